/* The fast grouped GEMMs: binary64 OpenBLAS products, certified element by
 * element, with two slower tiers for the elements the certificate misses.
 *
 * Why the fast tier is exact. Every input is a float, so each product
 * a_k*b_k is exact in binary64 (at most 48 significant bits, magnitudes in
 * [2^-298, 2^256]); every partial sum of such products is a multiple of
 * 2^-298, so no addition underflows and none overflows. The only error is in
 * the additions. A tile's dot products are computed in chunks of at most kc
 * terms by dgemm (any order, blocking, FMA or thread split: each term goes
 * through at most kc-1 rounded additions), and the chunk results are added
 * in a fixed order by us (at most nc-1 more). For any summation tree whose
 * height is h, |fl(S) - S| <= gamma_h * sum|a_k b_k| (Higham, ASNA 2nd ed.,
 * eq. 4.4 and the remark after it), with gamma_h = h u / (1 - h u),
 * u = 2^-53, so here h <= kc + nc. sum|a_k b_k| <= ||a||_2 ||b||_2 by
 * Cauchy-Schwarz; the norms are computed in binary64 (squares exact, sums
 * within gamma_K) and the factor g1 below is inflated to cover those
 * roundings. So the exact value lies within y +- g1*na*nb, and the
 * certificate decides whether that whole interval rounds to one value of
 * out_t: first a fast test (cert_fast: the exact distance from |y| to the
 * midpoint of its truncation interval, and the bound below ulp/4), then
 * the full one (cert_one) where that cannot tell.
 *
 * Chunking matters: gamma_K for K = 14336 would leave ~1% of fp32 outputs
 * uncertified; gamma_{kc+nc} with kc = 256 cuts that by ~50x, for the price
 * of one extra pass over the tile per chunk.
 *
 * The middle tier (elements the certificate misses) is a compensated dot
 * product whose every rounding error is either captured exactly (TwoSum) or
 * bounded a posteriori; when that bound is zero the double-double result is
 * the exact sum and is rounded exactly (round_dd), which settles exact ties
 * and exact zeros, common with bf16 inputs. Otherwise the interval is
 * certified as in tier 1. The last tier is the exact accumulator. Bits never
 * depend on which tier decided an element, so they do not depend on threads,
 * alignment or the BLAS kernel.
 *
 * Memory and parallelism: the output is cut into tiles (rows of one group
 * against a block of columns). A tile is the unit of work of one OpenMP
 * thread: for each K-chunk it converts that chunk of its rows to binary64,
 * then for each sub-block of its columns (sub_cols: the converted chunk of
 * B within 256 KiB, in L2) converts that chunk of the columns (a streaming
 * copy in the caller's layout), calls dgemm (single-threaded inside the
 * parallel region, so there is no nested oversubscription; with one thread
 * OpenBLAS may use its own), adds the chunk into the tile and, after the
 * last chunk, certifies the sub-block while it is in cache; then the slow
 * tiers run on the tile's misses, reading the caller's floats. No operand is ever
 * converted whole: scratch per thread is two tiles of doubles and two chunk
 * buffers, within a budget of a quarter of the input+output bytes (at least
 * 4 MiB, at most 128 MiB over all threads). Threads share nothing but the
 * output, and only ever write disjoint tiles of it; there is no reduction
 * over floating-point values anywhere. */
#include "config.h"
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#undef I /* <complex.h> via cblas.h; the GEMMs name a dimension I */
#ifdef _OPENMP
#include <omp.h>
#endif
#include "stages/stages_priv.h"

#define KC_DEFAULT 256
#define BUDGET_MAX (INT64_C(128) << 20)
#define BUDGET_MIN (INT64_C(4) << 20)
#define TILE_MAX (INT64_C(1) << 20) /* output elements in one tile */
#define TILE_ONE_CHUNK (INT64_C(1) << 16) /* ... when every sum is short: */
#define SHORT_SUM_CHUNKS 1 /* at most this many chunks (4, for Mixtral's dW: no gain measured) */
#define MID_BATCH 512                  /* misses the middle tier streams K for at once */
#define CONV_COLS 512                  /* k-major columns converted at once */
#define PF_CONV 8                      /* K-rows the k-major conversion prefetches ahead */
#define PF_AHEAD 4                     /* K-rows the middle tier prefetches ahead */
#define SUB_BYTES (INT64_C(256) << 10) /* one sub-block's converted K-chunk of B */
#define SMALL_MB 16                    /* tiles of at most this many rows ... */
#define SMALL_KC 64                    /* ... take chunks of this length when accumulated */

/* Vector code for the hot loops where the compiler and CPU allow it: the
 * clones compute the same IEEE operations (no contraction: the build has
 * -ffp-contract=off), so results are identical, only faster. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define DL__CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DL__CLONES
#endif

static int64_t tune_kc = 0, tune_budget = 0, tune_sub = 0;

void dl__gemm_set_tuning(int64_t kc, int64_t budget_bytes)
{
    tune_kc = kc > 0 ? kc : 0;
    tune_budget = budget_bytes > 0 ? budget_bytes : 0;
}

void dl__gemm_set_subblock(int64_t cols)
{
    tune_sub = cols > 0 ? cols : 0;
}

/* ------------------------------------------------------------ certification */

static inline uint64_t bits_of(double x)
{
    uint64_t b;
    memcpy(&b, &x, 8);
    return b;
}

static inline double of_bits(uint64_t b)
{
    double x;
    memcpy(&x, &b, 8);
    return x;
}

/* Round-to-nearest-even of a finite double onto t. fp32 is the hardware
 * conversion; bf16 and fp16 round the binary64 significand in place while
 * the result is a normal number of t, and leave the rest to dl_round. */
static inline double rnd(double x, dl_dtype_t t)
{
    if (t == DL_F32)
        return (double)(float)x;
    uint64_t b = bits_of(x), mag = b & ~(UINT64_C(1) << 63);
    int s;
    uint64_t lo_norm, inf_at;
    if (t == DL_BF16) {
        s = 45;
        lo_norm = UINT64_C(0x3810000000000000); /* 2^-126 */
        inf_at = UINT64_C(0x47f0000000000000);  /* 2^128 */
    } else {
        s = 42;
        lo_norm = UINT64_C(0x3f10000000000000); /* 2^-14 */
        inf_at = UINT64_C(0x40f0000000000000);  /* 2^16 */
    }
    if (DL__UNLIKELY(mag < lo_norm))
        return dl_round(x, t);
    mag += (UINT64_C(1) << (s - 1)) - 1 + ((mag >> s) & 1);
    mag &= ~((UINT64_C(1) << s) - 1);
    if (mag >= inf_at)
        mag = UINT64_C(0x7ff0000000000000);
    return of_bits((b & (UINT64_C(1) << 63)) | mag);
}

/* The exact value S is known to satisfy |S - y| <= err (y finite, err >= 0,
 * y a multiple of 2^-298 or zero). If every real in [y-err, y+err] rounds to
 * one value of t, store it and return 1. The computed ends L, H enclose the
 * exact ones: err is inflated by 2^-40 relative plus 2^-50 |y|, which covers
 * the rounding of y -+ e2 (at most u(|y| + e2)) and of e2 itself. An exact
 * zero rounds to +0, a negative tiny value to -0, so an interval touching
 * zero is only certified when it is {0}. */
static inline int certify(double y, double err, dl_dtype_t t, double *out)
{
    double e2 = err * (1.0 + 0x1p-40) + fabs(y) * 0x1p-50;
    double L = y - e2, H = y + e2;
    if (!(L > 0.0 || H < 0.0)) {
        if (L == 0.0 && H == 0.0) {
            *out = 0.0;
            return 1;
        }
        return 0;
    }
    double rl = rnd(L, t), rh = rnd(H, t);
    if (rl != rh)
        return 0;
    *out = rl;
    return 1;
}

/* ------------------------------------------------------------- the tiers */

/* TwoSum-accumulates e into *c and adds the (exact) error of that addition
 * to *w: afterwards the old c + e = new c + err exactly. */
static inline void lo_add(double *c, double *w, double e)
{
    double s = *c + e;
    double z = s - *c;
    *w += fabs((*c - (s - z)) + (e - z));
    *c = s;
}

/* Correct rounding of S = hi + lo (exactly, hi = fl(S)) onto t. S lies
 * strictly between hi and its binary64 neighbour nb towards lo when lo != 0,
 * and no value or midpoint of t lies strictly between two neighbouring
 * doubles, so S rounds like hi unless a midpoint sits at hi or nb; then the
 * midpoint of rnd(hi) and rnd(nb) (exact in binary64) says which side S is
 * on. Returns 0 only near the overflow threshold. */
