"""Grouped GEMMs over the flat (expert-sorted) array with device-side
offsets: no group size ever reaches the host, so the layer never waits for
the GPU and a CUDA graph can capture it.

Two shapes of grouped GEMM are needed:
  rows(a [M, K], w [E, K, N])  -> [M, N]: rows of group e times w[e]
                                  (forward GEMMs and the data gradients)
  wgrad(a [M, KA], b [M, N])   -> [E, KA, N] in fp32: a_e^T b_e per group,
                                  a ragged contraction (weight gradients)

Implementations, chosen per device and dtype (GroupedGemm.rows_impl /
wgrad_impl say which ran):
  grouped_mm  torch.nn.functional.grouped_mm / torch._grouped_mm: the CUTLASS
              kernel on CUDA for bf16 with 16-byte aligned rows (no host
              sync); on the CPU its reference loop.
  triton      the two kernels below: every output tile is written by one
              program, which reads its group's bounds from device memory and
              sums its contraction in one fixed order (deterministic, no
              atomics); fp32 operands at input_precision="ieee" (true fp32,
              not TF32), fp32 accumulation, and the weight gradient written
              (or accumulated) in fp32. Used on CUDA wherever grouped_mm
              would fall back to its per-group loop, which copies the offsets
              to the host (`offs.cpu()`): fp32 and fp16 GEMMs, unaligned
              rows, and every fp32 weight gradient (torch 2.11's grouped_mm
              refuses out_dtype=float32 for bf16 operands).
  loop        a per-group torch.mm loop on the CPU (offsets read on the host,
              which costs nothing there): shapes grouped_mm refuses.
  dense       where the Triton kernels fail (no C compiler for Triton's
              launcher, say): the rows scattered into a zero-padded
              [E, cap, K] buffer (cap = T, the most rows one expert can get)
              by a device-side index, then torch.bmm in fp32 (exact products
              of bf16/fp16 operands, fp32 accumulation, TF32 off): still no
              host sync and capturable, at E*T/M = E/k times the work; only
              while the buffers stay under DENSE_MAX_BYTES, else grouped_mm.
"""

import os

import torch

try:
    import triton
    import triton.language as tl
except Exception:  # no Triton (CPU-only torch): the CPU paths need none
    triton = None


def grouped_mm_fn():
    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def triton_usable(device):
    """Whether the Triton kernels can run here: on a CUDA device, or on the
    CPU under Triton's interpreter (TRITON_INTERPRET=1, for tests)."""
    if triton is None:
        return False
    if device.type == "cuda":
        return True
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    from . import interp
    return interp.enable()


