/* The case catalogue and the key = value case-file format. */
#include "config.h"
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "golden/golden_priv.h"
#include "dropless/quant.h"

/* ------------------------------------------------------------ catalogue */

#define ROUTE(E, k, sf, ng, tg, gs, rn, sc, ...)                                    \
    {.experts = E, .top_k = k, .score_fn = sf, .n_group = ng, .topk_group = tg,      \
     .group_score = gs, .renormalize = rn, .scaling = sc, ROUTE_FLAGS(__VA_ARGS__, 0, 0, 0, 0, 0)}
/* has_bias, then optionally has_router_bias, weight_on_input, hash_vocab and
 * zero_experts (0 when left out) */
#define ROUTE_FLAGS(...) ROUTE_FLAGS_(__VA_ARGS__)
#define ROUTE_FLAGS_(bias, rbias, win, hv, z, ...) .has_bias = bias, .has_router_bias = rbias, \
                                                   .weight_on_input = win, .hash_vocab = hv,  \
                                                   .zero_experts = z
#define ONE(nm, desc, T, d, f, rt, fk, dt, seed_, kind, zs, big)                     \
    {.name = nm, .description = desc,                                               \
     .config = {.tokens = T, .hidden = d, .ffn = f, .route = ROUTE rt, .ffn_kind = fk, \
                .dtype = dt},                                                        \
     .seed = seed_, .inputs = kind, .zipf_s = zs, .large = big,                     \
     .tier = (big) ? DL_TIER_LAYER : DL_TIER_VECTORS}
/* Every case comes in fp32 (no suffix), bf16 and fp16; all three draw the
 * same normals (same seed) and round them to their own grid. */
#define CASE3(nm, desc, T, d, f, rt, fk, seed_, kind, zs, big)                        \
    ONE(nm, desc, T, d, f, rt, fk, DL_F32, seed_, kind, zs, big),                    \
    ONE(nm "-bf16", desc, T, d, f, rt, fk, DL_BF16, seed_, kind, zs, big),           \
    ONE(nm "-fp16", desc, T, d, f, rt, fk, DL_F16, seed_, kind, zs, big)

/* An FFN variant (issue 26): the activation's alpha and limit and the
 * router weight's storage type, in fp32, bf16 and fp16. */
#define ONEV(nm, desc, T, d, f, rt, fk, al, li, rdt, fb, dt, seed_)                      \
    {.name = nm, .description = desc,                                               \
     .config = {.tokens = T, .hidden = d, .ffn = f, .route = ROUTE rt, .ffn_kind = fk, \
                .dtype = dt, .act_alpha = al, .act_limit = li, .router_dtype = rdt,   \
                .ffn_bias = fb},                                                     \
     .seed = seed_, .inputs = DL_INPUTS_RANDOM, .tier = DL_TIER_VECTORS}
#define CASE3V(nm, desc, T, d, f, rt, fk, al, li, rdt, fb, seed_)                       \
    ONEV(nm, desc, T, d, f, rt, fk, al, li, rdt, fb, DL_F32, seed_),                   \
    ONEV(nm "-bf16", desc, T, d, f, rt, fk, al, li, rdt, fb, DL_BF16, seed_),          \
    ONEV(nm "-fp16", desc, T, d, f, rt, fk, al, li, rdt, fb, DL_F16, seed_)

/* A kernel-tier case: one dtype, on demand, pinned by vectors/KERNEL_SHA256SUMS. */
#define KCASE(nm, desc, T, d, f, rt, dt, seed_, kind, zs)                              \
    {.name = nm, .description = desc,                                               \
     .config = {.tokens = T, .hidden = d, .ffn = f, .route = ROUTE rt,                 \
                .ffn_kind = DL_FFN_SWIGLU, .dtype = dt},                             \
     .seed = seed_, .inputs = kind, .zipf_s = zs, .large = 1, .tier = DL_TIER_KERNEL}

/* A layer recipe's case (DL_LOWP_LAYER_MAP): bf16, on demand in the
 * kernel tier, pinned by vectors/KERNEL_SHA256SUMS. */
/* A model family's kernel-tier member: the configuration's further fields
 * (the FFN variant's, the shared experts') as designated initializers. */
#define KFAM(nm, desc, T, d, f, rt, fk, seed_, ...)                                  \
    {.name = nm, .description = desc,                                               \
     .config = {.tokens = T, .hidden = d, .ffn = f, .route = ROUTE rt, .ffn_kind = fk, \
                .dtype = DL_BF16, __VA_ARGS__},                                      \
     .seed = seed_, .inputs = DL_INPUTS_RANDOM, .large = 1, .tier = DL_TIER_KERNEL}