static int round_dd(double hi, double lo, dl_dtype_t t, double *out)
{
    if (hi == 0.0) { /* then lo == 0: an exact zero */
        *out = 0.0;
        return 1;
    }
    double rh = rnd(hi, t);
    if (lo == 0.0) {
        *out = rh;
        return isfinite(rh);
    }
    double nb = nextafter(hi, lo > 0 ? INFINITY : -INFINITY);
    double rn = rnd(nb, t);
    if (!isfinite(rh) || !isfinite(rn))
        return 0;
    if (rh == rn) {
        *out = rh;
        return 1;
    }
    double m = rh / 2 + rn / 2; /* exact: both have at most 24 bits, far above underflow */
    *out = hi == m ? rn : rh;
    return 1;
}

static double dot_exact(const double *a, const double *b, int64_t n, dl_dtype_t t)
{
    dl_acc_t acc;
    dl_acc_clear(&acc);
    for (int64_t k = 0; k < n; k++)
        dl_acc_add(&acc, a[k] * b[k]); /* exact: both hold floats */
    return dl_acc_round(&acc, t);
}

/* --------------------------------------------------------------- the plan */

typedef struct {
    dl_dtype_t t;
    int64_t ks; /* dot-product length */
    int64_t kc; /* dgemm chunk along K */
    int acc;    /* chunks accumulated by dgemm itself (beta = 1), no chunk sums */
    double g1;  /* tier 1: err = g1 * na * nb */
} plan_t;

typedef struct {
    int64_t fast, middle, exact;
} counts_t;

/* Longest K the slack factors below are proven for: (K + kc + 64) u and
 * (K + 24) u stay below 2^-20. */
#define KS_MAX (INT64_C(1) << 30)

static void make_plan(plan_t *pl, dl_dtype_t t, int64_t ks, int nparts)
{
    pl->t = t;
    pl->ks = ks;
    pl->kc = tune_kc > 0 ? tune_kc : KC_DEFAULT;
    /* one chunk never crosses a part (a term), so at most
     * ceil(ks/kc) + nparts chunks */
    int64_t nc = (ks + pl->kc - 1) / pl->kc + nparts;
    int64_t h = (ks < pl->kc ? ks : pl->kc) + nc;
    /* bf16 and fp16 outputs: dgemm adds each chunk into the tile itself
     * (beta = 1). A chunk of kl terms is then one sum over kl + 1 leaves
     * (the tile's old value is one), a tree of height at most kl, so a term
     * of chunk c goes through at most kl_c + the later chunks' kl additions:
     * h <= ks. gamma_ks is still 2^-33 relative at ks = 2^20 (against
     * 2^-9 and 2^-12 output ulps: the bound costs almost no misses there),
     * and saves the pass over the tile per chunk; fp32 outputs keep the
     * chunk sums, whose h = kc + nc is 50x smaller at K = 14336. */
    pl->acc = t != DL_F32;
    if (pl->acc)
        h = ks;
    double hu = (double)h * 0x1p-53;
    double gam = hu / (1.0 - hu);
    /* norms: sum of squares within gamma_K, sqrt within u, two products
     * within u each; the 2^-40 covers the roundings in this line */
    double slack = 1.0 + (4.0 * (double)(ks + 16)) * 0x1p-53 + 0x1p-40;
    pl->g1 = gam * slack;
}

/* ------------------------------------------------------------ operands */

/* A K-range of one operand, read straight from the caller's floats:
 * element (r, k), k in [0, klen), is p[k*ld + r] (k-major) or p[r*ld + k]
 * (row-major); it is element koff + k of the operand's dot products. The
 * two operands of a tile have parts over the same K-ranges (one per term). */
typedef struct {
    const float *p;
    int64_t ld, koff, klen;
    int kmajor;
} part_t;

typedef struct {
    int n;
    part_t *part;
} operand_t;

/* Row r of the operand over all K, in binary64, for the slow tiers. */
static void fetch(const operand_t *op, int64_t r, double *buf)
{
    for (int i = 0; i < op->n; i++) {
        const part_t *q = &op->part[i];
        double *d = buf + q->koff;
        if (q->kmajor)
            for (int64_t k = 0; k < q->klen; k++)
                d[k] = q->p[k * q->ld + r];
        else
            for (int64_t k = 0; k < q->klen; k++)
                d[k] = q->p[r * q->ld + k];
    }
}

/* Converts the K-chunk [k0, k0+kl) of rows [0, rows) of part q into dst,
 * keeping the part's layout (row-major: rows x kl, ld kl; k-major: kl x rows,
 * ld rows), and adds the squares to ss[r]. Both are streaming copies. */
DL__CLONES
static void conv_chunk(const part_t *q, int64_t k0, int64_t kl, int64_t rows, double *dst,
                       double *ss)
{
    if (!q->kmajor) {
        for (int64_t r = 0; r < rows; r++) {
            const float *s = q->p + r * q->ld + k0;
            double *d = dst + r * kl;
            double acc[8] = {0};
            int64_t c = 0;
            for (; c + 8 <= kl; c += 8)
                for (int l = 0; l < 8; l++) {
                    double v = s[c + l];
                    d[c + l] = v;
                    acc[l] += v * v;
                }
            for (; c < kl; c++) {
                double v = s[c];
                d[c] = v;
                acc[0] += v * v;
            }
            ss[r] += ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        }
    } else {
        /* K-row by K-row, CONV_COLS columns at a time (their sums of
         * squares stay in L1), each row's run read contiguously with the
         * source prefetched PF_CONV rows ahead: the rows of a chunk are
         * N floats apart, a page or more, where the hardware does not
         * fetch ahead (64 columns by K-rows, the earlier order, read a
         * fifth of a row's page per visit and ran at half the rate) */
        for (int64_t c0 = 0; c0 < rows; c0 += CONV_COLS) {
            int64_t cn = rows - c0 < CONV_COLS ? rows - c0 : CONV_COLS;
            double *acc = ss + c0;
            for (int64_t k = 0; k < kl; k++) {
                const float *s = q->p + (k0 + k) * q->ld + c0;
                double *d = dst + k * rows + c0;
                if (k + PF_CONV < kl)
                    for (int64_t c = 0; c < cn; c += 16)
                        __builtin_prefetch(s + PF_CONV * q->ld + c);
#pragma omp simd
                for (int64_t c = 0; c < cn; c++) {
                    double v = s[c];
                    d[c] = v;
                    acc[c] += v * v;
                }
            }
        }
    }
}

/* Turns sums of squares into norms; returns 1 if any is not finite (a
 * squared float cannot overflow binary64, so only a NaN or an infinity in
 * the row does that). */
static int finish_norms(double *ss, int64_t n)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        bad |= !isfinite(ss[i]);
        ss[i] = sqrt(ss[i]);
    }
    return bad;
}

/* ------------------------------------------------------- certification pass */

/* Tier 1 for one element: the certified value of t where every real in
 * y +- err rounds to it, else a NaN (which no certified value is); the
 * arithmetic of certify() and rnd() on the bits, branch-free, so that the
 * loops calling it vectorise. e2 == 0 only for an exact zero (a zero
 * bound and y = 0), which gives +0. Magnitudes below the normal range of
 * bf16/fp16 are misses (left to the middle tier). t is a constant at every
 * call (always inlined), so each loop is specialised to one type. */
