/* The absent stages' deltas in binary32 (fusedck, issue 31 item 1): each
 * delta is the binary64 bound of before (dl__ck_bound_at, the propagated
 * error times DL__CK_PROP_SLACK, dl__ck_hypot_up for the statistical
 * tier's root sum of squares) rounded UP to binary32, so it stays an
 * upper bound and grows by less than one float ulp (2^-23 relative).
 *  - dl__ck_up32f against binary64 on random and adversarial values: the
 *    result is >= x and the float below it is < x (the least float >= x);
 *    rounding to nearest and a step down, run through the same test, are
 *    caught (the test can fail).
 *  - dl__ck_row_deltas (vectorised, chunked) against the scalar functions
 *    element by element: bitwise dl__ck_up32f of their value, on random
 *    and edge inputs (M = 0 with an infinite coefficient, huge and tiny
 *    values that leave the root's fast path, NaN and infinities), in
 *    both tiers' forms and on the binary64 path (dl__ck_f64_bounds); the
 *    mutant (dl__ck_delta_mutant: the float below) is caught. */
#include "config.h"
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "check/check_priv.h"

/* ------------------------------------------------ rounding up to binary32 */

typedef float (*round_fn)(double);

static float rn(double x)
{
    return (float)x;
}

static float below(double x)
{
    return nextafterf(dl__ck_up32f(x), 0.0f);
}

/* Value i of the adversarial and random set (x >= 0). */
static double value(dl_test_rng_t *r, int i)
{
    const float f = (float)ldexp(1.0 + (double)(dl_test_next(r) % (1u << 23)) * 0x1p-23,
                                 (int)(dl_test_next(r) % 250) - 125);
    const float sub = (float)ldexp((double)(1 + dl_test_next(r) % (1u << 23)), -149);
    switch (i % 12) {
    case 0: /* a float itself: stays */
        return f;
    case 1: /* just above a float (one binary64 ulp): the next float */
        return nextafter((double)f, INFINITY);
    case 2: /* just below a float: that float */
        return nextafter((double)f, 0.0);
    case 3: /* the midpoint of two floats (round to nearest goes down half the time) */
        return ((double)f + (double)nextafterf(f, INFINITY)) / 2;
    case 4: /* subnormal floats and between them */
        return (double)sub + (dl_test_next(r) % 2 ? 0x1p-152 : 0.0);
    case 5: /* below the least subnormal: 2^-149 */
        return ldexp(1.0 + (double)(dl_test_next(r) % 1000), -170 - (int)(dl_test_next(r) % 500));
    case 6: /* around FLT_MAX: FLT_MAX or +inf */
        return (double)FLT_MAX + (dl_test_next(r) % 2 ? ldexp(1.0, 70 + (int)(dl_test_next(r) % 34)) : 0.0);
    case 7: /* beyond binary32 */
        return ldexp(1.0 + (double)(dl_test_next(r) % 1000), 128 + (int)(dl_test_next(r) % 800));
    case 8:
        return 0.0;
    default: /* random binary64 bits over the float range and beyond */
        return ldexp((double)(dl_test_next(r) >> 11) * 0x1p-53 + 0.5, (int)(dl_test_next(r) % 320) - 180);
    }
}

/* Elements where f(x) is not the least float >= x. */
static int64_t violations(round_fn f, int n)
{
    dl_test_rng_t r = {31};
    int64_t bad = 0;
    for (int i = 0; i < n; i++) {
        const double x = value(&r, i);
        const float y = f(x);
        const float lo = nextafterf(y, 0.0f);
        /* y >= x, and (y == 0 or the float below y is < x): the comparisons
         * in binary64 are exact (every float is a double) */
        bad += !((double)y >= x && (y == 0.0f || (double)lo < x));
    }
    return bad;
}

START_TEST(up32f_least_float_above)
{
    ck_assert_int_eq(violations(dl__ck_up32f, 1200000), 0);
    ck_assert(isnan(dl__ck_up32f(NAN)));
    ck_assert(isinf(dl__ck_up32f(INFINITY)));
    ck_assert(dl__ck_up32f(0x1p-1074) == 0x1p-149f);
    ck_assert(isinf(dl__ck_up32f(nextafter((double)FLT_MAX, INFINITY))));
    /* the negative controls: the test can fail */
    ck_assert_int_gt(violations(rn, 1200000), 1000);
    ck_assert_int_gt(violations(below, 1200000), 1000);
}
END_TEST

/* --------------------------------------------- the row of an absent stage */

