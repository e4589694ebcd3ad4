/* The grouped GEMMs against GNU MPFR and against the reference: random
 * shapes, ragged and empty groups, every input grid and output type, both
 * right-hand layouts, two-term sums, ragged K, adversarial cancellation that
 * must reach the slow tiers, and thread-count invariance. */
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

/* Tolerances: none. Every element must match MPFR and the reference bit
 * for bit. MPFR checks every element up to this many per call, else a
 * strided sample of about this many. */
#define MP_CHECK_MAX 4000

void openblas_set_num_threads(int);

static const dl_dtype_t grids[] = {DL_F32, DL_BF16, DL_F16};

static uint32_t fbits(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

/* A value of grid g: a normal deviate times scale times 2^(+-spread). */
static float gen1(dl_test_rng_t *r, dl_dtype_t g, double scale, int spread)
{
    for (;;) {
        double v = dl_test_normal(r) * scale;
        if (spread > 0)
            v = ldexp(v, (int)(dl_test_next(r) % (uint64_t)(2 * spread + 1)) - spread);
        double x = dl_round(v, g);
        if (isfinite(x))
            return (float)x;
    }
}

static float *gen(dl_test_rng_t *r, int64_t n, dl_dtype_t g, double scale, int spread)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = gen1(r, g, scale, spread);
    return x;
}

/* Random group sizes over E experts; with empties, the first, middle and
 * last groups (those that exist) are left empty. */
static int64_t *random_offsets(dl_test_rng_t *r, int64_t E, int64_t M, int empties)
{
    int64_t *off = malloc((size_t)(E + 1) * sizeof(int64_t));
    int64_t *cnt = calloc((size_t)E, sizeof(int64_t));
    int64_t *ok = malloc((size_t)E * sizeof(int64_t)), nok = 0;
    for (int64_t e = 0; e < E; e++)
        if (!empties || E < 2 || (e != 0 && (E < 4 || (e != E / 2 && e != E - 1))))
            ok[nok++] = e;
    for (int64_t i = 0; i < M; i++)
        cnt[ok[dl_test_next(r) % (uint64_t)nok]]++;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = off[e] + cnt[e];
    free(cnt);
    free(ok);
    return off;
}

/* The exact element (m, n) of group e by MPFR. */
static double mp_elem(const dl_gemm_term_t *terms, int nterms, int64_t N, int64_t e,
                      int64_t m, int64_t n, dl_dtype_t t)
{
    int64_t ks = 0;
    for (int i = 0; i < nterms; i++)
        ks += terms[i].K;
    double *a = malloc((size_t)(ks + 1) * sizeof(double));
    double *b = malloc((size_t)(ks + 1) * sizeof(double));
    int64_t q = 0;
    for (int i = 0; i < nterms; i++) {
        int64_t K = terms[i].K;
        const float *w = terms[i].rhs + e * K * N;
        for (int64_t k = 0; k < K; k++, q++) {
            a[q] = terms[i].lhs[m * K + k];
            b[q] = terms[i].layout == DL_RHS_KN ? w[k * N + n] : w[n * K + k];
        }
    }
    double r = mpref_dot(a, b, (size_t)ks, t);
    free(a);
    free(b);
    return r;
}

/* Runs the fast path and the reference; both must agree bit for bit, and
 * with MPFR on every (or a sample of) element. Adds the tier counts to st. */
static void check_grouped(const dl_gemm_term_t *terms, int nterms, int64_t N,
                          const int64_t *off, int64_t E, dl_dtype_t t,
                          dl_tier_stats_t *st, const char *what)
{
    int64_t M = off[E];
    size_t sz = (size_t)(M * N > 0 ? M * N : 1);
    float *fast = malloc(sz * sizeof(float)), *ref = malloc(sz * sizeof(float));
    for (size_t i = 0; i < sz; i++)
        fast[i] = ref[i] = NAN; /* every element must be written */
    dl_tier_stats_t s = {0, 0, 0};
    int rc = dl_gemm_grouped(terms, nterms, N, off, E, t, fast, &s);
    ck_assert_msg(rc == 0, "%s: rc %d", what, rc);
    rc = dl_gemm_grouped_ref(terms, nterms, N, off, E, t, ref);
    ck_assert_msg(rc == 0, "%s: ref rc %d", what, rc);
    ck_assert_msg(s.fast + s.middle + s.exact == M * N, "%s: tier counts %lld+%lld+%lld != %lld",
                  what, (long long)s.fast, (long long)s.middle, (long long)s.exact,
                  (long long)(M * N));
    for (int64_t i = 0; i < M * N; i++)
        ck_assert_msg(fbits(fast[i]) == fbits(ref[i]), "%s: element %lld: fast %a ref %a",
                      what, (long long)i, (double)fast[i], (double)ref[i]);
    int64_t stride = M * N > MP_CHECK_MAX ? M * N / MP_CHECK_MAX + 1 : 1;
    for (int64_t e = 0; e < E; e++)
        for (int64_t m = off[e]; m < off[e + 1]; m++)
            for (int64_t n = 0; n < N; n++) {
                if ((m * N + n) % stride)
                    continue;
                double want = mp_elem(terms, nterms, N, e, m, n, t);
                ck_assert_msg(same_value(fast[m * N + n], want),
                              "%s: (%lld,%lld) %s: got %a, MPFR %a", what, (long long)m,
                              (long long)n, dl_dtype_name(t), (double)fast[m * N + n], want);
            }
    if (st) {
        st->fast += s.fast;
        st->middle += s.middle;
        st->exact += s.exact;
    }
    free(fast);
    free(ref);
}

