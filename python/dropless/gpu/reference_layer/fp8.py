"""Low-precision grouped GEMMs on the device, judged against the `dropless
lowp` goldens (doc/lowprecision.md, doc/conformance/README.md "FP8 on the
H200").

Each candidate computes a golden's block-scaled grouped GEMM

    out[m, n] = RN_out( sum_k dequant(a)[m, k] * dequant(b_e)[n, k] )

from the golden's own quantized bytes and scales (a_q, a_s, b_q, b_s), over
the same flat ragged layout (offsets), and is judged by the library's
`dl_qcheck_gemm` (dropless.quant.check_gemm) under the accumulation
profiles FP32 (TOSA's order) and HOPPER (a ~14-bit tensor-core
accumulator promoted to fp32 every 128 products):

* ``torch._scaled_mm[promote]``: one `torch._scaled_mm` per expert and
  K-block with unit scales and an fp32 output, the block scales applied and
  the partial sums added in fp32 outside (DeepGEMM's promotion, done by
  hand);
* ``triton-fp8-block``: our Triton kernel doing the same in registers:
  `tl.dot` of one K-block of E4M3 codes, scaled by the two block scales,
  added to an fp32 accumulator;
* ``triton-fp8-block[bf16-acc]``: the same with the accumulator rounded to
  bf16 after every block, a defect that must fail;
* ``torch-dequant-bf16``: where the dequantized values are exact in bf16
  (power-of-two scales: UE8M0, MX), the operands dequantized and one bf16
  matmul (fp32 accumulation);
* ``triton-mxfp4-dequant``: gpt-oss's path: bf16 activations times MXFP4
  weights decoded in the kernel (two E2M1 codes per byte, low nibble first;
  UE8M0 scales per 1x32 along K), `tl.dot` in bf16 with fp32 accumulation.

    python -m dropless.gpu.reference_layer.fp8 GOLDEN.h5 ... -o DIR [--device cuda]

writes DIR/fp8.jsonl (one line per candidate and profile) and prints a
table. Nothing here re-derives the golden: the exact values and the
tolerances are the library's.
"""

import argparse
import json
import os
import sys

import numpy as np

from ... import quant
from . import interp

try:
    import torch
except ImportError:  # pragma: no cover - the module needs torch
    torch = None

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


# ---------------------------------------------------------------- operands

