/* Certified transcendentals: a binary64 exp with a proven error bound, and
 * correctly rounded sigmoid, softmax and SiLU terms built on it. Each value
 * is evaluated in binary64 with a rigorous error bound and certified with
 * dl__certify; the undecided ones go to GNU MPFR interval evaluation in a
 * Ziv loop. No bit of any result depends on the platform's libm exp or log:
 * only ldexp, frexp, ilogb, floor, fabs and nextafter are used, which are
 * exact. */
#include "config.h"
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <mpfr.h>
#include "core/core_priv.h"

/* ------------------------------------------------------------------- exp
 *
 * exp(x + xl) = 2^k exp(r), r = x + xl - k ln2, k = floor(x/ln2 + 1/2).
 *
 * Proof of |theta| <= 4.2 u < DL__EXP_REL = 2^-50, u = 2^-53, for
 * |x| <= 1100 and |xl| <= 2^-40:
 *
 * 1. Reduction. t = fl(x * INV_LN2) and fl(t + 1/2) differ from x/ln2 + 1/2
 *    by < 1600 * 4u, so |k - x/ln2| <= 1/2 + 2^-40 and |k| <= 1588. Hence
 *    |r| <= ln2/2 + 2^-39 < rho := 0.3466.
 *    LN2_HI has 32 significant bits (LN2_HI * 2^32 = 2977044471), so
 *    k * LN2_HI is exact (43 bits) and a multiple of 2^-32. If k != 0 then
 *    |x| >= 0.34, so x is a multiple of 2^-54; hi = x - k LN2_HI is then a
 *    multiple of 2^-54 with |hi| <= rho + |k| |ln2 - LN2_HI| < 0.35 < 2^-1:
 *    it is representable, and the subtraction is exact (k = 0: hi = x).
 *    The rest: |k LN2_LO - fl(k LN2_LO)| <= u * 1588 * 2^-32.3 < 2^-20 u;
 *    |ln2 - LN2_HI - LN2_LO| < 2^-86.1 (checked with MPFR), times |k|:
 *    < 2^-75 = 2^-22 u; r1 = fl(hi - lo) and r = fl(r1 + xl) each add at
 *    most u |result| <= 0.3467 u. So the computed r differs from the exact
 *    x + xl - k ln2 by delta, |delta| <= 0.694 u + 2^-19 u < 0.7 u, which
 *    scales exp by exp(delta) = 1 + 0.7 u (1 + u) at most.
 * 2. Truncation: sum_{n>14} rho^n / n! < 1.2e-19 < 0.002 u * e^-rho.
 * 3. Coefficients: C[n] = fl(1/n!) (n! is exact for n <= 18) has relative
 *    error <= u, zero for n <= 2; sum_{n>=3} u rho^n/n! < 0.0076 u.
 * 4. Horner: p = C0 + r(C1 + r(C2 + ...)). Unrolling the rounding factors,
 *    the computed value is sum_n C[n] r^n (1 + theta_n) with theta_n the
 *    product of at most 2n+1 factors (1 + d), |d| <= u, so |theta_n| <=
 *    gamma_{2n+1} = (2n+1)u / (1 - (2n+1)u). The absolute error is at most
 *    u (1 + 3 rho + 5 rho^2/2 + 7 rho^3/6 + 9 rho^4/24 + ...) (1 + 2^-45)
 *    < 2.40 u. Divided by exp(r) >= e^-rho > 0.7071: 3.40 u relative.
 * Total: (1 + 3.40u + 0.011u + 0.002u)(1 + 0.7u(1 + u)) - 1 < 4.2 u.
 * The test suite measures the error against MPFR and checks the bound. */

static const double LN2_HI = 0x1.62e42feep-1;
static const double LN2_LO = 0x1.a39ef35793c76p-33;
static const double INV_LN2 = 0x1.71547652b82fep0;
static const double C[15] = {
    1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
    1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800,
    1.0 / 479001600, 1.0 / 6227020800.0, 1.0 / 87178291200.0};

double dl__exp_parts(double x, double xl, int *k)
{
    double kd = floor(x * INV_LN2 + 0.5);
    double hi = x - kd * LN2_HI; /* exact, see above */
    double lo = kd * LN2_LO;
    double r = (hi - lo) + xl;
    double p = C[14];
    for (int i = 13; i >= 0; i--)
        p = C[i] + r * p;
    *k = (int)kd;
    return p;
}

