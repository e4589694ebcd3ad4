/* Llama-4's routing weight on the expert input (route.weight_on_input,
 * src/stages/route_input.c) and DeepSeek-V4's hash routing (route_hash.c)
 * against GNU MPFR: the routed input
 * RN_t(x s) in fp32, bf16 and fp16, the scores' VJP RN_fp32(<d_x_sorted, x>)
 * and the input gradient sum_j s_j d_x_sorted + d_logits W^T, each bit for
 * bit, on random inputs and on the boundaries: a product exactly halfway
 * between two bf16 values (ties to even), zero and negative-zero inputs, a
 * dot that cancels exactly to zero (+0), top-1 ties of the scores (the
 * lower id wins; the VJP follows the selection it is given), the
 * configurations the variant refuses, and thread-count independence; hash
 * routing's ids are the table's rows for the token ids and its weights
 * RN(c s_j / sum s) computed in MPFR, a table or token id out of range and
 * a row listing an expert twice are refused. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "tap.h"
#include "mpref.h"
#include "dropless.h"
#include "stages/stages_priv.h"

static dl_route_config_t l4(int64_t E, int64_t k)
{
    dl_route_config_t c = {E, k, DL_SCORE_SIGMOID, 1, 1, DL_GROUP_MAX, 0, 1.0, 0, 0, 1};
    return c;
}

static float ref_prod(float x, float w, dl_dtype_t t)
{
    mpfr_t p;
    mpfr_init2(p, 64);
    mpfr_set_flt(p, x, MPFR_RNDN);
    mpfr_mul_d(p, p, w, MPFR_RNDN); /* 48 bits: exact */
    float r = (float)mpref_round(p, t);
    mpfr_clear(p);
    return r;
}

