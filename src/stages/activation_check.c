/* The checking side of the gated activations (activation.c): their exact
 * values on the runner's effective operands, the magnitudes M of their
 * rounding, and the derivative magnitudes that carry an absent upstream's
 * error into them (doc/tolerances.md, "Absent stages"), all in binary64.
 * SwiGLU (the routed experts' default and the shared experts'):
 *   h = silu(g) u,  silu(g) = g s(g),  s the logistic function,
 *   silu'(g) = s (1 + g (1 - s)),  silu''(g) = s (1 - s) (2 + g (1 - 2 s)),
 *   d_g = dh u silu'(g),  d_u = dh silu(g).
 * The routed experts' other kinds (swiglu-clamp, geglu-tanh) take the same
 * quantities from dl_ffn_act_deriv, beside their stage (activation.c). */
#include "config.h"
#include <string.h>
#include "stages/stages_priv.h"

#define EF(s) DL__EF(v, s)

static double sig(double g)
{
    return 1.0 / (1.0 + exp(-g));
}

static double dsilu(double g, double s)
{
    return s * (1.0 + g * (1.0 - s));
}

/* s(g) of every element of gate values hg (n of them) from the runner's
 * memo, computed into it the first time; NULL (no memo, no memory): the
 * caller computes each itself, the same value. */
static const double *sig_all(const dl__vctx_t *v, const float *hg, int64_t n)
{
    dl__memo_t *m = v->memo;
    if (!m || !hg)
        return NULL;
    for (int i = 0; i < 2; i++)
        if (m->slot[i].v && m->slot[i].key == hg && m->slot[i].n == n)
            return m->slot[i].v;
    double *s = v->alloc(v->actx, n, sizeof *s);
    if (!s)
        return NULL;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t i = 0; i < n; i++)
        s[i] = sig(hg[i]););
    m->slot[m->next].key = hg;
    m->slot[m->next].n = n;
    m->slot[m->next].v = s;
    m->next ^= 1;
    return s;
}

#define SIG(i) (S ? S[i] : sig(hg[i]))

/* ------------------------------------------------------------ forward */

int dl__exact_h_act(const dl__vctx_t *v, float *out)
{
    return dl_ffn_act(v->c, EF(H_GATE), EF(H_UP), v->M * v->f, out);
}

/* The routed experts' SwiGLU values, or the shared experts' (shared_check.c). */
static const dl__swiglu_vals_t routed = {DL_VALUE_H_GATE, DL_VALUE_H_UP, DL_VALUE_D_H_ACT};

#define VF(s) ((const float *)v->v[s])
#define VD(s) (v->delta[s])
#define VRSS(s) ((int)((v->rss >> (s)) & 1))

/* The experts' activation (the routed and the shared follow the case's)
 * when it is not SwiGLU: its derivatives come from dl_ffn_act_deriv. */
static int variant(const dl__vctx_t *v, dl__swiglu_vals_t o)
{
    (void)o;
    return v->c->ffn_kind != DL_FFN_SWIGLU;
}

/* M of h (which 0), of d_g (1) or of d_u (2) for a variant, |dh| times
 * the scales of the usual evaluations (dh NULL: h). */
static int variant_mag(const dl__vctx_t *v, dl__swiglu_vals_t o, int which, int64_t n,
                       dl__mag_t *m)
{
    const float *hg = VF(o.g), *hu = VF(o.u), *dh = which ? VF(o.dh) : NULL;
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        dl_ffn_act_deriv_t ad; /* relu2 has no gate (hg NULL) */
        dl_ffn_act_deriv(v->c, hg ? hg[i] : 0.0, hu[i], &ad);
        a[i] = which == 0 ? ad.hm : fabs((double)dh[i]) * (which == 1 ? ad.hgm : ad.hum);
    });
    m->elem = 1;
    return 0;
}

/* The first-order error that absent g, u (and dh) carry into h (which 0),
 * d_g (1) or d_u (2) for a variant. */
