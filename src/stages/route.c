/* Routing: scores, top-k selection with expert bias and group limits,
 * routing weights, and their backward. Every output is the exact function
 * of the stored inputs, rounded once to fp32: certified in binary64 where
 * the error bound decides the rounding, else computed exactly (the exact
 * accumulator) or in MPFR. Tokens are independent, so OpenMP goes over
 * tokens and the bits cannot depend on the thread count. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <mpfr.h>
#include "stages/stages_priv.h"

#define U 0x1p-53

static const char *const score_names[] = {"softmax", "sigmoid", "sqrtsoftplus", "softmax_topk"};
#define NSCORES ((int)(sizeof score_names / sizeof score_names[0]))

const char *dl_route_score_name(dl_score_fn_t f)
{
    return (int)f >= 0 && (int)f < NSCORES ? score_names[f] : NULL;
}

int dl_route_score_parse(const char *name)
{
    for (int i = 0; name && i < NSCORES; i++)
        if (strcmp(name, score_names[i]) == 0)
            return i;
    return -1;
}

int dl_route_config_validate(const dl_route_config_t *c)
{
    if (!c)
        return DL_EINVAL;
    if (c->experts < 1 || c->experts > INT32_MAX)
        return DL_EINVAL;
    /* zero experts: a plain softmax-style top-k over E + Z columns */
    if (c->zero_experts < 0 || c->zero_experts > INT32_MAX - c->experts ||
        (c->zero_experts > 0 && (c->n_group != 1 || c->hash_vocab > 0 || c->weight_on_input)))
        return DL_EINVAL;
    if (c->top_k < 1 || c->top_k > DL_ROUTE_WIDTH(c))
        return DL_EINVAL;
    if (!dl_route_score_name(c->score_fn))
        return DL_EINVAL;
    if (c->n_group < 1 || c->n_group > c->experts || c->experts % c->n_group != 0)
        return DL_EINVAL;
    if (c->topk_group < 1 || c->topk_group > c->n_group)
        return DL_EINVAL;
    if (c->group_score != DL_GROUP_MAX && c->group_score != DL_GROUP_TOP2_SUM &&
        c->group_score != DL_GROUP_TOPK_SUM)
        return DL_EINVAL;
    if (c->top_k > c->topk_group * (DL_ROUTE_WIDTH(c) / c->n_group))
        return DL_EINVAL;
    if (!isfinite(c->scaling) || !(c->scaling > 0))
        return DL_EINVAL;
    /* the weight on the input is the score itself (Llama-4) */
    if (c->weight_on_input && (c->renormalize || c->scaling != 1.0 ||
                               c->score_fn == DL_SCORE_SOFTMAX_TOPK))
        return DL_EINVAL;
    /* hash routing chooses by the table: no selection bias, no groups */
    if (c->hash_vocab < 0 || c->hash_vocab > INT32_MAX ||
        (c->hash_vocab > 0 && (c->has_bias || c->n_group > 1)))
        return DL_EINVAL;
    return 0;
}

double dl_route_score_slope(const dl_route_config_t *c, float s)
{
    const double as = fabs((double)s);
    switch (c->score_fn) {
    case DL_SCORE_SIGMOID:
        return fabs((double)s * (1.0 - (double)s));
    case DL_SCORE_SQRTSOFTPLUS: /* sigmoid(l) / (2 sqrt(softplus(l))) */
        return as == 0.0 ? 0.0 : -expm1(-as * as) / (2.0 * as) * (1.0 + 0x1p-40);
    case DL_SCORE_SOFTMAX_TOPK:
        return 1.0;
    default:
        return 0.0;
    }
}

double dl_route_score_curvature(const dl_route_config_t *c, float s)
{
    switch (c->score_fn) {
    case DL_SCORE_SIGMOID:
        return fabs(1.0 - 2.0 * (double)s);
    case DL_SCORE_SQRTSOFTPLUS:
        /* g(s) = (1 - e^-u) / (2 s), u = s^2: g' = e^-u - (1 - e^-u) / (2u),
         * 1/2 at u -> 0 and within [-0.11, 1/2] beyond */
        return 0.5;
    default:
        return 0.0;
    }
}

static int all_finite(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

static void set_err(int *err, int e)
{
    if (e) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
        *err = e;
    }
}

