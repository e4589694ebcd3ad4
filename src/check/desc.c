/* One descriptor per stage value: what it is a function of, how its exact
 * value is recomputed on the effective upstream (always by calling the
 * stage functions of the library), and how the scale M of its rounding
 * error is obtained for the tolerance (doc/tolerances.md). The driver that
 * walks the stages is stage.c. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "check/check_priv.h"

#define B(s) ((uint64_t)1 << (DL_VALUE_##s))
#define DISPATCH (B(SORT_PERM) | B(INV_PERM) | B(GROUP_SIZES) | B(GROUP_OFFSETS))
#define EF(s) ((const float *)ck->eff[DL_VALUE_##s])
#define OFF ((const int64_t *)ck->eff[DL_VALUE_GROUP_OFFSETS])
#define INV ((const int32_t *)ck->eff[DL_VALUE_INV_PERM])

static int grouped1(const float *lhs, int64_t K, const float *rhs, dl_rhs_layout_t lay, int64_t N,
                    const int64_t *off, int64_t E, dl_dtype_t t, float *out)
{
    dl_gemm_term_t term = {lhs, K, rhs, lay};
    return dl_gemm_grouped(&term, 1, N, off, E, t, out, NULL);
}

/* Operands off the profile's input grid for a product of types a and b. */
static int kin(const dl__ck_t *ck, const dl__cmp_t *cmp, dl_dtype_t a, dl_dtype_t b)
{
    const dl_check_profile_t *p = dl__ck_prof(ck, cmp->stage);
    return !dl__ck_on_input_grid(p, a) + !dl__ck_on_input_grid(p, b);
}

/* M given element by element: an array of n doubles owned by ck. */
static double *m_array(dl__ck_t *ck, dl__mprov_t *mp, int64_t n)
{
    double *m = dl__ck_alloc(ck, n, sizeof *m);
    if (m) {
        mp->kind = DL__M_ARRAY;
        mp->arr = m;
    }
    return m;
}

/* M of a grouped GEMM of one term over the sorted rows. */
static void m_grouped(dl__ck_t *ck, dl__cmp_t *cmp, dl__mprov_t *mp, const float *lhs, int64_t K,
                      const float *rhs, dl_rhs_layout_t lay, int64_t N)
{
    mp->kind = DL__M_GROUPED;
    mp->nterms = 1;
    mp->N = N;
    mp->terms[0] = (dl_gemm_term_t){lhs, K, rhs, lay};
    cmp->K = K;
    cmp->kappa_in = kin(ck, cmp, ck->act, ck->act);
}

/* A GEMM over all T rows as one group (the router's). */
static int64_t *all_rows(dl__ck_t *ck)
{
    int64_t *o = dl__ck_alloc(ck, 2, sizeof *o);
    if (o)
        o[1] = ck->T;
    return o;
}

static double silu(double g)
{
    return g / (1.0 + exp(-g));
}

/* ------------------------------------------------------------- routing */

static int ex_router_logits(dl__ck_t *ck, dl_value_t s, float *out)
{
    const int64_t all[2] = {0, ck->T};
    return grouped1(ck->in->x, ck->d, ck->in->router_weight, DL_RHS_KN, ck->E, all, 1, DL_F32, out);
}

static int m_router_logits(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    int64_t *o = all_rows(ck);
    if (!o)
        return DL_ENOMEM;
    *mp = (dl__mprov_t){.kind = DL__M_GROUPED, .nterms = 1, .N = ck->E, .off = o, .E = 1};
    mp->terms[0] = (dl_gemm_term_t){ck->in->x, ck->d, ck->in->router_weight, DL_RHS_KN};
    cmp->K = ck->d;
    cmp->kappa_in = kin(ck, cmp, ck->act, DL_F32);
    return 0;
}

static int ex_router_scores(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_route_scores(&ck->c->route, EF(ROUTER_LOGITS), ck->T, out);
}

static int m_router_scores(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    double *m = m_array(ck, mp, ck->numel[s]);
    if (!m)
        return DL_ENOMEM;
    dl__ck_score_m(ck, EF(ROUTER_LOGITS), ck->exact[s], m);
    cmp->elem = 1;
    cmp->K = ck->c->route.score_fn == DL_SCORE_SOFTMAX ? ck->E : 0;
    return 0;
}

static int ex_topk_weights(dl__ck_t *ck, dl_value_t s, float *out)
{
    const int32_t *ids = ck->eff[DL_VALUE_TOPK_IDS];
    const int64_t k = ck->k;
    for (int64_t t = 0; t < ck->T; t++) {
        if (!memcmp(ids + t * k, ck->exact_ids + t * k, (size_t)k * sizeof *ids))
            memcpy(out + t * k, ck->exact_weights + t * k, (size_t)k * sizeof *out);
        else if (dl_route_weights(&ck->c->route, EF(ROUTER_SCORES) + t * ck->E, ids + t * k,
                                  out + t * k))
            for (int64_t j = 0; j < k; j++) /* 0/0: no weight exists to compare with */
                out[t * k + j] = NAN;
    }
    return 0;
}

