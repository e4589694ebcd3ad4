/* The plugin executor, driven by the example backends of tests/backends:
 * execution diagnostics (ok, not-implemented, skipped, crashed, timeout,
 * error-return, unwritten, nondeterministic, abi-mismatch, load-failed) and
 * simple numeric facts about the example backends' outputs. Verdicts
 * (PASS/WARN/FAIL under a tolerance profile) belong to the checker and are
 * not judged here. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dropless.h>
#include <dropless/backend.h>
#include "tap.h"

/* Tolerances, relative to the largest golden magnitude of each tensor:
 * ordinary fp32 accumulation over the short sums of these cases stays far
 * below FP32_TOL; bf16 outputs are rounded from fp32 sums (half an ulp of
 * bf16 plus the fp32 error); a TF32 backend must be clearly worse than
 * fp32 but still TF32-accurate. */
#define FP32_TOL 1e-5
#define BF16_TOL 0x1p-7
#define TF32_MIN_RATIO 10.0
#define TF32_TOL 0x1p-8
/* The hanging backend's time limit, and how long the whole run may take. */
#define HANG_LIMIT_S 2.0
#define HANG_WALL_MAX_S 10.0

/* ------------------------------------------------------------ the cases */

typedef struct {
    dl_moe_config_t c;
    dl_moe_inputs_t in;
    float *x, *wr, *bias, *wg, *wu, *wd, *dout;
    dl_moe_forward_t f;
    dl_moe_backward_t b;
} case_t;

static float *randn(dl_test_rng_t *r, int64_t n, double scale, dl_dtype_t t)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)dl_round(scale * dl_test_normal(r), t);
    return p;
}

typedef struct {
    int64_t T, d, f, E, k;
    dl_dtype_t dtype;
    dl_ffn_t ffn;
    dl_score_fn_t score;
    int64_t n_group, topk_group;
    int bias;
    uint64_t seed;
} spec_t;

static case_t *case_new(spec_t s)
{
    case_t *k = calloc(1, sizeof *k);
    dl_test_rng_t r = {s.seed};
    dl_moe_config_t *c = &k->c;
    c->tokens = s.T, c->hidden = s.d, c->ffn = s.ffn == DL_FFN_PLAIN ? s.d : s.f;
    c->route = (dl_route_config_t){s.E, s.k, s.score, s.n_group ? s.n_group : 1,
                                   s.topk_group ? s.topk_group : 1, DL_GROUP_TOP2_SUM,
                                   s.score == DL_SCORE_SIGMOID, s.score == DL_SCORE_SIGMOID ? 2.5 : 1.0,
                                   s.bias, 0};
    c->ffn_kind = s.ffn, c->dtype = s.dtype;
    const int64_t T = s.T, d = s.d, f = c->ffn, E = s.E;
    /* full-precision values in fp32 cases: coarser inputs hide TF32 */
    k->x = randn(&r, T * d, 1.0, s.dtype);
    k->wr = randn(&r, d * E, 1.0 / sqrt((double)d), DL_F32);
    k->bias = s.bias ? randn(&r, E, 0.05, DL_F32) : NULL;
    if (s.ffn == DL_FFN_SWIGLU) {
        k->wg = randn(&r, E * d * f, 1.0 / sqrt((double)d), s.dtype);
        k->wu = randn(&r, E * d * f, 1.0 / sqrt((double)d), s.dtype);
    }
    k->wd = randn(&r, E * f * d, 1.0 / sqrt((double)f), s.dtype);
    k->dout = randn(&r, T * d, 1.0, s.dtype);
    k->in = (dl_moe_inputs_t){k->x, k->wr, k->bias, k->wg, k->wu, k->wd, k->dout};
    ck_assert_int_eq(dl_moe_forward(c, &k->in, &k->f), 0);
    ck_assert_int_eq(dl_moe_backward(c, &k->in, &k->f, &k->b), 0);
    return k;
}

static void case_free(case_t *k)
{
    dl_moe_forward_free(&k->f);
    dl_moe_backward_free(&k->b);
    free(k->x), free(k->wr), free(k->bias), free(k->wg), free(k->wu), free(k->wd), free(k->dout);
    free(k);
}

static const spec_t SMALL = {24, 16, 12, 6, 2, DL_F32, DL_FFN_SWIGLU, DL_SCORE_SOFTMAX, 0, 0, 0, 1};

