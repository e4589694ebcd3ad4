/* Routing checks: the tie-aware top-k comparison. (The exact routing
 * weights for the candidate's own ids, the score VJP on stored d_scores
 * and their magnitudes are the routing stages' checking side,
 * src/stages/route_check.c.) */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

/* ------------------------------------------------------- the ids check */

/* The exact selection on the effective scores: the golden's when they are
 * bitwise its scores, else recomputed by the stage. */
static int exact_selection(dl__ck_t *ck)
{
    const int64_t T = ck->T, M = ck->M;
    if (ck->st[DL_VALUE_ROUTER_SCORES].eff_golden && ck->gf->tie_margin && !ck->opt.recompute_all) {
        ck->exact_ids = ck->gf->topk_ids;
        ck->exact_weights = ck->gf->topk_weights;
        ck->tie_margin = ck->gf->tie_margin;
        ck->st[DL_VALUE_TOPK_IDS].exact_golden = 1;
    } else {
        int32_t *ids = dl__ck_alloc(ck, M, sizeof *ids);
        float *w = dl__ck_alloc(ck, M, sizeof *w);
        float *mg = dl__ck_alloc(ck, T, sizeof *mg);
        if (!ids || !w || !mg)
            return DL_ENOMEM;
        const dl_route_config_t *rt = &ck->c->route;
        int rc = rt->hash_vocab > 0 /* hash routing: the table chooses */
                     ? dl_route_hash(rt, ck->st[DL_VALUE_ROUTER_SCORES].eff, ck->in->hash_table,
                                     ck->in->token_ids, T, ids, w, mg)
                     : dl_route_topk(rt, ck->st[DL_VALUE_ROUTER_SCORES].eff, ck->in->expert_bias,
                                     T, ids, w, mg);
        if (rc)
            return rc;
        ck->exact_ids = ids;
        ck->exact_weights = w;
        ck->tie_margin = mg;
        ck->st[DL_VALUE_TOPK_IDS].exact_golden =
            !memcmp(ids, ck->gf->topk_ids, (size_t)M * sizeof *ids);
    }
    ck->st[DL_VALUE_TOPK_IDS].exact = ck->exact_ids;
    return 0;
}

/* Tally of the ids check. */
#define IDS_LISTED 3 /* failing tokens whose expected and chosen experts are listed */
typedef struct {
    int64_t n_range, n_dup, n_tie, n_fail, first_fail, first_tie;
    double worst_ratio;
    int64_t listed[IDS_LISTED];
    int n_listed;
} ids_tally_t;

/* 1 when token t's ids c are invalid (counted into n_range / n_dup). */
static int bad_ids(const int32_t *c, int64_t k, int64_t E, ids_tally_t *y)
{
    for (int64_t j = 0; j < k; j++) {
        if (c[j] < 0 || c[j] >= E) {
            y->n_range++;
            return 1;
        }
        for (int64_t i = 0; i < j; i++)
            if (c[i] == c[j]) {
                y->n_dup++;
                return 1;
            }
    }
    return 0;
}

/* A different expert set for token t is a WARN only when it is a plausible
 * tie: the exact rule gives it with every key within its own expert's
 * tolerance (select.c). */
static void judge_other_set(const dl__ck_t *ck, int64_t t, const int32_t *c, const int32_t *x,
                            dl__ck_sel_t *w, ids_tally_t *y)
{
    dl__ck_key_tolv(ck, t, w->tol);
    double tau = 0.0;
    for (int64_t j = 0; j < ck->k; j++)
        tau = fmax(tau, w->tol[x[j]] + w->tol[c[j]]);
    const double margin = ck->tie_margin[t];
    const int tie = dl__ck_plausible(ck, t, c, w);
    double ratio = tau > 0 ? margin / tau : INFINITY;
    if (tie) {
        y->n_tie++;
        if (y->first_tie < 0)
            y->first_tie = t;
    } else {
        y->n_fail++;
        if (y->n_listed < IDS_LISTED)
            y->listed[y->n_listed++] = t;
        if (y->first_fail < 0 || ratio > y->worst_ratio)
            y->worst_ratio = ratio;
        if (y->first_fail < 0)
            y->first_fail = t;
    }
}

/* Appends the k ids of a token as {a,b,...}. */
static void list_ids(dl_check_result_t *r, const int32_t *c, int64_t k)
{
    for (int64_t j = 0; j < k; j++)
        dl__ck_msg_append(r, "%s%d", j ? "," : "{", (int)c[j]);
    dl__ck_msg_append(r, "}");
}

