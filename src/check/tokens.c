/* Token accounting: the candidate's slot order put in canonical order, its
 * dispatch checked as a bijection onto the T*k assignments, group sizes and
 * offsets checked exactly, and wrong output rows diagnosed as dropped
 * (token, slot) pairs. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

/* The candidate may list a token's experts in any order. Where its set
 * equals the exact set, its slots are renumbered to the exact order so that
 * golden values can be reused downstream; elsewhere its own order stays. */
int dl__ck_canonicalise(dl__ck_t *ck)
{
    const int64_t T = ck->T, k = ck->k, E = DL_ROUTE_WIDTH(&ck->c->route), M = ck->M;
    const int32_t *cid = ck->st[DL_VALUE_TOPK_IDS].cand;
    ck->ids_cand_valid = 1;
    if (!cid)
        return 0;
    int32_t *map = NULL;
    for (int64_t t = 0; t < T; t++) {
        const int32_t *c = cid + t * k, *x = ck->exact_ids + t * k;
        int ok = 1;
        for (int64_t j = 0; j < k && ok; j++) {
            ok = c[j] >= 0 && c[j] < E;
            for (int64_t i = 0; i < j && ok; i++)
                ok = c[i] != c[j];
        }
        if (!ok) {
            ck->ids_cand_valid = 0;
            continue;
        }
        int64_t pos[1024]; /* k <= 1024 (dl_moe_config_validate) */
        int same = 1;
        for (int64_t j = 0; j < k && same; j++) {
            pos[j] = -1;
            for (int64_t i = 0; i < k; i++)
                if (x[i] == c[j])
                    pos[j] = i;
            same = pos[j] >= 0;
        }
        if (!same)
            continue;
        for (int64_t j = 0; j < k; j++) {
            if (pos[j] == j)
                continue;
            if (!map) {
                map = dl__ck_alloc(ck, M, sizeof *map);
                if (!map)
                    return DL_ENOMEM;
                for (int64_t fl = 0; fl < M; fl++)
                    map[fl] = (int32_t)fl;
            }
            map[t * k + j] = (int32_t)(t * k + pos[j]);
        }
    }
    if (!map)
        return 0;
    int32_t *inv = dl__ck_alloc(ck, M, sizeof *inv);
    if (!inv)
        return DL_ENOMEM;
    for (int64_t fl = 0; fl < M; fl++)
        inv[map[fl]] = (int32_t)fl;
    ck->to_canon = map;
    ck->from_canon = inv;

    /* per-slot arrays: value at canonical slot */
    static const dl_value_t slot_float[] = {DL_VALUE_TOPK_WEIGHTS, DL_VALUE_D_TOPK_WEIGHTS};
    for (size_t i = 0; i < 2; i++) {
        const float *src = ck->st[slot_float[i]].cand;
        if (!src)
            continue;
        float *dst = dl__ck_alloc(ck, M, sizeof *dst);
        if (!dst)
            return DL_ENOMEM;
        for (int64_t fl = 0; fl < M; fl++)
            dst[map[fl]] = src[fl];
        ck->st[slot_float[i]].cand = dst;
    }
    int32_t *ids = dl__ck_alloc(ck, M, sizeof *ids);
    if (!ids)
        return DL_ENOMEM;
    for (int64_t fl = 0; fl < M; fl++)
        ids[map[fl]] = cid[fl];
    ck->st[DL_VALUE_TOPK_IDS].cand = ids;
    /* sort_perm holds flat indices: renumber its values */
    const int32_t *sp = ck->st[DL_VALUE_SORT_PERM].cand;
    if (sp) {
        int32_t *d = dl__ck_alloc(ck, M, sizeof *d);
        if (!d)
            return DL_ENOMEM;
        for (int64_t p = 0; p < M; p++)
            d[p] = sp[p] >= 0 && sp[p] < M ? map[sp[p]] : sp[p];
        ck->st[DL_VALUE_SORT_PERM].cand = d;
    }
    /* inv_perm is indexed by flat index */
    const int32_t *ip = ck->st[DL_VALUE_INV_PERM].cand;
    if (ip) {
        int32_t *d = dl__ck_alloc(ck, M, sizeof *d);
        if (!d)
            return DL_ENOMEM;
        for (int64_t fl = 0; fl < M; fl++)
            d[map[fl]] = ip[fl];
        ck->st[DL_VALUE_INV_PERM].cand = d;
    }
    return 0;
}

/* Flat index in the candidate's own slot numbering, for messages. */
static int64_t cand_flat(const dl__ck_t *ck, int64_t canon)
{
    return ck->from_canon ? ck->from_canon[canon] : canon;
}

/* Lists up to max (token, slot) pairs of flat canonical indices. */
static void list_pairs(dl__ck_t *ck, dl_check_result_t *r, const int32_t *fl, int64_t n)
{
    const int64_t lim = n < ck->opt.max_listed ? n : ck->opt.max_listed;
    for (int64_t i = 0; i < lim; i++) {
        int64_t f = cand_flat(ck, fl[i]);
        dl__ck_msg_append(r, "%s(%lld,%lld)", i ? " " : "", (long long)(f / ck->k),
                          (long long)(f % ck->k));
    }
    if (n > lim)
        dl__ck_msg_append(r, " ...");
}

/* Offsets the candidate laid its rows out by: its own when valid, else
 * from its sizes when valid, else the oracle's. */
