/* The runner on the routing rules of issue 26, both directions: for
 * sqrtsoftplus scores and for the softmax over the top-k logits, the
 * golden and a plain-fp32 router (libm, float arithmetic: off the golden by
 * rounding) are CONFORMANT, and each defect a kernel could have FAILs at
 * the stage it touches: the wrong score function, the wrong derivative,
 * the softmax over all experts instead of the selected, the weights' VJP
 * without its centring term, and an out built from wrong weights when
 * nothing else is handed over. Also exact ties in the top-k logits. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "check/check_priv.h"

/* a golden layer: its configuration, inputs (arr: x, router weight, bias,
 * w_gate, w_up, w_down, d_out, router bias) and every stage value; the
 * softmax_topk cases (gpt-oss) have a router-logit bias */
enum { X, WR, BIAS, WG, WU, WD, DOUT, RBIAS, NARR };
typedef struct {
    dl_moe_config_t c;
    float *arr[NARR];
    dl_moe_inputs_t in;
    dl_moe_forward_t f;
    dl_moe_backward_t b;
} gcase_t;

static float *randn(dl_test_rng_t *r, int64_t n, double scale)
{
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)(dl_test_normal(r) * scale);
    return p;
}

/* T = 48 tokens, E = 12 experts, top-3; tie: experts 2 and 7 share a
 * router column (their logits tie exactly) */
static void make_case(gcase_t *g, dl_score_fn_t fn, int tie, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    const int64_t T = 48, d = 16, f = 8, E = 12, k = 3;
    g->c = (dl_moe_config_t){.tokens = T, .hidden = d, .ffn = f, .ffn_kind = DL_FFN_SWIGLU,
                             .dtype = DL_F32};
    g->c.route = (dl_route_config_t){.experts = E, .top_k = k, .score_fn = fn, .n_group = 1,
                                     .topk_group = 1, .renormalize = 1, .scaling = 1.5,
                                     .has_bias = fn == DL_SCORE_SQRTSOFTPLUS,
                                     .has_router_bias = fn == DL_SCORE_SOFTMAX_TOPK};
    dl_test_rng_t r = {seed};
    const int64_t n[NARR] = {T * d, d * E, E, E * d * f, E * d * f, E * f * d, T * d, E};
    const double sd[NARR] = {1.0, 2.0 / sqrt((double)d), 0.05, 1.0 / sqrt((double)d),
                             1.0 / sqrt((double)d), 1.0 / sqrt((double)f), 1.0, 0.5};
    for (int i = 0; i < NARR; i++)
        g->arr[i] = randn(&r, n[i], sd[i]);
    if (tie) {
        for (int64_t i = 0; i < d; i++)
            g->arr[WR][i * E + 7] = g->arr[WR][i * E + 2];
        g->arr[RBIAS][7] = g->arr[RBIAS][2];
        g->arr[BIAS][7] = g->arr[BIAS][2];
    }
    g->in = (dl_moe_inputs_t){
        .x = g->arr[X], .router_weight = g->arr[WR],
        .expert_bias = g->c.route.has_bias ? g->arr[BIAS] : NULL, .w_gate = g->arr[WG],
        .w_up = g->arr[WU], .w_down = g->arr[WD], .d_out = g->arr[DOUT],
        .router_bias = g->c.route.has_router_bias ? g->arr[RBIAS] : NULL};
    ck_assert_int_eq(dl_moe_forward(&g->c, &g->in, &g->f), 0);
    ck_assert_int_eq(dl_moe_backward(&g->c, &g->in, &g->f, &g->b), 0);
}

static void free_case(gcase_t *g)
{
    dl_moe_forward_free(&g->f);
    dl_moe_backward_free(&g->b);
    for (int i = 0; i < NARR; i++)
        free(g->arr[i]);
}

/* The router arrays a candidate replaces; the rest of it borrows the
 * golden's (a shallow copy: only these are its own). */
typedef struct {
    float *scores, *weights, *d_scores, *d_logits;
    int32_t *ids;
} router_t;

static void borrow(const gcase_t *g, router_t *own, dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    const int64_t TE = g->c.tokens * g->c.route.experts, M = g->c.tokens * g->c.route.top_k;
    own->scores = malloc(TE * sizeof(float));
    own->d_scores = malloc(TE * sizeof(float));
    own->d_logits = malloc(TE * sizeof(float));
    own->weights = malloc(M * sizeof(float));
    own->ids = malloc(M * sizeof(int32_t));
    memcpy(own->scores, g->f.router_scores, TE * sizeof(float));
    memcpy(own->d_scores, g->b.d_router_scores, TE * sizeof(float));
    memcpy(own->d_logits, g->b.d_router_logits, TE * sizeof(float));
    memcpy(own->weights, g->f.topk_weights, M * sizeof(float));
    memcpy(own->ids, g->f.topk_ids, M * sizeof(int32_t));
    *f = g->f;
    *b = g->b;
    f->router_scores = own->scores;
    f->topk_weights = own->weights;
    f->topk_ids = own->ids;
    b->d_router_scores = own->d_scores;
    b->d_router_logits = own->d_logits;
}

