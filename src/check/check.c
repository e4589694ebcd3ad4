/* The conformance runner's entry point: stage names and shapes, the report
 * and its bookkeeping, dl_check_run. The checks themselves live in
 * route.c (routing), tokens.c (zero drops), stage.c
 * (stage-local numerics), tol.c (tolerances); reports in
 * report.c. */
#include "config.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check/check_priv.h"

const char *dl_verdict_name(dl_verdict_t v)
{
    switch (v) {
    case DL_VERDICT_SKIP: return "SKIP";
    case DL_VERDICT_INFO: return "INFO";
    case DL_VERDICT_PASS: return "PASS";
    case DL_VERDICT_WARN: return "WARN";
    case DL_VERDICT_FAIL: return "FAIL";
    }
    return NULL;
}

dl_dtype_t dl__ck_stage_type(const dl__ck_t *ck, dl_value_t s)
{
    return dl_value_store(s) == DL_STORE_ACT ? ck->act : DL_F32;
}

void dl_check_options_default(dl_check_options_t *o)
{
    memset(o, 0, sizeof *o);
    o->diagnose_drops = 1;
    o->max_listed = 8;
}

/* ------------------------------------------------------------ bookkeeping */

void *dl__ck_alloc(dl__ck_t *ck, int64_t n, size_t size)
{
    if (ck->n_owned == ck->cap_owned) {
        size_t cap = ck->cap_owned ? 2 * ck->cap_owned : 64;
        void **p = realloc(ck->owned, cap * sizeof *p);
        if (!p)
            return NULL;
        ck->owned = p;
        ck->cap_owned = cap;
    }
    void *p = calloc(n > 0 ? (size_t)n : 1, size);
    if (p)
        ck->owned[ck->n_owned++] = p;
    return p;
}

dl_check_result_t *dl__ck_result(dl__ck_t *ck, dl_value_t s, const char *check)
{
    dl_check_report_t *r = ck->rep;
    if (r->n == ck->rep_cap) {
        size_t cap = ck->rep_cap ? 2 * ck->rep_cap : 64;
        dl_check_result_t *p = realloc(r->results, cap * sizeof *p);
        if (!p)
            return NULL;
        r->results = p;
        ck->rep_cap = cap;
    }
    dl_check_result_t *x = &r->results[r->n++];
    memset(x, 0, sizeof *x);
    x->stage = s;
    snprintf(x->check, sizeof x->check, "%s", check);
    x->verdict = DL_VERDICT_SKIP;
    x->err_pass = x->err_warn = x->max_ulp = x->max_abs = NAN;
    x->worst_cand = x->worst_exact = NAN;
    x->worst_index = -1;
    return x;
}

void dl__ck_msg(dl_check_result_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof r->message, fmt, ap);
    va_end(ap);
}

void dl__ck_msg_append(dl_check_result_t *r, const char *fmt, ...)
{
    size_t n = strlen(r->message);
    if (n + 1 >= sizeof r->message)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message + n, sizeof r->message - n, fmt, ap);
    va_end(ap);
}

int dl__ck_add_drop(dl__ck_t *ck, int64_t canon_flat)
{
    dl_check_report_t *r = ck->rep;
    int64_t f = ck->from_canon ? ck->from_canon[canon_flat] : canon_flat;
    for (int64_t i = 0; i < r->n_dropped; i++) /* short lists; dedup */
        if (r->dropped[i].token * ck->k + r->dropped[i].slot == f)
            return 0;
    if ((size_t)r->n_dropped == ck->drop_cap) {
        size_t cap = ck->drop_cap ? 2 * ck->drop_cap : 16;
        dl_check_drop_t *p = realloc(r->dropped, cap * sizeof *p);
        if (!p)
            return DL_ENOMEM;
        r->dropped = p;
        ck->drop_cap = cap;
    }
    r->dropped[r->n_dropped].token = f / ck->k;
    r->dropped[r->n_dropped].slot = f % ck->k;
    r->n_dropped++;
    return 0;
}

void dl_check_report_free(dl_check_report_t *r)
{
    if (!r)
        return;
    free(r->results);
    free(r->dropped);
    memset(r, 0, sizeof *r);
}

dl_verdict_t dl__ck_worst_verdict(const dl_check_report_t *r)
{
    dl_verdict_t v = DL_VERDICT_SKIP;
    for (size_t i = 0; i < r->n; i++) {
        dl_verdict_t x = r->results[i].verdict;
        if (x > v && x != DL_VERDICT_INFO)
            v = x;
    }
    return v;
}

