/* Stage-local numerics: each stage the candidate provides is compared with
 * the exact stage function of the candidate's own upstream values (golden
 * or exact ones where it provides none), so errors never compound. Where the
 * upstream is bitwise the golden's, the golden value is the exact one and
 * nothing is recomputed. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

/* Stages stored in sorted-row order [T*k, cols]: the candidate's rows are
 * gathered into the oracle's order before anything else. */
static int64_t row_cols(const dl__ck_t *ck, dl_value_t s)
{
    const char *dims = dl_value_dims(s);
    return dims[0] == 'M' && dims[1] && !dims[2] ? dl_value_dim(ck->c, dims[1]) : 0;
}

/* Stages in the candidate's slot order [T, k]. */
static int is_slot_stage(dl_value_t s)
{
    return !strcmp(dl_value_dims(s), "Tk");
}

/* Bitwise (value) equality: permutes move values, they compute nothing. */
static void compare_copy(dl__ck_t *ck, const float *c, const float *x, int64_t rows, int64_t cols,
                         const uint8_t *skip, dl_check_result_t *r)
{
    int64_t bad = 0, nf = 0, first = -1, checked = 0;
    double mabs = 0.0, mulp = 0.0;
    for (int64_t q = 0; q < rows; q++) {
        if (skip && skip[q])
            continue;
        for (int64_t i = 0; i < cols; i++) {
            const int64_t idx = q * cols + i;
            checked++;
            if (!isfinite(c[idx]))
                nf++;
            if (c[idx] == x[idx])
                continue;
            bad++;
            if (first < 0) {
                first = idx;
                r->worst_cand = c[idx];
                r->worst_exact = x[idx];
            }
            double e = fabs((double)c[idx] - (double)x[idx]);
            if (e > mabs || e != e)
                mabs = e;
            double u = e / dl__ck_ulp(x[idx], ck->act);
            if (u > mulp || u != u)
                mulp = u;
        }
    }
    r->n_checked = checked;
    r->n_over_pass = r->n_over_warn = bad;
    r->n_nonfinite = nf;
    r->worst_index = first;
    r->max_abs = mabs;
    r->max_ulp = mulp;
    r->err_pass = r->err_warn = bad ? INFINITY : 0.0;
    r->verdict = bad || nf ? DL_VERDICT_FAIL : DL_VERDICT_PASS;
    if (bad)
        dl__ck_msg(r, "%lld of %lld elements are not the copied input (first at %lld: %.9g vs %.9g)",
                   (long long)bad, (long long)checked, (long long)first, r->worst_cand,
                   r->worst_exact);
    else
        dl__ck_msg(r, "all %lld elements copied exactly", (long long)checked);
}

/* dW of an expert that received no token must be exactly zero. */
static int empty_experts(dl__ck_t *ck, dl_value_t s, const float *c)
{
    const int64_t *size = ck->st[DL_VALUE_GROUP_SIZES].eff;
    const int64_t per = ck->st[s].numel / ck->E;
    dl_check_result_t *r = dl__ck_result(ck, s, "empty_experts");
    if (!r)
        return DL_ENOMEM;
    int64_t nempty = 0, bad = 0, first = -1, nbad_e = 0;
    char list[160] = "";
    for (int64_t e = 0; e < ck->E; e++) {
        if (size[e])
            continue;
        nempty++;
        int64_t here = 0;
        for (int64_t i = 0; i < per; i++)
            if (c[e * per + i] != 0.0f) {
                if (first < 0) {
                    first = e * per + i;
                    r->worst_cand = c[first];
                    r->worst_exact = 0.0;
                }
                here++;
            }
        bad += here;
        if (here && nbad_e++ < 8) /* every bad expert counted, the first few named */
            snprintf(list + strlen(list), sizeof list - strlen(list), " %lld (%lld)", (long long)e,
                     (long long)here);
    }
    r->n_checked = nempty * per;
    r->n_over_pass = r->n_over_warn = bad;
    r->worst_index = first;
    r->verdict = bad ? DL_VERDICT_FAIL : DL_VERDICT_PASS;
    if (bad)
        dl__ck_msg(r, "%lld nonzero elements in the gradients of experts that received no token; "
                      "bad experts (elements):%s%s %lld of %lld empty experts", (long long)bad,
                   list, nbad_e > 8 ? " ...;" : ";", (long long)nbad_e, (long long)nempty);
    else if (nempty)
        dl__ck_msg(r, "%lld empty experts, their gradients exactly zero", (long long)nempty);
    else
        dl__ck_msg(r, "no empty expert in this case");
    return 0;
}

