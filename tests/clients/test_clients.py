"""Tests of the clients harness's own mapping code (tools/clients): the
weight layouts against transformers' own experts, the case filters in both
directions, the expectations' matching. Runs in the clients venv (torch,
transformers) before the harness (`make check-clients`); prints
'N passed, N failed' and exits 1 on a failure."""

import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "clients"))

import torch  # noqa: E402

import clients as C  # noqa: E402
import run as R  # noqa: E402

# configurations as dropless.load gives them (Golden.config), by routing kind
SOFTMAX_RENORM = dict(tokens=8, hidden=8, ffn=4, experts=4, top_k=2, score_function="softmax",
                      n_group=1, topk_group=1, group_score="max", renormalize=1, scaling=1.0,
                      has_bias=0, ffn_kind="swiglu", dtype="fp32")
SOFTMAX_PLAIN = dict(SOFTMAX_RENORM, renormalize=0)
DSV3 = dict(SOFTMAX_RENORM, experts=8, top_k=4, score_function="sigmoid", n_group=4, topk_group=2,
            group_score="top2_sum", scaling=2.5, has_bias=1)
GROUPED_MAX = dict(SOFTMAX_PLAIN, experts=8, top_k=2, n_group=4, topk_group=2, scaling=2.0)
PLAIN_FFN = dict(SOFTMAX_RENORM, ffn_kind="plain")
# the branches route's and ffn's /config keys for gpt-oss
GPT_OSS = dict(SOFTMAX_RENORM, score_function="softmax_topk", router_bias=1,
               ffn_kind="swiglu-clamp", act_alpha=1.702, act_limit=7.0, ffn_bias=1)
# the branch shared's /config keys
QWEN2_SHARED = dict(SOFTMAX_PLAIN, shared_experts=1, shared_ffn=16, shared_gate=1)
DSV3_SHARED = dict(DSV3, shared_experts=2, shared_ffn=4, shared_gate=0)
# DeepSeek-V4's scoring, its hash layer (the branch route's hash_vocab)
DSV4 = dict(DSV3, score_function="sqrtsoftplus", n_group=1, topk_group=1, scaling=1.5)
DSV4_HASH = dict(DSV4, has_bias=0, hash_vocab=32)
SOFTMAX_TOPK = dict(SOFTMAX_PLAIN, score_function="softmax_topk")


class Experts:  # the layout attributes transformers' experts carry
    def __init__(self, concatenated, transposed):
        self.is_concatenated, self.is_transposed = concatenated, transposed


def test_gate_up_round_trip():
    # every layout: the gradient split inverts the weight's packing
    wg, wu = torch.randn(3, 5, 4), torch.randn(3, 5, 4)
    for conc in (True, False):
        for tr in (True, False):
            ex = Experts(conc, tr)
            g, u = C._split_gate_up(ex, C._gate_up(ex, wg, wu, torch), 4)
            assert torch.equal(g, wg) and torch.equal(u, wu), (conc, tr)


def _load(name, cfg):
    c = C.by_name(name)
    block = C.build(c, cfg, torch)
    return c, block


def test_mixtral_layout_is_transformers():
    # transformers' own split of gate_up_proj (chunk: gate rows first)
    # gives x W_gate and x W_up from the mapped weights
    c, block = _load("mixtral", SOFTMAX_RENORM)
    ex = block.experts
    wg, wu = torch.randn(4, 8, 4, dtype=torch.float64), torch.randn(4, 8, 4, dtype=torch.float64)
    ex.double()
    with torch.no_grad():
        ex.gate_up_proj.copy_(C._gate_up(ex, wg, wu, torch))
    x = torch.randn(6, 8, dtype=torch.float64)
    g, u = torch.nn.functional.linear(x, ex.gate_up_proj[2]).chunk(2, dim=-1)
    assert torch.allclose(g, x @ wg[2]) and torch.allclose(u, x @ wu[2])


