/* Stage-local numerics: each stage the candidate provides is compared with
 * the exact stage function of the candidate's own upstream values (golden
 * or exact ones where it provides none), so errors never compound. Where the
 * upstream is bitwise the golden's, the golden value is the exact one and
 * nothing is recomputed. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

#define B(s) ((uint64_t)1 << (s))
#define DISPATCH (B(DL_VALUE_SORT_PERM) | B(DL_VALUE_INV_PERM) | B(DL_VALUE_GROUP_SIZES) | \
                  B(DL_VALUE_GROUP_OFFSETS))

/* The stages whose stored values stage s is a function of. */
static uint64_t upstream(const dl__ck_t *ck, dl_value_t s)
{
    const int sw = ck->swiglu;
    switch (s) {
    case DL_VALUE_ROUTER_LOGITS: return 0;
    case DL_VALUE_ROUTER_SCORES: return B(DL_VALUE_ROUTER_LOGITS);
    case DL_VALUE_TOPK_IDS: return B(DL_VALUE_ROUTER_SCORES) | B(DL_VALUE_ROUTER_LOGITS);
    case DL_VALUE_TOPK_WEIGHTS: return B(DL_VALUE_ROUTER_SCORES) | B(DL_VALUE_TOPK_IDS);
    case DL_VALUE_SORT_PERM: case DL_VALUE_INV_PERM: case DL_VALUE_GROUP_SIZES:
    case DL_VALUE_GROUP_OFFSETS:
        return B(DL_VALUE_TOPK_IDS);
    case DL_VALUE_X_SORTED: return DISPATCH;
    case DL_VALUE_H_GATE: case DL_VALUE_H_UP: return B(DL_VALUE_X_SORTED) | DISPATCH;
    case DL_VALUE_H_ACT: return B(DL_VALUE_H_GATE) | B(DL_VALUE_H_UP);
    case DL_VALUE_Y_SORTED: return (sw ? B(DL_VALUE_H_ACT) : B(DL_VALUE_X_SORTED)) | DISPATCH;
    case DL_VALUE_OUT: return B(DL_VALUE_Y_SORTED) | B(DL_VALUE_TOPK_WEIGHTS) | DISPATCH;
    case DL_VALUE_D_TOPK_WEIGHTS: return B(DL_VALUE_Y_SORTED) | DISPATCH;
    case DL_VALUE_D_Y_SORTED: return B(DL_VALUE_TOPK_WEIGHTS) | DISPATCH;
    case DL_VALUE_D_H_ACT: return B(DL_VALUE_D_Y_SORTED) | DISPATCH;
    case DL_VALUE_D_W_DOWN:
        return (sw ? B(DL_VALUE_H_ACT) : B(DL_VALUE_X_SORTED)) | B(DL_VALUE_D_Y_SORTED) | DISPATCH;
    case DL_VALUE_D_H_GATE: case DL_VALUE_D_H_UP:
        return B(DL_VALUE_H_GATE) | B(DL_VALUE_H_UP) | B(DL_VALUE_D_H_ACT);
    case DL_VALUE_D_X_SORTED:
        return (sw ? B(DL_VALUE_D_H_GATE) | B(DL_VALUE_D_H_UP) : B(DL_VALUE_D_Y_SORTED)) | DISPATCH;
    case DL_VALUE_D_W_GATE: return B(DL_VALUE_X_SORTED) | B(DL_VALUE_D_H_GATE) | DISPATCH;
    case DL_VALUE_D_W_UP: return B(DL_VALUE_X_SORTED) | B(DL_VALUE_D_H_UP) | DISPATCH;
    case DL_VALUE_D_ROUTER_SCORES:
        return B(DL_VALUE_ROUTER_SCORES) | B(DL_VALUE_TOPK_IDS) | B(DL_VALUE_D_TOPK_WEIGHTS);
    case DL_VALUE_D_ROUTER_LOGITS: return B(DL_VALUE_ROUTER_SCORES) | B(DL_VALUE_D_ROUTER_SCORES);
    case DL_VALUE_D_ROUTER_WEIGHT: return B(DL_VALUE_D_ROUTER_LOGITS);
    case DL_VALUE_D_X:
        return B(DL_VALUE_D_X_SORTED) | B(DL_VALUE_D_ROUTER_LOGITS) | DISPATCH;
    default: return 0;
    }
}

/* Stages stored in sorted-row order [T*k, cols]: the candidate's rows are
 * gathered into the oracle's order before anything else. */