/* The candidate's stage in the oracle's row order; rows it lacks are filled
 * from the exact values (and skipped by the comparison). */
static const float *gather(dl__ck_t *ck, dl_value_t s, const float *exact)
{
    const float *c = ck->st[s].cand;
    const int64_t cols = row_cols(ck, s);
    if (!cols || !ck->row_map)
        return c;
    float *g = dl__ck_alloc(ck, ck->M * cols, sizeof *g);
    if (!g)
        return NULL;
    DL__PAR_FOR(ck->M * cols > DL__PAR_MIN, schedule(static),
    for (int64_t q = 0; q < ck->M; q++) {
        const int64_t p = ck->row_map[q];
        memcpy(g + q * cols, p >= 0 ? c + p * cols : exact + q * cols, (size_t)cols * sizeof *g);
    });
    return g;
}

/* Maps an index of the oracle's layout back to the candidate's. */
static int64_t cand_index(const dl__ck_t *ck, dl_value_t s, int64_t idx)
{
    if (idx < 0)
        return idx;
    const int64_t cols = row_cols(ck, s);
    if (cols && ck->row_map) {
        const int64_t p = ck->row_map[idx / cols];
        return p >= 0 ? p * cols + idx % cols : idx;
    }
    if (is_slot_stage(s) && ck->from_canon)
        return ck->from_canon[idx];
    return idx;
}

/* Rows and columns of a stage for the comparison (blocks of rows run in
 * parallel): a matrix as it is stored, anything else as one row. */
static void shape2(const dl__ck_t *ck, dl_value_t s, int64_t *rows, int64_t *cols)
{
    int64_t dims[3];
    if (dl_value_shape(ck->c, s, dims) == 2) {
        *rows = dims[0];
        *cols = dims[1];
    } else {
        *rows = 1;
        *cols = ck->st[s].numel;
    }
}

/* The comparison of stage s against its exact values, set up by its
 * descriptor. */
static int setup_cmp(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    memset(mp, 0, sizeof *mp);
    cmp->mp = mp;
    mp->off = ck->st[DL_VALUE_GROUP_OFFSETS].eff;
    mp->E = ck->E;
    int rc = dl__ck_mag(ck, s, cmp, mp);
    if (!rc && !cmp->rows)
        shape2(ck, s, &cmp->rows, &cmp->cols);
    return rc;
}

int dl__ck_setup_cmp(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp)
{
    return setup_cmp(ck, s, cmp, mp);
}

enum { BCHUNK = 256 };

/* dl__ck_bound_at of n elements at M m, into own: bitwise its value (the
 * same IEEE operations in the same order, straight-line so that the
 * compiler vectorises it; the clones compute the same operations). Its
 * branches become selects of values computed on both sides: the
 * statistical tier's ulp is dl__ck_ulp's, from top's exponent bits (top
 * finite and >= 0 where it is taken: 2^(e-1) for top in [2^(e-1), 2^e),
 * floored at 2^emin = lo, times hs = 2^(1-p), all exact), fmin of two
 * values that are not NaN a select. */
DL__CK_VEC static void own_bounds(const dl__ck_bc_t *restrict bc, double hs, double lo, int n,
                                     const float *restrict g, const double *restrict m,
                                     double *restrict own)
{
    const double nu = bc->nu, f2 = bc->f2, c0 = bc->eta, kt = bc->kt, kap = bc->kap;
    const double uo = bc->uo, kw = bc->kw;
    const int stat = bc->stat;
    for (int j = 0; j < n; j++) {
        const double ag = fabs((double)g[j]), M = m[j];
        const double b0 = nu * ag * f2 + c0 + kt;
        const double top = ag * f2 + kw * M;
        uint64_t u;
        memcpy(&u, &top, sizeof u);
        u &= 0x7ff0000000000000u;
        double e2;
        memcpy(&e2, &u, sizeof e2);
        const double half = 0.5 * ((e2 > lo ? e2 : lo) * hs), ut = uo * top, alt = uo * ag * f2;
        const double r = fabs(top) <= 0x1.fffffffffffffp1023 ? (ut < half ? ut : half) : alt;
        const double bs = b0 + r;
        const double b = stat ? bs : b0, bk = b + kap * M;
        own[j] = M != 0.0 ? bk : b;
    }
}

/* own + pr (pr the propagated error p times the first-order slack), the
 * PASS/WARN tiers' and a coherent statistical tier's delta, rounded up
 * to binary32 into dl. */
