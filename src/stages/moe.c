/* The whole layer: the stages in order, forward and backward. Each stage is
 * an exact function of the stored values before it, rounded once; this file
 * only wires them and owns the memory. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "stages/stages_priv.h"


int dl_moe_config_validate(const dl_moe_config_t *c)
{
    if (!c || c->tokens < 0 || c->hidden < 1 || c->ffn < 1)
        return DL_EINVAL;
    if (c->dtype != DL_F32 && c->dtype != DL_BF16 && c->dtype != DL_F16)
        return DL_EINVAL;
    if (c->ffn_kind != DL_FFN_SWIGLU && c->ffn_kind != DL_FFN_PLAIN)
        return DL_EINVAL;
    if (c->ffn_kind == DL_FFN_PLAIN && c->ffn != c->hidden)
        return DL_EINVAL;
    int rc = dl_route_config_validate(&c->route);
    if (rc)
        return rc;
    if (c->route.top_k > DL__MAX_TOPK)
        return DL_EINVAL;
    const int64_t T = c->tokens, d = c->hidden, f = c->ffn, E = c->route.experts,
                  k = c->route.top_k;
    int64_t M, a, b;
    /* every tensor's element count, and its byte count, must fit int64 */
    if (dl_mul_size(T, k, &M) || M > INT32_MAX)
        return DL_EOVERFLOW;
    if (dl_mul_size(M, d > f ? d : f, &a) || dl_mul_size(a, 8, &a))
        return DL_EOVERFLOW;
    if (dl_mul_size(E, d, &b) || dl_mul_size(b, f, &b) || dl_mul_size(b, 8, &b))
        return DL_EOVERFLOW;
    if (dl_mul_size(T, d > E ? d : E, &a) || dl_mul_size(a, 8, &a))
        return DL_EOVERFLOW;
    if (dl_mul_size(d, E, &a) || dl_mul_size(a, 8, &a))
        return DL_EOVERFLOW;
    return 0;
}

static int check_tensor(const float *p, int64_t n, dl_dtype_t t)
{
    if (!p && n > 0)
        return DL_EINVAL;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(max : bad)
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &p[i], 4);
        int v = dl__float_verdict(b, t);
        bad = v > bad ? v : bad;
    }
    return bad == 2 ? DL_ENONFINITE : bad == 1 ? DL_EGRID : 0;
}

int dl_moe_inputs_validate(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                           int need_backward)
{
    int rc = dl_moe_config_validate(c);
    if (rc)
        return rc;
    if (!in)
        return DL_EINVAL;
    const int64_t T = c->tokens, d = c->hidden, f = c->ffn, E = c->route.experts;
    const dl_dtype_t t = c->dtype;
    int swiglu = c->ffn_kind == DL_FFN_SWIGLU;
    if ((rc = check_tensor(in->x, T * d, t)) || (rc = check_tensor(in->router_weight, d * E, DL_F32)))
        return rc;
    if (c->route.has_bias && (rc = check_tensor(in->expert_bias, E, DL_F32)))
        return rc;
    if (swiglu && ((rc = check_tensor(in->w_gate, E * d * f, t)) ||
                   (rc = check_tensor(in->w_up, E * d * f, t))))
        return rc;
    if ((rc = check_tensor(in->w_down, E * f * d, t)))
        return rc;
    if (need_backward && (rc = check_tensor(in->d_out, T * d, t)))
        return rc;
    return 0;
}

void dl_moe_forward_free(dl_moe_forward_t *f)
{
    if (!f)
        return;
    dl__moe_arrays_free(f, NULL);
    memset(f, 0, sizeof *f);
}

/* One grouped GEMM term over the sorted rows. */
static int grouped(const float *lhs, int64_t K, const float *rhs, dl_rhs_layout_t layout,
                   int64_t N, const int64_t *offsets, int64_t E, dl_dtype_t t, float *out,
                   dl_tier_stats_t *st)
{
    dl_gemm_term_t term = {lhs, K, rhs, layout};
    return dl_gemm_grouped(&term, 1, N, offsets, E, t, out, st);
}

int dl_moe_route(const dl_moe_config_t *c, const dl_moe_inputs_t *in, dl_moe_forward_t *f)
{
    int rc = dl_moe_config_validate(c);
    if (rc)
        return rc;
    if (!in || !f || !f->router_logits || !f->router_scores || !f->topk_ids || !f->topk_weights)
        return DL_EINVAL;
    const int64_t T = c->tokens, d = c->hidden, E = c->route.experts, k = c->route.top_k;
    const int64_t all_rows[2] = {0, T};
    if ((rc = grouped(in->x, d, in->router_weight, DL_RHS_KN, E, all_rows, 1, DL_F32,
                      f->router_logits, &f->stats)) ||
        (rc = dl_route_scores(&c->route, f->router_logits, T, f->router_scores)) ||
        (rc = dl_route_topk(&c->route, f->router_scores, in->expert_bias, T, f->topk_ids,
                            f->topk_weights, f->tie_margin)))
        return rc;
    if (!f->sort_perm)
        return 0;
    if ((rc = dl_sort_assignments(f->topk_ids, T, k, E, f->sort_perm, f->inv_perm,
                                  f->group_sizes, f->group_offsets)))
        return rc;
    return f->x_sorted ? dl_permute(in->x, T, d, k, f->sort_perm, f->x_sorted) : 0;
}

