"""transformers' MoE blocks as conformance clients of dropless.

One row of CLIENTS per block (and per experts implementation worth telling
apart): where transformers keeps it, and how a golden case's configuration
becomes the block's config (`configure`: keyword arguments for the model's
config class, or NotExpressible naming what the case or the block lacks;
for a block that needs a variant main's catalogue lacks, the branch that
builds it: the row is "not expressible on this branch: needs <variant>"
until the golden carries it, then it runs).

The block is built from its config alone (no weights from any hub,
`build`); the golden's inputs are copied into its parameters
(`load_inputs`); it runs forward and backward on the CPU and `run_block`
reads back what it exposes at its module boundaries: the router's logits,
the ids and weights it hands the experts, the output, and the gradients of
the logits, the weights, the router weight, the input and every expert
weight (and the shared experts' where the case has them). The blocks do
not expose their per-expert intermediates (h_gate, ..., y_sorted) nor a
sort (the eager loop never sorts), so a candidate holds none of those.
"""

import collections
import importlib

import numpy as np


class NotExpressible(Exception):
    """The case cannot be put into this block (or the block into the
    catalogue); str(e) says why."""


def _need(cond, why):
    if not cond:
        raise NotExpressible(why)


# ------------------------------------------------------------ configs

def _softmax_topk(cfg, renorm=None, groups=False, scaling=False):
    """Checks a softmax-over-all-experts, top-k case for a block; renorm:
    the block's fixed renormalisation (None: the block has the option)."""
    _need(cfg["score_function"] == "softmax", "the block scores with softmax; the case with %s"
          % cfg["score_function"])
    _need(not cfg["has_bias"], "the block has no selection bias")
    _need(groups or cfg["n_group"] <= 1, "the block has no group-limited routing")
    _need(scaling or cfg["scaling"] == 1.0, "the block has no routed scaling factor")
    if renorm is not None:
        _need(bool(cfg["renormalize"]) == renorm, "the block %s the top-k weights" %
              ("always renormalises" if renorm else "never renormalises"))


def _swiglu(cfg, shared_ok=False):
    _need(cfg["ffn_kind"] == "swiglu", "the block's experts are SwiGLU; the case's FFN is %s"
          % cfg["ffn_kind"])
    _need(shared_ok or not shared_of(cfg)[0], "this row has no shared expert; the case has %d"
          % shared_of(cfg)[0])


def shared_of(cfg):
    """(S shared experts, their width f_s, gated) of a case; (0, 0, False)
    without shared experts (main's catalogue has none: the branch shared
    adds /config shared_experts, shared_ffn, shared_gate)."""
    return (int(cfg.get("shared_experts", 0)), int(cfg.get("shared_ffn", 0)),
            bool(cfg.get("shared_gate", 0)))


def _dims(cfg, experts_key="num_local_experts", ffn_key="intermediate_size", **extra):
    d = {"hidden_size": cfg["hidden"], experts_key: cfg["experts"],
         "num_experts_per_tok": cfg["top_k"], ffn_key: cfg["ffn"], "hidden_act": "silu",
         "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
         "head_dim": 8,  # attention is never built; an even RoPE dimension for any d
         "vocab_size": 32}
    d.update(extra)
    return d


def cfg_mixtral(cfg):
    _swiglu(cfg)
    _softmax_topk(cfg, renorm=True)
    return _dims(cfg, router_jitter_noise=0.0)


def cfg_qwen(cfg, experts_key="num_experts", **extra):
    """Qwen2-MoE, Qwen3-MoE, OLMoE, FlexOlmo: softmax top-k with
    norm_topk_prob."""
    _swiglu(cfg)
    _softmax_topk(cfg)
    return _dims(cfg, experts_key=experts_key, norm_topk_prob=bool(cfg["renormalize"]), **extra)


def cfg_qwen2(cfg):
    # moe_intermediate_size is the routed experts' f; the shared expert is
    # switched off by its width 0 (its gate then multiplies zeros)
    d = cfg_qwen(cfg, ffn_key="moe_intermediate_size", shared_expert_intermediate_size=0)
    return d


def cfg_jamba(cfg):
    _swiglu(cfg)
    _softmax_topk(cfg, renorm=False)
    # a Jamba config wants its attention / Mamba layout too: one layer, MoE
    return _dims(cfg, experts_key="num_experts", expert_layer_period=1, expert_layer_offset=0,
                 attn_layer_period=1, attn_layer_offset=0)