static void release(router_t *own)
{
    free(own->scores), free(own->weights), free(own->d_scores), free(own->d_logits);
    free(own->ids);
}

static dl_check_report_t run(const gcase_t *g, const dl_moe_forward_t *f,
                             const dl_moe_backward_t *b)
{
    dl_check_golden_t gold = {&g->c, &g->in, &g->f, &g->b, "unit"};
    dl_check_candidate_t cand = {.backend = "test"};
    if (f)
        cand.fwd = *f;
    if (b)
        cand.bwd = *b;
    dl_check_options_t o;
    dl_check_options_default(&o);
    o.profile = dl_check_profile_find("fp32");
    dl_check_report_t r;
    ck_assert_int_eq(dl_check_run(&gold, &cand, &o, &r), 0);
    return r;
}

static dl_verdict_t verdict_of(const dl_check_report_t *r, dl_value_t s, const char *check)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->results[i].stage == s && !strcmp(r->results[i].check, check))
            return r->results[i].verdict;
    return DL_VERDICT_SKIP;
}

static void dump(const dl_check_report_t *r)
{
    const dl_check_report_t *rr = r;
    dl_check_write(stderr, DL_REPORT_TABLE, &rr, 1, 0);
}

/* ------------------------------------- a plain fp32 router (libm, floats) */

static float f_ssp(float l) { return sqrtf(l > 0 ? l + log1pf(expf(-l)) : log1pf(expf(l))); }

/* the router stages of a float kernel: scores, weights for the golden's
 * ids, d_scores and d_logits; defect picks one wrong formula */
enum { OK = 0, WRONG_SCORE, WRONG_DERIV, FULL_SOFTMAX, NO_CENTRING };

static void float_router(const gcase_t *g, int defect, dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    const dl_route_config_t *rc = &g->c.route;
    const int64_t T = g->c.tokens, E = rc->experts, k = rc->top_k;
    const float c = (float)rc->scaling;
    for (int64_t t = 0; t < T; t++) {
        const float *l = g->f.router_logits + t * E;
        float *s = f->router_scores + t * E, *ds = b->d_router_scores + t * E;
        float *dl = b->d_router_logits + t * E;
        const int32_t *id = g->f.topk_ids + t * k;
        const float *dw = g->b.d_topk_weights + t * k;
        float *w = f->topk_weights + t * k;
        for (int64_t e = 0; e < E; e++) {
            s[e] = rc->score_fn == DL_SCORE_SOFTMAX_TOPK ? l[e]
                   : defect == WRONG_SCORE              ? 1.0f / (1.0f + expf(-l[e]))
                                                        : f_ssp(l[e]);
            ds[e] = 0.0f;
        }
        if (rc->score_fn == DL_SCORE_SOFTMAX_TOPK) {
            float m = l[id[0]], S = 0.0f, p[3], mu = 0.0f, all = 0.0f;
            for (int64_t e = 0; e < E; e++)
                all += expf(l[e] - m);
            for (int64_t j = 0; j < k; j++)
                S += p[j] = expf(l[id[j]] - m);
            for (int64_t j = 0; j < k; j++) {
                p[j] = defect == FULL_SOFTMAX ? p[j] / all : p[j] / S;
                w[j] = c * p[j];
                mu += p[j] * dw[j];
            }
            for (int64_t j = 0; j < k; j++)
                ds[id[j]] = defect == NO_CENTRING ? c * p[j] * dw[j] : c * p[j] * (dw[j] - mu);
            for (int64_t e = 0; e < E; e++)
                dl[e] = ds[e];
            continue;
        }
        float S = 0.0f, B = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            S += s[id[j]];
            B += dw[j] * s[id[j]];
        }
        for (int64_t j = 0; j < k; j++) {
            w[j] = c * s[id[j]] / S;
            ds[id[j]] = c * (dw[j] * S - B) / (S * S);
        }
        for (int64_t e = 0; e < E; e++) {
            const float se = s[e];
            const float sig = -expm1f(-se * se); /* sigmoid(l) */
            dl[e] = defect == WRONG_DERIV ? ds[e] * sig : ds[e] * sig / (2.0f * se);
        }
    }
}