#define LCASE(nm, desc, T, d, f, rt, seed_, kind, lp)                                 \
    {.name = nm, .description = desc,                                               \
     .config = {.tokens = T, .hidden = d, .ffn = f, .route = ROUTE rt,                 \
                .ffn_kind = DL_FFN_SWIGLU, .dtype = DL_BF16, .lowp = DL_LOWP_##lp},     \
     .seed = seed_, .inputs = kind, .large = 1, .tier = DL_TIER_KERNEL}

/* kernel-sizes-bf16's shapes, routing, seed and inputs under a recipe */
#define LCASE_TWIN(nm, desc, lp) LCASE_X(nm, desc, KSIZES_TWIN(lp))
#define LCASE_X(...) LCASE(__VA_ARGS__)
#define KSIZES_TWIN(lp) 1024, 512, 512, (64, 2, SM, 1, 1, GMAX, 1, 1.0, 0), 201, DL_INPUTS_SIZES, lp
/* A case with shared experts (S of width fs; gate 1: Qwen2-MoE's sigmoid
 * gate) in the three dtypes. */
#define SONE(nm, desc, T, d, f, rt, dt, seed_, S, fs, gate)                           \
    {.name = nm, .description = desc,                                               \
     .config = {.tokens = T, .hidden = d, .ffn = f, .route = ROUTE rt,                 \
                .ffn_kind = DL_FFN_SWIGLU, .dtype = dt, .shared_experts = S,          \
                .shared_ffn = fs, .shared_gate = gate},                               \
     .seed = seed_, .inputs = DL_INPUTS_RANDOM, .tier = DL_TIER_VECTORS}
#define SCASE3(nm, desc, T, d, f, rt, seed_, S, fs, gate)                              \
    SONE(nm, desc, T, d, f, rt, DL_F32, seed_, S, fs, gate),                          \
    SONE(nm "-bf16", desc, T, d, f, rt, DL_BF16, seed_, S, fs, gate),                 \
    SONE(nm "-fp16", desc, T, d, f, rt, DL_F16, seed_, S, fs, gate)
/* ... and of another activation (the shared experts follow the case's). */
#define SONEK(nm, desc, T, d, f, rt, fk, dt, seed_, S, fs)                            \
    {.name = nm, .description = desc,                                               \
     .config = {.tokens = T, .hidden = d, .ffn = f, .route = ROUTE rt,                 \
                .ffn_kind = fk, .dtype = dt, .shared_experts = S, .shared_ffn = fs},  \
     .seed = seed_, .inputs = DL_INPUTS_RANDOM, .tier = DL_TIER_VECTORS}
#define SCASE3K(nm, desc, T, d, f, rt, fk, seed_, S, fs)                               \
    SONEK(nm, desc, T, d, f, rt, fk, DL_F32, seed_, S, fs),                           \
    SONEK(nm "-bf16", desc, T, d, f, rt, fk, DL_BF16, seed_, S, fs),                  \
    SONEK(nm "-fp16", desc, T, d, f, rt, fk, DL_F16, seed_, S, fs)

#define SM DL_SCORE_SOFTMAX
#define SG DL_SCORE_SIGMOID
#define GMAX DL_GROUP_MAX
#define G2 DL_GROUP_TOP2_SUM
#define GK DL_GROUP_TOPK_SUM
#define SWI DL_FFN_SWIGLU
#define PLN DL_FFN_PLAIN

static const dl_case_t catalogue[] = {
    CASE3("tiny", "4 tokens, 4 experts: small enough to check by hand",
          4, 4, 4, (4, 2, SM, 1, 1, GMAX, 1, 1.0, 0), SWI, 1, DL_INPUTS_RANDOM, 0, 0),
    CASE3("ties", "softmax top-2 with duplicated router columns: exact and near ties at the k boundary, an all-zero token",
          24, 16, 8, (8, 2, SM, 1, 1, GMAX, 1, 1.0, 0), SWI, 2, DL_INPUTS_TIES, 0, 0),
    CASE3("ties-grouped", "sigmoid, bias, 4 groups keep 2, topk_sum: tied groups and tied experts",
          16, 16, 8, (16, 4, SG, 4, 2, GK, 1, 1.0, 1), SWI, 3, DL_INPUTS_TIES, 0, 0),
    CASE3("empty-experts", "experts 0, 4 and 7 (first, middle, last) receive no token",
          32, 16, 8, (8, 2, SM, 1, 1, GMAX, 1, 1.0, 0), SWI, 4, DL_INPUTS_EMPTY, 0, 0),
    CASE3("no-tokens", "T = 0: every token-shaped array is empty, dW exactly zero",
          0, 8, 8, (4, 2, SM, 1, 1, GMAX, 1, 1.0, 0), SWI, 5, DL_INPUTS_RANDOM, 0, 0),
    CASE3("one-hot", "top-1 and every token to expert 4",
          16, 16, 8, (8, 1, SM, 1, 1, GMAX, 1, 1.0, 0), SWI, 6, DL_INPUTS_ONE_HOT, 0, 0),
    CASE3("single-token", "T = 1",
          1, 16, 8, (8, 2, SM, 1, 1, GMAX, 1, 1.0, 0), SWI, 7, DL_INPUTS_RANDOM, 0, 0),
    CASE3("odd-shapes", "T = 13, d = 23, f = 37, E = 3: no dimension a multiple of 8",
          13, 23, 37, (3, 2, SM, 1, 1, GMAX, 1, 1.0, 0), SWI, 8, DL_INPUTS_RANDOM, 0, 0),
    CASE3("zipf", "softmax without renormalisation, expert loads ~ (e+1)^-1.2",
          64, 8, 8, (16, 2, SM, 1, 1, GMAX, 0, 1.0, 0), SWI, 9, DL_INPUTS_ZIPF, 1.2, 0),
    CASE3("mixtral-small", "Mixtral routing (softmax, top-2 of 8, renormalised), small shapes",
          32, 16, 16, (8, 2, SM, 1, 1, GMAX, 1, 1.0, 0), SWI, 10, DL_INPUTS_RANDOM, 0, 0),
    CASE3("deepseek-v3-small", "DeepSeek-V3 routing (sigmoid, bias, 8 groups keep 4, top2_sum, top-8, scale 2.5), small shapes",
          16, 8, 8, (32, 8, SG, 8, 4, G2, 1, 2.5, 1), SWI, 11, DL_INPUTS_RANDOM, 0, 0),
    CASE3("grouped-max", "softmax, 4 groups keep 2 scored by max, no renormalisation, scale 2",
          24, 8, 8, (16, 3, SM, 4, 2, GMAX, 0, 2.0, 0), SWI, 12, DL_INPUTS_RANDOM, 0, 0),
    CASE3("plain-ffn", "single grouped GEMM per expert (y = x Wd): tests a grouped GEMM alone",
          24, 24, 24, (6, 2, SM, 1, 1, GMAX, 1, 1.0, 0), PLN, 13, DL_INPUTS_RANDOM, 0, 0),
    SCASE3("qwen2-moe-like", "Qwen2-MoE: softmax top-4 of 8 without renormalisation, one shared expert of width 4f scaled by sigmoid(x w_sg)",
           24, 16, 8, (8, 4, SM, 1, 1, GMAX, 0, 1.0, 0), 301, 1, 32, 1),
    SCASE3("deepseek-v3-shared", "DeepSeek-V3 routing with always-on shared experts added unscaled: 2 of width f (V2's count; one MLP of width 2f)",
           16, 8, 8, (32, 8, SG, 8, 4, G2, 1, 2.5, 1), 302, 2, 8, 0),
    CASE3("deepseek-v4-like", "DeepSeek-V4 routing: sqrtsoftplus scores, selection-only bias, top-4 of 16 renormalised, scale 1.5",
          16, 8, 4, (16, 4, DL_SCORE_SQRTSOFTPLUS, 1, 1, GMAX, 1, 1.5, 1), SWI, 2601, DL_INPUTS_RANDOM, 0, 0),
    CASE3("softmax-topk", "gpt-oss routing: a bias on the router logits, top-4 of 16 on the logits, then softmax over the 4 selected",
          16, 8, 4, (16, 4, DL_SCORE_SOFTMAX_TOPK, 1, 1, GMAX, 0, 1.0, 0, 1), SWI, 2602, DL_INPUTS_RANDOM, 0, 0),
    CASE3("softmax-topk-ties", "softmax over the top-2 logits with duplicated router columns: exact ties at the k boundary and inside the selection",
          16, 8, 4, (8, 2, DL_SCORE_SOFTMAX_TOPK, 1, 1, GMAX, 0, 1.0, 0), SWI, 2603, DL_INPUTS_TIES, 0, 0),
    CASE3V("gpt-oss-like", "gpt-oss's experts: SwiGLU clamped at 7 (alpha 1.702, up + 1), biases on both projections, softmax top-4 of 8 renormalised, bf16 router weight, small shapes",
           32, 16, 16, (8, 4, SM, 1, 1, GMAX, 1, 1.0, 0), DL_FFN_SWIGLU_CLAMP, 1.702, 7.0, DL_BF16, 1, 14),
    CASE3V("swiglu-clamp-tight", "gpt-oss's activation with limit 0.5: most gates and ups at or past the clamp",
           24, 16, 8, (8, 2, SM, 1, 1, GMAX, 1, 1.0, 0), DL_FFN_SWIGLU_CLAMP, 1.702, 0.5, DL_F32, 0, 15),
    CASE3V("geglu-tanh", "GeGLU with the tanh approximation of gelu, fp16 router weight, small shapes",
           24, 16, 16, (8, 2, SM, 1, 1, GMAX, 1, 1.0, 0), DL_FFN_GEGLU_TANH, 0.0, 0.0, DL_F16, 0, 16),
    CASE3V("nemotron-like", "Nemotron-H's experts: non-gated relu(x Wu)^2 Wd; sigmoid top-4 of 16 with the selection bias, renormalised, scale 2.5 (its shared expert left out)",
           24, 16, 16, (16, 4, SG, 1, 1, GMAX, 1, 2.5, 1), DL_FFN_RELU2, 0.0, 0.0, DL_F32, 0, 17),
    SCASE3("llama4-like", "Llama-4's MoE: sigmoid top-1 of 16 on the expert's input (x sigmoid(l) into the expert, outputs summed unweighted), one shared expert of width f",
           24, 16, 8, (16, 1, SG, 1, 1, GMAX, 0, 1.0, 0, 0, 1), 2604, 1, 8, 0),
    CASE3("deepseek-v4-hash", "DeepSeek-V4's first layers: hash routing, each token's top-4 of 16 a row of a 32-row token-id table in the inputs, weights its sqrtsoftplus scores renormalised, scale 1.5",
          16, 8, 4, (16, 4, DL_SCORE_SQRTSOFTPLUS, 1, 1, GMAX, 1, 1.5, 0, 0, 0, 32), SWI, 2606, DL_INPUTS_RANDOM, 0, 0),
    SCASE3K("nemotron-shared", "Nemotron-H's MoE with its shared expert: relu(x Wu)^2 Wd routed experts (sigmoid top-4 of 16, selection bias, renormalised, scale 2.5) and one ungated relu^2 shared expert of width 2f",
            24, 16, 16, (16, 4, SG, 1, 1, GMAX, 1, 2.5, 1), DL_FFN_RELU2, 19, 1, 32),
    CASE3V("gpt-oss-full", "gpt-oss with every feature on: a bias on the router logits, softmax over the top-4 of 8 logits, SwiGLU clamped at 7 (alpha 1.702, up + 1), biases on both projections, bf16 router weight",
           32, 16, 16, (8, 4, DL_SCORE_SOFTMAX_TOPK, 1, 1, GMAX, 0, 1.0, 0, 1), DL_FFN_SWIGLU_CLAMP, 1.702, 7.0, DL_BF16, 1, 18),
    CASE3("longcat-like", "LongCat-Flash: softmax over 8 experts and 4 zero (identity) experts, top-4 of the 12 chosen on the scores plus a selection-only bias, no renormalisation, scale 6; a zero expert's output is its input",
          24, 16, 8, (8, 4, SM, 1, 1, GMAX, 0, 6.0, 1, 0, 0, 0, 4), SWI, 2607, DL_INPUTS_RANDOM, 0, 0),
    CASE3("mixtral-layer", "Mixtral-8x7B layer: E = 8, k = 2, d = 4096, f = 14336 (on demand)",
          4096, 4096, 14336, (8, 2, SM, 1, 1, GMAX, 1, 1.0, 0), SWI, 101, DL_INPUTS_RANDOM, 0, 1),
    CASE3("deepseek-v3-layer", "DeepSeek-V3 layer: E = 256, k = 8, d = 7168, f = 2048, 8 groups keep 4 (on demand)",
          4096, 7168, 2048, (256, 8, SG, 8, 4, G2, 1, 2.5, 1), SWI, 102, DL_INPUTS_RANDOM, 0, 1),

    /* The kernel tier: the shapes at which a GPU grouped GEMM tiles, pads,
     * splits K and changes code path (doc/format.md, "The kernel tier"). */
    KCASE("kernel-sizes-bf16", "planted group sizes 0, 1, 63, 64, 65, 127, 128, 129 and a hot expert with every token",
          1024, 512, 512, (64, 2, SM, 1, 1, GMAX, 1, 1.0, 0), DL_BF16, 201, DL_INPUTS_SIZES, 0),
    KCASE("kernel-sizes-k6", "planted group sizes, top-6 of 128 experts, fp32 with full 24-bit inputs",
          1024, 1024, 512, (128, 6, SM, 1, 1, GMAX, 1, 1.0, 0), DL_F32, 202, DL_INPUTS_SIZES, 0),
    KCASE("kernel-m1-bf16", "T = 1: one row per selected expert, d = 4096",
          1, 4096, 2048, (8, 2, SM, 1, 1, GMAX, 1, 1.0, 0), DL_BF16, 203, DL_INPUTS_RANDOM, 0),
    KCASE("kernel-t7-fp16", "T = 7, d = 7168: sigmoid + bias, 4 groups keep 2, top2_sum, scale 2.5",
          7, 7168, 2048, (8, 2, SG, 4, 2, G2, 1, 2.5, 1), DL_F16, 204, DL_INPUTS_RANDOM, 0),
    KCASE("kernel-t33-bf16", "T = 33, DeepSeek-V3 routing over 256 experts: most groups empty or 1-2 rows",
          33, 512, 512, (256, 8, SG, 8, 4, G2, 1, 2.5, 1), DL_BF16, 205, DL_INPUTS_RANDOM, 0),
    KCASE("kernel-t128", "T = 128, f = 14336 (K of the down projection), fp32 with full 24-bit inputs",
          128, 1024, 14336, (8, 2, SM, 1, 1, GMAX, 1, 1.0, 0), DL_F32, 206, DL_INPUTS_RANDOM, 0),
    KCASE("kernel-t4096-bf16", "T = 4096, Zipf(1.2) loads: one expert takes most rows",
          4096, 2048, 1024, (8, 2, SM, 1, 1, GMAX, 0, 1.0, 0), DL_BF16, 207, DL_INPUTS_ZIPF, 1.2),
    KCASE("kernel-oddk-fp16", "d = 1000, f = 2900: K not a multiple of 64 (nor 8) in any GEMM, top-1",
          1024, 1000, 2900, (8, 1, SM, 1, 1, GMAX, 1, 1.0, 0), DL_F16, 208, DL_INPUTS_RANDOM, 0),

    /* The model families at kernel-tier shapes, every feature of the small
     * family on: the model's own hidden size (so K as its kernels see it),
     * fewer experts than the model to keep each file near 1 GB. */
    KFAM("gpt-oss-kernel-bf16", "gpt-oss with every feature on: router-logit bias, softmax over the top-4 logits, SwiGLU clamped at 7 (alpha 1.702, up + 1), biases on both projections, bf16 router weight; d = 2880 (K not a multiple of 128), f = 720, 16 experts",
         256, 2880, 720, (16, 4, DL_SCORE_SOFTMAX_TOPK, 1, 1, GMAX, 0, 1.0, 0, 1), DL_FFN_SWIGLU_CLAMP, 211,
         .act_alpha = 1.702, .act_limit = 7.0, .router_dtype = DL_BF16, .ffn_bias = 1),
    KFAM("qwen2-moe-kernel-bf16", "Qwen1.5-MoE's shapes (d = 2048, f = 1408, one shared expert of width 5632 scaled by sigmoid(x w_sg)), softmax top-4 of 8 without renormalisation",
         256, 2048, 1408, (8, 4, SM, 1, 1, GMAX, 0, 1.0, 0), SWI, 212,
         .shared_experts = 1, .shared_ffn = 5632, .shared_gate = 1),
    KFAM("deepseek-v3-shared-kernel-bf16", "DeepSeek-V3 routing (sigmoid, bias, 8 groups keep 4, top2_sum, top-8, scale 2.5) over 16 experts with one always-on shared expert; d = 2048, f = 1408",
         128, 2048, 1408, (16, 8, SG, 8, 4, G2, 1, 2.5, 1), SWI, 213, .shared_experts = 1, .shared_ffn = 1408),
    KFAM("deepseek-v4-kernel-bf16", "DeepSeek-V4 routing (sqrtsoftplus scores, selection-only bias, top-6 of 16 renormalised, scale 1.5); d = 2048, f = 1024",
         256, 2048, 1024, (16, 6, DL_SCORE_SQRTSOFTPLUS, 1, 1, GMAX, 1, 1.5, 1), SWI, 214, .ffn_bias = 0),
    KFAM("nemotron-kernel-bf16", "Nemotron's non-gated relu(x Wu)^2 Wd experts at d = 2688, f = 1856; sigmoid top-4 of 8 with the selection bias, renormalised, scale 2.5",
         256, 2688, 1856, (8, 4, SG, 1, 1, GMAX, 1, 2.5, 1), DL_FFN_RELU2, 215, .ffn_bias = 0),
    KFAM("llama4-kernel-bf16", "Llama-4's MoE at its d = 5120: sigmoid top-1 of 8 on the expert's input (x sigmoid(l) into the expert, outputs summed unweighted), one shared expert of width f = 1024",
         256, 5120, 1024, (8, 1, SG, 1, 1, GMAX, 0, 1.0, 0, 0, 1), SWI, 216, .shared_experts = 1, .shared_ffn = 1024),
    KFAM("longcat-kernel-bf16", "LongCat-Flash routing (softmax over 16 experts and 8 zero experts, top-6 on the scores plus the selection-only bias, no renormalisation, scale 6; a zero expert's output is its input); d = 2048, f = 1024",
         256, 2048, 1024, (16, 6, SM, 1, 1, GMAX, 0, 6.0, 1, 0, 0, 0, 8), SWI, 217, .ffn_bias = 0),

    /* The layer recipes (doc/lowprecision.md, "The layer recipes"): small,
     * and the kernel tier's planted sizes in the twin of kernel-sizes-bf16. */
    LCASE("deepseek-v3-fp8-small", "DeepSeek-V3 FP8: x 1x128 E4M3, weights 128x128, SwiGLU output requantized 1x128, the backward dgrad GEMMs too; DeepSeek-V3 routing",
          16, 320, 192, (16, 8, SG, 8, 4, G2, 1, 2.5, 1), 301, DL_INPUTS_RANDOM, DSV3_FP8),
    LCASE("gpt-oss-mxfp4-small", "gpt-oss: MXFP4 expert weights (E2M1, 1x32, UE8M0), bf16 activations; softmax top-4 of 8",
          32, 320, 192, (8, 4, SM, 1, 1, GMAX, 1, 1.0, 0), 302, DL_INPUTS_RANDOM, GPT_OSS_MXFP4),
    LCASE("nvfp4-small", "NVFP4 weights and activations (E2M1, 1x16, E4M3 scales x an fp32 global per expert); top-2 of 8",
          32, 320, 192, (8, 2, SM, 1, 1, GMAX, 1, 1.0, 0), 303, DL_INPUTS_RANDOM, NVFP4),
    LCASE_TWIN("kernel-sizes-fp8", "kernel-sizes-bf16 under the DeepSeek-V3 FP8 recipe (its bf16 twin)", DSV3_FP8),
    LCASE_TWIN("kernel-sizes-mxfp4", "kernel-sizes-bf16 with gpt-oss's MXFP4 expert weights", GPT_OSS_MXFP4),
    LCASE_TWIN("kernel-sizes-nvfp4", "kernel-sizes-bf16 under NVFP4 (weights and activations)", NVFP4),
};
#define NCAT ((int)(sizeof catalogue / sizeof catalogue[0]))

static const char *const tier_names[] = {"vectors", "kernel", "layer"};

const char *dl_case_tier_name(dl_case_tier_t t)
{
    return (int)t >= 0 && (int)t < 3 ? tier_names[t] : NULL;
}

int dl_case_tier_parse(const char *s, dl_case_tier_t *t)
{
    for (int i = 0; s && t && i < 3; i++)
        if (strcmp(s, tier_names[i]) == 0) {
            *t = (dl_case_tier_t)i;
            return 0;
        }
    return DL_ENOTFOUND;
}

int dl_case_count(void) { return NCAT; }

const dl_case_t *dl_case_get(int i) { return i >= 0 && i < NCAT ? &catalogue[i] : NULL; }

int dl_case_find(const char *name, dl_case_t *c)
{
    if (!name || !c)
        return DL_EINVAL;
    for (int i = 0; i < NCAT; i++)
        if (strcmp(catalogue[i].name, name) == 0) {
            *c = catalogue[i];
            return 0;
        }
    return DL_ENOTFOUND;
}

static void strip_dtype_suffix(char *name)
{
    size_t n = strlen(name);
    if (n > 5 && (strcmp(name + n - 5, "-bf16") == 0 || strcmp(name + n - 5, "-fp16") == 0 ||
                  strcmp(name + n - 5, "-fp32") == 0))
        name[n - 5] = '\0';
}

int dl_case_set_dtype(dl_case_t *c, dl_dtype_t t)
{
    if (!c || (t != DL_F32 && t != DL_BF16 && t != DL_F16))
        return DL_EINVAL;
    char base[DL_GOLDEN_NAME_MAX + 1];
    snprintf(base, sizeof base, "%s", c->name);
    strip_dtype_suffix(base);
    const char *suf = t == DL_BF16 ? "-bf16" : t == DL_F16 ? "-fp16" : "";
    size_t bl = strlen(base), sl = strlen(suf);
    if (bl + sl > DL_GOLDEN_NAME_MAX)
        return DL_EINVAL;
    memcpy(c->name, base, bl);
    memcpy(c->name + bl, suf, sl + 1);
    c->config.dtype = t;
    return 0;
}

int64_t dl_case_data_bytes(const dl_case_t *c)
{
    int64_t total = 0;
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        if (!dl_golden_dataset_applies(ds, &c->config))
            continue;
        int64_t dims[3];
        int64_t n = dl_golden_dataset_shape(ds, &c->config, dims);
        if (n < 0)
            return -1;
        int64_t sz = ds->elem == DL_GOLDEN_INT64 ? 8 : 4;
        if (n > (INT64_MAX - total) / sz)
            return -1;
        total += n * sz;
    }
    return total;
}

