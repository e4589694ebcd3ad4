/* The exact arithmetic core against GNU MPFR: rounding onto each storage
 * type, bit conversions, and the exact accumulator. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "mpref.h"
#include "dropless.h"
#include "core/core_priv.h"

/* Tolerances: none. Every value here must match MPFR bit for bit. */
#define N_RANDOM_ROUND 200000
#define N_RANDOM_DOTS 400
#define LONG_DOT_TERMS 1000000

static const dl_dtype_t all_types[] = {DL_F32, DL_BF16, DL_F16, DL_F64};

/* A random double spread over the exponent range that matters for t. */
static double random_double(dl_test_rng_t *r, int emin, int emax)
{
    uint64_t m = dl_test_next(r);
    int e = emin + (int)(dl_test_next(r) % (uint64_t)(emax - emin + 1));
    double x = ldexp((double)(m >> 11), e - 53);
    return (m & 1) ? -x : x;
}

START_TEST(round_random_vs_mpfr)
{
    dl_test_rng_t r = {42};
    for (int ti = 0; ti < 4; ti++) {
        dl_dtype_t t = all_types[ti];
        for (int i = 0; i < N_RANDOM_ROUND; i++) {
            double x = random_double(&r, -160, 140);
            if (t == DL_F16)
                x = random_double(&r, -30, 20);
            if (t == DL_F64)
                x = random_double(&r, -1080, 1030);
            double got = dl_round(x, t), want = mpref_round_d(x, t);
            ck_assert_msg(same_value(got, want), "%s: round(%a) = %a, MPFR says %a",
                          dl_dtype_name(t), x, got, want);
        }
    }
}
END_TEST

/* Midpoints between neighbours, one ulp either side of them, and the
 * overflow and underflow thresholds: the cases where rounding code breaks. */
START_TEST(round_adversarial)
{
    dl_test_rng_t r = {7};
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = all_types[ti];
        for (int i = 0; i < 50000; i++) {
            double x = dl_round(random_double(&r, t == DL_F16 ? -26 : -152, t == DL_F16 ? 17 : 129), t);
            if (!isfinite(x))
                continue;
            double y = nextafter(x, INFINITY);
            double up = dl_round(y, t);
            if (!isfinite(up)) /* above the largest finite: threshold is max + ulp/2 */
                up = x + (x - dl_round(nextafter(x, 0), t));
            double mid = x + (up - x) / 2;
            double cases[] = {mid, nextafter(mid, INFINITY), nextafter(mid, -INFINITY),
                              -mid, x};
            for (int c = 0; c < 5; c++) {
                double got = dl_round(cases[c], t), want = mpref_round_d(cases[c], t);
                ck_assert_msg(same_value(got, want), "%s: round(%a) = %a, MPFR says %a",
                              dl_dtype_name(t), cases[c], got, want);
            }
        }
    }
    /* specials */
    ck_assert(isnan(dl_round(NAN, DL_BF16)));
    ck_assert(dl_round(INFINITY, DL_F16) == INFINITY);
    ck_assert(signbit(dl_round(-0.0, DL_F32)));
    ck_assert(signbit(dl_round(-1e-300, DL_F32))); /* underflow keeps the sign */
    ck_assert(dl_round(65520.0, DL_F16) == INFINITY); /* max 65504 + ulp/2 ties up */
    ck_assert(dl_round(nextafter(65520.0, 0), DL_F16) == 65504.0);
    ck_assert(dl_round(0x1p-25, DL_F16) == 0.0); /* half the smallest subnormal: even */
    ck_assert(dl_round(nextafter(0x1p-25, 1), DL_F16) == 0x1p-24);
    ck_assert(dl_round(0x1p-150, DL_F32) == 0.0);
    ck_assert(dl_round(0x1.8p-150, DL_F32) == 0x1p-149);
}
END_TEST

/* dl__round_scaled (d_y_sorted's rounding, vectorised) against MPFR on
 * products w g of floats: ties of t's grid and their float neighbours,
 * t's subnormals and its overflow threshold, zeros of both signs, inf and
 * NaN, in blocks of 256 lanes with a tail, for every w sign and scale. */