static int64_t row_cols(const dl__ck_t *ck, dl_value_t s)
{
    switch (s) {
    case DL_VALUE_X_SORTED: case DL_VALUE_Y_SORTED: case DL_VALUE_D_Y_SORTED:
    case DL_VALUE_D_X_SORTED:
        return ck->d;
    case DL_VALUE_H_GATE: case DL_VALUE_H_UP: case DL_VALUE_H_ACT: case DL_VALUE_D_H_ACT:
    case DL_VALUE_D_H_GATE: case DL_VALUE_D_H_UP:
        return ck->f;
    default:
        return 0;
    }
}

static int is_slot_stage(dl_value_t s)
{
    return s == DL_VALUE_TOPK_IDS || s == DL_VALUE_TOPK_WEIGHTS || s == DL_VALUE_D_TOPK_WEIGHTS;
}

#define EF(s) ((const float *)ck->eff[s])

static int grouped1(const float *lhs, int64_t K, const float *rhs, dl_rhs_layout_t lay, int64_t N,
                    const int64_t *off, int64_t E, dl_dtype_t t, float *out)
{
    dl_gemm_term_t term = {lhs, K, rhs, lay};
    return dl_gemm_grouped(&term, 1, N, off, E, t, out, NULL);
}


/* The exact value of stage s on the effective upstream, into out. */
static int compute_exact(dl__ck_t *ck, dl_value_t s, void *outv)
{
    const dl_moe_config_t *c = ck->c;
    const dl_moe_inputs_t *in = ck->in;
    const int64_t T = ck->T, d = ck->d, f = ck->f, E = ck->E, k = ck->k, M = ck->M;
    const dl_dtype_t act = ck->act;
    const int64_t *off = ck->eff[DL_VALUE_GROUP_OFFSETS];
    const int32_t *sort = ck->eff[DL_VALUE_SORT_PERM], *inv = ck->eff[DL_VALUE_INV_PERM];
    const int64_t all[2] = {0, T};
    float *out = outv;
    int bad = 0;
    switch (s) {
    case DL_VALUE_ROUTER_LOGITS:
        return grouped1(in->x, d, in->router_weight, DL_RHS_KN, E, all, 1, DL_F32, out);
    case DL_VALUE_ROUTER_SCORES:
        return dl_route_scores(&c->route, EF(DL_VALUE_ROUTER_LOGITS), T, out);
    case DL_VALUE_TOPK_WEIGHTS: {
        const int32_t *ids = ck->eff[DL_VALUE_TOPK_IDS];
        for (int64_t t = 0; t < T; t++) {
            if (!memcmp(ids + t * k, ck->exact_ids + t * k, (size_t)k * sizeof *ids))
                memcpy(out + t * k, ck->exact_weights + t * k, (size_t)k * sizeof *out);
            else
                dl__ck_weights_for_ids(&c->route, EF(DL_VALUE_ROUTER_SCORES), ids, t, k, out);
        }
        return 0;
    }
    case DL_VALUE_X_SORTED:
        return dl_permute(in->x, T, d, k, sort, out);
    case DL_VALUE_H_GATE:
        return grouped1(EF(DL_VALUE_X_SORTED), d, in->w_gate, DL_RHS_KN, f, off, E, act, out);
    case DL_VALUE_H_UP:
        return grouped1(EF(DL_VALUE_X_SORTED), d, in->w_up, DL_RHS_KN, f, off, E, act, out);
    case DL_VALUE_H_ACT:
        return dl_swiglu(EF(DL_VALUE_H_GATE), EF(DL_VALUE_H_UP), M * f, act, out);
    case DL_VALUE_Y_SORTED:
        if (ck->swiglu)
            return grouped1(EF(DL_VALUE_H_ACT), f, in->w_down, DL_RHS_KN, d, off, E, act, out);
        return grouped1(EF(DL_VALUE_X_SORTED), d, in->w_down, DL_RHS_KN, d, off, E, act, out);
    case DL_VALUE_OUT:
        return dl_combine(EF(DL_VALUE_Y_SORTED), EF(DL_VALUE_TOPK_WEIGHTS), inv, T, k, d, act, out);
    case DL_VALUE_D_TOPK_WEIGHTS: {
        const float *y = EF(DL_VALUE_Y_SORTED);
#pragma omp parallel for schedule(static) reduction(| : bad)
        for (int64_t fl = 0; fl < M; fl++)
            out[fl] = (float)dl__dot_cert(in->d_out + (fl / k) * d, 1, y + (int64_t)inv[fl] * d, 1,
                                          d, DL_F32, &bad);
        return bad ? DL_ENONFINITE : 0;
    }
    case DL_VALUE_D_Y_SORTED: {
        const float *w = EF(DL_VALUE_TOPK_WEIGHTS);
#pragma omp parallel for schedule(static)
        for (int64_t fl = 0; fl < M; fl++)
            for (int64_t i = 0; i < d; i++) /* one product of floats: exact, rounded once */
                out[(int64_t)inv[fl] * d + i] =
                    (float)dl_round((double)w[fl] * (double)in->d_out[(fl / k) * d + i], act);
        return 0;
    }
    case DL_VALUE_D_H_ACT:
        return grouped1(EF(DL_VALUE_D_Y_SORTED), d, in->w_down, DL_RHS_NK, f, off, E, act, out);
    case DL_VALUE_D_W_DOWN:
        if (ck->swiglu)
            return dl_gemm_ragged_k(EF(DL_VALUE_H_ACT), f, EF(DL_VALUE_D_Y_SORTED), d, off, E,
                                    DL_F32, out, NULL);
        return dl_gemm_ragged_k(EF(DL_VALUE_X_SORTED), d, EF(DL_VALUE_D_Y_SORTED), d, off, E,
                                DL_F32, out, NULL);
    case DL_VALUE_D_H_GATE:
    case DL_VALUE_D_H_UP: {
        /* one call gives both; keep the sibling for when its turn comes */
        float *dg = s == DL_VALUE_D_H_GATE ? out : NULL, *du = s == DL_VALUE_D_H_UP ? out : NULL;
        dl_value_t sib = s == DL_VALUE_D_H_GATE ? DL_VALUE_D_H_UP : DL_VALUE_D_H_GATE;
        float *other = dl__ck_alloc(ck, M * f, sizeof *other);
        if (!other)
            return DL_ENOMEM;
        if (!dg)
            dg = other;
        else
            du = other;
        int rc = dl_swiglu_backward(EF(DL_VALUE_H_GATE), EF(DL_VALUE_H_UP), EF(DL_VALUE_D_H_ACT),
                                    M * f, act, dg, du);
        if (!rc && !ck->exact[sib])
            ck->exact[sib] = other;
        return rc;
    }
    case DL_VALUE_D_X_SORTED:
        if (ck->swiglu) {
            dl_gemm_term_t terms[2] = {{EF(DL_VALUE_D_H_GATE), f, in->w_gate, DL_RHS_NK},
                                       {EF(DL_VALUE_D_H_UP), f, in->w_up, DL_RHS_NK}};
            return dl_gemm_grouped(terms, 2, d, off, E, act, out, NULL);
        }
        return grouped1(EF(DL_VALUE_D_Y_SORTED), d, in->w_down, DL_RHS_NK, d, off, E, act, out);
    case DL_VALUE_D_W_GATE:
        return dl_gemm_ragged_k(EF(DL_VALUE_X_SORTED), d, EF(DL_VALUE_D_H_GATE), f, off, E, DL_F32,
                                out, NULL);
    case DL_VALUE_D_W_UP:
        return dl_gemm_ragged_k(EF(DL_VALUE_X_SORTED), d, EF(DL_VALUE_D_H_UP), f, off, E, DL_F32,
                                out, NULL);
    case DL_VALUE_D_ROUTER_SCORES:
        return dl_route_backward(&c->route, EF(DL_VALUE_ROUTER_SCORES), ck->eff[DL_VALUE_TOPK_IDS],
                                 EF(DL_VALUE_D_TOPK_WEIGHTS), T, out, NULL);
    case DL_VALUE_D_ROUTER_LOGITS: {
        double *m = dl__ck_alloc(ck, T * E, sizeof *m);
        if (!m)
            return DL_ENOMEM;
        return dl__ck_score_vjp(&c->route, EF(DL_VALUE_ROUTER_SCORES),
                                EF(DL_VALUE_D_ROUTER_SCORES), T, out, m);
    }
    case DL_VALUE_D_ROUTER_WEIGHT:
        return dl_gemm_ragged_k(in->x, d, EF(DL_VALUE_D_ROUTER_LOGITS), E, all, 1, DL_F32, out,
                                NULL);
    case DL_VALUE_D_X:
        return dl_input_backward(EF(DL_VALUE_D_X_SORTED), inv, EF(DL_VALUE_D_ROUTER_LOGITS),
                                 ck->in->router_weight, ck->T, ck->k, ck->d, ck->E, ck->act, out);
    default:
        return DL_EINTERNAL;
    }
}

