/* Error propagation through the stages a candidate does not provide
 * (doc/tolerances.md, "Absent stages"). A fused kernel hands over `out`
 * and `d_x` only; its intermediate values carried their own rounding and
 * accumulation errors into them. For every absent stage the runner keeps
 * a per-element bound delta on the candidate's hidden value (its own
 * PASS or WARN bound plus what its absent upstream propagates), and the
 * bound of a provided stage grows by the first-order propagation of its
 * absent upstream's deltas through the exact stage function:
 *   |f(x + e) - f(x)| <= sum_u |df/du| delta_u   (+ O(delta^2)),
 * evaluated in binary64 magnitude arithmetic on the effective values. The
 * GEMM stages (prop column GEMM) propagate by the same magnitude GEMMs that
 * give their M (one operand replaced by its delta); the others (ELEM) by
 * their derivative magnitudes, which live beside each stage
 * (src/stages/<stage>_check.c, dl__prop_<name>). */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

/* The absent upstream stage whose effective value is operand p, if it has
 * a delta. */
static int delta_of(const dl__ck_t *ck, const void *p, int warn)
{
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        if (p && ck->st[u].eff == p && ck->st[u].delta[warn])
            return u;
    return -1;
}

/* out += t on [i0, i1) (vectorised). */
DL__CK_VEC static void add_to(int64_t i0, int64_t i1, const double *restrict t, double *restrict out)
{
    for (int64_t i = i0; i < i1; i++)
        out[i] += t[i];
}

/* GEMM stages: out += |other operand| * delta, one magnitude GEMM per
 * operand that carries a delta; in the statistical tier, for an operand
 * whose errors are independent across its elements, the root sum of
 * squares sqrt(sum |other|^2 sigma^2) instead (Hoeffding: a sum of
 * independent mean-zero terms bounded by b_i has the sub-Gaussian scale
 * sqrt(sum b_i^2)). */
static int prop_mp(dl__ck_t *ck, const dl__cmp_t *cmp, const dl__mprov_t *mp, int warn,
                   double *out, int *any)
{
    const int64_t n = cmp->rows * cmp->cols;
    const int nops = mp->kind == DL__M_GROUPED ? mp->nterms : 2;
    for (int o = 0; o < nops; o++) {
        const float *op = mp->kind == DL__M_GROUPED ? mp->terms[o].lhs : o ? mp->b : mp->a;
        const int u = delta_of(ck, op, warn);
        if (u < 0)
            continue;
        const int rss = warn == DL__TIER_STAT && !ck->st[u].coherent;
        /* the delta rounded up to binary32 in place of the operand (a bound
         * stays a bound); rss: delta and other operand squared */
        dl__mprov_t sub = *mp;
        dl__ck_mop_t x = {.delta = ck->st[u].delta[warn], .which = o, .sq = rss};
        if (mp->kind == DL__M_GROUPED) {
            sub.nterms = 1;
            sub.terms[0] = mp->terms[o];
            x.which = 0;
        }
        /* out is all +0 before the first operand (0 + t = t for t >= 0):
         * that one goes into out itself */
        double *tmp = *any ? dl__ck_scratch(ck, DL__CK_SCR_TMP, n) : out;
        int rc = tmp ? dl__ck_m_up(ck, &sub, cmp->rows, &x, tmp) : DL_ENOMEM;
        if (rc)
            return rc;
        const int64_t nc = (n + DL__CK_VCHUNK - 1) / DL__CK_VCHUNK;
        DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
        for (int64_t c = 0; c < nc; c++) {
            const int64_t i0 = c * DL__CK_VCHUNK, i1 = i0 + DL__CK_VCHUNK < n ? i0 + DL__CK_VCHUNK : n;
            if (rss)
                for (int64_t i = i0; i < i1; i++)
                    out[i] = tmp == out ? sqrt(tmp[i]) : out[i] + sqrt(tmp[i]);
            else if (tmp != out)
                add_to(i0, i1, tmp, out);
        });
        *any = 1;
    }
    return 0;
}