/* ------------------------------------------------------- fallback counter */

static _Atomic uint64_t fallbacks;

uint64_t dl__mpfr_fallbacks(void) { return atomic_load(&fallbacks); }

void dl__mpfr_fallback_note(void) { atomic_fetch_add(&fallbacks, 1); }

/* ------------------------------------------------------- MPFR rounding */

double dl__mpfr_round(mpfr_srcptr x, dl_dtype_t t)
{
    if (mpfr_nan_p(x))
        return NAN;
    int neg = mpfr_signbit(x) != 0;
    if (mpfr_inf_p(x))
        return neg ? -INFINITY : INFINITY;
    if (mpfr_zero_p(x))
        return neg ? -0.0 : 0.0;
    mpfr_exp_t e = mpfr_get_exp(x); /* |x| in [2^(e-1), 2^e) */
    if (e > 4000)
        return neg ? -INFINITY : INFINITY;
    if (e < -4000)
        return neg ? -0.0 : 0.0;
    /* the top 64 bits by truncation; the rest is the sticky bit */
    mpfr_t a;
    mpz_t z;
    mpfr_init2(a, 64);
    mpz_init(z);
    int sticky = mpfr_abs(a, x, MPFR_RNDZ) != 0;
    mpfr_set_exp(a, 64); /* now an integer in [2^63, 2^64) */
    mpfr_get_z(z, a, MPFR_RNDZ);
    uint64_t hi = 0;
    size_t cnt = 0;
    mpz_export(&hi, &cnt, -1, sizeof hi, 0, 0, z);
    mpz_clear(z);
    mpfr_clear(a);
    return dl_round_parts(neg, hi, (int)e - 64, sticky, t);
}

int dl__ziv(dl__ival_fn eval, const void *ctx, dl_dtype_t t, double *out)
{
    dl__mpfr_fallback_note();
    mpfr_t lo, hi;
    mpfr_inits2(128, lo, hi, (mpfr_ptr)0);
    int rc = DL_EINTERNAL;
    for (mpfr_prec_t p = 128; p <= 65536; p *= 2) {
        mpfr_set_prec(lo, p);
        mpfr_set_prec(hi, p);
        eval(lo, hi, ctx);
        double a = dl__mpfr_round(lo, t), b = dl__mpfr_round(hi, t);
        if (a == b && signbit(a) == signbit(b)) {
            *out = a;
            rc = 0;
            break;
        }
    }
    mpfr_clears(lo, hi, (mpfr_ptr)0);
    return rc;
}

/* ------------------------------------------------ certification helpers */

/* The exact value lies in [y - err, y + err] * 2^k (k <= 0, y and err
 * finite, err >= 0). Like dl__certify, but y * 2^k may be below the binary64
 * range. Values known to be below 2^-199 in magnitude round to a zero of
 * every type but DL_F64. */
static int certify_scaled(double y, double err, int k, dl_dtype_t t, double *out)
{
    if (k == 0)
        return dl__certify(y, err, t, out);
    double b = (fabs(y) + err) * 1.0000001; /* >= |y| + err */
    if (b == 0.0)
        return 0;
    if (t != DL_F64 && ilogb(b) + k < -200) {
        if (y > err) {
            *out = 0.0;
            return 1;
        }
        if (-y > err) {
            *out = -0.0;
            return 1;
        }
        return 0;
    }
    if (y == 0.0 || ilogb(y) + k < -1000)
        return 0;
    double ys = ldexp(y, k); /* exact: stays >= 2^-1000 */
    /* err * 2^k, exact, or rounded up to 2^-1000 where it would be subnormal */
    double es = err == 0.0 ? 0.0 : ilogb(err) + k < -1000 ? 0x1p-1000 : ldexp(err, k);
    return dl__certify(ys, es, t, out);
}

/* E = exp(-|x|) = y 2^k (1 +- DL__EXP_REL) for |x| <= 1000; sets *e to E as
 * a double, or to 0 when E < 2^-999 (then 1 + E is 1 within 2^-999, which
 * every bound below absorbs). */
static double exp_neg(double ax, int *k, double *e)
{
    double y = dl__exp_parts(-ax, 0.0, k);
    *e = *k < -1000 ? 0.0 : ldexp(y, *k); /* exact when kept: >= 2^-1001 */
    return y;
}

