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
 * GEMM stages propagate by the same magnitude GEMMs that give their M
 * (one operand replaced by its delta); the others by their derivatives. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

#define EF(s) ((const float *)ck->eff[DL_VALUE_##s])
#define DL(s) ck->delta[warn][DL_VALUE_##s]
#define INV ((const int32_t *)ck->eff[DL_VALUE_INV_PERM])

static double sig(double g)
{
    return 1.0 / (1.0 + exp(-g));
}

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
        if (p && ck->eff[u] == p && ck->delta[warn][u])
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
        const int rss = warn == DL__TIER_STAT && !ck->coherent[u];
        dl__mprov_t sub = *mp;
        float *fd = rss ? sq_float(ck->delta[warn][u], NULL, ck->numel[u])
                        : up_float(ck->delta[warn][u], ck->numel[u]);
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

/* ---------------------------------------------------- elementwise stages */

/* The statistical tier adds the terms of independent sources (a hidden
 * value whose errors are independent across its elements, and distinct
 * hidden values) as a root sum of squares, coherent ones linearly; the
 * other tiers always linearly. RSS(u) says whether source u's terms go
 * into the squares. */
#define RSS(u) (warn == DL__TIER_STAT && !ck->coherent[DL_VALUE_##u])

static double comb(double lin, double sq)
{
    return lin + sqrt(sq);
}

static int p_router_scores(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *dl = DL(ROUTER_LOGITS);
    const float *sc = ck->exact[s];
    const int64_t E = ck->E;
    if (!dl)
        return 0;
    for (int64_t t = 0; t < ck->T; t++) {
        double sum = 0.0; /* softmax: ds_e <= s_e (dl_e + sum_j s_j dl_j) */
        for (int64_t e = 0; e < E; e++)
            sum += (double)sc[t * E + e] * dl[t * E + e];
        for (int64_t e = 0; e < E; e++) {
            const double se = sc[t * E + e];
            out[t * E + e] += ck->c->route.score_fn == DL_SCORE_SOFTMAX
                                  ? se * (dl[t * E + e] + sum)
                                  : se * (1.0 - se) * dl[t * E + e];
        }
    }
    return 1;
}

/* The renormalised selection's sum S of one token. */
static double sel_sum(const dl__ck_t *ck, const float *sc, const int32_t *ids, int64_t t)
{
    double S = 0.0;
    for (int64_t j = 0; j < ck->k; j++)
        S += sc[t * ck->E + ids[t * ck->k + j]];
    return S;
}

static int p_topk_weights(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *ds = DL(ROUTER_SCORES);
    const float *sc = EF(ROUTER_SCORES);
    const int32_t *ids = ck->eff[DL_VALUE_TOPK_IDS];
    const int64_t k = ck->k, E = ck->E;
    const double a = fabs(ck->c->route.scaling);
    if (!ds)
        return 0;
    for (int64_t t = 0; t < ck->T; t++) {
        if (!ck->c->route.renormalize) {
            for (int64_t j = 0; j < k; j++)
                out[t * k + j] += a * ds[t * E + ids[t * k + j]];
            continue;
        }
        /* w_j = a s_j / S: dw_j/ds_j = a (S - s_j) / S^2, dw_j/ds_i = -a s_j / S^2
         * (i != j), in magnitudes: dw_j <= a (|S - s_j| ds_j + s_j sum_{i != j} ds_i) / S^2
         * (zero for top-1, whose weight is exactly a) */
        const double S = sel_sum(ck, sc, ids, t);
        double dsum = 0.0;
        for (int64_t j = 0; j < k; j++)
            dsum += ds[t * E + ids[t * k + j]];
        if (!(S > 0.0))
            continue;
        for (int64_t j = 0; j < k; j++) {
            const double sj = sc[t * E + ids[t * k + j]], dj = ds[t * E + ids[t * k + j]];
            out[t * k + j] += a * (fabs(S - sj) * dj + fabs(sj) * (dsum - dj)) / (S * S);
        }
    }
    return 1;
}

/* The SwiGLU's gate and up values: the routed experts' or the shared ones'. */
static void swiglu_in(dl_value_t s, dl_value_t *g, dl_value_t *u, dl_value_t *dh)
{
    const int sh = s == DL_VALUE_SHARED_H_ACT || s == DL_VALUE_D_SHARED_H_GATE ||
                   s == DL_VALUE_D_SHARED_H_UP;
    *g = sh ? DL_VALUE_SHARED_H_GATE : DL_VALUE_H_GATE;
    *u = sh ? DL_VALUE_SHARED_H_UP : DL_VALUE_H_UP;
    *dh = sh ? DL_VALUE_D_SHARED_H_ACT : DL_VALUE_D_H_ACT;
}