static const int64_t *layout_offsets(dl__ck_t *ck, const int64_t *oracle)
{
    const int64_t E = ck->E, M = ck->M;
    const int64_t *co = ck->st[DL_VALUE_GROUP_OFFSETS].cand;
    if (co) {
        int ok = co[0] == 0;
        for (int64_t e = 0; e < E && ok; e++)
            ok = co[e + 1] >= co[e] && co[e + 1] <= M;
        if (ok)
            return co;
    }
    const int64_t *cs = ck->st[DL_VALUE_GROUP_SIZES].cand;
    if (cs) {
        int64_t *o = dl__ck_alloc(ck, E + 1, sizeof *o);
        if (!o)
            return NULL;
        int ok = 1;
        for (int64_t e = 0; e < E && ok; e++) {
            ok = cs[e] >= 0 && cs[e] <= M - o[e];
            o[e + 1] = ok ? o[e] + cs[e] : 0;
        }
        if (ok)
            return o;
    }
    return oracle;
}

/* The exact dispatch of the effective ids: the golden's when they are
 * bitwise its ids, else recomputed by the stage. */
static int exact_dispatch(dl__ck_t *ck)
{
    const int64_t T = ck->T, k = ck->k, E = ck->E, M = ck->M;
    int32_t *sort_o, *inv_o;
    int64_t *size_o, *off_o;
    const int gold = ck->st[DL_VALUE_TOPK_IDS].eff_golden;
    if (gold && !ck->opt.recompute_all) {
        sort_o = ck->gf->sort_perm;
        inv_o = ck->gf->inv_perm;
        size_o = ck->gf->group_sizes;
        off_o = ck->gf->group_offsets;
    } else {
        sort_o = dl__ck_alloc(ck, M, sizeof *sort_o);
        inv_o = dl__ck_alloc(ck, M, sizeof *inv_o);
        size_o = dl__ck_alloc(ck, E, sizeof *size_o);
        off_o = dl__ck_alloc(ck, E + 1, sizeof *off_o);
        if (!sort_o || !inv_o || !size_o || !off_o)
            return DL_ENOMEM;
        int rc = dl__sort_assignments_z(ck->st[DL_VALUE_TOPK_IDS].eff, T, k, E,
                                        ck->c->route.zero_experts, sort_o, inv_o, size_o, off_o);
        if (rc)
            return rc;
    }
    const void *orc[4] = {sort_o, inv_o, size_o, off_o};
    for (int i = 0; i < 4; i++) {
        dl_value_t s = (dl_value_t)(DL_VALUE_SORT_PERM + i);
        ck->st[s].exact = ck->st[s].eff = orc[i];
        ck->st[s].exact_golden = ck->st[s].eff_golden = gold;
    }
    return 0;
}

/* The candidate's permutation from its inv_perm alone (rows claimed twice
 * hold neither assignment). */
static const int32_t *perm_from_inv(dl__ck_t *ck, const int32_t *ci)
{
    const int64_t M = ck->M;
    int32_t *p = dl__ck_alloc(ck, M, sizeof *p);
    if (!p)
        return NULL;
    for (int64_t i = 0; i < M; i++)
        p[i] = -1;
    for (int64_t fl = 0; fl < M; fl++)
        if (ci[fl] >= 0 && ci[fl] < M) {
            if (p[ci[fl]] < 0)
                p[ci[fl]] = (int32_t)fl;
            else
                p[ci[fl]] = INT32_MAX; /* two assignments in one row: neither is there */
        }
    return p;
}

/* What the scan of a candidate permutation found. */
typedef struct {
    int64_t n_range, n_dup, n_miss, n_place, first;
} scan_t;

/* Scans the candidate's permutation cp row by row against its own group
 * layout: where[fl] gets the row of assignment fl (-1: nowhere), miss the
 * assignments dispatched nowhere (each also noted as a drop). */
static int scan_perm(dl__ck_t *ck, const int32_t *cp, const int64_t *lay, int32_t *where,
                     int32_t *miss, scan_t *sc)
{
    const int64_t M = ck->M, E = ck->E;
    const int32_t *ids = ck->st[DL_VALUE_TOPK_IDS].eff;
    memset(sc, 0, sizeof *sc);
    sc->first = -1;
    for (int64_t fl = 0; fl < M; fl++)
        where[fl] = -1;
    int64_t e = 0;
    for (int64_t p = 0; p < M; p++) {
        while (e < E && p >= lay[e + 1])
            e++;
        const int64_t fl = cp[p];
        if (fl < 0 || fl >= M) {
            /* padding past the candidate's last group is no finding by
             * itself: the missing assignment is (and so is a zero expert's
             * row missing from the identity tail) */
            if (p < lay[E]) {
                sc->n_range++;
                if (sc->first < 0)
                    sc->first = p;
            }
            continue;
        }
        if (where[fl] >= 0) {
            sc->n_dup++;
            if (sc->first < 0)
                sc->first = p;
            continue;
        }
        where[fl] = (int32_t)p;
        /* past the last group: the identity tail, a zero expert's rows
         * (ids in [E, E + Z), in any order) */
        if (e >= E || p >= lay[E] ? ids[fl] < E : ids[fl] != e) {
            sc->n_place++;
            if (sc->first < 0)
                sc->first = p;
        }
    }
    for (int64_t fl = 0; fl < M; fl++)
        if (where[fl] < 0) {
            miss[sc->n_miss++] = (int32_t)fl;
            int rc = dl__ck_add_drop(ck, fl);
            if (rc)
                return rc;
        }
    return 0;
}