DL__CK_VEC static void add_own(int n, const double *restrict own, const double *restrict p,
                               float *restrict dl)
{
    for (int j = 0; j < n; j++)
        dl[j] = dl__ck_up32f(own[j] + p[j] * DL__CK_PROP_SLACK);
}

/* x (>= 0) rounded up to binary32 into dl. */
DL__CK_VEC static void put_up(int n, const double *restrict x, float *restrict dl)
{
    for (int j = 0; j < n; j++)
        dl[j] = dl__ck_up32f(x[j]);
}

/* dl__ck_hypot_up(|own|, pr) for pr as add_own's (p NULL: 0), into res:
 * the sums of squares here, straight-line, the roots (a libm call each)
 * after; 1 where an element leaves the fast path's range (the caller
 * takes dl__ck_hypot_up itself then). */
DL__CK_VEC static int rss_sums(int n, const double *restrict own, const double *restrict p,
                               double *restrict res, double *restrict hv)
{
    int off = 0;
    for (int j = 0; j < n; j++) {
        const double a = fabs(own[j]), b = p[j] * DL__CK_PROP_SLACK;
        const double h = a > b ? a : b, l = a > b ? b : a, ss = a * a + b * b;
        /* !(h <= 2^450 && l >= 2^-450), NaN included, as a value */
        off |= (l != 0.0) & ((h > 0x1p450) | (l < 0x1p-450) | (h != h) | (l != l));
        hv[j] = l == 0.0 ? h : -1.0; /* >= 0: the root is h itself */
        res[j] = ss;
    }
    return off;
}

static int rss_own(int n, const double *own, const double *p, double *res)
{
    static const double zero[BCHUNK];
    double hv[BCHUNK];
    if (dl__ck_f64_bounds || rss_sums(n, own, p ? p : zero, res, hv))
        return 1;
    for (int j = 0; j < n; j++)
        res[j] = hv[j] >= 0.0 ? hv[j] : sqrt(res[j]) * (1.0 + 0x1p-50);
    return 0;
}

/* One row of an absent stage's deltas of one tier: its own bound at g and
 * m (NULL: M = |g|) plus the propagated error p (NULL: none), as
 * dl__ck_bound_at and dl__ck_hypot_up give them in binary64, chunk by
 * chunk, stored rounded up to binary32 (an upper bound stays one). */
int dl__ck_delta_mutant;

void dl__ck_row_deltas(const dl__ck_bc_t *bc, int64_t n, const float *g, const double *m,
                       const double *p, float *dl, int rss)
{
    const double hs = ldexp(1.0, 1 - dl_dtype_precision(bc->t)), lo = bc->eta / hs;
    double own[BCHUNK], buf[BCHUNK];
    for (int64_t j0 = 0; j0 < n; j0 += BCHUNK) {
        const int c = n - j0 < BCHUNK ? (int)(n - j0) : BCHUNK;
        const double *pj = p ? p + j0 : NULL;
        if (!m)
            for (int j = 0; j < c; j++)
                buf[j] = fabs((double)g[j0 + j]);
        own_bounds(bc, hs, lo, c, g + j0, m ? m + j0 : buf, own);
        if (!rss && p) {
            add_own(c, own, pj, dl + j0);
        } else if (!rss) {
            put_up(c, own, dl + j0);
        } else if (!rss_own(c, own, pj, buf)) {
            put_up(c, buf, dl + j0);
        } else {
            for (int j = 0; j < c; j++)
                dl[j0 + j] = dl__ck_up32f(
                    dl__ck_hypot_up(fabs(own[j]), pj ? pj[j] * DL__CK_PROP_SLACK : 0.0));
        }
        for (int j = 0; dl__ck_delta_mutant && j < c; j++) /* the tests' negative control */
            dl[j0 + j] = nextafterf(dl[j0 + j], 0.0f);
    }
}

/* An absent stage a provided one depends on: the bound on the error of the
 * candidate's hidden value, per element, its own PASS/WARN bound at the
 * exact value plus what its own absent upstream propagates (into scratch,
 * then the bound added in one pass that stores the delta in binary32). */