#define RSSV(v) (warn == DL__TIER_STAT && !ck->coherent[v])

static int p_h_act(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    dl_value_t vg, vu, vd;
    swiglu_in(s, &vg, &vu, &vd);
    const double *dg = ck->delta[warn][vg], *du = ck->delta[warn][vu];
    const float *g = ck->eff[vg], *u = ck->eff[vu];
    if (!dg && !du)
        return 0;
    const int rg = RSSV(vg), ru = RSSV(vu);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < ck->numel[s]; i++) {
        const double sg = sig(g[i]), gi = g[i];
        /* h = silu(g) u: |silu'(g) u| dg + |silu(g)| du */
        const double a = dg ? fabs(sg * (1.0 + gi * (1.0 - sg)) * u[i]) * dg[i] : 0.0;
        const double b = du ? fabs(gi * sg) * du[i] : 0.0;
        out[i] += comb((rg ? 0.0 : a) + (ru ? 0.0 : b), (rg ? a * a : 0.0) + (ru ? b * b : 0.0));
    }
    return 1;
}

static int p_d_h_gu(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    dl_value_t vg, vu, vd;
    swiglu_in(s, &vg, &vu, &vd);
    const double *dg = ck->delta[warn][vg], *du = ck->delta[warn][vu], *dd = ck->delta[warn][vd];
    const float *g = ck->eff[vg], *u = ck->eff[vu], *dh = ck->eff[vd];
    const int gate = s == DL_VALUE_D_H_GATE || s == DL_VALUE_D_SHARED_H_GATE;
    if (!dg && !du && !dd)
        return 0;
    const int rg = RSSV(vg), ru = RSSV(vu), rd = RSSV(vd);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < ck->numel[s]; i++) {
        const double sg = sig(g[i]), gi = g[i], ui = u[i], hi = dh[i];
        const double d1 = sg * (1.0 + gi * (1.0 - sg));                 /* silu' */
        const double d2 = sg * (1.0 - sg) * (2.0 + gi * (1.0 - 2.0 * sg)); /* silu'' */
        double td, tu = 0.0, tg;
        if (gate) { /* dh u silu'(g) */
            td = dd ? fabs(ui * d1) * dd[i] : 0.0;
            tu = du ? fabs(hi * d1) * du[i] : 0.0;
            tg = dg ? fabs(hi * ui * d2) * dg[i] : 0.0;
        } else { /* dh silu(g) */
            td = dd ? fabs(gi * sg) * dd[i] : 0.0;
            tg = dg ? fabs(hi * d1) * dg[i] : 0.0;
        }
        out[i] += comb((rd ? 0.0 : td) + (ru ? 0.0 : tu) + (rg ? 0.0 : tg),
                       (rd ? td * td : 0.0) + (ru ? tu * tu : 0.0) + (rg ? tg * tg : 0.0));
    }
    return 1;
}

/* ------------------------------------------------- combine and its VJP */

/* The shared experts' term of out (g shared_y): |g| d_shared_y + |shared_y| d_g. */
static double shared_out_delta(const dl__ck_t *ck, int warn, int64_t t, int64_t i)
{
    const double *dy = DL(SHARED_Y), *dg = DL(SHARED_GATE);
    const float *y = EF(SHARED_Y), *g = EF(SHARED_GATE);
    const int gated = ck->c->shared_gate && g;
    return (dy ? (gated ? fabs((double)g[t]) : 1.0) * dy[t * ck->d + i] : 0.0) +
           (gated && dg ? dg[t] * fabs((double)y[t * ck->d + i]) : 0.0);
}

static int p_out(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *dy = DL(Y_SORTED), *dw = DL(TOPK_WEIGHTS);
    const float *y = EF(Y_SORTED), *w = EF(TOPK_WEIGHTS);
    const int32_t *inv = INV;
    const int64_t k = ck->k, d = ck->d;
    const int sh = DL(SHARED_Y) || DL(SHARED_GATE);
    if (!dy && !dw && !sh)
        return 0;
    const int ry = RSS(Y_SORTED), rw = RSS(TOPK_WEIGHTS);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < ck->T; t++)
        for (int64_t i = 0; i < d; i++) {
            double lin = 0.0, sq = 0.0; /* the slots' rows are distinct hidden values */
            for (int64_t j = 0; j < k; j++) {
                const int64_t q = inv[t * k + j];
                const double ty = fabs((double)w[t * k + j]) * (dy ? dy[q * d + i] : 0.0);
                const double tw = (dw ? dw[t * k + j] : 0.0) * fabs((double)y[q * d + i]);
                lin += (ry ? 0.0 : ty) + (rw ? 0.0 : tw);
                sq += (ry ? ty * ty : 0.0) + (rw ? tw * tw : 0.0);
            }
            const double ts = sh ? shared_out_delta(ck, warn, t, i) : 0.0;
            out[t * d + i] += comb(lin + (RSS(SHARED_Y) ? 0.0 : ts), sq + (RSS(SHARED_Y) ? ts * ts : 0.0));
        }
    return 1;
}

