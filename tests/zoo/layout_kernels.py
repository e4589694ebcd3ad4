"""A zoo of grouped-GEMM kernels in the kernel layouts (doc/format.md,
"Kernel layouts"), in numpy, for tests/test_layouts.py: each takes the
layout's index arrays (the names DeepGEMM and vLLM use), the dispatched
activations x in the layout, the expert weights and the output buffer (0,
or NaN in the poisoned twin), and returns what it wrote. The correct ones
must be CONFORMANT on the golden and on its poisoned twin; each defective
one is a bug seen in production kernels and must be NOT CONFORMANT with
the rows named.

The expert FFN is computed in float64 and rounded once to float32 (the
fp32 cases): a fused kernel, within the runner's tolerance."""
import numpy as np


def ffn(x, e, w):
    """One expert's FFN on rows x [n, d] (float32 values), float64 inside."""
    x = x.astype(np.float64)
    if "w_gate" in w:
        g = x @ w["w_gate"][e].astype(np.float64)
        u = x @ w["w_up"][e].astype(np.float64)
        h = g / (1.0 + np.exp(-g)) * u
    else:
        h = x
    return (h @ w["w_down"][e].astype(np.float64)).astype(np.float32)


def _dense(x, counts, w, out, cap, e0, rows_of=None):
    """masked / batched: the first counts[g] rows of each group."""
    y = out.copy()
    for g, n in enumerate(counts):
        b = g * cap
        hi = rows_of(n) if rows_of else n
        if hi:
            y[b:b + hi] = ffn(x[b:b + hi], e0 + g, w)
    return y


def masked_ok(a, x, w, out):
    return _dense(x, a["masked_m"], w, out, a["cap"], a["e0"])


def batched_ok(a, x, w, out):
    return _dense(x, a["expert_num_tokens"], w, out, a["cap"], a["e0"])


def masked_writes_padding(a, x, w, out):
    """Stores whole 4-row tiles: the rows past masked_m get the tile's first
    row again (registers of an unmasked store)."""
    y = masked_ok(a, x, w, out)
    cap = a["cap"]
    for g, n in enumerate(a["masked_m"]):
        top = min(cap, -(-n // 4) * 4)
        for i in range(n, top):
            y[g * cap + i] = y[g * cap + (i // 4) * 4]
    return y


def masked_reads_padding(a, x, w, out):
    """Scales each 4-row tile by its largest |x| (a per-tile quantisation
    step) over every row of the tile, padding included: harmless with zero
    padding, NaN in every row of the tile with the poisoned twin."""
    xs = x.copy()
    cap = a["cap"]
    for g in range(len(a["masked_m"])):
        for b in range(g * cap, (g + 1) * cap, 4):
            s = np.max(np.abs(x[b:b + 4].astype(np.float64))) if b < len(x) else 1.0
            s = s if s != 0 else 1.0
            xs[b:b + 4] = (x[b:b + 4].astype(np.float64) / s * s).astype(np.float32)
    return masked_ok(a, xs, w, out)


def contiguous_ok(a, x, w, out):
    """Rows with m_indices >= 0 computed, padding rows zeroed."""
    y = np.zeros_like(out)
    mi = a["m_indices"]
    for g in np.unique(mi[mi >= 0]):
        r = np.nonzero(mi == g)[0]
        y[r] = ffn(x[r], a["e0"] + g, w)
    return y


def contiguous_computes_padding(a, x, w, out):
    """Computes every row of each group's aligned block, padding included
    (the expert of a padding row taken from its block): zero from zero
    padding, NaN from the poisoned twin's."""
    y = contiguous_ok(a, x, w, out)
    go = a["group_offsets"]
    for g in range(len(go) - 1):
        if go[g + 1] > go[g]:
            y[go[g]:go[g + 1]] = ffn(x[go[g]:go[g + 1]], a["e0"] + g, w)
    return y


def vllm_align(a, B, sentinel=None, post_pad_delta=0):
    """The kernel's own moe_align_block_size from topk_ids (as a kernel
    computes it), with an optional defect."""
    ids = a["topk_ids"].ravel()
    numel, E = ids.size, a["E"]
    cap = numel + E * (B - 1)
    sti = np.full(cap, numel if sentinel is None else sentinel, np.int32)
    eids = np.full(-(-cap // B), -1, np.int32)
    pos = 0
    for e in range(E):
        f = np.nonzero(ids == e)[0]
        sti[pos:pos + f.size] = f
        seg = -(-f.size // B) * B
        eids[pos // B:(pos + seg) // B] = e - a["e0"] if a["e0"] <= e < a["e1"] else -1
        pos += seg
    return {"sorted_token_ids": sti, "expert_ids": eids,
            "num_tokens_post_padded": np.array([pos + post_pad_delta], np.int32)}


def vllm_gemm(a, idx, x, w, out, B, full_blocks_only=False):
    """fused_moe over blocks: token rows x[id // k], output rows y[id];
    blocks of other ranks' experts (-1) write zeros, slots >= numel masked."""
    y = out.copy()
    k, numel = a["k"], a["topk_ids"].size
    sti, eids = idx["sorted_token_ids"], idx["expert_ids"]
    n_blocks = int(idx["num_tokens_post_padded"][0]) // B
    for b in range(n_blocks):
        slots = sti[b * B:(b + 1) * B]
        valid = slots[(slots < numel) & (slots >= 0)]
        if full_blocks_only and valid.size < B:
            continue  # the last partial block of the expert is dropped
        if eids[b] < 0:
            y[valid] = 0.0
        elif valid.size:
            y[valid] = ffn(x[valid // k], a["e0"] + eids[b], w)
    return y


def vllm_ok(a, x, w, out, B):
    idx = vllm_align(a, B)
    return idx, vllm_gemm(a, idx, x, w, out, B)


def vllm_reversed_segments(a, x, w, out, B):
    """Its atomics hand out each expert's slots in descending order: a
    legitimate order (WARN), the values still right."""
    idx = vllm_align(a, B)
    sti, ids = idx["sorted_token_ids"], a["topk_ids"].ravel()
    pos = 0
    for e in range(a["E"]):
        n = int((ids == e).sum())
        sti[pos:pos + n] = sti[pos:pos + n][::-1].copy()
        pos += -(-n // B) * B
    return idx, vllm_gemm(a, idx, x, w, out, B)


def vllm_off_by_one(a, x, w, out, B):
    idx = vllm_align(a, B, post_pad_delta=1)
    return idx, vllm_gemm(a, vllm_align(a, B), x, w, out, B)


def vllm_wrong_sentinel(a, x, w, out, B):
    idx = vllm_align(a, B, sentinel=-1)
    return idx, vllm_gemm(a, idx, x, w, out, B)


def vllm_drops_last_block(a, x, w, out, B):
    idx = vllm_align(a, B)
    return idx, vllm_gemm(a, idx, x, w, out, B, full_blocks_only=True)
