/* The experts' forward on given sorted rows, stage by stage: what the
 * schedule's h_gate, h_up, h_act and y_sorted producers compute for the
 * layer, for a caller that needs a few rows (the runner's tie inference
 * evaluates one token under each plausible selection). */
#include "config.h"
#include "stages/stages_priv.h"

int dl__experts_forward_rows(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                             const float *xr, const int64_t *off, float *hg, float *hu,
                             float *y)
{
    const int64_t E = c->route.experts, d = c->hidden, f = c->ffn, m = off[E];
    const dl_dtype_t t = c->dtype;
    int rc;
    if (c->ffn_kind == DL_FFN_SWIGLU) {
        dl_gemm_term_t tg = {xr, d, in->w_gate, DL_RHS_KN};
        dl_gemm_term_t tu = {xr, d, in->w_up, DL_RHS_KN};
        if ((rc = dl_gemm_grouped(&tg, 1, f, off, E, t, hg, NULL)) ||
            (rc = dl_gemm_grouped(&tu, 1, f, off, E, t, hu, NULL)) ||
            (rc = dl_swiglu(hg, hu, m * f, t, hg)))
            return rc;
        dl_gemm_term_t td = {hg, f, in->w_down, DL_RHS_KN};
        return dl_gemm_grouped(&td, 1, d, off, E, t, y, NULL);
    }
    dl_gemm_term_t td = {xr, d, in->w_down, DL_RHS_KN};
    return dl_gemm_grouped(&td, 1, d, off, E, t, y, NULL);
}