/* ------------------------------------------------------------- helpers */

static char *module(const char *name)
{
    const char *top = getenv("top_builddir");
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/tests/backends/.libs/%s.so", top ? top : ".", name);
    return buf;
}

static void run(const char *name, const case_t *k, double limit, dl_run_result_t *r)
{
    dl_run_options_t o = {limit, 0};
    ck_assert_int_eq(dl_run_backend(module(name), &k->c, &k->in, &k->f, &k->b, &o, r), 0);
}

/* max |c - g| / max |g| over n elements (0 when both are zero). */
static double rel_err(const float *c, const float *g, int64_t n)
{
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)c[i] - g[i]));
        m = fmax(m, fabs((double)g[i]));
        if (isnan(c[i]))
            return INFINITY;
    }
    return m > 0 ? e / m : e;
}

#define ST(r, s) ((r)->stage[DL_STAGE_##s].status)

static void assert_status(const dl_run_result_t *r, dl_run_stage_t s, dl_run_status_t want)
{
    ck_assert_msg(r->stage[s].status == want, "stage %s: %s (%s), expected %s",
                  dl_run_stage_name(s), dl_run_status_name(r->stage[s].status),
                  r->stage[s].message, dl_run_status_name(want));
}

/* ------------------------------------------------------- abi and loading */

START_TEST(names)
{
    ck_assert_str_eq(dl_run_stage_name(DL_STAGE_ROUTER), "router");
    ck_assert_str_eq(dl_run_stage_name(DL_STAGE_INPUT_BACKWARD), "input_backward");
    ck_assert_ptr_null(dl_run_stage_name(DL_STAGE_COUNT));
    ck_assert_str_eq(dl_run_status_name(DL_RUN_NONDETERMINISTIC), "nondeterministic");
    ck_assert_str_eq(dl_run_status_name(DL_RUN_LOAD_FAILED), "load-failed");
    ck_assert_ptr_null(dl_run_status_name((dl_run_status_t)99));
    ck_assert(dl_run_status_is_failure(DL_RUN_UNWRITTEN));
    ck_assert(dl_run_status_is_failure(DL_RUN_TIMEOUT));
    ck_assert(!dl_run_status_is_failure(DL_RUN_NONDETERMINISTIC));
    ck_assert(!dl_run_status_is_failure(DL_RUN_NOT_IMPLEMENTED));
    ck_assert(!dl_run_status_is_failure(DL_RUN_OK));
}
END_TEST

/* The poison is a quiet NaN whose payload survives arithmetic, so that an
 * output accumulated into without being cleared still reads as unwritten. */
START_TEST(poison_survives_arithmetic)
{
    uint32_t bits = DL_BACKEND_POISON_F32_BITS, out;
    float p;
    memcpy(&p, &bits, 4);
    ck_assert(isnan(p));
    ck_assert(bits & 0x00400000u); /* quiet */
    volatile float one = 1.0f;
    float q = p * one + one;
    memcpy(&out, &q, 4);
    ck_assert_uint_eq(out, bits);
}
END_TEST

START_TEST(bad_arguments)
{
    case_t *k = case_new(SMALL);
    dl_run_result_t r;
    ck_assert_int_eq(dl_run_backend(NULL, &k->c, &k->in, &k->f, &k->b, NULL, &r), DL_EINVAL);
    dl_run_result_free(&r);
    ck_assert_int_eq(dl_run_backend(module("plain"), &k->c, &k->in, NULL, &k->b, NULL, &r),
                     DL_EINVAL);
    dl_run_result_free(&r);
    dl_moe_config_t c = k->c;
    c.route.top_k = c.route.experts + 1;
    ck_assert_int_eq(dl_run_backend(module("plain"), &c, &k->in, &k->f, &k->b, NULL, &r),
                     DL_EINVAL);
    dl_run_result_free(&r);
    ck_assert_int_eq(dl_run_backend(module("plain"), &k->c, &k->in, &k->f, &k->b, NULL, NULL),
                     DL_EINVAL);
    case_free(k);
}
END_TEST