if triton is not None:
    @triton.jit
    def _rows_kernel(a_ptr, b_ptr, c_ptr, te_ptr, tr0_ptr, tr1_ptr, N, K,
                     s_am, s_ak, s_be, s_bk, s_bn, s_cm, s_cn,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     PREC: tl.constexpr, UPCAST: tl.constexpr):
        # One program: rows [r0, r1) (at most BM, all of expert e) x BN columns.
        pid_t = tl.program_id(0)
        pid_n = tl.program_id(1)
        e = tl.load(te_ptr + pid_t)
        r0 = tl.load(tr0_ptr + pid_t)
        r1 = tl.load(tr1_ptr + pid_t)
        rows = r0 + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        rmask = rows < r1
        cmask = cols < N
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            ks = k0 + tl.arange(0, BK)
            kmask = ks < K
            a = tl.load(a_ptr + rows[:, None] * s_am + ks[None, :] * s_ak,
                        mask=rmask[:, None] & kmask[None, :], other=0.0)
            b = tl.load(b_ptr + e * s_be + ks[:, None] * s_bk + cols[None, :] * s_bn,
                        mask=kmask[:, None] & cmask[None, :], other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc += tl.dot(a, b, input_precision=PREC)
        tl.store(c_ptr + rows[:, None] * s_cm + cols[None, :] * s_cn,
                 acc.to(c_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])

    @triton.jit
    def _wgrad_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, KA, N, n_ka, n_n,
                      s_am, s_ak, s_bm, s_bn, s_ce, s_ck, s_cn,
                      ACC: tl.constexpr, BM: tl.constexpr, BKA: tl.constexpr,
                      BN: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
                      GROUP: tl.constexpr = 8):
        # One program: a BKA x BN tile of expert e's a_e^T b_e, summed over
        # the expert's rows in increasing order.
        # Programs in groups of GROUP row tiles: the GROUP A tiles of a
        # group stay in L2 while its programs walk all of B's column tiles,
        # so B is read from memory n_ka / GROUP times, not n_ka times (the
        # same tiles, summed the same way: only the order of programs moves)
        pid = tl.program_id(0)
        e = pid // (n_ka * n_n)
        rem = pid % (n_ka * n_n)
        width = GROUP * n_n
        first = (rem // width) * GROUP
        gsize = tl.minimum(n_ka - first, GROUP)
        ti = first + (rem % width) % gsize
        tj = (rem % width) // gsize
        r0 = tl.load(offs_ptr + e).to(tl.int32)  # M < 2^31 rows
        r1 = tl.load(offs_ptr + e + 1).to(tl.int32)
        ka = ti * BKA + tl.arange(0, BKA)
        ns = tj * BN + tl.arange(0, BN)
        kmask = ka < KA
        nmask = ns < N
        acc = tl.zeros((BKA, BN), dtype=tl.float32)
        for r in range(r0, r1, BM):
            rows = (r + tl.arange(0, BM)).to(tl.int64)
            rm = rows < r1
            at = tl.load(a_ptr + ka[:, None] * s_ak + rows[None, :] * s_am,
                         mask=kmask[:, None] & rm[None, :], other=0.0)
            b = tl.load(b_ptr + rows[:, None] * s_bm + ns[None, :] * s_bn,
                        mask=rm[:, None] & nmask[None, :], other=0.0)
            if UPCAST:
                at = at.to(tl.float32)
                b = b.to(tl.float32)
            acc += tl.dot(at, b, input_precision=PREC)
        cp = c_ptr + e.to(tl.int64) * s_ce + ka[:, None] * s_ck + ns[None, :] * s_cn
        cm = kmask[:, None] & nmask[None, :]
        if ACC:
            acc += tl.load(cp, mask=cm, other=0.0)
        tl.store(cp, acc, mask=cm)


def _blocks(dtype):
    """Tile sizes: smaller for fp32 (4-byte operands, CUDA-core FMA)."""
    if dtype == torch.float32:
        return dict(BM=64, BN=64, BK=32, warps=4)
    return dict(BM=64, BN=128, BK=64, warps=8)


def _wgrad_blocks(dtype):
    """The weight-gradient kernel's tiles: 128 x 128 outputs, 32 rows a step.
    For bf16/fp16, 4 warps and 4 stages were the fastest of nine
    configurations on both layer shapes of an H200
    (dropless/gpu/reference_layer/profile.py: Mixtral's d_w_gate|up 4.4 ms against
    5.1 ms for 64 rows, 8 warps; DeepSeek-V3's 9.6 against 11.4)."""
    if dtype == torch.float32:
        return dict(BKA=64, BN=64, BM=32, warps=4, stages=3)
    return dict(BKA=128, BN=128, BM=32, warps=4, stages=4)


def tile_map(offs_full, M, BM):
    """For the rows kernel: program p -> (expert, first row, end row), as
    device tensors of the static length cdiv(M, BM) + E (an upper bound on
    the number of BM-row tiles of any split of M rows into E groups);
    programs past the last tile get an empty row range."""
    E = offs_full.numel() - 1
    starts, ends = offs_full[:-1], offs_full[1:]
    nt = (ends - starts + (BM - 1)) // BM
    tend = torch.cumsum(nt, 0)
    P = (M + BM - 1) // BM + E
    p = torch.arange(P, device=offs_full.device, dtype=torch.int64)
    e = torch.searchsorted(tend, p, right=True)
    valid = e < E
    ec = e.clamp(max=E - 1)
    r0 = starts[ec] + (p - (tend[ec] - nt[ec])) * BM
    r1 = torch.where(valid, ends[ec], r0)
    return ec.contiguous(), r0.contiguous(), r1.contiguous(), P


DENSE_MAX_BYTES = 8 << 30


def pad_index(offs_full, M, cap):
    """Sorted row p -> its place e*cap + (p - start of e) in the padded
    [E*cap] layout, on the device."""
    p = torch.arange(M, device=offs_full.device, dtype=torch.int64)
    e = torch.searchsorted(offs_full[1:], p, right=True)
    return e * cap + (p - offs_full[e])


def _padded(x, idx, E, cap):
    buf = torch.zeros((E * cap, x.shape[1]), dtype=torch.float32, device=x.device)
    return buf.index_copy_(0, idx, x.float()).view(E, cap, x.shape[1])


class GroupedGemm:
    """The grouped GEMMs of one layer (dtype, sizes, device); impl "auto"
    picks per device as the module docstring says, "torch" forces
    grouped_mm/loop, "triton" forces the Triton kernels."""

    def __init__(self, dtype, dims, device, impl="auto"):
        self.dtype, self.device = dtype, device
        gm = grouped_mm_fn()
        esz = torch.tensor([], dtype=dtype).element_size()
        aligned = all((n * esz) % 16 == 0 for n in dims)
        tri = triton_usable(device)
        if impl == "triton" and not tri:
            raise RuntimeError("Triton kernels requested but unusable here (device %s)" % device)
        if impl in ("triton", "dense"):
            self.rows_impl = self.wgrad_impl = impl
        elif device.type == "cuda" and impl == "auto":
            fast = gm is not None and aligned and dtype == torch.bfloat16
            self.rows_impl = "grouped_mm" if fast else ("triton" if tri else "grouped_mm")
            self.wgrad_impl = "triton" if tri else "grouped_mm"
        else:
            ok = gm is not None and aligned and dtype in (torch.float32, torch.bfloat16)
            self.rows_impl = self.wgrad_impl = "grouped_mm" if ok else "loop"
        self.gm = gm
        self.cap = None  # rows one expert can get at most (T): the layer sets it
        # fp32 operands: true fp32, never TF32 (the setting means nothing for bf16/fp16)
        self.prec = "ieee" if dtype == torch.float32 else "tf32"
        # Triton's CPU interpreter multiplies bf16/fp16 tiles wrongly; there
        # the tiles are upcast first (exact: fp32 holds their products)
        self.upcast = device.type != "cuda" and dtype != torch.float32

    def describe(self):
        d = {"rows": self.rows_impl, "wgrad": self.wgrad_impl,
             "grouped_mm": getattr(self.gm, "__module__", "") + "." + getattr(self.gm, "__name__", "")
             if self.gm else None}
        if self.fallback:
            d["triton_failed"] = self.fallback
        return d

    fallback = None

    def _soft(self, which, fn, *args):
        """A Triton kernel that fails (it does not compile here) leaves the
        layer running on grouped_mm, and says so in describe()."""
        try:
            return fn(*args)
        except Exception as e:
            self.fallback = "%s: %s" % (type(e).__name__, str(e)[:300])
            alt = "dense" if self.device.type == "cuda" or self.gm is None else "grouped_mm"
            self.rows_impl = alt if which == "rows" or self.rows_impl == "triton" else self.rows_impl
            self.wgrad_impl = alt
            return None

    def _dense_ok(self, E, M, widths):
        return self.cap is not None and E * self.cap * max(widths) * 4 * 3 <= DENSE_MAX_BYTES

    # -------------------------------------------------------------- rows

    def rows(self, a, w, offs32, offs_full):
        """[M, N] = per group e: a[rows of e] @ w[e]; in a's dtype."""
        M, N = a.shape[0], w.shape[2]
        if M == 0:  # M = T k is static: no kernel for an empty batch
            return a.new_zeros((0, N))
        if self.rows_impl == "triton":
            c = self._soft("rows", self._rows_triton, a, w, offs_full)
            if c is not None:
                return c
        if self.rows_impl == "dense":
            E = w.shape[0]
            if self._dense_ok(E, M, (a.shape[1], N)):
                idx = pad_index(offs_full, M, self.cap)
                y = torch.bmm(_padded(a, idx, E, self.cap), w.float())
                return y.view(E * self.cap, N).index_select(0, idx).to(a.dtype)
            self.rows_impl = "grouped_mm"
        if self.rows_impl == "grouped_mm" and self.gm is not None:
            return self.gm(a, w, offs=offs32)
        return self._rows_loop(a, w, offs_full)

    def _rows_triton(self, a, w, offs_full):
        M, N = a.shape[0], w.shape[2]
        c = torch.empty((M, N), dtype=a.dtype, device=a.device)
        bl = _blocks(a.dtype)
        te, r0, r1, P = tile_map(offs_full, M, bl["BM"])
        grid = (P, triton.cdiv(N, bl["BN"]))
        _rows_kernel[grid](a, w, c, te, r0, r1, N, a.shape[1],
                           a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
                           c.stride(0), c.stride(1), BM=bl["BM"], BN=bl["BN"], BK=bl["BK"],
                           PREC=self.prec, UPCAST=self.upcast, num_warps=bl["warps"])
        return c

    @staticmethod
    def _rows_loop(a, w, offs_full):
        out = a.new_zeros((a.shape[0], w.shape[2]))
        o = offs_full.tolist()  # CPU only: nothing to wait for
        for e in range(w.shape[0]):
            if o[e + 1] > o[e]:
                out[o[e]:o[e + 1]] = a[o[e]:o[e + 1]] @ w[e]
        return out

    # ------------------------------------------------------------- wgrad

    def wgrad(self, a, b, offs32, offs_full, out, accumulate=True):
        """out[e] (+)= a_e^T b_e in fp32, out [E, KA, N] fp32."""
        if a.shape[0] == 0:
            if not accumulate:
                out.zero_()
            return out
        if self.wgrad_impl == "triton" and \
                self._soft("wgrad", self._wgrad_triton, a, b, offs_full, out, accumulate) is not None:
            return out
        E = out.shape[0]
        if self.wgrad_impl == "dense":
            if self._dense_ok(E, a.shape[0], (a.shape[1], b.shape[1])):
                idx = pad_index(offs_full, a.shape[0], self.cap)
                r = torch.bmm(_padded(a, idx, E, self.cap).transpose(1, 2),
                              _padded(b, idx, E, self.cap))
                return out.add_(r) if accumulate else out.copy_(r)
            self.wgrad_impl = "grouped_mm"
        if self.wgrad_impl == "grouped_mm":
            r = self.gm(a.float().t(), b.float(), offs=offs32)
        else:
            o = offs_full.tolist()
            r = torch.zeros_like(out)
            for e in range(E):
                if o[e + 1] > o[e]:
                    r[e] = a[o[e]:o[e + 1]].float().t() @ b[o[e]:o[e + 1]].float()
        if accumulate:
            out.add_(r)
        else:
            out.copy_(r)
        return out

    def _wgrad_triton(self, a, b, offs_full, out, accumulate):
        E, KA, N = out.shape
        bl = _wgrad_blocks(a.dtype)
        n_ka, n_n = triton.cdiv(KA, bl["BKA"]), triton.cdiv(N, bl["BN"])
        _wgrad_kernel[(E * n_ka * n_n,)](
            a, b, out, offs_full, KA, N, n_ka, n_n, a.stride(0), a.stride(1),
            b.stride(0), b.stride(1), out.stride(0), out.stride(1), out.stride(2),
            ACC=accumulate, BM=bl["BM"], BKA=bl["BKA"], BN=bl["BN"], PREC=self.prec,
            UPCAST=self.upcast, num_warps=bl["warps"], num_stages=bl["stages"])
        return out
