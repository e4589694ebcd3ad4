/* Shared experts (dropless/shared.h, doc/reference_layer.md): every stage
 * against GNU MPFR, on random and boundary inputs, then the whole layer of
 * the two catalogue families (Qwen2-MoE's gated expert, DeepSeek's two
 * always-on experts) value by value from its stored upstream values.
 * Tolerances: none; each value must be MPFR's exact result rounded once. */
#include "config.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "mpref.h"

/* RN_t(sigmoid(x)) by MPFR at 400 bits (far past any rounding boundary a
 * float argument can bring). */
static double ref_sigmoid(double x, dl_dtype_t t)
{
    mpfr_t e;
    mpfr_init2(e, 400);
    mpfr_set_d(e, -x, MPFR_RNDN);
    mpfr_exp(e, e, MPFR_RNDN);
    mpfr_add_ui(e, e, 1, MPFR_RNDN);
    mpfr_ui_div(e, 1, e, MPFR_RNDN);
    double r = mpref_round(e, t);
    mpfr_clear(e);
    return r;
}

/* RN_fp32(dg g (1 - g)), exact in MPFR; an exact zero is +0 (the stage's
 * convention, as the router's sigmoid VJP). */
static double ref_gate_vjp(double dg, double g)
{
    mpfr_t a, b;
    mpfr_inits2(MPREF_EXACT_PREC, a, b, (mpfr_ptr)0);
    mpfr_set_d(a, g, MPFR_RNDN);
    mpfr_ui_sub(b, 1, a, MPFR_RNDN);
    mpfr_mul(a, a, b, MPFR_RNDN);
    mpfr_mul_d(a, a, dg, MPFR_RNDN);
    double r = mpfr_zero_p(a) ? 0.0 : mpref_round(a, DL_F32);
    mpfr_clears(a, b, (mpfr_ptr)0);
    return r;
}

static float rnd(dl_test_rng_t *r, double scale, dl_dtype_t t)
{
    return (float)dl_round(dl_test_normal(r) * scale, t);
}

/* ------------------------------------------------------ the gate stages */

/* Logits at the boundaries: 0 (g = 1/2), where g rounds to 1 (d_logit
 * exactly 0 then), where g is subnormal in fp32, and the extremes. */
static const float edge_logits[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 17.0f, 17.5f, 88.0f, 104.0f,
                                    -88.0f, -103.0f, -104.0f, -150.0f, 3.4e38f, -3.4e38f};

START_TEST(gate_forward_backward)
{
    dl_test_rng_t r = {2601};
    const int64_t ne = (int64_t)(sizeof edge_logits / sizeof *edge_logits), T = ne + 400;
    float *l = malloc(T * sizeof *l), *g = malloc(T * sizeof *g), *dg = malloc(T * sizeof *dg);
    float *dl = malloc(T * sizeof *dl);
    for (int64_t t = 0; t < T; t++) {
        l[t] = t < ne ? edge_logits[t] : rnd(&r, ldexp(1, (int)(dl_test_next(&r) % 12) - 4), DL_F32);
        dg[t] = t % 7 == 0 ? 0.0f : rnd(&r, 1.0, DL_F32);
    }
    ck_assert_int_eq(dl_shared_gate(l, T, g), 0);
    ck_assert_int_eq(dl_shared_gate_backward(dg, g, T, dl), 0);
    for (int64_t t = 0; t < T; t++) {
        ck_assert_msg(same_value(g[t], ref_sigmoid(l[t], DL_F32)), "gate(%a) = %a", l[t], g[t]);
        ck_assert_msg(same_value(dl[t], ref_gate_vjp(dg[t], g[t])), "d_logit(%a, %a) = %a",
                      dg[t], g[t], dl[t]);
    }
    /* g rounds to 1 from logit 17.5 on: its VJP is exactly zero there */
    ck_assert(g[5] == 1.0f && dl[5] == 0.0f);
    float bad = NAN;
    ck_assert_int_eq(dl_shared_gate(&bad, 1, g), DL_ENONFINITE);
    ck_assert_int_eq(dl_shared_gate(NULL, 1, g), DL_EINVAL);
    ck_assert_int_eq(dl_shared_gate(l, -1, g), DL_EINVAL);
    ck_assert_int_eq(dl_shared_gate_backward(dg, NULL, 1, dl), DL_EINVAL);
    free(l), free(g), free(dg), free(dl);
}
END_TEST

