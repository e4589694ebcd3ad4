/* Ties in candidates without routing. A fused kernel exposes `out` but not
 * the selection it made; on a token inside its tie margin (an exact tie, or
 * a gap its own score rounding can flip) any of the plausible selections is
 * legitimate, and judging out against the golden's alone would FAIL a
 * correct kernel that broke the tie the other way. So for each such token
 * the runner lists the selections the exact rule gives when the near-tied
 * keys (and near-tied groups) move by more than the score tolerance, and
 * keeps the one whose exact out row is nearest the candidate's; the rest of
 * the check then runs on those ids, as if the candidate had stored them. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

#define MAX_UNITS 12 /* perturbed keys or groups per token: 2^12 selections tried */
#define MAX_SETS 512 /* distinct plausible selections kept per token */

/* Group g's score as the selection ranks it (the stage's own: its best
 * key, or the sum of its best keys rounded once to fp32); -inf where the
 * stage finds none (only the order of such scores matters here). */
static double group_score(const dl__ck_t *ck, const float *s, int64_t g)
{
    float gs;
    return dl__route_group_score(&ck->c->route, s, ck->in->expert_bias, g, &gs) ? -INFINITY
                                                                                : gs;
}

/* The units whose order is in doubt, by their own tolerances tol[E]:
 * experts that can cross the boundary of the selection x (an unchosen one
 * whose key plus its tolerance reaches the weakest chosen key less its
 * own, and the chosen ones such a rival can pass), and with group-limited
 * routing the groups that can cross the kept groups' boundary likewise
 * (their experts move together). units[i] >= 0 is an expert, -1 - g a
 * group. Only a generator: every selection found is tested by
 * dl__ck_plausible. */
static int near_units(const dl__ck_t *ck, const float *s, const int32_t *x, const double *tol,
                      uint8_t *in, int *units)
{
    const int64_t E = DL_ROUTE_WIDTH(&ck->c->route), k = ck->k;
    const dl_route_config_t *rc = &ck->c->route;
    double lo = INFINITY, hi = -INFINITY;
    memset(in, 0, (size_t)E);
    for (int64_t j = 0; j < k; j++) {
        in[x[j]] = 1;
        lo = fmin(lo, dl__ck_key(ck, s, x[j]) - tol[x[j]]);
    }
    for (int64_t e = 0; e < E; e++)
        if (!in[e])
            hi = fmax(hi, dl__ck_key(ck, s, e) + tol[e]);
    int n = 0;
    for (int64_t e = 0; e < E && n < MAX_UNITS; e++) {
        const double key = dl__ck_key(ck, s, e);
        if (in[e] ? key - tol[e] <= hi : key + tol[e] >= lo)
            units[n++] = (int)e;
    }
    if (rc->n_group > 1 && E / rc->n_group <= 64 && rc->n_group <= 256) {
        const int64_t G = E / rc->n_group, terms = dl_route_group_terms(rc);
        double gs[256], gt[256], glo = INFINITY, ghi = -INFINITY;
        uint8_t kept[256] = {0};
        for (int64_t g = 0; g < rc->n_group; g++) {
            gs[g] = group_score(ck, s, g);
            gt[g] = 0.0;
            for (int64_t e = g * G; e < (g + 1) * G; e++)
                gt[g] = fmax(gt[g], tol[e]);
            gt[g] *= (double)terms;
        }
        for (int64_t j = 0; j < k; j++)
            kept[x[j] / G] = 1;
        for (int64_t g = 0; g < rc->n_group; g++)
            if (kept[g])
                glo = fmin(glo, gs[g] - gt[g]);
            else
                ghi = fmax(ghi, gs[g] + gt[g]);
        for (int64_t g = 0; g < rc->n_group && n < MAX_UNITS; g++)
            if (kept[g] ? gs[g] - gt[g] <= ghi : gs[g] + gt[g] >= glo)
                units[n++] = (int)(-1 - g);
    }
    return n;
}

/* The distinct plausible selections of token t under every up/down move of
 * the units by twice their tolerance, into sets [cap][k] (the golden's
 * first); their count. */