/* ---------------------------------------------------------------- logits */

/* A column of T ones: a bias as one more GEMM term (1 * b is exact). */
static float *ones(int64_t T)
{
    float *o = malloc((size_t)(T > 0 ? T : 1) * sizeof *o);
    for (int64_t i = 0; o && i < T; i++)
        o[i] = 1.0f;
    return o;
}

int dl_route_logits(const float *x, int64_t T, int64_t d, const float *W, const float *b,
                    int64_t E, float *logits, dl_tier_stats_t *stats)
{
    const int64_t all[2] = {0, T > 0 ? T : 0};
    dl_gemm_term_t t[2] = {{x, d, W, DL_RHS_KN}};
    if (!b)
        return dl_gemm_grouped(t, 1, E, all, 1, DL_F32, logits, stats);
    float *one = ones(T);
    if (!one)
        return DL_ENOMEM;
    t[1] = (dl_gemm_term_t){one, 1, b, DL_RHS_KN};
    int rc = dl_gemm_grouped(t, 2, E, all, 1, DL_F32, logits, stats);
    free(one);
    return rc;
}

int dl_route_bias_backward(const float *d_logits, int64_t T, int64_t E, float *d_b,
                           dl_tier_stats_t *stats)
{
    const int64_t all[2] = {0, T > 0 ? T : 0};
    float *one = ones(T);
    if (!one)
        return DL_ENOMEM;
    int rc = dl_gemm_ragged_k(one, 1, d_logits, E, all, 1, DL_F32, d_b, stats);
    free(one);
    return rc;
}

/* ---------------------------------------------------------------- scores */

int dl_route_scores(const dl_route_config_t *c, const float *logits, int64_t T,
                    float *scores)
{
    int rc = dl_route_config_validate(c);
    if (rc)
        return rc;
    int64_t n, E = DL_ROUTE_WIDTH(c);
    if (T < 0)
        return DL_EINVAL;
    if (dl_mul_size(T, E, &n))
        return DL_EOVERFLOW;
    if (T == 0)
        return 0;
    if (!logits || !scores)
        return DL_EINVAL;
    if (!all_finite(logits, n))
        return DL_ENONFINITE;
    int err = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        float *s = scores + t * E;
        if (c->score_fn == DL_SCORE_SOFTMAX) {
            set_err(&err, dl__softmax_row(l, E, DL_F32, s));
        } else if (c->score_fn == DL_SCORE_SOFTMAX_TOPK) {
            memcpy(s, l, (size_t)E * sizeof *s); /* the selection is on the logits */
        } else if (c->score_fn == DL_SCORE_SQRTSOFTPLUS) {
            for (int64_t e = 0; e < E; e++)
                set_err(&err, dl__sqrtsoftplus(l[e], &s[e]));
        } else {
            for (int64_t e = 0; e < E; e++) {
                double r = 0.0;
                set_err(&err, dl__sigmoid(l[e], DL_F32, &r));
                s[e] = (float)r;
            }
        }
    }
    return err;
}

/* ------------------------------------------------- exact quotients (MPFR) */

/* c * num / den^2 (den2 = 1) or c * num / den (den2 = 0) for exact MPFR
 * values; the interval is one directed division at the loop's precision. */
typedef struct {
    mpfr_srcptr num, den;
} quot_ctx_t;

static void quot_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    const quot_ctx_t *q = ctx;
    mpfr_div(lo, q->num, q->den, MPFR_RNDD);
    mpfr_div(hi, q->num, q->den, MPFR_RNDU);
}

/* Wide enough for any sum of up to 2^20 products of two floats (products
 * span 2^-298 .. 2^256) exactly, and for the square of such a sum of floats. */
#define EXACT_PREC 2400

