/* Token bookkeeping: stable counting sort of assignments, permute, combine. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "stages/stages_priv.h"


int dl_sort_assignments(const int32_t *ids, int64_t T, int64_t k, int64_t E,
                        int32_t *sort_perm, int32_t *inv_perm,
                        int64_t *group_sizes, int64_t *group_offsets)
{
    return dl__sort_assignments_z(ids, T, k, E, 0, sort_perm, inv_perm, group_sizes,
                                  group_offsets);
}

/* The counting sort over E + Z buckets: the zero experts' Z buckets after
 * the real experts' E, so their rows are the tail [group_offsets[E], M),
 * by zero expert then flat index; group_sizes [E], group_offsets [E + 1]
 * count the real experts only. */
int dl__sort_assignments_z(const int32_t *ids, int64_t T, int64_t k, int64_t E, int64_t Z,
                           int32_t *sort_perm, int32_t *inv_perm, int64_t *group_sizes,
                           int64_t *group_offsets)
{
    int64_t M;
    if (T < 0 || k < 1 || E < 1 || Z < 0 || Z > INT32_MAX - E || !group_sizes || !group_offsets)
        return DL_EINVAL;
    if (dl_mul_size(T, k, &M))
        return DL_EOVERFLOW;
    if (M > INT32_MAX)
        return DL_EOVERFLOW;
    if (M > 0 && (!ids || !sort_perm))
        return DL_EINVAL;
    const int64_t W = E + Z;
    int64_t *next = calloc((size_t)W + 1, sizeof *next);
    if (!next)
        return DL_ENOMEM;
    for (int64_t f = 0; f < M; f++) {
        if (ids[f] < 0 || ids[f] >= W) {
            free(next);
            return DL_ERANGE;
        }
        next[ids[f] + 1]++;
    }
    for (int64_t e = 0; e < W; e++) /* next[e]: bucket e's first row */
        next[e + 1] += next[e];
    group_offsets[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        group_sizes[e] = next[e + 1] - next[e];
        group_offsets[e + 1] = next[e + 1];
    }
    /* a forward sweep keeps equal experts in flat-index order: stable */
    for (int64_t f = 0; f < M; f++) {
        int64_t p = next[ids[f]]++;
        sort_perm[p] = (int32_t)f;
        if (inv_perm)
            inv_perm[f] = (int32_t)p;
    }
    free(next);
    return 0;
}

int dl__identity_tail(const dl_moe_config_t *c, int64_t rows, const int64_t *off, int64_t ne,
                      const float *src, int64_t n, float *dst)
{
    if (c->route.zero_experts <= 0 || !off || !dst)
        return 0;
    const int64_t r0 = off[ne] - off[0];
    for (int64_t r = r0; r < rows; r++) {
        if (src)
            memcpy(dst + r * n, src + r * n, (size_t)n * sizeof *dst);
        else
            memset(dst + r * n, 0, (size_t)n * sizeof *dst);
    }
    return 0;
}

int dl_permute(const float *x, int64_t T, int64_t d, int64_t k,
               const int32_t *sort_perm, float *x_sorted)
{
    int64_t M;
    if (T < 0 || d < 0 || k < 1 || dl_mul_size(T, k, &M))
        return DL_EINVAL;
    if (M > 0 && d > 0 && (!x || !sort_perm || !x_sorted))
        return DL_EINVAL;
    for (int64_t p = 0; p < M; p++)
        if (sort_perm[p] < 0 || sort_perm[p] >= M)
            return DL_ERANGE;
    return dl__permute_rows(x, d, k, sort_perm, 0, M, x_sorted);
}

int dl__permute_rows(const float *x, int64_t d, int64_t k, const int32_t *sort_perm, int64_t r0,
                     int64_t r1, float *out)
{
#pragma omp parallel for schedule(static)
    for (int64_t p = r0; p < r1; p++)
        memcpy(out + (p - r0) * d, x + (sort_perm[p] / k) * d, (size_t)d * sizeof *x);
    return 0;
}