static int plausible(const dl__ck_t *ck, int64_t t, const int32_t *x, dl__ck_sel_t *sel,
                     int32_t *sets, int cap, float *srow)
{
    const int64_t E = DL_ROUTE_WIDTH(&ck->c->route), k = ck->k;
    const dl_route_config_t *rc = &ck->c->route;
    const double *tol = sel->tol;
    const float *s = (const float *)ck->st[DL_VALUE_ROUTER_SCORES].eff + t * E;
    int units[MAX_UNITS];
    int nu = near_units(ck, s, x, tol, sel->in, units);
    int n = 1;
    memcpy(sets, x, (size_t)k * sizeof *sets);
    for (long mask = 0; mask < (1L << nu) && n < cap; mask++) {
        memcpy(srow, s, (size_t)E * sizeof *srow);
        for (int i = 0; i < nu; i++) {
            const double dir = (mask >> i) & 1 ? 1.0 : -1.0;
            int64_t lo = units[i], hi = units[i] + 1;
            if (units[i] < 0) {
                const int64_t G = E / rc->n_group;
                lo = (int64_t)(-1 - units[i]) * G;
                hi = lo + G;
            }
            for (int64_t e = lo; e < hi; e++) {
                double dl = fmax(2.0 * tol[e], 8.0 * dl__ck_ulp(srow[e], DL_F32));
                srow[e] = (float)((double)srow[e] + dir * dl);
            }
        }
        int32_t *c = sets + (size_t)n * k;
        float w[64], mg; /* k <= 64: dl__ck_infer_ties */
        if (dl_route_topk(rc, srow, ck->in->expert_bias, 1, c, w, &mg))
            continue;
        int seen = 0;
        for (int i = 0; i < n && !seen; i++)
            seen = dl__ck_same_set(sets + (size_t)i * k, c, k);
        /* a move of twice the tolerance may overshoot: only what each
         * expert's own tolerance allows stays */
        n += !seen && dl__ck_plausible(ck, t, c, sel);
    }
    return n;
}

/* y_e(x_t) for every expert e of the union of the sets: rows ys[e] (d
 * floats each, NULL for experts not used), the stages' own forward. */
static int expert_rows(const dl__ck_t *ck, int64_t t, const uint8_t *used, float *ys,
                       int64_t *off, float *xr, float *hg, float *hu)
{
    const int64_t E = DL_ROUTE_WIDTH(&ck->c->route), d = ck->d;
    int64_t m = 0;
    for (int64_t e = 0; e < E; e++) {
        off[e] = m;
        if (!used[e])
            continue;
        float *row = xr + (m++) * d;
        if (ck->c->route.weight_on_input) { /* Llama-4: the expert sees x scaled by its score */
            const float s = ((const float *)ck->st[DL_VALUE_ROUTER_SCORES].eff)[t * E + e];
            const int32_t p0 = 0;
            int rc = dl_route_scale_input(ck->in->x + t * d, 1, d, 1, &s, &p0, ck->act, row);
            if (rc)
                return rc;
        } else {
            memcpy(row, ck->in->x + t * d, (size_t)d * sizeof *xr);
        }
    }
    off[E] = m;
    /* the real experts' rows (the first off[E_real]); a zero expert's row
     * is its input (LongCat-Flash's identity) */
    const int64_t Er = ck->c->route.experts;
    int rc = dl__experts_forward_rows(ck->c, ck->in, xr, off, hg, hu, ys);
    for (int64_t e = Er; !rc && e < E; e++)
        if (used[e])
            memcpy(ys + off[e] * d, xr + off[e] * d, (size_t)d * sizeof *ys);
    return rc;
}

typedef struct {
    int32_t *sets;
    float *srow, *ys, *xr, *hg, *hu, *yk, *orow;
    int64_t *off;
    uint8_t *used;
    int cap;
} scratch_t;

/* The index of the set whose out row is nearest cand (the golden's on a
 * draw), or a negative error. */
static int nearest(const dl__ck_t *ck, int64_t t, const scratch_t *w, int n, const float *cand)
{
    const int64_t E = DL_ROUTE_WIDTH(&ck->c->route), k = ck->k, d = ck->d;
    memset(w->used, 0, (size_t)E);
    for (int i = 0; i < n * k; i++)
        w->used[w->sets[i]] = 1;
    int rc = expert_rows(ck, t, w->used, w->ys, w->off, w->xr, w->hg, w->hu);
    if (rc)
        return rc;
    const float *s = (const float *)ck->st[DL_VALUE_ROUTER_SCORES].eff + t * E;
    int best = 0;
    double best_err = INFINITY, err0 = INFINITY;
    for (int i = 0; i < n; i++) {
        const int32_t *c = w->sets + (size_t)i * k;
        float wt[64];
        int32_t slot[64];
        if (dl_route_weights(&ck->c->route, s, c, wt))
            continue;
        /* the token's exact out row under set c: the combine stage on its
         * experts' rows */
        for (int64_t j = 0; j < k; j++) {
            memcpy(w->yk + j * d, w->ys + w->off[c[j]] * d, (size_t)d * sizeof *w->yk);
            slot[j] = (int32_t)j;
        }
        if (dl_combine(w->yk, wt, slot, 1, k, d, ck->act, w->orow))
            continue;
        double err = 0.0;
        for (int64_t col = 0; col < d; col++)
            err = fmax(err, fabs((double)w->orow[col] - (double)cand[t * d + col]));
        if (i == 0)
            err0 = err;
        if (err < best_err) {
            best_err = err;
            best = i;
        }
    }
    /* Another selection must explain the row far better than the golden's:
     * a tie broken the other way leaves rounding, where a dropped or
     * wrongly weighted slot leaves a contribution-sized error either way
     * (and stays the drop search's to name). */
    return best > 0 && 4.0 * best_err < err0 ? best : 0;
}