static void check_ragged(const float *a, int64_t I, const float *b, int64_t J,
                         const int64_t *off, int64_t E, dl_dtype_t t,
                         dl_tier_stats_t *st, const char *what)
{
    size_t sz = (size_t)(E * I * J > 0 ? E * I * J : 1);
    float *fast = malloc(sz * sizeof(float)), *ref = malloc(sz * sizeof(float));
    for (size_t i = 0; i < sz; i++)
        fast[i] = ref[i] = NAN;
    dl_tier_stats_t s = {0, 0, 0};
    int rc = dl_gemm_ragged_k(a, I, b, J, off, E, t, fast, &s);
    ck_assert_msg(rc == 0, "%s: rc %d", what, rc);
    rc = dl_gemm_ragged_k_ref(a, I, b, J, off, E, t, ref);
    ck_assert_msg(rc == 0, "%s: ref rc %d", what, rc);
    ck_assert_msg(s.fast + s.middle + s.exact == E * I * J, "%s: tier counts", what);
    for (int64_t i = 0; i < E * I * J; i++)
        ck_assert_msg(fbits(fast[i]) == fbits(ref[i]), "%s: element %lld: fast %a ref %a",
                      what, (long long)i, (double)fast[i], (double)ref[i]);
    int64_t total = E * I * J;
    int64_t stride = total > MP_CHECK_MAX ? total / MP_CHECK_MAX + 1 : 1;
    int64_t maxme = 0;
    for (int64_t e = 0; e < E; e++)
        if (off[e + 1] - off[e] > maxme)
            maxme = off[e + 1] - off[e];
    double *x = malloc((size_t)(maxme + 1) * sizeof(double));
    double *y = malloc((size_t)(maxme + 1) * sizeof(double));
    for (int64_t idx = 0; idx < total; idx += stride) {
        int64_t e = idx / (I * J), i = idx / J % I, j = idx % J, me = off[e + 1] - off[e];
        for (int64_t m = 0; m < me; m++) {
            x[m] = a[(off[e] + m) * I + i];
            y[m] = b[(off[e] + m) * J + j];
        }
        double want = mpref_dot(x, y, (size_t)me, t);
        ck_assert_msg(same_value(fast[idx], want), "%s: (%lld,%lld,%lld): got %a, MPFR %a",
                      what, (long long)e, (long long)i, (long long)j, (double)fast[idx], want);
    }
    if (st) {
        st->fast += s.fast;
        st->middle += s.middle;
        st->exact += s.exact;
    }
    free(x);
    free(y);
    free(fast);
    free(ref);
}

/* One random grouped problem: K x N, E groups of M rows in all. */
static void random_case(dl_test_rng_t *r, int64_t M, int64_t K, int64_t N, int64_t E,
                        int empties, dl_dtype_t g, dl_dtype_t t, dl_rhs_layout_t lay,
                        int spread, const char *what)
{
    int64_t *off = random_offsets(r, E, M, empties);
    float *lhs = gen(r, M * K, g, 1.0, spread);
    float *rhs = gen(r, E * K * N, g, 1.0 / sqrt((double)(K > 0 ? K : 1)), spread);
    dl_gemm_term_t term = {lhs, K, rhs, lay};
    char buf[200];
    snprintf(buf, sizeof buf, "%s M=%lld K=%lld N=%lld E=%lld in %s out %s %s", what,
             (long long)M, (long long)K, (long long)N, (long long)E, dl_dtype_name(g),
             dl_dtype_name(t), lay == DL_RHS_KN ? "KN" : "NK");
    check_grouped(&term, 1, N, off, E, t, NULL, buf);
    free(off);
    free(lhs);
    free(rhs);
}

/* ------------------------------------------------------------ grouped */

/* Every input grid x output type x layout on shapes with K, N odd, K = 1,
 * and with the panels, tiles and dgemm chunks forced small so that the
 * blocking paths and both loop orders are taken. */
START_TEST(grid_by_out_type)
{
    dl_test_rng_t r = {100 + (uint64_t)_i};
    static const int64_t Ks[] = {1, 3, 13, 70, 257};
    static const int64_t Ns[] = {1, 5, 13, 31, 9};
    for (int gi = 0; gi < 3; gi++)
        for (int ti = 0; ti < 3; ti++)
            for (int lay = 0; lay < 2; lay++) {
                int s = (gi * 6 + ti * 2 + lay + _i) % 5;
                if (_i == 1) {
                    dl__gemm_set_tuning(7, 1); /* 8 x 8 tiles, 7-term chunks */
                    dl__gemm_set_subblock(3);  /* sub-blocks of 3, 3 and 2 columns */
                }
                random_case(&r, 29, Ks[s], Ns[s], 4, 0, grids[gi], grids[ti],
                            (dl_rhs_layout_t)lay, 0, _i ? "small tiles" : "default");
                dl__gemm_set_tuning(0, 0);
                dl__gemm_set_subblock(0);
            }
}
END_TEST

START_TEST(random_shapes)
{
    dl_test_rng_t r = {7};
    for (int it = 0; it < 40; it++) {
        int64_t E = 1 + (int64_t)(dl_test_next(&r) % 6);
        int64_t M = (int64_t)(dl_test_next(&r) % 60);
        int64_t K = 1 + (int64_t)(dl_test_next(&r) % 300);
        int64_t N = 1 + (int64_t)(dl_test_next(&r) % 40);
        dl_dtype_t g = grids[dl_test_next(&r) % 3], t = grids[dl_test_next(&r) % 3];
        if (it % 3 == 0) {
            dl__gemm_set_tuning(1 + (int64_t)(dl_test_next(&r) % 40),
                                1 + (int64_t)(dl_test_next(&r) % 100000));
            dl__gemm_set_subblock((int64_t)(dl_test_next(&r) % 10)); /* 0: default */
        }
        random_case(&r, M, K, N, E, it % 2, g, t, (dl_rhs_layout_t)(it % 2), it % 4 == 1 ? 8 : 0,
                    "random");
        dl__gemm_set_tuning(0, 0);
        dl__gemm_set_subblock(0);
    }
}
END_TEST