static int m_topk_weights(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    cmp->mp = NULL;
    cmp->K = ck->c->route.renormalize ? ck->k + 1 : 1; /* the sum S, the quotient, scaling */
    return 0;
}

/* ------------------------------------------------------ experts forward */

static int ex_x_sorted(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_permute(ck->in->x, ck->T, ck->d, ck->k, ck->eff[DL_VALUE_SORT_PERM], out);
}

static const float *gate_or_up(const dl__ck_t *ck, int gate)
{
    return gate ? ck->in->w_gate : ck->in->w_up;
}

static int ex_h(dl__ck_t *ck, dl_value_t s, float *out)
{
    return grouped1(EF(X_SORTED), ck->d, gate_or_up(ck, s == DL_VALUE_H_GATE), DL_RHS_KN, ck->f,
                    OFF, ck->E, ck->act, out);
}

static int m_h(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    m_grouped(ck, cmp, mp, EF(X_SORTED), ck->d, gate_or_up(ck, s == DL_VALUE_H_GATE), DL_RHS_KN,
              ck->f);
    return 0;
}

static int ex_h_act(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_swiglu(EF(H_GATE), EF(H_UP), ck->M * ck->f, ck->act, out);
}

/* M of a SwiGLU, elementwise: |silu(g) u|. */
static int m_swiglu(dl__ck_t *ck, dl_value_t s, const float *g, const float *u, dl__cmp_t *cmp,
                    dl__mprov_t *mp)
{
    const int64_t n = ck->numel[s];
    double *m = m_array(ck, mp, n);
    if (!m)
        return DL_ENOMEM;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        m[i] = fabs(silu(g[i]) * (double)u[i]);
    cmp->elem = 1;
    return 0;
}

static int m_h_act(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    return m_swiglu(ck, s, EF(H_GATE), EF(H_UP), cmp, mp);
}

/* The down projection's input: h_act, or x_sorted in a plain FFN. */
static const float *down_in(const dl__ck_t *ck, int64_t *K)
{
    *K = ck->swiglu ? ck->f : ck->d;
    return ck->swiglu ? EF(H_ACT) : EF(X_SORTED);
}

static int ex_y_sorted(dl__ck_t *ck, dl_value_t s, float *out)
{
    int64_t K;
    const float *a = down_in(ck, &K);
    return grouped1(a, K, ck->in->w_down, DL_RHS_KN, ck->d, OFF, ck->E, ck->act, out);
}

static int m_y_sorted(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    int64_t K;
    const float *a = down_in(ck, &K);
    m_grouped(ck, cmp, mp, a, K, ck->in->w_down, DL_RHS_KN, ck->d);
    return 0;
}

#if DL_EXTRA_VALUE
/* configure --enable-extra-value: y_half = RN(y_sorted / 2), elementwise */
static int ex_y_half(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_extra_half(EF(Y_SORTED), ck->M * ck->d, ck->act, out);
}

static int m_y_half(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    const float *y = EF(Y_SORTED);
    const int64_t n = ck->numel[s];
    double *m = m_array(ck, mp, n);
    if (!m)
        return DL_ENOMEM;
    for (int64_t i = 0; i < n; i++)
        m[i] = fabs(0.5 * (double)y[i]);
    cmp->elem = 1;
    return 0;
}
#endif

static int ex_out(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_combine_shared(EF(Y_SORTED), EF(TOPK_WEIGHTS), INV, EF(SHARED_Y), EF(SHARED_GATE),
                             ck->T, ck->k, ck->d, ck->act, out);
}

static int m_out(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    const float *y = EF(Y_SORTED), *w = EF(TOPK_WEIGHTS);
    const int32_t *inv = INV;
    const int64_t d = ck->d, k = ck->k;
    double *m = m_array(ck, mp, ck->numel[s]);
    if (!m)
        return DL_ENOMEM;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < ck->T; t++)
        for (int64_t i = 0; i < d; i++) {
            double a = 0.0;
            for (int64_t j = 0; j < k; j++)
                a += fabs((double)w[t * k + j] * (double)y[(int64_t)inv[t * k + j] * d + i]);
            m[t * d + i] = a + fabs(dl__ck_shared_out(ck, t, i));
        }
    cmp->K = k + (ck->c->shared_experts > 0); /* the shared experts' term is one more */
    cmp->short_sum = 1;
    return 0;
}

/* ------------------------------------------------------ combine backward */

static int ex_d_topk_weights(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_combine_backward(ck->in->d_out, EF(Y_SORTED), NULL, INV, ck->T, ck->k, ck->d,
                               ck->act, out, NULL);
}

static int m_d_topk_weights(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    const float *y = EF(Y_SORTED);
    const int32_t *inv = INV;
    const int64_t d = ck->d, k = ck->k;
    double *m = m_array(ck, mp, ck->numel[s]);
    if (!m)
        return DL_ENOMEM;
#pragma omp parallel for schedule(static)
    for (int64_t fl = 0; fl < ck->M; fl++) {
        double a = 0.0;
        const float *g = ck->in->d_out + (fl / k) * d, *yy = y + (int64_t)inv[fl] * d;
        for (int64_t i = 0; i < d; i++)
            a += fabs((double)g[i] * (double)yy[i]);
        m[fl] = a;
    }
    cmp->K = d;
    cmp->kappa_in = kin(ck, cmp, ck->act, ck->act);
    return 0;
}

