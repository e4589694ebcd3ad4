/* capacity.c: a Switch/GShard-style capacity-factor backend (the negative
 * control: it drops tokens).
 *
 * Capacity factor 1.0: each expert takes at most C = ceil(T*k / E)
 * assignments. Assignments are admitted in priority order, all top-1
 * choices first (j = 0, tokens left to right), then all top-2 choices, and
 * so on (DL_DROP_SLOT); an assignment whose expert is full is dropped.
 * Dropped assignments are missing from dispatch (group sizes count kept
 * ones only, sort_perm lists the kept ones and is -1 beyond them) and
 * contribute nothing to combine (nor get a gradient in combine_backward).
 * Expected verdict: FAIL, with exactly the number of dropped assignments.
 *
 * Unlike the other example backends this plugin links libdropless: the
 * capacity rule and the drop order are the library's dl_capacity and
 * dl_capacity_keep, so the drops the runner finds here are, by
 * construction, the ones `dropless capacity --cf 1 --policy slot` counts
 * (one implementation of the rule, not a copy that could drift). A real
 * backend needs dropless/backend.h alone.
 */
#include <dropless/backend.h>
#include <dropless/capacity.h>
#include "kernels.h"

/* keep[t*k+j] = 1 if the assignment survives the capacity limit. */
static uint8_t *capacity_keep(const dl_backend_config_t *c, const int32_t *ids)
{
    const int64_t T = c->tokens, k = c->top_k, E = c->experts;
    int64_t cap;
    uint8_t *keep = malloc((size_t)(T * k > 0 ? T * k : 1));
    if (!keep || dl_capacity(DL_CAPACITY_GSHARD, 1.0, T, k, E, &cap) ||
        dl_capacity_keep(ids, NULL, T, k, E, cap, DL_DROP_SLOT, keep)) {
        free(keep);
        return NULL;
    }
    return keep;
}

static int dispatch(const dl_backend_config_t *c, const dl_backend_dispatch_args_t *a)
{
    const int64_t E = c->experts, M = c->tokens * c->top_k;
    const int32_t *ids = EX_I32(a->topk_ids);
    int32_t *perm = EX_I32(a->sort_perm);
    int64_t *size = EX_I64(a->group_sizes), *off = EX_I64(a->group_offsets);
    uint8_t *keep = capacity_keep(c, ids);
    if (!keep)
        return 1;
    for (int64_t e = 0; e < E; e++)
        size[e] = 0;
    for (int64_t f = 0; f < M; f++)
        if (keep[f])
            size[ids[f]]++;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = off[e] + size[e];
    int64_t p = 0;
    for (int64_t e = 0; e < E; e++) /* kept assignments of e, in flat order */
        for (int64_t f = 0; f < M; f++)
            if (keep[f] && ids[f] == e)
                perm[p++] = (int32_t)f;
    for (; p < M; p++)
        perm[p] = -1; /* no assignment: the dropped ones are simply absent */
    free(keep);
    return 0;
}

static int combine(const dl_backend_config_t *c, const dl_backend_combine_args_t *a)
{
    uint8_t *keep = capacity_keep(c, EX_I32(a->topk_ids));
    if (!keep)
        return 1;
    ex_opts_t o = {.keep = keep};
    int rc = ex_combine(c, &o, a);
    free(keep);
    return rc;
}

static int combine_backward(const dl_backend_config_t *c,
                            const dl_backend_combine_backward_args_t *a)
{
    uint8_t *keep = capacity_keep(c, EX_I32(a->topk_ids));
    if (!keep)
        return 1;
    ex_opts_t o = {.keep = keep};
    int rc = ex_combine_backward(c, &o, a);
    free(keep);
    return rc;
}

static int permute(const dl_backend_config_t *c, const dl_backend_permute_args_t *a)
{
    return ex_permute(c, a);
}
static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION,
    .name = "capacity-factor-1.0",
    .version = "1.0",
    .compute_mode = "fp32",
    .router = ex_plain_router,
    .dispatch = dispatch,
    .permute = permute,
    .expert_forward = ex_plain_expert_forward,
    .combine = combine,
    .combine_backward = combine_backward,
};

const dl_backend_t *dropless_backend(void);
const dl_backend_t *dropless_backend(void)
{
    return &backend;
}
