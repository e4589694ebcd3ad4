/* stages_priv.h: internals of the stages (src/stages/) shared between
 * stage files and with the layers above; not installed. */
#ifndef DL_STAGES_PRIV_H
#define DL_STAGES_PRIV_H

#include "core/core_priv.h"
#include "dropless/route.h"
#include "dropless/dispatch.h"
#include "dropless/gemm.h"
#include "dropless/moe.h"

/* top_k beyond this is not a MoE router; it bounds per-token stack buffers */
#define DL__MAX_TOPK 1024

/* 0 if offsets is a valid [E+1] exclusive prefix sum (starts at 0, never
 * decreases), else DL_EINVAL. */
int dl__gemm_check_offsets(const int64_t *offsets, int64_t E);

/* Argument checks shared by the grouped GEMMs and their references: 0 or
 * DL_EINVAL / DL_EOVERFLOW. On success *ks_out (if not NULL) is the summed K
 * of all terms and *io_out the bytes of inputs plus outputs (as floats). */
int dl__gemm_check_grouped(const dl_gemm_term_t *terms, int nterms, int64_t N,
                           const int64_t *offsets, int64_t E, const float *out,
                           int64_t *ks_out, int64_t *io_out);
int dl__gemm_check_ragged(const float *a, int64_t I, const float *b, int64_t J,
                          const int64_t *offsets, int64_t E, const float *out,
                          int64_t *io_out);
/* The combine's backward over the sorted rows [r0, r1): d_y[p - r0, :] =
 * RN_t(w[fl] d_out[fl / k, :]) for the assignment fl at p = inv_perm[fl],
 * and, if d_w is not NULL (it needs every row of y_sorted),
 * d_w[fl] = RN_fp32(<d_out[fl / k], y_sorted[p]>). inv_perm must be a
 * valid permutation of [0, T*k). 0 or DL_ENONFINITE. */
int dl__combine_backward(const float *y_sorted, const float *w, const int32_t *inv_perm,
                         const float *d_out, int64_t T, int64_t k, int64_t d, dl_dtype_t t,
                         int64_t r0, int64_t r1, float *d_w, float *d_y);
/* Tuning of the fast GEMM path, for tests and benchmarks (not thread-safe):
 * kc = dgemm chunk length along K, budget = scratch bytes; 0 = default. */
void dl__gemm_set_tuning(int64_t kc, int64_t budget_bytes);

#endif
