/* Replaying the layer downstream of a mutated stage: each stage that
 * depends on a changed value is recomputed by the oracle's own stage
 * function (dl_gemm_*, dl_swiglu*, dl_combine*, dl_route_*, ...) on the
 * stored values before it, exactly as dl_moe_forward and dl_moe_backward
 * wire them; this file adds only the dependency table and the wiring,
 * never arithmetic. */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "golden/mutate_priv.h"

/* What each value is computed from: the up and up_plain columns of
 * DL_VALUE_MAP (doc/conformance.md, "Dependencies"), the runner's own. */
#define UP_IN(up, plain)
#define UP_AUX(up, plain)
#define UP_FW(up, plain) {up, plain},
#define UP_BW(up, plain) {up, plain},
#define UP_ROW(g, E, n, st, dims, cond, check, prop, up, plain, ...) UP_##g(up, plain)
static const dl_valueset_t value_up[DL_VALUE_COUNT][2] = {DL_VALUE_MAP(UP_ROW)};

static dl_valueset_t deps(int s, int hidden)
{
    return !hidden && value_up[s][1] ? value_up[s][1] : value_up[s][0];
}

void *dl__mut_array(dl_moe_forward_t *f, dl_moe_backward_t *b, int s)
{
    return (void *)dl_value_array(f, b, (dl_value_t)s);
}

static void grouped(dl__mut_gemm_t *g, const float *lhs, int64_t K, const float *rhs,
                    dl_rhs_layout_t lay, int64_t N)
{
    g->terms[g->nterms++] = (dl_gemm_term_t){lhs, K, rhs, lay};
    g->N = N;
}

static void ragged(dl__mut_gemm_t *g, const float *a, int64_t ni, const float *b, int64_t nj)
{
    g->ragged = 1;
    g->a = a, g->ni = ni, g->b = b, g->nj = nj;
    g->out_t = DL_F32;
}

int dl__mut_gemm_of(const dl_moe_config_t *c, const dl_moe_inputs_t *in, const dl_moe_forward_t *f,
                    const dl_moe_backward_t *b, int s, dl__mut_gemm_t *g, int *expert)
{
    const int64_t d = c->hidden, ff = c->ffn, E = c->route.experts;
    const int sw = DL_FFN_HIDDEN(c->ffn_kind), gated = DL_FFN_GATED(c->ffn_kind);
    /* the simulated GEMMs have no bias term: a projection of an ffn_bias
     * layer is not one of them */
    if (c->ffn_bias && (s == DL_VALUE_H_GATE || s == DL_VALUE_H_UP || s == DL_VALUE_Y_SORTED))
        return DL_ENOTFOUND;
    memset(g, 0, sizeof *g);
    g->off = f->group_offsets, g->E = E, g->out_t = c->dtype;
    *expert = 1;
    switch (s) {
    case DL_VALUE_ROUTER_LOGITS:
        grouped(g, in->x, d, in->router_weight, DL_RHS_KN, DL_ROUTE_WIDTH(&c->route));
        break;
    case DL_VALUE_H_GATE: grouped(g, f->x_sorted, d, in->w_gate, DL_RHS_KN, ff); break;
    case DL_VALUE_H_UP: grouped(g, f->x_sorted, d, in->w_up, DL_RHS_KN, ff); break;
    case DL_VALUE_Y_SORTED:
        grouped(g, sw ? f->h_act : f->x_sorted, sw ? ff : d, in->w_down, DL_RHS_KN, d);
        break;
    case DL_VALUE_D_H_ACT: grouped(g, b->d_y_sorted, d, in->w_down, DL_RHS_NK, ff); break;
    case DL_VALUE_D_X_SORTED:
        if (sw) {
            if (gated)
                grouped(g, b->d_h_gate, ff, in->w_gate, DL_RHS_NK, d);
            grouped(g, b->d_h_up, ff, in->w_up, DL_RHS_NK, d);
        } else {
            grouped(g, b->d_y_sorted, d, in->w_down, DL_RHS_NK, d);
        }
        break;
    case DL_VALUE_D_W_DOWN:
        ragged(g, sw ? f->h_act : f->x_sorted, sw ? ff : d, b->d_y_sorted, d);
        break;
    case DL_VALUE_D_W_GATE: ragged(g, f->x_sorted, d, b->d_h_gate, ff); break;
    case DL_VALUE_D_W_UP: ragged(g, f->x_sorted, d, b->d_h_up, ff); break;
    case DL_VALUE_D_ROUTER_WEIGHT:
        ragged(g, in->x, d, b->d_router_logits, DL_ROUTE_WIDTH(&c->route));
        break;
    default:
        return DL_ENOTFOUND;
    }
    if (s == DL_VALUE_ROUTER_LOGITS || s == DL_VALUE_D_ROUTER_WEIGHT) {
        *expert = 0;
        g->off = NULL, g->rows[1] = c->tokens, g->E = 1, g->out_t = DL_F32;
    }
    if ((!sw && (s == DL_VALUE_H_GATE || s == DL_VALUE_H_UP || s == DL_VALUE_D_H_ACT ||
                 s == DL_VALUE_D_W_GATE || s == DL_VALUE_D_W_UP)) ||
        (!gated && (s == DL_VALUE_H_GATE || s == DL_VALUE_D_W_GATE)))
        return DL_ENOTFOUND;
    return 0;
}

