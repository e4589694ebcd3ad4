/* The conformance runner: verdicts on known-good and known-bad candidates
 * built in memory from a small golden case, the exact helpers against MPFR,
 * and the report writers (JSON and JUnit parsed by python3 when present). */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tap.h"
#include "mpref.h"
#include "check/check_priv.h"

/* Tolerances: none of the test's own. Verdicts come from the runner's
 * derived bounds; the exact helpers must match MPFR bit for bit. */

/* ------------------------------------------------------------ a golden case */

typedef struct {
    dl_moe_config_t c;
    dl_moe_inputs_t in;
    float *x, *wr, *bias, *wg, *wu, *wd, *dout;
    dl_moe_forward_t f;
    dl_moe_backward_t b;
} gcase_t;

static float *randn(dl_test_rng_t *r, int64_t n, double scale, dl_dtype_t t)
{
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)dl_round(dl_test_normal(r) * scale, t); /* full significands in fp32 */
    return p;
}

enum { CASE_SOFTMAX = 0, CASE_SIGMOID_BIAS = 1, CASE_TIE = 2, CASE_PLAIN = 3, CASE_GROUPED = 4, CASE_BIGK = 5 };

static void make_case(gcase_t *g, int kind, dl_dtype_t t, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    const int64_t T = 64, d = 32, f = kind == CASE_PLAIN ? 32 : 48, E = kind == CASE_BIGK ? 16 : 8,
                  k = kind == CASE_SIGMOID_BIAS ? 2 : kind == CASE_BIGK ? 10 : 4;
    g->c = (dl_moe_config_t){.tokens = T, .hidden = d, .ffn = f,
                             .ffn_kind = kind == CASE_PLAIN ? DL_FFN_PLAIN : DL_FFN_SWIGLU,
                             .dtype = t};
    g->c.route = (dl_route_config_t){.experts = E, .top_k = k, .n_group = 1, .topk_group = 1,
                                     .renormalize = 1, .scaling = 1.0,
                                     .score_fn = kind == CASE_SIGMOID_BIAS ? DL_SCORE_SIGMOID
                                                                           : DL_SCORE_SOFTMAX};
    dl_test_rng_t r = {seed};
    g->x = randn(&r, T * d, 1.0, t);
    g->wr = randn(&r, d * E, 1.0 / sqrt((double)d), DL_F32);
    if (kind != CASE_PLAIN) {
        g->wg = randn(&r, E * d * f, 1.0 / sqrt((double)d), t);
        g->wu = randn(&r, E * d * f, 1.0 / sqrt((double)d), t);
    }
    g->wd = randn(&r, E * f * d, 1.0 / sqrt((double)f), t);
    g->dout = randn(&r, T * d, 1.0, t);
    if (kind == CASE_TIE) /* experts 2 and 5 get equal logits: exact ties */
        for (int64_t i = 0; i < d; i++)
            g->wr[i * E + 5] = g->wr[i * E + 2];
    if (kind == CASE_GROUPED) { /* DeepSeek-V3 style: sigmoid, 4 groups keep 2, top2_sum */
        g->c.route.score_fn = DL_SCORE_SIGMOID;
        g->c.route.n_group = 4;
        g->c.route.topk_group = 2;
        g->c.route.group_score = DL_GROUP_TOP2_SUM;
        g->c.route.scaling = 2.5;
        g->c.route.has_bias = 1;
        g->bias = randn(&r, E, 0.1, DL_F32);
    }
    if (kind == CASE_SIGMOID_BIAS) { /* expert 7 is never selected: empty */
        g->c.route.has_bias = 1;
        g->bias = calloc((size_t)E, sizeof *g->bias);
        g->bias[7] = -1000.0f;
    }
    g->in = (dl_moe_inputs_t){g->x, g->wr, g->bias, g->wg, g->wu, g->wd, g->dout};
    ck_assert_int_eq(dl_moe_forward(&g->c, &g->in, &g->f), 0);
    ck_assert_int_eq(dl_moe_backward(&g->c, &g->in, &g->f, &g->b), 0);
}

static void free_case(gcase_t *g)
{
    dl_moe_forward_free(&g->f);
    dl_moe_backward_free(&g->b);
    free(g->x), free(g->wr), free(g->bias), free(g->wg), free(g->wu), free(g->wd), free(g->dout);
}

static dl_check_golden_t golden_of(const gcase_t *g)
{
    return (dl_check_golden_t){&g->c, &g->in, &g->f, &g->b, "unit"};
}

static void *dupm(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    memcpy(q, p, n);
    return q;
}

/* A candidate that is a deep copy of every golden stage. */
static void copy_all(const gcase_t *g, dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    memset(f, 0, sizeof *f);
    memset(b, 0, sizeof *b);
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        const int64_t n = dl_value_numel(&g->c, (dl_value_t)s);
        const void *src = dl_value_array(&g->f, &g->b, (dl_value_t)s);
        if (!src || !n)
            continue;
        size_t sz = dl_value_store((dl_value_t)s) == DL_STORE_I64 ? 8 : 4;
        *dl__value_slot(f, b, (dl_value_t)s) = dupm(src, (size_t)n * sz);
    }
}

static int count(const dl_check_report_t *r, dl_verdict_t v)
{
    int n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += r->results[i].verdict == v;
    return n;
}

static const dl_check_result_t *find(const dl_check_report_t *r, dl_value_t s, const char *check)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->results[i].stage == s && !strcmp(r->results[i].check, check))
            return &r->results[i];
    return NULL;
}

static void dump(const dl_check_report_t *r)
{
    const dl_check_report_t *rr = r;
    dl_check_write(stderr, DL_REPORT_TABLE, &rr, 1, 0);
}

static dl_check_report_t run(const gcase_t *g, const dl_moe_forward_t *f,
                             const dl_moe_backward_t *b, const char *profile)
{
    dl_check_golden_t gold = golden_of(g);
    dl_check_candidate_t cand = {.backend = "test"};
    if (f)
        cand.fwd = *f;
    if (b)
        cand.bwd = *b;
    dl_check_options_t o;
    dl_check_options_default(&o);
    o.profile = dl_check_profile_find(profile);
    ck_assert_ptr_nonnull(o.profile);
    dl_check_report_t r;
    ck_assert_int_eq(dl_check_run(&gold, &cand, &o, &r), 0);
    return r;
}

/* ------------------------------------------------- a plain fp32 backend */

static float tf32(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x0FFFu + ((u >> 13) & 1u); /* round to nearest even at 13 dropped bits */
    u &= ~0x1FFFu;
    memcpy(&x, &u, 4);
    return x;
}

/* Natural-order fp32 dot product; with tf, operands rounded to tf32. */
static float fdot(const float *a, int64_t sa, const float *b, int64_t sb, int64_t n, int tf)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float x = a[i * sa], y = b[i * sb];
        if (tf)
            x = tf32(x), y = tf32(y);
        acc += x * y;
    }
    return acc;
}

/* The whole layer as a typical backend computes it: fp32 arithmetic in
 * natural order, expf, each stage stored in its storage type. */