/* RN_fp32(c * s[ids[j]] / sum_i s[ids[i]]) in MPFR. */
static int weight_mpfr(double c, const float *s, const int32_t *ids, int64_t k,
                       int64_t j, double *out)
{
    int rc;
#ifdef _OPENMP
#pragma omp critical(dl__mpfr)
#endif
    {
        mpfr_t num, den;
        mpfr_inits2(EXACT_PREC, num, den, (mpfr_ptr)0);
        mpfr_set_zero(den, 1);
        for (int64_t i = 0; i < k; i++)
            mpfr_add_d(den, den, s[ids[i]], MPFR_RNDN); /* exact */
        mpfr_set_d(num, c, MPFR_RNDN);
        mpfr_mul_d(num, num, s[ids[j]], MPFR_RNDN); /* exact: 77 bits */
        quot_ctx_t q = {num, den};
        rc = dl__ziv(quot_eval, &q, DL_F32, out);
        mpfr_clears(num, den, (mpfr_ptr)0);
    }
    return rc;
}

/* When certification fails, the enclosure [q - err, q + err] of an exact
 * value v usually straddles one midpoint M of fp32 between two adjacent
 * candidates. Sets *lo_r, *hi_r, *mid and returns 1 in that case (0
 * otherwise); the caller decides v against M exactly. */
static int straddled_midpoint(double q, double err, double *lo_r, double *hi_r, double *mid)
{
    if (!isfinite(q) || !isfinite(err))
        return 0;
    double a = dl_round(nextafter(q - err, -INFINITY), DL_F32);
    double b = dl_round(nextafter(q + err, INFINITY), DL_F32);
    if (!isfinite(a) || !isfinite(b) || a == 0.0 || b == 0.0 || (a < 0) != (b < 0))
        return 0;
    if ((float)b != nextafterf((float)a, INFINITY))
        return 0;
    *lo_r = a;
    *hi_r = b;
    *mid = 0.5 * (a + b); /* exact: adjacent floats, far above the binary64 subnormals */
    return 1;
}

/* The rounding of v given sign(v - M) for the straddled midpoint M: ties
 * go to the candidate with an even fp32 significand. */
static float pick(int sign, double lo_r, double hi_r)
{
    if (sign < 0)
        return (float)lo_r;
    if (sign > 0)
        return (float)hi_r;
    float f = (float)lo_r;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (bits & 1) ? (float)hi_r : f;
}

/* RN_fp32(c * x) for double c and float x. */
static float scale_round(double c, float x)
{
    double q = c * x, r;
    if (x == 0.0f)
        return 0.0f;
    if (fabs(q) >= 0x1p-1000 && fabs(q) <= 0x1p1000 && dl__certify(q, fabs(q) * 0x1p-52, DL_F32, &r))
        return (float)r;
    dl_acc_t acc;
    dl_acc_clear(&acc);
    dl_acc_add_prod(&acc, c, x);
    return (float)dl_acc_round(&acc, DL_F32);
}

/* ------------------------------------------------------------------ top-k */

typedef struct {
    float key;
    int32_t idx;
} kv_t;

/* best first: larger key, then lower index; keys are finite, so this is a
 * total order and qsort's result is unique */
