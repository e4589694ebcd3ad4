/* SwiGLU forward and backward, and the certified exp under them, against
 * GNU MPFR: every output bit-exact on random, wide-range, subnormal-result
 * and adversarial (near-midpoint) inputs, for fp32, bf16 and fp16. */
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

/* Tolerances: none for outputs (bit-exact). The exp's measured relative
 * error must stay within the bound proved in src/core/transc.c (4.2 u). */
#define EXP_PROVED_BOUND (4.2 * 0x1p-53)
#define N_EXP 400000
#define N_RANDOM 60000

static const dl_dtype_t act_types[] = {DL_F32, DL_BF16, DL_F16};

/* ------------------------------------------------------- MPFR references
 * Each is evaluated with round-to-nearest at two precisions; when the two
 * roundings to t agree (always, in practice) that is the answer, else a
 * third, much higher precision decides. */

typedef void (*ref_fn)(mpfr_t r, double a, double b);

/* For g > 2000, exp(-g) is replaced by exp(-2000): that moves the value by
 * a relative 2^-2885 or less toward the result at E = 0, with no rounding
 * boundary of any type in between (the nearest is at the E = 0 value
 * itself or 2^-60 away), and keeps MPFR's exponent range from flushing E
 * to 0, which would put exact midpoints where there are none. */
static double clamp_g(double g) { return g > 2000 ? 2000 : g; }

static void ref_silu_mul(mpfr_t r, double g, double u) /* g u / (1 + exp(-g)) */
{
    mpfr_t x;
    mpfr_init2(x, mpfr_get_prec(r));
    mpfr_set_d(x, -clamp_g(g), MPFR_RNDN);
    mpfr_exp(x, x, MPFR_RNDN);
    mpfr_add_ui(x, x, 1, MPFR_RNDN);
    mpfr_set_d(r, g, MPFR_RNDN);
    mpfr_mul_d(r, r, u, MPFR_RNDN);
    mpfr_div(r, r, x, MPFR_RNDN);
    mpfr_clear(x);
}

static void ref_dsilu_mul(mpfr_t r, double g, double p) /* p s (1 + g (1 - s)) */
{
    mpfr_t s, a;
    mpfr_inits2(mpfr_get_prec(r), s, a, (mpfr_ptr)0);
    mpfr_set_d(s, -clamp_g(g), MPFR_RNDN);
    mpfr_exp(s, s, MPFR_RNDN);
    mpfr_add_ui(s, s, 1, MPFR_RNDN);
    mpfr_ui_div(s, 1, s, MPFR_RNDN);
    mpfr_ui_sub(a, 1, s, MPFR_RNDN);
    mpfr_mul_d(a, a, g, MPFR_RNDN);
    mpfr_add_ui(a, a, 1, MPFR_RNDN);
    mpfr_mul(r, s, a, MPFR_RNDN);
    mpfr_mul_d(r, r, p, MPFR_RNDN);
    mpfr_clears(s, a, (mpfr_ptr)0);
}

static double ref_eval(ref_fn f, double a, double b, dl_dtype_t t)
{
    /* 1 - s = E / (1 + E) must survive: E = e^-g needs 1.45 g more bits */
    mpfr_prec_t p0 = 300 + (a > 0 ? (mpfr_prec_t)(1.5 * clamp_g(a)) : 0);
    const mpfr_prec_t precs[] = {p0, 3 * p0, 12 * p0};
    double prev = NAN;
    for (int i = 0; i < 3; i++) {
        mpfr_t r;
        mpfr_init2(r, precs[i]);
        f(r, a, b);
        double v = mpref_round(r, t);
        mpfr_clear(r);
        if (i > 0 && same_value(v, prev))
            return v;
        prev = v;
    }
    return prev;
}

/* silu(g) is exactly zero only for g = 0; then the product is +0 */
static double ref_swiglu(double g, double u, dl_dtype_t t)
{
    if (g == 0 || u == 0)
        return 0.0;
    return ref_eval(ref_silu_mul, g, u, t);
}

static double ref_dg(double g, double u, double dh, dl_dtype_t t)
{
    if (dh * u == 0)
        return 0.0;
    return ref_eval(ref_dsilu_mul, g, dh * u, t);
}

/* ------------------------------------------------------- input generators */

