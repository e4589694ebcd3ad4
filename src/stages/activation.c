/* The gated activations (SwiGLU, gpt-oss's clamped SwiGLU, GeGLU-tanh)
 * forward and backward, each output correctly rounded to its type
 * (the certified kernels live in transc.c). */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
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

/* ------------------------------------------- the other gated activations */

static int core_kind(dl_ffn_t k)
{
    return k == DL_FFN_SWIGLU_CLAMP ? DL__ACT_OAI
           : k == DL_FFN_GEGLU_TANH ? DL__ACT_GELU
           : k == DL_FFN_RELU2     ? DL__ACT_RELU2 : 0;
}

static int act_args(const dl_moe_config_t *c, int64_t n)
{
    if (!c || n < 0 || !DL_FFN_HIDDEN(c->ffn_kind))
        return DL_EINVAL;
    if (c->ffn_kind == DL_FFN_SWIGLU_CLAMP && !(isfinite(c->act_alpha) && c->act_limit >= 0 &&
                                                isfinite(c->act_limit)))
        return DL_EINVAL;
    return 0;
}

/* which: DL__ACT_H (dh unused), DL__ACT_DG or DL__ACT_DU, over n elements
 * of type t; kind 0 is SiLU (transc.c's kernels) */
/* SiLU: dl__silu_array's vector path, over chunks of independent outputs */
static int silu_loop(dl_dtype_t t, int which, const float *g, const float *u, const float *dh,
                     int64_t n, float *out)
{
    enum { CHUNK = 4096 };
    int rc = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++) {
        const int64_t i0 = c * CHUNK, m = n - i0 < CHUNK ? n - i0 : CHUNK;
        int e = dl__silu_array(which, g + i0, u + i0, dh ? dh + i0 : NULL, m, t, out + i0);
        if (e) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            rc = e;
        }
    }
    return rc;
}

static int act_loop(int kind, double alpha, double limit, dl_dtype_t t, int which,
                    const float *g, const float *u, const float *dh, int64_t n, float *out)
{
    if (!kind)
        return silu_loop(t, which, g, u, dh, n, out);
    int rc = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < n; i++) {
        double r = 0.0;
        int e;
        e = dl__act_eval(kind, alpha, limit, which, g[i], u[i], dh ? dh[i] : 0.0, t, &r);
        if (e) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            rc = e;
        }
        out[i] = (float)r;
    }
    return rc;
}

static int act_fw(int kind, double alpha, double limit, dl_dtype_t t, const float *g,
                  const float *u, int64_t n, float *h)
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
    return act_loop(kind, alpha, limit, t, DL__ACT_H, g, u, NULL, n, h);
}

static int act_bw(int kind, double alpha, double limit, dl_dtype_t t, const float *g,
                  const float *u, const float *dh, int64_t n, float *d_g, float *d_u)
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
    /* d_g written first would overwrite an input d_u still reads: with
     * both requested and d_g aliasing an input, d_g goes through a copy
     * (each pass alone reads element i before writing it) */
    const int alias = d_g && d_u && (d_g == g || d_g == u || d_g == dh);
    float *tmp = alias ? malloc((size_t)n * sizeof *tmp) : NULL;
    if (alias && !tmp)
        return DL_ENOMEM;
    int rc = 0;
    if (d_g)
        rc = act_loop(kind, alpha, limit, t, DL__ACT_DG, g, u, dh, n, alias ? tmp : d_g);
    if (!rc && d_u)
        rc = act_loop(kind, alpha, limit, t, DL__ACT_DU, g, u, dh, n, d_u);
    if (alias && !rc)
        memcpy(d_g, tmp, (size_t)n * sizeof *tmp);
    free(tmp);
    return rc;
}

int dl_swiglu(const float *g, const float *u, int64_t n, dl_dtype_t t, float *h)
{
    return act_fw(0, 0.0, 0.0, t, g, u, n, h);
}

