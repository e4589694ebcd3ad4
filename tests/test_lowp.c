/* Low-precision formats, block quantization, the block-scaled GEMM and
 * their checks, against independent references: a bit-level decoder and a
 * brute-force nearest-value search written here (no call into the encoder
 * under test), MPFR for every quotient and dot product, and a kernel zoo
 * whose defective quantizers are written here as a kernel would write them. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "mpref.h"
#include "dropless.h"

/* ------------------------------------------------ independent format reference */

typedef struct {
    dl_qfmt_t f;
    int ebits, mbits, bias, fn, ieee; /* fn: S.1..1.1..1 is NaN; ieee: exponent all ones */
} ref_fmt_t;

static const ref_fmt_t REF[] = {
    {DL_Q_E4M3, 4, 3, 7, 1, 0},
    {DL_Q_E5M2, 5, 2, 15, 0, 1},
    {DL_Q_E2M1, 2, 1, 1, 0, 0},
};

/* The value of a code, from the field definitions (OCP OFP8 v1.0, OCP MX v1.0). */
static double ref_decode(const ref_fmt_t *r, unsigned c)
{
    unsigned m = c & ((1u << r->mbits) - 1), e = (c >> r->mbits) & ((1u << r->ebits) - 1);
    int s = (c >> (r->mbits + r->ebits)) & 1;
    unsigned eall = (1u << r->ebits) - 1;
    double v;
    if (r->fn && e == eall && m == (1u << r->mbits) - 1)
        return NAN;
    if (r->ieee && e == eall)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = pow(2.0, 1 - r->bias) * (m / pow(2.0, r->mbits));
    else
        v = pow(2.0, (int)e - r->bias) * (1.0 + m / pow(2.0, r->mbits));
    return s ? -v : v;
}

/* Nonnegative finite codes in increasing order of value. */
static int ref_grid(const ref_fmt_t *r, unsigned *codes)
{
    int n = 0;
    for (unsigned c = 0; c < (1u << (r->ebits + r->mbits)); c++)
        if (isfinite(ref_decode(r, c)))
            codes[n++] = c;
    return n; /* the codes of a sign-magnitude format increase with the value */
}

/* The code of x by brute force over the grid. */
static unsigned ref_encode(const ref_fmt_t *r, double x, dl_qround_t mode, int sat)
{
    unsigned g[256], sbit = 1u << (r->ebits + r->mbits);
    int n = ref_grid(r, g), neg = signbit(x) != 0;
    if (isnan(x))
        return r->fn ? (sbit * neg) | 0x7f : r->ieee ? (sbit * neg) | 0x7e : 0;
    double a = fabs(x), top = ref_decode(r, g[n - 1]);
    double over = top + (top - ref_decode(r, g[n - 2])); /* the next value of the grid's pattern */
    int over_even = r->f == DL_Q_E4M3 ? 0 : 1; /* E4M3: 480 = 1.111b, E5M2/E2M1: 2^(emax+1) */
    int i = 0;
    while (i + 1 < n && ref_decode(r, g[i + 1]) <= a)
        i++;
    double lo = ref_decode(r, g[i]), hi = i + 1 < n ? ref_decode(r, g[i + 1]) : over;
    int hi_even = i + 1 < n ? !(g[i + 1] & 1) : over_even, pick_hi;
    if (a == lo || isinf(a))
        pick_hi = isinf(a);
    else if (mode == DL_QR_ZERO)
        pick_hi = 0;
    else if (mode == DL_QR_UP)
        pick_hi = !neg;
    else if (mode == DL_QR_DOWN)
        pick_hi = neg;
    else {
        double mid = lo + (hi - lo) / 2;
        pick_hi = a > mid || (a == mid && (mode == DL_QR_AWAY || (mode == DL_QR_RNE && hi_even)));
    }
    if (pick_hi && (i + 1 >= n || isinf(a))) { /* overflow */
        if (sat || r->f == DL_Q_E2M1)
            return sbit * neg | g[n - 1];
        return r->ieee ? sbit * neg | 0x7c : sbit * neg | 0x7f;
    }
    return sbit * neg | g[pick_hi ? i + 1 : i];
}

START_TEST(decode_every_code)
{
    for (int k = 0; k < 3; k++) {
        const ref_fmt_t *r = &REF[k];
        for (unsigned c = 0; c < (1u << (r->ebits + r->mbits + 1)); c++) {
            double want = ref_decode(r, c), got = dl_qdecode(c, r->f);
            ck_assert_msg(same_value(got, want), "%s code 0x%02x: %a, reference %a",
                          dl_qfmt_name(r->f), c, got, want);
            if (isfinite(want)) /* every finite value encodes back to its code */
                ck_assert_msg(dl_qencode(want, r->f, DL_QR_RNE, 1, NULL) == c,
                              "%s 0x%02x does not round-trip", dl_qfmt_name(r->f), c);
        }
    }
    ck_assert(dl_qfmt_max(DL_Q_E4M3) == 448.0 && dl_qfmt_max(DL_Q_E5M2) == 57344.0 &&
              dl_qfmt_max(DL_Q_E2M1) == 6.0);
    for (unsigned c = 0; c < 255; c++)
        ck_assert(dl_qdecode(c, DL_Q_UE8M0) == ldexp(1.0, (int)c - 127));
    ck_assert(isnan(dl_qdecode(255, DL_Q_UE8M0)));
}
END_TEST

