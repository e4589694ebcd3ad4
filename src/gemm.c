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
 * roundings. So the exact value lies within y +- g1*na*nb, and certify()
 * decides whether that whole interval rounds to one value of out_t.
 *
 * Chunking matters: gamma_K for K = 14336 would leave ~1% of fp32 outputs
 * uncertified; gamma_{kc+nc} with kc = 256 cuts that by ~50x, for the price
 * of one extra pass over the tile per chunk.
 *
 * The middle tier is a compensated dot product (TwoSum in 8 fixed lanes),
 * certified with |y - S| <= u|y| + 2 (K+8)^2 u^2 sum|p| (see dot2()). The last
 * tier is the exact accumulator. Bits never depend on which tier decided an
 * element, so they do not depend on threads, alignment or the BLAS kernel.
 *
 * Memory: inputs are converted to binary64 in bounded panels (a row block of
 * the left operand and a column panel of the right one, each over the full
 * K), within a scratch budget of at most a quarter of the input+output bytes
 * (capped at 128 MiB, at least 4 MiB). */
#include "config.h"
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#undef I /* <complex.h> via cblas.h; the GEMMs name a dimension I */
#ifdef _OPENMP
#include <omp.h>
#endif
#include "internal.h"

#define KC_DEFAULT 256
#define BUDGET_MAX (INT64_C(128) << 20)
#define BUDGET_MIN (INT64_C(4) << 20)
#define CERT_BLOCK 512 /* columns per unit of work in the certification pass */

static int64_t tune_kc = 0, tune_budget = 0;

void dl__gemm_set_tuning(int64_t kc, int64_t budget_bytes)
{
    tune_kc = kc > 0 ? kc : 0;
    tune_budget = budget_bytes > 0 ? budget_bytes : 0;
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

/* Compensated dot product of two binary64 vectors holding floats (so each
 * product is exact): 8 lanes of TwoSum, lanes folded by TwoSum in a fixed
 * order; the low parts are summed with rounding. Then S = hi + (exact sum of
 * all TwoSum errors e) and the only error is in summing the e's: a tree of
 * at most K+7 additions over values with sum|e| <= u sum|t|, where the t are
 * the TwoSum outputs, each |t| <= (1+u)^(K+7) sum|p|, at most K+7 of them.
 * Hence |lo - sum e| <= gamma_{K+7} (K+7) u (1+u)^(K+7) sum|p|, and with the
 * final rounding y = fl(hi + lo):
 *   |y - S| <= u|y| + 2 (K+8)^2 u^2 q     when (K+8) u <= 2^-20,
 * q being the computed sum|p| (within gamma_K of the true one). */
static double dot2(const double *a, const double *b, int64_t n, double *q_out)
{
    double s[8] = {0}, c[8] = {0}, q[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        for (int l = 0; l < 8; l++) {
            double p = a[k + l] * b[k + l];
            double t = s[l] + p;
            double z = t - s[l];
            c[l] += (s[l] - (t - z)) + (p - z);
            s[l] = t;
            q[l] += fabs(p);
        }
    }
    for (int l = 0; k < n; k++, l++) {
        double p = a[k] * b[k];
        double t = s[l] + p;
        double z = t - s[l];
        c[l] += (s[l] - (t - z)) + (p - z);
        s[l] = t;
        q[l] += fabs(p);
    }
    double hi = s[0], lo = c[0], qs = q[0];
    for (int l = 1; l < 8; l++) {
        double t = hi + s[l];
        double z = t - hi;
        lo += (hi - (t - z)) + (s[l] - z);
        hi = t;
        lo += c[l];
        qs += q[l];
    }
    *q_out = qs;
    return hi + lo;
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
    int64_t ks;   /* dot-product length */
    int64_t kc;   /* dgemm chunk along K */
    double g1;    /* tier 1: err = g1 * na * nb */
    double g2;    /* tier 2: err = 2^-52 |y| + g2 * q */
    int tier1, tier2;
} plan_t;

typedef struct {
    int64_t fast, middle, exact;
} counts_t;

static int64_t chunk_len(void)
{
    return tune_kc > 0 ? tune_kc : KC_DEFAULT;
}

static void make_plan(plan_t *pl, dl_dtype_t t, int64_t ks)
{
    pl->t = t;
    pl->ks = ks;
    pl->kc = chunk_len();
    int64_t nc = (ks + pl->kc - 1) / pl->kc;
    int64_t h = (ks < pl->kc ? ks : pl->kc) + nc;
    /* tier 1 needs h*u and (K+16)*u small for the slack factors to hold */
    pl->tier1 = ks <= (INT64_C(1) << 30) && ks <= INT_MAX;
    pl->tier2 = ks <= (INT64_C(1) << 30);
    double hu = (double)h * 0x1p-53;
    double gam = hu / (1.0 - hu);
    /* norms: sum of squares within gamma_K, sqrt within u, two products
     * within u each; the 2^-40 covers the roundings in this line */
    double slack = 1.0 + (4.0 * (double)(ks + 16)) * 0x1p-53 + 0x1p-40;
    pl->g1 = gam * slack;
    double kk = (double)(ks + 8);
    pl->g2 = 2.0 * kk * kk * 0x1p-106;
}

/* ------------------------------------------------------------ conversions */

/* dst[r*ldd + c] = src[r*lds + c] */
static void conv_rows(double *dst, int64_t ldd, const float *src, int64_t lds,
                      int64_t rows, int64_t cols)
{
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * lds;
        double *d = dst + r * ldd;
        for (int64_t c = 0; c < cols; c++)
            d[c] = s[c];
    }
}

