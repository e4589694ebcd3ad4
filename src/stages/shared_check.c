/* The checking side of the shared experts (shared.c, their GEMMs gemm.c's,
 * their SwiGLU activation.c's): the exact value of each shared value on
 * the runner's effective operands, the magnitudes M of its rounding, and
 * the derivative magnitudes that carry an absent upstream's error into it
 * (doc/tolerances.md, "Shared experts"). With S the concatenated width:
 *   h_gate = x Wg, h_up = x Wu  [T, S],  h_act = silu(h_gate) h_up,
 *   y = h_act Wd  [T, d],  l = x w_g  [T],  g = sigmoid(l),
 *   out += g y;  d_g = <d_out, y>,  d_l = d_g g (1 - g),  d_y = g d_out,
 *   d_h_act = d_y Wd^T,  dWd = h_act^T d_y,  dWg = x^T d_h_gate, ...,
 *   d_x += d_h_gate Wg^T + d_h_up Wu^T + d_l w_g^T.
 * The dense GEMMs run over all T tokens as one group. The terms of out and
 * d_x are the combine's and the input gradient's (dispatch_check.c), which
 * call the helpers at the end of this file. */
#include "config.h"
#include "stages/stages_priv.h"

#define EF(s) DL__EF(v, s)

static const dl__swiglu_vals_t shared = {DL_VALUE_SHARED_H_GATE, DL_VALUE_SHARED_H_UP,
                                         DL_VALUE_D_SHARED_H_ACT};

static int64_t width(const dl__vctx_t *v)
{
    return dl_value_dim(v->c, 'S');
}

/* --------------------------------------------------- the dense GEMMs */

static int exact_dense(const dl__vctx_t *v, const float *lhs, int64_t K, const float *rhs,
                       dl_rhs_layout_t lay, int64_t N, dl_dtype_t t, float *out)
{
    const int64_t all[2] = {0, v->T};
    return dl__exact_grouped1(lhs, K, rhs, lay, N, all, 1, t, out);
}

/* The group offsets {0, T}: every token in one group. */
static int64_t *all_rows(const dl__vctx_t *v)
{
    int64_t *o = v->alloc(v->actx, 2, sizeof *o); /* zeroed */
    if (o)
        o[1] = v->T;
    return o;
}

static int mag_dense(const dl__vctx_t *v, dl__mag_t *m, const float *lhs, int64_t K,
                     const float *rhs, dl_rhs_layout_t lay, int64_t N)
{
    int64_t *o = all_rows(v);
    if (!o)
        return DL_ENOMEM;
    dl__mag_grouped(v, m, lhs, K, rhs, lay, N);
    m->mp->off = o;
    m->mp->E = 1;
    m->rows = v->T; /* [T, N], also for the gate's logits (N = 1, stored [T]) */
    m->cols = N;
    return 0;
}

/* A shared weight's gradient a^T b over all T tokens: [I, N] fp32. */
static int exact_dw(const dl__vctx_t *v, const float *a, int64_t I, const float *b, int64_t N,
                    float *out)
{
    const int64_t all[2] = {0, v->T};
    return dl_gemm_ragged_k(a, I, b, N, all, 1, DL_F32, out, NULL);
}

static int mag_dw(const dl__vctx_t *v, dl__mag_t *m, const float *a, int64_t I, const float *b,
                  int64_t N, dl_dtype_t tb)
{
    int64_t *o = all_rows(v);
    if (!o)
        return DL_ENOMEM;
    *m->mp = (dl__mprov_t){.kind = DL__M_RAGGED, .off = o, .E = 1, .a = a, .I = I, .b = b, .N = N};
    m->rows = I;
    m->cols = N;
    m->K = v->T;
    m->nops = 2;
    m->op[0] = v->act;
    m->op[1] = tb;
    return 0;
}

/* ---------------------------------------------------------- forward */

int dl__exact_shared_h_gate(const dl__vctx_t *v, float *out)
{
    return exact_dense(v, v->in->x, v->d, v->in->shared_w_gate, DL_RHS_KN, width(v), v->act, out);
}

int dl__mag_shared_h_gate(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dense(v, m, v->in->x, v->d, v->in->shared_w_gate, DL_RHS_KN, width(v));
}