/* Inputs where rounding code breaks: every value, every midpoint and the
 * doubles next to both, beyond the max, below the smallest subnormal. */
static int boundary_inputs(const ref_fmt_t *r, double *x)
{
    unsigned g[256];
    int n = ref_grid(r, g), m = 0;
    for (int i = 0; i < n; i++) {
        double v = ref_decode(r, g[i]);
        double nx = i + 1 < n ? ref_decode(r, g[i + 1]) : v * 1.25;
        double mid = v + (nx - v) / 2;
        double pts[] = {v, nextafter(v, 0), nextafter(v, INFINITY), mid, nextafter(mid, 0),
                        nextafter(mid, INFINITY)};
        for (int j = 0; j < 6; j++) {
            x[m++] = pts[j];
            x[m++] = -pts[j];
        }
    }
    double more[] = {INFINITY, -INFINITY, 1e300, 0x1p-1074, 0x1p-30, 464.0, 480.0, 61440.0,
                     65536.0, 7.0, 8.0, 0.25, 0.75};
    for (size_t j = 0; j < sizeof more / sizeof *more; j++)
        x[m++] = more[j];
    return m;
}

START_TEST(encode_vs_brute_force)
{
    static const dl_qround_t modes[] = {DL_QR_RNE, DL_QR_AWAY, DL_QR_ZERO, DL_QR_UP, DL_QR_DOWN,
                                        DL_QR_TIEZERO};
    double *x = malloc(256 * 12 * sizeof(double) + 4096 * sizeof(double));
    dl_test_rng_t rng = {25};
    for (int k = 0; k < 3; k++) {
        const ref_fmt_t *r = &REF[k];
        int n = boundary_inputs(r, x);
        for (int i = 0; i < 2000; i++) /* random doubles over the range and past it */
            x[n++] = (dl_test_next(&rng) & 1 ? -1 : 1) *
                     ldexp(dl_test_unif(&rng) + 0.5, (int)(dl_test_next(&rng) % 40) - 22);
        for (int mi = 0; mi < 6; mi++)
            for (int sat = 0; sat < 2; sat++)
                for (int i = 0; i < n; i++) {
                    unsigned got = dl_qencode(x[i], r->f, modes[mi], sat, NULL);
                    unsigned want = ref_encode(r, x[i], modes[mi], sat);
                    ck_assert_msg(got == want,
                                  "%s mode %d sat %d: %a -> 0x%02x, reference 0x%02x",
                                  dl_qfmt_name(r->f), modes[mi], sat, x[i], got, want);
                }
    }
    /* OCP E4M3 facts: 464 is the tie between 448 and 480 (even: 448); NaN is 0x7f */
    ck_assert(dl_qencode(464.0, DL_Q_E4M3, DL_QR_RNE, 0, NULL) == 0x7e);
    ck_assert(dl_qencode(464.5, DL_Q_E4M3, DL_QR_RNE, 0, NULL) == 0x7f);
    ck_assert(dl_qencode(1e9, DL_Q_E4M3, DL_QR_RNE, 1, NULL) == 0x7e);
    ck_assert(dl_qencode(NAN, DL_Q_E4M3, DL_QR_RNE, 1, NULL) == 0x7f);
    ck_assert(dl_qencode(61440.0, DL_Q_E5M2, DL_QR_RNE, 0, NULL) == 0x7c);
    int lost = 0;
    ck_assert(dl_qencode(NAN, DL_Q_E2M1, DL_QR_RNE, 1, &lost) == 0 && lost);
    free(x);
}
END_TEST

START_TEST(ue8m0_modes)
{
    dl_test_rng_t rng = {8};
    for (int i = 0; i < 100000; i++) {
        double x = ldexp(1.0 + dl_test_unif(&rng), (int)(dl_test_next(&rng) % 300) - 150);
        if (i % 7 == 0)
            x = ldexp(1.0, (int)(dl_test_next(&rng) % 254) - 127); /* exact powers */
        if (i % 11 == 0)
            x = ldexp(1.5, (int)(dl_test_next(&rng) % 250) - 125); /* ties */
        double l2 = log2(x); /* exact enough: x is far from the next power when it is not one */
        int fl = (int)floor(l2), ce = x == ldexp(1.0, fl) ? fl : fl + 1;
        int up = ce < -127 ? 0 : ce > 127 ? 254 : ce + 127;
        int dn = fl < -127 ? 0 : fl > 127 ? 254 : fl + 127;
        ck_assert_int_eq(dl_qencode(x, DL_Q_UE8M0, DL_QR_UP, 1, NULL), up);
        ck_assert_int_eq(dl_qencode(x, DL_Q_UE8M0, DL_QR_DOWN, 1, NULL), dn);
        int near = x >= 1.5 * ldexp(1.0, fl) ? ce : fl; /* ties away: up */
        near = near < -127 ? 0 : near > 127 ? 254 : near + 127;
        ck_assert_int_eq(dl_qencode(x, DL_Q_UE8M0, DL_QR_AWAY, 1, NULL), near);
    }
    ck_assert_int_eq(dl_qencode(0x1p128, DL_Q_UE8M0, DL_QR_UP, 0, NULL), 255);
    ck_assert_int_eq(dl_qencode(0x1p128, DL_Q_UE8M0, DL_QR_UP, 1, NULL), 254);
    ck_assert_int_eq(dl_qencode(NAN, DL_Q_UE8M0, DL_QR_UP, 1, NULL), 255);
}
END_TEST

