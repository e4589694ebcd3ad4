/* routing.c: the routings the capacity analysis measures, all from the
 * library's own router (a case's inputs) or from a golden file, so a
 * `dropless capacity` table is about the very topk_ids `dropless gen`
 * writes. */
#include "capacity/capacity_priv.h"
#include <stdlib.h>
#include <string.h>

void dl_capacity_routing_free(dl_capacity_routing_t *r)
{
    if (r) {
        free(r->ids);
        free(r->prob);
        free(r->group_sizes);
        memset(r, 0, sizeof *r);
    }
}

static void *alloc(int64_t n, size_t size)
{
    return malloc((size_t)(n > 0 ? n : 1) * size);
}

static int routing_alloc(dl_capacity_routing_t *r, int64_t T, int64_t k, int64_t E)
{
    memset(r, 0, sizeof *r);
    r->tokens = T, r->top_k = k, r->experts = E;
    r->ids = alloc(T * k, sizeof *r->ids);
    r->prob = alloc(T * k, sizeof *r->prob);
    r->group_sizes = alloc(E, sizeof *r->group_sizes);
    return r->ids && r->prob && r->group_sizes ? 0 : DL_ENOMEM;
}

/* prob[t, j] = scores[t, ids[t, j]]. */
static void gather(dl_capacity_routing_t *r, const float *scores)
{
    const int64_t T = r->tokens, k = r->top_k, E = r->experts;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++)
            r->prob[t * k + j] = scores[t * E + r->ids[t * k + j]];
}

/* Router logits, scores, top-k and group sizes: the first stages of
 * dl_moe_forward (dl_moe_route), on x and the router alone. */
static int route(const dl_moe_config_t *c, const dl_golden_inputs_t *in, dl_capacity_routing_t *r)
{
    const int64_t T = c->tokens, E = c->route.experts, k = c->route.top_k;
    float *logits = alloc(T * E, sizeof(float)), *scores = alloc(T * E, sizeof(float));
    float *w = alloc(T * k, sizeof(float));
    int32_t *perm = alloc(T * k, sizeof(int32_t)), *inv = alloc(T * k, sizeof(int32_t));
    int64_t *off = alloc(E + 1, sizeof(int64_t));
    int rc = DL_ENOMEM;
    if (logits && scores && w && perm && inv && off) {
        dl_moe_forward_t f = {.router_logits = logits, .router_scores = scores,
                              .topk_ids = r->ids, .topk_weights = w, .sort_perm = perm,
                              .inv_perm = inv, .group_sizes = r->group_sizes,
                              .group_offsets = off};
        dl_moe_inputs_t view = dl_golden_inputs_view(in);
        if (!(rc = dl_moe_route(c, &view, &f)))
            gather(r, scores);
    }
    free(logits), free(scores), free(w), free(perm), free(inv), free(off);
    return rc;
}

int dl_capacity_route_case(const dl_case_t *c, dl_capacity_routing_t *r)
{
    if (!r)
        return DL_EINVAL;
    memset(r, 0, sizeof *r);
    if (!c)
        return DL_EINVAL;
    /* x, the router weight and the bias are drawn from their own streams,
     * whatever the FFN: a one-column SwiGLU FFN leaves them as they are and
     * keeps the expert weights (E*d*f each) out of memory. */
    dl_case_t rc_case = *c;
    rc_case.config.ffn = 1;
    rc_case.config.ffn_kind = DL_FFN_SWIGLU;
    const dl_moe_config_t *k = &rc_case.config;
    dl_golden_inputs_t in;
    int rc = dl_case_inputs(&rc_case, &in);
    if (!rc)
        rc = routing_alloc(r, k->tokens, k->route.top_k, k->route.experts);
    if (!rc)
        rc = route(k, &in, r);
    dl_golden_inputs_free(&in);
    return rc;
}

int dl_capacity_route_golden(const dl_golden_file_t *g, dl_capacity_routing_t *r)
{
    if (!r)
        return DL_EINVAL;
    memset(r, 0, sizeof *r);
    if (!g || !g->has_forward || !g->fwd.topk_ids || !g->fwd.router_scores || !g->fwd.group_sizes)
        return DL_EINVAL;
    const dl_moe_config_t *c = &g->config;
    const int64_t T = c->tokens, k = c->route.top_k, E = c->route.experts;
    int rc = routing_alloc(r, T, k, E);
    if (rc)
        return rc;
    memcpy(r->ids, g->fwd.topk_ids, (size_t)(T * k) * sizeof *r->ids);
    memcpy(r->group_sizes, g->fwd.group_sizes, (size_t)E * sizeof *r->group_sizes);
    gather(r, g->fwd.router_scores);
    return 0;
}
