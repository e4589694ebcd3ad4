/* The expert-parallel layout checks (doc/conformance.md, "Expert
 * parallelism"): a candidate's /ep/ranks_R against the stage dl_ep_layout
 * of the golden's routing. Counts and is_token_in_rank are exact; the
 * dispatch must be a bijection of the (token, slot) pairs whose expert
 * lives on a rank onto that rank's received rows, in any order (WARN when
 * not the canonical one), one copy of a token per rank; the received
 * weights are the golden's bits. Every finding names (t, j, rank). */
#include "config.h"
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

typedef struct {
    dl__ck_t *ck;
    const dl_ep_layout_t *L; /* the candidate's */
    const dl_ep_layout_t *G; /* the reference in the same form */
    const int32_t *ids;      /* golden topk_ids [T, k] */
    const float *w;          /* golden topk_weights */
    char where[64];          /* "ranks_4" or "ranks_4 rank 1" */
    int64_t per;             /* E/R */
} ep_t;

static dl_check_result_t *row(ep_t *e, const char *check)
{
    return dl__ck_result(e->ck, DL_VALUE_NONE, check);
}

/* A finding: the first few are listed in the message. */
static void note(ep_t *e, dl_check_result_t *x, int64_t *nf, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static void note(ep_t *e, dl_check_result_t *x, int64_t *nf, const char *fmt, ...)
{
    if ((*nf)++ < (e->ck->opt.max_listed > 0 ? e->ck->opt.max_listed : 1)) {
        char buf[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        dl__ck_msg_append(x, "%s%s", *nf > 1 ? "; " : "", buf);
    }
    x->verdict = DL_VERDICT_FAIL;
}

/* The finished message: "/ep/ranks_4: 3 findings: ..." or the PASS line. */
static void close_row(ep_t *e, dl_check_result_t *x, int64_t nf, const char *pass)
{
    char body[sizeof x->message];
    snprintf(body, sizeof body, "%s", x->message);
    if (x->verdict == DL_VERDICT_FAIL)
        dl__ck_msg(x, "/ep/%s: %" PRId64 " finding%s: %s", e->where, nf, nf == 1 ? "" : "s", body);
    else if (x->verdict == DL_VERDICT_WARN)
        dl__ck_msg(x, "/ep/%s: %s", e->where, body);
    else {
        x->verdict = DL_VERDICT_PASS;
        dl__ck_msg(x, "/ep/%s: %s", e->where, pass);
    }
}

/* The first token of the candidate's is_token_in_rank rows. */
static int64_t first_token(const ep_t *e)
{
    int64_t b = 0, end;
    if (e->L->rank >= 0)
        dl_ep_source_range(e->L->tokens, e->L->ranks, e->L->rank, &b, &end);
    return b;
}

/* Counts, displacements and is_token_in_rank: element by element. */
static int exact_arrays(ep_t *e)
{
    dl_check_result_t *cx = NULL, *ix = NULL;
    int64_t ncf = 0, nif = 0;
    for (int i = 0; i < DL_EP_DATASET_COUNT; i++) {
        const int elem = dl_ep_dataset_elem(i);
        const void *c = *dl_ep_slot((dl_ep_layout_t *)e->L, i);
        const void *g = *dl_ep_slot((dl_ep_layout_t *)e->G, i);
        if (!c || !g || elem == DL_EP_I32 || elem == DL_EP_F32)
            continue;
        const int isb = elem == DL_EP_BOOL;
        dl_check_result_t **xp = isb ? &ix : &cx;
        if (!*xp && !(*xp = row(e, isb ? "ep_in_rank" : "ep_counts")))
            return DL_ENOMEM;
        int64_t dims[2] = {1, 1};
        int nd = dl_ep_dataset_shape(e->G, i, dims);
        int64_t cols = nd == 2 ? dims[1] : 1, n = dims[0] * cols;
        (*xp)->n_checked += n;
        for (int64_t q = 0; q < n; q++) {
            int64_t cv = isb ? ((const uint8_t *)c)[q] : ((const int64_t *)c)[q];
            int64_t gv = isb ? ((const uint8_t *)g)[q] : ((const int64_t *)g)[q];
            if (cv == gv)
                continue;
            char at[48];
            if (nd == 2)
                snprintf(at, sizeof at, "%" PRId64 ",%" PRId64, q / cols, q % cols);
            else
                snprintf(at, sizeof at, "%" PRId64, q);
            if (isb)
                note(e, ix, &nif, "token %" PRId64 " rank %" PRId64 ": %s, expected %" PRId64,
                     q / cols + first_token(e), q % cols, cv > 1 ? "not 0/1" : cv ? "1" : "0", gv);
            else
                note(e, cx, &ncf, "%s[%s] = %" PRId64 ", expected %" PRId64, dl_ep_dataset_name(i),
                     at, cv, gv);
        }
    }
    if (cx)
        close_row(e, cx, ncf, "counts and displacements exact");
    if (ix)
        close_row(e, ix, nif, "is_token_in_rank exact");
    return 0;
}

/* Which of the candidate's rows each rank received, lo[r]..lo[r+1]: its
 * own recv_offsets or num_tokens_per_rank when they add up to its rows,
 * else the golden's when the row counts agree; 0 when none fits. */
static int rank_rows(const ep_t *e, int64_t *lo)
{
    const dl_ep_layout_t *L = e->L;
    const int64_t R = L->ranks, N = L->n_recv;
    if (L->rank >= 0) {
        lo[0] = 0;
        lo[1] = N;
        return 1;
    }
    const int64_t *src[2] = {L->recv_offsets, NULL};
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1 && L->num_tokens_per_rank) {
            lo[0] = 0;
            for (int64_t r = 0; r < R; r++)
                lo[r + 1] = lo[r] + (L->num_tokens_per_rank[r] < 0 ? N + 1 : L->num_tokens_per_rank[r]);
        } else if (pass != 1) {
            const int64_t *o = pass == 0 ? src[0] : e->G->recv_offsets;
            if (!o)
                continue;
            memcpy(lo, o, (size_t)(R + 1) * sizeof *lo);
        } else {
            continue;
        }
        int ok = lo[0] == 0 && lo[R] == N;
        for (int64_t r = 0; ok && r < R; r++)
            ok = lo[r] <= lo[r + 1];
        if (ok)
            return 1;
    }
    return 0;
}

