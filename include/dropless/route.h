/* dropless/route.h: router logits, scores, top-k selection and the
 * activation (SwiGLU), forward and backward. Part of the public API;
 * include <dropless.h>. */
#ifndef DROPLESS_ROUTE_H
#define DROPLESS_ROUTE_H
#include "core.h"
#include "gemm.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DL_SCORE_SOFTMAX = 0, /* softmax over all experts (Mixtral) */
    DL_SCORE_SIGMOID = 1, /* per-expert sigmoid (DeepSeek-V3) */
    DL_SCORE_SQRTSOFTPLUS = 2, /* per-expert sqrt(softplus(logit)) (DeepSeek-V4) */
    DL_SCORE_SOFTMAX_TOPK = 3  /* top-k on the logits, then softmax over the k
                                  selected (gpt-oss, "top-k then softmax"):
                                  the scores are the logits themselves and
                                  the weights c exp(l_j) / sum_sel exp(l_i);
                                  renormalize changes nothing (they sum to 1) */
} dl_score_fn_t;

/* Group-limited routing: how a group of experts is scored before the best
 * topk_group groups are kept. Implementations disagree, so it is explicit. */
typedef enum {
    DL_GROUP_MAX = 0,      /* max key in the group */
    DL_GROUP_TOP2_SUM = 1, /* sum of the 2 best keys (DeepSeek-V3 / vLLM) */
    DL_GROUP_TOPK_SUM = 2  /* sum of the best top_k/topk_group keys (Megatron / TE),
                              at least 1 and at most the group size */
} dl_group_score_t;

typedef struct {
    int64_t experts, top_k;
    dl_score_fn_t score_fn;
    int64_t n_group, topk_group; /* 1, 1: no group limit */
    dl_group_score_t group_score;
    int renormalize;             /* weights = scores / sum of selected scores */
    double scaling;              /* routed scaling factor; 1.0 for none */
    int has_bias;                /* selection-only expert bias (DeepSeek-V3) */
    int has_router_bias;         /* a bias on the logits, logits = x W_r + b_r (gpt-oss),
                                    with its gradient d_router_bias */
    int weight_on_input;         /* the score scales the expert's INPUT and the expert
                                    outputs are summed unweighted (Llama-4):
                                    x_sorted[r] = RN(x[t] s[t, e]), topk_weights = 1
                                    (the combine's weights); needs renormalize = 0,
                                    scaling = 1 and an elementwise or softmax score */
    int64_t hash_vocab;          /* > 0: hash routing (DeepSeek-V4's first layers): the
                                    experts of token t are row token_ids[t] of a table
                                    [hash_vocab, k] in the inputs (dl_route_hash); the
                                    weights still from the scores; 0: top-k selection */
    int64_t zero_experts;        /* Z > 0: LongCat-Flash's zero (identity) experts: the
                                    router scores E + Z columns (DL_ROUTE_WIDTH), ids in
                                    [E, E + Z) are experts whose output is their input
                                    (no weights; sorted after the real experts, the
                                    identity tail of the sorted rows); 0: none */
} dl_route_config_t;

/* The router's width, the columns of the logits and scores: the experts
 * and the zero experts, E + Z (E without zero experts). */
#define DL_ROUTE_WIDTH(c) ((c)->experts + (c)->zero_experts)

/* The score function's name in case files and goldens ("softmax",
 * "sigmoid", "sqrtsoftplus", "softmax_topk"; NULL for no function), and
 * the function of a name (-1 for none). Static data. */
DL_EXTERN const char *dl_route_score_name(dl_score_fn_t f);
DL_EXTERN int dl_route_score_parse(const char *name);

/* The router: logits[t, e] = RN_fp32(sum_i x[t, i] W[i, e] + b[e]), exact
 * then rounded once (the bias inside the one rounding: the grouped GEMM of
 * dropless/gemm.h with a second term, a column of ones times b). x [T, d],
 * W [d, E], b [E] or NULL (no bias), logits [T, E], caller-owned; stats may
 * be NULL. Errors: those of dl_gemm_grouped, DL_ENOMEM. */