static void float_backend(const gcase_t *g, int tf, dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    const int64_t T = g->c.tokens, d = g->c.hidden, ff = g->c.ffn, E = g->c.route.experts,
                  k = g->c.route.top_k, M = T * k;
    const dl_dtype_t t = g->c.dtype;
#define ST(v) ((float)dl_round((v), t))
#define AL(n) calloc((size_t)(n), sizeof(float))
    memset(f, 0, sizeof *f);
    memset(b, 0, sizeof *b);
    f->router_logits = AL(T * E);
    f->router_scores = AL(T * E);
    f->topk_ids = calloc((size_t)M, 4);
    f->topk_weights = AL(M);
    f->sort_perm = calloc((size_t)M, 4);
    f->inv_perm = calloc((size_t)M, 4);
    f->group_sizes = calloc((size_t)E, 8);
    f->group_offsets = calloc((size_t)E + 1, 8);
    f->x_sorted = AL(M * d);
    f->h_gate = AL(M * ff);
    f->h_up = AL(M * ff);
    f->h_act = AL(M * ff);
    f->y_sorted = AL(M * d);
    f->out = AL(T * d);
    for (int64_t tk = 0; tk < T; tk++) {
        float *l = f->router_logits + tk * E, *s = f->router_scores + tk * E;
        for (int64_t e = 0; e < E; e++)
            l[e] = fdot(g->x + tk * d, 1, g->wr + e, E, d, tf);
        float mx = l[0], sum = 0.0f;
        for (int64_t e = 1; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        for (int64_t e = 0; e < E; e++)
            sum += (s[e] = expf(l[e] - mx));
        for (int64_t e = 0; e < E; e++)
            s[e] = s[e] / sum;
        char used[64] = {0};
        float S = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            int64_t bst = -1;
            for (int64_t e = 0; e < E; e++)
                if (!used[e] && (bst < 0 || s[e] > s[bst]))
                    bst = e;
            used[bst] = 1;
            f->topk_ids[tk * k + j] = (int32_t)bst;
            S += s[bst];
        }
        for (int64_t j = 0; j < k; j++)
            f->topk_weights[tk * k + j] = s[f->topk_ids[tk * k + j]] / S;
    }
    ck_assert_int_eq(dl_sort_assignments(f->topk_ids, T, k, E, f->sort_perm, f->inv_perm,
                                         f->group_sizes, f->group_offsets), 0);
    const int64_t *off = f->group_offsets;
    for (int64_t e = 0; e < E; e++)
        for (int64_t p = off[e]; p < off[e + 1]; p++) {
            const int64_t tok = f->sort_perm[p] / k;
            memcpy(f->x_sorted + p * d, g->x + tok * d, (size_t)d * 4);
            for (int64_t n = 0; n < ff; n++) {
                f->h_gate[p * ff + n] = ST(fdot(f->x_sorted + p * d, 1, g->wg + e * d * ff + n, ff, d, tf));
                f->h_up[p * ff + n] = ST(fdot(f->x_sorted + p * d, 1, g->wu + e * d * ff + n, ff, d, tf));
                const float gg = f->h_gate[p * ff + n], sg = 1.0f / (1.0f + expf(-gg));
                f->h_act[p * ff + n] = ST(gg * sg * f->h_up[p * ff + n]);
            }
            for (int64_t i = 0; i < d; i++)
                f->y_sorted[p * d + i] = ST(fdot(f->h_act + p * ff, 1, g->wd + e * ff * d + i, d, ff, tf));
        }
    for (int64_t tk = 0; tk < T; tk++)
        for (int64_t i = 0; i < d; i++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < k; j++)
                acc += f->topk_weights[tk * k + j] * f->y_sorted[(int64_t)f->inv_perm[tk * k + j] * d + i];
            f->out[tk * d + i] = ST(acc);
        }

    b->d_topk_weights = AL(M);
    b->d_y_sorted = AL(M * d);
    b->d_h_act = AL(M * ff);
    b->d_w_down = AL(E * ff * d);
    b->d_h_gate = AL(M * ff);
    b->d_h_up = AL(M * ff);
    b->d_x_sorted = AL(M * d);
    b->d_w_gate = AL(E * d * ff);
    b->d_w_up = AL(E * d * ff);
    b->d_router_scores = AL(T * E);
    b->d_router_logits = AL(T * E);
    b->d_router_weight = AL(d * E);
    b->d_x = AL(T * d);
    for (int64_t fl = 0; fl < M; fl++) {
        const int64_t p = f->inv_perm[fl], tok = fl / k;
        b->d_topk_weights[fl] = fdot(g->dout + tok * d, 1, f->y_sorted + p * d, 1, d, tf);
        for (int64_t i = 0; i < d; i++)
            b->d_y_sorted[p * d + i] = ST(f->topk_weights[fl] * g->dout[tok * d + i]);
    }
    for (int64_t e = 0; e < E; e++) {
        const int64_t p0 = off[e], cnt = off[e + 1] - off[e];
        for (int64_t p = p0; p < p0 + cnt; p++)
            for (int64_t n = 0; n < ff; n++) {
                const float dh = ST(fdot(b->d_y_sorted + p * d, 1, g->wd + e * ff * d + n * d, 1, d, tf));
                const float gg = f->h_gate[p * ff + n], u = f->h_up[p * ff + n];
                const float sg = 1.0f / (1.0f + expf(-gg));
                b->d_h_act[p * ff + n] = dh;
                b->d_h_up[p * ff + n] = ST(dh * (gg * sg));
                b->d_h_gate[p * ff + n] = ST(dh * u * sg * (1.0f + gg * (1.0f - sg)));
            }
        for (int64_t n = 0; n < ff; n++)
            for (int64_t i = 0; i < d; i++)
                b->d_w_down[(e * ff + n) * d + i] =
                    fdot(f->h_act + p0 * ff + n, ff, b->d_y_sorted + p0 * d + i, d, cnt, tf);
        for (int64_t p = p0; p < p0 + cnt; p++)
            for (int64_t i = 0; i < d; i++) {
                float acc = 0.0f;
                for (int64_t n = 0; n < ff; n++) {
                    float a1 = b->d_h_gate[p * ff + n], w1 = g->wg[(e * d + i) * ff + n];
                    float a2 = b->d_h_up[p * ff + n], w2 = g->wu[(e * d + i) * ff + n];
                    if (tf)
                        a1 = tf32(a1), w1 = tf32(w1), a2 = tf32(a2), w2 = tf32(w2);
                    acc += a1 * w1;
                    acc += a2 * w2;
                }
                b->d_x_sorted[p * d + i] = ST(acc);
            }
        for (int64_t i = 0; i < d; i++)
            for (int64_t n = 0; n < ff; n++) {
                b->d_w_gate[(e * d + i) * ff + n] =
                    fdot(f->x_sorted + p0 * d + i, d, b->d_h_gate + p0 * ff + n, ff, cnt, tf);
                b->d_w_up[(e * d + i) * ff + n] =
                    fdot(f->x_sorted + p0 * d + i, d, b->d_h_up + p0 * ff + n, ff, cnt, tf);
            }
    }
    for (int64_t tk = 0; tk < T; tk++) {
        const float *s = f->router_scores + tk * E, *dw = b->d_topk_weights + tk * k;
        const int32_t *id = f->topk_ids + tk * k;
        float *ds = b->d_router_scores + tk * E, *dl = b->d_router_logits + tk * E;
        float S = 0.0f, cr = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            S += s[id[j]];
            cr += dw[j] * s[id[j]];
        }
        for (int64_t j = 0; j < k; j++)
            ds[id[j]] = dw[j] / S - cr / (S * S);
        float sig = 0.0f;
        for (int64_t e = 0; e < E; e++)
            sig += s[e] * ds[e];
        for (int64_t e = 0; e < E; e++)
            dl[e] = s[e] * (ds[e] - sig);
    }
    for (int64_t i = 0; i < d; i++)
        for (int64_t e = 0; e < E; e++)
            b->d_router_weight[i * E + e] = fdot(g->x + i, d, b->d_router_logits + e, E, T, tf);
    for (int64_t tk = 0; tk < T; tk++)
        for (int64_t i = 0; i < d; i++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < k; j++)
                acc += b->d_x_sorted[(int64_t)f->inv_perm[tk * k + j] * d + i];
            acc += fdot(b->d_router_logits + tk * E, 1, g->wr + i * E, 1, E, tf);
            b->d_x[tk * d + i] = ST(acc);
        }
#undef ST
#undef AL
}

/* ---------------------------------------------------------------- tests */

START_TEST(golden_is_conformant)
{
    static const struct { int kind; dl_dtype_t t; const char *prof; } cs[] = {
        {CASE_SOFTMAX, DL_F32, "fp32"}, {CASE_SIGMOID_BIAS, DL_F32, "fp32"},
        {CASE_SOFTMAX, DL_BF16, "bf16"}, {CASE_TIE, DL_F16, "fp16"}, {CASE_PLAIN, DL_BF16, "bf16-acc"}};
    gcase_t g;
    make_case(&g, cs[_i].kind, cs[_i].t, 11 + (uint64_t)_i);
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    copy_all(&g, &f, &b);
    dl_check_report_t r = run(&g, &f, &b, cs[_i].prof);
    if (r.verdict != DL_VERDICT_PASS)
        dump(&r);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    ck_assert_int_eq(count(&r, DL_VERDICT_FAIL) + count(&r, DL_VERDICT_WARN), 0);
    ck_assert(dl_check_conformant(&r));
    ck_assert_int_eq(r.n_dropped, 0);
    /* every stage the golden has was checked, and bitwise: err 0 */
    for (size_t i = 0; i < r.n; i++) {
        ck_assert_int_ne(r.results[i].verdict, DL_VERDICT_SKIP);
        if (!strcmp(r.results[i].check, "numerics"))
            ck_assert(r.results[i].err_pass == 0.0);
    }
    ck_assert_ptr_nonnull(find(&r, DL_VALUE_NONE, "zero_drops"));
    ck_assert_ptr_nonnull(find(&r, DL_VALUE_D_W_DOWN, "empty_experts"));
    dl_check_report_free(&r);
    dl_moe_forward_free(&f);
    dl_moe_backward_free(&b);
    free_case(&g);
}
END_TEST

START_TEST(fp32_backend_passes)
{
    static const struct { int kind; dl_dtype_t t; const char *prof; } cs[] = {
        {CASE_SOFTMAX, DL_F32, "fp32"}, {CASE_SOFTMAX, DL_BF16, "bf16"},
        {CASE_SOFTMAX, DL_F16, "fp16"}};
    gcase_t g;
    make_case(&g, cs[_i].kind, cs[_i].t, 21 + (uint64_t)_i);
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    float_backend(&g, 0, &f, &b);
    dl_check_report_t r = run(&g, &f, &b, cs[_i].prof);
    if (r.verdict != DL_VERDICT_PASS)
        dump(&r);
    ck_assert_int_eq(count(&r, DL_VERDICT_FAIL), 0);
    ck_assert_int_eq(count(&r, DL_VERDICT_WARN), 0);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    /* it really differs from the golden: the check is not vacuous */
    const dl_check_result_t *y = find(&r, DL_VALUE_Y_SORTED, "numerics");
    ck_assert_ptr_nonnull(y);
    ck_assert(y->err_pass > 0.0 && y->err_pass <= 1.0);
    const dl_check_result_t *dr = find(&r, DL_VALUE_OUT, "drift");
    /* (a bf16/fp16 out may round to the golden bits end to end) */
    ck_assert_msg(dr && dr->verdict == DL_VERDICT_INFO && (dr->max_abs > 0.0 || cs[_i].t != DL_F32), "%s", dr ? dr->message : "none");
    dl_check_report_free(&r);
    dl_moe_forward_free(&f);
    dl_moe_backward_free(&b);
    free_case(&g);
}
END_TEST

