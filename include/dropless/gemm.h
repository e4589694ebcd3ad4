/* dropless/gemm.h: exact grouped GEMM over a flat ragged token array.
 * Part of the public API; include <dropless.h>. */
#ifndef DROPLESS_GEMM_H
#define DROPLESS_GEMM_H
#include "core.h"
#ifdef __cplusplus
extern "C" {
#endif

/* How each expert's right-hand matrix is laid out in memory. */
typedef enum {
    DL_RHS_KN = 0, /* rhs[e] is [K, N], row-major: out = lhs . rhs[e] */
    DL_RHS_NK = 1  /* rhs[e] is [N, K], row-major: out = lhs . rhs[e]^T */
} dl_rhs_layout_t;

/* How many output elements each tier of the exactness engine decided:
 * fast = certified from the binary64 BLAS product (also the exact zeros of
 * empty sums), middle = decided from a compensated (double-double) dot
 * product in fixed order, either certified or proven exact and rounded,
 * exact = the exact accumulator. Which tier decides an element may vary with
 * threads and BLAS kernels; the bits never do. Counters add up across calls;
 * zero the struct to reset. */
typedef struct {
    int64_t fast, middle, exact;
} dl_tier_stats_t;

/* One product term lhs . op(rhs[e]) of a grouped GEMM. lhs is [M_total, K]
 * row-major (rows sorted by group); rhs is [E, K, N] (DL_RHS_KN) or
 * [E, N, K] (DL_RHS_NK), row-major. */
typedef struct {
    const float *lhs;
    int64_t K;
    const float *rhs;
    dl_rhs_layout_t layout;
} dl_gemm_term_t;

/* Grouped GEMM: for each group e and each row m in [offsets[e], offsets[e+1]),
 *   out[m, n] = RN_out_t( sum over terms of sum_k lhs[m,k] * op(rhs[e])[k,n] )
 * the exact sum of all terms rounded once. offsets is [E+1], non-decreasing,
 * offsets[0] = 0, M_total = offsets[E]. Inputs may hold any float values
 * (fp32, bf16 or fp16 grids); out is [M_total, N], caller-owned, fully
 * written. Same bits for any thread count. stats may be NULL.
 * Errors: DL_EINVAL (NULL pointers, nterms < 1, negative sizes, an unknown
 * layout, offsets not starting at 0 or decreasing, E < 1), DL_EOVERFLOW (a
 * size product beyond int64), DL_EDTYPE (out_t not fp32, bf16 or fp16),
 * DL_ENOMEM, DL_ENONFINITE (a NaN/Inf in an input that takes part: a lhs row
 * of some group, or the rhs of a group with rows; the output is then
 * unspecified). Scratch memory is bounded: about max(4 MiB, a quarter of
 * the bytes of inputs plus outputs), at most 128 MiB (plus a few rows of K
 * per thread); rhs of empty groups is never read. */
DL_EXTERN int dl_gemm_grouped(const dl_gemm_term_t *terms, int nterms, int64_t N,
                              const int64_t *offsets, int64_t E, dl_dtype_t out_t,
                              float *out, dl_tier_stats_t *stats);

/* The reference: every element through the exact accumulator, in a plain
 * loop. Same contract and same bits as dl_gemm_grouped. */
DL_EXTERN int dl_gemm_grouped_ref(const dl_gemm_term_t *terms, int nterms, int64_t N,
                                  const int64_t *offsets, int64_t E, dl_dtype_t out_t,
                                  float *out);

/* Ragged-K GEMM (weight gradients): for each group e,
 *   out[e, i, j] = RN_out_t( sum_{m in group e} a[m, i] * b[m, j] )
 * a is [M_total, ni], b is [M_total, nj] (row-major, rows sorted by group),
 * out is [E, ni, nj], caller-owned, fully written; an empty group gives exact
 * zeros. Errors as dl_gemm_grouped. */
DL_EXTERN int dl_gemm_ragged_k(const float *a, int64_t ni, const float *b, int64_t nj,
                               const int64_t *offsets, int64_t E, dl_dtype_t out_t,
                               float *out, dl_tier_stats_t *stats);

/* The reference for dl_gemm_ragged_k. */
DL_EXTERN int dl_gemm_ragged_k_ref(const float *a, int64_t ni, const float *b, int64_t nj,
                                   const int64_t *offsets, int64_t E, dl_dtype_t out_t,
                                   float *out);

#ifdef __cplusplus
}
#endif
#endif