START_TEST(empty_groups)
{
    dl_test_rng_t r = {11};
    int64_t K = 37, N = 19, E = 5;
    float *lhs = gen(&r, 40 * K, DL_BF16, 1.0, 0);
    float *rhs = gen(&r, E * K * N, DL_BF16, 0.2, 0);
    static const int64_t cases[][6] = {
        {0, 0, 10, 20, 30, 40},  /* first empty */
        {0, 10, 20, 20, 30, 40}, /* middle empty */
        {0, 10, 20, 30, 40, 40}, /* last empty */
        {0, 0, 0, 40, 40, 40},   /* one group holds everything */
        {0, 0, 0, 0, 0, 0},      /* M_total = 0 */
        {0, 1, 1, 2, 39, 40},    /* single rows */
    };
    for (int c = 0; c < 6; c++)
        for (int lay = 0; lay < 2; lay++) {
            dl_gemm_term_t term = {lhs, K, rhs, (dl_rhs_layout_t)lay};
            check_grouped(&term, 1, N, cases[c], E, DL_F32, NULL, "empty groups");
            check_grouped(&term, 1, N, cases[c], E, DL_BF16, NULL, "empty groups");
        }
    free(lhs);
    free(rhs);
}
END_TEST

/* K = 0 gives exact +0; N = 0 writes nothing; M_total = 0 writes nothing. */
START_TEST(degenerate_sizes)
{
    float lhs[4] = {1, 2, 3, 4}, rhs[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t off[3] = {0, 2, 4};
    float out[16];
    for (int i = 0; i < 16; i++)
        out[i] = -1.0f;
    dl_gemm_term_t term = {lhs, 0, rhs, DL_RHS_KN};
    dl_tier_stats_t s = {0, 0, 0};
    ck_assert_int_eq(dl_gemm_grouped(&term, 1, 3, off, 2, DL_F32, out, &s), 0);
    for (int i = 0; i < 12; i++)
        ck_assert(fbits(out[i]) == 0);
    ck_assert_int_eq(out[12], -1.0f);
    ck_assert_int_eq(s.fast + s.middle + s.exact, 12);
    term.K = 1;
    for (int i = 0; i < 16; i++)
        out[i] = -1.0f;
    ck_assert_int_eq(dl_gemm_grouped(&term, 1, 0, off, 2, DL_F32, out, &s), 0);
    ck_assert_int_eq(out[0], -1.0f);
    int64_t z[3] = {0, 0, 0};
    ck_assert_int_eq(dl_gemm_grouped(&term, 1, 3, z, 2, DL_F32, out, &s), 0);
    ck_assert_int_eq(out[0], -1.0f);
    /* ragged: an empty group and a zero-row problem give exact zeros */
    for (int i = 0; i < 16; i++)
        out[i] = -1.0f;
    ck_assert_int_eq(dl_gemm_ragged_k(lhs, 2, rhs, 2, z, 2, DL_BF16, out, NULL), 0);
    for (int i = 0; i < 8; i++)
        ck_assert(fbits(out[i]) == 0);
    ck_assert_int_eq(out[8], -1.0f);
}
END_TEST

/* Loop index 1 of the exponent-range and slow-tier tests: 7-term dgemm chunks, so that bf16
 * and fp16 outputs take the path where dgemm adds every chunk into the tile
 * itself (beta = 1, the bound gamma_K) over many chunks, under the same
 * cancellation, exponent spread and midpoints; and sub-blocks of 5 columns,
 * so that each chunk is converted, multiplied (and for fp32 outputs added
 * into the tile) a sub-block at a time and certified after its last chunk. */
static void chunks_for(int i)
{
    dl__gemm_set_tuning(i ? 7 : 0, 0);
    dl__gemm_set_subblock(i ? 5 : 0);
}

/* Products from 2^-120 to 2^120 in one dot product: the certificate must
 * not be fooled by absorption. */
START_TEST(dynamic_range)
{
    dl_test_rng_t r = {21 + (uint64_t)_i};
    chunks_for(_i);
    for (int ti = 0; ti < 3; ti++) {
        random_case(&r, 40, 150, 23, 3, 1, DL_F32, grids[ti], DL_RHS_KN, 60, "range f32");
        random_case(&r, 40, 150, 23, 3, 1, DL_BF16, grids[ti], DL_RHS_NK, 60, "range bf16");
        random_case(&r, 40, 150, 23, 3, 1, DL_F16, grids[ti], DL_RHS_KN, 6, "range f16");
    }
    chunks_for(0);
}
END_TEST

/* Subnormal inputs and outputs that land in each output type's subnormal
 * range (and fp16 overflow to infinity). */
START_TEST(subnormals_and_overflow)
{
    dl_test_rng_t r = {31};
    int64_t M = 24, K = 33, N = 17, E = 2;
    int64_t *off = random_offsets(&r, E, M, 0);
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = grids[ti];
        /* fp32 subnormal inputs times 1: fp32/bf16 subnormal outputs */
        float *lhs = gen(&r, M * K, DL_F32, 0x1p-140, 4);
        float *rhs = gen(&r, E * K * N, DL_F32, 1.0, 2);
        dl_gemm_term_t term = {lhs, K, rhs, DL_RHS_KN};
        check_grouped(&term, 1, N, off, E, t, NULL, "subnormal f32");
        free(lhs);
        free(rhs);
        /* fp16 subnormal inputs: fp16 subnormal outputs */
        lhs = gen(&r, M * K, DL_F16, 0x1p-12, 2);
        rhs = gen(&r, E * K * N, DL_F16, 0x1p-8, 2);
        term = (dl_gemm_term_t){lhs, K, rhs, DL_RHS_NK};
        check_grouped(&term, 1, N, off, E, t, NULL, "subnormal f16");
        free(lhs);
        free(rhs);
        /* large values: fp16 outputs overflow to infinity */
        lhs = gen(&r, M * K, DL_F16, 300.0, 1);
        rhs = gen(&r, E * K * N, DL_F16, 100.0, 1);
        term = (dl_gemm_term_t){lhs, K, rhs, DL_RHS_KN};
        check_grouped(&term, 1, N, off, E, t, NULL, "overflow f16");
        free(lhs);
        free(rhs);
    }
    free(off);
}
END_TEST

/* Rows whose halves repeat against columns whose halves negate: the big
 * products cancel exactly, so the binary64 result is all rounding error and
 * the fast tier cannot certify. The two tail terms then give a generic small
 * value, an exact zero or an exact midpoint of out_t. The middle tier decides
 * all of them when its double-double sum is provably exact; the products'
 * exponents are spread wide so that often it is not, and a zero or midpoint
 * is then left to the exact tier. */
