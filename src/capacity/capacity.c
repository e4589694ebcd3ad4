/* capacity.c: the capacity rule, the drop policies and their cost
 * (doc/capacity.md). Counts are exact integers; percentages are binary64
 * quotients of them, for reading, never for deciding anything. */
#include "capacity/capacity_priv.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const rule_names[] = {"gshard", "megatron"};
static const char *const policy_names[] = {"position", "probs", "slot"};

const char *dl_capacity_rule_name(dl_capacity_rule_t r)
{
    return (unsigned)r < 2 ? rule_names[r] : NULL;
}

const char *dl_drop_policy_name(dl_drop_policy_t p)
{
    return (unsigned)p < 3 ? policy_names[p] : NULL;
}

int dl_capacity_rule_parse(const char *s, dl_capacity_rule_t *out)
{
    for (int i = 0; s && out && i < 2; i++)
        if (strcmp(s, rule_names[i]) == 0)
            return *out = (dl_capacity_rule_t)i, 0;
    return DL_EINVAL;
}

int dl_drop_policy_parse(const char *s, dl_drop_policy_t *out)
{
    for (int i = 0; s && out && i < 3; i++)
        if (strcmp(s, policy_names[i]) == 0)
            return *out = (dl_drop_policy_t)i, 0;
    return DL_EINVAL;
}

/* cf as the decimal it was written as: the shortest decimal m * 10^x
 * (at most 17 digits) that reads back as the binary64 cf, so that 1.1 is
 * 11/10 and not 1.100000000000000088..., whose product with 50 is above 55. */
static void shortest_decimal(double cf, uint64_t *m, int *x)
{
    char buf[40];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, cf);
        if (strtod(buf, NULL) == cf)
            break;
    }
    snprintf(buf, sizeof buf, "%.*e", p - 1, cf);
    uint64_t v = 0;
    const char *c = buf;
    for (; *c && *c != 'e'; c++)
        if (*c >= '0' && *c <= '9')
            v = v * 10 + (uint64_t)(*c - '0');
    *m = v;
    *x = (*c == 'e' ? atoi(c + 1) : 0) - (p - 1);
}

/* ceil(cf * N / E) exactly, cf = m * 10^x, m < 10^17, N < 2^31. With
 * x >= -26 the divisor E * 10^-x is below 2^31 * 10^26 < 2^128 and the
 * numerator m * N * 10^x (cf <= 2^16 bounds it) fits too; below that the
 * quotient is a positive fraction under 1. */
static int64_t ceil_exact(double cf, int64_t N, int64_t E)
{
    uint64_t m;
    int x;
    if (N == 0)
        return 0;
    shortest_decimal(cf, &m, &x);
    if (x < -26)
        return 1;
    __extension__ typedef unsigned __int128 u128;
    u128 num = (u128)m * (uint64_t)N, den = (uint64_t)E;
    for (; x > 0; x--)
        num *= 10;
    for (; x < 0; x++)
        den *= 10;
    return (int64_t)(num / den + (num % den != 0));
}

int dl_capacity(dl_capacity_rule_t rule, double cf, int64_t T, int64_t k, int64_t E, int64_t *C)
{
    int64_t N;
    if (!C || !(cf > 0) || !(cf <= DL_CAPACITY_CF_MAX) || T < 0 || k < 1 || E < 1)
        return DL_EINVAL;
    if (dl_mul_size(T, k, &N) || N > INT32_MAX)
        return DL_EOVERFLOW;
    switch (rule) {
    case DL_CAPACITY_GSHARD:
        *C = ceil_exact(cf, N, E);
        return 0;
    case DL_CAPACITY_MEGATRON: {
        /* Python's math.ceil((num_tokens / num_experts) * capacity_factor) */
        double q = (double)N / (double)E;
        *C = (int64_t)ceil(q * cf);
        return 0;
    }
    }
    return DL_EINVAL;
}

/* ------------------------------------------------------------- dropping */

typedef struct {
    float p;
    int32_t f;
} by_prob_t;

/* Highest probability first; equal ones in flat (token) order. */
static int cmp_prob(const void *a, const void *b)
{
    const by_prob_t *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return (x->f > y->f) - (x->f < y->f);
}

