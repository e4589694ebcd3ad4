/* Recomputing only what a candidate's upstream changes (issue 31, item 1).
 * Where the parts of its upstream that an element (a row, an expert's
 * slab) of stage s depends on are bitwise the golden's, its exact value IS
 * the golden's stored one: the runner starts from that, gathers the
 * changed units of every upstream value into compact arrays, calls the
 * stage's own exact function (dl__exact_<name>) on them through a vctx of
 * the compact sizes, and scatters the result back. Which units an element
 * depends on is the value's reuse column (DL_VALUE_MAP, desc.c):
 *   EACH    element i on element i of each upstream value (same dims); the
 *           unit is an element where every dimension of s is one of the
 *           vctx's sizes, else a row of its first dimension;
 *   ROW     row r of the first dimension (T or M) on row r of each
 *           upstream value with that first dimension: a GEMM's output row
 *           on its lhs row (the weights are inputs: the golden's), a
 *           token's softmax on its logits;
 *   EXPERT  expert e's slab of a ragged-K weight gradient on the sorted
 *           rows [off[e], off[e+1]) of each upstream value.
 * The stage functions round each element once, from exact sums, so an
 * element's bits do not depend on which other rows are in the call. Valid
 * only where the element's whole dependency is the golden's: the inputs
 * and the configuration are (the runner judges against the golden's), the
 * dispatch must be for sorted-row and expert values
 * (dl__ck_golden_dispatch), the zero experts' identity tail
 * (rows outside every group) is left to the whole recomputation, and every upstream float value must have the
 * golden's counterpart in its layout; otherwise 0 is returned and the
 * caller recomputes everything. */
#include "config.h"
#include <string.h>
#include "check/check_priv.h"

dl__ck_reuse_test_t dl__ck_reuse_test;

/* The vctx size of dimension symbol c, or NULL where it has none (S, R, V,
 * P: sizes the stage functions take from the configuration). */
static int64_t *vdim(dl__vctx_t *v, char c)
{
    switch (c) {
    case 'T': return &v->T;
    case 'M': return &v->M;
    case 'd': return &v->d;
    case 'f': return &v->f;
    case 'E': return &v->E;
    case 'k': return &v->k;
    default: return NULL;
    }
}

/* The plan of one partial recomputation. */
typedef struct {
    int shape;            /* DL__CK_REUSE_* */
    int elem;             /* EACH by element (unit = element) */
    int64_t rows;         /* rows of the upstream values (elements when elem) */
    int64_t units;        /* rows, or E for EXPERT */
    dl_valueset_t floats; /* the upstream float values */
    int grouped;          /* rows are sorted rows: the call takes compact group offsets */
} plan_t;

/* 1 if the dispatch the runner uses is the golden's: only then do the
 * golden's upstream arrays line up with the candidate's rows. */
int dl__ck_golden_dispatch(const dl__ck_t *ck)
{
    const void *e = ck->st[DL_VALUE_TOPK_IDS].eff, *g = ck->st[DL_VALUE_TOPK_IDS].gold;
    return e && g && !memcmp(e, g, (size_t)ck->M * sizeof(int32_t)) && !ck->row_missing;
}

/* Whether stage s can be recomputed in part, and how (*p). */
static int make_plan(const dl__ck_t *ck, dl_value_t s, dl_valueset_t up, plan_t *p)
{
    const char *dims = dl_value_dims(s);
    memset(p, 0, sizeof *p);
    p->shape = dl__ck_desc(s)->reuse;
    if (p->shape < DL__CK_REUSE_EACH || !ck->st[s].gold || ck->st[s].numel <= 0)
        return 0;
    const char lead = p->shape == DL__CK_REUSE_EXPERT ? 'M' : dims[0];
    if (dims[0] != 'T' && (!dl__ck_golden_dispatch(ck) || ck->c->route.zero_experts > 0))
        return 0;
    dl__vctx_t v = {0};
    p->elem = p->shape == DL__CK_REUSE_EACH;
    for (const char *c = dims; *c; c++)
        p->elem &= vdim(&v, *c) != NULL;
    for (int u = 0; u < DL_VALUE_COUNT; u++) {
        if (!((up >> u) & 1))
            continue;
        if (dl_value_store((dl_value_t)u) > DL_STORE_F32) { /* ids and the dispatch */
            if (!dl__ck_golden_dispatch(ck))
                return 0;
            continue;
        }
        const char *ud = dl_value_dims((dl_value_t)u);
        if (!ck->st[u].gold || !ck->st[u].eff || ud[0] != lead ||
            (p->shape == DL__CK_REUSE_EACH && strcmp(ud, dims)))
            return 0;
        p->floats |= DL_VALUE_BIT(u);
    }
    p->rows = p->elem ? ck->st[s].numel : dl_value_dim(ck->c, lead);
    p->units = p->shape == DL__CK_REUSE_EXPERT ? ck->E : p->rows;
    p->grouped = lead == 'M' && !p->elem;
    return p->floats && p->rows > 0 && (p->shape != DL__CK_REUSE_EXPERT || dims[0] == 'E');
}