static int kv_cmp(const void *pa, const void *pb)
{
    const kv_t *a = pa, *b = pb;
    if (a->key > b->key)
        return -1;
    if (a->key < b->key)
        return 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

typedef struct {
    kv_t *kv, *grp, *gkv;
    unsigned char *kept;
} topk_work_t;

int64_t dl_route_group_terms(const dl_route_config_t *c)
{
    if (c->n_group <= 1 || c->topk_group < 1)
        return 1;
    int64_t nb = 1;
    if (c->group_score == DL_GROUP_TOP2_SUM)
        nb = 2;
    else if (c->group_score == DL_GROUP_TOPK_SUM)
        nb = c->top_k / c->topk_group;
    const int64_t G = c->experts / c->n_group;
    if (nb < 1)
        nb = 1;
    return nb < G ? nb : G;
}

/* The weights of one token's selection (dl_route_weights without the
 * argument checks). */
static int weights_of(const dl_route_config_t *c, const float *s, const int32_t *ids, float *w)
{
    const int64_t k = c->top_k;
    if (c->weight_on_input) { /* the combine's weights: the score scales the input */
        for (int64_t j = 0; j < k; j++)
            w[j] = 1.0f;
        return 0;
    }
    if (c->score_fn == DL_SCORE_SOFTMAX_TOPK)
        return dl__softmax_topk_weights(c->scaling, s, ids, k, w);
    if (!c->renormalize) {
        for (int64_t j = 0; j < k; j++)
            w[j] = scale_round(c->scaling, s[ids[j]]);
        return 0;
    }
    dl_acc_t acc;
    dl_acc_clear(&acc);
    for (int64_t j = 0; j < k; j++)
        dl_acc_add(&acc, s[ids[j]]);
    if (dl_acc_sign(&acc) == 0)
        return DL_ENONFINITE; /* weights would be 0/0 */
    double S = dl_acc_round(&acc, DL_F64);
    for (int64_t j = 0; j < k; j++) {
        float sj = s[ids[j]];
        double num = c->scaling * sj, r;
        if (sj == 0.0f) {
            w[j] = 0.0f;
            continue;
        }
        /* relative: u (num) + u (S) + u (division) + O(u^2) < 2^-50 */
        double q = num / S;
        if (fabs(num) >= 0x1p-1000 && fabs(num) <= 0x1p1000 && fabs(q) >= 0x1p-1000 &&
            fabs(q) <= 0x1p1000 && dl__certify(q, fabs(q) * 0x1p-50, DL_F32, &r)) {
            w[j] = (float)r;
            continue;
        }
        /* v = c s_j / S against the midpoint M: sign(c s_j - M S) sign(S),
         * exactly (M has 25 bits, so M s_i is exact) */
        double lo_r, hi_r, mid;
        if (fabs(q) >= 0x1p-1000 && fabs(q) <= 0x1p1000 &&
            straddled_midpoint(q, fabs(q) * 0x1p-50, &lo_r, &hi_r, &mid)) {
            dl_acc_t d;
            dl_acc_clear(&d);
            dl_acc_add_prod(&d, c->scaling, sj);
            for (int64_t i = 0; i < k; i++)
                dl_acc_add_prod(&d, -mid, s[ids[i]]);
            w[j] = pick(dl_acc_sign(&d) * dl_acc_sign(&acc), lo_r, hi_r);
            continue;
        }
        int e = weight_mpfr(c->scaling, s, ids, k, j, &r);
        if (e)
            return e;
        w[j] = (float)r;
    }
    return 0;
}

float dl__route_key(const dl_route_config_t *c, const float *s, const float *bias, int64_t e)
{
    /* a float addition is the exact sum rounded once to fp32 */
    return c->has_bias && bias ? s[e] + bias[e] : s[e];
}

/* The score of a group of G keys kv (grp: G scratch entries): its best key,
 * or the sum of its nb best rounded once to fp32. */
static int group_score(const kv_t *kv, int64_t G, int64_t nb, kv_t *grp, float *gs)
{
    memcpy(grp, kv, (size_t)G * sizeof(kv_t));
    qsort(grp, (size_t)G, sizeof(kv_t), kv_cmp);
    *gs = grp[0].key;
    if (nb > 1) {
        dl_acc_t acc;
        dl_acc_clear(&acc);
        for (int64_t i = 0; i < nb; i++)
            dl_acc_add(&acc, grp[i].key);
        *gs = (float)dl_acc_round(&acc, DL_F32);
        if (!isfinite(*gs))
            return DL_ENONFINITE;
    }
    return 0;
}

int dl__route_group_score(const dl_route_config_t *c, const float *s, const float *bias,
                          int64_t g, float *gs)
{
    const int64_t G = c->experts / c->n_group;
    kv_t *kv = malloc((size_t)(2 * G) * sizeof *kv);
    if (!kv)
        return DL_ENOMEM;
    for (int64_t i = 0; i < G; i++) {
        kv[i].key = dl__route_key(c, s, bias, g * G + i);
        kv[i].idx = (int32_t)(g * G + i);
    }
    int rc = group_score(kv, G, dl_route_group_terms(c), kv + G, gs);
    free(kv);
    return rc;
}

static int topk_token(const dl_route_config_t *c, const float *s, const float *bias,
                      int32_t *ids, float *w, float *margin, topk_work_t *wk)
{
    const int64_t E = DL_ROUTE_WIDTH(c), k = c->top_k, ng = c->n_group, tg = c->topk_group;
    const int64_t G = E / ng;
    kv_t *kv = wk->kv;
    for (int64_t e = 0; e < E; e++) {
        float key = dl__route_key(c, s, bias, e);
        if (!isfinite(key))
            return DL_ENONFINITE;
        kv[e].key = key;
        kv[e].idx = (int32_t)e;
    }
    float gap = INFINITY;
    int64_t nsel = E;
    if (ng > 1 && tg < ng) {
        int64_t nb = dl_route_group_terms(c);
        for (int64_t g = 0; g < ng; g++) {
            float gs;
            int rc = group_score(kv + g * G, G, nb, wk->grp, &gs);
            if (rc)
                return rc;
            wk->gkv[g].key = gs;
            wk->gkv[g].idx = (int32_t)g;
        }
        qsort(wk->gkv, (size_t)ng, sizeof(kv_t), kv_cmp);
        gap = wk->gkv[tg - 1].key - wk->gkv[tg].key;
        memset(wk->kept, 0, (size_t)ng);
        for (int64_t g = 0; g < tg; g++)
            wk->kept[wk->gkv[g].idx] = 1;
        nsel = 0;
        for (int64_t e = 0; e < E; e++)
            if (wk->kept[e / G])
                kv[nsel++] = kv[e];
    }
    qsort(kv, (size_t)nsel, sizeof(kv_t), kv_cmp);
    for (int64_t j = 0; j < k; j++)
        ids[j] = kv[j].idx;
    if (nsel > k) {
        float eg = kv[k - 1].key - kv[k].key;
        if (eg < gap)
            gap = eg;
    }
    if (margin)
        *margin = gap == 0.0f ? 0.0f : gap; /* +0 for a tie */

    return w ? weights_of(c, s, ids, w) : 0;
}

int dl_route_topk(const dl_route_config_t *c, const float *scores,
                  const float *bias, int64_t T, int32_t *ids, float *weights,
                  float *margin)
{
    int rc = dl_route_config_validate(c);
    if (rc)
        return rc;
    int64_t n, E = DL_ROUTE_WIDTH(c), k = c->top_k;
    if (T < 0)
        return DL_EINVAL;
    if (dl_mul_size(T, E, &n))
        return DL_EOVERFLOW;
    if (T == 0)
        return 0;
    if (!scores || !ids || !weights || (c->has_bias && !bias))
        return DL_EINVAL;
    if (!all_finite(scores, n) || (c->has_bias && !all_finite(bias, E)))
        return DL_ENONFINITE;
    int err = 0;
#ifdef _OPENMP
#pragma omp parallel if (T > 1) /* one token (the checker asks per token): no team */
#endif
    {
        topk_work_t wk;
        wk.kv = malloc((size_t)E * sizeof(kv_t));
        wk.grp = malloc((size_t)E * sizeof(kv_t));
        wk.gkv = malloc((size_t)c->n_group * sizeof(kv_t));
        wk.kept = malloc((size_t)c->n_group);
        int ok = wk.kv && wk.grp && wk.gkv && wk.kept;
        if (!ok)
            set_err(&err, DL_ENOMEM);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t t = 0; t < T; t++)
            if (ok)
                set_err(&err, topk_token(c, scores + t * E, bias, ids + t * k, weights + t * k,
                                         margin ? margin + t : NULL, &wk));
        free(wk.kv);
        free(wk.grp);
        free(wk.gkv);
        free(wk.kept);
    }
    return err;
}