START_TEST(round_scaled_vs_mpfr)
{
    dl_test_rng_t r = {77};
    enum { N = 1000 };
    static float g[N], out[N];
    static const double ws[] = {1.0, -1.0, 0.75, 0x1p-20, 2.0, -0x1.8p+3};
    for (int ti = 0; ti < 3; ti++) {
        const dl_dtype_t t = all_types[ti];
        const int drop = 24 - dl_dtype_precision(t); /* float bits below t's ulp (normals) */
        for (int i = 0; i < N; i++) {
            float x = (float)dl_round(random_double(&r, t == DL_F16 ? -28 : -150, t == DL_F16 ? 16 : 127), t);
            uint32_t b;
            memcpy(&b, &x, 4);
            if (drop > 0 && i % 4 == 1) /* a tie of t's grid, then its neighbours */
                b |= UINT32_C(1) << (drop - 1);
            b += i % 4 == 2 ? 1 : 0;
            memcpy(&x, &b, 4);
            g[i] = i % 97 == 3 ? -0.0f : i % 89 == 5 ? INFINITY : i % 83 == 7 ? NAN
                 : i % 79 == 9 ? 0x1p127f * 1.5f : i % 5 == 4 ? -x : x;
        }
        for (size_t wi = 0; wi < sizeof ws / sizeof ws[0]; wi++) {
            dl__round_scaled(g, ws[wi], N - 3, t, out); /* a tail of 232 after three blocks */
            for (int i = 0; i < N - 3; i++) {
                const double want = mpref_round_d(ws[wi] * (double)g[i], t);
                ck_assert_msg(same_value(out[i], want), "%s: %a x %a -> %a, MPFR says %a",
                              dl_dtype_name(t), ws[wi], (double)g[i], (double)out[i], want);
            }
        }
    }
}
END_TEST

START_TEST(bits_round_trip)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float b = dl_bf16_to_float((uint16_t)h), f = dl_f16_to_float((uint16_t)h);
        if (!isnan(b)) {
            ck_assert_uint_eq(dl_bf16_from_float(b), h);
            ck_assert(dl_on_grid(b, DL_BF16));
        }
        if (!isnan(f)) {
            ck_assert_uint_eq(dl_f16_from_float(f), h);
            ck_assert(dl_on_grid(f, DL_F16));
        }
    }
    ck_assert_uint_eq(dl_f16_from_float(1.0f), 0x3c00);
    ck_assert_uint_eq(dl_bf16_from_float(1.0f), 0x3f80);
    ck_assert(isnan(dl_f16_to_float(dl_f16_from_float(NAN))));
    ck_assert(isnan(dl_bf16_to_float(dl_bf16_from_float(NAN))));
    /* from float rounds to nearest even */
    ck_assert_uint_eq(dl_bf16_from_float(1.0f + 0x1p-8f), 0x3f80);
    ck_assert_uint_eq(dl_bf16_from_float(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
}
END_TEST

/* Grid membership, decided on bits, against the definition round(x) == x. */
START_TEST(on_grid_matches_rounding)
{
    dl_test_rng_t r = {31};
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = all_types[ti];
        for (int i = 0; i < 300000; i++) {
            float f;
            uint32_t b = (uint32_t)dl_test_next(&r);
            if (i % 3 == 1) /* values with few significand bits: often on the grid */
                b &= 0xffffe000u;
            else if (i % 3 == 2)
                b &= 0xffff0000u;
            memcpy(&f, &b, 4);
            if (isnan(f))
                continue;
            ck_assert_msg(dl_on_grid(f, t) == (dl_round(f, t) == f), "%s: on_grid(%a)",
                          dl_dtype_name(t), (double)f);
        }
        /* doubles that are not floats are on no 16- or 32-bit grid */
        ck_assert(!dl_on_grid(1.0 + 0x1p-40, t));
    }
    ck_assert(dl_on_grid(65504.0, DL_F16) && !dl_on_grid(65536.0, DL_F16));
    ck_assert(dl_on_grid(0x1p-24, DL_F16) && dl_on_grid(0x1.8p-23, DL_F16) && !dl_on_grid(0x1.8p-24, DL_F16));
}
END_TEST