/* Rows [first, end) of unit i. */
static void unit_rows(const plan_t *p, const int64_t *off, int64_t i, int64_t *first, int64_t *end)
{
    *first = p->shape == DL__CK_REUSE_EXPERT ? off[i] : i;
    *end = p->shape == DL__CK_REUSE_EXPERT ? off[i + 1] : i + 1;
}

/* chg[i] = 1 where unit i of some upstream value differs from the golden's
 * bitwise; the count. */
static int64_t changed_units(const dl__ck_t *ck, const plan_t *p, uint8_t *chg)
{
    const int64_t *off = ck->st[DL_VALUE_GROUP_OFFSETS].eff;
    memset(chg, 0, (size_t)p->units);
    for (int u = 0; u < DL_VALUE_COUNT; u++) {
        if (!((p->floats >> u) & 1) || ck->st[u].eff == ck->st[u].gold)
            continue;
        const int64_t len = ck->st[u].numel / p->rows;
        const char *e = ck->st[u].eff, *g = ck->st[u].gold;
        DL__PAR_FOR(ck->st[u].numel > DL__PAR_MIN, schedule(static),
        for (int64_t i = 0; i < p->units; i++) {
            int64_t a, b;
            unit_rows(p, off, i, &a, &b);
            const size_t at = (size_t)(a * len) * sizeof(float), sz = (size_t)((b - a) * len) * sizeof(float);
            if (!chg[i] && memcmp(e + at, g + at, sz))
                chg[i] = 1;
        });
    }
    int64_t n = 0;
    for (int64_t i = 0; i < p->units; i++)
        n += chg[i];
    /* the negative control of the tests: the first changed unit reused */
    if (dl__ck_reuse_test.mode == DL__CK_REUSE_TEST_MUTANT)
        for (int64_t i = 0; i < p->units; i++)
            if (chg[i]) {
                chg[i] = 0;
                n--;
                break;
            }
    return n;
}

/* The compact group offsets: the changed units' rows of each expert. */
static void compact_offsets(const dl__ck_t *ck, const plan_t *p, const uint8_t *chg, int64_t *co)
{
    const int64_t *off = ck->st[DL_VALUE_GROUP_OFFSETS].eff;
    int64_t q = 0, n = 0;
    for (int64_t e = 0; e < ck->E; e++) {
        co[e] = n;
        if (p->shape == DL__CK_REUSE_EXPERT) {
            n += chg[e] ? off[e + 1] - off[e] : 0;
            continue;
        }
        for (; q < off[e + 1]; q++)
            n += chg[q];
    }
    co[ck->E] = n;
}

/* Copies the changed units of array src (len elements a row) into dst
 * (gather) or back (scatter, dst the whole array); the elements moved. */
static int64_t move_units(const dl__ck_t *ck, const plan_t *p, const uint8_t *chg, int64_t len,
                          const float *whole, float *compact, int scatter)
{
    const int64_t *off = ck->st[DL_VALUE_GROUP_OFFSETS].eff;
    int64_t at = 0;
    for (int64_t i = 0; i < p->units; i++) {
        if (!chg[i])
            continue;
        int64_t a, b;
        unit_rows(p, off, i, &a, &b);
        const size_t sz = (size_t)((b - a) * len) * sizeof(float);
        if (scatter)
            memcpy((float *)whole + a * len, compact + at, sz);
        else
            memcpy(compact + at, whole + a * len, sz);
        at += (b - a) * len;
    }
    return at;
}

/* The compact buffers: one per upstream value (the cached compact
 * operands), the call's output, and a weight gradient's column calls'
 * operands and output; each grows (by half again over the need) and is
 * reused by every later stage of the run, so no pooled array is taken at
 * a size other than its own. */
#define BUF_OUT DL_VALUE_COUNT
#define BUF_DW_U (DL_VALUE_COUNT + 1)
#define BUF_DW_W (DL_VALUE_COUNT + 2)
#define BUF_DW_X (DL_VALUE_COUNT + 3)
_Static_assert(BUF_DW_X < DL__CK_REUSE_BUFS, "reuse.c's buffers");