/* d_gate = RN_fp32(<d_out, shared_y>), d_shared_y = RN_t(g d_out), and
 * d_out itself without a gate. */
START_TEST(combine_backward)
{
    dl_test_rng_t r = {2602};
    static const dl_dtype_t ts[] = {DL_F32, DL_BF16, DL_F16};
    for (int it = 0; it < 30; it++) {
        const dl_dtype_t t = ts[it % 3];
        const int64_t T = dl_test_next(&r) % 9, d = 1 + dl_test_next(&r) % 13;
        float *go = malloc((T * d + 1) * sizeof *go), *y = malloc((T * d + 1) * sizeof *y);
        float *g = malloc((T + 1) * sizeof *g), *dg = malloc((T + 1) * sizeof *dg);
        float *dy = malloc((T * d + 1) * sizeof *dy);
        for (int64_t i = 0; i < T * d; i++) {
            go[i] = rnd(&r, 1.0, t);
            y[i] = it % 2 && i % d == 1 ? -y[i - 1] : rnd(&r, 4.0, t); /* cancellation */
        }
        for (int64_t i = 0; i < T; i++)
            g[i] = (float)dl_test_unif(&r);
        const int gated = it % 4 != 3;
        ck_assert_int_eq(dl_shared_combine_backward(go, y, gated ? g : NULL, T, d, t,
                                                    gated ? dg : NULL, dy), 0);
        double *a = malloc((d + 1) * sizeof *a), *b = malloc((d + 1) * sizeof *b);
        for (int64_t tk = 0; tk < T; tk++) {
            for (int64_t i = 0; i < d; i++) {
                a[i] = go[tk * d + i];
                b[i] = y[tk * d + i];
                const double want = gated ? mpref_round_d((double)g[tk] * go[tk * d + i], t)
                                          : go[tk * d + i];
                ck_assert(same_value(dy[tk * d + i], want));
            }
            if (gated)
                ck_assert(same_value(dg[tk], mpref_dot(a, b, (size_t)d, DL_F32)));
        }
        free(a), free(b), free(go), free(y), free(g), free(dg), free(dy);
    }
}
END_TEST

/* --------------------------------------- combine and d_x with the terms */

/* out = RN(sum_j w_j y_j + g sy) and d_x's one sum over the routed, router
 * and shared terms, against MPFR, with the thread count changing nothing. */