def test_gpt_oss_layout_is_transformers():
    # gpt-oss stores gate/up interleaved and transposed ([E, d, 2f], gate in
    # the even columns): its own _apply_gate reads them back as mapped
    import transformers
    from transformers.models.gpt_oss import modeling_gpt_oss as m
    cfg = transformers.GptOssConfig(hidden_size=8, intermediate_size=4, num_local_experts=4,
                                    num_experts_per_tok=2, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=2, vocab_size=32)
    cfg._experts_implementation = "eager"
    ex = m.GptOssExperts(cfg).double()
    assert ex.is_transposed and not ex.is_concatenated
    wg, wu = torch.randn(4, 8, 4, dtype=torch.float64), torch.randn(4, 8, 4, dtype=torch.float64)
    with torch.no_grad():
        ex.gate_up_proj.copy_(C._gate_up(ex, wg, wu, torch))
    x = torch.randn(6, 8, dtype=torch.float64)
    gu = x @ ex.gate_up_proj[1]
    assert torch.allclose(gu[..., ::2], x @ wg[1]) and torch.allclose(gu[..., 1::2], x @ wu[1])


def test_filters_accept_their_cases():
    for name, cfg in (("mixtral", SOFTMAX_RENORM), ("qwen3-moe", SOFTMAX_RENORM),
                      ("qwen3-moe", SOFTMAX_PLAIN), ("jamba", SOFTMAX_PLAIN),
                      ("granite-moe", SOFTMAX_RENORM), ("deepseek-v2", SOFTMAX_PLAIN),
                      ("deepseek-v2", GROUPED_MAX), ("deepseek-v3", DSV3), ("glm4-moe", DSV3),
                      ("qwen2-moe[shared]", QWEN2_SHARED), ("deepseek-v3[shared]", DSV3_SHARED),
                      ("gpt-oss", GPT_OSS), ("deepseek-v4", DSV4), ("deepseek-v4[hash]", DSV4_HASH),
                      ("glm4-moe[shared]", DSV3_SHARED), ("dots1[shared]", DSV3_SHARED),
                      ("deepseek-v32", DSV3), ("deepseek-v32", DSV3_SHARED),
                      ("exaone-moe", DSV3_SHARED), ("hunyuan-v1-moe", SOFTMAX_RENORM),
                      ("qwen3-next", QWEN2_SHARED), ("qwen3-next", SOFTMAX_PLAIN),
                      ("qwen3.5-moe", SOFTMAX_RENORM), ("cohere2-moe", SOFTMAX_TOPK),
                      ("jetmoe", SOFTMAX_TOPK), ("aria", SOFTMAX_TOPK), ("granite-moe", SOFTMAX_TOPK),
                      ("granite-moe-hybrid", SOFTMAX_RENORM), ("qwen3-omni-moe", SOFTMAX_PLAIN),
                      ("qwen3-omni-moe[talker]", QWEN2_SHARED), ("dots3-note", DSV3),
                      ("kimi-linear", DSV3_SHARED), ("beam", DSV3), ("hy-v4", DSV3_SHARED),
                      ("qwen4-exp", QWEN2_SHARED), ("deepseek-ocr2", GROUPED_MAX)):
        C.by_name(name).configure(cfg)  # raises NotExpressible on a refusal


