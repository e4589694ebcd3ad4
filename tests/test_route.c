/* Routing against GNU MPFR and an independent selection reference:
 * softmax/sigmoid scores bit-exact (random, wide-range, subnormal and
 * near-midpoint inputs), top-k selection, margins and weights (ties, group
 * rules, bias, renormalisation, scaling), the backward against exact MPFR
 * values and against finite differences, and thread-count independence. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "tap.h"
#include "mpref.h"
#include "dropless.h"
#include "stages/stages_priv.h"

/* Tolerances: every output is compared bit for bit, except d_logits
 * against central finite differences of the exact (unrounded) routing
 * function, which differ from the stored-value VJP by the fp32 rounding of
 * the stored scores and d_scores: there |got - fd| <= TOL_FD * scale, with
 * scale = sum_e |s_e| (|ds_e| + |sum_j s_j ds_j|) + |d_logit_e| terms. */
#define TOL_FD 0x1p-16
#define EXACT_P 3000 /* exact sums of products of floats and their squares */

static dl_route_config_t cfg(int64_t E, int64_t k, dl_score_fn_t fn)
{
    dl_route_config_t c = {E, k, fn, 1, 1, DL_GROUP_MAX, 0, 1.0, 0, 0};
    return c;
}

/* ------------------------------------------------------- MPFR references */

/* RN_fp32(softmax(l)[e]) for all e: evaluated at two precisions (a third
 * if they disagree). MPFR flushes exp of differences below -2^29 or so to
 * 0; those terms are below 2^-(2^29) and cannot move any rounding here. */
static void ref_softmax_p(const float *l, int64_t E, float *out, mpfr_prec_t p)
{
    float m = l[0];
    for (int64_t j = 1; j < E; j++)
        m = l[j] > m ? l[j] : m;
    mpfr_t d, S, *T = malloc(E * sizeof(mpfr_t));
    mpfr_init2(d, 400);
    mpfr_init2(S, p);
    mpfr_set_zero(S, 1);
    for (int64_t j = 0; j < E; j++) {
        mpfr_init2(T[j], p);
        mpfr_set_d(d, l[j], MPFR_RNDN);
        mpfr_sub_d(d, d, m, MPFR_RNDN);
        mpfr_exp(T[j], d, MPFR_RNDN);
        mpfr_add(S, S, T[j], MPFR_RNDN);
    }
    for (int64_t j = 0; j < E; j++) {
        mpfr_div(T[j], T[j], S, MPFR_RNDN);
        out[j] = (float)mpref_round(T[j], DL_F32);
        mpfr_clear(T[j]);
    }
    mpfr_clears(d, S, (mpfr_ptr)0);
    free(T);
}

static void ref_softmax(const float *l, int64_t E, float *out)
{
    float *b = malloc(E * sizeof *b);
    ref_softmax_p(l, E, out, 300);
    ref_softmax_p(l, E, b, 900);
    if (memcmp(out, b, E * sizeof *b) != 0)
        ref_softmax_p(l, E, out, 6000);
    free(b);
}

static float ref_sigmoid_p(double x, mpfr_prec_t p)
{
    mpfr_t a;
    mpfr_init2(a, p);
    mpfr_set_d(a, -x, MPFR_RNDN);
    mpfr_exp(a, a, MPFR_RNDN);
    mpfr_add_ui(a, a, 1, MPFR_RNDN);
    mpfr_ui_div(a, 1, a, MPFR_RNDN);
    float r = (float)mpref_round(a, DL_F32);
    mpfr_clear(a);
    return r;
}

static float ref_sigmoid(double x)
{
    float a = ref_sigmoid_p(x, 300), b = ref_sigmoid_p(x, 900);
    return a == b ? a : ref_sigmoid_p(x, 6000);
}

/* RN_fp32(num / den) of exact MPFR values. The quotient of such rationals
 * (denominators below 2^1300) is either exact in 6000 bits or further than
 * 2^-1300 relative from every midpoint, so one RN division then the
 * rounding is the correctly rounded quotient. */
static float ref_quot(mpfr_srcptr num, mpfr_srcptr den)
{
    mpfr_t q;
    mpfr_init2(q, 6000);
    mpfr_div(q, num, den, MPFR_RNDN);
    float r = (float)mpref_round(q, DL_F32);
    mpfr_clear(q);
    return r;
}

/* RN_fp32(a + b) / RN_fp32(a - b) of floats, exactly */
static float ref_add(float a, float b, int sub)
{
    mpfr_t x;
    mpfr_init2(x, 400);
    mpfr_set_flt(x, a, MPFR_RNDN);
    if (sub)
        mpfr_sub_d(x, x, b, MPFR_RNDN);
    else
        mpfr_add_d(x, x, b, MPFR_RNDN);
    float r = (float)mpref_round(x, DL_F32);
    mpfr_clear(x);
    return r;
}

/* The selection by ranks (how many candidates beat each one), not by
 * sorting; keys, group sums and margins in MPFR; weights as exact MPFR
 * quotients. */
static void ref_topk(const dl_route_config_t *c, const float *s, const float *bias,
                     int32_t *ids, float *w, float *margin)
{
    int64_t E = c->experts, k = c->top_k, ng = c->n_group, tg = c->topk_group, G = E / ng;
    float *key = malloc(E * sizeof *key), *gs = malloc(ng * sizeof *gs);
    char *ok = malloc(E);
    for (int64_t e = 0; e < E; e++) {
        key[e] = c->has_bias ? ref_add(s[e], bias[e], 0) : s[e];
        ok[e] = 1;
    }
    float gap = INFINITY;
    if (ng > 1 && tg < ng) {
        int64_t nb = c->group_score == DL_GROUP_MAX ? 1
                   : c->group_score == DL_GROUP_TOP2_SUM ? 2 : k / tg;
        if (nb < 1)
            nb = 1;
        if (nb > G)
            nb = G;
        for (int64_t g = 0; g < ng; g++) {
            /* sum of the keys ranked < nb in the group */
            mpfr_t sum;
            mpfr_init2(sum, 600);
            mpfr_set_zero(sum, 1);
            for (int64_t a = g * G; a < (g + 1) * G; a++) {
                int64_t rank = 0;
                for (int64_t b = g * G; b < (g + 1) * G; b++)
                    rank += key[b] > key[a] || (key[b] == key[a] && b < a);
                if (rank < nb)
                    mpfr_add_d(sum, sum, key[a], MPFR_RNDN);
            }
            gs[g] = (float)mpref_round(sum, DL_F32);
            mpfr_clear(sum);
        }
        int64_t at[2] = {-1, -1}; /* groups ranked tg - 1 and tg */
        for (int64_t g = 0; g < ng; g++) {
            int64_t rank = 0;
            for (int64_t h = 0; h < ng; h++)
                rank += gs[h] > gs[g] || (gs[h] == gs[g] && h < g);
            for (int64_t a = g * G; a < (g + 1) * G; a++)
                ok[a] = rank < tg;
            if (rank == tg - 1)
                at[0] = g;
            if (rank == tg)
                at[1] = g;
        }
        gap = ref_add(gs[at[0]], gs[at[1]], 1);
    }
    int64_t nsel = 0, kth = -1, next = -1;
    for (int64_t e = 0; e < E; e++) {
        if (!ok[e])
            continue;
        nsel++;
        int64_t rank = 0;
        for (int64_t f = 0; f < E; f++)
            rank += ok[f] && (key[f] > key[e] || (key[f] == key[e] && f < e));
        if (rank < k)
            ids[rank] = (int32_t)e;
        if (rank == k - 1)
            kth = e;
        if (rank == k)
            next = e;
    }
    if (nsel > k) {
        float eg = ref_add(key[kth], key[next], 1);
        gap = eg < gap ? eg : gap;
    }
    *margin = gap == 0 ? 0.0f : gap;
    mpfr_t num, den;
    mpfr_inits2(EXACT_P, num, den, (mpfr_ptr)0);
    mpfr_set_zero(den, 1);
    for (int64_t j = 0; j < k; j++)
        mpfr_add_d(den, den, s[ids[j]], MPFR_RNDN);
    if (!c->renormalize)
        mpfr_set_ui(den, 1, MPFR_RNDN);
    for (int64_t j = 0; j < k; j++) {
        mpfr_set_d(num, c->scaling, MPFR_RNDN);
        mpfr_mul_d(num, num, s[ids[j]], MPFR_RNDN);
        w[j] = ref_quot(num, den);
        if (w[j] == 0)
            w[j] = 0.0f; /* an exact zero is +0 */
    }
    mpfr_clears(num, den, (mpfr_ptr)0);
    free(key);
    free(gs);
    free(ok);
}