/* ------------------------------------------------------------- sigmoid */

typedef struct { double x; } sig_ctx_t;

/* s in [lo, hi] for s = 1 / (1 + exp(-x)); all quantities positive. */
static void sig_ival(mpfr_ptr lo, mpfr_ptr hi, double x)
{
    mpfr_prec_t p = mpfr_get_prec(lo);
    mpfr_t a, b;
    mpfr_inits2(p, a, b, (mpfr_ptr)0);
    mpfr_set_d(a, -x, MPFR_RNDN); /* exact */
    mpfr_exp(b, a, MPFR_RNDU);
    mpfr_add_ui(b, b, 1, MPFR_RNDU);
    mpfr_ui_div(lo, 1, b, MPFR_RNDD);
    mpfr_exp(b, a, MPFR_RNDD);
    mpfr_add_ui(b, b, 1, MPFR_RNDD);
    mpfr_ui_div(hi, 1, b, MPFR_RNDU);
    mpfr_clears(a, b, (mpfr_ptr)0);
}

static void sig_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    sig_ival(lo, hi, ((const sig_ctx_t *)ctx)->x);
}

int dl__ziv_locked(dl__ival_fn f, const void *ctx, dl_dtype_t t, double *out)
{
    int rc;
#ifdef _OPENMP
#pragma omp critical(dl__mpfr)
#endif
    rc = dl__ziv(f, ctx, t, out);
    return rc;
}

int dl__sigmoid(double x, dl_dtype_t t, double *out)
{
    double ax = fabs(x);
    if (ax > 1000) {
        /* within 2^-1442 of 1 or of 0 (from above): no type resolves that */
        *out = x > 0 ? 1.0 : 0.0;
        return 0;
    }
    int k;
    double e, y = exp_neg(ax, &k, &e);
    /* Each branch: relative error <= 2 DL__EXP_REL + 2u + 2^-998 + O(u^2)
     * < 2^-48 (y and E each carry DL__EXP_REL; E enters as E/(1+E) <= 1;
     * one addition and one division). */
    if (x >= 0) {
        double s = 1.0 / (1.0 + e);
        if (dl__certify(s, s * 0x1p-48, t, out))
            return 0;
    } else {
        double m = y / (1.0 + e); /* s = m 2^k */
        if (certify_scaled(m, m * 0x1p-48, k, t, out))
            return 0;
    }
    sig_ctx_t c = {x};
    return dl__ziv_locked(sig_eval, &c, t, out);
}

/* ---------------------------------------------------------- silu * u */

typedef struct { double g, u; } silu_ctx_t;

static void silu_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    const silu_ctx_t *c = ctx;
    mpfr_prec_t p = mpfr_get_prec(lo);
    mpfr_t a, slo, shi;
    mpfr_init2(a, 128);
    mpfr_inits2(p, slo, shi, (mpfr_ptr)0);
    sig_ival(slo, shi, c->g);
    mpfr_set_d(a, c->g, MPFR_RNDN);
    mpfr_mul_d(a, a, c->u, MPFR_RNDN); /* exact: 48 bits */
    if (mpfr_sgn(a) > 0) {
        mpfr_mul(lo, a, slo, MPFR_RNDD);
        mpfr_mul(hi, a, shi, MPFR_RNDU);
    } else {
        mpfr_mul(lo, a, shi, MPFR_RNDD);
        mpfr_mul(hi, a, slo, MPFR_RNDU);
    }
    mpfr_clears(a, slo, shi, (mpfr_ptr)0);
}

