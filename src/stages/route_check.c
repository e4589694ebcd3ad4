/* The checking side of the routing stages (route.c): the router GEMM, the
 * score function, the routing weights and their backward. Their exact
 * values on the runner's effective operands (the selection itself is
 * judged by the runner's routing check), the magnitudes M of their
 * rounding, and the derivative magnitudes that carry an absent upstream's
 * error into them (doc/tolerances.md, "Absent stages"):
 *   softmax: ds_e = s_e (dl_e - sum_j s_j dl_j),  sigmoid: ds = s (1 - s) dl,
 *   w_j = a s_j / S (renormalised, S = sum of the selected scores) or a s_j;
 *   the elementwise scores (sigmoid, sqrtsoftplus, softmax_topk's identity):
 *   ds = g(s) dl, g the stage's dl_route_score_slope;
 *   softmax over the top-k logits: w_j = a p_j, p the softmax of the k
 *   selected logits. */
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

/* The router-logit bias, NULL without one. */
static const float *router_bias(const dl__vctx_t *v)
{
    return v->c->route.has_router_bias ? v->in->router_bias : NULL;
}

/* T ones: the router bias as one more GEMM term (its M provider's). */
static const float *ones_T(const dl__vctx_t *v)
{
    float *o = v->alloc(v->actx, v->T > 0 ? v->T : 1, sizeof *o);
    for (int64_t i = 0; o && i < v->T; i++)
        o[i] = 1.0f;
    return o;
}

/* ------------------------------------------------------ router forward */

int dl__exact_router_logits(const dl__vctx_t *v, float *out)
{
    return dl_route_logits(v->in->x, v->T, v->d, v->in->router_weight, router_bias(v), DL__RW(v), out,
                           NULL);
}

int dl__mag_router_logits(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    int64_t *o = all_rows(v);
    if (!o)
        return DL_ENOMEM;
    *m->mp = (dl__mprov_t){.kind = DL__M_GROUPED, .nterms = 1, .N = DL__RW(v), .off = o, .E = 1};
    m->mp->terms[0] = (dl_gemm_term_t){v->in->x, v->d, v->in->router_weight, DL_RHS_KN};
    m->K = v->d;
    m->nops = 2;
    m->op[0] = v->act;
    m->op[1] = DL_F32;
    if (router_bias(v)) { /* + 1 b: one more term of the sum */
        const float *one = ones_T(v);
        if (!one)
            return DL_ENOMEM;
        m->mp->terms[m->mp->nterms++] = (dl_gemm_term_t){one, 1, router_bias(v), DL_RHS_KN};
        m->K = dl__route_logit_k(v->c);
    }
    return 0;
}

double dl__route_logit_m(const dl_moe_config_t *c, const dl_moe_inputs_t *in, int64_t t,
                         int64_t e)
{
    const int64_t d = c->hidden, E = DL_ROUTE_WIDTH(&c->route);
    double m = 0.0;
    for (int64_t i = 0; i < d; i++)
        m += fabs((double)in->x[t * d + i]) * fabs((double)in->router_weight[i * E + e]);
    if (c->route.has_router_bias && in->router_bias) /* + 1 b, one more term */
        m += fabs((double)in->router_bias[e]);
    return m;
}

int64_t dl__route_logit_k(const dl_moe_config_t *c)
{
    return c->hidden + (c->route.has_router_bias ? 1 : 0);
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
    const int64_t E = DL__RW(v);
    const dl_route_config_t *rc = &v->c->route;
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < v->T; t++) {
        const float *l = logits + t * E, *s = g + t * E;
        double mx, zs;
        dl__route_score_m_row(rc, E, l, s, &mx, &zs);
        for (int64_t e = 0; e < E; e++)
            a[t * E + e] = dl__route_score_m(rc, l, s, e, mx, zs);
    });
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
    for (int64_t e = 0; e < E; e++) { /* elementwise: ds_e <= |g(s_e)| dl_e */
        const double se = fabs((double)s[e]);
        out[e] = c->score_fn == DL_SCORE_SOFTMAX ? se * (dl[e] + sum)
                                                 : dl_route_score_slope(c, s[e]) * dl[e];
    }
}