static inline __attribute__((always_inline)) float cert_one(double y, double err, dl_dtype_t t)
{
    double e2 = err * (1.0 + 0x1p-40) + fabs(y) * 0x1p-50;
    double L = y - e2, H = y + e2;
    if (t == DL_F32) {
        float fl = (float)L, fh = (float)H, o;
        uint32_t ok = (uint32_t)((fl == fh) & ((L > 0.0) | (H < 0.0)));
        uint32_t zero = (uint32_t)(e2 == 0.0), b;
        memcpy(&b, &fl, 4);
        b = ((b & (0 - ok)) | (UINT32_C(0x7fc00000) & (ok - 1))) & (zero - 1);
        memcpy(&o, &b, 4);
        return o;
    }
    /* bf16 (s = 45) or fp16 (s = 42) */
    const int s = t == DL_BF16 ? 45 : 42;
    const uint64_t lo_norm = t == DL_BF16 ? UINT64_C(0x3810000000000000)  /* 2^-126 */
                                          : UINT64_C(0x3f10000000000000); /* 2^-14 */
    const uint64_t inf_at = t == DL_BF16 ? UINT64_C(0x47f0000000000000)   /* 2^128 */
                                         : UINT64_C(0x40f0000000000000);  /* 2^16 */
    const uint64_t sgn = UINT64_C(1) << 63, half = (UINT64_C(1) << (s - 1)) - 1,
                   keep = ~((UINT64_C(1) << s) - 1), inf = UINT64_C(0x7ff0000000000000),
                   nan = UINT64_C(0x7ff8000000000000);
    uint64_t bl = bits_of(L), bh = bits_of(H);
    uint64_t ml = bl & ~sgn, mh = bh & ~sgn;
    uint64_t rl = (ml + half + ((ml >> s) & 1)) & keep;
    uint64_t rh = (mh + half + ((mh >> s) & 1)) & keep;
    uint64_t ok = (uint64_t)(rl == rh) & (uint64_t)((L > 0.0) | (H < 0.0)) &
                  (uint64_t)(ml >= lo_norm) & (uint64_t)(mh >= lo_norm);
    uint64_t zero = (uint64_t)(e2 == 0.0);
    uint64_t over = (uint64_t)(rl >= inf_at);
    uint64_t mag = (rl & (over - 1)) | (inf & (0 - over));
    uint64_t rb = ((bl & sgn) | mag) & (0 - ok);
    rb |= nan & ((ok | zero) - 1); /* neither: NaN marks a miss */
    return (float)of_bits(rb);     /* zero (ok = 0, zero = 1): rb = +0 */
}

/* Tier 1's fast test for one element, the one every element takes first:
 * the exact value S is within err of y (err a true bound, as the caller
 * computes it rounded up). Returns the value of t that every real in
 * [y - err, y + err] rounds to, or a NaN when this test cannot tell (then
 * cert_one decides). In the bits of |y|, the low s bits are the place
 * within an ulp of t (s = 29, 45, 42 for fp32, bf16, fp16) and mid (those
 * bits 100...0) the midpoint of |y|'s truncation interval; |y| - mid is
 * exact (both in one binade: Sterbenz). Every rounding boundary of t
 * other than mid is at least ulp/4 from |y| (ulp/4 below a power of two,
 * ulp/2 otherwise), so if err < | |y| - mid | and err < |y| 2^-(p+3) <=
 * ulp/4 (p the fraction bits of t), the interval holds no boundary and
 * stays on y's side of zero: S rounds as y, and y rounds half up as it is
 * not a tie. |y| must be a normal number of t and below 2^127 (2^15 for
 * fp16), which keeps the result finite. Comparisons are exact, so the
 * test needs no slack of its own; about half the operations of
 * cert_one. t is a constant at every call (always inlined). */
static inline __attribute__((always_inline)) float cert_fast(double y, double err, dl_dtype_t t)
{
    const int s = t == DL_F32 ? 29 : t == DL_BF16 ? 45 : 42;
    const double scale = t == DL_F32 ? 0x1p-26 : t == DL_BF16 ? 0x1p-10 : 0x1p-13;
    const uint64_t lo = t == DL_F16 ? UINT64_C(0x3f10000000000000)  /* 2^-14 */
                                    : UINT64_C(0x3810000000000000); /* 2^-126 */
    const uint64_t hi = t == DL_F16 ? UINT64_C(0x40e0000000000000)  /* 2^15 */
                                    : UINT64_C(0x47e0000000000000); /* 2^127 */
    const uint64_t sgn = UINT64_C(1) << 63, half = UINT64_C(1) << (s - 1),
                   keep = ~((UINT64_C(1) << s) - 1);
    uint64_t b = bits_of(y), mb = b & ~sgn;
    double ay = of_bits(mb), mid = of_bits((mb & keep) | half);
    uint64_t ok = (uint64_t)(fabs(ay - mid) > err) & (uint64_t)(err < ay * scale) &
                  (uint64_t)(mb >= lo) & (uint64_t)(mb < hi);
    if (t == DL_F32) { /* branch-free, so that the loops calling it vectorise */
        float r = (float)y;
        uint32_t rb;
        memcpy(&rb, &r, 4);
        rb = (rb & (0 - (uint32_t)ok)) | (UINT32_C(0x7fc00000) & ((uint32_t)ok - 1));
        memcpy(&r, &rb, 4);
        return r;
    }
    uint64_t rb = (((mb + half) & keep) | (b & sgn)) & (0 - ok);
    rb |= UINT64_C(0x7ff8000000000000) & (ok - 1);
    return (float)of_bits(rb);
}

/* The first j in [j0, n) with o[j] a NaN (a miss), else n: blocks of 64
 * by a vectorised count first (misses are rare: an element-by-element scan
 * of the rows holding one was a tenth of a small-group weight gradient's
 * time), then element by element. */
static inline int64_t next_nan(const float *o, int64_t j0, int64_t n)
{
    int64_t j = j0;
    for (; j + 64 <= n; j += 64) {
        int c = 0;
#pragma omp simd reduction(+ : c)
        for (int l = 0; l < 64; l++)
            c += o[j + l] != o[j + l];
        if (c)
            break;
    }
    for (; j < n; j++)
        if (o[j] != o[j])
            return j;
    return n;
}

/* Tier 1 for one row of a tile: o[j] = the certified value of
 * C[j] +- ga nbn[j] (the fast test, then cert_one where it could not
 * tell), NaN for a miss. The fast test's bound is ga (1 + 2^-40) nbn[j],
 * whose two roundings the 2^-40 covers, as in cert_one. Returns the number
 * of misses. */
static inline __attribute__((always_inline)) int64_t
certify_row_t(const double *C, double ga, const double *nbn, int64_t n, float *o, dl_dtype_t t)
{
    double ga2 = ga * (1.0 + 0x1p-40);
    int m32 = 0; /* 32-bit lanes: half the work of counting in 64 */
#pragma omp simd reduction(+ : m32)
    for (int64_t j = 0; j < n; j++) {
        float v = cert_fast(C[j], ga2 * nbn[j], t);
        o[j] = v;
        m32 += v != v;
    }
    if (m32 == 0)
        return 0;
    int64_t miss = 0;
    for (int64_t j = next_nan(o, 0, n); j < n; j = next_nan(o, j + 1, n)) {
        o[j] = cert_one(C[j], ga * nbn[j], t);
        miss += o[j] != o[j];
    }
    return miss;
}

static inline int64_t count_nan(const float *o, int64_t n)
{
    int64_t miss = 0;
#pragma omp simd reduction(+ : miss)
    for (int64_t j = 0; j < n; j++)
        miss += o[j] != o[j];
    return miss;
}

/* Tier 1 for one row of a tile (certify_row_t). Returns the number of
 * misses. */
DL__CLONES
static int64_t certify_row(const double *C, double ga, const double *nbn, int64_t n,
                           dl_dtype_t t, float *o)
{
    if (t == DL_F32)
        return certify_row_t(C, ga, nbn, n, o, DL_F32);
    if (t == DL_BF16)
        return certify_row_t(C, ga, nbn, n, o, DL_BF16);
    return certify_row_t(C, ga, nbn, n, o, DL_F16);
}

int dl__gemm_certify(double y, double err, dl_dtype_t t, int fast, float *out)
{
    float v;
    if (t == DL_F32)
        v = fast ? cert_fast(y, err, DL_F32) : cert_one(y, err, DL_F32);
    else if (t == DL_BF16)
        v = fast ? cert_fast(y, err, DL_BF16) : cert_one(y, err, DL_BF16);
    else
        v = fast ? cert_fast(y, err, DL_F16) : cert_one(y, err, DL_F16);
    *out = v;
    return v == v;
}

/* ------------------------------------------------------------- the tile */

typedef struct {
    double *C, *P;    /* mb x nb */
    double *ca, *cb;  /* one K-chunk of each operand: mb x kc, nb x kc */
    double *na, *nb;  /* row norms */
    int64_t *list;    /* mb x nb */
    int64_t *miss;    /* mb: misses per row */
    double *vec;      /* 2 ks per thread: a row and a column for the exact tier */
    double *mst;      /* 3 MID_BATCH: the middle tier's sums, errors, error bounds */
    int64_t *moff;    /* 2 MID_BATCH: the middle tier's element offsets */
} tilebuf_t;

/* Exponent of the last set bit of a nonzero float (its value is an integer
 * multiple of 2^that); INT_MAX for zero, which adds nothing to a sum. */