static int absent_delta(dl__ck_t *ck, dl_value_t s)
{
    dl__cmp_t cmp = {.stage = s, .t = dl__ck_stage_type(ck, s), .exact = ck->st[s].exact};
    dl__mprov_t mp;
    int rc = setup_cmp(ck, s, &cmp, &mp);
    if (rc)
        return rc;
    const int64_t n = ck->st[s].numel;
    const double *M = NULL; /* bulk M in scratch (the propagations below use other slots) */
    if (cmp.mp && cmp.mp->kind != DL__M_ARRAY && cmp.mp->kind != DL__M_ABS_G) {
        double *m = dl__ck_scratch(ck, DL__CK_SCR_M, n);
        if (!m)
            return DL_ENOMEM;
        if ((rc = dl__ck_m_up(ck, cmp.mp, cmp.rows, NULL, m)))
            return rc;
        M = m;
    } else if (cmp.mp && cmp.mp->kind == DL__M_ARRAY) {
        M = cmp.mp->arr;
    }
    const float *g = ck->st[s].exact;
    /* coherent: its own operands rounded to the input grid, or fed by a
     * coherent hidden value (the statistical tier propagates it linearly) */
    ck->st[s].coherent = cmp.kappa_in > 0;
    const dl_valueset_t up = dl__ck_upstream(ck, s);
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        ck->st[s].coherent |=
            ((up >> u) & 1) && ck->st[u].delta[DL__TIER_STAT] && ck->st[u].coherent;
    const int tiers = ck->lambda > 0 ? DL__TIERS : DL__TIER_STAT;
    for (int warn = 0; warn < tiers && !rc; warn++) {
        double *p = dl__ck_scratch(ck, DL__CK_SCR_P, n);
        float *dl = p ? dl__ck_take(ck, n, sizeof *dl, cmp.rows * cmp.cols != n) : NULL;
        const int any = dl ? dl__ck_propagate_into(ck, s, &cmp, warn, p) : DL_ENOMEM;
        if (any < 0) {
            rc = any;
            break;
        }
        /* the statistical tier: its own error and the propagated one are
         * independent (root sum of squares) unless coherent */
        const int rss = warn == DL__TIER_STAT && !ck->st[s].coherent;
        dl__ck_bc_t bc0;
        if (!cmp.row_K)
            dl__ck_bound_coef(ck, &cmp, cmp.K, warn, &bc0);
        DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
        for (int64_t r = 0; r < cmp.rows; r++) {
            dl__ck_bc_t bc = bc0;
            if (cmp.row_K)
                dl__ck_bound_coef(ck, &cmp, cmp.row_K[r], warn, &bc);
            const int64_t o = r * cmp.cols;
            dl__ck_row_deltas(&bc, cmp.cols, g + o, M ? M + o : NULL, any ? p + o : NULL, dl + o, rss);
        });
        ck->st[s].delta[warn] = dl;
    }
    return rc;
}

/* The bound of a provided stage grows by what its absent upstream
 * propagates into it. */
static int add_propagation(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp)
{
    const int tiers = ck->lambda > 0 ? DL__TIERS : DL__TIER_STAT;
    for (int warn = 0; warn < tiers; warn++) {
        double *p;
        int rc = dl__ck_propagate(ck, s, cmp, warn, 1, &p);
        if (rc)
            return rc;
        cmp->prop[warn] = p;
        ck->st[s].prop_used |= p != NULL;
        if (s == DL_VALUE_OUT)
            ck->prop_out[warn] = p;
    }
    return 0;
}

/* Judges stage s once more, on the golden's upstream: the candidate may
 * have computed it from golden inputs (a stage-by-stage harness) and its
 * upstream stages separately. Where that judgement is better, it replaces
 * r and says so (issue 11, item 3: the stage passes against either).
 * Returns 1 if it did, 0 if not, or an error. */
static int against_golden_upstream(dl__ck_t *ck, dl_value_t s, const float *cg, dl_check_result_t *r)
{
    const dl_valueset_t up = dl__ck_upstream(ck, s);
    int differs = 0;
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        differs |= ((up >> u) & 1) && !ck->st[u].eff_golden;
    if (r->verdict <= DL_VERDICT_PASS || !ck->st[s].gold || (!differs && !ck->st[s].prop_used) ||
        !dl__ck_golden_dispatch(ck))
        return 0;
    const void *save[DL_VALUE_COUNT];
    for (int u = 0; u < DL_VALUE_COUNT; u++) {
        save[u] = ck->st[u].eff;
        if (((up >> u) & 1) && ck->st[u].gold && dl__ck_desc((dl_value_t)u)->exact)
            ck->st[u].eff = ck->st[u].gold;
    }
    dl__cmp_t cmp = {.stage = s, .t = dl__ck_stage_type(ck, s), .cand = cg,
                     .exact = ck->st[s].gold};
    dl__mprov_t mp;
    dl_check_result_t alt = *r;
    alt.message[0] = '\0';
    int rc = setup_cmp(ck, s, &cmp, &mp);
    if (!rc)
        rc = dl__ck_compare(ck, &cmp, &alt);
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        ck->st[u].eff = save[u];
    if (rc || alt.verdict >= r->verdict)
        return rc;
    char own[64];
    snprintf(own, sizeof own, "%s at %.3g x PASS", dl_verdict_name(r->verdict), r->err_pass);
    *r = alt;
    dl__ck_msg_append(r, " [consistent with golden upstream; on the candidate's own upstream %s]",
                      own);
    return 1;
}