static int variant_prop(const dl__vctx_t *v, dl__swiglu_vals_t o, int which, int64_t n,
                        double *out)
{
    const float *dg = VD(o.g), *du = VD(o.u), *dd = which ? VD(o.dh) : NULL;
    const float *hg = VF(o.g), *hu = VF(o.u), *dh = which ? VF(o.dh) : NULL;
    if (!dg && !du && !dd)
        return 0;
    const int rg = VRSS(o.g), ru = VRSS(o.u), rd = which ? VRSS(o.dh) : 0;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        dl_ffn_act_deriv_t ad;
        dl_ffn_act_deriv(v->c, hg ? hg[i] : 0.0, hu[i], &ad);
        const double hi = dh ? dh[i] : 0.0;
        double td = 0.0, tu, tg;
        if (which == 0) { /* h: |dh/dg| dg + |dh/du| du */
            tg = dg ? fabs(ad.hg) * dg[i] : 0.0;
            tu = du ? fabs(ad.hu) * du[i] : 0.0;
        } else if (which == 1) { /* dh dh/dg */
            td = dd ? fabs(ad.hg) * dd[i] : 0.0;
            tu = du ? fabs(hi * ad.hgu) * du[i] : 0.0;
            tg = dg ? fabs(hi * ad.hgg) * dg[i] : 0.0;
        } else { /* dh dh/du (d2h/du2: relu2's 2, else 0) */
            td = dd ? fabs(ad.hu) * dd[i] : 0.0;
            tu = du ? fabs(hi * ad.huu) * du[i] : 0.0;
            tg = dg ? fabs(hi * ad.hgu) * dg[i] : 0.0;
        }
        out[i] += dl__comb((rd ? 0.0 : td) + (ru ? 0.0 : tu) + (rg ? 0.0 : tg),
                           (rd ? td * td : 0.0) + (ru ? tu * tu : 0.0) + (rg ? tg * tg : 0.0));
    });
    return 1;
}

int dl__swiglu_mag(const dl__vctx_t *v, dl__swiglu_vals_t o, int64_t n, dl__mag_t *m)
{
    if (variant(v, o))
        return variant_mag(v, o, 0, n, m);
    const float *hg = VF(o.g), *hu = VF(o.u);
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    const double *S = sig_all(v, hg, n);
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t i = 0; i < n; i++)
        a[i] = fabs((double)hg[i] * SIG(i) * (double)hu[i]); /* silu(g) u */);
    m->elem = 1;
    return 0;
}

int dl__swiglu_prop(const dl__vctx_t *v, dl__swiglu_vals_t o, int64_t n, double *out)
{
    if (variant(v, o))
        return variant_prop(v, o, 0, n, out);
    const float *dg = VD(o.g), *du = VD(o.u);
    const float *hg = VF(o.g), *hu = VF(o.u);
    if (!dg && !du)
        return 0;
    const int rg = VRSS(o.g), ru = VRSS(o.u);
    const double *S = sig_all(v, hg, n);
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        const double sg = SIG(i), gi = hg[i];
        /* h = silu(g) u: |silu'(g) u| dg + |silu(g)| du */
        const double a = dg ? fabs(dsilu(gi, sg) * hu[i]) * dg[i] : 0.0;
        const double b = du ? fabs(gi * sg) * du[i] : 0.0;
        out[i] += dl__comb((rg ? 0.0 : a) + (ru ? 0.0 : b), (rg ? a * a : 0.0) + (ru ? b * b : 0.0));
    });
    return 1;
}

int dl__mag_h_act(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return dl__swiglu_mag(v, routed, n, m);
}

int dl__prop_h_act(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    return dl__swiglu_prop(v, routed, n, out);
}

/* ----------------------------------------------------------- backward */

/* d_h_gate and d_h_up come out of one call: the other is kept in
 * v->spare (the runner's) and handed to the call that asks for it on the
 * same effective operands, so the certified backward runs once for both. */
int dl__swiglu_exact_d(const dl__vctx_t *v, dl__swiglu_vals_t o, int gate, int64_t n, float *out)
{
    dl__spare_t *sp = v->spare;
    const void *on[3] = {v->v[o.g], v->v[o.u], v->v[o.dh]};
    if (sp && sp->v && sp->key == (int)o.g && sp->gate == gate && sp->n == n &&
        !memcmp(sp->on, on, sizeof on)) {
        memcpy(out, sp->v, (size_t)n * sizeof *out);
        sp->v = NULL;
        return 0;
    }
    float *other = v->alloc(v->actx, n, sizeof *other);
    if (!other)
        return DL_ENOMEM;
    const int rc = variant(v, o) ? dl_ffn_act_backward(v->c, VF(o.g), VF(o.u), VF(o.dh), n,
                                                       gate ? out : other, gate ? other : out)
                                 : dl_swiglu_backward(VF(o.g), VF(o.u), VF(o.dh), n, v->act,
                                                      gate ? out : other, gate ? other : out);
    if (!rc && sp)
        *sp = (dl__spare_t){.v = other, .key = (int)o.g, .gate = !gate, .on = {on[0], on[1], on[2]},
                            .n = n};
    return rc;
}

