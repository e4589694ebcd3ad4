/* Checking a stage-isolated candidate: every group of values came from a
 * call fed the golden inputs of that call (dropless run), so each group is
 * judged on golden upstream, never on another group's output. */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

static int cmp_drop(const void *a, const void *b)
{
    const dl_check_drop_t *x = a, *y = b;
    if (x->token != y->token)
        return x->token < y->token ? -1 : 1;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

/* Appends src's results that belong to mask (and case-level findings) to dst. */
static int merge(dl_check_report_t *dst, const dl_check_report_t *src, dl_valueset_t mask)
{
    for (size_t i = 0; i < src->n; i++) {
        const dl_check_result_t *x = &src->results[i];
        /* the layout checks run in the last pass only, one row per layout */
        const int ep = !strncmp(x->check, "ep_", 3);
        int mine = x->stage == DL_VALUE_NONE ? x->verdict > DL_VERDICT_PASS || ep
                                              : (int)((mask >> x->stage) & 1);
        /* a case-level finding seen by several groups is listed once */
        for (size_t j = 0; mine && !ep && x->stage == DL_VALUE_NONE && j < dst->n; j++)
            if (dst->results[j].stage == DL_VALUE_NONE && !strcmp(dst->results[j].check, x->check))
                mine = 0;
        if (!mine)
            continue;
        dl_check_result_t *p = realloc(dst->results, (dst->n + 1) * sizeof *p);
        if (!p)
            return DL_ENOMEM;
        dst->results = p;
        dst->results[dst->n++] = *x;
    }
    if (src->n_dropped) {
        dl_check_drop_t *p = realloc(dst->dropped, (size_t)(dst->n_dropped + src->n_dropped) * sizeof *p);
        if (!p)
            return DL_ENOMEM;
        memcpy(p + dst->n_dropped, src->dropped, (size_t)src->n_dropped * sizeof *p);
        dst->dropped = p;
        dst->n_dropped += src->n_dropped;
    }
    return 0;
}

/* The caller's progress across the passes: pass i of n reports in
 * [i/n, (i+1)/n], so the caller sees one non-decreasing run ending once
 * with ("done", 1). */
typedef struct {
    void (*fn)(void *ctx, const char *stage, double done);
    void *ctx;
    double lo, span;
} pass_progress_t;

static void pass_progress(void *ctx, const char *stage, double done)
{
    const pass_progress_t *p = ctx;
    if (strcmp(stage, "done") != 0)
        p->fn(p->ctx, stage, p->lo + p->span * done);
}

int dl_check_run_isolated(const dl_check_golden_t *g, const dl_check_candidate_t *c,
                          const dl_check_options_t *o, const dl_valueset_t *groups, int ngroups,
                          dl_check_report_t *r)
{
    if (!r)
        return DL_EINVAL;
    memset(r, 0, sizeof *r);
    if (!g || !c || (!groups && ngroups > 0) || ngroups < 0)
        return DL_EINVAL;
    int rc = 0;
    double seconds = 0;
    dl_valueset_t covered = 0;
    pass_progress_t pp = {o ? o->progress : NULL, o ? o->progress_ctx : NULL, 0,
                          1.0 / (ngroups + 1)};
    for (int i = 0; i <= ngroups && rc == 0; i++) {
        /* the last pass carries the values no group claims, and the case-level checks */
        dl_valueset_t mask = i < ngroups ? groups[i] : ~covered;
        covered |= mask;
        dl_check_candidate_t sub = *c;
        memset(&sub.fwd, 0, sizeof sub.fwd);
        memset(&sub.bwd, 0, sizeof sub.bwd);
        sub.bad_shape = c->bad_shape & mask;
        if (i < ngroups)
            sub.n_ep = sub.n_layouts = 0;
        int any = 0;
        for (int s = 0; s < DL_VALUE_COUNT; s++) {
            if (!((mask >> s) & 1))
                continue;
            void **from = dl__value_slot((dl_moe_forward_t *)&c->fwd, (dl_moe_backward_t *)&c->bwd,
                                         (dl_value_t)s);
            *dl__value_slot(&sub.fwd, &sub.bwd, (dl_value_t)s) = *from;
            any |= *from != NULL || ((sub.bad_shape >> s) & 1) || (o && ((o->require >> s) & 1));
        }
        if (!any && i < ngroups)
            continue;
        dl_check_report_t part;
        dl_check_options_t so;
        if (o)
            so = *o;
        else
            dl_check_options_default(&so);
        so.exact_upstream = 1; /* each group was fed golden values */
        if (pp.fn) {
            pp.lo = (double)i / (ngroups + 1);
            so.progress = pass_progress;
            so.progress_ctx = &pp;
        }
        rc = dl_check_run(g, &sub, &so, &part);
        if (rc == 0) {
            if (r->case_name[0] == '\0') {
                memcpy(r->case_name, part.case_name, sizeof r->case_name);
                memcpy(r->backend, part.backend, sizeof r->backend);
                memcpy(r->backend_version, part.backend_version, sizeof r->backend_version);
                memcpy(r->profile, part.profile, sizeof r->profile);
            }
            rc = merge(r, &part, mask);
            seconds += part.seconds;
        }
        dl_check_report_free(&part);
    }
    if (rc) {
        dl_check_report_free(r);
        return rc;
    }
    /* one drop found by several groups is one drop */
    if (r->n_dropped > 1) {
        qsort(r->dropped, (size_t)r->n_dropped, sizeof *r->dropped, cmp_drop);
        int64_t w = 1;
        for (int64_t i = 1; i < r->n_dropped; i++)
            if (cmp_drop(&r->dropped[i], &r->dropped[w - 1]) != 0)
                r->dropped[w++] = r->dropped[i];
        r->n_dropped = w;
    }
    r->verdict = dl__ck_worst_verdict(r);
    r->seconds = seconds;
    if (pp.fn)
        pp.fn(pp.ctx, "done", 1.0);
    return 0;
}

int dl_check_parse_groups(const char *spec, dl_valueset_t *groups, int max)
{
    if (!spec || !groups || max < 1)
        return DL_EINVAL;
    int ng = 0;
    dl_valueset_t cur = 0;
    const char *p = spec;
    for (;;) {
        size_t len = strcspn(p, ",;");
        char name[64];
        if (len == 0 || len >= sizeof name)
            return DL_EINVAL;
        memcpy(name, p, len);
        name[len] = '\0';
        dl_value_t v;
        if (dl_value_parse(name, &v) != 0 || v == DL_VALUE_NONE)
            return DL_EINVAL;
        cur |= DL_VALUE_BIT(v);
        p += len;
        if (*p == ',') {
            p++;
            continue;
        }
        if (ng == max)
            return DL_EINVAL;
        groups[ng++] = cur;
        cur = 0;
        if (*p == '\0')
            return ng;
        p++; /* ';' */
    }
}

int dl_check_format_groups(const dl_valueset_t *groups, int ngroups, char *buf, size_t n)
{
    if (!groups || ngroups < 0 || !buf || n == 0)
        return DL_EINVAL;
    size_t used = 0;
    buf[0] = '\0';
    for (int g = 0; g < ngroups; g++) {
        int first = 1;
        for (int s = 0; s < DL_VALUE_COUNT; s++) {
            if (!((groups[g] >> s) & 1))
                continue;
            const char *sep = first ? (g ? ";" : "") : ",";
            int w = snprintf(buf + used, n - used, "%s%s", sep, dl_value_name((dl_value_t)s));
            if (w < 0 || (size_t)w >= n - used)
                return DL_EOVERFLOW;
            used += (size_t)w;
            first = 0;
        }
    }
    return 0;
}
