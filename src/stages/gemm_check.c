/* The checking side of the grouped GEMM stages (gemm.c): the exact value of
 * each GEMM stage value on the runner's effective operands, and its M, the
 * GEMM of the operands' magnitudes (doc/tolerances.md). Their error
 * propagates through the same magnitude GEMMs (the rows' prop GEMM), so
 * nothing here differentiates. */
#include "config.h"
#include "stages/stages_priv.h"

#define EF(s) DL__EF(v, s)
#define OFF ((const int64_t *)v->v[DL_VALUE_GROUP_OFFSETS])

int dl__exact_grouped1(const float *lhs, int64_t K, const float *rhs, dl_rhs_layout_t lay,
                       int64_t N, const int64_t *off, int64_t E, dl_dtype_t t, float *out)
{
    dl_gemm_term_t term = {lhs, K, rhs, lay};
    return dl_gemm_grouped(&term, 1, N, off, E, t, out, NULL);
}

void dl__mag_grouped(const dl__vctx_t *v, dl__mag_t *m, const float *lhs, int64_t K,
                     const float *rhs, dl_rhs_layout_t lay, int64_t N)
{
    m->mp->kind = DL__M_GROUPED;
    m->mp->nterms = 1;
    m->mp->N = N;
    m->mp->terms[0] = (dl_gemm_term_t){lhs, K, rhs, lay};
    m->K = K;
    m->nops = 2;
    m->op[0] = m->op[1] = v->act;
}

double *dl__mag_array(const dl__vctx_t *v, dl__mag_t *m, int64_t n)
{
    double *a = v->alloc(v->actx, n, sizeof *a);
    if (a) {
        m->mp->kind = DL__M_ARRAY;
        m->mp->arr = a;
    }
    return a;
}

/* ---------------------------------------------------- experts forward */

/* An expert projection lhs W (+ with ffn_bias its bias, the second term of
 * the one exact sum): the stage's own function (experts.c), and its M with
 * the bias term's |1| |b| in the magnitude GEMM. */
static int exact_proj(const dl__vctx_t *v, const float *lhs, int64_t K, const float *w,
                      const float *bias, int64_t N, float *out)
{
    return dl__expert_projection(v->c, lhs, K, w, bias, N, v->M, OFF, v->E, out, NULL);
}

static int mag_proj(const dl__vctx_t *v, dl__mag_t *m, const float *lhs, int64_t K,
                    const float *w, const float *bias, int64_t N)
{
    dl__mag_grouped(v, m, lhs, K, w, DL_RHS_KN, N);
    if (!v->c->ffn_bias)
        return 0;
    float *ones = v->alloc(v->actx, v->M > 0 ? v->M : 1, sizeof *ones);
    if (!ones)
        return DL_ENOMEM;
    for (int64_t i = 0; i < v->M; i++)
        ones[i] = 1.0f;
    m->mp->nterms = 2;
    m->mp->terms[1] = (dl_gemm_term_t){ones, 1, bias, DL_RHS_KN};
    m->K = K + 1;
    return 0;
}

int dl__exact_h_gate(const dl__vctx_t *v, float *out)
{
    return exact_proj(v, EF(X_SORTED), v->d, v->in->w_gate, v->in->b_gate, v->f, out);
}

int dl__mag_h_gate(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_proj(v, m, EF(X_SORTED), v->d, v->in->w_gate, v->in->b_gate, v->f);
}

int dl__exact_h_up(const dl__vctx_t *v, float *out)
{
    return exact_proj(v, EF(X_SORTED), v->d, v->in->w_up, v->in->b_up, v->f, out);
}

int dl__mag_h_up(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_proj(v, m, EF(X_SORTED), v->d, v->in->w_up, v->in->b_up, v->f);
}

/* The down projection's input: h_act, or x_sorted in a plain FFN (the
 * runner's swiglu flag: the FFN has a hidden layer, DL_FFN_HIDDEN). */
static const float *down_in(const dl__vctx_t *v, int64_t *K)
{
    *K = v->swiglu ? v->f : v->d;
    return v->swiglu ? EF(H_ACT) : EF(X_SORTED);
}

int dl__exact_y_sorted(const dl__vctx_t *v, float *out)
{
    int64_t K;
    const float *a = down_in(v, &K);
    int rc = exact_proj(v, a, K, v->in->w_down, v->in->b_down, v->d, out);
    /* zero experts' rows (dispatch.c): the input itself */
    return rc ? rc : dl__identity_tail(v->c, v->M, OFF, v->E, EF(X_SORTED), v->d, out);
}

int dl__mag_y_sorted(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    int64_t K;
    const float *a = down_in(v, &K);
    return mag_proj(v, m, a, K, v->in->w_down, v->in->b_down, v->d);
}

/* --------------------------------------------------- experts backward */

int dl__exact_d_h_act(const dl__vctx_t *v, float *out)
{
    return dl__exact_grouped1(EF(D_Y_SORTED), v->d, v->in->w_down, DL_RHS_NK, v->f, OFF, v->E,
                              v->act, out);
}

int dl__mag_d_h_act(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    dl__mag_grouped(v, m, EF(D_Y_SORTED), v->d, v->in->w_down, DL_RHS_NK, v->f);
    return 0;
}

static int exact_d_x_sorted(const dl__vctx_t *v, float *out)
{
    if (!v->swiglu)
        return dl__exact_grouped1(EF(D_Y_SORTED), v->d, v->in->w_down, DL_RHS_NK, v->d, OFF,
                                  v->E, v->act, out);
    if (v->c->ffn_kind == DL_FFN_RELU2) /* non-gated: the up projection's term alone */
        return dl__exact_grouped1(EF(D_H_UP), v->f, v->in->w_up, DL_RHS_NK, v->d, OFF, v->E,
                                  v->act, out);
    dl_gemm_term_t terms[2] = {{EF(D_H_GATE), v->f, v->in->w_gate, DL_RHS_NK},
                               {EF(D_H_UP), v->f, v->in->w_up, DL_RHS_NK}};
    return dl_gemm_grouped(terms, 2, v->d, OFF, v->E, v->act, out, NULL);
}