/* Zero experts (LongCat-Flash): a tail row of y_sorted is its x_sorted row
 * and of d_x_sorted its d_y_sorted row (dispatch.c's identity tail), so
 * that upstream's delta passes into those rows unchanged; 1 if it did. */
static int identity_tail(const dl__ck_t *ck, dl_value_t s, int warn, double *p)
{
    const dl_value_t src = s == DL_VALUE_Y_SORTED     ? DL_VALUE_X_SORTED
                           : s == DL_VALUE_D_X_SORTED ? DL_VALUE_D_Y_SORTED
                                                      : DL_VALUE_NONE;
    const int64_t *off = ck->st[DL_VALUE_GROUP_OFFSETS].eff;
    if (ck->c->route.zero_experts <= 0 || src == DL_VALUE_NONE || !off || !ck->st[src].delta[warn])
        return 0;
    for (int64_t i = off[ck->E] * ck->d; i < ck->M * ck->d; i++)
        p[i] += ck->st[src].delta[warn][i];
    return 1;
}

/* ------------------------------------------------------------ the entry */

/* An elementwise stage's propagation: its derivative magnitudes, beside the
 * stage (its row's prop function). */
static int prop_elem(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    dl__vctx_t v;
    dl__ck_vctx(ck, warn, &v);
    return dl__ck_desc(s)->prop(&v, ck->st[s].exact, ck->st[s].numel, out);
}

/* 1 if an upstream of s carries an error in this tier. */
static int prop_has(dl__ck_t *ck, dl_value_t s, int warn)
{
    const dl_valueset_t up = dl__ck_upstream(ck, s);
    int has = 0;
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        has |= ((up >> u) & 1) && ck->st[u].delta[warn] != NULL;
    if (!has && ck->c->route.zero_experts > 0) /* the identity tail's own upstream */
        has = (s == DL_VALUE_D_X_SORTED && ck->st[DL_VALUE_D_Y_SORTED].delta[warn]) ||
              (s == DL_VALUE_Y_SORTED && ck->st[DL_VALUE_X_SORTED].delta[warn]);
    return has;
}

int dl__ck_propagate_into(dl__ck_t *ck, dl_value_t s, const dl__cmp_t *cmp, int warn, double *p)
{
    if (!prop_has(ck, s, warn))
        return 0;
    const int64_t n = ck->st[s].numel;
    memset(p, 0, (size_t)(n > 0 ? n : 1) * sizeof *p);
    int any = 0, rc = 0;
    if (dl__ck_desc(s)->prop)
        any = prop_elem(ck, s, warn, p);
    else if (dl__ck_desc(s)->prop_gemm && cmp->mp &&
             (cmp->mp->kind == DL__M_GROUPED || cmp->mp->kind == DL__M_RAGGED))
        rc = prop_mp(ck, cmp, cmp->mp, warn, p, &any);
    if (rc < 0)
        return rc;
    any |= identity_tail(ck, s, warn, p);
    return any != 0;
}

int dl__ck_propagate(dl__ck_t *ck, dl_value_t s, const dl__cmp_t *cmp, int warn, int keep,
                     double **out)
{
    *out = NULL;
    const int64_t n = ck->st[s].numel;
    if (!prop_has(ck, s, warn))
        return 0;
    /* kept: an array of the run's pool (pages an earlier stage handed
     * back, not fresh ones), handed back again when nothing propagated */
    double *p = keep ? dl__ck_take(ck, n, sizeof *p, 0) : dl__ck_scratch(ck, DL__CK_SCR_P, n);
    if (!p)
        return DL_ENOMEM;
    const int any = dl__ck_propagate_into(ck, s, cmp, warn, p);
    if (keep && any <= 0)
        dl__ck_give(ck, p, (size_t)(n > 0 ? n : 1) * sizeof *p);
    if (any < 0)
        return any;
    /* first order: the neglected terms are O(delta^2); DL__CK_PROP_SLACK
     * covers them and the binary64 evaluation of the sums */
    DL__PAR_FOR(any && n > DL__PAR_MIN, schedule(static),
    for (int64_t i = 0; i < (any ? n : 0); i++)
        p[i] *= DL__CK_PROP_SLACK;);
    *out = any ? p : NULL;
    return 0;
}