static int ex_d_y_sorted(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_combine_backward(ck->in->d_out, NULL, EF(TOPK_WEIGHTS), INV, ck->T, ck->k, ck->d,
                               ck->act, NULL, out);
}

static int m_d_y_sorted(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    cmp->mp = NULL;
    cmp->K = 1;
    return 0;
}

/* ----------------------------------------------------- experts backward */

static int ex_d_h_act(dl__ck_t *ck, dl_value_t s, float *out)
{
    return grouped1(EF(D_Y_SORTED), ck->d, ck->in->w_down, DL_RHS_NK, ck->f, OFF, ck->E, ck->act,
                    out);
}

static int m_d_h_act(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    m_grouped(ck, cmp, mp, EF(D_Y_SORTED), ck->d, ck->in->w_down, DL_RHS_NK, ck->f);
    return 0;
}

/* The two ragged-K operands of a weight gradient: dW_e = a_e^T b_e. */
static void dw_operands(const dl__ck_t *ck, dl_value_t s, const float **a, int64_t *I,
                        const float **b, int64_t *N)
{
    if (s == DL_VALUE_D_W_DOWN) {
        *a = down_in(ck, I);
        *b = EF(D_Y_SORTED);
        *N = ck->d;
    } else {
        *a = EF(X_SORTED);
        *I = ck->d;
        *b = s == DL_VALUE_D_W_GATE ? EF(D_H_GATE) : EF(D_H_UP);
        *N = ck->f;
    }
}

static int ex_d_w(dl__ck_t *ck, dl_value_t s, float *out)
{
    const float *a, *b;
    int64_t I, N;
    dw_operands(ck, s, &a, &I, &b, &N);
    return dl_gemm_ragged_k(a, I, b, N, OFF, ck->E, DL_F32, out, NULL);
}

static int m_d_w(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    const int64_t *off = OFF, E = ck->E;
    mp->kind = DL__M_RAGGED;
    dw_operands(ck, s, &mp->a, &mp->I, &mp->b, &mp->N);
    int64_t *rk = dl__ck_alloc(ck, E * mp->I, sizeof *rk);
    if (!rk)
        return DL_ENOMEM;
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; i < mp->I; i++)
            rk[e * mp->I + i] = off[e + 1] - off[e];
    cmp->row_K = rk;
    cmp->rows = E * mp->I;
    cmp->cols = mp->N;
    cmp->kappa_in = kin(ck, cmp, ck->act, ck->act);
    return 0;
}

/* The SwiGLU backward's operands (gate, up, upstream gradient, the two
 * values it gives) for the routed experts or the shared ones. */
typedef struct {
    dl_value_t g, u, dh, dg, du;
} swiglu_vjp_t;

static swiglu_vjp_t swiglu_vjp(dl_value_t s)
{
    const int sh = s == DL_VALUE_D_SHARED_H_GATE || s == DL_VALUE_D_SHARED_H_UP;
    return sh ? (swiglu_vjp_t){DL_VALUE_SHARED_H_GATE, DL_VALUE_SHARED_H_UP,
                               DL_VALUE_D_SHARED_H_ACT, DL_VALUE_D_SHARED_H_GATE,
                               DL_VALUE_D_SHARED_H_UP}
              : (swiglu_vjp_t){DL_VALUE_H_GATE, DL_VALUE_H_UP, DL_VALUE_D_H_ACT,
                               DL_VALUE_D_H_GATE, DL_VALUE_D_H_UP};
}

static int ex_d_h_gu(dl__ck_t *ck, dl_value_t s, float *out)
{
    /* one call gives both; keep the sibling for when its turn comes */
    const swiglu_vjp_t o = swiglu_vjp(s);
    const int64_t n = ck->numel[s];
    float *other = dl__ck_alloc(ck, n, sizeof *other);
    if (!other)
        return DL_ENOMEM;
    const int gate = s == o.dg;
    int rc = dl_swiglu_backward(ck->eff[o.g], ck->eff[o.u], ck->eff[o.dh], n, ck->act,
                                gate ? out : other, gate ? other : out);
    const dl_value_t sib = gate ? o.du : o.dg;
    if (!rc && !ck->exact[sib])
        ck->exact[sib] = other;
    return rc;
}

static int m_d_h_gu(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    const swiglu_vjp_t o = swiglu_vjp(s);
    const float *g = ck->eff[o.g], *u = ck->eff[o.u], *dh = ck->eff[o.dh];
    const int64_t n = ck->numel[s];
    double *m = m_array(ck, mp, n);
    if (!m)
        return DL_ENOMEM;
    const int gate = s == o.dg;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const double sg = 1.0 / (1.0 + exp(-(double)g[i]));
        if (gate) /* dh u s (1 + g (1 - s)): the two terms' magnitudes */
            m[i] = fabs((double)dh[i] * (double)u[i] * sg) * (1.0 + fabs((double)g[i] * (1.0 - sg)));
        else
            m[i] = fabs((double)dh[i] * (double)g[i] * sg);
    }
    cmp->elem = 1;
    return 0;
}

