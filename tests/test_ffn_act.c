/* The FFN variants' activations (gpt-oss's clamped SwiGLU, GeGLU-tanh)
 * forward and backward against GNU MPFR: every output bit-exact on random,
 * boundary (at the clamps, at zero, huge gates) and wide-range inputs, for
 * fp32, bf16 and fp16. The references use other formulas than the library
 * (GeGLU through tanh, not the logistic; the derivatives as sums, not the
 * library's factored products) at a precision far past what the inputs
 * need, checked again at three times that. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "mpref.h"
#include "dropless.h"
#include "stages/stages_priv.h"

static const dl_dtype_t act_types[] = {DL_F32, DL_BF16, DL_F16};
enum { H, DG, DU };

/* the gpt-oss parameters; the cases carry them as binary64 values */
#define ALPHA 1.702
#define LIMIT 7.0

typedef struct {
    dl_ffn_t kind;
    int which;
    double g, u, dh;
} ref_t;

/* gpt-oss: (uc + 1) gc S(alpha gc); d_g = dh (uc + 1) (S + alpha gc S (1 - S))
 * where g <= limit, else 0; d_u = dh gc S where |u| <= limit, else 0 */
static void ref_oai(mpfr_t r, const ref_t *a)
{
    mpfr_prec_t p = mpfr_get_prec(r);
    mpfr_t s, x, v;
    mpfr_inits2(p, s, x, v, (mpfr_ptr)0);
    double gc = fmin(a->g, LIMIT), uc = fmax(fmin(a->u, LIMIT), -LIMIT);
    mpfr_set_d(x, ALPHA, MPFR_RNDN);
    mpfr_mul_d(x, x, gc, MPFR_RNDN);
    if (mpfr_cmp_si(x, -2000) < 0) /* a value far below every type's zero either way */
        mpfr_set_si(x, -2000, MPFR_RNDN);
    mpfr_neg(s, x, MPFR_RNDN);
    mpfr_exp(s, s, MPFR_RNDN);
    mpfr_add_ui(s, s, 1, MPFR_RNDN);
    mpfr_ui_div(s, 1, s, MPFR_RNDN); /* S */
    mpfr_set_d(v, uc, MPFR_RNDN);
    mpfr_add_ui(v, v, 1, MPFR_RNDN);
    if (a->which == H) {
        mpfr_mul(r, v, s, MPFR_RNDN);
        mpfr_mul_d(r, r, gc, MPFR_RNDN);
    } else if (a->which == DU) {
        mpfr_mul_d(r, s, gc * (fabs(a->u) <= LIMIT), MPFR_RNDN);
        mpfr_mul_d(r, r, a->dh, MPFR_RNDN);
    } else {
        mpfr_ui_sub(r, 1, s, MPFR_RNDN);
        mpfr_mul(r, r, s, MPFR_RNDN);
        mpfr_mul(r, r, x, MPFR_RNDN);
        mpfr_add(r, r, s, MPFR_RNDN);
        mpfr_mul(r, r, v, MPFR_RNDN);
        mpfr_mul_d(r, r, a->dh * (a->g <= LIMIT), MPFR_RNDN);
    }
    mpfr_clears(s, x, v, (mpfr_ptr)0);
}

/* GeGLU-tanh: th = tanh(c (g + b g^3)), gelu = g (1 + th) / 2, gelu' =
 * (1 + th) / 2 + g (1 - th^2) c (1 + 3 b g^2) / 2 */
