/* The FFN variants through the layer, the files and the runner: the
 * catalogue's variant cases (gpt-oss-like, swiglu-clamp-tight, geglu-tanh)
 * are conformant to themselves; candidates with the defects a real kernel
 * has (plain SwiGLU for gpt-oss's activation, no clamp in the gradient,
 * tanh-GeGLU evaluated as erf-less SwiGLU) FAIL on the value they break;
 * the bf16/fp16 router weight is stored, read back and validated on its
 * grid; the golden file carries the variant's attributes. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tap.h"
#include "mpref.h"
#include "dropless.h"
#include "check/check_priv.h"

typedef struct {
    dl_case_t k;
    dl_golden_inputs_t gi;
    dl_moe_inputs_t in;
    dl_moe_forward_t f;
    dl_moe_backward_t b;
} layer_t;

static void layer(layer_t *l, const char *name)
{
    memset(l, 0, sizeof *l);
    ck_assert_int_eq(dl_case_find(name, &l->k), 0);
    ck_assert_int_eq(dl_case_inputs(&l->k, &l->gi), 0);
    l->in = dl_golden_inputs_view(&l->gi);
    ck_assert_int_eq(dl_moe_forward(&l->k.config, &l->in, &l->f), 0);
    ck_assert_int_eq(dl_moe_backward(&l->k.config, &l->in, &l->f, &l->b), 0);
}

static void layer_free(layer_t *l)
{
    dl_moe_forward_free(&l->f);
    dl_moe_backward_free(&l->b);
    dl_golden_inputs_free(&l->gi);
}

/* Checks cand against the golden l with the fp32-exact default profile. */
static dl_check_report_t run(const layer_t *l, const dl_moe_forward_t *f,
                             const dl_moe_backward_t *b)
{
    dl_check_golden_t gold = {&l->k.config, &l->in, &l->f, &l->b, "unit"};
    dl_check_candidate_t cand = {.backend = "test", .fwd = *f, .bwd = *b};
    dl_check_report_t r;
    ck_assert_int_eq(dl_check_run(&gold, &cand, NULL, &r), 0);
    return r;
}

static dl_verdict_t verdict_of(const dl_check_report_t *r, dl_value_t s)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->results[i].stage == s && !strcmp(r->results[i].check, "numerics"))
            return r->results[i].verdict;
    return DL_VERDICT_SKIP;
}

static const char *const variant_cases[] = {"gpt-oss-like", "gpt-oss-like-bf16",
                                            "swiglu-clamp-tight-fp16", "geglu-tanh",
                                            "geglu-tanh-bf16"};

/* The golden handed back as the candidate: every value PASS. */
START_TEST(golden_is_conformant)
{
    layer_t l;
    layer(&l, variant_cases[_i]);
    dl_check_report_t r = run(&l, &l.f, &l.b);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_H_ACT), DL_VERDICT_PASS);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_D_H_GATE), DL_VERDICT_PASS);
    dl_check_report_free(&r);
    layer_free(&l);
}
END_TEST

/* A kernel that runs plain SwiGLU on a variant case: its h_act, d_h_gate and
 * d_h_up (each judged on the golden's own upstream) FAIL. */
START_TEST(plain_swiglu_fails)
{
    layer_t l;
    layer(&l, variant_cases[_i]);
    const int64_t n = dl_value_numel(&l.k.config, DL_VALUE_H_ACT);
    dl_moe_forward_t f = l.f;
    dl_moe_backward_t b = l.b;
    float *h = malloc(n * sizeof *h), *dg = malloc(n * sizeof *dg), *du = malloc(n * sizeof *du);
    const dl_dtype_t t = l.k.config.dtype;
    ck_assert_int_eq(dl_swiglu(l.f.h_gate, l.f.h_up, n, t, h), 0);
    ck_assert_int_eq(dl_swiglu_backward(l.f.h_gate, l.f.h_up, l.b.d_h_act, n, t, dg, du), 0);
    f.h_act = h;
    b.d_h_gate = dg;
    b.d_h_up = du;
    dl_check_report_t r = run(&l, &f, &b);
    ck_assert_int_eq(r.verdict, DL_VERDICT_FAIL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_H_ACT), DL_VERDICT_FAIL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_D_H_GATE), DL_VERDICT_FAIL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_D_H_UP), DL_VERDICT_FAIL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_H_GATE), DL_VERDICT_PASS); /* upstream untouched */
    dl_check_report_free(&r);
    free(h), free(dg), free(du);
    layer_free(&l);
}
END_TEST