static inline int lsb_exp(float v)
{
    uint32_t b;
    memcpy(&b, &v, 4);
    b &= 0x7fffffffu;
    if (b == 0)
        return INT_MAX;
    int e = (int)(b >> 23);
    uint32_t m = b & 0x7fffffu;
    if (e)
        m |= 0x800000u;
    return (e ? e - 150 : -149) + __builtin_ctz(m);
}

/* lo[r] = min over k of lsb_exp(row r) for the rows listed in rl[0..nr) of
 * every part of op, read in each part's own layout; other entries of lo
 * are left alone. */
static void lsb_rows(const operand_t *op, const int64_t *rl, int64_t nr, int *lo)
{
    for (int64_t x = 0; x < nr; x++)
        lo[rl[x]] = INT_MAX;
    for (int i = 0; i < op->n; i++) {
        const part_t *q = &op->part[i];
        for (int64_t k = 0; k < q->klen; k++)
            for (int64_t x = 0; x < nr; x++) {
                int64_t r = rl[x];
                int e = lsb_exp(q->kmajor ? q->p[k * q->ld + r] : q->p[r * q->ld + k]);
                lo[r] = e < lo[r] ? e : lo[r];
            }
    }
}

/* A second certificate for the elements tier 1 left, aimed at exact ties
 * (frequent when bf16/fp16 products are summed into fp32): if every product
 * of row i and column j is a multiple of 2^(la+lb) and sum |a_k b_k| <=
 * |a| |b| < 2^(la+lb+53), every partial sum in any order, FMA or not, is an
 * integer number of 2^(la+lb) below 2^53 of them: binary64 added them
 * exactly, and C is the exact value. The exponents are computed only for
 * the rows and columns that hold a miss (a few per tile: computing them for
 * all cost as much as converting the operands), and only when the misses
 * outnumber those rows and columns together: each exponent costs a pass
 * over K as an element of the middle tier does, so sparse misses (the
 * certificate's slack on long sums, one or two per row) go straight to the
 * middle tier, dense ones (exact ties of short bf16 sums) come here.
 * miss[i] counts row i's misses and is kept up to date. Returns how many
 * it decided. */
static int64_t exact_sums(const double *C, const double *na, const double *nb, int64_t mb,
                          int64_t nbc, const operand_t *A, const operand_t *B, dl_dtype_t t,
                          float *out, int64_t ldo, int64_t *miss)
{
    int *la = malloc((size_t)(mb + nbc) * sizeof *la);
    int64_t *rl = malloc((size_t)(mb + nbc) * sizeof *rl);
    char *colneed = calloc((size_t)nbc + 1, 1);
    if (!la || !rl || !colneed) {
        free(la);
        free(rl);
        free(colneed);
        return 0; /* the slower tiers still decide everything */
    }
    int *lb = la + mb;
    int64_t nr = 0, nc = 0;
    for (int64_t i = 0; i < mb; i++) {
        if (!miss[i])
            continue;
        const float *o = out + i * ldo;
#pragma omp simd
        for (int64_t j = 0; j < nbc; j++) /* branch-free: vectorises */
            colneed[j] |= (char)(o[j] != o[j]);
        rl[nr++] = i;
    }
    int64_t *cl = rl + nr, nmiss = 0;
    for (int64_t j = 0; j < nbc; j++)
        if (colneed[j])
            cl[nc++] = j;
    for (int64_t x = 0; x < nr; x++)
        nmiss += miss[rl[x]];
    if (nmiss > nr + nc) { /* else: see above */
        lsb_rows(A, rl, nr, la);
        lsb_rows(B, cl, nc, lb);
    } else
        nr = 0;
    int64_t done = 0;
    for (int64_t x = 0; x < nr; x++) {
        int64_t i = rl[x];
        for (int64_t y = 0; y < nc; y++) {
            int64_t j = cl[y];
            float *o = out + i * ldo + j;
            if (*o == *o || la[i] == INT_MAX || lb[j] == INT_MAX)
                continue;
            if (na[i] * nb[j] * (1.0 + 0x1p-40) < ldexp(1.0, la[i] + lb[j] + 53)) {
                double v = C[i * nbc + j]; /* exact; an exact zero is +0 */
                *o = v == 0.0 ? 0.0f : (float)dl_round(v, t);
                miss[i]--;
                done++;
            }
        }
    }
    free(la);
    free(rl);
    free(colneed);
    return done;
}

/* The middle tier, for up to MID_BATCH misses at once (tile elements
 * l[x] = i*nb + j): a compensated sum of each element's products, the
 * products taken in K order straight from the caller's floats, streaming
 * each K-row of both operands once for the whole batch (a k-major column
 * read alone would touch one cache line per term). Per element, TwoSum
 * keeps s + c + d = the exact partial sum, where each error of the
 * additions into c is captured exactly and its magnitude summed into w;
 * w is a sum of at most K nonnegative terms each rounded within u, and
 * (K + 24) u <= 2^-20 (KS_MAX), so |d| <= w (1 + 2^-18). When w == 0 the
 * pair is the exact sum. */
DL__CLONES
static void mid_stream(const part_t *pa, const part_t *pb, const int64_t *ao, const int64_t *bo,
                       int64_t n, double *s, double *c, double *w)
{
    int64_t sa = pa->kmajor ? pa->ld : 1, sb = pb->kmajor ? pb->ld : 1;
    /* how far ahead each operand is prefetched: PF_AHEAD K-rows of a
     * k-major one; a row-major one is read along its rows, a new line
     * every 16 terms, so 16 floats on, every 8th term */
    int64_t fa = pa->kmajor ? PF_AHEAD * sa : 16, fb = pb->kmajor ? PF_AHEAD * sb : 16;
    double pr[MID_BATCH];
    for (int64_t k = 0; k < pb->klen; k++) {
        const float *ak = pa->p + k * sa, *bk = pb->p + k * sb;
        /* the batch's elements ahead: a k-major row is a new cache line
         * per element and term, which the hardware does not fetch ahead
         * for a gather (without this, the loop waits on memory for every
         * line: 50 ns per element and term on a 2-core EPYC) */
        int pfa = (pa->kmajor || !(k & 7)) && k * sa + fa < pa->klen * sa,
            pfb = (pb->kmajor || !(k & 7)) && k * sb + fb < pb->klen * sb;
        if (pfa)
            for (int64_t x = 0; x < n; x++)
                __builtin_prefetch(ak + fa + ao[x]);
        if (pfb)
            for (int64_t x = 0; x < n; x++)
                __builtin_prefetch(bk + fb + bo[x]);
        /* the products gathered first, so that the compensated sums below
         * are vector code (with the gather in the same loop GCC left the
         * whole loop scalar) */
        for (int64_t x = 0; x < n; x++)
            pr[x] = (double)ak[ao[x]] * (double)bk[bo[x]]; /* exact */
#pragma omp simd
        for (int64_t x = 0; x < n; x++) {
            double p = pr[x];
            double t = s[x] + p, z = t - s[x];
            double e = (s[x] - (t - z)) + (p - z);
            double cs = c[x] + e, cz = cs - c[x];
            w[x] += fabs((c[x] - (cs - cz)) + (e - cz));
            c[x] = cs;
            s[x] = t;
        }
    }
}

/* The middle tier's verdict from a compensated sum: the exact value is
 * s + c + d with |d| <= w (1 + 2^-18). Returns 1 with the correctly
 * rounded value in *r when that decides it: exactly when w == 0, else by
 * the interval certificate. */
static int mid_decide(double s, double c, double w, dl_dtype_t t, double *r)
{
    double hi = s + c, z = hi - s;
    double lo = (s - (hi - z)) + (c - z); /* s + c = hi + lo exactly */
    return w == 0.0 ? round_dd(hi, lo, t, r) : certify(hi, fabs(lo) + w * (1.0 + 0x1p-18), t, r);
}

/* Decides the n misses l[0..n) of a tile by the middle tier, and those it
 * cannot decide (near the overflow threshold, or a bound straddling a
 * rounding boundary) by the exact accumulator. */
