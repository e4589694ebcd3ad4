/* What the routing check (route.c) and the tie inference (ties.c) share: the
 * selection key, the per-expert tolerance on it, and the one test of
 * whether a selection is plausible. A leaf of the checker's routing: it
 * calls the selection stage (dl_route_topk) and tol.c, nothing in route.c
 * or ties.c.
 *
 * Plausible means: the exact rule, run on scores each within its own
 * expert's tolerance of the effective ones, can give the selection. The
 * rule is monotone in each key (raising a chosen expert's key or lowering
 * an unchosen one never removes the chosen one), so the most favourable
 * scores for a selection c raise every expert of c by its tolerance and
 * lower every other; c is plausible exactly when the rule picks c there.
 * An expert whose key lies farther than its own tolerance (plus its rival's)
 * from the boundary can never enter a plausible selection, however large
 * another expert's tolerance is (issue 24: a near-zero-score expert
 * "explaining" a dropped slot through the largest tolerance of the row). */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

double dl__ck_key(const dl__ck_t *ck, const float *s, int64_t e)
{
    return dl__route_key(&ck->c->route, s, ck->in->expert_bias, e); /* the stage's */
}

int dl__ck_same_set(const int32_t *a, const int32_t *b, int64_t k)
{
    for (int64_t j = 0; j < k; j++) {
        int found = 0;
        for (int64_t i = 0; i < k && !found; i++)
            found = a[j] == b[i];
        if (!found)
            return 0;
    }
    return 1;
}

/* dl__ck_bound's coefficients for the scores (the same for every one). */
static void score_coef(const dl__ck_t *ck, int warn, dl__ck_bc_t *bc)
{
    const int soft = ck->c->route.score_fn == DL_SCORE_SOFTMAX;
    dl__cmp_t cmp = {.stage = DL_VALUE_ROUTER_SCORES, .t = DL_F32, .elem = 1,
                     .K = soft ? DL_ROUTE_WIDTH(&ck->c->route) : 0};
    dl__ck_bound_coef(ck, &cmp, cmp.K, warn, bc);
}

/* The bound (coefficients bc) of score e of a row whose row terms are mx,
 * zs (the score stage's magnitudes, stages/route_check.c). */
static double score_bound_at(const dl__ck_t *ck, const dl__ck_bc_t *bc, const float *l,
                             const float *s, int64_t e, double mx, double zs)
{
    const double M = dl__route_score_m(&ck->c->route, l, s, e, mx, zs);
    return dl__ck_bound_at(bc, s[e], M);
}

double dl__ck_score_bound(const dl__ck_t *ck, const float *logits, const float *scores, int64_t t,
                          int64_t e, int warn)
{
    const int64_t E = DL_ROUTE_WIDTH(&ck->c->route);
    const float *l = logits + t * E, *s = scores + t * E;
    double mx, zs;
    dl__route_score_m_row(&ck->c->route, E, l, s, &mx, &zs);
    dl__ck_bc_t bc;
    score_coef(ck, warn, &bc);
    return score_bound_at(ck, &bc, l, s, e, mx, zs);
}

/* The worst-case error of token t's logits that a kernel's hidden router
 * GEMM may carry under the router's profile (the WARN bound of
 * router_logits, kappa = K, plus u_in per off-grid operand), per expert,
 * into dl[E]; 0 when the candidate gives logits or scores (its selection
 * was then made on values the runner sees). */
