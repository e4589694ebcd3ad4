/* The runner's partial recomputation (src/check/reuse.c): a stage whose
 * upstream differs from the golden's in a few elements, rows or experts is
 * recomputed only there. Its exact values must equal bitwise those of the
 * whole recomputation (the tests' switch DL__CK_REUSE_TEST_FULL) and the
 * reports must be identical; a mutant that reuses one changed unit must be
 * caught by that comparison; with a dispatch that is not the golden's no
 * sorted-row or expert value may be reused in part. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "check/check_priv.h"
#include "dropless/golden.h"

/* Cases as data: each reuse shape of DL_VALUE_MAP appears in one of them
 * (shared experts' EACH and ROW rows in the shared cases, ffn_bias and the
 * clamped SwiGLU in gpt-oss-like, relu2's ungated rows in nemotron-like). */
static const char *const cases[] = {"mixtral-small-bf16", "mixtral-small", "qwen2-moe-like-bf16",
                                    "deepseek-v3-shared", "gpt-oss-like-bf16", "nemotron-like",
                                    "plain-ffn-bf16", "empty-experts", "softmax-topk"};
#define NCASES ((int)(sizeof cases / sizeof *cases))

typedef struct {
    dl_golden_file_t gf;
    dl_moe_inputs_t in;
    dl_check_golden_t g;
} golden_t;

static void make_golden(golden_t *w, const char *name)
{
    dl_case_t c;
    ck_assert_int_eq(dl_case_find(name, &c), 0);
    dl_golden_gen_opts_t go = {0};
    char err[256] = "";
    int bwd_err = 0;
    ck_assert_msg(!dl_golden_generate(&c, &go, &w->gf, &bwd_err, err, sizeof err) && !bwd_err,
                  "%s: %s", name, err);
    w->in = dl_golden_inputs_view(&w->gf.in);
    w->g = (dl_check_golden_t){&w->gf.config, &w->in, &w->gf.fwd, &w->gf.bwd, name};
}

/* One step of the storage grid up in magnitude (bf16: the next bf16). */
static float step(float x, dl_dtype_t t)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += t == DL_BF16 ? 0x10000u : 1u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Whether element j of value s is perturbed: a few elements of a few token
 * rows; of the sorted rows, a few columns of expert 1's first row (its
 * weight gradients' slabs recomputed by columns) and a fifth of the
 * elements of expert 2's rows (its slabs recomputed whole), the other
 * experts' left alone; one element of expert 2's weight gradient. */
static int perturbed(const dl_golden_file_t *gf, dl_value_t s, int64_t j)
{
    const char *dims = dl_value_dims(s);
    const int64_t n = dl_value_numel(&gf->config, s), rows = dl_value_dim(&gf->config, dims[0]);
    const int64_t len = rows > 0 ? n / rows : 1, r = j / len;
    if (dims[0] == 'M') {
        const int64_t *off = gf->fwd.group_offsets;
        return (r == off[1] || (r >= off[2] && r < off[3])) && j % 5 == 0;
    }
    if (dims[0] == 'T')
        return r % 7 == 3 && j % len % 3 == 0;
    if (dims[0] == 'E')
        return j == 2 * len + 1;
    return j == 0;
}

/* A candidate with every float stage (x_sorted and the integer ones as the
 * golden's), a few elements of each perturbed; ids_token >= 0: that
 * token's first expert replaced (another dispatch). */
