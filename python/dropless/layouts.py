"""Kernel layouts: convert between the flat sorted rows of a golden file
(x_sorted / y_sorted, [T*k, d], grouped by expert) and the layouts GPU
grouped GEMMs consume (doc/format.md, "Kernel layouts"):

    masked:MAX_M        DeepGEMM m_grouped_*_masked: [G, MAX_M, d], masked_m, expected_m
    contiguous:ALIGN    DeepGEMM m_grouped_*_contiguous: groups padded to ALIGN, m_indices (-1 pad)
    vllm-block:BLOCK    vLLM moe_align_block_size: sorted_token_ids (sentinel numel), expert_ids,
                        num_tokens_post_padded; x by token, y by flat assignment t*k+j
    batched:MAX_TOKENS  vLLM batched experts: [G, MAX_TOKENS, d], expert_num_tokens

    from dropless import layouts
    k = layouts.kernel_inputs("mixtral-small.h5", "masked:16")   # one call
    y = my_grouped_gemm(k["x"], k["masked_m"], k["expected_m"], out=k["y_out"])
    y_sorted = k["layout"].to_flat(y)                             # and back

Arrays may be numpy arrays or torch tensors (any device: index arrays go
where the data is); torch is only imported when a tensor is passed. The
index arrays are those of the C stage dl_layout_compute; Layout.compute
rebuilds them from group_sizes and sort_perm alone (same values, numpy).
"""

import numpy as np

KINDS = ("masked", "contiguous", "vllm-block", "batched")
PAD, NONLOCAL = -1, -2  # row codes of x_src / y_src


def parse(spec):
    """'masked:64' -> ('masked', 64)."""
    kind, _, p = str(spec).partition(":")
    if kind not in KINDS or not p.isdigit() or int(p) < 1:
        raise ValueError(f"not a layout: {spec!r} (masked:MAX_M, contiguous:ALIGN, "
                         "vllm-block:BLOCK, batched:MAX_TOKENS)")
    return kind, int(p)


def _round_up(n, a):
    return (n + a - 1) // a * a