/* d_scores (row of E) and d_logits of one token, exactly in MPFR */
static void ref_backward(const dl_route_config_t *c, const float *s, const int32_t *ids,
                         const float *dw, float *ds, float *dl)
{
    int64_t E = c->experts, k = c->top_k;
    mpfr_t S, N, q, t;
    mpfr_inits2(EXACT_P, S, N, q, t, (mpfr_ptr)0);
    mpfr_set_zero(S, 1);
    for (int64_t i = 0; i < k; i++)
        mpfr_add_d(S, S, s[ids[i]], MPFR_RNDN);
    for (int64_t e = 0; e < E; e++)
        ds[e] = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        if (!c->renormalize) {
            mpfr_set_d(N, c->scaling, MPFR_RNDN);
            mpfr_mul_d(N, N, dw[j], MPFR_RNDN);
            ds[ids[j]] = (float)mpref_round(N, DL_F32);
        } else {
            /* c (dw_j S - sum_i dw_i s_i) / S^2 */
            mpfr_mul_d(N, S, dw[j], MPFR_RNDN);
            for (int64_t i = 0; i < k; i++) {
                mpfr_set_d(t, dw[i], MPFR_RNDN);
                mpfr_mul_d(t, t, s[ids[i]], MPFR_RNDN);
                mpfr_sub(N, N, t, MPFR_RNDN);
            }
            mpfr_mul_d(N, N, c->scaling, MPFR_RNDN);
            mpfr_sqr(q, S, MPFR_RNDN);
            ds[ids[j]] = ref_quot(N, q);
        }
        if (ds[ids[j]] == 0)
            ds[ids[j]] = 0.0f;
    }
    for (int64_t e = 0; e < E; e++) {
        mpfr_set_zero(N, 1);
        if (c->score_fn == DL_SCORE_SIGMOID) {
            mpfr_set_d(t, 1.0, MPFR_RNDN);
            mpfr_sub_d(t, t, s[e], MPFR_RNDN);
            mpfr_mul_d(t, t, s[e], MPFR_RNDN);
            mpfr_mul_d(N, t, ds[e], MPFR_RNDN);
        } else {
            for (int64_t j = 0; j < E; j++) {
                mpfr_set_d(t, s[j], MPFR_RNDN);
                mpfr_mul_d(t, t, ds[j], MPFR_RNDN);
                mpfr_sub(N, N, t, MPFR_RNDN);
            }
            mpfr_add_d(N, N, ds[e], MPFR_RNDN);
            mpfr_mul_d(N, N, s[e], MPFR_RNDN);
        }
        dl[e] = (float)mpref_round(N, DL_F32);
        if (dl[e] == 0)
            dl[e] = 0.0f;
    }
    mpfr_clears(S, N, q, t, (mpfr_ptr)0);
}

/* ------------------------------------------------------------ generators */

static float wide_f(dl_test_rng_t *r, int emin, int emax)
{
    double m = 1.0 + dl_test_unif(r);
    int e = emin + (int)(dl_test_next(r) % (uint64_t)(emax - emin + 1));
    double x = ldexp(m, e);
    return (float)((dl_test_next(r) & 1) ? -x : x);
}

/* a row of logits of a random kind */
static void random_logits(dl_test_rng_t *r, float *l, int64_t E)
{
    int kind = (int)(dl_test_next(r) % 8);
    double sigma = kind == 0 ? 100 : kind == 1 ? 1e4 : kind == 2 ? 30 : 3;
    for (int64_t e = 0; e < E; e++) {
        l[e] = (float)(sigma * dl_test_normal(r));
        if (kind == 3 && e % 3 == 0)
            l[e] = -3e38f; /* exp far below every range */
        if (kind == 4)
            l[e] = 1.5f; /* all equal: 1/E */
        if (kind == 5 && e > 0)
            l[e] = l[0] - (float)(85 + 25 * dl_test_unif(r)); /* subnormal scores */
        if (kind == 6)
            l[e] = wide_f(r, -140, 10);
    }
}

/* ---------------------------------------------------------------- config */

START_TEST(config_validate)
{
    dl_route_config_t c = cfg(256, 8, DL_SCORE_SIGMOID);
    c.n_group = 8;
    c.topk_group = 4;
    c.group_score = DL_GROUP_TOP2_SUM;
    c.renormalize = 1;
    c.scaling = 2.5;
    c.has_bias = 1;
    ck_assert_int_eq(dl_route_config_validate(&c), 0);
    dl_route_config_t b = c;
    ck_assert_int_eq(dl_route_config_validate(NULL), DL_EINVAL);
    b.experts = 0;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = c, b.top_k = 0;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = c, b.top_k = 257;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = c, b.n_group = 7;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = c, b.topk_group = 9;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = c, b.topk_group = 0;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = c, b.topk_group = 1, b.top_k = 33; /* more than one group of 32 holds */
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b.top_k = 32;
    ck_assert_int_eq(dl_route_config_validate(&b), 0);
    b = c, b.scaling = 0;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = c, b.scaling = INFINITY;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = c, b.scaling = NAN;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = c, b.score_fn = (dl_score_fn_t)7;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = c, b.group_score = (dl_group_score_t)3;
    ck_assert_int_eq(dl_route_config_validate(&b), DL_EINVAL);
    b = cfg(1, 1, DL_SCORE_SOFTMAX);
    ck_assert_int_eq(dl_route_config_validate(&b), 0);
}
END_TEST

/* ---------------------------------------------------------------- scores */