int dl__prop_router_scores(const dl__vctx_t *v, const float *sc, int64_t n, double *out)
{
    const float *dl = DL__DL(v, ROUTER_LOGITS);
    const int64_t E = DL__RW(v);
    double *row = dl ? v->alloc(v->actx, 2 * E, sizeof *row) : NULL, *dr = row ? row + E : NULL;
    if (!row)
        return 0;
    for (int64_t t = 0; t < v->T; t++) {
        for (int64_t e = 0; e < E; e++) /* the binary32 deltas widened (exact) */
            dr[e] = dl[t * E + e];
        dl__route_score_prop_row(&v->c->route, E, sc + t * E, dr, row);
        for (int64_t e = 0; e < E; e++)
            out[t * E + e] += row[e];
    }
    return 1;
}

/* ------------------------------------------------------------- weights */

/* Softmax over the top-k logits (DL_SCORE_SOFTMAX_TOPK): the exact rule's
 * probabilities p[j] of one token's selection (binary64: magnitudes only),
 * its largest selected score *mx and *zs = sum_j p_j |s_j - mx|, the terms
 * of a rounded softmax's error (as the full softmax's dl__route_score_m). */
static void stk_probs(const float *s, const int32_t *id, int64_t k, double *p, double *mx,
                      double *zs)
{
    double S = 0.0;
    *mx = -INFINITY;
    *zs = 0.0;
    for (int64_t j = 0; j < k; j++)
        *mx = fmax(*mx, (double)s[id[j]]);
    for (int64_t j = 0; j < k; j++)
        S += p[j] = exp((double)s[id[j]] - *mx);
    for (int64_t j = 0; j < k; j++) {
        p[j] /= S;
        *zs += p[j] * fabs((double)s[id[j]] - *mx);
    }
}

/* The first-order error the absent scores (dl [E]) and d_weights (ddw [k])
 * carry into one token's weights (dw_out [k], dw NULL) and d_scores
 * (ds_out [E], dw its d_weights); any of dl, ddw, dw_out, ds_out NULL. */
static void stk_prop(const dl_route_config_t *rc, const float *s, const int32_t *id,
                     const float *dw, const float *dl, const float *ddw, double *dw_out,
                     double *ds_out)
{
    const int64_t k = rc->top_k;
    const double c = fabs(rc->scaling);
    double p[DL__MAX_TOPK], mx, zs, mu = 0.0, pl = 0.0, pdd = 0.0, pr = 0.0;
    stk_probs(s, id, k, p, &mx, &zs);
    for (int64_t i = 0; i < k; i++) {
        mu += p[i] * (dw ? dw[i] : 0.0);
        pl += dl ? p[i] * dl[id[i]] : 0.0;
        pdd += ddw ? p[i] * ddw[i] : 0.0;
    }
    for (int64_t i = 0; dw && i < k; i++)
        pr += p[i] * fabs(dw[i] - mu) * (dl ? dl[id[i]] : 0.0);
    for (int64_t j = 0; j < k; j++) {
        const double dlj = dl ? dl[id[j]] : 0.0;
        /* w_j = c p_j: dw_j <= c p_j (dl_j + sum_i p_i dl_i) */
        if (dw_out)
            dw_out[j] += c * p[j] * (dlj + pl);
        /* ds_j = c p_j (dw_j - mu): from the d_weights c p_j (ddw_j + sum
         * p ddw), from the scores c p_j (|dw_j - mu| (dl_j + sum p dl)
         * + sum_i p_i |dw_i - mu| dl_i) */
        if (ds_out)
            ds_out[id[j]] += c * p[j] * ((ddw ? ddw[j] : 0.0) + pdd +
                                         (dw ? fabs(dw[j] - mu) : 0.0) * (dlj + pl) + pr);
    }
}

