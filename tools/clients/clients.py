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
import types

import numpy as np


class NotExpressible(Exception):
    """The case cannot be put into this block (or the block into the
    catalogue); str(e) says why."""


class NotAvailable(Exception):
    """The installed transformers lacks the row's block, its config class
    or the version its mapping reads (the H200 machine's 5.17 has no
    Sarvam-MoE, ...); str(e) says what. Not a verdict on the mapping."""


def require_available(client):
    """NotAvailable unless the installed transformers has the row's module,
    block class and config class."""
    tf = importlib.import_module("transformers")
    try:
        mod = importlib.import_module(client.module)
    except ImportError:
        raise NotAvailable("transformers %s has no %s" % (tf.__version__, client.module))
    missing = [n for n, where in ((client.config, tf), (client.block, mod))
               if not hasattr(where, n)]
    if missing:
        raise NotAvailable("transformers %s has no %s" % (tf.__version__, " or ".join(missing)))


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
    # (the branch route's softmax_topk without a router-logit bias is the
    # block's rule itself: softmax-topk-ties)
    if cfg["score_function"] == "softmax_topk":
        softmax_topk_plain(cfg)
    else:
        _swiglu(cfg)
        _softmax_topk(cfg, renorm=True)
    # the mapping reads GraniteMoeTopKRouter's (router_logits, top_k_weights,
    # top_k_index); transformers 5.17's router (on the H200 machine) hands
    # the block another tuple, which the hooks misread as [T, k] logits
    since((5, 24), "GraniteMoeTopKRouter's (router_logits, top_k_weights, top_k_index)")
    return _dims(cfg)


def since(version, what):
    """NotAvailable when the installed transformers is older than `version`
    (major, minor), the one whose module structure `what` a mapping reads."""
    import transformers
    if _version(transformers.__version__) < version:
        raise NotAvailable("the mapping reads transformers >= %d.%d's %s; %s has another"
                           % (version + (what, transformers.__version__)))


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


def _shared_as(cfg, width, gated=False):
    """S for a block whose shared experts are S side by side of width
    `width` each (one MLP of width S * width), ungated unless `gated`; 0
    where the case has none (the block's own then built empty or zeroed)."""
    S, fs, g = shared_of(cfg)
    _need(not S or g == gated, "the block's shared expert is %s; the case's is %s" % (
        "gated" if gated else "ungated", "gated" if g else "ungated"))
    _need(not S or fs == width, "the block's shared experts are %d wide (f); the case's are %d"
          % (width, fs))
    return S


def cfg_v3_kin(cfg, experts_key="n_routed_experts", shared_key="n_shared_experts",
               shared_width_key=None, min_shared=0, **extra):
    """DeepSeek-V3's MoE as GLM-4-MoE-Lite, DeepSeek-V3.2, GLM-MoE-DSA,
    EXAONE-MoE, Bailing-hybrid, Sarvam-MoE, GLM-4.5V, Solar-Open,
    Kimi-Linear and dots.3 note copy it: its router and its S ungated shared
    experts of the routed width (S = 0 without, or min_shared, zeroed: the
    loader zeroes a shared expert the case lacks) as one MLP."""
    S = _shared_as(cfg, cfg["ffn"])
    _need(shared_key or not S, "the block has no shared experts; the case has %d" % S)
    _swiglu(cfg, shared_ok=True)
    d = cfg_deepseek_v3(cfg, experts_key=experts_key, shared_ok=True)
    d.pop("n_shared_experts")
    if shared_key:  # (None: a block without shared experts)
        d[shared_key] = max(S, min_shared)
    if shared_width_key:
        d[shared_width_key] = cfg["ffn"]
    d.update(extra)
    return d