/* Writes set c into the token's ids in the golden's slot order: experts
 * both selections share keep their slot, the others fill the rest. */
static void place(int32_t *dst, const int32_t *x, const int32_t *c, int64_t k)
{
    uint8_t used[64] = {0};
    for (int64_t j = 0; j < k; j++) {
        dst[j] = -1;
        for (int64_t q = 0; q < k; q++)
            if (c[q] == x[j]) {
                dst[j] = x[j];
                used[q] = 1;
            }
    }
    int64_t q = 0;
    for (int64_t j = 0; j < k; j++) {
        if (dst[j] >= 0)
            continue;
        while (used[q])
            q++;
        dst[j] = c[q];
        used[q] = 1;
    }
}

static int scratch_init(dl__ck_t *ck, scratch_t *w)
{
    const int64_t E = DL_ROUTE_WIDTH(&ck->c->route), k = ck->k, d = ck->d, f = ck->f ? ck->f : 1;
    w->cap = MAX_SETS;
    w->sets = dl__ck_alloc(ck, (int64_t)w->cap * k, sizeof *w->sets);
    w->srow = dl__ck_alloc(ck, E, sizeof *w->srow);
    w->ys = dl__ck_alloc(ck, E * d, sizeof *w->ys);
    w->xr = dl__ck_alloc(ck, E * d, sizeof *w->xr);
    w->hg = dl__ck_alloc(ck, E * f, sizeof *w->hg);
    w->hu = dl__ck_alloc(ck, E * f, sizeof *w->hu);
    w->yk = dl__ck_alloc(ck, k * d, sizeof *w->yk);
    w->orow = dl__ck_alloc(ck, d, sizeof *w->orow);
    w->off = dl__ck_alloc(ck, E + 1, sizeof *w->off);
    w->used = dl__ck_alloc(ck, E, 1);
    return w->sets && w->srow && w->ys && w->xr && w->hg && w->hu && w->yk && w->orow &&
                   w->off && w->used
               ? 0
               : DL_ENOMEM;
}

int dl__ck_infer_ties(dl__ck_t *ck, int32_t **ids_out)
{
    const int64_t T = ck->T, k = ck->k;
    const float *cand = ck->st[DL_VALUE_OUT].cand;
    *ids_out = NULL;
    if (!cand || !ck->tie_margin || !ck->st[DL_VALUE_ROUTER_SCORES].eff || k > 64 ||
        ck->opt.exact_upstream)
        return 0;
    scratch_t w;
    dl__ck_sel_t sel;
    int rc0 = dl__ck_sel_init(ck, &sel);
    if (rc0)
        return rc0;
    int32_t *ids = NULL;
    int64_t n_amb = 0, n_changed = 0, first = -1;
    uint8_t *flip = dl__ck_alloc(ck, T, 1);
    if (!flip || (rc0 = dl__ck_may_flip_all(ck, &sel, flip)))
        return flip ? rc0 : DL_ENOMEM;
    for (int64_t t = 0; t < T; t++) {
        const int32_t *x = ck->exact_ids + t * k;
        if (!flip[t])
            continue;
        dl__ck_key_tolv(ck, t, sel.tol);
        n_amb++;
        if (!ids) {
            int rc = scratch_init(ck, &w);
            if (rc || !(ids = dl__ck_alloc(ck, ck->M, sizeof *ids)))
                return rc ? rc : DL_ENOMEM;
            memcpy(ids, ck->exact_ids, (size_t)ck->M * sizeof *ids);
        }
        int n = plausible(ck, t, x, &sel, w.sets, w.cap, w.srow);
        int b = n > 1 ? nearest(ck, t, &w, n, cand) : 0;
        if (b < 0)
            return b;
        if (b > 0) {
            place(ids + t * k, x, w.sets + (size_t)b * k, k);
            if (first < 0)
                first = t;
            n_changed++;
        }
    }
    if (!n_changed)
        return 0;
    dl_check_result_t *r = dl__ck_result(ck, DL_VALUE_TOPK_IDS, "routing");
    if (!r)
        return DL_ENOMEM;
    r->verdict = DL_VERDICT_WARN;
    r->n_checked = n_amb;
    r->n_over_pass = n_changed;
    r->worst_index = first;
    dl__ck_msg(r, "no topk_ids: %lld of %lld tokens inside their tie margin; the selection that "
                  "explains out differs from the golden's on %lld (first: token %lld) and is "
                  "used downstream",
               (long long)n_amb, (long long)T, (long long)n_changed, (long long)first);
    *ids_out = ids;
    return 0;
}