/* dst[c*ldd + r] = src[r*lds + c], blocked so both sides stream. */
static void conv_trans(double *dst, int64_t ldd, const float *src, int64_t lds,
                       int64_t rows, int64_t cols)
{
    const int64_t B = 32;
    int64_t ncb = (cols + B - 1) / B;
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
    for (int64_t cb = 0; cb < ncb; cb++) {
        int64_t c0 = cb * B, c1 = c0 + B < cols ? c0 + B : cols;
        for (int64_t r0 = 0; r0 < rows; r0 += B) {
            int64_t r1 = r0 + B < rows ? r0 + B : rows;
            for (int64_t c = c0; c < c1; c++) {
                double *d = dst + c * ldd;
                for (int64_t r = r0; r < r1; r++)
                    d[r] = src[r * lds + c];
            }
        }
    }
}

/* nrm[r] = ||row r||_2 of a rows x len panel; returns 1 if any is not
 * finite (a squared float cannot overflow binary64, so only a NaN or an
 * infinity in the row does that). */
static int row_norms(const double *x, int64_t rows, int64_t len, double *nrm)
{
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (rows * len > 32768)
    for (int64_t r = 0; r < rows; r++) {
        const double *v = x + r * len;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t k = 0;
        for (; k + 4 <= len; k += 4) {
            s0 += v[k] * v[k];
            s1 += v[k + 1] * v[k + 1];
            s2 += v[k + 2] * v[k + 2];
            s3 += v[k + 3] * v[k + 3];
        }
        for (; k < len; k++)
            s0 += v[k] * v[k];
        double s = (s0 + s1) + (s2 + s3);
        nrm[r] = sqrt(s);
        bad |= !isfinite(s);
    }
    return bad;
}

/* ------------------------------------------------------------- the tile */

/* out[i*ldo + j] for i < mb, j < nb: the correctly rounded value of
 * A[i,:] . B[j,:] (A is mb x ks, B is nb x ks, both row-major binary64
 * holding floats; na, nb2 their row norms). C and P are mb x nb scratch. */
static void tile(const plan_t *pl, int64_t mb, int64_t nb, const double *A,
                 const double *na, const double *B, const double *nbn, double *C,
                 double *P, float *out, int64_t ldo, counts_t *cnt)
{
    int64_t ks = pl->ks;
    int64_t nfast = 0, nmid = 0, nexact = 0;
    if (pl->tier1) {
        for (int64_t k0 = 0; k0 < ks; k0 += pl->kc) {
            int64_t kl = ks - k0 < pl->kc ? ks - k0 : pl->kc;
            double *dst = k0 == 0 ? C : P;
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)mb, (int)nb,
                        (int)kl, 1.0, A + k0, (int)ks, B + k0, (int)ks, 0.0, dst,
                        (int)nb);
            if (k0 > 0) {
                int64_t total = mb * nb;
#pragma omp parallel for schedule(static) if (total > 65536)
                for (int64_t i = 0; i < total; i++)
                    C[i] += P[i];
            }
        }
    }
    int64_t ncb = (nb + CERT_BLOCK - 1) / CERT_BLOCK;
    int64_t units = mb * ncb;
    dl_dtype_t t = pl->t;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : nfast, nmid, nexact)
    for (int64_t u = 0; u < units; u++) {
        int64_t i = u / ncb, j0 = (u % ncb) * CERT_BLOCK;
        int64_t j1 = j0 + CERT_BLOCK < nb ? j0 + CERT_BLOCK : nb;
        const double *a = A + i * ks;
        double ai = na[i];
        float *o = out + i * ldo;
        for (int64_t j = j0; j < j1; j++) {
            double r;
            if (pl->tier1 && certify(C[i * nb + j], pl->g1 * ai * nbn[j], t, &r)) {
                o[j] = (float)r;
                nfast++;
                continue;
            }
            const double *b = B + j * ks;
            if (pl->tier2) {
                double q, y = dot2(a, b, ks, &q);
                if (certify(y, ldexp(fabs(y), -52) + pl->g2 * q, t, &r)) {
                    o[j] = (float)r;
                    nmid++;
                    continue;
                }
            }
            o[j] = (float)dot_exact(a, b, ks, t);
            nexact++;
        }
    }
    cnt->fast += nfast;
    cnt->middle += nmid;
    cnt->exact += nexact;
}

