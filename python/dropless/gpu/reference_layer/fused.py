"""The layer's memory-bound steps as single Triton kernels on CUDA: each
reads its operands once and writes its result once, where the plain
PyTorch expressions (kept as the CPU path, and as the definition) make
fp32 copies of [M, f] and [T, k, d] intermediates.

Every kernel computes what its PyTorch twin computes: fp32 arithmetic on
the stored bf16/fp16 (or fp32) values, one rounding to the output type at
the end, the k slots summed slot 0 first as the twin does; row_dots sums
its d products in blocks of 1024 by tl.sum's tree, the blocks in order (a
fixed order, not torch's). Every output element is written by one program
(no atomics, no split reductions): deterministic, sync-free and
capturable. Their conformance is measured on the device (h200_run.sh
reflayer); the CPU runs the PyTorch definitions.

  swiglu(hg, hu)              silu(g) * u                       [M, f]
  swiglu_backward(hg, hu, dh) (d_gate | d_up) in one [M, 2f]    [M, 2f]
  gather_sum(src, idx, w)     sum_j w[t, j] * src[idx[t, j]]    [T, n] fp32
  weighted_rows(d_out, w, perm, k)  w[r] * d_out[r // k] for r = perm[p]   [M, d]
  row_dots(y, idx, d_out)     sum_c y[idx[t, j], c] * d_out[t, c]  [T, k] fp32
"""

import torch

try:
    import triton
    import triton.language as tl
    try:  # libdevice's correctly rounded-ish expf (2 ulp), as CUDA's expf
        from triton.language.extra import libdevice as _ld
    except Exception:
        from triton.language.extra.cuda import libdevice as _ld
except Exception:
    triton = None


def on(t):
    """Whether t's step runs as a Triton kernel: CUDA tensors with Triton
    there. (Not under Triton's CPU interpreter: these kernels are checked by
    the layer's conformance on the device, doc/conformance/h200_run.sh
    reflayer; the CPU runs their PyTorch definitions.)"""
    return triton is not None and t.is_cuda


