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
