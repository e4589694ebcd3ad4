"""The reference layer's expert FFN in DeepGEMM's masked layout, captured
once as a CUDA graph and replayed on a sequence of routings (issue 30,
item 2; doc/format.md "Kernel layouts", doc/conformance/README.md).

The layout: x [G, MAX_M, d] with group g's first masked_m[g] rows valid,
the output y [G, MAX_M, d] whose padding rows the kernel must leave
untouched (the poisoned twin holds NaN there, and NaN in x's padding). One
Triton kernel, `masked_gemm`, computes C[g, m, :] = A[g, m, :] @ B[g] for
m < masked_m[g] only, reading masked_m from device memory, so the grid is
fixed by (G, MAX_M) and the same graph serves every routing:

    h_gate = RN(x @ W_gate), h_up = RN(x @ W_up)   (masked, fp32 accumulation)
    h_act  = RN(silu(h_gate) * h_up)               (fused.swiglu, every row)
    y      = RN(h_act @ W_down)                    (masked, into the output buffer)

RN rounds the fp32 accumulator to the case's type to nearest even, done by
the kernel on the fp32 bits, so the CPU test (Triton's interpreter) and the
GPU give the same values. Operands are fp32 tensors holding values of the
case's type (bf16 values are exact there); on the GPU the kernel casts them
to bf16 for the tensor cores (exact) when the case is bf16.

    python -m dropless.gpu.reference_layer.masked GOLDEN.h5 ... -o DIR [--device cuda]
        [--defect write-padding]

Each GOLDEN (a `dropless gen --layout masked:MAX_M` file, all of one shape)
is copied into the static buffers, the graph replayed, and a candidate
DIR/NAME--masked.h5 written with the golden's /layouts/masked_MAX_M group
holding the kernel's y: `dropless check GOLDEN CANDIDATE` judges it.
"""

import argparse
import os
import shutil
import sys

import numpy as np

from . import fused, interp

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

if triton is not None:
    @triton.jit
    def _rne(acc, MODE: tl.constexpr):
        # MODE 0: fp32 (no rounding); 1: bf16 (main() refuses other types)
        if MODE == 1:
            b = acc.to(tl.int32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
            acc = b.to(tl.float32, bitcast=True)
        return acc

    @triton.jit
    def _masked_gemm_kernel(a_ptr, b_ptr, c_ptr, mm_ptr, CAP, N, K,
                            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                            MODE: tl.constexpr, DOT_BF16: tl.constexpr, WRITE_PAD: tl.constexpr):
        g = tl.program_id(0)
        pm, pn = tl.program_id(1), tl.program_id(2)
        m_valid = tl.load(mm_ptr + g)
        if WRITE_PAD:  # the defect: every row, padding included
            m_valid = CAP
        if pm * BM < m_valid:
            rm = pm * BM + tl.arange(0, BM)
            rn = pn * BN + tl.arange(0, BN)
            rk = tl.arange(0, BK)
            rows = g.to(tl.int64) * CAP + rm
            ok_m = rm < m_valid
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, K, BK):
                kk = k0 + rk
                a = tl.load(a_ptr + rows[:, None] * K + kk[None, :],
                            mask=ok_m[:, None] & (kk[None, :] < K), other=0.0)
                b = tl.load(b_ptr + g.to(tl.int64) * K * N + kk[:, None] * N + rn[None, :],
                            mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
                if DOT_BF16:
                    acc += tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), out_dtype=tl.float32)
                else:
                    acc += tl.dot(a, b, out_dtype=tl.float32)
            tl.store(c_ptr + rows[:, None] * N + rn[None, :], _rne(acc, MODE),
                     mask=ok_m[:, None] & (rn[None, :] < N))


def masked_gemm(a, w, masked_m, cap, out, mode, write_pad=False):
    """out[g*cap + m, :] = RN(a[g*cap + m, :] @ w[g]) for m < masked_m[g]
    (device tensor, read by the kernel); other rows of out untouched. a
    [G*cap, K] fp32, w [G, K, N] fp32, out [G*cap, N] fp32."""
    G, K, N = w.shape
    BM, BN, BK = 16, 32, 32
    grid = (G, triton.cdiv(cap, BM), triton.cdiv(N, BN))
    _masked_gemm_kernel[grid](a, w, out, masked_m, cap, N, K, BM=BM, BN=BN, BK=BK,
                              MODE=mode, DOT_BF16=bool(a.is_cuda and mode == 1),
                              WRITE_PAD=write_pad)
    return out