static int ex_d_x_sorted(dl__ck_t *ck, dl_value_t s, float *out)
{
    if (!ck->swiglu)
        return grouped1(EF(D_Y_SORTED), ck->d, ck->in->w_down, DL_RHS_NK, ck->d, OFF, ck->E,
                        ck->act, out);
    dl_gemm_term_t terms[2] = {{EF(D_H_GATE), ck->f, ck->in->w_gate, DL_RHS_NK},
                               {EF(D_H_UP), ck->f, ck->in->w_up, DL_RHS_NK}};
    return dl_gemm_grouped(terms, 2, ck->d, OFF, ck->E, ck->act, out, NULL);
}

static int m_d_x_sorted(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    if (!ck->swiglu) {
        m_grouped(ck, cmp, mp, EF(D_Y_SORTED), ck->d, ck->in->w_down, DL_RHS_NK, ck->d);
        return 0;
    }
    mp->kind = DL__M_GROUPED;
    mp->N = ck->d;
    mp->nterms = 2;
    mp->terms[0] = (dl_gemm_term_t){EF(D_H_GATE), ck->f, ck->in->w_gate, DL_RHS_NK};
    mp->terms[1] = (dl_gemm_term_t){EF(D_H_UP), ck->f, ck->in->w_up, DL_RHS_NK};
    cmp->K = 2 * ck->f;
    cmp->short_sum = 1; /* the two terms may be rounded apart and added */
    cmp->kappa_in = kin(ck, cmp, ck->act, ck->act);
    return 0;
}

/* ------------------------------------------------------ router backward */

static int ex_d_router_scores(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_route_backward(&ck->c->route, EF(ROUTER_SCORES), ck->eff[DL_VALUE_TOPK_IDS],
                             EF(D_TOPK_WEIGHTS), ck->T, out, NULL);
}

static int m_d_router_scores(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    double *m = m_array(ck, mp, ck->numel[s]);
    if (!m)
        return DL_ENOMEM;
    dl__ck_dscores_m(&ck->c->route, EF(ROUTER_SCORES), ck->eff[DL_VALUE_TOPK_IDS],
                     EF(D_TOPK_WEIGHTS), ck->T, m);
    /* the longest chain of roundings: sum_j dw_j s_j (k), S^2 (2k-1), the
     * quotient and the difference */
    cmp->K = ck->c->route.renormalize ? 3 * ck->k + 1 : 1;
    return 0;
}

static int ex_d_router_logits(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_route_scores_backward(&ck->c->route, EF(ROUTER_SCORES), EF(D_ROUTER_SCORES), ck->T,
                                    out);
}

static int m_d_router_logits(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    double *m = m_array(ck, mp, ck->numel[s]);
    if (!m)
        return DL_ENOMEM;
    dl__ck_score_vjp_m(&ck->c->route, EF(ROUTER_SCORES), EF(D_ROUTER_SCORES), ck->T, m);
    /* softmax: sigma = sum of E products (E), the difference, the product;
     * sigmoid: 1 - s, two products */
    cmp->K = ck->c->route.score_fn == DL_SCORE_SOFTMAX ? ck->E + 2 : 3;
    return 0;
}

static int ex_d_router_weight(dl__ck_t *ck, dl_value_t s, float *out)
{
    const int64_t all[2] = {0, ck->T};
    return dl_gemm_ragged_k(ck->in->x, ck->d, EF(D_ROUTER_LOGITS), ck->E, all, 1, DL_F32, out,
                            NULL);
}

static int m_d_router_weight(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    int64_t *o = all_rows(ck);
    if (!o)
        return DL_ENOMEM;
    *mp = (dl__mprov_t){.kind = DL__M_RAGGED, .a = ck->in->x, .I = ck->d,
                        .b = EF(D_ROUTER_LOGITS), .N = ck->E, .off = o, .E = 1};
    cmp->rows = ck->d;
    cmp->cols = ck->E;
    cmp->K = ck->T;
    cmp->kappa_in = kin(ck, cmp, ck->act, DL_F32);
    return 0;
}

/* --------------------------------------------------------- input backward */

/* The shared path's terms of d_x (shared.h), on the effective values. */
static dl_shared_grad_t shared_grad(const dl__ck_t *ck)
{
    const int gated = ck->c->shared_gate != 0;
    return (dl_shared_grad_t){dl_value_dim(ck->c, 'S'), EF(D_SHARED_H_GATE), EF(D_SHARED_H_UP),
                              ck->in->shared_w_gate, ck->in->shared_w_up,
                              gated ? EF(D_SHARED_GATE_LOGIT) : NULL,
                              gated ? ck->in->shared_gate_weight : NULL};
}

