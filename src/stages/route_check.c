/* The checking side of the routing stages (route.c): the router GEMM, the
 * score function, the routing weights and their backward. Their exact
 * values on the runner's effective operands (the selection itself is
 * judged by the runner's routing check), the magnitudes M of their
 * rounding, and the derivative magnitudes that carry an absent upstream's
 * error into them (doc/tolerances.md, "Absent stages"):
 *   softmax: ds_e = s_e (dl_e - sum_j s_j dl_j),  sigmoid: ds = s (1 - s) dl,
 *   w_j = a s_j / S (renormalised, S = sum of the selected scores) or a s_j. */
#include "config.h"
#include <string.h>
#include "stages/stages_priv.h"

#define EF(s) DL__EF(v, s)

/* A GEMM over all T rows as one group (the router's). */
static int64_t *all_rows(const dl__vctx_t *v)
{
    int64_t *o = v->alloc(v->actx, 2, sizeof *o);
    if (o)
        o[1] = v->T;
    return o;
}

/* ------------------------------------------------------ router forward */

int dl__exact_router_logits(const dl__vctx_t *v, float *out)
{
    const int64_t all[2] = {0, v->T};
    return dl__exact_grouped1(v->in->x, v->d, v->in->router_weight, DL_RHS_KN, v->E, all, 1,
                              DL_F32, out);
}

int dl__mag_router_logits(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    int64_t *o = all_rows(v);
    if (!o)
        return DL_ENOMEM;
    *m->mp = (dl__mprov_t){.kind = DL__M_GROUPED, .nterms = 1, .N = v->E, .off = o, .E = 1};
    m->mp->terms[0] = (dl_gemm_term_t){v->in->x, v->d, v->in->router_weight, DL_RHS_KN};
    m->K = v->d;
    m->nops = 2;
    m->op[0] = v->act;
    m->op[1] = DL_F32;
    return 0;
}

int dl__exact_router_scores(const dl__vctx_t *v, float *out)
{
    return dl_route_scores(&v->c->route, EF(ROUTER_LOGITS), v->T, out);
}

void dl__route_score_m_row(const dl_route_config_t *c, int64_t E, const float *l, const float *s,
                           double *mx, double *zs)
{
    *mx = -INFINITY;
    *zs = 0.0;
    if (c->score_fn != DL_SCORE_SOFTMAX)
        return;
    for (int64_t j = 0; j < E; j++)
        if (l[j] > *mx)
            *mx = l[j];
    for (int64_t j = 0; j < E; j++)
        *zs += fabs((double)s[j]) * fabs((double)l[j] - *mx);
}

double dl__route_score_m(const dl_route_config_t *c, const float *l, const float *s, int64_t e,
                         double mx, double zs)
{
    /* sigmoid, 1/(1+exp(-l)): exp, add, divide, each relative to s;
     * softmax, s_e = exp(z_e) / sum_j exp(z_j), z = l - max l: a rounded
     * z_e carries |z_e| u into exp, and the sum carries its terms' */
    double M = fabs((double)s[e]);
    if (c->score_fn == DL_SCORE_SOFTMAX)
        M *= 1.0 + fabs((double)l[e] - mx) + zs;
    return M;
}

int dl__mag_router_scores(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    const float *logits = EF(ROUTER_LOGITS);
    const int64_t E = v->E;
    const dl_route_config_t *rc = &v->c->route;
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < v->T; t++) {
        const float *l = logits + t * E, *s = g + t * E;
        double mx, zs;
        dl__route_score_m_row(rc, E, l, s, &mx, &zs);
        for (int64_t e = 0; e < E; e++)
            a[t * E + e] = dl__route_score_m(rc, l, s, e, mx, zs);
    }
    m->elem = 1;
    m->K = rc->score_fn == DL_SCORE_SOFTMAX ? E : 0;
    return 0;
}

