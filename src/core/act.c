/* Certified activations beyond SiLU: gpt-oss's clamped SwiGLU
 * ((up + 1) * g * sigmoid(alpha g)), GeGLU with the tanh approximation of
 * gelu, and relu^2, forward and both partial products of the VJP, each the
 * exact real value rounded once to its type.
 *
 * Fast path: a binary64 evaluation on the certified exp of transc.c with a
 * rigorous error bound (below), certified with dl__certify. Undecided
 * values go to an interval evaluation in GNU MPFR (every operation rounded
 * outward) in a Ziv loop, so no bit depends on the fast path's bound being
 * tight, only on it being a bound.
 *
 * GeGLU-tanh: gelu(g) = g/2 (1 + tanh(c (g + b g^3))), c = sqrt(2/pi)
 * and b = 0.044715 exactly (the real numbers, not their binary64 values),
 * evaluated as g S(z), z = 2c g (1 + b g^2), S the logistic sigmoid
 * (1 + tanh(y) = 2 S(2y) exactly). */
#include "config.h"
#include <math.h>
#include <mpfr.h>
#include "core/core_priv.h"

/* ------------------------------------------------- interval arithmetic */

typedef struct { mpfr_t lo, hi; } iv_t;

static void iv_init(iv_t *a, mpfr_prec_t p) { mpfr_inits2(p, a->lo, a->hi, (mpfr_ptr)0); }
static void iv_clear(iv_t *a) { mpfr_clears(a->lo, a->hi, (mpfr_ptr)0); }

static void iv_d(iv_t *a, double x)
{
    mpfr_set_d(a->lo, x, MPFR_RNDD);
    mpfr_set_d(a->hi, x, MPFR_RNDU);
}

static void iv_add_ui(iv_t *r, const iv_t *a, unsigned long k)
{
    mpfr_add_ui(r->lo, a->lo, k, MPFR_RNDD);
    mpfr_add_ui(r->hi, a->hi, k, MPFR_RNDU);
}

/* r = a b (r may alias a or b): the extremes of the four corner products */
static void iv_mul(iv_t *r, const iv_t *a, const iv_t *b)
{
    mpfr_prec_t p = mpfr_get_prec(r->lo);
    mpfr_t t, lo, hi;
    mpfr_inits2(p, t, lo, hi, (mpfr_ptr)0);
    mpfr_srcptr x[2] = {a->lo, a->hi}, y[2] = {b->lo, b->hi};
    for (int i = 0; i < 4; i++) {
        mpfr_mul(t, x[i >> 1], y[i & 1], MPFR_RNDD);
        if (i == 0 || mpfr_less_p(t, lo))
            mpfr_set(lo, t, MPFR_RNDD);
        mpfr_mul(t, x[i >> 1], y[i & 1], MPFR_RNDU);
        if (i == 0 || mpfr_greater_p(t, hi))
            mpfr_set(hi, t, MPFR_RNDU);
    }
    mpfr_set(r->lo, lo, MPFR_RNDD);
    mpfr_set(r->hi, hi, MPFR_RNDU);
    mpfr_clears(t, lo, hi, (mpfr_ptr)0);
}

/* r = S(s x), s = +1 or -1 (S increasing): 1 / (1 + exp(-s x)) at each end */
static void iv_sig(iv_t *r, const iv_t *x, int s)
{
    mpfr_prec_t p = mpfr_get_prec(r->lo);
    mpfr_t a, lo;
    mpfr_inits2(p, a, lo, (mpfr_ptr)0);
    /* the lower end: the smallest s x, exp rounded up */
    mpfr_neg(a, s > 0 ? x->lo : x->hi, MPFR_RNDN); /* exact */
    if (s < 0)
        mpfr_neg(a, a, MPFR_RNDN);
    mpfr_exp(a, a, MPFR_RNDU);
    mpfr_add_ui(a, a, 1, MPFR_RNDU);
    mpfr_ui_div(lo, 1, a, MPFR_RNDD);
    mpfr_neg(a, s > 0 ? x->hi : x->lo, MPFR_RNDN);
    if (s < 0)
        mpfr_neg(a, a, MPFR_RNDN);
    mpfr_exp(a, a, MPFR_RNDD);
    mpfr_add_ui(a, a, 1, MPFR_RNDD);
    mpfr_ui_div(r->hi, 1, a, MPFR_RNDU);
    mpfr_set(r->lo, lo, MPFR_RNDD);
    mpfr_clears(a, lo, (mpfr_ptr)0);
}