static int ex_d_x(dl__ck_t *ck, dl_value_t s, float *out)
{
    const dl_shared_grad_t sh = shared_grad(ck);
    return dl_input_backward_shared(EF(D_X_SORTED), INV, EF(D_ROUTER_LOGITS),
                                    ck->in->router_weight, sh.width > 0 ? &sh : NULL, ck->T,
                                    ck->k, ck->d, ck->E, ck->act, out);
}

/* The magnitudes of the shared path's terms of d_x[t, i]. */
static double shared_dx_m(const dl_shared_grad_t *sh, int64_t t, int64_t i)
{
    const int64_t F = sh->width;
    double a = 0.0;
    for (int64_t c = 0; c < F; c++)
        a += fabs((double)sh->d_h_gate[t * F + c] * (double)sh->w_gate[i * F + c]) +
             fabs((double)sh->d_h_up[t * F + c] * (double)sh->w_up[i * F + c]);
    if (F > 0 && sh->d_gate_logit)
        a += fabs((double)sh->d_gate_logit[t] * (double)sh->gate_weight[i]);
    return a;
}

static int m_d_x(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    const dl_shared_grad_t sh = shared_grad(ck);
    const float *dxs = EF(D_X_SORTED), *dlg = EF(D_ROUTER_LOGITS), *wr = ck->in->router_weight;
    const int32_t *inv = INV;
    const int64_t d = ck->d, k = ck->k, E = ck->E;
    double *m = m_array(ck, mp, ck->numel[s]);
    if (!m)
        return DL_ENOMEM;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < ck->T; t++)
        for (int64_t i = 0; i < d; i++) {
            double a = 0.0;
            for (int64_t j = 0; j < k; j++)
                a += fabs((double)dxs[(int64_t)inv[t * k + j] * d + i]);
            for (int64_t e = 0; e < E; e++)
                a += fabs((double)dlg[t * E + e] * (double)wr[i * E + e]);
            m[t * d + i] = a + shared_dx_m(&sh, t, i);
        }
    cmp->K = k + E + (sh.width > 0 ? 2 * sh.width + (sh.d_gate_logit != NULL) : 0);
    cmp->short_sum = 1;
    cmp->kappa_in = kin(ck, cmp, DL_F32, DL_F32);
    return 0;
}

/* ------------------------------------------------------ shared experts */

/* The shared path's GEMMs run over all T tokens as one group. */
static int dense1(dl__ck_t *ck, const float *lhs, int64_t K, const float *rhs, dl_rhs_layout_t lay,
                  int64_t N, dl_dtype_t t, float *out)
{
    const int64_t all[2] = {0, ck->T};
    return grouped1(lhs, K, rhs, lay, N, all, 1, t, out);
}

static int m_dense(dl__ck_t *ck, dl__cmp_t *cmp, dl__mprov_t *mp, const float *lhs, int64_t K,
                   const float *rhs, dl_rhs_layout_t lay, int64_t N)
{
    int64_t *o = all_rows(ck);
    if (!o)
        return DL_ENOMEM;
    m_grouped(ck, cmp, mp, lhs, K, rhs, lay, N);
    mp->off = o;
    mp->E = 1;
    cmp->rows = ck->T; /* [T, N], also for the gate's logits (N = 1, stored [T]) */
    cmp->cols = N;
    return 0;
}

/* The operands of the shared path's forward GEMMs: lhs [T, K] times rhs. */
static void shared_fw_operands(const dl__ck_t *ck, dl_value_t s, const float **lhs, int64_t *K,
                               const float **rhs, int64_t *N)
{
    const int64_t F = dl_value_dim(ck->c, 'S');
    *lhs = s == DL_VALUE_SHARED_Y ? EF(SHARED_H_ACT) : ck->in->x;
    *K = s == DL_VALUE_SHARED_Y ? F : ck->d;
    *N = s == DL_VALUE_SHARED_Y ? ck->d : s == DL_VALUE_SHARED_GATE_LOGIT ? 1 : F;
    *rhs = s == DL_VALUE_SHARED_H_GATE ? ck->in->shared_w_gate
           : s == DL_VALUE_SHARED_H_UP ? ck->in->shared_w_up
           : s == DL_VALUE_SHARED_Y    ? ck->in->shared_w_down
                                       : ck->in->shared_gate_weight;
}

static int ex_shared_fw(dl__ck_t *ck, dl_value_t s, float *out)
{
    const float *lhs, *rhs;
    int64_t K, N;
    shared_fw_operands(ck, s, &lhs, &K, &rhs, &N);
    return dense1(ck, lhs, K, rhs, DL_RHS_KN, N, dl_value_store(s) == DL_STORE_ACT ? ck->act : DL_F32, out);
}

static int m_shared_fw(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    const float *lhs, *rhs;
    int64_t K, N;
    shared_fw_operands(ck, s, &lhs, &K, &rhs, &N);
    return m_dense(ck, cmp, mp, lhs, K, rhs, DL_RHS_KN, N);
}

static int ex_shared_h_act(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_swiglu(EF(SHARED_H_GATE), EF(SHARED_H_UP), ck->numel[s], ck->act, out);
}

