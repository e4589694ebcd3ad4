"""LongCat-Flash's zero (identity) experts as Python sees them (issue 26):
the catalogue carries zero_experts and the router's width R = E + Z; the
golden's arrays have the documented meaning (checked against numpy in
float64, a formula of its own: softmax over all E + Z columns, the
selection on scores plus the bias, weights scaling * score, an expert id
>= E whose output row is its input); the golden's values are CONFORMANT and
candidates with the identity rows wrong or dropped are NOT, the dropped
identity pair named."""
import numpy as np
import pytest

import dropless

CASES = ["longcat-like", "longcat-like-bf16", "longcat-like-fp16"]


def test_catalogue_keys():
    cs = {c.name: c for c in dropless.cases(large=False)}
    for n in CASES:
        assert cs[n].config["zero_experts"] == 4 and cs[n].dims["R"] == 12
        assert cs[n].dims["E"] == 8
    assert "zero_experts" not in cs["mixtral-small"].config
    assert cs["mixtral-small"].dims["R"] == cs["mixtral-small"].dims["E"]


def identity_rows(g):
    E, k = g.dims["E"], g.dims["k"]
    sp = g.forward["sort_perm"]
    return g.forward["topk_ids"].reshape(-1)[sp] >= E, sp // k


@pytest.mark.parametrize("name", CASES)
def test_meaning(goldens, name):
    g = goldens(name)
    E, Z, k = g.dims["E"], 4, g.dims["k"]
    x, lg = g.inputs["x"].astype(np.float64), g.forward["router_logits"].astype(np.float64)
    assert lg.shape == (g.dims["T"], E + Z) and g.inputs["router_weight"].shape[1] == E + Z
    p = np.exp(lg - lg.max(1, keepdims=True))
    s = g.forward["router_scores"].astype(np.float64)
    assert np.allclose(s, p / p.sum(1, keepdims=True), rtol=1e-6, atol=1e-9)
    ids = g.forward["topk_ids"]
    key = s + g.inputs["expert_bias"].astype(np.float64)  # the bias for the selection only
    worst_in = np.take_along_axis(key, ids, 1).min(1)
    out_mask = np.ones_like(key, bool)
    np.put_along_axis(out_mask, ids, False, 1)
    assert np.all(worst_in >= np.where(out_mask, key, -np.inf).max(1))
    w = g.forward["topk_weights"]
    assert np.array_equal(w, (6.0 * np.take_along_axis(s, ids, 1)).astype(np.float32))
    ident, tok = identity_rows(g)
    n_id = int(ident.sum())
    assert 0 < n_id < ident.size and np.all(ident[ident.size - n_id:])  # the tail
    assert g.forward["group_sizes"].sum() == ident.size - n_id
    ys, xs = g.forward["y_sorted"], g.forward["x_sorted"]
    assert np.array_equal(ys[ident], xs[ident]) and np.array_equal(xs[ident], g.inputs["x"][tok[ident]])
    assert np.all(g.forward["h_gate"][ident] == 0) and np.all(g.forward["h_act"][ident] == 0)
    dy, dxs = g.backward["d_y_sorted"], g.backward["d_x_sorted"]
    assert np.array_equal(dxs[ident], dy[ident])  # the identity's VJP
    # out: each token's weighted rows, the zero experts' its own input
    inv = g.forward["inv_perm"].reshape(-1, k)
    want = (w[..., None].astype(np.float64) * ys.astype(np.float64)[inv]).sum(1)
    tol = {"longcat-like": 1e-5, "longcat-like-bf16": 2e-2, "longcat-like-fp16": 2e-3}[name]
    assert np.allclose(g.forward["out"], want, rtol=tol, atol=tol)
    assert np.all(g.backward["d_w_down"].reshape(E, -1).shape[0] == E)


def full(g):
    outs = dict(g.forward)
    outs.update(g.backward)
    return {n: v for n, v in outs.items() if n != "tie_margin"}


@pytest.mark.parametrize("name", ["longcat-like", "longcat-like-bf16"])
def test_both_ways(goldens, name):
    g = goldens(name)
    assert dropless.check(g, full(g)).conformant
    ident, tok = identity_rows(g)
    k = g.dims["k"]
    # identity rows scaled by their weight (the combine weights them again)
    bad = full(g)
    wflat = g.forward["topk_weights"].reshape(-1)[g.forward["sort_perm"]]
    bad["y_sorted"] = bad["y_sorted"].copy()
    bad["y_sorted"][ident] = (bad["y_sorted"][ident] * wflat[ident][:, None]).astype(np.float32)
    r = dropless.check(g, bad)
    assert not r.conformant and "y_sorted" in [c.stage for c in r.failures]
    # one identity pair dropped from out (fused: out and d_x only)
    p = int(np.flatnonzero(ident)[0])
    fl = int(g.forward["sort_perm"][p])
    t, j = fl // k, fl % k
    fused = {"out": g.forward["out"].copy(), "d_x": g.backward["d_x"]}
    assert dropless.check(g, fused).conformant
    wt = np.float64(g.forward["topk_weights"][t, j])
    fused["out"][t] = (fused["out"][t].astype(np.float64) - wt * g.inputs["x"][t]).astype(
        fused["out"].dtype)
    r = dropless.check(g, fused)
    assert not r.conformant and (t, j) in r.dropped


@pytest.mark.parametrize("fill", [np.nan, 1e30])
def test_hidden_tail_ignored(goldens, fill):
    """A kernel never writes the hidden arrays' rows of the identity tail
    (its GEMMs run over the real experts' rows): garbage there is no
    finding, while y_sorted's tail (a real output) stays judged."""
    g = goldens("longcat-like-bf16")
    ident, _ = identity_rows(g)
    outs = full(g)
    for n in ("h_gate", "h_up", "h_act", "d_h_act", "d_h_gate", "d_h_up"):
        outs[n] = outs[n].copy()
        outs[n][ident] = fill
    r = dropless.check(g, outs)
    assert r.conformant, r.failures
    outs["y_sorted"] = outs["y_sorted"].copy()
    outs["y_sorted"][ident] = fill
    r = dropless.check(g, outs)
    assert not r.conformant and "y_sorted" in [c.stage for c in r.failures]
