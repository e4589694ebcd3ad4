/* The comparison's pruned M (src/check/tol.c, tolerances.md "M of a
 * compared element"): brackets from row and column norms or from a
 * binary32 bulk GEMM decide most elements, and dl__ck_m_elem is taken only
 * where a bracket leaves a figure open. The figures must be bitwise those
 * of the reference path (dl__ck_m_elem for every element that differs),
 * on random and adversarial candidates; a mutant of the pruning (its
 * upper end of M halved) must be caught by the same comparison. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "check/check_priv.h"

enum { P_GROUPED1, P_GROUPED2, P_RAGGED, P_KINDS };
enum { MB_NORMS_T = 1, MB_BULK_T = 2 }; /* dl__ck_m_stats.blocks: the bracketed paths */

/* One synthetic comparison: a provider, exact values RN_t(sum) and a
 * candidate built from them, with optional propagated bounds. */
typedef struct {
    dl__mprov_t mp;
    dl__cmp_t cmp;
    dl__ck_t ck;
    float *lhs[2], *rhs[2], *a, *b, *cand, *exact;
    double *prop[3];
    int64_t off[6], *row_K, E;
    uint8_t *skip, *fail;
    int64_t *over;
    int light; /* equal and few-ulp candidates only (as a correct kernel's) */
} syn_t;