static void middle_batch(const operand_t *A, const operand_t *B, tilebuf_t *tb, const int64_t *l,
                         int64_t n, int64_t nb, int64_t ks, dl_dtype_t t, float *out,
                         int64_t ldo, counts_t *cnt)
{
    double *s = tb->mst, *c = s + MID_BATCH, *w = c + MID_BATCH;
    int64_t *ao = tb->moff, *bo = ao + MID_BATCH;
    memset(s, 0, 3 * MID_BATCH * sizeof(double));
    for (int ip = 0; ip < A->n; ip++) {
        const part_t *pa = &A->part[ip], *pb = &B->part[ip];
        for (int64_t x = 0; x < n; x++) {
            int64_t i = l[x] / nb, j = l[x] % nb;
            ao[x] = pa->kmajor ? i : i * pa->ld;
            bo[x] = pb->kmajor ? j : j * pb->ld;
        }
        mid_stream(pa, pb, ao, bo, n, s, c, w);
    }
    for (int64_t x = 0; x < n; x++) {
        int64_t i = l[x] / nb, j = l[x] % nb;
        float *o = out + i * ldo + j;
        double r;
        if (mid_decide(s[x], c[x], w[x], t, &r)) {
            *o = (float)r;
            cnt->middle++;
        } else {
            double *a = tb->vec, *b = a + ks;
            fetch(A, i, a);
            fetch(B, j, b);
            *o = (float)dot_exact(a, b, ks, t);
            cnt->exact++;
        }
    }
}

/* Columns of one sub-block of a tile. Each K-chunk of B is converted and
 * multiplied a sub-block at a time, so that the converted chunk (kl x nbs
 * doubles, at most SUB_BYTES) is still in L2 when dgemm packs it: a whole
 * tile's chunk of a long row panel (32 rows of a DeepSeek group against
 * 7168 columns: 14 MB per thread) went out to memory between our
 * conversion and dgemm's packing, and came back. At least mb columns (a
 * multiple of 8), so that dgemm's packing of the A chunk, repeated for
 * every sub-block, costs at most what packing B's does. */
static int64_t sub_cols(const plan_t *pl, int64_t kc, int64_t mb, int64_t nb)
{
    int64_t kl = pl->ks < kc ? pl->ks : kc, n;
    if (tune_sub > 0)
        n = tune_sub;
    else {
        n = SUB_BYTES / (8 * kl);
        n = n < mb ? mb : n;
        n = (n + 7) / 8 * 8;
    }
    return n < nb ? n : nb;
}

/* C[i*ldc + j] += P[i*jn + j] for i < mb, j < jn: a chunk's sums added
 * into the tile (one IEEE addition per element, so vector code gives the
 * same bits; without the clones and the simd pragma GCC left this loop
 * scalar, 76% of tile()'s samples in an fp32-output GEMM). */
DL__CLONES
static void add_chunk(double *C, int64_t ldc, const double *P, int64_t mb, int64_t jn)
{
    for (int64_t i = 0; i < mb; i++) {
        double *c = C + i * ldc;
        const double *p = P + i * jn;
#pragma omp simd
        for (int64_t j = 0; j < jn; j++)
            c[j] += p[j];
    }
}

/* The K-chunk [k0, k0+kl) of part pb's columns [j0, j0+jn) of the tile:
 * converted (their squares added to the column norms) and multiplied by
 * the converted A chunk into C's columns, either by dgemm itself (the
 * first chunk, or accumulated: beta = 1) or through P (mb x jn), whose
 * chunk result is then added into C in chunk order. */
static void chunk_block(const plan_t *pl, const part_t *pa, const part_t *pb, int64_t k0,
                        int64_t kl, int64_t mb, int64_t nb, int64_t j0, int64_t jn, int first,
                        tilebuf_t *tb)
{
    part_t q = *pb;
    q.p += q.kmajor ? j0 : j0 * q.ld;
    conv_chunk(&q, k0, kl, jn, tb->cb, tb->nb + j0);
    double *C = tb->C + j0, *P = tb->P;
    int into_c = first || pl->acc;
    cblas_dgemm(CblasRowMajor, pa->kmajor ? CblasTrans : CblasNoTrans,
                pb->kmajor ? CblasNoTrans : CblasTrans, (int)mb, (int)jn, (int)kl, 1.0, tb->ca,
                (int)(pa->kmajor ? mb : kl), tb->cb, (int)(pb->kmajor ? jn : kl),
                first || !pl->acc ? 0.0 : 1.0, into_c ? C : P, (int)(into_c ? nb : jn));
    if (!into_c) /* the chunk sums, added in a fixed order */
        add_chunk(C, nb, P, mb, jn);
}

/* The products of a tile into tb->C (mb x nb) and tier 1 on them: each
 * K-chunk of both operands is converted to binary64 just before dgemm
 * reads it, so it stays in cache; no chunk crosses a part (a term). After
 * the last chunk of a sub-block its elements are certified at once, while
 * they are in cache (the norms are complete by then: the A chunk is
 * converted before the sub-blocks, each B column's last chunk with its
 * sub-block). tb->miss[i] counts row i's misses (NaN in out). Returns
 * DL_ENONFINITE if an input taking part is NaN or infinite. */
static int tile_products(const plan_t *pl, int64_t mb, int64_t nb, const operand_t *A,
                         const operand_t *B, tilebuf_t *tb, float *out, int64_t ldo)
{
    memset(tb->na, 0, (size_t)mb * sizeof(double));
    memset(tb->nb, 0, (size_t)nb * sizeof(double));
    memset(tb->miss, 0, (size_t)mb * sizeof(int64_t));
    /* few rows and dgemm accumulating the chunks (bf16/fp16 outputs, whose
     * bound gamma_ks does not depend on the chunk length): shorter chunks,
     * so that a sub-block is SMALL_KC K-rows of 4x the columns and the
     * conversion reads 2 KB runs of each K-row of a k-major weight instead
     * of 512 B ones (the groups of a few tokens are bound by reading the
     * weights; zipf_gate_up: conv_chunk 17% of our samples at 1 thread) */
    int64_t kc = pl->acc && mb <= SMALL_MB && pl->kc > SMALL_KC ? SMALL_KC : pl->kc;
    int64_t nbs = sub_cols(pl, kc, mb, nb);
    int first = 1;
    for (int ip = 0; ip < B->n; ip++) {
        const part_t *pa = &A->part[ip], *pb = &B->part[ip];
        for (int64_t k0 = 0; k0 < pb->klen; k0 += kc) {
            int64_t kl = pb->klen - k0 < kc ? pb->klen - k0 : kc;
            int last = ip == B->n - 1 && k0 + kl == pb->klen;
            conv_chunk(pa, k0, kl, mb, tb->ca, tb->na);
            if (last && finish_norms(tb->na, mb))
                return DL_ENONFINITE;
            for (int64_t j0 = 0; j0 < nb; j0 += nbs) {
                int64_t jn = nb - j0 < nbs ? nb - j0 : nbs;
                chunk_block(pl, pa, pb, k0, kl, mb, nb, j0, jn, first, tb);
                if (!last)
                    continue;
                if (finish_norms(tb->nb + j0, jn))
                    return DL_ENONFINITE;
                for (int64_t i = 0; i < mb; i++)
                    tb->miss[i] += certify_row(tb->C + i * nb + j0, pl->g1 * tb->na[i],
                                               tb->nb + j0, jn, pl->t, out + i * ldo + j0);
            }
            first = 0;
        }
    }
    return 0;
}

/* out[i*ldo + j] for i < mb, j < nb: the correctly rounded value of
 * A(i,:) . B(j,:). Runs on one thread (tiles are the unit of parallelism;
 * dgemm called inside a parallel region runs single-threaded): tier 1 by
 * tile_products, the exact-sum certificate and the slower tiers on its
 * misses. Returns DL_ENONFINITE if an input taking part is NaN or
 * infinite. */
static int tile(const plan_t *pl, int64_t mb, int64_t nb, const operand_t *A,
                const operand_t *B, tilebuf_t *tb, float *out, int64_t ldo, counts_t *cnt)
{
    int64_t ks = pl->ks, total = mb * nb;
    int rc = tile_products(pl, mb, nb, A, B, tb, out, ldo);
    if (rc)
        return rc;
    dl_dtype_t t = pl->t;
    int64_t nfail = 0;
    for (int64_t i = 0; i < mb; i++)
        nfail += tb->miss[i];
    if (nfail) {
        int64_t ex = exact_sums(tb->C, tb->na, tb->nb, mb, nb, A, B, t, out, ldo, tb->miss);
        nfail -= ex;
    }
    cnt->fast += total - nfail;
    if (nfail == 0)
        return 0;
    int64_t nl = 0;
    for (int64_t i = 0; i < mb; i++) {
        const float *o = out + i * ldo;
        int64_t left = tb->miss[i];
        for (int64_t j = left ? next_nan(o, 0, nb) : nb; j < nb && left; j = next_nan(o, j + 1, nb)) {
            tb->list[nl++] = i * nb + j;
            left--;
        }
    }
    for (int64_t x0 = 0; x0 < nl; x0 += MID_BATCH)
        middle_batch(A, B, tb, tb->list + x0, nl - x0 < MID_BATCH ? nl - x0 : MID_BATCH, nb, ks,
                     t, out, ldo, cnt);
    return 0;
}