START_TEST(packing)
{
    uint8_t c[7] = {1, 2, 3, 4, 5, 6, 7}, p[4], u[7];
    dl_fp4_pack(c, 7, p);
    ck_assert(p[0] == 0x21 && p[1] == 0x43 && p[2] == 0x65 && p[3] == 0x07);
    dl_fp4_unpack(p, 7, u);
    ck_assert(memcmp(c, u, 7) == 0);
    uint8_t s[5] = {127, 128, 1, 254, 3}, su[5];
    uint32_t w[2];
    dl_ue8m0_pack(s, 5, w);
    ck_assert(w[0] == (127u | 128u << 8 | 1u << 16 | 254u << 24));
    ck_assert(w[1] == (3u | 127u << 8 | 127u << 16 | 127u << 24));
    dl_ue8m0_unpack(w, 5, su);
    ck_assert(memcmp(s, su, 5) == 0);
}
END_TEST

/* ------------------------------------------------------------ quantization */

static const dl_qrule_t R_DSV3_ACT = {DL_Q_E4M3, DL_QSCALE_F32, 1, 128, DL_QS_DIV, DL_QR_RNE, 0, 0, 1};
static const dl_qrule_t R_DSV3_W = {DL_Q_E4M3, DL_QSCALE_F32, 128, 128, DL_QS_DIV, DL_QR_RNE, 0, 0, 1};
static const dl_qrule_t R_UE8M0 = {DL_Q_E4M3, DL_QSCALE_UE8M0, 1, 128, DL_QS_CEIL, DL_QR_RNE, DL_QF_PACKED, 0, 1};
static const dl_qrule_t R_MXFP8 = {DL_Q_E4M3, DL_QSCALE_UE8M0, 1, 32, DL_QS_MX, DL_QR_RNE, 0, 0, 1};
static const dl_qrule_t R_MXFP4 = {DL_Q_E2M1, DL_QSCALE_UE8M0, 1, 32, DL_QS_MX, DL_QR_RNE, 0, 0, 1};
static const dl_qrule_t R_NVFP4 = {DL_Q_E2M1, DL_QSCALE_E4M3, 1, 16, DL_QS_DIV, DL_QR_RNE, 0, 0, 1};

/* Test inputs with the hard cases planted: a zero block, a block whose
 * amax sits exactly on a scale boundary (448 2^k), ties of the element
 * grid, subnormal elements, and a spread of magnitudes across blocks. */
static void fill(float *x, int64_t rows, int64_t cols, uint64_t seed, int positive)
{
    dl_test_rng_t rng = {seed};
    for (int64_t i = 0; i < rows * cols; i++) {
        double v = dl_test_normal(&rng) * ldexp(1.0, (int)(i / 32 % 7) - 3);
        x[i] = (float)(positive ? fabs(v) : v);
    }
    for (int64_t j = 0; j < cols && j < 32; j++)
        x[j] = 0.0f; /* a zero block (and part of a bigger one) */
    if (rows > 1)
        for (int64_t j = 0; j < cols; j++) { /* row 1: ties of E4M3 at scale 2^-3 */
            x[cols + j] = (float)ldexp(1.0 + (2 * (j % 8) + 1) / 16.0, (int)(j % 5) - 3);
            if (j % 32 == 5)
                x[cols + j] = 56.0f; /* amax = 448 2^-3: sf is a power of two */
        }
    /* rows 2 and 3: the floats nearest to midpoints of the scaled E4M3 grid
     * (amax near 1.7 in every 16-block), where x / sf and x * RN(448 / amax)
     * round differently */
    for (int64_t i = 2; i < rows && i < 4; i++)
        for (int64_t j = 0; j < cols; j++) {
            float amax = (float)(1.7 * (1.0 + (double)(j / 16) / 64.0));
            float sf32 = amax / 448.0f;
            while (1.0f / sf32 == 448.0f / amax) { /* so that x * RN(1/sf) and x * RN(448/amax) differ */
                amax = nextafterf(amax, 2.0f);
                sf32 = amax / 448.0f;
            }
            double sf = sf32;
            double mid = ldexp(1.0 + (2 * (j % 8) + 1) / 16.0, (int)(j % 11) - 3);
            float v = (float)(mid * sf);
            x[i * cols + j] = j % 16 == 0 ? amax : i == 3 ? nextafterf(v, 0) : v;
        }
}

typedef struct {
    uint8_t *q, *s;
} qbuf_t;

