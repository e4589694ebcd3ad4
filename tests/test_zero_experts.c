/* LongCat-Flash's zero (identity) experts (route.zero_experts = Z): the
 * whole layer, forward and backward, against GNU MPFR and formulas of the
 * test's own. The router scores R = E + Z columns; ids in [E, E + Z) are
 * sorted after the real experts as the identity tail (a stable sort by id
 * over the R buckets, written independently here); a zero expert's
 * y_sorted row is its token's x and its d_x_sorted row its d_y_sorted row,
 * bit for bit; the hidden arrays are +0 there; out, d_topk_weights, d_x and
 * d_router_weight are each the exact sum of their terms (the zero experts'
 * w x among them) rounded once. On random inputs in fp32 and bf16 and on
 * the boundaries: every slot an identity (no real expert gets a row: the
 * GEMMs see none, every weight gradient exactly 0), no identity slot (the
 * layer is the plain one over R columns), and a zero expert tied exactly
 * with a real one (the lower id, the real expert, wins; the tie margin 0).
 * Also the configurations refused and thread-count independence. */
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

enum { T = 9, d = 6, f = 5, E = 3, Z = 3, R = E + Z, k = 2, M = T * k };

enum { RANDOM, ALL_IDENTITY, NO_IDENTITY, TIED };

typedef struct {
    float x[T * d], wr[d * R], bias[R], wg[E * d * f], wu[E * d * f], wd[E * f * d], dout[T * d];
    dl_moe_config_t c;
    dl_moe_inputs_t in;
    dl_moe_forward_t fw;
    dl_moe_backward_t bw;
} layer_t;

static float grid(dl_test_rng_t *r, double s, dl_dtype_t t)
{
    return (float)mpref_round_d(s * dl_test_normal(r), t);
}

static void make(layer_t *L, dl_dtype_t t, int kind, uint64_t seed)
{
    dl_test_rng_t r = {seed};
    memset(L, 0, sizeof *L);
    for (int i = 0; i < T * d; i++)
        L->x[i] = grid(&r, 1.0, t), L->dout[i] = grid(&r, 1.0, t);
    for (int i = 0; i < d * R; i++)
        L->wr[i] = (float)(0.5 * dl_test_normal(&r));
    for (int i = 0; i < E * d * f; i++)
        L->wg[i] = grid(&r, 0.4, t), L->wu[i] = grid(&r, 0.4, t), L->wd[i] = grid(&r, 0.4, t);
    for (int e = 0; e < R; e++) /* scores <= 1: a bias of +-2 decides the selection */
        L->bias[e] = kind == ALL_IDENTITY ? (e >= E ? 2.0f : 0.0f)
                     : kind == NO_IDENTITY ? (e >= E ? -2.0f : 0.0f)
                                           : (float)(0.0625 * dl_test_normal(&r));
    if (kind == TIED) { /* zero expert E is real expert 0's exact copy: their keys tie */
        for (int i = 0; i < d; i++)
            L->wr[i * R + E] = L->wr[i * R + 0];
        L->bias[E] = L->bias[0] = 0.5f; /* second behind expert 1: tied at the k boundary */
        L->bias[1] = 1.0f;
    }
    L->c = (dl_moe_config_t){.tokens = T, .hidden = d, .ffn = f, .ffn_kind = DL_FFN_SWIGLU,
                             .dtype = t};
    L->c.route = (dl_route_config_t){.experts = E, .top_k = k, .score_fn = DL_SCORE_SOFTMAX,
                                     .n_group = 1, .topk_group = 1, .group_score = DL_GROUP_MAX,
                                     .renormalize = 0, .scaling = 6.0, .has_bias = 1,
                                     .zero_experts = Z};
    L->in = (dl_moe_inputs_t){.x = L->x, .router_weight = L->wr, .expert_bias = L->bias,
                              .w_gate = L->wg, .w_up = L->wu, .w_down = L->wd, .d_out = L->dout};
}

static int run(layer_t *L)
{
    int rc = dl_moe_forward(&L->c, &L->in, &L->fw);
    return rc ? rc : dl_moe_backward(&L->c, &L->in, &L->fw, &L->bw);
}

static void release(layer_t *L)
{
    dl_moe_forward_free(&L->fw);
    dl_moe_backward_free(&L->bw);
}

