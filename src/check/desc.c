/* One descriptor per stage value, generated from its row of DL_VALUE_MAP
 * (dropless/values.h): what it is a function of (up, up_plain), how it is
 * judged (check), and the functions beside its stage that give its exact
 * value on the effective upstream, the scale M of its rounding error and
 * the propagation of an absent upstream's error (stages_priv.h), the
 * part of the layer a per-part profile names it by (part), and what its
 * elements depend on (reuse: how much of it a changed upstream makes the
 * runner recompute, reuse.c). Nothing
 * here lists a value by hand, so none can be left out: a row without its
 * functions does not link, and a row whose columns do not describe a check
 * stops the runner before it judges anything (dl__ck_table_check). The
 * driver that walks the stages is stage.c. */
#include "config.h"
#include <string.h>
#include "check/check_priv.h"

/* The check column: flags, the functions beside the stage, or the
 * runner's own routine. */
#define FNS_NUM(nm) 1, dl__exact_##nm, dl__mag_##nm, 0u, NULL
#define FNS_DW(nm) 1, dl__exact_##nm, dl__mag_##nm, DL__CK_DW, NULL
#define FNS_END(nm) 1, dl__exact_##nm, dl__mag_##nm, DL__CK_DRIFT, NULL
#define FNS_OUT(nm) 1, dl__exact_##nm, dl__mag_##nm, DL__CK_DRIFT | DL__CK_DROPS, NULL
#define FNS_COPY(nm) 1, dl__exact_##nm, NULL, DL__CK_COPY, NULL
#define FNS_IDS(nm) 1, NULL, NULL, 0u, dl__ck_route_ids
#define FNS_TOKENS(nm) 1, NULL, NULL, 0u, dl__ck_tokens
#define FNS_SORTED(nm) 1, NULL, NULL, DL__CK_WITH_SORT, NULL
#define FNS_NONE(nm) 0, NULL, NULL, 0u, NULL
/* The prop column. */
#define PROP_ELEM(nm) dl__prop_##nm, 0
#define PROP_GEMM(nm) NULL, 1
#define PROP_NONE(nm) NULL, 0
#define DESC_IN(nm, ck, pr, up, plain, part, reuse)
#define DESC_AUX(nm, ck, pr, up, plain, part, reuse)
#define DESC_FW(nm, ck, pr, up, plain, part, reuse) \
    {up, plain, FNS_##ck(nm), PROP_##pr(nm), DL__CK_PART_##part, DL__CK_REUSE_##reuse},
#define DESC_BW(nm, ck, pr, up, plain, part, reuse) DESC_FW(nm, ck, pr, up, plain, part, reuse)
/* every column by name: a row that lacks one does not build */
#define DESC(g, E, nm, st, dims, cond, ck, pr, up, plain, part, reuse) \
    DESC_##g(nm, ck, pr, up, plain, part, reuse)
/* in dl_value_t order: the map's FW and BW rows */
static const dl__ck_desc_t table[] = {DL_VALUE_MAP(DESC)};
_Static_assert(sizeof table / sizeof *table == DL_VALUE_COUNT,
               "one descriptor per stage value of DL_VALUE_MAP");

const char *dl__ck_desc_gap(const dl__ck_desc_t *d, dl_store_t store)
{
    if (!d->kind)
        return "its check column is NONE";
    if ((d->exact || d->mag) && store > DL_STORE_F32)
        return "its check column compares floats, but it is stored as integers";
    if (d->exact && !(d->flags & DL__CK_COPY) && !d->mag)
        return "its check column has no magnitude function";
    if (d->exact && !(d->flags & DL__CK_COPY) && !d->prop && !d->prop_gemm && (d->up || d->up_plain))
        return "it has upstream values but its prop column is NONE";
    if (d->exact && !(d->flags & DL__CK_COPY) && d->part == DL__CK_PART_NONE)
        return "it is judged within a tolerance but its part column is NONE (no profile part)";
    if (d->exact && d->reuse == DL__CK_REUSE_NONE)
        return "its exact value is recomputed but its reuse column is NONE (use ALL)";
    if (!d->exact && d->reuse != DL__CK_REUSE_NONE)
        return "its reuse column names a shape but nothing recomputes it (use NONE)";
    return NULL;
}

int dl__ck_table_check(dl__ck_t *ck)
{
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        const char *why = dl__ck_desc_gap(&table[s], dl_value_store((dl_value_t)s));
        if (!why)
            continue;
        /* a value the table does not describe would never be checked, and
         * the report would not say so: refuse, naming it */
        dl_check_result_t *r = dl__ck_result(ck, (dl_value_t)s, "table");
        if (r) {
            r->verdict = DL_VERDICT_FAIL;
            dl__ck_msg(r, "the runner has no check for value %s (%s, in its row of "
                          "DL_VALUE_MAP): refusing to judge",
                       dl_value_name((dl_value_t)s), why);
        }
        return DL_EINVAL;
    }
    return 0;
}

