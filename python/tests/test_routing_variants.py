"""issue 26's routing variants of route3 as Python sees them: Llama-4's
score on the expert input (weight_on_input) and DeepSeek-V4's hash routing
(hash_vocab, the token ids and the table in the inputs). The catalogue
and goldens carry the keys; the golden's arrays have the documented
meaning (checked here against numpy in float64, a formula of their own);
the golden's values are CONFORMANT and a candidate with one of the
variant's values wrong FAILs at that value."""
import numpy as np

import dropless


def test_catalogue_keys():
    cs = {c.name: c for c in dropless.cases(large=False)}
    assert cs["llama4-like-bf16"].config["weight_on_input"] == 1
    assert cs["deepseek-v4-hash"].config["hash_vocab"] == 32
    assert "weight_on_input" not in cs["mixtral-small"].config
    assert "hash_vocab" not in cs["mixtral-small"].config


def test_llama4_meaning(goldens):
    g = goldens("llama4-like")
    x, s = g.inputs["x"].astype(np.float64), g.forward["router_scores"].astype(np.float64)
    ids, sp, inv = g.forward["topk_ids"], g.forward["sort_perm"], g.forward["inv_perm"]
    T, k = ids.shape
    w = np.take_along_axis(s, ids, 1).reshape(-1)
    want = (x[sp // k] * w[sp][:, None]).astype(np.float32)  # one product, rounded once
    assert np.array_equal(g.forward["x_sorted"], want)
    assert np.all(g.forward["topk_weights"] == 1.0)
    dxs = g.backward["d_x_sorted"].astype(np.float64)
    dot = (dxs[inv] * np.repeat(x, k, 0)).sum(1).reshape(T, k)
    got = np.take_along_axis(g.backward["d_router_scores"], ids, 1)
    assert np.allclose(got, dot, rtol=1e-6, atol=1e-7)


def test_llama4_unscaled_input_fails(goldens):
    g = goldens("llama4-like")
    outs = {n: g.forward[n] for n in ("topk_ids", "sort_perm", "inv_perm", "x_sorted")}
    assert dropless.check(g, outs).conformant
    k = g.dims["k"]
    outs["x_sorted"] = g.inputs["x"][g.forward["sort_perm"] // k]  # the weight left out
    r = dropless.check(g, outs)
    assert not r.conformant and [c.stage for c in r.failures] == ["x_sorted"]


def test_hash_meaning_and_wrong_ids(goldens):
    g = goldens("deepseek-v4-hash")
    tid, tab, ids = g.inputs["token_ids"], g.inputs["hash_table"], g.forward["topk_ids"]
    assert tab.shape == (32, g.dims["k"]) and np.array_equal(ids, tab[tid])
    assert np.all(np.isinf(g.forward["tie_margin"]))
    s = np.take_along_axis(g.forward["router_scores"].astype(np.float64), ids, 1)
    assert np.allclose(g.forward["topk_weights"], 1.5 * s / s.sum(1, keepdims=True), rtol=1e-6)
    outs = {"topk_ids": ids.copy(), "topk_weights": g.forward["topk_weights"]}
    assert dropless.check(g, outs).conformant
    outs["topk_ids"][3, 0] = min(set(range(g.dims["E"])) - set(ids[3]))  # not the table's
    r = dropless.check(g, outs)
    assert not r.conformant and "topk_ids" in [c.stage for c in r.failures]