class Layout:
    """One layout: its index arrays (`index`, the file's dataset names) and
    the source of each row of x and y (`x_src`, `y_src`: a sorted row, for
    vllm-block's x a token, or PAD / NONLOCAL)."""

    def __init__(self, kind, param, tokens, top_k, experts, e0, e1, index, x_src, y_src):
        self.kind, self.param = kind, int(param)
        self.tokens, self.top_k, self.experts = int(tokens), int(top_k), int(experts)
        self.e0, self.e1 = int(e0), int(e1)
        self.index, self.x_src, self.y_src = index, x_src, y_src

    @classmethod
    def compute(cls, spec, group_sizes, sort_perm, top_k, experts=None, expert_range=None):
        """The layout `spec` ('masked:64') of a routing: group_sizes [E] and
        sort_perm [T*k] of a golden's /forward; expert_range (e0, e1) for
        an expert-parallel rank's variant (local experts only)."""
        kind, p = parse(spec)
        sizes = np.asarray(group_sizes, dtype=np.int64)
        perm = np.asarray(sort_perm, dtype=np.int64)
        E = int(experts or sizes.size)
        e0, e1 = expert_range or (0, E)
        off = np.concatenate([[0], np.cumsum(sizes)])
        M = int(off[-1])
        T = M // int(top_k)
        loc = sizes[e0:e1]
        if kind in ("masked", "batched"):
            if loc.size and loc.max() > p:
                raise ValueError(f"{spec}: a group of {int(loc.max())} rows exceeds {p}")
            i = np.arange(p)
            rows = np.where(i[None, :] < loc[:, None], off[e0:e1, None] + i[None, :], PAD)
            src = rows.reshape(-1).astype(np.int32)
            name = "masked_m" if kind == "masked" else "expert_num_tokens"
            index = {name: loc.astype(np.int32)}
            if kind == "masked":
                used = int(loc.sum())
                index["expected_m"] = max(1, -(-used // loc.size)) if used else 1
            return cls(kind, p, T, top_k, E, e0, e1, index, src, src.copy())
        if kind == "contiguous":
            padded = _round_up(loc, p)
            goff = np.concatenate([[0], np.cumsum(padded)]).astype(np.int64)
            g = np.repeat(np.arange(loc.size), padded)
            r = np.arange(goff[-1]) - goff[:-1][g] if g.size else np.zeros(0, np.int64)
            valid = r < loc[g]
            src = np.where(valid, off[e0:e1][g] + r, PAD).astype(np.int32)
            mi = np.where(valid, g, -1).astype(np.int32)
            return cls(kind, p, T, top_k, E, e0, e1, {"m_indices": mi, "group_offsets": goff},
                       src, src.copy())
        return cls._vllm(p, sizes, off, perm, T, top_k, E, e0, e1)

    @classmethod
    def _vllm(cls, B, sizes, off, perm, T, k, E, e0, e1):
        M = T * k
        cap = M + E * (B - 1)
        sti = np.full(cap, M, np.int32)
        eids = np.full(-(-cap // B), -1, np.int32)
        y_src = np.full(M + 1, PAD, np.int32)
        pos = 0
        for e in range(E):
            n = int(sizes[e])
            sti[pos:pos + n] = perm[off[e]:off[e] + n]
            local = e0 <= e < e1
            y_src[perm[off[e]:off[e] + n]] = np.arange(off[e], off[e] + n) if local else NONLOCAL
            seg = _round_up(n, B)
            eids[pos // B:(pos + seg) // B] = e - e0 if local else -1
            pos += seg
        x_src = np.append(np.arange(T), PAD).astype(np.int32)
        index = {"sorted_token_ids": sti, "expert_ids": eids,
                 "num_tokens_post_padded": np.array([pos], np.int32)}
        return cls("vllm-block", B, T, k, E, e0, e1, index, x_src, y_src)

    @classmethod
    def from_group(cls, group, golden):
        """The layout of an h5py group /layouts/NAME of a golden file (its
        stored index arrays checked against the routing's)."""
        a = group.attrs
        fw = golden["forward"]
        lay = cls.compute(f"{a['kind'].decode()}:{int(a['param'])}", fw["group_sizes"][()],
                          fw["sort_perm"][()], int(golden["config"].attrs["top_k"]),
                          expert_range=(int(a["expert_begin"]), int(a["expert_end"])))
        for name, v in lay.index.items():
            if name in group and not np.array_equal(group[name][()], v):
                raise ValueError(f"{group.name}/{name} is not the layout of the file's routing")
        return lay

    # -- conversions -----------------------------------------------------

    def to_layout(self, flat, which="x", fill=0.0):
        """flat sorted rows [T*k, d] (vllm-block x: the tokens [T, d]) ->
        this layout's x (which='x') or y rows; padding rows `fill` (0, or
        nan for a poisoned buffer), other ranks' rows 0."""
        src = self.x_src if which == "x" else self.y_src
        return _gather(flat, src, fill)

    def to_flat(self, rows, which="y"):
        """This layout's y (or x) rows -> flat sorted rows [T*k, d] (vllm-block
        x: [T, d]); rows of other ranks' experts stay 0."""
        src = self.x_src if which == "x" else self.y_src
        n = self.tokens if (which == "x" and self.kind == "vllm-block") else self.tokens * self.top_k
        return _scatter(rows, src, n)

    def empty_output(self, d, poisoned=False, like=None):
        """The output buffer a kernel writes into: zeros, or NaN for the
        poisoned twin (then untouched padding stays NaN)."""
        shape = (len(self.y_src), int(d))
        if like is not None and _is_torch(like):
            import torch
            return torch.full(shape, float("nan") if poisoned else 0.0, dtype=like.dtype,
                              device=like.device)
        return np.full(shape, np.nan if poisoned else 0.0, np.float32)

    def shaped(self, rows):
        """masked / batched rows [G*cap, d] as [G, cap, d]; others unchanged."""
        if self.kind in ("masked", "batched"):
            return rows.reshape(self.e1 - self.e0, self.param, -1)
        return rows


def _is_torch(a):
    return type(a).__module__.split(".")[0] == "torch"


def _gather(src, code, fill):
    code = np.asarray(code)
    valid = code >= 0
    if _is_torch(src):
        import torch
        out = torch.full((code.size,) + tuple(src.shape[1:]), fill, dtype=src.dtype, device=src.device)
        out[torch.as_tensor(code == NONLOCAL, device=src.device)] = 0
        v = torch.as_tensor(valid, device=src.device)
        out[v] = src[torch.as_tensor(code[valid].astype(np.int64), device=src.device)]
        return out
    src = np.asarray(src)
    out = np.full((code.size,) + src.shape[1:], fill, dtype=src.dtype if src.size else np.float32)
    out[code == NONLOCAL] = 0
    out[valid] = src[code[valid]]
    return out


def _scatter(rows, code, n):
    code = np.asarray(code)
    valid = code >= 0
    if _is_torch(rows):
        import torch
        rows = rows.reshape(code.size, rows.shape[-1])
        out = torch.zeros((n, rows.shape[1]), dtype=rows.dtype, device=rows.device)
        out[torch.as_tensor(code[valid].astype(np.int64), device=rows.device)] = \
            rows[torch.as_tensor(valid, device=rows.device)]
        return out
    rows = np.asarray(rows)
    rows = rows.reshape(code.size, rows.shape[-1])
    out = np.zeros((n, rows.shape[1]), rows.dtype)
    out[code[valid]] = rows[valid]
    return out


def kernel_inputs(golden, spec, expert_range=None, poisoned=False):
    """A golden file (path or open h5py.File) as a kernel's inputs in
    layout `spec`: a dict with the index arrays (DeepGEMM's / vLLM's
    names), "x" (the dispatched activations in the layout, padding 0 or
    NaN), "y_out" (the output buffer to write into), "y_expected" (the
    golden's outputs in the layout), "w_gate", "w_up", "w_down" (local
    experts), and "layout" (the Layout, for to_flat)."""
    import h5py
    f = golden if isinstance(golden, h5py.File) else h5py.File(golden, "r")
    try:
        fw, inp = f["forward"], f["inputs"]
        lay = Layout.compute(spec, fw["group_sizes"][()], fw["sort_perm"][()],
                             int(f["config"].attrs["top_k"]), expert_range=expert_range)
        fill = np.nan if poisoned else 0.0
        xs = inp["x"][()] if lay.kind == "vllm-block" else fw["x_sorted"][()]
        out = dict(lay.index)
        out.update(layout=lay, x=lay.to_layout(xs, "x", fill),
                   y_expected=lay.to_layout(fw["y_sorted"][()], "y", fill),
                   y_out=lay.empty_output(xs.shape[1], poisoned))
        for w in ("w_gate", "w_up", "w_down"):
            if w in inp:
                out[w] = inp[w][lay.e0:lay.e1]
        return out
    finally:
        if f is not golden:
            f.close()