static float on_grid(double x, dl_dtype_t t)
{
    return (float)mpref_round_d(x, t);
}

/* a random value with a random sign over a wide exponent range */
static double wide(dl_test_rng_t *r, int emin, int emax)
{
    double m = 1.0 + dl_test_unif(r);
    int e = emin + (int)(dl_test_next(r) % (uint64_t)(emax - emin + 1));
    double x = ldexp(m, e);
    return (dl_test_next(r) & 1) ? -x : x;
}

/* gates: mostly moderate, some huge, some near the SiLU minimum */
static double random_gate(dl_test_rng_t *r)
{
    switch (dl_test_next(r) % 8) {
    case 0: return wide(r, -30, 12);
    case 1: return wide(r, 7, 127);                        /* exp under/overflow */
    case 2: return -1.2784645 + 0.01 * dl_test_normal(r);  /* silu' changes sign */
    case 3: return -60 - 100 * dl_test_unif(r);            /* tiny silu */
    case 4: return 10 * dl_test_normal(r);
    default: return dl_test_normal(r);
    }
}

static double random_mult(dl_test_rng_t *r, dl_dtype_t t)
{
    if (dl_test_next(r) % 4 == 0)
        return t == DL_F16 ? wide(r, -24, 15) : wide(r, -149, 127);
    return dl_test_normal(r);
}

/* ------------------------------------------------------------------ tests */

START_TEST(exp_error_bound)
{
    dl_test_rng_t r = {11};
    mpfr_t x, ex, got;
    mpfr_inits2(256, x, ex, got, (mpfr_ptr)0);
    double worst = 0;
    for (int i = 0; i < N_EXP; i++) {
        double a = (dl_test_unif(&r) * 2 - 1) * 1100;
        if (i % 4 == 1)
            a = (dl_test_unif(&r) * 2 - 1) * 2; /* small arguments, k = 0, +-1 */
        if (i % 4 == 2)
            a = ldexp(1.0 + dl_test_unif(&r), -(int)(dl_test_next(&r) % 60)); /* tiny */
        double al = (i % 3 == 0) ? (dl_test_unif(&r) * 2 - 1) * 0x1p-43 : 0.0;
        if (fabs(a) < 1 && al != 0)
            al *= 0x1p-10;
        int k;
        double y = dl__exp_parts(a, al, &k);
        mpfr_set_d(x, a, MPFR_RNDN);
        mpfr_add_d(x, x, al, MPFR_RNDN); /* exact at 256 bits */
        mpfr_exp(ex, x, MPFR_RNDN);
        mpfr_set_d(got, y, MPFR_RNDN);
        mpfr_mul_2si(got, got, k, MPFR_RNDN);
        mpfr_sub(got, got, ex, MPFR_RNDN);
        mpfr_div(got, got, ex, MPFR_RNDN);
        double rel = fabs(mpfr_get_d(got, MPFR_RNDU));
        if (rel > worst)
            worst = rel;
        ck_assert_msg(rel <= EXP_PROVED_BOUND, "exp(%a + %a): relative error %g > proved bound",
                      a, al, rel);
        ck_assert(y >= 0.70 && y <= 1.42);
    }
    fprintf(stderr, "# exp: max relative error %.3f u over %d arguments (proved: 4.2 u)\n",
            worst / 0x1p-53, N_EXP);
    ck_assert(EXP_PROVED_BOUND <= DL__EXP_REL);
    mpfr_clears(x, ex, got, (mpfr_ptr)0);
}
END_TEST

static void check_swiglu_batch(const float *g, const float *u, const float *dh, int n,
                               dl_dtype_t t, uint64_t *outputs)
{
    float *h = malloc(n * sizeof *h), *dg = malloc(n * sizeof *dg), *du = malloc(n * sizeof *du);
    ck_assert_int_eq(dl_swiglu(g, u, n, t, h), 0);
    ck_assert_int_eq(dl_swiglu_backward(g, u, dh, n, t, dg, du), 0);
    for (int i = 0; i < n; i++) {
        double w = ref_swiglu(g[i], u[i], t);
        ck_assert_msg(same_value(h[i], w), "%s swiglu(%a, %a) = %a, MPFR %a", dl_dtype_name(t),
                      g[i], u[i], h[i], w);
        w = ref_swiglu(g[i], dh[i], t);
        ck_assert_msg(same_value(du[i], w), "%s d_u(%a, dh %a) = %a, MPFR %a", dl_dtype_name(t),
                      g[i], dh[i], du[i], w);
        w = ref_dg(g[i], u[i], dh[i], t);
        ck_assert_msg(same_value(dg[i], w), "%s d_g(%a, %a, %a) = %a, MPFR %a", dl_dtype_name(t),
                      g[i], u[i], dh[i], dg[i], w);
    }
    *outputs += 3 * (uint64_t)n;
    free(h);
    free(dg);
    free(du);
}