/* --------------------------------------------------------------- backward */

int dl_route_weights(const dl_route_config_t *c, const float *s, const int32_t *ids, float *w)
{
    int rc = dl_route_config_validate(c);
    if (rc)
        return rc;
    if (!s || !ids || !w)
        return DL_EINVAL;
    for (int64_t j = 0; j < c->top_k; j++) {
        if (ids[j] < 0 || ids[j] >= DL_ROUTE_WIDTH(c))
            return DL_ERANGE;
        for (int64_t i = 0; i < j; i++)
            if (ids[i] == ids[j])
                return DL_EINVAL;
        if (!isfinite(s[ids[j]]))
            return DL_ENONFINITE;
    }
    return weights_of(c, s, ids, w);
}

/* d_score of the j-th selected expert with renormalisation:
 * c / S^2 (dw_j S - sum_i dw_i s_i) = c N_j / S^2, N_j = sum_i s_i (dw_j - dw_i). */
static int dscore_mpfr(double c, const float *s, const int32_t *ids, const float *dw,
                       int64_t k, int64_t j, double *out)
{
    int rc;
#ifdef _OPENMP
#pragma omp critical(dl__mpfr)
#endif
    {
        mpfr_t num, den, p;
        mpfr_inits2(EXACT_PREC, num, den, (mpfr_ptr)0);
        mpfr_init2(p, 64);
        mpfr_set_zero(num, 1);
        mpfr_set_zero(den, 1);
        for (int64_t i = 0; i < k; i++) {
            float si = s[ids[i]];
            mpfr_add_d(den, den, si, MPFR_RNDN);
            mpfr_set_flt(p, si, MPFR_RNDN);
            mpfr_mul_d(p, p, dw[j], MPFR_RNDN); /* 48 bits: exact */
            mpfr_add(num, num, p, MPFR_RNDN);
            mpfr_set_flt(p, si, MPFR_RNDN);
            mpfr_mul_d(p, p, dw[i], MPFR_RNDN);
            mpfr_sub(num, num, p, MPFR_RNDN);
        }
        mpfr_sqr(den, den, MPFR_RNDN);        /* exact: S has < 300 bits */
        mpfr_mul_d(num, num, c, MPFR_RNDN);   /* exact: < 700 bits */
        quot_ctx_t q = {num, den};
        rc = dl__ziv(quot_eval, &q, DL_F32, out);
        mpfr_clears(num, den, p, (mpfr_ptr)0);
    }
    return rc;
}

