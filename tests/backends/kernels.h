/* kernels.h: plain CPU kernels shared by the example backends.
 *
 * Every stage of the plugin ABI, written the way a straightforward fp32
 * implementation would be: each dot product accumulated in one float, in
 * natural index order, and each stored value rounded once from that float
 * to the case's storage type. They depend on dropless/backend.h (so on
 * DLPack) and the C library alone, like any plugin.
 *
 * The options reproduce two common variations: tf32 rounds both operands of
 * every matrix product to tf32 (10 explicit mantissa bits) before
 * multiplying, as tensor cores do in TF32 mode; keep marks which
 * assignments a capacity-limited router kept (NULL: all of them).
 */
#ifndef DL_EXAMPLE_KERNELS_H
#define DL_EXAMPLE_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <dropless/backend.h>

typedef struct {
    int tf32;              /* round matrix-product operands to tf32 */
    const uint8_t *keep;   /* [T*k] 1 = the assignment t*k+j was kept; NULL = all */
    uint64_t order_salt;   /* nonzero: combine starts each sum at a slot chosen
                            * from this salt (a stand-in for thread timing) */
} ex_opts_t;

#define EX_F32(t) dl_backend_f32(t)
#define EX_I32(t) dl_backend_i32(t)
#define EX_I64(t) dl_backend_i64(t)

/* Round x to p significant bits, ties to even, with subnormals below 2^emin
 * and overflow to infinity above maxv. Scaling by powers of two and
 * nearbyint are exact in double, so one rounding happens. */
static inline float ex_round(double x, int p, int emin, double maxv)
{
    if (x == 0 || !isfinite(x))
        return (float)x;
    int e;
    frexp(x, &e);
    int lead = e - 1 < emin ? emin : e - 1;
    double q = ldexp(1.0, lead - (p - 1));
    double r = nearbyint(x / q) * q;
    if (fabs(r) > maxv)
        return (float)copysign(INFINITY, x);
    return (float)r;
}

/* The case's activation storage type. fp32 values are already stored. */
static inline float ex_act(const dl_backend_config_t *c, float v)
{
    switch (c->dtype) {
    case DL_BACKEND_BF16:
        return ex_round(v, 8, -126, ldexp(2.0 - ldexp(1.0, -7), 127));
    case DL_BACKEND_FP16:
        return ex_round(v, 11, -14, 65504.0);
    default:
        return v;
    }
}

/* An operand of a matrix product. */
static inline float ex_in(const ex_opts_t *o, float v)
{
    return o && o->tf32 ? ex_round(v, 11, -126, ldexp(2.0 - ldexp(1.0, -10), 127)) : v;
}

/* inv[f] = the sorted position of assignment f, from sort_perm; entries
 * that are not a valid flat index (a dropped slot) are skipped. */
static inline int32_t *ex_inverse(const int32_t *perm, int64_t M)
{
    int32_t *inv = malloc((size_t)(M > 0 ? M : 1) * sizeof *inv);
    if (!inv)
        return NULL;
    for (int64_t f = 0; f < M; f++)
        inv[f] = -1;
    for (int64_t p = 0; p < M; p++)
        if (perm[p] >= 0 && perm[p] < M)
            inv[perm[p]] = (int32_t)p;
    return inv;
}

/* ------------------------------------------------------------- forward */