START_TEST(swiglu_random_vs_mpfr)
{
    dl_test_rng_t r = {101};
    int n = N_RANDOM / 3;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u), *dh = malloc(n * sizeof *dh);
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = act_types[ti];
        for (int i = 0; i < n; i++) {
            do
                g[i] = on_grid(random_gate(&r), t);
            while (isinf(g[i]));
            u[i] = on_grid(random_mult(&r, t), t);
            dh[i] = on_grid(random_mult(&r, t), t);
        }
        uint64_t f0 = dl__mpfr_fallbacks(), outs = 0;
        check_swiglu_batch(g, u, dh, n, t, &outs);
        fprintf(stderr, "# swiglu %s: %llu MPFR fallbacks in %llu outputs\n", dl_dtype_name(t),
                (unsigned long long)(dl__mpfr_fallbacks() - f0), (unsigned long long)outs);
    }
    free(g);
    free(u);
    free(dh);
}
END_TEST

/* Typical activations (normal gates and multipliers): the fallback share. */
START_TEST(swiglu_fallback_share)
{
    dl_test_rng_t r = {5};
    int n = 200000;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u), *h = malloc(n * sizeof *h);
    float *dg = malloc(n * sizeof *g), *du = malloc(n * sizeof *u);
    for (int i = 0; i < n; i++) {
        g[i] = (float)(3 * dl_test_normal(&r));
        u[i] = (float)dl_test_normal(&r);
    }
    uint64_t f0 = dl__mpfr_fallbacks();
    ck_assert_int_eq(dl_swiglu(g, u, n, DL_F32, h), 0);
    ck_assert_int_eq(dl_swiglu_backward(g, u, u, n, DL_F32, dg, du), 0);
    uint64_t fb = dl__mpfr_fallbacks() - f0;
    fprintf(stderr, "# swiglu fp32 (g ~ N(0,9), u ~ N(0,1)): %llu fallbacks in %d outputs (%.2e)\n",
            (unsigned long long)fb, 3 * n, (double)fb / (3.0 * n));
    /* a spot check of the bits */
    for (int i = 0; i < n; i += 97) {
        ck_assert(same_value(h[i], ref_swiglu(g[i], u[i], DL_F32)));
        ck_assert(same_value(dg[i], ref_dg(g[i], u[i], u[i], DL_F32)));
    }
    ck_assert(fb < (uint64_t)n / 1000); /* the certified path must do the work */
    free(g);
    free(u);
    free(h);
    free(dg);
    free(du);
}
END_TEST

/* Every float gate within 2000 ulps of silu's minimum (where silu' = 0 and
 * the binary64 evaluation cancels), and the huge and tiny gates. */