int dl__exact_d_x_sorted(const dl__vctx_t *v, float *out)
{
    int rc = exact_d_x_sorted(v, out);
    /* zero experts' rows (dispatch.c): the identity's VJP, d_y_sorted itself */
    return rc ? rc : dl__identity_tail(v->c, v->M, OFF, v->E, EF(D_Y_SORTED), v->d, out);
}

int dl__mag_d_x_sorted(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    if (!v->swiglu) {
        dl__mag_grouped(v, m, EF(D_Y_SORTED), v->d, v->in->w_down, DL_RHS_NK, v->d);
        return 0;
    }
    if (v->c->ffn_kind == DL_FFN_RELU2) {
        dl__mag_grouped(v, m, EF(D_H_UP), v->f, v->in->w_up, DL_RHS_NK, v->d);
        return 0;
    }
    dl__mprov_t *mp = m->mp;
    mp->kind = DL__M_GROUPED;
    mp->N = v->d;
    mp->nterms = 2;
    mp->terms[0] = (dl_gemm_term_t){EF(D_H_GATE), v->f, v->in->w_gate, DL_RHS_NK};
    mp->terms[1] = (dl_gemm_term_t){EF(D_H_UP), v->f, v->in->w_up, DL_RHS_NK};
    m->K = 2 * v->f;
    m->short_sum = 1; /* the two terms may be rounded apart and added */
    m->nops = 2;
    m->op[0] = m->op[1] = v->act;
    return 0;
}

/* The two ragged-K operands of a weight gradient: dW_e = a_e^T b_e, and
 * its M: each row's K is its expert's group size. */
static int exact_dw(const dl__vctx_t *v, const float *a, int64_t I, const float *b, int64_t N,
                    float *out)
{
    return dl_gemm_ragged_k(a, I, b, N, OFF, v->E, DL_F32, out, NULL);
}

static int mag_dw(const dl__vctx_t *v, const float *a, int64_t I, const float *b, int64_t N,
                  dl__mag_t *m)
{
    const int64_t *off = OFF, E = v->E;
    dl__mprov_t *mp = m->mp;
    mp->kind = DL__M_RAGGED;
    mp->a = a;
    mp->I = I;
    mp->b = b;
    mp->N = N;
    int64_t *rk = v->alloc(v->actx, E * I, sizeof *rk);
    if (!rk)
        return DL_ENOMEM;
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; i < I; i++)
            rk[e * I + i] = off[e + 1] - off[e];
    m->row_K = rk;
    m->rows = E * I;
    m->cols = N;
    m->nops = 2;
    m->op[0] = m->op[1] = v->act;
    return 0;
}

int dl__exact_d_w_down(const dl__vctx_t *v, float *out)
{
    int64_t I;
    const float *a = down_in(v, &I);
    return exact_dw(v, a, I, EF(D_Y_SORTED), v->d, out);
}

int dl__mag_d_w_down(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    int64_t I;
    const float *a = down_in(v, &I);
    return mag_dw(v, a, I, EF(D_Y_SORTED), v->d, m);
}

int dl__exact_d_w_gate(const dl__vctx_t *v, float *out)
{
    return exact_dw(v, EF(X_SORTED), v->d, EF(D_H_GATE), v->f, out);
}

int dl__mag_d_w_gate(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dw(v, EF(X_SORTED), v->d, EF(D_H_GATE), v->f, m);
}

int dl__exact_d_w_up(const dl__vctx_t *v, float *out)
{
    return exact_dw(v, EF(X_SORTED), v->d, EF(D_H_UP), v->f, out);
}

int dl__mag_d_w_up(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_dw(v, EF(X_SORTED), v->d, EF(D_H_UP), v->f, m);
}

/* The expert biases' gradients (ffn_bias): the column sums of each
 * expert's rows, ones^T g (a ragged-K GEMM with I = 1, schedule.c). */
static const float *ones_col(const dl__vctx_t *v)
{
    float *o = v->alloc(v->actx, v->M > 0 ? v->M : 1, sizeof *o);
    for (int64_t i = 0; o && i < v->M; i++)
        o[i] = 1.0f;
    return o;
}

static int exact_db(const dl__vctx_t *v, const float *g, int64_t N, float *out)
{
    const float *o = ones_col(v);
    return o ? exact_dw(v, o, 1, g, N, out) : DL_ENOMEM;
}

static int mag_db(const dl__vctx_t *v, const float *g, int64_t N, dl__mag_t *m)
{
    const float *o = ones_col(v);
    return o ? mag_dw(v, o, 1, g, N, m) : DL_ENOMEM;
}

int dl__exact_d_b_down(const dl__vctx_t *v, float *out)
{
    return exact_db(v, EF(D_Y_SORTED), v->d, out);
}

int dl__mag_d_b_down(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_db(v, EF(D_Y_SORTED), v->d, m);
}

int dl__exact_d_b_gate(const dl__vctx_t *v, float *out)
{
    return exact_db(v, EF(D_H_GATE), v->f, out);
}

int dl__mag_d_b_gate(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_db(v, EF(D_H_GATE), v->f, m);
}

int dl__exact_d_b_up(const dl__vctx_t *v, float *out)
{
    return exact_db(v, EF(D_H_UP), v->f, out);
}

int dl__mag_d_b_up(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return mag_db(v, EF(D_H_UP), v->f, m);
}