static inline float ex_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static inline int ex_router(const dl_backend_config_t *c, const ex_opts_t *o,
                            const dl_backend_router_args_t *a)
{
    const int64_t T = c->tokens, d = c->hidden, E = c->experts, k = c->top_k;
    const float *x = EX_F32(a->x), *W = EX_F32(a->router_weight);
    const float *bias = EX_F32(a->expert_bias);
    float *logits = EX_F32(a->router_logits), *scores = EX_F32(a->router_scores);
    float *w = EX_F32(a->topk_weights);
    int32_t *ids = EX_I32(a->topk_ids);
    float *key = malloc((size_t)E * sizeof *key);
    float *gscore = malloc((size_t)c->n_group * sizeof *gscore);
    uint8_t *allowed = malloc((size_t)E), *used = malloc((size_t)E);
    if (!key || !gscore || !allowed || !used) {
        free(key), free(gscore), free(allowed), free(used);
        return 1;
    }
    for (int64_t t = 0; t < T; t++) {
        float *l = logits + t * E, *s = scores + t * E;
        for (int64_t e = 0; e < E; e++) {
            float acc = 0;
            for (int64_t i = 0; i < d; i++)
                acc += ex_in(o, x[t * d + i]) * ex_in(o, W[i * E + e]);
            l[e] = acc;
        }
        if (c->score_fn == DL_BACKEND_SOFTMAX) {
            float mx = l[0], sum = 0;
            for (int64_t e = 1; e < E; e++)
                mx = l[e] > mx ? l[e] : mx;
            for (int64_t e = 0; e < E; e++)
                sum += s[e] = expf(l[e] - mx);
            for (int64_t e = 0; e < E; e++)
                s[e] /= sum;
        } else {
            for (int64_t e = 0; e < E; e++)
                s[e] = ex_sigmoid(l[e]);
        }
        for (int64_t e = 0; e < E; e++) {
            key[e] = bias ? s[e] + bias[e] : s[e];
            allowed[e] = 1;
        }
        if (c->n_group > 1) {
            /* score the groups, keep the best topk_group (ties: lower group) */
            const int64_t G = c->n_group, per = E / G;
            const int64_t take = c->group_score == DL_BACKEND_GROUP_MAX         ? 1
                                 : c->group_score == DL_BACKEND_GROUP_TOP2_SUM ? 2
                                                                               : k / c->topk_group;
            for (int64_t g = 0; g < G; g++) {
                float sum = 0;
                memset(used, 0, (size_t)per);
                for (int64_t n = 0; n < take && n < per; n++) {
                    int64_t best = -1;
                    for (int64_t e = 0; e < per; e++)
                        if (!used[e] && (best < 0 || key[g * per + e] > key[g * per + best]))
                            best = e;
                    used[best] = 1;
                    sum += key[g * per + best];
                }
                gscore[g] = sum;
            }
            for (int64_t e = 0; e < E; e++)
                allowed[e] = 0;
            for (int64_t n = 0; n < c->topk_group; n++) {
                int64_t best = -1;
                for (int64_t g = 0; g < G; g++)
                    if (!allowed[g * per] && (best < 0 || gscore[g] > gscore[best]))
                        best = g;
                for (int64_t e = 0; e < per; e++)
                    allowed[best * per + e] = 1;
            }
        }
        /* the k best allowed keys, best first, ties to the lower index */
        float ssum = 0;
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++)
                if (allowed[e] && (best < 0 || key[e] > key[best]))
                    best = e;
            allowed[best] = 0;
            ids[t * k + j] = (int32_t)best;
            ssum += s[best];
        }
        for (int64_t j = 0; j < k; j++) {
            float sj = s[ids[t * k + j]];
            w[t * k + j] = (float)c->scaling * (c->renormalize ? sj / ssum : sj);
        }
    }
    free(key), free(gscore), free(allowed), free(used);
    return 0;
}

/* Stable counting sort of the assignments by expert. */
static inline int ex_dispatch(const dl_backend_config_t *c, const dl_backend_dispatch_args_t *a)
{
    const int64_t E = c->experts, M = c->tokens * c->top_k;
    const int32_t *ids = EX_I32(a->topk_ids);
    int32_t *perm = EX_I32(a->sort_perm);
    int64_t *size = EX_I64(a->group_sizes), *off = EX_I64(a->group_offsets);
    for (int64_t e = 0; e < E; e++)
        size[e] = 0;
    for (int64_t f = 0; f < M; f++) {
        if (ids[f] < 0 || ids[f] >= E)
            return 1;
        size[ids[f]]++;
    }
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = off[e] + size[e];
    int64_t *next = malloc((size_t)E * sizeof *next);
    if (!next)
        return 1;
    memcpy(next, off, (size_t)E * sizeof *next);
    for (int64_t f = 0; f < M; f++)
        perm[next[ids[f]]++] = (int32_t)f;
    free(next);
    return 0;
}