/* A fused candidate (out and d_x of the same fp32 backend, nothing else):
 * conformant only because the absent stages' errors propagate; judged as
 * if its upstream were exact (exact_upstream, the isolated semantics) it
 * FAILs. The tf32 backend fused is still caught under the fp32 profile. */
START_TEST(fused_backend_propagation)
{
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 31);
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    dl_check_golden_t gold = golden_of(&g);
    dl_check_options_t o;
    dl_check_options_default(&o);
    o.profile = dl_check_profile_find("fp32");
    dl_check_report_t r;
    for (int tf = 0; tf < 2; tf++) {
        float_backend(&g, tf, &f, &b);
        dl_check_candidate_t c = {.fwd = {.out = f.out}, .bwd = {.d_x = b.d_x}};
        o.exact_upstream = 0;
        ck_assert_int_eq(dl_check_run(&gold, &c, &o, &r), 0);
        const dl_check_result_t *out = find(&r, DL_VALUE_OUT, "numerics");
        const dl_check_result_t *dx = find(&r, DL_VALUE_D_X, "numerics");
        if (!tf) {
            if (r.verdict != DL_VERDICT_PASS)
                dump(&r);
            ck_assert_int_eq(out->verdict, DL_VERDICT_PASS);
            ck_assert_int_eq(dx->verdict, DL_VERDICT_PASS);
            ck_assert(out->err_pass > 0.0 && out->err_pass < 0.5);
            ck_assert_ptr_nonnull(strstr(out->message, "propagated"));
            ck_assert_int_eq(find(&r, DL_VALUE_NONE, "zero_drops")->verdict, DL_VERDICT_PASS);
            ck_assert_ptr_nonnull(strstr(find(&r, DL_VALUE_NONE, "zero_drops")->message, "floor"));
        } else {
            ck_assert_int_eq(out->verdict, DL_VERDICT_FAIL); /* tf32 declared fp32 */
        }
        dl_check_report_free(&r);
        if (!tf) {
            o.exact_upstream = 1; /* no propagation: one rounding allowed, the errors are not */
            ck_assert_int_eq(dl_check_run(&gold, &c, &o, &r), 0);
            ck_assert_int_ne(find(&r, DL_VALUE_OUT, "numerics")->verdict, DL_VERDICT_PASS);
            dl_check_report_free(&r);
        }
        dl_moe_forward_free(&f);
        dl_moe_backward_free(&b);
    }
    free_case(&g);
}
END_TEST

START_TEST(tf32_backend_needs_tf32_profile)
{
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 31);
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    float_backend(&g, 1, &f, &b);
    dl_check_report_t r = run(&g, &f, &b, "fp32");
    ck_assert_int_eq(r.verdict, DL_VERDICT_FAIL);
    ck_assert(!dl_check_conformant(&r));
    /* the GEMM stages are what fails */
    const dl_check_result_t *h = find(&r, DL_VALUE_H_GATE, "numerics");
    ck_assert(h && h->verdict == DL_VERDICT_FAIL && h->err_warn > 1.0);
    /* elementwise stages computed in fp32 from the candidate's own inputs pass */
    const dl_check_result_t *a = find(&r, DL_VALUE_H_ACT, "numerics");
    ck_assert(a && a->verdict == DL_VERDICT_PASS);
    dl_check_report_free(&r);
    r = run(&g, &f, &b, "tf32");
    if (r.verdict != DL_VERDICT_PASS)
        dump(&r);
    ck_assert_int_eq(count(&r, DL_VERDICT_FAIL), 0);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    dl_check_report_free(&r);
    dl_moe_forward_free(&f);
    dl_moe_backward_free(&b);
    free_case(&g);
}
END_TEST

/* Removes assignment (t, j) from a golden copy: out row t without the slot,
 * sort_perm without the entry (padded with -1), its group one smaller. */
static void drop_slot(const gcase_t *g, dl_moe_forward_t *f, int64_t t, int64_t j, int disp)
{
    const int64_t k = g->c.route.top_k, d = g->c.hidden, T = g->c.tokens, E = g->c.route.experts,
                  M = T * k, fl = t * k + j;
    float *w = dupm(g->f.topk_weights, (size_t)M * 4);
    w[fl] = 0.0f; /* 0 * y adds nothing exactly */
    float *out = malloc((size_t)(T * d) * 4);
    ck_assert_int_eq(dl_combine(g->f.y_sorted, w, g->f.inv_perm, T, k, d, g->c.dtype, out), 0);
    memcpy(f->out + t * d, out + t * d, (size_t)d * 4);
    free(out);
    free(w);
    if (!disp)
        return;
    int64_t q = 0;
    for (int64_t p = 0; p < M; p++)
        if (g->f.sort_perm[p] != fl)
            f->sort_perm[q++] = g->f.sort_perm[p];
    f->sort_perm[M - 1] = -1;
    f->group_sizes[g->f.topk_ids[fl]]--;
    for (int64_t e = 0; e < E; e++)
        f->group_offsets[e + 1] = f->group_offsets[e] + f->group_sizes[e];
}

START_TEST(dropped_slot_is_named)
{
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 41);
    dl_moe_forward_t f, f0;
    dl_moe_backward_t b;
    copy_all(&g, &f0, &b);
    dl_moe_backward_free(&b);
    memset(&f, 0, sizeof f);
    f.topk_ids = f0.topk_ids;
    f.topk_weights = f0.topk_weights;
    f.sort_perm = f0.sort_perm;
    f.group_sizes = f0.group_sizes;
    f.group_offsets = f0.group_offsets;
    f.out = f0.out;
    drop_slot(&g, &f, 5, 1, 1);
    dl_check_report_t r = run(&g, &f, NULL, "fp32");
    ck_assert_int_eq(r.verdict, DL_VERDICT_FAIL);
    ck_assert_int_eq(r.n_dropped, 1);
    ck_assert_int_eq(r.dropped[0].token, 5);
    ck_assert_int_eq(r.dropped[0].slot, 1);
    const dl_check_result_t *z = find(&r, DL_VALUE_NONE, "zero_drops");
    ck_assert(z && z->verdict == DL_VERDICT_FAIL);
    ck_assert_ptr_nonnull(strstr(z->message, "(5,1)"));
    ck_assert_int_eq(find(&r, DL_VALUE_SORT_PERM, "bijection")->verdict, DL_VERDICT_FAIL);
    ck_assert_int_eq(find(&r, DL_VALUE_GROUP_SIZES, "exact")->verdict, DL_VERDICT_FAIL);
    ck_assert_int_eq(find(&r, DL_VALUE_GROUP_OFFSETS, "exact")->verdict, DL_VERDICT_FAIL);
    ck_assert_int_eq(find(&r, DL_VALUE_OUT, "numerics")->verdict, DL_VERDICT_FAIL);
    ck_assert_int_eq(find(&r, DL_VALUE_OUT, "numerics")->worst_index / g.c.hidden, 5);
    dl_check_report_free(&r);
    dl_moe_forward_free(&f0);
    free_case(&g);
}
END_TEST

/* Only out: the drop is found by the combine diagnosis alone, for one slot,
 * two slots (of k = 4), and a whole token. */
START_TEST(dropped_out_diagnosed)
{
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 42);
    const int64_t d = g.c.hidden, T = g.c.tokens;
    dl_moe_forward_t f;
    memset(&f, 0, sizeof f);
    f.out = dupm(g.f.out, (size_t)(T * d) * 4);
    drop_slot(&g, &f, 9, 2, 0);
    drop_slot(&g, &f, 30, 0, 0);
    float *row = dupm(f.out + 30 * d, (size_t)d * 4);
    memcpy(f.out + 30 * d, g.f.out + 30 * d, (size_t)d * 4);
    /* token 30 loses slots 0 and 3 together */
    {
        const int64_t k = g.c.route.top_k, M = T * k;
        float *w = dupm(g.f.topk_weights, (size_t)M * 4);
        w[30 * k + 0] = w[30 * k + 3] = 0.0f;
        float *out = malloc((size_t)(T * d) * 4);
        ck_assert_int_eq(dl_combine(g.f.y_sorted, w, g.f.inv_perm, T, k, d, g.c.dtype, out), 0);
        memcpy(f.out + 30 * d, out + 30 * d, (size_t)d * 4);
        free(out);
        free(w);
    }
    free(row);
    memset(f.out + 50 * d, 0, (size_t)d * 4); /* token 50 dropped entirely */
    dl_check_report_t r = run(&g, &f, NULL, "fp32");
    ck_assert_int_eq(r.verdict, DL_VERDICT_FAIL);
    static const int64_t want[][2] = {{9, 2}, {30, 0}, {30, 3}, {50, 0}, {50, 1}, {50, 2}, {50, 3}};
    if (r.n_dropped != 7)
        dump(&r);
    ck_assert_int_eq(r.n_dropped, 7);
    for (int i = 0; i < 7; i++) {
        ck_assert_int_eq(r.dropped[i].token, want[i][0]);
        ck_assert_int_eq(r.dropped[i].slot, want[i][1]);
    }
    /* a row wrong some other way is not passed off as a drop */
    dl_check_report_free(&r);
    f.out[3 * d + 1] += 1.0f;
    r = run(&g, &f, NULL, "fp32");
    ck_assert_int_eq(r.n_dropped, 7);
    ck_assert_ptr_nonnull(strstr(find(&r, DL_VALUE_NONE, "zero_drops")->message, "not explained"));
    dl_check_report_free(&r);
    free(f.out);
    free_case(&g);
}
END_TEST