/* Operands off the profile's input grid for a product of types a and b. */
static int kin(const dl__ck_t *ck, dl_dtype_t a, dl_dtype_t b)
{
    return !dl__ck_on_input_grid(ck->prof, a) + !dl__ck_on_input_grid(ck->prof, b);
}

static double silu(double g)
{
    return g / (1.0 + exp(-g));
}

/* Sets up the comparison of stage s: its M provider (mp, possibly an array
 * computed here from the effective upstream) and its constants. */
static int setup_cmp(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    const dl_moe_inputs_t *in = ck->in;
    const int64_t T = ck->T, d = ck->d, f = ck->f, E = ck->E, k = ck->k, M = ck->M;
    const dl_dtype_t act = ck->act;
    const int64_t *off = ck->eff[DL_VALUE_GROUP_OFFSETS];
    const int32_t *inv = ck->eff[DL_VALUE_INV_PERM];
    const int softmax = ck->c->route.score_fn == DL_SCORE_SOFTMAX;
    memset(mp, 0, sizeof *mp);
    cmp->mp = mp;
    mp->off = off;
    mp->E = E;
    double *m = NULL;
    const int64_t n = ck->numel[s];
    switch (s) {
    case DL_VALUE_ROUTER_LOGITS: {
        int64_t *o = dl__ck_alloc(ck, 2, sizeof *o);
        if (!o)
            return DL_ENOMEM;
        o[1] = T;
        *mp = (dl__mprov_t){.kind = DL__M_GROUPED, .nterms = 1, .N = E, .off = o, .E = 1};
        mp->terms[0] = (dl_gemm_term_t){in->x, d, in->router_weight, DL_RHS_KN};
        cmp->K = d;
        cmp->kappa_in = kin(ck, act, DL_F32);
        return 0;
    }
    case DL_VALUE_ROUTER_SCORES:
        if (!(m = dl__ck_alloc(ck, n, sizeof *m)))
            return DL_ENOMEM;
        dl__ck_score_m(ck, EF(DL_VALUE_ROUTER_LOGITS), ck->exact[s], m);
        cmp->elem = 1;
        cmp->K = softmax ? E : 0;
        break;
    case DL_VALUE_TOPK_WEIGHTS:
        cmp->mp = NULL;
        cmp->K = ck->c->route.renormalize ? k + 1 : 1; /* the sum S, the quotient, scaling */
        return 0;
    case DL_VALUE_H_GATE:
    case DL_VALUE_H_UP:
        mp->kind = DL__M_GROUPED;
        mp->nterms = 1;
        mp->N = f;
        mp->terms[0] = (dl_gemm_term_t){EF(DL_VALUE_X_SORTED), d,
                                        s == DL_VALUE_H_GATE ? in->w_gate : in->w_up, DL_RHS_KN};
        cmp->K = d;
        cmp->kappa_in = kin(ck, act, act);
        return 0;
    case DL_VALUE_H_ACT: {
        const float *g = EF(DL_VALUE_H_GATE), *u = EF(DL_VALUE_H_UP);
        if (!(m = dl__ck_alloc(ck, n, sizeof *m)))
            return DL_ENOMEM;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            m[i] = fabs(silu(g[i]) * (double)u[i]);
        cmp->elem = 1;
        break;
    }
    case DL_VALUE_Y_SORTED:
        mp->kind = DL__M_GROUPED;
        mp->nterms = 1;
        mp->N = d;
        if (ck->swiglu)
            mp->terms[0] = (dl_gemm_term_t){EF(DL_VALUE_H_ACT), f, in->w_down, DL_RHS_KN};
        else
            mp->terms[0] = (dl_gemm_term_t){EF(DL_VALUE_X_SORTED), d, in->w_down, DL_RHS_KN};
        cmp->K = mp->terms[0].K;
        cmp->kappa_in = kin(ck, act, act);
        return 0;
    case DL_VALUE_OUT: {
        const float *y = EF(DL_VALUE_Y_SORTED), *w = EF(DL_VALUE_TOPK_WEIGHTS);
        if (!(m = dl__ck_alloc(ck, n, sizeof *m)))
            return DL_ENOMEM;
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < d; i++) {
                double a = 0.0;
                for (int64_t j = 0; j < k; j++)
                    a += fabs((double)w[t * k + j] * (double)y[(int64_t)inv[t * k + j] * d + i]);
                m[t * d + i] = a;
            }
        cmp->K = k;
        cmp->short_sum = 1;
        break;
    }
    case DL_VALUE_D_TOPK_WEIGHTS: {
        const float *y = EF(DL_VALUE_Y_SORTED);
        if (!(m = dl__ck_alloc(ck, n, sizeof *m)))
            return DL_ENOMEM;
#pragma omp parallel for schedule(static)
        for (int64_t fl = 0; fl < M; fl++) {
            double a = 0.0;
            const float *g = in->d_out + (fl / k) * d, *yy = y + (int64_t)inv[fl] * d;
            for (int64_t i = 0; i < d; i++)
                a += fabs((double)g[i] * (double)yy[i]);
            m[fl] = a;
        }
        cmp->K = d;
        cmp->kappa_in = kin(ck, act, act);
        break;
    }
    case DL_VALUE_D_Y_SORTED:
        cmp->mp = NULL;
        cmp->K = 1;
        return 0;
    case DL_VALUE_D_H_ACT:
        mp->kind = DL__M_GROUPED;
        mp->nterms = 1;
        mp->N = f;
        mp->terms[0] = (dl_gemm_term_t){EF(DL_VALUE_D_Y_SORTED), d, in->w_down, DL_RHS_NK};
        cmp->K = d;
        cmp->kappa_in = kin(ck, act, act);
        return 0;
    case DL_VALUE_D_W_DOWN:
    case DL_VALUE_D_W_GATE:
    case DL_VALUE_D_W_UP: {
        mp->kind = DL__M_RAGGED;
        if (s == DL_VALUE_D_W_DOWN) {
            mp->a = ck->swiglu ? EF(DL_VALUE_H_ACT) : EF(DL_VALUE_X_SORTED);
            mp->I = ck->swiglu ? f : d;
            mp->b = EF(DL_VALUE_D_Y_SORTED);
            mp->N = d;
        } else {
            mp->a = EF(DL_VALUE_X_SORTED);
            mp->I = d;
            mp->b = EF(s == DL_VALUE_D_W_GATE ? DL_VALUE_D_H_GATE : DL_VALUE_D_H_UP);
            mp->N = f;
        }
        int64_t *rk = dl__ck_alloc(ck, E * mp->I, sizeof *rk);
        if (!rk)
            return DL_ENOMEM;
        for (int64_t e = 0; e < E; e++)
            for (int64_t i = 0; i < mp->I; i++)
                rk[e * mp->I + i] = off[e + 1] - off[e];
        cmp->row_K = rk;
        cmp->rows = E * mp->I;
        cmp->cols = mp->N;
        cmp->kappa_in = kin(ck, act, act);
        return 0;
    }
    case DL_VALUE_D_H_GATE:
    case DL_VALUE_D_H_UP: {
        const float *g = EF(DL_VALUE_H_GATE), *u = EF(DL_VALUE_H_UP), *dh = EF(DL_VALUE_D_H_ACT);
        if (!(m = dl__ck_alloc(ck, n, sizeof *m)))
            return DL_ENOMEM;
        const int gate = s == DL_VALUE_D_H_GATE;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const double sg = 1.0 / (1.0 + exp(-(double)g[i]));
            if (gate) /* dh u s (1 + g (1 - s)): the two terms' magnitudes */
                m[i] = fabs((double)dh[i] * (double)u[i] * sg) *
                       (1.0 + fabs((double)g[i] * (1.0 - sg)));
            else
                m[i] = fabs((double)dh[i] * (double)g[i] * sg);
        }
        cmp->elem = 1;
        break;
    }
    case DL_VALUE_D_X_SORTED:
        mp->kind = DL__M_GROUPED;
        mp->N = d;
        if (ck->swiglu) {
            mp->nterms = 2;
            mp->terms[0] = (dl_gemm_term_t){EF(DL_VALUE_D_H_GATE), f, in->w_gate, DL_RHS_NK};
            mp->terms[1] = (dl_gemm_term_t){EF(DL_VALUE_D_H_UP), f, in->w_up, DL_RHS_NK};
            cmp->K = 2 * f;
            cmp->short_sum = 1; /* the two terms may be rounded apart and added */
        } else {
            mp->nterms = 1;
            mp->terms[0] = (dl_gemm_term_t){EF(DL_VALUE_D_Y_SORTED), d, in->w_down, DL_RHS_NK};
            cmp->K = d;
        }
        cmp->kappa_in = kin(ck, act, act);
        return 0;
    case DL_VALUE_D_ROUTER_SCORES:
        if (!(m = dl__ck_alloc(ck, n, sizeof *m)))
            return DL_ENOMEM;
        dl__ck_dscores_m(&ck->c->route, EF(DL_VALUE_ROUTER_SCORES), ck->eff[DL_VALUE_TOPK_IDS],
                         EF(DL_VALUE_D_TOPK_WEIGHTS), T, m);
        /* the longest chain of roundings: sum_j dw_j s_j (k), S^2 (2k-1),
         * the quotient and the difference */
        cmp->K = ck->c->route.renormalize ? 3 * k + 1 : 1;
        break;
    case DL_VALUE_D_ROUTER_LOGITS:
        if (!(m = dl__ck_alloc(ck, n, sizeof *m)))
            return DL_ENOMEM;
        dl__ck_score_vjp(&ck->c->route, EF(DL_VALUE_ROUTER_SCORES), EF(DL_VALUE_D_ROUTER_SCORES), T,
                         NULL, m);
        /* softmax: sigma = sum of E products (E), the difference, the product;
         * sigmoid: 1 - s, two products */
        cmp->K = softmax ? E + 2 : 3;
        break;
    case DL_VALUE_D_ROUTER_WEIGHT: {
        int64_t *o = dl__ck_alloc(ck, 2, sizeof *o);
        if (!o)
            return DL_ENOMEM;
        o[1] = T;
        *mp = (dl__mprov_t){.kind = DL__M_RAGGED, .a = in->x, .I = d,
                            .b = EF(DL_VALUE_D_ROUTER_LOGITS), .N = E, .off = o, .E = 1};
        cmp->rows = d;
        cmp->cols = E;
        cmp->K = T;
        cmp->kappa_in = kin(ck, act, DL_F32);
        return 0;
    }
    case DL_VALUE_D_X: {
        const float *dxs = EF(DL_VALUE_D_X_SORTED), *dlg = EF(DL_VALUE_D_ROUTER_LOGITS);
        const float *wr = in->router_weight;
        if (!(m = dl__ck_alloc(ck, n, sizeof *m)))
            return DL_ENOMEM;
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < d; i++) {
                double a = 0.0;
                for (int64_t j = 0; j < k; j++)
                    a += fabs((double)dxs[(int64_t)inv[t * k + j] * d + i]);
                for (int64_t e = 0; e < E; e++)
                    a += fabs((double)dlg[t * E + e] * (double)wr[i * E + e]);
                m[t * d + i] = a;
            }
        cmp->K = k + E;
        cmp->short_sum = 1;
        cmp->kappa_in = kin(ck, DL_F32, DL_F32);
        break;
    }
    default:
        return DL_EINTERNAL;
    }
    mp->kind = DL__M_ARRAY;
    mp->arr = m;
    return 0;
}