int dl__mut_gemm_run(const dl__mut_gemm_t *g, float *out)
{
    const int64_t *off = g->off ? g->off : g->rows;
    if (g->ragged)
        return dl_gemm_ragged_k(g->a, g->ni, g->b, g->nj, off, g->E, g->out_t, out, NULL);
    return dl_gemm_grouped(g->terms, g->nterms, g->N, off, g->E, g->out_t, out, NULL);
}

/* The layout row of value s. */
static int row_of(int s)
{
    for (int i = 0; i < dl_layout_count(); i++)
        if (dl_layout_row(i)->value == (dl_value_t)s)
            return i;
    return -1;
}

static size_t value_bytes(const dl_moe_config_t *c, int s)
{
    return (size_t)dl_value_numel(c, (dl_value_t)s) * (dl_value_store((dl_value_t)s) == DL_STORE_I64 ? 8 : 4);
}

/* The routing stages that one call computes together, into scratch; the
 * one asked for is copied out. */
static int route_stage(const dl_moe_config_t *c, const dl_moe_inputs_t *in, dl_moe_forward_t *f,
                       int s, void *dst)
{
    const int64_t T = c->tokens, E = c->route.experts, k = c->route.top_k, M = T * k;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(M ? M : 1));
    float *w = malloc(sizeof(float) * (size_t)(M ? M : 1));
    int32_t *sp = malloc(sizeof(int32_t) * (size_t)(M ? M : 1)), *ip = malloc(sizeof(int32_t) * (size_t)(M ? M : 1));
    int64_t *gs = malloc(sizeof(int64_t) * (size_t)E), *go = malloc(sizeof(int64_t) * (size_t)(E + 1));
    int rc = DL_ENOMEM;
    if (ids && w && sp && ip && gs && go) {
        if (s == DL_VALUE_TOPK_IDS || s == DL_VALUE_TOPK_WEIGHTS) {
            rc = c->route.hash_vocab > 0 /* hash routing: the table chooses */
                     ? dl_route_hash(&c->route, f->router_scores, in->hash_table, in->token_ids,
                                     T, ids, w, f->tie_margin)
                     : dl_route_topk(&c->route, f->router_scores, in->expert_bias, T, ids, w,
                                     f->tie_margin);
            if (!rc)
                memcpy(dst, s == DL_VALUE_TOPK_IDS ? (void *)ids : (void *)w, 4 * (size_t)M);
        } else {
            rc = dl__sort_assignments_z(f->topk_ids, T, k, E, c->route.zero_experts, sp, ip, gs,
                                        go);
            if (!rc && (s == DL_VALUE_SORT_PERM || s == DL_VALUE_INV_PERM))
                memcpy(dst, s == DL_VALUE_SORT_PERM ? sp : ip, 4 * (size_t)M);
            else if (!rc)
                memcpy(dst, s == DL_VALUE_GROUP_SIZES ? gs : go,
                       8 * (size_t)(s == DL_VALUE_GROUP_SIZES ? E : E + 1));
        }
    }
    free(ids), free(w), free(sp), free(ip), free(gs), free(go);
    return rc;
}

/* Stage s by the schedule's own producer on the whole layer: the layer's
 * wiring, for what compute does not wire itself (the shared experts, out
 * and d_x with their shared terms, the model variants' stages). A producer
 * may write values beside s (an activation's backward both its
 * gradients); those of keep (the mutated ones) are put back after it. One
 * that s is computed from is refused (DL_EINTERNAL): the producer would use
 * its own fresh value, not the mutated one. */
static int via_schedule(const dl_moe_config_t *c, const dl_moe_inputs_t *in, dl_moe_forward_t *f,
                        dl_moe_backward_t *b, int s, dl_valueset_t keep)
{
    const int p = dl_schedule_writer(row_of(s));
    const dl_producer_t *pr = dl_schedule_producer(p);
    if (!pr)
        return DL_EINVAL;
    const int hidden = DL_FFN_HIDDEN(c->ffn_kind);
    void *saved[DL_VALUE_COUNT] = {0};
    int rc = 0;
    for (int u = 0; u < DL_VALUE_COUNT && !rc; u++) {
        void *a = dl__mut_array(f, b, u);
        if (u == s || !(keep & DL__BIT(u)) || !a || !DL_ROWSET_HAS(pr->writes, row_of(u)))
            continue;
        if (deps(s, hidden) & DL__BIT(u))
            rc = DL_EINTERNAL;
        else if (!(saved[u] = malloc(value_bytes(c, u) ? value_bytes(c, u) : 1)))
            rc = DL_ENOMEM;
        else
            memcpy(saved[u], a, value_bytes(c, u));
    }
    const dl_stage_view_t v = {.c = *c, .in = *in, .f = *f, .b = *b,
                               .rows = c->tokens * c->route.top_k, .off = f->group_offsets,
                               .ne = c->route.experts};
    if (!rc)
        rc = dl_schedule_run(p, &v);
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        if (saved[u]) {
            memcpy(dl__mut_array(f, b, u), saved[u], value_bytes(c, u));
            free(saved[u]);
        }
    return rc;
}