int dl_moe_forward(const dl_moe_config_t *c, const dl_moe_inputs_t *in, dl_moe_forward_t *f)
{
    if (!f)
        return DL_EINVAL;
    memset(f, 0, sizeof *f);
    int rc = dl_moe_inputs_validate(c, in, 0);
    if (rc)
        return rc;
    const int64_t T = c->tokens, d = c->hidden, ff = c->ffn, E = c->route.experts,
                  k = c->route.top_k, M = T * k;
    const dl_dtype_t t = c->dtype;
    const int swiglu = c->ffn_kind == DL_FFN_SWIGLU;

    if (dl__moe_arrays_alloc(c, f, NULL))
        return DL_ENOMEM;

    if ((rc = dl_moe_route(c, in, f)))
        return rc;
    const int64_t *off = f->group_offsets;
    if (swiglu) {
        if ((rc = grouped(f->x_sorted, d, in->w_gate, DL_RHS_KN, ff, off, E, t, f->h_gate, &f->stats)) ||
            (rc = grouped(f->x_sorted, d, in->w_up, DL_RHS_KN, ff, off, E, t, f->h_up, &f->stats)) ||
            (rc = dl_swiglu(f->h_gate, f->h_up, M * ff, t, f->h_act)) ||
            (rc = grouped(f->h_act, ff, in->w_down, DL_RHS_KN, d, off, E, t, f->y_sorted, &f->stats)))
            return rc;
    } else if ((rc = grouped(f->x_sorted, d, in->w_down, DL_RHS_KN, d, off, E, t, f->y_sorted,
                             &f->stats))) {
        return rc;
    }
    return dl_combine(f->y_sorted, f->topk_weights, f->inv_perm, T, k, d, t, f->out);
}

void dl_moe_backward_free(dl_moe_backward_t *b)
{
    if (!b)
        return;
    dl__moe_arrays_free(NULL, b);
    memset(b, 0, sizeof *b);
}

int dl_moe_backward(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                    const dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    if (!b || !f)
        return DL_EINVAL;
    memset(b, 0, sizeof *b);
    int rc = dl_moe_inputs_validate(c, in, 1);
    if (rc)
        return rc;
    const int64_t T = c->tokens, d = c->hidden, ff = c->ffn, E = c->route.experts,
                  k = c->route.top_k, M = T * k;
    const dl_dtype_t t = c->dtype;
    const int swiglu = c->ffn_kind == DL_FFN_SWIGLU;
    const int64_t *off = f->group_offsets;

    if (dl__moe_arrays_alloc(c, NULL, b))
        return DL_ENOMEM;

    if ((rc = dl_combine_backward(in->d_out, f->y_sorted, f->topk_weights, f->inv_perm, T, k,
                                  d, t, b->d_topk_weights, b->d_y_sorted)))
        return rc;

    if (swiglu) {
        /* y = h_act Wd: d_h_act = d_y Wd^T, d_Wd = h_act^T d_y */
        if ((rc = grouped(b->d_y_sorted, d, in->w_down, DL_RHS_NK, ff, off, E, t, b->d_h_act, &b->stats)) ||
            (rc = dl_gemm_ragged_k(f->h_act, ff, b->d_y_sorted, d, off, E, DL_F32, b->d_w_down, &b->stats)) ||
            (rc = dl_swiglu_backward(f->h_gate, f->h_up, b->d_h_act, M * ff, t, b->d_h_gate, b->d_h_up)))
            return rc;
        dl_gemm_term_t terms[2] = {{b->d_h_gate, ff, in->w_gate, DL_RHS_NK},
                                   {b->d_h_up, ff, in->w_up, DL_RHS_NK}};
        if ((rc = dl_gemm_grouped(terms, 2, d, off, E, t, b->d_x_sorted, &b->stats)) ||
            (rc = dl_gemm_ragged_k(f->x_sorted, d, b->d_h_gate, ff, off, E, DL_F32, b->d_w_gate, &b->stats)) ||
            (rc = dl_gemm_ragged_k(f->x_sorted, d, b->d_h_up, ff, off, E, DL_F32, b->d_w_up, &b->stats)))
            return rc;
    } else if ((rc = grouped(b->d_y_sorted, d, in->w_down, DL_RHS_NK, d, off, E, t, b->d_x_sorted, &b->stats)) ||
               (rc = dl_gemm_ragged_k(f->x_sorted, d, b->d_y_sorted, d, off, E, DL_F32, b->d_w_down, &b->stats))) {
        return rc;
    }

    return dl_moe_route_backward(c, in, f, b);
}

int dl_moe_route_backward(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                          const dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    int rc = dl_moe_config_validate(c);
    if (rc)
        return rc;
    if (!in || !f || !b || !b->d_router_scores || !b->d_router_logits || !b->d_router_weight ||
        !b->d_x)
        return DL_EINVAL;
    const int64_t T = c->tokens, d = c->hidden, E = c->route.experts, k = c->route.top_k;
    const int64_t all_rows[2] = {0, T};
    if ((rc = dl_route_backward(&c->route, f->router_scores, f->topk_ids, b->d_topk_weights, T,
                                b->d_router_scores, b->d_router_logits)) ||
        (rc = dl_gemm_ragged_k(in->x, d, b->d_router_logits, E, all_rows, 1, DL_F32,
                               b->d_router_weight, &b->stats)))
        return rc;
    return dl_input_backward(b->d_x_sorted, f->inv_perm, b->d_router_logits, in->router_weight, T,
                             k, d, E, c->dtype, b->d_x);
}