static int p_d_topk_weights(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *dy = DL(Y_SORTED);
    const int32_t *inv = INV;
    const int64_t k = ck->k, d = ck->d;
    if (!dy)
        return 0;
    const int ry = RSS(Y_SORTED);
#pragma omp parallel for schedule(static)
    for (int64_t fl = 0; fl < ck->M; fl++) {
        const float *g = ck->in->d_out + (fl / k) * d;
        const double *e = dy + (int64_t)inv[fl] * d;
        double a = 0.0;
        for (int64_t i = 0; i < d; i++)
            a += ry ? ((double)g[i] * e[i]) * ((double)g[i] * e[i]) : fabs((double)g[i]) * e[i];
        out[fl] += ry ? sqrt(a) : a;
    }
    return 1;
}

static int p_d_y_sorted(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *dw = DL(TOPK_WEIGHTS);
    const int32_t *inv = INV;
    const int64_t k = ck->k, d = ck->d;
    if (!dw)
        return 0;
#pragma omp parallel for schedule(static)
    for (int64_t fl = 0; fl < ck->M; fl++) {
        const float *g = ck->in->d_out + (fl / k) * d;
        const int64_t q = inv[fl];
        for (int64_t i = 0; i < d; i++)
            out[q * d + i] += dw[fl] * fabs((double)g[i]);
    }
    return 1;
}

/* ------------------------------------------------------ router backward */

static int p_d_router_scores(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *ddw = DL(D_TOPK_WEIGHTS), *dsc = DL(ROUTER_SCORES);
    const float *sc = EF(ROUTER_SCORES), *dw = EF(D_TOPK_WEIGHTS);
    const int32_t *ids = ck->eff[DL_VALUE_TOPK_IDS];
    const int64_t k = ck->k, E = ck->E;
    const double a = fabs(ck->c->route.scaling);
    if (!ddw && !dsc)
        return 0;
    for (int64_t t = 0; t < ck->T; t++) {
        const int32_t *id = ids + t * k;
        if (!ck->c->route.renormalize) { /* ds = a dw */
            for (int64_t j = 0; j < k; j++)
                out[t * E + id[j]] += ddw ? a * ddw[t * k + j] : 0.0;
            continue;
        }
        /* ds_j = a (dw_j / S - P / S^2), P = sum_i dw_i s_i */
        const double S = sel_sum(ck, sc, ids, t);
        if (!(S > 0.0))
            continue;
        double P = 0.0, pd = 0.0, sd = 0.0, wd = 0.0;
        for (int64_t i = 0; i < k; i++) {
            const double si = sc[t * E + id[i]], dwi = dw[t * k + i];
            P += dwi * si;
            pd += ddw ? fabs(si) * ddw[t * k + i] : 0.0; /* from the dw's */
            sd += dsc ? dsc[t * E + id[i]] : 0.0;
            wd += dsc ? fabs(dwi) * dsc[t * E + id[i]] : 0.0;
        }
        for (int64_t j = 0; j < k; j++) {
            const double dwj = fabs((double)dw[t * k + j]);
            double b = ddw ? ddw[t * k + j] / S + pd / (S * S) : 0.0;
            /* d/ds_m: -(dw_j + dw_m) / S^2 + 2 P / S^3 */
            b += (dwj * sd + wd) / (S * S) + 2.0 * fabs(P) * sd / (S * S * S);
            out[t * E + id[j]] += a * b;
        }
    }
    return 1;
}