START_TEST(dtype_names)
{
    dl_dtype_t t;
    ck_assert_int_eq(dl_dtype_parse("bfloat16", &t), 0);
    ck_assert_int_eq(t, DL_BF16);
    ck_assert_int_eq(dl_dtype_parse("int8", &t), DL_EDTYPE);
    ck_assert_str_eq(dl_dtype_name(DL_F16), "fp16");
    ck_assert_int_eq(dl_dtype_precision(DL_BF16), 8);
    ck_assert_str_eq(dl_strerror(DL_ENOMEM), "out of memory");
    ck_assert_str_eq(dl_err_name(DL_ESHAPE), "DL_ESHAPE");
    ck_assert_str_eq(dl_strerror(-999), "unknown error");
    int64_t p;
    ck_assert_int_eq(dl_mul_size(INT64_C(1) << 32, INT64_C(1) << 30, &p), 0);
    ck_assert(p == INT64_C(1) << 62);
    ck_assert_int_eq(dl_mul_size(INT64_C(1) << 32, INT64_C(1) << 31, &p), DL_EOVERFLOW);
    ck_assert_int_eq(dl_mul_size(-1, 2, &p), DL_EINVAL);
}
END_TEST

/* ------------------------------------------------------------ accumulator */

static float grid_value(dl_test_rng_t *r, dl_dtype_t in, int emin, int emax)
{
    return (float)dl_round(random_double(r, emin, emax), in);
}

static void check_dot_f32(const float *a, const float *b, size_t n, const char *what)
{
    double *da = malloc(n * sizeof *da + 1), *db = malloc(n * sizeof *db + 1);
    for (size_t i = 0; i < n; i++) {
        da[i] = a[i];
        db[i] = b[i];
    }
    for (int ti = 0; ti < 4; ti++) {
        dl_dtype_t t = all_types[ti];
        double got = dl_dot_exact_f32(a, 1, b, 1, n, t), want = mpref_dot(da, db, n, t);
        ck_assert_msg(same_value(got, want), "%s n=%zu -> %s: got %a, MPFR %a", what, n,
                      dl_dtype_name(t), got, want);
    }
    free(da);
    free(db);
}

START_TEST(acc_random_grids)
{
    dl_test_rng_t r = {1234};
    static const dl_dtype_t ins[] = {DL_F32, DL_BF16, DL_F16};
    for (int it = 0; it < N_RANDOM_DOTS; it++) {
        dl_dtype_t in = ins[it % 3];
        size_t n = 1 + dl_test_next(&r) % 300;
        int wide = it % 4 == 0; /* a quarter of the runs span the whole range */
        int lo = in == DL_F16 ? -24 : (wide ? -149 : -8), hi = in == DL_F16 ? 15 : (wide ? 127 : 8);
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        for (size_t i = 0; i < n; i++) {
            a[i] = grid_value(&r, in, lo, hi);
            b[i] = grid_value(&r, in, lo, hi);
        }
        check_dot_f32(a, b, n, dl_dtype_name(in));
        free(a);
        free(b);
    }
}
END_TEST

/* Massive cancellation: big terms that cancel exactly leave a tiny residue
 * that must survive to the last bit. */