int dl_swiglu_backward(const float *g, const float *u, const float *dh, int64_t n, dl_dtype_t t,
                       float *d_g, float *d_u)
{
    return act_bw(0, 0.0, 0.0, t, g, u, dh, n, d_g, d_u);
}

int dl_ffn_act(const dl_moe_config_t *c, const float *g, const float *u, int64_t n, float *h)
{
    int rc = act_args(c, n);
    if (!rc && c->ffn_kind == DL_FFN_RELU2) /* non-gated: h = relu(u)^2, g unused */
        g = u;
    return rc ? rc : act_fw(core_kind(c->ffn_kind), c->act_alpha, c->act_limit, c->dtype, g, u, n, h);
}

int dl_ffn_act_backward(const dl_moe_config_t *c, const float *g, const float *u,
                        const float *dh, int64_t n, float *d_g, float *d_u)
{
    int rc = act_args(c, n);
    if (!rc && c->ffn_kind == DL_FFN_RELU2) /* non-gated: d_u = 2 dh relu(u), no d_g */
        return act_bw(DL__ACT_RELU2, 0.0, 0.0, c->dtype, u, u, dh, n, d_u, NULL);
    return rc ? rc : act_bw(core_kind(c->ffn_kind), c->act_alpha, c->act_limit, c->dtype, g, u,
                            dh, n, d_g, d_u);
}

/* ------------------------------------------- derivatives, for tolerances */

static double logistic(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

void dl_ffn_act_deriv(const dl_moe_config_t *c, double g, double u, dl_ffn_act_deriv_t *d)
{
    if (c->ffn_kind == DL_FFN_RELU2) { /* h = relu(u)^2: in u alone, d2h/du2 = 2 (u > 0) */
        const double r = u > 0 ? u : 0.0;
        *d = (dl_ffn_act_deriv_t){r * r, 0.0, 2.0 * r, 0.0, 0.0, r * r, 2.0 * r, 0.0,
                                  r > 0 ? 2.0 : 0.0};
        return;
    }
    double x, k1 = 1.0, k2 = 0.0, v = u; /* x = k(g), k1 = x', k2 = x'' */
    if (c->ffn_kind == DL_FFN_SWIGLU_CLAMP) {
        const double L = c->act_limit;
        g = g > L ? L : g;
        v = (u > L ? L : u < -L ? -L : u) + 1.0;
        x = c->act_alpha * g;
        k1 = c->act_alpha;
    } else if (c->ffn_kind == DL_FFN_GEGLU_TANH) {
        const double c2 = 0x1.9884533d43651p+0, b = 0.044715;
        x = c2 * g * (1.0 + b * g * g);
        k1 = c2 * (1.0 + 3.0 * b * g * g);
        k2 = c2 * 6.0 * b * g;
    } else {
        x = g;
    }
    /* a(g) = g S(x(g)): a' = S + g S (1 - S) x', a'' = 2 S (1 - S) x' +
     * g S (1 - S) ((1 - 2 S) x'^2 + x'') */
    const double s = logistic(x), s1 = s * (1.0 - s);
    const double a = g * s, a1 = s + g * s1 * k1;
    const double a2 = 2.0 * s1 * k1 + g * s1 * ((1.0 - 2.0 * s) * k1 * k1 + k2);
    double am = fabs(a), a1m = s + fabs(g * s1 * k1);
    if (c->ffn_kind == DL_FFN_GEGLU_TANH) { /* th = 2 S - 1, (g (1 + th))' = 1 + th + g (1 - th^2) x'/2 */
        const double th = 2.0 * s - 1.0;
        am = 0.5 * fabs(g) * (1.0 + fabs(th));
        a1m = 0.5 * (1.0 + fabs(th)) + 0.25 * fabs(g) * (1.0 + th * th) * fabs(k1);
    }
    *d = (dl_ffn_act_deriv_t){a * v, a1 * v, a, a2 * v, a1, fabs(v) * am, am, fabs(v) * a1m, 0.0};
}
