/* The independent judge: GNU MPFR references for the tests. Nothing here
 * calls the accumulator or the rounding code under test. */
#ifndef DL_TEST_MPREF_H
#define DL_TEST_MPREF_H
#include <mpfr.h>
#include "dropless.h"

/* Wide enough to hold any sum of up to 2^40 products of two doubles exactly. */
#define MPREF_EXACT_PREC 4400

/* Rounds an MPFR value once to type t as IEEE arithmetic would (subnormals,
 * overflow), returning it as a double. */
static inline double mpref_round(mpfr_srcptr exact, dl_dtype_t t)
{
    static const struct { int p; long emin, emax; } f[] = {
        [DL_F32] = {24, -148, 128},
        [DL_BF16] = {8, -132, 128},
        [DL_F16] = {11, -23, 16},
        [DL_F64] = {53, -1073, 1024},
    };
    mpfr_exp_t old_min = mpfr_get_emin(), old_max = mpfr_get_emax();
    mpfr_t r;
    mpfr_init2(r, f[t].p);
    int inex = mpfr_set(r, exact, MPFR_RNDN);
    mpfr_set_emin(f[t].emin);
    mpfr_set_emax(f[t].emax);
    inex = mpfr_check_range(r, inex, MPFR_RNDN);
    mpfr_subnormalize(r, inex, MPFR_RNDN);
    double d = mpfr_get_d(r, MPFR_RNDN);
    mpfr_set_emin(old_min);
    mpfr_set_emax(old_max);
    mpfr_clear(r);
    return d;
}

static inline double mpref_round_d(double x, dl_dtype_t t)
{
    mpfr_t e;
    mpfr_init2(e, 53);
    mpfr_set_d(e, x, MPFR_RNDN);
    double r = mpref_round(e, t);
    mpfr_clear(e);
    return r;
}

/* Exact dot product of doubles, rounded once to t. */
static inline double mpref_dot(const double *a, const double *b, size_t n, dl_dtype_t t)
{
    mpfr_t acc, p;
    mpfr_init2(acc, MPREF_EXACT_PREC);
    mpfr_init2(p, 106);
    mpfr_set_zero(acc, 1);
    for (size_t i = 0; i < n; i++) {
        mpfr_set_d(p, a[i], MPFR_RNDN);
        mpfr_mul_d(p, p, b[i], MPFR_RNDN); /* exact: 106 bits */
        mpfr_add(acc, acc, p, MPFR_RNDN);  /* exact: 4400 bits */
    }
    double r = mpref_round(acc, t);
    mpfr_clear(acc);
    mpfr_clear(p);
    return r;
}

/* Same bits (so -0 differs from +0, and all NaNs are equal). */
static inline int same_value(double a, double b)
{
    if (a != a && b != b)
        return 1;
    return a == b && (signbit(a) == signbit(b));
}
#endif
