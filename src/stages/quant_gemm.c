/* The block-scaled grouped GEMM: the exact sum of dequant(a) * dequant(b)
 * rounded once, computed by the grouped GEMM's exactness engine
 * (dl_gemm_grouped), not by a second one.
 *
 * A dequantized value v = code * scale is exact in binary64 (at most 2 + 4
 * + 24 significant bits: E2M1 times an E4M3 scale times an fp32 global
 * scale; E4M3 times an fp32 scale has 28). It is split into hi = RN_fp32(v)
 * and lo = v - hi, which is exact in binary64 and, having at most 7
 * significant bits at or above v's last bit, is a float whenever that last
 * bit is at least 2^-149 (checked, DL_ERANGE otherwise). Then
 *   sum_k a_k b_k = sum_k ah bh + ah bl + al bh + al bl
 * exactly, and dl_gemm_grouped takes the four products as terms of one sum
 * rounded once. Power-of-two scales (UE8M0, MX) leave lo = 0 and the
 * operand contributes one part, so an MX or UE8M0 GEMM is one term. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "stages/stages_priv.h"
#include "dropless/quant.h"
#include "stages/quant_priv.h"

/* Splits n values v into hi + lo (see the top), noting in *f bit 0 a NaN,
 * bit 1 a value that is no sum of two floats, bit 2 a nonzero lo. */
static inline void split_run(const double *v, int64_t n, float *hi, float *lo, unsigned *f)
{
    unsigned acc = 0;
    for (int64_t j = 0; j < n; j++) {
        float h = (float)v[j];
        double l = v[j] - (double)h;
        float lf = (float)l;
        hi[j] = h;
        lo[j] = lf;
        acc |= (unsigned)(v[j] != v[j]) | (unsigned)(!isfinite(h) || (double)lf != l) << 1 |
               (unsigned)(l != 0.0) << 2;
    }
    *f |= acc;
}

/* Dequantizes row i of m (codes through a table of their values, one
 * scale per block) into buf. */
static void dequant_row(const dl_qmat_t *m, const double *table, int64_t i, double *buf)
{
    const dl_qrule_t *r = m->rule;
    int64_t cols = m->cols;
    if (!r) {
        for (int64_t j = 0; j < cols; j++)
            buf[j] = ((const float *)m->s)[i * cols + j];
        return;
    }
    for (int64_t j0 = 0; j0 < cols; j0 += r->bc) {
        double s = dl_quant_scale(m, i / r->br, j0 / r->bc);
        int64_t j1 = j0 + r->bc < cols ? j0 + r->bc : cols;
        if (r->elem == DL_Q_E2M1)
            for (int64_t j = j0; j < j1; j++) {
                int64_t idx = i * cols + j;
                buf[j] = table[(m->q[idx / 2] >> (4 * (idx & 1))) & 0xf] * s;
            }
        else
            for (int64_t j = j0; j < j1; j++)
                buf[j] = table[m->q[i * cols + j]] * s;
    }
}

/* Dequantizes rows [r0, r1) of m into hi and lo (rows x cols, row-major);
 * sets *any_lo if a remainder is nonzero. 0, DL_ENONFINITE, DL_ERANGE or
 * DL_ENOMEM. */
static int split_rows(const dl_qmat_t *m, int64_t r0, int64_t r1, float *hi, float *lo,
                      int *any_lo)
{
    unsigned flags = 0;
    int nomem = 0;
    double table[256];
    for (unsigned c = 0; m->rule && c < (1u << dl_qfmt_bits(m->rule->elem)); c++)
        table[c] = dl_qdecode(c, m->rule->elem);
    /* rows are independent outputs; the reductions are of integer flags */
#pragma omp parallel reduction(| : flags, nomem) if ((r1 - r0) * m->cols > (1 << 16))
    {
        double *buf = malloc((size_t)(m->cols + 1) * sizeof(double));
        nomem |= !buf;
#pragma omp for schedule(static)
        for (int64_t i = r0; i < r1; i++)
            if (buf) {
                dequant_row(m, table, i, buf);
                split_run(buf, m->cols, hi + (i - r0) * m->cols, lo + (i - r0) * m->cols, &flags);
            }
        free(buf);
    }
    *any_lo |= (flags & 4) != 0;
    return nomem ? DL_ENOMEM : flags & 1 ? DL_ENONFINITE : flags & 2 ? DL_ERANGE : 0;
}

