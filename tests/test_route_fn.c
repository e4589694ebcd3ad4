/* The routing rules of issue 26 (src/stages/route_fn.c through the public
 * routing stages) against GNU MPFR at a fixed wide precision, evaluated by
 * other formulas than the stage's: sqrtsoftplus scores and their VJP (the
 * reference differentiates through the logit recovered from the stored
 * score, l = log(expm1(s^2)), not through 1 - exp(-s^2)), softmax over the
 * top-k logits (weights and d_scores from the probabilities directly, not
 * through sums of differences), on random inputs and on the boundaries:
 * ties in the top-k logits, all selected logits equal (rational weights),
 * k = 1, zero d_weights, zero and huge logits, and thread-count
 * independence. Every comparison is bit for bit. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "tap.h"
#include "mpref.h"
#include "dropless.h"

#define REF_P 4000 /* far beyond any rounding boundary these inputs reach */

static dl_route_config_t cfg(int64_t E, int64_t k, dl_score_fn_t fn)
{
    dl_route_config_t c = {E, k, fn, 1, 1, DL_GROUP_MAX, 0, 1.0, 0, 0};
    return c;
}

/* RN_fp32 of an MPFR value, +0 for a zero of either sign (the stages'
 * convention for exact zeros; a reference value below every subnormal
 * rounds to a zero whose sign the stage may not share). */
static float rn(mpfr_srcptr v)
{
    float f = (float)mpref_round(v, DL_F32);
    return f == 0.0f ? 0.0f : f;
}

static int same(float a, float b)
{
    return a == b || (isnan(a) && isnan(b));
}

/* ---------------------------------------------------- sqrtsoftplus refs */

static float ref_ssp(float l)
{
    mpfr_t x, e;
    mpfr_inits2(REF_P, x, e, (mpfr_ptr)0);
    mpfr_set_flt(x, l, MPFR_RNDN);
    /* log(1 + exp(l)) = max(l, 0) + log(exp(-|l|) + 1), no log1p */
    mpfr_set_flt(e, -fabsf(l), MPFR_RNDN);
    mpfr_exp(e, e, MPFR_RNDN);
    mpfr_add_ui(e, e, 1, MPFR_RNDN);
    mpfr_log(e, e, MPFR_RNDN);
    if (l > 0)
        mpfr_add(e, e, x, MPFR_RNDN);
    mpfr_sqrt(e, e, MPFR_RNDN);
    float r = rn(e);
    mpfr_clears(x, e, (mpfr_ptr)0);
    return r;
}

/* ds * sigmoid(l) / (2 s) with l = log(exp(s^2) - 1), the logit whose exact
 * score is s */
static float ref_ssp_vjp(float s, float ds)
{
    if (s == 0.0f)
        return 0.0f;
    mpfr_t q, l, g;
    mpfr_inits2(REF_P, q, l, g, (mpfr_ptr)0);
    mpfr_set_flt(q, s, MPFR_RNDN);
    mpfr_sqr(q, q, MPFR_RNDN);
    mpfr_expm1(l, q, MPFR_RNDN);
    mpfr_log(l, l, MPFR_RNDN);
    mpfr_neg(g, l, MPFR_RNDN); /* sigmoid(l) = 1 / (1 + exp(-l)) */
    mpfr_exp(g, g, MPFR_RNDN);
    mpfr_add_ui(g, g, 1, MPFR_RNDN);
    mpfr_ui_div(g, 1, g, MPFR_RNDN);
    mpfr_mul_d(g, g, (double)ds, MPFR_RNDN);
    mpfr_div_d(g, g, 2.0 * (double)s, MPFR_RNDN);
    float r = rn(g);
    mpfr_clears(q, l, g, (mpfr_ptr)0);
    return r;
}

/* a logit of a random kind: moderate, wide, huge, tiny, zero */
static float rand_logit(dl_test_rng_t *r)
{
    switch (dl_test_next(r) % 6) {
    case 0:
        return (float)(3 * dl_test_normal(r));
    case 1:
        return (float)(40 * dl_test_normal(r));
    case 2:
        return (float)ldexp(dl_test_normal(r), (int)(dl_test_next(r) % 60) - 30);
    case 3:
        return (dl_test_next(r) & 1) ? -200.0f - (float)(100 * dl_test_unif(r))
                                     : 1e30f * (float)dl_test_unif(r);
    case 4:
        return 0.0f;
    default:
        return (float)(dl_test_normal(r) * 0.01);
    }
}