# (row, module, block, config class, cfg_v3_kin's keyword arguments)
_NUM = {"experts_key": "num_experts", "shared_key": "num_shared_experts"}
_NOCLAMP = {"swiglu_limit": float("inf")}
V3_KIN = (("glm4-moe-lite", "glm4_moe_lite", "Glm4MoeLiteMoE", "Glm4MoeLiteConfig", {}),
          ("deepseek-v32", "deepseek_v32", "DeepseekV32MoE", "DeepseekV32Config", {}),
          ("glm-moe-dsa", "glm_moe_dsa", "GlmMoeDsaMoE", "GlmMoeDsaConfig", {}),
          ("exaone-moe", "exaone_moe", "ExaoneMoeSparseMoEBlock", "ExaoneMoeConfig", _NUM),
          ("bailing-hybrid", "bailing_hybrid", "BailingHybridMoE", "BailingHybridConfig", _NUM),
          # Sarvam-MoE: transformers maps it to GLM-4-MoE's model
          ("sarvam-moe", "glm4_moe", "Glm4MoeMoE", "SarvamMoEConfig", {}),
          ("glm4v-moe", "glm4v_moe", "Glm4vMoeTextMoE", "Glm4vMoeTextConfig", {}),
          ("solar-open", "solar_open", "SolarOpenMoE", "SolarOpenConfig", {}),
          ("kimi-linear", "kimi_linear", "KimiLinearMoE", "KimiLinearConfig", _NUM),
          # dots.3 note's text MoE: its shared experts' width a key of its own,
          # and at least one of them (zeroed for a case without)
          ("dots3-note", "dots3_note", "Dots3NoteTextMoE", "Dots3NoteTextConfig",
           {"shared_width_key": "shared_experts_intermediate_size", "min_shared": 1}),
          ("axk2", "axk2", "AXK2MoE", "AXK2Config", {}),
          # these clamp their SwiGLU at swiglu_limit (10) without gpt-oss's
          # (up + 1): the limit set to infinity is the case's SwiGLU
          ("glm5-next", "glm5_next", "Glm5NextTextMoE", "Glm5NextTextConfig", _NOCLAMP),
          ("hy-v4", "hy_v4", "HYV4MoE", "HYV4Config", _NOCLAMP),
          ("hy-v4-vl", "hy_v4_vl", "HYV4VLMoE", "HYV4VLTextConfig", _NOCLAMP),
          ("beam", "beam", "BeamMoE", "BeamConfig", {"shared_key": None,
                                                     "experts_key": "num_experts"}),
          ("mimo-v2-flash", "mimo_v2_flash", "MiMoV2FlashMoE", "MiMoV2FlashConfig",
           {"shared_key": None}))


# blocks refused, each with what the catalogue or the block lacks: (row,
# module, block, config class, reason)
_SIGMOID_NOGROUPS = ("needs sigmoid scores with a selection bias and no groups, SwiGLU experts: "
                     "no catalogue family has them (nemotron-like's experts are relu^2, "
                     "deepseek-v3-small's and deepseek-v3-shared's routing is grouped)")
REFUSED = (("axk1", "axk1", "AXK1MoE", "AXK1Config", "DeepSeek-V3's MoE with an RMSNorm on "
            "its output (post_mlp_layernorm): no catalogue stage normalises the layer's out"),
           ("mistral-large4", "mistral_large4", "MistralLarge4TextMoE", "MistralLarge4TextConfig",
            "needs softmax scores with groups scored by the sum of their best two: the "
            "catalogue's grouped softmax family (grouped-max) scores a group by its max"),
           ("flint", "flint", "FlintSparseMoeBlock", "FlintConfig", "needs sigmoid scores "
            "without a selection bias or groups and k > 1: no catalogue family (llama4-like "
            "is top-1 on the input)"),
           ("minimax-m3-vl", "minimax_m3_vl", "MiniMaxM3VLSparseMoeBlock", "MiniMaxM3VLTextConfig",
            _SIGMOID_NOGROUPS),
           ("kolibri1", "kolibri1", "Kolibri1SparseMoeBlock", "Kolibri1Config", _SIGMOID_NOGROUPS),
           ("inkling", "inkling", "InklingMoE", "InklingTextConfig", _SIGMOID_NOGROUPS),
           ("hy-v3", "hy_v3", "HYV3MoE", "HYV3Config", _SIGMOID_NOGROUPS),
           ("muse-spark", "muse_spark", "MuseSparkMoE", "MuseSparkTextConfig", _SIGMOID_NOGROUPS +
            "; and a centred RMSNorm on the experts' input (pre_expert_norm)"),
           ("inkling2", "inkling2", "Inkling2SparseMoeBlock", "Inkling2TextConfig",
            "needs a softcapped SwiGLU (Inkling2SoftcappedSwiGLU): no catalogue FFN"),
           ("inkling2-loop", "inkling2_loop", "Inkling2LoopSparseMoeBlock",
            "Inkling2LoopTextConfig", "needs a softcapped SwiGLU: no catalogue FFN"),
           ("ernie4.5-vl-moe", "ernie4_5_vl_moe", "Ernie4_5_VLMoeMoeBlock",
            "Ernie4_5_VLMoeTextConfig", "ERNIE-4.5-MoE's routing (a selection bias on softmax "
            "scores), a text and a vision MoE: no catalogue family"),
           ("doge", "doge", "DogeCDMoE", "DogeConfig", "needs product-key experts (rank-one "
            "experts from two key tables, Doge's CDMoE) beside a dense MLP: no catalogue FFN"),
           ("gemma4", "gemma4", "Gemma4TextMLP", "Gemma4TextConfig", "needs a router that "
            "RMS-normalises and scales its input and multiplies each weight by a per-expert "
            "scale, the MoE inside the decoder's MLP beside a dense MLP: no catalogue routing"),
           ("diffusion-gemma", "diffusion_gemma", "DiffusionGemmaTextExperts",
            "DiffusionGemmaTextConfig", "Gemma-4's router (a normalised, scaled input, "
            "per-expert scales on the weights): no catalogue routing"),
           ("openai-privacy-filter", "openai_privacy_filter", "OpenAIPrivacyFilterMLP",
            "OpenAIPrivacyFilterConfig", "gpt-oss's routing with the softmax over the top-k "
            "logits divided by k: no catalogue family has softmax_topk with a scale (gpt-oss-full "
            "and softmax-topk have scale 1)"))


