/* stages_priv.h: internals of the stages (src/stages/) shared between
 * stage files and with the layers above; not installed. */
#ifndef DL_STAGES_PRIV_H
#define DL_STAGES_PRIV_H

#include "core/core_priv.h"
#include "dropless/route.h"
#include "dropless/dispatch.h"
#include "dropless/gemm.h"
#include "dropless/moe.h"
#include "dropless/shared.h"
#include "dropless/values.h"
#include "dropless/schedule.h"

/* The position of each row in DL_VALUE_MAP (dl_layout_row's index):
 * DL__ROW_X, DL__ROW_ROUTER_LOGITS, ... (the schedule's read and write
 * sets are bits of these). */
#define DL__ROW_POS(g, E, n, st, dims, cond) DL__ROW_##E,
enum { DL_VALUE_MAP(DL__ROW_POS) DL__ROW_COUNT };
_Static_assert(DL__ROW_COUNT <= 64, "the schedule's row sets are 64-bit masks");

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
/* x_sorted rows [r0, r1) of dl_permute into out (row r0 first). sort_perm
 * is checked by the caller (dl_permute) or comes from dl_sort_assignments. */
int dl__permute_rows(const float *x, int64_t d, int64_t k, const int32_t *sort_perm, int64_t r0,
                     int64_t r1, float *out);
/* Bit tests of one float: 2 = NaN or infinity, 1 = finite but off the
 * grid of t, 0 = fine. The same verdicts as isfinite and dl_on_grid, on the
 * bits and branch-free so that the loop over a tensor vectorises (input
 * validation was a large share of the layer before). bf16 has fp32's
 * exponent range, so its grid is "the low 16 bits are zero"; fp16 normals
 * (2^-14 <= |v| <= 65504) keep 10 fraction bits, fp16 subnormals are the
 * multiples of 2^-24 below 2^-14. */
static inline int dl__float_verdict(uint32_t b, dl_dtype_t t)
{
    uint32_t a = b & 0x7fffffffu;
    int nonfinite = a >= 0x7f800000u;
    if (t == DL_F32)
        return nonfinite ? 2 : 0;
    if (t == DL_BF16)
        return nonfinite ? 2 : (b & 0xffffu) != 0;
    int e = (int)(a >> 23) - 127;
    uint32_t sub_mask = e < -14 && e >= -24 ? (UINT32_C(1) << (-1 - e)) - 1 : 0;
    int ok = a == 0 || (a <= 0x477fe000u && e >= -24 &&
                        (e >= -14 ? (a & 0x1fffu) == 0 : (a & sub_mask) == 0));
    return nonfinite ? 2 : !ok;
}

/* Tuning of the fast GEMM path, for tests and benchmarks (not thread-safe):
 * kc = dgemm chunk length along K, budget = scratch bytes; 0 = default. */
void dl__gemm_set_tuning(int64_t kc, int64_t budget_bytes);

/* The address of stage s's array pointer inside *f (forward values) or *b
 * (backward values); NULL for an unknown s or when that struct is NULL. */
void **dl__value_slot(dl_moe_forward_t *f, dl_moe_backward_t *b, dl_value_t s);
/* Allocates every array of *f (when not NULL) and of *b (when not NULL)
 * that exists for c, zero-filled, a zero-sized one as one element; 0 or
 * DL_ENOMEM (the arrays that were allocated stay, for the caller's free). */
int dl__moe_arrays_alloc(const dl_moe_config_t *c, dl_moe_forward_t *f, dl_moe_backward_t *b);
/* Allocates, zero-filled, the arrays of the stage values in the mask
 * (bit s for dl_value_t s) that live in *f or *b (either may be NULL); 0 or
 * DL_ENOMEM. */
int dl__values_alloc(const dl_moe_config_t *c, dl_moe_forward_t *f, dl_moe_backward_t *b,
                     uint64_t values);
/* Frees every array of *f and *b (either may be NULL) and sets it NULL. */
void dl__moe_arrays_free(dl_moe_forward_t *f, dl_moe_backward_t *b);

#endif