int dl__exact_shared_h_up(const dl__vctx_t *v, float *out)
{
    return exact_dense(v, v->in->x, v->d, v->in->shared_w_up, DL_RHS_KN, width(v), v->act, out);
}

int dl__mag_shared_h_up(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dense(v, m, v->in->x, v->d, v->in->shared_w_up, DL_RHS_KN, width(v));
}

int dl__exact_shared_h_act(const dl__vctx_t *v, float *out)
{
    return dl_ffn_act(v->c, EF(SHARED_H_GATE), EF(SHARED_H_UP), v->T * width(v), out);
}

int dl__mag_shared_h_act(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return dl__swiglu_mag(v, shared, n, m);
}

int dl__prop_shared_h_act(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    return dl__swiglu_prop(v, shared, n, out);
}

int dl__exact_shared_y(const dl__vctx_t *v, float *out)
{
    return exact_dense(v, EF(SHARED_H_ACT), width(v), v->in->shared_w_down, DL_RHS_KN, v->d,
                       v->act, out);
}

int dl__mag_shared_y(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dense(v, m, EF(SHARED_H_ACT), width(v), v->in->shared_w_down, DL_RHS_KN, v->d);
}

int dl__exact_shared_gate_logit(const dl__vctx_t *v, float *out)
{
    return exact_dense(v, v->in->x, v->d, v->in->shared_gate_weight, DL_RHS_KN, 1, DL_F32, out);
}

int dl__mag_shared_gate_logit(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dense(v, m, v->in->x, v->d, v->in->shared_gate_weight, DL_RHS_KN, 1);
}

int dl__exact_shared_gate(const dl__vctx_t *v, float *out)
{
    return dl_shared_gate(EF(SHARED_GATE_LOGIT), v->T, out);
}

/* A sigmoid: M = |g|, one certified transcendental (the router's sigmoid
 * scores' rule). */
int dl__mag_shared_gate(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    m->mp = NULL;
    m->elem = 1;
    m->K = 0;
    return 0;
}

/* g = sigmoid(l): g (1 - g) dl */
int dl__prop_shared_gate(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *dl = DL__DL(v, SHARED_GATE_LOGIT);
    for (int64_t t = 0; dl && t < v->T; t++)
        out[t] += (double)g[t] * (1.0 - (double)g[t]) * dl[t];
    return dl != NULL;
}

/* --------------------------------------------------------- backward */

int dl__exact_d_shared_gate(const dl__vctx_t *v, float *out)
{
    return dl_shared_combine_backward(v->in->d_out, EF(SHARED_Y), EF(SHARED_GATE), v->T, v->d,
                                      v->act, out, NULL);
}

int dl__mag_d_shared_gate(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    const float *y = EF(SHARED_Y);
    const int64_t d = v->d;
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    for (int64_t t = 0; t < v->T; t++) {
        double s = 0.0;
        for (int64_t i = 0; i < d; i++)
            s += fabs((double)v->in->d_out[t * d + i] * (double)y[t * d + i]);
        a[t] = s;
    }
    m->K = d;
    m->prod_store = 1; /* Qwen2-MoE: sigmoid(gate) * shared_y, its VJP in bf16 */
    m->nops = 2;
    m->op[0] = m->op[1] = v->act;
    return 0;
}

/* d_g[t] = <d_out[t], shared_y[t]>: sum_i |d_out| d_shared_y */
int dl__prop_d_shared_gate(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *dy = DL__DL(v, SHARED_Y);
    const int64_t d = v->d;
    const int ry = DL__RSS(v, SHARED_Y);
    for (int64_t t = 0; dy && t < v->T; t++) {
        double a = 0.0;
        for (int64_t i = 0; i < d; i++) {
            const double e = fabs((double)v->in->d_out[t * d + i]) * dy[t * d + i];
            a += ry ? e * e : e;
        }
        out[t] += ry ? sqrt(a) : a;
    }
    return dy != NULL;
}

int dl__exact_d_shared_gate_logit(const dl__vctx_t *v, float *out)
{
    return dl_shared_gate_backward(EF(D_SHARED_GATE), EF(SHARED_GATE), v->T, out);
}