/* --------------------------------------------------- configuration checks */

int dl__golden_config_check(const dl_moe_config_t *c, char *why, size_t whylen)
{
    const dl_route_config_t *r = &c->route;
#define BAD(...) do { dl__golden_msg(why, whylen, __VA_ARGS__); return DL_EINVAL; } while (0)
    if (c->tokens < 0)
        BAD("tokens must be >= 0");
    if (c->hidden < 1 || c->ffn < 1)
        BAD("hidden and ffn must be >= 1");
    if (!DL_FFN_HIDDEN(c->ffn_kind) && c->ffn_kind != DL_FFN_PLAIN)
        BAD("unknown ffn_kind");
    if (c->ffn_kind == DL_FFN_SWIGLU_CLAMP &&
        !(isfinite(c->act_alpha) && c->act_limit >= 0 && isfinite(c->act_limit)))
        BAD("act_alpha must be finite and act_limit finite and >= 0");
    if (c->ffn_kind != DL_FFN_SWIGLU_CLAMP && (c->act_alpha != 0 || c->act_limit != 0))
        BAD("act_alpha and act_limit need ffn_kind swiglu-clamp");
    if (c->router_dtype != DL_F32 && c->router_dtype != DL_BF16 && c->router_dtype != DL_F16)
        BAD("router_dtype must be fp32, bf16 or fp16");
    if (c->ffn_bias && !DL_FFN_GATED(c->ffn_kind))
        BAD("ffn_bias needs a gated ffn_kind (swiglu, swiglu-clamp or geglu-tanh)");
    if (c->ffn_kind == DL_FFN_PLAIN && c->ffn != c->hidden)
        BAD("ffn_kind plain needs ffn = hidden");
    if (c->dtype != DL_F32 && c->dtype != DL_BF16 && c->dtype != DL_F16)
        BAD("dtype must be fp32, bf16 or fp16");
    if (r->experts < 1)
        BAD("experts must be >= 1");
    if (r->experts > INT32_MAX)
        BAD("experts must fit int32");
    if (r->zero_experts < 0 || r->zero_experts > INT32_MAX - r->experts)
        BAD("zero_experts must be in [0, 2^31 - 1 - experts] (0: no zero experts)");
    if (r->zero_experts > 0 && (r->n_group > 1 || r->hash_vocab > 0 || r->weight_on_input))
        BAD("zero_experts (identity experts in the router, LongCat-Flash) need n_group 1, "
            "hash_vocab 0 and weight_on_input 0");
    if (r->top_k < 1 || r->top_k > DL_ROUTE_WIDTH(r))
        BAD("top_k must be in [1, experts + zero_experts]");
    if (!dl__golden_score_name(r->score_fn))
        BAD("unknown score_function");
    if (r->group_score < DL_GROUP_MAX || r->group_score > DL_GROUP_TOPK_SUM)
        BAD("unknown group_score");
    if (r->n_group < 1 || r->experts % r->n_group != 0)
        BAD("n_group must divide experts");
    if (r->topk_group < 1 || r->topk_group > r->n_group)
        BAD("topk_group must be in [1, n_group]");
    if (r->top_k > r->topk_group * (DL_ROUTE_WIDTH(r) / r->n_group))
        BAD("top_k exceeds the experts in topk_group groups");
    if (r->n_group > 1 && r->group_score == DL_GROUP_TOP2_SUM && r->experts / r->n_group < 2)
        BAD("group_score top2_sum needs >= 2 experts per group");
    if (r->n_group > 1 && r->group_score == DL_GROUP_TOPK_SUM && r->top_k % r->topk_group != 0)
        BAD("group_score topk_sum needs topk_group to divide top_k");
    if (!(r->scaling > 0) || !isfinite(r->scaling))
        BAD("scaling must be finite and > 0");
    if (r->weight_on_input && (r->renormalize || r->scaling != 1.0))
        BAD("weight_on_input (the score scales the expert's input) needs renormalize 0 and scaling 1");
    if (r->weight_on_input && r->score_fn == DL_SCORE_SOFTMAX_TOPK)
        BAD("weight_on_input needs a score_function other than softmax_topk");
    if (r->hash_vocab < 0 || r->hash_vocab > INT32_MAX)
        BAD("hash_vocab must be in [0, 2^31 - 1] (0: no hash routing)");
    if (r->hash_vocab > 0 && (r->has_bias || r->n_group > 1))
        BAD("hash routing (hash_vocab > 0) chooses by its table: it needs has_bias 0 and n_group 1");
    int64_t m;
    if (dl_mul_size(c->tokens, r->top_k, &m) || m > INT32_MAX)
        BAD("tokens * top_k must fit int32");
    if (c->shared_experts < 0 || c->shared_ffn < 0 || (c->shared_experts > 0) != (c->shared_ffn > 0))
        BAD("shared_experts and shared_ffn must both be >= 1 (shared experts) or both 0");
    if (c->shared_gate && c->shared_experts == 0)
        BAD("shared_gate needs shared experts (shared_experts >= 1)");
    if (c->shared_gate != 0 && c->shared_gate != 1)
        BAD("shared_gate must be 0 or 1");
    if (dl_mul_size(c->shared_experts, c->shared_ffn, &m))
        BAD("shared_experts * shared_ffn overflows 64 bits");
    if (c->shared_experts > 0 && !DL_FFN_HIDDEN(c->ffn_kind))
        BAD("shared experts have a hidden layer: they need an ffn_kind other than %s",
            dl_ffn_name(c->ffn_kind));
    if (c->lowp && c->ffn_bias)
        BAD("a lowp layer recipe does not quantize the expert biases: lowp needs ffn_bias 0");
    if (c->lowp && c->ffn_kind == DL_FFN_RELU2)
        BAD("the lowp layer recipes are SwiGLU layers: lowp needs ffn_kind swiglu, not relu2");
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        int64_t dims[3];
        if (dl_golden_dataset_shape(dl_golden_dataset(i), c, dims) < 0)
            BAD("a tensor's size overflows 64 bits");
    }
    if (dl_case_data_bytes(&(dl_case_t){.config = *c}) < 0)
        BAD("the file's size overflows 64 bits");