static void cancel_case(dl_test_rng_t *r, dl_dtype_t g, dl_dtype_t t, dl_rhs_layout_t lay,
                        int64_t h, dl_tier_stats_t *st)
{
    int64_t K = 2 * h + 2, N = 12, E = 2, M = 18;
    int64_t off[3] = {0, 7, M};
    int p = dl_dtype_precision(t);
    int spread = g == DL_F16 ? 12 : 40;
    float *lhs = malloc((size_t)(M * K) * sizeof(float));
    float *rhs = malloc((size_t)(E * K * N) * sizeof(float));
    for (int64_t m = 0; m < M; m++) {
        float *a = lhs + m * K;
        for (int64_t k = 0; k < h; k++)
            a[k] = a[k + h] = gen1(r, g, 1.0, spread);
        if (m % 2 == 0) { /* the midpoint 2^-4 (1 + 2^-p) with the [1, 1] tail */
            a[2 * h] = 0x1p-4f;
            a[2 * h + 1] = (float)ldexp(1.0, -4 - p);
        } else {
            a[2 * h] = gen1(r, g, 0.1, 0);
            a[2 * h + 1] = gen1(r, g, 0.1, 0);
        }
    }
    for (int64_t e = 0; e < E; e++)
        for (int64_t n = 0; n < N; n++) {
            float col[2 * 1024 + 2];
            for (int64_t k = 0; k < h; k++) {
                col[k] = gen1(r, g, 1.0, spread);
                col[k + h] = -col[k];
            }
            int kind = (int)(n % 3);
            col[2 * h] = kind == 0 ? gen1(r, g, 1.0, 0) : kind == 1 ? 0.0f : 1.0f;
            col[2 * h + 1] = kind == 0 ? gen1(r, g, 1.0, 0) : kind == 1 ? 0.0f : 1.0f;
            for (int64_t k = 0; k < K; k++) {
                if (lay == DL_RHS_KN)
                    rhs[e * K * N + k * N + n] = col[k];
                else
                    rhs[e * K * N + n * K + k] = col[k];
            }
        }
    dl_gemm_term_t term = {lhs, K, rhs, lay};
    check_grouped(&term, 1, N, off, E, t, st, "cancellation");
    free(lhs);
    free(rhs);
}

START_TEST(cancellation_reaches_slow_tiers)
{
    dl_test_rng_t r = {41};
    chunks_for(_i);
    dl_tier_stats_t all = {0, 0, 0};
    for (int gi = 0; gi < 3; gi++)
        for (int ti = 0; ti < 3; ti++) {
            dl_tier_stats_t st = {0, 0, 0};
            cancel_case(&r, grids[gi], grids[ti], (dl_rhs_layout_t)((gi + ti) % 2),
                        100 + 37 * gi, &st);
            ck_assert_msg(st.middle > 0 && st.fast < st.middle + st.exact,
                          "in %s out %s: fast %lld middle %lld exact %lld", dl_dtype_name(grids[gi]),
                          dl_dtype_name(grids[ti]), (long long)st.fast, (long long)st.middle,
                          (long long)st.exact);
            if (grids[gi] != DL_F16)
                ck_assert_msg(st.exact > 0, "in %s out %s: exact tier not reached",
                              dl_dtype_name(grids[gi]), dl_dtype_name(grids[ti]));
            all.middle += st.middle;
            all.exact += st.exact;
        }
    ck_assert(all.middle > 0 && all.exact > 0);
    chunks_for(0);
}
END_TEST

/* Exact midpoints of out_t nudged by a tiny third term (+, -, or none),
 * under big cancelling pairs: the fast tier cannot decide, the middle tier's
 * double-double sum is exact, and its rounding must see the nudge (it sits
 * far below a binary64 ulp of the midpoint). */
START_TEST(midpoints_with_sticky)
{
    dl_test_rng_t r = {43};
    chunks_for(_i);
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = grids[ti];
        int p = dl_dtype_precision(t);
        int64_t h = 40, K = 2 * h + 3, N = 9, M = 6, E = 1;
        int64_t off[2] = {0, M};
        float *lhs = malloc((size_t)(M * K) * sizeof(float));
        float *rhs = malloc((size_t)(K * N) * sizeof(float));
        for (int64_t m = 0; m < M; m++) {
            float sg = m % 2 ? -1.0f : 1.0f;
            float *a = lhs + m * K;
            for (int64_t k = 0; k < h; k++)
                a[k] = a[k + h] = (float)dl_round(dl_test_normal(&r) * 256.0, DL_BF16);
            a[2 * h] = sg * 0x1p-4f;
            a[2 * h + 1] = sg * (float)ldexp(1.0, -4 - p);
            a[2 * h + 2] = (float)ldexp(1.0, -70 - (int)m);
        }
        for (int64_t n = 0; n < N; n++) {
            for (int64_t k = 0; k < h; k++) {
                rhs[k * N + n] = (float)dl_round(dl_test_normal(&r) * 256.0, DL_BF16);
                rhs[(k + h) * N + n] = -rhs[k * N + n];
            }
            rhs[2 * h * N + n] = 1.0f;
            rhs[(2 * h + 1) * N + n] = n % 2 ? 3.0f : 1.0f; /* odd n: not a midpoint */
            rhs[(2 * h + 2) * N + n] = (float)(n % 3) - 1.0f;
        }
        dl_gemm_term_t term = {lhs, K, rhs, DL_RHS_KN};
        dl_tier_stats_t st = {0, 0, 0};
        check_grouped(&term, 1, N, off, E, t, &st, "midpoints");
        ck_assert_int_eq(st.fast, 0);
        free(lhs);
        free(rhs);
    }
    chunks_for(0);
}
END_TEST

/* d_x = d_h_gate Wg^T + d_h_up Wu^T rounded once: two terms (different K
 * and layouts), including a pair that cancels between the terms. */