START_TEST(combine_and_input_backward)
{
    dl_test_rng_t r = {2603};
    static const dl_dtype_t ts[] = {DL_F32, DL_BF16, DL_F16};
    for (int it = 0; it < 24; it++) {
        const dl_dtype_t t = ts[it % 3];
        const int64_t T = 1 + dl_test_next(&r) % 6, k = 1 + dl_test_next(&r) % 3, E = k + 1;
        const int64_t d = 1 + dl_test_next(&r) % 7, F = 1 + dl_test_next(&r) % 9, M = T * k;
        const int gated = it % 2;
        int32_t *inv = malloc(M * sizeof *inv);
        for (int64_t i = 0; i < M; i++) /* the reversed order is a valid permutation */
            inv[i] = (int32_t)(M - 1 - i);
        float *y = malloc(M * d * sizeof *y), *w = malloc(M * sizeof *w);
        float *sy = malloc(T * d * sizeof *sy), *g = malloc(T * sizeof *g);
        float *dxs = malloc(M * d * sizeof *dxs), *dlg = malloc(T * E * sizeof *dlg);
        float *wr = malloc(d * E * sizeof *wr), *dhg = malloc(T * F * sizeof *dhg);
        float *dhu = malloc(T * F * sizeof *dhu), *wg = malloc(d * F * sizeof *wg);
        float *wu = malloc(d * F * sizeof *wu), *dl = malloc(T * sizeof *dl);
        float *wsg = malloc(d * sizeof *wsg), *out = malloc(T * d * sizeof *out);
        float *dx = malloc(T * d * sizeof *dx), *o1 = malloc(T * d * sizeof *o1);
        for (int64_t i = 0; i < M * d; i++)
            y[i] = rnd(&r, 2.0, t), dxs[i] = rnd(&r, 1.0, t);
        for (int64_t i = 0; i < M; i++)
            w[i] = (float)dl_test_unif(&r);
        for (int64_t i = 0; i < T * d; i++) /* the shared term cancels the routed ones at times */
            sy[i] = it % 3 == 0 ? -y[inv[(i / d) * k] * d + i % d] : rnd(&r, 2.0, t);
        for (int64_t i = 0; i < T; i++)
            g[i] = it % 3 == 0 ? w[i * k] : (float)dl_test_unif(&r), dl[i] = rnd(&r, 1.0, DL_F32);
        for (int64_t i = 0; i < T * E; i++)
            dlg[i] = rnd(&r, 0.1, DL_F32);
        for (int64_t i = 0; i < d * E; i++)
            wr[i] = rnd(&r, 0.3, DL_F32);
        for (int64_t i = 0; i < T * F; i++)
            dhg[i] = rnd(&r, 1.0, t), dhu[i] = rnd(&r, 1.0, t);
        for (int64_t i = 0; i < d * F; i++)
            wg[i] = rnd(&r, 0.3, t), wu[i] = rnd(&r, 0.3, t);
        for (int64_t i = 0; i < d; i++)
            wsg[i] = rnd(&r, 0.3, DL_F32);
        const float *gp = gated ? g : NULL;
        ck_assert_int_eq(dl_combine_shared(y, w, inv, sy, gp, T, k, d, t, out), 0);
        const int ffn_gated = it % 4 != 3; /* relu2's shared experts: no gate projection */
        const dl_shared_grad_t sh = {F, ffn_gated ? dhg : NULL, dhu, ffn_gated ? wg : NULL, wu,
                                     gated ? dl : NULL, gated ? wsg : NULL};
        ck_assert_int_eq(dl_input_backward_shared(dxs, inv, dlg, wr, &sh, T, k, d, E, t, dx), 0);
        const int64_t n = k + E + 2 * F + 1;
        double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        for (int64_t tk = 0; tk < T; tk++)
            for (int64_t i = 0; i < d; i++) {
                for (int64_t j = 0; j < k; j++)
                    a[j] = w[tk * k + j], b[j] = y[inv[tk * k + j] * d + i];
                a[k] = gated ? g[tk] : 1.0, b[k] = sy[tk * d + i];
                ck_assert(same_value(out[tk * d + i], mpref_dot(a, b, (size_t)k + 1, t)));
                int64_t m = 0;
                for (int64_t j = 0; j < k; j++)
                    a[m] = 1.0, b[m++] = dxs[inv[tk * k + j] * d + i];
                for (int64_t e = 0; e < E; e++)
                    a[m] = dlg[tk * E + e], b[m++] = wr[i * E + e];
                for (int64_t c = 0; c < F; c++) {
                    if (ffn_gated)
                        a[m] = dhg[tk * F + c], b[m++] = wg[i * F + c];
                    a[m] = dhu[tk * F + c], b[m++] = wu[i * F + c];
                }
                if (gated)
                    a[m] = dl[tk], b[m++] = wsg[i];
                ck_assert(same_value(dx[tk * d + i], mpref_dot(a, b, (size_t)m, t)));
            }
        /* without the shared path these are dl_combine and dl_input_backward */
        ck_assert_int_eq(dl_combine_shared(y, w, inv, NULL, NULL, T, k, d, t, out), 0);
        ck_assert_int_eq(dl_combine(y, w, inv, T, k, d, t, o1), 0);
        ck_assert(memcmp(out, o1, (size_t)(T * d) * sizeof *out) == 0);
        omp_set_num_threads(1);
        ck_assert_int_eq(dl_input_backward_shared(dxs, inv, dlg, wr, &sh, T, k, d, E, t, o1), 0);
        omp_set_num_threads(2);
        ck_assert(memcmp(dx, o1, (size_t)(T * d) * sizeof *dx) == 0);
        const dl_shared_grad_t half = {F, dhg, dhu, wg, wu, dl, NULL}; /* logit without weight */
        ck_assert_int_eq(dl_input_backward_shared(dxs, inv, dlg, wr, &half, T, k, d, E, t, o1),
                         DL_EINVAL);
        const dl_shared_grad_t nog = {F, dhg, dhu, NULL, wu, NULL, NULL}; /* gate without weight */
        ck_assert_int_eq(dl_input_backward_shared(dxs, inv, dlg, wr, &nog, T, k, d, E, t, o1),
                         DL_EINVAL);
        free(a), free(b), free(inv), free(y), free(w), free(sy), free(g), free(dxs), free(dlg);
        free(wr), free(dhg), free(dhu), free(wg), free(wu), free(dl), free(wsg), free(out);
        free(dx), free(o1);
    }
}
END_TEST