#undef BAD
    return 0;
}

int dl_golden_config_string(const dl_moe_config_t *c, const char *sep, char *buf, size_t n)
{
    if (!c || !buf || n == 0)
        return DL_EINVAL;
    if (!sep)
        sep = " ";
    const char *sf = dl__golden_score_name(c->route.score_fn);
    const char *gs = dl__golden_group_name(c->route.group_score);
    const char *fk = dl__golden_ffn_name(c->ffn_kind);
    const char *dt = dl_dtype_name(c->dtype);
    int w = snprintf(buf, n,
                     "tokens = %" PRId64 "%shidden = %" PRId64 "%sffn = %" PRId64
                     "%sexperts = %" PRId64 "%stop_k = %" PRId64 "%sscore_function = %s"
                     "%sn_group = %" PRId64 "%stopk_group = %" PRId64 "%sgroup_score = %s"
                     "%srenormalize = %d%sscaling = %.17g%shas_bias = %d%sffn_kind = %s"
                     "%sdtype = %s",
                     c->tokens, sep, c->hidden, sep, c->ffn, sep, c->route.experts, sep,
                     c->route.top_k, sep, sf ? sf : "?", sep, c->route.n_group, sep,
                     c->route.topk_group, sep, gs ? gs : "?", sep, c->route.renormalize != 0,
                     sep, c->route.scaling, sep, c->route.has_bias != 0, sep, fk ? fk : "?",
                     sep, dt ? dt : "?");
    if (w >= 0 && (size_t)w < n && c->lowp) /* only a layer recipe's case has the key */
        w += snprintf(buf + w, n - (size_t)w, "%slowp = %s", sep,
                      dl_lowp_layer(c->lowp) ? dl_lowp_layer(c->lowp)->name : "?");
    if (w >= 0 && (size_t)w < n && c->shared_experts > 0) /* only where there are some */
        w += snprintf(buf + w, n - (size_t)w,
                      "%sshared_experts = %" PRId64 "%sshared_ffn = %" PRId64 "%sshared_gate = %d",
                      sep, c->shared_experts, sep, c->shared_ffn, sep, c->shared_gate != 0);
    if (w < 0 || (size_t)w >= n)
        return DL_EOVERFLOW;
    if (c->route.has_router_bias) /* only when set: older texts stay */
        w += snprintf(buf + w, n - (size_t)w, "%srouter_bias = 1", sep);
    if (w >= 0 && (size_t)w < n && c->route.weight_on_input)
        w += snprintf(buf + w, n - (size_t)w, "%sweight_on_input = 1", sep);
    if (w >= 0 && (size_t)w < n && c->route.hash_vocab > 0)
        w += snprintf(buf + w, n - (size_t)w, "%shash_vocab = %" PRId64, sep, c->route.hash_vocab);
    if (w >= 0 && (size_t)w < n && c->route.zero_experts > 0)
        w += snprintf(buf + w, n - (size_t)w, "%szero_experts = %" PRId64, sep,
                      c->route.zero_experts);
    /* the variants' keys only where a case uses them (the default's text is unchanged) */
    if (w >= 0 && (size_t)w < n && c->ffn_kind == DL_FFN_SWIGLU_CLAMP)
        w += snprintf(buf + w, n - (size_t)w, "%sact_alpha = %.17g%sact_limit = %.17g", sep,
                      c->act_alpha, sep, c->act_limit);
    if (w >= 0 && (size_t)w < n && c->ffn_bias)
        w += snprintf(buf + w, n - (size_t)w, "%sffn_bias = 1", sep);
    if (w >= 0 && (size_t)w < n && c->router_dtype != DL_F32)
        w += snprintf(buf + w, n - (size_t)w, "%srouter_dtype = %s", sep,
                      dl_dtype_name(c->router_dtype));
    return w < 0 || (size_t)w >= n ? DL_EOVERFLOW : 0;
}

