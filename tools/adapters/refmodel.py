"""A small float64 numpy model of the layer, for testing the adapters'
plumbing where `dropless gen` is not available.

Every stage is computed in binary64 from the stored (rounded) values before
it and rounded to its storage type, as the oracle does; but binary64 is not
exact so a file made here is NOT a golden file: it is close to one (an element
now and then one unit in the last place off) and good for checking that an
adapter reads, runs and writes the right things.
"""

import numpy as np

from . import common


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def select(scores, bias, cfg):
    """Top-k ids [T,k] (best first, ties to the lower index) and the keys
    used for selection, as the oracle defines them (route.h)."""
    T, E = scores.shape
    k = cfg["top_k"]
    key = scores.astype(np.float64)
    if cfg["has_bias"]:
        key = (scores.astype(np.float64) + bias.astype(np.float64)).astype(np.float32).astype(np.float64)
    ng, kg = cfg["n_group"], cfg["topk_group"]
    sel = key.copy()
    if ng > 1:
        G = E // ng
        kgrp = key.reshape(T, ng, G)
        srt = -np.sort(-kgrp, axis=-1)
        gs = srt[..., :common.group_terms(cfg)].sum(-1).astype(np.float32)
        keep = np.argsort(-gs, axis=-1, kind="stable")[:, :kg]
        mask = np.zeros((T, ng), bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        sel = np.where(np.repeat(mask, G, axis=1), key, -np.inf)
    ids = np.argsort(-sel, axis=-1, kind="stable")[:, :k].astype(np.int32)
    return ids, sel


def make_golden(path, case="plumbing", T=16, d=16, f=16, E=8, k=2, score="softmax",
                n_group=1, topk_group=1, group_score="max", renormalize=1, scaling=1.0,
                has_bias=0, ffn_kind="swiglu", dtype="fp32", seed=1):
    """Writes a golden-layout file made with this model (see the module
    docstring for what it is not)."""
    import h5py
    if ffn_kind == "plain":
        f = d
    rng = np.random.default_rng(seed)
    act = dtype
    R = lambda a, t: common.round_to(np.asarray(a, dtype=np.float64), t)
    cfg = dict(tokens=T, hidden=d, ffn=f, experts=E, top_k=k, score_function=score,
               n_group=n_group, topk_group=topk_group, group_score=group_score,
               renormalize=renormalize, scaling=scaling, has_bias=has_bias,
               ffn_kind=ffn_kind, dtype=dtype)
    x = R(rng.standard_normal((T, d)), act)
    wr = R(rng.standard_normal((d, E)) / np.sqrt(d), "fp32")
    bias = R(rng.standard_normal(E) * 0.1, "fp32")
    wg = R(rng.standard_normal((E, d, f)) / np.sqrt(d), act)
    wu = R(rng.standard_normal((E, d, f)) / np.sqrt(d), act)
    wd = R(rng.standard_normal((E, f, d)) / np.sqrt(f), act)
    dout = R(rng.standard_normal((T, d)), act)
    inputs = dict(x=x, router_weight=wr, w_down=wd, d_out=dout)
    if has_bias:
        inputs["expert_bias"] = bias
    if ffn_kind == "swiglu":
        inputs.update(w_gate=wg, w_up=wu)
    fw, bw = compute(cfg, inputs)

    with h5py.File(path, "w") as fh:
        fh.attrs["format"] = common.FORMAT
        fh.attrs["format_version"] = np.int64(common.FORMAT_VERSION)
        fh.attrs["generator"] = "dropless adapters refmodel (NOT a golden file)"
        fh.attrs["case"] = case
        fh.attrs["seed"] = np.uint64(seed)
        c = fh.create_group("config")
        for kk, v in cfg.items():
            c.attrs[kk] = v if isinstance(v, str) else (np.float64(v) if kk == "scaling" else np.int64(v))
        for grp, vals in (("inputs", inputs), ("forward", fw), ("backward", bw)):
            for name, a in vals.items():
                g_, n_, elem, a_act, dims, cond = common.SPEC[grp + "/" + name]
                if elem == "i32":
                    a, dt = np.asarray(a, np.int32), "int32"
                elif elem == "i64":
                    a, dt = np.asarray(a, np.int64), "int64"
                else:
                    a, dt = np.asarray(a, np.float32), (dtype if a_act else "fp32")
                ds = fh.create_dataset(grp + "/" + name, data=a)
                ds.attrs["dtype"] = dt
    return path


def compute(cfg, inputs):
    """Every forward and backward stage ({name: array}, {name: array}) of the
    layer for cfg (a /config dict) and inputs ({name: array})."""
    T, d, f, E, k = (cfg[n] for n in ("tokens", "hidden", "ffn", "experts", "top_k"))
    act = cfg["dtype"]
    score, renormalize, scaling = cfg["score_function"], cfg["renormalize"], cfg["scaling"]
    ffn_kind = cfg["ffn_kind"]
    R = lambda a, t: common.round_to(np.asarray(a, dtype=np.float64), t)
    x, wr, wd, dout = (inputs[n] for n in ("x", "router_weight", "w_down", "d_out"))
    bias = inputs.get("expert_bias")
    wg, wu = inputs.get("w_gate"), inputs.get("w_up")
    D = lambda a: np.asarray(a, dtype=np.float64)

    logits = R(D(x) @ D(wr), "fp32")
    if score == "softmax":
        z = D(logits) - D(logits).max(-1, keepdims=True) if T else D(logits)
        ez = np.exp(z)
        scores = R(ez / ez.sum(-1, keepdims=True), "fp32")
    else:
        scores = R(_sigmoid(D(logits)), "fp32")
    ids, sel = select(scores, bias, cfg)
    s_sel = np.take_along_axis(D(scores), ids.astype(np.int64), axis=1)
    S = s_sel.sum(-1, keepdims=True) if renormalize else np.ones((T, 1))
    w = R(scaling * s_sel / S, "fp32")
    srt = -np.sort(-sel, axis=-1)
    margin = (srt[:, k - 1] - srt[:, k]) if k < E else np.full(T, np.inf)
    margin = R(np.where(np.isfinite(margin), margin, np.inf), "fp32")
    flat = ids.reshape(-1)
    perm = np.argsort(flat, kind="stable").astype(np.int32)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(T * k, dtype=np.int32)
    sizes = np.bincount(flat, minlength=E).astype(np.int64)
    offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    tok = perm // k
    xs = x[tok]

    def gmm(a, wts):
        out = np.zeros((a.shape[0], wts.shape[2]))
        for e in range(E):
            s, t = offs[e], offs[e + 1]
            out[s:t] = D(a[s:t]) @ D(wts[e])
        return out

    def gmm_t(a, wts):  # a @ W[e]^T
        out = np.zeros((a.shape[0], wts.shape[1]))
        for e in range(E):
            s, t = offs[e], offs[e + 1]
            out[s:t] = D(a[s:t]) @ D(wts[e]).T
        return out

    def ragged_k(a, b):  # per expert a_e^T b_e
        out = np.zeros((E, a.shape[1], b.shape[1]))
        for e in range(E):
            s, t = offs[e], offs[e + 1]
            out[e] = D(a[s:t]).T @ D(b[s:t])
        return out

    fw, bw = {}, {}
    if ffn_kind == "swiglu":
        hg = R(gmm(xs, wg), act)
        hu = R(gmm(xs, wu), act)
        ha = R(D(hg) * _sigmoid(D(hg)) * D(hu), act)
        y = R(gmm(ha, wd), act)
    else:
        y = R(gmm(xs, wd), act)
    wflat = w.reshape(-1)
    out = np.zeros((T, d))
    for j in range(k):
        out += D(w[:, j:j + 1]) * D(y[inv.reshape(T, k)[:, j]])
    out = R(out, act)
    fw.update(router_logits=logits, router_scores=scores, topk_ids=ids, topk_weights=w,
              tie_margin=margin, sort_perm=perm, inv_perm=inv, group_sizes=sizes,
              group_offsets=offs, x_sorted=xs, y_sorted=y, out=out)
    if ffn_kind == "swiglu":
        fw.update(h_gate=hg, h_up=hu, h_act=ha)

    g_sorted = D(dout)[tok]
    dtw = R((D(dout)[:, None, :] * D(y)[inv.reshape(T, k)]).sum(-1), "fp32")
    dy = R(D(wflat[perm])[:, None] * g_sorted, act)
    if ffn_kind == "swiglu":
        dha = R(gmm_t(dy, wd), act)
        dwd = R(ragged_k(ha, dy), "fp32")
        sg = _sigmoid(D(hg))
        dhg = R(D(dha) * D(hu) * sg * (1 + D(hg) * (1 - sg)), act)
        dhu = R(D(dha) * D(hg) * sg, act)
        dxs = R(gmm_t(dhg, wg) + gmm_t(dhu, wu), act)
        dwg = R(ragged_k(xs, dhg), "fp32")
        dwu = R(ragged_k(xs, dhu), "fp32")
        bw.update(d_h_act=dha, d_h_gate=dhg, d_h_up=dhu, d_w_gate=dwg, d_w_up=dwu)
    else:
        dxs = R(gmm_t(dy, wd), act)
        dwd = R(ragged_k(xs, dy), "fp32")
    dws = np.zeros((T, E))
    Sd = S[:, 0]
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            if renormalize:
                dws[t, e] = scaling / Sd[t] ** 2 * (D(dtw[t, j]) * Sd[t] - (D(dtw[t]) * s_sel[t]).sum())
            else:
                dws[t, e] = scaling * D(dtw[t, j])
    dws = R(dws, "fp32")
    s64 = D(scores)
    if score == "softmax":
        dl = s64 * D(dws) - s64 * (s64 * D(dws)).sum(-1, keepdims=True)
    else:
        dl = D(dws) * s64 * (1 - s64)
    dl = R(dl, "fp32")
    dwr = R(D(x).T @ D(dl), "fp32")
    dx = D(dl) @ D(wr).T
    for j in range(k):
        dx += D(dxs)[inv.reshape(T, k)[:, j]]
    dx = R(dx, act)
    bw.update(d_topk_weights=dtw, d_y_sorted=dy, d_w_down=dwd, d_x_sorted=dxs,
              d_router_scores=dws, d_router_logits=dl, d_router_weight=dwr, d_x=dx)
    return fw, bw