/* Bitwise (value) equality: permutes move values, they compute nothing. */
static void compare_copy(dl__ck_t *ck, const float *c, const float *x, int64_t rows, int64_t cols,
                         const uint8_t *skip, dl_check_result_t *r)
{
    int64_t bad = 0, nf = 0, first = -1, checked = 0;
    double mabs = 0.0, mulp = 0.0;
    for (int64_t q = 0; q < rows; q++) {
        if (skip && skip[q])
            continue;
        for (int64_t i = 0; i < cols; i++) {
            const int64_t idx = q * cols + i;
            checked++;
            if (!isfinite(c[idx]))
                nf++;
            if (c[idx] == x[idx])
                continue;
            bad++;
            if (first < 0) {
                first = idx;
                r->worst_cand = c[idx];
                r->worst_exact = x[idx];
            }
            double e = fabs((double)c[idx] - (double)x[idx]);
            if (e > mabs || e != e)
                mabs = e;
            double u = e / dl__ck_ulp(x[idx], ck->act);
            if (u > mulp || u != u)
                mulp = u;
        }
    }
    r->n_checked = checked;
    r->n_over_pass = r->n_over_warn = bad;
    r->n_nonfinite = nf;
    r->worst_index = first;
    r->max_abs = mabs;
    r->max_ulp = mulp;
    r->err_pass = r->err_warn = bad ? INFINITY : 0.0;
    r->verdict = bad || nf ? DL_VERDICT_FAIL : DL_VERDICT_PASS;
    if (bad)
        dl__ck_msg(r, "%lld of %lld elements are not the copied input (first at %lld: %.9g vs %.9g)",
                   (long long)bad, (long long)checked, (long long)first, r->worst_cand,
                   r->worst_exact);
    else
        dl__ck_msg(r, "all %lld elements copied exactly", (long long)checked);
}

