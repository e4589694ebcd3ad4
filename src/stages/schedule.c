/* The one schedule of the layer: every stage of the forward and backward
 * pass as a producer row (what it reads, what it writes, over which part
 * of the layer it can run), and the scheduler that walks them for a
 * placement. The placements are dl_moe_forward/dl_moe_backward (moe.c:
 * the whole layer), the streaming generator (golden/stream.c: one expert
 * at a time, or an expert slice) and `mpirun dropless gen` (cli/gen_mpi.c:
 * one rank's tokens and experts). Each producer is a call of the stage
 * functions on the window it is given; nothing here computes a value. */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "stages/stages_priv.h"
#include "stages/quant_priv.h"

#define R(n) DL_ROWSET_BIT(DL__ROW_##n)

/* ---------------------------------------------------------- producers */

static int grouped1(const dl_stage_view_t *v, const float *lhs, int64_t K, const float *rhs,
                    dl_rhs_layout_t lay, int64_t N, float *out)
{
    dl_gemm_term_t t = {lhs, K, rhs, lay};
    return dl_gemm_grouped(&t, 1, N, v->off, v->ne, v->c.dtype, out, v->stats);
}

/* An expert GEMM of kind q (quant_priv.h): on quantized operands when
 * the case's layer recipe quantizes it, else grouped1. */
static int expert_gemm(const dl_stage_view_t *v, int q, const float *lhs, int64_t K,
                       const float *rhs, dl_rhs_layout_t lay, int64_t N, float *out)
{
    const dl__lowp_pair_t p = {lhs, rhs, lay};
    return dl__lowp_applies(&v->c, q) ? dl__lowp_gemm(v, q, &p, 1, K, N, out)
                                      : grouped1(v, lhs, K, rhs, lay, N, out);
}

/* The FFN has a hidden layer (h_up, h_act): the gated kinds and relu2. */
static int swiglu(const dl_stage_view_t *v)
{
    return DL_FFN_HIDDEN(v->c.ffn_kind);
}

static int p_router_logits(const dl_stage_view_t *v)
{
    return dl_route_logits(v->in.x, v->c.tokens, v->c.hidden, v->in.router_weight,
                           v->c.route.has_router_bias ? v->in.router_bias : NULL,
                           DL_ROUTE_WIDTH(&v->c.route), v->f.router_logits, v->stats);
}

static int p_router_scores(const dl_stage_view_t *v)
{
    return dl_route_scores(&v->c.route, v->f.router_logits, v->c.tokens, v->f.router_scores);
}

static int p_topk_ids(const dl_stage_view_t *v)
{
    if (v->c.route.hash_vocab > 0) /* DeepSeek-V4's hash layers: the table chooses */
        return dl_route_hash(&v->c.route, v->f.router_scores, v->in.hash_table, v->in.token_ids,
                             v->c.tokens, v->f.topk_ids, v->f.topk_weights, v->f.tie_margin);
    return dl_route_topk(&v->c.route, v->f.router_scores, v->in.expert_bias, v->c.tokens,
                         v->f.topk_ids, v->f.topk_weights, v->f.tie_margin);
}

static int p_sort_perm(const dl_stage_view_t *v)
{
    return dl__sort_assignments_z(v->f.topk_ids, v->c.tokens, v->c.route.top_k,
                                  v->c.route.experts, v->c.route.zero_experts, v->f.sort_perm,
                                  v->f.inv_perm, v->f.group_sizes, v->f.group_offsets);
}

/* Llama-4's weights on the expert input, [T, k] (route.weight_on_input),
 * malloc'd: the scores of the selection. NULL with *rc set on an error. */
static float *input_weights(const dl_stage_view_t *v, int *rc)
{
    float *w = malloc((size_t)(v->c.tokens * v->c.route.top_k + 1) * sizeof *w);
    *rc = w ? dl_route_input_weights(&v->c.route, v->f.router_scores, v->f.topk_ids,
                                     v->c.tokens, w)
            : DL_ENOMEM;
    if (*rc) {
        free(w);
        return NULL;
    }
    return w;
}