START_TEST(acc_cancellation)
{
    dl_test_rng_t r = {99};
    for (int it = 0; it < 200; it++) {
        size_t n = 2 + dl_test_next(&r) % 200;
        float *a = malloc((2 * n + 1) * sizeof *a), *b = malloc((2 * n + 1) * sizeof *b);
        for (size_t i = 0; i < n; i++) {
            a[i] = grid_value(&r, DL_F32, 60, 127);
            b[i] = grid_value(&r, DL_F32, 60, 127);
            a[n + i] = -a[i];
            b[n + i] = b[i];
        }
        a[2 * n] = grid_value(&r, DL_F32, -149, -100);
        b[2 * n] = grid_value(&r, DL_F32, -149, -100);
        /* shuffle so the cancelling pair is not adjacent */
        for (size_t i = 2 * n; i > 0; i--) {
            size_t j = dl_test_next(&r) % (i + 1);
            float ta = a[i], tb = b[i];
            a[i] = a[j], b[i] = b[j], a[j] = ta, b[j] = tb;
        }
        check_dot_f32(a, b, 2 * n + 1, "cancellation");
        free(a);
        free(b);
    }
    /* exact zero is +0 */
    float a[2] = {3.0f, -3.0f}, b[2] = {5.0f, 5.0f};
    double z = dl_dot_exact_f32(a, 1, b, 1, 2, DL_F32);
    ck_assert(z == 0.0 && !signbit(z));
}
END_TEST

/* Sums that land exactly on a rounding midpoint, and a hair either side. */
START_TEST(acc_ties)
{
    /* 1 + 2^-24 is the fp32 midpoint between 1 and 1+2^-23: ties to even (1). */
    float a[3] = {1.0f, 0x1p-12f, 0x1p-100f}, b[3] = {1.0f, 0x1p-12f, 0.0f};
    ck_assert(dl_dot_exact_f32(a, 1, b, 1, 2, DL_F32) == 1.0);
    b[2] = 0x1p-49f; /* a hair above: rounds up */
    ck_assert(dl_dot_exact_f32(a, 1, b, 1, 3, DL_F32) == 1.0 + 0x1p-23);
    b[2] = -0x1p-49f; /* a hair below: down */
    ck_assert(dl_dot_exact_f32(a, 1, b, 1, 3, DL_F32) == 1.0);
    check_dot_f32(a, b, 3, "tie");
    /* 1 + 3*2^-24 ties to 1 + 2^-22 (even) */
    float c[2] = {1.0f, 0x1.8p-12f}, d[2] = {1.0f, 0x1p-11f};
    ck_assert(dl_dot_exact_f32(c, 1, d, 1, 2, DL_F32) == 1.0 + 0x1p-22);
}
END_TEST

START_TEST(acc_extremes)
{
    /* overflow of the sum to infinity, the largest products, the smallest */
    float big = 0x1.fffffep127f, tiny = 0x1p-149f;
    float a[4] = {big, big, tiny, -tiny}, b[4] = {big, 1.0f, tiny, tiny};
    check_dot_f32(a, b, 4, "extremes");
    ck_assert(dl_dot_exact_f32(a, 1, b, 1, 1, DL_F32) == INFINITY);
    double r64 = dl_dot_exact_f32(a, 1, b, 1, 1, DL_F64);
    ck_assert(r64 == (double)big * (double)big);
    float s[1] = {tiny}, t[1] = {tiny};
    ck_assert(dl_dot_exact_f32(s, 1, t, 1, 1, DL_F32) == 0.0);
    ck_assert(dl_dot_exact_f32(s, 1, t, 1, 1, DL_F64) == 0x1p-298);
    /* subnormal outputs of each type */
    float u[1] = {0x1p-20f}, v[1] = {0x1.8p-6f};
    check_dot_f32(u, v, 1, "fp16 subnormal");
    /* non-finite inputs follow IEEE */
    float n1[2] = {INFINITY, 1.0f}, n2[2] = {1.0f, 1.0f};
    ck_assert(dl_dot_exact_f32(n1, 1, n2, 1, 2, DL_F32) == INFINITY);
    float n3[2] = {INFINITY, -INFINITY};
    ck_assert(isnan(dl_dot_exact_f32(n3, 1, n2, 1, 2, DL_F32)));
    float n4[1] = {INFINITY}, n5[1] = {0.0f};
    ck_assert(isnan(dl_dot_exact_f32(n4, 1, n5, 1, 1, DL_F32)));
    ck_assert(dl_dot_exact_f32(n4, 1, n5, 1, 0, DL_F32) == 0.0);
}
END_TEST