static int check_inv(const int32_t *inv_perm, int64_t M)
{
    if (M > 0 && !inv_perm)
        return DL_EINVAL;
    for (int64_t f = 0; f < M; f++)
        if (inv_perm[f] < 0 || inv_perm[f] >= M)
            return DL_ERANGE;
    return 0;
}

/* The checks the combine and its gradients share: shapes (M = T*k), the
 * caller's verdict on its arrays, the inverse permutation's range. */
static int rows_args(int64_t T, int64_t d, int64_t k, int arrays_ok, const int32_t *inv_perm,
                     int64_t *M)
{
    if (T < 0 || d < 0 || k < 1 || k > DL__MAX_TOPK || dl_mul_size(T, k, M) || !arrays_ok)
        return DL_EINVAL;
    return check_inv(inv_perm, *M);
}

int dl_combine(const float *y_sorted, const float *w, const int32_t *inv_perm,
               int64_t T, int64_t k, int64_t d, dl_dtype_t t, float *out)
{
    return dl_combine_shared(y_sorted, w, inv_perm, NULL, NULL, T, k, d, t, out);
}

int dl_combine_shared(const float *y_sorted, const float *w, const int32_t *inv_perm,
                      const float *shared_y, const float *gate, int64_t T, int64_t k,
                      int64_t d, dl_dtype_t t, float *out)
{
    int64_t M;
    int rc = rows_args(T, d, k, !(T > 0 && d > 0 && (!y_sorted || !w || !inv_perm || !out)),
                       inv_perm, &M);
    if (rc)
        return rc;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t tk = 0; tk < T; tk++) {
        for (int64_t i = 0; i < d; i++) {
            /* the slots' products (exact in binary64), then the shared
             * experts' output scaled by its gate; rounded once */
            double p[DL__MAX_TOPK + 1];
            const int64_t n = dl__combine_terms(y_sorted, w, inv_perm, shared_y, gate, k, d, tk,
                                                i, 0, p);
            out[tk * d + i] = (float)dl__sum_exact(p, n, t, &bad);
        }
    }
    return bad ? DL_ENONFINITE : 0;
}

int dl__combine_backward(const float *y_sorted, const float *w, const int32_t *inv_perm,
                         const float *d_out, int64_t T, int64_t k, int64_t d, dl_dtype_t t,
                         int64_t r0, int64_t r1, float *d_w, float *d_y)
{
    const int64_t M = T * k;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t fl = 0; fl < M; fl++) {
        const int64_t p = inv_perm[fl];
        const float *g = d_out + (fl / k) * d;
        if (d_w)
            d_w[fl] = (float)dl__dot_cert(g, 1, y_sorted + p * d, 1, d, DL_F32, &bad);
        if (!d_y || p < r0 || p >= r1)
            continue;
        /* one product of floats per element: exact, then rounded once */
        dl__round_scaled(g, w[fl], d, t, d_y + (p - r0) * d);
    }
    return bad ? DL_ENONFINITE : 0;
}

int dl_combine_backward(const float *d_out, const float *y_sorted, const float *w,
                        const int32_t *inv_perm, int64_t T, int64_t k, int64_t d, dl_dtype_t t,
                        float *d_w, float *d_y_sorted)
{
    int64_t M;
    int rc = rows_args(T, d, k, !(T > 0 && (!d_out || !inv_perm || (d_w && !y_sorted) ||
                                            (d_y_sorted && !w))),
                       inv_perm, &M);
    if (rc)
        return rc;
    return dl__combine_backward(y_sorted, w, inv_perm, d_out, T, k, d, t, 0, M, d_w, d_y_sorted);
}

int dl_unpermute_sum(const float *d_x_sorted, const int32_t *inv_perm, int64_t T,
                     int64_t k, int64_t d, dl_dtype_t t, float *d_x)
{
    int64_t M;
    int rc = rows_args(T, d, k, !(T > 0 && d > 0 && (!d_x_sorted || !inv_perm || !d_x)),
                       inv_perm, &M);
    if (rc)
        return rc;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t tk = 0; tk < T; tk++)
        for (int64_t i = 0; i < d; i++) {
            double p[DL__MAX_TOPK];
            for (int64_t j = 0; j < k; j++)
                p[j] = d_x_sorted[(int64_t)inv_perm[tk * k + j] * d + i];
            d_x[tk * d + i] = (float)dl__sum_exact(p, k, t, &bad);
        }
    return bad ? DL_ENONFINITE : 0;
}