START_TEST(softmax_random_vs_mpfr)
{
    dl_test_rng_t r = {21};
    static const int64_t Es[] = {1, 2, 3, 8, 64, 256};
    uint64_t outs = 0, f0 = dl__mpfr_fallbacks();
    for (int ei = 0; ei < 6; ei++) {
        int64_t E = Es[ei], T = ei < 4 ? 300 : ei == 4 ? 120 : 30;
        dl_route_config_t c = cfg(E, 1, DL_SCORE_SOFTMAX);
        float *l = malloc(T * E * sizeof *l), *s = malloc(T * E * sizeof *s);
        float *w = malloc(E * sizeof *w);
        for (int64_t t = 0; t < T; t++)
            random_logits(&r, l + t * E, E);
        ck_assert_int_eq(dl_route_scores(&c, l, T, s), 0);
        for (int64_t t = 0; t < T; t++) {
            ref_softmax(l + t * E, E, w);
            for (int64_t e = 0; e < E; e++)
                ck_assert_msg(same_value(s[t * E + e], w[e]),
                              "E=%lld t=%lld e=%lld: %a, MPFR %a (logit %a)", (long long)E,
                              (long long)t, (long long)e, s[t * E + e], w[e], l[t * E + e]);
        }
        outs += T * E;
        free(l);
        free(s);
        free(w);
    }
    fprintf(stderr, "# softmax (wide rows): %llu fallbacks in %llu outputs\n",
            (unsigned long long)(dl__mpfr_fallbacks() - f0), (unsigned long long)outs);
}
END_TEST

START_TEST(sigmoid_random_vs_mpfr)
{
    dl_test_rng_t r = {22};
    int64_t T = 1000, E = 100;
    dl_route_config_t c = cfg(E, 1, DL_SCORE_SIGMOID);
    float *l = malloc(T * E * sizeof *l), *s = malloc(T * E * sizeof *s);
    for (int64_t i = 0; i < T * E; i++) {
        switch (i % 6) {
        case 0: l[i] = wide_f(&r, -149, 127); break;
        case 1: l[i] = -(float)(80 + 30 * dl_test_unif(&r)); break; /* subnormal scores */
        case 2: l[i] = (float)(20 * dl_test_normal(&r)); break;
        default: l[i] = (float)(2 * dl_test_normal(&r)); break;
        }
    }
    uint64_t f0 = dl__mpfr_fallbacks();
    ck_assert_int_eq(dl_route_scores(&c, l, T, s), 0);
    for (int64_t i = 0; i < T * E; i++) {
        float w = ref_sigmoid(l[i]);
        ck_assert_msg(same_value(s[i], w), "sigmoid(%a) = %a, MPFR %a", l[i], s[i], w);
    }
    fprintf(stderr, "# sigmoid (wide): %llu fallbacks in %lld outputs\n",
            (unsigned long long)(dl__mpfr_fallbacks() - f0), (long long)(T * E));
    /* specials */
    float x[] = {0.0f, -0.0f, 1e-45f, -1e-45f, 3e38f, -3e38f, 103.0f, -103.0f, -103.28f,
                 -103.97f, -104.0f, 17.0f, 16.6f, 88.7f, -88.7f, -87.3f};
    int n = sizeof x / sizeof x[0];
    float y[sizeof x / sizeof x[0]];
    c = cfg(n, 1, DL_SCORE_SIGMOID);
    ck_assert_int_eq(dl_route_scores(&c, x, 1, y), 0);
    for (int i = 0; i < n; i++)
        ck_assert_msg(same_value(y[i], ref_sigmoid(x[i])), "sigmoid(%a) = %a", x[i], y[i]);
    ck_assert(y[0] == 0.5f && y[4] == 1.0f && y[5] == 0.0f && !signbit(y[5]));
    free(l);
    free(s);
}
END_TEST

/* Typical router logits: the share of outputs that need MPFR. */
START_TEST(scores_fallback_share)
{
    dl_test_rng_t r = {23};
    int64_t T = 4096, E = 64;
    float *l = malloc(T * E * sizeof *l), *s = malloc(T * E * sizeof *s);
    for (int64_t i = 0; i < T * E; i++)
        l[i] = (float)(2 * dl_test_normal(&r));
    dl_route_config_t c = cfg(E, 1, DL_SCORE_SOFTMAX);
    uint64_t f0 = dl__mpfr_fallbacks();
    ck_assert_int_eq(dl_route_scores(&c, l, T, s), 0);
    uint64_t fs = dl__mpfr_fallbacks() - f0;
    c.score_fn = DL_SCORE_SIGMOID;
    f0 = dl__mpfr_fallbacks();
    ck_assert_int_eq(dl_route_scores(&c, l, T, s), 0);
    uint64_t fg = dl__mpfr_fallbacks() - f0;
    fprintf(stderr, "# softmax N(0,4) E=64: %llu fallbacks in %lld (%.2e); sigmoid: %llu (%.2e)\n",
            (unsigned long long)fs, (long long)(T * E), (double)fs / (T * E),
            (unsigned long long)fg, (double)fg / (T * E));
    for (int64_t i = 0; i < T * E; i += 61)
        ck_assert(same_value(s[i], ref_sigmoid(l[i])));
    ck_assert(fs + fg < (uint64_t)(T * E) / 1000);
    free(l);
    free(s);
}
END_TEST

/* Logits whose sigmoid lies within ~2^-26 fp32 ulps of a midpoint: found
 * by screening every float in [1, 8) and (-8, -1] with the platform libm in
 * binary64, then judged by MPFR. The certified binary64 evaluation cannot
 * decide them, so the fallback must run. The same values as 2-expert
 * softmax rows [x, 0] (softmax_0 = sigmoid(x)). */
START_TEST(scores_adversarial_midpoints)
{
    enum { NC = 8 };
    float cand[NC];
    double cd[NC];
    for (int i = 0; i < NC; i++)
        cand[i] = 1, cd[i] = 1;
    double thr = 1;
    for (int sign = 0; sign < 2; sign++)
        for (float x = 1.0f; x < 8.0f; x = nextafterf(x, 9.0f)) {
            double xv = sign ? -(double)x : x;
            double s = 1.0 / (1.0 + exp(-xv));
            int e;
            frexp(s, &e);
            double units = ldexp(s, 24 - e); /* s / ulp_fp32(s) */
            double d = fabs(units - floor(units) - 0.5);
            if (d >= thr)
                continue;
            int worst = 0;
            for (int i = 1; i < NC; i++)
                worst = cd[i] > cd[worst] ? i : worst;
            cd[worst] = d;
            cand[worst] = (float)xv;
            thr = 0;
            for (int i = 0; i < NC; i++)
                thr = cd[i] > thr ? cd[i] : thr;
        }
    float out[NC], rows[2 * NC], sm[2 * NC];
    dl_route_config_t c = cfg(NC, 1, DL_SCORE_SIGMOID);
    uint64_t f0 = dl__mpfr_fallbacks();
    ck_assert_int_eq(dl_route_scores(&c, cand, 1, out), 0);
    uint64_t fb = dl__mpfr_fallbacks() - f0;
    for (int i = 0; i < NC; i++) {
        ck_assert_msg(same_value(out[i], ref_sigmoid(cand[i])), "sigmoid(%a) = %a, MPFR %a",
                      cand[i], out[i], ref_sigmoid(cand[i]));
        rows[2 * i] = cand[i];
        rows[2 * i + 1] = 0.0f;
    }
    c = cfg(2, 1, DL_SCORE_SOFTMAX);
    f0 = dl__mpfr_fallbacks();
    ck_assert_int_eq(dl_route_scores(&c, rows, NC, sm), 0);
    uint64_t fs = dl__mpfr_fallbacks() - f0;
    for (int i = 0; i < NC; i++) {
        float w[2];
        ref_softmax(rows + 2 * i, 2, w);
        ck_assert(same_value(sm[2 * i], w[0]) && same_value(sm[2 * i + 1], w[1]));
        ck_assert(same_value(sm[2 * i], out[i]));
    }
    fprintf(stderr, "# near-midpoint logits: %llu of %d sigmoids, %llu of %d softmax rows fell back\n",
            (unsigned long long)fb, NC, (unsigned long long)fs, NC);
    ck_assert(fb >= 1 && fs >= 1);
}
END_TEST

