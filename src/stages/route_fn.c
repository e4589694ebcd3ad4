/* The routing rules beyond softmax and sigmoid (issue 26): the sqrtsoftplus
 * score (DeepSeek-V4) and its VJP, and the softmax over the selected
 * logits (gpt-oss, "top-k then softmax") with its VJP. Each value is the
 * exact function of the stored inputs rounded once to fp32: Ziv's loop in
 * MPFR over a directed-rounding enclosure (dl__ziv), after the exact cases
 * are decided exactly. Why Ziv's loop ends: the values are transcendental
 * (Lindemann-Weierstrass: exp of a nonzero rational is transcendental, and
 * so is every sum sum_g m_g exp(L_g) over distinct L_g with a nonzero
 * coefficient beside exp(0)), so an enclosure that shrinks around them
 * eventually holds no fp32 rounding boundary; the rational cases (all
 * selected logits equal) go through an exact quotient, for which the
 * enclosure is a point once the precision holds it. */
#include "config.h"
#include <math.h>
#include <mpfr.h>
#include "stages/stages_priv.h"

/* Wide enough for a difference of two floats (2^128 .. 2^-149) exactly. */
#define DIFF_PREC 320
/* Wide enough for k * dw_j - sum dw_i over up to 2^20 floats, times c. */
#define SUM_PREC 2400

/* Ziv's loop, after one look at 128 bits: a value whose whole enclosure
 * rounds to a zero of fp32 is +0 (an enclosure that holds a term below
 * MPFR's exponent range, exp(-2^98) say, never shrinks to one sign). */
static int ziv(dl__ival_fn f, const void *ctx, double *out)
{
    int rc = 0;
#ifdef _OPENMP
#pragma omp critical(dl__mpfr)
#endif
    {
        mpfr_t lo, hi;
        mpfr_inits2(128, lo, hi, (mpfr_ptr)0);
        f(lo, hi, ctx);
        if (dl__mpfr_round(lo, DL_F32) == 0.0 && dl__mpfr_round(hi, DL_F32) == 0.0)
            *out = 0.0;
        else
            rc = dl__ziv(f, ctx, DL_F32, out);
        mpfr_clears(lo, hi, (mpfr_ptr)0);
    }
    return rc;
}

/* ------------------------------------------------------- sqrtsoftplus */

static void ssp_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    const float l = *(const float *)ctx;
    mpfr_ptr v[2] = {lo, hi};
    const mpfr_rnd_t rd[2] = {MPFR_RNDD, MPFR_RNDU};
    for (int i = 0; i < 2; i++) {
        /* softplus(l) = log1p(exp(l)) = l + log1p(exp(-l)): each step is
         * monotone increasing in its argument, so one direction bounds it */
        mpfr_set_flt(v[i], l > 0 ? -l : l, MPFR_RNDN);
        mpfr_exp(v[i], v[i], rd[i]);
        mpfr_log1p(v[i], v[i], rd[i]);
        if (l > 0)
            mpfr_add_d(v[i], v[i], (double)l, rd[i]);
        mpfr_sqrt(v[i], v[i], rd[i]);
    }
}

int dl__sqrtsoftplus(float l, float *s)
{
    double r;
    int rc = ziv(ssp_eval, &l, &r);
    *s = (float)r;
    return rc;
}

typedef struct {
    float s, ds;
} sspd_ctx_t;

/* |ds| (1 - exp(-s^2)) / (2 |s|), enclosed; the sign is applied after. */
static void sspd_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    const sspd_ctx_t *c = ctx;
    const double as = fabs((double)c->s), ad = fabs((double)c->ds);
    mpfr_ptr v[2] = {lo, hi};
    /* 1 - exp(-q) = -expm1(-q): a lower bound from expm1 rounded up */
    const mpfr_rnd_t up[2] = {MPFR_RNDU, MPFR_RNDD}, rd[2] = {MPFR_RNDD, MPFR_RNDU};
    for (int i = 0; i < 2; i++) {
        mpfr_set_d(v[i], as, MPFR_RNDN);
        mpfr_sqr(v[i], v[i], MPFR_RNDN); /* exact: 48 bits */
        mpfr_neg(v[i], v[i], MPFR_RNDN);
        mpfr_expm1(v[i], v[i], up[i]);
        mpfr_neg(v[i], v[i], MPFR_RNDN);
        mpfr_mul_d(v[i], v[i], ad, rd[i]);
        mpfr_div_d(v[i], v[i], 2.0 * as, rd[i]);
    }
}

int dl__sqrtsoftplus_vjp(float s, float ds, float *dl)
{
    /* d sqrt(softplus(l)) / dl = sigmoid(l) / (2 sqrt(softplus(l))), and
     * sigmoid(l) = 1 - exp(-softplus(l)) = 1 - exp(-s^2): at the stored score
     * s the VJP is ds (1 - exp(-s^2)) / (2 s); its limit at s = 0 is 0. */
    if (s == 0.0f || ds == 0.0f) {
        *dl = 0.0f;
        return 0;
    }
    sspd_ctx_t c = {s, ds};
    double r;
    int rc = ziv(sspd_eval, &c, &r);
    const int neg = (s < 0) != (ds < 0);
    *dl = (float)(neg ? -r : r);
    return rc;
}