static void bijection_verdict(dl__ck_t *ck, dl_check_result_t *r, const scan_t *sc,
                              const int32_t *miss, int same)
{
    const int64_t M = ck->M;
    r->n_checked = M;
    r->n_over_warn = sc->n_range + sc->n_dup + sc->n_miss + sc->n_place;
    r->n_over_pass = r->n_over_warn;
    r->worst_index = sc->first;
    if (r->n_over_warn) {
        r->verdict = DL_VERDICT_FAIL;
        if (sc->n_miss) {
            dl__ck_msg(r, "%lld assignments dispatched nowhere (dropped):", (long long)sc->n_miss);
            list_pairs(ck, r, miss, sc->n_miss);
            dl__ck_msg_append(r, "; ");
        }
        if (sc->n_range)
            dl__ck_msg_append(r, "%lld entries outside [0,T*k); ", (long long)sc->n_range);
        if (sc->n_dup)
            dl__ck_msg_append(r, "%lld duplicate entries; ", (long long)sc->n_dup);
        if (sc->n_place)
            dl__ck_msg_append(r, "%lld rows in another expert's segment", (long long)sc->n_place);
    } else if (!same) {
        r->verdict = DL_VERDICT_WARN;
        r->n_over_warn = 0;
        dl__ck_msg(r, "a valid dispatch in another order than the stable sort by expert "
                      "(rows are compared in the candidate's order)");
    } else {
        r->verdict = DL_VERDICT_PASS;
        r->n_over_pass = 0;
        dl__ck_msg(r, "every one of %lld assignments dispatched exactly once, stable order",
                   (long long)M);
    }
}

/* The candidate's dispatch cp as a bijection onto the assignments; where it
 * is not the oracle's order, the row map for the sorted-row stages. */
static int check_bijection(dl__ck_t *ck, const int32_t *cp, int from_inv)
{
    const int64_t M = ck->M;
    const int32_t *sort_o = ck->st[DL_VALUE_SORT_PERM].exact;
    dl_check_result_t *r = dl__ck_result(ck, from_inv ? DL_VALUE_INV_PERM : DL_VALUE_SORT_PERM,
                                         "bijection");
    int32_t *where = dl__ck_alloc(ck, M, sizeof *where); /* flat -> candidate row */
    int32_t *miss = dl__ck_alloc(ck, M, sizeof *miss);
    const int64_t *lay = layout_offsets(ck, ck->st[DL_VALUE_GROUP_OFFSETS].exact);
    if (!r || !where || !miss || !lay)
        return DL_ENOMEM;
    scan_t sc;
    int rc = scan_perm(ck, cp, lay, where, miss, &sc);
    if (rc)
        return rc;
    int same = !sc.n_range && !sc.n_dup && !sc.n_miss && !sc.n_place;
    for (int64_t p = 0; p < M && same; p++)
        same = cp[p] == sort_o[p];
    bijection_verdict(ck, r, &sc, miss, same);
    if (same)
        return 0;
    int32_t *map = dl__ck_alloc(ck, M, sizeof *map);
    uint8_t *gone = dl__ck_alloc(ck, M, sizeof *gone);
    if (!map || !gone)
        return DL_ENOMEM;
    for (int64_t q = 0; q < M; q++) {
        map[q] = where[sort_o[q]];
        gone[q] = map[q] < 0;
        ck->n_row_missing += gone[q];
    }
    ck->row_map = map;
    ck->row_missing = ck->n_row_missing ? gone : NULL;
    return 0;
}

/* inv_perm must invert the candidate's own sort_perm. */
static int check_inverse(dl__ck_t *ck, const int32_t *ci, const int32_t *cp)
{
    const int64_t M = ck->M;
    dl_check_result_t *r = dl__ck_result(ck, DL_VALUE_INV_PERM, "inverse");
    if (!r)
        return DL_ENOMEM;
    int64_t bad = 0, first = -1;
    for (int64_t fl = 0; fl < M; fl++) {
        const int64_t p = ci[fl];
        int ok = p >= 0 && p < M && cp[p] == fl;
        if (!ok) {
            bad++;
            if (first < 0)
                first = cand_flat(ck, fl);
        }
    }
    r->n_checked = M;
    r->n_over_pass = r->n_over_warn = bad;
    r->worst_index = first;
    r->verdict = bad ? DL_VERDICT_FAIL : DL_VERDICT_PASS;
    if (bad)
        dl__ck_msg(r, "%lld entries do not invert sort_perm (first at flat index %lld)",
                   (long long)bad, (long long)first);
    else
        dl__ck_msg(r, "inverts sort_perm");
    return 0;
}

/* The assignments to real experts, the rows the group sizes count: T*k
 * less the zero experts' (LongCat-Flash's identity tail): the exact
 * layout's last offset once exact_dispatch has sorted the effective ids,
 * else counted from them. */