DL_EXTERN int dl_route_logits(const float *x, int64_t T, int64_t d, const float *W,
                              const float *b, int64_t E, float *logits, dl_tier_stats_t *stats);

/* The router bias's gradient: d_b[e] = RN_fp32(sum_t d_logits[t, e]), exact
 * then rounded once (the ragged-K GEMM 1^T d_logits). d_logits [T, E], d_b
 * [E]; stats may be NULL. Errors: those of dl_gemm_ragged_k, DL_ENOMEM. */
DL_EXTERN int dl_route_bias_backward(const float *d_logits, int64_t T, int64_t E, float *d_b,
                                     dl_tier_stats_t *stats);

/* Checks a routing configuration: E >= 1, 1 <= k <= E, n_group divides E,
 * 1 <= topk_group <= n_group, k <= topk_group * E / n_group, finite
 * positive scaling. Returns 0 or DL_EINVAL. */
DL_EXTERN int dl_route_config_validate(const dl_route_config_t *c);

/* scores[t, e] = RN_fp32(softmax_e(logits[t, :])), RN_fp32(sigmoid(logits[t,e])),
 * RN_fp32(sqrt(log(1 + exp(logits[t, e])))) or, for softmax_topk, logits[t, e],
 * correctly rounded on every platform (certified binary64 evaluation, MPFR
 * for undecided cases; no libm exp). logits and scores are [T, E],
 * caller-owned, and must not overlap. A score whose exact value is
 * positive but below half the smallest subnormal is +0.
 * Errors: DL_EINVAL, DL_EOVERFLOW, DL_ENONFINITE (NaN/Inf logit). */
DL_EXTERN int dl_route_scores(const dl_route_config_t *c, const float *logits, int64_t T,
                              float *scores);

/* Top-k selection and routing weights for each token.
 * Selection key: key[e] = RN_fp32(scores[e] + bias[e]) with bias, scores[e]
 * without. Group limit (n_group > 1 and topk_group < n_group): groups of
 * E/n_group consecutive experts are scored by c->group_score over keys
 * (sums rounded once to fp32), the best topk_group groups are kept (ties:
 * lower group index). Then the k best keys among kept experts, ties to the
 * lower expert index (-0 and +0 tie); ids are listed best first. Weights:
 *   w[t, j] = RN_fp32(scaling * s[id_j] / (renormalize ? sum_j' s[id_j'] : 1))
 * (softmax_topk: RN_fp32(scaling * exp(s[id_j]) / sum_j' exp(s[id_j'])));
 * with weight_on_input 1, the combine's constant weights (the score scales
 * the input instead: dl_route_scale_input); exact then rounded once; an exact zero is +0. margin[t] (may be NULL) is
 * the tie margin: the smallest gap, as RN_fp32 of the exact difference,
 * between the k-th and (k+1)-th selectable keys and between the
 * topk_group-th and next group scores; +inf when nothing competes, +0 for
 * an exact tie. ids, weights are [T, k]; bias is [E] (ignored without
 * has_bias). Errors: DL_EINVAL, DL_EOVERFLOW, DL_ENONFINITE (a NaN/Inf score
 * or bias, a key or group score that overflows fp32, or renormalisation by
 * an exactly zero sum of selected scores). */
DL_EXTERN int dl_route_topk(const dl_route_config_t *c, const float *scores,
                            const float *bias, int64_t T, int32_t *ids, float *weights,
                            float *margin);

/* Hash routing (c->hash_vocab = V > 0): ids[t, :] = table[token_ids[t], :]
 * (the row's order kept), no competition (margin +inf, may be NULL), the
 * weights of that selection as dl_route_weights gives them; the scores get
 * no gradient from the choice. table [V, k] of distinct experts in [0, E),
 * token_ids [T] in [0, V); ids, weights [T, k]; all caller-owned. Errors:
 * DL_EINVAL (no hash routing, a table row listing an expert twice), DL_ERANGE
 * (a token id or table entry out of range), those of dl_route_weights. */