static dl_check_candidate_t candidate(const golden_t *w, int64_t ids_token, float **copies)
{
    dl_check_candidate_t cand = {.fwd = w->gf.fwd, .bwd = w->gf.bwd, .backend = "test"};
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        void **slot = dl__value_slot(&cand.fwd, &cand.bwd, (dl_value_t)s);
        const int64_t n = dl_value_numel(&w->gf.config, (dl_value_t)s);
        copies[s] = NULL;
        if (!slot || !*slot || n <= 0 || s == DL_VALUE_X_SORTED ||
            dl_value_store((dl_value_t)s) > DL_STORE_F32)
            continue;
        float *c = malloc((size_t)n * sizeof *c);
        memcpy(c, *slot, (size_t)n * sizeof *c);
        const dl_dtype_t t = dl_value_dtype(&w->gf.config, (dl_value_t)s);
        for (int64_t j = 0; j < n; j++)
            if (c[j] != 0.0f && isfinite(c[j]) && perturbed(&w->gf, (dl_value_t)s, j))
                c[j] = step(c[j], t);
        *slot = copies[s] = c;
    }
    if (ids_token >= 0) {
        const int64_t k = w->gf.config.route.top_k, E = w->gf.config.route.experts;
        int32_t *ids = malloc((size_t)(w->gf.config.tokens * k) * sizeof *ids);
        memcpy(ids, w->gf.fwd.topk_ids, (size_t)(w->gf.config.tokens * k) * sizeof *ids);
        for (int32_t e = 0; e < E; e++) { /* an expert the token does not have */
            int have = 0;
            for (int64_t j = 0; j < k; j++)
                have |= ids[ids_token * k + j] == e;
            if (!have) {
                ids[ids_token * k] = e;
                break;
            }
        }
        cand.fwd.topk_ids = ids;
        copies[DL_VALUE_TOPK_IDS] = (float *)ids;
    }
    return cand;
}

/* What one run saw: every recomputed exact value, and in how many units. */
typedef struct {
    float *exact[DL_VALUE_COUNT];
    int64_t n[DL_VALUE_COUNT], reused[DL_VALUE_COUNT];
    int golden_dispatch[DL_VALUE_COUNT];
} seen_t;

static void seen(void *ctx, const dl__ck_t *ck, dl_value_t s, const float *x)
{
    seen_t *w = ctx;
    const int64_t n = ck->st[s].numel;
    free(w->exact[s]); /* a nested run (the second chained level) sees it again */
    w->exact[s] = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(w->exact[s], x, (size_t)n * sizeof(float));
    w->n[s] = n;
    w->reused[s] = ck->st[s].reused;
    const void *e = ck->st[DL_VALUE_TOPK_IDS].eff, *g = ck->st[DL_VALUE_TOPK_IDS].gold;
    w->golden_dispatch[s] = e && g && !memcmp(e, g, (size_t)ck->M * sizeof(int32_t));
}

static dl_check_report_t run_mode(const golden_t *w, const dl_check_candidate_t *cand, int mode,
                                  seen_t *sn)
{
    memset(sn, 0, sizeof *sn);
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        sn->reused[s] = -2; /* not recomputed */
    dl__ck_reuse_test = (dl__ck_reuse_test_t){.mode = mode, .seen = seen, .ctx = sn};
    dl_check_options_t o;
    dl_check_options_default(&o);
    dl_check_report_t r;
    ck_assert_int_eq(dl_check_run(&w->g, cand, &o, &r), 0);
    dl__ck_reuse_test = (dl__ck_reuse_test_t){0};
    return r;
}

static void free_seen(seen_t *s)
{
    for (int i = 0; i < DL_VALUE_COUNT; i++)
        free(s->exact[i]);
}

/* The first stage whose recomputed exact values differ between a and b
 * (or that one recomputed and the other did not), or -1. */
static int first_diff(const seen_t *a, const seen_t *b)
{
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        if (!a->exact[s] != !b->exact[s] ||
            (a->exact[s] && memcmp(a->exact[s], b->exact[s], (size_t)a->n[s] * sizeof(float))))
            return s;
    return -1;
}

/* Bitwise (NaN-safe) equality of two doubles. */
static int same(double a, double b)
{
    return !memcmp(&a, &b, sizeof a);
}

static void same_reports(const dl_check_report_t *a, const dl_check_report_t *b, const char *what)
{
    ck_assert_int_eq(a->verdict, b->verdict);
    ck_assert_uint_eq(a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        const dl_check_result_t *x = &a->results[i], *y = &b->results[i];
        ck_assert_msg(x->stage == y->stage && !strcmp(x->check, y->check) &&
                          x->verdict == y->verdict && x->n_checked == y->n_checked &&
                          x->n_over_pass == y->n_over_pass && x->n_over_warn == y->n_over_warn &&
                          x->worst_index == y->worst_index && same(x->max_abs, y->max_abs) &&
                          same(x->max_ulp, y->max_ulp) && same(x->err_pass, y->err_pass) &&
                          same(x->err_warn, y->err_warn) && !strcmp(x->message, y->message),
                      "%s: %s %s differs:\n  %s\n  %s", what, dl_value_name(x->stage), x->check,
                      x->message, y->message);
    }
}

