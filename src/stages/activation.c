/* SwiGLU forward and backward, each output correctly rounded to its type
 * (the certified kernels live in transc.c). */
#include "config.h"
#include <math.h>
#include "stages/stages_priv.h"

static int act_type_ok(dl_dtype_t t)
{
    return t == DL_F32 || t == DL_BF16 || t == DL_F16;
}

static int all_finite(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

int dl_swiglu(const float *g, const float *u, int64_t n, dl_dtype_t t, float *h)
{
    if (n < 0)
        return DL_EINVAL;
    if (!act_type_ok(t))
        return DL_EDTYPE;
    if (n == 0)
        return 0;
    if (!g || !u || !h)
        return DL_EINVAL;
    if (!all_finite(g, n) || !all_finite(u, n))
        return DL_ENONFINITE;
    int rc = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < n; i++) {
        double r = 0.0;
        int e = dl__silu_mul(g[i], u[i], t, &r);
        if (e) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            rc = e;
        }
        h[i] = (float)r;
    }
    return rc;
}

int dl_swiglu_backward(const float *g, const float *u, const float *dh,
                       int64_t n, dl_dtype_t t, float *d_g, float *d_u)
{
    if (n < 0)
        return DL_EINVAL;
    if (!act_type_ok(t))
        return DL_EDTYPE;
    if (n == 0 || (!d_g && !d_u))
        return 0;
    if (!g || !u || !dh)
        return DL_EINVAL;
    if (!all_finite(g, n) || !all_finite(u, n) || !all_finite(dh, n))
        return DL_ENONFINITE;
    int rc = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < n; i++) {
        /* read everything first so outputs may overwrite inputs */
        double gi = g[i], ui = u[i], dhi = dh[i], rg = 0.0, ru = 0.0;
        int e = 0;
        if (d_g)
            e = dl__dsilu_mul(gi, dhi * ui, t, &rg); /* the product is exact */
        if (d_u && !e)
            e = dl__silu_mul(gi, dhi, t, &ru);
        if (e) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            rc = e;
        }
        if (d_g)
            d_g[i] = (float)rg;
        if (d_u)
            d_u[i] = (float)ru;
    }
    return rc;
}