START_TEST(swiglu_edges)
{
    int n = 4001 + 64;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u), *dh = malloc(n * sizeof *dh);
    float root = -1.27846454f;
    float x = root;
    for (int i = 0; i < 2000; i++)
        x = nextafterf(x, -INFINITY);
    for (int i = 0; i < 4001; i++) {
        g[i] = x;
        u[i] = 1.0f + i * 0x1p-20f;
        dh[i] = -0.75f;
        x = nextafterf(x, INFINITY);
    }
    static const float specials[] = {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 1e-30f, -1e-30f,
                                     88.0f, -88.0f, 103.0f, -103.0f, 104.0f, -104.0f,
                                     709.0f, -709.0f, 745.0f, -745.0f, 999.0f, -999.0f,
                                     1000.0f, -1000.0f, 1001.0f, -1001.0f, 3e38f, -3e38f,
                                     -1.0f, 1.0f, -20.0f, -150.0f, -190.0f, -200.0f, 16.0f, -16.0f};
    for (int i = 0; i < 64; i++) {
        g[4001 + i] = specials[i % 32];
        u[4001 + i] = i < 32 ? 3e38f : -0x1.8p-140f;
        dh[4001 + i] = i < 32 ? -1e38f : 0x1p-149f;
        if (i % 3 == 2) /* g u and dh u exact midpoints of fp32 for g = 2^k */
            u[4001 + i] = dh[4001 + i] = 1 + 0x1p-24f;
    }
    uint64_t outs = 0;
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = act_types[ti];
        float *gg = malloc(n * sizeof *gg), *uu = malloc(n * sizeof *uu), *dd = malloc(n * sizeof *dd);
        for (int i = 0; i < n; i++) {
            gg[i] = t == DL_F32 ? g[i] : on_grid(g[i], t);
            if (isinf(gg[i]))
                gg[i] = copysignf(65504.0f, gg[i]);
            uu[i] = on_grid(u[i], t);
            dd[i] = on_grid(dh[i], t);
            if (t == DL_F16 && isinf(uu[i]))
                uu[i] = dd[i] = copysignf(65504.0f, uu[i]);
            if (t == DL_F16 && isinf(dd[i]))
                dd[i] = copysignf(65504.0f, dd[i]);
        }
        check_swiglu_batch(gg, uu, dd, n, t, &outs);
        free(gg);
        free(uu);
        free(dd);
    }
    /* exact zeros are +0; the sign of a nonzero result that underflows is kept */
    float h, dg, du;
    float g0 = 0.0f, u0 = -2.0f, gz = 5.0f, uz = -0.0f, gn = -3e38f, up = 1.0f;
    ck_assert_int_eq(dl_swiglu(&g0, &u0, 1, DL_F32, &h), 0);
    ck_assert(h == 0 && !signbit(h));
    ck_assert_int_eq(dl_swiglu(&gz, &uz, 1, DL_F32, &h), 0);
    ck_assert(h == 0 && !signbit(h));
    ck_assert_int_eq(dl_swiglu(&gn, &up, 1, DL_F32, &h), 0);
    ck_assert(h == 0 && signbit(h)); /* g e^g u < 0, far below 2^-150 */
    ck_assert_int_eq(dl_swiglu_backward(&g0, &u0, &up, 1, DL_F32, &dg, &du), 0);
    ck_assert(dg == -1.0f && du == 0 && !signbit(du)); /* silu'(0) = 1/2, silu(0) = 0 */
    free(g);
    free(u);
    free(dh);
}
END_TEST

/* Inputs chosen so that the exact result lies very near a midpoint of fp32:
 * for a few gates g, the multiplier u (all 2^23 floats in [1, 2)) putting
 * silu(g) u closest to a midpoint. The binary64 bound cannot decide those,
 * so the MPFR fallback must run, and must be right. */
START_TEST(swiglu_adversarial_midpoints)
{
    dl_test_rng_t r = {77};
    const int NG = 10;
    float g[10], u[10];
    for (int q = 0; q < NG; q++) {
        float gq = (float)(2 * dl_test_normal(&r));
        /* screen in binary64 with the platform libm (accurate to ~2^-52,
         * fine for a search); MPFR judges the result below */
        double s = gq / (1 + exp(-(double)gq));
        int e;
        frexp(fabs(s), &e); /* |s| in [2^(e-1), 2^e) */
        double best = 1, bu = 1;
        for (uint32_t j = 1u << 23; j < 1u << 24; j++) {
            double uj = ldexp(j, -23);
            double h = fabs(s) * uj; /* in [2^(e-1), 2^(e+1)) */
            int eh = h >= ldexp(1, e) ? e : e - 1;
            double units = ldexp(h, 23 - eh); /* h / ulp_fp32(h) */
            double f = units - floor(units);
            double d = fabs(f - 0.5);
            if (d < best) {
                best = d;
                bu = uj;
            }
        }
        g[q] = gq;
        u[q] = (float)bu;
    }
    float h[10];
    uint64_t f0 = dl__mpfr_fallbacks();
    ck_assert_int_eq(dl_swiglu(g, u, NG, DL_F32, h), 0);
    uint64_t fb = dl__mpfr_fallbacks() - f0;
    for (int q = 0; q < NG; q++) {
        double w = ref_swiglu(g[q], u[q], DL_F32);
        ck_assert_msg(same_value(h[q], w), "swiglu(%a, %a) = %a, MPFR %a", g[q], u[q], h[q], w);
    }
    fprintf(stderr, "# swiglu near-midpoint inputs: %llu of %d took the MPFR fallback\n",
            (unsigned long long)fb, NG);
    ck_assert_msg(fb >= 1, "no near-midpoint input reached the MPFR fallback");
}
END_TEST