/* k > 8: single slots and whole tokens are searched. */
START_TEST(dropped_big_k)
{
    gcase_t g;
    make_case(&g, CASE_BIGK, DL_F32, 44);
    const int64_t d = g.c.hidden, T = g.c.tokens;
    dl_moe_forward_t f;
    memset(&f, 0, sizeof f);
    f.out = dupm(g.f.out, (size_t)(T * d) * 4);
    drop_slot(&g, &f, 3, 7, 0);
    memset(f.out + 60 * d, 0, (size_t)d * 4);
    dl_check_report_t r = run(&g, &f, NULL, "fp32");
    ck_assert_int_eq(r.n_dropped, 11);
    ck_assert(r.dropped[0].token == 3 && r.dropped[0].slot == 7);
    for (int j = 0; j < 10; j++)
        ck_assert(r.dropped[1 + j].token == 60 && r.dropped[1 + j].slot == j);
    dl_check_report_free(&r);
    free(f.out);
    free_case(&g);
}
END_TEST

/* The same layer with each token's slots listed in reverse: nothing changes. */
START_TEST(slot_order_is_free)
{
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 43);
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    copy_all(&g, &f, &b);
    const int64_t k = g.c.route.top_k, M = g.c.tokens * k;
    for (int64_t fl = 0; fl < M; fl++) {
        const int64_t t = fl / k, j = fl % k, r = t * k + (k - 1 - j);
        f.topk_ids[r] = g.f.topk_ids[fl];
        f.topk_weights[r] = g.f.topk_weights[fl];
        b.d_topk_weights[r] = g.b.d_topk_weights[fl];
        f.inv_perm[r] = g.f.inv_perm[fl];
    }
    for (int64_t p = 0; p < M; p++) {
        const int64_t fl = g.f.sort_perm[p], t = fl / k, j = fl % k;
        f.sort_perm[p] = (int32_t)(t * k + (k - 1 - j));
    }
    dl_check_report_t r = run(&g, &f, &b, "fp32");
    if (r.verdict != DL_VERDICT_PASS)
        dump(&r);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    /* golden values were reused: bitwise equal everywhere */
    for (size_t i = 0; i < r.n; i++)
        if (!strcmp(r.results[i].check, "numerics"))
            ck_assert(r.results[i].err_pass == 0.0);
    dl_check_report_free(&r);
    dl_moe_forward_free(&f);
    dl_moe_backward_free(&b);
    free_case(&g);
}
END_TEST

START_TEST(routing_ties)
{
    gcase_t g;
    make_case(&g, CASE_TIE, DL_F32, 51);
    const int64_t k = g.c.route.top_k, T = g.c.tokens, E = g.c.route.experts;
    /* a token whose k-th pick is expert 2, tied with the unselected expert 5 */
    int64_t tt = -1, jj = -1;
    for (int64_t t = 0; t < T && tt < 0; t++) {
        int has5 = 0;
        for (int64_t j = 0; j < k; j++)
            has5 |= g.f.topk_ids[t * k + j] == 5;
        for (int64_t j = 0; j < k && !has5; j++)
            if (g.f.topk_ids[t * k + j] == 2)
                tt = t, jj = j;
    }
    ck_assert_int_ge(tt, 0);
    ck_assert(g.f.tie_margin[tt] == 0.0f);
    dl_moe_forward_t f;
    memset(&f, 0, sizeof f);
    f.topk_ids = dupm(g.f.topk_ids, (size_t)(T * k) * 4);
    f.topk_weights = dupm(g.f.topk_weights, (size_t)(T * k) * 4);
    f.topk_ids[tt * k + jj] = 5; /* the other side of an exact tie */
    dl_check_report_t r = run(&g, &f, NULL, "fp32");
    if (r.verdict != DL_VERDICT_WARN)
        dump(&r);
    const dl_check_result_t *x = find(&r, DL_VALUE_TOPK_IDS, "routing");
    ck_assert(x && x->verdict == DL_VERDICT_WARN && x->worst_index == tt);
    ck_assert_int_eq(find(&r, DL_VALUE_TOPK_WEIGHTS, "numerics")->verdict, DL_VERDICT_PASS);
    ck_assert_int_eq(r.verdict, DL_VERDICT_WARN);
    ck_assert(dl_check_conformant(&r));
    dl_check_report_free(&r);

    /* a clear loser instead: outside any margin */
    f.topk_ids[tt * k + jj] = 2;
    int64_t lo = -1;
    for (int64_t e = 0; e < E; e++) {
        int sel = 0;
        for (int64_t j = 0; j < k; j++)
            sel |= g.f.topk_ids[3 * k + j] == e;
        if (!sel && (lo < 0 || g.f.router_scores[3 * E + e] < g.f.router_scores[3 * E + lo]))
            lo = e;
    }
    ck_assert(g.f.tie_margin[3] > 0.0f);
    f.topk_ids[3 * k + k - 1] = (int32_t)lo;
    r = run(&g, &f, NULL, "fp32");
    x = find(&r, DL_VALUE_TOPK_IDS, "routing");
    ck_assert(x && x->verdict == DL_VERDICT_FAIL && x->worst_index == 3);
    ck_assert(!dl_check_conformant(&r));
    dl_check_report_free(&r);

    /* out of range and repeated ids: a FAIL, not a crash */
    f.topk_ids[3 * k] = 99;
    f.topk_ids[7 * k] = f.topk_ids[7 * k + 1];
    r = run(&g, &f, NULL, "fp32");
    x = find(&r, DL_VALUE_TOPK_IDS, "routing");
    ck_assert(x && x->verdict == DL_VERDICT_FAIL);
    ck_assert_ptr_nonnull(strstr(x->message, "out of"));
    dl_check_report_free(&r);
    free(f.topk_ids);
    free(f.topk_weights);
    free_case(&g);
}
END_TEST

START_TEST(hygiene)
{
    gcase_t g;
    make_case(&g, CASE_SIGMOID_BIAS, DL_F32, 61);
    ck_assert_int_eq(g.f.group_sizes[7], 0);
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    copy_all(&g, &f, &b);
    const int64_t d = g.c.hidden, ff = g.c.ffn;
    b.d_w_gate[7 * d * ff + 3] = 1e-30f; /* an empty expert's dW written */
    f.h_act[7] = NAN;
    b.d_x[0] = INFINITY;
    dl_check_report_t r = run(&g, &f, &b, "fp32");
    ck_assert_int_eq(r.verdict, DL_VERDICT_FAIL);
    const dl_check_result_t *x = find(&r, DL_VALUE_D_W_GATE, "empty_experts");
    ck_assert(x && x->verdict == DL_VERDICT_FAIL && x->n_over_warn == 1 &&
              x->worst_index == 7 * d * ff + 3);
    ck_assert_int_eq(find(&r, DL_VALUE_D_W_UP, "empty_experts")->verdict, DL_VERDICT_PASS);
    x = find(&r, DL_VALUE_H_ACT, "numerics");
    ck_assert(x && x->verdict == DL_VERDICT_FAIL && x->n_nonfinite == 1 && x->worst_index == 7);
    x = find(&r, DL_VALUE_D_X, "numerics");
    ck_assert(x && x->verdict == DL_VERDICT_FAIL && x->n_nonfinite == 1);
    /* downstream of the NaN is checked on exact values, and passes */
    ck_assert_int_eq(find(&r, DL_VALUE_Y_SORTED, "numerics")->verdict, DL_VERDICT_PASS);
    dl_check_report_free(&r);

    /* a stage the loader found misshapen */
    dl_check_golden_t gold = golden_of(&g);
    dl_check_candidate_t cand = {.fwd = f, .bwd = b, .bad_shape = DL_VALUE_BIT(DL_VALUE_OUT)};
    b.d_w_gate[7 * d * ff + 3] = 0.0f;
    f.h_act[7] = g.f.h_act[7];
    b.d_x[0] = g.b.d_x[0];
    cand.fwd = f;
    cand.bwd = b;
    ck_assert_int_eq(dl_check_run(&gold, &cand, NULL, &r), 0);
    x = find(&r, DL_VALUE_OUT, "shape");
    ck_assert(x && x->verdict == DL_VERDICT_FAIL);
    ck_assert_int_eq(count(&r, DL_VERDICT_FAIL), 1);
    dl_check_report_free(&r);

    /* garbage dispatch: FAILs, no crash */
    for (int64_t p = 0; p < g.c.tokens * g.c.route.top_k; p++)
        f.sort_perm[p] = (int32_t)(p * 7919 % 1000) - 300;
    f.group_offsets[3] = -5;
    f.group_sizes[1] = INT64_MAX;
    cand.fwd = f;
    cand.bad_shape = 0;
    ck_assert_int_eq(dl_check_run(&gold, &cand, NULL, &r), 0);
    ck_assert_int_eq(find(&r, DL_VALUE_SORT_PERM, "bijection")->verdict, DL_VERDICT_FAIL);
    ck_assert_int_eq(find(&r, DL_VALUE_GROUP_SIZES, "exact")->verdict, DL_VERDICT_FAIL);
    ck_assert_int_eq(find(&r, DL_VALUE_NONE, "zero_drops")->verdict, DL_VERDICT_FAIL);
    dl_check_report_free(&r);
    dl_moe_forward_free(&f);
    dl_moe_backward_free(&b);
    free_case(&g);
}
END_TEST