static inline int ex_permute(const dl_backend_config_t *c, const dl_backend_permute_args_t *a)
{
    const int64_t d = c->hidden, k = c->top_k, M = c->tokens * k;
    const float *x = EX_F32(a->x);
    const int32_t *perm = EX_I32(a->sort_perm);
    float *xs = EX_F32(a->x_sorted);
    for (int64_t p = 0; p < M; p++)
        memcpy(xs + p * d, x + (perm[p] / k) * d, (size_t)d * sizeof *xs);
    return 0;
}

/* out[r, n] = act(sum_i lhs[r, i] rhs[i, n]) for rows [r0, r1), rhs [K, N]. */
static inline void ex_gemm_rows(const dl_backend_config_t *c, const ex_opts_t *o,
                                const float *lhs, int64_t K, const float *rhs, int64_t N,
                                int64_t r0, int64_t r1, float *out)
{
    for (int64_t r = r0; r < r1; r++)
        for (int64_t n = 0; n < N; n++) {
            float acc = 0;
            for (int64_t i = 0; i < K; i++)
                acc += ex_in(o, lhs[r * K + i]) * ex_in(o, rhs[i * N + n]);
            out[r * N + n] = ex_act(c, acc);
        }
}

/* The expert FFN on rows [r0, r1) of x_sorted, all of expert e. */
static inline void ex_ffn_rows(const dl_backend_config_t *c, const ex_opts_t *o,
                               const dl_backend_expert_forward_args_t *a, const float *xs,
                               int64_t e, int64_t r0, int64_t r1, float *hg, float *hu,
                               float *ha, float *y)
{
    const int64_t d = c->hidden, f = c->ffn;
    const float *Wd = EX_F32(a->w_down) + e * f * d;
    if (c->ffn_kind == DL_BACKEND_PLAIN) {
        ex_gemm_rows(c, o, xs, d, Wd, d, r0, r1, y);
        return;
    }
    ex_gemm_rows(c, o, xs, d, EX_F32(a->w_gate) + e * d * f, f, r0, r1, hg);
    ex_gemm_rows(c, o, xs, d, EX_F32(a->w_up) + e * d * f, f, r0, r1, hu);
    for (int64_t i = r0 * f; i < r1 * f; i++)
        ha[i] = ex_act(c, hg[i] * ex_sigmoid(hg[i]) * hu[i]);
    ex_gemm_rows(c, o, ha, f, Wd, d, r0, r1, y);
}

static inline int ex_expert_forward(const dl_backend_config_t *c, const ex_opts_t *o,
                                    const dl_backend_expert_forward_args_t *a)
{
    const int64_t *off = EX_I64(a->group_offsets);
    for (int64_t e = 0; e < c->experts; e++)
        ex_ffn_rows(c, o, a, EX_F32(a->x_sorted), e, off[e], off[e + 1], EX_F32(a->h_gate),
                    EX_F32(a->h_up), EX_F32(a->h_act), EX_F32(a->y_sorted));
    return 0;
}