/* The expert whose rows hold sorted row q (oracle layout). */
static int64_t expert_of(const dl__ck_t *ck, int64_t q)
{
    const int64_t *off = ck->st[DL_VALUE_GROUP_OFFSETS].eff;
    int64_t e = 0;
    while (e + 1 < ck->E && off[e + 1] <= q)
        e++;
    return e;
}

/* Appends where the worst element of a failing stage is, in the layer's
 * terms: (expert, row in group, token, slot, column) for sorted rows,
 * (token, column) for token rows, (expert, row, column) for weight
 * gradients (issue 11, item 8). idx is in the oracle's layout. */
static void locate(const dl__ck_t *ck, dl_value_t s, int64_t idx, dl_check_result_t *r)
{
    const char *dims = dl_value_dims(s);
    int64_t sh[3];
    const int rank = dl_value_shape(ck->c, s, sh);
    if (idx < 0 || rank < 1)
        return;
    const int64_t cols = rank >= 2 ? sh[rank - 1] : 1;
    if (dims[0] == 'M' && rank == 2 && ck->st[DL_VALUE_SORT_PERM].eff) {
        const int64_t q = idx / cols, e = expert_of(ck, q);
        const int64_t *off = ck->st[DL_VALUE_GROUP_OFFSETS].eff;
        int64_t p = ((const int32_t *)ck->st[DL_VALUE_SORT_PERM].eff)[q];
        if (ck->from_canon && p >= 0 && p < ck->M)
            p = ck->from_canon[p];
        dl__ck_msg_append(r, " at (expert %lld, row %lld of %lld, token %lld, slot %lld, column %lld)",
                          (long long)e, (long long)(q - off[e]), (long long)(off[e + 1] - off[e]),
                          (long long)(p / ck->k), (long long)(p % ck->k), (long long)(idx % cols));
    } else if (dims[0] == 'T' && rank == 2) {
        int64_t t = idx / cols, c = idx % cols;
        if (dims[1] == 'k' && ck->from_canon) {
            const int64_t f = ck->from_canon[idx];
            t = f / ck->k;
            c = f % ck->k;
        }
        dl__ck_msg_append(r, " at (token %lld, %s %lld)", (long long)t,
                          dims[1] == 'k' ? "slot" : dims[1] == 'E' ? "expert" : "column", (long long)c);
    } else if (dims[0] == 'E' && rank == 3) {
        dl__ck_msg_append(r, " at (expert %lld, row %lld, column %lld)", (long long)(idx / (sh[1] * sh[2])),
                          (long long)(idx / sh[2] % sh[1]), (long long)(idx % sh[2]));
    }
}

/* Counts a failing stage's elements over the PASS bound per expert and
 * lists the bad experts: the first few and the total. */
static void per_expert(const dl__ck_t *ck, dl_value_t s, const dl__cmp_t *cmp, dl_check_result_t *r)
{
    const char *dims = dl_value_dims(s);
    const int rows_by_expert =
        dims[0] == 'M' && cmp->rows == ck->M && ck->st[DL_VALUE_GROUP_OFFSETS].eff;
    if (!cmp->row_over || (!rows_by_expert && dims[0] != 'E') || ck->E <= 0)
        return;
    int64_t *cnt = calloc((size_t)ck->E, sizeof *cnt);
    if (!cnt)
        return;
    const int64_t per = dims[0] == 'E' ? cmp->rows / ck->E : 0;
    for (int64_t q = 0; q < cmp->rows; q++)
        if (cmp->row_over[q])
            cnt[rows_by_expert ? expert_of(ck, q) : q / (per ? per : 1)] += cmp->row_over[q];
    int64_t nbad = 0;
    for (int64_t e = 0; e < ck->E; e++)
        nbad += cnt[e] > 0;
    if (nbad) {
        dl__ck_msg_append(r, "; bad experts (elements over PASS):");
        for (int64_t e = 0, shown = 0; e < ck->E && shown < 6; e++)
            if (cnt[e]) {
                dl__ck_msg_append(r, " %lld (%lld)", (long long)e, (long long)cnt[e]);
                shown++;
            }
        dl__ck_msg_append(r, "%s %lld of %lld experts", nbad > 6 ? " ...;" : ";", (long long)nbad,
                          (long long)ck->E);
    }
    free(cnt);
}