START_TEST(two_terms)
{
    dl_test_rng_t r = {51};
    for (int it = 0; it < 6; it++) {
        int64_t E = 3, M = 33, N = 21, K1 = 40 + it * 17, K2 = it == 5 ? K1 : 25 + it;
        dl_dtype_t g = grids[it % 3], t = grids[(it / 3 + it) % 3];
        int64_t *off = random_offsets(&r, E, M, it % 2);
        float *l1 = gen(&r, M * K1, g, 1.0, 0), *l2 = gen(&r, M * K2, g, 1.0, 0);
        float *w1 = gen(&r, E * K1 * N, g, 0.1, 0), *w2 = gen(&r, E * K2 * N, g, 0.1, 0);
        if (it == 5) { /* the second term is exactly minus the first */
            for (int64_t i = 0; i < M * K1; i++)
                l2[i] = -l1[i];
            memcpy(w2, w1, (size_t)(E * K1 * N) * sizeof(float));
        }
        dl_gemm_term_t terms[2] = {{l1, K1, w1, DL_RHS_NK},
                                   {l2, K2, w2, it % 2 ? DL_RHS_KN : DL_RHS_NK}};
        if (it == 5)
            terms[1].layout = DL_RHS_NK;
        if (it == 2)
            dl__gemm_set_tuning(9, 1);
        dl_tier_stats_t st = {0, 0, 0};
        check_grouped(terms, 2, N, off, E, t, &st, "two terms");
        dl__gemm_set_tuning(0, 0);
        if (it == 5) /* all exact zeros: the exact-sum certificate decides them (+0) */
            ck_assert(st.middle == 0 && st.exact == 0);
        free(off);
        free(l1);
        free(l2);
        free(w1);
        free(w2);
    }
}
END_TEST

/* Long K with the default chunking: bf16 inputs give exact sums short
 * enough that fp32 ties are common (the middle tier's exact rounding), fp32
 * inputs leave the odd element to the middle tier by width alone. */
START_TEST(long_k)
{
    dl_test_rng_t r = {55};
    random_case(&r, 48, 3001, 40, 2, 0, DL_BF16, DL_F32, DL_RHS_KN, 0, "long K bf16");
    random_case(&r, 48, 3001, 40, 2, 0, DL_F32, DL_F32, DL_RHS_NK, 0, "long K f32");
    random_case(&r, 30, 1000, 30, 2, 0, DL_BF16, DL_F32, DL_RHS_NK, 3, "long K bf16 spread");
    /* bf16 and fp16 outputs: 12 chunks that dgemm accumulates itself */
    random_case(&r, 24, 3001, 20, 2, 0, DL_BF16, DL_BF16, DL_RHS_KN, 40, "long K to bf16");
    random_case(&r, 24, 3001, 20, 2, 0, DL_F32, DL_F16, DL_RHS_NK, 4, "long K to f16");
}
END_TEST

/* ------------------------------------------------------------ ragged K */

START_TEST(ragged_random)
{
    dl_test_rng_t r = {61};
    for (int it = 0; it < 18; it++) {
        int64_t E = 1 + it % 5, M = (int64_t)(dl_test_next(&r) % 200);
        int64_t I = 1 + (int64_t)(dl_test_next(&r) % 30), J = 1 + (int64_t)(dl_test_next(&r) % 30);
        dl_dtype_t g = grids[it % 3], t = grids[(it / 3) % 3];
        int64_t *off = random_offsets(&r, E, M, it % 2);
        float *a = gen(&r, M * I, g, 1.0, it % 4 == 3 ? 10 : 0);
        float *b = gen(&r, M * J, g, 1.0, 0);
        if (it % 3 == 1) {
            dl__gemm_set_tuning(5, 1);
            dl__gemm_set_subblock(1 + it % 4);
        }
        check_ragged(a, I, b, J, off, E, t, NULL, "ragged");
        dl__gemm_set_tuning(0, 0);
        dl__gemm_set_subblock(0);
        free(off);
        free(a);
        free(b);
    }
}
END_TEST

/* Ragged K with rows that cancel in pairs: the slow tiers must be taken. */
START_TEST(ragged_cancellation)
{
    dl_test_rng_t r = {71};
    chunks_for(_i);
    int64_t h = 150, I = 9, J = 8, E = 3;
    int64_t me = 2 * h + 2, M = 2 * me;
    int64_t off[4] = {0, me, me, M}; /* middle group empty */
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = grids[ti];
        int p = dl_dtype_precision(t);
        float *a = malloc((size_t)(M * I) * sizeof(float));
        float *b = malloc((size_t)(M * J) * sizeof(float));
        for (int64_t g0 = 0; g0 < M; g0 += me) {
            for (int64_t m = 0; m < h; m++) {
                for (int64_t i = 0; i < I; i++)
                    a[(g0 + m) * I + i] = a[(g0 + m + h) * I + i] = gen1(&r, DL_F32, 1.0, 40);
                for (int64_t j = 0; j < J; j++) {
                    b[(g0 + m) * J + j] = gen1(&r, DL_F32, 1.0, 40);
                    b[(g0 + m + h) * J + j] = -b[(g0 + m) * J + j];
                }
            }
            for (int64_t i = 0; i < I; i++) {
                a[(g0 + 2 * h) * I + i] = i % 2 ? gen1(&r, DL_F16, 0.1, 0) : 0x1p-4f;
                a[(g0 + 2 * h + 1) * I + i] = i % 2 ? gen1(&r, DL_F16, 0.1, 0)
                                                    : (float)ldexp(1.0, -4 - p);
            }
            for (int64_t j = 0; j < J; j++) {
                int kind = (int)(j % 3);
                b[(g0 + 2 * h) * J + j] = kind == 0 ? gen1(&r, DL_F16, 1, 0) : kind == 1 ? 0.0f : 1.0f;
                b[(g0 + 2 * h + 1) * J + j] = kind == 0 ? gen1(&r, DL_F16, 1, 0) : kind == 1 ? 0.0f : 1.0f;
            }
        }
        dl_tier_stats_t st = {0, 0, 0};
        check_ragged(a, I, b, J, off, E, t, &st, "ragged cancellation");
        ck_assert_msg(st.middle > 0 && st.exact > 0, "out %s: fast %lld middle %lld exact %lld",
                      dl_dtype_name(t), (long long)st.fast, (long long)st.middle,
                      (long long)st.exact);
        free(a);
        free(b);
    }
    chunks_for(0);
}
END_TEST