/* -------------------------------------------- softmax over the selection */

typedef struct {
    const float *s;      /* one token's E scores (= logits) */
    const int32_t *ids;  /* its k selected experts */
    const float *dw;     /* d_weights [k] (dscores only) */
    int64_t k, j;
    double c;            /* scaling */
    float m;             /* the largest selected score */
} stk_ctx_t;

/* exp(s[ids[i]] - m) enclosed in [lo, hi]; d is DIFF_PREC scratch. */
static void stk_exp(const stk_ctx_t *c, int64_t i, mpfr_ptr d, mpfr_ptr lo, mpfr_ptr hi)
{
    mpfr_set_flt(d, c->s[c->ids[i]], MPFR_RNDN);
    mpfr_sub_d(d, d, (double)c->m, MPFR_RNDN); /* exact */
    mpfr_exp(lo, d, MPFR_RNDD);
    mpfr_exp(hi, d, MPFR_RNDU);
}

/* S = sum_i exp(s_i - m), enclosed. */
static void stk_sum(const stk_ctx_t *c, mpfr_ptr d, mpfr_ptr slo, mpfr_ptr shi, mpfr_ptr tlo,
                    mpfr_ptr thi)
{
    mpfr_set_zero(slo, 1);
    mpfr_set_zero(shi, 1);
    for (int64_t i = 0; i < c->k; i++) {
        stk_exp(c, i, d, tlo, thi);
        mpfr_add(slo, slo, tlo, MPFR_RNDD);
        mpfr_add(shi, shi, thi, MPFR_RNDU);
    }
}

/* c exp(s_j - m) / S */
static void stk_w_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    const stk_ctx_t *c = ctx;
    mpfr_t d, slo, shi, tlo, thi;
    mpfr_init2(d, DIFF_PREC);
    mpfr_inits2(mpfr_get_prec(lo) + 16, slo, shi, tlo, thi, (mpfr_ptr)0);
    stk_sum(c, d, slo, shi, tlo, thi);
    stk_exp(c, c->j, d, tlo, thi);
    mpfr_mul_d(tlo, tlo, c->c, MPFR_RNDD);
    mpfr_mul_d(thi, thi, c->c, MPFR_RNDU);
    mpfr_div(lo, tlo, shi, MPFR_RNDD);
    mpfr_div(hi, thi, slo, MPFR_RNDU);
    mpfr_clears(d, slo, shi, tlo, thi, (mpfr_ptr)0);
}

/* c exp(s_j - m) A / S^2, A = sum_i exp(s_i - m) (dw_j - dw_i) */
static void stk_d_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    const stk_ctx_t *c = ctx;
    const mpfr_prec_t p = mpfr_get_prec(lo) + 16;
    mpfr_t d, a, slo, shi, tlo, thi, alo, ahi, x;
    mpfr_inits2(DIFF_PREC, d, a, (mpfr_ptr)0);
    mpfr_inits2(p, slo, shi, tlo, thi, alo, ahi, x, (mpfr_ptr)0);
    stk_sum(c, d, slo, shi, tlo, thi);
    mpfr_set_zero(alo, 1);
    mpfr_set_zero(ahi, 1);
    for (int64_t i = 0; i < c->k; i++) {
        mpfr_set_flt(a, c->dw[c->j], MPFR_RNDN);
        mpfr_sub_d(a, a, (double)c->dw[i], MPFR_RNDN); /* exact */
        stk_exp(c, i, d, tlo, thi);
        const int pos = mpfr_sgn(a) >= 0;
        mpfr_mul(x, pos ? tlo : thi, a, MPFR_RNDD);
        mpfr_add(alo, alo, x, MPFR_RNDD);
        mpfr_mul(x, pos ? thi : tlo, a, MPFR_RNDU);
        mpfr_add(ahi, ahi, x, MPFR_RNDU);
    }
    stk_exp(c, c->j, d, tlo, thi);
    mpfr_mul_d(tlo, tlo, c->c, MPFR_RNDD); /* c exp(s_j - m) > 0 */
    mpfr_mul_d(thi, thi, c->c, MPFR_RNDU);
    mpfr_sqr(slo, slo, MPFR_RNDD);
    mpfr_sqr(shi, shi, MPFR_RNDU);
    /* [tlo, thi] [alo, ahi] / [slo, shi], the positive factors on the side
     * that makes each end extreme */
    mpfr_mul(lo, mpfr_sgn(alo) >= 0 ? tlo : thi, alo, MPFR_RNDD);
    mpfr_div(lo, lo, mpfr_sgn(alo) >= 0 ? shi : slo, MPFR_RNDD);
    mpfr_mul(hi, mpfr_sgn(ahi) >= 0 ? thi : tlo, ahi, MPFR_RNDU);
    mpfr_div(hi, hi, mpfr_sgn(ahi) >= 0 ? slo : shi, MPFR_RNDU);
    mpfr_clears(d, a, slo, shi, tlo, thi, alo, ahi, x, (mpfr_ptr)0);
}