/* --------------------------------------------------------- the layer */

/* RN_t(sum_c a[t*K + c*as] b[...]) for a dense product: row t of A [T, K]
 * (or column t of A^T when at) times column j of B [K, N] (or row j of
 * B^T when bt, B stored [N, K]), exact in MPFR. */
static double ref_gemm(const float *A, const float *B, int64_t t, int64_t j, int64_t K,
                       int64_t lda, int at, int64_t ldb, int bt, dl_dtype_t ty)
{
    double *a = malloc((K + 1) * sizeof *a), *b = malloc((K + 1) * sizeof *b);
    for (int64_t c = 0; c < K; c++) {
        a[c] = at ? A[c * lda + t] : A[t * lda + c];
        b[c] = bt ? B[j * ldb + c] : B[c * ldb + j];
    }
    double r = mpref_dot(a, b, (size_t)K, ty);
    free(a), free(b);
    return r;
}

/* Every element of a [rows, cols] dense GEMM value against MPFR. */
static void check_gemm(const char *what, const float *got, const float *A, const float *B,
                       int64_t rows, int64_t cols, int64_t K, int64_t lda, int at, int64_t ldb,
                       int bt, dl_dtype_t ty)
{
    for (int64_t t = 0; t < rows; t++)
        for (int64_t j = 0; j < cols; j++) {
            const double want = ref_gemm(A, B, t, j, K, lda, at, ldb, bt, ty);
            ck_assert_msg(same_value(got[t * cols + j], want), "%s[%lld,%lld] = %a, exact %a",
                          what, (long long)t, (long long)j, (double)got[t * cols + j], want);
        }
}

/* The catalogue families: qwen2-moe-like (gated, one expert of width 4f),
 * deepseek-v3-shared (two experts unscaled) and nemotron-shared (relu^2,
 * non-gated: no gate projection), each dtype. */
static const char *const layer_cases[] = {
    "qwen2-moe-like", "qwen2-moe-like-bf16", "qwen2-moe-like-fp16",
    "deepseek-v3-shared", "deepseek-v3-shared-bf16", "deepseek-v3-shared-fp16",
    "nemotron-shared", "nemotron-shared-bf16", "nemotron-shared-fp16"};

/* relu^2's shared activation and its VJP against exact values: relu(u)^2
 * and 2 relu(u) dh are exact in binary64 (24-bit floats), rounded once
 * (the activation's own MPFR test is test_ffn_act's relu2_vs_mpfr). */
static void check_relu2(const dl_moe_forward_t *f, const dl_moe_backward_t *b, int64_t n,
                        dl_dtype_t t)
{
    for (int64_t i = 0; i < n; i++) {
        const double r = f->shared_h_up[i] > 0 ? f->shared_h_up[i] : 0.0;
        ck_assert(same_value(f->shared_h_act[i], mpref_round_d(r * r, t)));
        /* the subgradient at 0 is +0 */
        const double du = r > 0 ? mpref_round_d(2.0 * r * b->d_shared_h_act[i], t) : 0.0;
        ck_assert(same_value(b->d_shared_h_up[i], du));
    }
}