/* dW of an expert that received no token must be exactly zero. */
static int empty_experts(dl__ck_t *ck, dl_value_t s, const float *c)
{
    const int64_t *size = ck->eff[DL_VALUE_GROUP_SIZES];
    const int64_t per = ck->numel[s] / ck->E;
    dl_check_result_t *r = dl__ck_result(ck, s, "empty_experts");
    if (!r)
        return DL_ENOMEM;
    int64_t nempty = 0, bad = 0, first = -1;
    for (int64_t e = 0; e < ck->E; e++) {
        if (size[e])
            continue;
        nempty++;
        for (int64_t i = 0; i < per; i++)
            if (c[e * per + i] != 0.0f) {
                if (first < 0) {
                    first = e * per + i;
                    r->worst_cand = c[first];
                    r->worst_exact = 0.0;
                }
                bad++;
            }
    }
    r->n_checked = nempty * per;
    r->n_over_pass = r->n_over_warn = bad;
    r->worst_index = first;
    r->verdict = bad ? DL_VERDICT_FAIL : DL_VERDICT_PASS;
    if (bad)
        dl__ck_msg(r, "%lld nonzero elements in the gradients of experts that received no token "
                      "(first: expert %lld)", (long long)bad, (long long)(first / per));
    else if (nempty)
        dl__ck_msg(r, "%lld empty experts, their gradients exactly zero", (long long)nempty);
    else
        dl__ck_msg(r, "no empty expert in this case");
    return 0;
}