const dl__ck_desc_t *dl__ck_desc(dl_value_t s)
{
    return (int)s >= 0 && s < DL_VALUE_COUNT ? &table[s] : NULL;
}

/* The values that exist for the case: a variant's values (the shared
 * experts') are no stage's upstream in a case without it, so they cannot
 * make a stage look recomputed on a changed upstream. */
#define VCOND_IN(E, cond)
#define VCOND_AUX(E, cond)
#define VCOND_FW(E, cond) [DL_VALUE_##E] = DL_COND_##cond,
#define VCOND_BW(E, cond) [DL_VALUE_##E] = DL_COND_##cond,
#define VCOND(g, E, n, st, dims, cond, ...) VCOND_##g(E, cond)
static const dl_cond_t value_cond[DL_VALUE_COUNT] = {DL_VALUE_MAP(VCOND)};

static dl_valueset_t existing(const dl__ck_t *ck)
{
    dl_valueset_t m = 0;
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        if (dl_cond_applies(value_cond[u], ck->c))
            m |= DL_VALUE_BIT(u);
    return m;
}

static dl_valueset_t upstream_of(const dl__ck_t *ck, dl_value_t s, dl_valueset_t ex)
{
    const dl__ck_desc_t *d = dl__ck_desc(s);
    if (!d)
        return 0;
    return (!ck->swiglu && d->up_plain ? d->up_plain : d->up) & ex;
}

dl_valueset_t dl__ck_upstream(const dl__ck_t *ck, dl_value_t s)
{
    if (ck->have_up && (int)s >= 0 && s < DL_VALUE_COUNT)
        return ck->up[s];
    return upstream_of(ck, s, existing(ck));
}

void dl__ck_upstream_init(dl__ck_t *ck)
{
    /* the conditions once, not once per value and upstream (47 x 47 name
     * lookups were 3% of a small case's full check) */
    const dl_valueset_t ex = existing(ck);
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        ck->up[s] = upstream_of(ck, (dl_value_t)s, ex);
    ck->have_up = 1;
}

dl_dtype_t dl__ck_stage_type(const dl__ck_t *ck, dl_value_t s)
{
    /* a candidate's coarser storage is judged at its own precision */
    if ((int)s >= 0 && s < DL_VALUE_COUNT && ck->st[s].cand && ((ck->coarse >> s) & 1))
        return ck->st[s].store;
    return dl__ck_case_type(ck, s);
}

int dl__ck_exact(dl__ck_t *ck, dl_value_t s, float *out)
{
    dl__vctx_t v;
    dl__ck_vctx(ck, -1, &v);
    return table[s].exact(&v, out);
}

/* Operands off the profile's input grid for a product of types a and b. */
static int kin(const dl__ck_t *ck, dl_value_t s, dl_dtype_t a, dl_dtype_t b)
{
    const dl_check_profile_t *p = dl__ck_prof(ck, s);
    return !dl__ck_on_input_grid(p, a) + !dl__ck_on_input_grid(p, b);
}

int dl__ck_mag(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    dl__vctx_t v;
    dl__ck_vctx(ck, -1, &v);
    dl__mag_t m = {.mp = mp};
    int rc = table[s].mag(&v, ck->st[s].exact, ck->st[s].numel, &m);
    if (rc)
        return rc;
    cmp->mp = m.mp;
    cmp->K = m.K;
    cmp->row_K = m.row_K;
    cmp->rows = m.rows;
    cmp->cols = m.cols;
    cmp->elem = m.elem;
    cmp->short_sum = m.short_sum;
    cmp->prod_store = m.prod_store;
    cmp->kappa_in = m.nops == 2 ? kin(ck, s, m.op[0], m.op[1]) : 0;
    return 0;
}