/* Buffer slot of at least n floats, or NULL on no memory. */
static float *buffer(dl__ck_t *ck, int slot, int64_t n)
{
    dl__ck_reuse_t *r = &ck->reuse;
    float *b = r->buf[slot];
    /* the memo and the spare are keyed by operand addresses: nothing kept
     * on what the buffer held before stays */
    for (int i = 0; b && i < 3; i++) {
        if (i < 2 && ck->memo.slot[i].key == b)
            ck->memo.slot[i].v = NULL;
        if (ck->spare.v && ck->spare.on[i] == b)
            ck->spare.v = NULL;
    }
    if (r->cap[slot] < n) {
        b = r->buf[slot] = dl__ck_alloc(ck, n + n / 2 + 1, sizeof *b);
        r->cap[slot] = b ? n + n / 2 + 1 : 0;
    }
    return b;
}

/* The compact operands of a plan, kept for the next stage when it has the
 * same upstream on the same arrays (d_h_up after d_h_gate: then the two-
 * output SwiGLU backward keeps its second output for it, v->spare). */
static int compact_inputs(dl__ck_t *ck, dl_value_t s, const plan_t *p, const uint8_t *chg,
                          int64_t nchg, dl__ck_reuse_t *r)
{
    int same = r->stage == (int)s - 1 && r->floats == p->floats && r->shape == p->shape &&
               r->elem == p->elem && r->nchg == nchg && r->units == p->units && r->chg &&
               !memcmp(r->chg, chg, (size_t)p->units);
    for (int u = 0; same && u < DL_VALUE_COUNT; u++)
        same = !((p->floats >> u) & 1) || r->on[u] == ck->st[u].eff;
    r->stage = (int)s;
    if (same)
        return 0;
    r->floats = p->floats;
    r->shape = p->shape;
    r->elem = p->elem;
    r->nchg = nchg;
    r->units = p->units;
    if (!(r->chg = dl__ck_alloc(ck, p->units, 1)))
        return DL_ENOMEM;
    memcpy(r->chg, chg, (size_t)p->units);
    for (int u = 0; u < DL_VALUE_COUNT; u++) {
        if (!((p->floats >> u) & 1))
            continue;
        const int64_t len = ck->st[u].numel / p->rows;
        int64_t n = 0;
        for (int64_t i = 0; i < p->units; i++) /* the compact array's length */
            if (chg[i]) {
                int64_t a, b;
                unit_rows(p, ck->st[DL_VALUE_GROUP_OFFSETS].eff, i, &a, &b);
                n += (b - a) * len;
            }
        r->on[u] = NULL; /* until filled */
        if (!(r->arr[u] = buffer(ck, u, n)))
            return DL_ENOMEM;
        r->on[u] = ck->st[u].eff;
        move_units(ck, p, chg, len, ck->st[u].eff, r->arr[u], 0);
    }
    return 0;
}

/* The vctx of the compact call: sizes of the changed units, the compact
 * upstream, nothing else of the runner's values (a stage function that
 * read a value its row does not name would fail, not read wrong rows). */
static void compact_vctx(dl__ck_t *ck, dl_value_t s, const plan_t *p, const dl__ck_reuse_t *r,
                         int64_t nrows, const int64_t *co, dl__vctx_t *v)
{
    dl__ck_vctx(ck, -1, v);
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        v->v[u] = (p->floats >> u) & 1 ? r->arr[u] : NULL;
    v->v[DL_VALUE_GROUP_OFFSETS] = co;
    const char *dims = dl_value_dims(s);
    if (p->elem) {
        for (const char *c = dims; *c; c++)
            *vdim(v, *c) = c == dims ? nrows : 1;
    } else {
        *vdim(v, p->shape == DL__CK_REUSE_EXPERT ? 'M' : dims[0]) = nrows;
    }
}