static qbuf_t qalloc(const dl_qrule_t *r, int64_t rows, int64_t cols)
{
    qbuf_t b = {calloc((size_t)dl_quant_qbytes(r, rows, cols) + 1, 1),
                calloc((size_t)dl_quant_sbytes(r, rows, cols) + 1, 1)};
    return b;
}

/* The element rule against MPFR: for each element, decode(code) * s is the
 * nearest point of the scaled grid (ties to even code), or +-max when x / s
 * is beyond it; s is RN_fp32(amax / fmax) by MPFR. */
static void check_elements_mpfr(const dl_qrule_t *r, const float *x, int64_t rows, int64_t cols,
                                const dl_qmat_t *m)
{
    mpfr_t e, t;
    mpfr_inits2(256, e, t, (mpfr_ptr)0);
    double fmax = dl_qfmt_max(r->elem);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            double s = dl_quant_scale(m, i / r->br, j / r->bc);
            unsigned c = dl_quant_code(m, i, j);
            double v = dl_qdecode(c, r->elem);
            mpfr_set_d(e, x[i * cols + j], MPFR_RNDN);
            mpfr_div_d(e, e, s, MPFR_RNDN); /* 256 bits: exact enough to order */
            double here = fabs(mpfr_get_d(e, MPFR_RNDN));
            ck_assert_msg(isfinite(v), "NaN element at (%ld, %ld)", (long)i, (long)j);
            if (here >= fmax) {
                ck_assert(fabs(v) == fmax || fabs(v) == fmax);
                continue;
            }
            /* |x/s - v| <= |x/s - w| for both neighbours w of v */
            for (int d = -1; d <= 1; d += 2) {
                unsigned nc = (unsigned)((int)c + d);
                double w = dl_qdecode(nc, r->elem);
                if (!isfinite(w) || (w < 0) != (v < 0) || nc > 0xff)
                    continue;
                mpfr_sub_d(t, e, v, MPFR_RNDN);
                double dv = fabs(mpfr_get_d(t, MPFR_RNDN));
                mpfr_sub_d(t, e, w, MPFR_RNDN);
                double dw = fabs(mpfr_get_d(t, MPFR_RNDN));
                ck_assert_msg(dv < dw || (dv == dw && !(c & 1)),
                              "(%ld, %ld): x/s = %a coded %a, %a is nearer", (long)i, (long)j,
                              mpfr_get_d(e, MPFR_RNDN), v, w);
            }
        }
    mpfr_clears(e, t, (mpfr_ptr)0);
}

/* The scale of every block, recomputed by MPFR and by the rule's text. */
static void check_scales_mpfr(const dl_qrule_t *r, const float *x, int64_t rows, int64_t cols,
                              const dl_qmat_t *m)
{
    mpfr_t q;
    mpfr_init2(q, 24);
    for (int64_t bi = 0; bi * r->br < rows; bi++)
        for (int64_t bj = 0; bj * r->bc < cols; bj++) {
            double amax = 0;
            for (int64_t i = bi * r->br; i < rows && i < (bi + 1) * r->br; i++)
                for (int64_t j = bj * r->bc; j < cols && j < (bj + 1) * r->bc; j++)
                    amax = fmax(amax, fabs(x[i * cols + j]));
            double got = dl_quant_scale(m, bi, bj), want;
            mpfr_set_d(q, amax, MPFR_RNDN);
            mpfr_div_d(q, q, dl_qfmt_max(r->elem), MPFR_RNDN); /* RN_fp32(amax / fmax) */
            double sf = mpfr_get_d(q, MPFR_RNDN);
            if (amax == 0)
                want = r->scale == DL_QSCALE_E4M3 ? r->global : 1.0;
            else if (r->srule == DL_QS_DIV && r->scale == DL_QSCALE_F32)
                want = sf;
            else if (r->srule == DL_QS_CEIL)
                want = ldexp(1.0, (int)ceil(log2(sf) - 0x1p-40)); /* sf: 24 bits, far from a power unless one */
            else if (r->srule == DL_QS_MX)
                want = ldexp(1.0, (int)floor(log2(amax) + 0x1p-40) - dl_qfmt_emax(r->elem));
            else
                continue; /* NVFP4: checked through the elements and the round trip */
            ck_assert_msg(got == want, "block (%ld, %ld): scale %a, want %a (amax %a)", (long)bi,
                          (long)bj, got, want, amax);
        }
    mpfr_clear(q);
}

static const dl_qrule_t *const RULES[] = {&R_DSV3_ACT, &R_DSV3_W, &R_UE8M0, &R_MXFP8, &R_MXFP4,
                                          &R_NVFP4};

START_TEST(quantize_vs_mpfr)
{
    int64_t rows = 130, cols = 288; /* partial blocks on both axes */
    float *x = malloc((size_t)(rows * cols) * sizeof(float));
    fill(x, rows, cols, 100 + (uint64_t)_i, 0);
    dl_qrule_t r = *RULES[_i];
    if (r.scale == DL_QSCALE_E4M3)
        r.global = dl_nvfp4_global(x, rows * cols);
    qbuf_t b = qalloc(&r, rows, cols);
    ck_assert_int_eq(dl_quantize(&r, x, rows, cols, b.q, b.s), 0);
    dl_qmat_t m = {&r, rows, cols, b.q, b.s};
    check_scales_mpfr(&r, x, rows, cols, &m);
    check_elements_mpfr(&r, x, rows, cols, &m);
    /* the declared rule checks CONFORMANT against itself */
    dl_qcheck_t res;
    ck_assert_int_eq(dl_qcheck(&r, x, rows, cols, &m, &res), 0);
    ck_assert(res.conformant && res.elem_diff == 0);
    free(b.q), free(b.s), free(x);
}
END_TEST