static void free_copies(float **copies)
{
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        free(copies[s]);
}

/* One case checked twice: whole (the tests' switch) and in mode b. */
typedef struct {
    golden_t w;
    float *copies[DL_VALUE_COUNT];
    seen_t full, b;
    dl_check_report_t rf, rb;
} pair_t;

static void pair_run(pair_t *p, const char *name, int64_t ids_token, int mode_b)
{
    make_golden(&p->w, name);
    dl_check_candidate_t cand = candidate(&p->w, ids_token, p->copies);
    p->rf = run_mode(&p->w, &cand, DL__CK_REUSE_TEST_FULL, &p->full);
    p->rb = run_mode(&p->w, &cand, mode_b, &p->b);
}

static void pair_free(pair_t *p)
{
    dl_check_report_free(&p->rf);
    dl_check_report_free(&p->rb);
    free_seen(&p->full);
    free_seen(&p->b);
    free_copies(p->copies);
    dl_golden_free(&p->w.gf);
}

/* The partial path equals the whole one, bitwise, and reports the same;
 * every shape the case has was taken in part at least once. */
START_TEST(partial_equals_whole)
{
    pair_t p;
    pair_run(&p, cases[_i], -1, 0);
    const int d = first_diff(&p.full, &p.b);
    ck_assert_msg(d < 0, "%s: %s's exact values differ", cases[_i], d < 0 ? "" : dl_value_name(d));
    same_reports(&p.rf, &p.rb, cases[_i]);
    int shapes = 0, taken = 0; /* the shapes seen, and those taken in part */
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        const int sh = dl__ck_desc((dl_value_t)s)->reuse;
        if (p.b.exact[s] && sh >= DL__CK_REUSE_EACH) {
            shapes |= 1 << sh;
            taken |= (p.b.reused[s] > 0) << sh;
        }
        ck_assert_int_eq(p.full.reused[s] > -1, 0); /* the switch: all whole */
    }
    ck_assert_msg(shapes && taken == shapes, "%s: shapes %#x, taken in part %#x", cases[_i], shapes,
                  taken);
    pair_free(&p);
}
END_TEST

/* The negative control: reusing one changed unit gives other exact values,
 * which the comparison above catches. */
START_TEST(mutant_is_caught)
{
    pair_t p;
    pair_run(&p, cases[_i], -1, DL__CK_REUSE_TEST_MUTANT);
    ck_assert_msg(first_diff(&p.full, &p.b) >= 0, "%s: the mutant went unnoticed", cases[_i]);
    pair_free(&p);
}
END_TEST

/* Another dispatch: the golden's sorted rows are other tokens' slots, so no
 * sorted-row or expert value is reused in part; still the same reports. */
START_TEST(other_dispatch_whole)
{
    pair_t p;
    pair_run(&p, cases[_i], 5, 0);
    ck_assert_int_lt(first_diff(&p.full, &p.b), 0);
    same_reports(&p.rf, &p.rb, cases[_i]);
    int other = 0;
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        if (!p.b.exact[s] || p.b.golden_dispatch[s] || dl_value_dims((dl_value_t)s)[0] == 'T')
            continue;
        other++;
        ck_assert_msg(p.b.reused[s] == -1, "%s: %s reused on another dispatch", cases[_i],
                      dl_value_name((dl_value_t)s));
    }
    ck_assert_int_gt(other, 0); /* the dispatch did differ */
    pair_free(&p);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST_LOOP("partial recomputation", "equals whole", partial_equals_whole, 0, NCASES, 120),
        DL_TEST_LOOP("partial recomputation", "negative control", mutant_is_caught, 0, NCASES, 120),
        DL_TEST_LOOP("partial recomputation", "other dispatch", other_dispatch_whole, 0, NCASES, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