int dl__silu_mul(double g, double u, dl_dtype_t t, double *out)
{
    if (g == 0.0 || u == 0.0) {
        *out = 0.0;
        return 0;
    }
    double a = g * u; /* exact for floats */
    double ag = fabs(g);
    if (g <= -1000) {
        /* |g e^g u| <= 1000 e^-1000 2^128 < 2^-1300: a zero of a's sign */
        *out = copysign(0.0, a);
        return 0;
    }
    if (g >= 42) {
        /* h = a s with 0 < 1 - s < E = e^-g < 2^-60. a has at most 48
         * significant bits; a rounding boundary of t != DL_F64 (a value or
         * a midpoint: at most 25 bits) other than a itself is a multiple
         * of a's last bit, so at least 2^-49 |a| from a. No boundary lies
         * in [a', a), a' the double next to a toward zero, and h (inside
         * (a (1 - 2^-60), a)) rounds like a'. For DL_F64, h rounds to a.
         * This matters when a is itself a midpoint of t. */
        *out = t == DL_F64 ? a : dl_round(nextafter(a, 0.0), t);
        return 0;
    } else {
        int k;
        double e, y = exp_neg(ag, &k, &e); /* |g| < 1000 */
        /* relative error <= 2 DL__EXP_REL + 3u + 2^-998 + O(u^2) < 2^-48 */
        if (g > 0) {
            double h = a / (1.0 + e);
            if (dl__certify(h, fabs(h) * 0x1p-48, t, out))
                return 0;
        } else {
            double m = (a * y) / (1.0 + e); /* h = m 2^k */
            if (certify_scaled(m, fabs(m) * 0x1p-48, k, t, out))
                return 0;
        }
    }
    silu_ctx_t c = {g, u};
    return dl__ziv_locked(silu_eval, &c, t, out);
}

/* ------------------------------------------------------ silu'(g) * p
 *
 * silu'(g) = s (1 + g (1 - s)). With E = exp(-|g|):
 *   g > 0: (1 + E (1 + g)) / (1 + E)^2           (no cancellation)
 *   g < 0: E (1 + g + E) / (1 + E)^2             (F = 1 + g + E changes sign
 *                                                 near g = -1.2785) */

static void dsilu_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    const silu_ctx_t *c = ctx; /* u holds p */
    mpfr_prec_t p = mpfr_get_prec(lo);
    mpfr_t elo, ehi, a, b, dlo, dhi, pp;
    mpfr_inits2(p, elo, ehi, a, b, dlo, dhi, (mpfr_ptr)0);
    mpfr_init2(pp, 64);
    mpfr_set_d(pp, c->u, MPFR_RNDN);
    mpfr_set_d(a, -fabs(c->g), MPFR_RNDN); /* exact */
    mpfr_exp(elo, a, MPFR_RNDD);
    mpfr_exp(ehi, a, MPFR_RNDU);
    if (c->g >= 0) {
        /* numerator in [a, b], all positive */
        mpfr_set_d(b, c->g, MPFR_RNDN);
        mpfr_add_ui(b, b, 1, MPFR_RNDD);
        mpfr_mul(a, elo, b, MPFR_RNDD);
        mpfr_add_ui(a, a, 1, MPFR_RNDD);
        mpfr_set_d(b, c->g, MPFR_RNDN);
        mpfr_add_ui(b, b, 1, MPFR_RNDU);
        mpfr_mul(b, ehi, b, MPFR_RNDU);
        mpfr_add_ui(b, b, 1, MPFR_RNDU);
        /* divide by (1 + E)^2 */
        mpfr_add_ui(dhi, ehi, 1, MPFR_RNDU);
        mpfr_sqr(dhi, dhi, MPFR_RNDU);
        mpfr_add_ui(dlo, elo, 1, MPFR_RNDD);
        mpfr_sqr(dlo, dlo, MPFR_RNDD);
        mpfr_div(a, a, dhi, MPFR_RNDD);
        mpfr_div(b, b, dlo, MPFR_RNDU);
        mpfr_swap(dlo, a);
        mpfr_swap(dhi, b);
    } else {
        /* Q = E / (1 + E)^2 increases on [0, 1] */
        mpfr_t qlo, qhi, flo, fhi;
        mpfr_inits2(p, qlo, qhi, flo, fhi, (mpfr_ptr)0);
        mpfr_add_ui(a, elo, 1, MPFR_RNDU);
        mpfr_sqr(a, a, MPFR_RNDU);
        mpfr_div(qlo, elo, a, MPFR_RNDD);
        mpfr_add_ui(a, ehi, 1, MPFR_RNDD);
        mpfr_sqr(a, a, MPFR_RNDD);
        mpfr_div(qhi, ehi, a, MPFR_RNDU);
        mpfr_set_d(a, c->g, MPFR_RNDN);
        mpfr_add_ui(flo, a, 1, MPFR_RNDD);
        mpfr_add(flo, flo, elo, MPFR_RNDD);
        mpfr_add_ui(fhi, a, 1, MPFR_RNDU);
        mpfr_add(fhi, fhi, ehi, MPFR_RNDU);
        mpfr_mul(dlo, mpfr_sgn(flo) >= 0 ? qlo : qhi, flo, MPFR_RNDD);
        mpfr_mul(dhi, mpfr_sgn(fhi) >= 0 ? qhi : qlo, fhi, MPFR_RNDU);
        mpfr_clears(qlo, qhi, flo, fhi, (mpfr_ptr)0);
    }
    if (mpfr_sgn(pp) > 0) {
        mpfr_mul(lo, pp, dlo, MPFR_RNDD);
        mpfr_mul(hi, pp, dhi, MPFR_RNDU);
    } else {
        mpfr_mul(lo, pp, dhi, MPFR_RNDD);
        mpfr_mul(hi, pp, dlo, MPFR_RNDU);
    }
    mpfr_clears(elo, ehi, a, b, dlo, dhi, pp, (mpfr_ptr)0);
}

