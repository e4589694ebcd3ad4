/* The whole layer, forward and backward, by two independent routes:
 * (1) a dense [T, E] formulation (no sorting, no grouped GEMM) evaluated
 *     exactly with GNU MPFR, stage by stage, compared bit for bit;
 * (2) central finite differences of the layer computed in binary64 with no
 *     rounding to storage types, compared with the oracle's gradients.
 * Routing, scores and SwiGLU are taken from the library here: their
 * exactness has its own MPFR suites. */
#include "config.h"
#include <malloc.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "mpref.h"
#include "stages/stages_priv.h"

/* Finite differences: step FD_STEP (relative to 1; inputs are O(1)) makes
 * truncation error ~h^2 |f'''| ~ 1e-10 and cancellation ~eps/h ~ 1e-11 in
 * binary64, far below the ~1e-6 relative difference between the gradient of
 * the unrounded function and the oracle's gradients of the fp32-rounded
 * pipeline (a few fp32 roundings, each 2^-24 ~ 6e-8, amplified by
 * cancellation in sums). FD_RTOL bounds the latter, relative to the largest
 * gradient entry of the tensor. */
#define FD_STEP 1e-5
#define FD_RTOL 2e-4

typedef struct {
    dl_moe_config_t c;
    float *x, *wr, *bias, *wg, *wu, *wd, *dout;
    dl_moe_inputs_t in;
} layer_t;

static float *randn(dl_test_rng_t *r, int64_t n, double scale, dl_dtype_t t)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)dl_round(dl_test_normal(r) * scale, t);
    return p;
}

static layer_t *layer_new(uint64_t seed, int64_t T, int64_t d, int64_t f, int64_t E, int64_t k,
                          int sigmoid, dl_dtype_t t, dl_ffn_t kind)
{
    layer_t *L = calloc(1, sizeof *L);
    dl_test_rng_t r = {seed};
    L->c.tokens = T, L->c.hidden = d, L->c.ffn = kind == DL_FFN_PLAIN ? d : f;
    L->c.route.experts = E, L->c.route.top_k = k;
    L->c.route.score_fn = sigmoid ? DL_SCORE_SIGMOID : DL_SCORE_SOFTMAX;
    L->c.route.n_group = sigmoid && E % 4 == 0 ? 4 : 1;
    L->c.route.topk_group = sigmoid && E % 4 == 0 ? 2 : 1;
    L->c.route.group_score = DL_GROUP_TOP2_SUM;
    L->c.route.renormalize = 1;
    L->c.route.scaling = sigmoid ? 2.5 : 1.0;
    L->c.route.has_bias = sigmoid;
    L->c.ffn_kind = kind, L->c.dtype = t;
    f = L->c.ffn;
    L->x = randn(&r, T * d, 1.0, t);
    L->wr = randn(&r, d * E, 1.0 / sqrt((double)d), DL_F32);
    L->bias = randn(&r, E, 0.1, DL_F32);
    L->wg = randn(&r, E * d * f, 1.0 / sqrt((double)d), t);
    L->wu = randn(&r, E * d * f, 1.0 / sqrt((double)d), t);
    L->wd = randn(&r, E * f * d, 1.0 / sqrt((double)f), t);
    L->dout = randn(&r, T * d, 1.0, t);
    L->in = (dl_moe_inputs_t){L->x, L->wr, sigmoid ? L->bias : NULL, L->wg, L->wu, L->wd, L->dout};
    return L;
}

static void layer_free(layer_t *L)
{
    free(L->x), free(L->wr), free(L->bias), free(L->wg), free(L->wu), free(L->wd), free(L->dout);
    free(L);
}

