/* The checking side of the dispatch stages (dispatch.c): the permutation,
 * the combine and its backward, the input gradient. Their exact values on
 * the runner's effective operands, the magnitudes M of their sums, and the
 * derivative magnitudes that carry an absent upstream's error into them
 * (doc/tolerances.md, "Absent stages"):
 *   out[t] = sum_j w[t,j] y[inv[t,j]],  d_w[t,j] = <d_out[t], y[inv[t,j]]>,
 *   d_y[inv[t,j]] = w[t,j] d_out[t],
 *   d_x[t] = sum_j d_x_sorted[inv[t,j]] + d_logits[t] W_r^T,
 * plus, with shared experts, their terms (shared_check.c): g_t shared_y[t]
 * in out, and their input gradients in d_x. */
#include "config.h"
#include "stages/stages_priv.h"

#define EF(s) DL__EF(v, s)
#define INV ((const int32_t *)v->v[DL_VALUE_INV_PERM])

int dl__exact_x_sorted(const dl__vctx_t *v, float *out)
{
    if (v->c->route.weight_on_input) { /* Llama-4: the routed input, x scaled by its score */
        const float *w = dl__route_input_w(v);
        return w ? dl_route_scale_input(v->in->x, v->T, v->d, v->k, w, v->v[DL_VALUE_SORT_PERM],
                                        v->act, out)
                 : DL_ENOMEM;
    }
    return dl_permute(v->in->x, v->T, v->d, v->k, v->v[DL_VALUE_SORT_PERM], out);
}

/* -------------------------------------------------------------- combine */

int dl__exact_out(const dl__vctx_t *v, float *out)
{
    const float *sy, *sg;
    dl__shared_out_operands(v, &sy, &sg);
    return dl_combine_shared(EF(Y_SORTED), EF(TOPK_WEIGHTS), INV, sy, sg, v->T, v->k, v->d, v->act,
                             out);
}

int64_t dl__out_terms(const dl__vctx_t *v)
{
    return v->k + (v->c->shared_experts > 0); /* the shared experts' term is one more */
}

double dl__out_slot(const dl__vctx_t *v, int64_t t, int64_t j, int64_t i)
{
    const int64_t k = v->k;
    return fabs((double)EF(TOPK_WEIGHTS)[t * k + j] *
                (double)EF(Y_SORTED)[(int64_t)INV[t * k + j] * v->d + i]);
}

double dl__out_exact_elem(const dl__vctx_t *v, int64_t t, int64_t i, uint64_t drop, int *bad)
{
    const float *sy, *sg;
    dl__shared_out_operands(v, &sy, &sg);
    double p[DL__MAX_TOPK + 1];
    const int64_t n = dl__combine_terms(EF(Y_SORTED), EF(TOPK_WEIGHTS), INV, sy, sg, v->k, v->d,
                                        t, i, drop, p);
    return dl__sum_exact(p, n, v->act, bad);
}

double dl__out_mag_elem(const dl__vctx_t *v, int64_t t, int64_t i, uint64_t drop)
{
    const float *sy, *sg;
    dl__shared_out_operands(v, &sy, &sg);
    double s = 0.0;
    for (int64_t j = 0; j < v->k; j++)
        if (j >= 64 || !((drop >> j) & 1))
            s += dl__out_slot(v, t, j, i);
    return s + fabs(dl__shared_out_term(sy, sg, v->d, t, i)); /* never dropped, in every row */
}

int dl__mag_out(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < v->T; t++)
        for (int64_t i = 0; i < v->d; i++)
            a[t * v->d + i] = dl__out_mag_elem(v, t, i, 0););
    m->K = dl__out_terms(v);
    m->short_sum = 1;
    return 0;
}