int dl__dsilu_mul(double g, double p, dl_dtype_t t, double *out)
{
    if (p == 0.0) {
        *out = 0.0;
        return 0;
    }
    if (g == 0.0) { /* silu'(0) = 1/2 */
        *out = dl_round(p * 0.5, t);
        return 0;
    }
    if (g <= -1000) {
        /* |E F| <= 1001 e^-1000 < 2^-1432, |p| < 2^257; F < 0 */
        *out = copysign(0.0, -p);
        return 0;
    }
    if (g >= 48) {
        /* silu' - 1 = E (g - 1 - E) / (1 + E)^2 is in (0, g e^-g) and
         * g e^-g < 2^-63: as for dl__silu_mul, the value is strictly inside
         * (p, p'), p' the double next to p away from zero, and no rounding
         * boundary of t lies in (p, p'] */
        *out = t == DL_F64 ? p : dl_round(nextafter(p, p > 0 ? INFINITY : -INFINITY), t);
        return 0;
    } else if (g > 0) {
        int k;
        double e;
        exp_neg(g, &k, &e);
        /* numerator: positive terms, relative DL__EXP_REL + 3u; (1+E)^2:
         * 2 (DL__EXP_REL + u) + u; p N: u; division: u. Total
         * 3 DL__EXP_REL + 8u + O(u^2) < 2^-47. */
        double num = 1.0 + e * (1.0 + g);
        double d1 = 1.0 + e;
        double r = (p * num) / (d1 * d1);
        if (dl__certify(r, fabs(r) * 0x1p-47, t, out))
            return 0;
    } else {
        int k;
        double e, y = exp_neg(-g, &k, &e);
        /* F = (1 + g) + E with an absolute bound bf: two roundings and E's
         * relative error; when E was dropped (g < -692), |F| > 690 and the
         * dropped 2^-999 is covered by the |f| 2^-900 term. */
        double f1 = 1.0 + g;
        double f = f1 + e;
        double bf = ((fabs(f1) + fabs(f)) * 0x1p-53 + e * 0x1p-49 + fabs(f) * 0x1p-900) * 1.01;
        /* M = p Y / (1 + E)^2: relative 3 DL__EXP_REL + 5u + O(u^2) < 2^-47 */
        double d1 = 1.0 + e;
        double m = (p * y) / (d1 * d1);
        double r = m * f; /* the value is r 2^k */
        double err = (fabs(m) * (0x1p-46 * (fabs(f) + bf) + bf) + fabs(r) * 0x1p-53) * 1.01;
        if (certify_scaled(r, err, k, t, out))
            return 0;
    }
    silu_ctx_t c = {g, p};
    return dl__ziv_locked(dsilu_eval, &c, t, out);
}