START_TEST(sqrtsoftplus_scores_vs_mpfr)
{
    dl_test_rng_t r = {2601};
    const int64_t T = 200, E = 16;
    dl_route_config_t c = cfg(E, 2, DL_SCORE_SQRTSOFTPLUS);
    float *l = malloc(T * E * sizeof *l), *s = malloc(T * E * sizeof *s);
    for (int64_t i = 0; i < T * E; i++)
        l[i] = rand_logit(&r);
    l[0] = -3e38f; /* exp far below every range: +0 */
    l[1] = 3e38f;  /* sqrt(l) */
    ck_assert_int_eq(dl_route_scores(&c, l, T, s), 0);
    for (int64_t i = 0; i < T * E; i++) {
        float want = ref_ssp(l[i]);
        if (!same(s[i], want))
            ck_abort_msg("sqrtsoftplus(%a) = %a, MPFR %a", l[i], s[i], want);
        ck_assert(!signbit(s[i]));
    }
    free(l);
    free(s);
}
END_TEST

START_TEST(sqrtsoftplus_vjp_vs_mpfr)
{
    dl_test_rng_t r = {2602};
    const int64_t T = 100, E = 16;
    dl_route_config_t c = cfg(E, 2, DL_SCORE_SQRTSOFTPLUS);
    float *l = malloc(T * E * sizeof *l), *s = malloc(T * E * sizeof *s);
    float *ds = malloc(T * E * sizeof *ds), *dl = malloc(T * E * sizeof *dl);
    for (int64_t i = 0; i < T * E; i++) {
        l[i] = rand_logit(&r);
        ds[i] = (i % 7 == 0) ? 0.0f : (float)dl_test_normal(&r);
    }
    ck_assert_int_eq(dl_route_scores(&c, l, T, s), 0);
    s[5] = 0.0f; /* the limit at s = 0 */
    ck_assert_int_eq(dl_route_scores_backward(&c, s, ds, T, dl), 0);
    for (int64_t i = 0; i < T * E; i++) {
        float want = ref_ssp_vjp(s[i], ds[i]);
        if (!same(dl[i], want))
            ck_abort_msg("vjp(s=%a, ds=%a) = %a, MPFR %a", s[i], ds[i], dl[i], want);
    }
    /* through dl_route_backward: d_scores = scaling dw on the selection */
    const int64_t k = 2;
    int32_t *ids = malloc(T * k * sizeof *ids);
    float *w = malloc(T * k * sizeof *w), *dw = malloc(T * k * sizeof *dw);
    ck_assert_int_eq(dl_route_topk(&c, s, NULL, T, ids, w, NULL), 0);
    for (int64_t i = 0; i < T * k; i++)
        dw[i] = (float)dl_test_normal(&r);
    ck_assert_int_eq(dl_route_backward(&c, s, ids, dw, T, ds, dl), 0);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t e = t * E + ids[t * k + j];
            ck_assert(ds[e] == dw[t * k + j]);
            ck_assert(same(dl[e], ref_ssp_vjp(s[e], ds[e])));
        }
    free(l);
    free(s);
    free(ds);
    free(dl);
    free(ids);
    free(w);
    free(dw);
}
END_TEST

/* ------------------------------------------- softmax over the top-k refs */

/* p_i = exp(l_i) / sum exp(l_sel) for the k selected, at REF_P bits */
static void ref_probs(const float *l, const int32_t *ids, int64_t k, mpfr_t *p)
{
    mpfr_t S;
    mpfr_init2(S, REF_P);
    mpfr_set_zero(S, 1);
    float mx = l[ids[0]]; /* exp(1e30) is beyond MPFR's range, exp(1e30 - mx) is not */
    for (int64_t i = 1; i < k; i++)
        mx = fmaxf(mx, l[ids[i]]);
    for (int64_t i = 0; i < k; i++) {
        mpfr_set_flt(p[i], l[ids[i]], MPFR_RNDN);
        mpfr_sub_d(p[i], p[i], (double)mx, MPFR_RNDN);
        mpfr_exp(p[i], p[i], MPFR_RNDN);
        mpfr_add(S, S, p[i], MPFR_RNDN);
    }
    for (int64_t i = 0; i < k; i++)
        mpfr_div(p[i], p[i], S, MPFR_RNDN);
    mpfr_clear(S);
}