/* Groups of 1-8 rows (the short-group path of the ragged GEMM: its own
 * summation loop, tier 1 per element, the middle tier on its misses):
 * products of bf16 values are exact ties of bf16 and fp16 outputs often
 * (a single product has 16 significant bits), pairs that cancel give exact
 * zeros (+0, also from -0 products), a wide exponent spread gives
 * subnormal fp16 results; J = 37 has a partial column block. Every element
 * against the reference and MPFR, in all three output types; the ties must
 * reach the middle tier. */
START_TEST(ragged_short_groups)
{
    dl_test_rng_t r = {67};
    int64_t E = 9, I = 23, J = 37;
    int64_t off[10] = {0};
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = off[e] + (e == 4 ? 0 : 1 + e % 8); /* expert 4 empty */
    int64_t M = off[E];
    for (int ti = 0; ti < 3; ti++)
        for (int spread = 0; spread <= 30; spread += 30) {
            float *a = gen(&r, M * I, DL_BF16, 1.0, spread);
            float *b = gen(&r, M * J, DL_BF16, 1.0, spread);
            for (int64_t e = 0; e < E; e++) {
                int64_t me = off[e + 1] - off[e], h = me / 2;
                for (int64_t m = 0; m < h && me % 2 == 0; m++) /* group cancels exactly */
                    for (int64_t i = 0; i < I; i++) {
                        a[(off[e] + m + h) * I + i] = a[(off[e] + m) * I + i];
                        for (int64_t j = 0; j < J && i == 0; j++)
                            b[(off[e] + m + h) * J + j] = -b[(off[e] + m) * J + j];
                    }
                for (int64_t m = 0; m < me; m++) /* column 3: zeros times negatives (-0) */
                    b[(off[e] + m) * J + 3] = 0.0f, a[(off[e] + m) * I + 5] = -fabsf(a[(off[e] + m) * I + 5]);
            }
            dl_tier_stats_t st = {0, 0, 0};
            check_ragged(a, I, b, J, off, E, grids[ti], &st, "ragged short groups");
            ck_assert_msg(st.middle > 0, "out %s spread %d: fast %lld middle %lld exact %lld",
                          dl_dtype_name(grids[ti]), spread, (long long)st.fast,
                          (long long)st.middle, (long long)st.exact);
            free(a);
            free(b);
        }
}
END_TEST

/* ------------------------------------------------------------ threads */

/* The same bits with 1 or 2 OpenMP threads and 1 or 2 OpenBLAS threads, on
 * a problem large enough that OpenBLAS splits it. */
START_TEST(thread_invariance)
{
    dl_test_rng_t r = {81};
    int64_t E = 3, M = 420, K = 700, N = 260;
    int64_t *off = random_offsets(&r, E, M, 0);
    float *lhs = gen(&r, M * K, DL_F32, 1.0, 0);
    float *rhs = gen(&r, E * K * N, DL_F32, 1.0 / sqrt((double)K), 0);
    dl_gemm_term_t term = {lhs, K, rhs, DL_RHS_KN};
    float *ref = malloc((size_t)(M * N) * sizeof(float));
    float *out = malloc((size_t)(M * N) * sizeof(float));
    ck_assert_int_eq(dl_gemm_grouped_ref(&term, 1, N, off, E, DL_F32, ref), 0);
    for (int cfg = 0; cfg < 4; cfg++) {
#ifdef _OPENMP
        omp_set_num_threads(cfg & 1 ? 2 : 1);
#endif
        openblas_set_num_threads(cfg & 2 ? 2 : 1);
        dl_tier_stats_t st = {0, 0, 0};
        ck_assert_int_eq(dl_gemm_grouped(&term, 1, N, off, E, DL_F32, out, &st), 0);
        ck_assert(st.fast > 0);
        ck_assert_msg(memcmp(out, ref, (size_t)(M * N) * sizeof(float)) == 0,
                      "omp %d openblas %d threads: bits differ", cfg & 1 ? 2 : 1, cfg & 2 ? 2 : 1);
        /* ragged: dW[e] = lhs_e^T lhs_e[:, :N] */
        float *w = malloc((size_t)(E * 40 * 30) * sizeof(float));
        float *wr = malloc((size_t)(E * 40 * 30) * sizeof(float));
        float *bb = gen(&r, M * 30, DL_F32, 1.0, 0);
        ck_assert_int_eq(dl_gemm_ragged_k(lhs, 40, bb, 30, off, E, DL_F32, w, NULL), 0);
        ck_assert_int_eq(dl_gemm_ragged_k_ref(lhs, 40, bb, 30, off, E, DL_F32, wr), 0);
        ck_assert(memcmp(w, wr, (size_t)(E * 40 * 30) * sizeof(float)) == 0);
        free(w);
        free(wr);
        free(bb);
    }
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    openblas_set_num_threads(2);
    free(off);
    free(lhs);
    free(rhs);
    free(ref);
    free(out);
}
END_TEST

/* ------------------------------------------------------------ certificate */

/* 1 if every real in [y - err, y + err] rounds to r in t, by MPFR: both
 * ends are computed exactly and rounded once (rounding is monotone, so the
 * reals between round to r too; a tiny end rounds to a zero of its own
 * sign). The interval {0} must give +0, the GEMM's exact zero. */
static int mp_interval_rounds_to(double y, double err, dl_dtype_t t, double r)
{
    mpfr_t x;
    mpfr_init2(x, 2300); /* y +- err exactly: doubles span 2^-1074 .. 2^1024 */
    double end[2];
    int zeros = 0;
    for (int k = 0; k < 2; k++) {
        mpfr_set_d(x, y, MPFR_RNDN);
        if (k)
            mpfr_add_d(x, x, err, MPFR_RNDN);
        else
            mpfr_sub_d(x, x, err, MPFR_RNDN);
        zeros += mpfr_zero_p(x) != 0;
        end[k] = mpref_round(x, t);
    }
    mpfr_clear(x);
    if (zeros == 2)
        return same_value(r, 0.0);
    return same_value(end[0], r) && same_value(end[1], r);
}

/* One (y, err) through both certificates: what either certifies, MPFR
 * confirms; returns 1 if the fast test certified. */