START_TEST(layer_values)
{
    dl_case_t cs;
    ck_assert_int_eq(dl_case_find(layer_cases[_i], &cs), 0);
    const dl_moe_config_t *c = &cs.config;
    dl_golden_inputs_t gi;
    ck_assert_int_eq(dl_case_inputs(&cs, &gi), 0);
    const dl_moe_inputs_t in = dl_golden_inputs_view(&gi);
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    ck_assert_int_eq(dl_moe_forward(c, &in, &f), 0);
    ck_assert_int_eq(dl_moe_backward(c, &in, &f, &b), 0);
    const int64_t T = c->tokens, d = c->hidden, F = c->shared_experts * c->shared_ffn;
    const dl_dtype_t t = c->dtype;
    ck_assert(F > 0 && (c->shared_gate != 0) == (strstr(cs.name, "qwen2") != NULL));
    const int gated = DL_FFN_GATED(c->ffn_kind);
    ck_assert(gated == (in.shared_w_gate != NULL) && gated == (f.shared_h_gate != NULL) &&
              gated == (b.d_shared_h_gate != NULL) && gated == (b.d_shared_w_gate != NULL));
    if (gated)
        check_gemm("shared_h_gate", f.shared_h_gate, in.x, in.shared_w_gate, T, F, d, d, 0, F, 0, t);
    else
        check_relu2(&f, &b, T * F, t);
    check_gemm("shared_h_up", f.shared_h_up, in.x, in.shared_w_up, T, F, d, d, 0, F, 0, t);
    check_gemm("shared_y", f.shared_y, f.shared_h_act, in.shared_w_down, T, d, F, F, 0, d, 0, t);
    check_gemm("d_shared_h_act", b.d_shared_h_act, b.d_shared_y, in.shared_w_down, T, F, d, d,
               0, d, 1, t);
    check_gemm("d_shared_w_down", b.d_shared_w_down, f.shared_h_act, b.d_shared_y, F, d, T, F,
               1, d, 0, DL_F32);
    if (gated)
        check_gemm("d_shared_w_gate", b.d_shared_w_gate, in.x, b.d_shared_h_gate, d, F, T, d, 1,
                   F, 0, DL_F32);
    check_gemm("d_shared_w_up", b.d_shared_w_up, in.x, b.d_shared_h_up, d, F, T, d, 1, F, 0,
               DL_F32);
    if (c->shared_gate) {
        check_gemm("shared_gate_logit", f.shared_gate_logit, in.x, in.shared_gate_weight, T, 1,
                   d, d, 0, 1, 0, DL_F32);
        check_gemm("d_shared_gate_weight", b.d_shared_gate_weight, in.x, b.d_shared_gate_logit,
                   d, 1, T, d, 1, 1, 0, DL_F32);
        for (int64_t i = 0; i < T; i++) {
            ck_assert(same_value(f.shared_gate[i], ref_sigmoid(f.shared_gate_logit[i], DL_F32)));
            ck_assert(same_value(b.d_shared_gate_logit[i],
                                 ref_gate_vjp(b.d_shared_gate[i], f.shared_gate[i])));
        }
        for (int64_t i = 0; i < T; i++) /* <d_out[t], shared_y[t]>: row t of each */
            check_gemm("d_shared_gate", b.d_shared_gate + i, in.d_out + i * d, f.shared_y + i * d,
                       1, 1, d, d, 0, d, 1, DL_F32);
    } else {
        ck_assert(!f.shared_gate && !f.shared_gate_logit && !b.d_shared_gate &&
                  !b.d_shared_gate_weight && !in.shared_gate_weight);
    }
    /* out: the routed slots and the (gated) shared term in one sum; d_x
     * with the shared path's three terms (MPFR, from the stored values) */
    const int64_t k = c->route.top_k, E = c->route.experts, n = k + E + 2 * F + 2;
    double *a = malloc(n * sizeof *a), *v = malloc(n * sizeof *v);
    for (int64_t tk = 0; tk < T; tk++)
        for (int64_t i = 0; i < d; i++) {
            const double g = c->shared_gate ? f.shared_gate[tk] : 1.0;
            for (int64_t j = 0; j < k; j++)
                a[j] = f.topk_weights[tk * k + j],
                v[j] = f.y_sorted[(int64_t)f.inv_perm[tk * k + j] * d + i];
            a[k] = g, v[k] = f.shared_y[tk * d + i];
            ck_assert(same_value(f.out[tk * d + i], mpref_dot(a, v, (size_t)k + 1, t)));
            ck_assert(same_value(b.d_shared_y[tk * d + i],
                                 mpref_round_d(g * in.d_out[tk * d + i], t)));
            int64_t m = 0;
            for (int64_t j = 0; j < k; j++)
                a[m] = 1.0, v[m++] = b.d_x_sorted[(int64_t)f.inv_perm[tk * k + j] * d + i];
            for (int64_t e = 0; e < E; e++)
                a[m] = b.d_router_logits[tk * E + e], v[m++] = in.router_weight[i * E + e];
            for (int64_t q = 0; q < F; q++) {
                if (gated)
                    a[m] = b.d_shared_h_gate[tk * F + q], v[m++] = in.shared_w_gate[i * F + q];
                a[m] = b.d_shared_h_up[tk * F + q], v[m++] = in.shared_w_up[i * F + q];
            }
            if (c->shared_gate)
                a[m] = b.d_shared_gate_logit[tk], v[m++] = in.shared_gate_weight[i];
            ck_assert(same_value(b.d_x[tk * d + i], mpref_dot(a, v, (size_t)m, t)));
        }
    /* S experts of width f_s summed are the concatenated MLP: shared_y as
     * the sum over the experts of each expert's exact partial product */
    const int64_t fs = c->shared_ffn;
    for (int64_t tk = 0; tk < T; tk++)
        for (int64_t i = 0; i < d; i++) {
            mpfr_t acc, p;
            mpfr_init2(acc, MPREF_EXACT_PREC);
            mpfr_init2(p, 106);
            mpfr_set_zero(acc, 1);
            for (int64_t s = 0; s < c->shared_experts; s++)
                for (int64_t q = s * fs; q < (s + 1) * fs; q++) {
                    mpfr_set_d(p, f.shared_h_act[tk * F + q], MPFR_RNDN);
                    mpfr_mul_d(p, p, in.shared_w_down[q * d + i], MPFR_RNDN);
                    mpfr_add(acc, acc, p, MPFR_RNDN);
                }
            ck_assert(same_value(f.shared_y[tk * d + i], mpref_round(acc, t)));
            mpfr_clear(acc), mpfr_clear(p);
        }
    free(a), free(v);
    dl_moe_backward_free(&b);
    dl_moe_forward_free(&f);
    dl_golden_inputs_free(&gi);
}
END_TEST