static int bits_eq(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* a random float on t's grid */
static float on_grid(dl_test_rng_t *r, double scale, dl_dtype_t t)
{
    return (float)mpref_round_d(scale * dl_test_normal(r), t);
}

START_TEST(scale_input_vs_mpfr)
{
    const dl_dtype_t ts[3] = {DL_F32, DL_BF16, DL_F16};
    dl_test_rng_t r = {40};
    enum { T = 9, k = 2, d = 7, M = T * k };
    for (int ti = 0; ti < 3; ti++) {
        float x[T * d], w[M], out[M * d];
        int32_t perm[M];
        for (int i = 0; i < T * d; i++)
            x[i] = on_grid(&r, 1.0, ts[ti]);
        for (int i = 0; i < M; i++) {
            w[i] = (float)dl_test_unif(&r);
            perm[i] = (int32_t)((i * 7) % M); /* a permutation: 7 and 18 coprime */
        }
        x[0] = 0.0f, x[1] = -0.0f, w[3] = 0.0f, w[5] = 1.0f;
        ck_assert_int_eq(dl_route_scale_input(x, T, d, k, w, perm, ts[ti], out), 0);
        for (int p = 0; p < M; p++)
            for (int i = 0; i < d; i++) {
                float want = ref_prod(x[(perm[p] / k) * d + i], w[perm[p]], ts[ti]);
                ck_assert_msg(bits_eq(out[p * d + i], want), "%s row %d col %d: %a want %a",
                              dl_dtype_name(ts[ti]), p, i, out[p * d + i], want);
            }
    }
}
END_TEST

START_TEST(scale_input_boundaries)
{
    /* (1 + 2^-7) * (1 + 2^-1) = 1.5 + 1.5 * 2^-7: halfway in bf16, ties to even */
    float x[2] = {1.0f + 0x1p-7f, -0.0f}, w[2] = {1.5f, 0.25f}, out[4];
    int32_t perm[2] = {1, 0};
    ck_assert_int_eq(dl_route_scale_input(x, 2, 1, 1, w, perm, DL_BF16, out), 0);
    ck_assert(bits_eq(out[0], -0.0f)); /* row 0 is token 1: -0 * 0.25 keeps its sign */
    ck_assert(bits_eq(out[1], ref_prod(x[0], 1.5f, DL_BF16)));
    ck_assert_float_eq(out[1], 1.5f + 0x1p-6f); /* the even neighbour, not 1.5 */
    perm[0] = 2; /* out of range */
    ck_assert_int_eq(dl_route_scale_input(x, 2, 1, 1, w, perm, DL_BF16, out), DL_ERANGE);
    ck_assert_int_eq(dl_route_scale_input(x, 2, 1, 1, w, perm, DL_F64, out), DL_EDTYPE);
}
END_TEST

/* RN_fp32(sum_i a_i b_i), exactly in MPFR */
static float ref_dot(const float *a, const float *b, int64_t n)
{
    double da[64], db[64];
    for (int64_t i = 0; i < n; i++)
        da[i] = a[i], db[i] = b[i];
    float f = (float)mpref_dot(da, db, (size_t)n, DL_F32);
    return f == 0.0f ? 0.0f : f;
}

START_TEST(input_backward_vs_mpfr)
{
    dl_test_rng_t r = {41};
    enum { T = 11, E = 6, k = 2, d = 13, M = T * k };
    dl_route_config_t c = l4(E, k);
    float x[T * d], dxs[M * d], sc[T * E], ds[T * E], dl[T * E];
    int32_t ids[T * k], inv[M];
    for (int i = 0; i < T * d; i++)
        x[i] = (float)dl_test_normal(&r);
    for (int i = 0; i < M * d; i++)
        dxs[i] = (float)dl_test_normal(&r) * 0x1p-3f;
    for (int i = 0; i < T * E; i++)
        sc[i] = (float)dl_test_unif(&r);
    for (int t = 0; t < T; t++)
        ids[t * k] = t % E, ids[t * k + 1] = (t + 3) % E;
    for (int i = 0; i < M; i++)
        inv[i] = (int32_t)((i * 5) % M);
    /* token 0's first expert: the gradient row is x itself negated in
     * half and doubled in half: the dot cancels exactly to zero */
    for (int i = 0; i < d; i++)
        dxs[inv[0] * d + i] = 0.0f;
    dxs[inv[0] * d + 0] = x[1], dxs[inv[0] * d + 1] = -x[0];
    ck_assert_int_eq(dl_route_input_backward(&c, x, d, dxs, inv, sc, ids, T, ds, dl), 0);
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            float want = 0.0f;
            for (int j = 0; j < k; j++)
                if (ids[t * k + j] == e)
                    want = ref_dot(dxs + (int64_t)inv[t * k + j] * d, x + t * d, d);
            ck_assert_msg(bits_eq(ds[t * E + e], want), "t %d e %d: %a want %a", t, e,
                          ds[t * E + e], want);
        }
    ck_assert(bits_eq(ds[ids[0]], 0.0f)); /* +0, not -0 */
    float dl2[T * E]; /* d_logits: the sigmoid VJP of the stored d_scores */
    ck_assert_int_eq(dl_route_scores_backward(&c, sc, ds, T, dl2), 0);
    ck_assert(!memcmp(dl, dl2, sizeof dl));
}
END_TEST

/* sum_j w_j dxs_j + sum_e dl_e W_ie, exactly, rounded once to t */
static float ref_dx(const float *w, const float *dxs, const int32_t *inv, const float *dlg,
                    const float *W, int64_t t_, int64_t i, int64_t k, int64_t d, int64_t E,
                    dl_dtype_t t)
{
    double a[64], b[64];
    int64_t n = 0;
    for (int64_t j = 0; j < k; j++, n++)
        a[n] = w[t_ * k + j], b[n] = dxs[(int64_t)inv[t_ * k + j] * d + i];
    for (int64_t e = 0; e < E; e++, n++)
        a[n] = dlg[t_ * E + e], b[n] = W[i * E + e];
    float f = (float)mpref_dot(a, b, (size_t)n, t);
    return f == 0.0f ? 0.0f : f;
}