/* 2 sqrt(2/pi) and 0.044715, enclosed */
static void iv_gelu_consts(iv_t *c2, iv_t *b)
{
    mpfr_t pl, ph;
    mpfr_inits2(mpfr_get_prec(c2->lo), pl, ph, (mpfr_ptr)0);
    mpfr_const_pi(pl, MPFR_RNDD);
    mpfr_const_pi(ph, MPFR_RNDU);
    mpfr_ui_div(c2->lo, 2, ph, MPFR_RNDD);
    mpfr_ui_div(c2->hi, 2, pl, MPFR_RNDU);
    mpfr_sqrt(c2->lo, c2->lo, MPFR_RNDD);
    mpfr_sqrt(c2->hi, c2->hi, MPFR_RNDU);
    mpfr_mul_2ui(c2->lo, c2->lo, 1, MPFR_RNDD);
    mpfr_mul_2ui(c2->hi, c2->hi, 1, MPFR_RNDU);
    mpfr_set_ui(b->lo, 44715, MPFR_RNDD);
    mpfr_div_ui(b->lo, b->lo, 1000000, MPFR_RNDD);
    mpfr_set_ui(b->hi, 44715, MPFR_RNDU);
    mpfr_div_ui(b->hi, b->hi, 1000000, MPFR_RNDU);
    mpfr_clears(pl, ph, (mpfr_ptr)0);
}

/* ------------------------------------------------------- the functions */

typedef struct {
    int kind, which;
    double g, u, dh, alpha; /* g and u already clamped (gpt-oss) */
} act_ctx_t;

/* The sigmoid's argument x (alpha g, or z for GeGLU) and, for the
 * gradient, the inner factor's q (F = 1 + q). */
static void arg_ival(const act_ctx_t *c, iv_t *x, iv_t *zp, iv_t *t)
{
    iv_d(t, c->g);
    if (c->kind == DL__ACT_OAI) {
        iv_d(x, c->alpha);
        iv_mul(x, x, t);
        return;
    }
    iv_t b;
    iv_init(&b, mpfr_get_prec(x->lo));
    iv_gelu_consts(zp, &b);
    iv_mul(t, t, t);       /* g^2 */
    iv_mul(t, t, &b);      /* b g^2 */
    iv_add_ui(x, t, 1);    /* 1 + b g^2 */
    iv_mul(x, x, zp);      /* c2 (1 + b g^2) */
    mpfr_mul_ui(t->lo, t->lo, 3, MPFR_RNDD);
    mpfr_mul_ui(t->hi, t->hi, 3, MPFR_RNDU);
    iv_add_ui(t, t, 1);
    iv_mul(zp, zp, t);     /* z' = c2 (1 + 3 b g^2) */
    iv_d(t, c->g);
    iv_mul(x, x, t);       /* z */
    iv_clear(&b);
}