/* Stage s, recomputed into its array from the stored values. */
static int compute(const dl_moe_config_t *c, const dl_moe_inputs_t *in, dl_moe_forward_t *f,
                   dl_moe_backward_t *b, int s, dl_valueset_t keep)
{
    const int64_t T = c->tokens, d = c->hidden, ff = c->ffn,
                  k = c->route.top_k, M = T * k;
    const dl_dtype_t t = c->dtype;
    void *dst = dl__mut_array(f, b, s);
    dl__mut_gemm_t g;
    int expert;
    if (c->route.zero_experts > 0 && (s == DL_VALUE_H_GATE || s == DL_VALUE_H_UP ||
                                      s == DL_VALUE_Y_SORTED || s == DL_VALUE_D_H_ACT ||
                                      s == DL_VALUE_D_X_SORTED))
        return via_schedule(c, in, f, b, s, keep); /* the identity tail: the producers know it */
    if (dl__mut_gemm_of(c, in, f, b, s, &g, &expert) == 0)
        return dl__mut_gemm_run(&g, dst);
    const char *nm = dl_value_name((dl_value_t)s);
    if (!strncmp(nm, "shared_", 7) || !strncmp(nm, "d_shared_", 9) ||
        (c->shared_experts > 0 && (s == DL_VALUE_OUT || s == DL_VALUE_D_X)) ||
        (c->route.weight_on_input && (s == DL_VALUE_X_SORTED || s == DL_VALUE_D_ROUTER_SCORES ||
                                      s == DL_VALUE_D_X))) /* Llama-4: the producers know it */
        return via_schedule(c, in, f, b, s, keep);
    switch (s) {
    case DL_VALUE_ROUTER_SCORES: return dl_route_scores(&c->route, f->router_logits, T, dst);
    case DL_VALUE_TOPK_IDS: case DL_VALUE_TOPK_WEIGHTS: case DL_VALUE_SORT_PERM:
    case DL_VALUE_INV_PERM: case DL_VALUE_GROUP_SIZES: case DL_VALUE_GROUP_OFFSETS:
        return route_stage(c, in, f, s, dst);
    case DL_VALUE_X_SORTED: return dl_permute(in->x, T, d, k, f->sort_perm, dst);
    case DL_VALUE_H_ACT: return dl_ffn_act(c, f->h_gate, f->h_up, M * ff, dst);
    case DL_VALUE_OUT: return dl_combine(f->y_sorted, f->topk_weights, f->inv_perm, T, k, d, t, dst);
    case DL_VALUE_D_TOPK_WEIGHTS:
        return dl_combine_backward(in->d_out, f->y_sorted, f->topk_weights, f->inv_perm, T, k, d,
                                   t, dst, NULL);
    case DL_VALUE_D_Y_SORTED:
        return dl_combine_backward(in->d_out, f->y_sorted, f->topk_weights, f->inv_perm, T, k, d,
                                   t, NULL, dst);
    case DL_VALUE_D_H_GATE:
        return dl_ffn_act_backward(c, f->h_gate, f->h_up, b->d_h_act, M * ff, dst, NULL);
    case DL_VALUE_D_H_UP:
        return dl_ffn_act_backward(c, f->h_gate, f->h_up, b->d_h_act, M * ff, NULL, dst);
    case DL_VALUE_D_ROUTER_SCORES:
        return dl_route_backward(&c->route, f->router_scores, f->topk_ids, b->d_topk_weights, T,
                                 dst, NULL);
    case DL_VALUE_D_ROUTER_LOGITS:
        return dl_route_scores_backward(&c->route, f->router_scores, b->d_router_scores, T, dst);
    case DL_VALUE_D_X:
        return dl_input_backward(b->d_x_sorted, f->inv_perm, b->d_router_logits, in->router_weight,
                                 T, k, d, DL_ROUTE_WIDTH(&c->route), t, dst);
    default:
        return via_schedule(c, in, f, b, s, keep);
    }
}

int dl__mut_replay(const dl_moe_config_t *c, const dl_moe_inputs_t *in, dl_moe_forward_t *f,
                   dl_moe_backward_t *b, dl_valueset_t dirty, dl_valueset_t fixed)
{
    const int sw = DL_FFN_HIDDEN(c->ffn_kind);
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        if ((fixed & DL__BIT(s)) || !(deps(s, sw) & dirty) || !dl_value_numel(c, (dl_value_t)s))
            continue;
        if (dl_value_is_backward((dl_value_t)s) && !b->d_x)
            continue; /* a forward-only golden */
        int rc = compute(c, in, f, b, s, fixed);
        if (rc)
            return rc;
        dirty |= DL__BIT(s);
    }
    return 0;
}