/* weights and d_scores of one token, checked against MPFR */
static void check_token(const dl_route_config_t *c, const float *l, const int32_t *ids,
                        const float *w, const float *dw, const float *ds)
{
    const int64_t k = c->top_k;
    mpfr_t p[64], a, m;
    mpfr_inits2(REF_P, a, m, (mpfr_ptr)0);
    for (int64_t i = 0; i < k; i++)
        mpfr_init2(p[i], REF_P);
    ref_probs(l, ids, k, p);
    mpfr_set_zero(m, 1); /* sum p_i dw_i */
    for (int64_t i = 0; i < k; i++) {
        mpfr_mul_d(a, p[i], (double)dw[i], MPFR_RNDN);
        mpfr_add(m, m, a, MPFR_RNDN);
    }
    for (int64_t j = 0; j < k; j++) {
        mpfr_mul_d(a, p[j], c->scaling, MPFR_RNDN);
        float want = rn(a);
        if (!same(w[j], want))
            ck_abort_msg("w[%lld] = %a, MPFR %a", (long long)j, w[j], want);
        mpfr_set_flt(a, dw[j], MPFR_RNDN);
        mpfr_sub(a, a, m, MPFR_RNDN);
        mpfr_mul(a, a, p[j], MPFR_RNDN);
        mpfr_mul_d(a, a, c->scaling, MPFR_RNDN);
        want = rn(a);
        const float got = ds[ids[j]];
        if (!same(got, want))
            ck_abort_msg("d_score[%d] = %a, MPFR %a", (int)ids[j], got, want);
        ck_assert(got != 0.0f || !signbit(got));
    }
    for (int64_t i = 0; i < k; i++)
        mpfr_clear(p[i]);
    mpfr_clears(a, m, (mpfr_ptr)0);
}

/* one batch: scores, selection, weights, backward, all checked */
static void run_topk_softmax(dl_route_config_t *c, const float *l, const float *dw, int64_t T)
{
    const int64_t E = c->experts, k = c->top_k;
    float *s = malloc(T * E * sizeof *s), *w = malloc(T * k * sizeof *w);
    float *ds = malloc(T * E * sizeof *ds), *dl = malloc(T * E * sizeof *dl);
    int32_t *ids = malloc(T * k * sizeof *ids);
    ck_assert_int_eq(dl_route_scores(c, l, T, s), 0);
    ck_assert(memcmp(s, l, T * E * sizeof *s) == 0); /* the scores are the logits */
    ck_assert_int_eq(dl_route_topk(c, s, NULL, T, ids, w, NULL), 0);
    ck_assert_int_eq(dl_route_backward(c, s, ids, dw, T, ds, dl), 0);
    for (int64_t t = 0; t < T; t++) {
        /* the selection: the k largest logits, ties to the lower index */
        for (int64_t j = 0; j < k; j++)
            for (int64_t e = 0; e < E; e++) {
                int sel = 0;
                for (int64_t i = 0; i < k; i++)
                    sel |= ids[t * k + i] == e;
                const float le = l[t * E + e], lj = l[t * E + ids[t * k + j]];
                if (!sel)
                    ck_assert(le < lj || (le == lj && e > ids[t * k + j]));
            }
        check_token(c, l + t * E, ids + t * k, w + t * k, dw + t * k, ds + t * E);
        for (int64_t e = 0; e < E; e++) /* the score VJP is the identity */
            ck_assert(dl[t * E + e] == ds[t * E + e] && !signbit(dl[t * E + e]) ==
                                                            !signbit(ds[t * E + e]));
    }
    free(s);
    free(w);
    free(ds);
    free(dl);
    free(ids);
}

START_TEST(softmax_topk_random_vs_mpfr)
{
    dl_test_rng_t r = {2603};
    const int64_t T = 60, E = 12;
    float *l = malloc(T * E * sizeof *l), *dw = malloc(T * 4 * sizeof *dw);
    for (int pass = 0; pass < 4; pass++) {
        dl_route_config_t c = cfg(E, pass == 3 ? 1 : 4, DL_SCORE_SOFTMAX_TOPK);
        c.scaling = pass == 1 ? 2.5 : pass == 2 ? 0.3 : 1.0; /* the Ziv path and the fast one */
        c.renormalize = pass & 1; /* changes nothing */
        for (int64_t i = 0; i < T * E; i++)
            l[i] = pass == 2 ? rand_logit(&r) : (float)(2 * dl_test_normal(&r));
        for (int64_t i = 0; i < T * c.top_k; i++)
            dw[i] = (float)dl_test_normal(&r);
        run_topk_softmax(&c, l, dw, T);
    }
    free(l);
    free(dw);
}
END_TEST

/* ties in the top-k logits, all selected equal (rational weights, c / k
 * a midpoint for c = 3 2^-24 k ...), equal d_weights (exact zero
 * d_scores), zero d_weights, a selection straddling equal logits */