static void ref_gelu(mpfr_t r, const ref_t *a)
{
    mpfr_prec_t p = mpfr_get_prec(r);
    mpfr_t c, b, y, th, t;
    mpfr_inits2(p, c, b, y, th, t, (mpfr_ptr)0);
    mpfr_const_pi(c, MPFR_RNDN);
    mpfr_ui_div(c, 2, c, MPFR_RNDN);
    mpfr_sqrt(c, c, MPFR_RNDN);
    mpfr_set_ui(b, 44715, MPFR_RNDN);
    mpfr_div_ui(b, b, 1000000, MPFR_RNDN);
    mpfr_set_d(y, a->g, MPFR_RNDN);
    mpfr_pow_ui(y, y, 3, MPFR_RNDN);
    mpfr_mul(y, y, b, MPFR_RNDN);
    mpfr_add_d(y, y, a->g, MPFR_RNDN);
    mpfr_mul(y, y, c, MPFR_RNDN);
    /* past |y| = 2000 the value moves by a relative e^-4000 toward its
     * limit, across no rounding boundary (test_activation.c's argument) */
    if (mpfr_cmpabs_ui(y, 2000) > 0)
        mpfr_set_si(y, mpfr_sgn(y) * 2000, MPFR_RNDN);
    mpfr_tanh(th, y, MPFR_RNDN);
    mpfr_add_ui(t, th, 1, MPFR_RNDN); /* 1 + th */
    if (a->which != DG) {
        mpfr_mul_d(r, t, a->g, MPFR_RNDN);
        mpfr_mul_d(r, r, a->which == H ? a->u : a->dh, MPFR_RNDN);
    } else {
        mpfr_sqr(y, th, MPFR_RNDN);
        mpfr_ui_sub(y, 1, y, MPFR_RNDN); /* 1 - th^2 */
        mpfr_mul(y, y, c, MPFR_RNDN);
        mpfr_set_d(th, a->g, MPFR_RNDN);
        mpfr_sqr(th, th, MPFR_RNDN);
        mpfr_mul(th, th, b, MPFR_RNDN);
        mpfr_mul_ui(th, th, 3, MPFR_RNDN);
        mpfr_add_ui(th, th, 1, MPFR_RNDN);
        mpfr_mul(y, y, th, MPFR_RNDN);
        mpfr_mul_d(y, y, a->g, MPFR_RNDN);
        mpfr_add(r, t, y, MPFR_RNDN);
        mpfr_mul_d(r, r, a->u, MPFR_RNDN);
        mpfr_mul_d(r, r, a->dh, MPFR_RNDN);
    }
    mpfr_div_2ui(r, r, 1, MPFR_RNDN);
    mpfr_clears(c, b, y, th, t, (mpfr_ptr)0);
}

/* 1 - th^2 ~ 4 e^-2|y| and 1 - S ~ e^-|x| must survive: 3 bits per unit of
 * the argument, plus the 24-bit inputs' products */
static double ref(const ref_t *a, dl_dtype_t t)
{
    const double g = a->g;
    const double arg = a->kind == DL_FFN_GEGLU_TANH ? 0.8 * fabs(g) * (1 + 0.045 * g * g)
                                                    : ALPHA * fabs(fmin(g, LIMIT));
    mpfr_prec_t p0 = 400 + (mpfr_prec_t)(3.2 * fmin(arg, 2000));
    double prev = NAN;
    for (int i = 0; i < 2; i++) {
        mpfr_t r;
        mpfr_init2(r, i ? 3 * p0 : p0);
        (a->kind == DL_FFN_GEGLU_TANH ? ref_gelu : ref_oai)(r, a);
        double v = mpref_round(r, t);
        if (mpfr_zero_p(r))
            v = 0.0; /* an exact zero is +0 */
        mpfr_clear(r);
        if (i > 0)
            ck_assert_msg(same_value(v, prev), "reference undecided at %a", g);
        prev = v;
    }
    return prev;
}

static dl_moe_config_t cfg(dl_ffn_t kind, dl_dtype_t t)
{
    dl_moe_config_t c = {.ffn_kind = kind, .dtype = t};
    if (kind == DL_FFN_SWIGLU_CLAMP) {
        c.act_alpha = ALPHA;
        c.act_limit = LIMIT;
    }
    return c;
}

/* Runs the stage on n elements and compares every output with MPFR. */
static void check_batch(dl_ffn_t kind, const float *g, const float *u, const float *dh, int n,
                        dl_dtype_t t)
{
    dl_moe_config_t c = cfg(kind, t);
    float *h = malloc(n * sizeof *h), *dg = malloc(n * sizeof *dg), *du = malloc(n * sizeof *du);
    ck_assert_int_eq(dl_ffn_act(&c, g, u, n, h), 0);
    ck_assert_int_eq(dl_ffn_act_backward(&c, g, u, dh, n, dg, du), 0);
    for (int i = 0; i < n; i++) {
        const float *got[3] = {h, dg, du};
        for (int w = 0; w < 3; w++) {
            ref_t a = {kind, w, g[i], u[i], dh[i]};
            double want = ref(&a, t);
            ck_assert_msg(same_value(got[w][i], want),
                          "%s %s which %d: g %a u %a dh %a: got %a want %a",
                          kind == DL_FFN_GEGLU_TANH ? "geglu" : "oai", dl_dtype_name(t), w, g[i],
                          u[i], dh[i], got[w][i], want);
        }
    }
    free(h);
    free(dg);
    free(du);
}

static float on_grid(double x, dl_dtype_t t)
{
    return (float)mpref_round_d(x, t);
}