/* ------------------------------------------------------------ case files */

#define LINE_MAX_LEN 1024

int dl__golden_name_ok(const char *s)
{
    if (!*s || strlen(s) > DL_GOLDEN_NAME_MAX)
        return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '-' && *s != '_' && *s != '.')
            return 0;
    return 1;
}

static int parse_i64(const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    if (!*v || !(isdigit((unsigned char)*v) || *v == '-'))
        return -1;
    errno = 0;
    char *end;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || x < lo || x > hi)
        return -1;
    *out = x;
    return 0;
}

static int parse_u64(const char *v, uint64_t *out)
{
    if (!*v || !isdigit((unsigned char)*v))
        return -1;
    errno = 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || *end)
        return -1;
    *out = x;
    return 0;
}

static int parse_bool(const char *v, int *out)
{
    if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes")) {
        *out = 1;
        return 0;
    }
    if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no")) {
        *out = 0;
        return 0;
    }
    return -1;
}

static int parse_double(const char *v, double *out)
{
    if (!*v)
        return -1;
    errno = 0;
    char *end;
    double x = strtod(v, &end);
    if (errno || *end || !isfinite(x))
        return -1;
    *out = x;
    return 0;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

enum {
    K_NAME, K_BASE, K_TOKENS, K_HIDDEN, K_FFN, K_EXPERTS, K_TOP_K, K_SCORE, K_NGROUP,
    K_TOPKG, K_GSCORE, K_RENORM, K_SCALING, K_BIAS, K_FFNKIND, K_DTYPE, K_SEED, K_INPUTS,
    K_ZIPF, K_LOWP, K_SHARED, K_SHARED_FFN, K_SHARED_GATE, K_RBIAS, K_ACT_ALPHA, K_ACT_LIMIT,
    K_ROUTER_DTYPE, K_FFN_BIAS, K_WIN, K_HASH, K_ZERO, NKEYS
};
static const char *const keys[NKEYS] = {
    "name", "base", "tokens", "hidden", "ffn", "experts", "top_k", "score_function",
    "n_group", "topk_group", "group_score", "renormalize", "scaling", "has_bias",
    "ffn_kind", "dtype", "seed", "inputs", "zipf_s", "lowp", "shared_experts", "shared_ffn",
    "shared_gate", "router_bias", "act_alpha", "act_limit", "router_dtype", "ffn_bias", "weight_on_input", "hash_vocab",
    "zero_experts"};

static void case_defaults(dl_case_t *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "custom");
    c->description = "";
    c->config.route = (dl_route_config_t){.experts = 0, .top_k = 0, .score_fn = DL_SCORE_SOFTMAX,
                                          .n_group = 1, .topk_group = 1,
                                          .group_score = DL_GROUP_MAX, .renormalize = 1,
                                          .scaling = 1.0, .has_bias = 0};
    c->config.ffn_kind = DL_FFN_SWIGLU;
    c->config.dtype = DL_F32;
    c->config.ffn = -1;
    c->seed = 1;
    c->inputs = DL_INPUTS_RANDOM;
    c->zipf_s = 1.0;
}