START_TEST(quantize_errors)
{
    float x[4] = {1, 2, NAN, 4};
    uint8_t q[4], s[8];
    ck_assert_int_eq(dl_quantize(&R_DSV3_ACT, x, 1, 4, q, s), DL_ENONFINITE);
    dl_qrule_t bad = R_MXFP4;
    ck_assert_int_eq(dl_quantize(&bad, x, 1, 3, q, s), DL_EINVAL); /* odd FP4 row */
    bad = R_DSV3_ACT;
    bad.flags = DL_QF_PACKED; /* packing is for UE8M0 only */
    ck_assert_int_eq(dl_quant_rule_check(&bad, 4), DL_EINVAL);
    bad = R_DSV3_ACT;
    bad.bc = 0;
    ck_assert_int_eq(dl_quantize(&bad, x, 1, 2, q, s), DL_EINVAL);
}
END_TEST

/* ------------------------------------------------------------ the rule zoo */

static uint32_t fbits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

typedef enum {
    K_CORRECT_F32, K_CORRECT_UE8M0, K_POW2_AFTER, K_LOG2_PLUS1, K_LEAKED, K_NIBBLES, K_SHIFTED,
    K_TIES_ZERO, K_NOSAT, K_DEEPGEMM_MUL, K_DEEPGEMM_RECIP, K_VLLM_DIV32
} kernel_t;

/* One zoo kernel: quantizes x [rows, cols] with 1 x bc blocks as a kernel
 * author would write it (fp32 arithmetic, the bits of the fp32 scale), with
 * its defect, into the declared layout of rule r. */
static void zoo_quant(kernel_t k, const dl_qrule_t *r, const float *x, int64_t rows,
                      int64_t cols, uint8_t *q, uint8_t *s)
{
    int64_t ncb = (cols + r->bc - 1) / r->bc, wpr = (ncb + 3) / 4;
    float fmax = (float)dl_qfmt_max(r->elem);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t bj = 0; bj < ncb; bj++) {
            float amax = 0;
            for (int64_t j = bj * r->bc; j < cols && j < (bj + 1) * r->bc; j++)
                amax = fmaxf(amax, fabsf(x[i * cols + j]));
            float sf = amax > 0 ? amax / fmax : 1.0f, se = sf; /* se: the divisor of the elements */
            uint32_t b = fbits(sf), code = (b >> 23) + ((b & 0x7fffff) != 0); /* ceil on the bits */
            int e;
            if (k == K_LOG2_PLUS1) {
                frexpf(sf, &e); /* floor(log2 sf) + 1 */
                code = (uint32_t)(e + 126 + 1);
            }
            if (r->srule == DL_QS_MX) { /* OCP: floor(log2 amax) - emax */
                frexpf(amax > 0 ? amax : 1.0f, &e);
                code = amax > 0 ? (uint32_t)(e - 1 - dl_qfmt_emax(r->elem) + 127) : 127;
            }
            if (r->scale == DL_QSCALE_UE8M0 && amax == 0)
                code = 127;
            if (r->scale == DL_QSCALE_UE8M0 && k != K_POW2_AFTER)
                se = ldexpf(1.0f, (int)code - 127);
            int64_t sj = k == K_SHIFTED ? (bj + 1 < ncb ? bj + 1 : 0) : bj;
            if (k == K_SHIFTED && bj + 1 == ncb)
                sj = bj; /* the last block overwrites its own slot too: block 0's slot keeps garbage */
            if (r->scale == DL_QSCALE_F32)
                memcpy(s + 4 * (i * ncb + sj), &sf, 4);
            else if (r->flags & DL_QF_PACKED) {
                uint8_t byte = (uint8_t)code;
                if (k == K_LEAKED) /* the ceil done by adding 0x7fffff, bits 16-22 not masked */
                    byte = (uint8_t)(((b + 0x7fffff) >> 23) | ((b + 0x7fffff) >> 16));
                s[4 * (i * wpr + bj / 4) + bj % 4] = byte;
            } else
                s[i * ncb + bj] = (uint8_t)code;
            float inv = fmax / amax;
            for (int64_t j = bj * r->bc; j < cols && j < (bj + 1) * r->bc; j++) {
                double y = (double)x[i * cols + j] / se;
                if (k == K_DEEPGEMM_MUL) /* x * (448 / amax) in fp32 */
                    y = amax > 0 ? x[i * cols + j] * inv : 0.0f;
                if (k == K_DEEPGEMM_RECIP) /* x * (1 / sf) in fp32 */
                    y = x[i * cols + j] * (1.0f / sf);
                if (k == K_VLLM_DIV32) /* x / sf in fp32 */
                    y = x[i * cols + j] / sf;
                dl_qround_t mode = k == K_TIES_ZERO ? DL_QR_TIEZERO : DL_QR_RNE;
                unsigned c = dl_qencode(y, r->elem, mode, k != K_NOSAT, NULL);
                int64_t at = i * cols + j;
                if (r->elem != DL_Q_E2M1)
                    q[at] = (uint8_t)c;
                else if (k == K_NIBBLES) /* element 2i to the high nibble */
                    q[at / 2] |= (uint8_t)(c << (at & 1 ? 0 : 4));
                else
                    q[at / 2] |= (uint8_t)(c << (at & 1 ? 4 : 0));
            }
        }
    if (r->flags & DL_QF_PACKED) /* the pad bytes: 1.0 */
        for (int64_t i = 0; i < rows; i++)
            for (int64_t bj = ncb; bj < 4 * wpr; bj++)
                s[4 * (i * wpr + bj / 4) + bj % 4] = 127;
}