/* An exact quotient num / den, enclosed (a point once p holds it). */
typedef struct {
    mpfr_srcptr num, den;
} q_ctx_t;

static void q_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    const q_ctx_t *q = ctx;
    mpfr_div(lo, q->num, q->den, MPFR_RNDD);
    mpfr_div(hi, q->num, q->den, MPFR_RNDU);
}

/* RN_fp32(c (k dw_j - sum_i dw_i) / k^2) (dw NULL: RN_fp32(c / k)), the
 * case of k equal selected scores, where every p_i is exactly 1/k. */
static int stk_rational(const stk_ctx_t *c, double *out)
{
    int rc;
#ifdef _OPENMP
#pragma omp critical(dl__mpfr)
#endif
    {
        mpfr_t num, den;
        mpfr_inits2(SUM_PREC, num, den, (mpfr_ptr)0);
        mpfr_set_si(den, (long)c->k, MPFR_RNDN);
        if (c->dw) {
            mpfr_set_flt(num, c->dw[c->j], MPFR_RNDN);
            mpfr_mul_si(num, num, (long)c->k, MPFR_RNDN); /* exact */
            for (int64_t i = 0; i < c->k; i++)
                mpfr_sub_d(num, num, (double)c->dw[i], MPFR_RNDN); /* exact */
            mpfr_sqr(den, den, MPFR_RNDN);
        } else {
            mpfr_set_ui(num, 1, MPFR_RNDN);
        }
        mpfr_mul_d(num, num, c->c, MPFR_RNDN); /* exact */
        q_ctx_t q = {num, den};
        rc = dl__ziv(q_eval, &q, DL_F32, out);
        mpfr_clears(num, den, (mpfr_ptr)0);
    }
    return rc;
}

static void stk_init(stk_ctx_t *c, double scaling, const float *s, const int32_t *ids,
                     const float *dw, int64_t k, int *all_equal)
{
    *c = (stk_ctx_t){.s = s, .ids = ids, .dw = dw, .k = k, .c = scaling, .m = s[ids[0]]};
    *all_equal = 1;
    for (int64_t i = 1; i < k; i++) {
        if (s[ids[i]] > c->m)
            c->m = s[ids[i]];
        *all_equal &= s[ids[i]] == s[ids[0]];
    }
}

int dl__softmax_topk_weights(double scaling, const float *s, const int32_t *ids, int64_t k,
                             float *w)
{
    stk_ctx_t c;
    int eq;
    stk_init(&c, scaling, s, ids, NULL, k, &eq);
    if (scaling == 1.0 && k <= DL__MAX_TOPK) {
        float sel[DL__MAX_TOPK];
        for (int64_t i = 0; i < k; i++)
            sel[i] = s[ids[i]];
        return dl__softmax_row(sel, k, DL_F32, w);
    }
    for (int64_t j = 0; j < k; j++) {
        double r;
        c.j = j;
        int rc = eq ? stk_rational(&c, &r) : ziv(stk_w_eval, &c, &r);
        if (rc)
            return rc;
        w[j] = (float)r;
    }
    return 0;
}

/* 1 when sum_i p_i (dw_j - dw_i) is exactly zero: by Lindemann-Weierstrass,
 * when for every value L among the selected scores the sum of
 * (dw_j - dw_i) over the experts i scoring L is zero (decided exactly). */
static int stk_zero(const stk_ctx_t *c)
{
    for (int64_t g = 0; g < c->k; g++) {
        const float L = c->s[c->ids[g]];
        int first = 1;
        for (int64_t i = 0; i < g && first; i++)
            first = c->s[c->ids[i]] != L;
        if (!first)
            continue;
        dl_acc_t acc;
        dl_acc_clear(&acc);
        for (int64_t i = 0; i < c->k; i++)
            if (c->s[c->ids[i]] == L) {
                dl_acc_add(&acc, c->dw[c->j]);
                dl_acc_add(&acc, -(double)c->dw[i]);
            }
        if (dl_acc_sign(&acc) != 0)
            return 0;
    }
    return 1;
}

int dl__softmax_topk_dscores(double scaling, const float *s, const int32_t *ids, const float *dw,
                             int64_t k, float *ds)
{
    stk_ctx_t c;
    int eq;
    stk_init(&c, scaling, s, ids, dw, k, &eq);
    for (int64_t j = 0; j < k; j++) {
        double r;
        c.j = j;
        if (stk_zero(&c)) {
            ds[j] = 0.0f;
            continue;
        }
        int rc = eq ? stk_rational(&c, &r) : ziv(stk_d_eval, &c, &r);
        if (rc)
            return rc;
        ds[j] = (float)r;
    }
    return 0;
}