/* M of softmax_topk's weights [T, k] (c p_j, k exps, their sum, a quotient). */
static int stk_weights_m(const dl__vctx_t *v, int64_t n, dl__mag_t *m)
{
    const float *sc = EF(ROUTER_SCORES);
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS];
    const int64_t E = DL__RW(v), k = v->k;
    const double c = fabs(v->c->route.scaling);
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < v->T; t++) {
        double p[DL__MAX_TOPK], mx, zs;
        stk_probs(sc + t * E, ids + t * k, k, p, &mx, &zs);
        for (int64_t j = 0; j < k; j++)
            a[t * k + j] = c * p[j] * (1.0 + fabs((double)sc[t * E + ids[t * k + j]] - mx) + zs);
    });
    m->K = k + 2;
    return 0;
}

int dl__exact_topk_weights(const dl__vctx_t *v, float *out)
{
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS];
    const int64_t k = v->k;
    for (int64_t t = 0; t < v->T; t++) {
        if (!memcmp(ids + t * k, v->sel_ids + t * k, (size_t)k * sizeof *ids))
            memcpy(out + t * k, v->sel_weights + t * k, (size_t)k * sizeof *out);
        else if (dl_route_weights(&v->c->route, EF(ROUTER_SCORES) + t * DL__RW(v), ids + t * k,
                                  out + t * k))
            for (int64_t j = 0; j < k; j++) /* 0/0: no weight exists to compare with */
                out[t * k + j] = NAN;
    }
    return 0;
}

int dl__mag_topk_weights(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    if (v->c->route.score_fn == DL_SCORE_SOFTMAX_TOPK)
        return stk_weights_m(v, n, m);
    m->mp = NULL;
    m->K = v->c->route.renormalize ? v->k + 1 : 1; /* the sum S, the quotient, scaling */
    return 0;
}

/* The renormalised selection's sum S of one token. */
static double sel_sum(const dl__vctx_t *v, const float *sc, const int32_t *ids, int64_t t)
{
    double S = 0.0;
    for (int64_t j = 0; j < v->k; j++)
        S += sc[t * DL__RW(v) + ids[t * v->k + j]];
    return S;
}

int dl__prop_topk_weights(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *ds = DL__DL(v, ROUTER_SCORES);
    const float *sc = EF(ROUTER_SCORES);
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS];
    const int64_t k = v->k, E = DL__RW(v);
    const double a = fabs(v->c->route.scaling);
    if (!ds || v->c->route.weight_on_input) /* Llama-4's combine weights are constant */
        return 0;
    for (int64_t t = 0; t < v->T; t++) {
        if (v->c->route.score_fn == DL_SCORE_SOFTMAX_TOPK) {
            stk_prop(&v->c->route, sc + t * E, ids + t * k, NULL, ds + t * E, NULL, out + t * k,
                     NULL);
            continue;
        }
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

const float *dl__route_input_w(const dl__vctx_t *v)
{
    float *w = v->alloc(v->actx, v->T * v->k, sizeof *w);
    if (!w || dl_route_input_weights(&v->c->route, EF(ROUTER_SCORES), v->v[DL_VALUE_TOPK_IDS],
                                     v->T, w))
        return NULL;
    return w;
}

/* Llama-4's d_scores: the dot of the routed input's gradient with the token. */
static int input_d_scores_m(const dl__vctx_t *v, int64_t n, dl__mag_t *m)
{
    const float *dxs = EF(D_X_SORTED), *x = v->in->x;
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS], *inv = v->v[DL_VALUE_INV_PERM];
    const int64_t E = DL__RW(v), k = v->k, d = v->d;
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < v->T; t++)
        for (int64_t j = 0; j < k; j++) {
            double s = 0.0;
            for (int64_t i = 0; i < d; i++)
                s += fabs((double)dxs[(int64_t)inv[t * k + j] * d + i] * (double)x[t * d + i]);
            a[t * E + ids[t * k + j]] = s;
        }
    m->K = d;);
    m->prod_store = 1; /* autograd's (d_routed_in * x).sum(-1) */
    m->nops = 2;
    m->op[0] = m->op[1] = v->act;
    return 0;
}