static const dl_qrule_t R_UE8M0_PLAIN = {DL_Q_E4M3, DL_QSCALE_UE8M0, 1, 128, DL_QS_CEIL, DL_QR_RNE, 0, 0, 1};

static const struct {
    kernel_t k;
    const dl_qrule_t *rule;
    const char *expect; /* "CONFORMANT", a variant name or a defect name */
} ZOO[] = {
    {K_CORRECT_F32, &R_DSV3_ACT, "CONFORMANT"},
    {K_CORRECT_UE8M0, &R_UE8M0, "CONFORMANT"},
    {K_CORRECT_UE8M0, &R_MXFP8, "CONFORMANT"},
    {K_CORRECT_UE8M0, &R_MXFP4, "CONFORMANT"},
    {K_POW2_AFTER, &R_UE8M0, "pow2-after-quantize"},
    {K_LOG2_PLUS1, &R_UE8M0_PLAIN, "log2-ceil-off-by-one"},
    {K_LEAKED, &R_UE8M0, "leaked-ue8m0-bits"},
    {K_NIBBLES, &R_MXFP4, "swapped-nibbles"},
    {K_SHIFTED, &R_DSV3_ACT, "scale-block-shifted"},
    {K_TIES_ZERO, &R_DSV3_ACT, "ties-toward-zero"},
    {K_NOSAT, &R_MXFP8, "no-saturation"},
    {K_DEEPGEMM_MUL, &R_DSV3_ACT, "multiply-fmax-over-amax"},
    {K_DEEPGEMM_RECIP, &R_DSV3_ACT, "reciprocal-multiply"},
    {K_VLLM_DIV32, &R_DSV3_ACT, "fp32-division"},
};

START_TEST(zoo_verdicts)
{
    int64_t rows = 6, cols = 512;
    float *x = malloc((size_t)(rows * cols) * sizeof(float));
    fill(x, rows, cols, 7, 0);
    const dl_qrule_t *r = ZOO[_i].rule;
    qbuf_t b = qalloc(r, rows, cols);
    zoo_quant(ZOO[_i].k, r, x, rows, cols, b.q, b.s);
    dl_qmat_t m = {r, rows, cols, b.q, b.s};
    dl_qcheck_t res;
    char line[1024];
    ck_assert_int_eq(dl_qcheck(r, x, rows, cols, &m, &res), 0);
    dl_qcheck_format(&res, line, sizeof line);
    printf("# zoo %d (%s): %s\n", _i, ZOO[_i].expect, line);
    if (strcmp(ZOO[_i].expect, "CONFORMANT") == 0) {
        ck_assert_msg(res.conformant, "%s", line);
    } else {
        ck_assert_msg(!res.conformant && strstr(line, ZOO[_i].expect), "expected %s: %s",
                      ZOO[_i].expect, line);
        ck_assert(res.elem_diff + res.scale_diff > 0 && res.elements == rows * cols);
    }
    free(b.q), free(b.s), free(x);
}
END_TEST

/* ------------------------------------------------------ block-scaled GEMM */

typedef struct {
    int64_t E, N, K, offsets[5];
    const dl_qrule_t *ra, *rb;
    dl_qrule_t a_rule, b_rule;
    float *x, *w;
    qbuf_t qa, qb;
    dl_qmat_t a, b;
} gcase_t;