START_TEST(scores_errors)
{
    dl_route_config_t c = cfg(4, 2, DL_SCORE_SOFTMAX);
    float l[8] = {1, 2, 3, 4, 5, 6, 7, 8}, s[8];
    ck_assert_int_eq(dl_route_scores(&c, NULL, 0, NULL), 0);
    ck_assert_int_eq(dl_route_scores(&c, l, -1, s), DL_EINVAL);
    ck_assert_int_eq(dl_route_scores(&c, NULL, 2, s), DL_EINVAL);
    l[5] = NAN;
    ck_assert_int_eq(dl_route_scores(&c, l, 2, s), DL_ENONFINITE);
    l[5] = -INFINITY;
    ck_assert_int_eq(dl_route_scores(&c, l, 2, s), DL_ENONFINITE);
    c.score_fn = DL_SCORE_SIGMOID;
    l[5] = INFINITY;
    ck_assert_int_eq(dl_route_scores(&c, l, 2, s), DL_ENONFINITE);
    c.top_k = 5;
    ck_assert_int_eq(dl_route_scores(&c, l, 2, s), DL_EINVAL);
}
END_TEST

/* ------------------------------------------------------------------ top-k */

static void check_topk(const dl_route_config_t *c, const float *s, const float *bias, int64_t T)
{
    int64_t E = c->experts, k = c->top_k;
    int32_t *ids = malloc(T * k * sizeof *ids), *rid = malloc(k * sizeof *rid);
    float *w = malloc(T * k * sizeof *w), *m = malloc(T * sizeof *m), *rw = malloc(k * sizeof *rw);
    ck_assert_int_eq(dl_route_topk(c, s, bias, T, ids, w, m), 0);
    for (int64_t t = 0; t < T; t++) {
        float rm;
        ref_topk(c, s + t * E, bias, rid, rw, &rm);
        for (int64_t j = 0; j < k; j++) {
            ck_assert_msg(ids[t * k + j] == rid[j], "t=%lld j=%lld: id %d, reference %d",
                          (long long)t, (long long)j, ids[t * k + j], rid[j]);
            ck_assert_msg(same_value(w[t * k + j], rw[j]), "t=%lld j=%lld: weight %a, MPFR %a",
                          (long long)t, (long long)j, w[t * k + j], rw[j]);
        }
        ck_assert_msg(same_value(m[t], rm), "t=%lld: margin %a, reference %a", (long long)t,
                      m[t], rm);
    }
    free(ids);
    free(rid);
    free(w);
    free(m);
    free(rw);
}

START_TEST(topk_random_vs_reference)
{
    dl_test_rng_t r = {31};
    for (int trial = 0; trial < 40; trial++) {
        int64_t ng = (int64_t[]){1, 2, 4, 8}[trial % 4];
        int64_t E = ng * (int64_t[]){1, 2, 4, 8, 32}[(trial / 4) % 5];
        int64_t tg = 1 + (int64_t)(dl_test_next(&r) % ng);
        int64_t kmax = tg * (E / ng);
        int64_t k = 1 + (int64_t)(dl_test_next(&r) % (kmax < 9 ? kmax : 9));
        dl_route_config_t c = cfg(E, k, trial % 2 ? DL_SCORE_SIGMOID : DL_SCORE_SOFTMAX);
        c.n_group = ng;
        c.topk_group = tg;
        c.group_score = (dl_group_score_t)(trial % 3);
        c.renormalize = (trial / 2) % 2;
        c.scaling = trial % 5 == 0 ? 2.5 : 1.0;
        c.has_bias = trial % 3 == 1;
        int64_t T = 40;
        float *l = malloc(T * E * sizeof *l), *s = malloc(T * E * sizeof *s);
        float *bias = malloc(E * sizeof *bias);
        for (int64_t i = 0; i < T * E; i++)
            l[i] = (float)(2 * dl_test_normal(&r));
        for (int64_t e = 0; e < E; e++)
            bias[e] = (float)(0.05 * dl_test_normal(&r));
        if (trial % 7 == 3) /* quantised logits: many exact ties */
            for (int64_t i = 0; i < T * E; i++)
                l[i] = roundf(l[i]);
        ck_assert_int_eq(dl_route_scores(&c, l, T, s), 0);
        check_topk(&c, s, bias, T);
        free(l);
        free(s);
        free(bias);
    }
}
END_TEST