/* Random d_x inputs: d_x_sorted on t's grid, router gradients and weights. */
static void dx_inputs(dl_test_rng_t *r, int64_t M, int64_t T, int64_t E, int64_t d,
                      dl_dtype_t t, float *dxs, float *dlg, float *W)
{
    for (int64_t i = 0; i < M * d; i++)
        dxs[i] = on_grid(r, 1.0, t);
    for (int64_t i = 0; i < T * E; i++)
        dlg[i] = (float)dl_test_normal(r) * 0x1p-4f;
    for (int64_t i = 0; i < d * E; i++)
        W[i] = (float)dl_test_normal(r);
}

START_TEST(input_gradient_vs_mpfr)
{
    dl_test_rng_t r = {42};
    enum { T = 7, E = 5, k = 2, d = 6, M = T * k };
    for (int bf = 0; bf < 2; bf++) {
        const dl_dtype_t t = bf ? DL_BF16 : DL_F32;
        float w[M], dxs[M * d], dlg[T * E], W[d * E], dx[T * d];
        int32_t inv[M];
        for (int i = 0; i < M; i++)
            w[i] = (float)dl_test_unif(&r), inv[i] = (int32_t)((i * 3) % M);
        dx_inputs(&r, M, T, E, d, t, dxs, dlg, W);
        ck_assert_int_eq(dl__input_backward_w(dxs, w, inv, dlg, W, NULL, T, k, d, E, t, dx), 0);
        for (int tk = 0; tk < T; tk++)
            for (int i = 0; i < d; i++)
                ck_assert(bits_eq(dx[tk * d + i], ref_dx(w, dxs, inv, dlg, W, tk, i, k, d, E, t)));
    }
}
END_TEST

/* The vector lanes of d_x (dispatch.c's d_x_token: 16 features at a
 * time, a tail of 5 here) against MPFR, with and without input weights,
 * on random sums and on adversarial ones whose binary64 sum misses the
 * rounding: 1 + 2^-8 + 40 x 2^-54 in bf16 is above the midpoint of 1 and
 * 1 + 2^-7 only by the 40 x 2^-54 that a binary64 sum drops term by term
 * (more than the ulp dl__certify widens by), 1 + 2^-8 alone is a tie (to
 * even: 1), and -3 + 3 cancels to an exact +0. */
START_TEST(input_gradient_lanes_vs_mpfr)
{
    dl_test_rng_t r = {4242};
    enum { T = 9, E = 40, k = 6, d = 37, M = T * k };
    static float w[M], dxs[M * d], dlg[T * E], W[d * E], dx[T * d];
    static int32_t inv[M];
    for (int pass = 0; pass < 4; pass++) {
        const dl_dtype_t t = pass & 1 ? DL_BF16 : DL_F32;
        for (int i = 0; i < M; i++)
            w[i] = pass < 2 ? 1.0f : (float)dl_test_unif(&r), inv[i] = (int32_t)((i * 5) % M);
        dx_inputs(&r, M, T, E, d, t, dxs, dlg, W);
        /* token 0: E router products of 2^-54 each on feature 0, none on 1 and 2 */
        for (int e = 0; e < E; e++)
            dlg[e] = 0x1p-27f, W[e] = 0x1p-27f, W[E + e] = W[2 * E + e] = 0.0f;
        for (int i = 0; i < d; i++)
            for (int j = 0; j < k; j++)
                dxs[(int64_t)inv[j] * d + i] = j == 0 ? (i % 2 ? -3.0f : 1.0f)
                                             : j == 1 ? (i % 2 ? 3.0f : 0x1p-8f) : 0.0f;
        w[0] = w[1] = 1.0f;
        ck_assert_int_eq(dl__input_backward_w(dxs, pass < 2 ? NULL : w, inv, dlg, W, NULL, T, k, d,
                                              E, t, dx), 0);
        float one[M];
        for (int i = 0; i < M; i++)
            one[i] = pass < 2 ? 1.0f : w[i];
        for (int tk = 0; tk < T; tk++)
            for (int i = 0; i < d; i++)
                ck_assert_msg(bits_eq(dx[tk * d + i], ref_dx(one, dxs, inv, dlg, W, tk, i, k, d, E, t)),
                              "pass %d token %d feature %d: %a", pass, tk, i, dx[tk * d + i]);
        if (t == DL_BF16) /* the adversarial rows decide as argued above */
            ck_assert(bits_eq(dx[0], 0x1.02p0f) && bits_eq(dx[2], 1.0f) && bits_eq(dx[1], 0.0f));
    }
}
END_TEST