/* ------------------------------------------------------------- scratch */

/* One thread's scratch. */
typedef struct {
    part_t *pa, *pb;
    tilebuf_t tb;
} scratch_t;

static void scratch_free(scratch_t *s)
{
    free(s->pa);
    free(s->pb);
    free(s->tb.C);
    free(s->tb.P);
    free(s->tb.ca);
    free(s->tb.cb);
    free(s->tb.na);
    free(s->tb.nb);
    free(s->tb.list);
    free(s->tb.miss);
    free(s->tb.vec);
    free(s->tb.mst);
    free(s->tb.moff);
    memset(s, 0, sizeof *s);
}

static int scratch_alloc(scratch_t *s, int64_t mb, int64_t nb, int64_t kc, int64_t ks,
                         int nparts)
{
    int64_t mbn = mb * nb;
    memset(s, 0, sizeof *s);
    s->pa = malloc((size_t)nparts * sizeof(part_t));
    s->pb = malloc((size_t)nparts * sizeof(part_t));
    /* zeroed: dgemm with beta = 0 should not read C, but never let it see a NaN */
    s->tb.C = calloc((size_t)mbn, sizeof(double));
    s->tb.P = calloc((size_t)mbn, sizeof(double));
    s->tb.ca = malloc((size_t)(mb * kc) * sizeof(double));
    s->tb.cb = malloc((size_t)(nb * kc) * sizeof(double));
    s->tb.na = malloc((size_t)mb * sizeof(double));
    s->tb.nb = malloc((size_t)nb * sizeof(double));
    s->tb.list = malloc((size_t)mbn * sizeof(int64_t));
    s->tb.miss = malloc((size_t)mb * sizeof(int64_t));
    s->tb.vec = malloc(2 * (size_t)ks * sizeof(double));
    s->tb.mst = malloc(3 * MID_BATCH * sizeof(double));
    s->tb.moff = malloc(2 * MID_BATCH * sizeof(int64_t));
    if (!s->pa || !s->pb || !s->tb.C || !s->tb.P || !s->tb.ca || !s->tb.cb || !s->tb.na ||
        !s->tb.nb || !s->tb.list || !s->tb.miss || !s->tb.vec || !s->tb.mst ||
        !s->tb.moff) {
        scratch_free(s);
        return DL_ENOMEM;
    }
    return 0;
}

static void scratch_free_all(scratch_t *s, int n)
{
    if (!s)
        return;
    for (int i = 0; i < n; i++)
        scratch_free(&s[i]);
    free(s);
}

/* n scratches (one per thread), or NULL. */
static scratch_t *scratch_alloc_all(int n, int64_t mb, int64_t nb, int64_t kc, int64_t ks,
                                    int nparts)
{
    scratch_t *s = calloc((size_t)n, sizeof *s);
    if (!s)
        return NULL;
    for (int i = 0; i < n; i++)
        if (scratch_alloc(&s[i], mb, nb, kc, ks, nparts)) {
            scratch_free_all(s, n);
            return NULL;
        }
    return s;
}

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static int64_t budget_for(int64_t io_bytes)
{
    if (tune_budget > 0)
        return tune_budget;
    int64_t b = io_bytes / 4;
    if (b > BUDGET_MAX)
        b = BUDGET_MAX;
    if (b < BUDGET_MIN)
        b = BUDGET_MIN;
    return b;
}

/* Tile of mb x nb outputs for one thread: each tile converts its rows and
 * columns once, so conversions per flop go as 1/mb + 1/nb; the tile (two
 * doubles and a list entry per element) takes at most half of the thread's
 * share of the budget and at most TILE_MAX elements, so that it stays near
 * the cache, and there are enough tiles for the threads (outputs / 4 per
 * thread at most). Sums of at most SHORT_SUM_CHUNKS kc terms (ks: the
 * weight gradients of small groups) take tiles of at most
 * TILE_ONE_CHUNK elements, whose binary64 result is still in L2 when it is
 * certified: a conversion there is a few rows of K per output row, and
 * reading a 1024 x 1024 tile back from L3 cost as much as dgemm's K ~ 32
 * flops per element. */
static void tile_sizes(int64_t budget, int nthr, int64_t outputs, int64_t kc, int64_t ks,
                       int64_t rows, int64_t cols, int64_t *mb, int64_t *nb)
{
    int64_t share = budget / nthr;
    int64_t cap = share / 2 / 24;
    if (cap > TILE_MAX)
        cap = TILE_MAX;
    if (ks <= SHORT_SUM_CHUNKS * kc && cap > TILE_ONE_CHUNK)
        cap = TILE_ONE_CHUNK;
    if (nthr > 1 && cap > outputs / (4 * nthr))
        cap = outputs / (4 * nthr);
    if (cap < 4096)
        cap = 4096;
    int64_t side = (int64_t)sqrt((double)cap);
    int64_t m, n;
    if (rows <= side) {
        m = rows;
        n = cap / m;
    } else if (cols <= side) {
        n = cols;
        m = cap / n;
    } else {
        m = n = side;
    }
    /* the chunk buffers take (m + n) kc doubles of the other half */
    int64_t lim = share / 2 / (8 * kc);
    if (m + n > lim) {
        m = m * lim / (m + n);
        n = lim - m;
    }
    m = m < 8 ? 8 : m;
    n = n < 8 ? 8 : n;
    *mb = m < rows ? m : rows;
    *nb = n < cols ? n : cols;
}

static void add_counts(dl_tier_stats_t *stats, const counts_t *c)
{
    if (stats) {
        stats->fast += c->fast;
        stats->middle += c->middle;
        stats->exact += c->exact;
    }
}

/* ------------------------------------------------------- validation */

/* --------------------------------------------------------- grouped GEMM */

/* The tiles of a grouped GEMM: rows [r0, r0+mb) of group e against
 * columns [n0, n0+nb). */
typedef struct {
    int64_t e, r0, mb, n0, nb;
} job_t;

/* Runs the jobs over the threads, each job on one thread with its own
 * scratch; run(j, scratch, counts) returns 0 or an error, which stops the
 * others at their next job. */
typedef int (*job_fn)(const void *ctx, int64_t j, scratch_t *s, counts_t *c);

static int run_jobs(const void *ctx, job_fn fn, int64_t njobs, scratch_t *scr, int nthr,
                    counts_t *cnt)
{
    int err = 0;
    int64_t f = 0, m = 0, x = 0;
#pragma omp parallel num_threads(nthr) if (nthr > 1 && njobs > 1) reduction(+ : f, m, x)
    {
        scratch_t *s = &scr[thread_id()];
        counts_t c = {0, 0, 0};
#pragma omp for schedule(dynamic, 1)
        for (int64_t j = 0; j < njobs; j++) {
            int stop;
#pragma omp atomic read
            stop = err;
            if (stop)
                continue;
            int rc = fn(ctx, j, s, &c);
            if (rc) {
#pragma omp atomic write
                err = rc;
            }
        }
        f += c.fast;
        m += c.middle;
        x += c.exact;
    }
    cnt->fast += f;
    cnt->middle += m;
    cnt->exact += x;
    return err;
}

typedef struct {
    const dl_gemm_term_t *terms;
    int nterms;
    int64_t N;
    const job_t *jobs;
    const plan_t *pl;
    float *out;
} grouped_ctx_t;

static int grouped_job(const void *vctx, int64_t jx, scratch_t *s, counts_t *c)
{
    const grouped_ctx_t *g = vctx;
    const job_t *jb = &g->jobs[jx];
    int64_t N = g->N, koff = 0;
    operand_t A = {0, s->pa}, B = {0, s->pb};
    for (int t = 0; t < g->nterms; t++) {
        int64_t K = g->terms[t].K;
        if (K == 0)
            continue;
        const float *w = g->terms[t].rhs + jb->e * K * N;
        s->pa[A.n++] = (part_t){g->terms[t].lhs + jb->r0 * K, K, koff, K, 0};
        if (g->terms[t].layout == DL_RHS_NK)
            s->pb[B.n++] = (part_t){w + jb->n0 * K, K, koff, K, 0};
        else
            s->pb[B.n++] = (part_t){w + jb->n0, N, koff, K, 1};
        koff += K;
    }
    return tile(g->pl, jb->mb, jb->nb, &A, &B, &s->tb, g->out + jb->r0 * N + jb->n0, N, c);
}