/* d_scores of one token's selected experts (ds[j] for ids[j]). */
static int dscores_token(const dl_route_config_t *c, const float *s, const int32_t *ids,
                         const float *dw, float *ds)
{
    const int64_t k = c->top_k;
    const double cs = c->scaling;
    if (c->weight_on_input) { /* constant combine weights: no gradient to the scores */
        for (int64_t j = 0; j < k; j++)
            ds[j] = 0.0f;
        return 0;
    }
    if (c->score_fn == DL_SCORE_SOFTMAX_TOPK)
        return dl__softmax_topk_dscores(cs, s, ids, dw, k, ds);
    if (!c->renormalize) {
        for (int64_t j = 0; j < k; j++)
            ds[j] = scale_round(cs, dw[j]);
        return 0;
    }
    dl_acc_t sa, ba;
    dl_acc_clear(&sa);
    dl_acc_clear(&ba);
    for (int64_t i = 0; i < k; i++) {
        dl_acc_add(&sa, s[ids[i]]);
        dl_acc_add(&ba, (double)dw[i] * s[ids[i]]); /* float products are exact */
    }
    if (dl_acc_sign(&sa) == 0)
        return DL_ENONFINITE;
    double S = dl_acc_round(&sa, DL_F64), B = dl_acc_round(&ba, DL_F64);
    double S2 = S * S;
    for (int64_t j = 0; j < k; j++) {
        double r;
        /* N = dw_j S - B: |error| <= u |dw_j S| (S) + u |p1| + u |B| (B)
         * + u |nd|, with |dw_j S| <= |p1| (1 + u) */
        double p1 = dw[j] * S, nd = p1 - B;
        double errn = (2 * fabs(p1) + fabs(B) + fabs(nd)) * U * 1.01;
        /* c N / S^2: the computed quotient of the computed N carries
         * 5u + O(u^2) (c nd, S, S^2, division) < 2^-50; N's error adds
         * c errn / S^2 */
        double num = cs * nd, q = num / S2;
        if (S2 >= 0x1p-1000 && S2 <= 0x1p1000 && fabs(num) <= 0x1p1000 &&
            (q == 0.0 || fabs(q) >= 0x1p-900) && fabs(q) <= 0x1p1000) {
            double err = (fabs(q) * 0x1p-50 + cs * errn / S2) * 1.01;
            if (err >= 0x1p-1000 && err <= 0x1p1000 && dl__certify(q, err, DL_F32, &r)) {
                ds[j] = (float)r;
                continue;
            }
        }
        /* an exact zero N is common (k = 1, or equal d_weights): decide it exactly */
        dl_acc_t na;
        dl_acc_clear(&na);
        for (int64_t i = 0; i < k; i++) {
            dl_acc_add(&na, (double)dw[j] * s[ids[i]]);
            dl_acc_add(&na, -((double)dw[i] * s[ids[i]]));
        }
        if (dl_acc_sign(&na) == 0) {
            ds[j] = 0.0f;
            continue;
        }
        /* again with N exact, then rounded once: relative 6u + O(u^2) */
        double ne = dl_acc_round(&na, DL_F64);
        num = cs * ne;
        q = num / S2;
        if (S2 >= 0x1p-1000 && S2 <= 0x1p1000 && fabs(num) >= 0x1p-1000 && fabs(num) <= 0x1p1000 &&
            fabs(q) >= 0x1p-1000 && fabs(q) <= 0x1p1000 &&
            dl__certify(q, fabs(q) * 0x1p-50, DL_F32, &r)) {
            ds[j] = (float)r;
            continue;
        }
        /* v = c N / S^2 against the straddled midpoint M: sign(c N - M S^2),
         * exactly; c N and M S^2 are sums of exact double products */
        double lo_r, hi_r, mid;
        if (k <= 64 && S2 >= 0x1p-1000 && S2 <= 0x1p1000 && fabs(q) >= 0x1p-1000 &&
            fabs(q) <= 0x1p1000 && straddled_midpoint(q, fabs(q) * 0x1p-50, &lo_r, &hi_r, &mid)) {
            dl_acc_t d;
            dl_acc_clear(&d);
            for (int64_t i = 0; i < k; i++) {
                double si = s[ids[i]];
                dl_acc_add_prod(&d, cs, si * dw[j]);
                dl_acc_add_prod(&d, -cs, si * dw[i]);
                for (int64_t l = 0; l < k; l++)
                    dl_acc_add_prod(&d, -mid, si * s[ids[l]]);
            }
            ds[j] = pick(dl_acc_sign(&d), lo_r, hi_r);
            continue;
        }
        int e = dscore_mpfr(cs, s, ids, dw, k, j, &r);
        if (e)
            return e;
        ds[j] = (float)r;
    }
    return 0;
}