START_TEST(missing_stages_skip)
{
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 71);
    dl_moe_forward_t f;
    memset(&f, 0, sizeof f);
    f.out = g.f.out;
    dl_check_report_t r = run(&g, &f, NULL, "fp32");
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    ck_assert_int_eq(find(&r, DL_VALUE_OUT, "numerics")->verdict, DL_VERDICT_PASS);
    ck_assert_int_eq(find(&r, DL_VALUE_NONE, "zero_drops")->verdict, DL_VERDICT_PASS);
    ck_assert_int_eq(find(&r, DL_VALUE_H_GATE, "provided")->verdict, DL_VERDICT_SKIP);
    ck_assert_int_eq(find(&r, DL_VALUE_D_X, "provided")->verdict, DL_VERDICT_SKIP);
    /* every value of the case but out is a SKIP line (those of variants the
     * case does not have, such as shared experts, do not exist) */
    int live = 0;
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        live += dl_cond_applies(dl_layout_find(dl_value_name((dl_value_t)s))->cond, &g.c);
    ck_assert_int_eq(count(&r, DL_VERDICT_SKIP), live - 1);
    dl_check_report_free(&r);
    /* nothing at all: everything SKIP, and nothing checked is not conformance */
    memset(&f, 0, sizeof f);
    r = run(&g, &f, NULL, "fp32");
    ck_assert_int_eq(r.verdict, DL_VERDICT_SKIP);
    ck_assert(!dl_check_checked(&r));
    ck_assert(!dl_check_conformant(&r));
    {
        const dl_check_report_t *rp = &r;
        ck_assert_int_eq(dl_check_exit_status(&rp, 1), DL_CHECK_EXIT_USAGE);
        /* an INFO note alone checks nothing either */
        ck_assert_int_eq(dl_check_report_add(&r, DL_VALUE_NONE, "note", DL_VERDICT_INFO, "x"), 0);
        ck_assert(!dl_check_checked(&r));
        ck_assert_int_eq(dl_check_exit_status(&rp, 1), DL_CHECK_EXIT_USAGE);
    }
    dl_check_report_free(&r);
    /* a forward-only golden: backward stages SKIP */
    dl_moe_forward_t f2;
    dl_moe_backward_t b2;
    copy_all(&g, &f2, &b2);
    dl_check_golden_t gold = golden_of(&g);
    gold.bwd = NULL;
    dl_check_candidate_t cand = {.fwd = f2, .bwd = b2};
    ck_assert_int_eq(dl_check_run(&gold, &cand, NULL, &r), 0);
    ck_assert_int_eq(find(&r, DL_VALUE_D_X, "provided")->verdict, DL_VERDICT_SKIP);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    dl_check_report_free(&r);
    dl_moe_forward_free(&f2);
    dl_moe_backward_free(&b2);
    free_case(&g);
}
END_TEST

/* --require: a required stage the candidate lacks is a FAIL (its SKIP line
 * turned), one it provides is judged as usual; plain runs and isolated
 * runs agree; a backward stage against a forward-only golden FAILs too. */
START_TEST(required_stages)
{
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 72);
    dl_check_golden_t gold = golden_of(&g);
    dl_check_candidate_t cand = {.fwd = {.out = g.f.out}};
    dl_check_options_t o;
    dl_check_options_default(&o);
    o.require = DL_VALUE_BIT(DL_VALUE_OUT) | DL_VALUE_BIT(DL_VALUE_D_X);
    dl_check_report_t r;
    ck_assert_int_eq(dl_check_run(&gold, &cand, &o, &r), 0);
    ck_assert_int_eq(find(&r, DL_VALUE_OUT, "numerics")->verdict, DL_VERDICT_PASS);
    ck_assert_int_eq(find(&r, DL_VALUE_D_X, "required")->verdict, DL_VERDICT_FAIL);
    ck_assert_ptr_null(find(&r, DL_VALUE_D_X, "provided"));
    ck_assert(!dl_check_conformant(&r));
    dl_check_report_free(&r);
    dl_valueset_t groups[2] = {DL_VALUE_BIT(DL_VALUE_OUT), DL_VALUE_BIT(DL_VALUE_D_X)};
    ck_assert_int_eq(dl_check_run_isolated(&gold, &cand, &o, groups, 2, &r), 0);
    ck_assert_int_eq(find(&r, DL_VALUE_D_X, "required")->verdict, DL_VERDICT_FAIL);
    ck_assert(!dl_check_conformant(&r));
    dl_check_report_free(&r);
    /* provided: conformant */
    cand.bwd.d_x = g.b.d_x;
    ck_assert_int_eq(dl_check_run(&gold, &cand, &o, &r), 0);
    ck_assert_ptr_null(find(&r, DL_VALUE_D_X, "required"));
    ck_assert(dl_check_conformant(&r));
    dl_check_report_free(&r);
    /* the golden has no backward: a required backward stage cannot be met */
    gold.bwd = NULL;
    ck_assert_int_eq(dl_check_run(&gold, &cand, &o, &r), 0);
    ck_assert_int_eq(find(&r, DL_VALUE_D_X, "required")->verdict, DL_VERDICT_FAIL);
    ck_assert_ptr_nonnull(strstr(find(&r, DL_VALUE_D_X, "required")->message, "no backward"));
    dl_check_report_free(&r);
    free_case(&g);
}
END_TEST

/* Per-stage profiles: parts, stage names, default, later items override,
 * errors; and they reach the bound (a tf32 backend judged tf32 only in the
 * experts FAILs on the router). */
START_TEST(per_stage_profiles)
{
    const dl_check_profile_t *whole, *ps[DL_VALUE_COUNT];
    ck_assert_int_eq(dl_check_parse_profiles("bf16", &whole, ps), 0);
    ck_assert_str_eq(whole->name, "bf16");
    ck_assert_ptr_null(ps[DL_VALUE_H_GATE]);
    ck_assert_int_eq(dl_check_parse_profiles("router=fp32,experts=bf16-acc,h_act=bf16", &whole, ps), 0);
    ck_assert_ptr_null(whole);
    ck_assert_str_eq(ps[DL_VALUE_ROUTER_LOGITS]->name, "fp32");
    ck_assert_str_eq(ps[DL_VALUE_D_ROUTER_WEIGHT]->name, "fp32");
    ck_assert_str_eq(ps[DL_VALUE_D_W_DOWN]->name, "bf16-acc");
    ck_assert_str_eq(ps[DL_VALUE_H_ACT]->name, "bf16");
    ck_assert_ptr_null(ps[DL_VALUE_OUT]);
    ck_assert_int_eq(dl_check_parse_profiles("default=tf32,combine=fp32", &whole, ps), 0);
    ck_assert_str_eq(whole->name, "tf32");
    ck_assert_str_eq(ps[DL_VALUE_D_X]->name, "fp32");
    /* the three parts cover every value judged within a tolerance (their
     * part column), the shared experts' ones by the part they belong to;
     * the exactly judged ones (x_sorted, the routing ids) none */
    ck_assert_int_eq(dl_check_parse_profiles("router=fp32,experts=bf16-acc,combine=tf32", &whole, ps),
                     0);
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        const dl__ck_desc_t *d = dl__ck_desc((dl_value_t)s);
        ck_assert_msg((ps[s] != NULL) == (d->exact && !(d->flags & DL__CK_COPY)), "%s",
                      dl_value_name((dl_value_t)s));
    }
    ck_assert_str_eq(ps[DL_VALUE_SHARED_GATE]->name, "fp32");
    ck_assert_str_eq(ps[DL_VALUE_D_SHARED_W_DOWN]->name, "bf16-acc");
    ck_assert_str_eq(ps[DL_VALUE_D_SHARED_Y]->name, "tf32");
    ck_assert_int_eq(dl_check_parse_profiles("routr=fp32", &whole, ps), DL_EINVAL);
    ck_assert_int_eq(dl_check_parse_profiles("router=fp8", &whole, ps), DL_EINVAL);
    ck_assert_int_eq(dl_check_parse_profiles("router=fp32,,experts=tf32", &whole, ps), DL_EINVAL);
    ck_assert_int_eq(dl_check_parse_profiles("router", &whole, ps), DL_EINVAL);
    ck_assert_int_eq(dl_check_parse_profiles("router=", &whole, ps), DL_EINVAL);
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 41);
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    float_backend(&g, 1, &f, &b); /* tf32 everywhere */
    dl_check_golden_t gold = golden_of(&g);
    dl_check_candidate_t c = {.fwd = f, .bwd = b};
    dl_check_options_t o;
    dl_check_options_default(&o);
    ck_assert_int_eq(dl_check_parse_profiles("default=tf32,router=fp32", &o.profile, o.stage_profile), 0);
    dl_check_report_t r;
    ck_assert_int_eq(dl_check_run(&gold, &c, &o, &r), 0);
    ck_assert_int_eq(find(&r, DL_VALUE_ROUTER_LOGITS, "numerics")->verdict, DL_VERDICT_FAIL);
    ck_assert_int_eq(find(&r, DL_VALUE_H_GATE, "numerics")->verdict, DL_VERDICT_PASS);
    dl_check_report_free(&r);
    /* the same profile spec as the candidate's compute_mode */
    dl_check_options_default(&o);
    c.compute_mode = "default=tf32,router=fp32";
    ck_assert_int_eq(dl_check_run(&gold, &c, &o, &r), 0);
    ck_assert_int_eq(find(&r, DL_VALUE_ROUTER_LOGITS, "numerics")->verdict, DL_VERDICT_FAIL);
    ck_assert_int_eq(find(&r, DL_VALUE_H_GATE, "numerics")->verdict, DL_VERDICT_PASS);
    ck_assert_str_eq(r.profile, "tf32+per-stage");
    dl_check_report_free(&r);
    dl_moe_forward_free(&f);
    dl_moe_backward_free(&b);
    free_case(&g);
}
END_TEST