START_TEST(selection_and_refusals)
{
    /* top-1 with tied scores: the lower id wins; the combine's weight is 1 */
    dl_route_config_t c = l4(4, 1);
    float s[4] = {0.25f, 0.75f, 0.75f, 0.5f}, w = 0.0f, m = 1.0f, dw = 3.0f, ds[4];
    int32_t id = -1;
    ck_assert_int_eq(dl_route_topk(&c, s, NULL, 1, &id, &w, &m), 0);
    ck_assert_int_eq(id, 1);
    ck_assert_float_eq(w, 1.0f);
    ck_assert(bits_eq(m, 0.0f)); /* an exact tie */
    float win;
    ck_assert_int_eq(dl_route_input_weights(&c, s, &id, 1, &win), 0);
    ck_assert(bits_eq(win, 0.75f));
    /* the combine's weights are constant: no gradient reaches the scores through them */
    ck_assert_int_eq(dl_route_backward(&c, s, &id, &dw, 1, ds, NULL), 0);
    for (int e = 0; e < 4; e++)
        ck_assert(bits_eq(ds[e], 0.0f));
    c.renormalize = 1;
    ck_assert_int_eq(dl_route_config_validate(&c), DL_EINVAL);
    c.renormalize = 0, c.scaling = 2.0;
    ck_assert_int_eq(dl_route_config_validate(&c), DL_EINVAL);
    c.scaling = 1.0, c.score_fn = DL_SCORE_SOFTMAX_TOPK;
    ck_assert_int_eq(dl_route_config_validate(&c), DL_EINVAL);
    c.score_fn = DL_SCORE_SIGMOID, c.weight_on_input = 0;
    ck_assert_int_eq(dl_route_input_weights(&c, s, &id, 1, &win), DL_EINVAL);
    c.weight_on_input = 1, c.top_k = 2;
    int32_t dup[2] = {1, 1};
    float w2[2];
    ck_assert_int_eq(dl_route_input_weights(&c, s, dup, 1, w2), DL_EINVAL);
    dup[1] = 4;
    ck_assert_int_eq(dl_route_input_weights(&c, s, dup, 1, w2), DL_ERANGE);
}
END_TEST

START_TEST(thread_count)
{
#ifdef _OPENMP
    dl_test_rng_t r = {43};
    enum { T = 64, E = 8, d = 32 };
    dl_route_config_t c = l4(E, 1);
    static float x[T * d], dxs[T * d], sc[T * E], ds[2][T * E];
    int32_t ids[T], inv[T];
    for (int i = 0; i < T * d; i++)
        x[i] = (float)dl_test_normal(&r), dxs[i] = (float)dl_test_normal(&r);
    for (int i = 0; i < T * E; i++)
        sc[i] = (float)dl_test_unif(&r);
    for (int t = 0; t < T; t++)
        ids[t] = t % E, inv[t] = (t * 7) % T;
    for (int n = 0; n < 2; n++) {
        omp_set_num_threads(n ? 3 : 1);
        ck_assert_int_eq(dl_route_input_backward(&c, x, d, dxs, inv, sc, ids, T, ds[n], NULL), 0);
    }
    ck_assert(!memcmp(ds[0], ds[1], sizeof ds[0]));
#else
    dl_test_skip("no OpenMP");
#endif
}
END_TEST