static int p_x_sorted_scaled(const dl_stage_view_t *v)
{
    int rc;
    float *w = input_weights(v, &rc);
    if (!w)
        return rc;
    const int64_t T = v->c.tokens, k = v->c.route.top_k;
    rc = v->row0 == 0 && v->rows == T * k /* checks sort_perm */
             ? dl_route_scale_input(v->in.x, T, v->c.hidden, k, w, v->f.sort_perm, v->c.dtype,
                                    v->f.x_sorted)
             : dl__scale_input_rows(v->in.x, v->c.hidden, k, w, v->f.sort_perm, v->row0,
                                    v->row0 + v->rows, v->c.dtype, v->f.x_sorted);
    free(w);
    return rc;
}

static int p_x_sorted(const dl_stage_view_t *v)
{
    if (v->c.route.weight_on_input)
        return p_x_sorted_scaled(v);
    if (v->row0 == 0 && v->rows == v->c.tokens * v->c.route.top_k) /* checks sort_perm */
        return dl_permute(v->in.x, v->c.tokens, v->c.hidden, v->c.route.top_k, v->f.sort_perm,
                          v->f.x_sorted);
    return dl__permute_rows(v->in.x, v->c.hidden, v->c.route.top_k, v->f.sort_perm, v->row0,
                            v->row0 + v->rows, v->f.x_sorted);
}

/* An expert projection of kind q: with ffn_bias, its bias as a second term
 * of the one exact sum (experts.c); else expert_gemm. */
static int projection(const dl_stage_view_t *v, int q, const float *lhs, int64_t K,
                      const float *w, const float *bias, int64_t N, float *out)
{
    if (!v->c.ffn_bias)
        return expert_gemm(v, q, lhs, K, w, DL_RHS_KN, N, out);
    return dl__expert_projection(&v->c, lhs, K, w, bias, N, v->rows, v->off, v->ne, out, v->stats);
}

/* The zero experts' rows of the window (dl__identity_tail): src's rows,
 * or +0 with src NULL. */
static int tail(const dl_stage_view_t *v, const float *src, int64_t n, float *dst)
{
    return dl__identity_tail(&v->c, v->rows, v->off, v->ne, src, n, dst);
}

static int p_h_gate(const dl_stage_view_t *v)
{
    int rc = projection(v, DL__LOWP_FWD_X, v->f.x_sorted, v->c.hidden, v->in.w_gate,
                        v->in.b_gate, v->c.ffn, v->f.h_gate);
    return rc ? rc : tail(v, NULL, v->c.ffn, v->f.h_gate);
}

static int p_h_up(const dl_stage_view_t *v)
{
    int rc = projection(v, DL__LOWP_FWD_X, v->f.x_sorted, v->c.hidden, v->in.w_up, v->in.b_up,
                        v->c.ffn, v->f.h_up);
    return rc ? rc : tail(v, NULL, v->c.ffn, v->f.h_up);
}

static int p_h_act(const dl_stage_view_t *v)
{
    return dl_ffn_act(&v->c, v->f.h_gate, v->f.h_up, v->rows * v->c.ffn, v->f.h_act);
}

/* The down projection's input: h_act, or x_sorted in a plain FFN. */
static const float *down_in(const dl_stage_view_t *v, int64_t *K)
{
    *K = swiglu(v) ? v->c.ffn : v->c.hidden;
    return swiglu(v) ? v->f.h_act : v->f.x_sorted;
}

static int p_y_sorted(const dl_stage_view_t *v)
{
    int64_t K;
    const float *a = down_in(v, &K);
    int rc = projection(v, swiglu(v) ? DL__LOWP_FWD_H : DL__LOWP_FWD_X, a, K, v->in.w_down,
                        v->in.b_down, v->c.hidden, v->f.y_sorted);
    /* a zero expert's output is its input (LongCat-Flash) */
    return rc ? rc : tail(v, v->f.x_sorted, v->c.hidden, v->f.y_sorted);
}

#if DL_EXTRA_VALUE
static int p_y_half(const dl_stage_view_t *v)
{
    return dl_extra_half(v->f.y_sorted, v->rows * v->c.hidden, v->c.dtype, v->f.y_half);
}
#endif

/* ------------------------------------------- shared experts (shared.h) */

/* A GEMM of the shared path: all the window's tokens as one group. */
static int dense1(const dl_stage_view_t *v, const float *lhs, int64_t K, const float *rhs,
                  dl_rhs_layout_t lay, int64_t N, dl_dtype_t t, float *out)
{
    const int64_t all[2] = {0, v->c.tokens};
    dl_gemm_term_t term = {lhs, K, rhs, lay};
    return dl_gemm_grouped(&term, 1, N, all, 1, t, out, v->stats);
}