START_TEST(softmax_topk_boundaries)
{
    const int64_t E = 6, k = 3, T = 6;
    static const float L[6][6] = {
        {1, 1, 1, 1, 1, 1},         /* all tie: ids 0,1,2, p = 1/3 */
        {2, 2, 0, 0, 0, 0},         /* a tie inside the selection, one outside */
        {0, 0, 0, 5, 0, 0},         /* the boundary of the selection is a tie */
        {-1e30f, 3, 3, -1e30f, 3, 0}, /* equal selected, the rest far below */
        {0, -0.0f, 0, 1, 1, 1},     /* +0 and -0 tie */
        {80, -80, 0, 30, -30, 40}, /* probabilities far apart */
    };
    static const float DW[6][3] = {
        {1, 1, 1}, {0.5f, 0.5f, 2}, {0, 0, 0}, {1, -2, 1}, {3, 0, -1}, {1, 2, 3},
    };
    float l[36], dw[18];
    memcpy(l, L, sizeof l);
    memcpy(dw, DW, sizeof dw);
    double scales[] = {1.0, 3.0, 0x1.000002p0, 1e-30};
    for (int i = 0; i < 4; i++) {
        dl_route_config_t c = cfg(E, k, DL_SCORE_SOFTMAX_TOPK);
        c.scaling = scales[i];
        run_topk_softmax(&c, l, dw, T);
    }
    /* the first token: equal d_weights give exact zeros, the ids the lowest */
    dl_route_config_t c = cfg(E, k, DL_SCORE_SOFTMAX_TOPK);
    int32_t ids[18];
    float w[18], ds[36];
    ck_assert_int_eq(dl_route_topk(&c, l, NULL, T, ids, w, NULL), 0);
    ck_assert(ids[0] == 0 && ids[1] == 1 && ids[2] == 2);
    ck_assert(w[0] == (float)(1.0 / 3.0));
    ck_assert_int_eq(dl_route_backward(&c, l, ids, dw, T, ds, NULL), 0);
    for (int e = 0; e < 6; e++)
        ck_assert(ds[e] == 0.0f && !signbit(ds[e]));
    /* top-1: the weight is scaling exactly, the gradient zero */
    c.top_k = 1;
    ck_assert_int_eq(dl_route_topk(&c, l + 30, NULL, 1, ids, w, NULL), 0);
    ck_assert(ids[0] == 0 && w[0] == 1.0f);
}
END_TEST

START_TEST(new_rules_thread_count)
{
#ifdef _OPENMP
    dl_test_rng_t r = {2604};
    const int64_t T = 300, E = 16, k = 4;
    float *l = malloc(T * E * sizeof *l), *dw = malloc(T * k * sizeof *dw);
    for (int64_t i = 0; i < T * E; i++)
        l[i] = rand_logit(&r);
    for (int64_t i = 0; i < T * k; i++)
        dw[i] = (float)dl_test_normal(&r);
    const int saved = omp_get_max_threads();
    for (int fn = DL_SCORE_SQRTSOFTPLUS; fn <= DL_SCORE_SOFTMAX_TOPK; fn++) {
        dl_route_config_t c = cfg(E, k, (dl_score_fn_t)fn);
        c.scaling = 1.5;
        c.renormalize = 1;
        float *s[2], *w[2], *dl[2];
        int32_t *ids[2];
        for (int p = 0; p < 2; p++) {
            omp_set_num_threads(p + 1);
            s[p] = malloc(T * E * sizeof(float));
            dl[p] = malloc(T * E * sizeof(float));
            w[p] = malloc(T * k * sizeof(float));
            ids[p] = malloc(T * k * sizeof(int32_t));
            ck_assert_int_eq(dl_route_scores(&c, l, T, s[p]), 0);
            ck_assert_int_eq(dl_route_topk(&c, s[p], NULL, T, ids[p], w[p], NULL), 0);
            ck_assert_int_eq(dl_route_backward(&c, s[p], ids[p], dw, T, NULL, dl[p]), 0);
        }
        omp_set_num_threads(saved);
        ck_assert(!memcmp(s[0], s[1], T * E * sizeof(float)));
        ck_assert(!memcmp(dl[0], dl[1], T * E * sizeof(float)));
        ck_assert(!memcmp(w[0], w[1], T * k * sizeof(float)));
        ck_assert(!memcmp(ids[0], ids[1], T * k * sizeof(int32_t)));
        for (int p = 0; p < 2; p++) {
            free(s[p]);
            free(dl[p]);
            free(w[p]);
            free(ids[p]);
        }
    }
    free(l);
    free(dw);
#endif
}
END_TEST

/* logits = RN(x W + b) and d_b = RN(sum_t d_logits) against exact MPFR sums:
 * the bias inside the one rounding (a cancelling bias makes the difference
 * from RN(RN(x W) + b) visible), wide ranges, zeros */
