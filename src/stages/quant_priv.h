/* Internal pieces of the low-precision stages (quant_gemm.c, quant_layer.c). */
#ifndef DL_STAGES_QUANT_PRIV_H
#define DL_STAGES_QUANT_PRIV_H
#include "dropless/quant.h"
#include "dropless/schedule.h"

/* Dequantizes m into hi + lo (m->rows x m->cols floats each, row-major),
 * the exact split of dl_gemm_block_scaled; sets *any_lo when a remainder
 * is nonzero. 0, DL_ENONFINITE, DL_ERANGE or DL_ENOMEM. */
int dl__qmat_split(const dl_qmat_t *m, float *hi, float *lo, int *any_lo);

/* The GEMMs a layer recipe may quantize, and whether c's recipe does. */
enum { DL__LOWP_FWD_X = 0, DL__LOWP_FWD_H = 1, DL__LOWP_DGRAD = 2 };
int dl__lowp_applies(const dl_moe_config_t *c, int kind);

/* 0 when c's layer recipe is none, or known and applicable to its shapes
 * (FP4 needs even hidden and ffn), else DL_EINVAL. */
int dl__lowp_config_check(const dl_moe_config_t *c);

/* A layer recipe's expert GEMM on a producer's window (schedule.c):
 *   out_e = RN( sum_p Q_a(a_p,e) Q_w(W_p,e)^T )
 * for each expert e of the window, the sum over the np pairs exact and
 * rounded once to the case's dtype: a_p,e the expert's rows of a_p under
 * the row's x recipe (kinds DL__LOWP_FWD_X, the gate/up input, and
 * DL__LOWP_DGRAD, an activation gradient) or h (DL__LOWP_FWD_H, the down
 * projection's input), W_p,e the expert's weight taken [N, K] from w_p's
 * layout, under w; one dl_gemm_grouped call over the window's experts.
 * Errors: those of dl_quantize, dl__qmat_split and dl_gemm_grouped,
 * DL_EINVAL (np outside [1, DL__QPAIRS_MAX]), DL_ENOMEM. */
#define DL__QPAIRS_MAX 2
typedef struct {
    const float *a; /* [rows, K]: the window's rows */
    const float *w; /* the window's experts' weights, layout lay */
    dl_rhs_layout_t lay;
} dl__lowp_pair_t;
int dl__lowp_gemm(const dl_stage_view_t *v, int kind, const dl__lowp_pair_t *p, int np, int64_t K,
                  int64_t N, float *out);
#endif
