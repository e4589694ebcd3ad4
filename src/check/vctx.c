/* The runner's view of the layer for the stages' checking sides
 * (dl__vctx_t, stages_priv.h): the case, the effective values and, for a
 * propagation, the deltas of one tier. A leaf of the runner: the driver
 * (desc.c, prop.c) and the token accounting (tokens.c) call the stages'
 * checking functions through it. */
#include "config.h"
#include "check/check_priv.h"

static void *ck_alloc(void *actx, int64_t n, size_t size)
{
    return dl__ck_alloc(actx, n, size);
}

void dl__ck_vctx(dl__ck_t *ck, int tier, dl__vctx_t *v)
{
    *v = (dl__vctx_t){.c = ck->c, .in = ck->in, .T = ck->T, .d = ck->d, .f = ck->f, .E = ck->E,
                      .k = ck->k, .M = ck->M, .swiglu = ck->swiglu, .act = ck->act,
                      .sel_ids = ck->exact_ids, .sel_weights = ck->exact_weights,
                      .alloc = ck_alloc, .actx = ck, .spare = &ck->spare,
                      .memo = &ck->memo};
    for (int u = 0; u < DL_VALUE_COUNT; u++) {
        v->v[u] = ck->st[u].eff;
        v->delta[u] = tier < 0 ? NULL : ck->st[u].delta[tier];
    }
    if (tier < 0)
        return;
    /* the statistical tier adds the terms of independent sources (a hidden
     * value whose errors are independent across its elements, and distinct
     * hidden values) as a root sum of squares, coherent ones linearly; the
     * other tiers always linearly */
    for (int u = 0; tier == DL__TIER_STAT && u < DL_VALUE_COUNT; u++)
        v->rss |= (dl_valueset_t)!ck->st[u].coherent << u;
}

dl_dtype_t dl__ck_case_type(const dl__ck_t *ck, dl_value_t s)
{
    return dl_value_store(s) == DL_STORE_ACT ? ck->act : DL_F32;
}
