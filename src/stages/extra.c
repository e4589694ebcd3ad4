/* The synthetic stage value of configure --enable-extra-value (y_half):
 * the build that shows a value is added through the tables alone. Compiled
 * into that build only. */
#include "config.h"
#include <math.h>
#include "stages/stages_priv.h"

int dl_extra_half(const float *y, int64_t n, dl_dtype_t t, float *out)
{
    if (n < 0 || (n > 0 && (!y || !out)) || (t != DL_F32 && t != DL_BF16 && t != DL_F16))
        return DL_EINVAL;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        bad |= !isfinite(y[i]);
        out[i] = (float)dl_round(0.5 * (double)y[i], t); /* the halving is exact in binary64 */
    }
    return bad ? DL_ENONFINITE : 0;
}

/* Its checking side (stages_priv.h): the exact value on the runner's
 * effective y_sorted, M = |y / 2| (one rounding, elementwise), and the
 * propagation of y_sorted's error: half of it. */
int dl__exact_y_half(const dl__vctx_t *v, float *out)
{
    return dl_extra_half(DL__EF(v, Y_SORTED), v->M * v->d, v->act, out);
}

int dl__mag_y_half(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    const float *y = DL__EF(v, Y_SORTED);
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    for (int64_t i = 0; i < n; i++)
        a[i] = fabs(0.5 * (double)y[i]);
    m->elem = 1;
    return 0;
}

int dl__prop_y_half(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *dy = DL__DL(v, Y_SORTED);
    for (int64_t i = 0; dy && i < n; i++)
        out[i] += 0.5 * dy[i];
    return dy != NULL;
}