static int bits_eq(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* exact sum_n a[n] b[n], rounded once to t, an exact zero +0 */
static float ref(const double *a, const double *b, int n, dl_dtype_t t)
{
    float v = (float)mpref_dot(a, b, (size_t)n, t);
    return v == 0.0f ? 0.0f : v;
}

/* The stable sort by id over R buckets, the real experts' E first. */
static void check_sort(const layer_t *L, int *n_id)
{
    const int32_t *ids = L->fw.topk_ids;
    int p = 0;
    *n_id = 0;
    for (int e = 0; e < R; e++)
        for (int fl = 0; fl < M; fl++)
            if (ids[fl] == e) {
                ck_assert_int_eq(L->fw.sort_perm[p], fl);
                ck_assert_int_eq(L->fw.inv_perm[fl], p);
                p++;
                *n_id += e >= E;
            }
    ck_assert_int_eq(p, M);
    int64_t s = 0;
    for (int e = 0; e < E; e++) {
        ck_assert_int_eq(L->fw.group_offsets[e], s);
        s += L->fw.group_sizes[e];
    }
    ck_assert_int_eq(L->fw.group_offsets[E], M - *n_id);
}

/* The identity tail: y_sorted = x, d_x_sorted = d_y_sorted, hidden +0. */
static void check_tail(const layer_t *L)
{
    for (int p = (int)L->fw.group_offsets[E]; p < M; p++) {
        const int tok = L->fw.sort_perm[p] / k;
        ck_assert(!memcmp(L->fw.y_sorted + p * d, L->x + tok * d, d * sizeof(float)));
        ck_assert(!memcmp(L->fw.x_sorted + p * d, L->x + tok * d, d * sizeof(float)));
        ck_assert(!memcmp(L->bw.d_x_sorted + p * d, L->bw.d_y_sorted + p * d, d * sizeof(float)));
        for (int j = 0; j < f; j++) {
            const float *h[5] = {L->fw.h_gate, L->fw.h_up, L->fw.h_act, L->bw.d_h_act,
                                 L->bw.d_h_gate};
            for (int a = 0; a < 5; a++)
                ck_assert(bits_eq(h[a][p * f + j], 0.0f));
            ck_assert(bits_eq(L->bw.d_h_up[p * f + j], 0.0f));
        }
    }
}

/* out, d_topk_weights, d_x, d_router_weight against MPFR. */
static void check_sums(const layer_t *L)
{
    const dl_dtype_t t = L->c.dtype;
    double a[64], b[64];
    for (int tk = 0; tk < T; tk++) {
        for (int i = 0; i < d; i++) {
            for (int j = 0; j < k; j++) { /* a zero expert's row is x itself */
                const int fl = tk * k + j, p = L->fw.inv_perm[fl];
                const int id = L->fw.topk_ids[fl] >= E;
                a[j] = L->fw.topk_weights[fl];
                b[j] = id ? L->x[tk * d + i] : L->fw.y_sorted[p * d + i];
            }
            ck_assert(bits_eq(L->fw.out[tk * d + i], ref(a, b, k, t)));
            int n = 0;
            for (int j = 0; j < k; j++, n++)
                a[n] = 1.0, b[n] = L->bw.d_x_sorted[L->fw.inv_perm[tk * k + j] * d + i];
            for (int e = 0; e < R; e++, n++)
                a[n] = L->bw.d_router_logits[tk * R + e], b[n] = L->wr[i * R + e];
            ck_assert(bits_eq(L->bw.d_x[tk * d + i], ref(a, b, n, t)));
        }
        for (int j = 0; j < k; j++) {
            const int fl = tk * k + j, p = L->fw.inv_perm[fl];
            const float *y = L->fw.topk_ids[fl] >= E ? L->x + tk * d : L->fw.y_sorted + p * d;
            for (int i = 0; i < d; i++)
                a[i] = L->dout[tk * d + i], b[i] = y[i];
            ck_assert(bits_eq(L->bw.d_topk_weights[fl], ref(a, b, d, DL_F32)));
            /* no renormalisation: d_scores = RN(6 d_w) at the selected column */
            const float ds = (float)mpref_round_d(6.0 * L->bw.d_topk_weights[fl], DL_F32);
            ck_assert(bits_eq(L->bw.d_router_scores[tk * R + L->fw.topk_ids[fl]], ds == 0 ? 0 : ds));
        }
    }
    double xa[T], ga[T];
    for (int i = 0; i < d; i++)
        for (int e = 0; e < R; e++) {
            for (int tk = 0; tk < T; tk++)
                xa[tk] = L->x[tk * d + i], ga[tk] = L->bw.d_router_logits[tk * R + e];
            ck_assert(bits_eq(L->bw.d_router_weight[i * R + e], ref(xa, ga, T, DL_F32)));
        }
}

static void check_case(dl_dtype_t t, int kind, uint64_t seed, int *n_id)
{
    layer_t *L = calloc(1, sizeof *L);
    ck_assert_ptr_nonnull(L);
    make(L, t, kind, seed);
    ck_assert_int_eq(run(L), 0);
    check_sort(L, n_id);
    check_tail(L);
    check_sums(L);
    /* weights: RN(6 s) of the selected score, no renormalisation */
    for (int fl = 0; fl < M; fl++) {
        const float s = L->fw.router_scores[(fl / k) * R + L->fw.topk_ids[fl]];
        ck_assert(bits_eq(L->fw.topk_weights[fl], (float)mpref_round_d(6.0 * s, DL_F32)));
    }
    if (kind == ALL_IDENTITY)
        for (int i = 0; i < E * d * f; i++) /* no real expert has a row */
            ck_assert(bits_eq(L->bw.d_w_down[i], 0.0f) && bits_eq(L->bw.d_w_gate[i], 0.0f));
    if (kind == TIED)
        for (int tk = 0; tk < T; tk++) {
            int has0 = 0, hasE = 0;
            for (int j = 0; j < k; j++)
                has0 |= L->fw.topk_ids[tk * k + j] == 0, hasE |= L->fw.topk_ids[tk * k + j] == E;
            ck_assert(has0 || !hasE); /* the lower id wins the tie */
            if (has0 != hasE)
                ck_assert(bits_eq(L->fw.tie_margin[tk], 0.0f));
        }
    release(L);
    free(L);
}

START_TEST(random_vs_mpfr)
{
    const dl_dtype_t ts[2] = {DL_F32, DL_BF16};
    for (int ti = 0; ti < 2; ti++)
        for (uint64_t seed = 60; seed < 64; seed++) {
            int n_id;
            check_case(ts[ti], RANDOM, seed, &n_id);
            ck_assert(n_id > 0 && n_id < M); /* both kinds of rows at these seeds */
        }
}
END_TEST

START_TEST(boundaries)
{
    int n_id;
    check_case(DL_BF16, ALL_IDENTITY, 61, &n_id);
    ck_assert_int_eq(n_id, M);
    check_case(DL_F32, NO_IDENTITY, 62, &n_id);
    ck_assert_int_eq(n_id, 0);
    check_case(DL_F32, TIED, 63, &n_id);
}
END_TEST

/* Without zero experts the sort is dl_sort_assignments; the refusals. */
START_TEST(sort_and_refusals)
{
    const int32_t ids[6] = {4, 0, 3, 1, 0, 4};
    int32_t sp[6], ip[6], sp2[6], ip2[6];
    int64_t gs[3], go[4], gs2[5], go2[6];
    ck_assert_int_eq(dl__sort_assignments_z(ids, 3, 2, 3, 2, sp, ip, gs, go), 0);
    const int32_t want[6] = {1, 4, 3, 2, 0, 5}; /* experts 0, 0, 1, then zero experts 3, 4, 4 */
    ck_assert(!memcmp(sp, want, sizeof want));
    ck_assert(gs[0] == 2 && gs[1] == 1 && gs[2] == 0 && go[3] == 3);
    ck_assert_int_eq(dl__sort_assignments_z(ids, 3, 2, 3, 1, sp, ip, gs, go), DL_ERANGE);
    ck_assert_int_eq(dl_sort_assignments(ids, 3, 2, 5, sp2, ip2, gs2, go2), 0);
    ck_assert(!memcmp(sp, sp2, sizeof sp)); /* the same order as 5 real buckets */
    layer_t *L = calloc(1, sizeof *L);
    make(L, DL_F32, RANDOM, 60);
    dl_moe_config_t c = L->c;
    c.route.n_group = 3; /* groups over zero experts: refused */
    ck_assert_int_eq(dl_moe_config_validate(&c), DL_EINVAL);
    c = L->c;
    c.route.hash_vocab = 4;
    c.route.has_bias = 0;
    ck_assert_int_eq(dl_moe_config_validate(&c), DL_EINVAL);
    c = L->c;
    c.route.zero_experts = -1;
    ck_assert_int_eq(dl_moe_config_validate(&c), DL_EINVAL);
    c = L->c;
    c.route.top_k = R + 1;
    ck_assert_int_eq(dl_moe_config_validate(&c), DL_EINVAL);
    c.route.top_k = R; /* k up to E + Z */
    ck_assert_int_eq(dl_moe_config_validate(&c), 0);
    free(L);
}
END_TEST

START_TEST(thread_count)
{
#ifdef _OPENMP
    layer_t *A = calloc(1, sizeof *A), *B = calloc(1, sizeof *B);
    make(A, DL_BF16, RANDOM, 64);
    make(B, DL_BF16, RANDOM, 64);
    omp_set_num_threads(1);
    ck_assert_int_eq(run(A), 0);
    omp_set_num_threads(3);
    ck_assert_int_eq(run(B), 0);
    ck_assert(!memcmp(A->fw.out, B->fw.out, sizeof(float) * T * d));
    ck_assert(!memcmp(A->bw.d_x, B->bw.d_x, sizeof(float) * T * d));
    ck_assert(!memcmp(A->bw.d_w_down, B->bw.d_w_down, sizeof(float) * E * f * d));
    release(A), release(B);
    free(A), free(B);
#endif
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("zero_experts", "mpfr", random_vs_mpfr, 60),
        DL_TEST("zero_experts", "boundaries", boundaries, 60),
        DL_TEST("zero_experts", "sort_and_refusals", sort_and_refusals, 60),
        DL_TEST("zero_experts", "threads", thread_count, 60),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