double dl__out_prop_elem(const dl__vctx_t *v, int64_t t, int64_t i, uint64_t drop)
{
    const float *dy = DL__DL(v, Y_SORTED), *dw = DL__DL(v, TOPK_WEIGHTS);
    const float *y = EF(Y_SORTED), *w = EF(TOPK_WEIGHTS);
    const int32_t *inv = INV;
    const int64_t k = v->k, d = v->d;
    const float *sy, *sg;
    dl__shared_out_operands(v, &sy, &sg);
    const float *dsy = DL__DL(v, SHARED_Y), *dsg = DL__DL(v, SHARED_GATE);
    const int sh = dsy || dsg, rs = DL__RSS(v, SHARED_Y);
    const int ry = DL__RSS(v, Y_SORTED), rw = DL__RSS(v, TOPK_WEIGHTS);
    double lin = 0.0, sq = 0.0; /* the slots' rows are distinct hidden values */
    for (int64_t j = 0; j < k; j++) {
        if (j < 64 && ((drop >> j) & 1))
            continue;
        const int64_t q = inv[t * k + j];
        const double ty = fabs((double)w[t * k + j]) * (dy ? dy[q * d + i] : 0.0);
        const double tw = (dw ? dw[t * k + j] : 0.0) * fabs((double)y[q * d + i]);
        lin += (ry ? 0.0 : ty) + (rw ? 0.0 : tw);
        sq += (ry ? ty * ty : 0.0) + (rw ? tw * tw : 0.0);
    }
    const double ts = sh ? dl__shared_out_delta(sy, sg, dsy, dsg, d, t, i) : 0.0;
    return dl__comb(lin + (rs ? 0.0 : ts), sq + (rs ? ts * ts : 0.0));
}

int dl__prop_out(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    if (!DL__DL(v, Y_SORTED) && !DL__DL(v, TOPK_WEIGHTS) && !DL__DL(v, SHARED_Y) &&
        !DL__DL(v, SHARED_GATE))
        return 0;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < v->T; t++)
        for (int64_t i = 0; i < v->d; i++)
            out[t * v->d + i] += dl__out_prop_elem(v, t, i, 0););
    return 1;
}

/* ----------------------------------------------------- combine backward */

int dl__exact_d_topk_weights(const dl__vctx_t *v, float *out)
{
    return dl_combine_backward(v->in->d_out, EF(Y_SORTED), NULL, INV, v->T, v->k, v->d, v->act,
                               out, NULL);
}

int dl__mag_d_topk_weights(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    const float *y = EF(Y_SORTED);
    const int32_t *inv = INV;
    const int64_t d = v->d, k = v->k;
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t fl = 0; fl < v->M; fl++) {
        double s = 0.0;
        const float *go = v->in->d_out + (fl / k) * d, *yy = y + (int64_t)inv[fl] * d;
        for (int64_t i = 0; i < d; i++)
            s += fabs((double)go[i] * (double)yy[i]);
        a[fl] = s;
    });
    m->K = d;
    m->prod_store = 1; /* PyTorch: (d_out * y).sum(-1), the product in bf16 */
    m->nops = 2;
    m->op[0] = m->op[1] = v->act;
    return 0;
}

int dl__prop_d_topk_weights(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *dy = DL__DL(v, Y_SORTED);
    const int32_t *inv = INV;
    const int64_t k = v->k, d = v->d;
    if (!dy)
        return 0;
    const int ry = DL__RSS(v, Y_SORTED);
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t fl = 0; fl < v->M; fl++) {
        const float *go = v->in->d_out + (fl / k) * d;
        const float *e = dy + (int64_t)inv[fl] * d;
        double a = 0.0;
        for (int64_t i = 0; i < d; i++)
            a += ry ? ((double)go[i] * e[i]) * ((double)go[i] * e[i]) : fabs((double)go[i]) * e[i];
        out[fl] += ry ? sqrt(a) : a;
    });
    return 1;
}

int dl__exact_d_y_sorted(const dl__vctx_t *v, float *out)
{
    return dl_combine_backward(v->in->d_out, NULL, EF(TOPK_WEIGHTS), INV, v->T, v->k, v->d,
                               v->act, NULL, out);
}

int dl__mag_d_y_sorted(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    m->mp = NULL; /* one product, rounded once: M = |g| */
    m->K = 1;
    return 0;
}

int dl__prop_d_y_sorted(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *dw = DL__DL(v, TOPK_WEIGHTS);
    const int32_t *inv = INV;
    const int64_t k = v->k, d = v->d;
    if (!dw)
        return 0;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t fl = 0; fl < v->M; fl++) {
        const float *go = v->in->d_out + (fl / k) * d;
        const int64_t q = inv[fl];
        for (int64_t i = 0; i < d; i++)
            out[q * d + i] += dw[fl] * fabs((double)go[i]);
    });
    return 1;
}

/* ------------------------------------------------------- input backward */