START_TEST(topk_edges)
{
    int32_t ids[8];
    float w[8], m[2];
    /* T = 0 */
    dl_route_config_t c = cfg(4, 2, DL_SCORE_SOFTMAX);
    ck_assert_int_eq(dl_route_topk(&c, NULL, NULL, 0, NULL, NULL, NULL), 0);
    /* E = 1 */
    c = cfg(1, 1, DL_SCORE_SOFTMAX);
    float one = 1.0f;
    ck_assert_int_eq(dl_route_topk(&c, &one, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 0 && w[0] == 1.0f && isinf(m[0]) && m[0] > 0);
    c.renormalize = 1;
    c.scaling = 2.5;
    float third = 0.3f;
    ck_assert_int_eq(dl_route_topk(&c, &third, NULL, 1, ids, w, m), 0);
    ck_assert(w[0] == 2.5f);
    /* k = E: everything selected, best first, nothing competes */
    c = cfg(4, 4, DL_SCORE_SOFTMAX);
    float s4[4] = {0.1f, 0.4f, 0.2f, 0.3f};
    ck_assert_int_eq(dl_route_topk(&c, s4, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 1 && ids[1] == 3 && ids[2] == 2 && ids[3] == 0 && isinf(m[0]));
    check_topk(&c, s4, NULL, 1);
    /* exact tie at the k boundary: the lower index wins, margin +0 */
    c = cfg(4, 2, DL_SCORE_SOFTMAX);
    float st[4] = {0.1f, 0.3f, 0.3f, 0.3f};
    ck_assert_int_eq(dl_route_topk(&c, st, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 1 && ids[1] == 2 && m[0] == 0 && !signbit(m[0]));
    check_topk(&c, st, NULL, 1);
    /* near tie: margin is the exact difference, here one ulp */
    float sn[4] = {0.1f, 0.3f, nextafterf(0.3f, 1), 0.2f};
    ck_assert_int_eq(dl_route_topk(&c, sn, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 2 && ids[1] == 1 && m[0] == 0.3f - 0.2f);
    c.top_k = 1;
    ck_assert_int_eq(dl_route_topk(&c, sn, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 2 && m[0] == nextafterf(0.3f, 1) - 0.3f && m[0] > 0);
    /* non-finite inputs */
    c = cfg(4, 2, DL_SCORE_SIGMOID);
    c.has_bias = 1;
    float bias[4] = {0, 0, 0, 0};
    float sb[4] = {0.1f, NAN, 0.2f, 0.3f};
    ck_assert_int_eq(dl_route_topk(&c, sb, bias, 1, ids, w, m), DL_ENONFINITE);
    sb[1] = INFINITY;
    ck_assert_int_eq(dl_route_topk(&c, sb, bias, 1, ids, w, m), DL_ENONFINITE);
    sb[1] = 0.5f;
    bias[3] = -INFINITY;
    ck_assert_int_eq(dl_route_topk(&c, sb, bias, 1, ids, w, m), DL_ENONFINITE);
    ck_assert_int_eq(dl_route_topk(&c, sb, NULL, 1, ids, w, m), DL_EINVAL);
    bias[3] = 3e38f;
    sb[3] = 3e38f; /* the key overflows fp32 */
    ck_assert_int_eq(dl_route_topk(&c, sb, bias, 1, ids, w, m), DL_ENONFINITE);
    /* renormalising a zero sum */
    c = cfg(4, 2, DL_SCORE_SIGMOID);
    c.renormalize = 1;
    float sz[4] = {0, 0, 0, 0};
    ck_assert_int_eq(dl_route_topk(&c, sz, NULL, 1, ids, w, m), DL_ENONFINITE);
    c.renormalize = 0;
    ck_assert_int_eq(dl_route_topk(&c, sz, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 0 && ids[1] == 1 && w[0] == 0 && !signbit(w[0]));
}
END_TEST

START_TEST(topk_groups)
{
    int32_t ids[8];
    float w[8], m[1];
    /* TOP2_SUM and TOPK_SUM disagree: group 0 has two strong experts,
     * group 1 four good ones */
    float s[8] = {0.9f, 0.8f, 0.0f, 0.0f, 0.6f, 0.6f, 0.6f, 0.6f};
    dl_route_config_t c = cfg(8, 4, DL_SCORE_SIGMOID);
    c.n_group = 2;
    c.topk_group = 1;
    c.group_score = DL_GROUP_TOP2_SUM;
    ck_assert_int_eq(dl_route_topk(&c, s, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 0 && ids[1] == 1 && ids[2] == 2 && ids[3] == 3);
    ck_assert(m[0] == 1.7f - 1.2f); /* only the group scores compete */
    check_topk(&c, s, NULL, 1);
    c.group_score = DL_GROUP_TOPK_SUM;
    ck_assert_int_eq(dl_route_topk(&c, s, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 4 && ids[1] == 5 && ids[2] == 6 && ids[3] == 7);
    check_topk(&c, s, NULL, 1);
    c.group_score = DL_GROUP_MAX;
    ck_assert_int_eq(dl_route_topk(&c, s, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 0);
    check_topk(&c, s, NULL, 1);
    /* a tie between group scores: the lower group is kept */
    float sg[8] = {0.1f, 0.5f, 0.2f, 0.2f, 0.5f, 0.1f, 0.9f, 0.0f};
    c = cfg(8, 2, DL_SCORE_SIGMOID);
    c.n_group = 4;
    c.topk_group = 1;
    c.group_score = DL_GROUP_MAX; /* groups: 0.5, 0.2, 0.5, 0.9 */
    c.topk_group = 2;
    ck_assert_int_eq(dl_route_topk(&c, sg, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 6 && ids[1] == 1 && m[0] == 0); /* group 0 beats group 2 */
    check_topk(&c, sg, NULL, 1);
    /* group sums are rounded once to fp32: 1 + 2^-24 + 2^-24 vs 1 + 2^-23 */
    float sr[4] = {1.0f, 0x1p-24f, 1.0f, 0x1p-23f};
    c = cfg(4, 1, DL_SCORE_SIGMOID);
    c.n_group = 2;
    c.topk_group = 1;
    c.group_score = DL_GROUP_TOP2_SUM; /* sums: RN(1 + 2^-24) = 1, 1 + 2^-23 */
    ck_assert_int_eq(dl_route_topk(&c, sr, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 2 && m[0] == 0x1p-23f);
    check_topk(&c, sr, NULL, 1);
}
END_TEST

/* The stages the runner shares with the oracle: weights of a given
 * selection (dl_route_topk's own, and every refusal), the one group-score
 * rule, and the score VJP for any d_scores (dl_route_backward's on its own
 * d_scores, and every refusal). */
START_TEST(shared_route_stages)
{
    dl_test_rng_t rng = {77};
    const int64_t T = 40, E = 8, k = 3;
    dl_route_config_t c = cfg(E, k, DL_SCORE_SOFTMAX);
    c.renormalize = 1;
    c.scaling = 2.5;
    float lg[40 * 8], s[40 * 8], w[40 * 3], w2[3], dw[40 * 3], ds[40 * 8], dl1[40 * 8], dl2[40 * 8];
    int32_t ids[40 * 3];
    for (int64_t i = 0; i < T * E; i++)
        lg[i] = (float)dl_test_normal(&rng);
    for (int64_t i = 0; i < T * k; i++)
        dw[i] = (float)dl_test_normal(&rng);
    ck_assert_int_eq(dl_route_scores(&c, lg, T, s), 0);
    ck_assert_int_eq(dl_route_topk(&c, s, NULL, T, ids, w, NULL), 0);
    for (int64_t t = 0; t < T; t++) {
        ck_assert_int_eq(dl_route_weights(&c, s + t * E, ids + t * k, w2), 0);
        ck_assert(memcmp(w2, w + t * k, sizeof w2) == 0);
    }
    int32_t bad[3] = {0, 1, 8};
    ck_assert_int_eq(dl_route_weights(&c, s, bad, w2), DL_ERANGE);
    bad[2] = 1;
    ck_assert_int_eq(dl_route_weights(&c, s, bad, w2), DL_EINVAL);
    float nan_row[8] = {0.1f, NAN, 0.2f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f};
    int32_t sel[3] = {0, 1, 2};
    ck_assert_int_eq(dl_route_weights(&c, nan_row, sel, w2), DL_ENONFINITE);
    ck_assert_int_eq(dl_route_weights(&c, NULL, sel, w2), DL_EINVAL);
    /* the group rule: 1 for max, 2 for top2_sum, k / topk_group for topk_sum,
     * never more than the group size */
    dl_route_config_t g = cfg(8, 2, DL_SCORE_SIGMOID);
    ck_assert_int_eq(dl_route_group_terms(&g), 1);
    g.n_group = 4;
    g.topk_group = 2;
    g.group_score = DL_GROUP_MAX;
    ck_assert_int_eq(dl_route_group_terms(&g), 1);
    g.group_score = DL_GROUP_TOP2_SUM;
    ck_assert_int_eq(dl_route_group_terms(&g), 2);
    g.group_score = DL_GROUP_TOPK_SUM;
    g.top_k = 2;
    g.topk_group = 2;
    ck_assert_int_eq(dl_route_group_terms(&g), 1);
    g.top_k = 4;
    g.topk_group = 1;
    ck_assert_int_eq(dl_route_group_terms(&g), 2); /* 4 keys asked, groups of 2 */
    /* the score VJP on dl_route_backward's own d_scores gives its d_logits */
    ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, T, ds, dl1), 0);
    ck_assert_int_eq(dl_route_scores_backward(&c, s, ds, T, dl2), 0);
    ck_assert(memcmp(dl1, dl2, sizeof dl1) == 0);
    ck_assert_int_eq(dl_route_scores_backward(&c, s, ds, -1, dl2), DL_EINVAL);
    ck_assert_int_eq(dl_route_scores_backward(&c, s, NULL, T, dl2), DL_EINVAL);
    ds[3] = INFINITY;
    ck_assert_int_eq(dl_route_scores_backward(&c, s, ds, T, dl2), DL_ENONFINITE);
}
END_TEST

START_TEST(topk_bias_and_weights)
{
    int32_t ids[4];
    float w[4], m[1];
    /* the bias moves expert 2 ahead of expert 1; the weights use the scores */
    float s[4] = {0.9f, 0.5f, 0.4f, 0.1f}, bias[4] = {0, 0, 0.2f, 0};
    dl_route_config_t c = cfg(4, 2, DL_SCORE_SIGMOID);
    c.renormalize = 1;
    ck_assert_int_eq(dl_route_topk(&c, s, NULL, 1, ids, w, m), 0);
    ck_assert(ids[0] == 0 && ids[1] == 1);
    c.has_bias = 1;
    ck_assert_int_eq(dl_route_topk(&c, s, bias, 1, ids, w, m), 0);
    ck_assert(ids[0] == 0 && ids[1] == 2);
    check_topk(&c, s, bias, 1);
    /* renormalisation off, scaling 2.5 */
    c.renormalize = 0;
    c.scaling = 2.5;
    ck_assert_int_eq(dl_route_topk(&c, s, bias, 1, ids, w, m), 0);
    ck_assert(w[0] == (float)(2.5 * 0.9f) && w[1] == (float)(2.5 * 0.4f));
    check_topk(&c, s, bias, 1);
    c.renormalize = 1;
    check_topk(&c, s, bias, 1);
    /* a weight that is exactly an fp32 midpoint: 3 (1/2 + 2^-24) / 1 =
     * 3/2 + 3 * 2^-24 lies halfway between 3/2 + 2^-23 and 3/2 + 2^-22; it
     * must tie to even (3/2 + 2^-22): the exact midpoint comparison */
    float sm[2] = {0.5f + 0x1p-24f, 0.5f - 0x1p-24f};
    c = cfg(2, 2, DL_SCORE_SIGMOID);
    c.renormalize = 1;
    c.scaling = 3.0;
    ck_assert_int_eq(dl_route_topk(&c, sm, NULL, 1, ids, w, m), 0);
    ck_assert(w[0] == 1.5f + 0x1p-22f);
    check_topk(&c, sm, NULL, 1);
    c.renormalize = 0; /* the same midpoint through the exact accumulator */
    ck_assert_int_eq(dl_route_topk(&c, sm, NULL, 1, ids, w, m), 0);
    ck_assert(w[0] == 1.5f + 0x1p-22f);
    /* just off the midpoint, by 2^-149 / 1 in the sum: rounds down */
    float sm3[3] = {0.5f + 0x1p-24f, 0.5f - 0x1p-24f, 0x1p-149f};
    c = cfg(3, 3, DL_SCORE_SIGMOID);
    c.renormalize = 1;
    c.scaling = 3.0;
    ck_assert_int_eq(dl_route_topk(&c, sm3, NULL, 1, ids, w, m), 0);
    ck_assert(w[0] == 1.5f + 0x1p-23f);
    check_topk(&c, sm3, NULL, 1);
    /* weights beyond the binary64 certification range go to MPFR */
    c.scaling = 0x1p1010;
    uint64_t f0 = dl__mpfr_fallbacks();
    ck_assert_int_eq(dl_route_topk(&c, sm3, NULL, 1, ids, w, m), 0);
    ck_assert(dl__mpfr_fallbacks() - f0 >= 1);
    ck_assert(w[0] == INFINITY && w[1] == INFINITY);
    check_topk(&c, sm3, NULL, 1);
    c.scaling = 0x1p-1010;
    ck_assert_int_eq(dl_route_topk(&c, sm3, NULL, 1, ids, w, m), 0);
    ck_assert(w[0] == 0 && !signbit(w[0]));
    check_topk(&c, sm3, NULL, 1);
}
END_TEST

/* -------------------------------------------------------------- backward */

static void check_backward(const dl_route_config_t *c, const float *s, const int32_t *ids,
                           const float *dw, int64_t T)
{
    int64_t E = c->experts;
    float *ds = malloc(T * E * sizeof *ds), *dl = malloc(T * E * sizeof *dl);
    float *dl2 = malloc(T * E * sizeof *dl2);
    float *rs = malloc(E * sizeof *rs), *rl = malloc(E * sizeof *rl);
    ck_assert_int_eq(dl_route_backward(c, s, ids, dw, T, ds, dl), 0);
    ck_assert_int_eq(dl_route_backward(c, s, ids, dw, T, NULL, dl2), 0);
    ck_assert(memcmp(dl, dl2, T * E * sizeof *dl) == 0);
    for (int64_t t = 0; t < T; t++) {
        ref_backward(c, s + t * E, ids + t * c->top_k, dw + t * c->top_k, rs, rl);
        for (int64_t e = 0; e < E; e++) {
            ck_assert_msg(same_value(ds[t * E + e], rs[e]), "t=%lld e=%lld: d_score %a, MPFR %a",
                          (long long)t, (long long)e, ds[t * E + e], rs[e]);
            ck_assert_msg(same_value(dl[t * E + e], rl[e]), "t=%lld e=%lld: d_logit %a, MPFR %a",
                          (long long)t, (long long)e, dl[t * E + e], rl[e]);
        }
    }
    free(ds);
    free(dl);
    free(dl2);
    free(rs);
    free(rl);
}

START_TEST(backward_vs_mpfr)
{
    dl_test_rng_t r = {41};
    for (int trial = 0; trial < 16; trial++) {
        int64_t E = (int64_t[]){4, 16, 64, 256}[trial % 4], k = 1 + trial % 8;
        if (k > E)
            k = E;
        dl_route_config_t c = cfg(E, k, trial % 2 ? DL_SCORE_SIGMOID : DL_SCORE_SOFTMAX);
        c.renormalize = (trial / 2) % 2;
        c.scaling = trial % 3 ? 2.5 : 1.0;
        int64_t T = E == 256 ? 8 : 40;
        float *l = malloc(T * E * sizeof *l), *s = malloc(T * E * sizeof *s);
        float *dw = malloc(T * k * sizeof *dw), *w = malloc(T * k * sizeof *w);
        int32_t *ids = malloc(T * k * sizeof *ids);
        for (int64_t i = 0; i < T * E; i++)
            l[i] = (float)(3 * dl_test_normal(&r));
        for (int64_t i = 0; i < T * k; i++)
            dw[i] = trial % 5 == 4 ? wide_f(&r, -140, 100) : (float)dl_test_normal(&r);
        if (trial % 4 == 3) /* equal d_weights: renormalised gradients cancel exactly */
            for (int64_t i = 0; i < T * k; i++)
                dw[i] = 0.25f;
        ck_assert_int_eq(dl_route_scores(&c, l, T, s), 0);
        ck_assert_int_eq(dl_route_topk(&c, s, NULL, T, ids, w, NULL), 0);
        check_backward(&c, s, ids, dw, T);
        free(l);
        free(s);
        free(dw);
        free(w);
        free(ids);
    }
}
END_TEST

/* L(x) = sum_j dw_j c p_{id_j}(x) / (renormalize ? sum_i p_{id_i}(x) : 1)
 * with p = x (mode 0: the weight function of the scores) or p = softmax /
 * sigmoid of logits x (mode 1), exactly in MPFR at precision P. */
static void loss(const dl_route_config_t *c, const mpfr_t *x, const int32_t *ids,
                 const float *dw, int mode, mpfr_t out)
{
    int64_t E = c->experts, k = c->top_k;
    mpfr_prec_t P = mpfr_get_prec(out);
    mpfr_t *p = malloc(E * sizeof(mpfr_t)), S, a;
    mpfr_inits2(P, S, a, (mpfr_ptr)0);
    mpfr_set_zero(S, 1);
    for (int64_t e = 0; e < E; e++) {
        mpfr_init2(p[e], P);
        if (mode == 0) {
            mpfr_set(p[e], x[e], MPFR_RNDN);
        } else if (c->score_fn == DL_SCORE_SOFTMAX) {
            mpfr_exp(p[e], x[e], MPFR_RNDN);
            mpfr_add(S, S, p[e], MPFR_RNDN);
        } else {
            mpfr_neg(a, x[e], MPFR_RNDN);
            mpfr_exp(a, a, MPFR_RNDN);
            mpfr_add_ui(a, a, 1, MPFR_RNDN);
            mpfr_ui_div(p[e], 1, a, MPFR_RNDN);
        }
    }
    if (mode == 1 && c->score_fn == DL_SCORE_SOFTMAX)
        for (int64_t e = 0; e < E; e++)
            mpfr_div(p[e], p[e], S, MPFR_RNDN);
    mpfr_set_zero(S, 1);
    for (int64_t j = 0; j < k; j++)
        mpfr_add(S, S, p[ids[j]], MPFR_RNDN);
    mpfr_set_zero(out, 1);
    for (int64_t j = 0; j < k; j++) {
        mpfr_mul_d(a, p[ids[j]], dw[j] * c->scaling, MPFR_RNDN); /* 2.5 dw exact */
        if (c->renormalize)
            mpfr_div(a, a, S, MPFR_RNDN);
        mpfr_add(out, out, a, MPFR_RNDN);
    }
    for (int64_t e = 0; e < E; e++)
        mpfr_clear(p[e]);
    free(p);
    mpfr_clears(S, a, (mpfr_ptr)0);
}

/* Central differences of L in MPFR: d_scores bit-exact (mode 0: h = 2^-300
 * at 3000 bits leaves an O(h^2) error), d_logits within TOL_FD (mode 1). */
START_TEST(backward_vs_finite_differences)
{
    dl_test_rng_t r = {43};
    const mpfr_prec_t P = 3000;
    for (int trial = 0; trial < 12; trial++) {
        int64_t E = 3 + trial % 4, k = 1 + trial % 3;
        dl_route_config_t c = cfg(E, k, trial % 2 ? DL_SCORE_SIGMOID : DL_SCORE_SOFTMAX);
        c.renormalize = (trial / 2) % 2;
        c.scaling = trial % 3 ? 2.5 : 1.0;
        float l[6], s[6], w[3], dw[3], ds[6], dl[6];
        int32_t ids[3];
        for (int64_t e = 0; e < E; e++)
            l[e] = (float)(1.5 * dl_test_normal(&r));
        for (int64_t j = 0; j < k; j++)
            dw[j] = (float)dl_test_normal(&r);
        ck_assert_int_eq(dl_route_scores(&c, l, 1, s), 0);
        ck_assert_int_eq(dl_route_topk(&c, s, NULL, 1, ids, w, NULL), 0);
        ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, 1, ds, dl), 0);
        mpfr_t x[6], lp, lm, h;
        for (int64_t e = 0; e < E; e++)
            mpfr_init2(x[e], P);
        mpfr_inits2(P, lp, lm, h, (mpfr_ptr)0);
        double A = 0, scale = 0;
        for (int64_t e = 0; e < E; e++)
            A += (double)s[e] * ds[e];
        for (int64_t e = 0; e < E; e++)
            scale += fabs(s[e]) * (fabs(ds[e]) + fabs(A));
        for (int mode = 0; mode < 2; mode++) {
            for (int64_t e = 0; e < E; e++) {
                int hexp = mode == 0 ? -300 : -100;
                for (int64_t f = 0; f < E; f++)
                    mpfr_set_d(x[f], mode == 0 ? s[f] : l[f], MPFR_RNDN);
                mpfr_set_ui_2exp(h, 1, hexp, MPFR_RNDN);
                mpfr_add(x[e], x[e], h, MPFR_RNDN);
                loss(&c, x, ids, dw, mode, lp);
                mpfr_sub(x[e], x[e], h, MPFR_RNDN);
                mpfr_sub(x[e], x[e], h, MPFR_RNDN);
                loss(&c, x, ids, dw, mode, lm);
                mpfr_sub(lp, lp, lm, MPFR_RNDN);
                mpfr_div_2si(lp, lp, hexp + 1, MPFR_RNDN); /* / 2h */
                if (mode == 0) {
                    float fd = (float)mpref_round(lp, DL_F32);
                    ck_assert_msg(fd == ds[e], "trial %d: d_score[%lld] %a, FD %a", trial,
                                  (long long)e, ds[e], fd);
                } else {
                    double fd = mpfr_get_d(lp, MPFR_RNDN);
                    ck_assert_msg(fabs(fd - dl[e]) <= TOL_FD * scale + 1e-30,
                                  "trial %d: d_logit[%lld] %a, FD %a (scale %g)", trial,
                                  (long long)e, dl[e], fd, scale);
                }
            }
        }
        for (int64_t e = 0; e < E; e++)
            mpfr_clear(x[e]);
        mpfr_clears(lp, lm, h, (mpfr_ptr)0);
    }
}
END_TEST

START_TEST(backward_errors_and_edges)
{
    dl_route_config_t c = cfg(4, 2, DL_SCORE_SOFTMAX);
    float s[4] = {0.1f, 0.2f, 0.3f, 0.4f}, dw[2] = {1, -1}, ds[4], dl[4];
    int32_t ids[2] = {3, 2};
    ck_assert_int_eq(dl_route_backward(&c, NULL, NULL, NULL, 0, ds, dl), 0);
    ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, 1, NULL, NULL), 0);
    ids[1] = 4;
    ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, 1, ds, dl), DL_ERANGE);
    ids[1] = -1;
    ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, 1, ds, dl), DL_ERANGE);
    ids[1] = 3;
    ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, 1, ds, dl), DL_EINVAL);
    ids[1] = 2;
    dw[0] = NAN;
    ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, 1, ds, dl), DL_ENONFINITE);
    dw[0] = 1;
    s[0] = INFINITY;
    ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, 1, ds, dl), DL_ENONFINITE);
    s[0] = 0.1f;
    /* k = 1 with renormalisation: the weight is the constant c, no gradient */
    c = cfg(4, 1, DL_SCORE_SIGMOID);
    c.renormalize = 1;
    c.scaling = 2.5;
    ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, 1, ds, dl), 0);
    for (int e = 0; e < 4; e++)
        ck_assert(ds[e] == 0 && !signbit(ds[e]) && dl[e] == 0 && !signbit(dl[e]));
    /* without renormalisation: d_score = 2.5 dw, d_logit = d_score s (1 - s) */
    c.renormalize = 0;
    ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, 1, ds, dl), 0);
    ck_assert(ds[3] == 2.5f && ds[0] == 0 && dl[0] == 0);
    check_backward(&c, s, ids, dw, 1);
    /* d_score just below an fp32 midpoint: 3 dw_1 / S^2 with 3 dw_1 =
     * 3 + 3 * 2^-23 (halfway between 3 + 2^-22 and 3 + 2^-21) and
     * S = 1 + 2^-149: decided by the exact midpoint comparison */
    float s2[2] = {1.0f, 0x1p-149f}, dw2[2] = {0.0f, 1.0f + 0x1p-23f};
    int32_t id2[2] = {0, 1};
    c = cfg(2, 2, DL_SCORE_SIGMOID);
    c.renormalize = 1;
    c.scaling = 3.0;
    ck_assert_int_eq(dl_route_backward(&c, s2, id2, dw2, 1, ds, dl), 0);
    ck_assert(ds[1] == 3.0f + 0x1p-22f && ds[0] == -3 * 0x1p-149f);
    check_backward(&c, s2, id2, dw2, 1);
    s2[1] = 0.0f; /* now exactly the midpoint: ties to even */
    ck_assert_int_eq(dl_route_backward(&c, s2, id2, dw2, 1, ds, dl), 0);
    ck_assert(ds[1] == 3.0f + 0x1p-21f && ds[0] == 0 && !signbit(ds[0]));
    check_backward(&c, s2, id2, dw2, 1);
}
END_TEST