static int64_t real_rows(const dl__ck_t *ck)
{
    const int64_t *off = ck->st[DL_VALUE_GROUP_OFFSETS].exact;
    const int32_t *ids = ck->st[DL_VALUE_TOPK_IDS].eff;
    if (off || ck->c->route.zero_experts <= 0 || !ids)
        return off ? off[ck->E] : ck->M;
    int64_t n = ck->M;
    for (int64_t fl = 0; fl < ck->M; fl++)
        n -= ids[fl] >= ck->E;
    return n;
}

static int check_sizes(dl__ck_t *ck, const int64_t *cs)
{
    const int64_t E = ck->E, M = ck->M, Mr = real_rows(ck);
    const int64_t *size_o = ck->st[DL_VALUE_GROUP_SIZES].exact;
    dl_check_result_t *r = dl__ck_result(ck, DL_VALUE_GROUP_SIZES, "exact");
    if (!r)
        return DL_ENOMEM;
    int64_t bad = 0, first = -1;
    int over = 0;
    int64_t sum = 0;
    for (int64_t e = 0; e < E; e++) {
        if (cs[e] != size_o[e]) {
            bad++;
            if (first < 0)
                first = e;
        }
        if (cs[e] < 0 || cs[e] > M)
            over = 1;
        else if (!over)
            sum += cs[e];
    }
    r->n_checked = E;
    r->n_over_pass = r->n_over_warn = bad;
    r->worst_index = first;
    if (first >= 0) {
        r->worst_cand = (double)cs[first];
        r->worst_exact = (double)size_o[first];
    }
    r->verdict = bad ? DL_VERDICT_FAIL : DL_VERDICT_PASS;
    if (over)
        dl__ck_msg(r, "sizes outside [0,T*k]; ");
    else if (sum != Mr)
        dl__ck_msg(r, "sizes sum to %lld, not the %lld assignments to real experts; ",
                   (long long)sum, (long long)Mr);
    if (bad)
        dl__ck_msg_append(r, "%lld of %lld experts differ (first: expert %lld, %lld vs %lld)",
                          (long long)bad, (long long)E, (long long)first,
                          (long long)cs[first], (long long)size_o[first]);
    else
        dl__ck_msg(r, "all %lld group sizes exact, sum %lld%s", (long long)E,
                   (long long)Mr, Mr == M ? " = T*k" : " (the rest identity rows)");
    return 0;
}

static int check_offsets(dl__ck_t *ck, const int64_t *co)
{
    const int64_t E = ck->E, M = ck->M;
    const int64_t *off_o = ck->st[DL_VALUE_GROUP_OFFSETS].exact;
    dl_check_result_t *r = dl__ck_result(ck, DL_VALUE_GROUP_OFFSETS, "exact");
    if (!r)
        return DL_ENOMEM;
    int64_t bad = 0, first = -1;
    for (int64_t e = 0; e <= E; e++)
        if (co[e] != off_o[e]) {
            bad++;
            if (first < 0)
                first = e;
        }
    r->n_checked = E + 1;
    r->n_over_pass = r->n_over_warn = bad;
    r->worst_index = first;
    if (first >= 0) {
        r->worst_cand = (double)co[first];
        r->worst_exact = (double)off_o[first];
    }
    r->verdict = bad ? DL_VERDICT_FAIL : DL_VERDICT_PASS;
    if (bad)
        dl__ck_msg(r, "%lld of %lld offsets differ (first: [%lld] %lld vs %lld; end %lld vs T*k %lld)",
                   (long long)bad, (long long)(E + 1), (long long)first, (long long)co[first],
                   (long long)off_o[first], (long long)co[E], (long long)M);
    else
        dl__ck_msg(r, "all %lld offsets exact", (long long)(E + 1));
    return 0;
}

/* The identity tail (zero experts, LongCat-Flash): each of the exact
 * layout's tail rows q, at the candidate's row of that assignment, must be
 * bitwise src row(q) (y_sorted: the token's input x; d_x_sorted: the
 * candidate's own d_y_sorted row, the identity's VJP). The grouped GEMMs'
 * numerics judge the real experts' rows only. */
static int check_identity(dl__ck_t *ck, dl_value_t s, const float *cand, const float *dy)
{
    const int64_t M = ck->M, d = ck->d, k = ck->k;
    const int32_t *sort_o = ck->st[DL_VALUE_SORT_PERM].exact;
    const int64_t *off_o = ck->st[DL_VALUE_GROUP_OFFSETS].exact;
    dl_check_result_t *r = dl__ck_result(ck, s, "identity");
    if (!r)
        return DL_ENOMEM;
    int64_t bad = 0, first = -1, n = 0;
    float *fixed = NULL; /* downstream sees the FAILed rows' defined values */
    for (int64_t q = off_o[ck->E]; q < M; q++) {
        const int64_t p = ck->row_map ? ck->row_map[q] : q;
        if (p < 0)
            continue; /* not dispatched: the token accounting names it */
        const float *want = dy ? dy + p * d : ck->in->x + (sort_o[q] / k) * d;
        n++;
        if (!memcmp(cand + p * d, want, (size_t)d * sizeof *want))
            continue;
        bad++;
        first = first < 0 ? cand_flat(ck, sort_o[q]) : first;
        if (!fixed && (fixed = dl__ck_alloc(ck, M * d, sizeof *fixed)))
            memcpy(fixed, cand, (size_t)(M * d) * sizeof *fixed);
        if (!fixed)
            return DL_ENOMEM;
        memcpy(fixed + p * d, want, (size_t)d * sizeof *want);
    }
    if (fixed) /* as a FAILed stage's exact value is: its defect stays its own */
        ck->st[s].cand = fixed;
    r->n_checked = n * d;
    r->n_over_pass = r->n_over_warn = bad;
    r->worst_index = first;
    r->verdict = bad ? DL_VERDICT_FAIL : DL_VERDICT_PASS;
    if (bad)
        dl__ck_msg(r, "%lld of %lld zero-expert rows are not %s (first: token %lld, slot %lld)",
                   (long long)bad, (long long)n, dy ? "their d_y_sorted rows" : "their token's x",
                   (long long)(first / k), (long long)(first % k));
    else
        dl__ck_msg(r, "all %lld zero-expert rows are %s exactly", (long long)n,
                   dy ? "their d_y_sorted rows" : "their token's x");
    return 0;
}