/* A legitimate kernel: the activation and its VJP in fp32 arithmetic (libm
 * expf/tanhf, the model code's own formulas), rounded to the case's type:
 * not the exact values, within the derived bounds. */
static void float_act(const dl_moe_config_t *c, float g, float u, float dh, float out[3])
{
    if (c->ffn_kind == DL_FFN_SWIGLU_CLAMP) {
        const float L = (float)c->act_limit, a = (float)c->act_alpha;
        const float gc = fminf(g, L), uc = fmaxf(fminf(u, L), -L);
        const float s = 1.0f / (1.0f + expf(-a * gc));
        out[0] = (uc + 1.0f) * gc * s;
        out[1] = g <= L ? dh * (uc + 1.0f) * (s + a * gc * s * (1.0f - s)) : 0.0f;
        out[2] = fabsf(u) <= L ? dh * gc * s : 0.0f;
    } else {
        const float k = 0.7978845608f, b = 0.044715f;
        const float th = tanhf(k * (g + b * g * g * g));
        const float gl = 0.5f * g * (1.0f + th);
        const float d = 0.5f * (1.0f + th) + 0.5f * g * (1.0f - th * th) * k * (1.0f + 3.0f * b * g * g);
        out[0] = u * gl;
        out[1] = dh * u * d;
        out[2] = dh * gl;
    }
}

START_TEST(float_kernel_passes)
{
    layer_t l;
    layer(&l, variant_cases[_i]);
    const dl_moe_config_t *c = &l.k.config;
    const int64_t n = dl_value_numel(c, DL_VALUE_H_ACT);
    dl_moe_forward_t f = l.f;
    dl_moe_backward_t b = l.b;
    float *v[3];
    for (int j = 0; j < 3; j++)
        v[j] = malloc(n * sizeof *v[j]);
    for (int64_t i = 0; i < n; i++) {
        float o[3];
        float_act(c, l.f.h_gate[i], l.f.h_up[i], l.b.d_h_act[i], o);
        for (int j = 0; j < 3; j++)
            v[j][i] = (float)dl_round(o[j], c->dtype);
    }
    f.h_act = v[0];
    b.d_h_gate = v[1];
    b.d_h_up = v[2];
    dl_check_report_t r = run(&l, &f, &b);
    if (r.verdict != DL_VERDICT_PASS) {
        const dl_check_report_t *rp = &r;
        dl_check_write(stderr, DL_REPORT_TABLE, &rp, 1, 0);
    }
    /* fp32 arithmetic's 1 - s cancels where s is near 1: a WARN there at
     * most, never a FAIL (CONFORMANT) */
    ck_assert(dl_check_conformant(&r));
    ck_assert(r.verdict != DL_VERDICT_FAIL);
    dl_check_report_free(&r);
    for (int j = 0; j < 3; j++)
        free(v[j]);
    layer_free(&l);
}
END_TEST

/* gpt-oss's activation with the clamp's subgradient wrong: the gradient let
 * through past the limit (the unclamped branch's derivative at the clamped
 * point), for the gate (g > limit) and the up (|u| > limit) in turn; and
 * the gradient stopped at the limit itself (g == limit must pass). */