static int cert_case(double y, double err, dl_dtype_t t)
{
    float v[2];
    int ok[2];
    for (int fast = 0; fast < 2; fast++) {
        ok[fast] = dl__gemm_certify(y, err, t, fast, &v[fast]);
        ck_assert_msg(ok[fast] == (v[fast] == v[fast]), "certify: return and value disagree");
        if (ok[fast])
            ck_assert_msg(mp_interval_rounds_to(y, err, t, v[fast]),
                          "%s certificate: %a +- %a certified as %a in %s, MPFR disagrees",
                          fast ? "fast" : "full", y, err, (double)v[fast], dl_dtype_name(t));
    }
    return ok[1];
}

/* A normal value of t with exponent e (p significant bits) and a random
 * fraction. */
static double value_of(dl_test_rng_t *r, int p, int e)
{
    double f = (double)(dl_test_next(r) >> (64 - (p - 1)));
    return ldexp(1.0 + ldexp(f, 1 - p), e);
}

/* Tier 1's certificates on their own against MPFR (above): y at and a few
 * doubles around the midpoints of t, around powers of two (the boundary
 * below is ulp/4 away there), at the bottom and top of t's normal range,
 * in its subnormal range, past its overflow threshold, zero; err from 0 to
 * an ulp of t, around the distances that decide (the distance to the
 * midpoint, ulp/4, ulp/2, plus and minus a double). The fast test must also
 * certify every exactly representable y with err = 0 and nearly every y
 * with a tiny err, so that it cannot pass by refusing. */
START_TEST(certificate_intervals)
{
    dl_test_rng_t r = {97};
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = grids[ti];
        int p = dl_dtype_precision(t);
        int emin = t == DL_F16 ? -14 : -126, emax = t == DL_F16 ? 15 : 127;
        int64_t tiny_ok = 0, tiny_n = 0;
        for (int it = 0; it < 20000; it++) {
            int which = it % 5;
            int e = which == 0 ? emin + (int)(dl_test_next(&r) % 3)
                  : which == 1 ? emax - (int)(dl_test_next(&r) % 3)
                  : which == 2 ? emin - 1 - (int)(dl_test_next(&r) % 12) /* subnormal of t */
                               : emin + (int)(dl_test_next(&r) % (uint64_t)(emax - emin + 1));
            double v = which == 4 ? ldexp(1.0, e) : value_of(&r, p, e);
            double ulp = ldexp(1.0, e - (p - 1)), du = ldexp(1.0, e - 52);
            double sg = dl_test_next(&r) & 1 ? -1.0 : 1.0;
            /* the midpoint above v, or for a power of two the one below */
            double mid = which == 4 && (it & 8) ? v - ulp / 4 : v + ulp / 2;
            int64_t k = (int64_t)(dl_test_next(&r) % 7) - 3;
            if (it % 3 == 0)
                k = (int64_t)(dl_test_next(&r) % 2000001) - 1000000;
            double y = sg * (mid + (double)k * du);
            double d = fabs(fabs(y) - mid);
            const double errs[] = {0.0, d, d - du, d + du, nextafter(d, 0.0), ulp / 4,
                                   ulp / 4 - du, ulp / 4 + du, ulp / 2, ulp,
                                   ulp * dl_test_unif(&r)};
            for (size_t q = 0; q < sizeof errs / sizeof errs[0]; q++)
                if (errs[q] >= 0.0)
                    cert_case(y, errs[q], t);
            cert_case(sg * v, 0.0, t); /* v itself, exactly */
            if (which == 4) /* just above a power of two, the boundary below ulp/4 away */
                for (int64_t j = 0; j < 3; j++) {
                    double yp = sg * (v + (double)j * du), f = (double)j * du;
                    const double e4[] = {ulp / 4 + f - du, ulp / 4 + f, ulp / 4 + f + du,
                                         3 * ulp / 8, ulp / 2 - f - du};
                    for (size_t q = 0; q < sizeof e4 / sizeof e4[0]; q++)
                        cert_case(yp, e4[q], t);
                }
            if (which != 2 && e < emax) { /* the fast test's range: below 2^emax */
                ck_assert_msg(cert_case(sg * v, 0.0, t), "fast test refused %a in %s", sg * v,
                              dl_dtype_name(t));
                double yr = sg * v * (1.0 + dl_test_unif(&r));
                if (fabs(yr) < ldexp(1.0, emax)) {
                    tiny_ok += cert_case(yr, fabs(yr) * ldexp(1.0, -p - 14), t);
                    tiny_n++;
                }
            }
        }
        /* specials: zeros, the overflow threshold, huge and tiny values */
        const double sp[] = {0.0, -0.0, ldexp(1.0, emax + 1), -ldexp(1.0, emax + 1),
                             ldexp(2.0 - ldexp(1.0, 1 - p), emax),
                             ldexp(2.0 - ldexp(1.0, -p), emax), 0x1p-1074, 0x1p1000};
        for (size_t q = 0; q < sizeof sp / sizeof sp[0]; q++)
            for (int z = 0; z < 3; z++)
                cert_case(sp[q], z == 0 ? 0.0 : z == 1 ? 0x1p-1074 : fabs(sp[q]) * 0x1p-60, t);
        ck_assert_msg(tiny_ok * 1000 >= tiny_n * 998, "%s: fast test certified %lld of %lld",
                      dl_dtype_name(t), (long long)tiny_ok, (long long)tiny_n);
    }
}
END_TEST

/* ------------------------------------------------------------ errors */