/* A hidden array's rows of the identity tail are no expert's: a kernel
 * runs its GEMMs over the real experts' rows only and never writes them.
 * A candidate's copy is judged with those rows at their defined +0,
 * whatever it left there (garbage, NaN, uninitialised bits). */
static int ignore_hidden_tail(dl__ck_t *ck)
{
    static const dl_value_t hidden[] = {DL_VALUE_H_GATE, DL_VALUE_H_UP, DL_VALUE_H_ACT,
                                        DL_VALUE_D_H_ACT, DL_VALUE_D_H_GATE, DL_VALUE_D_H_UP};
    const int64_t M = ck->M, f = ck->f;
    const int64_t *off_o = ck->st[DL_VALUE_GROUP_OFFSETS].exact;
    for (size_t h = 0; h < sizeof hidden / sizeof *hidden; h++) {
        const float *c = ck->st[hidden[h]].cand;
        if (!c || ck->st[hidden[h]].numel != M * f)
            continue;
        float *z = dl__ck_alloc(ck, M * f, sizeof *z);
        if (!z)
            return DL_ENOMEM;
        memcpy(z, c, (size_t)(M * f) * sizeof *z);
        for (int64_t q = off_o[ck->E]; q < M; q++) {
            const int64_t p = ck->row_map ? ck->row_map[q] : q;
            if (p >= 0)
                memset(z + p * f, 0, (size_t)f * sizeof *z);
        }
        ck->st[hidden[h]].cand = z;
    }
    return 0;
}

/* The zero experts' rows of y_sorted and (with the candidate's d_y_sorted)
 * of d_x_sorted; the hidden arrays' tail ignored; nothing without zero
 * experts. */
static int check_identities(dl__ck_t *ck)
{
    if (ck->c->route.zero_experts <= 0)
        return 0;
    int rh = ignore_hidden_tail(ck);
    if (rh)
        return rh;
    const float *y = ck->st[DL_VALUE_Y_SORTED].cand, *dxs = ck->st[DL_VALUE_D_X_SORTED].cand;
    const float *dy = ck->st[DL_VALUE_D_Y_SORTED].cand;
    int rc = y ? check_identity(ck, DL_VALUE_Y_SORTED, y, NULL) : 0;
    return rc || !dxs || !dy ? rc : check_identity(ck, DL_VALUE_D_X_SORTED, dxs, dy);
}

int dl__ck_tokens(dl__ck_t *ck)
{
    int rc = exact_dispatch(ck);
    if (rc)
        return rc;
    /* the candidate's permutation: its sort_perm, else the inverse of its inv_perm */
    const int32_t *cp = ck->st[DL_VALUE_SORT_PERM].cand;
    const int32_t *ci = ck->st[DL_VALUE_INV_PERM].cand;
    const int from_inv = !cp && ci;
    if (from_inv && !(cp = perm_from_inv(ck, ci)))
        return DL_ENOMEM;
    if (cp && (rc = check_bijection(ck, cp, from_inv)))
        return rc;
    if (ci && !from_inv && (rc = check_inverse(ck, ci, cp)))
        return rc;
    const int64_t *cs = ck->st[DL_VALUE_GROUP_SIZES].cand;
    if (cs && (rc = check_sizes(ck, cs)))
        return rc;
    const int64_t *co = ck->st[DL_VALUE_GROUP_OFFSETS].cand;
    if (co && (rc = check_offsets(ck, co)))
        return rc;
    return check_identities(ck);
}

/* Whether candidate row t equals the exact combine without the slots in
 * mask, within the bound of that combine; *seen gets the removed slots that
 * are visible. The combine's element, its M and the worst-case error the
 * absent y_sorted, weights and shared terms carry into the slots kept are
 * the stage's own (dl__out_*_elem beside the combine; v has the WARN
 * tier's deltas). */