START_TEST(swiglu_errors)
{
    float g[2] = {1, NAN}, u[2] = {1, 1}, h[2];
    ck_assert_int_eq(dl_swiglu(g, u, 2, DL_F32, h), DL_ENONFINITE);
    g[1] = INFINITY;
    ck_assert_int_eq(dl_swiglu(g, u, 2, DL_F32, h), DL_ENONFINITE);
    g[1] = 1;
    u[0] = -INFINITY;
    ck_assert_int_eq(dl_swiglu(g, u, 2, DL_BF16, h), DL_ENONFINITE);
    ck_assert_int_eq(dl_swiglu_backward(g, g, u, 2, DL_F16, h, NULL), DL_ENONFINITE);
    u[0] = 1;
    ck_assert_int_eq(dl_swiglu(g, u, 2, DL_F64, h), DL_EDTYPE);
    ck_assert_int_eq(dl_swiglu(g, u, -1, DL_F32, h), DL_EINVAL);
    ck_assert_int_eq(dl_swiglu(g, u, 2, DL_F32, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_swiglu(NULL, NULL, 0, DL_F32, NULL), 0);
    ck_assert_int_eq(dl_swiglu_backward(g, u, u, 2, DL_F32, NULL, NULL), 0);
    /* in place */
    float gg[2] = {0.5f, -2.0f}, uu[2] = {3.0f, 0.25f};
    double w0 = ref_swiglu(0.5, 3.0, DL_F32), w1 = ref_swiglu(-2.0, 0.25, DL_F32);
    ck_assert_int_eq(dl_swiglu(gg, uu, 2, DL_F32, gg), 0);
    ck_assert(gg[0] == (float)w0 && gg[1] == (float)w1);
}
END_TEST

START_TEST(swiglu_threads_same_bits)
{
#ifdef _OPENMP
    dl_test_rng_t r = {9};
    int n = 50000;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u);
    float *out[2][3];
    for (int i = 0; i < n; i++) {
        g[i] = (float)random_gate(&r);
        u[i] = (float)random_mult(&r, DL_F32);
    }
    int saved = omp_get_max_threads();
    for (int p = 0; p < 2; p++) {
        omp_set_num_threads(p + 1);
        for (int j = 0; j < 3; j++)
            out[p][j] = malloc(n * sizeof(float));
        ck_assert_int_eq(dl_swiglu(g, u, n, DL_BF16, out[p][0]), 0);
        ck_assert_int_eq(dl_swiglu_backward(g, u, g, n, DL_F32, out[p][1], out[p][2]), 0);
    }
    omp_set_num_threads(saved);
    for (int j = 0; j < 3; j++) {
        ck_assert(memcmp(out[0][j], out[1][j], n * sizeof(float)) == 0);
        free(out[0][j]);
        free(out[1][j]);
    }
    free(g);
    free(u);
#endif
}
END_TEST

