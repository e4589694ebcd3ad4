/* Internal pieces of the low-precision stages (quant_gemm.c, quant_layer.c). */
#ifndef DL_STAGES_QUANT_PRIV_H
#define DL_STAGES_QUANT_PRIV_H
#include "dropless/quant.h"
#include "dropless/schedule.h"

#define DL__QPAIRS_MAX 2

/* The sum of np block-scaled products a[p] b[p]^T (each as in
 * dl_gemm_block_scaled, every b[p] with the same rows N) rounded once:
 * all the pairs' terms in one call of the exactness engine. Errors: as
 * dl_gemm_block_scaled; DL_EINVAL (np outside [1, DL__QPAIRS_MAX]). */
int dl__gemm_block_scaled_pairs(const dl_qmat_t *a, const dl_qmat_t *b, int np,
                                          int64_t E, const int64_t *offsets, dl_dtype_t out_t,
                                          float *out, dl_tier_stats_t *stats);

/* A layer recipe's expert GEMM on a producer's window (schedule.c): for each
 * expert of the window, out_e = RN( sum_p Q_x(a_p,e) Q_w(W_p,e)^T ) with the
 * row's recipes (kind DL__LOWP_FWD_X, the gate/up input, and DL__LOWP_DGRAD, an
 * activation gradient, under the row's x recipe; DL__LOWP_FWD_H, the down
 * projection's input, under h), W_p,e taken [N, K] from rhs_p's layout. Errors: those of dl_quantize
 * and dl__gemm_block_scaled_pairs, DL_ENOMEM. */
typedef struct {
    const float *a;   /* [rows, K] window rows */
    const float *w;   /* the window's experts' weights, rhs layout lay */
    dl_rhs_layout_t lay;
} dl__lowp_pair_t;
int dl__lowp_gemm(const dl_stage_view_t *v, int kind, const dl__lowp_pair_t *p, int np,
                            int64_t K, int64_t N, float *out);

/* The GEMMs a layer recipe may quantize, and whether c's recipe does. */
enum { DL__LOWP_FWD_X = 0, DL__LOWP_FWD_H = 1, DL__LOWP_DGRAD = 2 };
int dl__lowp_applies(const dl_moe_config_t *c, int kind);

/* 0 when c's layer recipe is none, or known and applicable to its shapes
 * (FP4 needs even hidden and ffn), else DL_EINVAL. */
int dl__lowp_config_check(const dl_moe_config_t *c);
#endif