START_TEST(router_bias_vs_mpfr)
{
    dl_test_rng_t r = {2605};
    const int64_t T = 40, d = 24, E = 8;
    float *x = malloc(T * d * sizeof *x), *W = malloc(d * E * sizeof *W), b[8];
    float *l = malloc(T * E * sizeof *l), *dl = malloc(T * E * sizeof *dl), db[8];
    for (int64_t i = 0; i < T * d; i++)
        x[i] = (i % 11 == 0) ? 0.0f : rand_logit(&r);
    for (int64_t i = 0; i < d * E; i++)
        W[i] = (float)dl_test_normal(&r);
    for (int64_t e = 0; e < E; e++)
        b[e] = e == 3 ? 0.0f : rand_logit(&r);
    x[0] = 1.0f, W[0] = 1.0f, b[0] = -1.0f; /* token 0, expert 0: cancels to a tiny sum */
    for (int64_t i = 1; i < d; i++)
        x[i] = 0x1p-30f * (float)(i & 1);
    ck_assert_int_eq(dl_route_logits(x, T, d, W, b, E, l, NULL), 0);
    mpfr_t acc, p;
    mpfr_inits2(REF_P, acc, p, (mpfr_ptr)0);
    int differs = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) {
            mpfr_set_flt(acc, b[e], MPFR_RNDN);
            for (int64_t i = 0; i < d; i++) {
                mpfr_set_flt(p, x[t * d + i], MPFR_RNDN);
                mpfr_mul_d(p, p, (double)W[i * E + e], MPFR_RNDN);
                mpfr_add(acc, acc, p, MPFR_RNDN);
            }
            const float want = rn(acc);
            ck_assert_msg(same(l[t * E + e], want), "logit %lld,%lld %a want %a", (long long)t,
                          (long long)e, l[t * E + e], want);
            float nob;
            ck_assert_int_eq(dl_route_logits(x + t * d, 1, d, W, NULL, E, l + t * E, NULL), 0);
            nob = l[t * E + e] + b[e];
            differs |= !same(nob, want);
            ck_assert_int_eq(dl_route_logits(x + t * d, 1, d, W, b, E, l + t * E, NULL), 0);
        }
    ck_assert_msg(differs, "no input where rounding twice differs: the test would not see it");
    for (int64_t i = 0; i < T * E; i++)
        dl[i] = (i % 5 == 0) ? 0.0f : rand_logit(&r);
    ck_assert_int_eq(dl_route_bias_backward(dl, T, E, db, NULL), 0);
    for (int64_t e = 0; e < E; e++) {
        mpfr_set_zero(acc, 1);
        for (int64_t t = 0; t < T; t++)
            mpfr_add_d(acc, acc, (double)dl[t * E + e], MPFR_RNDN);
        ck_assert(same(db[e], rn(acc)));
    }
    ck_assert_int_eq(dl_route_bias_backward(dl, 0, E, db, NULL), 0); /* T = 0: zero */
    for (int64_t e = 0; e < E; e++)
        ck_assert(db[e] == 0.0f && !signbit(db[e]));
    mpfr_clears(acc, p, (mpfr_ptr)0);
    free(x), free(W), free(l), free(dl);
}
END_TEST

START_TEST(config_rules)
{
    dl_route_config_t c = cfg(8, 2, DL_SCORE_SQRTSOFTPLUS);
    ck_assert_int_eq(dl_route_config_validate(&c), 0);
    c.score_fn = DL_SCORE_SOFTMAX_TOPK;
    ck_assert_int_eq(dl_route_config_validate(&c), 0);
    c.score_fn = (dl_score_fn_t)4;
    ck_assert_int_eq(dl_route_config_validate(&c), DL_EINVAL);
    c.score_fn = DL_SCORE_SQRTSOFTPLUS;
    float l[8] = {0, 1, 2, 3, 4, 5, NAN, 7}, s[8];
    ck_assert_int_eq(dl_route_scores(&c, l, 1, s), DL_ENONFINITE);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("config", "new_rules", config_rules, 30),
        DL_TEST("sqrtsoftplus", "scores", sqrtsoftplus_scores_vs_mpfr, 120),
        DL_TEST("sqrtsoftplus", "vjp", sqrtsoftplus_vjp_vs_mpfr, 120),
        DL_TEST("softmax_topk", "random", softmax_topk_random_vs_mpfr, 120),
        DL_TEST("softmax_topk", "boundaries", softmax_topk_boundaries, 120),
        DL_TEST("threads", "same_bits", new_rules_thread_count, 120),
        DL_TEST("router_bias", "mpfr", router_bias_vs_mpfr, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