/* The candidate's stage in the oracle's row order; rows it lacks are filled
 * from the exact values (and skipped by the comparison). */
static const float *gather(dl__ck_t *ck, dl_value_t s, const float *exact)
{
    const float *c = ck->cand_arr[s];
    const int64_t cols = row_cols(ck, s);
    if (!cols || !ck->row_map)
        return c;
    float *g = dl__ck_alloc(ck, ck->M * cols, sizeof *g);
    if (!g)
        return NULL;
#pragma omp parallel for schedule(static)
    for (int64_t q = 0; q < ck->M; q++) {
        const int64_t p = ck->row_map[q];
        memcpy(g + q * cols, p >= 0 ? c + p * cols : exact + q * cols, (size_t)cols * sizeof *g);
    }
    return g;
}

/* Maps an index of the oracle's layout back to the candidate's. */
static int64_t cand_index(const dl__ck_t *ck, dl_value_t s, int64_t idx)
{
    if (idx < 0)
        return idx;
    const int64_t cols = row_cols(ck, s);
    if (cols && ck->row_map) {
        const int64_t p = ck->row_map[idx / cols];
        return p >= 0 ? p * cols + idx % cols : idx;
    }
    if (is_slot_stage(s) && ck->from_canon)
        return ck->from_canon[idx];
    return idx;
}