/* splitmix64's finaliser: every input bit moves every output bit. */
static inline uint64_t ex_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static inline int ex_combine(const dl_backend_config_t *c, const ex_opts_t *o,
                             const dl_backend_combine_args_t *a)
{
    const int64_t T = c->tokens, d = c->hidden, k = c->top_k;
    const float *y = EX_F32(a->y_sorted), *w = EX_F32(a->topk_weights);
    float *out = EX_F32(a->out);
    int32_t *inv = ex_inverse(EX_I32(a->sort_perm), T * k);
    if (!inv)
        return 1;
    const uint64_t salt = o ? o->order_salt : 0;
    for (int64_t t = 0; t < T; t++) {
        /* with a salt, the sum starts at a slot that depends on it, as a
         * split of the work over threads might */
        int64_t first = salt ? (int64_t)(ex_mix(salt + (uint64_t)t) % (uint64_t)k) : 0;
        for (int64_t n = 0; n < d; n++) {
            float acc = 0;
            for (int64_t jj = 0; jj < k; jj++) {
                int64_t j = (first + jj) % k, fl = t * k + j;
                if (o && o->keep && !o->keep[fl])
                    continue; /* dropped: contributes nothing */
                acc += w[fl] * y[(int64_t)inv[fl] * d + n];
            }
            out[t * d + n] = ex_act(c, acc);
        }
    }
    free(inv);
    return 0;
}

/* ------------------------------------------------------------ backward */

static inline int ex_combine_backward(const dl_backend_config_t *c, const ex_opts_t *o,
                                      const dl_backend_combine_backward_args_t *a)
{
    const int64_t T = c->tokens, d = c->hidden, k = c->top_k;
    const float *g = EX_F32(a->d_out), *y = EX_F32(a->y_sorted), *w = EX_F32(a->topk_weights);
    float *dw = EX_F32(a->d_topk_weights), *dy = EX_F32(a->d_y_sorted);
    int32_t *inv = ex_inverse(EX_I32(a->sort_perm), T * k);
    if (!inv)
        return 1;
    for (int64_t fl = 0; fl < T * k; fl++) {
        const int64_t t = fl / k, p = inv[fl];
        const int kept = !(o && o->keep && !o->keep[fl]);
        float acc = 0;
        for (int64_t n = 0; n < d; n++) {
            acc += g[t * d + n] * y[p * d + n];
            dy[p * d + n] = kept ? ex_act(c, w[fl] * g[t * d + n]) : 0.0f;
        }
        dw[fl] = kept ? acc : 0.0f;
    }
    free(inv);
    return 0;
}

/* out[e, i, j] = sum over the rows m of expert e of a[m, i] b[m, j], fp32.
 * With write_empty == 0, experts without rows are left unwritten. */
static inline void ex_weight_grad(const ex_opts_t *o, const float *a, int64_t I, const float *b,
                                  int64_t J, const int64_t *off, int64_t E, int write_empty,
                                  float *out)
{
    for (int64_t e = 0; e < E; e++) {
        if (!write_empty && off[e + 1] == off[e])
            continue;
        for (int64_t i = 0; i < I; i++)
            for (int64_t j = 0; j < J; j++) {
                float acc = 0;
                for (int64_t m = off[e]; m < off[e + 1]; m++)
                    acc += ex_in(o, a[m * I + i]) * ex_in(o, b[m * J + j]);
                out[(e * I + i) * J + j] = acc;
            }
    }
}

/* out[r, i] = act(sum_j lhs[r, j] rhs[i, j]) for rows [r0, r1): a product
 * with the transpose of an expert's weight, rhs [I, J]. */
static inline void ex_gemm_rows_t(const dl_backend_config_t *c, const ex_opts_t *o,
                                  const float *lhs, int64_t J, const float *rhs, int64_t I,
                                  int64_t r0, int64_t r1, float *out)
{
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = 0; i < I; i++) {
            float acc = 0;
            for (int64_t j = 0; j < J; j++)
                acc += ex_in(o, lhs[r * J + j]) * ex_in(o, rhs[i * J + j]);
            out[r * I + i] = ex_act(c, acc);
        }
}

/* The row-wise part of the expert backward on rows [r0, r1) of expert e:
 * d_h_act, d_h_gate, d_h_up, d_x_sorted (weight gradients are separate). */