def cfg_deepseek_v4(cfg, hashed):
    """DeepSeek-V4's DeepseekV4SparseMoeBlock: sqrtsoftplus scores (a
    selection bias in its top-k layers, a token-id table in its hash
    layers), always renormalised (+ 1e-20), scaled, one ungated shared
    expert of width f (zeroed for a case without). Its SwiGLU clamps gate
    and up at swiglu_limit without gpt-oss's (up + 1) and alpha, a form the
    catalogue lacks: the limit is set to infinity, which is the case's
    plain SwiGLU."""
    _need(cfg["score_function"] == "sqrtsoftplus", "the block scores with sqrtsoftplus; the "
          "case with %s" % cfg["score_function"])
    _need(bool(int(cfg.get("hash_vocab", 0) or 0)) == hashed, "the %s layer %s" % (
        ("hash", "routes by its token-id table (hash_vocab > 0)") if hashed else
        ("top-k", "routes by the scores (the case has a hash table: the row deepseek-v4[hash])")))
    _need(cfg["renormalize"], "the block always renormalises the top-k weights")
    _need(cfg["n_group"] <= 1, "the block has no group-limited routing")
    _need(cfg["ffn_kind"] == "swiglu", "the block's experts are SwiGLU (clamped at "
          "swiglu_limit, set to infinity); the case's FFN is %s" % cfg["ffn_kind"])
    _need(_shared_as(cfg, cfg["ffn"]) <= 1, "the block has one shared expert")
    return _dims(cfg, scoring_func="sqrtsoftplus", routed_scaling_factor=float(cfg["scaling"]),
                 swiglu_limit=float("inf"), mlp_layer_types=["hash_moe" if hashed else "moe"],
                 vocab_size=int(cfg.get("hash_vocab", 0) or 0) or 32)


def _v4_load_extra(block, golden, torch):
    if hasattr(block.gate, "tid2eid"):  # the hash layer's token-id -> expert table
        block.gate.tid2eid.copy_(torch.from_numpy(golden.array("hash_table")).long())


def _v4_forward_kwargs(golden, torch, device):
    if not int(golden.config.get("hash_vocab", 0) or 0):
        return {}
    ids = torch.from_numpy(golden.array("token_ids")).long()
    return {"input_ids": ids.reshape(1, -1).to(device)}


DEEPSEEK_V4 = types.SimpleNamespace(block_args=(0,), load_extra=_v4_load_extra,
                                    forward_kwargs=_v4_forward_kwargs)


def cfg_hunyuan(cfg):
    # HunYuan-MoE-V1: softmax top-k, always renormalised, router `wg` in
    # fp32; its shared MLP (ungated, of the experts' width) always built:
    # zeroed for a case without shared experts
    S = _shared_as(cfg, cfg["ffn"])
    _need(S <= 1, "the block has one shared MLP")
    _swiglu(cfg, shared_ok=True)
    _softmax_topk(cfg, renorm=True)
    return _dims(cfg, experts_key="num_experts", moe_topk=cfg["top_k"])