/* d_g g (1 - g): 1 - g, two products (the router's sigmoid VJP rule). */
int dl__mag_d_shared_gate_logit(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    m->mp = NULL;
    m->K = 3;
    return 0;
}

/* d_l = d_g g (1 - g): g (1 - g) delta(d_g) + |d_g (1 - 2 g)| delta(g) */
int dl__prop_d_shared_gate_logit(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *ddg = DL__DL(v, D_SHARED_GATE), *dgt = DL__DL(v, SHARED_GATE);
    const float *gt = EF(SHARED_GATE), *dg = EF(D_SHARED_GATE);
    for (int64_t t = 0; (ddg || dgt) && t < v->T; t++)
        out[t] += (ddg ? (double)gt[t] * (1.0 - (double)gt[t]) * ddg[t] : 0.0) +
                  (dgt ? fabs((double)dg[t] * (1.0 - 2.0 * (double)gt[t])) * dgt[t] : 0.0);
    return ddg || dgt;
}

int dl__exact_d_shared_gate_weight(const dl__vctx_t *v, float *out)
{
    return exact_dw(v, v->in->x, v->d, EF(D_SHARED_GATE_LOGIT), 1, out);
}

int dl__mag_d_shared_gate_weight(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dw(v, m, v->in->x, v->d, EF(D_SHARED_GATE_LOGIT), 1, DL_F32);
}

int dl__exact_d_shared_y(const dl__vctx_t *v, float *out)
{
    return dl_shared_combine_backward(v->in->d_out, NULL, v->c->shared_gate ? EF(SHARED_GATE) : NULL,
                                      v->T, v->d, v->act, NULL, out);
}

int dl__mag_d_shared_y(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    m->mp = NULL; /* one product, rounded once: M = |g| */
    m->K = 1;
    /* gated (Qwen2-MoE): autograd multiplies d_out by the gate it saved,
     * sigmoid's output stored in the case's type (bf16): one rounding of
     * that operand, u_act |g| = u_act M, the -acc profiles' stored part */
    m->prod_store = v->c->shared_gate != 0;
    return 0;
}

/* d_shared_y = g d_out: |d_out| delta(g) */
int dl__prop_d_shared_y(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *dgt = v->c->shared_gate ? DL__DL(v, SHARED_GATE) : NULL;
    const int64_t d = v->d;
    for (int64_t t = 0; dgt && t < v->T; t++)
        for (int64_t i = 0; i < d; i++)
            out[t * d + i] += fabs((double)v->in->d_out[t * d + i]) * dgt[t];
    return dgt != NULL;
}

int dl__exact_d_shared_h_act(const dl__vctx_t *v, float *out)
{
    return exact_dense(v, EF(D_SHARED_Y), v->d, v->in->shared_w_down, DL_RHS_NK, width(v), v->act,
                       out);
}

int dl__mag_d_shared_h_act(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dense(v, m, EF(D_SHARED_Y), v->d, v->in->shared_w_down, DL_RHS_NK, width(v));
}

int dl__exact_d_shared_w_down(const dl__vctx_t *v, float *out)
{
    return exact_dw(v, EF(SHARED_H_ACT), width(v), EF(D_SHARED_Y), v->d, out);
}

int dl__mag_d_shared_w_down(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dw(v, m, EF(SHARED_H_ACT), width(v), EF(D_SHARED_Y), v->d, v->act);
}

int dl__exact_d_shared_h_gate(const dl__vctx_t *v, float *out)
{
    return dl__swiglu_exact_d(v, shared, 1, v->T * width(v), out);
}

int dl__mag_d_shared_h_gate(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return dl__swiglu_mag_d(v, shared, 1, n, m);
}

int dl__prop_d_shared_h_gate(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    return dl__swiglu_prop_d(v, shared, 1, n, out);
}

int dl__exact_d_shared_h_up(const dl__vctx_t *v, float *out)
{
    return dl__swiglu_exact_d(v, shared, 0, v->T * width(v), out);
}

int dl__mag_d_shared_h_up(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return dl__swiglu_mag_d(v, shared, 0, n, m);
}