/* Errors never compound: a candidate h_gate 1 ulp off and the h_act that
 * its own h_gate gives: h_act is checked against the recomputation. */
START_TEST(stage_local)
{
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 81);
    const int64_t n = g.c.tokens * g.c.route.top_k * g.c.ffn;
    dl_moe_forward_t f;
    memset(&f, 0, sizeof f);
    f.h_gate = dupm(g.f.h_gate, (size_t)n * 4);
    f.h_act = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i += 3)
        f.h_gate[i] = nextafterf(f.h_gate[i], INFINITY);
    ck_assert_int_eq(dl_swiglu(f.h_gate, g.f.h_up, n, DL_F32, f.h_act), 0);
    dl_check_report_t r = run(&g, &f, NULL, "fp32");
    const dl_check_result_t *a = find(&r, DL_VALUE_H_ACT, "numerics");
    ck_assert(a && a->verdict == DL_VERDICT_PASS && a->err_pass == 0.0);
    ck_assert_ptr_nonnull(strstr(a->message, "recomputed"));
    ck_assert_int_eq(find(&r, DL_VALUE_H_GATE, "numerics")->verdict, DL_VERDICT_PASS);
    ck_assert(find(&r, DL_VALUE_H_GATE, "numerics")->max_ulp == 1.0);
    dl_check_report_free(&r);
    /* against the golden h_act instead it would not be exact */
    memcpy(f.h_act, g.f.h_act, (size_t)n * 4);
    r = run(&g, &f, NULL, "fp32");
    ck_assert(find(&r, DL_VALUE_H_ACT, "numerics")->err_pass > 0.0);
    dl_check_report_free(&r);
    free(f.h_gate);
    free(f.h_act);
    free_case(&g);
}
END_TEST

/* With golden reuse off, every stage is recomputed from the golden's own
 * upstream: the runner's recomputation must give the golden bits exactly
 * (score VJP, un-permute plus router d_x, weights, dispatch, all of it). */
START_TEST(recompute_matches_golden)
{
    static const struct { int kind; dl_dtype_t t; } cs[] = {
        {CASE_SOFTMAX, DL_F32}, {CASE_SIGMOID_BIAS, DL_BF16}, {CASE_PLAIN, DL_F16},
        {CASE_GROUPED, DL_F32}, {CASE_TIE, DL_BF16}};
    gcase_t g;
    make_case(&g, cs[_i].kind, cs[_i].t, 121 + (uint64_t)_i);
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    copy_all(&g, &f, &b);
    dl_check_golden_t gold = golden_of(&g);
    dl_check_candidate_t cand = {.fwd = f, .bwd = b};
    dl_check_options_t o;
    dl_check_options_default(&o);
    o.recompute_all = 1;
    dl_check_report_t r;
    ck_assert_int_eq(dl_check_run(&gold, &cand, &o, &r), 0);
    if (r.verdict != DL_VERDICT_PASS)
        dump(&r);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    int n = 0;
    for (size_t i = 0; i < r.n; i++) {
        const dl_check_result_t *x = &r.results[i];
        if (strcmp(x->check, "numerics"))
            continue;
        n++;
        ck_assert_msg(x->err_pass == 0.0 && x->n_checked > 0, "%s differs from the golden: %s",
                      dl_value_name(x->stage), x->message);
        ck_assert_ptr_nonnull(strstr(x->message, "recomputed"));
    }
    ck_assert_int_ge(n, cs[_i].kind == CASE_PLAIN ? 12 : 19);
    ck_assert_int_eq(find(&r, DL_VALUE_TOPK_IDS, "routing")->verdict, DL_VERDICT_PASS);
    dl_check_report_free(&r);
    dl_moe_forward_free(&f);
    dl_moe_backward_free(&b);
    free_case(&g);
}
END_TEST

/* The plain single-GEMM layer with routing weights 1 ulp off: everything
 * downstream of the weights is recomputed through the plain branches, and
 * the golden's values, 1 ulp-ish away from those, pass. */
START_TEST(plain_recomputed)
{
    gcase_t g;
    make_case(&g, CASE_PLAIN, DL_F32, 111);
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    copy_all(&g, &f, &b);
    for (int64_t i = 0; i < g.c.tokens * g.c.route.top_k; i += 5)
        f.topk_weights[i] = nextafterf(f.topk_weights[i], 0.0f);
    dl_check_report_t r = run(&g, &f, &b, "fp32");
    if (r.verdict != DL_VERDICT_PASS)
        dump(&r);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    static const dl_value_t re[] = {DL_VALUE_OUT, DL_VALUE_D_Y_SORTED};
    for (size_t i = 0; i < sizeof re / sizeof re[0]; i++) {
        const dl_check_result_t *x = find(&r, re[i], "numerics");
        ck_assert_ptr_nonnull(x);
        ck_assert_msg(strstr(x->message, "recomputed") != NULL, "%s: %s", dl_value_name(re[i]), x->message);
    }
    /* its upstream (the candidate's golden d_y_sorted) is golden: reused */
    ck_assert_ptr_null(strstr(find(&r, DL_VALUE_D_X_SORTED, "numerics")->message, "recomputed"));
    ck_assert_ptr_null(find(&r, DL_VALUE_H_GATE, "numerics"));
    dl_check_report_free(&r);
    dl_moe_forward_free(&f);
    dl_moe_backward_free(&b);
    free_case(&g);
}
END_TEST

/* M per element and M in bulk (OpenBLAS over magnitudes) agree, for the
 * grouped and the ragged-K providers. */
START_TEST(m_paths_agree)
{
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 112);
    const int64_t d = g.c.hidden, f = g.c.ffn, E = g.c.route.experts,
                  M = g.c.tokens * g.c.route.top_k;
    dl__mprov_t mp[2];
    memset(mp, 0, sizeof mp);
    mp[0].kind = DL__M_GROUPED;
    mp[0].nterms = 2;
    mp[0].terms[0] = (dl_gemm_term_t){g.b.d_h_gate, f, g.wg, DL_RHS_NK};
    mp[0].terms[1] = (dl_gemm_term_t){g.b.d_h_up, f, g.wu, DL_RHS_NK};
    mp[0].N = d;
    mp[0].off = g.f.group_offsets;
    mp[0].E = E;
    mp[1] = (dl__mprov_t){.kind = DL__M_RAGGED, .a = g.f.x_sorted, .I = d, .b = g.b.d_h_up, .N = f,
                          .off = g.f.group_offsets, .E = E};
    const int64_t rows[2] = {M, E * d};
    for (int i = 0; i < 2; i++) {
        double *bulk = malloc((size_t)(rows[i] * mp[i].N) * sizeof *bulk);
        ck_assert_int_eq(dl__ck_m_bulk(&mp[i], rows[i], bulk), 0);
        for (int64_t r = 0; r < rows[i]; r++)
            for (int64_t c = 0; c < mp[i].N; c++) {
                double e = dl__ck_m_elem(&mp[i], r, c), x = bulk[r * mp[i].N + c];
                ck_assert(fabs(e - x) <= 1e-12 * e);
            }
        free(bulk);
    }
    free_case(&g);
}
END_TEST

/* ------------------------------------------------------ exact helpers */