static int p_d_router_logits(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *dds = DL(D_ROUTER_SCORES), *dsc = DL(ROUTER_SCORES);
    const float *sc = EF(ROUTER_SCORES), *ds = EF(D_ROUTER_SCORES);
    const int64_t E = ck->E;
    if (!dds && !dsc)
        return 0;
    for (int64_t t = 0; t < ck->T; t++) {
        const float *st = sc + t * E, *dt = ds + t * E;
        if (ck->c->route.score_fn != DL_SCORE_SOFTMAX) { /* dl = ds s (1 - s) */
            for (int64_t e = 0; e < E; e++)
                out[t * E + e] += (dds ? st[e] * (1.0 - st[e]) * dds[t * E + e] : 0.0) +
                                  (dsc ? fabs((double)dt[e] * (1.0 - 2.0 * st[e])) * dsc[t * E + e]
                                       : 0.0);
            continue;
        }
        /* dl_e = s_e (ds_e - sigma), sigma = sum_j s_j ds_j */
        double sigma = 0.0, a1 = 0.0, a2 = 0.0;
        for (int64_t j = 0; j < E; j++) {
            sigma += (double)st[j] * dt[j];
            a1 += dds ? st[j] * dds[t * E + j] : 0.0;
            a2 += dsc ? fabs((double)dt[j]) * dsc[t * E + j] : 0.0;
        }
        for (int64_t e = 0; e < E; e++)
            out[t * E + e] += st[e] * ((dds ? dds[t * E + e] : 0.0) + a1 + a2) +
                              (dsc ? fabs(dt[e] - sigma) * dsc[t * E + e] : 0.0);
    }
    return 1;
}

/* ------------------------------------------------------- shared experts */

/* g = sigmoid(l): g (1 - g) dl */
static int p_shared_gate(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *dl = DL(SHARED_GATE_LOGIT);
    const float *g = ck->exact[s];
    for (int64_t t = 0; dl && t < ck->T; t++)
        out[t] += (double)g[t] * (1.0 - (double)g[t]) * dl[t];
    return dl != NULL;
}

/* dg_t = <d_out[t], shared_y[t]>: sum_i |d_out| d_shared_y */
static int p_d_shared_gate(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *dy = DL(SHARED_Y);
    const int64_t d = ck->d;
    const int ry = RSS(SHARED_Y);
    for (int64_t t = 0; dy && t < ck->T; t++) {
        double a = 0.0;
        for (int64_t i = 0; i < d; i++) {
            const double v = fabs((double)ck->in->d_out[t * d + i]) * dy[t * d + i];
            a += ry ? v * v : v;
        }
        out[t] += ry ? sqrt(a) : a;
    }
    return dy != NULL;
}

/* dl = dg g (1 - g): g (1 - g) d_dg + |dg (1 - 2 g)| d_g */
static int p_d_shared_gate_logit(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *ddg = DL(D_SHARED_GATE), *dgt = DL(SHARED_GATE);
    const float *g = EF(SHARED_GATE), *dg = EF(D_SHARED_GATE);
    for (int64_t t = 0; (ddg || dgt) && t < ck->T; t++)
        out[t] += (ddg ? (double)g[t] * (1.0 - (double)g[t]) * ddg[t] : 0.0) +
                  (dgt ? fabs((double)dg[t] * (1.0 - 2.0 * (double)g[t])) * dgt[t] : 0.0);
    return ddg || dgt;
}

/* d_shared_y = g d_out: |d_out| d_g */
static int p_d_shared_y(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *dgt = ck->c->shared_gate ? DL(SHARED_GATE) : NULL;
    const int64_t d = ck->d;
    for (int64_t t = 0; dgt && t < ck->T; t++)
        for (int64_t i = 0; i < d; i++)
            out[t * d + i] += fabs((double)ck->in->d_out[t * d + i]) * dgt[t];
    return dgt != NULL;
}

/* The shared path's terms of d_x[t, i]: sum_c |Wsg[i,c]| d_dhg[t,c] +
 * |Wsu[i,c]| d_dhu[t,c] + |w_g[i]| d_dl[t], into *lin and *sq. */
static void shared_dx_delta(const dl__ck_t *ck, int warn, int64_t t, int64_t i, double *lin,
                            double *sq)
{
    const double *dhg = DL(D_SHARED_H_GATE), *dhu = DL(D_SHARED_H_UP);
    const double *dlg = ck->c->shared_gate ? DL(D_SHARED_GATE_LOGIT) : NULL;
    const int64_t F = dl_value_dim(ck->c, 'S');
    const int rg = RSS(D_SHARED_H_GATE), ru = RSS(D_SHARED_H_UP), rl = RSS(D_SHARED_GATE_LOGIT);
    for (int64_t c = 0; c < F; c++) {
        const double a = dhg ? fabs((double)ck->in->shared_w_gate[i * F + c]) * dhg[t * F + c] : 0.0;
        const double b = dhu ? fabs((double)ck->in->shared_w_up[i * F + c]) * dhu[t * F + c] : 0.0;
        *lin += (rg ? 0.0 : a) + (ru ? 0.0 : b);
        *sq += (rg ? a * a : 0.0) + (ru ? b * b : 0.0);
    }
    const double l = dlg ? fabs((double)ck->in->shared_gate_weight[i]) * dlg[t] : 0.0;
    *lin += rl ? 0.0 : l;
    *sq += rl ? l * l : 0.0;
}