#define WHY(...) do { dl__golden_msg(why, n, __VA_ARGS__); return DL_EFORMAT; } while (0)

/* An integer key of the configuration. */
static int set_int(dl_case_t *c, int key, const char *k, const char *v, char *why, size_t n)
{
    int64_t i64;
    if (parse_i64(v, key == K_TOKENS ? 0 : 1, INT32_MAX, &i64))
        WHY("%s must be an integer in [%d, 2147483647], got '%.40s'", k, key == K_TOKENS ? 0 : 1, v);
    int64_t *dst[NKEYS] = {[K_TOKENS] = &c->config.tokens, [K_HIDDEN] = &c->config.hidden,
                           [K_FFN] = &c->config.ffn, [K_EXPERTS] = &c->config.route.experts,
                           [K_TOP_K] = &c->config.route.top_k, [K_NGROUP] = &c->config.route.n_group,
                           [K_TOPKG] = &c->config.route.topk_group};
    *dst[key] = i64;
    return 0;
}

/* Sets key to the value v; 0 or DL_EFORMAT with the reason in why. */
static int set_key(dl_case_t *c, int key, const char *k, const char *v, char *why, size_t n)
{
    int b, e;
    dl_dtype_t dt;
    switch (key) {
    case K_NAME:
        if (!dl__golden_name_ok(v))
            WHY("name must be 1-%d of [A-Za-z0-9._-]", DL_GOLDEN_NAME_MAX);
        snprintf(c->name, sizeof c->name, "%s", v);
        return 0;
    case K_BASE:
        if (dl_case_find(v, c))
            WHY("unknown base case '%.60s' (see 'dropless cases')", v);
        c->description = "";
        c->large = 0;
        c->tier = DL_TIER_VECTORS;
        return 0;
    case K_TOKENS: case K_HIDDEN: case K_FFN: case K_EXPERTS: case K_TOP_K: case K_NGROUP:
    case K_TOPKG:
        return set_int(c, key, k, v, why, n);
    case K_SCORE:
        if ((e = dl__golden_score_parse(v)) < 0)
            WHY("score_function must be softmax, sigmoid, sqrtsoftplus or softmax_topk, got '%.40s'", v);
        c->config.route.score_fn = (dl_score_fn_t)e;
        return 0;
    case K_GSCORE:
        if ((e = dl__golden_group_parse(v)) < 0)
            WHY("group_score must be max, top2_sum or topk_sum, got '%.40s'", v);
        c->config.route.group_score = (dl_group_score_t)e;
        return 0;
    case K_FFNKIND:
        if ((e = dl__golden_ffn_parse(v)) < 0)
            WHY("ffn_kind must be swiglu, plain, swiglu-clamp, geglu-tanh or relu2, got '%.40s'", v);
        c->config.ffn_kind = (dl_ffn_t)e;
        /* gpt-oss's parameters unless act_alpha / act_limit follow; none for the others */
        c->config.act_alpha = e == DL_FFN_SWIGLU_CLAMP ? 1.702 : 0.0;
        c->config.act_limit = e == DL_FFN_SWIGLU_CLAMP ? 7.0 : 0.0;
        return 0;
    case K_ACT_ALPHA:
    case K_ACT_LIMIT: {
        double x;
        if (parse_double(v, &x) || !isfinite(x) || (key == K_ACT_LIMIT && x < 0))
            WHY("%s must be a finite number%s, got '%.40s'", k,
                key == K_ACT_LIMIT ? " >= 0" : "", v);
        *(key == K_ACT_ALPHA ? &c->config.act_alpha : &c->config.act_limit) = x;
        return 0;
    }
    case K_ROUTER_DTYPE:
        if (dl_dtype_parse(v, &dt) || dt == DL_F64)
            WHY("router_dtype must be fp32, bf16 or fp16, got '%.40s'", v);
        c->config.router_dtype = dt;
        return 0;
    case K_INPUTS:
        if ((e = dl__golden_inputs_parse(v)) < 0)
            WHY("inputs must be random, zipf, ties, empty-experts, one-hot or sizes, "
                "got '%.40s'", v);
        c->inputs = (dl_inputs_kind_t)e;
        return 0;
    case K_FFN_BIAS:
        if (parse_bool(v, &b))
            WHY("%s must be 0/1/true/false/yes/no, got '%.40s'", k, v);
        c->config.ffn_bias = b;
        return 0;
    case K_RENORM:
    case K_BIAS:
    case K_RBIAS:
    case K_WIN:
        if (parse_bool(v, &b))
            WHY("%s must be 0/1/true/false/yes/no, got '%.40s'", k, v);
        *(key == K_RENORM ? &c->config.route.renormalize
          : key == K_BIAS ? &c->config.route.has_bias
          : key == K_WIN  ? &c->config.route.weight_on_input
                          : &c->config.route.has_router_bias) = b;
        return 0;
    case K_SCALING:
        /* a weight is scaling times a score <= 1, rounded to fp32: beyond
         * FLT_MAX it is infinite, which no stage accepts */
        if (parse_double(v, &c->config.route.scaling) || !(c->config.route.scaling > 0) ||
            c->config.route.scaling > FLT_MAX)
            WHY("scaling must be a number in (0, %.17g] (FLT_MAX: finite in fp32), got '%.40s'",
                (double)FLT_MAX, v);
        return 0;
    case K_SHARED:
    case K_SHARED_FFN:
    case K_HASH:
    case K_ZERO:
        if (parse_i64(v, 0, INT32_MAX, key == K_SHARED       ? &c->config.shared_experts
                                       : key == K_SHARED_FFN ? &c->config.shared_ffn
                                       : key == K_ZERO       ? &c->config.route.zero_experts
                                                             : &c->config.route.hash_vocab))
            WHY("%s must be an integer in [0, 2147483647], got '%.40s'", k, v);
        return 0;
    case K_SHARED_GATE:
        if (parse_bool(v, &c->config.shared_gate))
            WHY("%s must be 0/1/true/false/yes/no, got '%.40s'", k, v);
        return 0;
    case K_ZIPF:
        if (parse_double(v, &c->zipf_s) || c->zipf_s < 0 || c->zipf_s > 16)
            WHY("zipf_s must be a number in [0, 16], got '%.40s'", v);
        return 0;
    case K_LOWP:
        if ((e = dl_lowp_layer_parse(v)) < 0)
            WHY("lowp must be none, deepseek-v3-fp8, gpt-oss-mxfp4 or nvfp4, got '%.40s'", v);
        c->config.lowp = e;
        return 0;
    case K_DTYPE:
        if (dl_dtype_parse(v, &dt) || dt == DL_F64)
            WHY("dtype must be fp32, bf16 or fp16, got '%.40s'", v);
        c->config.dtype = dt;
        return 0;
    default: /* K_SEED */
        if (parse_u64(v, &c->seed))
            WHY("seed must be an unsigned 64-bit integer, got '%.40s'", v);
        return 0;
    }
}