/* ---------------------------------------------------------------- threads */

START_TEST(threads_same_bits)
{
#ifdef _OPENMP
    dl_test_rng_t r = {51};
    int64_t T = 600, E = 64, k = 6;
    dl_route_config_t c = cfg(E, k, DL_SCORE_SIGMOID);
    c.n_group = 8;
    c.topk_group = 3;
    c.group_score = DL_GROUP_TOP2_SUM;
    c.renormalize = 1;
    c.scaling = 2.5;
    c.has_bias = 1;
    float *l = malloc(T * E * sizeof *l), *bias = malloc(E * sizeof *bias);
    float *dw = malloc(T * k * sizeof *dw);
    for (int64_t i = 0; i < T * E; i++)
        l[i] = (float)(2 * dl_test_normal(&r));
    for (int64_t e = 0; e < E; e++)
        bias[e] = (float)(0.1 * dl_test_normal(&r));
    for (int64_t i = 0; i < T * k; i++)
        dw[i] = (float)dl_test_normal(&r);
    float *s[2], *w[2], *m[2], *ds[2], *dl[2];
    int32_t *ids[2];
    int saved = omp_get_max_threads();
    for (int p = 0; p < 2; p++) {
        s[p] = malloc(T * E * sizeof(float));
        ds[p] = malloc(T * E * sizeof(float));
        dl[p] = malloc(T * E * sizeof(float));
        w[p] = malloc(T * k * sizeof(float));
        m[p] = malloc(T * sizeof(float));
        ids[p] = malloc(T * k * sizeof(int32_t));
    }
    for (int fn = 0; fn < 2; fn++) {
        c.score_fn = fn ? DL_SCORE_SIGMOID : DL_SCORE_SOFTMAX;
        for (int p = 0; p < 2; p++) {
            omp_set_num_threads(p + 1);
            ck_assert_int_eq(dl_route_scores(&c, l, T, s[p]), 0);
            ck_assert_int_eq(dl_route_topk(&c, s[p], bias, T, ids[p], w[p], m[p]), 0);
            ck_assert_int_eq(dl_route_backward(&c, s[p], ids[p], dw, T, ds[p], dl[p]), 0);
        }
        omp_set_num_threads(saved);
        ck_assert(memcmp(s[0], s[1], T * E * sizeof(float)) == 0);
        ck_assert(memcmp(ds[0], ds[1], T * E * sizeof(float)) == 0);
        ck_assert(memcmp(dl[0], dl[1], T * E * sizeof(float)) == 0);
        ck_assert(memcmp(w[0], w[1], T * k * sizeof(float)) == 0);
        ck_assert(memcmp(m[0], m[1], T * sizeof(float)) == 0);
        ck_assert(memcmp(ids[0], ids[1], T * k * sizeof(int32_t)) == 0);
    }
    for (int p = 0; p < 2; p++) {
        free(s[p]);
        free(ds[p]);
        free(dl[p]);
        free(w[p]);
        free(m[p]);
        free(ids[p]);
    }
    free(l);
    free(bias);
    free(dw);
#endif
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("config", "validate", config_validate, 30),
        DL_TEST("scores", "softmax_random", softmax_random_vs_mpfr, 120),
        DL_TEST("scores", "sigmoid_random", sigmoid_random_vs_mpfr, 120),
        DL_TEST("scores", "fallback_share", scores_fallback_share, 120),
        DL_TEST("scores", "adversarial", scores_adversarial_midpoints, 120),
        DL_TEST("scores", "errors", scores_errors, 30),
        DL_TEST("topk", "random", topk_random_vs_reference, 120),
        DL_TEST("topk", "edges", topk_edges, 30),
        DL_TEST("topk", "groups", topk_groups, 30),
        DL_TEST("topk", "bias_weights", topk_bias_and_weights, 30),
        DL_TEST("topk", "shared_stages", shared_route_stages, 30),
        DL_TEST("backward", "mpfr", backward_vs_mpfr, 120),
        DL_TEST("backward", "finite_differences", backward_vs_finite_differences, 120),
        DL_TEST("backward", "edges", backward_errors_and_edges, 30),
        DL_TEST("threads", "same_bits", threads_same_bits, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