int dl__swiglu_mag_d(const dl__vctx_t *v, dl__swiglu_vals_t o, int gate, int64_t n, dl__mag_t *m)
{
    if (variant(v, o))
        return variant_mag(v, o, gate ? 1 : 2, n, m);
    const float *hg = VF(o.g), *hu = VF(o.u), *dh = VF(o.dh);
    double *a = dl__mag_array(v, m, n);
    if (!a)
        return DL_ENOMEM;
    const double *S = sig_all(v, hg, n);
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        const double sg = SIG(i);
        if (gate) /* dh u s (1 + g (1 - s)): the two terms' magnitudes */
            a[i] = fabs((double)dh[i] * (double)hu[i] * sg) *
                   (1.0 + fabs((double)hg[i] * (1.0 - sg)));
        else
            a[i] = fabs((double)dh[i] * (double)hg[i] * sg);
    });
    m->elem = 1;
    return 0;
}

int dl__swiglu_prop_d(const dl__vctx_t *v, dl__swiglu_vals_t o, int gate, int64_t n, double *out)
{
    if (variant(v, o))
        return variant_prop(v, o, gate ? 1 : 2, n, out);
    const float *dg = VD(o.g), *du = VD(o.u), *dd = VD(o.dh);
    const float *hg = VF(o.g), *hu = VF(o.u), *dh = VF(o.dh);
    if (!dg && !du && !dd)
        return 0;
    const int rg = VRSS(o.g), ru = VRSS(o.u), rd = VRSS(o.dh);
    const double *S = sig_all(v, hg, n);
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        const double sg = SIG(i), gi = hg[i], ui = hu[i], hi = dh[i];
        const double d1 = dsilu(gi, sg);                                 /* silu' */
        const double d2 = sg * (1.0 - sg) * (2.0 + gi * (1.0 - 2.0 * sg)); /* silu'' */
        double td, tu = 0.0, tg;
        if (gate) { /* dh u silu'(g) */
            td = dd ? fabs(ui * d1) * dd[i] : 0.0;
            tu = du ? fabs(hi * d1) * du[i] : 0.0;
            tg = dg ? fabs(hi * ui * d2) * dg[i] : 0.0;
        } else { /* dh silu(g) */
            td = dd ? fabs(gi * sg) * dd[i] : 0.0;
            tg = dg ? fabs(hi * d1) * dg[i] : 0.0;
        }
        out[i] += dl__comb((rd ? 0.0 : td) + (ru ? 0.0 : tu) + (rg ? 0.0 : tg),
                           (rd ? td * td : 0.0) + (ru ? tu * tu : 0.0) + (rg ? tg * tg : 0.0));
    });
    return 1;
}

int dl__exact_d_h_gate(const dl__vctx_t *v, float *out)
{
    return dl__swiglu_exact_d(v, routed, 1, v->M * v->f, out);
}

int dl__mag_d_h_gate(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return dl__swiglu_mag_d(v, routed, 1, n, m);
}

int dl__prop_d_h_gate(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    return dl__swiglu_prop_d(v, routed, 1, n, out);
}

int dl__exact_d_h_up(const dl__vctx_t *v, float *out)
{
    return dl__swiglu_exact_d(v, routed, 0, v->M * v->f, out);
}

int dl__mag_d_h_up(const dl__vctx_t *v, const float *g, int64_t n, dl__mag_t *m)
{
    return dl__swiglu_mag_d(v, routed, 0, n, m);
}

int dl__prop_d_h_up(const dl__vctx_t *v, const float *g, int64_t n, double *out)
{
    return dl__swiglu_prop_d(v, routed, 0, n, out);
}