void dl__route_score_prop_row(const dl_route_config_t *c, int64_t E, const float *s,
                              const double *dl, double *out)
{
    double sum = 0.0; /* softmax: ds_e <= s_e (dl_e + sum_j s_j dl_j) */
    for (int64_t e = 0; e < E; e++)
        sum += fabs((double)s[e]) * dl[e];
    for (int64_t e = 0; e < E; e++) {
        const double se = fabs((double)s[e]);
        out[e] = c->score_fn == DL_SCORE_SOFTMAX ? se * (dl[e] + sum) : se * (1.0 - se) * dl[e];
    }
}

int dl__prop_router_scores(const dl__vctx_t *v, const float *sc, int64_t n, double *out)
{
    const double *dl = DL__DL(v, ROUTER_LOGITS);
    const int64_t E = v->E;
    double *row = dl ? v->alloc(v->actx, E, sizeof *row) : NULL;
    if (!row)
        return 0;
    for (int64_t t = 0; t < v->T; t++) {
        dl__route_score_prop_row(&v->c->route, E, sc + t * E, dl + t * E, row);
        for (int64_t e = 0; e < E; e++)
            out[t * E + e] += row[e];
    }
    return 1;
}

/* ------------------------------------------------------------- weights */

int dl__exact_topk_weights(const dl__vctx_t *v, float *out)
{
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS];
    const int64_t k = v->k;
    for (int64_t t = 0; t < v->T; t++) {
        if (!memcmp(ids + t * k, v->sel_ids + t * k, (size_t)k * sizeof *ids))
            memcpy(out + t * k, v->sel_weights + t * k, (size_t)k * sizeof *out);
        else if (dl_route_weights(&v->c->route, EF(ROUTER_SCORES) + t * v->E, ids + t * k,
                                  out + t * k))
            for (int64_t j = 0; j < k; j++) /* 0/0: no weight exists to compare with */
                out[t * k + j] = NAN;
    }
    return 0;
}

int dl__mag_topk_weights(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    m->mp = NULL;
    m->K = v->c->route.renormalize ? v->k + 1 : 1; /* the sum S, the quotient, scaling */
    return 0;
}

/* The renormalised selection's sum S of one token. */
static double sel_sum(const dl__vctx_t *v, const float *sc, const int32_t *ids, int64_t t)
{
    double S = 0.0;
    for (int64_t j = 0; j < v->k; j++)
        S += sc[t * v->E + ids[t * v->k + j]];
    return S;
}

int dl__prop_topk_weights(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const double *ds = DL__DL(v, ROUTER_SCORES);
    const float *sc = EF(ROUTER_SCORES);
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS];
    const int64_t k = v->k, E = v->E;
    const double a = fabs(v->c->route.scaling);
    if (!ds)
        return 0;
    for (int64_t t = 0; t < v->T; t++) {
        if (!v->c->route.renormalize) {
            for (int64_t j = 0; j < k; j++)
                out[t * k + j] += a * ds[t * E + ids[t * k + j]];
            continue;
        }
        /* w_j = a s_j / S: dw_j/ds_j = a (S - s_j) / S^2, dw_j/ds_i = -a s_j / S^2
         * (i != j), in magnitudes: dw_j <= a (|S - s_j| ds_j + s_j sum_{i != j} ds_i) / S^2
         * (zero for top-1, whose weight is exactly a) */
        const double S = sel_sum(v, sc, ids, t);
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

/* ----------------------------------------------------- router backward */

int dl__exact_d_router_scores(const dl__vctx_t *v, float *out)
{
    return dl_route_backward(&v->c->route, EF(ROUTER_SCORES), v->v[DL_VALUE_TOPK_IDS],
                             EF(D_TOPK_WEIGHTS), v->T, out, NULL);
}

int dl__mag_d_router_scores(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    const dl_route_config_t *rc = &v->c->route;
    const float *scores = EF(ROUTER_SCORES), *d_w = EF(D_TOPK_WEIGHTS);
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS];
    const int64_t E = v->E, k = v->k;
    const double sc = fabs(rc->scaling);
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < v->T; t++) {
        double *mt = a + t * E;
        double S = 0.0, cross = 0.0;
        for (int64_t j = 0; j < k; j++) {
            double s = scores[t * E + ids[t * k + j]];
            S += s;
            cross += fabs((double)d_w[t * k + j]) * s;
        }
        for (int64_t j = 0; j < k; j++) {
            double dw = fabs((double)d_w[t * k + j]);
            mt[ids[t * k + j]] = rc->renormalize && S > 0.0 ? sc * (dw / S + cross / (S * S))
                                                            : sc * dw;
        }
    }
    /* the longest chain of roundings: sum_j dw_j s_j (k), S^2 (2k-1), the
     * quotient and the difference */
    m->K = rc->renormalize ? 3 * k + 1 : 1;
    return 0;
}