/* One line: blank, a comment or "key = value" (applied to c). */
static int parse_line(dl_case_t *c, char *line, int lineno, int *line_of, char *why, size_t n)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = '\0';
    char *s = trim(line);
    if (!*s)
        return 0;
    char *eq = strchr(s, '=');
    if (!eq)
        WHY("expected 'key = value', got '%.60s'", s);
    *eq = '\0';
    char *k = trim(s), *v = trim(eq + 1);
    int key = -1;
    for (int i = 0; i < NKEYS; i++)
        if (!strcmp(keys[i], k))
            key = i;
    if (key < 0)
        WHY("unknown key '%.60s'", k);
    if (line_of[key])
        WHY("key '%s' given twice (first on line %d)", k, line_of[key]);
    if (!*v)
        WHY("key '%s' has no value", k);
    for (int i = 0; i < NKEYS && key == K_BASE; i++)
        if (line_of[i])
            WHY("'base' must come before every other key");
    line_of[key] = lineno;
    return set_key(c, key, k, v, why, n);
}

/* The whole file's rules, once every line is read; 0 or an error with a
 * message in err. */
static int finish_case(const char *path, dl_case_t *c, const int *line_of, char *err,
                       size_t errlen)
{
    if (!line_of[K_BASE]) {
        static const int req[] = {K_TOKENS, K_HIDDEN, K_EXPERTS, K_TOP_K};
        for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
            if (!line_of[req[i]]) {
                dl__golden_msg(err, errlen, "%s: missing key '%s' (or a 'base' case)", path,
                               keys[req[i]]);
                return DL_EFORMAT;
            }
    }
    for (int i = K_ACT_ALPHA; i <= K_ACT_LIMIT; i++)
        if (line_of[i] && line_of[i] < line_of[K_FFNKIND]) { /* ffn_kind sets their defaults */
            dl__golden_msg(err, errlen, "%s:%d: '%s' must come after 'ffn_kind'", path,
                           line_of[i], keys[i]);
            return DL_EFORMAT;
        }
    if (c->config.ffn < 0)
        c->config.ffn = c->config.hidden;
    char why[160] = "";
    int bad = dl__golden_config_check(&c->config, why, sizeof why) != 0;
    if (!bad && dl_moe_config_validate(&c->config)) {
        bad = 1;
        snprintf(why, sizeof why, "rejected by dl_moe_config_validate");
    }
    if (!bad)
        return 0;
    /* name the line of the last key that shapes the configuration, if any */
    int lineno = 0;
    for (int i = K_TOKENS; i < NKEYS; i++)
        if ((i <= K_DTYPE || i >= K_ACT_ALPHA) && line_of[i] > lineno)
            lineno = line_of[i];
    if (!lineno)
        lineno = line_of[K_BASE];
    if (lineno)
        dl__golden_msg(err, errlen, "%s:%d: invalid configuration: %s", path, lineno, why);
    else
        dl__golden_msg(err, errlen, "%s: invalid configuration: %s", path, why);
    return DL_EINVAL;
}