/* MPFR rounding helper of the library vs the test's own (mpref_round). */
START_TEST(mpfr_round_helper)
{
    dl_test_rng_t r = {3};
    mpfr_t x;
    mpfr_init2(x, 200);
    static const dl_dtype_t all[] = {DL_F32, DL_BF16, DL_F16, DL_F64};
    for (int i = 0; i < 200000; i++) {
        dl_dtype_t t = all[i % 4];
        int lo = t == DL_F16 ? -30 : t == DL_F64 ? -1100 : -160;
        int hi = t == DL_F16 ? 18 : t == DL_F64 ? 1026 : 130;
        mpfr_set_d(x, wide(&r, lo, hi), MPFR_RNDN);
        if (i % 3 == 0) /* bits beyond binary64: the sticky path */
            mpfr_mul_d(x, x, 1 + ldexp(dl_test_unif(&r), -60), MPFR_RNDN);
        if (i % 5 == 0) { /* exact midpoints of t */
            double v = mpref_round(x, t);
            if (isfinite(v) && v != 0) {
                mpfr_set_d(x, v, MPFR_RNDN);
                int e = ilogb(v) - dl_dtype_precision(t);
                if (t == DL_F16 && e < -25) e = -25;
                if (t == DL_F32 && e < -150) e = -150;
                if (t == DL_BF16 && e < -134) e = -134;
                if (t == DL_F64 && e < -1075) e = -1075;
                mpfr_t h;
                mpfr_init2(h, 64);
                mpfr_set_ui_2exp(h, 1, e, MPFR_RNDN);
                mpfr_add(x, x, h, MPFR_RNDN);
                mpfr_clear(h);
            }
        }
        double a = dl__mpfr_round(x, t), b = mpref_round(x, t);
        ck_assert_msg(same_value(a, b), "%s: %a vs %a", dl_dtype_name(t), a, b);
    }
    mpfr_clear(x);
}
END_TEST

/* dl__silu_array's vector path against the scalar functions it stands
 * for: the same bits on every element and the same MPFR fallbacks (a lane
 * the vector path decides must be one the scalar's binary64 path decides:
 * a vector bound tighter than the scalar's would decide near-midpoint
 * lanes itself, and fall back less), and MPFR's value on the adversarial
 * inputs: fp32 results within ~2^-48 of a midpoint (silu(g) u, silu'(g)
 * u for both signs of g), gates where the reduction's floor changes (v =
 * -|g|/ln2 + 1/2 near an integer), the ends of the vector range (|g| near
 * 42), zero operands, and results at the types' subnormal and overflow
 * edges. */
static float near_mid_u(double fg) /* u in [1, 2) putting fg u nearest an fp32 midpoint */
{
    int e;
    frexp(fabs(fg), &e);
    double best = 1, bu = 1;
    for (uint32_t j = 1u << 23; j < 1u << 24; j++) {
        double uj = ldexp(j, -23), h = fabs(fg) * uj;
        int eh = h >= ldexp(1, e) ? e : e - 1;
        double units = ldexp(h, 23 - eh), d = fabs(units - floor(units) - 0.5);
        if (d < best)
            best = d, bu = uj;
    }
    return (float)bu;
}

static void vec_vs_scalar(const float *g, const float *u, const float *dh, int n, dl_dtype_t t,
                          int with_mpfr)
{
    float *o = malloc(n * sizeof *o);
    for (int which = 0; which < 3; which++) {
        uint64_t f0 = dl__mpfr_fallbacks();
        ck_assert_int_eq(dl__silu_array(which, g, u, dh, n, t, o), 0);
        uint64_t fv = dl__mpfr_fallbacks() - f0;
        f0 = dl__mpfr_fallbacks();
        for (int i = 0; i < n; i++) {
            double r;
            if (which == DL__ACT_DG)
                ck_assert_int_eq(dl__dsilu_mul(g[i], (double)dh[i] * u[i], t, &r), 0);
            else
                ck_assert_int_eq(dl__silu_mul(g[i], which == DL__ACT_H ? u[i] : dh[i], t, &r), 0);
            ck_assert_msg(same_value(o[i], r), "%s which %d (%a, %a, %a): vector %a, scalar %a",
                          dl_dtype_name(t), which, g[i], u[i], dh[i], o[i], r);
            if (with_mpfr) {
                double w = which == DL__ACT_H ? ref_swiglu(g[i], u[i], t)
                         : which == DL__ACT_DU ? ref_swiglu(g[i], dh[i], t)
                                               : ref_dg(g[i], u[i], dh[i], t);
                ck_assert_msg(same_value(o[i], w), "%s which %d (%a, %a, %a) = %a, MPFR %a",
                              dl_dtype_name(t), which, g[i], u[i], dh[i], o[i], w);
            }
        }
        uint64_t fs = dl__mpfr_fallbacks() - f0;
        ck_assert_msg(fv == fs, "%s which %d: %llu MPFR fallbacks, the scalar functions %llu",
                      dl_dtype_name(t), which, (unsigned long long)fv, (unsigned long long)fs);
    }
    free(o);
}

