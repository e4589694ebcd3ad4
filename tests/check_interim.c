/* INTERIM, test-only: stand-ins for the routing/activation stages and the
 * layer glue until route.c and moe.c are built on main. Binary64 evaluation
 * rounded once: deterministic but not certified. Delete when main links. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dropless.h"

int dl_route_config_validate(const dl_route_config_t *c)
{
    if (!c || c->experts < 1 || c->top_k < 1 || c->top_k > c->experts || c->n_group != 1 ||
        c->topk_group != 1 || !(c->scaling > 0))
        return DL_EINVAL;
    return 0;
}

int dl_route_scores(const dl_route_config_t *c, const float *l, int64_t T, float *s)
{
    const int64_t E = c->experts;
    for (int64_t i = 0; i < T * E; i++)
        if (!isfinite(l[i]))
            return DL_ENONFINITE;
    for (int64_t t = 0; t < T; t++) {
        if (c->score_fn == DL_SCORE_SIGMOID) {
            for (int64_t e = 0; e < E; e++)
                s[t * E + e] = (float)(1.0 / (1.0 + exp(-(double)l[t * E + e])));
            continue;
        }
        double mx = -INFINITY, sum = 0.0;
        for (int64_t e = 0; e < E; e++)
            mx = fmax(mx, l[t * E + e]);
        for (int64_t e = 0; e < E; e++)
            sum += exp((double)l[t * E + e] - mx);
        for (int64_t e = 0; e < E; e++)
            s[t * E + e] = (float)(exp((double)l[t * E + e] - mx) / sum);
    }
    return 0;
}

int dl_route_topk(const dl_route_config_t *c, const float *scores, const float *bias, int64_t T,
                  int32_t *ids, float *w, float *margin)
{
    const int64_t E = c->experts, k = c->top_k;
    float *key = malloc((size_t)E * sizeof *key);
    char *used = malloc((size_t)E);
    for (int64_t t = 0; t < T; t++) {
        const float *s = scores + t * E;
        for (int64_t e = 0; e < E; e++) {
            key[e] = c->has_bias && bias ? (float)((double)s[e] + bias[e]) : s[e];
            used[e] = 0;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < k; j++) {
            int64_t b = -1;
            for (int64_t e = 0; e < E; e++)
                if (!used[e] && (b < 0 || key[e] > key[b]))
                    b = e;
            used[b] = 1;
            ids[t * k + j] = (int32_t)b;
            sum += s[b];
        }
        for (int64_t j = 0; j < k; j++)
            w[t * k + j] = (float)(c->scaling * s[ids[t * k + j]] / (c->renormalize ? sum : 1.0));
        if (margin) {
            int64_t b = -1;
            for (int64_t e = 0; e < E; e++)
                if (!used[e] && (b < 0 || key[e] > key[b]))
                    b = e;
            margin[t] = b < 0 ? INFINITY : (float)((double)key[ids[t * k + k - 1]] - key[b]);
        }
    }
    free(key);
    free(used);
    return 0;
}

int dl_route_backward(const dl_route_config_t *c, const float *scores, const int32_t *ids,
                      const float *dw, int64_t T, float *d_scores, float *d_logits)
{
    const int64_t E = c->experts, k = c->top_k;
    float *row = malloc((size_t)E * sizeof *row);
    for (int64_t t = 0; t < T; t++) {
        const float *s = scores + t * E;
        float *ds = d_scores ? d_scores + t * E : row;
        for (int64_t e = 0; e < E; e++)
            ds[e] = 0.0f;
        double S = 0.0, cr = 0.0;
        for (int64_t j = 0; j < k; j++) {
            S += s[ids[t * k + j]];
            cr += (double)dw[t * k + j] * s[ids[t * k + j]];
        }
        for (int64_t j = 0; j < k; j++)
            ds[ids[t * k + j]] = (float)(c->renormalize
                                             ? c->scaling * (dw[t * k + j] / S - cr / (S * S))
                                             : c->scaling * dw[t * k + j]);
        if (!d_logits)
            continue;
        double sig = 0.0;
        for (int64_t e = 0; e < E; e++)
            sig += (double)s[e] * ds[e];
        for (int64_t e = 0; e < E; e++)
            d_logits[t * E + e] = c->score_fn == DL_SCORE_SOFTMAX
                                      ? (float)((double)s[e] * ((double)ds[e] - sig))
                                      : (float)((double)ds[e] * s[e] * (1.0 - (double)s[e]));
    }
    free(row);
    return 0;
}

int dl_swiglu(const float *g, const float *u, int64_t n, dl_dtype_t t, float *h)
{
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) || !isfinite(u[i]))
            return DL_ENONFINITE;
        h[i] = (float)dl_round((double)g[i] / (1.0 + exp(-(double)g[i])) * u[i], t);
    }
    return 0;
}

int dl_swiglu_backward(const float *g, const float *u, const float *dh, int64_t n, dl_dtype_t t,
                       float *d_g, float *d_u)
{
    for (int64_t i = 0; i < n; i++) {
        double s = 1.0 / (1.0 + exp(-(double)g[i]));
        d_g[i] = (float)dl_round((double)dh[i] * u[i] * s * (1.0 + g[i] * (1.0 - s)), t);
        d_u[i] = (float)dl_round((double)dh[i] * g[i] * s, t);
    }
    return 0;
}

#include "../src/moe.c"