static void act_eval(mpfr_ptr lo, mpfr_ptr hi, const void *ctx)
{
    const act_ctx_t *c = ctx;
    mpfr_prec_t p = mpfr_get_prec(lo);
    iv_t x, zp, t, s, r;
    iv_init(&x, p), iv_init(&zp, p), iv_init(&t, p), iv_init(&s, p), iv_init(&r, p);
    arg_ival(c, &x, &zp, &t);
    iv_sig(&s, &x, 1);
    iv_d(&r, c->which == DL__ACT_H ? c->u : c->dh);
    if (c->which == DL__ACT_H && c->kind == DL__ACT_OAI)
        iv_add_ui(&r, &r, 1); /* up + 1 */
    if (c->which != DL__ACT_DG) { /* (u [+ 1] or dh) g S */
        iv_d(&t, c->g);
        iv_mul(&r, &r, &t);
    } else { /* dh (u [+ 1]) S (1 + q) */
        iv_d(&t, c->u);
        if (c->kind == DL__ACT_OAI)
            iv_add_ui(&t, &t, 1);
        iv_mul(&r, &r, &t);
        iv_sig(&t, &x, -1); /* 1 - S */
        if (c->kind == DL__ACT_OAI) {
            iv_mul(&t, &t, &x); /* q = x (1 - S) */
        } else {
            iv_mul(&t, &t, &zp);
            iv_d(&x, c->g);
            iv_mul(&t, &t, &x); /* q = g (1 - S) z' */
        }
        iv_add_ui(&t, &t, 1);
        iv_mul(&r, &r, &t);
    }
    iv_mul(&r, &r, &s);
    mpfr_set(lo, r.lo, MPFR_RNDD);
    mpfr_set(hi, r.hi, MPFR_RNDU);
    iv_clear(&x), iv_clear(&zp), iv_clear(&t), iv_clear(&s), iv_clear(&r);
}

/* ---------------------------------------------------------- fast path */

/* S(x) and 1 - S(x), each within a relative 2^-48 (dl__sigmoid's
 * analysis: one certified exp, one addition, one division); 0 when |x| >
 * 700, where the caller takes the interval path. */
static int sig2(double x, double *s, double *sm)
{
    if (!(fabs(x) <= 700))
        return 0;
    int k;
    const double y = dl__exp_parts(-fabs(x), 0.0, &k);
    const double e = ldexp(y, k); /* >= 2^-1011: normal */
    double a = 1.0 / (1.0 + e), b = e / (1.0 + e);
    *s = x >= 0 ? a : b;
    *sm = x >= 0 ? b : a;
    return 1;
}

/* The binary64 value and its error bound. The argument x carries a
 * relative error ex (OAI: alpha g, one rounding, 2^-53; GeGLU: z from six
 * roundings of binary64 constants and products, < 8 u = 2^-50), which moves
 * S relatively by at most (1 - S) |x| ex <= |x| ex and 1 - S by S |x| ex
 * <= |x| ex; so both carry es = 2^-48 + |x| ex. Products of k factors add
 * k roundings (u each). F = 1 + q is bounded absolutely: |q| (es + 2^-50)
 * + u |F| (q's own roundings and z''s < 2^-50, then the addition). Every
 * bound is rounded up by the factor (1 + 2^-20). Returns 0 when the value
 * or a partial product is below 2^-900 (binary64's relative bounds stop
 * holding near its subnormals): the interval path then decides. */
static int fast(const act_ctx_t *c, dl_dtype_t t, double *out)
{
    const int oai = c->kind == DL__ACT_OAI;
    double x, zp = 0.0, s, sm, ex;
    if (oai) {
        x = c->alpha * c->g;
        ex = 0x1p-52;
    } else {
        const double c2 = 0x1.9884533d43651p+0, b = 0.044715, bg2 = b * (c->g * c->g);
        x = c2 * c->g * (1.0 + bg2);
        zp = c2 * (1.0 + 3.0 * bg2);
        ex = 0x1p-49;
    }
    if (!sig2(x, &s, &sm))
        return 0;
    const double es = 0x1p-48 + fabs(x) * ex, up = 1.0 + 0x1p-20;
    const double v = oai ? c->u + 1.0 : c->u; /* one rounding (OAI) */
    double y, err;
    if (c->which != DL__ACT_DG) {
        const double pre = c->which == DL__ACT_H ? v : c->dh;
        y = pre * c->g * s;
        err = fabs(y) * (es + 0x1p-51) * up;
    } else {
        const double q = oai ? x * sm : c->g * sm * zp;
        const double f = 1.0 + q, ps = c->dh * v * s;
        const double ef = fabs(q) * (es + 0x1p-49) + 0x1p-53 * fabs(f);
        y = ps * f;
        err = fabs(ps) * (fabs(f) * (es + 0x1p-50) + ef) * up;
        if (fabs(ps) < 0x1p-900)
            return 0;
    }
    if (!(fabs(y) >= 0x1p-900))
        return 0;
    return dl__certify(y, err, t, out);
}

