/* The shared experts' own stages (dropless/shared.h): the sigmoid gate,
 * the combine's gradients into the shared path and the gate's VJP. Their
 * GEMMs are the grouped GEMM over one group of all tokens and their SwiGLU
 * the routed experts' (schedule.c calls them); the combine and the input
 * gradient with the shared terms are dispatch.c's, in the same exact sums
 * as the routed terms. */
#include "config.h"
#include <math.h>
#include "stages/stages_priv.h"

int dl_shared_gate(const float *logit, int64_t T, float *gate)
{
    if (T < 0 || (T > 0 && (!logit || !gate)))
        return DL_EINVAL;
    int err = 0;
#pragma omp parallel for schedule(static) reduction(min : err)
    for (int64_t t = 0; t < T; t++) {
        double r = 0.0;
        int e = isfinite(logit[t]) ? dl__sigmoid(logit[t], DL_F32, &r) : DL_ENONFINITE;
        gate[t] = (float)r;
        err = e < err ? e : err;
    }
    return err;
}

int dl_shared_combine_backward(const float *d_out, const float *shared_y, const float *gate,
                               int64_t T, int64_t d, dl_dtype_t t, float *d_gate,
                               float *d_shared_y)
{
    if (T < 0 || d < 0 || (T > 0 && d > 0 && (!d_out || (d_gate && (!shared_y || !gate)))))
        return DL_EINVAL;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t tk = 0; tk < T; tk++) {
        const float *g = d_out + tk * d;
        if (gate && d_gate) /* <d_out[t], shared_y[t]>: the gate's gradient */
            d_gate[tk] = (float)dl__dot_cert(g, 1, shared_y + tk * d, 1, d, DL_F32, &bad);
        const double s = gate ? (double)gate[tk] : 1.0;
        for (int64_t i = 0; d_shared_y && i < d; i++) /* one product of floats: exact, rounded once */
            d_shared_y[tk * d + i] = (float)dl_round(s * (double)g[i], t);
    }
    return bad ? DL_ENONFINITE : 0;
}

int dl_shared_gate_backward(const float *d_gate, const float *gate, int64_t T, float *d_logit)
{
    if (T < 0 || (T > 0 && (!d_gate || !gate || !d_logit)))
        return DL_EINVAL;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t t = 0; t < T; t++) {
        /* dg g (1 - g) = dg g - (dg g) g; dg g is exact in binary64 (the
         * router's sigmoid VJP, route.c) */
        const double p = (double)d_gate[t] * (double)gate[t];
        if (!isfinite(p)) {
            bad = 1;
            continue;
        }
        dl_acc_t acc;
        dl_acc_clear(&acc);
        dl_acc_add(&acc, p);
        dl_acc_add_prod(&acc, -p, gate[t]);
        d_logit[t] = (float)dl_acc_round(&acc, DL_F32);
    }
    return bad ? DL_ENONFINITE : 0;
}