/* one candidate: the golden with the router stages of a float kernel */
static dl_check_report_t run_router(const gcase_t *g, int defect)
{
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    router_t own;
    borrow(g, &own, &f, &b);
    float_router(g, defect, &f, &b);
    dl_check_report_t r = run(g, &f, &b);
    release(&own);
    return r;
}

static const dl_score_fn_t FNS[2] = {DL_SCORE_SQRTSOFTPLUS, DL_SCORE_SOFTMAX_TOPK};

START_TEST(correct_candidates_pass)
{
    gcase_t g;
    make_case(&g, FNS[_i / 2], _i & 1, 70 + (uint64_t)_i);
    dl_check_report_t r = run(&g, &g.f, &g.b);
    if (r.verdict != DL_VERDICT_PASS)
        dump(&r);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    dl_check_report_free(&r);
    /* a float router: off by rounding, still conformant, and really off */
    r = run_router(&g, OK);
    if (r.verdict == DL_VERDICT_FAIL)
        dump(&r);
    ck_assert(r.verdict != DL_VERDICT_FAIL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_TOPK_WEIGHTS, "numerics"), DL_VERDICT_PASS);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_D_ROUTER_LOGITS, "numerics"), DL_VERDICT_PASS);
    dl_check_report_free(&r);
    free_case(&g);
}
END_TEST

START_TEST(defects_fail)
{
    static const struct { dl_score_fn_t fn; int defect; dl_value_t at; } cs[] = {
        {DL_SCORE_SQRTSOFTPLUS, WRONG_SCORE, DL_VALUE_ROUTER_SCORES},
        {DL_SCORE_SQRTSOFTPLUS, WRONG_DERIV, DL_VALUE_D_ROUTER_LOGITS},
        {DL_SCORE_SOFTMAX_TOPK, FULL_SOFTMAX, DL_VALUE_TOPK_WEIGHTS},
        {DL_SCORE_SOFTMAX_TOPK, NO_CENTRING, DL_VALUE_D_ROUTER_SCORES},
    };
    gcase_t g;
    make_case(&g, cs[_i].fn, 0, 80 + (uint64_t)_i);
    dl_check_report_t r = run_router(&g, cs[_i].defect);
    if (verdict_of(&r, cs[_i].at, "numerics") != DL_VERDICT_FAIL)
        dump(&r);
    ck_assert_int_eq(verdict_of(&r, cs[_i].at, "numerics"), DL_VERDICT_FAIL);
    ck_assert_int_eq(r.verdict, DL_VERDICT_FAIL);
    dl_check_report_free(&r);
    free_case(&g);
}
END_TEST

/* out alone, combined from the golden's expert outputs with the softmax
 * over all experts' weights (the Mixtral rule without renormalisation):
 * the runner sees only out and must still FAIL it; with the right weights
 * (the golden's out) it is CONFORMANT */
START_TEST(fused_out_wrong_rule)
{
    gcase_t g;
    make_case(&g, DL_SCORE_SOFTMAX_TOPK, 0, 90);
    const int64_t T = g.c.tokens, E = g.c.route.experts, k = g.c.route.top_k, d = g.c.hidden;
    dl_route_config_t full = g.c.route;
    full.score_fn = DL_SCORE_SOFTMAX;
    full.renormalize = 0;
    float *s = malloc(T * E * sizeof *s), *w = malloc(T * k * sizeof *w);
    ck_assert_int_eq(dl_route_scores(&full, g.f.router_logits, T, s), 0);
    for (int64_t t = 0; t < T; t++)
        ck_assert_int_eq(dl_route_weights(&full, s + t * E, g.f.topk_ids + t * k, w + t * k), 0);
    dl_moe_forward_t f;
    memset(&f, 0, sizeof f);
    f.out = malloc(T * d * sizeof *f.out);
    ck_assert_int_eq(dl_combine(g.f.y_sorted, w, g.f.inv_perm, T, k, d, DL_F32, f.out), 0);
    dl_check_report_t r = run(&g, &f, NULL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_OUT, "numerics"), DL_VERDICT_FAIL);
    dl_check_report_free(&r);
    memcpy(f.out, g.f.out, T * d * sizeof *f.out);
    r = run(&g, &f, NULL);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    dl_check_report_free(&r);
    free(f.out);
    free(s);
    free(w);
    free_case(&g);
}
END_TEST

/* the router-logit bias: logits without it (a kernel that drops the bias)
 * FAIL router_logits, a d_router_bias off by one token's row (the sum over
 * T-1 tokens) FAILs d_router_bias, and out alone from the bias-less
 * routing FAILs out */
