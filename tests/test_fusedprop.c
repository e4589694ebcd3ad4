/* The fused checks' bounds (issue 31 item 1): the absent stages' M and
 * every tier's propagation in binary32 (dl__ck_m_up) and the statistical
 * tier's root sum of squares rounded up (dl__ck_hypot_up) are upper
 * bounds of the exact values (MPFR, on random and adversarial operands),
 * and the reports of fused candidates keep their verdicts, with bounds
 * that dominate the binary64 path's (dl__ck_f64_bounds) by at most the
 * inflation. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "mpref.h"
#include "check/check_priv.h"

/* ------------------------------------------- M in binary32 against MPFR */

enum { V_NORMAL, V_WIDE, V_ROUNDS_DOWN, V_SUBNORMAL, V_HUGE, V_ZEROS, V_UNDERFLOW, V_KINDS };

/* One operand element of kind v (i: its index in its array, lhs: 1 for
 * the left operand). V_ROUNDS_DOWN: every product after the first of a
 * dot is 1 + just under half an ulp below the running sum (fp32 loses
 * each one); V_SUBNORMAL: products that underflow in binary32 (the
 * absolute term covers them); V_HUGE: products that overflow it (the
 * binary64 path must be taken); V_UNDERFLOW: every product of every dot
 * just under 2^-150, so binary32 rounds each to 0 and the sum is 0: only
 * the absolute term keeps the result above the exact sum (V_SUBNORMAL's
 * tiny products sit beside normal ones, which the relative part covers). */
static float elem(dl_test_rng_t *r, int v, int64_t i, int lhs)
{
    const double z = dl_test_normal(r);
    switch (v) {
    case V_WIDE:
        return (float)ldexp(z, (int)(dl_test_next(r) % 61) - 30);
    case V_ROUNDS_DOWN:
        return lhs ? 1.0f : i == 0 ? 1.0f : (float)(0x1p-25 * (1.0 - 0x1p-12));
    case V_SUBNORMAL:
        return i % 5 == 0 ? 0x1p-140f : (float)z;
    case V_HUGE:
        return i % 7 == 0 ? 1e30f : (float)z;
    case V_ZEROS:
        return i % 3 ? 0.0f : (float)z;
    case V_UNDERFLOW: /* 2^-75 times 2^-75 (1 - a little): below the midpoint 2^-150 */
        return lhs ? 0x1p-75f : (float)(0x1p-75 * (1.0 - (double)(1 + dl_test_next(r) % 255) * 0x1p-20));
    default:
        return (float)z;
    }
}

/* The exact dot of element (row, col) of provider mp (x: a delta in place
 * of the lhs; sq: squares of both), in MPFR: the true operands, not the
 * rounded-up ones the code multiplies. */
static void exact_m(const dl__mprov_t *mp, const dl__ck_mop_t *x, int64_t row, int64_t col,
                    mpfr_t acc)
{
    mpfr_t p;
    mpfr_init2(p, 2 * 53 * 2 + 8);
    mpfr_set_zero(acc, 1);
    int64_t e = 0;
    while (e + 1 < mp->E && mp->off[e + 1] <= row)
        e++;
    for (int t = 0; t < mp->nterms; t++) {
        const dl_gemm_term_t *tm = &mp->terms[t];
        for (int64_t k = 0; k < tm->K; k++) {
            const double a = x ? x->delta[row * tm->K + k] : fabs((double)tm->lhs[row * tm->K + k]);
            const float *w = tm->rhs + e * tm->K * mp->N;
            const double b =
                fabs((double)(tm->layout == DL_RHS_KN ? w[k * mp->N + col] : w[col * tm->K + k]));
            mpfr_set_d(p, a, MPFR_RNDN);
            mpfr_mul_d(p, p, b, MPFR_RNDN); /* exact: 106 bits */
            if (x && x->sq)
                mpfr_sqr(p, p, MPFR_RNDN); /* exact: 212 bits */
            mpfr_add(acc, acc, p, MPFR_RNDN);
        }
    }
    mpfr_clear(p);
}