static inline void ex_expert_backward_rows(const dl_backend_config_t *c, const ex_opts_t *o,
                                           const dl_backend_expert_backward_args_t *a,
                                           const float *dy, const float *hg, const float *hu,
                                           int64_t e, int64_t r0, int64_t r1, float *dha,
                                           float *dhg, float *dhu, float *dxs)
{
    const int64_t d = c->hidden, f = c->ffn;
    const float *Wd = EX_F32(a->w_down) + e * f * d;
    if (c->ffn_kind == DL_BACKEND_PLAIN) {
        ex_gemm_rows_t(c, o, dy, d, Wd, d, r0, r1, dxs);
        return;
    }
    ex_gemm_rows_t(c, o, dy, d, Wd, f, r0, r1, dha);
    for (int64_t i = r0 * f; i < r1 * f; i++) {
        float s = ex_sigmoid(hg[i]);
        dhu[i] = ex_act(c, dha[i] * (hg[i] * s));
        dhg[i] = ex_act(c, dha[i] * hu[i] * (s * (1.0f + hg[i] * (1.0f - s))));
    }
    const float *Wg = EX_F32(a->w_gate) + e * d * f, *Wu = EX_F32(a->w_up) + e * d * f;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = 0; i < d; i++) {
            float acc = 0;
            for (int64_t j = 0; j < f; j++)
                acc += ex_in(o, dhg[r * f + j]) * ex_in(o, Wg[i * f + j]);
            for (int64_t j = 0; j < f; j++)
                acc += ex_in(o, dhu[r * f + j]) * ex_in(o, Wu[i * f + j]);
            dxs[r * d + i] = ex_act(c, acc);
        }
}

/* write_empty_dw = 0 leaves the weight gradients of experts without rows
 * unwritten: the bug the "nodw" example backend has on purpose. */
static inline int ex_expert_backward(const dl_backend_config_t *c, const ex_opts_t *o,
                                     const dl_backend_expert_backward_args_t *a,
                                     int write_empty_dw)
{
    const int64_t d = c->hidden, f = c->ffn, E = c->experts;
    const int64_t *off = EX_I64(a->group_offsets);
    const float *dy = EX_F32(a->d_y_sorted), *xs = EX_F32(a->x_sorted);
    for (int64_t e = 0; e < E; e++)
        ex_expert_backward_rows(c, o, a, dy, EX_F32(a->h_gate), EX_F32(a->h_up), e, off[e],
                                off[e + 1], EX_F32(a->d_h_act), EX_F32(a->d_h_gate),
                                EX_F32(a->d_h_up), EX_F32(a->d_x_sorted));
    if (c->ffn_kind == DL_BACKEND_PLAIN) {
        ex_weight_grad(o, xs, d, dy, d, off, E, write_empty_dw, EX_F32(a->d_w_down));
        return 0;
    }
    ex_weight_grad(o, EX_F32(a->h_act), f, dy, d, off, E, write_empty_dw, EX_F32(a->d_w_down));
    ex_weight_grad(o, xs, d, EX_F32(a->d_h_gate), f, off, E, write_empty_dw, EX_F32(a->d_w_gate));
    ex_weight_grad(o, xs, d, EX_F32(a->d_h_up), f, off, E, write_empty_dw, EX_F32(a->d_w_up));
    return 0;
}