static double wide(dl_test_rng_t *r, int emin, int emax)
{
    double x = ldexp(1.0 + dl_test_unif(r), emin + (int)(dl_test_next(r) % (uint64_t)(emax - emin + 1)));
    return (dl_test_next(r) & 1) ? -x : x;
}

static double random_gate(dl_test_rng_t *r, dl_ffn_t kind)
{
    switch (dl_test_next(r) % 8) {
    case 0: return wide(r, -30, 4);
    case 1: return kind == DL_FFN_GEGLU_TANH ? wide(r, 3, 5) : wide(r, 3, 40); /* far tails */
    case 2: return 5 * dl_test_normal(r);
    default: return 2 * dl_test_normal(r);
    }
}

static double random_mult(dl_test_rng_t *r, dl_dtype_t t)
{
    if (dl_test_next(r) % 5 == 0)
        return t == DL_F16 ? wide(r, -20, 8) : wide(r, -100, 60);
    return 4 * dl_test_normal(r);
}

START_TEST(random_vs_mpfr)
{
    const dl_ffn_t kind = _i ? DL_FFN_GEGLU_TANH : DL_FFN_SWIGLU_CLAMP;
    dl_test_rng_t r = {900 + (uint64_t)_i};
    const int n = 6000;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u), *dh = malloc(n * sizeof *dh);
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = act_types[ti];
        for (int i = 0; i < n; i++) {
            g[i] = on_grid(random_gate(&r, kind), t);
            u[i] = on_grid(random_mult(&r, t), t);
            dh[i] = on_grid(random_mult(&r, t), t);
            if (isinf(g[i]) || isinf(u[i]) || isinf(dh[i]))
                g[i] = u[i] = dh[i] = 1.0f;
        }
        uint64_t f0 = dl__mpfr_fallbacks();
        check_batch(kind, g, u, dh, n, t);
        fprintf(stderr, "# %s %s: %llu MPFR fallbacks in %d outputs\n",
                _i ? "geglu-tanh" : "swiglu-clamp", dl_dtype_name(t),
                (unsigned long long)(dl__mpfr_fallbacks() - f0), 3 * n);
    }
    free(g);
    free(u);
    free(dh);
}
END_TEST

/* Typical values: the binary64 path must decide nearly all of them. */
START_TEST(fallback_share)
{
    const dl_ffn_t kind = _i ? DL_FFN_GEGLU_TANH : DL_FFN_SWIGLU_CLAMP;
    dl_moe_config_t c = cfg(kind, DL_BF16);
    dl_test_rng_t r = {40};
    const int n = 100000;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u), *h = malloc(n * sizeof *h);
    for (int i = 0; i < n; i++) {
        g[i] = on_grid(3 * dl_test_normal(&r), DL_BF16);
        u[i] = on_grid(3 * dl_test_normal(&r), DL_BF16);
    }
    uint64_t f0 = dl__mpfr_fallbacks();
    ck_assert_int_eq(dl_ffn_act(&c, g, u, n, h), 0);
    ck_assert_int_eq(dl_ffn_act_backward(&c, g, u, u, n, h, NULL), 0);
    uint64_t fb = dl__mpfr_fallbacks() - f0;
    fprintf(stderr, "# fallbacks %llu in %d outputs\n", (unsigned long long)fb, 2 * n);
    ck_assert(fb < (uint64_t)n / 500);
    free(g);
    free(u);
    free(h);
}
END_TEST

/* At and beside the clamps (g = limit: the gradient passes; one ulp above:
 * it does not), u at +-limit, zeros (g = 0, u = -1 makes up + 1 zero, u =
 * 0), signed zeros, huge and tiny gates (the tails and the interval path). */
START_TEST(boundaries)
{
    const dl_ffn_t kind = _i ? DL_FFN_GEGLU_TANH : DL_FFN_SWIGLU_CLAMP;
    static const float gs[] = {7.0f, 0x1.c00002p2f, 0x1.bffffep2f, -7.0f, 0.0f, -0.0f, 1.0f,
                               -1.0f, -0.75f, 0x1p-149f, -0x1p-140f, 25.0f, -25.0f, 30.0f,
                               -30.0f, -400.0f, -420.0f, 1e4f, -1e4f, 3e38f, -3e38f, 2.5f};
    static const float us[] = {7.0f, -7.0f, 0x1.c00002p2f, -0x1.c00002p2f, -1.0f, 0.0f,
                               -0.0f, 1.0f, 0x1p-149f, -3.0f, 100.0f, 0x1.8p-3f};
    static const float dhs[] = {1.0f, -0.5f, 0.0f, 0x1p-130f, 1e30f};
    const int ng = 22, nu = 12, nd = 5, n = ng * nu * nd;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u), *dh = malloc(n * sizeof *dh);
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = act_types[ti];
        for (int i = 0; i < n; i++) {
            g[i] = on_grid(gs[i % ng], t);
            u[i] = on_grid(us[(i / ng) % nu], t);
            dh[i] = on_grid(dhs[i / (ng * nu)], t);
            if (isinf(g[i]))
                g[i] = copysignf(65504.0f, g[i]);
            if (isinf(dh[i]))
                dh[i] = 60000.0f;
        }
        check_batch(kind, g, u, dh, n, t);
    }
    free(g);
    free(u);
    free(dh);
}
END_TEST