static float *alloc_f(int64_t n)
{
    return calloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

/* An operand: normals on the grid of type t, with zero rows/entries and
 * subnormal entries (squares and products stay exact in binary64). */
static void fill_op(dl_test_rng_t *r, float *p, int64_t n, int64_t rowlen, dl_dtype_t t)
{
    for (int64_t i = 0; i < n; i++) {
        const uint64_t u = dl_test_next(r) % 64;
        double v = dl_test_normal(r);
        if ((i / rowlen) % 11 == 3)
            v = 0.0; /* a zero row: M = 0 there */
        else if (u == 0)
            v = 0.0;
        else if (u == 1)
            v = ldexp(v, -135); /* fp32 subnormal */
        p[i] = (float)dl_round(v, t);
    }
}

/* The exact value of element (row, col) in binary64: sum of the
 * provider's products (the test only needs some g on the type's grid). */
static double dot(const syn_t *s, int64_t row, int64_t col)
{
    const dl__mprov_t *mp = &s->mp;
    double x = 0.0;
    if (mp->kind == DL__M_RAGGED) {
        const int64_t e = row / mp->I, i = row % mp->I;
        for (int64_t m = mp->off[e]; m < mp->off[e + 1]; m++)
            x += (double)mp->a[m * mp->I + i] * (double)mp->b[m * mp->N + col];
        return x;
    }
    int64_t e = 0;
    while (mp->off[e + 1] <= row)
        e++;
    for (int t = 0; t < mp->nterms; t++) {
        const dl_gemm_term_t *tm = &mp->terms[t];
        const float *w = tm->rhs + e * tm->K * mp->N;
        for (int64_t i = 0; i < tm->K; i++)
            x += (double)tm->lhs[row * tm->K + i] *
                 (double)(tm->layout == DL_RHS_KN ? w[i * mp->N + col] : w[col * tm->K + i]);
    }
    return x;
}

/* The candidate of one element: equal, 1 or many ulps off, at a PASS or
 * WARN bound times a factor straddling 1, zero, subnormal, or not finite. */
static float cand_of(syn_t *s, dl_test_rng_t *r, int64_t row, int64_t col, double g, int nonfin)
{
    const dl_dtype_t t = s->cmp.t;
    const double ulp = dl__ck_ulp(g, t);
    const uint64_t u = dl_test_next(r) % (s->light ? 60 : 100);
    const double sg = dl_test_next(r) & 1 ? 1.0 : -1.0;
    if (u < 35)
        return (float)g;
    if (u < 55)
        return (float)dl_round(g + sg * ulp, t);
    if (u < 63)
        return (float)dl_round(g + sg * ulp * (double)(2 + dl_test_next(r) % 3000), t);
    if (u < 90) { /* near a bound: the exact M's bound times 1 -+ a hair */
        static const double f[] = {1.0, 1.0 - 0x1p-40, 1.0 + 0x1p-40, 1.0 - 1e-9, 1.0 + 1e-9,
                                   0.999, 1.001, 0.5, 2.0, 1.0 - 0x1p-20, 1.0 + 0x1p-20};
        const double M = dl__ck_m_elem(&s->mp, row, col);
        const int64_t K = s->cmp.row_K ? s->cmp.row_K[row] : s->cmp.K;
        const int warn = (int)(dl_test_next(r) % 2);
        const int64_t idx = row * s->cmp.cols + col;
        double b = dl__ck_bound(&s->ck, &s->cmp, g, M, K, warn);
        if (s->cmp.prop[warn])
            b += s->cmp.prop[warn][idx];
        return (float)dl_round(g + sg * b * f[dl_test_next(r) % (sizeof f / sizeof f[0])], t);
    }
    if (u < 93)
        return 0.0f;
    if (u < 96)
        return (float)dl_round(sg * ldexp(1.0, -140 - (int)(dl_test_next(r) % 9)), t);
    if (nonfin && u < 97)
        return u & 1 ? NAN : INFINITY;
    return (float)dl_round(g * (1.0 + sg * 0x1p-9), t);
}

/* The tie: row q a copy of row p (operands, exact, candidate), inside one
 * block, so every ratio of q equals p's and the first index must win. */
static void make_tie(syn_t *s, int64_t p, int64_t q)
{
    const int64_t C = s->cmp.cols;
    memcpy(s->cand + q * C, s->cand + p * C, (size_t)C * sizeof(float));
    memcpy(s->exact + q * C, s->exact + p * C, (size_t)C * sizeof(float));
}

static const dl_dtype_t types[] = {DL_F32, DL_BF16, DL_F16};

/* Builds variant v: provider kind, output type, profile, propagated
 * bounds, non-finite elements, skipped rows from v's bits. */
static void build(syn_t *s, int v)
{
    memset(s, 0, sizeof *s);
    s->light = v >= 36;
    dl_test_rng_t r = {0x5eed0000u + (uint64_t)v};
    const int kind = v % P_KINDS;
    const dl_dtype_t t = types[(v / P_KINDS) % 3];
    const int props = (v / 9) % 2, nonfin = (v / 18) % 2;
    const dl_dtype_t opt = v % 2 ? DL_BF16 : DL_F32;
    static const int64_t sizes[2][5] = {{0, 41, 3, 57, 25}, {0, 70, 5, 52, 1}};
    s->E = 4;
    const int64_t *sz = sizes[kind == P_RAGGED];
    for (int e = 0; e < s->E; e++)
        s->off[e + 1] = s->off[e] + sz[e + 1];
    const int64_t Mtot = s->off[s->E], N = 80;
    s->mp.off = s->off;
    s->mp.E = s->E;
    s->mp.N = N;
    int64_t rows, K;
    if (kind == P_RAGGED) {
        const int64_t I = 24;
        s->a = alloc_f(Mtot * I);
        s->b = alloc_f(Mtot * N);
        fill_op(&r, s->a, Mtot * I, I, opt);
        fill_op(&r, s->b, Mtot * N, N, opt);
        s->mp.kind = DL__M_RAGGED;
        s->mp.a = s->a;
        s->mp.b = s->b;
        s->mp.I = I;
        rows = s->E * I;
        K = 0;
        s->row_K = calloc((size_t)rows, sizeof *s->row_K);
        for (int64_t q = 0; q < rows; q++)
            s->row_K[q] = s->off[q / I + 1] - s->off[q / I];
    } else {
        s->mp.kind = DL__M_GROUPED;
        s->mp.nterms = kind == P_GROUPED2 ? 2 : 1; /* d_x_sorted: two terms, NK */
        const int64_t Ks[2] = {96, 48};
        K = 0;
        for (int tm = 0; tm < s->mp.nterms; tm++) {
            s->lhs[tm] = alloc_f(Mtot * Ks[tm]);
            s->rhs[tm] = alloc_f(s->E * Ks[tm] * N);
            fill_op(&r, s->lhs[tm], Mtot * Ks[tm], Ks[tm], opt);
            fill_op(&r, s->rhs[tm], s->E * Ks[tm] * N, N, opt);
            s->mp.terms[tm] = (dl_gemm_term_t){s->lhs[tm], Ks[tm], s->rhs[tm],
                                               kind == P_GROUPED2 ? DL_RHS_NK : DL_RHS_KN};
            K += Ks[tm];
        }
        rows = Mtot;
        if (rows > 10) /* the tie's rows 1 and 9 lie in group 1: equal operands */
            for (int tm = 0; tm < s->mp.nterms; tm++)
                memcpy(s->lhs[tm] + 9 * Ks[tm], s->lhs[tm] + 1 * Ks[tm],
                       (size_t)Ks[tm] * sizeof(float));
    }
    s->ck.prof = dl_check_profile_find(v % 4 < 2 ? "bf16" : "fp32");
    s->ck.act = t;
    s->ck.lambda = 7.25;
    s->cand = alloc_f(rows * N);
    s->exact = alloc_f(rows * N);
    s->skip = calloc((size_t)rows, 1);
    s->fail = calloc((size_t)rows, 1);
    s->over = calloc((size_t)rows, sizeof *s->over);
    s->skip[rows / 2] = 1;
    s->cmp = (dl__cmp_t){.stage = DL_VALUE_H_GATE, .t = t, .rows = rows, .cols = N,
                         .cand = s->cand, .exact = s->exact, .row_skip = s->skip,
                         .row_K = s->row_K, .K = K, .kappa_in = v % 3 == 0, .short_sum = v % 5 == 0,
                         .mp = &s->mp, .row_fail = s->fail, .row_over = s->over};
    for (int q = 0; props && q < 3; q++) {
        s->prop[q] = calloc((size_t)(rows * N), sizeof(double));
        for (int64_t i = 0; i < rows * N; i++)
            s->prop[q][i] = dl_test_next(&r) % 3 ? 0.0 : ldexp(dl_test_unif(&r), -10 - q);
        s->cmp.prop[q] = s->prop[q];
    }
    for (int64_t q = 0; q < rows; q++)
        for (int64_t j = 0; j < N; j++)
            s->exact[q * N + j] = (float)dl_round(dot(s, q, j), t);
    for (int64_t q = 0; q < rows; q++)
        for (int64_t j = 0; j < N; j++)
            s->cand[q * N + j] = cand_of(s, &r, q, j, s->exact[q * N + j], nonfin);
    if (kind != P_RAGGED)
        make_tie(s, 1, 9);
}

static void destroy(syn_t *s)
{
    for (int i = 0; i < 2; i++)
        free(s->lhs[i]), free(s->rhs[i]);
    for (int i = 0; i < 3; i++)
        free(s->prop[i]);
    free(s->a), free(s->b), free(s->cand), free(s->exact), free(s->row_K);
    free(s->skip), free(s->fail), free(s->over);
    for (int i = 0; i < DL__CK_SCRATCH; i++)
        free(s->ck.scr[i]);
}

/* The comparison under mode m: the result and the per-row outputs. */
typedef struct {
    dl_check_result_t res;
    uint8_t *fail;
    int64_t *over;
} out_t;

static void run_mode(syn_t *s, int m, out_t *o)
{
    memset(&o->res, 0, sizeof o->res);
    memset(s->fail, 0, (size_t)s->cmp.rows);
    memset(s->over, 0, (size_t)s->cmp.rows * sizeof *s->over);
    dl__ck_m_mode = m;
    ck_assert_int_eq(dl__ck_compare(&s->ck, &s->cmp, &o->res), 0);
    dl__ck_m_mode = -1;
    o->fail = malloc((size_t)s->cmp.rows);
    o->over = malloc((size_t)s->cmp.rows * sizeof *o->over);
    memcpy(o->fail, s->fail, (size_t)s->cmp.rows);
    memcpy(o->over, s->over, (size_t)s->cmp.rows * sizeof *o->over);
}

/* 1 where every figure is bitwise the same. */
static int same(const syn_t *s, const out_t *x, const out_t *y)
{
    return !memcmp(&x->res, &y->res, sizeof x->res) &&
           !memcmp(x->fail, y->fail, (size_t)s->cmp.rows) &&
           !memcmp(x->over, y->over, (size_t)s->cmp.rows * sizeof *x->over);
}

static void show(const char *what, const out_t *o)
{
    const dl_check_result_t *r = &o->res;
    fprintf(stderr, "%s: over %lld/%lld/%lld nonfinite %lld err %.17g/%.17g/%.17g worst %lld ulp %.17g abs %.17g | %s\n",
            what, (long long)r->n_over_pass, (long long)r->n_over_warn, (long long)r->n_over_stat,
            (long long)r->n_nonfinite, r->err_pass, r->err_warn, r->err_stat,
            (long long)r->worst_index, r->max_ulp, r->max_abs, r->message);
}

static void free_out(out_t *o)
{
    free(o->fail), free(o->over);
}

/* The pruned comparison's figures equal the reference's bitwise, and the
 * pruning really ran (a bracket decided most differing elements). */
START_TEST(pruned_equals_exact)
{
    syn_t s;
    build(&s, _i);
    memset(&dl__ck_m_stats, 0, sizeof dl__ck_m_stats);
    out_t ref, pr;
    run_mode(&s, DL__CK_M_EXACT, &ref);
    ck_assert_int_eq(dl__ck_m_stats.blocks[MB_NORMS_T] + dl__ck_m_stats.blocks[MB_BULK_T], 0);
    run_mode(&s, DL__CK_M_PRUNED, &pr);
    if (!same(&s, &ref, &pr)) {
        show("exact ", &ref);
        show("pruned", &pr);
    }
    ck_assert_msg(same(&s, &ref, &pr), "variant %d: pruned figures differ from the exact M's", _i);
    ck_assert_int_gt(dl__ck_m_stats.blocks[MB_NORMS_T] + dl__ck_m_stats.blocks[MB_BULK_T], 0);
    ck_assert_int_lt(dl__ck_m_stats.exact, dl__ck_m_stats.diff);
    /* the adversarial mix reaches every figure: counts over each bound */
    if (!s.light)
        ck_assert_int_gt(ref.res.n_over_warn, 0);
    free_out(&ref), free_out(&pr);
    destroy(&s);
}
END_TEST

/* The same figures under DROPLESS_CHECK_M=exact (the switch the CLI and
 * the Python package see) as under the internal reference mode. */
START_TEST(env_switch)
{
    syn_t s;
    build(&s, 4);
    out_t ref, env;
    run_mode(&s, DL__CK_M_EXACT, &ref);
    setenv("DROPLESS_CHECK_M", "exact", 1);
    memset(&dl__ck_m_stats, 0, sizeof dl__ck_m_stats);
    run_mode(&s, -1, &env);
    unsetenv("DROPLESS_CHECK_M");
    ck_assert_int_eq(dl__ck_m_stats.blocks[MB_NORMS_T] + dl__ck_m_stats.blocks[MB_BULK_T], 0);
    ck_assert(same(&s, &ref, &env));
    free_out(&ref), free_out(&env);
    destroy(&s);
}
END_TEST

/* A tie between an element whose M is 0 (its rhs column all zero) and an
 * earlier one of the same row whose M is too small to move its bound: the
 * two ratios are bitwise equal, and the first index must stay the worst
 * on the pruned path too (an M = 0 element judged at once, ahead of the
 * row's waiting ones, took the tie: the review of 2026-12-02 d). */
START_TEST(tie_with_zero_m)
{
    syn_t s;
    build(&s, 39); /* grouped, one term (KN), bf16 output, few-ulp candidates */
    const int64_t N = s.cmp.cols, K = s.mp.terms[0].K, j1 = 60, j2 = 70;
    float *w = (float *)s.mp.terms[0].rhs; /* expert 0's [K, N] */
    for (int64_t k = 0; k < K; k++) {
        w[k * N + j1] = 0x1p-60f; /* M of row 0 at j1: about 2^-54, no weight in a bound near 2^-7 */
        w[k * N + j2] = 0.0f;
    }
    for (int64_t q = s.off[0]; q < s.off[1]; q++)
        for (int64_t j = j1; j <= j2; j += j2 - j1) /* the columns changed: candidates equal */
            s.cand[q * N + j] = s.exact[q * N + j] = (float)dl_round(dot(&s, q, j), s.cmp.t);
    /* every candidate exact but rows 0-2 of group 0, a few ulps off (enough
     * elements differ for the norms' bracket to be taken, none near the tie) */
    for (int64_t i = 0; i < s.cmp.rows * N; i++)
        s.cand[i] = i < 3 * N ? (float)dl_round(s.exact[i] * (1.0 + 0x1p-7), s.cmp.t) : s.exact[i];
    s.exact[j1] = s.exact[j2] = 1.0f; /* row 0: the same g, the same error, larger than any other */
    s.cand[j1] = s.cand[j2] = 1.5f;
    out_t ref, pr;
    run_mode(&s, DL__CK_M_EXACT, &ref);
    memset(&dl__ck_m_stats, 0, sizeof dl__ck_m_stats);
    run_mode(&s, DL__CK_M_PRUNED, &pr);
    ck_assert_int_gt(dl__ck_m_stats.blocks[MB_NORMS_T], 0);
    ck_assert_int_eq(ref.res.worst_index, j1);
    ck_assert_int_eq(pr.res.worst_index, j1);
    ck_assert(same(&s, &ref, &pr));
    free_out(&ref), free_out(&pr);
    destroy(&s);
}
END_TEST

/* The negative control: pruning with the upper end of M halved (MB_NORMS
 * and MB_BULK alike) changes some variant's figures, so the equality
 * above can fail. */
START_TEST(mutant_is_caught)
{
    int caught[3] = {0, 0, 0}; /* variants whose pruning took the norms only, bulk */
    for (int v = 0; v < 48; v++) {
        syn_t s;
        build(&s, v);
        out_t ref, mu;
        run_mode(&s, DL__CK_M_EXACT, &ref);
        memset(&dl__ck_m_stats, 0, sizeof dl__ck_m_stats);
        run_mode(&s, DL__CK_M_MUTANT, &mu);
        caught[dl__ck_m_stats.blocks[MB_BULK_T] ? 2 : 1] += !same(&s, &ref, &mu);
        free_out(&ref), free_out(&mu);
        destroy(&s);
    }
    ck_assert_int_gt(caught[1], 0);
    ck_assert_int_gt(caught[2], 0);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST_LOOP("pruned M", "equals exact M", pruned_equals_exact, 0, 48, 120),
        DL_TEST("pruned M", "equals exact M", env_switch, 60),
        DL_TEST("pruned M", "equals exact M", tie_with_zero_m, 60),
        DL_TEST("pruned M", "negative control", mutant_is_caught, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
