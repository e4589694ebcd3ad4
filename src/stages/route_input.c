/* Llama-4's routing weight on the expert input (route.weight_on_input):
 * the score of a token's expert scales the token's row before the expert
 * (x_sorted[p] = RN_t(x[t] s[t, e])), the experts' outputs are summed
 * unweighted, and the scores' gradient is the dot of the routed input's
 * gradient with the token (d s[t, e] = <d_x_sorted[p], x[t]>). Every value
 * is exact then rounded once: a product of two floats is exact in binary64
 * and one dl_round; the dot goes through the exact accumulator. Tokens and
 * rows are independent, so OpenMP goes over them. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include "stages/stages_priv.h"

/* n rows of k expert ids, each in [0, E) and none twice in a row: the
 * selections of Llama-4's weights and hash routing's table. */
int dl__route_rows_ok(const int32_t *ids, int64_t n, int64_t k, int64_t E)
{
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < k; j++) {
            const int32_t e = ids[t * k + j];
            if (e < 0 || e >= E)
                return DL_ERANGE;
            for (int64_t i = 0; i < j; i++)
                if (ids[t * k + i] == e)
                    return DL_EINVAL;
        }
    return 0;
}

static int perm_ok(const int32_t *p, int64_t M)
{
    for (int64_t r = 0; r < M; r++)
        if (p[r] < 0 || p[r] >= M)
            return DL_ERANGE;
    return 0;
}

int dl_route_input_weights(const dl_route_config_t *c, const float *scores, const int32_t *ids,
                           int64_t T, float *w_in)
{
    int rc = dl_route_config_validate(c);
    int64_t nk;
    if (rc || !c->weight_on_input || T < 0)
        return rc ? rc : DL_EINVAL;
    if (dl_mul_size(T, c->top_k, &nk))
        return DL_EOVERFLOW;
    if (T > 0 && (!scores || !ids || !w_in))
        return DL_EINVAL;
    if ((rc = dl__route_rows_ok(ids, T, c->top_k, c->experts)))
        return rc;
    for (int64_t i = 0; i < nk; i++)
        w_in[i] = scores[(i / c->top_k) * c->experts + ids[i]];
    return 0;
}

int dl__scale_input_rows(const float *x, int64_t d, int64_t k, const float *w_in,
                         const int32_t *sort_perm, int64_t r0, int64_t r1, dl_dtype_t t,
                         float *out)
{
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t p = r0; p < r1; p++) {
        const int64_t tk = sort_perm[p] / k;
        const double w = w_in[sort_perm[p]];
        for (int64_t i = 0; i < d; i++) {
            const double v = dl_round((double)x[tk * d + i] * w, t); /* exact product */
            bad |= !isfinite(v);
            out[(p - r0) * d + i] = (float)v; /* IEEE signs, as a framework's product */
        }
    }
    return bad ? DL_ENONFINITE : 0;
}

int dl_route_scale_input(const float *x, int64_t T, int64_t d, int64_t k, const float *w_in,
                         const int32_t *sort_perm, dl_dtype_t t, float *x_sorted)
{
    int64_t M;
    if (T < 0 || d < 0 || k < 1 || dl_mul_size(T, k, &M))
        return DL_EINVAL;
    if (t != DL_F32 && t != DL_BF16 && t != DL_F16)
        return DL_EDTYPE;
    if (M == 0 || d == 0)
        return 0;
    if (!x || !w_in || !sort_perm || !x_sorted)
        return DL_EINVAL;
    int rc = perm_ok(sort_perm, M);
    return rc ? rc : dl__scale_input_rows(x, d, k, w_in, sort_perm, 0, M, t, x_sorted);
}

/* Token t's selected d_scores (sel[j] for ids[j]): the exact dots, rounded once. */
static int dot_token(const float *x, int64_t d, const float *dxs, const int32_t *inv,
                     int64_t k, float *sel)
{
    for (int64_t j = 0; j < k; j++) {
        dl_acc_t acc;
        dl_acc_clear(&acc);
        const float *g = dxs + (int64_t)inv[j] * d;
        for (int64_t i = 0; i < d; i++)
            dl_acc_add_prod(&acc, g[i], x[i]);
        const double r = dl_acc_round(&acc, DL_F32);
        if (!isfinite(r))
            return DL_ENONFINITE;
        sel[j] = r == 0.0 ? 0.0f : (float)r;
    }
    return 0;
}

static int backward_args(const dl_route_config_t *c, const float *x, int64_t d,
                         const float *dxs, const int32_t *inv, const float *scores,
                         const int32_t *ids, int64_t T)
{
    int rc = dl_route_config_validate(c);
    int64_t n, M;
    if (rc || !c->weight_on_input || T < 0 || d < 0)
        return rc ? rc : DL_EINVAL;
    if (dl_mul_size(T, c->experts, &n) || dl_mul_size(T, c->top_k, &M))
        return DL_EOVERFLOW;
    if (T > 0 && (!x || !dxs || !inv || !scores || !ids))
        return DL_EINVAL;
    if ((rc = dl__route_rows_ok(ids, T, c->top_k, c->experts)) || (rc = perm_ok(inv, M)))
        return rc;
    return 0;
}

int dl_route_input_backward(const dl_route_config_t *c, const float *x, int64_t d,
                            const float *d_x_sorted, const int32_t *inv_perm,
                            const float *scores, const int32_t *ids, int64_t T,
                            float *d_scores, float *d_logits)
{
    int rc = backward_args(c, x, d, d_x_sorted, inv_perm, scores, ids, T);
    if (rc || T == 0 || (!d_scores && !d_logits))
        return rc;
    const int64_t E = c->experts, k = c->top_k;
    int err = 0, nomem = 0;
#pragma omp parallel reduction(| : nomem)
    {
        float *row = malloc((size_t)E * sizeof *row), sel[DL__MAX_TOPK];
        nomem = !row;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            if (!row)
                continue;
            int e = dot_token(x + t * d, d, d_x_sorted, inv_perm + t * k, k, sel);
            float *ds = d_scores ? d_scores + t * E : row;
            for (int64_t i = 0; i < E; i++)
                ds[i] = 0.0f;
            for (int64_t j = 0; !e && j < k; j++)
                ds[ids[t * k + j]] = sel[j];
            if (!e && d_logits)
                e = dl__route_scores_vjp_row(c, scores + t * E, ds, d_logits + t * E);
            if (e) {
#pragma omp critical(dl__route_input_err)
                err = err ? err : e;
            }
        }
        free(row);
    }
    return nomem ? DL_ENOMEM : err;
}