enum { N = 1000 };

/* Bound coefficients as dl__ck_bound_coef makes them, for case c. */
static dl__ck_bc_t coef(dl_test_rng_t *r, int c)
{
    static const dl_dtype_t types[] = {DL_BF16, DL_F16, DL_F32};
    const dl_dtype_t t = types[c % 3];
    const double uo = dl_dtype_unit_roundoff(t), K = (double)(1 + dl_test_next(r) % 4096);
    dl__ck_bc_t bc = {.nu = 2 * uo, .f2 = 1 + 2 * uo, .eta = dl__ck_ulp(0.0, t),
                      .kt = (K + 2) * 0x1p-150, .kap = 3 * sqrt(K) * 0x1p-24, .stat = (c / 3) % 2,
                      .uo = uo, .kw = K * 0x1p-24 / (1 - K * 0x1p-24), .t = t};
    if (bc.stat)
        bc.nu = 0.0;
    if (c % 7 == 6) /* K u >= 1/2: the worst case infinite (an M of 0 must not make NaN) */
        bc.kw = bc.kap = INFINITY;
    return bc;
}

/* Element j's inputs of case c: g, M and the propagated p. */
static void inputs(dl_test_rng_t *r, int c, float *g, double *m, double *p)
{
    for (int j = 0; j < N; j++) {
        const double z = dl_test_normal(r);
        const int e = (int)(dl_test_next(r) % 61) - 30;
        g[j] = (float)ldexp(z, e);
        m[j] = fabs(ldexp(dl_test_normal(r), e + (int)(dl_test_next(r) % 8)));
        p[j] = fabs(ldexp(dl_test_normal(r), e - (int)(dl_test_next(r) % 30)));
        if (c % 8 < 3) /* rows without edge values: the root's fast path throughout */
            continue;
        switch ((j + c) % 23) {
        case 0: m[j] = 0.0; break;
        case 1: g[j] = 0.0f; break;
        case 2: p[j] = 0.0; break;
        case 3: p[j] = 0x1p470; break;        /* beyond the root's fast path */
        case 4: p[j] = 0x1p-470; break;       /* below it */
        case 5: m[j] = 0x1p1000; break;       /* top overflows in binary32 terms */
        case 6: g[j] = 0x1p-140f; break;      /* subnormal */
        case 7: g[j] = 3e38f; m[j] = 1e308; break; /* top infinite */
        case 8: p[j] = NAN; break;
        case 9: g[j] = INFINITY; break;
        case 10: m[j] = INFINITY; break;
        default: break;
        }
    }
}

/* Mismatches of dl__ck_row_deltas against the scalar reference on case c
 * (and asserts every result bounds the binary64 value). */
static int64_t row_mismatches(int c)
{
    dl_test_rng_t r = {500 + (uint64_t)c};
    const dl__ck_bc_t bc = coef(&r, c);
    float g[N], dl[N];
    double m[N], p[N];
    inputs(&r, c, g, m, p);
    const int rss = bc.stat && c % 2, withp = c % 5 != 4, withm = c % 4 != 3;
    dl__ck_row_deltas(&bc, N, g, withm ? m : NULL, withp ? p : NULL, dl, rss);
    int64_t bad = 0;
    for (int j = 0; j < N; j++) {
        const double M = withm ? m[j] : fabs((double)g[j]);
        const double own = dl__ck_bound_at(&bc, g[j], M), pr = withp ? p[j] * DL__CK_PROP_SLACK : 0.0;
        const double ref = rss ? dl__ck_hypot_up(fabs(own), pr) : own + pr;
        const float want = dl__ck_up32f(ref);
        const int same = memcmp(&want, &dl[j], sizeof want) == 0 || (isnan(want) && isnan(dl[j]));
        bad += !same || !((double)dl[j] >= ref || isnan(ref));
    }
    return bad;
}

START_TEST(row_deltas_match_scalar)
{
    dl__ck_f64_bounds = _i >= 42; /* the binary64 path: hypot itself */
    ck_assert_int_eq(row_mismatches(_i % 42), 0);
    dl__ck_delta_mutant = 1; /* the negative control: the float below */
    ck_assert_int_gt(row_mismatches(_i % 42), N / 2);
    dl__ck_delta_mutant = 0;
    dl__ck_f64_bounds = 0;
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("binary32 deltas", "rounding up", up32f_least_float_above, 60),
        DL_TEST_LOOP("binary32 deltas", "row of bounds", row_deltas_match_scalar, 0, 84, 60),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