/* The compact call and the scatter into x (the golden's value). */
static int recompute_units(dl__ck_t *ck, dl_value_t s, const plan_t *p, const uint8_t *chg,
                           int64_t nchg, float *x)
{
    dl__ck_reuse_t *r = &ck->reuse;
    int64_t *co = NULL;
    int rc;
    if ((rc = compact_inputs(ck, s, p, chg, nchg, r)))
        return rc;
    if (p->grouped && !(co = dl__ck_alloc(ck, ck->E + 1, sizeof *co)))
        return DL_ENOMEM;
    if (co)
        compact_offsets(ck, p, chg, co);
    const int64_t n = ck->st[s].numel;
    const int expert = p->shape == DL__CK_REUSE_EXPERT;
    /* rows of the call: changed units, or the changed experts' rows */
    const int64_t nrows = expert ? co[ck->E] : nchg;
    const int64_t len = expert ? n / ck->E : n / p->rows; /* per unit of s */
    const int64_t cn = expert ? n : nchg * len;
    dl__vctx_t v;
    compact_vctx(ck, s, p, r, nrows, co, &v);
    float *cx = buffer(ck, BUF_OUT, cn);
    if (!cx)
        return DL_ENOMEM;
    memset(cx, 0, (size_t)cn * sizeof *cx);
    rc = dl__ck_desc(s)->exact(&v, cx);
    if (!rc && expert) { /* the changed experts' slabs, in place */
        for (int64_t e = 0; e < ck->E; e++)
            if (chg[e])
                memcpy(x + e * len, cx + e * len, (size_t)len * sizeof *x);
    } else if (!rc) {
        plan_t q = *p;
        q.shape = DL__CK_REUSE_ROW; /* s's units are its rows (or elements) */
        move_units(ck, &q, chg, len, x, cx, 1);
    }
    return rc;
}

/* EXPERT, finer: element (e, i, j) of a ragged-K weight gradient
 * a_e^T b_e depends on column i of a and column j of b over expert e's
 * rows only. A changed expert whose changes fall in a few columns is
 * recomputed as its rows i of changed a columns (a compacted to them, the
 * a column size of the call their count) and its columns j of changed b
 * columns (b compacted likewise), by the stage's function on that
 * expert's rows alone (E = 1). The operands: a, whose columns are s's
 * second dimension (none for a bias gradient: ones), and b, its last. */
typedef struct {
    int a, b;      /* the operands' values (a: -1 for a bias gradient) */
    char ca, cb;   /* their column symbols */
    int64_t I, N;  /* their columns */
} dw_t;

static int dw_operands(const dl__ck_t *ck, dl_value_t s, const plan_t *p, dw_t *o)
{
    const char *dims = dl_value_dims(s);
    const size_t r = strlen(dims);
    *o = (dw_t){.a = -1, .b = -1, .ca = r == 3 ? dims[1] : 0, .cb = dims[r - 1], .I = 1};
    dl__vctx_t v = {0};
    if (!ck->swiglu || o->ca == o->cb || !vdim(&v, o->cb) || (o->ca && !vdim(&v, o->ca)))
        return 0; /* a plain FFN's d_w_down: x_sorted's columns are not s's */
    for (int u = 0; u < DL_VALUE_COUNT; u++) {
        if (!((p->floats >> u) & 1))
            continue;
        const char c = dl_value_dims((dl_value_t)u)[1];
        if (c == o->ca && o->a < 0)
            o->a = u;
        else if (c == o->cb && o->b < 0)
            o->b = u;
        else
            return 0;
    }
    if (o->a >= 0)
        o->I = ck->st[o->a].numel / ck->M;
    if (o->b >= 0)
        o->N = ck->st[o->b].numel / ck->M;
    return o->b >= 0 && (r == 2) == (o->a < 0);
}

/* sel[j] = 1 where column j (of len) of value u differs from the golden's
 * on rows [r0, r0 + m); the count. */
static int64_t changed_cols(const dl__ck_t *ck, int u, int64_t r0, int64_t m, int64_t len,
                            uint8_t *sel)
{
    memset(sel, 0, (size_t)len);
    if (u < 0 || ck->st[u].eff == ck->st[u].gold)
        return 0;
    const uint32_t *e = ck->st[u].eff, *g = ck->st[u].gold;
    for (int64_t r = r0; r < r0 + m; r++)
        for (int64_t j = 0; j < len; j++)
            sel[j] |= e[r * len + j] != g[r * len + j];
    int64_t n = 0;
    for (int64_t j = 0; j < len; j++)
        n += sel[j];
    return n;
}

/* One call of expert e on the selected columns sel (ns of them) of operand
 * pass (0: a, 1: b), the other whole; scattered into x. */