static int row_matches(dl__ck_t *ck, const dl__vctx_t *v, const float *cand_row, int64_t t,
                       uint64_t mask, uint64_t *seen_out)
{
    const int64_t k = ck->k, d = ck->d, K = dl__out_terms(v);
    dl__cmp_t cmp = {.stage = DL_VALUE_OUT, .t = ck->act, .K = K, .short_sum = 1};
    uint64_t seen = 0;
    for (int64_t i = 0; i < d; i++) {
        int bad = 0;
        const double g = dl__out_exact_elem(v, t, i, mask, &bad);
        const double c = cand_row[i];
        if (bad || !isfinite(c))
            return 0;
        /* the tighter of the worst case and the statistical tier (the
         * latter with out's own sigma, which covers the slots kept) */
        const double *ps = ck->prop_out[DL__TIER_STAT];
        double pr = dl__out_prop_elem(v, t, i, mask) * (1.0 + 0x1p-20);
        if (ps)
            pr = fmin(pr, ck->lambda * ps[t * d + i]);
        const double B = dl__ck_bound(ck, &cmp, g, dl__out_mag_elem(v, t, i, mask), K, 1) + pr;
        if (fabs(c - g) > B)
            return 0;
        /* a removed slot is visible where its contribution exceeds B
         * somewhere in the row (the row without it fits there, the row with
         * it cannot); only visible slots are named: naming one that is not
         * would be a guess (a wrong row that is no drop) */
        for (int64_t j = 0; j < k && j < 64; j++)
            if (((mask >> j) & 1) && dl__out_slot(v, t, j, i) > B)
                seen |= (uint64_t)1 << j;
    }
    *seen_out = seen & mask;
    return 1;
}

static int popcount64(uint64_t x)
{
    int n = 0;
    for (; x; x &= x - 1)
        n++;
    return n;
}

int dl__ck_diagnose_out(dl__ck_t *ck, const uint8_t *row_fail, const float *cand_out)
{
    const int64_t T = ck->T, k = ck->k, d = ck->d;
    if (!ck->st[DL_VALUE_Y_SORTED].eff || !ck->st[DL_VALUE_TOPK_WEIGHTS].eff ||
        !ck->st[DL_VALUE_INV_PERM].eff)
        return 0;
    dl__vctx_t v;
    dl__ck_vctx(ck, DL__TIER_WARN, &v);
    /* the subsets to try, fewest slots first: all of them up to k = 8,
     * else each single slot and the whole token */
    uint64_t *masks = NULL;
    int64_t nm = 0;
    if (k <= 8) {
        masks = malloc(((size_t)1 << k) * sizeof *masks);
        if (!masks)
            return DL_ENOMEM;
        for (int pc = 1; pc <= k; pc++)
            for (uint64_t m = 1; m < ((uint64_t)1 << k); m++)
                if (popcount64(m) == pc)
                    masks[nm++] = m;
    } else {
        masks = malloc((size_t)(k + 1) * sizeof *masks);
        if (!masks)
            return DL_ENOMEM;
        for (int64_t j = 0; j < k && j < 64; j++)
            masks[nm++] = (uint64_t)1 << j;
        masks[nm++] = ~(uint64_t)0;
    }
    uint64_t *found = calloc((size_t)(T > 0 ? T : 1), sizeof *found);
    if (!found) {
        free(masks);
        return DL_ENOMEM;
    }
    /* the smallest drop set that fits the row with every member visible is
     * named; where none does, a slot is named when it is a visible member
     * of the smallest set that fits and belongs to every set that fits (the
     * true one among them): a visible drop beside sub-floor ones is named
     * (issue 24: it was once refused with them), and a present slot that
     * some other fitting set happens to remove is not. The smallest set's
     * other members are counted below the floor, not named. */
    const uint64_t all = k < 64 ? ((uint64_t)1 << k) - 1 : ~(uint64_t)0;
    int64_t nrows = 0, unexplained = 0, unnamed = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : nrows, unexplained, unnamed)
    for (int64_t t = 0; t < T; t++) {
        if (!row_fail[t])
            continue;
        nrows++;
        uint64_t seen = 0, vis = 0, smallest = 0, every = all;
        int fits = 0;
        for (int64_t i = 0; i < nm; i++) {
            if (!row_matches(ck, &v, cand_out + t * d, t, masks[i], &seen))
                continue;
            if (seen == (masks[i] & all)) { /* every member visible */
                smallest = vis = every = seen;
                fits = 1;
                break;
            }
            if (!fits) {
                smallest = masks[i] & all;
                vis = seen;
            }
            every &= masks[i];
            fits = 1;
        }
        found[t] = fits ? every & vis : 0;
        unnamed += fits ? popcount64(smallest) - popcount64(found[t]) : 0;
        unexplained += !fits;
    }
    int rc = 0;
    for (int64_t t = 0; t < T && !rc; t++)
        for (int64_t j = 0; j < k && j < 64 && !rc; j++)
            if ((found[t] >> j) & 1)
                rc = dl__ck_add_drop(ck, t * k + j);
    ck->n_diag_rows += nrows;
    ck->n_unexplained += unexplained;
    ck->n_unnamed += unnamed;
    free(found);
    free(masks);
    return rc;
}