def cfg_granite(cfg):
    # softmax over the top-k logits: mathematically the renormalised
    # softmax over all experts restricted to the top k (the common
    # denominator cancels), so the catalogue's softmax + renormalize
    # expresses it; its rounding differs, which the tolerances cover
    _swiglu(cfg)
    _softmax_topk(cfg, renorm=True)
    # the mapping reads GraniteMoeTopKRouter's (router_logits, top_k_weights,
    # top_k_index); transformers 5.17's router (on the H200 machine) hands
    # the block another tuple, which the hooks misread as [T, k] logits
    import transformers
    _need(_version(transformers.__version__) >= (5, 24),
          "the mapping reads transformers >= 5.24's GraniteMoeTopKRouter; %s's router "
          "returns another tuple" % transformers.__version__)
    return _dims(cfg)


def _version(v):
    """(major, minor) of a version string: "5.24.0" -> (5, 24)."""
    parts = (v.split(".") + ["0", "0"])[:2]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)


def cfg_deepseek_v2(cfg):
    _swiglu(cfg)
    _softmax_topk(cfg, renorm=False, groups=True, scaling=True)
    grouped = cfg["n_group"] > 1
    _need(not grouped or cfg["group_score"] == "max",
          "DeepSeek-V2's group_limited_greedy scores a group by its max, the case by %s"
          % cfg["group_score"])
    return _dims(cfg, experts_key="n_routed_experts", ffn_key="moe_intermediate_size",
                 n_shared_experts=0, routed_scaling_factor=float(cfg["scaling"]),
                 topk_method="group_limited_greedy" if grouped else "greedy",
                 n_group=cfg["n_group"], topk_group=cfg["topk_group"], first_k_dense_replace=0,
                 intermediate_size=cfg["ffn"])