static int dw_call(dl__ck_t *ck, dl_value_t s, const dw_t *o, int64_t e, int pass,
                   const uint8_t *sel, int64_t ns, float *x)
{
    const int64_t *off = ck->st[DL_VALUE_GROUP_OFFSETS].eff;
    const int64_t r0 = off[e], m = off[e + 1] - off[e], I = o->I, N = o->N;
    const int u = pass ? o->b : o->a, w = pass ? o->a : o->b;
    const int64_t lu = pass ? N : I, lw = pass ? I : N, cn = pass ? I * ns : ns * N;
    float *cu = buffer(ck, BUF_DW_U, m * ns), *cw = NULL, *cx = buffer(ck, BUF_DW_X, cn);
    if (!cu || !cx || (w >= 0 && !(cw = buffer(ck, BUF_DW_W, m * lw))))
        return DL_ENOMEM;
    memset(cx, 0, (size_t)cn * sizeof *cx);
    const float *eu = ck->st[u].eff;
    for (int64_t r = 0, k = 0; r < m; r++)
        for (int64_t j = 0; j < lu; j++)
            if (sel[j])
                cu[k++] = eu[(r0 + r) * lu + j];
    if (cw)
        memcpy(cw, (const float *)ck->st[w].eff + r0 * lw, (size_t)(m * lw) * sizeof *cw);
    const int64_t co[2] = {0, m};
    dl__vctx_t v;
    dl__ck_vctx(ck, -1, &v);
    for (int q = 0; q < DL_VALUE_COUNT; q++)
        v.v[q] = q == u ? cu : q == w ? cw : NULL;
    v.v[DL_VALUE_GROUP_OFFSETS] = co;
    v.E = 1;
    v.M = m;
    *vdim(&v, pass ? o->cb : o->ca) = ns;
    int rc = dl__ck_desc(s)->exact(&v, cx);
    float *xe = x + e * I * N;
    for (int64_t i = 0, k = 0; !rc && i < (pass ? I : lu); i++) {
        if (!pass && sel[i])
            memcpy(xe + i * N, cx + k++ * N, (size_t)N * sizeof *x);
        for (int64_t j = 0, q = 0; pass && j < N; j++)
            if (sel[j])
                xe[i * N + j] = cx[i * ns + q++];
    }
    return rc;
}

/* The changed experts of chg whose changes lie in few columns, recomputed
 * by columns into x; their chg cleared. */
static int dw_columns(dl__ck_t *ck, dl_value_t s, const plan_t *p, uint8_t *chg, float *x)
{
    dw_t o;
    if (!dw_operands(ck, s, p, &o))
        return 0;
    const int64_t *off = ck->st[DL_VALUE_GROUP_OFFSETS].eff;
    uint8_t *ci = dl__ck_alloc(ck, o.I, 1), *cj = dl__ck_alloc(ck, o.N, 1);
    if (!ci || !cj)
        return DL_ENOMEM;
    for (int64_t e = 0; e < ck->E; e++) {
        if (!chg[e])
            continue;
        const int64_t m = off[e + 1] - off[e];
        const int64_t nI = changed_cols(ck, o.a, off[e], m, o.I, ci);
        const int64_t nJ = changed_cols(ck, o.b, off[e], m, o.N, cj);
        /* the elements the two calls give, against the expert's whole slab */
        if ((nI * o.N + nJ * o.I) * 2 > o.I * o.N)
            continue;
        int rc = 0;
        if ((nI && (rc = dw_call(ck, s, &o, e, 0, ci, nI, x))) ||
            (nJ && (rc = dw_call(ck, s, &o, e, 1, cj, nJ, x))))
            return rc;
        chg[e] = 0;
    }
    return 0;
}

int dl__ck_exact_reuse(dl__ck_t *ck, dl_value_t s, float *x)
{
    plan_t p;
    const dl_valueset_t up = dl__ck_upstream(ck, s);
    ck->st[s].reused = -1;
    if (dl__ck_reuse_test.mode == DL__CK_REUSE_TEST_FULL || ck->opt.recompute_all ||
        !make_plan(ck, s, up, &p))
        return 0;
    uint8_t *chg = dl__ck_alloc(ck, p.units, 1); /* small: the run's */
    if (!chg)
        return DL_ENOMEM;
    int64_t nchg = changed_units(ck, &p, chg);
    const int64_t nunits = nchg;
    int rc = 0;
    memcpy(x, ck->st[s].gold, (size_t)ck->st[s].numel * sizeof *x);
    if (p.shape == DL__CK_REUSE_EXPERT && nchg > 0) { /* by columns where few changed */
        if ((rc = dw_columns(ck, s, &p, chg, x)))
            return rc;
        nchg = 0;
        for (int64_t e = 0; e < p.units; e++)
            nchg += chg[e];
    }
    /* nearly all changed: the whole call costs no more than the gathers */
    if (nchg * 10 > p.units * 9 && nchg == nunits &&
        dl__ck_reuse_test.mode != DL__CK_REUSE_TEST_MUTANT)
        return 0;
    if (nchg > 0)
        rc = recompute_units(ck, s, &p, chg, nchg, x);
    ck->st[s].reused = nunits;
    return rc ? rc : 1;
}