START_TEST(silu_array_vs_scalar)
{
    dl_test_rng_t r = {4242};
    enum { NM = 24, NF = 60 * 6, NE = 64, NR = 30000 };
    const int n = 2 * NM + NF + NE + NR;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u), *dh = malloc(n * sizeof *dh);
    int i = 0;
    for (int q = 0; q < NM; q++, i += 2) { /* near-midpoint fp32: h, then d_g */
        double gq = (q % 2 ? -1 : 1) * (q < 8 ? 0.3 * dl_test_unif(&r) : q < 16 ? 3 * dl_test_unif(&r) : 5 + 30 * dl_test_unif(&r));
        g[i] = g[i + 1] = (float)gq;
        double s = 1 / (1 + exp(-(double)g[i]));
        u[i] = near_mid_u(g[i] * s);
        dh[i] = 1.0f;
        u[i + 1] = near_mid_u(s * (1 + g[i] * (1 - s)));
        dh[i + 1] = 1.0f;
    }
    for (int j = 1; j <= 60; j++) { /* floor's steps: |g| = (j - 1/2) ln2, neighbours */
        float c = (float)((j - 0.5) * 0.6931471805599453);
        float v[6] = {c, nextafterf(c, 0), nextafterf(c, 100), -c, -nextafterf(c, 0), -nextafterf(c, 100)};
        for (int q = 0; q < 6; q++, i++)
            g[i] = v[q], u[i] = (float)(1 + dl_test_unif(&r)), dh[i] = (float)dl_test_normal(&r);
    }
    static const float edge_g[8] = {42.0f, 0x1.4ffffep5f, -42.0f, -0x1.4ffffep5f, 0.0f, -0.0f, 0x1p-149f, -0x1p-126f};
    for (int q = 0; q < NE; q++, i++) { /* the vector range's ends, zeros, tiny and huge results */
        g[i] = q < 32 ? edge_g[q % 8] : (float)dl_test_normal(&r);
        const float m[8] = {0.0f, -0.0f, 0x1p-149f, 0x1.8p-133f, 0x1p-24f, 3e38f, -3e38f, 65504.0f};
        u[i] = m[q % 8], dh[i] = m[(q / 8) % 8];
    }
    for (; i < n; i++) { /* random, wide multipliers (subnormal and overflowing results) */
        g[i] = (float)random_gate(&r);
        if (isinf(g[i]))
            g[i] = 1.0f;
        u[i] = (float)random_mult(&r, DL_F32);
        dh[i] = (float)random_mult(&r, DL_F32);
    }
    const int nadv = 2 * NM + NF + NE;
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = act_types[ti];
        float *gg = malloc(n * sizeof *gg), *uu = malloc(n * sizeof *uu), *dd = malloc(n * sizeof *dd);
        for (int j = 0; j < n; j++) { /* onto t's grid (fp32 keeps the near-midpoint inputs) */
            gg[j] = on_grid(g[j], t), uu[j] = on_grid(u[j], t), dd[j] = on_grid(dh[j], t);
            if (isinf(gg[j]) || isinf(uu[j]) || isinf(dd[j]))
                gg[j] = uu[j] = dd[j] = copysignf(t == DL_F16 ? 65504.0f : 3e38f, gg[j]);
        }
        vec_vs_scalar(gg, uu, dd, nadv, t, 1);
        vec_vs_scalar(gg + nadv, uu + nadv, dd + nadv, n - nadv, t, 0);
        free(gg), free(uu), free(dd);
    }
    free(g), free(u), free(dh);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("exp", "bound", exp_error_bound, 120),
        DL_TEST("exp", "mpfr_round", mpfr_round_helper, 60),
        DL_TEST("swiglu", "random", swiglu_random_vs_mpfr, 120),
        DL_TEST("swiglu", "random", swiglu_fallback_share, 120),
        DL_TEST("swiglu", "edges", swiglu_edges, 60),
        DL_TEST("swiglu", "edges", swiglu_errors, 60),
        DL_TEST("swiglu", "adversarial", swiglu_adversarial_midpoints, 60),
        DL_TEST("swiglu", "threads", swiglu_threads_same_bits, 60),
        DL_TEST("swiglu", "vector", silu_array_vs_scalar, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