/* Configuration i: value kind, terms, layouts, sizes, delta or not. */
START_TEST(m_up_mpfr)
{
    const int v = _i % V_KINDS, withx = (_i / V_KINDS) % 3; /* 0: M, 1: delta, 2: delta^2 */
    dl_test_rng_t r = {1000 + (uint64_t)_i};
    const int nterms = 1 + (int)(dl_test_next(&r) % 2);
    const int64_t E = 4, N = 3 + (int64_t)(dl_test_next(&r) % 20);
    const int64_t K0 = v == V_ROUNDS_DOWN ? 3000 : 1 + (int64_t)(dl_test_next(&r) % 200);
    int64_t off[5] = {0};
    const int64_t sizes[4] = {(int64_t)(dl_test_next(&r) % 9), 0, 1, 3 + (int64_t)(dl_test_next(&r) % 30)};
    for (int e = 0; e < E; e++)
        off[e + 1] = off[e] + sizes[e];
    const int64_t rows = off[E];
    dl__mprov_t mp = {.kind = DL__M_GROUPED, .nterms = withx ? 1 : nterms, .N = N, .off = off, .E = E};
    float *store[4] = {0};
    for (int t = 0; t < mp.nterms; t++) {
        const int64_t K = K0 + t;
        float *a = malloc((size_t)(rows * K + 1) * sizeof *a), *b = malloc((size_t)(E * K * N) * sizeof *b);
        for (int64_t i = 0; i < rows * K; i++)
            a[i] = elem(&r, v, i % K, 1);
        const int layout = (int)(dl_test_next(&r) % 2) ? DL_RHS_KN : DL_RHS_NK;
        for (int64_t i = 0; i < E * K * N; i++) /* the k index of element i */
            b[i] = elem(&r, v, layout == DL_RHS_KN ? (i / N) % K : i % K, 0);
        mp.terms[t] = (dl_gemm_term_t){a, K, b, layout};
        store[2 * t] = a, store[2 * t + 1] = b;
    }
    float *delta = NULL;
    dl__ck_mop_t xo = {0}, *x = NULL;
    if (withx) {
        delta = malloc((size_t)(rows * K0 + 1) * sizeof *delta);
        for (int64_t i = 0; i < rows * K0; i++) /* stored as the runner does: rounded up */
            delta[i] = dl__ck_up32f(fabs((double)mp.terms[0].lhs[i]) * (1.0 + 0x1p-30));
        xo = (dl__ck_mop_t){.delta = delta, .which = 0, .sq = withx == 2};
        x = &xo;
    }
    const int64_t n = rows * N;
    double *up = malloc((size_t)(n + 1) * sizeof *up), *old = malloc((size_t)(n + 1) * sizeof *old);
    dl__ck_t ck;
    memset(&ck, 0, sizeof ck);
    ck_assert_int_eq(dl__ck_m_up(&ck, &mp, rows, x, up), 0);
    ck_assert_int_eq(dl__ck_m_bulk(&ck, &mp, rows, x, old), 0);
    int64_t Kt = 0;
    for (int t = 0; t < mp.nterms; t++)
        Kt += mp.terms[t].K;
    const double infl = 1.0 + 2.0 * (double)(Kt + 4) * 0x1p-24;
    mpfr_t ex;
    mpfr_init2(ex, MPREF_EXACT_PREC);
    double worst = 1.0;
    for (int64_t q = 0; q < rows; q++)
        for (int64_t c = 0; c < N; c++) {
            const double u = up[q * N + c], o = old[q * N + c];
            exact_m(&mp, x, q, c, ex);
            const int f64 = v == V_HUGE; /* binary32 overflows: the binary64 path of before */
            ck_assert_msg(f64 || mpfr_cmp_d(ex, u) <= 0, "kind %d x %d: element (%lld, %lld) %.17g below the exact %.17g",
                          v, withx, (long long)q, (long long)c, u, mpfr_get_d(ex, MPFR_RNDN));
            ck_assert_msg(u >= o, "below the binary64 path: %.17g < %.17g", u, o);
            if (f64)
                ck_assert_msg(u == o, "kind %d: %.17g, binary64 %.17g", v, u, o);
            if (o > 0x1p-100) /* (below, the absolute term for underflow) */
                worst = fmax(worst, u / o);
        }
    /* not a loose bound: the inflation and binary32's own roundings up at
     * most (the operands are the binary64 path's) */
    ck_assert_msg(worst <= infl * (1.0 + (double)(Kt + 4) * 0x1p-24), "ratio %.9g over %.9g", worst,
                  infl);
    if (v == V_ROUNDS_DOWN && !withx) /* fp32 lost the small products: the inflation covers */
        ck_assert_msg(worst > 1.0 + 0x1p-20, "ratio %.9g", worst);
    mpfr_clear(ex);
    for (int i = 0; i < 4; i++)
        free(store[i]);
    for (int i = 0; i < DL__CK_SCRATCH; i++)
        free(ck.scr[i]);
    free(delta);
    free(up);
    free(old);
}
END_TEST