START_TEST(weights_for_ids_mpfr)
{
    dl_test_rng_t rng = {91};
    const int64_t E = 16, k = 5, T = 200;
    float *s = malloc((size_t)(T * E) * 4), *w = malloc((size_t)(T * k) * 4);
    int32_t *ids = malloc((size_t)(T * k) * 4);
    dl_route_config_t rc = {.experts = E, .top_k = k, .n_group = 1, .topk_group = 1,
                            .renormalize = 1, .scaling = 2.5};
    for (int64_t i = 0; i < T * E; i++) /* adversarial spread: tiny to 1 */
        s[i] = (float)ldexp(dl_test_unif(&rng) + 0.5, -(int)(dl_test_next(&rng) % (i % 7 ? 8 : 140)));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++)
            ids[t * k + j] = (int32_t)((t + 3 * j) % E);
    for (int pass = 0; pass < 2; pass++) {
        rc.renormalize = pass == 0;
        rc.scaling = pass ? 1.0 / 3.0 : 2.5;
        for (int64_t t = 0; t < T; t++) {
            ck_assert_int_eq(dl_route_weights(&rc, s + t * E, ids + t * k, w + t * k), 0);
            mpfr_t sum, q;
            mpfr_init2(sum, 2000);
            mpfr_init2(q, 2000);
            mpfr_set_zero(sum, 1);
            for (int64_t j = 0; j < k; j++)
                mpfr_add_d(sum, sum, s[t * E + ids[t * k + j]], MPFR_RNDN);
            for (int64_t j = 0; j < k; j++) {
                mpfr_set_d(q, s[t * E + ids[t * k + j]], MPFR_RNDN);
                mpfr_mul_d(q, q, rc.scaling, MPFR_RNDN);
                if (rc.renormalize)
                    mpfr_div(q, q, sum, MPFR_RNDN);
                ck_assert(same_value(w[t * k + j], mpref_round(q, DL_F32)));
            }
            mpfr_clear(sum);
            mpfr_clear(q);
        }
    }
    free(s), free(w), free(ids);
}
END_TEST

START_TEST(score_vjp_mpfr)
{
    dl_test_rng_t rng = {92};
    const int64_t E = 24, T = 300;
    float *s = malloc((size_t)(T * E) * 4), *ds = malloc((size_t)(T * E) * 4);
    float *dl = malloc((size_t)(T * E) * 4);
    for (int sf = 0; sf < 2; sf++) {
        dl_route_config_t rc = {.experts = E, .top_k = 2, .n_group = 1, .topk_group = 1,
                                .scaling = 1.0, .score_fn = sf ? DL_SCORE_SIGMOID : DL_SCORE_SOFTMAX};
        for (int64_t t = 0; t < T; t++) {
            for (int64_t e = 0; e < E; e++) {
                s[t * E + e] = (float)dl_test_unif(&rng);
                ds[t * E + e] = (float)dl_test_normal(&rng);
            }
            if (t % 3 == 0) { /* cancellation: ds_e close to sum_j s_j ds_j */
                double sig = 0;
                for (int64_t j = 0; j < E; j++)
                    sig += (double)s[t * E + j] * ds[t * E + j];
                ds[t * E + t % E] = (float)sig;
            }
        }
        ck_assert_int_eq(dl_route_scores_backward(&rc, s, ds, T, dl), 0);
        mpfr_t sig, v, p;
        mpfr_inits2(2000, sig, v, p, (mpfr_ptr)0);
        for (int64_t t = 0; t < T; t++) {
            mpfr_set_zero(sig, 1);
            for (int64_t j = 0; j < E; j++) {
                mpfr_set_d(p, s[t * E + j], MPFR_RNDN);
                mpfr_mul_d(p, p, ds[t * E + j], MPFR_RNDN);
                mpfr_add(sig, sig, p, MPFR_RNDN);
            }
            for (int64_t e = 0; e < E; e++) {
                const double se = s[t * E + e], de = ds[t * E + e];
                if (sf) { /* ds s (1 - s) */
                    mpfr_set_d(v, 1.0, MPFR_RNDN);
                    mpfr_sub_d(v, v, se, MPFR_RNDN);
                    mpfr_mul_d(v, v, se, MPFR_RNDN);
                    mpfr_mul_d(v, v, de, MPFR_RNDN);
                } else { /* s (ds - sigma) */
                    mpfr_set_d(v, de, MPFR_RNDN);
                    mpfr_sub(v, v, sig, MPFR_RNDN);
                    mpfr_mul_d(v, v, se, MPFR_RNDN);
                }
                ck_assert_msg(same_value(dl[t * E + e], mpref_round(v, DL_F32)), "t %lld e %lld",
                              (long long)t, (long long)e);
            }
        }
        mpfr_clears(sig, v, p, (mpfr_ptr)0);
    }
    free(s), free(ds), free(dl);
}
END_TEST

/* The bound: WARN is never tighter than PASS, profiles order as their unit
 * roundoffs do, and the golden's own rounding is allowed for. */
START_TEST(bound_model)
{
    dl__ck_t ck;
    memset(&ck, 0, sizeof ck);
    const char *names[] = {"fp32", "tf32", "bf16", "fp16", "bf16-acc", "fp16-acc"};
    ck_assert_int_eq(dl_check_profile_count(), 8);
    for (int i = 0; i < 6; i++) {
        ck_assert_ptr_eq(dl_check_profile_find(names[i]), dl_check_profile_at(i));
        ck.prof = dl_check_profile_at(i);
        for (int64_t K = 1; K <= 1 << 20; K *= 4) {
            dl__cmp_t cmp = {.t = DL_F32, .kappa_in = 2};
            double p = dl__ck_bound(&ck, &cmp, 1.0, 10.0, K, 0);
            double w = dl__ck_bound(&ck, &cmp, 1.0, 10.0, K, 1);
            ck_assert(p > 0 && w >= p);
            /* one rounding of the candidate plus the golden's: an ulp always passes */
            ck_assert(p >= dl__ck_ulp(1.0, DL_F32));
        }
    }
    ck_assert_ptr_eq(dl_check_profile_find("FLOAT32"), dl_check_profile_at(0));
    ck_assert_ptr_null(dl_check_profile_find("fp8"));
    dl__cmp_t cmp = {.t = DL_F32, .kappa_in = 2};
    ck.prof = dl_check_profile_find("fp32");
    double b32 = dl__ck_bound(&ck, &cmp, 0.0, 1.0, 64, 0);
    ck.prof = dl_check_profile_find("tf32");
    double btf = dl__ck_bound(&ck, &cmp, 0.0, 1.0, 64, 0);
    ck_assert(btf > 100 * b32);
    /* bf16 data is on the bf16 grid: no input term under the bf16 profile */
    ck.prof = dl_check_profile_find("bf16");
    ck_assert(dl__ck_on_input_grid(ck.prof, DL_BF16) && !dl__ck_on_input_grid(ck.prof, DL_F32));
    ck_assert(dl__ck_on_input_grid(dl_check_profile_find("tf32"), DL_F16));
    ck_assert(!dl__ck_on_input_grid(dl_check_profile_find("fp16"), DL_BF16));
    ck_assert(dl__ck_ulp(1.0, DL_BF16) == 0x1p-7 && dl__ck_ulp(0.0, DL_F16) == 0x1p-24);
    for (int v = DL_VERDICT_SKIP; v <= DL_VERDICT_FAIL; v++)
        ck_assert_ptr_nonnull(dl_verdict_name((dl_verdict_t)v));
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        dl_value_t x;
        ck_assert_int_eq(dl_value_parse(dl_value_name((dl_value_t)s), &x), 0);
        ck_assert_int_eq(x, s);
    }
    dl_value_t x;
    ck_assert_int_eq(dl_value_parse("nope", &x), DL_ENOTFOUND);
}
END_TEST

/* ---------------------------------------------------------- reports */

static int have_python(void)
{
    return system("/usr/bin/python3 -c 'import json, xml.etree.ElementTree' >/dev/null 2>&1") == 0;
}