static int hidden_logit_err(const dl__ck_t *ck, int64_t t, double *dl)
{
    const int64_t E = DL_ROUTE_WIDTH(&ck->c->route);
    if (ck->st[DL_VALUE_ROUTER_LOGITS].cand || ck->st[DL_VALUE_ROUTER_SCORES].cand ||
        !ck->in->router_weight) {
        memset(dl, 0, (size_t)E * sizeof *dl);
        return 0;
    }
    const dl_check_profile_t *p = dl__ck_prof(ck, DL_VALUE_ROUTER_LOGITS);
    const double kin = (dl__ck_on_input_grid(p, ck->act) ? 0 : 1) +
                       (dl__ck_on_input_grid(p, DL_F32) ? 0 : 1);
    /* the router GEMM's K and M from beside the stage (route_check.c) */
    const double K = (double)dl__route_logit_k(ck->c);
    const double rel = K * fmax(p->u_acc, 0x1p-24) + kin * ldexp(1.0, -p->in_bits);
    const float *l = (const float *)ck->st[DL_VALUE_ROUTER_LOGITS].eff + t * E;
    for (int64_t e = 0; e < E; e++)
        dl[e] = rel * dl__route_logit_m(ck->c, ck->in, t, e) + 0x1p-23 * fabs((double)l[e]);
    return 1;
}

void dl__ck_key_tolv(const dl__ck_t *ck, int64_t t, double *tol)
{
    const int64_t E = DL_ROUTE_WIDTH(&ck->c->route);
    const float *scores = ck->st[DL_VALUE_ROUTER_SCORES].eff;
    const float *logits = ck->st[DL_VALUE_ROUTER_LOGITS].eff;
    const float *s = scores + t * E;
    /* the hidden router's error per expert, through the score function as
     * the score stage propagates it (stages/route_check.c) */
    if (hidden_logit_err(ck, t, tol))
        dl__route_score_prop_row(&ck->c->route, E, s, tol, tol);
    double mx, zs; /* the softmax row terms, once for the row's E bounds */
    dl__route_score_m_row(&ck->c->route, E, logits + t * E, s, &mx, &zs);
    dl__ck_bc_t bc;
    score_coef(ck, 1, &bc);
    for (int64_t e = 0; e < E; e++) {
        tol[e] += score_bound_at(ck, &bc, logits + t * E, s, e, mx, zs);
        if (ck->c->route.has_bias)
            tol[e] += 2.0 * 0x1p-24 * fabs(dl__ck_key(ck, s, e)); /* the key's own rounding */
    }
}

int dl__ck_sel_init(dl__ck_t *ck, dl__ck_sel_t *w)
{
    const int64_t E = DL_ROUTE_WIDTH(&ck->c->route), k = ck->k;
    w->srow = dl__ck_alloc(ck, E, sizeof *w->srow);
    w->tol = dl__ck_alloc(ck, E, sizeof *w->tol);
    w->ids = dl__ck_alloc(ck, k, sizeof *w->ids);
    w->wt = dl__ck_alloc(ck, k, sizeof *w->wt);
    w->in = dl__ck_alloc(ck, E, 1);
    return w->srow && w->tol && w->ids && w->wt && w->in ? 0 : DL_ENOMEM;
}

/* Token t's scores moved by dir * tol[e] (+1 for the experts of c, -1 for
 * the others, times sign) into srow[E]; in[E] scratch. */
static void moved_row(const dl__ck_t *ck, int64_t t, const int32_t *c, double sign,
                      const double *tol, uint8_t *in, float *srow)
{
    const int64_t E = DL_ROUTE_WIDTH(&ck->c->route), k = ck->k;
    const float *s = (const float *)ck->st[DL_VALUE_ROUTER_SCORES].eff + t * E;
    memset(in, 0, (size_t)E);
    for (int64_t j = 0; j < k; j++)
        if (c[j] >= 0 && c[j] < E)
            in[c[j]] = 1;
    for (int64_t e = 0; e < E; e++) {
        const double dir = (in[e] ? 1.0 : -1.0) * sign;
        /* just past the tolerance: an exact tie at the edge breaks towards c */
        const double mv = tol[e] + 2.0 * dl__ck_ulp(s[e], DL_F32);
        srow[e] = (float)((double)s[e] + dir * mv);
    }
}

/* The rule on token t's moved scores (moved_row with w->tol), into w->ids;
 * 0 or an error. */