START_TEST(load_failed)
{
    case_t *k = case_new(SMALL);
    dl_run_result_t r;
    ck_assert_int_eq(dl_run_backend("/nonexistent/dir/plugin.so", &k->c, &k->in, &k->f, &k->b,
                                    NULL, &r), 0);
    ck_assert_int_eq(r.loaded, 0);
    ck_assert_int_eq(r.load.status, DL_RUN_LOAD_FAILED);
    ck_assert_ptr_nonnull(strstr(r.load.message, "dlopen"));
    for (int s = 0; s < DL_STAGE_COUNT; s++)
        assert_status(&r, (dl_run_stage_t)s, DL_RUN_LOAD_FAILED);
    ck_assert_ptr_null(r.fwd.out);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

START_TEST(load_crash)
{
    case_t *k = case_new(SMALL);
    dl_run_result_t r;
    run("loadcrash", k, 0, &r);
    ck_assert_int_eq(r.loaded, 0);
    ck_assert_int_eq(r.load.status, DL_RUN_LOAD_FAILED);
    ck_assert_ptr_nonnull(strstr(r.load.message, "while loading"));
    for (int s = 0; s < DL_STAGE_COUNT; s++)
        assert_status(&r, (dl_run_stage_t)s, DL_RUN_LOAD_FAILED);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

START_TEST(abi_mismatch)
{
    case_t *k = case_new(SMALL);
    dl_run_result_t r;
    run("badabi", k, 0, &r);
    ck_assert_int_eq(r.loaded, 0);
    ck_assert_int_eq(r.backend.abi_version, DL_BACKEND_ABI_VERSION + 1);
    ck_assert_int_eq(r.load.status, DL_RUN_ABI_MISMATCH);
    for (int s = 0; s < DL_STAGE_COUNT; s++)
        assert_status(&r, (dl_run_stage_t)s, DL_RUN_ABI_MISMATCH);
    ck_assert(dl_run_status_is_failure(r.stage[DL_STAGE_COMBINE].status));
    ck_assert_ptr_null(r.fwd.out);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

/* --------------------------------------------------------------- plain */

static void check_plain(const case_t *k, const dl_run_result_t *r, double tol)
{
    const int64_t T = k->c.tokens, d = k->c.hidden, f = k->c.ffn, E = k->c.route.experts,
                  kk = k->c.route.top_k, M = T * kk;
    const int sw = k->c.ffn_kind == DL_FFN_SWIGLU;
    ck_assert_int_eq(r->loaded, 1);
    ck_assert_str_eq(r->backend.name, "plain-fp32");
    ck_assert_str_eq(r->backend.compute_mode, "fp32");
    ck_assert_uint_eq(r->backend.implemented, (1u << DL_STAGE_COUNT) - 1);
    for (int s = 0; s < DL_STAGE_COUNT; s++) {
        assert_status(r, (dl_run_stage_t)s, DL_RUN_OK);
        ck_assert_int_eq(r->stage[s].unwritten, 0);
        ck_assert_int_eq(r->stage[s].differing, 0);
        ck_assert(r->stage[s].seconds >= 0 && r->stage[s].seconds < 60);
    }
    /* the discrete stages are exact */
    ck_assert_mem_eq(r->fwd.topk_ids, k->f.topk_ids, (size_t)M * 4);
    ck_assert_mem_eq(r->fwd.sort_perm, k->f.sort_perm, (size_t)M * 4);
    ck_assert_mem_eq(r->fwd.group_sizes, k->f.group_sizes, (size_t)E * 8);
    ck_assert_mem_eq(r->fwd.group_offsets, k->f.group_offsets, (size_t)(E + 1) * 8);
    ck_assert_mem_eq(r->fwd.x_sorted, k->f.x_sorted, (size_t)(M * d) * 4);
    ck_assert_ptr_null(r->fwd.inv_perm);
    ck_assert_ptr_null(r->fwd.tie_margin);
    /* the arithmetic ones are within ordinary fp32 (or bf16) error */
    struct {
        const char *name;
        const float *c, *g;
        int64_t n;
        int act; /* stored in the case's dtype (else fp32) */
    } v[] = {
        {"router_logits", r->fwd.router_logits, k->f.router_logits, T * E, 0},
        {"router_scores", r->fwd.router_scores, k->f.router_scores, T * E, 0},
        {"topk_weights", r->fwd.topk_weights, k->f.topk_weights, M, 0},
        {"h_gate", r->fwd.h_gate, k->f.h_gate, sw ? M * f : 0, 1},
        {"h_act", r->fwd.h_act, k->f.h_act, sw ? M * f : 0, 1},
        {"y_sorted", r->fwd.y_sorted, k->f.y_sorted, M * d, 1},
        {"out", r->fwd.out, k->f.out, T * d, 1},
        {"d_topk_weights", r->bwd.d_topk_weights, k->b.d_topk_weights, M, 0},
        {"d_y_sorted", r->bwd.d_y_sorted, k->b.d_y_sorted, M * d, 1},
        {"d_h_gate", r->bwd.d_h_gate, k->b.d_h_gate, sw ? M * f : 0, 1},
        {"d_w_down", r->bwd.d_w_down, k->b.d_w_down, E * f * d, 0},
        {"d_w_up", r->bwd.d_w_up, k->b.d_w_up, sw ? E * d * f : 0, 0},
        {"d_x_sorted", r->bwd.d_x_sorted, k->b.d_x_sorted, M * d, 1},
        {"d_router_logits", r->bwd.d_router_logits, k->b.d_router_logits, T * E, 0},
        {"d_router_weight", r->bwd.d_router_weight, k->b.d_router_weight, d * E, 0},
        {"d_x", r->bwd.d_x, k->b.d_x, T * d, 1},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        if (!v[i].n)
            continue;
        ck_assert_msg(v[i].c, "%s missing", v[i].name);
        double e = rel_err(v[i].c, v[i].g, v[i].n);
        ck_assert_msg(e <= tol, "%s: error %g > %g", v[i].name, e, tol);
        for (int64_t j = 0; j < v[i].n && v[i].act; j++)
            ck_assert_msg(dl_on_grid(v[i].c[j], k->c.dtype), "%s[%lld] off the grid",
                          v[i].name, (long long)j);
    }
    if (!sw) {
        ck_assert_ptr_null(r->fwd.h_gate);
        ck_assert_ptr_null(r->bwd.d_w_gate);
    }
}

START_TEST(plain_fp32)
{
    case_t *k = case_new(SMALL);
    dl_run_result_t r;
    run("plain", k, 0, &r);
    check_plain(k, &r, FP32_TOL);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

START_TEST(plain_bf16_sigmoid)
{
    spec_t s = SMALL;
    s.dtype = DL_BF16, s.score = DL_SCORE_SIGMOID, s.k = 3, s.seed = 2;
    case_t *k = case_new(s);
    dl_run_result_t r;
    run("plain", k, 0, &r);
    check_plain(k, &r, BF16_TOL);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

START_TEST(plain_single_gemm)
{
    spec_t s = SMALL;
    s.ffn = DL_FFN_PLAIN, s.seed = 3;
    case_t *k = case_new(s);
    dl_run_result_t r;
    run("plain", k, 0, &r);
    check_plain(k, &r, FP32_TOL);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

/* DeepSeek-style routing in miniature. */
START_TEST(plain_group_limited)
{
    spec_t s = {16, 16, 8, 16, 4, DL_F32, DL_FFN_SWIGLU, DL_SCORE_SIGMOID, 4, 2, 1, 4};
    case_t *k = case_new(s);
    dl_run_result_t r;
    run("plain", k, 0, &r);
    check_plain(k, &r, FP32_TOL);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

/* -------------------------------------------------- padded and capacity */

/* Padding rows are computed but never reach an output: every output is
 * bit-identical to the unpadded plain backend's, on groups far from 128. */
START_TEST(padded_equals_plain)
{
    spec_t s = {40, 16, 12, 4, 2, DL_F32, DL_FFN_SWIGLU, DL_SCORE_SOFTMAX, 0, 0, 0, 5};
    case_t *k = case_new(s);
    dl_run_result_t p, q;
    run("plain", k, 0, &p);
    run("padded", k, 0, &q);
    ck_assert_str_eq(q.backend.name, "block-padded-128");
    for (int st = 0; st < DL_STAGE_COUNT; st++)
        assert_status(&q, (dl_run_stage_t)st, DL_RUN_OK);
    const int64_t T = s.T, d = s.d, f = s.f, E = s.E, M = s.T * s.k;
    ck_assert_mem_eq(q.fwd.sort_perm, k->f.sort_perm, (size_t)M * 4);
    ck_assert_mem_eq(q.fwd.group_offsets, k->f.group_offsets, (size_t)(E + 1) * 8);
    struct {
        const float *a, *b;
        int64_t n;
    } v[] = {{q.fwd.h_gate, p.fwd.h_gate, M * f},       {q.fwd.h_act, p.fwd.h_act, M * f},
             {q.fwd.y_sorted, p.fwd.y_sorted, M * d},   {q.fwd.out, p.fwd.out, T * d},
             {q.bwd.d_h_act, p.bwd.d_h_act, M * f},     {q.bwd.d_h_up, p.bwd.d_h_up, M * f},
             {q.bwd.d_x_sorted, p.bwd.d_x_sorted, M * d}, {q.bwd.d_w_down, p.bwd.d_w_down, E * f * d},
             {q.bwd.d_w_gate, p.bwd.d_w_gate, E * d * f}, {q.bwd.d_w_up, p.bwd.d_w_up, E * d * f}};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        ck_assert_mem_eq(v[i].a, v[i].b, (size_t)v[i].n * 4);
    dl_run_result_free(&p);
    dl_run_result_free(&q);
    case_free(k);
}
END_TEST

/* Capacity factor 1: each expert keeps at most C = ceil(T*k/E) of its n_e
 * assignments, whatever the priority order, so exactly
 * sum_e max(0, n_e - C) assignments are missing from the dispatch. */
START_TEST(capacity_drops)
{
    spec_t s = {32, 16, 12, 8, 2, DL_F32, DL_FFN_SWIGLU, DL_SCORE_SOFTMAX, 0, 0, 0, 6};
    case_t *k = case_new(s);
    const int64_t T = s.T, d = s.d, E = s.E, K = s.k, M = T * K, C = (M + E - 1) / E;
    int64_t drops = 0;
    for (int64_t e = 0; e < E; e++)
        drops += k->f.group_sizes[e] > C ? k->f.group_sizes[e] - C : 0;
    ck_assert_int_gt(drops, 0); /* the case is unbalanced enough to drop */

    dl_run_result_t r;
    run("capacity", k, 0, &r);
    for (int st = DL_STAGE_ROUTER; st <= DL_STAGE_COMBINE_BACKWARD; st++)
        assert_status(&r, (dl_run_stage_t)st, DL_RUN_OK);
    assert_status(&r, DL_STAGE_EXPERT_BACKWARD, DL_RUN_NOT_IMPLEMENTED);
    ck_assert_ptr_null(r.bwd.d_w_down);

    char *seen = calloc((size_t)M, 1);
    int64_t present = 0, sum = 0;
    for (int64_t p = 0; p < M; p++) {
        int32_t fl = r.fwd.sort_perm[p];
        if (fl >= 0 && fl < M && !seen[fl])
            seen[fl] = 1, present++;
    }
    for (int64_t e = 0; e < E; e++)
        sum += r.fwd.group_sizes[e];
    ck_assert_int_eq(M - present, drops);
    ck_assert_int_eq(sum, M - drops);
    ck_assert_int_eq(r.fwd.group_offsets[E], M - drops);

    /* combine: tokens with every slot kept are fine; the others are not */
    int wrong = 0;
    for (int64_t t = 0; t < T; t++) {
        int dropped = 0;
        for (int64_t j = 0; j < K; j++)
            dropped |= !seen[t * K + j];
        double e = rel_err(r.fwd.out + t * d, k->f.out + t * d, d);
        if (!dropped)
            ck_assert_msg(e <= FP32_TOL, "token %lld: error %g", (long long)t, e);
        wrong += dropped && e > 1e-3;
    }
    ck_assert_int_gt(wrong, 0);
    free(seen);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

/* ---------------------------------------------------------------- tf32 */

START_TEST(tf32_worse_than_fp32)
{
    spec_t s = {32, 64, 64, 4, 2, DL_F32, DL_FFN_SWIGLU, DL_SCORE_SOFTMAX, 0, 0, 0, 7};
    case_t *k = case_new(s);
    const int64_t M = s.T * s.k, d = s.d, f = s.f, E = s.E;
    dl_run_result_t p, q;
    run("plain", k, 0, &p);
    run("tf32", k, 0, &q);
    ck_assert_str_eq(q.backend.compute_mode, "tf32");
    for (int st = 0; st < DL_STAGE_COUNT; st++)
        assert_status(&q, (dl_run_stage_t)st, DL_RUN_OK);
    struct {
        const char *name;
        const float *pc, *qc, *g;
        int64_t n;
    } v[] = {{"h_gate", p.fwd.h_gate, q.fwd.h_gate, k->f.h_gate, M * f},
             {"y_sorted", p.fwd.y_sorted, q.fwd.y_sorted, k->f.y_sorted, M * d},
             {"d_x_sorted", p.bwd.d_x_sorted, q.bwd.d_x_sorted, k->b.d_x_sorted, M * d},
             {"d_w_gate", p.bwd.d_w_gate, q.bwd.d_w_gate, k->b.d_w_gate, E * d * f}};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        double ep = rel_err(v[i].pc, v[i].g, v[i].n), eq = rel_err(v[i].qc, v[i].g, v[i].n);
        ck_assert_msg(eq >= TF32_MIN_RATIO * ep && eq <= TF32_TOL, "%s: fp32 %g, tf32 %g",
                      v[i].name, ep, eq);
    }
    dl_run_result_free(&p);
    dl_run_result_free(&q);
    case_free(k);
}
END_TEST

/* ------------------------------------------------------------- hygiene */

START_TEST(unwritten_empty_expert_dw)
{
    spec_t s = {4, 8, 6, 16, 2, DL_F32, DL_FFN_SWIGLU, DL_SCORE_SOFTMAX, 0, 0, 0, 8};
    case_t *k = case_new(s);
    const int64_t d = s.d, f = s.f, E = s.E;
    int64_t empty = 0, first = -1;
    for (int64_t e = 0; e < E; e++)
        if (k->f.group_sizes[e] == 0)
            empty++, first = first < 0 ? e : first;
    ck_assert_int_ge(empty, E - s.T * s.k); /* at most T*k experts are busy */

    dl_run_result_t r;
    run("nodw", k, 0, &r);
    assert_status(&r, DL_STAGE_EXPERT_FORWARD, DL_RUN_OK);
    assert_status(&r, DL_STAGE_EXPERT_BACKWARD, DL_RUN_UNWRITTEN);
    assert_status(&r, DL_STAGE_COMBINE, DL_RUN_NOT_IMPLEMENTED);
    const dl_run_diag_t *g = &r.stage[DL_STAGE_EXPERT_BACKWARD];
    ck_assert_int_eq(g->unwritten, empty * (f * d + 2 * d * f));
    ck_assert_ptr_nonnull(strstr(g->message, "d_w_down"));
    ck_assert_ptr_nonnull(strstr(g->message, "d_w_gate"));
    /* the poisoned arrays are handed on for the checker to see */
    uint32_t bits;
    memcpy(&bits, r.bwd.d_w_down + first * f * d, 4);
    ck_assert_uint_eq(bits, DL_BACKEND_POISON_F32_BITS);
    ck_assert(rel_err(r.bwd.d_x_sorted, k->b.d_x_sorted, s.T * s.k * d) <= FP32_TOL);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

START_TEST(crash_is_a_diagnostic)
{
    case_t *k = case_new(SMALL);
    dl_run_result_t r;
    run("crash", k, 0, &r);
    ck_assert_int_eq(r.loaded, 1);
    assert_status(&r, DL_STAGE_EXPERT_BACKWARD, DL_RUN_CRASHED);
    ck_assert_ptr_nonnull(strstr(r.stage[DL_STAGE_EXPERT_BACKWARD].message, "signal 11"));
    assert_status(&r, DL_STAGE_COMBINE_BACKWARD, DL_RUN_ERROR_RETURN);
    ck_assert_ptr_nonnull(strstr(r.stage[DL_STAGE_COMBINE_BACKWARD].message, "returned 7"));
    assert_status(&r, DL_STAGE_PERMUTE, DL_RUN_CRASHED);
    ck_assert_ptr_nonnull(strstr(r.stage[DL_STAGE_PERMUTE].message, "input tensor x"));
    assert_status(&r, DL_STAGE_EXPERT_FORWARD, DL_RUN_OK);
    assert_status(&r, DL_STAGE_COMBINE, DL_RUN_OK);
    assert_status(&r, DL_STAGE_ROUTER, DL_RUN_NOT_IMPLEMENTED);
    ck_assert_ptr_null(r.fwd.x_sorted);
    ck_assert_ptr_null(r.bwd.d_w_down);
    ck_assert_ptr_null(r.bwd.d_x_sorted);
    ck_assert_ptr_null(r.bwd.d_topk_weights);
    ck_assert(rel_err(r.fwd.out, k->f.out, k->c.tokens * k->c.hidden) <= FP32_TOL);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

START_TEST(nondeterministic_combine)
{
    spec_t s = {16, 16, 8, 8, 4, DL_F32, DL_FFN_SWIGLU, DL_SCORE_SOFTMAX, 0, 0, 0, 9};
    case_t *k = case_new(s);
    dl_run_result_t r;
    run("nondet", k, 0, &r);
    assert_status(&r, DL_STAGE_EXPERT_FORWARD, DL_RUN_OK);
    assert_status(&r, DL_STAGE_COMBINE, DL_RUN_NONDETERMINISTIC);
    ck_assert_int_gt(r.stage[DL_STAGE_COMBINE].differing, 0);
    ck_assert_int_eq(r.stage[DL_STAGE_COMBINE].unwritten, 0);
    ck_assert(!dl_run_status_is_failure(r.stage[DL_STAGE_COMBINE].status));
    ck_assert(rel_err(r.fwd.out, k->f.out, s.T * s.d) <= FP32_TOL);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

START_TEST(hang_times_out)
{
    case_t *k = case_new(SMALL);
    dl_run_result_t r;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    run("hang", k, HANG_LIMIT_S, &r);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double wall = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    assert_status(&r, DL_STAGE_COMBINE, DL_RUN_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(r.stage[DL_STAGE_COMBINE].message, "time limit"));
    ck_assert_ptr_null(r.fwd.out);
    assert_status(&r, DL_STAGE_EXPERT_FORWARD, DL_RUN_OK);
    ck_assert(wall >= HANG_LIMIT_S && wall < HANG_WALL_MAX_S);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

START_TEST(backward_skipped)
{
    case_t *k = case_new(SMALL);
    dl_run_result_t r;
    ck_assert_int_eq(dl_run_backend(module("plain"), &k->c, &k->in, &k->f, NULL, NULL, &r), 0);
    for (int s = 0; s < DL_STAGE_COUNT; s++)
        assert_status(&r, (dl_run_stage_t)s, s < DL_STAGE_COMBINE_BACKWARD ? DL_RUN_OK : DL_RUN_SKIPPED);
    ck_assert_ptr_null(r.bwd.d_x);
    dl_run_result_free(&r);
    dl_run_options_t o = {0, 1};
    ck_assert_int_eq(dl_run_backend(module("plain"), &k->c, &k->in, &k->f, &k->b, &o, &r), 0);
    assert_status(&r, DL_STAGE_EXPERT_BACKWARD, DL_RUN_SKIPPED);
    assert_status(&r, DL_STAGE_COMBINE, DL_RUN_OK);
    dl_run_result_free(&r);
    case_free(k);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("abi-and-loading", "abi", names, 60),
        DL_TEST("abi-and-loading", "abi", poison_survives_arithmetic, 60),
        DL_TEST("abi-and-loading", "abi", bad_arguments, 60),
        DL_TEST("abi-and-loading", "abi", load_failed, 60),
        DL_TEST("abi-and-loading", "abi", load_crash, 60),
        DL_TEST("abi-and-loading", "abi", abi_mismatch, 60),
        DL_TEST("plain-backend", "plain", plain_fp32, 120),
        DL_TEST("plain-backend", "plain", plain_bf16_sigmoid, 120),
        DL_TEST("plain-backend", "plain", plain_single_gemm, 120),
        DL_TEST("plain-backend", "plain", plain_group_limited, 120),
        DL_TEST("plain-backend", "plain", backward_skipped, 120),
        DL_TEST("layouts-and-drops", "layouts", padded_equals_plain, 120),
        DL_TEST("layouts-and-drops", "layouts", capacity_drops, 120),
        DL_TEST("layouts-and-drops", "layouts", tf32_worse_than_fp32, 120),
        DL_TEST("hygiene", "hygiene", unwritten_empty_expert_dw, 120),
        DL_TEST("hygiene", "hygiene", crash_is_a_diagnostic, 120),
        DL_TEST("hygiene", "hygiene", nondeterministic_combine, 120),
        DL_TEST("hygiene", "hygiene", hang_times_out, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