typedef struct {
    dl_check_result_t *dx, *wx;
    int64_t ndf, nwf;
    int unordered;
    int32_t *stamp;  /* [T] rank + 1 that last received token t */
    int64_t *first;  /* [T] its row there */
} walk_t;

/* Expected local id of slot j of token t on rank r (-1: elsewhere). */
static int32_t want_idx(const ep_t *e, int64_t t, int64_t j, int64_t r)
{
    int64_t x = e->ids[t * e->L->top_k + j];
    return x / e->per == r ? (int32_t)(x - r * e->per) : -1;
}

/* One received row i of rank r. */
static void one_row(ep_t *e, walk_t *w, int64_t r, int64_t i, int64_t *prev)
{
    const dl_ep_layout_t *L = e->L;
    const int64_t k = L->top_k;
    const int64_t t = L->recv_token[i];
    if (t < 0 || t >= L->tokens) {
        note(e, w->dx, &w->ndf, "row %" PRId64 " on rank %" PRId64 ": token %" PRId64 " out of range",
             i, r, t);
        return;
    }
    int64_t j0 = 0; /* the slot a finding names: the first the row claims */
    for (int64_t j = 0; L->recv_topk_idx && j < k; j++)
        if (L->recv_topk_idx[i * k + j] != -1) {
            j0 = j;
            break;
        }
    if (w->stamp[t] == r + 1) {
        note(e, w->dx, &w->ndf, "duplicate copies: DeepEP sends one per rank: (%" PRId64
             ", %" PRId64 ", rank %" PRId64 ") in rows %" PRId64 " and %" PRId64, t, j0, r,
             w->first[t], i);
        return;
    }
    w->stamp[t] = (int32_t)(r + 1);
    w->first[t] = i;
    /* the golden's is_token_in_rank, whole */
    int in = 0;
    for (int64_t j = 0; j < k; j++)
        in |= want_idx(e, t, j, r) >= 0;
    if (!in) {
        note(e, w->dx, &w->ndf, "wrong rank: (%" PRId64 ", %" PRId64 ", rank %" PRId64
             "): token %" PRId64 " has no expert on rank %" PRId64, t, j0, r, t, r);
        return;
    }
    if (t < *prev)
        w->unordered = 1;
    *prev = t;
    for (int64_t j = 0; j < k; j++) {
        int32_t want = want_idx(e, t, j, r);
        if (L->recv_topk_idx) {
            int32_t got = L->recv_topk_idx[i * k + j];
            if (got != want && !(want >= 0 && got == -1)) /* a -1 there is a drop, below */
                note(e, w->dx, &w->ndf, "(%" PRId64 ", %" PRId64 ", rank %" PRId64
                     "): local expert %d, expected %d", t, j, r, (int)got, (int)want);
        }
        if (L->recv_topk_weights && w->wx) {
            float exp = 0.0f;
            if (want >= 0)
                exp = e->w[t * k + j];
            uint32_t a, b;
            memcpy(&a, &L->recv_topk_weights[i * k + j], 4);
            memcpy(&b, &exp, 4);
            if (a != b)
                note(e, w->wx, &w->nwf, "(%" PRId64 ", %" PRId64 ", rank %" PRId64
                     "): weight 0x%08x, expected 0x%08x", t, j, r, (unsigned)a, (unsigned)b);
        }
    }
}

/* Every (t, j) whose expert lives on r must have reached it. */
static void drops(ep_t *e, walk_t *w, int64_t r)
{
    const dl_ep_layout_t *L = e->L;
    const int64_t k = L->top_k;
    for (int64_t t = 0; t < L->tokens; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t want = want_idx(e, t, j, r);
            if (want < 0)
                continue;
            if (w->stamp[t] != r + 1)
                note(e, w->dx, &w->ndf, "dropped: (%" PRId64 ", %" PRId64 ", rank %" PRId64
                     ") never arrives", t, j, r);
            else if (L->recv_topk_idx && L->recv_topk_idx[w->first[t] * k + j] == -1)
                note(e, w->dx, &w->ndf, "dropped: (%" PRId64 ", %" PRId64 ", rank %" PRId64
                     ") arrives without its slot (local id -1)", t, j, r);
        }
}