def cfg_deepseek_v3(cfg, experts_key="n_routed_experts", shared_ok=False, **extra):
    """DeepSeek-V3, GLM-4-MoE, dots1: sigmoid + selection bias, groups
    scored by the sum of their best two, renormalised, scaled."""
    _swiglu(cfg, shared_ok)
    _need(cfg["score_function"] == "sigmoid", "the block scores with sigmoid; the case with %s"
          % cfg["score_function"])
    _need(cfg["has_bias"], "the block always adds e_score_correction_bias (set it to the "
          "case's bias); a case without one would need a zero bias: use has_bias = 1")
    grp_terms = {"top2_sum": 2, "max": 1}.get(cfg["group_score"],
                                              cfg["top_k"] // max(cfg["topk_group"], 1))
    _need(cfg["n_group"] > 1 and grp_terms == 2,
          "the block scores groups by the sum of their best two experts")
    d = _dims(cfg, experts_key=experts_key, ffn_key="moe_intermediate_size", n_shared_experts=0,
              routed_scaling_factor=float(cfg["scaling"]), n_group=cfg["n_group"],
              topk_group=cfg["topk_group"], norm_topk_prob=bool(cfg["renormalize"]),
              first_k_dense_replace=0, intermediate_size=cfg["ffn"])
    d.update(extra)
    return d


def cfg_dbrx(cfg):
    # DBRX: softmax top-k, weights divided by their p-norm (p = 1: the
    # renormalisation; None: none); experts as w1, v1, w2 [E*f, d]
    _swiglu(cfg)
    _softmax_topk(cfg)
    ffn = {"ffn_hidden_size": cfg["ffn"], "moe_num_experts": cfg["experts"],
           "moe_top_k": cfg["top_k"], "moe_jitter_eps": None,
           "moe_normalize_expert_weights": 1.0 if cfg["renormalize"] else None,
           "ffn_act_fn": {"name": "silu"}}
    return {"d_model": cfg["hidden"], "n_heads": 1, "n_layers": 1, "vocab_size": 32,
            "ffn_config": ffn}


def cfg_phimoe(cfg):
    # PhiMoE routes with sparsemixer: top-1 by the max logit, its weight a
    # softmax over only the experts within a relative threshold of the max
    # (2 x router_jitter_noise), then the second choice the same way with
    # the first masked: no catalogue routing computes that
    raise NotExpressible("needs sparsemixer routing (a softmax over the experts within a "
                         "relative threshold of the max logit); no branch builds it")


def cfg_gpt_oss(cfg):
    # gpt-oss: a bias on the router logits, softmax over the top-k logits,
    # the clamped SwiGLU ((up + 1) glu, alpha 1.702, limit 7), biases on
    # both expert GEMMs, gate/up interleaved in one weight (the mapping's
    # layout, not the case's): the keys of the branches route and ffn
    missing = []
    if cfg["score_function"] != "softmax_topk":
        missing.append("softmax over the top-k logits (score_function softmax_topk, route)")
    if not (cfg.get("router_bias") or cfg.get("has_router_bias")):
        missing.append("a router-logit bias (router_bias, route)")
    if cfg["ffn_kind"] != "swiglu-clamp":
        missing.append("the clamped (up + 1) SwiGLU (ffn_kind swiglu-clamp, ffn)")
    if not cfg.get("ffn_bias"):
        missing.append("biases on both expert GEMMs (ffn_bias, ffn)")
    _need(not missing, "needs " + "; ".join(missing))
    _need(not cfg["has_bias"] and cfg["n_group"] <= 1 and cfg["scaling"] == 1.0,
          "gpt-oss has no selection bias, groups or scaling")
    _need(not shared_of(cfg)[0], "gpt-oss has no shared expert")
    return _dims(cfg, swiglu_alpha=float(cfg["act_alpha"]), swiglu_limit=float(cfg["act_limit"]),
                 router_aux_loss_coef=0.0, layer_types=["full_attention"])


def cfg_llama4(cfg):
    raise NotExpressible("needs sigmoid top-1 with the weight on the expert's input (route) and "
                         "a shared expert (shared)")


def _need_shared(cfg, gated):
    S, fs, g = shared_of(cfg)
    _need(S >= 1, "needs shared experts (the branch shared): the case has none")
    _need(g == gated, "the block %s its shared experts; the case's are %s" % (
        "scales" if gated else "adds unscaled", "gated" if g else "ungated"))
    return S, fs


def cfg_qwen2_shared(cfg):
    # one shared expert of width f_s scaled by sigmoid(shared_expert_gate(x));
    # S experts side by side are one MLP of width S f_s (doc/format.md)
    S, fs = _need_shared(cfg, gated=True)
    _swiglu(cfg, shared_ok=True)
    _softmax_topk(cfg)
    return _dims(cfg, experts_key="num_experts", ffn_key="moe_intermediate_size",
                 norm_topk_prob=bool(cfg["renormalize"]), shared_expert_intermediate_size=S * fs)


def cfg_deepseek_v3_shared(cfg):
    # n_shared_experts experts of width moe_intermediate_size as one MLP
    S, fs = _need_shared(cfg, gated=False)
    _need(fs == cfg["ffn"], "DeepSeek's shared experts are as wide as its routed ones (f = %d); "
          "the case's are %d wide" % (cfg["ffn"], fs))
    d = cfg_deepseek_v3(cfg, shared_ok=True)
    d["n_shared_experts"] = S
    return d


def cfg_nemotron_h(cfg):
    # Nemotron-H: relu^2 experts (non-gated), DeepSeek-V3's router (sigmoid,
    # e_score_correction_bias, groups by their best two, renormalised,
    # scaled) and always one ungated relu^2 shared expert (NemotronHMLP): a
    # case without one gets it zeroed (its output and gradients exactly 0)
    _need(cfg["ffn_kind"] == "relu2", "the block's experts are relu^2 (non-gated); the case's "
          "FFN is %s" % cfg["ffn_kind"])
    _need(cfg["score_function"] == "sigmoid", "the block scores with sigmoid; the case with %s"
          % cfg["score_function"])
    _need(cfg["has_bias"], "the block always adds e_score_correction_bias")
    _need(cfg["n_group"] <= 1 or cfg["group_score"] == "top2_sum",
          "the block scores groups by the sum of their best two experts")
    S, fs, gated = shared_of(cfg)
    _need(not gated, "the block's shared expert is ungated; the case's is gated")
    return _dims(cfg, experts_key="n_routed_experts", ffn_key="moe_intermediate_size",
                 num_local_experts=cfg["experts"], mlp_hidden_act="relu2", mlp_bias=False,
                 moe_latent_size=None, moe_shared_expert_intermediate_size=S * fs or cfg["ffn"],
                 n_group=max(cfg["n_group"], 1), topk_group=max(cfg["topk_group"], 1),
                 norm_topk_prob=bool(cfg["renormalize"]),
                 routed_scaling_factor=float(cfg["scaling"]))


def cfg_longcat(cfg):
    # LongCat-Flash: a softmax over E experts and Z zero (identity) experts,
    # the top-k on scores + e_score_correction_bias, weights the scores times
    # routed_scaling_factor; an id >= E is the identity (zero_experts). Its
    # router (a classifier module the forward never calls) and its E + Z
    # gate_up rows need their own functions: tools/clients/longcat.py's hooks
    if "hooks" not in Client._fields:
        raise NotExpressible("needs Client.hooks (per-client hooks) to drive LongcatFlashMoE; "
                             "tools/clients/longcat.py runs it alone")
    return LC.configure(cfg, error=NotExpressible)


import longcat as LC  # noqa: E402  (the hooks of the longcat-flash row)


# --------------------------------------------------------------- table

Client = collections.namedtuple("Client", "name module block config configure impl defect note "
                                 "router_dtype layout")
Client.__doc__ = """name: the row's name (model[implementation]); module and block:
where transformers keeps the MoE block; config: its config class (in
transformers); configure(cfg) -> config kwargs or NotExpressible; impl: the
experts implementation (transformers' config._experts_implementation:
eager, grouped_mm, batched_mm); defect: None, or a deliberate mapping
error (a negative control the checker must refuse); note: a short line
for the table; router_dtype: "fp32" (the router kept in fp32, holding the
golden's fp32 router weight exactly) or "case" (transformers' default: the
router weight in the model's dtype, so rounded from the golden's);
layout: "gate_up" (transformers' 3-D gate_up_proj / down_proj experts) or
"dbrx" (w1, v1, w2 [E*f, d])."""


def _c(name, module, block, config, configure, impl="eager", defect=None, note="",
       router_dtype="fp32", layout="gate_up"):
    return Client(name, "transformers.models.%s.modeling_%s" % (module, module), block, config,
                  configure, impl, defect, note, router_dtype, layout)


CLIENTS = [
    _c("mixtral", "mixtral", "MixtralSparseMoeBlock", "MixtralConfig", cfg_mixtral),
    _c("mixtral[grouped_mm]", "mixtral", "MixtralSparseMoeBlock", "MixtralConfig", cfg_mixtral,
       impl="grouped_mm", note="sorted by expert, grouped GEMM, fp32 reshape-sum combine"),
    _c("mixtral[batched_mm]", "mixtral", "MixtralSparseMoeBlock", "MixtralConfig", cfg_mixtral,
       impl="batched_mm", note="one bmm per (token, slot), fp32 reshape-sum combine"),
    _c("qwen2-moe", "qwen2_moe", "Qwen2MoeSparseMoeBlock", "Qwen2MoeConfig", cfg_qwen2,
       note="shared expert off (width 0)"),
    _c("qwen3-moe", "qwen3_moe", "Qwen3MoeSparseMoeBlock", "Qwen3MoeConfig",
       lambda c: cfg_qwen(c, ffn_key="moe_intermediate_size")),
    _c("qwen3-vl-moe", "qwen3_vl_moe", "Qwen3VLMoeTextSparseMoeBlock", "Qwen3VLMoeTextConfig",
       lambda c: (_softmax_topk(c, renorm=True), cfg_qwen(c, ffn_key="moe_intermediate_size"))[1]),
    _c("olmoe", "olmoe", "OlmoeSparseMoeBlock", "OlmoeConfig",
       lambda c: cfg_qwen(c, num_local_experts=c["experts"])),
    _c("flex-olmo", "flex_olmo", "FlexOlmoSparseMoeBlock", "FlexOlmoConfig", cfg_qwen),
    _c("minimax", "minimax", "MiniMaxSparseMoeBlock", "MiniMaxConfig", cfg_mixtral),
    _c("granite-moe", "granitemoe", "GraniteMoeMoE", "GraniteMoeConfig", cfg_granite,
       note="softmax over the top-k logits"),
    _c("jamba", "jamba", "JambaSparseMoeBlock", "JambaConfig", cfg_jamba),
    _c("dbrx", "dbrx", "DbrxFFN", "DbrxConfig", cfg_dbrx, layout="dbrx",
       note="moe_normalize_expert_weights 1 or None"),
    _c("deepseek-v2", "deepseek_v2", "DeepseekV2Moe", "DeepseekV2Config", cfg_deepseek_v2,
       note="shared experts off (n_shared_experts = 0)"),
    _c("deepseek-v3", "deepseek_v3", "DeepseekV3MoE", "DeepseekV3Config", cfg_deepseek_v3,
       note="shared experts off (n_shared_experts = 0)"),
    _c("deepseek-v3[grouped_mm]", "deepseek_v3", "DeepseekV3MoE", "DeepseekV3Config",
       cfg_deepseek_v3, impl="grouped_mm", note="shared experts off"),
    _c("glm4-moe", "glm4_moe", "Glm4MoeMoE", "Glm4MoeConfig",
       lambda c: cfg_deepseek_v3(c, experts_key="n_routed_experts"), note="shared experts off"),
    _c("dots1", "dots1", "Dots1MoE", "Dots1Config", cfg_deepseek_v3, note="shared experts off"),
    # transformers' default router: its weight in the model's dtype (bf16 /
    # fp16 cases: the golden's fp32 router weight rounded on the way in)
    _c("mixtral[router-in-dtype]", "mixtral", "MixtralSparseMoeBlock", "MixtralConfig",
       cfg_mixtral, router_dtype="case", note="the router weight in the case's dtype"),
    _c("qwen3-moe[router-in-dtype]", "qwen3_moe", "Qwen3MoeSparseMoeBlock", "Qwen3MoeConfig",
       lambda c: cfg_qwen(c, ffn_key="moe_intermediate_size"), router_dtype="case",
       note="the router weight in the case's dtype"),
    # negative controls: a mapping with a deliberate error must be refused
    _c("mixtral[defect:gate-up-swapped]", "mixtral", "MixtralSparseMoeBlock", "MixtralConfig",
       cfg_mixtral, defect="gate-up-swapped", note="negative control: w_gate and w_up swapped"),
    _c("qwen3-moe[defect:no-renorm]", "qwen3_moe", "Qwen3MoeSparseMoeBlock", "Qwen3MoeConfig",
       lambda c: dict(cfg_qwen(c, ffn_key="moe_intermediate_size"), norm_topk_prob=False),
       defect="no-renorm", note="negative control: norm_topk_prob off on a renormalised case"),
    # mappings written, waiting for variants other branches build
    _c("phimoe", "phimoe", "PhimoeSparseMoeBlock", "PhimoeConfig", cfg_phimoe),
    _c("gpt-oss", "gpt_oss", "GptOssMLP", "GptOssConfig", cfg_gpt_oss, layout="gpt_oss",
       note="router bias, softmax over the top-k logits, clamped SwiGLU, expert biases"),
    _c("llama4", "llama4", "Llama4TextMoe", "Llama4TextConfig", cfg_llama4),
    _c("qwen2-moe[shared]", "qwen2_moe", "Qwen2MoeSparseMoeBlock", "Qwen2MoeConfig",
       cfg_qwen2_shared, note="gated shared expert on"),
    _c("deepseek-v3[shared]", "deepseek_v3", "DeepseekV3MoE", "DeepseekV3Config",
       cfg_deepseek_v3_shared, note="shared experts on"),
    _c("nemotron-h", "nemotron_h", "NemotronHMoE", "NemotronHConfig", cfg_nemotron_h,
       layout="nemotron", note="relu^2 experts, an ungated relu^2 shared expert"),
    _c("longcat-flash", "longcat_flash", "LongcatFlashMoE", "LongcatFlashConfig", cfg_longcat,
       note="zero (identity) experts in the softmax, the bias for selection only (longcat.py)",
       **({"hooks": LC} if "hooks" in Client._fields else {})),
]


def by_name(name):
    for c in CLIENTS:
        if c.name == name:
            return c
    raise KeyError("no client %r (known: %s)" % (name, ", ".join(c.name for c in CLIENTS)))


# ---------------------------------------------------------- the block

BATCHED_MM_BUDGET = 2**30  # bytes: each run stays well under 3 GiB


def build(client, cfg, torch):
    """The client's block for case configuration cfg, in the case's dtype
    (the router in fp32: the golden's router weight is fp32), in eval mode;
    NotExpressible when the case does not fit the block."""
    kwargs = client.configure(cfg)
    if client.impl == "batched_mm":
        # batched_mm gathers every (token, slot)'s expert weights (gate_up
        # and down: 3 d f values each) before its bmm
        esize = 4 if cfg["dtype"] == "fp32" else 2
        need = cfg["tokens"] * cfg["top_k"] * 3 * cfg["hidden"] * cfg["ffn"] * esize
        _need(need <= BATCHED_MM_BUDGET, "batched_mm would copy %.1f GiB of expert weights "
              "(one per token and slot), over the harness's %.0f GiB budget"
              % (need / 2**30, BATCHED_MM_BUDGET / 2**30))
    tf = importlib.import_module("transformers")
    config = getattr(tf, client.config)(**kwargs)
    config._experts_implementation = client.impl
    mod = importlib.import_module(client.module)
    block = getattr(mod, client.block)(config).eval()
    return block


def router_of(block):
    """The module whose weight [E, d] gives the router logits."""
    for name in ("gate", "router"):
        r = getattr(block, name, None)
        if r is not None and hasattr(r, "weight"):
            return r
        if r is not None and hasattr(getattr(r, "layer", None), "weight"):  # DBRX
            return r.layer
    raise NotExpressible("the block has no router module with a weight (gate / router)")


def _gate_up(experts, wg, wu, torch):
    """The experts' gate_up_proj from w_gate, w_up [E, d, f]: [E, 2f, d]
    gate rows first (transformers' concatenated layout), or its transpose
    [E, d, 2f] (is_transposed), interleaved where is_concatenated is off."""
    if getattr(experts, "is_concatenated", True):
        gu = torch.cat([wg, wu], dim=2)  # [E, d, 2f]
    else:
        gu = torch.stack([wg, wu], dim=3).flatten(2)  # [E, d, 2f]: g0 u0 g1 u1 ...
    return gu if getattr(experts, "is_transposed", False) else gu.transpose(1, 2)


def _split_gate_up(experts, g, f):
    """d_w_gate, d_w_up [E, d, f] from gate_up_proj's gradient."""
    if not getattr(experts, "is_transposed", False):
        g = g.transpose(1, 2)
    if getattr(experts, "is_concatenated", True):
        return g[:, :, :f], g[:, :, f:]
    return g[:, :, 0::2], g[:, :, 1::2]


def load_inputs(client, block, golden, torch):
    """Copies the golden's inputs into the block's parameters, in place:
    router weight (fp32, [E, d] = router_weightᵀ), selection bias,
    gate_up_proj and down_proj (the case's dtype)."""
    dt = TORCH_DTYPES(torch)[golden.config["dtype"]]
    T = lambda name, dtype=dt: torch.from_numpy(golden.array(name)).to(dtype)
    router = router_of(block)
    block.to(dt)
    fp32_router = router_fp32(client, golden.config)
    if fp32_router:
        router.float()
    with torch.no_grad():
        # copy_ rounds to the parameter's dtype: exact for an fp32 router
        router.weight.copy_(T("router_weight", torch.float32).t())
        if golden.config["has_bias"]:
            router.e_score_correction_bias.copy_(T("expert_bias", torch.float32))
        wg = T("w_gate") if golden.config["ffn_kind"] != "relu2" else None  # relu2: no gate
        wu = T("w_up")
        if client.defect == "gate-up-swapped":
            wg, wu = wu, wg
        LAYOUTS[client.layout][0](block, wg, wu, T("w_down"), T, torch)
        if shared_of(golden.config)[0]:
            _load_shared(block, golden, T)
        elif client.layout == "nemotron":  # its shared expert, always built: zeroed
            for p in shared_mlp(block).parameters():
                p.zero_()
    if fp32_router:
        # the router runs on the fp32 weight: its input is cast to fp32 first
        router.register_forward_pre_hook(lambda m, args: (args[0].float(),) + tuple(args[1:]))


def router_fp32(client, cfg):
    """Whether the block's router is kept in fp32: the golden's router
    weight is fp32 unless the case says router_dtype (the branch ffn's
    bf16/fp16 router weight), and a router weight stored in the case's own
    dtype is exactly what transformers holds: then it stays in that dtype."""
    rdt = cfg.get("router_dtype", "fp32")
    return client.router_dtype == "fp32" and not (rdt != "fp32" and rdt == cfg["dtype"])


def shared_mlp(block):
    """The block's shared expert MLP (Qwen2-MoE: shared_expert, DeepSeek:
    shared_experts), or None."""
    return getattr(block, "shared_expert", None) or getattr(block, "shared_experts", None)


def _load_shared(block, golden, T):
    # Linear weights are [out, in]: shared_w_gate/up [d, S] and
    # shared_w_down [S, d] go in transposed; the gate's [1, d] is the row
    mlp = shared_mlp(block)
    if hasattr(mlp, "gate_proj"):  # gated (relu2's NemotronHMLP has none)
        mlp.gate_proj.weight.copy_(T("shared_w_gate").t())
    mlp.up_proj.weight.copy_(T("shared_w_up").t())
    mlp.down_proj.weight.copy_(T("shared_w_down").t())
    if shared_of(golden.config)[2]:
        block.shared_expert_gate.weight.copy_(T("shared_gate_weight").reshape(1, -1))


def _shared_stages(block, golden, seen, torch):
    """The shared experts' stages the block exposes: their output and its
    gradient, the gate's logit and its gradient, the weight gradients."""
    mlp = shared_mlp(block)
    T = golden.dims["T"]
    res = {"shared_y": seen["shared_y"].reshape(T, -1),
           "d_shared_w_up": _grad(mlp.up_proj.weight, torch).t(),
           "d_shared_w_down": _grad(mlp.down_proj.weight, torch).t()}
    if hasattr(mlp, "gate_proj"):
        res["d_shared_w_gate"] = _grad(mlp.gate_proj.weight, torch).t()
    if seen["shared_y"].grad is not None:
        res["d_shared_y"] = seen["shared_y"].grad.reshape(T, -1)
    if "shared_gate_logit" in seen:
        g = seen["shared_gate_logit"]
        res["shared_gate_logit"] = g.reshape(T)
        res["d_shared_gate_weight"] = _grad(block.shared_expert_gate.weight, torch).reshape(-1)
        if g.grad is not None:
            res["d_shared_gate_logit"] = g.grad.reshape(T)
    return res


def _load_gate_up(block, wg, wu, wd, T, torch):
    ex = block.experts
    ex.gate_up_proj.copy_(_gate_up(ex, wg, wu, torch))
    ex.down_proj.copy_(wd if getattr(ex, "is_transposed", False) else wd.transpose(1, 2))


def _grads_gate_up(block, f, torch):
    ex = block.experts
    dwg, dwu = _split_gate_up(ex, _grad(ex.gate_up_proj, torch), f)
    dwd = _grad(ex.down_proj, torch)
    return dwg, dwu, dwd if getattr(ex, "is_transposed", False) else dwd.transpose(1, 2)


def _load_dbrx(block, wg, wu, wd, T, torch):
    # DBRX: gate = x w1[e]ᵀ, up = x v1[e]ᵀ, down = h w2[e], each [f, d]
    mlp = block.experts.mlp
    E, d, f = wg.shape
    mlp.w1.copy_(wg.transpose(1, 2).reshape(E * f, d))
    mlp.v1.copy_(wu.transpose(1, 2).reshape(E * f, d))
    mlp.w2.copy_(wd.reshape(E * f, d))


def _grads_dbrx(block, f, torch):
    mlp = block.experts.mlp
    E = mlp.w1.shape[0] // f
    g = lambda p: _grad(p, torch).reshape(E, f, -1)
    return g(mlp.w1).transpose(1, 2), g(mlp.v1).transpose(1, 2), g(mlp.w2)


def _interleave(a, b, torch):
    """[..., 2n] with a in the even and b in the odd columns."""
    return torch.stack([a, b], dim=-1).flatten(-2)


def _load_gpt_oss(block, wg, wu, wd, T, torch):
    # gate_up_proj [E, d, 2f] interleaved (transposed layout), its bias
    # [E, 2f] likewise; down_proj [E, f, d] as w_down; the router's bias
    _load_gate_up(block, wg, wu, wd, T, torch)
    ex = block.experts
    ex.gate_up_proj_bias.copy_(_interleave(T("b_gate"), T("b_up"), torch))
    ex.down_proj_bias.copy_(T("b_down"))
    router_of(block).bias.copy_(T("router_bias", torch.float32))


def _bias_stages(block, torch):
    """gpt-oss's bias gradients: d_b_gate, d_b_up, d_b_down, d_router_bias."""
    ex = block.experts
    g = _grad(ex.gate_up_proj_bias, torch)
    return {"d_b_gate": g[:, 0::2], "d_b_up": g[:, 1::2],
            "d_b_down": _grad(ex.down_proj_bias, torch),
            "d_router_bias": _grad(router_of(block).bias, torch)}


def _load_nemotron(block, wg, wu, wd, T, torch):
    # NemotronHExperts: up_proj [E, f, d] = w_upᵀ, down_proj [E, d, f] = w_downᵀ
    ex = block.experts
    ex.up_proj.copy_(wu.transpose(1, 2))
    ex.down_proj.copy_(wd.transpose(1, 2))


def _grads_nemotron(block, f, torch):
    ex = block.experts
    return None, _grad(ex.up_proj, torch).transpose(1, 2), _grad(ex.down_proj, torch).transpose(1, 2)


# layout: (load the expert weights (block, w_gate, w_up, w_down, golden
# array accessor, torch), read their gradients as d_w_gate, d_w_up, d_w_down)
LAYOUTS = {"gate_up": (_load_gate_up, _grads_gate_up), "dbrx": (_load_dbrx, _grads_dbrx),
           "gpt_oss": (_load_gpt_oss, _grads_gate_up), "nemotron": (_load_nemotron, _grads_nemotron)}


def TORCH_DTYPES(torch):
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def run_block(client, block, golden, torch, device="cpu"):
    """Forward and backward of the block (its parameters on `device`) on
    the golden's x and d_out: {stage: array on the CPU} of what the block
    exposes."""
    dt = TORCH_DTYPES(torch)[golden.config["dtype"]]
    T, d = golden.dims["T"], golden.dims["d"]
    f = golden.dims["f"]
    seen = {}

    def keep(t):
        if t.requires_grad:
            t.retain_grad()
        return t

    def grab_logits(m, args, out):  # routers return logits first, or logits alone
        seen["logits"] = keep(out[0] if isinstance(out, tuple) else out)

    def grab_routing(m, args, kwargs):  # experts(hidden_states, top_k_index, top_k_weights)
        assert not kwargs, "the experts were called with keywords %s" % sorted(kwargs)
        args = list(args)
        if client.layout == "dbrx" and args[2].dtype != dt:
            # DBRX's experts index_add_ weighted rows of the weights' dtype into
            # rows of the input's: with its router in the case's dtype the two
            # agree; with the fp32 router the weights go in at the case's dtype
            args[2] = args[2].to(dt)
        seen["ids"], seen["weights"] = args[1], keep(args[2])
        return tuple(args), kwargs

    router = router_of(block)
    router.register_forward_hook(grab_logits)
    block.experts.register_forward_pre_hook(grab_routing, with_kwargs=True)
    shared = shared_of(golden.config)[0] and shared_mlp(block)
    if shared:
        shared.register_forward_hook(lambda m, a, out: seen.update(shared_y=keep(out)))
        if shared_of(golden.config)[2]:
            block.shared_expert_gate.register_forward_hook(
                lambda m, a, out: seen.update(shared_gate_logit=keep(out)))
    x = torch.from_numpy(golden.array("x")).to(device=device, dtype=dt)
    x = x.reshape(1, T, d).requires_grad_()
    out = block(x)
    if isinstance(out, tuple):  # gpt-oss, Llama-4 return (out, router output)
        out = out[0]
    out = out.reshape(T, d)
    if out.requires_grad:  # with T = 0 the eager loop runs no expert: no graph at all
        out.backward(torch.from_numpy(golden.array("d_out")).to(device=device, dtype=dt))
    dwg, dwu, dwd = LAYOUTS[client.layout][1](block, f, torch)
    res = {
        "router_logits": seen["logits"], "topk_ids": seen["ids"].to(torch.int32),
        "topk_weights": seen["weights"], "out": out,
        "d_router_weight": _grad(router.weight, torch).t(), "d_x": _grad(x, torch).reshape(T, d),
        "d_w_gate": dwg, "d_w_up": dwu, "d_w_down": dwd,
    }
    if dwg is None:  # non-gated experts (relu2)
        del res["d_w_gate"]
    for stage, t in (("d_router_logits", seen["logits"]), ("d_topk_weights", seen["weights"])):
        if t.grad is not None:
            res[stage] = t.grad
    if shared:
        res.update(_shared_stages(block, golden, seen, torch))
    if client.layout == "gpt_oss":
        res.update(_bias_stages(block, torch))
        # gpt-oss's own gradient layout: gate_up_proj [E, d, 2f], gate in the
        # even columns, handed over as is (doc/format.md, "Interleaved gate/up")
        del res["d_w_gate"], res["d_w_up"]
        res["d_w_gate_up"] = _grad(block.experts.gate_up_proj, torch)
    return {k: _np(v, torch) for k, v in res.items()}


def _grad(p, torch):
    """p's gradient; autograd leaves None where nothing reached p, which
    is PyTorch's zero gradient (T = 0: no token reaches any weight)."""
    return p.grad if p.grad is not None else torch.zeros_like(p)


def _np(t, torch):
    """A stage for dropless.write_candidate: floats as the torch tensor the
    block made, in its own dtype, so the candidate declares its storage
    (a bf16 gradient of an fp32-typed stage is labelled bf16, not left to
    the checker's inference, which needs 8 nonzero values); integers as
    numpy arrays. Tensors on a GPU come back to the CPU first."""
    t = t.detach().cpu().contiguous()
    if t.is_floating_point():
        return t
    return np.ascontiguousarray(t.numpy())