/* The ragged provider (weight gradients) keeps the binary64 path: bitwise
 * dl__ck_m_bulk. */
START_TEST(m_up_ragged_is_bulk)
{
    dl_test_rng_t r = {77};
    const int64_t E = 3, I = 5, J = 7, off[4] = {0, 4, 4, 13};
    float a[13 * 5], b[13 * 7];
    for (int i = 0; i < 13 * 5; i++)
        a[i] = (float)dl_test_normal(&r);
    for (int i = 0; i < 13 * 7; i++)
        b[i] = (float)dl_test_normal(&r);
    dl__mprov_t mp = {.kind = DL__M_RAGGED, .a = a, .I = I, .b = b, .N = J, .off = off, .E = E};
    double up[3 * 5 * 7], old[3 * 5 * 7];
    dl__ck_t ck;
    memset(&ck, 0, sizeof ck);
    ck_assert_int_eq(dl__ck_m_up(&ck, &mp, E * I, NULL, up), 0);
    ck_assert_int_eq(dl__ck_m_bulk(&ck, &mp, E * I, NULL, old), 0);
    ck_assert(!memcmp(up, old, sizeof up));
    for (int i = 0; i < DL__CK_SCRATCH; i++)
        free(ck.scr[i]);
}
END_TEST

/* ------------------------------------- the root sum of squares, rounded up */

START_TEST(hypot_up_mpfr)
{
    dl_test_rng_t r = {4242};
    mpfr_t s, h;
    mpfr_init2(s, 2200);
    mpfr_init2(h, 2200);
    const double fixed[][2] = {{0, 0}, {1, 0}, {0, 3}, {3, 4}, {1, 1}, {0x1p-1074, 0x1p-1074},
                               {0x1p1000, 0x1p1000}, {0x1p-451, 1}, {0x1p450, 0x1p-450},
                               {1e300, 1e-300}, {0x1.fffffffffffffp1023, 1}};
    const int nfix = (int)(sizeof fixed / sizeof fixed[0]);
    for (int i = 0; i < 20000 + nfix; i++) {
        double a, b;
        if (i < nfix) {
            a = fixed[i][0], b = fixed[i][1];
        } else {
            const int span = i % 3 == 0 ? 2000 : i % 3 == 1 ? 120 : 8; /* range, then near-equal */
            a = ldexp(fabs(dl_test_normal(&r)) + 0.5, (int)(dl_test_next(&r) % span) - span / 2);
            b = ldexp(fabs(dl_test_normal(&r)) + 0.5, (int)(dl_test_next(&r) % span) - span / 2);
        }
        const double y = dl__ck_hypot_up(a, b);
        /* y^2 >= a^2 + b^2, exactly (2200 bits hold every square and sum) */
        mpfr_set_d(s, a, MPFR_RNDN);
        mpfr_sqr(s, s, MPFR_RNDN);
        mpfr_set_d(h, b, MPFR_RNDN);
        mpfr_sqr(h, h, MPFR_RNDN);
        mpfr_add(s, s, h, MPFR_RNDN);
        mpfr_set_d(h, y, MPFR_RNDN);
        mpfr_sqr(h, h, MPFR_RNDN);
        ck_assert_msg(isinf(y) || mpfr_cmp(h, s) >= 0, "hypot_up(%a, %a) = %a below the root", a, b, y);
        /* and not loose: within 2^-48 of the nearest root */
        const double hy = hypot(a, b);
        ck_assert_msg(y >= hy && (isinf(hy) || y <= nextafter(hy * (1.0 + 0x1p-48), INFINITY)),
                      "%a %a: %a vs hypot %a", a,
                      b, y, hy);
    }
    mpfr_clear(s);
    mpfr_clear(h);
}
END_TEST