/* The flat indices t*k+j in the policy's priority order. */
static int32_t *priority(const float *prob, int64_t T, int64_t k, dl_drop_policy_t policy)
{
    const int64_t M = T * k;
    int32_t *ord = malloc((size_t)(M > 0 ? M : 1) * sizeof *ord);
    if (!ord)
        return NULL;
    if (policy == DL_DROP_POSITION) {
        for (int64_t f = 0; f < M; f++)
            ord[f] = (int32_t)f;
    } else if (policy == DL_DROP_SLOT) {
        int64_t p = 0;
        for (int64_t j = 0; j < k; j++)
            for (int64_t t = 0; t < T; t++)
                ord[p++] = (int32_t)(t * k + j);
    } else {
        by_prob_t *v = malloc((size_t)(M > 0 ? M : 1) * sizeof *v);
        if (!v) {
            free(ord);
            return NULL;
        }
        for (int64_t f = 0; f < M; f++)
            v[f] = (by_prob_t){prob[f], (int32_t)f};
        qsort(v, (size_t)M, sizeof *v, cmp_prob);
        for (int64_t f = 0; f < M; f++)
            ord[f] = v[f].f;
        free(v);
    }
    return ord;
}

int dl_capacity_keep(const int32_t *ids, const float *prob, int64_t T, int64_t k, int64_t E,
                     int64_t C, dl_drop_policy_t policy, uint8_t *keep)
{
    int64_t M;
    if (!ids || !keep || T < 0 || k < 1 || E < 1 || C < 0 || (unsigned)policy > DL_DROP_SLOT ||
        (policy == DL_DROP_PROBS && !prob))
        return DL_EINVAL;
    if (dl_mul_size(T, k, &M) || M > INT32_MAX)
        return DL_EOVERFLOW;
    for (int64_t f = 0; f < M; f++) {
        if (ids[f] < 0 || ids[f] >= E)
            return DL_ERANGE;
        if (policy == DL_DROP_PROBS && isnan(prob[f]))
            return DL_ENONFINITE;
    }
    int64_t *load = calloc((size_t)E, sizeof *load);
    int32_t *ord = priority(prob, T, k, policy);
    if (!load || !ord) {
        free(load), free(ord);
        return DL_ENOMEM;
    }
    for (int64_t p = 0; p < M; p++) {
        int32_t f = ord[p], e = ids[f];
        keep[f] = load[e] < C;
        load[e] += keep[f];
    }
    free(load), free(ord);
    return 0;
}

/* --------------------------------------------------------------- costs */

/* FLOPs of the expert GEMMs per row, forward, and activation bytes per row. */
static int per_row(const dl_moe_config_t *c, int64_t *flops, int64_t *bytes)
{
    const int64_t d = c->hidden, f = c->ffn, sz = c->dtype == DL_F32 ? 4 : 2;
    int64_t df;
    const int gated = DL_FFN_GATED(c->ffn_kind), hidden = DL_FFN_HIDDEN(c->ffn_kind);
    if (dl_mul_size(d, hidden ? f : d, &df) || dl_mul_size(df, gated ? 6 : hidden ? 4 : 2, flops))
        return DL_EOVERFLOW;
    *bytes = (2 * d + (gated ? 3 * f : hidden ? 2 * f : 0)) * sz;
    return 0;
}

/* Fills cost from rows and padded rows. */
static int fill_cost(const dl_moe_config_t *c, int64_t rows, int64_t padded, dl_capacity_cost_t *cost)
{
    int64_t fl, by;
    memset(cost, 0, sizeof *cost);
    if (per_row(c, &fl, &by) || dl_mul_size(rows, fl, &cost->flops_fwd) ||
        dl_mul_size(cost->flops_fwd, 2, &cost->flops_bwd) ||
        dl_mul_size(padded, fl, &cost->waste_flops_fwd) ||
        dl_mul_size(cost->waste_flops_fwd, 2, &cost->waste_flops_bwd) ||
        dl_mul_size(padded, by, &cost->extra_bytes))
        return DL_EOVERFLOW;
    cost->rows = rows;
    cost->padded_rows = padded;
    cost->waste = rows > 0 ? (double)padded / (double)rows : 0.0;
    return 0;
}

void dl_capacity_row_free(dl_capacity_row_t *row)
{
    if (row) {
        free(row->dropped_at);
        memset(row, 0, sizeof *row);
    }
}