/* Setup: stage s's exact value on the effective upstream, the golden's
 * where that upstream is bitwise the golden's, else recomputed by its
 * row's function. */
static int exact_value(dl__ck_t *ck, dl_value_t s)
{
    const int64_t n = ck->st[s].numel;
    const dl_valueset_t up = dl__ck_upstream(ck, s);
    int up_golden = 1;
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        if ((up >> u) & 1)
            up_golden &= ck->st[u].eff_golden;
    if (ck->st[s].exact) {
        ck->st[s].recomputed = 1;
    } else if (up_golden && ck->st[s].gold && !ck->opt.recompute_all) {
        ck->st[s].exact = ck->st[s].gold;
        ck->st[s].exact_golden = 1;
    } else {
        float *x = dl__ck_take(ck, n, sizeof *x, 1);
        if (!x)
            return DL_ENOMEM;
        /* where parts of the upstream are the golden's, so are the parts
         * of s that depend only on them (reuse.c); else all of it */
        int rc = dl__ck_exact_reuse(ck, s, x);
        if (rc < 0 || (rc == 0 && (rc = dl__ck_exact(ck, s, x))))
            return rc;
        if (dl__ck_reuse_test.seen)
            dl__ck_reuse_test.seen(dl__ck_reuse_test.ctx, ck, s, x);
        ck->st[s].exact = x;
        ck->st[s].recomputed = ck->st[s].exact_owned = 1;
    }
    if (!ck->st[s].exact_golden)
        ck->st[s].exact_golden = ck->st[s].gold &&
                              !memcmp(ck->st[s].exact, ck->st[s].gold, (size_t)n * sizeof(float));
    return 0;
}

/* Diagnose: where a failing stage's worst element is, which experts are
 * bad, and for the layer's output which dropped slots explain its rows. */
static int diagnose(dl__ck_t *ck, dl_value_t s, const dl__cmp_t *cmp, dl_check_result_t *r,
                    int on_golden, const float *cg)
{
    if (r->verdict > DL_VERDICT_PASS && !on_golden) {
        locate(ck, s, r->worst_index, r);
        per_expert(ck, s, cmp, r);
    }
    if (cmp->row_fail && r->verdict == DL_VERDICT_FAIL)
        return dl__ck_diagnose_out(ck, cmp->row_fail, cg);
    return 0;
}

/* Compare: the candidate's stage s (cg, in the oracle's layout) against
 * its exact value within the tolerance (its absent upstream's error
 * propagated), then on the golden's upstream and as the candidate's only
 * stage where that judges better; *on_golden says one of those did. */
static int compare(dl__ck_t *ck, dl_value_t s, const float *cg, dl_check_result_t *r,
                   int *on_golden)
{
    dl__cmp_t cmp = {.stage = s, .t = dl__ck_stage_type(ck, s), .cand = cg,
                     .exact = ck->st[s].exact};
    dl__mprov_t mp;
    int rc;
    if ((rc = setup_cmp(ck, s, &cmp, &mp)) || (rc = add_propagation(ck, s, &cmp)))
        return rc;
    if (row_cols(ck, s))
        cmp.row_skip = ck->row_missing;
    if ((dl__ck_desc(s)->flags & DL__CK_DROPS) && ck->opt.diagnose_drops &&
        !(cmp.row_fail = dl__ck_alloc(ck, ck->T, 1)))
        return DL_ENOMEM;
    if (!(cmp.row_over = dl__ck_alloc(ck, cmp.rows, sizeof *cmp.row_over)))
        return DL_ENOMEM;
    if ((rc = dl__ck_compare(ck, &cmp, r)) || (rc = against_golden_upstream(ck, s, cg, r)) < 0)
        return rc;
    *on_golden = rc;
    if (!*on_golden && ck->second && (rc = ck->second(ck, s, r)) < 0)
        return rc;
    *on_golden |= rc; /* figures then are the second level's */
    return diagnose(ck, s, &cmp, r, *on_golden, cg);
}