/* Quantizes random a [M, K] and E weights [N, K] under ra and rb. */
static void gcase_make(gcase_t *g, const dl_qrule_t *ra, const dl_qrule_t *rb, int64_t N,
                       int64_t K, int positive, uint64_t seed)
{
    int64_t M = g->offsets[g->E];
    g->a_rule = *ra, g->b_rule = *rb, g->N = N, g->K = K;
    g->x = malloc((size_t)(M * K + 1) * sizeof(float));
    g->w = malloc((size_t)(g->E * N * K) * sizeof(float));
    fill(g->x, M, K, seed, positive);
    fill(g->w, g->E * N, K, seed + 1, positive);
    if (ra->scale == DL_QSCALE_E4M3)
        g->a_rule.global = dl_nvfp4_global(g->x, M * K);
    if (rb->scale == DL_QSCALE_E4M3)
        g->b_rule.global = dl_nvfp4_global(g->w, g->E * N * K);
    g->qa = qalloc(&g->a_rule, M, K);
    int64_t qb = dl_quant_qbytes(&g->b_rule, N, K), sb = dl_quant_sbytes(&g->b_rule, N, K);
    g->qb.q = calloc((size_t)(g->E * qb + 1), 1);
    g->qb.s = calloc((size_t)(g->E * sb + 1), 1);
    ck_assert_int_eq(dl_quantize(&g->a_rule, g->x, M, K, g->qa.q, g->qa.s), 0);
    for (int64_t e = 0; e < g->E; e++)
        ck_assert_int_eq(dl_quantize(&g->b_rule, g->w + e * N * K, N, K, g->qb.q + e * qb,
                                     g->qb.s + e * sb), 0);
    g->a = (dl_qmat_t){&g->a_rule, M, K, g->qa.q, g->qa.s};
    g->b = (dl_qmat_t){&g->b_rule, N, K, g->qb.q, g->qb.s};
}

static void gcase_free(gcase_t *g)
{
    free(g->x), free(g->w), free(g->qa.q), free(g->qa.s), free(g->qb.q), free(g->qb.s);
}

static const dl_qrule_t R_DSV3_W_UE8M0 = {DL_Q_E4M3, DL_QSCALE_UE8M0, 128, 128, DL_QS_CEIL, DL_QR_RNE, 0, 0, 1};
static const dl_qrule_t *const GEMM_RULES[][2] = {
    {&R_DSV3_ACT, &R_DSV3_W},    /* fp32 scales: four terms */
    {&R_UE8M0, &R_DSV3_W_UE8M0}, /* power-of-two scales: one term */
    {&R_MXFP8, &R_MXFP4},        /* MX: one term */
    {&R_NVFP4, &R_NVFP4},        /* E4M3 scale times the global scale: two parts each */
};

/* Every output against MPFR's exact dot product of the dequantized rows. */
START_TEST(gemm_vs_mpfr)
{
    gcase_t g = {.E = 4, .offsets = {0, 3, 3, 7, 9}};
    gcase_make(&g, GEMM_RULES[_i][0], GEMM_RULES[_i][1], 130, 288, 0, 300 + (uint64_t)_i);
    int64_t M = 9, N = g.N, K = g.K;
    double *da = malloc((size_t)K * sizeof(double)), *db = malloc((size_t)K * sizeof(double));
    float *out = malloc((size_t)(M * N) * sizeof(float));
    for (int ti = 0; ti < 2; ti++) {
        dl_dtype_t t = ti ? DL_BF16 : DL_F32;
        ck_assert_int_eq(dl_gemm_block_scaled(&g.a, &g.b, g.E, g.offsets, t, out, NULL), 0);
        for (int64_t e = 0; e < g.E; e++) {
            dl_qmat_t be = g.b;
            be.q += e * dl_quant_qbytes(&g.b_rule, N, K);
            be.s = (const uint8_t *)be.s + e * dl_quant_sbytes(&g.b_rule, N, K);
            for (int64_t m = g.offsets[e]; m < g.offsets[e + 1]; m++)
                for (int64_t n = 0; n < N; n += 7) {
                    for (int64_t k = 0; k < K; k++) {
                        da[k] = dl_dequant(&g.a, m, k);
                        db[k] = dl_dequant(&be, n, k);
                    }
                    double want = mpref_dot(da, db, (size_t)K, t);
                    ck_assert_msg(same_value(out[m * N + n], want), "(%ld, %ld): %a, MPFR %a",
                                  (long)m, (long)n, out[m * N + n], want);
                }
        }
    }
    free(da), free(db), free(out);
    gcase_free(&g);
}
END_TEST

/* 14 significant bits, truncated: the Hopper FP8 accumulator's model. */
static double trunc14(double v)
{
    int e;
    if (v == 0)
        return 0;
    frexp(v, &e);
    return ldexp(trunc(ldexp(v, 14 - e)), e - 14);
}

typedef enum { G_TOSA, G_PROMOTED, G_NEVER } gkernel_t;

/* A candidate GEMM of the zoo on 1x128 / 128x128 blocks (scales constant
 * over each 128-long K-block): the TOSA fp32 order, the 14-bit accumulator
 * promoted every 128 products, and the one never promoted. */