int dl_input_backward(const float *d_x_sorted, const int32_t *inv_perm, const float *d_logits,
                      const float *w_r, int64_t T, int64_t k, int64_t d, int64_t E,
                      dl_dtype_t t, float *d_x)
{
    return dl_input_backward_shared(d_x_sorted, inv_perm, d_logits, w_r, NULL, T, k, d, E, t,
                                    d_x);
}

/* The shared path's terms of d_x[t, i] into p (returns how many). */
static int64_t shared_terms(const dl_shared_grad_t *sh, int64_t tk, int64_t i, double *p)
{
    const int64_t F = sh->width;
    int64_t n = 0;
    for (int64_t c = 0; c < F; c++) { /* float products: exact in binary64 */
        if (sh->d_h_gate) /* a gated FFN's gate (relu2: none) */
            p[n++] = (double)sh->d_h_gate[tk * F + c] * (double)sh->w_gate[i * F + c];
        p[n++] = (double)sh->d_h_up[tk * F + c] * (double)sh->w_up[i * F + c];
    }
    if (sh->d_gate_logit)
        p[n++] = (double)sh->d_gate_logit[tk] * (double)sh->gate_weight[i];
    return n;
}

static int shared_args(const dl_shared_grad_t *sh)
{
    if (sh->width < 0 || (sh->width > 0 && (!sh->d_h_gate != !sh->w_gate || !sh->d_h_up ||
                                            !sh->w_up)))
        return DL_EINVAL;
    return !sh->d_gate_logit != !sh->gate_weight ? DL_EINVAL : 0;
}

int dl_input_backward_shared(const float *d_x_sorted, const int32_t *inv_perm,
                             const float *d_logits, const float *w_r, const dl_shared_grad_t *sh,
                             int64_t T, int64_t k, int64_t d, int64_t E, dl_dtype_t t, float *d_x)
{
    return dl__input_backward_w(d_x_sorted, NULL, inv_perm, d_logits, w_r, sh, T, k, d, E, t,
                                d_x);
}

/* d_x without shared experts, DX_B features of a token at a time: each
 * sum's binary64 value s and magnitude m in vector lanes, the k routed
 * terms and then the E router terms (products of floats: exact). Any
 * order of a recursive sum obeys |s - exact| <= gamma_{n-1} sum|p|, the
 * bound dl__sum_exact certifies (core/acc.c's certified_sum: the 2^-40
 * covers m's own rounding), so a decided element is the exact sum rounded
 * once, as dl__sum_exact's; an undecided one takes dl__sum_exact itself.
 * wt is w_r transposed ([E, d]: the lanes read consecutive features). */
enum { DX_B = 16 };

/* The k + E terms of token tk's element i into p (products of floats:
 * exact in binary64): the k routed rows (w_in: Llama-4's weight on the
 * input) and the E router terms, w_r's element (i, e) at
 * wr[e * se + i * si] (w_r itself: se 1, si E; transposed: se d, si 1). */
static void d_x_terms(const float *d_x_sorted, const float *w_in, const int32_t *inv_perm,
                      const float *d_logits, const float *wr, int64_t se, int64_t si, int64_t tk,
                      int64_t i, int64_t k, int64_t d, int64_t E, double *p)
{
    for (int64_t j = 0; j < k; j++)
        p[j] = (w_in ? (double)w_in[tk * k + j] : 1.0) * d_x_sorted[(int64_t)inv_perm[tk * k + j] * d + i];
    for (int64_t e = 0; e < E; e++)
        p[k + e] = (double)d_logits[tk * E + e] * (double)wr[e * se + i * si];
}