static int drop_cmp(const void *a, const void *b)
{
    const dl_check_drop_t *x = a, *y = b;
    if (x->token != y->token)
        return x->token < y->token ? -1 : 1;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

/* Without the dispatch, zero drops rest on out alone. A kernel that dropped
 * slot (t, j) and was otherwise within the model computes the combine
 * without it: its out differs from that by at most B' per element, the
 * combine's own bound plus what the absent upstream propagates, and B' <=
 * B + 2u(1 + 2u)|w_j y_j,i| (the dropped combine's magnitude is at most
 * |g| + |w_j y_j|). The exact out differs from the dropped one by
 * w_j y_j,i; so |w_j y_j,i| <= |c_i - g_i| + B', and the slot is proven
 * present wherever |w_j y_j,i| (1 - 2u(1 + 2u)) > |c_i - g_i| + B_i: that is
 * the detection floor, at most 2B (c within B, else out FAILs) and about B
 * for a kernel close to the exact values. Without the candidate's out (not
 * finite) the floor is 2B. A slot whose contribution is exactly 0 in every
 * element (a zero token, weight or expert output) cannot be seen: dropping
 * it leaves out unchanged, so out cannot prove it present; it is below the
 * floor like any other (issue 24: a zero token was once "proven present"),
 * and counted in *zero too. Finds the slot of nonzero contribution with the
 * smallest ratio of its largest contribution to the floor (*weak, as
 * t*k+j, -1 if none) and counts the slots below the floor; fl: scratch of
 * T (d + 2 + 2k) doubles (the floors, and per row and slot what the ordered
 * pass after the parallel one needs). */
static int64_t below_floor(dl__ck_t *ck, double *fl, double *weak_ratio, int64_t *weak,
                           double *floor_max, double *floor_min, int64_t *zero)
{
    const int64_t T = ck->T, k = ck->k, d = ck->d;
    const float *g = ck->st[DL_VALUE_OUT].exact;
    dl__vctx_t v;
    dl__ck_vctx(ck, -1, &v);
    const double *prop = ck->prop_out[1], *ps = ck->prop_out[DL__TIER_STAT];
    const float *c = ck->st[DL_VALUE_OUT].eff_is_cand ? ck->st[DL_VALUE_OUT].eff : NULL;
    const double uo = dl_dtype_unit_roundoff(ck->act), shrink = 1.0 - 2.0 * uo * (1.0 + 2.0 * uo);
    const int64_t K = dl__out_terms(&v);
    const dl__cmp_t cmp = {.stage = DL_VALUE_OUT, .t = ck->act, .K = K, .short_sum = 1};
    dl__ck_bc_t bc; /* dl__ck_bound's coefficients, the same for every element */
    dl__ck_bound_coef(ck, &cmp, K, 1, &bc);
    /* per token row, in parallel (independent rows): the floors' extremes
     * (rmin, rmax) and each slot's best ratio and largest contribution */
    double *rmin = fl + T * d, *rmax = rmin + T, *best = rmax + T, *seen = best + T * k;
    DL__PAR_FOR(T * k * d > DL__PAR_MIN, schedule(static),
    for (int64_t t = 0; t < T; t++) {
        double *f = fl + t * d, lo = INFINITY, hi = 0.0;
        /* the floor of each element of the row, once for its k slots */
        for (int64_t i = 0; i < d; i++) {
            const double m = dl__out_mag_elem(&v, t, i, 0); /* the combine's M */
            /* out FAILs beyond B, the tighter of its worst-case and
             * statistical bounds; the floor is B plus the candidate's own
             * error there (2B without it) */
            double pr = prop ? prop[t * d + i] : 0.0;
            if (ps)
                pr = fmin(pr, ck->lambda * ps[t * d + i]);
            const double B = dl__ck_bound_at(&bc, g[t * d + i], m) + pr;
            f[i] = (c ? fabs((double)c[t * d + i] - (double)g[t * d + i]) + B : 2.0 * B) / shrink;
            lo = fmin(lo, f[i]);
            hi = fmax(hi, f[i]);
        }
        rmin[t] = lo;
        rmax[t] = hi;
        for (int64_t j = 0; j < k; j++) {
            double b = 0.0, sn = 0.0;
            for (int64_t i = 0; i < d; i++) {
                const double cj = dl__out_slot(&v, t, j, i);
                if (cj / f[i] > b)
                    b = cj / f[i];
                sn = fmax(sn, cj);
            }
            best[t * k + j] = b;
            seen[t * k + j] = sn;
        }
    });
    int64_t n = 0;
    *zero = 0;
    *weak_ratio = INFINITY;
    *weak = -1;
    *floor_max = 0.0;
    *floor_min = INFINITY;
    for (int64_t t = 0; t < T; t++) { /* in order: the first weakest slot */
        *floor_min = fmin(*floor_min, rmin[t]);
        *floor_max = fmax(*floor_max, rmax[t]);
        for (int64_t j = 0; j < k; j++) {
            if (seen[t * k + j] == 0.0) { /* nothing a drop could change: no proof either */
                ++*zero;
                ++n;
                continue;
            }
            n += !(best[t * k + j] > 1.0);
            if (best[t * k + j] < *weak_ratio) {
                *weak_ratio = best[t * k + j];
                *weak = t * k + j;
            }
        }
    }
    return n;
}

int dl__ck_zero_drops(dl__ck_t *ck)
{
    dl_check_report_t *rep = ck->rep;
    if (rep->n_dropped > 1)
        qsort(rep->dropped, (size_t)rep->n_dropped, sizeof *rep->dropped, drop_cmp);
    const int has_disp = ck->st[DL_VALUE_SORT_PERM].cand || ck->st[DL_VALUE_INV_PERM].cand ||
                         ck->st[DL_VALUE_GROUP_SIZES].cand || ck->st[DL_VALUE_GROUP_OFFSETS].cand;
    const int has_out = ck->st[DL_VALUE_OUT].cand != NULL;
    dl_check_result_t *r = dl__ck_result(ck, DL_VALUE_NONE, "zero_drops");
    if (!r)
        return DL_ENOMEM;
    if (!has_disp && !has_out) {
        dl__ck_msg(r, "neither dispatch nor out provided");
        return 0;
    }
    const int64_t M = ck->M, E = ck->E, Mr = real_rows(ck); /* Mr: zero experts' rows not counted */
    int64_t sum = Mr, nbad = 0; /* sizes (or end offsets) outside [0, M] are not summed */
    const int64_t *cs = ck->st[DL_VALUE_GROUP_SIZES].cand;
    const int64_t *co = ck->st[DL_VALUE_GROUP_OFFSETS].cand;
    if (cs) {
        sum = 0;
        for (int64_t e = 0; e < E; e++)
            if (cs[e] >= 0 && cs[e] <= M)
                sum += cs[e];
            else
                nbad++;
    } else if (co) {
        nbad = (co[0] < 0 || co[0] > M) + (co[E] < 0 || co[E] > M);
        sum = nbad ? 0 : co[E] - co[0];
    }
    r->n_checked = M;
    r->n_over_pass = r->n_over_warn = rep->n_dropped;
    if (rep->n_dropped || nbad || sum != Mr) {
        r->verdict = DL_VERDICT_FAIL;
        if (rep->n_dropped) {
            dl__ck_msg(r, "%lld (token, slot) pairs dropped:", (long long)rep->n_dropped);
            const int64_t lim = rep->n_dropped < ck->opt.max_listed ? rep->n_dropped
                                                                      : ck->opt.max_listed;
            for (int64_t i = 0; i < lim; i++)
                dl__ck_msg_append(r, " (%lld,%lld)", (long long)rep->dropped[i].token,
                                  (long long)rep->dropped[i].slot);
            if (rep->n_dropped > lim)
                dl__ck_msg_append(r, " ...");
            r->worst_index = rep->dropped[0].token * ck->k + rep->dropped[0].slot;
        }
        if (nbad)
            dl__ck_msg_append(r, "%s%lld group %s outside [0, %lld]", rep->n_dropped ? "; " : "",
                              (long long)nbad, cs ? "sizes" : "offsets", (long long)M);
        else if (sum != Mr)
            dl__ck_msg_append(r, "%sgroup sizes account for %lld of %lld assignments to real "
                              "experts", rep->n_dropped ? "; " : "", (long long)sum, (long long)Mr);
    } else if (!has_disp && ck->st[DL_VALUE_OUT].exact && ck->st[DL_VALUE_Y_SORTED].eff) {
        /* the proof from out alone: never a PASS by default */
        const int64_t nfl = ck->T * (ck->d + 2 + 2 * ck->k);
        double ratio, fmax, fmin, *fl = dl__ck_take(ck, nfl, sizeof *fl, 0);
        int64_t weak, zero;
        if (!fl)
            return DL_ENOMEM;
        const int64_t nb = below_floor(ck, fl, &ratio, &weak, &fmax, &fmin, &zero);
        dl__ck_give(ck, fl, (size_t)nfl * sizeof *fl);
        const int64_t wf = weak >= 0 && ck->from_canon ? ck->from_canon[weak] : weak;
        r->err_pass = r->err_warn = ratio > 0 ? 1.0 / ratio : INFINITY;
        r->worst_index = wf;
        if (nb) {
            r->verdict = DL_VERDICT_WARN;
            dl__ck_msg(r, "cannot prove zero drops: %lld of %lld (token, slot) pairs contribute "
                       "less to out than the detection floor (the bound out FAILs beyond plus "
                       "out's own error there: %.3g to %.3g per element; the smallest contribution "
                       "seen for certain is %.3g)", (long long)nb, (long long)M, fmin, fmax, fmin);
            if (zero)
                dl__ck_msg_append(r, "; %lld of them contribute exactly 0 (a zero token, weight or "
                                  "expert output): their drop would change nothing in out",
                                  (long long)zero);
            if (weak >= 0)
                dl__ck_msg_append(r, "; weakest nonzero (%lld,%lld) at %.3g x the floor",
                                  (long long)(wf / ck->k), (long long)(wf % ck->k), ratio);
            dl__ck_msg_append(r, "; no dispatch provided");
        } else {
            r->verdict = DL_VERDICT_PASS;
            dl__ck_msg(r, "all %lld assignments proven present in out: each slot's contribution "
                       "exceeds the detection floor (the bound out FAILs beyond plus out's own "
                       "error there: %.3g to %.3g per element)", (long long)M, fmin, fmax);
            if (weak >= 0)
                dl__ck_msg_append(r, "; weakest (%lld,%lld) at %.3g x the floor",
                                  (long long)(wf / ck->k), (long long)(wf % ck->k), ratio);
        }
    } else {
        r->verdict = DL_VERDICT_PASS;
        dl__ck_msg(r, "all %lld assignments accounted for%s", (long long)M,
                   has_out ? ", every out row complete" : "");
    }
    if (ck->n_unnamed)
        dl__ck_msg_append(r, "; %lld more slots of those rows' drop sets lie below the detection "
                          "floor (their absence shows only together): not named",
                          (long long)ck->n_unnamed);
    if (ck->n_unexplained)
        dl__ck_msg_append(r, "; %lld wrong out rows not explained by missing slots",
                          (long long)ck->n_unexplained);
    return 0;
}