/* ------------------------------------------- SiLU products over arrays
 *
 * dl__silu_mul and dl__dsilu_mul element by element cost a call, a branch
 * per case, ldexp/ilogb calls and two dl_round calls per element. Most
 * elements take one path: |g| < 42, nonzero operands, a result that is a
 * normal number of t. For those lanes the loops below do the same binary64
 * operations as the scalar functions, branch-free so that they vectorise,
 * and certify in the same way, so a decided lane holds exactly the
 * scalar's result; every other lane (NaN in the block) goes through the
 * scalar function. The operations are the same because:
 *   - E = exp(-|g|) is y 2^k with k >= -61 for |g| < 42: the scalar's
 *     ldexp(y, k), here y times 2^k built from k's bits;
 *   - for g < 0 the scalar computes m = (a y) / (1 + E) (or (p y) / (1 +
 *     E)^2 and the rest of dl__dsilu_mul's terms) and certifies m, err
 *     scaled by 2^k; here the same operations on a E = a y 2^k. Scaling by
 *     a power of two commutes with each rounding while no operand leaves
 *     binary64's normal range: |a|, |p| >= 2^-298 (products of two nonzero
 *     floats), 2^k >= 2^-61, (1 + E)^2 <= 4, and a nonzero F = (1 + g) + E
 *     is a multiple of 2^-55 (for g in (-2, -1/2): 1 + g a multiple of
 *     2^-24, E in (0.13, 0.61) of 2^-55, and the sum exact; |F| > 1/2
 *     elsewhere), so every product stays above 2^-500;
 *   - certify_scaled with k < 0 calls dl__certify on the scaled pair
 *     unless the value is below 2^-199 (then it is no normal of t and the
 *     lane falls back here too).
 * cert_lane is dl__certify (ends widened by one double ulp, both rounded,
 * equal) for ends that are normal numbers of t, rounding by the bits as
 * dl_round does there. Both arms of every select are computed first: with
 * trapping math (the default) GCC does not if-convert a floating-point
 * operation inside an arm, and the loop would not vectorise (so the
 * lanes' results are doubles: a conversion to float is such an operation). */

enum { LANES = 256 }; /* elements per block: the block's results live on the stack */

DL__ALWAYS_INLINE uint64_t dbits(double x)
{
    uint64_t b;
    memcpy(&b, &x, 8);
    return b;
}

DL__ALWAYS_INLINE double dof(uint64_t b)
{
    double x;
    memcpy(&x, &b, 8);
    return x;
}

/* dl__certify(y, err, t) where both widened ends are normal numbers of t
 * below its overflow threshold; NaN otherwise (undecided or out of range). */
DL__ALWAYS_INLINE double cert_lane(double y, double err, dl_dtype_t t)
{
    const int s = t == DL_F32 ? 29 : t == DL_BF16 ? 45 : 42; /* 53 - p */
    const uint64_t lo_norm = t == DL_F16 ? UINT64_C(0x3f10000000000000)  /* 2^-14 */
                                         : UINT64_C(0x3810000000000000); /* 2^-126 */
    const uint64_t inf_at = t == DL_F16 ? UINT64_C(0x40f0000000000000)   /* 2^16 */
                                        : UINT64_C(0x47f0000000000000);  /* 2^128 */
    const uint64_t half = (UINT64_C(1) << (s - 1)) - 1, keep = ~((UINT64_C(1) << s) - 1);
    const double a = fabs(y);
    /* |lo| and |hi| of dl__certify: next_down/next_up of a -+ err in magnitude */
    const uint64_t ml = dbits(a - err) - 1, mh = dbits(a + err) + 1;
    const uint64_t rl = (ml + half + ((ml >> s) & 1)) & keep;
    const uint64_t rh = (mh + half + ((mh >> s) & 1)) & keep;
    const int ok = (rl == rh) & (ml >= lo_norm) & (ml < inf_at) & (rl < inf_at) & (a - err > 0);
    const double r = dof(rl | (dbits(y) & (UINT64_C(1) << 63)));
    return ok ? r : NAN;
}

/* E = exp(-|g|) = dl__exp_parts(-|g|, 0)'s y times 2^k, for |g| < 42 (the
 * same operations; 2^k from k's bits by the 1.5 2^52 trick) */
DL__ALWAYS_INLINE double exp_neg_lane(double ag)
{
    const double x = -ag;
    /* floor(v) (vector floor does not vectorise under trapping math):
     * (v + 1.5 2^52) - 1.5 2^52 rounds v to an integer, exactly for |v| <
     * 2^51, then one step down where that went up */
    const double v = x * INV_LN2 + 0.5, rv = (v + 0x1.8p52) - 0x1.8p52;
    const double kd = rv - (rv > v ? 1.0 : 0.0);
    const double hi = x - kd * LN2_HI;
    const double lo = kd * LN2_LO;
    const double r = (hi - lo) + 0.0;
    /* dl__exp_parts' Horner loop, written out (a loop inside the lane loop
     * keeps it from vectorising) */
    double p = C[14];
    p = C[13] + r * p, p = C[12] + r * p, p = C[11] + r * p, p = C[10] + r * p;
    p = C[9] + r * p, p = C[8] + r * p, p = C[7] + r * p, p = C[6] + r * p;
    p = C[5] + r * p, p = C[4] + r * p, p = C[3] + r * p, p = C[2] + r * p;
    p = C[1] + r * p, p = C[0] + r * p;
    const uint64_t k = dbits(kd + 0x1.8p52) - UINT64_C(0x4338000000000000); /* kd, two's complement */
    return p * dof((k + 1023) << 52);
}