class MaskedFFN:
    """Static buffers and the step of one shape (G, cap, d, f, dtype); step()
    is what the CUDA graph captures."""

    def __init__(self, G, cap, d, f, dtype, dev, defect=None):
        z = lambda *s: torch.zeros(s, dtype=torch.float32, device=dev)  # noqa: E731
        self.G, self.cap, self.dtype, self.dev = G, cap, dtype, dev
        self.mode = {"fp32": 0, "bf16": 1}[dtype]
        self.x, self.y = z(G * cap, d), z(G * cap, d)
        self.wg, self.wu, self.wd = z(G, d, f), z(G, d, f), z(G, f, d)
        self.hg, self.hu, self.ha = z(G * cap, f), z(G * cap, f), z(G * cap, f)
        self.mm = torch.zeros(G, dtype=torch.int32, device=dev)
        self.defect = defect
        self.graph = None

    def step(self):
        masked_gemm(self.x, self.wg, self.mm, self.cap, self.hg, self.mode)
        masked_gemm(self.x, self.wu, self.mm, self.cap, self.hu, self.mode)
        t = torch.bfloat16 if self.mode == 1 else torch.float32
        self.ha.copy_(fused.swiglu(self.hg.to(t), self.hu.to(t), t).float())
        masked_gemm(self.ha, self.wd, self.mm, self.cap, self.y, self.mode,
                    write_pad=self.defect == "write-padding")

    def load(self, k):
        """Copies one golden's kernel inputs (dropless.layouts.kernel_inputs)
        into the static buffers; y starts as the golden's output buffer."""
        for name, buf in (("x", self.x), ("w_gate", self.wg), ("w_up", self.wu), ("w_down", self.wd)):
            buf.copy_(torch.from_numpy(np.asarray(k[name], dtype=np.float32).reshape(buf.shape)))
        self.y.copy_(torch.from_numpy(np.asarray(k["y_out"], dtype=np.float32).reshape(self.y.shape)))
        self.mm.copy_(torch.from_numpy(np.asarray(k["masked_m"], dtype=np.int32)))

    def run(self):
        """One replay of the graph (captured on the first call) on CUDA;
        the step itself elsewhere."""
        if not self.x.is_cuda:
            self.step()
            return
        if self.graph is None:
            self.step()  # compiles the kernels outside the capture
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.step()
        self.graph.replay()


def write_candidate(golden, name, y, out_path):
    """A candidate: the golden's /layouts/NAME group with y, nothing else."""
    import h5py
    tmp = out_path + ".tmp"
    shutil.copy(golden, tmp)
    with h5py.File(tmp, "r+") as f:
        for grp in ("forward", "backward", "inputs", "ep"):
            if grp in f:
                del f[grp]
        for n in list(f["layouts"]):
            if n != name:
                del f["layouts"][n]
        g = f["layouts"][name]
        g["y"][...] = y
        del g["x"]
        f.attrs["backend"] = "reference-masked[cuda-graph]"
    os.replace(tmp, out_path)


def main(argv=None):
    from ... import layouts
    import h5py
    ap = argparse.ArgumentParser(prog="python -m dropless.gpu.reference_layer.masked")
    ap.add_argument("goldens", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--defect", choices=["write-padding"])
    args = ap.parse_args(argv)
    interp.enable()
    os.makedirs(args.out, exist_ok=True)
    ffn = None
    for path in args.goldens:
        with h5py.File(path, "r") as f:
            names = [n for n in f["layouts"] if n.startswith("masked_") and "." not in n]
            poisoned = bool(f["layouts"][names[0]].attrs["poisoned"])
            dtype = f["config"].attrs["dtype"]
            dtype = dtype.decode() if isinstance(dtype, bytes) else str(dtype)
        name = names[0]
        k = layouts.kernel_inputs(path, "masked:" + name.split("_")[1], poisoned=poisoned)
        G, cap, d = k["x"].reshape(len(k["masked_m"]), -1, k["x"].shape[-1]).shape
        f_ = k["w_gate"].shape[2]
        if dtype not in ("fp32", "bf16"):
            print("%s: dtype %s: the masked kernel rounds to fp32 or bf16 only" % (path, dtype),
                  file=sys.stderr)
            return 2
        if ffn is None:
            ffn = MaskedFFN(G, cap, d, f_, dtype, args.device, args.defect)
        elif (ffn.G, ffn.cap, ffn.x.shape[1], ffn.wg.shape[2], ffn.dtype) != (G, cap, d, f_, dtype):
            raise SystemExit("%s: another shape than the first golden's (one graph, one shape)" % path)
        ffn.load(k)
        ffn.run()
        y = ffn.y.cpu().numpy()
        base = os.path.splitext(os.path.basename(path))[0]
        out = os.path.join(args.out, "%s--masked%s.h5" % (base, "-" + args.defect if args.defect else ""))
        write_candidate(path, name, y, out)
        print("%s: masked_m %s -> %s" % (path, list(map(int, k["masked_m"])), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
