/* dropless/shared.h: shared experts, the dense experts every token passes
 * through beside the routed ones (DeepSeek-V2/V3: S always-on experts added
 * unscaled; Qwen2-MoE: one expert scaled by sigmoid(x w_sg)). The S experts
 * of width f_s are one SwiGLU MLP of width F = S*f_s, their weights
 * concatenated along the intermediate dimension: each value below is an
 * exact sum rounded once, so summing S expert outputs and the concatenated
 * MLP's one output are the same real number, rounded the same way
 * (doc/reference_layer.md). Their GEMMs are the grouped GEMM with one group
 * of all T tokens (dl_gemm_grouped, dl_gemm_ragged_k); the SwiGLU is
 * dl_swiglu and its VJP dl_swiglu_backward. Part of the public API; include
 * <dropless.h>. */
#ifndef DROPLESS_SHARED_H
#define DROPLESS_SHARED_H
#include "core.h"
#ifdef __cplusplus
extern "C" {
#endif

/* gate[t] = RN_fp32(sigmoid(logit[t])) for T logits (certified, MPFR when
 * undecided). Errors: DL_EINVAL (T < 0, NULL arrays with T > 0),
 * DL_ENONFINITE (a non-finite logit), DL_EINTERNAL. */
DL_EXTERN int dl_shared_gate(const float *logit, int64_t T, float *gate);

/* The combine's gradients into the shared path, per token t, for d_out
 * [T,d] and shared_y [T,d] (the dtype t) and gate [T] (fp32, NULL: no gate,
 * the shared output added unscaled):
 *   d_shared_y[t,i] = RN_t(gate[t] d_out[t,i])  (d_out itself without gate)
 *   d_gate[t]       = RN_fp32(sum_i d_out[t,i] shared_y[t,i])  (gate only)
 * d_gate or d_shared_y may be NULL (not computed). Errors: DL_EINVAL, DL_ENONFINITE. */
DL_EXTERN int dl_shared_combine_backward(const float *d_out, const float *shared_y,
                                         const float *gate, int64_t T, int64_t d, dl_dtype_t t,
                                         float *d_gate, float *d_shared_y);

/* The sigmoid gate's VJP at the stored gate g = gate[t]:
 *   d_logit[t] = RN_fp32(d_gate[t] g (1 - g))  (exact, rounded once).
 * Errors: DL_EINVAL, DL_ENONFINITE. */
DL_EXTERN int dl_shared_gate_backward(const float *d_gate, const float *gate, int64_t T,
                                      float *d_logit);

/* The shared path's terms of the layer's input gradient (d_x), all of
 * token t's row: d_h_gate, d_h_up [T,F] (the dtype), w_gate, w_up [d,F]
 * (the dtype; d_h_gate and w_gate both NULL for a non-gated FFN, relu2),
 * and, with the gate, d_gate_logit [T] (fp32) and gate_weight [d] (the
 * dtype; both NULL without it). */
typedef struct {
    int64_t width; /* F = S*f_s */
    const float *d_h_gate, *d_h_up, *w_gate, *w_up;
    const float *d_gate_logit, *gate_weight;
} dl_shared_grad_t;

/* out[t,i] = RN_t( sum_j w[t,j] y_sorted[inv_perm[t*k+j], i]
 *                  + g_t shared_y[t,i] ), g_t = gate[t] (1 without gate:
 * gate NULL), the exact sum rounded once; shared_y NULL is dl_combine.
 * Errors: those of dl_combine. */
DL_EXTERN int dl_combine_shared(const float *y_sorted, const float *w, const int32_t *inv_perm,
                                const float *shared_y, const float *gate, int64_t T, int64_t k,
                                int64_t d, dl_dtype_t t, float *out);

/* dl_input_backward with the shared path's terms in the same exact sum,
 * rounded once:
 *   d_x[t,i] = RN_t( sum_j d_x_sorted[inv_perm[t*k+j], i] + sum_e d_logits[t,e] w_r[i,e]
 *                    + sum_c (d_h_gate[t,c] w_gate[i,c] + d_h_up[t,c] w_up[i,c])
 *                    + d_gate_logit[t] gate_weight[i] )
 * sh NULL (or sh->width 0) is dl_input_backward. Errors: those of
 * dl_input_backward, DL_EINVAL (sh's arrays NULL). */
DL_EXTERN int dl_input_backward_shared(const float *d_x_sorted, const int32_t *inv_perm,
                                       const float *d_logits, const float *w_r,
                                       const dl_shared_grad_t *sh, int64_t T, int64_t k,
                                       int64_t d, int64_t E, dl_dtype_t t, float *d_x);

#ifdef __cplusplus
}
#endif
#endif