START_TEST(clamp_gradient_defects_fail)
{
    layer_t l;
    layer(&l, "swiglu-clamp-tight");
    const dl_moe_config_t *c = &l.k.config;
    const double L = c->act_limit;
    const int64_t n = dl_value_numel(c, DL_VALUE_H_ACT);
    float *g2 = malloc(n * sizeof *g2), *u2 = malloc(n * sizeof *u2), *bad = malloc(n * sizeof *bad);
    int64_t past_g = 0, past_u = 0;
    for (int64_t i = 0; i < n; i++) {
        g2[i] = l.f.h_gate[i] > L ? (float)L : l.f.h_gate[i];
        u2[i] = fabsf(l.f.h_up[i]) > L ? copysignf((float)L, l.f.h_up[i]) : l.f.h_up[i];
        past_g += l.f.h_gate[i] > L;
        past_u += fabsf(l.f.h_up[i]) > L;
    }
    ck_assert(past_g > n / 10 && past_u > n / 10); /* the case does exercise the clamp */
    for (int which = 0; which < 2; which++) {
        dl_moe_backward_t b = l.b;
        /* the inputs moved to the clamp: the branch's derivative is then let through */
        ck_assert_int_eq(dl_ffn_act_backward(c, which ? l.f.h_gate : g2, which ? u2 : l.f.h_up,
                                             l.b.d_h_act, n, which ? NULL : bad,
                                             which ? bad : NULL), 0);
        *(which ? &b.d_h_up : &b.d_h_gate) = bad;
        dl_check_report_t r = run(&l, &l.f, &b);
        ck_assert_int_eq(verdict_of(&r, which ? DL_VALUE_D_H_UP : DL_VALUE_D_H_GATE),
                         DL_VERDICT_FAIL);
        ck_assert_int_eq(verdict_of(&r, which ? DL_VALUE_D_H_GATE : DL_VALUE_D_H_UP),
                         DL_VERDICT_PASS);
        dl_check_report_free(&r);
    }
    free(g2), free(u2), free(bad);
    layer_free(&l);
}
END_TEST

/* At g == limit exactly PyTorch's clamp passes the gradient: a kernel that
 * stops it there (g >= limit as the cut) is wrong on those elements. */
START_TEST(clamp_at_limit_passes_gradient)
{
    dl_moe_config_t c = {.ffn_kind = DL_FFN_SWIGLU_CLAMP, .dtype = DL_BF16, .act_alpha = 1.702,
                         .act_limit = 7.0};
    const float g[2] = {7.0f, 7.0625f}, u[2] = {7.0f, -7.0625f}, dh[2] = {1.0f, 1.0f};
    float dg[2], du[2];
    ck_assert_int_eq(dl_ffn_act_backward(&c, g, u, dh, 2, dg, du), 0);
    ck_assert(dg[0] > 0 && du[0] > 0);
    ck_assert(dg[1] == 0 && du[1] == 0);
}
END_TEST

/* The biased projections and the bias gradients against MPFR: h_gate,
 * h_up, y_sorted = RN(the exact sum of the row's products and the bias),
 * d_b_* = RN_fp32(the exact column sums of each expert's rows). */
START_TEST(biases_vs_mpfr)
{
    layer_t l;
    layer(&l, _i ? "gpt-oss-like-bf16" : "gpt-oss-like");
    const dl_moe_config_t *c = &l.k.config;
    const int64_t d = c->hidden, f = c->ffn, E = c->route.experts;
    const int64_t *off = l.f.group_offsets;
    double a[64], b[64];
    ck_assert(c->ffn_bias && d < 63 && f < 63);
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = off[e]; r < off[e + 1]; r++) {
            for (int w = 0; w < 3; w++) { /* h_gate, h_up, y_sorted */
                const int64_t K = w < 2 ? d : f, N = w < 2 ? f : d;
                const float *lhs = w < 2 ? l.f.x_sorted + r * d : l.f.h_act + r * f;
                const float *W = w == 0 ? l.in.w_gate : w == 1 ? l.in.w_up : l.in.w_down;
                const float *bias = w == 0 ? l.in.b_gate : w == 1 ? l.in.b_up : l.in.b_down;
                const float *got = w == 0 ? l.f.h_gate : w == 1 ? l.f.h_up : l.f.y_sorted;
                for (int64_t j = 0; j < N; j++) {
                    for (int64_t q = 0; q < K; q++) {
                        a[q] = lhs[q];
                        b[q] = W[(e * K + q) * N + j];
                    }
                    a[K] = 1.0, b[K] = bias[e * N + j];
                    ck_assert(same_value(got[r * N + j], mpref_dot(a, b, (size_t)K + 1, c->dtype)));
                }
            }
        }
    for (int w = 0; w < 3; w++) {
        const int64_t N = w == 0 ? d : f;
        const float *g = w == 0 ? l.b.d_y_sorted : w == 1 ? l.b.d_h_gate : l.b.d_h_up;
        const float *got = w == 0 ? l.b.d_b_down : w == 1 ? l.b.d_b_gate : l.b.d_b_up;
        for (int64_t e = 0; e < E; e++)
            for (int64_t j = 0; j < N; j++) {
                double *ga = malloc((size_t)(off[e + 1] - off[e] + 1) * sizeof *ga);
                double *on = malloc((size_t)(off[e + 1] - off[e] + 1) * sizeof *on);
                for (int64_t r = off[e]; r < off[e + 1]; r++)
                    ga[r - off[e]] = g[r * N + j], on[r - off[e]] = 1.0;
                ck_assert(same_value(got[e * N + j],
                                     mpref_dot(on, ga, (size_t)(off[e + 1] - off[e]), DL_F32)));
                free(ga), free(on);
            }
    }
    layer_free(&l);
}
END_TEST