/* Rows and columns of a stage for the comparison (blocks of rows run in
 * parallel). */
static void shape2(const dl__ck_t *ck, dl_value_t s, int64_t *rows, int64_t *cols)
{
    const int64_t rc = row_cols(ck, s);
    if (rc) {
        *rows = ck->M;
        *cols = rc;
        return;
    }
    switch (s) {
    case DL_VALUE_ROUTER_LOGITS: case DL_VALUE_ROUTER_SCORES: case DL_VALUE_D_ROUTER_SCORES:
    case DL_VALUE_D_ROUTER_LOGITS:
        *rows = ck->T;
        *cols = ck->E;
        return;
    case DL_VALUE_TOPK_WEIGHTS: case DL_VALUE_D_TOPK_WEIGHTS:
        *rows = ck->T;
        *cols = ck->k;
        return;
    case DL_VALUE_OUT: case DL_VALUE_D_X:
        *rows = ck->T;
        *cols = ck->d;
        return;
    default:
        *rows = 1;
        *cols = ck->numel[s];
        return;
    }
}

/* One float stage: exact value, comparison, effective value. */
static int float_stage(dl__ck_t *ck, dl_value_t s)
{
    const int64_t n = ck->numel[s];
    const uint64_t up = upstream(ck, s);
    int up_golden = 1;
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        if ((up >> u) & 1)
            up_golden &= ck->eff_golden[u];
    int rc;
    if (!ck->exact[s]) {
        if (up_golden && ck->gold[s] && !ck->opt.recompute_all) {
            ck->exact[s] = ck->gold[s];
            ck->exact_golden[s] = 1;
        } else {
            float *x = dl__ck_alloc(ck, n, sizeof *x);
            if (!x)
                return DL_ENOMEM;
            if ((rc = compute_exact(ck, s, x)))
                return rc;
            ck->exact[s] = x;
            ck->recomputed[s] = 1;
        }
    } else {
        ck->recomputed[s] = 1; /* a sibling left by dl_swiglu_backward */
    }
    /* (a value left by dl_swiglu_backward for its sibling lands here too) */
    if (!ck->exact_golden[s])
        ck->exact_golden[s] = ck->gold[s] &&
                              !memcmp(ck->exact[s], ck->gold[s], (size_t)n * sizeof(float));
    const float *exact = ck->exact[s];
    const float *cand = ck->cand_arr[s];
    int cand_ok = 0;
    if (cand) {
        const float *cg = gather(ck, s, exact);
        if (!cg)
            return DL_ENOMEM;
        const int64_t cols = row_cols(ck, s);
        dl_check_result_t *r;
        if (s == DL_VALUE_X_SORTED) {
            if (!(r = dl__ck_result(ck, s, "exact")))
                return DL_ENOMEM;
            compare_copy(ck, cg, exact, ck->M, ck->d, ck->row_missing, r);
        } else {
            dl__cmp_t cmp = {.stage = s, .t = dl__ck_stage_type(ck, s), .cand = cg, .exact = exact};
            dl__mprov_t mp;
            if ((rc = setup_cmp(ck, s, &cmp, &mp)))
                return rc;
            if (!cmp.rows)
                shape2(ck, s, &cmp.rows, &cmp.cols);
            if (cols)
                cmp.row_skip = ck->row_missing;
            uint8_t *row_fail = NULL;
            if (s == DL_VALUE_OUT && ck->opt.diagnose_drops) {
                if (!(row_fail = dl__ck_alloc(ck, ck->T, 1)))
                    return DL_ENOMEM;
                cmp.row_fail = row_fail;
            }
            if (!(r = dl__ck_result(ck, s, "numerics")))
                return DL_ENOMEM;
            if ((rc = dl__ck_compare(ck, &cmp, r)))
                return rc;
            if (row_fail && r->verdict == DL_VERDICT_FAIL &&
                (rc = dl__ck_diagnose_out(ck, row_fail, cg)))
                return rc;
        }
        r->worst_index = cand_index(ck, s, r->worst_index);
        if (ck->recomputed[s])
            dl__ck_msg_append(r, " [recomputed on the candidate's upstream]");
        cand_ok = r->n_nonfinite == 0;
        if (cand_ok) {
            ck->eff[s] = cg;
            ck->eff_is_cand[s] = 1;
            ck->eff_golden[s] = ck->gold[s] && !memcmp(cg, ck->gold[s], (size_t)n * sizeof(float));
        }
        if (s == DL_VALUE_D_W_DOWN || s == DL_VALUE_D_W_GATE || s == DL_VALUE_D_W_UP)
            if ((rc = empty_experts(ck, s, cand)))
                return rc;
    }
    if (!cand_ok) {
        ck->eff[s] = exact;
        ck->eff_golden[s] = ck->exact_golden[s];
    }
    return 0;
}