if triton is not None:
    @triton.jit
    def _sigmoid(g):
        # as torch's CUDA sigmoid for fp32: 1 / (1 + expf(-g)), IEEE division
        return _ld.div_rn(tl.full(g.shape, 1.0, tl.float32), 1.0 + _ld.exp(-g))

    @triton.jit
    def _swiglu_kernel(hg_ptr, hu_ptr, o_ptr, F, s_g, s_u, s_o, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < F
        g = tl.load(hg_ptr + r * s_g + c, mask=m, other=0.0).to(tl.float32)
        u = tl.load(hu_ptr + r * s_u + c, mask=m, other=0.0).to(tl.float32)
        a = g * _sigmoid(g)
        tl.store(o_ptr + r * s_o + c, (a * u).to(o_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _swiglu_bw_kernel(hg_ptr, hu_ptr, dh_ptr, o_ptr, F, s_g, s_u, s_d, s_o,
                          BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < F
        g = tl.load(hg_ptr + r * s_g + c, mask=m, other=0.0).to(tl.float32)
        u = tl.load(hu_ptr + r * s_u + c, mask=m, other=0.0).to(tl.float32)
        dh = tl.load(dh_ptr + r * s_d + c, mask=m, other=0.0).to(tl.float32)
        s = _sigmoid(g)
        d_up = dh * (g * s)
        d_gate = dh * u * (s * (1.0 + g * (1.0 - s)))
        ty = o_ptr.dtype.element_ty
        tl.store(o_ptr + r * s_o + c, d_gate.to(ty), mask=m)
        tl.store(o_ptr + r * s_o + F + c, d_up.to(ty), mask=m)

    @triton.jit
    def _gather_sum_kernel(src_ptr, idx_ptr, w_ptr, o_ptr, N, s_src, s_o,
                           K: tl.constexpr, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < N
        row = tl.load(idx_ptr + t * K).to(tl.int64)
        acc = tl.load(src_ptr + row * s_src + c, mask=m, other=0.0).to(tl.float32)
        if HAS_W:
            acc = acc * tl.load(w_ptr + t * K)
        for j in tl.static_range(1, K):
            row = tl.load(idx_ptr + t * K + j).to(tl.int64)
            v = tl.load(src_ptr + row * s_src + c, mask=m, other=0.0).to(tl.float32)
            if HAS_W:
                v = v * tl.load(w_ptr + t * K + j)
            acc = acc + v
        tl.store(o_ptr + t * s_o + c, acc, mask=m)

    @triton.jit
    def _weighted_rows_kernel(d_ptr, w_ptr, perm_ptr, o_ptr, N, s_d, s_o,
                              K: tl.constexpr, BLOCK: tl.constexpr):
        p = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < N
        r = tl.load(perm_ptr + p).to(tl.int64)
        w = tl.load(w_ptr + r)
        v = tl.load(d_ptr + (r // K) * s_d + c, mask=m, other=0.0).to(tl.float32)
        tl.store(o_ptr + p * s_o + c, (w * v).to(o_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _row_dots_kernel(y_ptr, idx_ptr, d_ptr, o_ptr, N, s_y, s_d,
                         K: tl.constexpr, BLOCK: tl.constexpr):
        # one program per (token, slot): blocks of BLOCK columns, each summed
        # by tl.sum's fixed tree, the blocks added in increasing order
        q = tl.program_id(0).to(tl.int64)
        t = q // K
        row = tl.load(idx_ptr + q).to(tl.int64)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for c0 in range(0, N, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            m = c < N
            y = tl.load(y_ptr + row * s_y + c, mask=m, other=0.0).to(tl.float32)
            d = tl.load(d_ptr + t * s_d + c, mask=m, other=0.0).to(tl.float32)
            acc = acc + y * d
        tl.store(o_ptr + q, tl.sum(acc, axis=0))


_BLOCK = 1024


def _grid(rows, n):
    return (rows, triton.cdiv(max(n, 1), _BLOCK))


def swiglu(hg, hu, dt):
    """silu(hg) * hu in fp32, rounded once to dt; hg, hu [M, f] (row-strided
    views are fine)."""
    if not on(hg) or hg.shape[0] == 0:
        return (torch.nn.functional.silu(hg.float()) * hu.float()).to(dt)
    M, F = hg.shape
    out = torch.empty((M, F), dtype=dt, device=hg.device)
    _swiglu_kernel[_grid(M, F)](hg, hu, out, F, hg.stride(0), hu.stride(0), out.stride(0),
                                BLOCK=_BLOCK)
    return out


def swiglu_backward(hg, hu, dha, dt):
    """[d_h_gate | d_h_up] as one [M, 2f] tensor in dt (the operand of the
    d_x_sorted GEMM against [W_gate | W_up]), from fp32 arithmetic rounded once."""
    M, F = hg.shape
    if not on(hg) or M == 0:
        g, u, dh = hg.float(), hu.float(), dha.float()
        s = torch.sigmoid(g)
        d_up = dh * (g * s)
        d_gate = dh * u * (s * (1.0 + g * (1.0 - s)))
        return torch.cat([d_gate.to(dt), d_up.to(dt)], 1)
    out = torch.empty((M, 2 * F), dtype=dt, device=hg.device)
    _swiglu_bw_kernel[_grid(M, F)](hg, hu, dha, out, F, hg.stride(0), hu.stride(0),
                                   dha.stride(0), out.stride(0), BLOCK=_BLOCK)
    return out


def gather_sum(src, idx, w=None):
    """[T, n] fp32: sum over j of (w[t, j] *) src[idx[t, j]], slot 0 first,
    products and sums in fp32. idx [T, k] int64, w [T, k] fp32 or None."""
    T, k = idx.shape
    n = src.shape[1]
    if not on(src) or T == 0:
        v = src.index_select(0, idx.reshape(-1)).view(T, k, n).float()
        if w is not None:
            v = v * w.unsqueeze(-1)
        acc = v[:, 0]
        for j in range(1, k):
            acc = acc + v[:, j]
        return acc if k > 1 else acc.clone()
    out = torch.empty((T, n), dtype=torch.float32, device=src.device)
    idx = idx.contiguous()
    wc = w.contiguous() if w is not None else idx
    _gather_sum_kernel[_grid(T, n)](src, idx, wc, out, n, src.stride(0), out.stride(0), K=k,
                                    HAS_W=w is not None, BLOCK=_BLOCK)
    return out


def weighted_rows(d_out, w, perm, k, dt):
    """[M, d] in dt, sorted order: row p is w.flat[perm[p]] * d_out[perm[p] // k]
    (fp32 product, rounded once)."""
    M = perm.numel()
    T, n = d_out.shape
    if not on(d_out) or M == 0:
        v = (w.unsqueeze(-1) * d_out.float().unsqueeze(1)).to(dt).view(M, n)
        return v.index_select(0, perm)
    out = torch.empty((M, n), dtype=dt, device=d_out.device)
    _weighted_rows_kernel[_grid(M, n)](d_out, w.contiguous(), perm, out, n, d_out.stride(0),
                                       out.stride(0), K=k, BLOCK=_BLOCK)
    return out


def row_dots(y, idx, d_out):
    """[T, k] fp32: the dot product over columns of y[idx[t, j]] and d_out[t]
    in fp32 (d_topk_weights)."""
    T, k = idx.shape
    if not on(y) or T == 0:
        yt = y.index_select(0, idx.reshape(-1)).view(T, k, y.shape[1]).float()
        return (yt * d_out.float().unsqueeze(1)).sum(-1)
    out = torch.empty((T, k), dtype=torch.float32, device=y.device)
    _row_dots_kernel[(T * k,)](y, idx.contiguous(), d_out, out, y.shape[1], y.stride(0),
                               d_out.stride(0), K=k, BLOCK=_BLOCK)
    return out