static int select_moved(const dl__ck_t *ck, int64_t t, const int32_t *c, double sign,
                        dl__ck_sel_t *w)
{
    moved_row(ck, t, c, sign, w->tol, w->in, w->srow);
    float mg;
    return dl_route_topk(&ck->c->route, w->srow, ck->in->expert_bias, 1, w->ids, w->wt, &mg);
}

int dl__ck_plausible(const dl__ck_t *ck, int64_t t, const int32_t *c, dl__ck_sel_t *w)
{
    if (ck->c->route.hash_vocab > 0)
        return 0; /* a table's choice has no tie: another set is wrong */
    return select_moved(ck, t, c, 1.0, w) == 0 && dl__ck_same_set(w->ids, c, ck->k);
}

int dl__ck_may_flip(const dl__ck_t *ck, int64_t t, const int32_t *x, dl__ck_sel_t *w)
{
    if (ck->c->route.hash_vocab > 0)
        return 0; /* a table's choice does not move with the scores */
    if (ck->tie_margin && ck->tie_margin[t] == 0.0f)
        return 1; /* an exact tie */
    return select_moved(ck, t, x, -1.0, w) != 0 || !dl__ck_same_set(w->ids, x, ck->k);
}

/* dl__ck_may_flip of every token's exact selection, into flip[T], with the
 * rule run once on all T moved rows (one call, not T: each call validates,
 * allocates and opens its parallel region); should that call fail (a moved
 * row not finite), token by token as dl__ck_may_flip. w->tol is left
 * holding the last token's tolerances. */
static int flip_rows(dl__ck_t *ck, dl__ck_sel_t *w, float *rows, int32_t *ids, float *wt,
                     float *mg, uint8_t *flip)
{
    const int64_t T = ck->T, E = DL_ROUTE_WIDTH(&ck->c->route), k = ck->k;
    for (int64_t t = 0; t < T; t++) {
        dl__ck_key_tolv(ck, t, w->tol);
        moved_row(ck, t, ck->exact_ids + t * k, -1.0, w->tol, w->in, rows + t * E);
    }
    const int rc = dl_route_topk(&ck->c->route, rows, ck->in->expert_bias, T, ids, wt, mg);
    for (int64_t t = 0; t < T; t++) {
        const int32_t *x = ck->exact_ids + t * k;
        if (rc)
            dl__ck_key_tolv(ck, t, w->tol);
        flip[t] = rc ? dl__ck_may_flip(ck, t, x, w)
                     : (ck->tie_margin && ck->tie_margin[t] == 0.0f) ||
                           !dl__ck_same_set(ids + t * k, x, k);
    }
    return 0;
}

int dl__ck_may_flip_all(dl__ck_t *ck, dl__ck_sel_t *w, uint8_t *flip)
{
    const int64_t T = ck->T, E = DL_ROUTE_WIDTH(&ck->c->route), k = ck->k;
    if (ck->c->route.hash_vocab > 0 || T == 0) {
        memset(flip, 0, (size_t)T); /* a table's choice does not move with the scores */
        return 0;
    }
    float *rows = dl__ck_take(ck, T * E, sizeof *rows, 0), *wt = dl__ck_take(ck, T * k, sizeof *wt, 0);
    int32_t *ids = dl__ck_take(ck, T * k, sizeof *ids, 0);
    float *mg = dl__ck_take(ck, T, sizeof *mg, 0);
    const int rc = rows && wt && ids && mg ? flip_rows(ck, w, rows, ids, wt, mg, flip) : DL_ENOMEM;
    dl__ck_give(ck, rows, (size_t)(T * E) * sizeof *rows);
    dl__ck_give(ck, wt, (size_t)(T * k) * sizeof *wt);
    dl__ck_give(ck, ids, (size_t)(T * k) * sizeof *ids);
    dl__ck_give(ck, mg, (size_t)T * sizeof *mg);
    return rc;
}