static int input_d_scores_prop(const dl__vctx_t *v, double *out)
{
    const float *dd = DL__DL(v, D_X_SORTED);
    const float *x = v->in->x;
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS], *inv = v->v[DL_VALUE_INV_PERM];
    const int64_t E = DL__RW(v), k = v->k, d = v->d;
    const int rss = DL__RSS(v, D_X_SORTED);
    if (!dd)
        return 0;
    DL__PAR_FOR(v->T * k * d > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < v->T; t++)
        for (int64_t j = 0; j < k; j++) {
            double lin = 0.0, sq = 0.0;
            for (int64_t i = 0; i < d; i++) {
                const double a = dd[(int64_t)inv[t * k + j] * d + i] * fabs((double)x[t * d + i]);
                lin += rss ? 0.0 : a;
                sq += rss ? a * a : 0.0;
            }
            out[t * E + ids[t * k + j]] += dl__comb(lin, sq);
        }
    return 1;);
}

int dl__exact_d_router_scores(const dl__vctx_t *v, float *out)
{
    if (v->c->route.weight_on_input)
        return dl_route_input_backward(&v->c->route, v->in->x, v->d, EF(D_X_SORTED),
                                       v->v[DL_VALUE_INV_PERM], EF(ROUTER_SCORES),
                                       v->v[DL_VALUE_TOPK_IDS], v->T, out, NULL);
    return dl_route_backward(&v->c->route, EF(ROUTER_SCORES), v->v[DL_VALUE_TOPK_IDS],
                             EF(D_TOPK_WEIGHTS), v->T, out, NULL);
}

int dl__mag_d_router_scores(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    const dl_route_config_t *rc = &v->c->route;
    const float *scores = EF(ROUTER_SCORES), *d_w = EF(D_TOPK_WEIGHTS);
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS];
    const int64_t E = DL__RW(v), k = v->k;
    const double sc = fabs(rc->scaling);
    if (rc->weight_on_input)
        return input_d_scores_m(v, n, m);
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    const int stk = rc->score_fn == DL_SCORE_SOFTMAX_TOPK;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < v->T; t++) {
        double *mt = a + t * E;
        if (stk) { /* c p_j (dw_j - sum p dw): p_j as a rounded softmax, the sum's terms */
            double p[DL__MAX_TOPK], mx, zs, pa = 0.0;
            stk_probs(scores + t * E, ids + t * k, k, p, &mx, &zs);
            for (int64_t j = 0; j < k; j++)
                pa += p[j] * fabs((double)d_w[t * k + j]);
            for (int64_t j = 0; j < k; j++) {
                const double lj = scores[t * E + ids[t * k + j]];
                mt[ids[t * k + j]] = sc * p[j] * (fabs((double)d_w[t * k + j]) + pa) *
                                     (1.0 + fabs(lj - mx) + zs);
            }
            continue;
        }
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
    });
    /* the longest chain of roundings: sum_j dw_j s_j (k), S^2 (2k-1), the
     * quotient and the difference */
    m->K = stk ? 2 * k + 3 : rc->renormalize ? 3 * k + 1 : 1;
    /* softmax_topk: autograd's softmax VJP reads its saved output p stored
     * in the case's type (PyTorch's _softmax_backward_data(grad, p), gpt-oss
     * in bf16): each p_i off by u_act p_i moves c p_j (dw_j - sum p dw) by at
     * most u_act c p_j (|dw_j - mu| + sum_i p_i |dw_i|) <= u_act M, the
     * -acc profiles' one rounding per stored part of a dot (tolerances.md) */
    m->prod_store = stk;
    return 0;
}