START_TEST(router_bias_defects)
{
    gcase_t g;
    make_case(&g, DL_SCORE_SOFTMAX_TOPK, 0, 97);
    const int64_t T = g.c.tokens, E = g.c.route.experts, d = g.c.hidden;
    float *l = malloc(T * E * sizeof *l), *db = malloc(E * sizeof *db);
    ck_assert_int_eq(dl_route_logits(g.in.x, T, d, g.in.router_weight, NULL, E, l, NULL), 0);
    dl_moe_forward_t f;
    memset(&f, 0, sizeof f);
    f.router_logits = l;
    dl_check_report_t r = run(&g, &f, NULL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_ROUTER_LOGITS, "numerics"), DL_VERDICT_FAIL);
    dl_check_report_free(&r);
    ck_assert_int_eq(dl_route_bias_backward(g.b.d_router_logits, T - 1, E, db, NULL), 0);
    dl_moe_backward_t b;
    memset(&b, 0, sizeof b);
    b.d_router_bias = db;
    r = run(&g, NULL, &b);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_D_ROUTER_BIAS, "numerics"), DL_VERDICT_FAIL);
    dl_check_report_free(&r);
    b.d_router_bias = g.b.d_router_bias; /* the golden's: PASS */
    r = run(&g, NULL, &b);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_D_ROUTER_BIAS, "numerics"), DL_VERDICT_PASS);
    dl_check_report_free(&r);
    /* out of the whole layer without the bias */
    dl_moe_config_t c = g.c;
    c.route.has_router_bias = 0;
    dl_moe_inputs_t in = g.in;
    in.router_bias = NULL;
    dl_moe_forward_t nf;
    ck_assert_int_eq(dl_moe_forward(&c, &in, &nf), 0);
    memset(&f, 0, sizeof f);
    f.out = nf.out;
    r = run(&g, &f, NULL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_OUT, "numerics"), DL_VERDICT_FAIL);
    dl_check_report_free(&r);
    dl_moe_forward_free(&nf);
    free(l);
    free(db);
    free_case(&g);
}
END_TEST

/* ties in the top-k logits: a candidate that breaks the exact tie between
 * experts 2 and 7 the other way is a plausible tie (WARN at most), one that
 * picks an expert far below the boundary FAILs */
START_TEST(topk_logit_ties)
{
    gcase_t g;
    make_case(&g, DL_SCORE_SOFTMAX_TOPK, 1, 95);
    const int64_t T = g.c.tokens, E = g.c.route.experts, k = g.c.route.top_k;
    int64_t swapped = -1;
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    router_t own;
    borrow(&g, &own, &f, &b);
    for (int64_t t = 0; t < T && swapped < 0; t++) {
        int32_t *id = f.topk_ids + t * k;
        int has2 = -1, has7 = -1;
        for (int64_t j = 0; j < k; j++) {
            has2 = id[j] == 2 ? (int)j : has2;
            has7 = id[j] == 7 ? (int)j : has7;
        }
        if (has2 >= 0 && has7 < 0) { /* 2 at the boundary: 7 ties with it */
            const float l2 = g.f.router_logits[t * E + 2];
            int last = 1;
            for (int64_t j = 0; j < k; j++)
                last &= id[j] == 2 || g.f.router_logits[t * E + id[j]] >= l2;
            if (last) {
                id[has2] = 7;
                swapped = t;
            }
        }
    }
    ck_assert_msg(swapped >= 0, "no token with expert 2 at the boundary");
    dl_check_report_t r = run(&g, &f, NULL);
    ck_assert(verdict_of(&r, DL_VALUE_TOPK_IDS, "routing") != DL_VERDICT_FAIL);
    dl_check_report_free(&r);
    /* the worst expert of the token instead: far outside any tolerance */
    int32_t *id = f.topk_ids + swapped * k;
    int64_t worst = 0;
    for (int64_t e = 1; e < E; e++)
        if (g.f.router_logits[swapped * E + e] < g.f.router_logits[swapped * E + worst])
            worst = e;
    for (int64_t j = 0; j < k; j++)
        if (id[j] == 7)
            id[j] = (int32_t)worst;
    r = run(&g, &f, NULL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_TOPK_IDS, "routing"), DL_VERDICT_FAIL);
    dl_check_report_free(&r);
    release(&own);
    free_case(&g);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST_LOOP("conformant", "correct", correct_candidates_pass, 0, 4, 120),
        DL_TEST_LOOP("defects", "fail", defects_fail, 0, 4, 120),
        DL_TEST("defects", "fused_out", fused_out_wrong_rule, 120),
        DL_TEST("ties", "topk_logits", topk_logit_ties, 120),
        DL_TEST("defects", "router_bias", router_bias_defects, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