/* --------------------------------------- fused candidates, both paths */

/* v a few steps of its storage type up (a defective candidate with steps
 * large, a correct-looking one with one step). */
static float step_up(float v, dl_dtype_t t, int steps)
{
    for (int q = 0; q < steps; q++) {
        double step = fmax(fabs((double)v) * 0x1p-24, 0x1p-149);
        for (int i = 0; i < 64; i++, step *= 2) {
            float w = (float)dl_round((double)v + (v < 0 ? -step : step), t);
            if (w != v && isfinite(w)) {
                v = w;
                break;
            }
        }
    }
    return v;
}

typedef struct {
    const char *name;
    int with_dw; /* also d_w_down: a ragged provider propagating h_act's delta */
} fcase_t;

static const fcase_t fcases[] = {
    {"mixtral-small", 0},      {"mixtral-small-bf16", 0}, {"mixtral-small-fp16", 1},
    {"grouped-max-bf16", 0},   {"deepseek-v3-shared-bf16", 0}, {"longcat-like-bf16", 0},
    {"empty-experts-fp16", 1}, {"gpt-oss-like-bf16", 0},
};

/* The report of the fused candidate (out, d_x and, with_dw, d_w_down, each
 * every 5th element `steps` steps up) under the binary64 bounds (f64) or
 * binary32 ones; false_alarm as the option. */
static dl_check_report_t fused_report(dl_golden_file_t *gf, const fcase_t *fc, int steps, int f64,
                                      double false_alarm, float **copies)
{
    dl_golden_file_t v = *gf;
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        dl_value_t s;
        if (ds->group == DL_GOLDEN_INPUTS || dl_value_parse(ds->name, &s) != 0)
            continue;
        void **slot = dl_golden_slot(&v, ds);
        if (!*slot || !(s == DL_VALUE_OUT || s == DL_VALUE_D_X ||
                        (fc->with_dw && s == DL_VALUE_D_W_DOWN))) {
            *slot = NULL;
            continue;
        }
        const int64_t n = dl_value_numel(&gf->config, s);
        if (!copies[s]) {
            copies[s] = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
            const float *src = *slot;
            for (int64_t j = 0; j < n; j++)
                copies[s][j] = j % 5 == 0 && src[j] != 0
                                   ? step_up(src[j], dl_value_dtype(&gf->config, s), steps)
                                   : src[j];
        }
        *slot = copies[s];
    }
    dl_check_candidate_t cand = {.fwd = v.fwd, .bwd = v.bwd};
    dl_moe_inputs_t in = dl_golden_inputs_view(&gf->in);
    dl_check_golden_t g = {&gf->config, &in, &gf->fwd, &gf->bwd, fc->name};
    dl_check_options_t o;
    dl_check_options_default(&o);
    o.false_alarm = false_alarm;
    dl__ck_f64_bounds = f64;
    dl_check_report_t r;
    ck_assert_int_eq(dl_check_run(&g, &cand, &o, &r), 0);
    dl__ck_f64_bounds = 0;
    return r;
}