/* One line of f into buf (at most n - 1 bytes, the newline kept, then a
 * terminating NUL), its length in *len and in *nul whether it holds a NUL
 * byte; 0 at the end of the file. */
static int read_line(FILE *f, char *buf, size_t n, size_t *len, int *nul)
{
    int ch = EOF;
    *len = 0;
    *nul = 0;
    while (*len + 1 < n && (ch = getc(f)) != EOF) {
        *nul |= ch == 0;
        buf[(*len)++] = (char)ch;
        if (ch == '\n')
            break;
    }
    buf[*len] = '\0';
    return *len > 0;
}

int dl_case_parse_file(const char *path, dl_case_t *out, char *err, size_t errlen)
{
    if (!path || !out)
        return DL_EINVAL;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        dl__golden_msg(err, errlen, "%s: is a directory, not a case file", path);
        return DL_EIO;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        dl__golden_msg(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return DL_EIO;
    }
    dl_case_t c;
    case_defaults(&c);
    int line_of[NKEYS] = {0};
    char line[LINE_MAX_LEN + 2], why[256];
    int lineno = 0, rc = 0, nul = 0;
    size_t len;
    while (!rc && read_line(f, line, sizeof line, &len, &nul)) {
        lineno++;
        if (nul) {
            /* a NUL would end the line early and hide what follows it */
            dl__golden_msg(why, sizeof why, "a NUL byte (not a text file)");
            rc = DL_EFORMAT;
        } else if (len > LINE_MAX_LEN && line[len - 1] != '\n') {
            dl__golden_msg(why, sizeof why, "line longer than %d characters", LINE_MAX_LEN);
            rc = DL_EFORMAT;
        } else {
            rc = parse_line(&c, line, lineno, line_of, why, sizeof why);
        }
        if (rc)
            dl__golden_msg(err, errlen, "%s:%d: %s", path, lineno, why);
    }
    if (!rc && ferror(f)) {
        dl__golden_msg(err, errlen, "%s: read error: %s", path, strerror(errno));
        rc = DL_EIO;
    }
    fclose(f);
    if (!rc && !(rc = finish_case(path, &c, line_of, err, errlen)))
        *out = c;
    return rc;
}