static void ids_verdict(const dl__ck_t *ck, dl_check_result_t *r, const ids_tally_t *y,
                        const int32_t *cid)
{
    const int64_t T = ck->T;
    r->n_checked = T;
    r->n_over_pass = y->n_tie + y->n_fail;
    r->n_over_warn = y->n_fail;
    r->worst_index = y->first_fail >= 0 ? y->first_fail : y->first_tie;
    if (y->n_fail) {
        r->verdict = DL_VERDICT_FAIL;
        if (y->n_range || y->n_dup)
            dl__ck_msg(r, "%lld tokens with ids out of [0,%lld), %lld with repeated ids; ",
                       (long long)y->n_range, (long long)DL_ROUTE_WIDTH(&ck->c->route), (long long)y->n_dup);
        dl__ck_msg_append(r, "%lld of %lld tokens select other experts outside the tie margin "
                             "(first: token %lld)",
                          (long long)(y->n_fail - y->n_range - y->n_dup), (long long)T,
                          (long long)y->first_fail);
        if (y->n_tie)
            dl__ck_msg_append(r, "; %lld more inside it", (long long)y->n_tie);
        for (int i = 0; i < y->n_listed; i++) {
            const int64_t t = y->listed[i];
            dl__ck_msg_append(r, "%s token %lld expected ", i ? ";" : ":", (long long)t);
            list_ids(r, ck->exact_ids + t * ck->k, ck->k);
            dl__ck_msg_append(r, " chose ");
            list_ids(r, cid + t * ck->k, ck->k);
        }
    } else if (y->n_tie) {
        r->verdict = DL_VERDICT_WARN;
        dl__ck_msg(r, "%lld of %lld tokens select other experts inside the tie margin "
                      "(first: token %lld)",
                   (long long)y->n_tie, (long long)T, (long long)y->first_tie);
    } else {
        r->verdict = DL_VERDICT_PASS;
        dl__ck_msg(r, "all %lld tokens select the exact expert sets", (long long)T);
    }
}

/* The candidate's ids token by token against the exact selection. */
static int check_ids(dl__ck_t *ck, const int32_t *cid)
{
    const int64_t k = ck->k;
    dl_check_result_t *r = dl__ck_result(ck, DL_VALUE_TOPK_IDS, "routing");
    if (!r)
        return DL_ENOMEM;
    ids_tally_t y;
    memset(&y, 0, sizeof y);
    y.first_fail = y.first_tie = -1;
    dl__ck_sel_t w;
    int rc = dl__ck_sel_init(ck, &w);
    if (rc)
        return rc;
    for (int64_t t = 0; t < ck->T; t++) {
        const int32_t *c = cid + t * k, *x = ck->exact_ids + t * k;
        if (bad_ids(c, k, DL_ROUTE_WIDTH(&ck->c->route), &y)) {
            y.n_fail++;
            if (y.n_listed < IDS_LISTED)
                y.listed[y.n_listed++] = t;
            if (y.first_fail < 0)
                y.first_fail = t;
            continue;
        }
        if (!dl__ck_same_set(c, x, k))
            judge_other_set(ck, t, c, x, &w, &y);
    }
    ids_verdict(ck, r, &y, cid);
    return 0;
}

int dl__ck_route_ids(dl__ck_t *ck)
{
    int rc;
    if ((rc = exact_selection(ck)) || (rc = dl__ck_canonicalise(ck)))
        return rc;
    const int32_t *cid = ck->st[DL_VALUE_TOPK_IDS].cand
                             ? dl_value_array(&ck->cand->fwd, NULL, DL_VALUE_TOPK_IDS)
                             : NULL;
    if (cid && (rc = check_ids(ck, cid)))
        return rc;
    /* the ids downstream stages are recomputed on */
    if (ck->st[DL_VALUE_TOPK_IDS].cand && ck->ids_cand_valid) {
        ck->st[DL_VALUE_TOPK_IDS].eff = ck->st[DL_VALUE_TOPK_IDS].cand;
        ck->st[DL_VALUE_TOPK_IDS].eff_is_cand = 1;
    } else {
        int32_t *inferred = NULL;
        if (!ck->st[DL_VALUE_TOPK_IDS].cand && (rc = dl__ck_infer_ties(ck, &inferred)))
            return rc;
        ck->st[DL_VALUE_TOPK_IDS].eff = inferred ? inferred : ck->exact_ids;
        ck->st[DL_VALUE_TOPK_IDS].eff_is_cand = inferred != NULL;
    }
    ck->st[DL_VALUE_TOPK_IDS].eff_golden =
        !memcmp(ck->st[DL_VALUE_TOPK_IDS].eff, ck->gf->topk_ids, (size_t)ck->M * sizeof(int32_t));
    return 0;
}
