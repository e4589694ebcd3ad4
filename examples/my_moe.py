"""A token-dropless MoE layer in numpy, forward and backward, as a kernel
author might write a reference: every stage computed in float64 from the
stored values before it and stored in its storage type (bf16/fp16
activations, fp32 router and weight gradients). It returns every stage
value it stores, so the check can localise an error to its stage.

This is the "kernel under test" of examples/test_my_kernel.py, not part of
dropless: dropless only judges what it returns."""

import ml_dtypes
import numpy as np

STORE = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _route(cfg, scores, bias):
    """Top-k experts per token (ties to the lower index), optionally
    group-limited, on scores (+ bias, stored in fp32)."""
    T, E = scores.shape
    key = scores.astype(np.float64)
    if cfg["has_bias"]:
        key = (key + bias).astype(np.float32).astype(np.float64)
    ng = cfg["n_group"]
    if ng > 1:
        G = E // ng
        terms = {"max": 1, "top2_sum": 2}.get(cfg["group_score"], cfg["top_k"] // cfg["topk_group"])
        top = -np.sort(-key.reshape(T, ng, G), axis=-1)[..., :min(max(terms, 1), G)]
        gscore = top.sum(-1).astype(np.float32)
        keep = np.argsort(-gscore, axis=-1, kind="stable")[:, :cfg["topk_group"]]
        mask = np.zeros((T, ng), bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        key = np.where(np.repeat(mask, G, axis=1), key, -np.inf)
    return np.argsort(-key, axis=-1, kind="stable")[:, :cfg["top_k"]].astype(np.int32)


def _shared_forward(cfg, x, shared_w_gate, shared_w_up, shared_w_down, shared_gate_weight=None):
    """The shared experts (one SwiGLU MLP of width shared_experts * shared_ffn)
    and, with shared_gate, their sigmoid gate: the values they store."""
    act, f64 = STORE[cfg["dtype"]], np.float64
    D = lambda a: np.asarray(a, f64)
    fw = {"shared_h_gate": (x @ D(shared_w_gate)).astype(act),
          "shared_h_up": (x @ D(shared_w_up)).astype(act)}
    hg, hu = D(fw["shared_h_gate"]), D(fw["shared_h_up"])
    fw["shared_h_act"] = (hg * _sigmoid(hg) * hu).astype(act)
    fw["shared_y"] = (D(fw["shared_h_act"]) @ D(shared_w_down)).astype(act)
    if cfg.get("shared_gate"):
        fw["shared_gate_logit"] = (x @ D(shared_gate_weight)).astype(np.float32)
        fw["shared_gate"] = _sigmoid(D(fw["shared_gate_logit"])).astype(np.float32)
    return fw


def moe_forward(cfg, x, router_weight, w_down, expert_bias=None, w_gate=None, w_up=None,
                shared_w_gate=None, shared_w_up=None, shared_w_down=None,
                shared_gate_weight=None, router_bias=None, token_ids=None, hash_table=None, **_):
    act, f64 = STORE[cfg["dtype"]], np.float64
    T, E, k = cfg["tokens"], cfg["experts"], cfg["top_k"]
    x = np.asarray(x, f64)
    logits = x @ np.asarray(router_weight, f64)
    if cfg.get("router_bias"):  # gpt-oss: a bias on the logits
        logits = logits + np.asarray(router_bias, f64)
    logits = logits.astype(np.float32)
    z = logits.astype(f64)
    if cfg["score_function"] == "softmax":
        e = np.exp(z - (z.max(-1, keepdims=True) if T else 0))
        scores = (e / e.sum(-1, keepdims=True)).astype(np.float32)
    elif cfg["score_function"] == "sqrtsoftplus":
        scores = np.sqrt(np.logaddexp(0.0, z)).astype(np.float32)
    elif cfg["score_function"] == "softmax_topk":  # top-k on the logits, softmax over those
        scores = logits
    else:
        scores = _sigmoid(z).astype(np.float32)
    if cfg.get("hash_vocab"):  # DeepSeek-V4's hash layers: the table chooses
        ids = np.asarray(hash_table, np.int32)[np.asarray(token_ids, np.int64)].reshape(T, k)
    else:
        ids = _route(cfg, scores, expert_bias)
    picked = np.take_along_axis(scores.astype(f64), ids.astype(np.int64), axis=1)
    if cfg["score_function"] == "softmax_topk":
        e = np.exp(picked - (picked.max(-1, keepdims=True) if T else 0))
        picked = e / e.sum(-1, keepdims=True)
    denom = picked.sum(-1, keepdims=True) if cfg["renormalize"] else 1.0
    weights = (cfg["scaling"] * picked / denom).astype(np.float32)
    win = cfg.get("weight_on_input")  # Llama-4: the score scales the expert's input
    if win:
        weights, w_in = np.ones_like(weights), picked
    perm = np.argsort(ids.reshape(-1), kind="stable").astype(np.int32)
    inv = np.argsort(perm, kind="stable").astype(np.int32)
    # zero experts (ids >= E, LongCat-Flash) sort after the real ones: the identity tail
    sizes = np.bincount(ids.reshape(-1), minlength=E)[:E].astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    xs = x[perm // k]
    if win:
        xs = xs * w_in.reshape(-1)[perm][:, None]  # one product, rounded once below
        xs = xs.astype(act).astype(f64)

    def grouped(a, w):  # rows of expert e times w[e]
        out = np.zeros((a.shape[0], w.shape[2]))
        for e in range(E):
            s, t = offsets[e], offsets[e + 1]
            out[s:t] = a[s:t] @ np.asarray(w[e], f64)
        return out

    fw = dict(router_logits=logits, router_scores=scores, topk_ids=ids, topk_weights=weights,
              sort_perm=perm, inv_perm=inv, group_sizes=sizes, group_offsets=offsets,
              x_sorted=xs.astype(act))
    h = xs
    if cfg["ffn_kind"] == "swiglu":
        fw["h_gate"] = grouped(xs, w_gate).astype(act)
        fw["h_up"] = grouped(xs, w_up).astype(act)
        hg, hu = fw["h_gate"].astype(f64), fw["h_up"].astype(f64)
        fw["h_act"] = (hg * _sigmoid(hg) * hu).astype(act)
        h = fw["h_act"].astype(f64)
    fw["y_sorted"] = grouped(h, w_down).astype(act)
    fw["y_sorted"][offsets[E]:] = fw["x_sorted"][offsets[E]:]  # a zero expert's output: its input
    y = fw["y_sorted"].astype(f64)[inv].reshape(T, k, cfg["hidden"])
    out = np.einsum("tkd,tk->td", y, weights.astype(f64))
    if cfg.get("shared_experts"):  # always-on experts, added (scaled by their gate)
        fw.update(_shared_forward(cfg, x, shared_w_gate, shared_w_up, shared_w_down,
                                  shared_gate_weight))
        g = fw["shared_gate"].astype(f64)[:, None] if cfg.get("shared_gate") else 1.0
        out = out + g * fw["shared_y"].astype(f64)
    fw["out"] = out.astype(act)
    return fw


def _shared_backward(cfg, inputs, fw, dout):
    """The shared experts' gradients and their terms of d_x."""
    act, f64 = STORE[cfg["dtype"]], np.float64
    D = lambda a: np.asarray(a, f64)
    x, bw, dx = D(inputs["x"]), {}, 0.0
    g = 1.0
    if cfg.get("shared_gate"):
        g = D(fw["shared_gate"])[:, None]
        bw["d_shared_gate"] = (dout * D(fw["shared_y"])).sum(-1).astype(np.float32)
        gg = g[:, 0]
        bw["d_shared_gate_logit"] = (D(bw["d_shared_gate"]) * gg * (1 - gg)).astype(np.float32)
        dl = D(bw["d_shared_gate_logit"])
        bw["d_shared_gate_weight"] = (x.T @ dl).astype(np.float32)
        dx = np.outer(dl, D(inputs["shared_gate_weight"]))
    bw["d_shared_y"] = (g * dout).astype(act)
    dy = D(bw["d_shared_y"])
    bw["d_shared_h_act"] = (dy @ D(inputs["shared_w_down"]).T).astype(act)
    bw["d_shared_w_down"] = (D(fw["shared_h_act"]).T @ dy).astype(np.float32)
    hg, hu, dha = D(fw["shared_h_gate"]), D(fw["shared_h_up"]), D(bw["d_shared_h_act"])
    sg = _sigmoid(hg)
    bw["d_shared_h_gate"] = (dha * hu * sg * (1 + hg * (1 - sg))).astype(act)
    bw["d_shared_h_up"] = (dha * hg * sg).astype(act)
    dhg, dhu = D(bw["d_shared_h_gate"]), D(bw["d_shared_h_up"])
    bw["d_shared_w_gate"] = (x.T @ dhg).astype(np.float32)
    bw["d_shared_w_up"] = (x.T @ dhu).astype(np.float32)
    dx = dx + dhg @ D(inputs["shared_w_gate"]).T + dhu @ D(inputs["shared_w_up"]).T
    return bw, dx


def moe_backward(cfg, inputs, fw):
    """Every gradient, from the stored forward values and inputs["d_out"]."""
    act, f64 = STORE[cfg["dtype"]], np.float64
    T, E, k = cfg["tokens"], cfg["experts"], cfg["top_k"]
    D = lambda a: np.asarray(a, f64)
    x, wr, dout = D(inputs["x"]), D(inputs["router_weight"]), D(inputs["d_out"])
    perm, inv, off = fw["sort_perm"], fw["inv_perm"], fw["group_offsets"]
    ids, w, s = fw["topk_ids"], D(fw["topk_weights"]), D(fw["router_scores"])

    def rows_times_wT(a, wts):  # a[rows of e] @ W[e]^T
        out = np.zeros((a.shape[0], wts.shape[1]))
        for e in range(E):
            out[off[e]:off[e + 1]] = a[off[e]:off[e + 1]] @ D(wts[e]).T
        return out

    def wgrad(a, b):  # per expert a_e^T b_e, stored in fp32
        out = np.zeros((E, a.shape[1], b.shape[1]))
        for e in range(E):
            out[e] = a[off[e]:off[e + 1]].T @ b[off[e]:off[e + 1]]
        return out.astype(np.float32)

    bw = {}
    y_tok = D(fw["y_sorted"])[inv].reshape(T, k, cfg["hidden"])
    bw["d_topk_weights"] = np.einsum("td,tkd->tk", dout, y_tok).astype(np.float32)
    dy = (w.reshape(-1)[perm][:, None] * dout[perm // k]).astype(act)
    bw["d_y_sorted"], dy = dy, D(dy)
    if cfg["ffn_kind"] == "swiglu":
        hg, hu, ha = D(fw["h_gate"]), D(fw["h_up"]), D(fw["h_act"])
        bw["d_h_act"] = rows_times_wT(dy, inputs["w_down"]).astype(act)
        bw["d_w_down"] = wgrad(ha, dy)
        dha, sg = D(bw["d_h_act"]), _sigmoid(hg)
        bw["d_h_gate"] = (dha * hu * sg * (1 + hg * (1 - sg))).astype(act)
        bw["d_h_up"] = (dha * hg * sg).astype(act)
        dhg, dhu, xs = D(bw["d_h_gate"]), D(bw["d_h_up"]), D(fw["x_sorted"])
        bw["d_x_sorted"] = (rows_times_wT(dhg, inputs["w_gate"]) +
                            rows_times_wT(dhu, inputs["w_up"])).astype(act)
        bw["d_w_gate"], bw["d_w_up"] = wgrad(xs, dhg), wgrad(xs, dhu)
    else:
        bw["d_x_sorted"] = rows_times_wT(dy, inputs["w_down"]).astype(act)
        bw["d_w_down"] = wgrad(D(fw["x_sorted"]), dy)
    bw["d_x_sorted"][off[E]:] = bw["d_y_sorted"][off[E]:]  # the identity's VJP (zero experts)
    dtw = D(bw["d_topk_weights"])
    picked = np.take_along_axis(s, ids.astype(np.int64), axis=1)
    win = cfg.get("weight_on_input")
    if win:  # Llama-4: the scores' gradient comes back from the scaled input
        dtw = (D(bw["d_x_sorted"])[inv] * np.repeat(x, k, 0)).sum(-1).reshape(T, k)
    S = picked.sum(-1, keepdims=True) if cfg["renormalize"] else np.ones((T, 1))
    dpick = cfg["scaling"] * (dtw / S - ((dtw * picked).sum(-1, keepdims=True) / S ** 2
                                         if cfg["renormalize"] else 0))
    if cfg["score_function"] == "softmax_topk":  # c p_j (dw_j - sum_i p_i dw_i)
        e = np.exp(picked - (picked.max(-1, keepdims=True) if T else 0))
        p = e / e.sum(-1, keepdims=True)
        dpick = cfg["scaling"] * p * (dtw - (p * dtw).sum(-1, keepdims=True))
    ds = np.zeros(s.shape)  # [T, E + zero experts]
    np.put_along_axis(ds, ids.astype(np.int64), dpick, axis=1)
    bw["d_router_scores"] = ds.astype(np.float32)
    ds = D(bw["d_router_scores"])
    if cfg["score_function"] == "softmax":
        dl = s * ds - s * (s * ds).sum(-1, keepdims=True)
    elif cfg["score_function"] == "sqrtsoftplus":  # ds sigmoid(l) / (2 s), sigmoid = 1 - e^-s^2
        with np.errstate(divide="ignore", invalid="ignore"):
            dl = np.where(s > 0, ds * -np.expm1(-s * s) / (2 * s), 0.0)
    elif cfg["score_function"] == "softmax_topk":
        dl = ds
    else:
        dl = ds * s * (1 - s)
    bw["d_router_logits"] = dl.astype(np.float32)
    dl = D(bw["d_router_logits"])
    bw["d_router_weight"] = (x.T @ dl).astype(np.float32)
    if cfg.get("router_bias"):
        bw["d_router_bias"] = dl.sum(0).astype(np.float32)
    wi = picked[:, :, None] if win else 1.0
    dxs = (D(bw["d_x_sorted"])[inv].reshape(T, k, cfg["hidden"]) * wi).sum(1)
    dx_shared = 0.0
    if cfg.get("shared_experts"):
        sbw, dx_shared = _shared_backward(cfg, inputs, fw, dout)
        bw.update(sbw)
    bw["d_x"] = (dxs + dl @ wr.T + dx_shared).astype(act)
    return bw