int dl__exact_d_x(const dl__vctx_t *v, float *out)
{
    dl_shared_grad_t sh;
    dl__shared_grad(v, &sh);
    const float *w = v->c->route.weight_on_input ? dl__route_input_w(v) : NULL;
    if (v->c->route.weight_on_input && !w)
        return DL_ENOMEM;
    return dl__input_backward_w(EF(D_X_SORTED), w, INV, EF(D_ROUTER_LOGITS), v->in->router_weight,
                                sh.width > 0 ? &sh : NULL, v->T, v->k, v->d, DL__RW(v), v->act, out);
}

/* The weight of d_x's j-th routed term of token t: 1, or Llama-4's on the input. */
static double in_w(const float *w, int64_t tk)
{
    return w ? fabs((double)w[tk]) : 1.0;
}

int dl__mag_d_x(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    const float *dxs = EF(D_X_SORTED), *dlg = EF(D_ROUTER_LOGITS), *wr = v->in->router_weight;
    const int32_t *inv = INV;
    const int64_t d = v->d, k = v->k, E = DL__RW(v);
    dl_shared_grad_t sh;
    dl__shared_grad(v, &sh);
    const float *w = v->c->route.weight_on_input ? dl__route_input_w(v) : NULL;
    double *a = dl__mag_array(v, m, n);
    if (!a || (v->c->route.weight_on_input && !w))
        return DL_ENOMEM;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < v->T; t++)
        for (int64_t i = 0; i < d; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < k; j++)
                s += in_w(w, t * k + j) * fabs((double)dxs[(int64_t)inv[t * k + j] * d + i]);
            for (int64_t e = 0; e < E; e++)
                s += fabs((double)dlg[t * E + e] * (double)wr[i * E + e]);
            a[t * d + i] = s + dl__shared_dx_m(&sh, t, i);
        }
    m->K = k + E + dl__shared_dx_terms(&sh););
    m->short_sum = 1;
    m->nops = 2;
    m->op[0] = m->op[1] = DL_F32;
    return 0;
}

int dl__prop_d_x(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    const float *dxs = DL__DL(v, D_X_SORTED), *dlg = DL__DL(v, D_ROUTER_LOGITS);
    const float *wr = v->in->router_weight;
    const int32_t *inv = INV;
    const int64_t k = v->k, d = v->d, E = DL__RW(v);
    const int sh = v->c->shared_experts > 0 && (DL__DL(v, D_SHARED_H_GATE) || DL__DL(v, D_SHARED_H_UP) ||
                                                DL__DL(v, D_SHARED_GATE_LOGIT));
    const int wi = v->c->route.weight_on_input; /* Llama-4: w_j dxs_j, both may carry error */
    const float *dsc = wi ? DL__DL(v, ROUTER_SCORES) : NULL;
    const float *w = wi ? dl__route_input_w(v) : NULL, *ex = EF(D_X_SORTED);
    if (!dxs && !dlg && !sh && !dsc)
        return 0;
    if (wi && !w)
        return DL_ENOMEM;
    const int32_t *ids = v->v[DL_VALUE_TOPK_IDS];
    const int rx = DL__RSS(v, D_X_SORTED), rl = DL__RSS(v, D_ROUTER_LOGITS);
    const int rs = DL__RSS(v, ROUTER_SCORES);
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < v->T; t++)
        for (int64_t i = 0; i < d; i++) {
            double lin = 0.0, sq = 0.0;
            for (int64_t j = 0; dxs && j < k; j++) {
                const double a = in_w(w, t * k + j) * dxs[(int64_t)inv[t * k + j] * d + i];
                lin += rx ? 0.0 : a;
                sq += rx ? a * a : 0.0;
            }
            for (int64_t j = 0; dsc && j < k; j++) {
                const double a = dsc[t * E + ids[t * k + j]] *
                                 fabs((double)ex[(int64_t)inv[t * k + j] * d + i]);
                lin += rs ? 0.0 : a;
                sq += rs ? a * a : 0.0;
            }
            for (int64_t e = 0; dlg && e < E; e++) {
                const double a = dlg[t * E + e] * fabs((double)wr[i * E + e]);
                lin += rl ? 0.0 : a;
                sq += rl ? a * a : 0.0;
            }
            if (sh)
                dl__shared_dx_prop(v, t, i, &lin, &sq);
            out[t * d + i] += dl__comb(lin, sq);
        }
    return 1;);
}