/* silu(g) m: dl__silu_mul's |g| < 42 branch */
DL__ALWAYS_INLINE double silu_lane(float gf, float mf, dl_dtype_t t)
{
    const double g = gf, a = g * (double)mf, ag = fabs(g);
    const double e = exp_neg_lane(ag) /* any value for |g| >= 42: the lane is not used */;
    const double ae = a * e, h = (g > 0 ? a : ae) / (1.0 + e);
    const double o = cert_lane(h, fabs(h) * 0x1p-48, t);
    return (gf != 0.0f) & (mf != 0.0f) & (ag < 42) ? o : NAN;
}

/* silu'(g) dh u: dl__dsilu_mul's 0 < |g| < 42 branches, p = dh u exact */
DL__ALWAYS_INLINE double dsilu_lane(float gf, float uf, float dhf, dl_dtype_t t)
{
    const double g = gf, p = (double)dhf * uf, ag = fabs(g);
    const double e = exp_neg_lane(ag) /* any value for |g| >= 42: the lane is not used */;
    const double d1 = 1.0 + e;
    /* g > 0 */
    const double num = 1.0 + e * (1.0 + g);
    const double rp = (p * num) / (d1 * d1);
    const double errp = fabs(rp) * 0x1p-47;
    /* g < 0 (scaled by 2^k) */
    const double f1 = 1.0 + g, f = f1 + e;
    const double bf = ((fabs(f1) + fabs(f)) * 0x1p-53 + e * 0x1p-49 + fabs(f) * 0x1p-900) * 1.01;
    const double m = (p * e) / (d1 * d1);
    const double rn = m * f;
    const double errn = (fabs(m) * (0x1p-46 * (fabs(f) + bf) + bf) + fabs(rn) * 0x1p-53) * 1.01;
    const double op = cert_lane(rp, errp, t), on = cert_lane(rn, errn, t);
    const double o = g > 0 ? op : on;
    return (gf != 0.0f) & (p != 0.0) & (ag < 42) ? o : NAN;
}

/* One block of at most LANES elements, t a constant (always inlined) */
DL__ALWAYS_INLINE void silu_block_t(int which, const float *g, const float *u, const float *dh,
                                    int n, dl_dtype_t t, double *o)
{
    if (which == DL__ACT_DG) {
#pragma omp simd
        for (int i = 0; i < n; i++)
            o[i] = dsilu_lane(g[i], u[i], dh[i], t);
    } else {
        const float *m = which == DL__ACT_H ? u : dh;
#pragma omp simd
        for (int i = 0; i < n; i++)
            o[i] = silu_lane(g[i], m[i], t);
    }
}

DL__VEC_CLONES
static void silu_block(int which, const float *g, const float *u, const float *dh, int n,
                       dl_dtype_t t, double *o)
{
    if (t == DL_F32)
        silu_block_t(which, g, u, dh, n, DL_F32, o);
    else if (t == DL_BF16)
        silu_block_t(which, g, u, dh, n, DL_BF16, o);
    else
        silu_block_t(which, g, u, dh, n, DL_F16, o);
}