/* RN_fp32(c s_j / sum_i s_i), in MPFR */
static float ref_renorm(double c, const float *s, const int32_t *id, int64_t k, int64_t j)
{
    mpfr_t S, q;
    mpfr_inits2(MPREF_EXACT_PREC, S, q, (mpfr_ptr)0);
    mpfr_set_zero(S, 1);
    for (int64_t i = 0; i < k; i++)
        mpfr_add_d(S, S, s[id[i]], MPFR_RNDN); /* exact */
    mpfr_set_d(q, s[id[j]], MPFR_RNDN);
    mpfr_mul_d(q, q, c, MPFR_RNDN); /* exact */
    mpfr_div(q, q, S, MPFR_RNDN);   /* within 2^-4400 relative: far below any fp32 boundary here */
    float r = (float)mpref_round(q, DL_F32);
    mpfr_clears(S, q, (mpfr_ptr)0);
    return r;
}

START_TEST(hash_vs_mpfr)
{
    dl_test_rng_t r = {44};
    enum { T = 13, E = 8, k = 3, V = 5 };
    dl_route_config_t c = {E, k, DL_SCORE_SIGMOID, 1, 1, DL_GROUP_MAX, 1, 1.5, 0, 0, 0, V};
    float s[T * E], w[T * k], mg[T];
    int32_t table[V * k], tid[T], ids[T * k];
    for (int i = 0; i < T * E; i++)
        s[i] = (float)dl_test_unif(&r);
    for (int v = 0; v < V; v++)
        for (int j = 0; j < k; j++)
            table[v * k + j] = (v + 3 * j) % E; /* distinct: 3j mod 8 for j < 3 */
    for (int t = 0; t < T; t++)
        tid[t] = (int32_t)(dl_test_next(&r) % V);
    s[0] = s[1] = s[2] = 0.5f; /* ties in the scores change nothing: the table chooses */
    ck_assert_int_eq(dl_route_hash(&c, s, table, tid, T, ids, w, mg), 0);
    for (int t = 0; t < T; t++) {
        ck_assert(isinf(mg[t]) && mg[t] > 0);
        for (int j = 0; j < k; j++) {
            ck_assert_int_eq(ids[t * k + j], table[tid[t] * k + j]);
            float want = ref_renorm(1.5, s + t * E, ids + t * k, k, j);
            ck_assert_msg(bits_eq(w[t * k + j], want), "t %d j %d: %a want %a", t, j,
                          w[t * k + j], want);
        }
    }
    tid[4] = V; /* a token id past the table */
    ck_assert_int_eq(dl_route_hash(&c, s, table, tid, T, ids, w, mg), DL_ERANGE);
    tid[4] = 0, table[2] = E; /* an expert out of range */
    ck_assert_int_eq(dl_route_hash(&c, s, table, tid, T, ids, w, mg), DL_ERANGE);
    table[2] = table[0]; /* an expert twice in a row */
    ck_assert_int_eq(dl_route_hash(&c, s, table, tid, T, ids, w, mg), DL_EINVAL);
    c.has_bias = 1; /* a selection bias has nothing to choose */
    ck_assert_int_eq(dl_route_config_validate(&c), DL_EINVAL);
    c.has_bias = 0, c.hash_vocab = 0;
    ck_assert_int_eq(dl_route_hash(&c, s, table, tid, T, ids, w, mg), DL_EINVAL);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("scale_input", "mpfr", scale_input_vs_mpfr, 60),
        DL_TEST("scale_input", "boundaries", scale_input_boundaries, 60),
        DL_TEST("input_backward", "mpfr", input_backward_vs_mpfr, 60),
        DL_TEST("input_gradient", "mpfr", input_gradient_vs_mpfr, 60),
        DL_TEST("input_gradient", "mpfr", input_gradient_lanes_vs_mpfr, 60),
        DL_TEST("selection", "ties_and_refusals", selection_and_refusals, 60),
        DL_TEST("threads", "same_bits", thread_count, 60),
        DL_TEST("hash", "mpfr_and_refusals", hash_vs_mpfr, 60),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
