/* The experts' forward on given sorted rows, stage by stage: what the
 * schedule's h_gate, h_up, h_act and y_sorted producers compute for the
 * layer, for a caller that needs a few rows (the runner's tie inference
 * evaluates one token under each plausible selection); and the expert
 * projection with its bias, which both use. */
#include "config.h"
#include <stdlib.h>
#include "stages/stages_priv.h"

int dl__expert_projection(const dl_moe_config_t *c, const float *lhs, int64_t K, const float *w,
                          const float *bias, int64_t N, int64_t rows, const int64_t *off,
                          int64_t E, float *out, dl_tier_stats_t *stats)
{
    if (!c->ffn_bias) {
        dl_gemm_term_t t = {lhs, K, w, DL_RHS_KN};
        return dl_gemm_grouped(&t, 1, N, off, E, c->dtype, out, stats);
    }
    float *ones = dl__ones(rows);
    if (!ones)
        return DL_ENOMEM;
    dl_gemm_term_t t[2] = {{lhs, K, w, DL_RHS_KN}, {ones, 1, bias, DL_RHS_KN}};
    int rc = dl_gemm_grouped(t, 2, N, off, E, c->dtype, out, stats);
    free(ones);
    return rc;
}

int dl__experts_forward_rows(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                             const float *xr, const int64_t *off, float *hg, float *hu,
                             float *y)
{
    const int64_t E = c->route.experts, d = c->hidden, f = c->ffn, m = off[E];
    int rc;
    if (c->ffn_kind == DL_FFN_RELU2) { /* non-gated: relu(x W_up)^2 W_down */
        if ((rc = dl__expert_projection(c, xr, d, in->w_up, NULL, f, m, off, E, hu, NULL)) ||
            (rc = dl_ffn_act(c, NULL, hu, m * f, hu)))
            return rc;
        return dl__expert_projection(c, hu, f, in->w_down, NULL, d, m, off, E, y, NULL);
    }
    if (DL_FFN_GATED(c->ffn_kind)) {
        if ((rc = dl__expert_projection(c, xr, d, in->w_gate, in->b_gate, f, m, off, E, hg,
                                        NULL)) ||
            (rc = dl__expert_projection(c, xr, d, in->w_up, in->b_up, f, m, off, E, hu, NULL)) ||
            (rc = dl_ffn_act(c, hg, hu, m * f, hg)))
            return rc;
        return dl__expert_projection(c, hg, f, in->w_down, in->b_down, d, m, off, E, y, NULL);
    }
    return dl__expert_projection(c, xr, d, in->w_down, NULL, d, m, off, E, y, NULL);
}