static int64_t shared_width(const dl_stage_view_t *v)
{
    return dl_value_dim(&v->c, 'S');
}

static int p_shared_h_gate(const dl_stage_view_t *v)
{
    return dense1(v, v->in.x, v->c.hidden, v->in.shared_w_gate, DL_RHS_KN, shared_width(v),
                  v->c.dtype, v->f.shared_h_gate);
}

static int p_shared_h_up(const dl_stage_view_t *v)
{
    return dense1(v, v->in.x, v->c.hidden, v->in.shared_w_up, DL_RHS_KN, shared_width(v),
                  v->c.dtype, v->f.shared_h_up);
}

static int p_shared_h_act(const dl_stage_view_t *v)
{
    /* the case's activation, as the routed experts' (relu2: no gate) */
    return dl_ffn_act(&v->c, v->f.shared_h_gate, v->f.shared_h_up, v->c.tokens * shared_width(v),
                      v->f.shared_h_act);
}

static int p_shared_y(const dl_stage_view_t *v)
{
    return dense1(v, v->f.shared_h_act, shared_width(v), v->in.shared_w_down, DL_RHS_KN,
                  v->c.hidden, v->c.dtype, v->f.shared_y);
}

static int p_shared_gate_logit(const dl_stage_view_t *v)
{
    return dense1(v, v->in.x, v->c.hidden, v->in.shared_gate_weight, DL_RHS_KN, 1, DL_F32,
                  v->f.shared_gate_logit);
}

static int p_shared_gate(const dl_stage_view_t *v)
{
    return dl_shared_gate(v->f.shared_gate_logit, v->c.tokens, v->f.shared_gate);
}

/* The shared gate when the layer has one (else NULL: unscaled). */
static const float *gate_of(const dl_stage_view_t *v)
{
    return dl_cond_applies(DL_COND_SHARED_GATE, &v->c) ? v->f.shared_gate : NULL;
}

static int p_out(const dl_stage_view_t *v)
{
    const float *sy = v->c.shared_experts > 0 ? v->f.shared_y : NULL;
    return dl_combine_shared(v->f.y_sorted, v->f.topk_weights, v->f.inv_perm, sy, gate_of(v),
                             v->c.tokens, v->c.route.top_k, v->c.hidden, v->c.dtype, v->f.out);
}

static int p_d_topk_weights(const dl_stage_view_t *v)
{
    return dl_combine_backward(v->in.d_out, v->f.y_sorted, NULL, v->f.inv_perm, v->c.tokens,
                               v->c.route.top_k, v->c.hidden, v->c.dtype, v->b.d_topk_weights,
                               NULL);
}

static int p_d_y_sorted(const dl_stage_view_t *v)
{
    const int64_t T = v->c.tokens, k = v->c.route.top_k;
    if (v->row0 == 0 && v->rows == T * k) /* checks the arguments and inv_perm */
        return dl_combine_backward(v->in.d_out, NULL, v->f.topk_weights, v->f.inv_perm, T, k,
                                   v->c.hidden, v->c.dtype, NULL, v->b.d_y_sorted);
    return dl__combine_backward(NULL, v->f.topk_weights, v->f.inv_perm, v->in.d_out, T, k,
                                v->c.hidden, v->c.dtype, v->row0, v->row0 + v->rows, NULL,
                                v->b.d_y_sorted);
}

static int p_d_h_act(const dl_stage_view_t *v)
{
    int rc = expert_gemm(v, DL__LOWP_DGRAD, v->b.d_y_sorted, v->c.hidden, v->in.w_down,
                         DL_RHS_NK, v->c.ffn, v->b.d_h_act);
    return rc ? rc : tail(v, NULL, v->c.ffn, v->b.d_h_act);
}

static int ragged(const dl_stage_view_t *v, const float *a, int64_t I, const float *b, int64_t J,
                  float *out)
{
    return dl_gemm_ragged_k(a, I, b, J, v->off, v->ne, DL_F32, out, v->stats);
}

static int p_d_w_down(const dl_stage_view_t *v)
{
    int64_t K;
    const float *a = down_in(v, &K);
    return ragged(v, a, K, v->b.d_y_sorted, v->c.hidden, v->b.d_w_down);
}

static int p_d_h_gate(const dl_stage_view_t *v)
{
    return dl_ffn_act_backward(&v->c, v->f.h_gate, v->f.h_up, v->b.d_h_act, v->rows * v->c.ffn,
                               v->b.d_h_gate, v->b.d_h_up);
}