DL_EXTERN int dl_route_hash(const dl_route_config_t *c, const float *scores,
                            const int32_t *table, const int32_t *token_ids, int64_t T,
                            int32_t *ids, float *weights, float *margin);

/* The weights of a given selection, as dl_route_topk computes them for
 * its own: w[j] = RN_fp32(scaling * s[ids[j]] / (renormalize ? sum_j'
 * s[ids[j']] : 1)), exact then rounded once, an exact zero +0. s is one
 * token's row of E scores, ids its k experts (distinct, in [0, E)), w [k].
 * Errors: DL_EINVAL (also an expert listed twice), DL_ERANGE (an id outside
 * [0, E)), DL_ENONFINITE (a NaN/Inf score, or renormalisation by an exactly
 * zero sum). */
DL_EXTERN int dl_route_weights(const dl_route_config_t *c, const float *s, const int32_t *ids,
                               float *w);

/* The number of keys a group score adds up under c->group_score (1 for
 * max, 2 for top2_sum, top_k / topk_group for topk_sum), at least 1 and at
 * most the group size E / n_group; 1 without group-limited routing. The
 * one definition the selection, its tie margin and the runner use. */
DL_EXTERN int64_t dl_route_group_terms(const dl_route_config_t *c);

/* The VJP of the score function alone, for any stored d_scores [T, E] (not
 * only zero off the selection): d_logits[t, e] = RN_fp32(softmax: s_e (ds_e
 * - sum_j s_j ds_j); sigmoid: ds_e s_e (1 - s_e)) at the stored scores s,
 * exact then rounded once; sqrtsoftplus: ds_e (1 - exp(-s_e^2)) / (2 s_e), +0 at
 * s_e = 0 (sigmoid(l) = 1 - exp(-softplus(l)), so the derivative is a function
 * of the stored score); softmax_topk: ds_e (the identity; -0 becomes +0).
 * Errors: DL_EINVAL, DL_EOVERFLOW, DL_ENONFINITE (a NaN/Inf product). */
DL_EXTERN int dl_route_scores_backward(const dl_route_config_t *c, const float *scores,
                                       const float *d_scores, int64_t T, float *d_logits);

/* Backward of dl_route_topk's weights and of dl_route_scores, for stored
 * (rounded) forward values: given d_weights [T, k], writes
 * d_scores[t, e] = RN_fp32(exact d weights/d scores contracted with d_weights)
 * (zero for unselected experts; the bias and the discrete selection get no
 * gradient): with renormalisation c (dw_i S - sum_j dw_j s_j) / S^2, S the
 * sum of selected scores, else c dw_i; softmax_topk: c p_i (dw_i - sum_j p_j
 * dw_j), p the exact softmax of the selected scores; weight_on_input: 0 (its
 * combine weights are constant; dl_route_input_backward gives the scores'
 * gradient). Then d_logits[t, e] = RN_fp32(exact
 * VJP of the score function at the stored scores, applied to the STORED
 * d_scores) as dl_route_scores_backward has it. Exact zeros are +0. Either output may be NULL to skip it.
 * Errors: DL_EINVAL (also: an expert listed twice in a token), DL_ERANGE
 * (an id outside [0, E)), DL_EOVERFLOW, DL_ENONFINITE (NaN/Inf input, or
 * renormalisation by an exactly zero sum). */
DL_EXTERN int dl_route_backward(const dl_route_config_t *c, const float *scores,
                                const int32_t *ids, const float *d_weights, int64_t T,
                                float *d_scores, float *d_logits);