/* The candidate's stage s judged: bitwise for a copy, else compare(); its
 * finite value becomes the effective one. */
static int judge(dl__ck_t *ck, dl_value_t s, int *cand_ok)
{
    const dl__ck_desc_t *desc = dl__ck_desc(s);
    const float *cg = gather(ck, s, ck->st[s].exact);
    if (!cg)
        return DL_ENOMEM;
    const int copy = (desc->flags & DL__CK_COPY) != 0;
    dl_check_result_t *r = dl__ck_result(ck, s, copy ? "exact" : "numerics");
    if (!r)
        return DL_ENOMEM;
    int rc = 0, on_golden = 0;
    if (copy)
        compare_copy(ck, cg, ck->st[s].exact, ck->M, row_cols(ck, s), ck->row_missing, r);
    else if ((rc = compare(ck, s, cg, r, &on_golden)))
        return rc;
    r->worst_index = cand_index(ck, s, r->worst_index);
    if (ck->st[s].recomputed && !on_golden)
        dl__ck_msg_append(r, " [recomputed on the candidate's upstream]");
    if (!copy && ck->st[s].prop_used && !on_golden)
        dl__ck_msg_append(r, " [+ error propagated from absent upstream]");
    *cand_ok = r->n_nonfinite == 0;
    if (*cand_ok) {
        ck->st[s].eff = cg;
        ck->st[s].eff_is_cand = 1;
        ck->st[s].eff_golden = ck->st[s].gold &&
                            !memcmp(cg, ck->st[s].gold, (size_t)ck->st[s].numel * sizeof(float));
    }
    if (desc->flags & DL__CK_DW)
        return empty_experts(ck, s, ck->st[s].cand);
    return 0;
}

/* One float stage: exact value, the candidate's judged, effective value
 * (the exact one where the candidate has none, with the bound on the error
 * its hidden value may carry). */
static int float_stage(dl__ck_t *ck, dl_value_t s)
{
    int rc, cand_ok = 0;
    if ((rc = exact_value(ck, s)))
        return rc;
    if (ck->st[s].cand && (rc = judge(ck, s, &cand_ok)))
        return rc;
    if (!cand_ok) {
        ck->st[s].eff = ck->st[s].exact;
        ck->st[s].eff_golden = ck->st[s].exact_golden;
        if (ck->st[s].track && !(dl__ck_desc(s)->flags & DL__CK_COPY) &&
            (rc = absent_delta(ck, s)))
            return rc;
    } else if (ck->st[s].exact_owned && s != DL_VALUE_OUT) {
        /* the candidate's value goes downstream: the recomputed one is read
         * no more (the token accounting reads out's) */
        dl__ck_give(ck, (void *)ck->st[s].exact, (size_t)ck->st[s].numel * sizeof(float));
        ck->st[s].exact = NULL;
        ck->st[s].exact_owned = 0;
    }
    return 0;
}

/* The absent stages whose deltas the propagation into s reads: its
 * upstream. A propagation that reads another one's delta must name it
 * here, or the delta is handed back before it (release_deltas). */
static dl_valueset_t delta_reads(const dl__ck_t *ck, dl_value_t s)
{
    dl_valueset_t r = dl__ck_upstream(ck, s);
    /* zero experts: prop.c's identity_tail gives the tail rows of y_sorted
     * and d_x_sorted their source's delta (x_sorted's, d_y_sorted's) */
    if (ck->c->route.zero_experts > 0 && s == DL_VALUE_Y_SORTED)
        r |= DL_VALUE_BIT(DL_VALUE_X_SORTED);
    if (ck->c->route.zero_experts > 0 && s == DL_VALUE_D_X_SORTED)
        r |= DL_VALUE_BIT(DL_VALUE_D_Y_SORTED);
    return r;
}

/* The deltas of the absent stages that no stage from s on reads (last[u]:
 * the last stage that reads it, delta_reads) are handed back for reuse. */
static void release_deltas(dl__ck_t *ck, const int *last, int s)
{
    for (int u = 0; u < s; u++)
        if (last[u] < s)
            for (int w = 0; w < DL__TIERS; w++)
                if (ck->st[u].delta[w]) {
                    dl__ck_give(ck, ck->st[u].delta[w], (size_t)ck->st[u].numel * sizeof(float));
                    ck->st[u].delta[w] = NULL;
                }
}