static int d_x_sorted_experts(const dl_stage_view_t *v)
{
    const int64_t d = v->c.hidden, ff = v->c.ffn;
    if (!swiglu(v))
        return expert_gemm(v, DL__LOWP_DGRAD, v->b.d_y_sorted, d, v->in.w_down, DL_RHS_NK, d,
                           v->b.d_x_sorted);
    if (v->c.ffn_kind == DL_FFN_RELU2) /* non-gated: the up projection's term alone */
        return grouped1(v, v->b.d_h_up, ff, v->in.w_up, DL_RHS_NK, d, v->b.d_x_sorted);
    const dl__lowp_pair_t p[2] = {{v->b.d_h_gate, v->in.w_gate, DL_RHS_NK},
                                  {v->b.d_h_up, v->in.w_up, DL_RHS_NK}};
    if (dl__lowp_applies(&v->c, DL__LOWP_DGRAD))
        return dl__lowp_gemm(v, DL__LOWP_DGRAD, p, 2, ff, d, v->b.d_x_sorted);
    dl_gemm_term_t t[2] = {{v->b.d_h_gate, ff, v->in.w_gate, DL_RHS_NK},
                           {v->b.d_h_up, ff, v->in.w_up, DL_RHS_NK}};
    return dl_gemm_grouped(t, 2, d, v->off, v->ne, v->c.dtype, v->b.d_x_sorted, v->stats);
}

static int p_d_x_sorted(const dl_stage_view_t *v)
{
    int rc = d_x_sorted_experts(v);
    /* the identity's VJP: a zero expert's d_x_sorted row is its d_y_sorted row */
    return rc ? rc : tail(v, v->b.d_y_sorted, v->c.hidden, v->b.d_x_sorted);
}

static int p_d_w_gate(const dl_stage_view_t *v)
{
    return ragged(v, v->f.x_sorted, v->c.hidden, v->b.d_h_gate, v->c.ffn, v->b.d_w_gate);
}

static int p_d_w_up(const dl_stage_view_t *v)
{
    return ragged(v, v->f.x_sorted, v->c.hidden, v->b.d_h_up, v->c.ffn, v->b.d_w_up);
}

static int p_d_router_scores(const dl_stage_view_t *v)
{
    if (v->c.route.weight_on_input) /* the scores scale the input: their gradient comes back from it */
        return dl_route_input_backward(&v->c.route, v->in.x, v->c.hidden, v->b.d_x_sorted,
                                       v->f.inv_perm, v->f.router_scores, v->f.topk_ids,
                                       v->c.tokens, v->b.d_router_scores, v->b.d_router_logits);
    return dl_route_backward(&v->c.route, v->f.router_scores, v->f.topk_ids, v->b.d_topk_weights,
                             v->c.tokens, v->b.d_router_scores, v->b.d_router_logits);
}

static int p_d_router_weight(const dl_stage_view_t *v)
{
    const int64_t all[2] = {0, v->c.tokens};
    return dl_gemm_ragged_k(v->in.x, v->c.hidden, v->b.d_router_logits, DL_ROUTE_WIDTH(&v->c.route), all,
                            1, DL_F32, v->b.d_router_weight, v->stats);
}

static int p_d_shared_gate(const dl_stage_view_t *v)
{
    return dl_shared_combine_backward(v->in.d_out, v->f.shared_y, v->f.shared_gate, v->c.tokens,
                                      v->c.hidden, v->c.dtype, v->b.d_shared_gate, NULL);
}

static int p_d_shared_gate_logit(const dl_stage_view_t *v)
{
    return dl_shared_gate_backward(v->b.d_shared_gate, v->f.shared_gate, v->c.tokens,
                                   v->b.d_shared_gate_logit);
}

/* x^T g over all the window's tokens, [d, N] fp32 (the shared weights' gradients). */
static int dense_dw(const dl_stage_view_t *v, const float *a, int64_t I, const float *g,
                    int64_t N, float *out)
{
    const int64_t all[2] = {0, v->c.tokens};
    return dl_gemm_ragged_k(a, I, g, N, all, 1, DL_F32, out, v->stats);
}

static int p_d_shared_gate_weight(const dl_stage_view_t *v)
{
    return dense_dw(v, v->in.x, v->c.hidden, v->b.d_shared_gate_logit, 1,
                    v->b.d_shared_gate_weight);
}