/* A kernel that drops the down projection's bias, and one whose bias
 * gradient sums the wrong rows (each expert's window one row late): FAIL
 * on that value; the golden's own values PASS (golden_is_conformant). */
START_TEST(bias_defects_fail)
{
    layer_t l;
    layer(&l, "gpt-oss-like-bf16");
    const dl_moe_config_t *c = &l.k.config;
    const int64_t d = c->hidden, f = c->ffn, E = c->route.experts, M = c->tokens * c->route.top_k;
    float *y = malloc((size_t)M * d * sizeof *y), *db = malloc((size_t)E * d * sizeof *db);
    dl_gemm_term_t t = {l.f.h_act, f, l.in.w_down, DL_RHS_KN};
    ck_assert_int_eq(dl_gemm_grouped(&t, 1, d, l.f.group_offsets, E, c->dtype, y, NULL), 0);
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = 0; j < d; j++) {
            double sum = 0;
            for (int64_t r = l.f.group_offsets[e] + 1; r <= l.f.group_offsets[e + 1] && r < M; r++)
                sum += l.b.d_y_sorted[r * d + j];
            db[e * d + j] = (float)sum;
        }
    dl_moe_forward_t fw = l.f;
    dl_moe_backward_t bw = l.b;
    fw.y_sorted = y;
    bw.d_b_down = db;
    dl_check_report_t r = run(&l, &fw, &bw);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_Y_SORTED), DL_VERDICT_FAIL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_D_B_DOWN), DL_VERDICT_FAIL);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_D_B_GATE), DL_VERDICT_PASS);
    dl_check_report_free(&r);
    free(y), free(db);
    layer_free(&l);
}
END_TEST

/* The router weight in bf16/fp16: on its grid, written with its dtype
 * attribute and read back; off-grid inputs refused; the config's
 * attributes survive the file. */