/* Magnitudes for tolerances (binary64 with libm, not rounded values): the
 * slope |d score / d logit| of an elementwise score function at the stored
 * score s (sigmoid |s (1 - s)|, sqrtsoftplus (1 - exp(-s^2)) / (2 |s|), 0 at
 * s = 0; softmax_topk 1, the identity) and a bound on the slope's own
 * derivative in s (sigmoid |1 - 2 s|, sqrtsoftplus 1/2, softmax_topk 0).
 * Both 0 for softmax, which is not elementwise. */
DL_EXTERN double dl_route_score_slope(const dl_route_config_t *c, float s);
DL_EXTERN double dl_route_score_curvature(const dl_route_config_t *c, float s);

/* Llama-4's routing weight on the expert input (c->weight_on_input), the
 * stage functions of route_input.c. The weight of token t's j-th expert is
 * its score, w_in[t, j] = scores[t, ids[t, j]] (no rounding: an exact copy).
 *
 * dl_route_input_weights: w_in [T, k] of scores [T, E] and ids [T, k].
 * dl_route_scale_input: the routed input, x_sorted[p] = RN_t(x[t] w_in[t, j])
 * for sort_perm[p] = t k + j (one product of two floats, rounded once to
 * t), p in [0, T k). x [T, d], x_sorted [T k, d].
 * dl_route_input_backward: the VJP of that product into the scores,
 * d_scores[t, ids[t, j]] = RN_fp32(sum_i d_x_sorted[inv[t, j], i] x[t, i]),
 * exact then rounded once (+0 elsewhere and for an exact zero), then
 * d_logits as dl_route_scores_backward has it at the stored d_scores;
 * either output may be NULL. d_x_sorted [T k, d], inv_perm [T k].
 * All arrays caller-owned. Errors: DL_EINVAL (also without
 * c->weight_on_input, or an expert listed twice), DL_ERANGE (an id or
 * permutation entry out of range), DL_EDTYPE, DL_EOVERFLOW, DL_ENONFINITE
 * (a NaN/Inf product or sum), DL_ENOMEM. */
DL_EXTERN int dl_route_input_weights(const dl_route_config_t *c, const float *scores,
                                     const int32_t *ids, int64_t T, float *w_in);
DL_EXTERN int dl_route_scale_input(const float *x, int64_t T, int64_t d, int64_t k,
                                   const float *w_in, const int32_t *sort_perm, dl_dtype_t t,
                                   float *x_sorted);
DL_EXTERN int dl_route_input_backward(const dl_route_config_t *c, const float *x, int64_t d,
                                      const float *d_x_sorted, const int32_t *inv_perm,
                                      const float *scores, const int32_t *ids, int64_t T,
                                      float *d_scores, float *d_logits);

/* SwiGLU: h[i] = RN_t(silu(g[i]) * u[i]), silu(g) = g / (1 + exp(-g)),
 * correctly rounded to t (fp32, bf16 or fp16; no libm exp). An exact zero
 * (g or u zero) is +0; a nonzero result that rounds to zero keeps its sign.
 * h may alias g or u. Errors: DL_EINVAL, DL_EDTYPE, DL_ENONFINITE. */
DL_EXTERN int dl_swiglu(const float *g, const float *u, int64_t n, dl_dtype_t t, float *h);

/* SwiGLU backward: d_g[i] = RN_t(dh[i] * u[i] * silu'(g[i])),
 * d_u[i] = RN_t(dh[i] * silu(g[i])), silu'(g) = s (1 + g (1 - s)),
 * s = sigmoid(g), each correctly rounded, with the zero conventions of
 * dl_swiglu. Either output may be NULL; outputs may alias inputs.
 * Errors: DL_EINVAL, DL_EDTYPE, DL_ENONFINITE. */
DL_EXTERN int dl_swiglu_backward(const float *g, const float *u, const float *dh,
                                 int64_t n, dl_dtype_t t, float *d_g, float *d_u);

#ifdef __cplusplus
}
#endif
#endif