START_TEST(reports_parse)
{
    gcase_t g;
    make_case(&g, CASE_SOFTMAX, DL_F32, 101);
    dl_moe_forward_t f, f0;
    dl_moe_backward_t b;
    copy_all(&g, &f0, &b);
    f = f0;
    drop_slot(&g, &f, 5, 1, 1);
    f.h_act[3] = NAN;
    dl_check_golden_t gold = golden_of(&g);
    gold.case_name = "we\"ird <&> 'name'\n\x01\\ \xff\xc3\xa9";
    dl_check_candidate_t cand = {.fwd = f, .bwd = b, .backend = "back\"end</x>",
                                 .backend_version = "1.0 & up"};
    dl_check_report_t r;
    ck_assert_int_eq(dl_check_run(&gold, &cand, NULL, &r), 0);
    const dl_check_report_t *rr[2] = {&r, &r};
    char dir[] = "/tmp/dl_check_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char pj[64], px[64], pt[64], pa[64], cmd[1024];
    snprintf(pj, sizeof pj, "%s/r.json", dir);
    snprintf(pa, sizeof pa, "%s/r2.json", dir);
    snprintf(px, sizeof px, "%s/r.xml", dir);
    snprintf(pt, sizeof pt, "%s/r.txt", dir);
    ck_assert_int_eq(dl_check_save(pj, DL_REPORT_JSON, rr, 1, 0), 0);
    ck_assert_int_eq(dl_check_save(pa, DL_REPORT_JSON, rr, 2, 0), 0);
    ck_assert_int_eq(dl_check_save(px, DL_REPORT_JUNIT, rr, 2, 0), 0);
    ck_assert_int_eq(dl_check_save(pt, DL_REPORT_TABLE, rr, 1, DL_REPORT_COLOUR | DL_REPORT_ALL), 0);
    ck_assert_int_eq(dl_check_save("/nonexistent-dir/x.json", DL_REPORT_JSON, rr, 1, 0), DL_EIO);
    FILE *t = fopen(pt, "r");
    char buf[1 << 16];
    size_t nr = fread(buf, 1, sizeof buf - 1, t);
    buf[nr] = 0;
    fclose(t);
    ck_assert_ptr_nonnull(strstr(buf, "NOT CONFORMANT"));
    ck_assert_ptr_nonnull(strstr(buf, "\033["));
    if (have_python()) {
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 -c 'import json,sys\n"
                 "d=json.load(open(sys.argv[1]))\n"
                 "assert d[\"format\"]==\"dropless-check\" and d[\"version\"]==1\n"
                 "assert d[\"verdict\"]==\"FAIL\" and d[\"conformant\"] is False\n"
                 "assert d[\"case\"].startswith(\"we\\\"ird <&>\")\n"
                 "assert d[\"dropped\"][\"count\"]==1 and d[\"dropped\"][\"pairs\"]==[[5,1]]\n"
                 "assert len(d[\"checks\"])==%zu\n"
                 "for c in d[\"checks\"]:\n"
                 "  assert set(c)>={\"stage\",\"check\",\"verdict\",\"n_checked\",\"err_pass\",\"max_ulp\",\"worst\",\"message\"}\n"
                 "a=json.load(open(sys.argv[2])); assert isinstance(a,list) and len(a)==2\n"
                 "' %s %s",
                 r.n, pj, pa);
        ck_assert_int_eq(system(cmd), 0);
        int nfail = count(&r, DL_VERDICT_FAIL), nskip = count(&r, DL_VERDICT_SKIP);
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 -c 'import sys, xml.etree.ElementTree as E\n"
                 "t=E.parse(sys.argv[1]).getroot()\n"
                 "assert t.tag==\"testsuites\"\n"
                 "s=t.findall(\"testsuite\"); assert len(s)==2\n"
                 "assert len(s[0].findall(\"testcase\"))==%zu\n"
                 "assert len(s[0].findall(\"testcase/failure\"))==%d\n"
                 "assert len(s[0].findall(\"testcase/skipped\"))==%d\n"
                 "assert s[0].get(\"name\").startswith(\"we\\\"ird <&>\")\n"
                 "' %s",
                 r.n, nfail, nskip, px);
        ck_assert_int_eq(system(cmd), 0);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(dl_check_exit_status(rr, 2), DL_CHECK_EXIT_NONCONFORMANT);
    {
        /* findings from outside (the plugin executor) join the verdict */
        dl_check_golden_t g2 = golden_of(&g);
        dl_check_candidate_t c2 = {.fwd = {.out = g.f.out}};
        dl_check_report_t q;
        ck_assert_int_eq(dl_check_run(&g2, &c2, NULL, &q), 0);
        ck_assert_int_eq(q.verdict, DL_VERDICT_PASS);
        ck_assert_int_eq(dl_check_report_add(&q, DL_VALUE_OUT, "deterministic", DL_VERDICT_WARN,
                                             "two runs differ in 3 elements"), 0);
        ck_assert_int_eq(q.verdict, DL_VERDICT_WARN);
        ck_assert(dl_check_conformant(&q));
        ck_assert_int_eq(dl_check_report_add(&q, DL_VALUE_NONE, "executed", DL_VERDICT_FAIL, NULL), 0);
        ck_assert_int_eq(q.verdict, DL_VERDICT_FAIL);
        ck_assert(!dl_check_conformant(&q));
        ck_assert_int_eq(dl_check_report_add(&q, (dl_value_t)99, "x", DL_VERDICT_FAIL, NULL), DL_EINVAL);
        dl_check_report_free(&q);
    }
    dl_report_format_t fm;
    ck_assert_int_eq(dl_report_format_parse("junit", &fm), 0);
    ck_assert_int_eq(fm, DL_REPORT_JUNIT);
    ck_assert_int_eq(dl_report_format_parse("yaml", &fm), DL_EINVAL);
    dl_check_report_free(&r);
    dl_moe_forward_free(&f0);
    dl_moe_backward_free(&b);
    free_case(&g);
}
END_TEST

/* The runner's descriptors come from DL_VALUE_MAP's rows: every stage
 * value of this build (the extra value's too) has a complete one, and a
 * row whose columns describe no check is refused (the runner then stops,
 * naming the value) rather than silently never checked. */
START_TEST(value_table)
{
    int n_num = 0;
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        const dl__ck_desc_t *d = dl__ck_desc((dl_value_t)s);
        ck_assert_msg(d && !dl__ck_desc_gap(d, dl_value_store((dl_value_t)s)), "%s: %s",
                      dl_value_name((dl_value_t)s), d ? dl__ck_desc_gap(d, dl_value_store((dl_value_t)s)) : "none");
        ck_assert(d->check || d->exact || (d->flags & DL__CK_WITH_SORT));
        n_num += d->mag != NULL;
    }
    ck_assert_int_ge(n_num, 21);
    const dl__ck_desc_t *out = dl__ck_desc(DL_VALUE_OUT);
    dl__ck_desc_t bad = *out;
    bad.kind = 0; /* check column NONE */
    ck_assert_ptr_nonnull(dl__ck_desc_gap(&bad, DL_STORE_ACT));
    bad = *out;
    bad.prop = NULL; /* upstream values, no propagation rule */
    ck_assert_ptr_nonnull(dl__ck_desc_gap(&bad, DL_STORE_ACT));
    bad = *out;
    bad.mag = NULL; /* a numeric check without its M */
    ck_assert_ptr_nonnull(dl__ck_desc_gap(&bad, DL_STORE_ACT));
    bad = *out;
    bad.part = DL__CK_PART_NONE; /* judged within a tolerance, under no profile part */
    ck_assert_ptr_nonnull(dl__ck_desc_gap(&bad, DL_STORE_ACT));
    /* exact checks need no part: the permutation, the routing ids */
    ck_assert_int_eq(dl__ck_desc(DL_VALUE_X_SORTED)->part, DL__CK_PART_NONE);
    ck_assert_ptr_null(dl__ck_desc_gap(dl__ck_desc(DL_VALUE_X_SORTED), DL_STORE_ACT));
    ck_assert_ptr_nonnull(dl__ck_desc_gap(out, DL_STORE_I32)); /* floats compared on ints */
    ck_assert_ptr_null(dl__ck_desc_gap(out, DL_STORE_ACT));
}
END_TEST

int main(void)
{
    if (!have_python())
        dl_test_skip("reports: JSON and JUnit parsed by /usr/bin/python3 (not installed)");
    const dl_test_t tests[] = {
        DL_TEST_LOOP("verdicts", "known candidates", golden_is_conformant, 0, 5, 120),
        DL_TEST("verdicts", "known candidates", plain_recomputed, 120),
        DL_TEST_LOOP("verdicts", "known candidates", recompute_matches_golden, 0, 5, 120),
        DL_TEST("verdicts", "known candidates", m_paths_agree, 120),
        DL_TEST_LOOP("verdicts", "known candidates", fp32_backend_passes, 0, 3, 120),
        DL_TEST("verdicts", "known candidates", tf32_backend_needs_tf32_profile, 120),
        DL_TEST("verdicts", "known candidates", fused_backend_propagation, 120),
        DL_TEST("verdicts", "known candidates", stage_local, 120),
        DL_TEST("verdicts", "known candidates", missing_stages_skip, 120),
        DL_TEST("verdicts", "known candidates", required_stages, 120),
        DL_TEST("verdicts", "known candidates", per_stage_profiles, 120),
        DL_TEST("tokens and routing", "drops", dropped_slot_is_named, 120),
        DL_TEST("tokens and routing", "drops", dropped_out_diagnosed, 120),
        DL_TEST("tokens and routing", "drops", dropped_big_k, 120),
        DL_TEST("tokens and routing", "drops", slot_order_is_free, 120),
        DL_TEST("tokens and routing", "routing", routing_ties, 120),
        DL_TEST("tokens and routing", "hygiene", hygiene, 120),
        DL_TEST("exact helpers and tolerance model", "mpfr", weights_for_ids_mpfr, 120),
        DL_TEST("exact helpers and tolerance model", "mpfr", score_vjp_mpfr, 120),
        DL_TEST("exact helpers and tolerance model", "mpfr", bound_model, 120),
        DL_TEST("reports", "writers", reports_parse, 120),
        DL_TEST("value table", "descriptors", value_table, 60),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