def cfg_qwen3_next(cfg, renorm=None):
    """Qwen3-Next (norm_topk_prob) and Qwen3.5-MoE (always renormalised):
    Qwen2-MoE's gated shared expert of width S f_s, always built (width 0,
    its gate multiplying zeros, for a case without)."""
    S, fs, gated = shared_of(cfg)
    _need(not S or gated, "the block's shared expert is gated by sigmoid(x w_sg); the case's "
          "is ungated")
    _swiglu(cfg, shared_ok=True)
    _softmax_topk(cfg, renorm=renorm)
    return _dims(cfg, experts_key="num_experts", ffn_key="moe_intermediate_size",
                 norm_topk_prob=bool(cfg["renormalize"]), shared_expert_intermediate_size=S * fs,
                 layer_types=["full_attention"], mlp_only_layers=[], decoder_sparse_step=1)


def softmax_topk_plain(cfg):
    """Checks a case for a block whose weights are a softmax over the top-k
    logits (the catalogue's softmax_topk) with no router-logit bias, no
    selection bias, groups or scaling, and SwiGLU experts."""
    _need(cfg["score_function"] == "softmax_topk", "the block takes a softmax over the top-k "
          "logits (softmax_topk); the case scores with %s" % cfg["score_function"])
    _need(not (cfg.get("router_bias") or cfg.get("has_router_bias")),
          "the block has no router-logit bias")
    _need(not cfg["has_bias"] and cfg["n_group"] <= 1 and cfg["scaling"] == 1.0,
          "the block has no selection bias, groups or scaling")
    _swiglu(cfg)


def cfg_cohere2(cfg):
    # Cohere2-MoE: the top-k of the logits, a softmax over those k
    # (expert_selection_fn softmax); shared experts off (num_shared_experts 0)
    softmax_topk_plain(cfg)
    return _dims(cfg, experts_key="num_experts", expert_selection_fn="softmax",
                 num_shared_experts=0, layer_types=["full_attention"])


def cfg_aria(cfg):
    # Aria: the top-k of the logits and a softmax over those k, and S
    # ungated shared experts of the routed width: no softmax_topk family has
    # shared experts, so theirs are built of width 0
    softmax_topk_plain(cfg)
    since((5, 24), "AriaExperts.gate_up_proj")  # 5.17's experts are per-expert modules
    return _dims(cfg, experts_key="moe_num_experts", moe_topk=cfg["top_k"],
                 moe_num_shared_experts=0)


def cfg_mistral4(cfg):
    raise NotExpressible("needs softmax scores with groups scored by the sum of their best two "
                         "(Mistral4TopkRouter): the catalogue's grouped softmax family "
                         "(grouped-max) scores a group by its max")


def _refuse(why):
    raise NotExpressible(why)


def cfg_zaya(cfg):
    raise NotExpressible("needs a router that is an MLP (down_proj to router_hidden_size, "
                         "then router_mlp to E + 1 classes, the last a 'skip' class whose "
                         "slots get weight 0): the catalogue's router is one linear map [d, E]")


def cfg_sigmoid_nogroups(cfg, why):
    """MiniMax-M2, AFMoE, LFM2-MoE: sigmoid scores with a selection bias
    and no groups, SwiGLU experts: no catalogue family (nemotron-like's
    experts are relu², deepseek-v3-*'s routing is grouped)."""
    _need(cfg["score_function"] == "sigmoid" and cfg["n_group"] <= 1 and cfg["has_bias"]
          and cfg["ffn_kind"] == "swiglu" and not cfg.get("weight_on_input"),
          "needs sigmoid scores with a selection bias, no groups and SwiGLU experts: no "
          "catalogue family has them (nemotron-like's experts are relu^2, deepseek-v3-small's "
          "and deepseek-v3-shared's routing is grouped)" + why)
    raise NotExpressible("no mapping written for this case" + why)


def cfg_ernie(cfg):
    raise NotExpressible("needs a selection bias added to softmax scores (Ernie4_5_MoeStatics; "
                         "the weights renormalised with the sum clamped at moe_norm_min): no "
                         "catalogue family has softmax with a selection bias")