/* The subgradient at the clamp, spelled out; exact zeros are +0. */
START_TEST(clamp_subgradient)
{
    dl_moe_config_t c = cfg(DL_FFN_SWIGLU_CLAMP, DL_F32);
    const float g[4] = {7.0f, nextafterf(7.0f, 8.0f), 1.0f, 1.0f};
    const float u[4] = {7.0f, 7.0f, -7.0f, nextafterf(-7.0f, -8.0f)};
    const float dh[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    float h[4], dg[4], du[4];
    ck_assert_int_eq(dl_ffn_act(&c, g, u, 4, h), 0);
    ck_assert_int_eq(dl_ffn_act_backward(&c, g, u, dh, 4, dg, du), 0);
    ck_assert(h[0] == h[1]);              /* clamped: the same value */
    ck_assert(dg[0] != 0 && dg[1] == 0 && !signbit(dg[1])); /* passes at the limit only */
    ck_assert(du[0] != 0 && du[2] != 0 && du[3] == 0 && !signbit(du[3]));
    ck_assert(h[2] == h[3]);
}
END_TEST

START_TEST(errors_and_aliasing)
{
    dl_moe_config_t c = cfg(DL_FFN_SWIGLU_CLAMP, DL_F32);
    float g[3] = {1.0f, -2.0f, 8.0f}, u[3] = {0.5f, 3.0f, -9.0f}, dh[3] = {1.0f, 2.0f, 3.0f};
    float h[3], dg[3], du[3], gi[3], nanv[1] = {NAN};
    ck_assert_int_eq(dl_ffn_act(&c, g, nanv, 1, h), DL_ENONFINITE);
    c.ffn_kind = DL_FFN_PLAIN;
    ck_assert_int_eq(dl_ffn_act(&c, g, u, 3, h), DL_EINVAL);
    c = cfg(DL_FFN_SWIGLU_CLAMP, DL_F64);
    ck_assert_int_eq(dl_ffn_act(&c, g, u, 3, h), DL_EDTYPE);
    c = cfg(DL_FFN_SWIGLU_CLAMP, DL_F32);
    c.act_limit = NAN;
    ck_assert_int_eq(dl_ffn_act(&c, g, u, 3, h), DL_EINVAL);
    c = cfg(DL_FFN_SWIGLU_CLAMP, DL_F32);
    ck_assert_int_eq(dl_ffn_act_backward(&c, g, u, dh, 3, dg, du), 0);
    /* both outputs over inputs: the same bits */
    memcpy(gi, g, sizeof g);
    float uu[3];
    memcpy(uu, u, sizeof u);
    ck_assert_int_eq(dl_ffn_act_backward(&c, gi, uu, dh, 3, gi, uu), 0);
    ck_assert(!memcmp(gi, dg, sizeof dg) && !memcmp(uu, du, sizeof du));
}
END_TEST

/* The derivatives the runner's tolerances use agree with finite
 * differences away from the kinks. */
START_TEST(deriv_finite_differences)
{
    const dl_ffn_t kinds[3] = {DL_FFN_SWIGLU, DL_FFN_SWIGLU_CLAMP, DL_FFN_GEGLU_TANH};
    for (int k = 0; k < 3; k++) {
        dl_moe_config_t c = cfg(kinds[k], DL_F32);
        for (double g = -6.1; g < 6.5; g += 0.37)
            for (double u = -3.3; u < 3.4; u += 1.1) {
                dl_ffn_act_deriv_t d, p, m;
                const double e = 1e-6;
                dl_ffn_act_deriv(&c, g, u, &d);
                dl_ffn_act_deriv(&c, g + e, u, &p);
                dl_ffn_act_deriv(&c, g - e, u, &m);
                ck_assert_double_eq_tol((p.h - m.h) / (2 * e), d.hg, 1e-6 * (1 + fabs(d.hg)));
                ck_assert_double_eq_tol((p.hg - m.hg) / (2 * e), d.hgg, 1e-5 * (1 + fabs(d.hgg)));
                ck_assert_double_eq_tol((p.hu - m.hu) / (2 * e), d.hgu, 1e-6 * (1 + fabs(d.hgu)));
                dl_ffn_act_deriv(&c, g, u + e, &p);
                dl_ffn_act_deriv(&c, g, u - e, &m);
                ck_assert_double_eq_tol((p.h - m.h) / (2 * e), d.hu, 1e-6 * (1 + fabs(d.hu)));
            }
    }
}
END_TEST

/* relu2 (non-gated, Nemotron): h = RN(relu(u)^2), d_u = RN(2 dh relu(u)),
 * against MPFR squares and products on random, wide-range and boundary
 * inputs (0, -0, negatives: h = d_u = +0, the subgradient at 0 is 0); the
 * gate argument is unused (NULL), and d_g is never written. */
static double relu2_ref(double u, double dh, int which, dl_dtype_t t)
{
    if (!(u > 0) || (which == DU && dh == 0.0))
        return 0.0;
    mpfr_t r;
    mpfr_init2(r, 256);
    mpfr_set_d(r, u, MPFR_RNDN);
    if (which == H)
        mpfr_sqr(r, r, MPFR_RNDN);
    else {
        mpfr_mul_d(r, r, dh, MPFR_RNDN);
        mpfr_mul_ui(r, r, 2, MPFR_RNDN);
    }
    double v = mpref_round(r, t);
    mpfr_clear(r);
    return v;
}

START_TEST(relu2_vs_mpfr)
{
    dl_test_rng_t r = {950};
    enum { N = 4000 };
    static float u[N], dh[N], h[N], du[N], dg[N];
    for (int ti = 0; ti < 3; ti++) {
        dl_dtype_t t = act_types[ti];
        dl_moe_config_t c = cfg(DL_FFN_RELU2, t);
        for (int i = 0; i < N; i++) {
            /* |u|, |dh| < 2^7 in fp16 so that u^2 and 2 u dh stay finite */
            u[i] = on_grid(i < 8 ? (double)(i - 4) * 0.5 : t == DL_F16 ? fmin(fabs(wide(&r, -20, 6)), 120) * ((i & 1) ? 1 : -1) : random_mult(&r, t), t);
            dh[i] = on_grid(t == DL_F16 ? wide(&r, -12, 6) : random_mult(&r, t), t);
            dg[i] = 12345.0f;
        }
        u[0] = -0.0f;
        ck_assert_int_eq(dl_ffn_act(&c, NULL, u, N, h), 0);
        ck_assert_int_eq(dl_ffn_act_backward(&c, NULL, u, dh, N, dg, du), 0);
        for (int i = 0; i < N; i++) {
            ck_assert_msg(same_value(h[i], relu2_ref(u[i], dh[i], H, t)), "%s h(%a) = %a",
                          dl_dtype_name(t), u[i], h[i]);
            ck_assert_msg(same_value(du[i], relu2_ref(u[i], dh[i], DU, t)), "%s d_u(%a, %a) = %a",
                          dl_dtype_name(t), u[i], dh[i], du[i]);
            ck_assert(dg[i] == 12345.0f); /* relu2 has no gate gradient */
            ck_assert(!(u[i] <= 0) || (h[i] == 0 && !signbit(h[i]) && du[i] == 0 && !signbit(du[i])));
        }
        dl_ffn_act_deriv_t d; /* its derivatives for the tolerances: in u alone */
        dl_ffn_act_deriv(&c, 99.0, 3.0, &d);
        ck_assert(d.h == 9.0 && d.hu == 6.0 && d.huu == 2.0 && d.hg == 0.0 && d.hgg == 0.0);
        dl_ffn_act_deriv(&c, 99.0, -3.0, &d);
        ck_assert(d.h == 0.0 && d.hu == 0.0 && d.huu == 0.0);
    }
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST_LOOP("ffn_act", "random", random_vs_mpfr, 0, 2, 300),
        DL_TEST_LOOP("ffn_act", "fallbacks", fallback_share, 0, 2, 120),
        DL_TEST_LOOP("ffn_act", "boundaries", boundaries, 0, 2, 300),
        DL_TEST("ffn_act", "clamp", clamp_subgradient, 30),
        DL_TEST("ffn_act", "errors", errors_and_aliasing, 30),
        DL_TEST("ffn_act", "derivatives", deriv_finite_differences, 30),
        DL_TEST("ffn_act", "relu2", relu2_vs_mpfr, 60),
    };
    return dl_test_main(tests, (int)(sizeof tests / sizeof tests[0]));
}