def test_filters_refuse_other_routing():
    for name, cfg in (("mixtral", SOFTMAX_PLAIN), ("mixtral", DSV3), ("jamba", SOFTMAX_RENORM),
                      ("deepseek-v3", SOFTMAX_RENORM), ("deepseek-v2", SOFTMAX_RENORM),
                      ("deepseek-v2", DSV3), ("qwen3-moe", GROUPED_MAX),
                      ("mixtral", PLAIN_FFN), ("gpt-oss", SOFTMAX_RENORM),
                      ("llama4", SOFTMAX_RENORM), ("qwen2-moe[shared]", SOFTMAX_RENORM),
                      # a row without shared experts refuses a case with them, and back
                      ("qwen2-moe", QWEN2_SHARED), ("deepseek-v3", DSV3_SHARED),
                      ("qwen2-moe[shared]", dict(QWEN2_SHARED, shared_gate=0)),
                      ("deepseek-v3[shared]", dict(DSV3_SHARED, shared_gate=1)),
                      ("deepseek-v3[shared]", dict(DSV3_SHARED, shared_ffn=8)),
                      # issue 26's further blocks: each refuses its neighbours' routing
                      ("deepseek-v4", DSV4_HASH), ("deepseek-v4[hash]", DSV4),
                      ("deepseek-v4", DSV3), ("deepseek-v4", dict(DSV4, renormalize=0)),
                      ("glm4-moe[shared]", DSV3), ("deepseek-v32", dict(DSV3_SHARED, shared_ffn=8)),
                      ("deepseek-v32", dict(DSV3_SHARED, shared_gate=1)),
                      ("hunyuan-v1-moe", SOFTMAX_PLAIN), ("hunyuan-v1-moe", QWEN2_SHARED),
                      ("qwen3-next", DSV3_SHARED), ("qwen3.5-moe", QWEN2_SHARED),
                      ("qwen3-next", dict(QWEN2_SHARED, shared_gate=0)),
                      ("cohere2-moe", SOFTMAX_RENORM), ("cohere2-moe", dict(SOFTMAX_TOPK, router_bias=1)),
                      ("minimax-m2", SOFTMAX_RENORM), ("afmoe", DSV3), ("ernie4.5-moe", SOFTMAX_RENORM),
                      ("jetmoe", SOFTMAX_RENORM), ("jetmoe", dict(SOFTMAX_TOPK, router_bias=1)),
                      ("aria", SOFTMAX_RENORM), ("granite-moe", dict(SOFTMAX_TOPK, router_bias=1)),
                      ("qwen3-omni-moe", QWEN2_SHARED), ("mistral4", GROUPED_MAX),
                      ("laguna", DSV3), ("step3p7", DSV4), ("zaya", SOFTMAX_RENORM),
                      ("beam", DSV3_SHARED), ("qwen4-exp", SOFTMAX_PLAIN), ("axk1", DSV3),
                      ("doge", SOFTMAX_RENORM), ("mistral-large4", GROUPED_MAX)):
        try:
            C.by_name(name).configure(cfg)
        except C.NotExpressible as e:
            assert str(e), name
            continue
        raise AssertionError("%s accepted a case it cannot express" % name)


def test_gpt_oss_names_what_is_missing():
    # each missing feature is named, so the row says which branch it waits for
    for key, off, word in (("score_function", "softmax", "softmax_topk"),
                           ("router_bias", 0, "router_bias"),
                           ("ffn_kind", "swiglu", "swiglu-clamp"), ("ffn_bias", 0, "ffn_bias")):
        try:
            C.by_name("gpt-oss").configure(dict(GPT_OSS, **{key: off}))
        except C.NotExpressible as e:
            assert word in str(e), (key, str(e))
            continue
        raise AssertionError("gpt-oss accepted a case without %s" % key)
    C.build(C.by_name("gpt-oss"), GPT_OSS, torch)  # the config transformers accepts
    # the golden's /config spells the router bias has_router_bias (route's format)
    alt = dict(GPT_OSS, has_router_bias=1)
    del alt["router_bias"]
    C.by_name("gpt-oss").configure(alt)


class FakeGolden:
    """What load_inputs and run_block read of a dropless.Golden, from
    arrays drawn here (fp32), for mappings whose goldens main lacks."""

    def __init__(self, cfg, arrays):
        self.config, self._a = cfg, arrays
        self.dims = {"T": cfg["tokens"], "d": cfg["hidden"], "f": cfg["ffn"]}

    def array(self, name):
        return self._a[name]


def _draw(shapes, seed=3):
    import numpy as np
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s) * 0.5).astype(np.float32) for n, s in shapes.items()}