/* ------------------------------------------------------------- scratch */

typedef struct {
    double *A, *B, *C, *P, *na, *nb;
} scratch_t;

static void scratch_free(scratch_t *s)
{
    free(s->A);
    free(s->B);
    free(s->C);
    free(s->P);
    free(s->na);
    free(s->nb);
}

static int scratch_alloc(scratch_t *s, int64_t mb, int64_t nb, int64_t ks)
{
    memset(s, 0, sizeof *s);
    s->A = malloc((size_t)(mb * ks) * sizeof(double));
    s->B = malloc((size_t)(nb * ks) * sizeof(double));
    s->C = calloc((size_t)(mb * nb), sizeof(double));
    s->P = calloc((size_t)(mb * nb), sizeof(double));
    s->na = malloc((size_t)mb * sizeof(double));
    s->nb = malloc((size_t)nb * sizeof(double));
    if (!s->A || !s->B || !s->C || !s->P || !s->na || !s->nb) {
        scratch_free(s);
        return DL_ENOMEM;
    }
    return 0;
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

/* Tile sizes for a rows x cols output over dots of length ks: a row block
 * of mb x ks, a column panel of nb x ks and two mb x nb tiles in budget. */
static void tile_sizes(int64_t budget, int64_t ks, int64_t rows, int64_t cols,
                       int64_t *mb, int64_t *nb)
{
    int64_t m = budget / 2 / (8 * ks);
    if (m < 8)
        m = 8;
    if (m > rows)
        m = rows;
    int64_t n = budget / 2 / (8 * ks + 16 * m);
    if (n < 8)
        n = 8;
    if (n > cols)
        n = cols;
    *mb = m;
    *nb = n;
}

/* ------------------------------------------------------- validation */

static int add_size(int64_t a, int64_t b, int64_t *r)
{
    if (a > INT64_MAX - b)
        return DL_EOVERFLOW;
    *r = a + b;
    return 0;
}

int dl__gemm_check_grouped(const dl_gemm_term_t *terms, int nterms, int64_t N,
                           const int64_t *offsets, int64_t E, const float *out,
                           int64_t *ks_out, int64_t *io_out)
{
    if (!terms || nterms < 1 || N < 0 || E < 1 || !offsets)
        return DL_EINVAL;
    int rc = dl__gemm_check_offsets(offsets, E);
    if (rc)
        return rc;
    int64_t M = offsets[E], ks = 0, io = 0, x;
    for (int t = 0; t < nterms; t++) {
        int64_t K = terms[t].K;
        if (K < 0 || (terms[t].layout != DL_RHS_KN && terms[t].layout != DL_RHS_NK))
            return DL_EINVAL;
        if ((rc = add_size(ks, K, &ks)))
            return rc;
        if ((rc = dl_mul_size(M, K, &x)) || (rc = add_size(io, x, &io)))
            return rc;
        if ((rc = dl_mul_size(E, K, &x)) || (rc = dl_mul_size(x, N, &x)) ||
            (rc = add_size(io, x, &io)))
            return rc;
        if (K > 0 && M > 0 && N > 0 && (!terms[t].lhs || !terms[t].rhs))
            return DL_EINVAL;
    }
    if ((rc = dl_mul_size(M, N, &x)) || (rc = add_size(io, x, &io)) ||
        (rc = dl_mul_size(io, 8, &x)))
        return rc;
    if (!out && M > 0 && N > 0)
        return DL_EINVAL;
    if (ks_out)
        *ks_out = ks;
    if (io_out)
        *io_out = io * 4;
    return 0;
}

int dl__gemm_check_ragged(const float *a, int64_t I, const float *b, int64_t J,
                          const int64_t *offsets, int64_t E, const float *out,
                          int64_t *io_out)
{
    if (I < 0 || J < 0 || E < 1 || !offsets)
        return DL_EINVAL;
    int rc = dl__gemm_check_offsets(offsets, E);
    if (rc)
        return rc;
    int64_t M = offsets[E], x, y, io;
    if ((rc = dl_mul_size(M, I, &x)) || (rc = dl_mul_size(M, J, &y)) ||
        (rc = add_size(x, y, &io)))
        return rc;
    if ((rc = dl_mul_size(E, I, &x)) || (rc = dl_mul_size(x, J, &x)) ||
        (rc = add_size(io, x, &io)) || (rc = dl_mul_size(io, 8, &x)))
        return rc;
    if ((!out && x > 0) || (M > 0 && ((!a && I > 0) || (!b && J > 0))))
        return DL_EINVAL;
    if (io_out)
        *io_out = io * 4;
    return 0;
}

/* --------------------------------------------------------- grouped GEMM */

/* Row block [r0, r0+mb) of the K-concatenation of all terms' lhs. */
static void load_lhs(const dl_gemm_term_t *terms, int nterms, int64_t ks, int64_t r0,
                     int64_t mb, double *A)
{
    int64_t koff = 0;
    for (int t = 0; t < nterms; t++) {
        int64_t K = terms[t].K;
        if (K > 0)
            conv_rows(A + koff, ks, terms[t].lhs + r0 * K, K, mb, K);
        koff += K;
    }
}

/* Column panel [n0, n0+nb) of op(rhs[e]) for all terms, stored transposed:
 * B[j, koff + k] = op(rhs_t[e])[k, n0 + j]. */
static void load_rhs(const dl_gemm_term_t *terms, int nterms, int64_t ks, int64_t N,
                     int64_t e, int64_t n0, int64_t nb, double *B)
{
    int64_t koff = 0;
    for (int t = 0; t < nterms; t++) {
        int64_t K = terms[t].K;
        if (K > 0) {
            const float *w = terms[t].rhs + e * K * N;
            if (terms[t].layout == DL_RHS_NK)
                conv_rows(B + koff, ks, w + n0 * K, K, nb, K);
            else
                conv_trans(B + koff, ks, w + n0, N, K, nb);
        }
        koff += K;
    }
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
    plan_t pl;
    make_plan(&pl, out_t, ks);
    if (!pl.tier1 || ks > INT_MAX) {
        rc = dl_gemm_grouped_ref(terms, nterms, N, offsets, E, out_t, out);
        if (stats && rc == 0)
            stats->exact += M * N;
        return rc;
    }
    int64_t budget = budget_for(io), maxme = 0;
    for (int64_t e = 0; e < E; e++)
        if (offsets[e + 1] - offsets[e] > maxme)
            maxme = offsets[e + 1] - offsets[e];
    int64_t MB, NB;
    tile_sizes(budget, ks, maxme, N, &MB, &NB);
    if (MB > INT_MAX || NB > INT_MAX)
        return DL_EOVERFLOW;
    scratch_t s;
    if ((rc = scratch_alloc(&s, MB, NB, ks)))
        return rc;
    counts_t cnt = {0, 0, 0};
    for (int64_t e = 0; e < E && !rc; e++) {
        int64_t m0 = offsets[e], me = offsets[e + 1] - m0;
        if (me == 0)
            continue;
        int64_t nrb = (me + MB - 1) / MB, npb = (N + NB - 1) / NB;
        /* convert whichever operand would be converted more often only once */
        int lhs_outer = (double)nrb * (double)N <= (double)npb * (double)me;
        int64_t n_outer = lhs_outer ? nrb : npb, n_inner = lhs_outer ? npb : nrb;
        for (int64_t xo = 0; xo < n_outer && !rc; xo++) {
            for (int64_t xi = 0; xi < n_inner && !rc; xi++) {
                int64_t rb = lhs_outer ? xo : xi, pb = lhs_outer ? xi : xo;
                int64_t r0 = m0 + rb * MB, mb = me - rb * MB < MB ? me - rb * MB : MB;
                int64_t n0 = pb * NB, nb = N - n0 < NB ? N - n0 : NB;
                if (xi == 0 || lhs_outer == 0) {
                    load_lhs(terms, nterms, ks, r0, mb, s.A);
                    if (row_norms(s.A, mb, ks, s.na))
                        rc = DL_ENONFINITE;
                }
                if (xi == 0 || lhs_outer == 1) {
                    load_rhs(terms, nterms, ks, N, e, n0, nb, s.B);
                    if (row_norms(s.B, nb, ks, s.nb))
                        rc = DL_ENONFINITE;
                }
                if (!rc)
                    tile(&pl, mb, nb, s.A, s.na, s.B, s.nb, s.C, s.P, out + r0 * N + n0,
                         N, &cnt);
            }
        }
    }
    scratch_free(&s);
    if (stats && !rc) {
        stats->fast += cnt.fast;
        stats->middle += cnt.middle;
        stats->exact += cnt.exact;
    }
    return rc;
}

/* ------------------------------------------------------ ragged-K GEMM */

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
    counts_t cnt = {0, 0, 0};
    if (maxme > (INT64_C(1) << 30) || maxme > INT_MAX) {
        rc = dl_gemm_ragged_k_ref(a, I, b, J, offsets, E, out_t, out);
        if (stats && rc == 0)
            stats->exact += E * I * J;
        return rc;
    }
    /* scratch sized for the largest group; smaller ones use part of it */
    int64_t MB = 0, NB = 0;
    if (maxme > 0)
        tile_sizes(budget, maxme, I, J, &MB, &NB);
    scratch_t s;
    memset(&s, 0, sizeof s);
    if (maxme > 0) {
        /* a smaller group may take taller/wider tiles within the same bytes */
        int64_t amax = 0, bmax = 0, cmax = 0;
        for (int64_t e = 0; e < E; e++) {
            int64_t me = offsets[e + 1] - offsets[e], mb, nb;
            if (me == 0)
                continue;
            tile_sizes(budget, me, I, J, &mb, &nb);
            if (mb * me > amax) amax = mb * me;
            if (nb * me > bmax) bmax = nb * me;
            if (mb * nb > cmax) cmax = mb * nb;
            if (mb > MB) MB = mb;
            if (nb > NB) NB = nb;
        }
        memset(&s, 0, sizeof s);
        s.A = malloc((size_t)amax * sizeof(double));
        s.B = malloc((size_t)bmax * sizeof(double));
        s.C = calloc((size_t)cmax, sizeof(double));
        s.P = calloc((size_t)cmax, sizeof(double));
        s.na = malloc((size_t)MB * sizeof(double));
        s.nb = malloc((size_t)NB * sizeof(double));
        if (!s.A || !s.B || !s.C || !s.P || !s.na || !s.nb) {
            scratch_free(&s);
            return DL_ENOMEM;
        }
    }
    for (int64_t e = 0; e < E && !rc; e++) {
        int64_t m0 = offsets[e], me = offsets[e + 1] - m0;
        float *oe = out + e * I * J;
        if (me == 0) {
            memset(oe, 0, (size_t)(I * J) * sizeof(float));
            cnt.fast += I * J;
            continue;
        }
        plan_t pl;
        make_plan(&pl, out_t, me);
        int64_t mbx, nbx;
        tile_sizes(budget, me, I, J, &mbx, &nbx);
        int64_t nrb = (I + mbx - 1) / mbx, npb = (J + nbx - 1) / nbx;
        int lhs_outer = (double)nrb * (double)J <= (double)npb * (double)I;
        int64_t n_outer = lhs_outer ? nrb : npb, n_inner = lhs_outer ? npb : nrb;
        for (int64_t xo = 0; xo < n_outer && !rc; xo++) {
            for (int64_t xi = 0; xi < n_inner && !rc; xi++) {
                int64_t rb = lhs_outer ? xo : xi, pb = lhs_outer ? xi : xo;
                int64_t i0 = rb * mbx, mb = I - i0 < mbx ? I - i0 : mbx;
                int64_t j0 = pb * nbx, nb = J - j0 < nbx ? J - j0 : nbx;
                if (xi == 0 || lhs_outer == 0) {
                    conv_trans(s.A, me, a + m0 * I + i0, I, me, mb);
                    if (row_norms(s.A, mb, me, s.na))
                        rc = DL_ENONFINITE;
                }
                if (xi == 0 || lhs_outer == 1) {
                    conv_trans(s.B, me, b + m0 * J + j0, J, me, nb);
                    if (row_norms(s.B, nb, me, s.nb))
                        rc = DL_ENONFINITE;
                }
                if (!rc)
                    tile(&pl, mb, nb, s.A, s.na, s.B, s.nb, s.C, s.P, oe + i0 * J + j0,
                         J, &cnt);
            }
        }
    }
    scratch_free(&s);
    if (stats && !rc) {
        stats->fast += cnt.fast;
        stats->middle += cnt.middle;
        stats->exact += cnt.exact;
    }
    return rc;
}
