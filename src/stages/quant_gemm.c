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

/* Splits v into hi + lo (see the top); 0, DL_ENONFINITE or DL_ERANGE. */
static inline int split_one(double v, float *hi, float *lo, int *any_lo)
{
    float h = (float)v;
    double l = v - (double)h;
    *hi = h;
    *lo = (float)l;
    *any_lo |= l != 0.0;
    if (isnan(v))
        return DL_ENONFINITE;
    return !isfinite(h) || (double)*lo != l ? DL_ERANGE : 0;
}

/* Dequantizes rows [r0, r1) of m into hi and lo (rows x cols, row-major):
 * the codes through a table of their values, one scale per block; sets
 * *any_lo if a remainder is nonzero. */
static int split_rows(const dl_qmat_t *m, int64_t r0, int64_t r1, float *hi, float *lo,
                      int *any_lo)
{
    int bad = 0, any = 0;
    const dl_qrule_t *r = m->rule;
    double table[256];
    for (unsigned c = 0; r && c < (1u << dl_qfmt_bits(r->elem)); c++)
        table[c] = dl_qdecode(c, r->elem);
    int64_t bc = r ? r->bc : m->cols;
    /* rows are independent outputs; the reductions are of integer flags */
#pragma omp parallel for schedule(static) reduction(| : any) reduction(min : bad) if ((r1 - r0) * m->cols > (1 << 16))
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j0 = 0; j0 < m->cols; j0 += bc) {
            double s = r ? dl_quant_scale(m, i / r->br, j0 / bc) : 1.0;
            for (int64_t j = j0; j < j0 + bc && j < m->cols; j++) {
                int64_t at = (i - r0) * m->cols + j, idx = i * m->cols + j;
                double v = !r ? ((const float *)m->s)[idx]
                           : r->elem == DL_Q_E2M1 ? table[(m->q[idx / 2] >> (4 * (idx & 1))) & 0xf] * s
                                                  : table[m->q[idx]] * s;
                int rc = split_one(v, &hi[at], &lo[at], &any);
                bad = rc < bad ? rc : bad; /* the most negative code: the same for any threads */
            }
        }
    *any_lo |= any;
    return bad;
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