static inline int ex_router_backward(const dl_backend_config_t *c, const ex_opts_t *o,
                                     const dl_backend_router_backward_args_t *a)
{
    const int64_t T = c->tokens, d = c->hidden, E = c->experts, k = c->top_k;
    const float *dw = EX_F32(a->d_topk_weights), *s = EX_F32(a->router_scores);
    const float *x = EX_F32(a->x);
    const int32_t *ids = EX_I32(a->topk_ids);
    float *ds = EX_F32(a->d_router_scores), *dl = EX_F32(a->d_router_logits);
    float *dW = EX_F32(a->d_router_weight);
    const float scale = (float)c->scaling;
    for (int64_t t = 0; t < T; t++) {
        const float *st = s + t * E;
        float *dst = ds + t * E, *dlt = dl + t * E;
        for (int64_t e = 0; e < E; e++)
            dst[e] = 0;
        /* w_j = scale s_j / S: dS_i = scale (dw_i / S - sum_j dw_j s_j / S^2) */
        float S = 0, dot = 0;
        for (int64_t j = 0; j < k; j++) {
            S += st[ids[t * k + j]];
            dot += dw[t * k + j] * st[ids[t * k + j]];
        }
        for (int64_t j = 0; j < k; j++) {
            int32_t e = ids[t * k + j];
            dst[e] = c->renormalize ? scale * (dw[t * k + j] / S - dot / (S * S))
                                    : scale * dw[t * k + j];
        }
        if (c->score_fn == DL_BACKEND_SOFTMAX) {
            float sd = 0;
            for (int64_t e = 0; e < E; e++)
                sd += st[e] * dst[e];
            for (int64_t e = 0; e < E; e++)
                dlt[e] = st[e] * (dst[e] - sd);
        } else {
            for (int64_t e = 0; e < E; e++)
                dlt[e] = dst[e] * st[e] * (1.0f - st[e]);
        }
    }
    for (int64_t i = 0; i < d; i++)
        for (int64_t e = 0; e < E; e++) {
            float acc = 0;
            for (int64_t t = 0; t < T; t++)
                acc += ex_in(o, x[t * d + i]) * ex_in(o, dl[t * E + e]);
            dW[i * E + e] = acc;
        }
    return 0;
}

static inline int ex_input_backward(const dl_backend_config_t *c, const ex_opts_t *o,
                                    const dl_backend_input_backward_args_t *a)
{
    const int64_t T = c->tokens, d = c->hidden, E = c->experts, k = c->top_k;
    const float *dxs = EX_F32(a->d_x_sorted), *dl = EX_F32(a->d_router_logits);
    const float *W = EX_F32(a->router_weight);
    float *dx = EX_F32(a->d_x);
    int32_t *inv = ex_inverse(EX_I32(a->sort_perm), T * k);
    if (!inv)
        return 1;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < d; i++) {
            float acc = 0;
            for (int64_t j = 0; j < k; j++)
                acc += dxs[(int64_t)inv[t * k + j] * d + i];
            for (int64_t e = 0; e < E; e++)
                acc += ex_in(o, dl[t * E + e]) * ex_in(o, W[i * E + e]);
            dx[t * d + i] = ex_act(c, acc);
        }
    free(inv);
    return 0;
}

/* Every stage in plain fp32 arithmetic with the ABI's signature, for the
 * example backends that change only one thing (plain.c spells these out as
 * the template to copy). */
static inline int ex_plain_router(const dl_backend_config_t *c, const dl_backend_router_args_t *a)
{
    return ex_router(c, NULL, a);
}
static inline int ex_plain_expert_forward(const dl_backend_config_t *c,
                                          const dl_backend_expert_forward_args_t *a)
{
    return ex_expert_forward(c, NULL, a);
}
static inline int ex_plain_combine(const dl_backend_config_t *c, const dl_backend_combine_args_t *a)
{
    return ex_combine(c, NULL, a);
}
static inline int ex_plain_combine_backward(const dl_backend_config_t *c,
                                            const dl_backend_combine_backward_args_t *a)
{
    return ex_combine_backward(c, NULL, a);
}
static inline int ex_plain_expert_backward(const dl_backend_config_t *c,
                                           const dl_backend_expert_backward_args_t *a)
{
    return ex_expert_backward(c, NULL, a, 1);
}
static inline int ex_plain_router_backward(const dl_backend_config_t *c,
                                           const dl_backend_router_backward_args_t *a)
{
    return ex_router_backward(c, NULL, a);
}
static inline int ex_plain_input_backward(const dl_backend_config_t *c,
                                          const dl_backend_input_backward_args_t *a)
{
    return ex_input_backward(c, NULL, a);
}

#endif