START_TEST(errors)
{
    float lhs[12] = {0}, rhs[24] = {0}, out[24];
    int64_t off[3] = {0, 2, 4}, bad[3] = {0, 3, 2}, bad0[3] = {1, 2, 4};
    dl_gemm_term_t term = {lhs, 3, rhs, DL_RHS_KN};
    ck_assert_int_eq(dl_gemm_grouped(NULL, 1, 2, off, 2, DL_F32, out, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_gemm_grouped(&term, 0, 2, off, 2, DL_F32, out, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_gemm_grouped(&term, 1, -1, off, 2, DL_F32, out, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_gemm_grouped(&term, 1, 2, bad, 2, DL_F32, out, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_gemm_grouped(&term, 1, 2, bad0, 2, DL_F32, out, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_gemm_grouped(&term, 1, 2, NULL, 2, DL_F32, out, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_gemm_grouped(&term, 1, 2, off, 2, DL_F32, NULL, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_gemm_grouped(&term, 1, 2, off, 2, DL_F64, out, NULL), DL_EDTYPE);
    ck_assert_int_eq(dl_gemm_grouped_ref(&term, 1, 2, off, 2, DL_F64, out), DL_EDTYPE);
    dl_gemm_term_t neg = {lhs, -1, rhs, DL_RHS_KN}, lay = {lhs, 3, rhs, (dl_rhs_layout_t)7};
    ck_assert_int_eq(dl_gemm_grouped(&neg, 1, 2, off, 2, DL_F32, out, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_gemm_grouped(&lay, 1, 2, off, 2, DL_F32, out, NULL), DL_EINVAL);
    /* sizes whose products overflow int64, checked before any access */
    dl_gemm_term_t huge = {lhs, INT64_C(1) << 40, rhs, DL_RHS_KN};
    int64_t hoff[2] = {0, INT64_C(1) << 30};
    ck_assert_int_eq(dl_gemm_grouped(&huge, 1, 2, hoff, 1, DL_F32, out, NULL), DL_EOVERFLOW);
    ck_assert_int_eq(dl_gemm_grouped_ref(&huge, 1, 2, hoff, 1, DL_F32, out), DL_EOVERFLOW);
    ck_assert_int_eq(dl_gemm_ragged_k(lhs, INT64_C(1) << 40, rhs, 2, hoff, 1, DL_F32, out, NULL),
                     DL_EOVERFLOW);
    ck_assert_int_eq(dl_gemm_ragged_k(NULL, 2, rhs, 2, off, 2, DL_F32, out, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_gemm_ragged_k(lhs, -2, rhs, 2, off, 2, DL_F32, out, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_gemm_ragged_k(lhs, 2, rhs, 2, bad, 2, DL_F32, out, NULL), DL_EINVAL);
}
END_TEST

/* A NaN or an infinity in any input that takes part gives DL_ENONFINITE;
 * one in the weights of an expert with no rows takes no part. */
START_TEST(nonfinite)
{
    dl_test_rng_t r = {91};
    int64_t E = 3, M = 10, K = 9, N = 6;
    int64_t off[4] = {0, 5, 10, 10};
    float *lhs = gen(&r, M * K, DL_F32, 1, 0), *rhs = gen(&r, E * K * N, DL_F32, 1, 0);
    float out[200];
    dl_gemm_term_t term = {lhs, K, rhs, DL_RHS_KN};
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int v = 0; v < 6; v++) {
        /* v >= 3: the same with sub-blocks of 2 columns, each certified
         * after its last chunk: a bad value in a later sub-block (rhs
         * column 2) still fails the call */
        dl__gemm_set_subblock(v >= 3 ? 2 : 0);
        float keep = lhs[7 * K + 4];
        lhs[7 * K + 4] = bad[v % 3];
        ck_assert_int_eq(dl_gemm_grouped(&term, 1, N, off, E, DL_F32, out, NULL), DL_ENONFINITE);
        ck_assert_int_eq(dl_gemm_grouped_ref(&term, 1, N, off, E, DL_F32, out), DL_ENONFINITE);
        lhs[7 * K + 4] = keep;
        keep = rhs[1 * K * N + 3 * N + 2];
        rhs[1 * K * N + 3 * N + 2] = bad[v % 3];
        ck_assert_int_eq(dl_gemm_grouped(&term, 1, N, off, E, DL_BF16, out, NULL), DL_ENONFINITE);
        rhs[1 * K * N + 3 * N + 2] = keep;
        keep = rhs[2 * K * N + 3];
        rhs[2 * K * N + 3] = bad[v % 3]; /* expert 2 has no rows */
        ck_assert_int_eq(dl_gemm_grouped(&term, 1, N, off, E, DL_BF16, out, NULL), 0);
        rhs[2 * K * N + 3] = keep;
        /* ragged: a and b rows of group 1 */
        keep = lhs[6 * K + 1];
        lhs[6 * K + 1] = bad[v % 3];
        ck_assert_int_eq(dl_gemm_ragged_k(lhs, K, rhs, N, off, E, DL_F16, out, NULL),
                         DL_ENONFINITE);
        ck_assert_int_eq(dl_gemm_ragged_k_ref(lhs, K, rhs, N, off, E, DL_F16, out),
                         DL_ENONFINITE);
        lhs[6 * K + 1] = keep;
    }
    dl__gemm_set_subblock(0);
    free(lhs);
    free(rhs);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST_LOOP("gemm_grouped", "grids", grid_by_out_type, 0, 2, 120),
        DL_TEST("gemm_grouped", "grids", random_shapes, 120),
        DL_TEST("gemm_grouped", "edges", empty_groups, 120),
        DL_TEST("gemm_grouped", "edges", degenerate_sizes, 120),
        DL_TEST_LOOP("gemm_grouped", "edges", dynamic_range, 0, 2, 120),
        DL_TEST("gemm_grouped", "edges", subnormals_and_overflow, 120),
        DL_TEST_LOOP("gemm_grouped", "slow_tiers", cancellation_reaches_slow_tiers, 0, 2, 120),
        DL_TEST_LOOP("gemm_grouped", "slow_tiers", midpoints_with_sticky, 0, 2, 120),
        DL_TEST("gemm_grouped", "slow_tiers", two_terms, 120),
        DL_TEST("gemm_grouped", "slow_tiers", long_k, 120),
        DL_TEST("gemm_ragged_k", "ragged", ragged_random, 120),
        DL_TEST_LOOP("gemm_ragged_k", "ragged", ragged_cancellation, 0, 2, 120),
        DL_TEST("gemm_ragged_k", "ragged", ragged_short_groups, 120),
        DL_TEST("gemm_threads", "threads", thread_invariance, 120),
        DL_TEST("gemm_certificate", "intervals", certificate_intervals, 120),
        DL_TEST("gemm_errors", "errors", errors, 0),
        DL_TEST("gemm_errors", "errors", nonfinite, 0),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
