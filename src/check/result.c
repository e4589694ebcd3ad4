/* The report's bookkeeping: verdict names, results and their messages, the
 * dropped assignments, memory owned by a run, conformance. A leaf of the
 * checker: everything else in src/check/ calls it, it calls nothing there. */
#include "config.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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

/* A result with nothing measured yet. */
static void result_init(dl_check_result_t *x, dl_value_t s, const char *check, dl_verdict_t v)
{
    memset(x, 0, sizeof *x);
    x->stage = s;
    snprintf(x->check, sizeof x->check, "%s", check);
    x->verdict = v;
    x->err_pass = x->err_warn = x->max_ulp = x->max_abs = NAN;
    x->worst_cand = x->worst_exact = NAN;
    x->err_stat = x->lambda = NAN;
    x->worst_index = -1;
}

/* Arrays a finished run leaves to the next (on any thread): a small case's
 * check allocates a few hundred KiB and frees them at its end, and the
 * heap's trimming there and regrowth in the next run (a page fault per
 * page) cost a sixth of a small fused or out-only check. At most KEEP_N
 * arrays of KEEP_MAX bytes each; freed at exit. */
enum { KEEP_N = 64 };
#define KEEP_MAX ((size_t)64 << 10)
static struct {
    void *p[KEEP_N];
    size_t bytes[KEEP_N];
    int n;
} keep;

/* The smallest kept array of want to 2 want bytes (its size in *have), or
 * NULL. */
static void *keep_take(size_t want, size_t *have)
{
    void *p = NULL;
#pragma omp critical(dl__ck_keep)
    {
        int best = -1;
        for (int i = 0; i < keep.n; i++)
            if (keep.bytes[i] >= want && keep.bytes[i] / 2 <= want &&
                (best < 0 || keep.bytes[i] < keep.bytes[best]))
                best = i;
        if (best >= 0) {
            p = keep.p[best];
            *have = keep.bytes[best];
            keep.n--;
            keep.p[best] = keep.p[keep.n];
            keep.bytes[best] = keep.bytes[keep.n];
        }
    }
    return p;
}

static void keep_put(void *p, size_t bytes)
{
    int kept = 0;
#pragma omp critical(dl__ck_keep)
    if (bytes <= KEEP_MAX && keep.n < KEEP_N) {
        keep.p[keep.n] = p;
        keep.bytes[keep.n++] = bytes;
        kept = 1;
    }
    if (!kept)
        free(p);
}

#ifdef __GNUC__
__attribute__((destructor))
#endif
static void keep_free(void)
{
    for (int i = 0; i < keep.n; i++)
        free(keep.p[i]);
    keep.n = 0;
}

void dl__ck_release(dl__ck_t *ck)
{
    for (size_t i = 0; i < ck->n_owned; i++)
        keep_put(ck->owned[i], ck->owned_bytes[i]);
    for (int i = 0; i < DL__CK_SCRATCH; i++)
        if (ck->scr[i])
            keep_put(ck->scr[i], (size_t)ck->scr_n[i] * sizeof *ck->scr[i]);
    free(ck->owned);
    free(ck->owned_bytes);
}

void *dl__ck_alloc(dl__ck_t *ck, int64_t n, size_t size)
{
    const size_t cnt = n > 0 ? (size_t)n : 1;
    if (size && cnt > SIZE_MAX / size)
        return NULL;
    if (ck->n_owned == ck->cap_owned) {
        size_t cap = ck->cap_owned ? 2 * ck->cap_owned : 64;
        void **p = realloc(ck->owned, cap * sizeof *p);
        if (p)
            ck->owned = p;
        size_t *b = p ? realloc(ck->owned_bytes, cap * sizeof *b) : NULL;
        if (!b)
            return NULL;
        ck->owned_bytes = b;
        ck->cap_owned = cap;
    }
    size_t have = cnt * size;
    void *p = keep_take(have, &have);
    if (p)
        memset(p, 0, have);
    else
        p = calloc(cnt, size);
    if (p) {
        ck->owned[ck->n_owned] = p;
        ck->owned_bytes[ck->n_owned++] = have;
    }
    return p;
}