static int drift(dl__ck_t *ck, dl_value_t s)
{
    if (!ck->st[s].cand || !ck->st[s].gold)
        return 0;
    dl_check_result_t *r = dl__ck_result(ck, s, "drift");
    if (!r)
        return DL_ENOMEM;
    dl__cmp_t cmp = {.stage = s, .t = ck->act, .rows = ck->T, .cols = ck->d,
                     .cand = ck->st[s].cand, .exact = ck->st[s].gold, .info = 1};
    return dl__ck_compare(ck, &cmp, r);
}

static int skip(dl__ck_t *ck, dl_value_t s, const char *why)
{
    dl_check_result_t *r = dl__ck_result(ck, s, "provided");
    if (!r)
        return DL_ENOMEM;
    r->verdict = DL_VERDICT_SKIP;
    dl__ck_msg(r, "%s", why);
    return 0;
}

int dl__ck_stages(dl__ck_t *ck)
{
    int rc;
    /* which stages' values are needed: the candidate's, and their upstream */
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        ck->st[s].need = ck->st[s].cand != NULL;
    for (int s = DL_VALUE_COUNT - 1; s >= 0; s--)
        if (ck->st[s].need) {
            dl_valueset_t up = dl__ck_upstream(ck, (dl_value_t)s);
            for (int u = 0; u < s; u++)
                if ((up >> u) & 1)
                    ck->st[u].need = 1;
        }
    /* the statistical tier's multiplier: a union bound over the elements
     * it may judge, each beyond lambda sigma with probability at most
     * 2 exp(-lambda^2 / 2) (tolerances.md) */
    ck->n_stat = 0;
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        ck->n_stat +=
            ck->st[s].cand && dl_value_store((dl_value_t)s) <= DL_STORE_F32 ? ck->st[s].numel : 0;
    const double pfa = ck->opt.false_alarm == 0.0 ? DL__FALSE_ALARM_DEFAULT : ck->opt.false_alarm;
    ck->lambda = pfa > 0 && pfa < 1 && ck->n_stat > 0
                     ? sqrt(2.0 * log(2.0 * (double)ck->n_stat / pfa)) : 0.0;
    /* the absent stages whose errors reach a provided one */
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        ck->st[s].track = ck->st[s].need && !ck->st[s].cand && !ck->opt.exact_upstream;
    /* routing and dispatch are cheap and always needed for token accounting */
    for (int s = 0; s <= DL_VALUE_GROUP_OFFSETS; s++)
        ck->st[s].need = 1;

    int64_t total = 0, done = 0;
    int last[DL_VALUE_COUNT];
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        total += ck->st[s].numel > 0 ? ck->st[s].numel : 0;
        last[s] = s;
        for (int d = s + 1; d < DL_VALUE_COUNT; d++)
            if (DL_VALUE_HAS(delta_reads(ck, (dl_value_t)d), s))
                last[s] = d;
    }
    for (int si = 0; si < DL_VALUE_COUNT; si++) {
        const dl_value_t s = (dl_value_t)si;
        release_deltas(ck, last, si);
        if (ck->opt.progress)
            ck->opt.progress(ck->opt.progress_ctx, dl_value_name(s),
                             total > 0 ? (double)done / (double)total : 0.0);
        done += ck->st[s].numel > 0 ? ck->st[s].numel : 0;
        /* a stage with no element is not checked, but the routing and the
         * token accounting still set the dispatch (T = 0: E empty groups) */
        if (ck->st[s].numel == 0 && !dl__ck_desc(s)->check)
            continue;
        const int bad_shape = (ck->cand->bad_shape >> s) & 1;
        const int has = /* or fed */
            ck->st[s].cand || dl_value_array(&ck->cand->fwd, &ck->cand->bwd, s);
        if (dl_value_is_backward(s) && !ck->have_bwd) {
            if (has && !bad_shape && (rc = skip(ck, s, "the golden has no backward pass")))
                return rc;
            continue;
        }
        const dl__ck_desc_t *desc = dl__ck_desc(s);
        if (desc->check) {
            if ((rc = desc->check(ck)))
                return rc;
        } else if (desc->exact && ck->st[s].need) {
            if ((rc = float_stage(ck, s)))
                return rc;
        }
        if (!has && !bad_shape && (rc = skip(ck, s, "not provided")))
            return rc;
        if ((desc->flags & DL__CK_DROPS) && (rc = dl__ck_zero_drops(ck)))
            return rc;
        if ((desc->flags & DL__CK_DRIFT) && (rc = drift(ck, s)))
            return rc;
    }
    if (ck->opt.progress)
        ck->opt.progress(ck->opt.progress_ctx, "done", 1.0);
    return 0;
}