int dl_check_report_add(dl_check_report_t *r, dl_value_t stage, const char *check,
                        dl_verdict_t verdict, const char *message)
{
    if (!r || !check || !dl_value_name(stage) || !dl_verdict_name(verdict))
        return DL_EINVAL;
    dl_check_result_t *p = realloc(r->results, (r->n + 1) * sizeof *p);
    if (!p)
        return DL_ENOMEM;
    r->results = p;
    dl_check_result_t *x = &p[r->n++];
    memset(x, 0, sizeof *x);
    x->stage = stage;
    snprintf(x->check, sizeof x->check, "%s", check);
    x->verdict = verdict;
    x->err_pass = x->err_warn = x->max_ulp = x->max_abs = NAN;
    x->worst_cand = x->worst_exact = NAN;
    x->worst_index = -1;
    snprintf(x->message, sizeof x->message, "%s", message ? message : "");
    r->verdict = dl__ck_worst_verdict(r);
    return 0;
}

int dl_check_conformant(const dl_check_report_t *r)
{
    for (size_t i = 0; r && i < r->n; i++)
        if (r->results[i].verdict == DL_VERDICT_FAIL)
            return 0;
    return r != NULL;
}

int dl_check_exit_status(const dl_check_report_t *const *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!dl_check_conformant(r[i]))
            return DL_CHECK_EXIT_NONCONFORMANT;
    return DL_CHECK_EXIT_CONFORMANT;
}

/* ------------------------------------------------------------ the run */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int golden_forward_complete(const dl_moe_config_t *c, const dl_moe_forward_t *f)
{
    for (int s = 0; s <= DL_VALUE_OUT; s++)
        if (dl_value_numel(c, (dl_value_t)s) > 0 && !dl_value_array(f, NULL, (dl_value_t)s))
            return 0;
    return 1;
}

int dl_check_run(const dl_check_golden_t *g, const dl_check_candidate_t *cand,
                 const dl_check_options_t *o, dl_check_report_t *r)
{
    if (!r)
        return DL_EINVAL;
    memset(r, 0, sizeof *r);
    const double t0 = now();
    if (!g || !cand || !g->config || !g->inputs || !g->fwd)
        return DL_EINVAL;
    int rc = dl_moe_config_validate(g->config);
    if (rc)
        return rc;
    if (!golden_forward_complete(g->config, g->fwd))
        return DL_EINVAL;

    dl__ck_t ck;
    memset(&ck, 0, sizeof ck);
    ck.c = g->config;
    ck.in = g->inputs;
    ck.gf = g->fwd;
    ck.gb = g->bwd;
    ck.cand = cand;
    if (o)
        ck.opt = *o;
    else
        dl_check_options_default(&ck.opt);
    if (ck.opt.max_listed < 0)
        ck.opt.max_listed = 0;
    ck.prof = ck.opt.profile;
    if (!ck.prof)
        ck.prof = dl_check_profile_find(cand->compute_mode);
    if (!ck.prof)
        ck.prof = dl_check_profile_at(0);
    ck.rep = r;
    ck.T = g->config->tokens;
    ck.d = g->config->hidden;
    ck.f = g->config->ffn;
    ck.E = g->config->route.experts;
    ck.k = g->config->route.top_k;
    ck.M = ck.T * ck.k;
    ck.swiglu = g->config->ffn_kind == DL_FFN_SWIGLU;
    ck.act = g->config->dtype;
    ck.have_bwd = g->bwd && g->inputs->d_out;

    snprintf(r->case_name, sizeof r->case_name, "%s", g->case_name ? g->case_name : "unnamed");
    snprintf(r->backend, sizeof r->backend, "%s", cand->backend ? cand->backend : "unknown");
    snprintf(r->backend_version, sizeof r->backend_version, "%s",
             cand->backend_version ? cand->backend_version : "");
    snprintf(r->profile, sizeof r->profile, "%s", ck.prof->name);

    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        ck.numel[s] = dl_value_numel(ck.c, (dl_value_t)s);
        ck.gold[s] = ck.numel[s] > 0 ? dl_value_array(ck.gf, ck.gb, (dl_value_t)s) : NULL;
        const void *p = dl_value_array(&cand->fwd, &cand->bwd, (dl_value_t)s);
        /* a loader that set a misshapen stage aside leaves its array NULL */
        if (cand->bad_shape & ((uint64_t)1 << s)) {
            dl_check_result_t *x = dl__ck_result(&ck, (dl_value_t)s, "shape");
            if (!x) {
                rc = DL_ENOMEM;
                goto out;
            }
            x->verdict = DL_VERDICT_FAIL;
            dl__ck_msg(x, "the candidate's %s has the wrong shape or type (expected %lld elements)",
                       dl_value_name((dl_value_t)s), (long long)ck.numel[s]);
            continue;
        }
        if (!p || ck.numel[s] == 0)
            continue;
        ck.cand_arr[s] = p;
    }

    rc = dl__ck_stages(&ck);
    if (rc)
        goto out;

    r->verdict = dl__ck_worst_verdict(r);
out:
    for (size_t i = 0; i < ck.n_owned; i++)
        free(ck.owned[i]);
    free(ck.owned);
    r->seconds = now() - t0;
    return rc;
}