int dl__prop_d_router_scores(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *ddw = DL__DL(v, D_TOPK_WEIGHTS), *dsc = DL__DL(v, ROUTER_SCORES);
    const float *sc = EF(ROUTER_SCORES), *dw = EF(D_TOPK_WEIGHTS);
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS];
    const int64_t k = v->k, E = DL__RW(v);
    const double a = fabs(v->c->route.scaling);
    if (v->c->route.weight_on_input) /* the weights are constant; the input carries it */
        return input_d_scores_prop(v, out);
    if (!ddw && !dsc)
        return 0;
    for (int64_t t = 0; t < v->T; t++) {
        const int32_t *id = ids + t * k;
        if (v->c->route.score_fn == DL_SCORE_SOFTMAX_TOPK) {
            stk_prop(&v->c->route, sc + t * E, id, dw + t * k, dsc ? dsc + t * E : NULL,
                     ddw ? ddw + t * k : NULL, NULL, out + t * E);
            continue;
        }
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
    const int64_t E = DL__RW(v);
    const int softmax = v->c->route.score_fn == DL_SCORE_SOFTMAX;
    const int sigmoid = v->c->route.score_fn == DL_SCORE_SIGMOID;
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < v->T; t++) {
        const float *s = scores + t * E, *ds = d_scores + t * E;
        double asig = 0.0;
        for (int64_t j = 0; softmax && j < E; j++)
            asig += fabs((double)s[j] * (double)ds[j]);
        for (int64_t e = 0; e < E; e++)
            a[t * E + e] = softmax ? fabs((double)s[e]) * (fabs((double)ds[e]) + asig)
                           : sigmoid ? fabs((double)ds[e] * (double)s[e]) * (1.0 + fabs((double)s[e]))
                                     : fabs((double)ds[e]) * dl_route_score_slope(&v->c->route, s[e]);
    });
    /* softmax: sigma = sum of E products (E), the difference, the product;
     * sigmoid: 1 - s, two products */
    m->K = softmax ? E + 2 : 3;
    return 0;
}

int dl__prop_d_router_logits(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *dds = DL__DL(v, D_ROUTER_SCORES), *dsc = DL__DL(v, ROUTER_SCORES);
    const float *sc = EF(ROUTER_SCORES), *ds = EF(D_ROUTER_SCORES);
    const int64_t E = DL__RW(v);
    if (!dds && !dsc)
        return 0;
    for (int64_t t = 0; t < v->T; t++) {
        const float *st = sc + t * E, *dt = ds + t * E;
        if (v->c->route.score_fn != DL_SCORE_SOFTMAX &&
            v->c->route.score_fn != DL_SCORE_SIGMOID) { /* dl = ds g(s): slope, curvature */
            for (int64_t e = 0; e < E; e++)
                out[t * E + e] +=
                    (dds ? dl_route_score_slope(&v->c->route, st[e]) * dds[t * E + e] : 0.0) +
                    (dsc ? fabs((double)dt[e]) * dl_route_score_curvature(&v->c->route, st[e]) *
                               dsc[t * E + e]
                         : 0.0);
            continue;
        }
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
    return dl_gemm_ragged_k(v->in->x, v->d, EF(D_ROUTER_LOGITS), DL__RW(v), all, 1, DL_F32, out,
                            NULL);
}

int dl__mag_d_router_weight(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    int64_t *o = all_rows(v);
    if (!o)
        return DL_ENOMEM;
    *m->mp = (dl__mprov_t){.kind = DL__M_RAGGED, .a = v->in->x, .I = v->d,
                           .b = EF(D_ROUTER_LOGITS), .N = DL__RW(v), .off = o, .E = 1};
    m->rows = v->d;
    m->cols = DL__RW(v);
    m->K = v->T;
    m->nops = 2;
    m->op[0] = v->act;
    m->op[1] = DL_F32;
    return 0;
}

/* The router bias's gradient, 1^T d_logits: the ragged-K GEMM of a column of ones. */
int dl__exact_d_router_bias(const dl__vctx_t *v, float *out)
{
    return dl_route_bias_backward(EF(D_ROUTER_LOGITS), v->T, DL__RW(v), out, NULL);
}

int dl__mag_d_router_bias(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    int64_t *o = all_rows(v);
    const float *one = ones_T(v);
    if (!o || !one)
        return DL_ENOMEM;
    *m->mp = (dl__mprov_t){.kind = DL__M_RAGGED, .a = one, .I = 1, .b = EF(D_ROUTER_LOGITS),
                           .N = DL__RW(v), .off = o, .E = 1};
    m->rows = 1;
    m->cols = DL__RW(v);
    m->K = v->T;
    m->nops = 2;
    m->op[0] = DL_F32;
    m->op[1] = DL_F32;
    return 0;
}