def cfg_longcat(cfg):
    # LongCat-Flash: a softmax over E experts and Z zero (identity) experts,
    # the top-k on scores + e_score_correction_bias, weights the scores times
    # routed_scaling_factor; an id >= E is the identity (zero_experts). Its
    # router (a classifier module the forward never calls) and its E + Z
    # gate_up rows need their own functions: tools/clients/longcat.py's hooks
    cfg = LC.configure(cfg, error=NotExpressible)
    # 5.17's LongcatFlashTopkRouter hands the experts another tuple
    since((5, 24), "LongcatFlashTopkRouter's (router_logits, topk_weights, topk_indices)")
    return cfg


import longcat as LC  # noqa: E402  (the hooks of the longcat-flash row)


# --------------------------------------------------------------- table

import jetmoe as JET  # noqa: E402  (the hooks of rows these functions cannot drive;
import llama4 as L4  # noqa: E402   they import this module's helpers)


Client = collections.namedtuple("Client", "name module block config configure impl defect note "
                                 "router_dtype layout hooks")
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
"dbrx" (w1, v1, w2 [E*f, d]); hooks: None, or an object (a module) whose
build(client, cfg, torch), load_inputs(client, block, golden, torch) and
run_block(client, block, golden, torch, device), where present, replace
this module's for the row: a block these generic functions cannot drive
(Llama-4: tools/clients/llama4.py) is driven by its own, through the same
harness; and where the generic functions serve with an addition,
block_args (the block's further constructor arguments: DeepSeek-V4's
layer index), load_extra(block, golden, torch) (inputs beyond the weights:
its hash table) and forward_kwargs(golden, torch, device) (the block's
further forward arguments: its token ids)."""


def _c(name, module, block, config, configure, impl="eager", defect=None, note="",
       router_dtype="fp32", layout="gate_up", hooks=None):
    return Client(name, "transformers.models.%s.modeling_%s" % (module, module), block, config,
                  configure, impl, defect, note, router_dtype, layout, hooks)


def _hook(client, name):
    """The row's own `name` function (Client.hooks), or None."""
    return getattr(client.hooks, name, None) if client.hooks is not None else None


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
    # issue 26's other transformers 5.24 blocks
    _c("glm4-moe[shared]", "glm4_moe", "Glm4MoeMoE", "Glm4MoeConfig", cfg_deepseek_v3_shared,
       note="shared experts on"),
    _c("dots1[shared]", "dots1", "Dots1MoE", "Dots1Config", cfg_deepseek_v3_shared,
       note="shared experts on"),
    # DeepSeek-V3's MoE copied (its router, its S ungated shared experts)
    *[_c(name, module, block, config, lambda c, k=keys: cfg_v3_kin(c, **k),
         note="DeepSeek-V3's MoE; its shared experts as the case's") for
      name, module, block, config, keys in V3_KIN],
    _c("deepseek-v4", "deepseek_v4", "DeepseekV4SparseMoeBlock", "DeepseekV4Config",
       lambda c: cfg_deepseek_v4(c, hashed=False), hooks=DEEPSEEK_V4,
       note="sqrtsoftplus + selection bias; swiglu_limit infinite; its shared expert zeroed"),
    _c("deepseek-v4[hash]", "deepseek_v4", "DeepseekV4SparseMoeBlock", "DeepseekV4Config",
       lambda c: cfg_deepseek_v4(c, hashed=True), hooks=DEEPSEEK_V4,
       note="the hash layer: tid2eid = hash_table, input_ids = token_ids"),
    _c("hunyuan-v1-moe", "hunyuan_v1_moe", "HunYuanMoEV1Moe", "HunYuanMoEV1Config", cfg_hunyuan,
       note="its shared MLP zeroed"),
    _c("qwen3-next", "qwen3_next", "Qwen3NextSparseMoeBlock", "Qwen3NextConfig", cfg_qwen3_next,
       note="gated shared expert as the case's (width 0 without)"),
    _c("qwen3.5-moe", "qwen3_5_moe", "Qwen3_5MoeSparseMoeBlock", "Qwen3_5MoeTextConfig",
       lambda c: cfg_qwen3_next(c, renorm=True), note="gated shared expert (width 0 without)"),
    _c("granite-moe-shared", "granitemoeshared", "GraniteMoeSharedMoE", "GraniteMoeSharedConfig",
       cfg_granite, note="the block; its shared MLP is the decoder layer's, not the block's"),
    _c("granite-moe-hybrid", "granitemoehybrid", "GraniteMoeHybridMoE", "GraniteMoeHybridConfig",
       lambda c: dict(cfg_granite(c), mamba_n_heads=1),  # (its config checks its Mamba heads)
       note="Granite-MoE's block in the hybrid model"),
    _c("qwen3-omni-moe", "qwen3_omni_moe", "Qwen3OmniMoeThinkerTextSparseMoeBlock",
       "Qwen3OmniMoeTextConfig", lambda c: cfg_qwen(c, ffn_key="moe_intermediate_size"),
       note="the thinker's MoE (Qwen3-MoE's)"),
    _c("qwen3-omni-moe[talker]", "qwen3_omni_moe", "Qwen3OmniMoeTalkerTextSparseMoeBlock",
       "Qwen3OmniMoeTalkerTextConfig", cfg_qwen3_next,
       note="the talker's MoE: Qwen2-MoE's gated shared expert (width 0 without)"),
    _c("aria", "aria", "AriaTextMoELayer", "AriaTextConfig", cfg_aria,
       note="softmax over the top-k logits; its shared experts of width 0"),
    _c("mistral4", "mistral4", "Mistral4MoE", "Mistral4Config", cfg_mistral4),
    _c("laguna", "laguna", "LagunaSparseMoeBlock", "LagunaConfig",
       lambda c: cfg_sigmoid_nogroups(c, "")),
    _c("step3p7", "step3p7", "Step3p7SparseMoeBlock", "Step3p7TextConfig",
       lambda c: cfg_sigmoid_nogroups(c, "")),
    _c("zaya", "zaya", "ZayaSparseMoeBlock", "ZayaConfig", cfg_zaya),
    _c("deepseek-ocr2", "deepseek_ocr2", "DeepseekOcr2TextMoe", "DeepseekOcr2TextConfig",
       cfg_deepseek_v2, note="DeepSeek-V2's MoE; shared experts off"),
    _c("unlimited-ocr", "unlimited_ocr", "UnlimitedOcrTextMoe", "UnlimitedOcrTextConfig",
       cfg_deepseek_v2, note="DeepSeek-V2's MoE; shared experts off"),
    _c("lara-mini", "lara_mini", "LaraMiniSparseMoeBlock", "LaraMiniConfig",
       lambda c: cfg_qwen(c, ffn_key="moe_intermediate_size", shared_expert_intermediate_size=0),
       note="its ungated shared expert at width 0"),
    _c("mellum", "mellum", "MellumSparseMoeBlock", "MellumConfig",
       lambda c: cfg_qwen(c, ffn_key="moe_intermediate_size")),
    _c("qwen4-exp", "qwen4_exp", "Qwen4ExpTextSparseMoeBlock", "Qwen4ExpTextConfig",
       lambda c: (_need_shared(c, gated=True), cfg_qwen3_next(c))[1],  # (its config wants one)
       note="Qwen2-MoE's gated shared expert"),
    _c("granite-moe-swa", "granitemoe_swa", "GraniteMoeSWAMoE", "GraniteMoeSWAConfig",
       cfg_granite),
    *[_c(name, module, block, config, lambda c, why=why: _refuse(why))
      for name, module, block, config, why in REFUSED],
    _c("cohere2-moe", "cohere2_moe", "Cohere2MoeSparseMoeBlock", "Cohere2MoeConfig", cfg_cohere2,
       note="softmax over the top-k logits; shared experts off"),
    _c("minimax-m2", "minimax_m2", "MiniMaxM2SparseMoeBlock", "MiniMaxM2Config",
       lambda c: cfg_sigmoid_nogroups(c, "")),
    _c("afmoe", "afmoe", "AfmoeSparseMoeBlock", "AfmoeConfig",
       lambda c: cfg_sigmoid_nogroups(c, "")),
    _c("lfm2-moe", "lfm2_moe", "Lfm2MoeSparseMoeBlock", "Lfm2MoeConfig",
       lambda c: cfg_sigmoid_nogroups(c, "; and it renormalises by sum + 1e-6 (8 fp32 ulp of a "
                                         "sum near 1)")),
    _c("ernie4.5-moe", "ernie4_5_moe", "Ernie4_5_MoeSparseMoeBlock", "Ernie4_5_MoeConfig",
       cfg_ernie),
    _c("jetmoe", "jetmoe", "JetMoeMoE", "JetMoeConfig", lambda c: JET.configure(c), hooks=JET,
       note="softmax over the top-k logits, experts sorted; its output bias zeroed (jetmoe.py)"),
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
    _c("llama4", "llama4", "Llama4TextMoe", "Llama4TextConfig", lambda c: L4.configure(c),
       hooks=L4, note="sigmoid top-1 on the expert's input, a shared expert (llama4.py)"),
    _c("llama4[defect:weight-on-output]", "llama4", "Llama4TextMoe", "Llama4TextConfig",
       lambda c: L4.configure(c), hooks=L4, defect="weight-on-output",
       note="negative control: the score on the expert's output, the Mixtral way"),
    _c("qwen2-moe[shared]", "qwen2_moe", "Qwen2MoeSparseMoeBlock", "Qwen2MoeConfig",
       cfg_qwen2_shared, note="gated shared expert on"),
    _c("deepseek-v3[shared]", "deepseek_v3", "DeepseekV3MoE", "DeepseekV3Config",
       cfg_deepseek_v3_shared, note="shared experts on"),
    _c("nemotron-h", "nemotron_h", "NemotronHMoE", "NemotronHConfig", cfg_nemotron_h,
       layout="nemotron", note="relu^2 experts, an ungated relu^2 shared expert"),
    _c("longcat-flash", "longcat_flash", "LongcatFlashMoE", "LongcatFlashConfig", cfg_longcat,
       note="zero (identity) experts in the softmax, the bias for selection only (longcat.py)",
       hooks=LC),
    _c("longcat-flash[defect:identity-dropped]", "longcat_flash", "LongcatFlashMoE",
       "LongcatFlashConfig", cfg_longcat, hooks=LC, defect="identity-dropped",
       note="negative control: every zero expert's slot weighted 0 (its w x term dropped)"),
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
    NotExpressible when the case does not fit the block, NotAvailable
    when the installed transformers lacks it."""
    require_available(client)
    if _hook(client, "build"):
        return _hook(client, "build")(client, cfg, torch)
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
    block = getattr(mod, client.block)(config, *(getattr(client.hooks, "block_args", ()))).eval()
    return block


def router_of(block):
    """The module whose weight [E, d] gives the router logits: the block's
    gate or router, or its linear layer (DBRX, JetMoE: layer; HunYuan: wg;
    AFMoE: gate)."""
    for name in ("gate", "router"):
        r = getattr(block, name, None)
        if r is not None and hasattr(r, "weight"):
            return r
        for inner in ("layer", "wg", "gate"):
            if r is not None and hasattr(getattr(r, inner, None), "weight"):
                return getattr(r, inner)
    raise NotExpressible("the block has no router module with a weight (gate / router)")


def selection_bias(block):
    """The selection bias [E] the block adds to the scores before its top-k:
    the router's e_score_correction_bias (DeepSeek-V3 and its kin), or the
    block's own (MiniMax-M2: e_score_correction_bias; AFMoE, LFM2-MoE:
    expert_bias)."""
    for owner in (router_of(block), getattr(block, "gate", None), block):
        for name in ("e_score_correction_bias", "expert_bias"):
            if owner is not None and getattr(owner, name, None) is not None:
                return getattr(owner, name)
    raise NotExpressible("the block has no selection bias to hold the case's expert_bias")


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
    if _hook(client, "load_inputs"):
        return _hook(client, "load_inputs")(client, block, golden, torch)
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
            selection_bias(block).copy_(T("expert_bias", torch.float32).reshape(
                selection_bias(block).shape))
        wg = T("w_gate") if golden.config["ffn_kind"] != "relu2" else None  # relu2: no gate
        wu = T("w_up")
        if client.defect == "gate-up-swapped":
            wg, wu = wu, wg
        LAYOUTS[client.layout][0](block, wg, wu, T("w_down"), T, torch)
        if _hook(client, "load_extra"):
            _hook(client, "load_extra")(block, golden, torch)
        if shared_of(golden.config)[0]:
            _load_shared(block, golden, T)
        elif shared_mlp(block) is not None:  # a shared expert always built: zeroed
            for p in shared_mlp(block).parameters():  # (its output and gradients exactly 0)
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
    shared_experts, HunYuan: shared_mlp), or None."""
    for name in ("shared_expert", "shared_experts", "shared_mlp"):
        if getattr(block, name, None) is not None:
            return getattr(block, name)
    return None


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
    if _hook(client, "run_block"):
        return _hook(client, "run_block")(client, block, golden, torch, device)
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
    kw = _hook(client, "forward_kwargs")
    out = block(x, **(kw(golden, torch, device) if kw else {}))
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