/* ratio figure a (binary32 bounds) against b (binary64): never above it
 * (larger bounds) where up is set (a numerics figure: error over bound),
 * and within 2^-10 of it (the inflation is small) */
static void dominated(const char *what, int up, double a, double b, double *worst)
{
    if (!(isfinite(a) && isfinite(b)) || b == 0.0) {
        ck_assert_msg(a == b || (isnan(a) && isnan(b)), "%s: %g vs %g", what, a, b);
        return;
    }
    ck_assert_msg((!up || a <= b * (1.0 + 0x1p-40)) && fabs(a - b) <= b * 0x1p-10,
                  "%s: %.17g vs %.17g", what, a, b);
    *worst = fmax(*worst, fabs(1.0 - a / b));
}

START_TEST(fused_verdicts_unchanged)
{
    const fcase_t *fc = &fcases[_i / 4];
    const int steps = _i % 2 ? 400 : 1;
    const double fa = (_i / 2) % 2 ? -1.0 : 0.0; /* the statistical tier off / on */
    dl_case_t c;
    ck_assert_int_eq(dl_case_find(fc->name, &c), 0);
    dl_golden_gen_opts_t go = {0};
    dl_golden_file_t gf;
    char err[256] = "";
    int bwd_err = 0;
    ck_assert_int_eq(dl_golden_generate(&c, &go, &gf, &bwd_err, err, sizeof err), 0);
    float *copies[DL_VALUE_COUNT] = {0};
    dl_check_report_t a = fused_report(&gf, fc, steps, 0, fa, copies);
    dl_check_report_t b = fused_report(&gf, fc, steps, 1, fa, copies);
    ck_assert_int_eq(a.verdict, b.verdict);
    ck_assert_int_eq((long long)a.n, (long long)b.n);
    double worst = 0.0;
    int nprop = 0;
    for (int i = 0; i < (int)a.n; i++) {
        const dl_check_result_t *x = &a.results[i], *y = &b.results[i];
        ck_assert_int_eq(x->stage, y->stage);
        ck_assert_str_eq(x->check, y->check);
        ck_assert_msg(x->verdict == y->verdict, "%s %s: %s vs %s", dl_value_name(x->stage), x->check,
                      x->message, y->message);
        ck_assert_int_eq(x->n_over_warn, y->n_over_warn);
        nprop += strstr(x->message, "propagated") != NULL;
        char what[96];
        const int num = !strcmp(x->check, "numerics");
        snprintf(what, sizeof what, "%s %s err_pass", dl_value_name(x->stage), x->check);
        dominated(what, num, x->err_pass, y->err_pass, &worst);
        snprintf(what, sizeof what, "%s %s err_warn", dl_value_name(x->stage), x->check);
        dominated(what, num, x->err_warn, y->err_warn, &worst);
        snprintf(what, sizeof what, "%s %s err_stat", dl_value_name(x->stage), x->check);
        dominated(what, num, x->err_stat, y->err_stat, &worst);
    }
    ck_assert_int_ge(nprop, 2); /* out and d_x carried propagated error */
    fprintf(stderr, "# %s steps %d false_alarm %g: %s, largest relative change of a figure %.3g\n",
            fc->name, steps, fa, dl_verdict_name(a.verdict), worst);
    if (steps > 1) /* a defective fused candidate still fails */
        ck_assert_int_eq(a.verdict, DL_VERDICT_FAIL);
    dl_check_report_free(&a);
    dl_check_report_free(&b);
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        free(copies[s]);
    dl_golden_free(&gf);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST_LOOP("fused bounds", "binary32 M against MPFR", m_up_mpfr, 0, 3 * V_KINDS * 2, 120),
        DL_TEST("fused bounds", "binary32 M against MPFR", m_up_ragged_is_bulk, 60),
        DL_TEST("fused bounds", "root sum of squares", hypot_up_mpfr, 60),
        DL_TEST_LOOP("fused bounds", "fused candidates", fused_verdicts_unchanged, 0,
                     4 * (int)(sizeof fcases / sizeof fcases[0]), 300),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