static void zoo_gemm(gkernel_t k, const gcase_t *g, float *out)
{
    int64_t N = g->N, K = g->K;
    for (int64_t e = 0; e < g->E; e++) {
        dl_qmat_t be = g->b;
        be.q += e * dl_quant_qbytes(&g->b_rule, N, K);
        be.s = (const uint8_t *)be.s + e * dl_quant_sbytes(&g->b_rule, N, K);
        for (int64_t m = g->offsets[e]; m < g->offsets[e + 1]; m++)
            for (int64_t n = 0; n < N; n++) {
                float acc = 0;
                double t = 0;
                for (int64_t kb = 0; kb < K; kb += 128) {
                    float sa = (float)dl_quant_scale(&g->a, m, kb / 128);
                    float sb = (float)dl_quant_scale(&be, n / 128, kb / 128);
                    float p = 0;
                    double t14 = 0;
                    for (int64_t j = kb; j < kb + 128 && j < K; j++) {
                        double qa = dl_qdecode(dl_quant_code(&g->a, m, j), DL_Q_E4M3);
                        double qb = dl_qdecode(dl_quant_code(&be, n, j), DL_Q_E4M3);
                        p += (float)(qa * qb);
                        t14 = trunc14(t14 + qa * qb);
                        t = trunc14(t + qa * qb * sa * sb);
                    }
                    if (k == G_TOSA)
                        acc += p * sa * sb;
                    else
                        acc += (float)t14 * sa * sb;
                }
                out[m * N + n] = (float)dl_round(k == G_NEVER ? t : acc, DL_F32);
            }
    }
}

START_TEST(gemm_profiles)
{
    /* same-sign inputs: the running sum grows with k, which is what a
     * never-promoted accumulator cannot follow (random signs keep it small) */
    gcase_t g = {.E = 2, .offsets = {0, 2, 5}};
    gcase_make(&g, &R_DSV3_ACT, &R_DSV3_W, 128, 4096, 1, 77);
    int64_t MN = 5 * g.N;
    float *gold = malloc((size_t)MN * sizeof(float)), *c = malloc((size_t)MN * sizeof(float));
    dl_qgemm_check_t res;
    ck_assert_int_eq(dl_gemm_block_scaled(&g.a, &g.b, g.E, g.offsets, DL_F32, gold, NULL), 0);
    ck_assert_int_eq(dl_qcheck_gemm(&g.a, &g.b, g.E, g.offsets, DL_F32, DL_QACC_EXACT, gold, &res), 0);
    ck_assert(res.checked == MN && res.failed == 0);
    memcpy(c, gold, (size_t)MN * sizeof(float));
    c[7] = nextafterf(c[7], INFINITY); /* one ulp: not exact */
    ck_assert_int_eq(dl_qcheck_gemm(&g.a, &g.b, g.E, g.offsets, DL_F32, DL_QACC_EXACT, c, &res), 0);
    ck_assert(res.failed == 1 && res.first[1] == 7);
    static const struct { gkernel_t k; dl_qacc_t p; int pass; } rows[] = {
        {G_TOSA, DL_QACC_FP32, 1}, {G_TOSA, DL_QACC_HOPPER, 1}, {G_PROMOTED, DL_QACC_HOPPER, 1},
        {G_NEVER, DL_QACC_HOPPER, 0}, {G_NEVER, DL_QACC_FP32, 0}};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        zoo_gemm(rows[i].k, &g, c);
        ck_assert_int_eq(dl_qcheck_gemm(&g.a, &g.b, g.E, g.offsets, DL_F32, rows[i].p, c, &res), 0);
        printf("# gemm kernel %d profile %d: %ld of %ld fail, worst |c - g| / tol = %g\n",
               rows[i].k, rows[i].p, (long)res.failed, (long)res.checked, res.worst_ratio);
        ck_assert_msg(rows[i].pass ? res.failed == 0 : res.failed > 0, "kernel %d profile %d",
                      rows[i].k, rows[i].p);
    }
    free(gold), free(c);
    gcase_free(&g);
}
END_TEST

START_TEST(gemm_errors)
{
    gcase_t g = {.E = 1, .offsets = {0, 2}};
    gcase_make(&g, &R_DSV3_ACT, &R_DSV3_W, 4, 130, 0, 5);
    float out[8];
    int64_t bad_off[2] = {0, 3};
    ck_assert_int_eq(dl_gemm_block_scaled(&g.a, &g.b, 1, bad_off, DL_F32, out, NULL), DL_ESHAPE);
    ((float *)g.qa.s)[0] = NAN; /* a NaN scale that takes part */
    ck_assert_int_eq(dl_gemm_block_scaled(&g.a, &g.b, 1, g.offsets, DL_F32, out, NULL), DL_ENONFINITE);
    ((float *)g.qa.s)[0] = 0x1p127f; /* 448 * 2^127 is no float */
    ck_assert_int_eq(dl_gemm_block_scaled(&g.a, &g.b, 1, g.offsets, DL_F32, out, NULL), DL_ERANGE);
    gcase_free(&g);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("formats", "codes", decode_every_code, 60),
        DL_TEST("formats", "encode", encode_vs_brute_force, 120),
        DL_TEST("formats", "ue8m0", ue8m0_modes, 60),
        DL_TEST("formats", "packing", packing, 60),
        DL_TEST_LOOP("quantize", "rules", quantize_vs_mpfr, 0, 6, 300),
        DL_TEST("quantize", "errors", quantize_errors, 60),
        DL_TEST_LOOP("zoo", "quant-rules", zoo_verdicts, 0, (int)(sizeof ZOO / sizeof *ZOO), 120),
        DL_TEST_LOOP("gemm", "exact", gemm_vs_mpfr, 0, 4, 300),
        DL_TEST("gemm", "profiles", gemm_profiles, 300),
        DL_TEST("gemm", "errors", gemm_errors, 60),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