static int p_d_shared_y(const dl_stage_view_t *v)
{
    return dl_shared_combine_backward(v->in.d_out, NULL, gate_of(v), v->c.tokens, v->c.hidden,
                                      v->c.dtype, NULL, v->b.d_shared_y);
}

static int p_d_shared_h_act(const dl_stage_view_t *v)
{
    return dense1(v, v->b.d_shared_y, v->c.hidden, v->in.shared_w_down, DL_RHS_NK,
                  shared_width(v), v->c.dtype, v->b.d_shared_h_act);
}

static int p_d_shared_w_down(const dl_stage_view_t *v)
{
    return dense_dw(v, v->f.shared_h_act, shared_width(v), v->b.d_shared_y, v->c.hidden,
                    v->b.d_shared_w_down);
}

static int p_d_shared_h_gate(const dl_stage_view_t *v)
{
    return dl_ffn_act_backward(&v->c, v->f.shared_h_gate, v->f.shared_h_up, v->b.d_shared_h_act,
                               v->c.tokens * shared_width(v), v->b.d_shared_h_gate,
                               v->b.d_shared_h_up);
}

static int p_d_shared_w_gate(const dl_stage_view_t *v)
{
    return dense_dw(v, v->in.x, v->c.hidden, v->b.d_shared_h_gate, shared_width(v),
                    v->b.d_shared_w_gate);
}

static int p_d_shared_w_up(const dl_stage_view_t *v)
{
    return dense_dw(v, v->in.x, v->c.hidden, v->b.d_shared_h_up, shared_width(v),
                    v->b.d_shared_w_up);
}

static int p_d_router_bias(const dl_stage_view_t *v)
{
    return dl_route_bias_backward(v->b.d_router_logits, v->c.tokens, DL_ROUTE_WIDTH(&v->c.route),
                                  v->b.d_router_bias, v->stats);
}

/* A bias gradient: the column sums of each expert's rows of g, exact and
 * rounded once to fp32 (ones^T g, a ragged-K GEMM with I = 1). */
static int bias_grad(const dl_stage_view_t *v, const float *g, int64_t N, float *out)
{
    float *ones = dl__ones(v->rows);
    if (!ones)
        return DL_ENOMEM;
    int rc = ragged(v, ones, 1, g, N, out);
    free(ones);
    return rc;
}

static int p_d_b_down(const dl_stage_view_t *v)
{
    return bias_grad(v, v->b.d_y_sorted, v->c.hidden, v->b.d_b_down);
}

static int p_d_b_gate(const dl_stage_view_t *v)
{
    return bias_grad(v, v->b.d_h_gate, v->c.ffn, v->b.d_b_gate);
}

static int p_d_b_up(const dl_stage_view_t *v)
{
    return bias_grad(v, v->b.d_h_up, v->c.ffn, v->b.d_b_up);
}

static int p_d_x(const dl_stage_view_t *v)
{
    const int gated = dl_cond_applies(DL_COND_SHARED_GATE, &v->c); /* reads no shared_gate */
    const dl_shared_grad_t sh = {shared_width(v), v->b.d_shared_h_gate, v->b.d_shared_h_up,
                                 v->in.shared_w_gate, v->in.shared_w_up,
                                 gated ? v->b.d_shared_gate_logit : NULL,
                                 gated ? v->in.shared_gate_weight : NULL};
    int rc = 0;
    float *w = v->c.route.weight_on_input ? input_weights(v, &rc) : NULL;
    if (rc)
        return rc;
    rc = dl__input_backward_w(v->b.d_x_sorted, w, v->f.inv_perm, v->b.d_router_logits,
                              v->in.router_weight, v->c.shared_experts > 0 ? &sh : NULL,
                              v->c.tokens, v->c.route.top_k, v->c.hidden,
                              DL_ROUTE_WIDTH(&v->c.route), v->c.dtype, v->b.d_x);
    free(w);
    return rc;
}

/* ----------------------------------------------------------- the table */

#if DL_EXTRA_VALUE
/* the synthetic value of `configure --enable-extra-value` (doc/architecture.md) */
#define DL__EXTRA_PRODUCER(P) P(y_half, EXPERTS, FW, ALWAYS, R(Y_SORTED), 0, R(Y_HALF))
#else
#define DL__EXTRA_PRODUCER(P)
#endif

/* P(name, span, pass, cond, reads, reads_plain (0: the same), writes), in
 * dependency order (the order of DL_VALUE_MAP's values they write). */