START_TEST(router_dtype_storage)
{
    const char *names[2] = {"gpt-oss-like-fp16", "geglu-tanh"};
    const dl_dtype_t want[2] = {DL_BF16, DL_F16};
    for (int i = 0; i < 2; i++) {
        layer_t l;
        layer(&l, names[i]);
        const dl_moe_config_t *c = &l.k.config;
        ck_assert_int_eq(c->router_dtype, want[i]);
        const int64_t nw = c->hidden * c->route.experts;
        for (int64_t j = 0; j < nw; j++)
            ck_assert(dl_on_grid(l.in.router_weight[j], want[i]));
        char path[64];
        snprintf(path, sizeof path, "/tmp/dl_ffn_check_%d_%d.h5", (int)getpid(), i);
        dl_golden_file_t gf, back;
        memset(&gf, 0, sizeof gf);
        dl_golden_gen_opts_t o = {0};
        char err[256] = "";
        int bwe = 0;
        ck_assert_int_eq(dl_golden_generate(&l.k, &o, &gf, &bwe, err, sizeof err), 0);
        ck_assert_int_eq(dl_golden_write(path, &gf, 1, NULL, NULL, err, sizeof err), 0);
        ck_assert_msg(dl_golden_load(path, &back, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(back.config.router_dtype, want[i]);
        ck_assert(back.config.act_alpha == c->act_alpha && back.config.act_limit == c->act_limit);
        ck_assert_int_eq(back.config.ffn_kind, c->ffn_kind);
        ck_assert(!memcmp(back.in.router_weight, l.in.router_weight, (size_t)nw * 4));
        dl_golden_free(&back);
        dl_golden_free(&gf);
        unlink(path);
        /* one value off the grid: the layer refuses the inputs */
        float keep = l.gi.router_weight[1];
        l.gi.router_weight[1] = nextafterf(keep, INFINITY);
        ck_assert_int_eq(dl_moe_inputs_validate(c, &l.in, 0), DL_EGRID);
        l.gi.router_weight[1] = keep;
        layer_free(&l);
    }
}
END_TEST

/* The case-file keys: the defaults of swiglu-clamp, the order rule, the
 * refusals, and the configuration string's extra keys. */
START_TEST(case_file_keys)
{
    char path[64], err[256];
    snprintf(path, sizeof path, "/tmp/dl_ffn_case_%d.txt", (int)getpid());
    struct { const char *text; int ok; double alpha, limit; dl_dtype_t rt; } rows[] = {
        {"tokens = 4\nhidden = 4\nexperts = 4\ntop_k = 2\nffn_kind = swiglu-clamp\n", 1, 1.702, 7, DL_F32},
        {"base = tiny\nffn_kind = swiglu-clamp\nact_limit = 2.5\nrouter_dtype = bf16\n", 1, 1.702, 2.5, DL_BF16},
        {"base = tiny\nact_limit = 2.5\nffn_kind = swiglu-clamp\n", 0, 0, 0, DL_F32},
        {"base = tiny\nact_alpha = 1\n", 0, 0, 0, DL_F32},
        {"base = tiny\nffn_kind = swiglu-clamp\nact_limit = -1\n", 0, 0, 0, DL_F32},
        {"base = tiny\nrouter_dtype = fp64\n", 0, 0, 0, DL_F32},
        {"base = gpt-oss-like\nffn_kind = geglu-tanh\n", 1, 0, 0, DL_BF16},
        {"base = tiny\nffn_bias = 1\n", 1, 0, 0, DL_F32},
        {"base = plain-ffn\nffn_bias = 1\n", 0, 0, 0, DL_F32},
        {"base = tiny\nffn_bias = 2\n", 0, 0, 0, DL_F32},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        FILE *fp = fopen(path, "w");
        fputs(rows[i].text, fp);
        fclose(fp);
        dl_case_t k;
        int rc = dl_case_parse_file(path, &k, err, sizeof err);
        ck_assert_msg((rc == 0) == rows[i].ok, "row %zu: rc %d (%s)", i, rc, err);
        if (!rows[i].ok) {
            ck_assert(strchr(err, '\n') == NULL && strlen(err) > 0);
            continue;
        }
        ck_assert(k.config.act_alpha == rows[i].alpha && k.config.act_limit == rows[i].limit);
        ck_assert_int_eq(k.config.router_dtype, rows[i].rt);
    }
    unlink(path);
    dl_case_t k;
    char buf[1024];
    ck_assert_int_eq(dl_case_find("gpt-oss-like", &k), 0);
    ck_assert_int_eq(dl_golden_config_string(&k.config, " ", buf, sizeof buf), 0);
    ck_assert_ptr_nonnull(strstr(buf, "ffn_kind = swiglu-clamp"));
    ck_assert_ptr_nonnull(strstr(buf, "act_alpha = 1.702"));
    ck_assert_ptr_nonnull(strstr(buf, "router_dtype = bf16"));
    ck_assert_ptr_nonnull(strstr(buf, "ffn_bias = 1"));
    ck_assert_int_eq(dl_case_find("tiny", &k), 0);
    ck_assert_int_eq(dl_golden_config_string(&k.config, " ", buf, sizeof buf), 0);
    ck_assert_ptr_null(strstr(buf, "act_alpha"));
    ck_assert_ptr_null(strstr(buf, "router_dtype"));
    ck_assert_ptr_null(strstr(buf, "ffn_bias"));
}
END_TEST

/* relu2 (nemotron-like, non-gated): the golden is its own conformant
 * candidate and has no gate values; a kernel computing relu(u)^2 and its
 * VJP in fp32 arithmetic, rounded to the type, is conformant; relu without
 * the square, the gradient without its factor 2, or a gradient let through
 * where u < 0 FAIL the value they break (each on the golden's upstream). */
static dl_check_report_t relu2_with(const layer_t *l, int defect, float *h, float *du)
{
    const int64_t n = dl_value_numel(&l->k.config, DL_VALUE_H_ACT);
    const float *u = l->f.h_up, *dh = l->b.d_h_act;
    for (int64_t i = 0; i < n; i++) {
        const float r = u[i] > 0 ? u[i] : 0.0f;
        h[i] = (float)dl_round(defect == 1 ? r : r * r, l->k.config.dtype);
        du[i] = (float)dl_round(defect == 2 ? dh[i] * r : defect == 3 ? 2.0f * dh[i] * u[i]
                                                                       : 2.0f * dh[i] * r,
                                l->k.config.dtype);
    }
    dl_moe_forward_t f = l->f;
    dl_moe_backward_t b = l->b;
    f.h_act = h;
    b.d_h_up = du;
    return run(l, &f, &b);
}

START_TEST(relu2_both_ways)
{
    layer_t l;
    layer(&l, _i ? "nemotron-like-bf16" : "nemotron-like");
    ck_assert(!l.f.h_gate && !l.b.d_h_gate && !l.b.d_w_gate && !l.gi.w_gate && l.gi.w_up);
    dl_check_report_t r = run(&l, &l.f, &l.b);
    ck_assert_int_eq(r.verdict, DL_VERDICT_PASS);
    ck_assert_int_eq(verdict_of(&r, DL_VALUE_D_X_SORTED), DL_VERDICT_PASS);
    dl_check_report_free(&r);
    const int64_t n = dl_value_numel(&l.k.config, DL_VALUE_H_ACT);
    float *h = malloc(n * sizeof *h), *du = malloc(n * sizeof *du);
    static const dl_value_t broken[4] = {DL_VALUE_NONE, DL_VALUE_H_ACT, DL_VALUE_D_H_UP,
                                         DL_VALUE_D_H_UP};
    for (int defect = 0; defect < 4; defect++) {
        r = relu2_with(&l, defect, h, du);
        ck_assert_msg(r.verdict == (defect ? DL_VERDICT_FAIL : DL_VERDICT_PASS), "defect %d", defect);
        if (defect)
            ck_assert_int_eq(verdict_of(&r, broken[defect]), DL_VERDICT_FAIL);
        ck_assert_int_eq(verdict_of(&r, DL_VALUE_H_UP), DL_VERDICT_PASS); /* upstream untouched */
        dl_check_report_free(&r);
    }
    free(h), free(du);
    layer_free(&l);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST_LOOP("ffn_check", "conformant", golden_is_conformant, 0, 5, 120),
        DL_TEST_LOOP("ffn_check", "legitimate", float_kernel_passes, 0, 5, 120),
        DL_TEST_LOOP("ffn_check", "defects", plain_swiglu_fails, 0, 5, 120),
        DL_TEST("ffn_check", "defects", clamp_gradient_defects_fail, 120),
        DL_TEST("ffn_check", "clamp", clamp_at_limit_passes_gradient, 30),
        DL_TEST("ffn_check", "router_dtype", router_dtype_storage, 120),
        DL_TEST_LOOP("ffn_check", "biases", biases_vs_mpfr, 0, 2, 120),
        DL_TEST("ffn_check", "biases", bias_defects_fail, 60),
        DL_TEST("ffn_check", "case_file", case_file_keys, 60),
        DL_TEST_LOOP("ffn_check", "relu2", relu2_both_ways, 0, 2, 120),
    };
    return dl_test_main(tests, (int)(sizeof tests / sizeof tests[0]));
}