/* d_logits of one token from stored scores s and any stored d_scores ds
 * (a full row of E); 0 or DL_ENONFINITE. */
static int scores_vjp_row(const dl_route_config_t *c, const float *s, const float *ds, float *dl)
{
    const int64_t E = DL_ROUTE_WIDTH(c);
    dl_acc_t acc;
    if (c->score_fn == DL_SCORE_SOFTMAX_TOPK || c->score_fn == DL_SCORE_SQRTSOFTPLUS) {
        int rc = 0;
        for (int64_t e = 0; e < E && !rc; e++) {
            if (!isfinite(ds[e]) || !isfinite(s[e]))
                return DL_ENONFINITE;
            if (c->score_fn == DL_SCORE_SOFTMAX_TOPK)
                dl[e] = ds[e] == 0.0f ? 0.0f : ds[e]; /* the identity */
            else
                rc = dl__sqrtsoftplus_vjp(s[e], ds[e], &dl[e]);
        }
        return rc;
    }
    if (c->score_fn == DL_SCORE_SIGMOID) {
        /* ds s (1 - s) = ds s - (ds s) s; ds s is exact in binary64 */
        for (int64_t e = 0; e < E; e++) {
            const double p = (double)ds[e] * (double)s[e];
            if (!isfinite(p))
                return DL_ENONFINITE;
            dl_acc_clear(&acc);
            dl_acc_add(&acc, p);
            dl_acc_add_prod(&acc, -p, s[e]);
            dl[e] = (float)dl_acc_round(&acc, DL_F32);
        }
        return 0;
    }
    /* s_e (ds_e - sigma), sigma = sum_j s_j ds_j: certified from a binary64
     * evaluation, else the exact accumulator */
    double sig = 0.0, asig = 0.0;
    for (int64_t j = 0; j < E; j++) {
        double p = (double)s[j] * (double)ds[j];
        sig += p;
        asig += fabs(p);
    }
    if (!isfinite(asig))
        return DL_ENONFINITE;
    const double nu = (double)E * 0x1p-53;
    const double sig_err = nu / (1.0 - nu) * asig * (1.0 + 0x1p-40);
    for (int64_t e = 0; e < E; e++) {
        const double se = s[e];
        const double a = se * (double)ds[e]; /* exact */
        const double b = se * sig;
        const double y = a - b;
        /* b rounded (u|b|), sigma's own error times s_e, the subtraction (u|y|) */
        const double err = (fabs(b) + fabs(y)) * 0x1p-53 + se * sig_err + 0x1p-1074;
        double r;
        if (dl__certify(y, err * (1.0 + 0x1p-40), DL_F32, &r)) {
            dl[e] = (float)r;
            continue;
        }
        dl_acc_clear(&acc);
        dl_acc_add(&acc, a);
        for (int64_t j = 0; j < E; j++)
            dl_acc_add_prod(&acc, -se * (double)s[j], ds[j]); /* s_e s_j: exact */
        dl[e] = (float)dl_acc_round(&acc, DL_F32);
    }
    return 0;
}