def test_gpt_oss_mapping_against_its_formula():
    # the whole mapping (interleaved gate/up, transposes, the three biases,
    # the router bias) against gpt-oss's layer written out in float64, and
    # the bias gradients against their definitions
    import numpy as np
    T, d, f, E, k = 6, 8, 4, 4, 2
    cfg = dict(GPT_OSS, tokens=T, hidden=d, ffn=f, experts=E, top_k=k, act_limit=0.6)
    a = _draw({"x": (T, d), "router_weight": (d, E), "router_bias": (E,), "w_gate": (E, d, f),
               "w_up": (E, d, f), "w_down": (E, f, d), "b_gate": (E, f), "b_up": (E, f),
               "b_down": (E, d), "d_out": (T, d)})
    c = C.by_name("gpt-oss")
    block = C.build(c, cfg, torch)
    C.load_inputs(c, block, FakeGolden(cfg, a), torch)
    got = C.run_block(c, block, FakeGolden(cfg, a), torch)
    A = {n: v.astype(np.float64) for n, v in a.items()}
    logits = A["x"] @ A["router_weight"] + A["router_bias"]
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, ids, 1)
    w = np.exp(top - top.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    out = np.zeros((T, d))
    d_bd = np.zeros((E, d))
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            g = np.minimum(A["x"][t] @ A["w_gate"][e] + A["b_gate"][e], 0.6)
            u = np.clip(A["x"][t] @ A["w_up"][e] + A["b_up"][e], -0.6, 0.6)
            h = (u + 1) * g / (1 + np.exp(-1.702 * g))
            out[t] += w[t, j] * (h @ A["w_down"][e] + A["b_down"][e])
            d_bd[e] += w[t, j] * A["d_out"][t]
    assert np.allclose(got["router_logits"].double().numpy(), logits, atol=1e-5)
    assert np.allclose(got["out"].double().numpy(), out, atol=1e-5)
    assert np.allclose(got["d_b_down"].double().numpy(), d_bd, atol=1e-5)
    assert np.allclose(got["d_router_bias"].double().numpy(),
                       got["d_router_logits"].double().numpy().sum(0), atol=1e-6)
    # the weight gradient is handed over in gpt-oss's own interleaved layout
    # [E, d, 2f]; with x all ones each row of d_w_gate[e] = sum_t x_t d_h_gate[t]
    # is d_b_gate[e] = sum_t d_h_gate[t]: its even columns are the gate's
    # gradient, the odd the up's
    a["x"] = np.ones_like(a["x"])
    block = C.build(c, cfg, torch)
    C.load_inputs(c, block, FakeGolden(cfg, a), torch)
    got = C.run_block(c, block, FakeGolden(cfg, a), torch)
    gu = got["d_w_gate_up"].double().numpy()
    assert gu.shape == (E, d, 2 * f) and "d_w_gate" not in got and "d_w_up" not in got
    for h, b in ((0, "d_b_gate"), (1, "d_b_up")):
        want = np.broadcast_to(got[b].double().numpy()[:, None, :], (E, d, f))
        assert np.abs(want).max() > 0 and np.allclose(gu[:, :, h::2], want, atol=1e-5)


def test_nemotron_h_mapping_against_its_formula():
    # Nemotron-H (relu^2 experts, DeepSeek-V3-style sigmoid router with the
    # selection bias, one ungated relu^2 shared expert) against its layer
    # written out in float64; without shared experts in the case the
    # block's own is zeroed: out is the routed part alone
    import numpy as np
    T, d, f, E, k, F = 6, 8, 4, 4, 2, 8
    base = dict(DSV3, tokens=T, hidden=d, ffn=f, experts=E, top_k=k, n_group=1, topk_group=1,
                ffn_kind="relu2")
    a = _draw({"x": (T, d), "router_weight": (d, E), "expert_bias": (E,), "w_up": (E, d, f),
               "w_down": (E, f, d), "shared_w_up": (d, F), "shared_w_down": (F, d),
               "d_out": (T, d)})
    A = {n: v.astype(np.float64) for n, v in a.items()}
    relu2 = lambda z: np.maximum(z, 0.0) ** 2
    s = 1.0 / (1.0 + np.exp(-(A["x"] @ A["router_weight"])))
    ids = np.argsort(-(s + A["expert_bias"]), axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(s, ids, 1)
    w = 2.5 * w / w.sum(1, keepdims=True)
    routed = np.zeros((T, d))
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            routed[t] += w[t, j] * (relu2(A["x"][t] @ A["w_up"][e]) @ A["w_down"][e])
    shared = relu2(A["x"] @ A["shared_w_up"]) @ A["shared_w_down"]
    c = C.by_name("nemotron-h")
    for cfg, want in ((dict(base, shared_experts=1, shared_ffn=F, shared_gate=0), routed + shared),
                      (base, routed)):
        block = C.build(c, cfg, torch)
        C.load_inputs(c, block, FakeGolden(cfg, a), torch)
        got = C.run_block(c, block, FakeGolden(cfg, a), torch)
        assert np.allclose(got["out"].double().numpy(), want, atol=1e-4), cfg
        assert "d_w_gate" not in got and "d_shared_w_gate" not in got
    # a gated FFN, or a gated shared expert, is not this block
    for bad in (dict(base, ffn_kind="swiglu"), dict(base, shared_experts=1, shared_ffn=F,
                                                      shared_gate=1)):
        try:
            c.configure(bad)
        except C.NotExpressible:
            continue
        raise AssertionError("nemotron-h accepted %s" % bad)


LLAMA4 = dict(SOFTMAX_PLAIN, experts=4, top_k=1, score_function="sigmoid", weight_on_input=1,
              shared_experts=1, shared_ffn=4, shared_gate=0)


def test_llama4_hooks_against_its_formula():
    # the llama4 rows are driven by their hooks (llama4.py) through the
    # generic build / load_inputs / run_block: out = shared(x) + sum over
    # the top-1 expert of E(x sigmoid(l)); the control, E(x) sigmoid(l),
    # must differ (both directions of the mapping)
    import numpy as np
    T, d, f, E = 6, 8, 4, 4
    cfg = dict(LLAMA4, tokens=T, hidden=d, ffn=f, experts=E)
    a = _draw({"x": (T, d), "router_weight": (d, E), "w_gate": (E, d, f), "w_up": (E, d, f),
               "w_down": (E, f, d), "shared_w_gate": (d, f), "shared_w_up": (d, f),
               "shared_w_down": (f, d), "d_out": (T, d)}, seed=5)
    A = {n: v.astype(np.float64) for n, v in a.items()}
    swiglu = lambda z, g, u, dn: (g(z) / (1 + np.exp(-g(z))) * u(z)) @ dn
    lg = A["x"] @ A["router_weight"]
    e = lg.argmax(1)
    s = 1 / (1 + np.exp(-lg[np.arange(T), e]))
    shared = swiglu(A["x"], lambda z: z @ A["shared_w_gate"], lambda z: z @ A["shared_w_up"],
                    A["shared_w_down"])
    ex = lambda t, z: swiglu(z, lambda v: v @ A["w_gate"][e[t]], lambda v: v @ A["w_up"][e[t]],
                             A["w_down"][e[t]])
    on_in = shared + np.stack([ex(t, A["x"][t] * s[t]) for t in range(T)])
    on_out = shared + np.stack([ex(t, A["x"][t]) * s[t] for t in range(T)])
    for name, want, other in (("llama4", on_in, on_out),
                              ("llama4[defect:weight-on-output]", on_out, on_in)):
        c = C.by_name(name)
        assert c.hooks is not None
        block = C.build(c, cfg, torch)
        C.load_inputs(c, block, FakeGolden(cfg, a), torch)
        got = C.run_block(c, block, FakeGolden(cfg, a), torch)["out"].double().numpy()
        assert np.allclose(got, want, atol=1e-5), name
        assert not np.allclose(got, other, atol=1e-3), name
    for bad in (dict(cfg, weight_on_input=0), dict(cfg, top_k=2), dict(cfg, shared_gate=1),
                dict(cfg, shared_experts=0)):
        try:
            C.by_name("llama4").configure(bad)
        except C.NotExpressible:
            continue
        raise AssertionError("llama4 accepted %s" % bad)


def test_deepseek_v4_hash_reads_the_table():
    # the hash layer selects table[token_id] whatever the scores; a table
    # left unloaded (all expert 0) would select expert 0 everywhere
    import numpy as np
    T, d, f, E, k, V = 6, 8, 4, 16, 4, 32
    cfg = dict(DSV4_HASH, tokens=T, hidden=d, ffn=f, experts=E, top_k=k, renormalize=1)
    a = _draw({"x": (T, d), "router_weight": (d, E), "w_gate": (E, d, f), "w_up": (E, d, f),
               "w_down": (E, f, d), "d_out": (T, d)})
    rng = np.random.default_rng(7)
    a["hash_table"] = np.stack([rng.permutation(E)[:k] for _ in range(V)]).astype(np.int32)
    a["token_ids"] = rng.integers(0, V, T).astype(np.int32)
    c = C.by_name("deepseek-v4[hash]")
    block = C.build(c, cfg, torch)
    C.load_inputs(c, block, FakeGolden(cfg, a), torch)
    got = C.run_block(c, block, FakeGolden(cfg, a), torch)
    assert np.array_equal(got["topk_ids"], a["hash_table"][a["token_ids"]])
    s = np.sqrt(np.log1p(np.exp(a["x"].astype(np.float64) @ a["router_weight"])))
    w = np.take_along_axis(s, a["hash_table"][a["token_ids"]], 1)
    want = 1.5 * w / w.sum(1, keepdims=True)
    assert np.allclose(got["topk_weights"].double().numpy(), want, atol=1e-5)


def test_jetmoe_hooks_against_its_formula():
    # JetMoE's router hands the weights over in the experts' sorted order:
    # the hooks put topk_ids / topk_weights back in token order (checked
    # against softmax over the top-k logits written out), and out is the
    # layer's with the block's output bias zeroed
    import numpy as np
    T, d, f, E, k = 6, 8, 4, 4, 2
    cfg = dict(SOFTMAX_TOPK, tokens=T, hidden=d, ffn=f, experts=E, top_k=k)
    a = _draw({"x": (T, d), "router_weight": (d, E), "w_gate": (E, d, f), "w_up": (E, d, f),
               "w_down": (E, f, d), "d_out": (T, d)}, seed=9)
    A = {n: v.astype(np.float64) for n, v in a.items()}
    lg = A["x"] @ A["router_weight"]
    ids = np.argsort(-lg, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(lg, ids, 1)
    w = np.exp(top - top.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    out, dw = np.zeros((T, d)), np.zeros((T, k))
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            g = A["x"][t] @ A["w_gate"][e]
            y = (g / (1 + np.exp(-g)) * (A["x"][t] @ A["w_up"][e])) @ A["w_down"][e]
            out[t] += w[t, j] * y
            dw[t, j] = y @ A["d_out"][t]  # d_topk_weights: <d_out, the expert's output>
    c = C.by_name("jetmoe")
    block = C.build(c, cfg, torch)
    C.load_inputs(c, block, FakeGolden(cfg, a), torch)
    got = C.run_block(c, block, FakeGolden(cfg, a), torch)
    gi = np.asarray(got["topk_ids"])
    order = np.argsort(gi, axis=1)  # torch.topk's slot order may differ; compare as sets
    assert np.array_equal(np.take_along_axis(gi, order, 1), np.sort(ids, axis=1))
    gw = np.take_along_axis(got["topk_weights"].double().numpy(), order, 1)
    assert np.allclose(gw, np.take_along_axis(w, np.argsort(ids, axis=1), 1), atol=1e-6)
    assert np.allclose(got["out"].double().numpy(), out, atol=1e-5)
    gd = np.take_along_axis(got["d_topk_weights"].double().numpy(), order, 1)
    assert np.allclose(gd, np.take_along_axis(dw, np.argsort(ids, axis=1), 1), atol=1e-5)


def test_clamped_kin_run_unclamped():
    # GLM-5-next's and HY-V4's SwiGLU clamps at swiglu_limit (10 by default)
    # without (up + 1): their rows set it to infinity, the catalogue's SwiGLU
    for name in ("hy-v4", "glm5-next"):
        assert C.by_name(name).configure(DSV3_SHARED)["swiglu_limit"] == float("inf"), name


def test_batched_mm_memory_guard():
    # batched_mm copies the expert weights per (token, slot): refused where
    # that passes the budget (kernel-sizes-bf16: 3.0 GiB), built where not
    big = dict(SOFTMAX_RENORM, tokens=1024, hidden=512, ffn=512, experts=64, dtype="bf16")
    try:
        C.build(C.by_name("mixtral[batched_mm]"), big, torch)
    except C.NotExpressible as e:
        assert "GiB" in str(e)
    else:
        raise AssertionError("batched_mm accepted a case over its memory budget")
    C.build(C.by_name("mixtral[batched_mm]"), SOFTMAX_RENORM, torch)
    C.build(C.by_name("mixtral"), big, torch)  # the eager loop copies nothing


def test_expectations_match_first_rule(tmp="/tmp"):
    path = os.path.join(tmp, "clients-expected-%d.tsv" % os.getpid())
    with open(path, "w") as fh:
        fh.write("# comment\nmixtral*\tzipf\t*\tfused\tNOT CONFORMANT\tone\n"
                 "mixtral*\t*\t*\t*\tCONFORMANT\ttwo\n")
    try:
        rows = R.load_expected(path)
    finally:
        os.unlink(path)
    assert R.expected_for(rows, "mixtral[grouped_mm]", "zipf", "bf16", "fused")[1] == "one"
    assert R.expected_for(rows, "mixtral", "zipf", "bf16", "chained")[1] == "two"
    assert R.expected_for(rows, "olmoe", "zipf", "bf16", "fused") == ("CONFORMANT", "")


def test_every_control_is_expected_to_fail():
    # a negative control expected CONFORMANT would prove nothing
    rows = R.load_expected(os.path.join(HERE, "..", "..", "tools", "clients", "expected.tsv"))
    controls = [c for c in C.CLIENTS if c.defect]
    assert len(controls) >= 2
    for c in controls:
        for case in ("mixtral-small", "ties", "tiny"):
            for dt in R.DTYPES:
                for m in R.CANDIDATES:
                    assert R.expected_for(rows, c.name, case, dt, m)[0] == "NOT CONFORMANT", \
                        (c.name, case, dt, m)


def test_every_row_is_available_here():
    # NOT AVAILABLE is for an older transformers (the H200 machine's 5.17):
    # under the one the table is written for, a row that says it names a
    # class its module lacks and would silently test nothing
    import transformers
    if C._version(transformers.__version__) < (5, 24):
        return
    missing = []
    for c in C.CLIENTS:
        try:
            C.require_available(c)
        except C.NotAvailable as e:
            missing.append((c.name, str(e)))
    assert not missing, missing


def test_require_available_refuses_what_is_missing():
    base = C.by_name("mixtral")
    for bad in (base._replace(module="transformers.models.no_such.modeling_no_such"),
                base._replace(config="NoSuchConfig"), base._replace(block="NoSuchMoeBlock")):
        try:
            C.require_available(bad)
        except C.NotAvailable as e:
            assert "has no" in str(e), str(e)
        else:
            raise AssertionError("%s: not refused" % (bad,))
    try:
        C.since((99, 0), "a future router")
    except C.NotAvailable as e:
        assert "99.0" in str(e) and "a future router" in str(e), str(e)
    else:
        raise AssertionError("since((99, 0)) did not refuse")
    C.since((1, 0), "an old router")  # no refusal


def test_base_case():
    assert R.base_case("mixtral-small-bf16", "bf16") == "mixtral-small"
    assert R.base_case("ties-fp16", "fp16") == "ties"
    assert R.base_case("ties", "fp32") == "ties"


def main():
    tests = [(k, v) for k, v in sorted(globals().items()) if k.startswith("test_")]
    passed = failed = 0
    for name, fn in tests:
        try:
            fn()
            passed += 1
            print("ok - %s" % name)
        except Exception:
            failed += 1
            print("not ok - %s" % name)
            traceback.print_exc()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