int dl__prop_d_shared_h_up(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    return dl__swiglu_prop_d(v, shared, 0, n, out);
}

int dl__exact_d_shared_w_gate(const dl__vctx_t *v, float *out)
{
    return exact_dw(v, v->in->x, v->d, EF(D_SHARED_H_GATE), width(v), out);
}

int dl__mag_d_shared_w_gate(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dw(v, m, v->in->x, v->d, EF(D_SHARED_H_GATE), width(v), v->act);
}

int dl__exact_d_shared_w_up(const dl__vctx_t *v, float *out)
{
    return exact_dw(v, v->in->x, v->d, EF(D_SHARED_H_UP), width(v), out);
}

int dl__mag_d_shared_w_up(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dw(v, m, v->in->x, v->d, EF(D_SHARED_H_UP), width(v), v->act);
}

/* ---------------------- the shared terms of the combine and of d_x */

void dl__shared_out_operands(const dl__vctx_t *v, const float **y, const float **g)
{
    const int sh = v->c->shared_experts > 0;
    *y = sh ? EF(SHARED_Y) : NULL;
    *g = sh && v->c->shared_gate ? EF(SHARED_GATE) : NULL;
}

void dl__shared_grad(const dl__vctx_t *v, dl_shared_grad_t *sh)
{
    const int gated = v->c->shared_experts > 0 && v->c->shared_gate != 0;
    *sh = (dl_shared_grad_t){v->c->shared_experts > 0 ? width(v) : 0, EF(D_SHARED_H_GATE),
                             EF(D_SHARED_H_UP), v->in->shared_w_gate, v->in->shared_w_up,
                             gated ? EF(D_SHARED_GATE_LOGIT) : NULL,
                             gated ? v->in->shared_gate_weight : NULL};
}

double dl__shared_dx_m(const dl_shared_grad_t *sh, int64_t t, int64_t i)
{
    const int64_t F = sh->width;
    double a = 0.0;
    for (int64_t c = 0; c < F; c++)
        a += (sh->d_h_gate ? fabs((double)sh->d_h_gate[t * F + c] * (double)sh->w_gate[i * F + c])
                           : 0.0) +
             fabs((double)sh->d_h_up[t * F + c] * (double)sh->w_up[i * F + c]);
    if (F > 0 && sh->d_gate_logit)
        a += fabs((double)sh->d_gate_logit[t] * (double)sh->gate_weight[i]);
    return a;
}

int64_t dl__shared_dx_terms(const dl_shared_grad_t *sh)
{
    return sh->width > 0 ? (sh->d_h_gate ? 2 : 1) * sh->width + (sh->d_gate_logit != NULL) : 0;
}

/* sum_c |Wg[i,c]| delta(d_h_gate[t,c]) + |Wu[i,c]| delta(d_h_up[t,c])
 * + |w_g[i]| delta(d_l[t]) */
void dl__shared_dx_prop(const dl__vctx_t *v, int64_t t, int64_t i, double *lin, double *sq)
{
    const float *dhg = DL__DL(v, D_SHARED_H_GATE), *dhu = DL__DL(v, D_SHARED_H_UP);
    const float *dlg = v->c->shared_gate ? DL__DL(v, D_SHARED_GATE_LOGIT) : NULL;
    const int64_t F = width(v);
    const int rg = DL__RSS(v, D_SHARED_H_GATE), ru = DL__RSS(v, D_SHARED_H_UP);
    const int rl = DL__RSS(v, D_SHARED_GATE_LOGIT);
    for (int64_t c = 0; c < F; c++) {
        const double a = dhg ? fabs((double)v->in->shared_w_gate[i * F + c]) * dhg[t * F + c] : 0.0;
        const double b = dhu ? fabs((double)v->in->shared_w_up[i * F + c]) * dhu[t * F + c] : 0.0;
        *lin += (rg ? 0.0 : a) + (ru ? 0.0 : b);
        *sq += (rg ? a * a : 0.0) + (ru ? b * b : 0.0);
    }
    const double l = dlg ? fabs((double)v->in->shared_gate_weight[i]) * dlg[t] : 0.0;
    *lin += rl ? 0.0 : l;
    *sq += rl ? l * l : 0.0;
}