/* The shared experts change nothing else: the routed values of a case with
 * them equal those of the same case without them, bit for bit; out differs. */
START_TEST(layer_routed_unchanged)
{
    dl_case_t cs;
    ck_assert_int_eq(dl_case_find("qwen2-moe-like", &cs), 0);
    dl_golden_inputs_t gi;
    ck_assert_int_eq(dl_case_inputs(&cs, &gi), 0);
    const dl_moe_inputs_t in = dl_golden_inputs_view(&gi);
    dl_moe_config_t none = cs.config;
    none.shared_experts = none.shared_ffn = 0;
    none.shared_gate = 0;
    dl_moe_forward_t f, g;
    ck_assert_int_eq(dl_moe_forward(&cs.config, &in, &f), 0);
    ck_assert_int_eq(dl_moe_forward(&none, &in, &g), 0);
    const int64_t M = cs.config.tokens * cs.config.route.top_k, d = cs.config.hidden;
    ck_assert(memcmp(f.y_sorted, g.y_sorted, (size_t)(M * d) * sizeof(float)) == 0);
    ck_assert(!g.shared_y && memcmp(f.out, g.out, (size_t)(cs.config.tokens * d) * 4) != 0);
    dl_moe_forward_free(&f);
    dl_moe_forward_free(&g);
    dl_golden_inputs_free(&gi);
}
END_TEST

/* Invalid shared configurations are refused by the layer and by the case
 * parser's configuration check. */
START_TEST(config_refused)
{
    dl_case_t cs;
    ck_assert_int_eq(dl_case_find("deepseek-v3-shared", &cs), 0);
    ck_assert_int_eq(dl_moe_config_validate(&cs.config), 0);
    const struct { int64_t S, fs; int gate; } bad[] = {
        {-1, 8, 0}, {1, 0, 0}, {0, 8, 0}, {0, 0, 1}, {2, 8, 2}, {INT64_MAX / 2, 8, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dl_moe_config_t c = cs.config;
        c.shared_experts = bad[i].S, c.shared_ffn = bad[i].fs, c.shared_gate = bad[i].gate;
        ck_assert_msg(dl_moe_config_validate(&c) != 0, "row %zu accepted", i);
    }
    /* the inputs must be there: a NULL shared weight is refused */
    dl_golden_inputs_t gi;
    ck_assert_int_eq(dl_case_inputs(&cs, &gi), 0);
    dl_moe_inputs_t in = dl_golden_inputs_view(&gi);
    in.shared_w_up = NULL;
    ck_assert_int_eq(dl_moe_inputs_validate(&cs.config, &in, 1), DL_EINVAL);
    dl_golden_inputs_free(&gi);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("shared-stages", "gate", gate_forward_backward, 60),
        DL_TEST("shared-stages", "combine-backward", combine_backward, 60),
        DL_TEST("shared-stages", "sums", combine_and_input_backward, 120),
        DL_TEST_LOOP("shared-layer", "values", layer_values, 0,
                     (int)(sizeof layer_cases / sizeof *layer_cases), 300),
        DL_TEST("shared-layer", "routed-unchanged", layer_routed_unchanged, 60),
        DL_TEST("shared-layer", "config", config_refused, 60),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