static int m_shared_h_act(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    return m_swiglu(ck, s, EF(SHARED_H_GATE), EF(SHARED_H_UP), cmp, mp);
}

static int ex_shared_gate(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_shared_gate(EF(SHARED_GATE_LOGIT), ck->T, out);
}

/* A sigmoid: M = |g|, one certified transcendental (the router's sigmoid
 * scores' rule). */
static int m_shared_gate(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    cmp->mp = NULL;
    cmp->elem = 1;
    cmp->K = 0;
    return 0;
}

static int ex_d_shared_gate(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_shared_combine_backward(ck->in->d_out, EF(SHARED_Y), EF(SHARED_GATE), ck->T, ck->d,
                                      ck->act, out, NULL);
}

static int m_d_shared_gate(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    const float *y = EF(SHARED_Y);
    const int64_t d = ck->d;
    double *m = m_array(ck, mp, ck->numel[s]);
    if (!m)
        return DL_ENOMEM;
    for (int64_t t = 0; t < ck->T; t++) {
        double a = 0.0;
        for (int64_t i = 0; i < d; i++)
            a += fabs((double)ck->in->d_out[t * d + i] * (double)y[t * d + i]);
        m[t] = a;
    }
    cmp->K = d;
    cmp->kappa_in = kin(ck, cmp, ck->act, ck->act);
    return 0;
}

static int ex_d_shared_gate_logit(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_shared_gate_backward(EF(D_SHARED_GATE), EF(SHARED_GATE), ck->T, out);
}

/* dg g (1 - g): 1 - g, two products (the router's sigmoid VJP rule). */
static int m_d_shared_gate_logit(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    cmp->mp = NULL;
    cmp->K = 3;
    return 0;
}

static int ex_d_shared_y(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dl_shared_combine_backward(ck->in->d_out, NULL, ck->c->shared_gate ? EF(SHARED_GATE) : NULL,
                                      ck->T, ck->d, ck->act, NULL, out);
}

static int m_d_shared_y(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    cmp->mp = NULL;
    cmp->K = 1;
    return 0;
}

static int ex_d_shared_h_act(dl__ck_t *ck, dl_value_t s, float *out)
{
    return dense1(ck, EF(D_SHARED_Y), ck->d, ck->in->shared_w_down, DL_RHS_NK,
                  dl_value_dim(ck->c, 'S'), ck->act, out);
}

static int m_d_shared_h_act(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    return m_dense(ck, cmp, mp, EF(D_SHARED_Y), ck->d, ck->in->shared_w_down, DL_RHS_NK,
                   dl_value_dim(ck->c, 'S'));
}

/* A shared weight's gradient a^T b over all T tokens: [I, N] fp32. */
static void shared_dw_operands(const dl__ck_t *ck, dl_value_t s, const float **a, int64_t *I,
                               const float **b, int64_t *N)
{
    const int64_t F = dl_value_dim(ck->c, 'S');
    const int down = s == DL_VALUE_D_SHARED_W_DOWN;
    *a = down ? EF(SHARED_H_ACT) : ck->in->x;
    *I = down ? F : ck->d;
    *b = down ? EF(D_SHARED_Y) : s == DL_VALUE_D_SHARED_W_GATE ? EF(D_SHARED_H_GATE)
         : s == DL_VALUE_D_SHARED_W_UP ? EF(D_SHARED_H_UP) : EF(D_SHARED_GATE_LOGIT);
    *N = down ? ck->d : s == DL_VALUE_D_SHARED_GATE_WEIGHT ? 1 : F;
}

static int ex_d_shared_w(dl__ck_t *ck, dl_value_t s, float *out)
{
    const int64_t all[2] = {0, ck->T};
    const float *a, *b;
    int64_t I, N;
    shared_dw_operands(ck, s, &a, &I, &b, &N);
    return dl_gemm_ragged_k(a, I, b, N, all, 1, DL_F32, out, NULL);
}

static int m_d_shared_w(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    int64_t *o = all_rows(ck);
    if (!o)
        return DL_ENOMEM;
    *mp = (dl__mprov_t){.kind = DL__M_RAGGED, .off = o, .E = 1};
    shared_dw_operands(ck, s, &mp->a, &mp->I, &mp->b, &mp->N);
    cmp->rows = mp->I;
    cmp->cols = mp->N;
    cmp->K = ck->T;
    cmp->kappa_in = kin(ck, cmp, ck->act, s == DL_VALUE_D_SHARED_GATE_WEIGHT ? DL_F32 : ck->act);
    return 0;
}

/* ----------------------------------------------------------- the table */