/* The bijection of the dispatch and the received weights. */
static int dispatch(ep_t *e)
{
    const dl_ep_layout_t *L = e->L;
    if (!L->recv_token) {
        if (!L->recv_topk_idx && !L->recv_topk_weights)
            return 0;
        /* received slots without their tokens: said, not silently passed over */
        dl_check_result_t *x = row(e, "ep_dispatch");
        if (!x)
            return DL_ENOMEM;
        dl__ck_msg(x, "/ep/%s: recv_topk_idx/recv_topk_weights without recv_token: the dispatch "
                   "cannot be checked", e->where);
        return 0;
    }
    const int64_t R = L->ranks;
    walk_t w = {0};
    w.dx = row(e, "ep_dispatch");
    if (!w.dx || (L->recv_topk_weights && !(w.wx = row(e, "ep_weights"))))
        return DL_ENOMEM;
    int64_t *lo = dl__ck_alloc(e->ck, R + 1, sizeof *lo);
    w.stamp = dl__ck_alloc(e->ck, L->tokens, sizeof *w.stamp);
    w.first = dl__ck_alloc(e->ck, L->tokens, sizeof *w.first);
    if (!lo || !w.stamp || !w.first)
        return DL_ENOMEM;
    w.dx->n_checked = L->n_recv;
    if (w.wx)
        w.wx->n_checked = L->n_recv * L->top_k;
    if (!rank_rows(e, lo)) {
        note(e, w.dx, &w.ndf, "%" PRId64 " received rows that neither recv_offsets nor "
             "num_tokens_per_rank divide among the ranks", L->n_recv);
        close_row(e, w.dx, w.ndf, "");
        if (w.wx)
            w.wx->verdict = DL_VERDICT_SKIP, dl__ck_msg(w.wx, "/ep/%s: rows not attributable", e->where);
        return 0;
    }
    int64_t r0 = L->rank >= 0 ? L->rank : 0, r1 = L->rank >= 0 ? L->rank + 1 : R;
    for (int64_t r = r0; r < r1; r++) {
        int64_t prev = -1, b = L->rank >= 0 ? lo[0] : lo[r], end = L->rank >= 0 ? lo[1] : lo[r + 1];
        for (int64_t i = b; i < end; i++)
            one_row(e, &w, r, i, &prev);
        drops(e, &w, r);
    }
    if (w.dx->verdict != DL_VERDICT_FAIL && w.unordered) {
        w.dx->verdict = DL_VERDICT_WARN;
        dl__ck_msg(w.dx, "a bijection, but the receive order differs from canonical (by source "
                   "rank, then token)");
    }
    close_row(e, w.dx, w.ndf, "a bijection, one copy per rank, canonical order");
    if (w.wx)
        close_row(e, w.wx, w.nwf, "received weights bit-exact");
    return 0;
}

static int one_layout(dl__ck_t *ck, const dl_ep_layout_t *L)
{
    ep_t e = {ck, L, NULL, ck->gf->topk_ids, ck->gf->topk_weights, "", L->experts / L->ranks};
    if (L->rank >= 0)
        snprintf(e.where, sizeof e.where, "ranks_%" PRId64 " rank %" PRId64, L->ranks, L->rank);
    else
        snprintf(e.where, sizeof e.where, "ranks_%" PRId64, L->ranks);
    dl_ep_layout_t whole, view;
    int rc = dl_ep_layout(e.ids, e.w, ck->T, ck->k, ck->E, L->ranks, &whole);
    if (rc)
        return rc;
    memset(&view, 0, sizeof view);
    if (L->rank >= 0 && (rc = dl_ep_layout_view(&whole, L->rank, &view)))
        goto out;
    e.G = L->rank >= 0 ? &view : &whole;
    if (L->bad) {
        dl_check_result_t *x = row(&e, "ep_shape");
        if (!x) {
            rc = DL_ENOMEM;
            goto out;
        }
        x->verdict = DL_VERDICT_FAIL;
        dl__ck_msg(x, "/ep/%s: set aside: %s", e.where, L->bad_reason);
    }
    if (!(rc = exact_arrays(&e)))
        rc = dispatch(&e);
out:
    dl_ep_layout_free(&view);
    dl_ep_layout_free(&whole);
    return rc;
}

int dl__ck_ep(dl__ck_t *ck)
{
    for (int i = 0; i < ck->cand->n_ep; i++) {
        const dl_ep_layout_t *L = &ck->cand->ep[i];
        if (L->experts != ck->E || L->top_k != ck->k || L->tokens != ck->T || L->ranks < 1 ||
            ck->E % L->ranks)
            return DL_EINVAL;
        int rc = one_layout(ck, L);
        if (rc)
            return rc;
    }
    return 0;
}
