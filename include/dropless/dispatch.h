/* dropless/dispatch.h: the token bookkeeping of a dropless layer: stable
 * argsort of assignments, group sizes and offsets, permute, combine.
 * Part of the public API; include <dropless.h>. */
#ifndef DROPLESS_DISPATCH_H
#define DROPLESS_DISPATCH_H
#include "core.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Stable counting sort of the T*k assignments by expert over the flat index
 * f = t*k + j: sort_perm[p] = f of the p-th assignment in sorted order;
 * inv_perm[f] = p (may be NULL); group_sizes[e] = number of assignments to
 * e; group_offsets = exclusive prefix sum of sizes, [E+1], offsets[E] = T*k.
 * O(T*k + E). ids is [T, k]. All outputs caller-owned.
 * Errors: DL_EINVAL, DL_ERANGE (an id outside [0, E)), DL_EOVERFLOW (T*k
 * beyond int32). */
DL_EXTERN int dl_sort_assignments(const int32_t *ids, int64_t T, int64_t k, int64_t E,
                                  int32_t *sort_perm, int32_t *inv_perm,
                                  int64_t *group_sizes, int64_t *group_offsets);

/* x_sorted[p, :] = x[sort_perm[p] / k, :] for p < T*k. x is [T, d],
 * x_sorted [T*k, d]. Errors: DL_EINVAL, DL_ERANGE. */
DL_EXTERN int dl_permute(const float *x, int64_t T, int64_t d, int64_t k,
                         const int32_t *sort_perm, float *x_sorted);

/* out[t, :] = RN_t( sum_j w[t, j] * y_sorted[inv_perm[t*k + j], :] ), the
 * exact weighted sum rounded once. out is [T, d].
 * Errors: DL_EINVAL, DL_ERANGE. */
DL_EXTERN int dl_combine(const float *y_sorted, const float *w, const int32_t *inv_perm,
                         int64_t T, int64_t k, int64_t d, dl_dtype_t t, float *out);

/* Gradient of dl_combine for the upstream gradient d_out [T, d]:
 *   d_w[t, j]                      = RN_f32( <d_out[t, :], y_sorted[p, :]> )
 *   d_y_sorted[p, :]               = RN_t( w[t, j] * d_out[t, :] )
 * with p = inv_perm[t*k + j]; each an exact value rounded once. Either
 * output may be NULL (not computed). Errors: DL_EINVAL, DL_ERANGE,
 * DL_ENONFINITE (a NaN or infinity in a dot product). */
DL_EXTERN int dl_combine_backward(const float *d_out, const float *y_sorted, const float *w,
                                  const int32_t *inv_perm, int64_t T, int64_t k, int64_t d,
                                  dl_dtype_t t, float *d_w, float *d_y_sorted);

/* Gradient of dl_permute (un-permute): d_x[t, :] = RN_t(sum_j d_x_sorted[inv_perm[t*k+j], :]). */
DL_EXTERN int dl_unpermute_sum(const float *d_x_sorted, const int32_t *inv_perm, int64_t T,
                               int64_t k, int64_t d, dl_dtype_t t, float *d_x);

/* The layer's whole input gradient, rounded once:
 *   d_x[t, i] = RN_t( sum_j d_x_sorted[inv_perm[t*k+j], i]
 *                     + sum_e d_logits[t, e] * w_r[i, e] )
 * the gradient through the experts (un-permuted) and through the router.
 * d_logits is [T, E] fp32, w_r [d, E]. Errors: DL_EINVAL, DL_ERANGE,
 * DL_ENOMEM, DL_ENONFINITE. */
DL_EXTERN int dl_input_backward(const float *d_x_sorted, const int32_t *inv_perm, const float *d_logits,
                                const float *w_r, int64_t T, int64_t k, int64_t d, int64_t E,
                                dl_dtype_t t, float *d_x);

#ifdef __cplusplus
}
#endif
#endif