int dl__route_scores_vjp_row(const dl_route_config_t *c, const float *s, const float *ds,
                             float *dl)
{
    return scores_vjp_row(c, s, ds, dl);
}

int dl_route_scores_backward(const dl_route_config_t *c, const float *scores,
                             const float *d_scores, int64_t T, float *d_logits)
{
    int rc = dl_route_config_validate(c);
    if (rc)
        return rc;
    int64_t n;
    if (T < 0)
        return DL_EINVAL;
    if (dl_mul_size(T, DL_ROUTE_WIDTH(c), &n))
        return DL_EOVERFLOW;
    if (T == 0)
        return 0;
    if (!scores || !d_scores || !d_logits)
        return DL_EINVAL;
    int err = 0;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t t = 0; t < T; t++) {
        int e = scores_vjp_row(c, scores + t * DL_ROUTE_WIDTH(c), d_scores + t * DL_ROUTE_WIDTH(c),
                               d_logits + t * DL_ROUTE_WIDTH(c));
        if (e)
            set_err(&err, e);
    }
    return err;
}

int dl_route_backward(const dl_route_config_t *c, const float *scores,
                      const int32_t *ids, const float *d_weights, int64_t T,
                      float *d_scores, float *d_logits)
{
    int rc = dl_route_config_validate(c);
    if (rc)
        return rc;
    int64_t n, nk, E = DL_ROUTE_WIDTH(c), k = c->top_k;
    if (T < 0)
        return DL_EINVAL;
    if (dl_mul_size(T, E, &n) || dl_mul_size(T, k, &nk))
        return DL_EOVERFLOW;
    if (T == 0 || (!d_scores && !d_logits))
        return 0;
    if (!scores || !ids || !d_weights)
        return DL_EINVAL;
    for (int64_t i = 0; i < nk; i++)
        if (ids[i] < 0 || ids[i] >= E)
            return DL_ERANGE;
    unsigned char *seen = calloc((size_t)E, 1);
    if (!seen)
        return DL_ENOMEM;
    int dup = 0;
    for (int64_t t = 0; t < T && !dup; t++) {
        const int32_t *id = ids + t * k;
        for (int64_t j = 0; j < k; j++) {
            dup |= seen[id[j]];
            seen[id[j]] = 1;
        }
        for (int64_t j = 0; j < k; j++)
            seen[id[j]] = 0;
    }
    free(seen);
    if (dup)
        return DL_EINVAL;
    if (!all_finite(scores, n) || !all_finite(d_weights, nk))
        return DL_ENONFINITE;
    int err = 0;
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
        float *row = malloc((size_t)E * sizeof(float));
        float *sel = malloc((size_t)k * sizeof(float));
        int ok = row && sel;
        if (!ok)
            set_err(&err, DL_ENOMEM);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t t = 0; t < T; t++) {
            if (!ok)
                continue;
            const float *s = scores + t * E;
            const int32_t *id = ids + t * k;
            int e = dscores_token(c, s, id, d_weights + t * k, sel);
            if (e) {
                set_err(&err, e);
                continue;
            }
            float *ds = d_scores ? d_scores + t * E : row;
            for (int64_t i = 0; i < E; i++)
                ds[i] = 0.0f;
            for (int64_t j = 0; j < k; j++)
                ds[id[j]] = sel[j];
            if (d_logits && (e = scores_vjp_row(c, s, ds, d_logits + t * E)))
                set_err(&err, e);
        }
        free(row);
        free(sel);
    }
    return err;
}