static int p_d_x(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *dxs = DL(D_X_SORTED), *dlg = DL(D_ROUTER_LOGITS);
    const float *wr = ck->in->router_weight;
    const int32_t *inv = INV;
    const int64_t k = ck->k, d = ck->d, E = ck->E;
    const int sh = ck->c->shared_experts > 0 &&
                   (DL(D_SHARED_H_GATE) || DL(D_SHARED_H_UP) || DL(D_SHARED_GATE_LOGIT));
    if (!dxs && !dlg && !sh)
        return 0;
    const int rx = RSS(D_X_SORTED), rl = RSS(D_ROUTER_LOGITS);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < ck->T; t++)
        for (int64_t i = 0; i < d; i++) {
            double lin = 0.0, sq = 0.0;
            for (int64_t j = 0; dxs && j < k; j++) {
                const double a = dxs[(int64_t)inv[t * k + j] * d + i];
                lin += rx ? 0.0 : a;
                sq += rx ? a * a : 0.0;
            }
            for (int64_t e = 0; dlg && e < E; e++) {
                const double a = dlg[t * E + e] * fabs((double)wr[i * E + e]);
                lin += rl ? 0.0 : a;
                sq += rl ? a * a : 0.0;
            }
            if (sh)
                shared_dx_delta(ck, warn, t, i, &lin, &sq);
            out[t * d + i] += comb(lin, sq);
        }
    return 1;
}

#if DL_EXTRA_VALUE
/* y_half = y_sorted / 2: half of y_sorted's delta */
static int p_y_half(dl__ck_t *ck, dl_value_t s, int warn, double *out)
{
    const double *dy = DL(Y_SORTED);
    for (int64_t i = 0; dy && i < ck->numel[s]; i++)
        out[i] += 0.5 * dy[i];
    return dy != NULL;
}
#endif

/* ------------------------------------------------------------ the entry */

static int (*const elementwise[DL_VALUE_COUNT])(dl__ck_t *, dl_value_t, int, double *) = {
    [DL_VALUE_ROUTER_SCORES] = p_router_scores,
    [DL_VALUE_TOPK_WEIGHTS] = p_topk_weights,
    [DL_VALUE_H_ACT] = p_h_act,
#if DL_EXTRA_VALUE
    [DL_VALUE_Y_HALF] = p_y_half,
#endif
    [DL_VALUE_OUT] = p_out,
    [DL_VALUE_D_TOPK_WEIGHTS] = p_d_topk_weights,
    [DL_VALUE_D_Y_SORTED] = p_d_y_sorted,
    [DL_VALUE_D_H_GATE] = p_d_h_gu,
    [DL_VALUE_D_H_UP] = p_d_h_gu,
    [DL_VALUE_D_ROUTER_SCORES] = p_d_router_scores,
    [DL_VALUE_D_ROUTER_LOGITS] = p_d_router_logits,
    [DL_VALUE_SHARED_H_ACT] = p_h_act,
    [DL_VALUE_SHARED_GATE] = p_shared_gate,
    [DL_VALUE_D_SHARED_GATE] = p_d_shared_gate,
    [DL_VALUE_D_SHARED_GATE_LOGIT] = p_d_shared_gate_logit,
    [DL_VALUE_D_SHARED_Y] = p_d_shared_y,
    [DL_VALUE_D_SHARED_H_GATE] = p_d_h_gu,
    [DL_VALUE_D_SHARED_H_UP] = p_d_h_gu,
    [DL_VALUE_D_X] = p_d_x,
};

int dl__ck_propagate(dl__ck_t *ck, dl_value_t s, const dl__cmp_t *cmp, int warn, double **out)
{
    *out = NULL;
    const uint64_t up = dl__ck_upstream(ck, s);
    int has = 0;
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        has |= ((up >> u) & 1) && ck->delta[warn][u] != NULL;
    if (!has)
        return 0;
    const int64_t n = ck->numel[s];
    double *p = dl__ck_alloc(ck, n, sizeof *p); /* zeroed */
    if (!p)
        return DL_ENOMEM;
    int any = 0, rc = 0;
    if (elementwise[s])
        any = elementwise[s](ck, s, warn, p);
    else if (cmp->mp && (cmp->mp->kind == DL__M_GROUPED || cmp->mp->kind == DL__M_RAGGED))
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