#define DL_SCHEDULE_MAP(P)                                                                      \
    P(router_logits, TOKENS, FW, ALWAYS, R(IN_X) | R(IN_ROUTER_WEIGHT) | R(IN_ROUTER_BIAS), 0,     \
      R(ROUTER_LOGITS))                                                                         \
    P(router_scores, TOKENS, FW, ALWAYS, R(ROUTER_LOGITS), 0, R(ROUTER_SCORES))                 \
    P(topk_ids, TOKENS, FW, ALWAYS, R(ROUTER_SCORES) | R(IN_EXPERT_BIAS) | R(IN_TOKEN_IDS) |        \
      R(IN_HASH_TABLE), 0,                                                                      \
      R(TOPK_IDS) | R(TOPK_WEIGHTS) | R(TIE_MARGIN))                                            \
    P(sort_perm, ALL, FW, ALWAYS, R(TOPK_IDS), 0,                                               \
      R(SORT_PERM) | R(INV_PERM) | R(GROUP_SIZES) | R(GROUP_OFFSETS))                           \
    P(x_sorted, DISPATCH, FW, ALWAYS, R(IN_X) | R(SORT_PERM) | R(ROUTER_SCORES) | R(TOPK_IDS), 0, \
      R(X_SORTED))                                                                              \
    P(h_gate, EXPERTS, FW, GATE, R(X_SORTED) | R(IN_W_GATE) | R(IN_B_GATE), 0, R(H_GATE))        \
    P(h_up, EXPERTS, FW, SWIGLU, R(X_SORTED) | R(IN_W_UP) | R(IN_B_UP), 0, R(H_UP))                \
    P(h_act, EXPERTS, FW, SWIGLU, R(H_GATE) | R(H_UP), 0, R(H_ACT))                             \
    P(y_sorted, EXPERTS, FW, ALWAYS, R(H_ACT) | R(IN_W_DOWN) | R(IN_B_DOWN) | R(X_SORTED), R(X_SORTED) | R(IN_W_DOWN), \
      R(Y_SORTED))                                                                              \
    DL__EXTRA_PRODUCER(P)                                                                       \
    P(shared_h_gate, TOKENS, FW, SHARED_GATED, R(IN_X) | R(IN_SHARED_W_GATE), 0, R(SHARED_H_GATE))   \
    P(shared_h_up, TOKENS, FW, SHARED, R(IN_X) | R(IN_SHARED_W_UP), 0, R(SHARED_H_UP))         \
    P(shared_h_act, TOKENS, FW, SHARED, R(SHARED_H_GATE) | R(SHARED_H_UP), 0, R(SHARED_H_ACT)) \
    P(shared_y, TOKENS, FW, SHARED, R(SHARED_H_ACT) | R(IN_SHARED_W_DOWN), 0, R(SHARED_Y))     \
    P(shared_gate_logit, TOKENS, FW, SHARED_GATE, R(IN_X) | R(IN_SHARED_GATE_WEIGHT), 0,        \
      R(SHARED_GATE_LOGIT))                                                                     \
    P(shared_gate, TOKENS, FW, SHARED_GATE, R(SHARED_GATE_LOGIT), 0, R(SHARED_GATE))            \
    P(out, TOKENS, FW, ALWAYS,                                                                  \
      R(Y_SORTED) | R(TOPK_WEIGHTS) | R(INV_PERM) | R(SHARED_Y) | R(SHARED_GATE), 0, R(OUT))    \
    P(d_topk_weights, TOKENS, BW, ALWAYS, R(IN_D_OUT) | R(Y_SORTED) | R(INV_PERM), 0,              \
      R(D_TOPK_WEIGHTS))                                                                        \
    P(d_y_sorted, TOKENS, BW, ALWAYS, R(IN_D_OUT) | R(TOPK_WEIGHTS) | R(INV_PERM), 0,              \
      R(D_Y_SORTED))                                                                            \
    P(d_h_act, EXPERTS, BW, SWIGLU, R(D_Y_SORTED) | R(IN_W_DOWN), 0, R(D_H_ACT))                   \
    P(d_w_down, EXPERTS, BW, ALWAYS, R(H_ACT) | R(D_Y_SORTED), R(X_SORTED) | R(D_Y_SORTED),     \
      R(D_W_DOWN))                                                                              \
    P(d_h_gate, EXPERTS, BW, SWIGLU, R(H_GATE) | R(H_UP) | R(D_H_ACT), 0,                       \
      R(D_H_GATE) | R(D_H_UP))                                                                  \
    P(d_x_sorted, EXPERTS, BW, ALWAYS, R(D_H_GATE) | R(D_H_UP) | R(IN_W_GATE) | R(IN_W_UP) | R(D_Y_SORTED), \
      R(D_Y_SORTED) | R(IN_W_DOWN), R(D_X_SORTED))                                                 \
    P(d_w_gate, EXPERTS, BW, GATE, R(X_SORTED) | R(D_H_GATE), 0, R(D_W_GATE))                 \
    P(d_w_up, EXPERTS, BW, SWIGLU, R(X_SORTED) | R(D_H_UP), 0, R(D_W_UP))                       \
    P(d_b_down, EXPERTS, BW, FFN_BIAS, R(D_Y_SORTED), 0, R(D_B_DOWN))                           \
    P(d_b_gate, EXPERTS, BW, FFN_BIAS, R(D_H_GATE), 0, R(D_B_GATE))                             \
    P(d_b_up, EXPERTS, BW, FFN_BIAS, R(D_H_UP), 0, R(D_B_UP))                                   \
    P(d_router_scores, TOKENS, BW, ALWAYS, R(ROUTER_SCORES) | R(TOPK_IDS) | R(D_TOPK_WEIGHTS) | \
      R(IN_X) | R(D_X_SORTED) | R(INV_PERM), 0, R(D_ROUTER_SCORES) | R(D_ROUTER_LOGITS))         \
    P(d_router_weight, ALL, BW, ALWAYS, R(IN_X) | R(D_ROUTER_LOGITS), 0, R(D_ROUTER_WEIGHT))      \
    P(d_router_bias, ALL, BW, ROUTER_BIAS, R(D_ROUTER_LOGITS), 0, R(D_ROUTER_BIAS))             \
    P(d_shared_gate, TOKENS, BW, SHARED_GATE, R(IN_D_OUT) | R(SHARED_Y) | R(SHARED_GATE), 0,     \
      R(D_SHARED_GATE))                                                                         \
    P(d_shared_gate_logit, TOKENS, BW, SHARED_GATE, R(D_SHARED_GATE) | R(SHARED_GATE), 0,       \
      R(D_SHARED_GATE_LOGIT))                                                                   \
    P(d_shared_gate_weight, ALL, BW, SHARED_GATE, R(IN_X) | R(D_SHARED_GATE_LOGIT), 0,          \
      R(D_SHARED_GATE_WEIGHT))                                                                  \
    P(d_shared_y, TOKENS, BW, SHARED, R(IN_D_OUT) | R(SHARED_GATE), 0, R(D_SHARED_Y))           \
    P(d_shared_h_act, TOKENS, BW, SHARED, R(D_SHARED_Y) | R(IN_SHARED_W_DOWN), 0,               \
      R(D_SHARED_H_ACT))                                                                        \
    P(d_shared_w_down, ALL, BW, SHARED, R(SHARED_H_ACT) | R(D_SHARED_Y), 0, R(D_SHARED_W_DOWN)) \
    P(d_shared_h_gate, TOKENS, BW, SHARED, R(SHARED_H_GATE) | R(SHARED_H_UP) | R(D_SHARED_H_ACT), \
      0, R(D_SHARED_H_GATE) | R(D_SHARED_H_UP))                                                 \
    P(d_shared_w_gate, ALL, BW, SHARED_GATED, R(IN_X) | R(D_SHARED_H_GATE), 0, R(D_SHARED_W_GATE)) \
    P(d_shared_w_up, ALL, BW, SHARED, R(IN_X) | R(D_SHARED_H_UP), 0, R(D_SHARED_W_UP))          \
    P(d_x, TOKENS, BW, ALWAYS,                                                                  \
      R(D_X_SORTED) | R(INV_PERM) | R(D_ROUTER_LOGITS) | R(IN_ROUTER_WEIGHT) |                  \
      R(ROUTER_SCORES) | R(TOPK_IDS) |                                                          \
      R(D_SHARED_H_GATE) | R(D_SHARED_H_UP) | R(IN_SHARED_W_GATE) | R(IN_SHARED_W_UP) |         \
      R(D_SHARED_GATE_LOGIT) | R(IN_SHARED_GATE_WEIGHT), 0, R(D_X))