void *dl__ck_take(dl__ck_t *ck, int64_t n, size_t size, int zero)
{
    const size_t want = (n > 0 ? (size_t)n : 1) * size;
    int best = -1; /* the smallest that fits */
    for (int i = 0; i < ck->n_pool; i++)
        if (ck->pool_bytes[i] >= want && (best < 0 || ck->pool_bytes[i] < ck->pool_bytes[best]))
            best = i;
    if (best < 0)
        return dl__ck_alloc(ck, n, size);
    void *p = ck->pool[best];
    ck->n_pool--;
    ck->pool[best] = ck->pool[ck->n_pool];
    ck->pool_bytes[best] = ck->pool_bytes[ck->n_pool];
    if (zero)
        memset(p, 0, want);
    return p;
}

void dl__ck_give(dl__ck_t *ck, void *p, size_t bytes)
{
    /* the memo and the spare are keyed by their operands' addresses: an
     * array handed back may come back holding other values, so nothing
     * computed on it stays kept */
    for (int i = 0; p && i < 2; i++)
        if (ck->memo.slot[i].key == p)
            ck->memo.slot[i].v = NULL;
    for (int i = 0; p && ck->spare.v && i < 3; i++)
        if (ck->spare.on[i] == p)
            ck->spare.v = NULL;
    if (p && ck->n_pool < DL__CK_POOL) {
        ck->pool[ck->n_pool] = p;
        ck->pool_bytes[ck->n_pool++] = bytes;
    }
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
    result_init(x, s, check, DL_VERDICT_SKIP);
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
    result_init(x, stage, check, verdict);
    snprintf(x->message, sizeof x->message, "%s", message ? message : "");
    r->verdict = dl__ck_worst_verdict(r);
    return 0;
}

int dl_check_checked(const dl_check_report_t *r)
{
    for (size_t i = 0; r && i < r->n; i++)
        if (r->results[i].verdict >= DL_VERDICT_PASS)
            return 1;
    return 0;
}

static int has_fail(const dl_check_report_t *r)
{
    for (size_t i = 0; r && i < r->n; i++)
        if (r->results[i].verdict == DL_VERDICT_FAIL)
            return 1;
    return 0;
}

int dl_check_conformant(const dl_check_report_t *r)
{
    return r && !has_fail(r) && dl_check_checked(r);
}

int dl_check_exit_status(const dl_check_report_t *const *r, size_t n)
{
    int empty = 0;
    for (size_t i = 0; i < n; i++) {
        if (!r[i] || has_fail(r[i]))
            return DL_CHECK_EXIT_NONCONFORMANT;
        empty |= !dl_check_checked(r[i]);
    }
    return empty ? DL_CHECK_EXIT_USAGE : DL_CHECK_EXIT_CONFORMANT;
}

/* A required stage must have been judged: one with only SKIP lines (not
 * provided, or nothing to judge it against) FAILs. */
int dl__ck_require(dl__ck_t *ck)
{
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        if (!((ck->opt.require >> s) & 1) || ck->st[s].numel == 0)
            continue;
        dl_check_result_t *x = NULL;
        int judged = 0;
        for (size_t i = 0; i < ck->rep->n; i++) {
            dl_check_result_t *y = &ck->rep->results[i];
            if (y->stage != (dl_value_t)s)
                continue;
            judged |= y->verdict >= DL_VERDICT_PASS;
            if (y->verdict == DL_VERDICT_SKIP && !x)
                x = y; /* the stage's SKIP line becomes the FAIL */
        }
        if (judged)
            continue;
        if (!x && !(x = dl__ck_result(ck, (dl_value_t)s, "required")))
            return DL_ENOMEM;
        snprintf(x->check, sizeof x->check, "required");
        x->verdict = DL_VERDICT_FAIL;
        if (dl_value_is_backward((dl_value_t)s) && !ck->have_bwd)
            dl__ck_msg(x, "required, but the golden has no backward pass to check it against");
        else
            dl__ck_msg(x, "required, but the candidate does not provide it");
    }
    return 0;
}