/* Products of arbitrary doubles (any exponent, subnormals) through add_prod. */
START_TEST(acc_f64_products)
{
    dl_test_rng_t r = {555};
    for (int it = 0; it < 200; it++) {
        size_t n = 1 + dl_test_next(&r) % 100;
        double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        int wide = it % 2;
        for (size_t i = 0; i < n; i++) {
            a[i] = random_double(&r, wide ? -1074 : -30, wide ? 1000 : 30);
            b[i] = random_double(&r, wide ? -1074 : -30, wide ? 1000 : 30);
            if (it % 5 == 0 && i % 2 == 1) { /* cancel the previous term */
                a[i] = -a[i - 1];
                b[i] = b[i - 1];
            }
        }
        for (int ti = 0; ti < 4; ti++) {
            double got = dl_dot_exact_f64(a, 1, b, 1, n, all_types[ti]);
            double want = mpref_dot(a, b, n, all_types[ti]);
            ck_assert_msg(same_value(got, want), "f64 dot n=%zu %s: %a vs %a", n,
                          dl_dtype_name(all_types[ti]), got, want);
        }
        free(a);
        free(b);
    }
}
END_TEST

/* A million terms: carries must be propagated before any limb overflows. */
START_TEST(acc_long)
{
    dl_test_rng_t r = {2024};
    size_t n = LONG_DOT_TERMS;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) {
        a[i] = grid_value(&r, DL_BF16, -20, 20);
        b[i] = grid_value(&r, DL_BF16, -20, 20);
    }
    check_dot_f32(a, b, n, "long");
    /* all terms equal and of one sign: the limbs take the full carry load */
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] = 0x1.fffffep20f;
    check_dot_f32(a, b, n, "long same-sign");
    free(a);
    free(b);
    /* add_acc merges partial sums exactly */
    dl_acc_t x, y;
    dl_acc_clear(&x);
    dl_acc_clear(&y);
    dl_acc_add(&x, 1.0);
    dl_acc_add(&y, -0x1p-1000);
    dl_acc_add_acc(&x, &y);
    ck_assert(dl_acc_round(&x, DL_F64) == 1.0 - 0x1p-1000 || dl_acc_round(&x, DL_F64) == 1.0);
    ck_assert_int_eq(dl_acc_sign(&x), 1);
    ck_assert(dl_acc_round(&x, DL_F32) == 1.0);
    dl_acc_add(&x, -1.0);
    ck_assert_int_eq(dl_acc_sign(&x), -1);
    ck_assert(dl_acc_round(&x, DL_F64) == -0x1p-1000);
}
END_TEST

START_TEST(certify_interval)
{
    double out;
    ck_assert(dl__certify(1.0, 1e-12, DL_F32, &out) && out == 1.0);
    ck_assert(!dl__certify(1.0 + 0x1p-24, 1e-12, DL_F32, &out)); /* straddles a midpoint */
    ck_assert(!dl__certify(0.0, 1e-30, DL_F32, &out));            /* -0 or +0 */
    ck_assert(!dl__certify(NAN, 0, DL_F32, &out));
}
END_TEST


int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("round", "rounding", round_random_vs_mpfr, 120),
        DL_TEST("round", "rounding", round_adversarial, 120),
        DL_TEST("round", "rounding", round_scaled_vs_mpfr, 120),
        DL_TEST("round", "rounding", bits_round_trip, 120),
        DL_TEST("round", "rounding", dtype_names, 120),
        DL_TEST("round", "rounding", on_grid_matches_rounding, 120),
        DL_TEST("round", "rounding", certify_interval, 120),
        DL_TEST("accumulator", "exact-sums", acc_random_grids, 300),
        DL_TEST("accumulator", "exact-sums", acc_cancellation, 300),
        DL_TEST("accumulator", "exact-sums", acc_ties, 300),
        DL_TEST("accumulator", "exact-sums", acc_extremes, 300),
        DL_TEST("accumulator", "exact-sums", acc_f64_products, 300),
        DL_TEST("accumulator", "exact-sums", acc_long, 300),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