#define PASS_FW 0
#define PASS_BW 1
#define ROW(n, span, pass, cond, reads, plain, writes) \
    {#n, DL_SPAN_##span, PASS_##pass, DL_COND_##cond, reads, (plain) ? (plain) : (reads), writes},
static const dl_producer_t table[] = {DL_SCHEDULE_MAP(ROW)};
#define FN(n, span, pass, cond, reads, plain, writes) p_##n,
static int (*const run[])(const dl_stage_view_t *) = {DL_SCHEDULE_MAP(FN)};
#define NPROD ((int)(sizeof table / sizeof table[0]))

int dl_schedule_count(void)
{
    return NPROD;
}

const dl_producer_t *dl_schedule_producer(int i)
{
    return i >= 0 && i < NPROD ? &table[i] : NULL;
}

int dl_schedule_writer(int row)
{
    for (int i = 0; row >= 0 && row < DL__ROW_COUNT && i < NPROD; i++)
        if (DL_ROWSET_HAS(table[i].writes, row))
            return i;
    return -1;
}

dl_rowset_t dl_schedule_reads(const dl_producer_t *p, const dl_moe_config_t *c)
{
    /* an EXPERTS producer's window is groups of rows: it reads their offsets */
    const dl_rowset_t groups = p->span == DL_SPAN_EXPERTS ? R(GROUP_OFFSETS) : 0;
    return (DL_FFN_HIDDEN(c->ffn_kind) ? p->reads : p->reads_plain) | groups;
}

dl_rowset_t dl_schedule_needs_experts(const dl_moe_config_t *c)
{
    dl_rowset_t rows = 0, m = 0;
    for (int r = 0; r < dl_layout_count(); r++)
        if (dl_layout_row(r)->dims[0] == 'M' && dl_layout_row(r)->dims[1])
            rows |= DL_ROWSET_BIT(r);
    for (int i = 0; i < NPROD; i++)
        if ((table[i].span == DL_SPAN_TOKENS || table[i].span == DL_SPAN_ALL) &&
            (dl_schedule_reads(&table[i], c) & (rows | m)))
            m |= table[i].writes;
    return m;
}

/* Every array the producer reads or writes is there (for rows whose
 * condition holds; tie_margin may be NULL: dl_route_topk skips it). */
static int arrays_present(const dl_producer_t *p, const dl_stage_view_t *v)
{
    dl_stage_view_t w = *v;
    const dl_rowset_t all = dl_schedule_reads(p, &v->c) | p->writes;
    for (int r = 0; r < dl_layout_count(); r++) {
        const dl_layout_row_t *row = dl_layout_row(r);
        const int aux = row->group != DL_LAYOUT_INPUTS && row->value == DL_VALUE_NONE;
        if (!DL_ROWSET_HAS(all, r) || !dl_cond_applies(row->cond, &v->c) || aux)
            continue; /* an AUX array (tie_margin) is optional */
        void **s = dl_layout_slot(row, &w.in, &w.f, &w.b);
        if (!s || !*s)
            return 0;
    }
    return 1;
}

int dl_schedule_run(int i, const dl_stage_view_t *v)
{
    if (i < 0 || i >= NPROD || !v)
        return DL_EINVAL;
    if (!arrays_present(&table[i], v) || (table[i].span == DL_SPAN_EXPERTS && !v->off))
        return DL_EINVAL;
    return run[i](v);
}

int dl_schedule_exec(const dl_moe_config_t *c, int passes, int *next, int upto,
                     const dl_placement_t *pl, void *ctx)
{
    if (!c || !pl || !pl->bind)
        return DL_EINVAL;
    if (upto < 0 || upto >= NPROD)
        upto = NPROD - 1;
    for (int i = next ? *next : 0; i <= upto; i++) {
        if (next)
            *next = i + 1;
        const dl_producer_t *p = &table[i];
        if (!((passes >> p->backward) & 1) || !dl_cond_applies(p->cond, c))
            continue;
        for (int w = 0;; w++) {
            dl_stage_view_t v;
            memset(&v, 0, sizeof v);
            int rc = pl->bind(ctx, i, w, &v);
            if (rc == DL_SCHEDULE_END)
                break;
            if (rc == DL_SCHEDULE_SKIP)
                continue;
            if (rc || (rc = dl_schedule_run(i, &v)) || (pl->done && (rc = pl->done(ctx, i, w, &v))))
                return rc;
        }
    }
    return 0;
}