int dl__silu_array(int which, const float *g, const float *u, const float *dh, int64_t n,
                   dl_dtype_t t, float *out)
{
    double blk[LANES];
    int rc = 0;
    for (int64_t i0 = 0; i0 < n; i0 += LANES) {
        const int nb = n - i0 < LANES ? (int)(n - i0) : LANES;
        if (t == DL_F64) /* only the scalar functions handle binary64 */
            for (int i = 0; i < nb; i++)
                blk[i] = NAN;
        else
            silu_block(which, g + i0, u + i0, dh ? dh + i0 : NULL, nb, t, blk);
        for (int i = 0; i < nb; i++) {
            const int64_t j = i0 + i;
            double r = blk[i];
            if (blk[i] != blk[i]) { /* undecided or another branch: the scalar function */
                int e = which == DL__ACT_DG ? dl__dsilu_mul(g[j], (double)dh[j] * u[j], t, &r)
                                            : dl__silu_mul(g[j], which == DL__ACT_H ? u[j] : dh[j], t, &r);
                rc = e ? e : rc;
            }
            out[j] = (float)r;
        }
    }
    return rc;
}

/* ------------------------------------------------------------- softmax */

typedef struct {
    const float *l;
    int64_t n, e;
    float m;
} smax_ctx_t;

static void smax_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    const smax_ctx_t *c = ctx;
    mpfr_prec_t p = mpfr_get_prec(lo);
    mpfr_t d, tlo, thi, slo, shi, elo, ehi;
    mpfr_init2(d, 320); /* a difference of floats is exact in 280 bits */
    mpfr_inits2(p, tlo, thi, slo, shi, elo, ehi, (mpfr_ptr)0);
    mpfr_set_zero(slo, 1);
    mpfr_set_zero(shi, 1);
    for (int64_t j = 0; j < c->n; j++) {
        mpfr_set_flt(d, c->l[j], MPFR_RNDN);
        mpfr_sub_d(d, d, (double)c->m, MPFR_RNDN);
        mpfr_exp(tlo, d, MPFR_RNDD);
        mpfr_exp(thi, d, MPFR_RNDU);
        mpfr_add(slo, slo, tlo, MPFR_RNDD);
        mpfr_add(shi, shi, thi, MPFR_RNDU);
        if (j == c->e) {
            mpfr_set(elo, tlo, MPFR_RNDN);
            mpfr_set(ehi, thi, MPFR_RNDN);
        }
    }
    mpfr_div(lo, elo, shi, MPFR_RNDD);
    mpfr_div(hi, ehi, slo, MPFR_RNDU);
    mpfr_clears(d, tlo, thi, slo, shi, elo, ehi, (mpfr_ptr)0);
}

/* exp(l - m) for floats l <= m: d = l - m as an exact pair (TwoSum), then
 * y 2^k; returns 0 when the term is below 2^-999 (or dropped as such). */
static int smax_term(float l, float m, double *y, int *k)
{
    double a = l, b = -(double)m;
    double s = a + b, bp = s - a, ap = s - bp;
    double sl = (a - ap) + (b - bp); /* |sl| <= 2^-43 when |s| <= 1000 */
    if (s < -1000)
        return 0;
    *y = dl__exp_parts(s, sl, k);
    return *k >= -1000;
}

int dl__softmax_row(const float *l, int64_t n, dl_dtype_t t, float *out)
{
    if (t == DL_F64)
        return DL_EDTYPE;
    float m = l[0];
    for (int64_t j = 1; j < n; j++)
        if (l[j] > m)
            m = l[j];
    /* S = sum exp(l_j - m) >= 1. Kept terms carry DL__EXP_REL each; the sum
     * of the kept doubles is exact, then rounded once (u); dropped terms
     * add < n 2^-999 <= S 2^-960. */
    dl_acc_t acc;
    dl_acc_clear(&acc);
    for (int64_t j = 0; j < n; j++) {
        double y;
        int k;
        if (smax_term(l[j], m, &y, &k))
            dl_acc_add(&acc, ldexp(y, k));
    }
    double S = dl_acc_round(&acc, DL_F64);
    int rc = 0;
    for (int64_t j = 0; j < n; j++) {
        double y, r;
        int k;
        if (!smax_term(l[j], m, &y, &k) || k < -300) {
            /* s_j < 1.5 * 2^-300 / S: positive, below every subnormal */
            out[j] = 0.0f;
            continue;
        }
        /* relative: 2 DL__EXP_REL + 2u + 2^-960 + O(u^2) < 2^-48 */
        double q = ldexp(y, k) / S;
        if (!dl__certify(q, q * 0x1p-48, t, &r)) {
            smax_ctx_t c = {l, n, j, m};
            int e = dl__ziv_locked(smax_eval, &c, t, &r);
            if (e)
                rc = e;
        }
        out[j] = (float)r;
    }
    return rc;
}