int dl__prop_d_router_scores(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const double *ddw = DL__DL(v, D_TOPK_WEIGHTS), *dsc = DL__DL(v, ROUTER_SCORES);
    const float *sc = EF(ROUTER_SCORES), *dw = EF(D_TOPK_WEIGHTS);
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS];
    const int64_t k = v->k, E = v->E;
    const double a = fabs(v->c->route.scaling);
    if (!ddw && !dsc)
        return 0;
    for (int64_t t = 0; t < v->T; t++) {
        const int32_t *id = ids + t * k;
        if (!v->c->route.renormalize) { /* ds = a dw */
            for (int64_t j = 0; j < k; j++)
                out[t * E + id[j]] += ddw ? a * ddw[t * k + j] : 0.0;
            continue;
        }
        /* ds_j = a (dw_j / S - P / S^2), P = sum_i dw_i s_i */
        const double S = sel_sum(v, sc, ids, t);
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

int dl__exact_d_router_logits(const dl__vctx_t *v, float *out)
{
    return dl_route_scores_backward(&v->c->route, EF(ROUTER_SCORES), EF(D_ROUTER_SCORES), v->T,
                                    out);
}

int dl__mag_d_router_logits(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    const float *scores = EF(ROUTER_SCORES), *d_scores = EF(D_ROUTER_SCORES);
    const int64_t E = v->E;
    const int softmax = v->c->route.score_fn == DL_SCORE_SOFTMAX;
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < v->T; t++) {
        const float *s = scores + t * E, *ds = d_scores + t * E;
        double asig = 0.0;
        for (int64_t j = 0; softmax && j < E; j++)
            asig += fabs((double)s[j] * (double)ds[j]);
        for (int64_t e = 0; e < E; e++)
            a[t * E + e] = softmax ? fabs((double)s[e]) * (fabs((double)ds[e]) + asig)
                                   : fabs((double)ds[e] * (double)s[e]) * (1.0 + fabs((double)s[e]));
    }
    /* softmax: sigma = sum of E products (E), the difference, the product;
     * sigmoid: 1 - s, two products */
    m->K = softmax ? E + 2 : 3;
    return 0;
}

int dl__prop_d_router_logits(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const double *dds = DL__DL(v, D_ROUTER_SCORES), *dsc = DL__DL(v, ROUTER_SCORES);
    const float *sc = EF(ROUTER_SCORES), *ds = EF(D_ROUTER_SCORES);
    const int64_t E = v->E;
    if (!dds && !dsc)
        return 0;
    for (int64_t t = 0; t < v->T; t++) {
        const float *st = sc + t * E, *dt = ds + t * E;
        if (v->c->route.score_fn != DL_SCORE_SOFTMAX) { /* dl = ds s (1 - s) */
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

int dl__exact_d_router_weight(const dl__vctx_t *v, float *out)
{
    const int64_t all[2] = {0, v->T};
    return dl_gemm_ragged_k(v->in->x, v->d, EF(D_ROUTER_LOGITS), v->E, all, 1, DL_F32, out,
                            NULL);
}

int dl__mag_d_router_weight(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    int64_t *o = all_rows(v);
    if (!o)
        return DL_ENOMEM;
    *m->mp = (dl__mprov_t){.kind = DL__M_RAGGED, .a = v->in->x, .I = v->d,
                           .b = EF(D_ROUTER_LOGITS), .N = v->E, .off = o, .E = 1};
    m->rows = v->d;
    m->cols = v->E;
    m->K = v->T;
    m->nops = 2;
    m->op[0] = v->act;
    m->op[1] = DL_F32;
    return 0;
}