/* Drop counts and the dropped list from keep. */
static int tally(const dl_moe_config_t *c, const uint8_t *keep, const float *prob,
                 dl_capacity_row_t *row)
{
    const int64_t T = c->tokens, k = c->route.top_k, M = T * k;
    double all = 0, lost = 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t gone = 0;
        for (int64_t j = 0; j < k; j++) {
            int64_t f = t * k + j;
            gone += !keep[f];
            if (prob) {
                all += prob[f];
                lost += keep[f] ? 0.0 : prob[f];
            }
        }
        row->dropped += gone;
        row->tokens_all_dropped += gone == k;
    }
    row->assignments = M;
    row->dropped_pct = M > 0 ? 100.0 * (double)row->dropped / (double)M : 0.0;
    row->dropped_mass_pct = all > 0 ? 100.0 * lost / all : 0.0;
    if (row->dropped > 0) {
        row->dropped_at = malloc((size_t)row->dropped * sizeof *row->dropped_at);
        if (!row->dropped_at)
            return DL_ENOMEM;
        int64_t n = 0;
        for (int64_t f = 0; f < M; f++)
            if (!keep[f])
                row->dropped_at[n++] = (int32_t)f;
    }
    return 0;
}

int dl_capacity_analyze(const dl_moe_config_t *c, const int32_t *ids, const float *prob,
                        dl_capacity_rule_t rule, double cf, dl_drop_policy_t policy,
                        dl_capacity_row_t *row)
{
    if (!row)
        return DL_EINVAL;
    memset(row, 0, sizeof *row);
    int rc = dl_moe_config_validate(c);
    if (rc)
        return rc;
    const int64_t T = c->tokens, k = c->route.top_k, E = c->route.experts;
    row->cf = cf;
    row->rule = rule;
    row->policy = policy;
    if ((rc = dl_capacity(rule, cf, T, k, E, &row->capacity)))
        return rc;
    uint8_t *keep = malloc((size_t)(T * k > 0 ? T * k : 1));
    if (!keep)
        return DL_ENOMEM;
    if (!(rc = dl_capacity_keep(ids, prob, T, k, E, row->capacity, policy, keep)) &&
        !(rc = tally(c, keep, prob, row))) {
        int64_t rows;
        if (dl_mul_size(E, row->capacity, &rows))
            rc = DL_EOVERFLOW;
        else
            rc = fill_cost(c, rows, rows - (row->assignments - row->dropped), &row->cost);
    }
    free(keep);
    return rc;
}

/* 0 if sizes [E] are nonnegative; their sum in *N. */
static int sizes_ok(const dl_moe_config_t *c, const int64_t *sizes, int64_t *N)
{
    *N = 0;
    if (!sizes || dl_moe_config_validate(c))
        return DL_EINVAL;
    for (int64_t e = 0; e < c->route.experts; e++) {
        if (sizes[e] < 0 || sizes[e] > INT32_MAX)
            return DL_EINVAL;
        *N += sizes[e];
    }
    return 0;
}

int dl_capacity_dropless(const dl_moe_config_t *c, const int64_t *group_sizes, int64_t block,
                         dl_capacity_cost_t *cost)
{
    int64_t N, rows = 0;
    if (!cost || block < 1 || block > INT32_MAX || sizes_ok(c, group_sizes, &N))
        return DL_EINVAL;
    for (int64_t e = 0; e < c->route.experts; e++)
        rows += (group_sizes[e] + block - 1) / block * block;
    return fill_cost(c, rows, rows - N, cost);
}

/* Padded rows of fixed [E, C] buffers reach frac of them. */
static int pads(const int64_t *sizes, int64_t E, int64_t C, double frac)
{
    int64_t kept = 0;
    for (int64_t e = 0; e < E; e++)
        kept += sizes[e] < C ? sizes[e] : C;
    return (double)(E * C - kept) >= frac * (double)(E * C);
}

int dl_capacity_waste_threshold(const dl_moe_config_t *c, const int64_t *group_sizes, double frac,
                                int64_t *C, double *cf_above)
{
    int64_t N;
    if (!C || !cf_above || !(frac > 0 && frac < 1) || sizes_ok(c, group_sizes, &N))
        return DL_EINVAL;
    const int64_t E = c->route.experts;
    *C = 0;
    *cf_above = INFINITY;
    if (N == 0)
        return 0;
    /* beyond the largest load, padding is 1 - N/(E C), which tends to 1 */
    int64_t lo = 0, hi = 1;
    while (!pads(group_sizes, E, hi, frac)) {
        lo = hi;
        if (hi > INT64_MAX / 2 / E)
            return DL_EOVERFLOW;
        hi *= 2;
    }
    while (hi - lo > 1) { /* pads(hi) holds, pads(lo) does not (or lo = 0) */
        int64_t mid = lo + (hi - lo) / 2;
        if (pads(group_sizes, E, mid, frac))
            hi = mid;
        else
            lo = mid;
    }
    *C = hi;
    *cf_above = (double)(hi - 1) * (double)E / (double)N;
    return 0;
}