/* |x| > 700 (the sigmoid's argument), for the stages' types: the value
 * is P S or P S F with P the exact product of the two floats in front
 * (g u or g dh; dh u for the gradient) and S within e^-700 of 1 or 0.
 *   x > 700: P S lies in (P (1 - 2^-1000), P); P S F (GeGLU only: OAI's x
 *     is at most alpha limit) in (P, P (1 + 2^-60)), since F - 1 = g z'
 *     (1 - S) <= 3 z e^-z and S F - 1 = (1 - S)(g z' - 1) - g z' (1 - S)^2
 *     > 0 (g z' > 32 there). P has at most 48 significant bits, so no
 *     rounding boundary of a type of at most 25 bits lies strictly
 *     between P and its binary64 neighbour (dl__silu_mul's argument).
 *   x < -700: |P S F| <= 2^256 e^-700 (1 + 3 |x|) < 2^-700 (|q| <= 3 |x|):
 *     a zero of the value's sign (F < 0 there for the gradient: q < -1). */
static int tail(const act_ctx_t *c, dl_dtype_t t, double *out)
{
    const int oai = c->kind == DL__ACT_OAI, dg = c->which == DL__ACT_DG;
    const double x = oai ? c->alpha * c->g
                         : 0x1.9884533d43651p+0 * c->g * (1.0 + 0.044715 * (c->g * c->g));
    /* 701: past the rounding of x; OAI's x > 700 (a limit past 411) and
     * F64 take the interval path */
    if (t == DL_F64 || fabs(x) <= 701 || (oai && x > 0))
        return 0;
    const double v = oai ? c->u + 1.0 : c->u; /* only its sign matters for OAI */
    const double p = dg ? c->dh * v : (c->which == DL__ACT_H ? v : c->dh) * c->g;
    if (x < 0)
        *out = copysign(0.0, dg ? -p : p);
    else
        *out = dl_round(nextafter(p, dg ? copysign(INFINITY, p) : 0.0), t);
    return 1;
}

/* relu^2: exact in binary64 (g has at most 24 significant bits), rounded once */
static int relu2(int which, double g, double dh, dl_dtype_t t, double *out)
{
    if (g <= 0 || (which == DL__ACT_DG && dh == 0.0)) {
        *out = 0.0; /* the subgradient at 0 is 0 */
        return 0;
    }
    *out = dl_round(which == DL__ACT_H ? g * g : 2.0 * (g * dh), t);
    return 0;
}

int dl__act_eval(int kind, double alpha, double limit, int which, double g, double u,
                 double dh, dl_dtype_t t, double *out)
{
    if (kind == DL__ACT_RELU2)
        return relu2(which, g, dh, t, out);
    act_ctx_t c = {kind, which, g, u, dh, alpha};
    int zero;
    if (kind == DL__ACT_OAI) {
        /* the clamps' derivative is 1 on the closed range (torch's clamp) */
        c.g = g > limit ? limit : g;
        c.u = u > limit ? limit : u < -limit ? -limit : u;
        zero = which == DL__ACT_H ? c.g == 0.0 || c.u == -1.0
             : which == DL__ACT_DU ? fabs(u) > limit || c.g == 0.0 || dh == 0.0
                                   : g > limit || dh == 0.0 || c.u == -1.0;
    } else {
        zero = which == DL__ACT_H ? g == 0.0 || u == 0.0
             : which == DL__ACT_DU ? g == 0.0 || dh == 0.0 : dh == 0.0 || u == 0.0;
    }
    if (zero) {
        *out = 0.0;
        return 0;
    }
    if (fast(&c, t, out) || tail(&c, t, out))
        return 0;
    return dl__ziv_locked(act_eval, &c, t, out);
}
