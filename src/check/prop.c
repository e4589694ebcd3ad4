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

/* A delta as floats for the magnitude GEMMs, rounded up (a bound stays a
 * bound). */
static float *up_float(const double *x, int64_t n)
{
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    if (!f)
        return NULL;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float v = (float)x[i];
        f[i] = (double)v < x[i] ? nextafterf(v, INFINITY) : v;
    }
    return f;
}

/* Squares as floats, rounded up: the statistical tier's root sum of
 * squares runs through the same magnitude GEMMs (sum a^2 sigma^2). x is
 * double (sq) or float (sqf). */
static float *sq_float(const double *x, const float *xf, int64_t n)
{
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    if (!f)
        return NULL;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double v = x ? x[i] * x[i] : (double)xf[i] * (double)xf[i];
        float r = (float)v;
        f[i] = (double)r < v ? nextafterf(r, INFINITY) : r;
    }
    return f;
}

/* The absent upstream stage whose effective value is operand p, if it has
 * a delta. */
static int delta_of(const dl__ck_t *ck, const void *p, int warn)
{
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        if (p && ck->st[u].eff == p && ck->st[u].delta[warn])
            return u;
    return -1;
}

/* The other operand of a GEMM term squared (the statistical tier), or
 * NULL on no memory; *n its element count. */
static float *other_squared(const dl__mprov_t *mp, int o, dl__mprov_t *sub)
{
    if (mp->kind == DL__M_GROUPED) {
        const dl_gemm_term_t *tm = &mp->terms[o];
        float *w = sq_float(NULL, tm->rhs, mp->E * tm->K * mp->N);
        sub->terms[0].rhs = w;
        return w;
    }
    const int64_t rows = mp->off[mp->E];
    float *w = sq_float(NULL, o ? mp->a : mp->b, rows * (o ? mp->I : mp->N));
    if (o)
        sub->a = w;
    else
        sub->b = w;
    return w;
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
        dl__mprov_t sub = *mp;
        float *fd = rss ? sq_float(ck->st[u].delta[warn], NULL, ck->st[u].numel)
                        : up_float(ck->st[u].delta[warn], ck->st[u].numel);
        float *w2 = NULL;
        double *tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
        int rc = fd && tmp ? 0 : DL_ENOMEM;
        if (!rc) {
            if (mp->kind == DL__M_GROUPED) {
                sub.nterms = 1;
                sub.terms[0] = mp->terms[o];
                sub.terms[0].lhs = fd;
            } else if (o) {
                sub.b = fd;
            } else {
                sub.a = fd;
            }
            if (rss && !(w2 = other_squared(mp, o, &sub)))
                rc = DL_ENOMEM;
        }
        if (!rc)
            rc = dl__ck_m_bulk(&sub, cmp->rows, tmp);
        if (!rc)
            for (int64_t i = 0; i < n; i++)
                out[i] += rss ? sqrt(tmp[i]) : tmp[i];
        free(fd);
        free(w2);
        free(tmp);
        if (rc)
            return rc;
        *any = 1;
    }
    return 0;
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

int dl__ck_propagate(dl__ck_t *ck, dl_value_t s, const dl__cmp_t *cmp, int warn, double **out)
{
    *out = NULL;
    const dl_valueset_t up = dl__ck_upstream(ck, s);
    int has = 0;
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        has |= ((up >> u) & 1) && ck->st[u].delta[warn] != NULL;
    if (!has)
        return 0;
    const int64_t n = ck->st[s].numel;
    double *p = dl__ck_alloc(ck, n, sizeof *p); /* zeroed */
    if (!p)
        return DL_ENOMEM;
    int any = 0, rc = 0;
    if (dl__ck_desc(s)->prop)
        any = prop_elem(ck, s, warn, p);
    else if (dl__ck_desc(s)->prop_gemm && cmp->mp &&
             (cmp->mp->kind == DL__M_GROUPED || cmp->mp->kind == DL__M_RAGGED))
        rc = prop_mp(ck, cmp, cmp->mp, warn, p, &any);
    if (rc < 0)
        return rc;
    /* first order: the neglected terms are O(delta^2); a relative 2^-20
     * covers them and the binary64 evaluation of the sums */
    for (int64_t i = 0; any && i < n; i++)
        p[i] *= 1.0 + 0x1p-20;
    *out = any ? p : NULL;
    return 0;
}