/* MPFR: RN_t(sum_i a[i*sa] * b[i*sb] + sum_i c[i*sc] * e[i*se]) */
static double mp_dot2(const float *a, int64_t sa, const float *b, int64_t sb, int64_t n,
                      const float *c, int64_t sc, const float *e, int64_t se, int64_t m,
                      dl_dtype_t t)
{
    double *u = malloc((size_t)(n + m + 1) * sizeof *u), *v = malloc((size_t)(n + m + 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        u[i] = a[i * sa], v[i] = b[i * sb];
    for (int64_t i = 0; i < m; i++)
        u[n + i] = c[i * sc], v[n + i] = e[i * se];
    double r = mpref_dot(u, v, (size_t)(n + m), t);
    free(u), free(v);
    return r;
}

static double mp_dot(const float *a, int64_t sa, const float *b, int64_t sb, int64_t n, dl_dtype_t t)
{
    return mp_dot2(a, sa, b, sb, n, NULL, 0, NULL, 0, 0, t);
}

#define SAME(got, want, what, i)                                                               \
    ck_assert_msg(same_value((got), (want)), "%s[%lld]: oracle %a, dense MPFR %a", what,       \
                  (long long)(i), (double)(got), (double)(want))

/* Route (1): the dense formulation, stage by stage. Row (t, j) of the sorted
 * arrays is found through inv_perm; the dense side never sorts. */
static void dense_check(layer_t *L)
{
    const dl_moe_config_t *c = &L->c;
    const int64_t T = c->tokens, d = c->hidden, f = c->ffn, E = c->route.experts, k = c->route.top_k;
    const dl_dtype_t t = c->dtype;
    const int swiglu = c->ffn_kind == DL_FFN_SWIGLU;
    dl_moe_forward_t F;
    dl_moe_backward_t B;
    ck_assert_int_eq(dl_moe_forward(c, &L->in, &F), 0);
    ck_assert_int_eq(dl_moe_backward(c, &L->in, &F, &B), 0);

    for (int64_t tk = 0; tk < T; tk++)
        for (int64_t e = 0; e < E; e++)
            SAME(F.router_logits[tk * E + e], mp_dot(L->x + tk * d, 1, L->wr + e, E, d, DL_F32),
                 "router_logits", tk * E + e);
    float *hg = malloc(f * sizeof *hg), *hu = malloc(f * sizeof *hu), *ha = malloc(f * sizeof *ha);
    float *dha = malloc(f * sizeof *dha), *dhg = malloc(f * sizeof *dhg), *dhu = malloc(f * sizeof *dhu);
    float *dy = malloc(d * sizeof *dy);
    float *y = malloc(k * d * sizeof *y);
    for (int64_t tk = 0; tk < T; tk++) {
        for (int64_t j = 0; j < k; j++) {
            int64_t e = F.topk_ids[tk * k + j], p = F.inv_perm[tk * k + j];
            const float *xe = L->x + tk * d;
            const float *hin = xe;
            if (swiglu) {
                for (int64_t i = 0; i < f; i++) {
                    hg[i] = (float)mp_dot(xe, 1, L->wg + e * d * f + i, f, d, t);
                    hu[i] = (float)mp_dot(xe, 1, L->wu + e * d * f + i, f, d, t);
                    SAME(F.h_gate[p * f + i], hg[i], "h_gate", p * f + i);
                    SAME(F.h_up[p * f + i], hu[i], "h_up", p * f + i);
                }
                dl_swiglu(hg, hu, f, t, ha);
                for (int64_t i = 0; i < f; i++)
                    SAME(F.h_act[p * f + i], ha[i], "h_act", p * f + i);
                hin = ha;
            }
            for (int64_t i = 0; i < d; i++) {
                y[j * d + i] = (float)mp_dot(hin, 1, L->wd + e * f * d + i, d, f, t);
                SAME(F.y_sorted[p * d + i], y[j * d + i], "y_sorted", p * d + i);
            }
            /* backward through this slot */
            double w = F.topk_weights[tk * k + j];
            SAME(B.d_topk_weights[tk * k + j], mp_dot(L->dout + tk * d, 1, y + j * d, 1, d, DL_F32),
                 "d_topk_weights", tk * k + j);
            for (int64_t i = 0; i < d; i++) {
                dy[i] = (float)mpref_round_d(w * L->dout[tk * d + i], t);
                SAME(B.d_y_sorted[p * d + i], dy[i], "d_y_sorted", p * d + i);
            }
            if (swiglu) {
                for (int64_t i = 0; i < f; i++) {
                    dha[i] = (float)mp_dot(dy, 1, L->wd + e * f * d + i * d, 1, d, t);
                    SAME(B.d_h_act[p * f + i], dha[i], "d_h_act", p * f + i);
                }
                dl_swiglu_backward(hg, hu, dha, f, t, dhg, dhu);
                for (int64_t i = 0; i < d; i++)
                    SAME(B.d_x_sorted[p * d + i],
                         mp_dot2(dhg, 1, L->wg + e * d * f + i * f, 1, f, dhu, 1,
                                 L->wu + e * d * f + i * f, 1, f, t),
                         "d_x_sorted", p * d + i);
            } else {
                for (int64_t i = 0; i < d; i++)
                    SAME(B.d_x_sorted[p * d + i], mp_dot(dy, 1, L->wd + e * d * d + i * d, 1, d, t),
                         "d_x_sorted", p * d + i);
            }
        }
        for (int64_t i = 0; i < d; i++) {
            double *u = calloc(k + 1, sizeof *u), *v = calloc(k + 1, sizeof *v);
            for (int64_t j = 0; j < k; j++)
                u[j] = F.topk_weights[tk * k + j], v[j] = y[j * d + i];
            SAME(F.out[tk * d + i], mpref_dot(u, v, k, t), "out", tk * d + i);
            free(u), free(v);
        }
    }
    /* weight gradients: dense sums over the tokens routed to e (mask), no groups */
    float *lhs = malloc((T + 1) * (f > d ? f : d) * sizeof *lhs);
    float *rhs = malloc((T + 1) * (f > d ? f : d) * sizeof *rhs);
    const float *dW[3] = {B.d_w_down, B.d_w_gate, B.d_w_up};
    const char *names[3] = {"d_w_down", "d_w_gate", "d_w_up"};
    for (int which = 0; which < (swiglu ? 3 : 1); which++) {
        int64_t I = which == 0 ? f : d, J = which == 0 ? d : f;
        for (int64_t e = 0; e < E; e++) {
            int64_t n = 0; /* gather the masked rows densely, in token order */
            for (int64_t tk = 0; tk < T; tk++)
                for (int64_t j = 0; j < k; j++) {
                    if (F.topk_ids[tk * k + j] != e)
                        continue;
                    int64_t p = F.inv_perm[tk * k + j];
                    const float *a = which == 0 ? (swiglu ? F.h_act + p * f : F.x_sorted + p * d)
                                                : L->x + tk * d;
                    const float *b = which == 0 ? B.d_y_sorted + p * d
                                   : which == 1 ? B.d_h_gate + p * f : B.d_h_up + p * f;
                    memcpy(lhs + n * I, a, I * sizeof *lhs);
                    memcpy(rhs + n * J, b, J * sizeof *rhs);
                    n++;
                }
            for (int64_t i = 0; i < I; i++)
                for (int64_t jj = 0; jj < J; jj++)
                    SAME(dW[which][(e * I + i) * J + jj], mp_dot(lhs + i, I, rhs + jj, J, n, DL_F32),
                         names[which], (e * I + i) * J + jj);
        }
    }
    for (int64_t i = 0; i < d; i++)
        for (int64_t e = 0; e < E; e++)
            SAME(B.d_router_weight[i * E + e],
                 mp_dot(L->x + i, d, B.d_router_logits + e, E, T, DL_F32), "d_router_weight", i * E + e);
    for (int64_t tk = 0; tk < T; tk++)
        for (int64_t i = 0; i < d; i++) {
            float ones[64], parts[64];
            for (int64_t j = 0; j < k; j++)
                ones[j] = 1.0f, parts[j] = B.d_x_sorted[(int64_t)F.inv_perm[tk * k + j] * d + i];
            SAME(B.d_x[tk * d + i],
                 mp_dot2(ones, 1, parts, 1, k, B.d_router_logits + tk * E, 1, L->wr + i * E, 1, E, t),
                 "d_x", tk * d + i);
        }
    free(lhs), free(rhs), free(hg), free(hu), free(ha), free(dha), free(dhg), free(dhu), free(dy), free(y);
    dl_moe_forward_free(&F);
    dl_moe_backward_free(&B);
}

START_TEST(dense_softmax_swiglu)
{
    static const dl_dtype_t ts[] = {DL_F32, DL_BF16, DL_F16};
    for (int i = 0; i < 3; i++) {
        layer_t *L = layer_new(100 + i, 9, 6, 5, 4, 2, 0, ts[i], DL_FFN_SWIGLU);
        dense_check(L);
        layer_free(L);
    }
}
END_TEST

START_TEST(dense_sigmoid_grouped)
{
    static const dl_dtype_t ts[] = {DL_F32, DL_BF16};
    for (int i = 0; i < 2; i++) {
        layer_t *L = layer_new(200 + i, 11, 7, 3, 8, 3, 1, ts[i], DL_FFN_SWIGLU);
        dense_check(L);
        layer_free(L);
    }
}
END_TEST

START_TEST(dense_plain)
{
    layer_t *L = layer_new(300, 7, 5, 5, 3, 2, 0, DL_F32, DL_FFN_PLAIN);
    dense_check(L);
    layer_free(L);
}
END_TEST

START_TEST(dense_edges)
{
    layer_t *L = layer_new(400, 0, 4, 3, 4, 2, 0, DL_F32, DL_FFN_SWIGLU); /* T = 0 */
    dense_check(L);
    layer_free(L);
    L = layer_new(401, 3, 4, 3, 6, 1, 0, DL_F32, DL_FFN_SWIGLU); /* k = 1: most experts empty */
    dense_check(L);
    layer_free(L);
    L = layer_new(402, 4, 3, 2, 3, 3, 0, DL_BF16, DL_FFN_SWIGLU); /* k = E */
    dense_check(L);
    layer_free(L);
}
END_TEST

/* Empty experts get exact zeros whatever was in the output buffer. */
START_TEST(empty_expert_grads_zero)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {1, -1, 2, 0.5f};
    int64_t off[4] = {0, 0, 2, 2}; /* experts 0 and 2 empty */
    float out[3 * 3 * 2];
    for (int i = 0; i < 18; i++)
        out[i] = NAN;
    ck_assert_int_eq(dl_gemm_ragged_k(a, 3, b, 2, off, 3, DL_F32, out, NULL), 0);
    for (int i = 0; i < 6; i++) {
        ck_assert(out[i] == 0.0f && !signbit(out[i]));
        ck_assert(out[12 + i] == 0.0f && !signbit(out[12 + i]));
    }
    ck_assert(out[6] == 1 * 1 + 4 * 2);
}
END_TEST

/* ---------------------------------------------- route (2): finite differences */

/* The layer in binary64, no rounding anywhere; routing (ids) frozen to the
 * oracle's, since selection is piecewise constant and the step stays inside
 * the margin (checked). Returns sum(d_out * out). */
static double loss64(const layer_t *L, const int32_t *ids, const double *x, const double *wr,
                     const double *wg, const double *wu, const double *wd)
{
    const dl_moe_config_t *c = &L->c;
    const int64_t T = c->tokens, d = c->hidden, f = c->ffn, E = c->route.experts, k = c->route.top_k;
    double total = 0;
    double *s = malloc(E * sizeof *s), *h = malloc(f * sizeof *h);
    for (int64_t tk = 0; tk < T; tk++) {
        double mx = -INFINITY;
        for (int64_t e = 0; e < E; e++) {
            double l = 0;
            for (int64_t i = 0; i < d; i++)
                l += x[tk * d + i] * wr[i * E + e];
            s[e] = l;
            mx = l > mx ? l : mx;
        }
        if (c->route.score_fn == DL_SCORE_SOFTMAX) {
            double z = 0;
            for (int64_t e = 0; e < E; e++)
                z += (s[e] = exp(s[e] - mx));
            for (int64_t e = 0; e < E; e++)
                s[e] /= z;
        } else {
            for (int64_t e = 0; e < E; e++)
                s[e] = 1 / (1 + exp(-s[e]));
        }
        double norm = 0;
        for (int64_t j = 0; j < k; j++)
            norm += s[ids[tk * k + j]];
        for (int64_t j = 0; j < k; j++) {
            int64_t e = ids[tk * k + j];
            double w = c->route.scaling * s[e] / (c->route.renormalize ? norm : 1.0);
            for (int64_t q = 0; q < f; q++) {
                double g = 0, u = 0;
                for (int64_t i = 0; i < d; i++) {
                    g += x[tk * d + i] * wg[(e * d + i) * f + q];
                    u += x[tk * d + i] * wu[(e * d + i) * f + q];
                }
                h[q] = g / (1 + exp(-g)) * u;
            }
            for (int64_t i = 0; i < d; i++) {
                double yv = 0;
                for (int64_t q = 0; q < f; q++)
                    yv += h[q] * wd[(e * f + q) * d + i];
                total += L->dout[tk * d + i] * w * yv;
            }
        }
    }
    free(s), free(h);
    return total;
}

static double *to64(const float *p, int64_t n)
{
    double *r = malloc(n * sizeof *r);
    for (int64_t i = 0; i < n; i++)
        r[i] = p[i];
    return r;
}

static void fd_check(layer_t *L)
{
    const dl_moe_config_t *c = &L->c;
    const int64_t T = c->tokens, d = c->hidden, f = c->ffn, E = c->route.experts;
    dl_moe_forward_t F;
    dl_moe_backward_t B;
    ck_assert_int_eq(dl_moe_forward(c, &L->in, &F), 0);
    ck_assert_int_eq(dl_moe_backward(c, &L->in, &F, &B), 0);
    for (int64_t tk = 0; tk < T; tk++) /* the step must not change the selection */
        ck_assert_msg(F.tie_margin[tk] > 1e-3, "margin %g too small for FD", F.tie_margin[tk]);
    double *v[5] = {to64(L->x, T * d), to64(L->wr, d * E), to64(L->wg, E * d * f),
                    to64(L->wu, E * d * f), to64(L->wd, E * f * d)};
    const int64_t n[5] = {T * d, d * E, E * d * f, E * d * f, E * f * d};
    const float *g[5] = {B.d_x, B.d_router_weight, B.d_w_gate, B.d_w_up, B.d_w_down};
    const char *name[5] = {"d_x", "d_router_weight", "d_w_gate", "d_w_up", "d_w_down"};
    for (int q = 0; q < 5; q++) {
        double gmax = 0;
        for (int64_t i = 0; i < n[q]; i++)
            gmax = fmax(gmax, fabs(g[q][i]));
        for (int64_t i = 0; i < n[q]; i++) {
            double keep = v[q][i];
            v[q][i] = keep + FD_STEP;
            double lp = loss64(L, F.topk_ids, v[0], v[1], v[2], v[3], v[4]);
            v[q][i] = keep - FD_STEP;
            double lm = loss64(L, F.topk_ids, v[0], v[1], v[2], v[3], v[4]);
            v[q][i] = keep;
            double fd = (lp - lm) / (2 * FD_STEP);
            ck_assert_msg(fabs(fd - g[q][i]) <= FD_RTOL * gmax, "%s[%lld]: oracle %.9g, FD %.9g",
                          name[q], (long long)i, (double)g[q][i], fd);
        }
    }
    for (int q = 0; q < 5; q++)
        free(v[q]);
    dl_moe_forward_free(&F);
    dl_moe_backward_free(&B);
}

START_TEST(fd_softmax)
{
    layer_t *L = layer_new(500, 5, 6, 4, 4, 2, 0, DL_F32, DL_FFN_SWIGLU);
    fd_check(L);
    layer_free(L);
}
END_TEST

START_TEST(fd_sigmoid_scaled)
{
    layer_t *L = layer_new(501, 5, 6, 4, 8, 2, 1, DL_F32, DL_FFN_SWIGLU);
    fd_check(L);
    layer_free(L);
}
END_TEST

/* Same bits with 1 and 2 threads, forward and backward. */
START_TEST(threads_same_bits)
{
    layer_t *L = layer_new(600, 33, 16, 12, 8, 2, 1, DL_BF16, DL_FFN_SWIGLU);
    dl_moe_forward_t F1, F2;
    dl_moe_backward_t B1, B2;
    omp_set_num_threads(1);
    ck_assert_int_eq(dl_moe_forward(&L->c, &L->in, &F1), 0);
    ck_assert_int_eq(dl_moe_backward(&L->c, &L->in, &F1, &B1), 0);
    omp_set_num_threads(2);
    ck_assert_int_eq(dl_moe_forward(&L->c, &L->in, &F2), 0);
    ck_assert_int_eq(dl_moe_backward(&L->c, &L->in, &F2, &B2), 0);
    int64_t M = 33 * 2;
    ck_assert(memcmp(F1.out, F2.out, 33 * 16 * sizeof(float)) == 0);
    ck_assert(memcmp(F1.h_act, F2.h_act, M * 12 * sizeof(float)) == 0);
    ck_assert(memcmp(B1.d_x, B2.d_x, 33 * 16 * sizeof(float)) == 0);
    ck_assert(memcmp(B1.d_w_gate, B2.d_w_gate, 8 * 16 * 12 * sizeof(float)) == 0);
    ck_assert(memcmp(B1.d_router_weight, B2.d_router_weight, 16 * 8 * sizeof(float)) == 0);
    dl_moe_forward_free(&F1), dl_moe_forward_free(&F2);
    dl_moe_backward_free(&B1), dl_moe_backward_free(&B2);
    layer_free(L);
}
END_TEST

/* The router and router-gradient sequences alone give the full pass's
 * bits, into the caller's arrays, and refuse missing arrays. */
START_TEST(route_stages_alone)
{
    layer_t *L = layer_new(800, 21, 16, 12, 8, 2, 1, DL_BF16, DL_FFN_SWIGLU);
    dl_moe_forward_t F;
    dl_moe_backward_t B;
    ck_assert_int_eq(dl_moe_forward(&L->c, &L->in, &F), 0);
    ck_assert_int_eq(dl_moe_backward(&L->c, &L->in, &F, &B), 0);
    const int64_t T = 21, E = 8, M = 42, d = 16;
    dl_moe_forward_t r = {.router_logits = calloc(T * E, 4), .router_scores = calloc(T * E, 4),
                          .topk_ids = calloc(M, 4), .topk_weights = calloc(M, 4)};
    ck_assert_int_eq(dl_moe_route(&L->c, &L->in, &r), 0); /* no sort_perm: routing only */
    ck_assert(memcmp(r.router_scores, F.router_scores, T * E * 4) == 0);
    ck_assert(memcmp(r.topk_ids, F.topk_ids, M * 4) == 0);
    ck_assert(memcmp(r.topk_weights, F.topk_weights, M * 4) == 0);
    float *keep = r.router_logits;
    r.router_logits = NULL;
    ck_assert_int_eq(dl_moe_route(&L->c, &L->in, &r), DL_EINVAL);
    r.router_logits = keep;
    dl_moe_backward_t b = {.d_topk_weights = B.d_topk_weights, .d_x_sorted = B.d_x_sorted,
                           .d_router_scores = calloc(T * E, 4), .d_router_logits = calloc(T * E, 4),
                           .d_router_weight = calloc(d * E, 4), .d_x = calloc(T * d, 4)};
    ck_assert_int_eq(dl_moe_route_backward(&L->c, &L->in, &F, &b), 0);
    ck_assert(memcmp(b.d_router_logits, B.d_router_logits, T * E * 4) == 0);
    ck_assert(memcmp(b.d_router_weight, B.d_router_weight, d * E * 4) == 0);
    ck_assert(memcmp(b.d_x, B.d_x, T * d * 4) == 0);
    free(b.d_x);
    b.d_x = NULL;
    ck_assert_int_eq(dl_moe_route_backward(&L->c, &L->in, &F, &b), DL_EINVAL);
    free(b.d_router_scores), free(b.d_router_logits), free(b.d_router_weight);
    free(r.router_logits), free(r.router_scores), free(r.topk_ids), free(r.topk_weights);
    dl_moe_forward_free(&F);
    dl_moe_backward_free(&B);
    layer_free(L);
}
END_TEST

START_TEST(bad_inputs)
{
    layer_t *L = layer_new(700, 4, 4, 3, 4, 2, 0, DL_BF16, DL_FFN_SWIGLU);
    dl_moe_forward_t F;
    L->x[3] = NAN;
    ck_assert_int_eq(dl_moe_forward(&L->c, &L->in, &F), DL_ENONFINITE);
    dl_moe_forward_free(&F);
    L->x[3] = 1.0f + 0x1p-12f; /* not a bf16 value */
    ck_assert_int_eq(dl_moe_forward(&L->c, &L->in, &F), DL_EGRID);
    dl_moe_forward_free(&F);
    L->x[3] = 1.0f;
    L->c.route.top_k = 5; /* k > E */
    ck_assert_int_eq(dl_moe_forward(&L->c, &L->in, &F), DL_EINVAL);
    dl_moe_forward_free(&F);
    L->c.route.top_k = 2;
    L->c.tokens = INT64_C(1) << 40; /* absurd sizes are refused before any allocation */
    ck_assert_int_eq(dl_moe_config_validate(&L->c), DL_EOVERFLOW);
    L->c.tokens = 4;
    L->c.ffn_kind = DL_FFN_PLAIN; /* plain needs f = d */
    ck_assert_int_eq(dl_moe_config_validate(&L->c), DL_EINVAL);
    layer_free(L);
}
END_TEST

/* Validation over arrays of several of check_tensor's chunks (65536
 * floats): one bad element anywhere (first, either side of a chunk
 * boundary, last) is found, in every weight, for each type; a NaN wins
 * over an off-grid value wherever the two are; a clean layer passes. */
START_TEST(validation_chunks)
{
    const dl_dtype_t ts[3] = {DL_F32, DL_BF16, DL_F16};
    for (int ti = 0; ti < 3; ti++) {
        layer_t *L = layer_new(701, 4, 64, 48, 45, 2, 0, ts[ti], DL_FFN_SWIGLU);
        const int64_t n = 45 * 64 * 48, pos[5] = {0, 65535, 65536, 131072 + 7, n - 1};
        float *w[3] = {L->wg, L->wu, L->wd};
        /* off grid: fp32 has no off-grid float, so only NaN/Inf there */
        const float off = ts[ti] == DL_F32 ? INFINITY : 1.0f + 0x1p-20f;
        const int want_off = ts[ti] == DL_F32 ? DL_ENONFINITE : DL_EGRID;
        ck_assert_int_eq(dl_moe_inputs_validate(&L->c, &L->in, 1), 0);
        for (int a = 0; a < 3; a++)
            for (int p = 0; p < 5; p++) {
                float keep = w[a][pos[p]];
                w[a][pos[p]] = off;
                ck_assert_int_eq(dl_moe_inputs_validate(&L->c, &L->in, 1), want_off);
                w[a][pos[p]] = NAN;
                ck_assert_int_eq(dl_moe_inputs_validate(&L->c, &L->in, 1), DL_ENONFINITE);
                float keep2 = w[a][pos[4 - p]];
                w[a][pos[4 - p]] = off; /* NaN and off-grid in one array (or both off-grid at p = 2) */
                ck_assert_int_eq(dl_moe_inputs_validate(&L->c, &L->in, 1),
                                 p == 2 ? want_off : DL_ENONFINITE);
                w[a][pos[4 - p]] = keep2;
                w[a][pos[p]] = keep;
            }
        ck_assert_int_eq(dl_moe_inputs_validate(&L->c, &L->in, 1), 0);
        layer_free(L);
    }
}
END_TEST

/* The input validation's bit test agrees with isfinite and dl_on_grid on
 * every exponent and sign with the low bits that matter for each grid
 * (every pattern of the top 16 bits, 24 patterns of the low 16), and on
 * every fp16 value and its neighbours. */
START_TEST(validation_bits_match_on_grid)
{
    static const uint32_t lows[] = {0, 1, 2, 0x10, 0x100, 0x800, 0xfff, 0x1000, 0x1fff,
                                    0x2000, 0x3fff, 0x4000, 0x7fff, 0x8000, 0xc000, 0xe000,
                                    0xf000, 0xfff0, 0xffff, 0x0400, 0x0200, 0x6000, 0xa000, 0x5555};
    const dl_dtype_t ts[3] = {DL_F32, DL_BF16, DL_F16};
    int64_t n = 0, bad = 0;
    uint32_t first_bad = 0;
    for (uint32_t hi = 0; hi < 0x10000u; hi++)
        for (size_t l = 0; l < sizeof lows / sizeof lows[0]; l++) {
            uint32_t b = hi << 16 | lows[l];
            float f;
            memcpy(&f, &b, 4);
            for (int i = 0; i < 3; i++) {
                int want = !isfinite(f) ? 2 : !dl_on_grid(f, ts[i]);
                if (dl__float_verdict(b, ts[i]) != want && !bad++)
                    first_bad = b;
                n++;
            }
        }
    for (uint32_t h = 0; h < 0x10000u; h++) { /* every fp16, as a float, and one ulp off */
        float f = dl_f16_to_float((uint16_t)h);
        uint32_t b;
        memcpy(&b, &f, 4);
        for (int dlt = -1; dlt <= 1; dlt++) {
            uint32_t c = b + (uint32_t)dlt;
            float g;
            memcpy(&g, &c, 4);
            int want = !isfinite(g) ? 2 : !dl_on_grid(g, DL_F16);
            if (dl__float_verdict(c, DL_F16) != want && !bad++)
                first_bad = c;
        }
    }
    ck_assert_msg(bad == 0, "%lld mismatches, first bits %08x", (long long)bad, first_bad);
    ck_assert_int_gt(n, 4000000);
}
END_TEST

/* The schedule's row sets hold every row of DL_VALUE_MAP, past bit 63 too
 * (dl_rowset_t is 128 bits: the model variants took the table past 64
 * rows): each stage value has exactly one writer, whose set holds it; an
 * input has none; every producer reads only inputs and rows an earlier
 * producer wrote (the table's dependency order), for both FFN kinds. */
START_TEST(schedule_row_sets)
{
    ck_assert_int_le(dl_layout_count(), DL_ROWSET_BITS);
    ck_assert_int_le(dl_golden_dataset_count(), DL_GOLDEN_DATASET_MAX);
    for (int r = 0; r < dl_layout_count(); r++) {
        const dl_layout_row_t *row = dl_layout_row(r);
        int writers = 0;
        for (int i = 0; i < dl_schedule_count(); i++)
            writers += DL_ROWSET_HAS(dl_schedule_producer(i)->writes, r);
        int want = row->group != DL_LAYOUT_INPUTS;
        ck_assert_msg(writers == want, "%s: %d writers", row->name, writers);
        int w = dl_schedule_writer(r);
        ck_assert_msg(want ? w >= 0 && DL_ROWSET_HAS(dl_schedule_producer(w)->writes, r) : w < 0,
                      "%s: writer %d", row->name, w);
    }
    ck_assert_int_lt(dl_schedule_writer(dl_layout_count()), 0);
    for (int kind = 0; kind < 2; kind++) {
        dl_moe_config_t c;
        memset(&c, 0, sizeof c);
        c.ffn_kind = kind ? DL_FFN_PLAIN : DL_FFN_SWIGLU;
        dl_rowset_t have = 0;
        for (int r = 0; r < dl_layout_count(); r++)
            if (dl_layout_row(r)->group == DL_LAYOUT_INPUTS)
                have |= DL_ROWSET_BIT(r);
        for (int i = 0; i < dl_schedule_count(); i++) {
            const dl_producer_t *p = dl_schedule_producer(i);
            dl_rowset_t early = dl_schedule_reads(p, &c) & ~have;
            for (int r = 0; r < dl_layout_count(); r++)
                ck_assert_msg(!DL_ROWSET_HAS(early, r), "%s reads %s before it is written",
                              p->name, dl_layout_row(r)->name);
            have |= p->writes;
        }
    }
}
END_TEST

/* keep.c: a kept array comes back zero-filled (calloc's contract, however
 * dirty it was freed) and only for a request of its own size: a block with
 * a quarter more room, or too little, is not taken. */
START_TEST(keep_zero_and_size)
{
    const int keeping = !(getenv("DROPLESS_KEEP") && !strcmp(getenv("DROPLESS_KEEP"), "0"));
    const size_t n = (size_t)3 << 20, sizes[2] = {n - n / 4, n + n / 3};
    unsigned char *p = dl__keep_alloc(n, 1);
    ck_assert_ptr_nonnull(p);
    memset(p, 0xA5, n);
    dl__keep_free(p);
    unsigned char *q = dl__keep_alloc(n, 1);
    ck_assert_ptr_nonnull(q);
    if (keeping)
        ck_assert_ptr_eq(q, p); /* the kept block: the path under test */
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(q[i] == 0, "byte %zu of a kept array is %d", i, q[i]);
    for (int s = 0; s < 2; s++) {
        memset(q, 0xA5, malloc_usable_size(q));
        dl__keep_free(q);
        q = dl__keep_alloc(sizes[s], 1);
        ck_assert_ptr_nonnull(q);
        const size_t u = malloc_usable_size(q);
        ck_assert_msg(u >= sizes[s] && u - sizes[s] <= u / 64, "%zu bytes asked, %zu given", sizes[s], u);
        for (size_t i = 0; i < sizes[s]; i++)
            ck_assert_msg(q[i] == 0, "byte %zu is %d", i, q[i]);
    }
    dl__keep_free(q);
}
END_TEST

/* Every array of both passes, copied (row r at out[r], NULL if absent). */
static void snapshot(const dl_moe_config_t *c, dl_moe_forward_t *F, dl_moe_backward_t *B,
                     void **out, size_t *bytes)
{
    for (int r = 0; r < dl_layout_count(); r++) {
        const dl_layout_row_t *row = dl_layout_row(r);
        void **p = row->group == DL_LAYOUT_INPUTS ? NULL : dl_layout_slot(row, NULL, F, B);
        out[r] = NULL, bytes[r] = 0;
        if (!p || !*p)
            continue;
        bytes[r] = (size_t)dl_layout_numel_rows(row, c, -1) * (row->store == DL_STORE_I64 ? 8 : 4);
        out[r] = malloc(bytes[r] + 1);
        memcpy(out[r], *p, bytes[r]);
        memset(*p, 0xFF, bytes[r]); /* freed dirty: NaN bits wherever a stage relied on zeros */
    }
}

/* A second forward and backward of L on kept arrays (freed full of NaN
 * bits) gives the first pass's bits in every array. */
static void same_bits_on_kept(layer_t *L)
{
    dl_moe_forward_t F1, F2;
    dl_moe_backward_t B1, B2;
    ck_assert_int_eq(dl_moe_forward(&L->c, &L->in, &F1), 0);
    ck_assert_int_eq(dl_moe_backward(&L->c, &L->in, &F1, &B1), 0);
    const float *dw[3] = {B1.d_w_gate, B1.d_w_up, B1.d_w_down};
    void *first[DL_ROWSET_BITS];
    size_t bytes[DL_ROWSET_BITS];
    snapshot(&L->c, &F1, &B1, first, bytes);
    dl_moe_backward_free(&B1);
    dl_moe_forward_free(&F1);
    ck_assert_int_eq(dl_moe_forward(&L->c, &L->in, &F2), 0);
    ck_assert_int_eq(dl_moe_backward(&L->c, &L->in, &F2, &B2), 0);
    if (!(getenv("DROPLESS_KEEP") && !strcmp(getenv("DROPLESS_KEEP"), "0")))
        ck_assert(B2.d_w_down == dw[0] || B2.d_w_down == dw[1] || B2.d_w_down == dw[2]);
    for (int r = 0; r < dl_layout_count(); r++) {
        void **p = first[r] ? dl_layout_slot(dl_layout_row(r), NULL, &F2, &B2) : NULL;
        ck_assert_msg(!first[r] || memcmp(*p, first[r], bytes[r]) == 0, "%s differs",
                      dl_layout_row(r)->name);
        free(first[r]);
    }
    dl_moe_forward_free(&F2), dl_moe_backward_free(&B2);
}

/* Arrays of 1 MiB and more are kept: [M, f] rows and [E, d, f] slabs here;
 * with 6 tokens for 16 experts, most weight-gradient slabs are empty
 * experts' zeros, written by the GEMM itself on pages the last pass left
 * NaN. */
START_TEST(keep_layer_same_bits)
{
    layer_t *L[3] = {layer_new(700, 512, 256, 512, 8, 2, 0, DL_BF16, DL_FFN_SWIGLU),
                     layer_new(701, 6, 256, 512, 16, 1, 0, DL_BF16, DL_FFN_SWIGLU),
                     layer_new(702, 300, 256, 512, 16, 4, 1, DL_F16, DL_FFN_PLAIN)};
    for (int i = 0; i < 3; i++) {
        same_bits_on_kept(L[i]);
        layer_free(L[i]);
    }
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("vjp-dense", "dense-formulation", dense_softmax_swiglu, 300),
        DL_TEST("vjp-dense", "dense-formulation", dense_sigmoid_grouped, 300),
        DL_TEST("vjp-dense", "dense-formulation", dense_plain, 300),
        DL_TEST("vjp-dense", "dense-formulation", dense_edges, 300),
        DL_TEST("vjp-dense", "dense-formulation", empty_expert_grads_zero, 300),
        DL_TEST("vjp-finite-differences", "central-differences", fd_softmax, 300),
        DL_TEST("vjp-finite-differences", "central-differences", fd_sigmoid_scaled, 300),
        DL_TEST("layer", "determinism-and-errors", threads_same_bits, 120),
        DL_TEST("layer", "determinism-and-errors", bad_inputs, 120),
        DL_TEST("layer", "validation", validation_chunks, 60),
        DL_TEST("layer", "determinism-and-errors", route_stages_alone, 120),
        DL_TEST("layer", "determinism-and-errors", validation_bits_match_on_grid, 120),
        DL_TEST("layer", "schedule", schedule_row_sets, 60),
        DL_TEST("layer", "kept-arrays", keep_zero_and_size, 60),
        DL_TEST("layer", "kept-arrays", keep_layer_same_bits, 300),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