int dl__qmat_split(const dl_qmat_t *m, float *hi, float *lo, int *any_lo)
{
    return split_rows(m, 0, m->rows, hi, lo, any_lo);
}

static int check_args(const dl_qmat_t *a, const dl_qmat_t *b, int64_t E, const int64_t *offsets,
                      const float *out)
{
    if (!a || !b || !b->rule || (a->rule && !a->q) || !a->s || !b->q || !b->s || !offsets ||
        !out || E < 1)
        return DL_EINVAL;
    if ((a->rule && dl_quant_rule_check(a->rule, a->cols)) || dl_quant_rule_check(b->rule, b->cols))
        return DL_EINVAL;
    int rc = dl__gemm_check_offsets(offsets, E);
    if (rc)
        return rc;
    if (a->cols != b->cols || a->rows != offsets[E] || b->rows < 0)
        return DL_ESHAPE;
    return 0;
}

/* Dequantizes a and every expert of b that has rows. */
static int split_all(const dl_qmat_t *a, const dl_qmat_t *b, int64_t E, const int64_t *offsets,
                     float *ah, float *al, float *bh, float *bl, int *a_lo, int *b_lo)
{
    int rc = split_rows(a, 0, a->rows, ah, al, a_lo);
    int64_t qb = dl_quant_qbytes(b->rule, b->rows, b->cols);
    int64_t sb = dl_quant_sbytes(b->rule, b->rows, b->cols), NK = b->rows * b->cols;
    for (int64_t e = 0; e < E && !rc; e++) {
        if (offsets[e + 1] == offsets[e])
            continue; /* never read by the engine */
        dl_qmat_t be = *b;
        be.q = b->q + e * qb;
        be.s = (const uint8_t *)b->s + e * sb;
        rc = split_rows(&be, 0, b->rows, bh + e * NK, bl + e * NK, b_lo);
    }
    return rc;
}

int dl_gemm_block_scaled(const dl_qmat_t *a, const dl_qmat_t *b, int64_t E,
                         const int64_t *offsets, dl_dtype_t out_t, float *out,
                         dl_tier_stats_t *stats)
{
    int rc = check_args(a, b, E, offsets, out);
    if (rc)
        return rc;
    int64_t K = a->cols, N = b->rows, na, nb;
    if (dl_mul_size(a->rows, K, &na) || dl_mul_size(N, K, &nb) || dl_mul_size(E, nb, &nb))
        return DL_EOVERFLOW;
    float *ah = malloc((size_t)(na ? na : 1) * sizeof(float));
    float *al = malloc((size_t)(na ? na : 1) * sizeof(float));
    float *bh = calloc((size_t)(nb ? nb : 1), sizeof(float));
    float *bl = calloc((size_t)(nb ? nb : 1), sizeof(float));
    if (!ah || !al || !bh || !bl) {
        rc = DL_ENOMEM;
        goto done;
    }
    int a_lo = 0, b_lo = 0;
    rc = split_all(a, b, E, offsets, ah, al, bh, bl, &a_lo, &b_lo);
    if (rc)
        goto done;
    dl_gemm_term_t t[4];
    int nt = 0;
    t[nt++] = (dl_gemm_term_t){ah, K, bh, DL_RHS_NK};
    if (b_lo)
        t[nt++] = (dl_gemm_term_t){ah, K, bl, DL_RHS_NK};
    if (a_lo)
        t[nt++] = (dl_gemm_term_t){al, K, bh, DL_RHS_NK};
    if (a_lo && b_lo)
        t[nt++] = (dl_gemm_term_t){al, K, bl, DL_RHS_NK};
    rc = dl_gemm_grouped(t, nt, N, offsets, E, out_t, out, stats);
done:
    free(ah);
    free(al);
    free(bh);
    free(bl);
    return rc;
}
