/* The kernel layout checks (doc/conformance.md, "Kernel layouts"): a
 * candidate's /layouts/NAME against the stage dl_layout_compute of the
 * golden's routing. The index arrays are exact; padding rows hold what the
 * layout's contract says (untouched: the bits the buffer held, the golden's
 * 0, or NaN in the poisoned twin; zero: +-0); valid rows of y are judged by
 * the runner itself (dl__ck_layouts_feed makes them the candidate's
 * y_sorted), and named here when they are non-finite or never written.
 * Every finding names the layout row. */
#include "config.h"
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

typedef struct {
    dl__ck_t *ck;
    const dl_layout_t *L; /* the candidate's */
    dl_layout_t ref;      /* the stage's, filled with the golden's rows */
    dl_check_result_t *x;
    int64_t nf;
    int warned; /* sorted_token_ids: only the order within segments differs */
} lc_t;

static void finding(lc_t *c, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void finding(lc_t *c, const char *fmt, ...)
{
    if (c->nf++ < (c->ck->opt.max_listed > 0 ? c->ck->opt.max_listed : 1)) {
        char buf[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        dl__ck_msg_append(c->x, "%s%s", c->nf > 1 ? "; " : "", buf);
    }
    c->x->verdict = DL_VERDICT_FAIL;
}

static int open_row(lc_t *c, const char *check)
{
    c->nf = 0;
    return (c->x = dl__ck_result(c->ck, DL_VALUE_NONE, check)) ? 0 : DL_ENOMEM;
}

/* "/layouts/NAME: 3 findings: ..." or the PASS line. */
static void close_row(lc_t *c, const char *pass)
{
    char body[sizeof c->x->message];
    snprintf(body, sizeof body, "%s", c->x->message);
    if (c->x->verdict == DL_VERDICT_FAIL)
        dl__ck_msg(c->x, "/layouts/%s: %" PRId64 " finding%s: %s", c->L->name, c->nf,
                   c->nf == 1 ? "" : "s", body);
    else {
        c->x->verdict = DL_VERDICT_PASS;
        dl__ck_msg(c->x, "/layouts/%s: %s", c->L->name, pass);
    }
}

/* Where row i of x (is_x) or y lies, in the layout's terms. */
static void where(const lc_t *c, int is_x, int64_t i, char *buf, size_t n)
{
    const dl_layout_t *R = &c->ref;
    const int64_t M = R->tokens * R->top_k;
    if (R->kind == DL_LAYOUT_VLLM_BLOCK) {
        if (i == (is_x ? R->tokens : M))
            snprintf(buf, n, "row %" PRId64 " (the sentinel's row)", i);
        else if (is_x)
            snprintf(buf, n, "row %" PRId64 " (token %" PRId64 ")", i, i);
        else
            snprintf(buf, n, "row %" PRId64 " (token %" PRId64 ", slot %" PRId64 ")", i,
                     i / R->top_k, i % R->top_k);
    } else if (R->kind == DL_LAYOUT_CONTIGUOUS) {
        int64_t g = 0;
        while (g + 1 < R->e1 - R->e0 && R->group_offsets[g + 1] <= i)
            g++;
        snprintf(buf, n, "row %" PRId64 " (expert %" PRId64 ", row %" PRId64 " of its block)", i,
                 R->e0 + g, i - R->group_offsets[g]);
    } else {
        snprintf(buf, n, "row %" PRId64 " (expert %" PRId64 ", row %" PRId64 ")", i,
                 R->e0 + i / R->param, i % R->param);
    }
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* 1 when got differs from want in sorted_token_ids only by the order
 * within each expert's segment (vLLM's atomics order a segment as they
 * please; the values a kernel computes follow the ids, not the order). */
static int within_segments(const lc_t *c, const int32_t *got, const int32_t *want)
{
    const dl_layout_t *R = &c->ref;
    const int64_t B = R->param;
    int32_t *a = malloc((size_t)(R->n_rows > 0 ? R->n_rows : 1) * 2 * sizeof *a);
    if (!a)
        return 0;
    int ok = 1;
    int64_t pos = 0;
    for (int64_t e = 0; e <= R->experts && ok; e++) {
        const int64_t n = e < R->experts ? (c->ck->gf->group_sizes[e] + B - 1) / B * B
                                         : R->n_rows - pos; /* the tail */
        memcpy(a, got + pos, (size_t)n * sizeof *a);
        memcpy(a + n, want + pos, (size_t)n * sizeof *a);
        qsort(a, (size_t)n, sizeof *a, cmp_i32);
        qsort(a + n, (size_t)n, sizeof *a, cmp_i32);
        ok = !memcmp(a, a + n, (size_t)n * sizeof *a);
        pos += n;
    }
    free(a);
    return ok;
}

/* Index arrays, element by element; expert_ids only where a block is used. */
static int index_arrays(lc_t *c)
{
    const dl_layout_t *L = c->L, *R = &c->ref;
    int any = 0;
    for (int i = 0; i < DL_LAYOUT_DATASET_COUNT; i++)
        any |= !dl_layout_dataset_is_float(i) && *dl_layout_dataset_slot((dl_layout_t *)L, i) != NULL;
    if (!any)
        return 0;
    if (open_row(c, "layout_index"))
        return DL_ENOMEM;
    for (int i = 0; i < DL_LAYOUT_DATASET_COUNT; i++) {
        const void *got = *dl_layout_dataset_slot((dl_layout_t *)L, i);
        const void *want = *dl_layout_dataset_slot((dl_layout_t *)R, i);
        if (dl_layout_dataset_is_float(i) || !got || !want)
            continue;
        int64_t dims[2];
        dl_layout_dataset_shape(R, i, dims);
        int64_t n = dims[0];
        if (i == DL_LAYOUT_DS_EXPERT_IDS) /* blocks past num_tokens_post_padded: unspecified */
            n = R->num_tokens_post_padded[0] / R->param;
        if (L->len[i] != dims[0] && (i != DL_LAYOUT_DS_EXPERT_IDS || L->len[i] < n)) {
            finding(c, "%s has %" PRId64 " entries, expected %" PRId64, dl_layout_dataset_name(i),
                    L->len[i], dims[0]);
            continue;
        }
        c->x->n_checked += n;
        const int i64 = dl_layout_dataset_i64(i);
        if (i == DL_LAYOUT_DS_SORTED_TOKEN_IDS && memcmp(got, want, (size_t)n * 4) &&
            within_segments(c, got, want)) {
            if (c->x->verdict != DL_VERDICT_FAIL)
                c->x->verdict = DL_VERDICT_WARN;
            c->warned = 1;
            continue;
        }
        for (int64_t q = 0; q < n; q++) {
            int64_t a = i64 ? ((const int64_t *)got)[q] : ((const int32_t *)got)[q];
            int64_t b = i64 ? ((const int64_t *)want)[q] : ((const int32_t *)want)[q];
            if (a != b)
                finding(c, "%s[%" PRId64 "] = %" PRId64 ", expected %" PRId64 "%s",
                        dl_layout_dataset_name(i), q, a, b,
                        i == DL_LAYOUT_DS_SORTED_TOKEN_IDS && b == R->tokens * R->top_k
                            ? " (the sentinel numel)" : "");
        }
    }
    if (c->warned && c->x->verdict == DL_VERDICT_WARN)
        dl__ck_msg(c->x, "/layouts/%s: sorted_token_ids orders an expert's slots otherwise than "
                   "ascending t*k+j (its ids are right)", c->L->name);
    else
        close_row(c, "index arrays exact");
    return 0;
}

static int zero_row(const float *r, int64_t d)
{
    for (int64_t j = 0; j < d; j++)
        if (r[j] != 0.0f)
            return 0;
    return 1;
}

/* Padding and other ranks' rows of x (is_x) or y: their contract. */
static void padding(lc_t *c, int is_x, const float *got, const float *want)
{
    const dl_layout_t *R = &c->ref;
    const int64_t d = R->hidden, n = is_x ? R->n_x : R->n_y;
    const int32_t *src = is_x ? R->x_src : R->y_src;
    const int zero = !is_x && dl_layout_contract(R->kind) == DL_LAYOUT_ZERO;
    for (int64_t i = 0; i < n; i++) {
        if (src[i] >= 0)
            continue;
        c->x->n_checked += d;
        const float *g = got + i * d;
        const int ok = src[i] == DL_LAYOUT_NONLOCAL || zero
                           ? zero_row(g, d)
                           : !memcmp(g, want + i * d, (size_t)d * sizeof *g);
        if (!ok) {
            char at[96];
            where(c, is_x, i, at, sizeof at);
            finding(c, "%s %s: %s", is_x ? "x" : "y", at,
                    src[i] == DL_LAYOUT_NONLOCAL ? "another rank's row, must be zero"
                    : zero ? "padding, must be zero (computed from padding?)"
                           : "padding written (must be left as it was)");
        }
    }
}

/* Valid rows: x a copy, y finite and written (its value: the runner's). */
static void valid_rows(lc_t *c, int is_x, const float *got, const float *want)
{
    const dl_layout_t *R = &c->ref;
    const int64_t d = R->hidden, n = is_x ? R->n_x : R->n_y;
    const int32_t *src = is_x ? R->x_src : R->y_src;
    for (int64_t i = 0; i < n; i++) {
        if (src[i] < 0)
            continue;
        c->x->n_checked += d;
        const float *g = got + i * d, *w = want + i * d;
        int nonfinite = 0;
        for (int64_t j = 0; j < d; j++)
            nonfinite |= !isfinite(g[j]);
        const int same = !memcmp(g, w, (size_t)d * sizeof *g);
        const char *why = is_x && !same ? "not the golden's row (x is a copy)"
                          : nonfinite ? "NaN/Inf (read padding?)"
                          : !is_x && !same && zero_row(g, d) && !zero_row(w, d)
                              ? "never written (still zero)" : NULL;
        if (why) {
            char at[96];
            where(c, is_x, i, at, sizeof at);
            finding(c, "%s %s: %s", is_x ? "x" : "y", at, why);
        }
    }
}

/* x and y of the candidate: their padding, then their valid rows. */
static int data_rows(lc_t *c)
{
    for (int is_x = 1; is_x >= 0; is_x--) {
        const int i = is_x ? DL_LAYOUT_DS_ACT_X : DL_LAYOUT_DS_ACT_Y;
        const float *got = *dl_layout_dataset_slot((dl_layout_t *)c->L, i);
        if (!got)
            continue;
        const int64_t want_n = is_x ? c->ref.n_x : c->ref.n_y;
        if (open_row(c, is_x ? "layout_x" : "layout_y") ||
            (c->L->len[i] != want_n &&
             (finding(c, "%s has %" PRId64 " rows, expected %" PRId64, is_x ? "x" : "y",
                      c->L->len[i], want_n), 1))) {
            if (!c->x)
                return DL_ENOMEM;
            close_row(c, "");
            continue;
        }
        const float *want = is_x ? c->ref.x : c->ref.y;
        padding(c, is_x, got, want);
        valid_rows(c, is_x, got, want);
        close_row(c, is_x ? "padding as the contract says, valid rows the golden's copies"
                          : "padding as the contract says, every valid row written and finite");
    }
    return 0;
}

/* The reference layout of the candidate's kind, parameter and experts. */
static int reference(dl__ck_t *ck, const dl_layout_t *L, dl_layout_t *R)
{
    int rc = dl_layout_compute(L->kind, L->param, ck->gf->group_sizes, ck->gf->sort_perm, ck->T,
                               ck->k, ck->E, L->e0, L->e1, R);
    if (!rc)
        rc = dl_layout_fill(R, ck->in->x, ck->gf->x_sorted, ck->gf->y_sorted, ck->d, L->poisoned);
    return rc;
}

static int one_layout(dl__ck_t *ck, const dl_layout_t *L)
{
    lc_t c = {ck, L, {0}, NULL, 0, 0};
    int rc = reference(ck, L, &c.ref);
    if (rc == DL_ERANGE || L->bad) {
        if (open_row(&c, "layout_shape") == 0) {
            finding(&c, "%s", rc == DL_ERANGE ? "a group holds more rows than the layout's "
                    "capacity" : L->bad_reason);
            close_row(&c, "");
        }
        rc = rc == DL_ERANGE ? 0 : rc;
    }
    if (!rc && c.ref.x_src && !(rc = index_arrays(&c)))
        rc = data_rows(&c);
    dl_layout_free(&c.ref);
    return c.x || rc ? rc : 0;
}

int dl__ck_layouts(dl__ck_t *ck)
{
    for (int i = 0; i < ck->cand->n_layouts; i++) {
        const dl_layout_t *L = &ck->cand->layouts[i];
        if (L->experts != ck->E || L->top_k != ck->k || L->tokens != ck->T)
            return DL_EINVAL;
        int rc = one_layout(ck, L);
        if (rc)
            return rc;
    }
    return 0;
}

/* Which candidate layouts' y rows become the candidate's y_sorted: every
 * group of the first family (kind, parameter, ranks) that holds a usable y;
 * rows none of them covers (other ranks') are the golden's, said in an
 * INFO line. */
int dl__ck_layouts_feed(dl__ck_t *ck)
{
    const dl_layout_t *first = NULL;
    for (int i = 0; i < ck->cand->n_layouts && !first; i++) {
        const dl_layout_t *L = &ck->cand->layouts[i];
        if (L->y && !(L->bad >> DL_LAYOUT_DS_ACT_Y & 1))
            first = L;
    }
    if (!first || ck->st[DL_VALUE_Y_SORTED].cand || ck->M == 0)
        return 0;
    /* the flat rows are in the golden's sorted order: a candidate sorting
     * its own way keeps its layouts to the layout checks */
    const int32_t *sp = ck->cand->fwd.sort_perm;
    if (sp && memcmp(sp, ck->gf->sort_perm, (size_t)ck->M * sizeof *sp))
        return 0;
    float *flat = dl__ck_alloc(ck, ck->M * ck->d, sizeof *flat);
    uint8_t *have = dl__ck_alloc(ck, ck->M, 1);
    if (!flat || !have)
        return DL_ENOMEM;
    for (int i = 0; i < ck->cand->n_layouts; i++) {
        const dl_layout_t *L = &ck->cand->layouts[i];
        if (!L->y || (L->bad >> DL_LAYOUT_DS_ACT_Y & 1) || L->kind != first->kind ||
            L->param != first->param || L->ranks != first->ranks)
            continue;
        dl_layout_t R;
        int rc = dl_layout_compute(L->kind, L->param, ck->gf->group_sizes, ck->gf->sort_perm,
                                   ck->T, ck->k, ck->E, L->e0, L->e1, &R);
        for (int64_t r = 0; !rc && L->len[DL_LAYOUT_DS_ACT_Y] == R.n_y && r < R.n_y; r++)
            if (R.y_src[r] >= 0) {
                memcpy(flat + (int64_t)R.y_src[r] * ck->d, L->y + r * ck->d,
                       (size_t)ck->d * sizeof *flat);
                have[R.y_src[r]] = 1;
            }
        dl_layout_free(&R);
        if (rc && rc != DL_ERANGE)
            return rc;
    }
    int64_t n = 0;
    for (int64_t q = 0; q < ck->M; q++)
        if (have[q])
            n++;
        else /* another rank's rows, absent: the golden's stand in (they pass) */
            memcpy(flat + q * ck->d, ck->gf->y_sorted + q * ck->d, (size_t)ck->d * sizeof *flat);
    if (n == 0)
        return 0;
    ck->st[DL_VALUE_Y_SORTED].cand = flat;
    if (n < ck->M) {
        dl_check_result_t *x = dl__ck_result(ck, DL_VALUE_NONE, "layout_feed");
        if (!x)
            return DL_ENOMEM;
        x->verdict = DL_VERDICT_INFO;
        dl__ck_msg(x, "/layouts/%s: its family covers %" PRId64 " of %" PRId64 " sorted rows: "
                   "y_sorted is judged on those, the golden's rows stand in for the rest",
                   first->name, n, ck->M);
    }
    return 0;
}