#define F(ex, m) .exact = ex, .setup = m
static const dl__ck_desc_t table[DL_VALUE_COUNT] = {
    [DL_VALUE_ROUTER_LOGITS] = {0, 0, F(ex_router_logits, m_router_logits), 0},
    [DL_VALUE_ROUTER_SCORES] = {B(ROUTER_LOGITS), 0, F(ex_router_scores, m_router_scores), 0},
    [DL_VALUE_TOPK_IDS] = {B(ROUTER_SCORES) | B(ROUTER_LOGITS), 0, .check = dl__ck_route_ids},
    [DL_VALUE_TOPK_WEIGHTS] = {B(ROUTER_SCORES) | B(TOPK_IDS), 0,
                               F(ex_topk_weights, m_topk_weights), 0},
    [DL_VALUE_SORT_PERM] = {B(TOPK_IDS), 0, .check = dl__ck_tokens},
    [DL_VALUE_INV_PERM] = {B(TOPK_IDS), 0, .flags = DL__CK_WITH_SORT},
    [DL_VALUE_GROUP_SIZES] = {B(TOPK_IDS), 0, .flags = DL__CK_WITH_SORT},
    [DL_VALUE_GROUP_OFFSETS] = {B(TOPK_IDS), 0, .flags = DL__CK_WITH_SORT},
    [DL_VALUE_X_SORTED] = {DISPATCH, 0, F(ex_x_sorted, NULL), DL__CK_COPY},
    [DL_VALUE_H_GATE] = {B(X_SORTED) | DISPATCH, 0, F(ex_h, m_h), 0},
    [DL_VALUE_H_UP] = {B(X_SORTED) | DISPATCH, 0, F(ex_h, m_h), 0},
    [DL_VALUE_H_ACT] = {B(H_GATE) | B(H_UP), 0, F(ex_h_act, m_h_act), 0},
    [DL_VALUE_Y_SORTED] = {B(H_ACT) | DISPATCH, B(X_SORTED) | DISPATCH,
                           F(ex_y_sorted, m_y_sorted), 0},
#if DL_EXTRA_VALUE
    [DL_VALUE_Y_HALF] = {B(Y_SORTED) | DISPATCH, 0, F(ex_y_half, m_y_half), 0},
#endif
    [DL_VALUE_SHARED_H_GATE] = {0, 0, F(ex_shared_fw, m_shared_fw), 0},
    [DL_VALUE_SHARED_H_UP] = {0, 0, F(ex_shared_fw, m_shared_fw), 0},
    [DL_VALUE_SHARED_H_ACT] = {B(SHARED_H_GATE) | B(SHARED_H_UP), 0,
                               F(ex_shared_h_act, m_shared_h_act), 0},
    [DL_VALUE_SHARED_Y] = {B(SHARED_H_ACT), 0, F(ex_shared_fw, m_shared_fw), 0},
    [DL_VALUE_SHARED_GATE_LOGIT] = {0, 0, F(ex_shared_fw, m_shared_fw), 0},
    [DL_VALUE_SHARED_GATE] = {B(SHARED_GATE_LOGIT), 0, F(ex_shared_gate, m_shared_gate), 0},
    [DL_VALUE_OUT] = {B(Y_SORTED) | B(TOPK_WEIGHTS) | DISPATCH | B(SHARED_Y) | B(SHARED_GATE), 0,
                      F(ex_out, m_out),
                      DL__CK_DRIFT | DL__CK_DROPS},
    [DL_VALUE_D_TOPK_WEIGHTS] = {B(Y_SORTED) | DISPATCH, 0,
                                 F(ex_d_topk_weights, m_d_topk_weights), 0},
    [DL_VALUE_D_Y_SORTED] = {B(TOPK_WEIGHTS) | DISPATCH, 0, F(ex_d_y_sorted, m_d_y_sorted), 0},
    [DL_VALUE_D_H_ACT] = {B(D_Y_SORTED) | DISPATCH, 0, F(ex_d_h_act, m_d_h_act), 0},
    [DL_VALUE_D_W_DOWN] = {B(H_ACT) | B(D_Y_SORTED) | DISPATCH, B(X_SORTED) | B(D_Y_SORTED) | DISPATCH,
                           F(ex_d_w, m_d_w), DL__CK_DW},
    [DL_VALUE_D_H_GATE] = {B(H_GATE) | B(H_UP) | B(D_H_ACT), 0, F(ex_d_h_gu, m_d_h_gu), 0},
    [DL_VALUE_D_H_UP] = {B(H_GATE) | B(H_UP) | B(D_H_ACT), 0, F(ex_d_h_gu, m_d_h_gu), 0},
    [DL_VALUE_D_X_SORTED] = {B(D_H_GATE) | B(D_H_UP) | DISPATCH, B(D_Y_SORTED) | DISPATCH,
                             F(ex_d_x_sorted, m_d_x_sorted), 0},
    [DL_VALUE_D_W_GATE] = {B(X_SORTED) | B(D_H_GATE) | DISPATCH, 0, F(ex_d_w, m_d_w), DL__CK_DW},
    [DL_VALUE_D_W_UP] = {B(X_SORTED) | B(D_H_UP) | DISPATCH, 0, F(ex_d_w, m_d_w), DL__CK_DW},
    [DL_VALUE_D_ROUTER_SCORES] = {B(ROUTER_SCORES) | B(TOPK_IDS) | B(D_TOPK_WEIGHTS), 0,
                                  F(ex_d_router_scores, m_d_router_scores), 0},
    [DL_VALUE_D_ROUTER_LOGITS] = {B(ROUTER_SCORES) | B(D_ROUTER_SCORES), 0,
                                  F(ex_d_router_logits, m_d_router_logits), 0},
    [DL_VALUE_D_ROUTER_WEIGHT] = {B(D_ROUTER_LOGITS), 0,
                                  F(ex_d_router_weight, m_d_router_weight), 0},
    [DL_VALUE_D_SHARED_GATE] = {B(SHARED_Y) | B(SHARED_GATE), 0,
                                F(ex_d_shared_gate, m_d_shared_gate), 0},
    [DL_VALUE_D_SHARED_GATE_LOGIT] = {B(SHARED_GATE) | B(D_SHARED_GATE), 0,
                                      F(ex_d_shared_gate_logit, m_d_shared_gate_logit), 0},
    [DL_VALUE_D_SHARED_GATE_WEIGHT] = {B(D_SHARED_GATE_LOGIT), 0,
                                       F(ex_d_shared_w, m_d_shared_w), 0},
    [DL_VALUE_D_SHARED_Y] = {B(SHARED_GATE), 0, F(ex_d_shared_y, m_d_shared_y), 0},
    [DL_VALUE_D_SHARED_H_ACT] = {B(D_SHARED_Y), 0, F(ex_d_shared_h_act, m_d_shared_h_act), 0},
    [DL_VALUE_D_SHARED_W_DOWN] = {B(SHARED_H_ACT) | B(D_SHARED_Y), 0,
                                  F(ex_d_shared_w, m_d_shared_w), 0},
    [DL_VALUE_D_SHARED_H_GATE] = {B(SHARED_H_GATE) | B(SHARED_H_UP) | B(D_SHARED_H_ACT), 0,
                                  F(ex_d_h_gu, m_d_h_gu), 0},
    [DL_VALUE_D_SHARED_H_UP] = {B(SHARED_H_GATE) | B(SHARED_H_UP) | B(D_SHARED_H_ACT), 0,
                                F(ex_d_h_gu, m_d_h_gu), 0},
    [DL_VALUE_D_SHARED_W_GATE] = {B(D_SHARED_H_GATE), 0, F(ex_d_shared_w, m_d_shared_w), 0},
    [DL_VALUE_D_SHARED_W_UP] = {B(D_SHARED_H_UP), 0, F(ex_d_shared_w, m_d_shared_w), 0},
    [DL_VALUE_D_X] = {B(D_X_SORTED) | B(D_ROUTER_LOGITS) | DISPATCH | B(D_SHARED_H_GATE) |
                          B(D_SHARED_H_UP) | B(D_SHARED_GATE_LOGIT),
                      0, F(ex_d_x, m_d_x),
                      DL__CK_DRIFT},
};