int dl_gemm_grouped(const dl_gemm_term_t *terms, int nterms, int64_t N,
                    const int64_t *offsets, int64_t E, dl_dtype_t out_t,
                    float *out, dl_tier_stats_t *stats)
{
    int64_t ks, io;
    int rc = dl__gemm_check_grouped(terms, nterms, N, offsets, E, out, &ks, &io);
    if (rc)
        return rc;
    if (out_t != DL_F32 && out_t != DL_BF16 && out_t != DL_F16)
        return DL_EDTYPE;
    int64_t M = offsets[E];
    if (M == 0 || N == 0)
        return 0;
    if (ks == 0) { /* empty sums: exact zeros */
        memset(out, 0, (size_t)(M * N) * sizeof(float));
        if (stats)
            stats->fast += M * N;
        return 0;
    }
    if (ks > KS_MAX) { /* beyond the proven slack: the reference */
        rc = dl_gemm_grouped_ref(terms, nterms, N, offsets, E, out_t, out);
        if (stats && rc == 0)
            stats->exact += M * N;
        return rc;
    }
    plan_t pl;
    make_plan(&pl, out_t, ks, nterms);
    int nthr = max_threads();
    int64_t budget = budget_for(io), maxme = 0;
    for (int64_t e = 0; e < E; e++)
        if (offsets[e + 1] - offsets[e] > maxme)
            maxme = offsets[e + 1] - offsets[e];
    int64_t MB, NB, njobs = 0;
    tile_sizes(budget, nthr, M * N, pl.kc, ks, maxme, N, &MB, &NB);
    for (int64_t e = 0; e < E; e++)
        njobs += (offsets[e + 1] - offsets[e] + MB - 1) / MB * ((N + NB - 1) / NB);
    job_t *jobs = malloc((size_t)njobs * sizeof(job_t));
    if (!jobs)
        return DL_ENOMEM;
    int64_t nj = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t r0 = offsets[e]; r0 < offsets[e + 1]; r0 += MB)
            for (int64_t n0 = 0; n0 < N; n0 += NB)
                jobs[nj++] = (job_t){e, r0, offsets[e + 1] - r0 < MB ? offsets[e + 1] - r0 : MB,
                                     n0, N - n0 < NB ? N - n0 : NB};
    if (nthr > njobs)
        nthr = (int)njobs;
    scratch_t *scr = scratch_alloc_all(nthr, MB, NB, pl.kc, ks, nterms);
    if (!scr) {
        free(jobs);
        return DL_ENOMEM;
    }
    grouped_ctx_t ctx = {terms, nterms, N, jobs, &pl, out};
    counts_t cnt = {0, 0, 0};
    rc = run_jobs(&ctx, grouped_job, njobs, scr, nthr, &cnt);
    scratch_free_all(scr, nthr);
    free(jobs);
    if (!rc)
        add_counts(stats, &cnt);
    return rc;
}

/* ------------------------------------------------- short ragged groups */

/* Groups of at most SHORT_K rows (the tail experts of a skewed routing)
 * make weight gradients whose every output is a sum of a few products:
 * dgemm does O(K) work per output there, with a fixed overhead per call and
 * a binary64 output that the tile's certification pass reads back; so such
 * tiles are summed by a loop of our own, row by row into registers, and
 * certified as they are summed (the same fast-tier bound: any summation
 * order of K terms is a tree of height < K + 2). */
#define SHORT_K 8 /* above it, dgemm's tile is as fast (bench: K = 13 equal, 31 slower) */
#define SHORT_JB 16 /* columns summed at once (in registers) */

/* The n elements of row i (i < mb) that tier 1 left (NaN in o[0..nb)): the
 * middle tier's compensated sum over the K products, else the exact
 * accumulator. Returns DL_ENONFINITE if a product is not finite (a NaN or
 * an infinity among the inputs). */
static int short_misses(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t K,
                        int64_t i, int64_t nb, int64_t n, dl_dtype_t t, float *o,
                        counts_t *cnt)
{
    for (int64_t j = next_nan(o, 0, nb); j < nb && n; j = next_nan(o, j + 1, nb)) {
        double sm = 0, cm = 0, wm = 0, r;
        for (int64_t k = 0; k < K; k++) { /* as in mid_stream */
            double p = (double)a[k * lda + i] * (double)b[k * ldb + j];
            if (!isfinite(p))
                return DL_ENONFINITE;
            double u = sm + p, z = u - sm;
            lo_add(&cm, &wm, (sm - (u - z)) + (p - z));
            sm = u;
        }
        if (mid_decide(sm, cm, wm, t, &r)) {
            o[j] = (float)r;
            cnt->middle++;
        } else {
            dl_acc_t acc;
            dl_acc_clear(&acc);
            for (int64_t k = 0; k < K; k++)
                dl_acc_add(&acc, (double)a[k * lda + i] * (double)b[k * ldb + j]);
            o[j] = (float)dl_acc_round(&acc, t);
            cnt->exact++;
        }
        n--;
    }
    return 0;
}

/* y[j] for j < jn (jn <= SHORT_JB): one row's sums against jn columns of
 * the converted operand (K rows of ld doubles). */
static inline __attribute__((always_inline)) void
short_sums(const double *ai, const double *bj, int64_t ld, int64_t K, int64_t jn, double *y)
{
#pragma omp simd
    for (int64_t j = 0; j < jn; j++)
        y[j] = ai[0] * bj[j];
    for (int64_t k = 1; k < K; k++) {
        const double *bk = bj + k * ld;
#pragma omp simd
        for (int64_t j = 0; j < jn; j++)
            y[j] += ai[k] * bk[j];
    }
}

/* short_sums for jn = SHORT_JB = 16 with the sums held in registers across
 * K (GCC vector types: AVX-512, AVX2 or scalar code, as the clone is; the
 * same IEEE operations in the same order). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi" /* static, inlined: no ABI crossed */