static int drift(dl__ck_t *ck, dl_value_t s)
{
    if (!ck->cand_arr[s] || !ck->gold[s])
        return 0;
    dl_check_result_t *r = dl__ck_result(ck, s, "drift");
    if (!r)
        return DL_ENOMEM;
    dl__cmp_t cmp = {.stage = s, .t = ck->act, .rows = ck->T, .cols = ck->d,
                     .cand = ck->cand_arr[s], .exact = ck->gold[s], .info = 1};
    return dl__ck_compare(ck, &cmp, r);
}

static int skip(dl__ck_t *ck, dl_value_t s, const char *why)
{
    dl_check_result_t *r = dl__ck_result(ck, s, "provided");
    if (!r)
        return DL_ENOMEM;
    r->verdict = DL_VERDICT_SKIP;
    dl__ck_msg(r, "%s", why);
    return 0;
}

int dl__ck_stages(dl__ck_t *ck)
{
    int rc;
    /* which stages' values are needed: the candidate's, and their upstream */
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        ck->need[s] = ck->cand_arr[s] != NULL;
    for (int s = DL_VALUE_COUNT - 1; s >= 0; s--)
        if (ck->need[s]) {
            uint64_t up = upstream(ck, (dl_value_t)s);
            for (int u = 0; u < s; u++)
                if ((up >> u) & 1)
                    ck->need[u] = 1;
        }
    /* routing and dispatch are cheap and always needed for token accounting */
    for (int s = 0; s <= DL_VALUE_GROUP_OFFSETS; s++)
        ck->need[s] = 1;

    for (int si = 0; si < DL_VALUE_COUNT; si++) {
        const dl_value_t s = (dl_value_t)si;
        if (ck->numel[s] == 0)
            continue;
        const int bad_shape = (ck->cand->bad_shape >> s) & 1;
        const int has = dl_value_array(&ck->cand->fwd, &ck->cand->bwd, s) != NULL;
        if (dl_value_is_backward(s) && !ck->have_bwd) {
            if (has && !bad_shape && (rc = skip(ck, s, "the golden has no backward pass")))
                return rc;
            continue;
        }
        if (s == DL_VALUE_TOPK_IDS) {
            if ((rc = dl__ck_route_ids(ck)))
                return rc;
        } else if (s == DL_VALUE_SORT_PERM) {
            if ((rc = dl__ck_tokens(ck)))
                return rc;
        } else if (s == DL_VALUE_INV_PERM || s == DL_VALUE_GROUP_SIZES ||
                   s == DL_VALUE_GROUP_OFFSETS) {
            /* done with sort_perm */
        } else if (ck->need[s]) {
            if ((rc = float_stage(ck, s)))
                return rc;
        }
        if (!has && !bad_shape && (rc = skip(ck, s, "not provided")))
            return rc;
        if (s == DL_VALUE_OUT) {
            if ((rc = dl__ck_zero_drops(ck)) || (rc = drift(ck, s)))
                return rc;
        }
        if (s == DL_VALUE_D_X && (rc = drift(ck, s)))
            return rc;
    }
    return 0;
}