int dl__ck_table_check(dl__ck_t *ck)
{
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        const dl__ck_desc_t *d = &table[s];
        const int fl = dl_value_store((dl_value_t)s) <= DL_STORE_F32;
        const int ok = d->check || (d->flags & DL__CK_WITH_SORT) ||
                       (fl && d->exact && (d->setup || (d->flags & DL__CK_COPY)));
        if (ok)
            continue;
        /* a value the table does not describe would never be checked, and
         * the report would not say so: refuse, naming it */
        dl_check_result_t *r = dl__ck_result(ck, (dl_value_t)s, "table");
        if (r) {
            r->verdict = DL_VERDICT_FAIL;
            dl__ck_msg(r, "the runner has no check for value %s (its row in src/check/desc.c "
                          "lacks an exact function and comparison setup): refusing to judge",
                       dl_value_name((dl_value_t)s));
        }
        return DL_EINVAL;
    }
    return 0;
}

const dl__ck_desc_t *dl__ck_desc(dl_value_t s)
{
    return (int)s >= 0 && s < DL_VALUE_COUNT ? &table[s] : NULL;
}

/* The values of mask m that exist for the case: a variant's values (the
 * shared experts') are no stage's upstream in a case without it, so they
 * cannot make a stage look recomputed on a changed upstream. */
static uint64_t existing(const dl__ck_t *ck, uint64_t m)
{
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        if (((m >> u) & 1) &&
            !dl_cond_applies(dl_layout_find(dl_value_name((dl_value_t)u))->cond, ck->c))
            m &= ~((uint64_t)1 << u);
    return m;
}

uint64_t dl__ck_upstream(const dl__ck_t *ck, dl_value_t s)
{
    const dl__ck_desc_t *d = dl__ck_desc(s);
    if (!d)
        return 0;
    return existing(ck, !ck->swiglu && d->up_plain ? d->up_plain : d->up);
}

dl_dtype_t dl__ck_stage_type(const dl__ck_t *ck, dl_value_t s)
{
    /* a candidate's coarser storage is judged at its own precision */
    if ((int)s >= 0 && s < DL_VALUE_COUNT && ck->cand_arr[s] && ((ck->coarse >> s) & 1))
        return ck->store[s];
    return dl_value_store(s) == DL_STORE_ACT ? ck->act : DL_F32;
}