typedef double v8d_t __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) v8d_t ld8(const double *p)
{
    v8d_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void
short_sums16(const double *ai, const double *bj, int64_t ld, int64_t K, double *y)
{
    v8d_t y0 = ai[0] * ld8(bj), y1 = ai[0] * ld8(bj + 8);
    for (int64_t k = 1; k < K; k++) {
        const double *bk = bj + k * ld;
        y0 += ai[k] * ld8(bk);
        y1 += ai[k] * ld8(bk + 8);
    }
    memcpy(y, &y0, sizeof y0);
    memcpy(y + 8, &y1, sizeof y1);
}
#else
static inline void short_sums16(const double *ai, const double *bj, int64_t ld, int64_t K,
                                double *y)
{
    short_sums(ai, bj, ld, K, SHORT_JB, y);
}
#endif

/* Tier 1 on o[j] = the sums of one row against jn <= SHORT_JB columns,
 * within ga nbn[j] of the exact ones: the fast test alone, what it cannot
 * tell (NaN) goes to short_misses (a fallback to cert_one here would keep
 * the sums and count the misses per 16 columns: the count's horizontal sum
 * was a quarter of this loop's time). */
static inline __attribute__((always_inline)) void
short_block(const double *ai, const double *bj, int64_t ld, int64_t K, int64_t jn, double ga,
            const double *nbn, float *o, dl_dtype_t t)
{
    double y[SHORT_JB];
    if (jn == SHORT_JB)
        short_sums16(ai, bj, ld, K, y);
    else
        short_sums(ai, bj, ld, K, jn, y);
    double ga2 = ga * (1.0 + 0x1p-40); /* as in certify_row_t */
#pragma omp simd
    for (int64_t j = 0; j < jn; j++) /* misses (NaN) go to short_misses */
        o[j] = cert_fast(y[j], ga2 * nbn[j], t);
}

/* Row by row (so that the output is written in order), each row against
 * the blocks of SHORT_JB columns of the converted slice of b (K rows of
 * ldb doubles; ldb is not a multiple of a page, so that the K lines of a
 * block do not compete for one cache set). */
static inline __attribute__((always_inline)) void
short_rows_t(const tilebuf_t *tb, int64_t K, int64_t mb, int64_t nb, int64_t ldb, double g1,
             float *out, int64_t ldo, dl_dtype_t t)
{
    for (int64_t i = 0; i < mb; i++) {
        const double *ai = tb->ca + i * K;
        float *o = out + i * ldo;
        double ga = g1 * tb->na[i];
        int64_t j0 = 0;
        for (; j0 + SHORT_JB <= nb; j0 += SHORT_JB)
            short_block(ai, tb->cb + j0, ldb, K, SHORT_JB, ga, tb->nb + j0, o + j0, t);
        if (j0 < nb)
            short_block(ai, tb->cb + j0, ldb, K, nb - j0, ga, tb->nb + j0, o + j0, t);
    }
}

/* out[i*ldo + j] = the correctly rounded sum over k < K of
 * a[k*lda + i] b[k*ldb + j], for i < mb, j < nb (1 <= K <= SHORT_K): both
 * K-slices converted once, as a tile's chunk, and the products summed by
 * our own loop in place of dgemm (which at such K costs more in overhead
 * and in its binary64 output than in flops); the bound is tier 1's (the
 * plan's g1 for ks = K, one chunk). Returns DL_ENONFINITE if an input
 * taking part is NaN or infinite. */
DL__CLONES
static int short_tile(const part_t *pa, const part_t *pb, int64_t mb, int64_t nb, dl_dtype_t t,
                      tilebuf_t *tb, float *out, int64_t ldo, counts_t *cnt)
{
    int64_t K = pa->klen;
    plan_t pl;
    make_plan(&pl, t, K, 1);
    memset(tb->na, 0, (size_t)mb * sizeof(double));
    memset(tb->nb, 0, (size_t)nb * sizeof(double));
    for (int64_t k = 0; k < K; k++) { /* a's slice transposed: row i at ca + i K */
        const float *src = pa->p + k * pa->ld;
        for (int64_t i = 0; i < mb; i++) {
            double v = src[i];
            tb->ca[i * K + k] = v;
            tb->na[i] += v * v;
        }
    }
    int64_t ldb = nb + 8; /* (nb + 8) K <= nb kc doubles: checked by the caller */
    for (int64_t k = 0; k < K; k++) {
        const float *src = pb->p + k * pb->ld;
        double *d = tb->cb + k * ldb;
#pragma omp simd
        for (int64_t j = 0; j < nb; j++) {
            double v = src[j];
            d[j] = v;
            tb->nb[j] += v * v;
        }
    }
    if (finish_norms(tb->na, mb) | finish_norms(tb->nb, nb))
        return DL_ENONFINITE;
    if (t == DL_F32)
        short_rows_t(tb, K, mb, nb, ldb, pl.g1, out, ldo, DL_F32);
    else if (t == DL_BF16)
        short_rows_t(tb, K, mb, nb, ldb, pl.g1, out, ldo, DL_BF16);
    else
        short_rows_t(tb, K, mb, nb, ldb, pl.g1, out, ldo, DL_F16);
    for (int64_t i = 0; i < mb; i++) {
        float *o = out + i * ldo;
        int64_t miss = count_nan(o, nb);
        cnt->fast += nb - miss;
        if (miss)
            short_misses(pa->p, pa->ld, pb->p, pb->ld, K, i, nb, miss, t, o, cnt);
    }
    return 0;
}

/* ------------------------------------------------------ ragged-K GEMM */

typedef struct {
    const float *a, *b;
    int64_t I, J;
    const int64_t *offsets;
    const job_t *jobs; /* e, i0 (as r0), mb, j0 (as n0), nb; mb = 0: zero group */
    dl_dtype_t t;
    float *out;
} ragged_ctx_t;

static int ragged_job(const void *vctx, int64_t jx, scratch_t *s, counts_t *c)
{
    const ragged_ctx_t *g = vctx;
    const job_t *jb = &g->jobs[jx];
    int64_t I = g->I, J = g->J, m0 = g->offsets[jb->e], me = g->offsets[jb->e + 1] - m0;
    float *oe = g->out + jb->e * I * J;
    if (me == 0) { /* an empty group: exact zeros */
        memset(oe, 0, (size_t)(I * J) * sizeof(float));
        c->fast += I * J;
        return 0;
    }
    /* a_e^T and b_e^T are k-major as stored */
    operand_t A = {1, s->pa}, B = {1, s->pb};
    s->pa[0] = (part_t){g->a + m0 * I + jb->r0, I, 0, me, 1};
    s->pb[0] = (part_t){g->b + m0 * J + jb->n0, J, 0, me, 1};
    if (me <= SHORT_K && (jb->nb + 8) * me <= jb->nb * (tune_kc > 0 ? tune_kc : KC_DEFAULT))
        /* the padded slice fits the chunk buffer */
        return short_tile(&s->pa[0], &s->pb[0], jb->mb, jb->nb, g->t, &s->tb,
                          oe + jb->r0 * J + jb->n0, J, c);
    plan_t pl;
    make_plan(&pl, g->t, me, 1);
    return tile(&pl, jb->mb, jb->nb, &A, &B, &s->tb, oe + jb->r0 * J + jb->n0, J, c);
}

/* The jobs of a ragged-K GEMM: for each group, its I x J outputs in tiles
 * of sz[0] x sz[1] when the group has more than SHORT_SUM_CHUNKS kc rows,
 * else of sz[2] x sz[3] (short sums: smaller tiles, see tile_sizes); an
 * empty group is one job (mb = 0) that zeroes its outputs. NULL when out
 * of memory. */
static job_t *ragged_jobs(const int64_t *offsets, int64_t E, int64_t I, int64_t J, int64_t kc,
                          const int64_t *sz, int64_t *njobs)
{
    int64_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        job_t *jobs = pass ? malloc((size_t)n * sizeof(job_t)) : NULL;
        if (pass && !jobs)
            return NULL;
        n = 0;
        for (int64_t e = 0; e < E; e++) {
            int64_t me = offsets[e + 1] - offsets[e];
            int64_t lg = me > SHORT_SUM_CHUNKS * kc;
            int64_t MB = lg ? sz[0] : sz[2], NB = lg ? sz[1] : sz[3];
            if (me == 0) {
                if (pass)
                    jobs[n] = (job_t){e, 0, 0, 0, 0};
                n++;
                continue;
            }
            for (int64_t i0 = 0; i0 < I; i0 += MB)
                for (int64_t j0 = 0; j0 < J; j0 += NB, n++)
                    if (pass)
                        jobs[n] = (job_t){e, i0, I - i0 < MB ? I - i0 : MB, j0,
                                          J - j0 < NB ? J - j0 : NB};
        }
        if (pass) {
            *njobs = n;
            return jobs;
        }
    }
    return NULL;
}

int dl_gemm_ragged_k(const float *a, int64_t I, const float *b, int64_t J,
                     const int64_t *offsets, int64_t E, dl_dtype_t out_t,
                     float *out, dl_tier_stats_t *stats)
{
    int64_t io;
    int rc = dl__gemm_check_ragged(a, I, b, J, offsets, E, out, &io);
    if (rc)
        return rc;
    if (out_t != DL_F32 && out_t != DL_BF16 && out_t != DL_F16)
        return DL_EDTYPE;
    if (I == 0 || J == 0)
        return 0;
    int64_t budget = budget_for(io), maxme = 0;
    for (int64_t e = 0; e < E; e++)
        if (offsets[e + 1] - offsets[e] > maxme)
            maxme = offsets[e + 1] - offsets[e];
    if (maxme > KS_MAX) {
        rc = dl_gemm_ragged_k_ref(a, I, b, J, offsets, E, out_t, out);
        if (stats && rc == 0)
            stats->exact += E * I * J;
        return rc;
    }
    plan_t pl;
    make_plan(&pl, out_t, maxme > 0 ? maxme : 1, 1);
    int nthr = max_threads();
    int64_t sz[4], njobs; /* MB, NB for the longest group; for short sums */
    tile_sizes(budget, nthr, E * I * J, pl.kc, pl.ks, I, J, &sz[0], &sz[1]);
    tile_sizes(budget, nthr, E * I * J, pl.kc, 1, I, J, &sz[2], &sz[3]);
    job_t *jobs = ragged_jobs(offsets, E, I, J, pl.kc, sz, &njobs);
    if (!jobs)
        return DL_ENOMEM;
    if (nthr > njobs)
        nthr = (int)njobs;
    scratch_t *scr = scratch_alloc_all(nthr, sz[0] > sz[2] ? sz[0] : sz[2],
                                       sz[1] > sz[3] ? sz[1] : sz[3], pl.kc,
                                       maxme > 0 ? maxme : 1, 1);
    if (!scr) {
        free(jobs);
        return DL_ENOMEM;
    }
    ragged_ctx_t ctx = {a, b, I, J, offsets, jobs, out_t, out};
    counts_t cnt = {0, 0, 0};
    rc = run_jobs(&ctx, ragged_job, njobs, scr, nthr, &cnt);
    scratch_free_all(scr, nthr);
    free(jobs);
    if (!rc)
        add_counts(stats, &cnt);
    return rc;
}