def _scales(rule, s_bytes, rows, cols):
    """The block scales of a quantized [rows, cols] operand as float32
    [ceil(rows/br), ceil(cols/bc)] (the C layout of quant.h)."""
    nbr, nbc = -(-rows // rule.br), -(-cols // rule.bc)
    raw = np.frombuffer(bytes(s_bytes), dtype=np.uint8)
    if rule.scale == quant.SCALES["fp32"]:
        return raw.view("<f4").reshape(nbr, nbc).astype(np.float32)
    if rule.scale == quant.SCALES["ue8m0"]:
        if rule.flags & quant.FLAGS["packed"]:
            wpr = -(-nbc // 4)
            words = raw.view("<u4").reshape(nbr, wpr)
            codes = np.stack([quant.unpack_ue8m0(words[i], nbc) for i in range(nbr)])
        else:
            codes = raw.reshape(nbr, nbc)
        return np.ldexp(np.float32(1), codes.astype(np.int32) - 127).astype(np.float32)
    return (quant.decode(raw, "e4m3").reshape(nbr, nbc) * rule.global_).astype(np.float32)


class Operand:
    """One quantized operand of a golden: codes (uint8, FP4 unpacked)
    [rows, cols], the element format, and the block scales."""

    def __init__(self, recipe, q, s, rows, cols, global_scale=None):
        self.rule = quant.rule(recipe, **({} if global_scale is None else
                                          {"global_scale": global_scale}))
        self.elem = quant.FORMATS[self.rule.elem]
        q = np.frombuffer(bytes(q), dtype=np.uint8)
        self.packed = q  # as stored (FP4: two codes per byte)
        self.codes = (quant.unpack_fp4(q, rows * cols) if self.elem == "e2m1" else q).reshape(rows, cols)
        self.scales = _scales(self.rule, s, rows, cols)
        self.rows, self.cols = rows, cols

    def values(self):
        """The dequantized values (float64, exact)."""
        d = quant.decode(self.codes, self.elem)
        br, bc = self.rule.br, self.rule.bc
        s = np.repeat(np.repeat(self.scales.astype(np.float64), br, 0)[:self.rows], bc, 1)[:, :self.cols]
        return d * s


class Golden:
    """A `dropless lowp` file's /lowp group."""

    def __init__(self, path):
        import h5py
        with h5py.File(path, "r") as f:
            g = f["lowp"]
            self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()}
            self.x, self.w = g["x"][()], g["w"][()]
            self.offsets = g["offsets"][()].astype(np.int64)
            self.out = g["out"][()]
            M, K = self.x.shape
            E, N, _ = self.w.shape
            self.M, self.N, self.K, self.E = M, N, K, E
            ga = float(self.attrs.get("a_global", 1.0) or 1.0)
            gb = float(self.attrs.get("b_global", 1.0) or 1.0)
            self.a = None
            if self.attrs["a_recipe"] != "bf16":
                self.a = Operand(self.attrs["a_recipe"], g["a_q"][()], g["a_s"][()], M, K,
                                 ga if "nvfp4" in self.attrs["a_recipe"] else None)
            bq, bs = g["b_q"][()], g["b_s"][()]
        self.path, self.family = path, self.attrs["family"]
        # the experts' weights are quantized one after another: split the bytes
        r = quant.rule(self.attrs["b_recipe"])
        qb = quant.FORMATS[r.elem] == "e2m1"
        qper = N * K // 2 if qb else N * K
        sper = len(bs) // E
        gb = gb if "nvfp4" in self.attrs["b_recipe"] else None
        self.b = [Operand(self.attrs["b_recipe"], bq[e * qper:(e + 1) * qper],
                          bs[e * sper:(e + 1) * sper], N, K, gb) for e in range(E)]


# ---------------------------------------------------------------- kernels

if triton is not None:
    @triton.jit
    def _fp8_block_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, M, N, K, nkb, wbr,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          BF16_ACC: tl.constexpr):
        pm, pn = tl.program_id(0), tl.program_id(1)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kb in range(0, nkb):
            a = tl.load(a_ptr + rm[:, None] * K + kb * BK + rk[None, :], mask=rm[:, None] < M, other=0.0)
            b = tl.load(b_ptr + rn[None, :] * K + kb * BK + rk[:, None], mask=rn[None, :] < N, other=0.0)
            p = tl.dot(a, b, out_dtype=tl.float32)
            sa = tl.load(sa_ptr + rm * nkb + kb, mask=rm < M, other=0.0)
            sb = tl.load(sb_ptr + (rn // wbr) * nkb + kb, mask=rn < N, other=0.0)
            acc += (p * sa[:, None]) * sb[None, :]
            if BF16_ACC:
                acc = acc.to(tl.bfloat16).to(tl.float32)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))

    @triton.jit
    def _mxfp4_kernel(x_ptr, wq_ptr, ws_ptr, c_ptr, M, N, K,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        # x [M, K] (bf16 on the GPU); wq [N, K/2] bytes (element 2i low nibble); ws [N, K/32] UE8M0 codes
        pm, pn = tl.program_id(0), tl.program_id(1)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        rh = tl.arange(0, BK // 2)
        rs = tl.arange(0, BK // 32)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            x = tl.load(x_ptr + rm[:, None] * K + k0 + rk[None, :], mask=rm[:, None] < M, other=0.0)
            byt = tl.load(wq_ptr + rn[:, None] * (K // 2) + k0 // 2 + rh[None, :], mask=rn[:, None] < N, other=0)
            byt = byt.to(tl.int32)
            codes = tl.reshape(tl.join(byt & 15, byt >> 4), (BN, BK))  # low nibble first
            mag = codes & 7
            e = mag >> 1
            m = (mag & 1).to(tl.float32)
            v = tl.where(e == 0, m * 0.5, (1.0 + m * 0.5) * tl.exp2((e - 1).to(tl.float32)))
            v = tl.where((codes & 8) != 0, -v, v)
            sc = tl.load(ws_ptr + rn[:, None] * (K // 32) + k0 // 32 + rs[None, :], mask=rn[:, None] < N, other=127)
            sv = tl.exp2(sc.to(tl.float32) - 127.0)
            w = tl.reshape(tl.reshape(v, (BN, BK // 32, 32)) * sv[:, :, None], (BN, BK)).to(x.dtype)
            acc += tl.dot(x, tl.trans(w), out_dtype=tl.float32)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


def _fp8(codes, dev):
    return torch.from_numpy(np.array(codes, dtype=np.uint8)).to(dev).view(torch.float8_e4m3fn)


def _experts(g):
    for e in range(g.E):
        lo, hi = int(g.offsets[e]), int(g.offsets[e + 1])
        if hi > lo:
            yield e, lo, hi


def _bk(g):
    return g.a.rule.bc


def scaled_mm_promote(g, dev):
    """torch._scaled_mm per expert and K-block (unit scales, fp32 out),
    the block scales and the sum over blocks in fp32."""
    A, bk = _fp8(g.a.codes, dev), _bk(g)
    sa = torch.from_numpy(g.a.scales).to(dev)
    out = torch.zeros(g.M, g.N, dtype=torch.float32, device=dev)
    one = torch.ones((), dtype=torch.float32, device=dev)
    for e, lo, hi in _experts(g):
        B = _fp8(g.b[e].codes, dev)
        sb = torch.from_numpy(g.b[e].scales).to(dev)
        sbn = sb.repeat_interleave(g.b[e].rule.br, 0)[:g.N]  # per output column
        acc = torch.zeros(hi - lo, g.N, dtype=torch.float32, device=dev)
        for kb in range(g.K // bk):
            ks = slice(kb * bk, (kb + 1) * bk)
            p = torch._scaled_mm(A[lo:hi, ks].contiguous(), B[:, ks].contiguous().t(), scale_a=one,
                                 scale_b=one, out_dtype=torch.float32)
            acc += (p * sa[lo:hi, kb:kb + 1]) * sbn[:, kb][None, :]
        out[lo:hi] = acc
    return out.to(torch.bfloat16).float().cpu().numpy()


def triton_fp8_block(g, dev, bf16_acc=False):
    A, bk = _fp8(g.a.codes, dev), _bk(g)
    sa = torch.from_numpy(g.a.scales).contiguous().to(dev)
    out = torch.zeros(g.M, g.N, dtype=torch.bfloat16, device=dev)
    nkb = g.K // bk
    BM, BN = 16, 64
    for e, lo, hi in _experts(g):
        B = _fp8(g.b[e].codes, dev)
        sb = torch.from_numpy(g.b[e].scales).contiguous().to(dev)
        grid = (triton.cdiv(hi - lo, BM), triton.cdiv(g.N, BN))
        _fp8_block_kernel[grid](A[lo:], B, sa[lo:], sb, out[lo:], hi - lo, g.N, g.K, nkb,
                                g.b[e].rule.br, BM=BM, BN=BN, BK=bk, BF16_ACC=bf16_acc)
    return out.float().cpu().numpy()


def dequant_bf16(g, dev):
    a = torch.from_numpy(g.x if g.a is None else g.a.values()).to(dev)
    out = torch.zeros(g.M, g.N, dtype=torch.bfloat16, device=dev)
    for e, lo, hi in _experts(g):
        w = torch.from_numpy(g.b[e].values()).to(dev)
        out[lo:hi] = a[lo:hi].to(torch.bfloat16) @ w.to(torch.bfloat16).t()
    return out.float().cpu().numpy()


def triton_mxfp4(g, dev):
    # bf16 operands on the GPU; in Triton's CPU interpreter (the tests), whose
    # bf16 tl.dot is wrong, fp32 ones holding the same bf16 values
    x = torch.from_numpy(g.x).to(dev).to(torch.bfloat16 if str(dev).startswith("cuda") else torch.float32)
    out = torch.zeros(g.M, g.N, dtype=torch.bfloat16, device=dev)
    BM, BN, BK = 16, 64, 64
    for e, lo, hi in _experts(g):
        wq = torch.from_numpy(g.b[e].packed.copy()).to(dev)
        codes = np.round(np.log2(g.b[e].scales.astype(np.float64))).astype(np.int32) + 127
        ws = torch.from_numpy(codes.astype(np.uint8)).contiguous().to(dev)
        grid = (triton.cdiv(hi - lo, BM), triton.cdiv(g.N, BN))
        _mxfp4_kernel[grid](x[lo:], wq, ws, out[lo:], hi - lo, g.N, g.K, BM=BM, BN=BN, BK=BK)
    return out.float().cpu().numpy()


def _exact_pow2_bf16(op):
    """Dequantized values exact in bf16: power-of-two scales and at most
    8 significant bits of the element (E4M3: 4, E2M1: 2)."""
    return op is None or (op.rule.scale == quant.SCALES["ue8m0"])


def candidates(g):
    """(name, fn, declared profile, expected) for the golden's family:
    expected is "pass", or "fail" for a defect; the verdict under the
    declared profile is the one that must match, the other is reported."""
    fp8 = g.a is not None and g.a.elem == "e4m3" and g.b[0].elem == "e4m3"
    out = []
    if fp8:  # FP8 tensor cores: HOPPER; the defect claims fp32 promotion
        out += [("torch._scaled_mm[promote]", scaled_mm_promote, "hopper", "pass"),
                ("triton-fp8-block", triton_fp8_block, "hopper", "pass"),
                ("triton-fp8-block[bf16-acc]", lambda g, d: triton_fp8_block(g, d, True), "fp32",
                 "fail")]
    if _exact_pow2_bf16(g.a) and all(_exact_pow2_bf16(b) for b in g.b):  # bf16 tensor cores
        out.append(("torch-dequant-bf16", dequant_bf16, "fp32", "pass"))
    if g.a is None and g.b[0].elem == "e2m1" and g.b[0].rule.scale == quant.SCALES["ue8m0"]:
        out.append(("triton-mxfp4-dequant", triton_mxfp4, "fp32", "pass"))
    return out


def run(paths, dev):
    """Every candidate of every golden under both profiles: a list of dicts
    (family, candidate, profile, declared, expected, and check_gemm's figures
    or error; as_expected on the declared profile's row)."""
    rows = []
    for path in paths:
        g = Golden(path)
        for name, fn, declared, want in candidates(g):
            try:
                cand, err = fn(g, dev), None
            except Exception as e:  # a candidate that cannot run is reported, not fatal
                cand, err = None, "%s: %s" % (type(e).__name__, e)
            for prof in ("fp32", "hopper"):
                r = {"family": g.family, "candidate": name, "profile": prof,
                     "declared": prof == declared, "expected": want}
                if err:
                    r["error"], r["as_expected"] = err, False
                else:
                    r.update(quant.check_gemm(g.path, cand, prof))
                    r["as_expected"] = (r["conformant"] == (want == "pass")) if prof == declared else None
                rows.append(r)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dropless.gpu.reference_layer.fp8")
    ap.add_argument("goldens", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    interp.enable()
    os.makedirs(args.out, exist_ok=True)
    rows = run(args.goldens, args.device)
    path = os.path.join(args.out, "fp8.jsonl")
    with open(path + ".tmp", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(path + ".tmp", path)
    print("%-27s %-27s %-8s %-10s %7s %9s" % ("family", "candidate", "profile", "verdict", "failed", "worst/tol"))
    for r in rows:
        v = r.get("error") or ("CONFORMANT" if r["conformant"] else "NOT CONF.")
        print("%-27s %-27s %-8s %-10s %7s %9s%s" % (
            r["family"], r["candidate"], r["profile"] + ("*" if r["declared"] else ""), v[:40],
            r.get("failed", "-"), "%.3g" % r["worst_ratio"] if "worst_ratio" in r else "-",
            "" if r["as_expected"] is not False else "  UNEXPECTED"))
    print("* the declared profile (the verdict that must be the expected one)")
    return 1 if any(r["as_expected"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