static void d_x_token(const float *d_x_sorted, const float *w_in, const int32_t *inv_perm,
                      const float *d_logits, const float *wt, int64_t tk, int64_t k, int64_t d,
                      int64_t E, dl_dtype_t t, double *p, float *d_x, int *bad)
{
    const double nu = (double)(k + E - 1) * 0x1p-53, gam = nu / (1.0 - nu) * (1.0 + 0x1p-40);
    for (int64_t i0 = 0; i0 < d; i0 += DX_B) {
        const int64_t nb = d - i0 < DX_B ? d - i0 : DX_B;
        double s[DX_B] = {0}, m[DX_B] = {0};
        for (int64_t j = 0; j < k; j++) {
            const float *row = d_x_sorted + (int64_t)inv_perm[tk * k + j] * d + i0;
            const double w = w_in ? (double)w_in[tk * k + j] : 1.0;
#pragma omp simd
            for (int64_t b = 0; b < nb; b++)
                s[b] += w * (double)row[b], m[b] += fabs(w * (double)row[b]);
        }
        for (int64_t e = 0; e < E; e++) {
            const double g = d_logits[tk * E + e];
            const float *col = wt + e * d + i0;
#pragma omp simd
            for (int64_t b = 0; b < nb; b++)
                s[b] += g * (double)col[b], m[b] += fabs(g * (double)col[b]);
        }
        for (int64_t b = 0; b < nb; b++) {
            double r;
            if (!isfinite(m[b]) || !dl__certify(s[b], gam * m[b], t, &r)) {
                d_x_terms(d_x_sorted, w_in, inv_perm, d_logits, wt, d, 1, tk, i0 + b, k, d, E, p);
                r = dl__sum_exact(p, k + E, t, bad);
            }
            d_x[tk * d + i0 + b] = (float)r;
        }
    }
}

/* d_x with shared experts: each element's terms gathered, dl__sum_exact. */
static void d_x_token_shared(const float *d_x_sorted, const float *w_in, const int32_t *inv_perm,
                             const float *d_logits, const float *w_r, const dl_shared_grad_t *sh,
                             int64_t tk, int64_t k, int64_t d, int64_t E, dl_dtype_t t, double *p,
                             float *d_x, int *bad)
{
    for (int64_t i = 0; i < d; i++) {
        d_x_terms(d_x_sorted, w_in, inv_perm, d_logits, w_r, 1, E, tk, i, k, d, E, p);
        const int64_t ns = shared_terms(sh, tk, i, p + k + E);
        d_x[tk * d + i] = (float)dl__sum_exact(p, k + E + ns, t, bad);
    }
}

int dl__input_backward_w(const float *d_x_sorted, const float *w_in, const int32_t *inv_perm,
                         const float *d_logits, const float *w_r, const dl_shared_grad_t *sh,
                         int64_t T, int64_t k, int64_t d, int64_t E, dl_dtype_t t, float *d_x)
{
    int64_t M;
    if (T < 0 || d < 0 || k < 1 || E < 1 || dl_mul_size(T, k, &M) || (sh && shared_args(sh)))
        return DL_EINVAL;
    if (T > 0 && d > 0 && (!d_x_sorted || !inv_perm || !d_logits || !w_r || !d_x))
        return DL_EINVAL;
    int rc = check_inv(inv_perm, M);
    if (rc)
        return rc;
    const int64_t n = k + E + (sh ? 2 * sh->width + 1 : 0);
    float *wt = sh ? NULL : malloc((size_t)(d * E + 1) * sizeof *wt);
    if (!sh && !wt)
        return DL_ENOMEM;
    for (int64_t i = 0; !sh && i < d; i++)
        for (int64_t e = 0; e < E; e++)
            wt[e * d + i] = w_r[i * E + e];
    int bad = 0, nomem = 0;
#pragma omp parallel reduction(| : bad, nomem)
    {
        double *p = malloc((size_t)n * sizeof *p);
        if (!p)
            nomem = 1;
#pragma omp for schedule(static)
        for (int64_t tk = 0; tk < T; tk++) {
            if (p && sh)
                d_x_token_shared(d_x_sorted, w_in, inv_perm, d_logits, w_r, sh, tk, k, d, E, t,
                                 p, d_x, &bad);
            else if (p)
                d_x_token(d_x_sorted, w_in, inv_perm, d_logits, wt, tk, k, d, E, t, p, d_x, &bad);
        }
        free(p);
    }
    free(wt);
    return nomem ? DL_ENOMEM : bad ? DL_ENONFINITE : 0;
}
