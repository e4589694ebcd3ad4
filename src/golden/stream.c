/* The streaming generator: a golden file written dataset by dataset in the
 * format's order, the expert weights drawn one expert at a time (the input
 * PRNG is addressed by element, so expert e's slab is the same values
 * dl_case_inputs draws) and never held whole, the weight gradients written
 * one expert at a time. What stays in memory is the token-sized inputs,
 * the routing, the sorted-row activations of the experts written, and one
 * expert's weights: for mixtral-layer about 4 GB instead of the file's
 * 13 GiB. It is the schedule's per-expert placement (dropless/schedule.h):
 * the producers of dl_moe_forward/backward, the EXPERTS ones one expert at
 * a time, and every value is the exact result rounded once, so the bytes
 * are those of the in-memory generator.
 *
 * A slice (experts [A, B)) keeps the global routing and writes only those
 * experts' weights, sorted rows and weight gradients: the expert-parallel
 * rank's view (doc/format.md, "Expert slices"). */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "golden/golden_priv.h"

typedef struct {
    const dl_case_t *c;
    const dl_golden_gen_opts_t *o;
    int64_t A, B, r0, r1; /* experts [A, B), their sorted rows [r0, r1) */
    int full, swiglu;
    dl_golden_inputs_t in; /* every input but the expert weights */
    dl_moe_forward_t f;    /* per-token values and the permutations whole; "M?" rows [r0, r1) */
    dl_moe_backward_t b;
    dl_golden_file_t *hdr; /* the file's header: the layouts go there */
    float *wbuf[2];        /* one expert's weights */
    float *dw;             /* one expert's weight gradient */
    int64_t off1[2];       /* an EXPERTS window's one group: {0, its rows} */
    int next;              /* the schedule's next producer */
    dl_rowset_t written;   /* layout rows in the file */
    dl__golden_sink_t *sink; /* the dataset being written, and its row */
    int sink_row;
    dl_tier_stats_t stats;
    double work_done, work_total;
    char *err;
    size_t errlen;
} stream_t;

/* Datasets that need every expert's rows, so are not in a slice: the
 * schedule's (dl_schedule_needs_experts). */
static int needs_all_experts(const dl_golden_dataset_t *ds, const dl_moe_config_t *c)
{
    for (int r = 0; r < dl_golden_dataset_count(); r++)
        if (dl_golden_dataset(r) == ds)
            return DL_ROWSET_HAS(dl_schedule_needs_experts(c), r);
    return 0;
}

int64_t dl__golden_slice_shape(const dl_golden_dataset_t *ds, const dl_moe_config_t *c, int full,
                               int64_t n_experts, int64_t n_rows, int64_t dims[3])
{
    if (!full && needs_all_experts(ds, c))
        return -1;
    int64_t n = dl_golden_dataset_shape(ds, c, dims);
    if (n < 0 || full)
        return n;
    if (ds->rank >= 2 && ds->dims[0] == 'E') /* the weights, the biases, their gradients */
        dims[0] = n_experts;
    else if (ds->rank == 2 && ds->dims[0] == 'M') /* sort_perm, inv_perm stay whole */
        dims[0] = n_rows;
    n = 1;
    for (int i = 0; i < ds->rank; i++)
        n *= dims[i];
    return n;
}

static int64_t shape_of(void *vctx, const dl_golden_dataset_t *ds, int64_t dims[3])
{
    stream_t *s = vctx;
    if (s->o->no_backward && ds->group == DL_GOLDEN_BACKWARD)
        return -1;
    return dl__golden_slice_shape(ds, &s->c->config, s->full, s->B - s->A, s->r1 - s->r0, dims);
}

static void progress(stream_t *s, const char *phase, double add)
{
    s->work_done += add;
    if (s->o->progress)
        s->o->progress(s->o->progress_ctx, phase,
                       s->work_total > 0 ? s->work_done / s->work_total : 1.0);
}

#define FAILMSG(rc_, ...)                                         \
    do {                                                          \
        dl__golden_msg(s->err, s->errlen, __VA_ARGS__);           \
        return (rc_);                                             \
    } while (0)

static void *alloc0(int64_t n, size_t size)
{
    return calloc(n > 0 ? (size_t)n : 1, size);
}

/* ------------------------------------------------- the stream placement */

/* A sorted-row array of rank 2 ("M?"): held for the slice's rows only. */
static int rows_array(const dl_layout_row_t *r)
{
    return r->dims[0] == 'M' && r->dims[1];
}

/* An expert array of rank 3 ("E??": weights, weight gradients): drawn or
 * written one expert at a time. */
static int slab(const dl_layout_row_t *r)
{
    return r->dims[0] == 'E' && r->dims[1] && r->dims[2];
}

/* A per-expert array of rank 2 ("E?": the expert biases, their
 * gradients): held for the slice's experts A..B-1, expert e's row at e - A
 * (an input is drawn whole: its row e). */
static int expert_rows(const dl_layout_row_t *r)
{
    return r->dims[0] == 'E' && r->dims[1] && !r->dims[2];
}

/* The producer writes a dataset of this file (a slice leaves out what
 * needs every expert: out, the router gradients, d_x). */
static int in_file(const stream_t *s, const dl_producer_t *p)
{
    int64_t dims[3];
    for (int r = 0; r < dl_layout_count(); r++)
        if (DL_ROWSET_HAS(p->writes, r) && shape_of((void *)(uintptr_t)s, dl_golden_dataset(r), dims) >= 0)
            return 1;
    return 0;
}

/* The first expert weight row the producer reads, after `after`, and which
 * weight it is (DL__W_*); -1 when none. */
static int weight_read(const stream_t *s, const dl_producer_t *p, int after, int *which)
{
    static const int rows[3] = {DL__ROW_IN_W_GATE, DL__ROW_IN_W_UP, DL__ROW_IN_W_DOWN};
    const dl_rowset_t reads = dl_schedule_reads(p, &s->c->config);
    for (int i = 0; i < 3; i++)
        if (rows[i] > after && ((reads >> rows[i]) & 1)) {
            *which = i;
            return rows[i];
        }
    return -1;
}

/* The outputs of producer p that are not there yet: whole, the slice's
 * rows for "M?" arrays; an expert array is one expert's slab in s->dw. */
static int alloc_outputs(stream_t *s, const dl_producer_t *p)
{
    const dl_moe_config_t *c = &s->c->config;
    for (int r = 0; r < dl_layout_count(); r++) {
        const dl_layout_row_t *row = dl_layout_row(r);
        void **slot = dl_layout_slot(row, NULL, &s->f, &s->b);
        if (!DL_ROWSET_HAS(p->writes, r) || !slot || *slot || slab(row))
            continue;
        int64_t n = dl_layout_numel_rows(row, c, rows_array(row) ? s->r1 - s->r0
                                                 : expert_rows(row) ? s->B - s->A : -1);
        if (!(*slot = alloc0(n, row->store == DL_STORE_I64 ? 8 : 4)))
            return DL_ENOMEM;
    }
    return 0;
}

/* The window: every token; sorted rows [row0, row0 + rows) of the slice's
 * buffers; an EXPERTS producer one expert (A + w) at a time, its weights
 * drawn into s->wbuf, its weight gradient into s->dw. */
static int bind(void *ctx, int i, int w, dl_stage_view_t *v)
{
    stream_t *s = ctx;
    const dl_producer_t *p = dl_schedule_producer(i);
    const int experts = p->span == DL_SPAN_EXPERTS;
    if ((w > 0 && !experts) || s->A + w >= s->B || !in_file(s, p))
        return DL_SCHEDULE_END;
    int rc = w == 0 ? alloc_outputs(s, p) : 0;
    if (rc)
        return rc;
    const int64_t e = s->A + w;
    int64_t row0 = s->r0, n = s->r1 - s->r0;
    if (experts) {
        row0 = s->f.group_offsets[e];
        n = s->f.group_offsets[e + 1] - row0;
    }
    *v = (dl_stage_view_t){.c = s->c->config, .in = dl_golden_inputs_view(&s->in), .f = s->f,
                           .b = s->b, .row0 = row0, .rows = n, .off = s->off1, .ne = 1,
                           .stats = &s->stats};
    s->off1[1] = n;
    for (int r = 0; r < dl_layout_count(); r++) {
        const dl_layout_row_t *row = dl_layout_row(r);
        void **slot = dl_layout_slot(row, NULL, &v->f, &v->b);
        if (slot && *slot && rows_array(row))
            *slot = (float *)*slot + (row0 - s->r0) * (row->dims[1] == 'd' ? s->c->config.hidden
                                                                             : s->c->config.ffn);
        else if (slot && slab(row) && DL_ROWSET_HAS(p->writes, r))
            *slot = s->dw;
        else if (experts && expert_rows(row)) { /* expert e's row */
            const int64_t N = dl_layout_numel_rows(row, &s->c->config, 1);
            void **in = dl_layout_slot(row, &v->in, NULL, NULL);
            if (in && *in)
                *in = (float *)*in + e * N;
            else if (slot && *slot)
                *slot = (float *)*slot + (e - s->A) * N;
        }
    }
    int which, at = -1;
    for (int k = 0; experts && (at = weight_read(s, p, at, &which)) >= 0; k++) {
        dl__case_expert_weight(s->c, which, e, s->wbuf[k]);
        *dl_layout_slot(dl_layout_row(at), &v->in, NULL, NULL) = s->wbuf[k];
    }
    return 0;
}

/* After a window: an expert's weight gradient goes to the file; the sort
 * gives the slice's rows and the expert-parallel layouts. */
static int done(void *ctx, int i, int w, const dl_stage_view_t *v)
{
    stream_t *s = ctx;
    const dl_producer_t *p = dl_schedule_producer(i);
    progress(s, p->name, p->span == DL_SPAN_EXPERTS ? 1.0 / (double)(s->B - s->A) : 0.02);
    if (DL_ROWSET_HAS(p->writes, DL__ROW_GROUP_OFFSETS)) {
        s->r0 = s->f.group_offsets[s->A];
        s->r1 = s->f.group_offsets[s->B];
        /* written after every other group, by then from the header */
        return dl__golden_ep_layouts(&s->c->config, s->f.topk_ids, s->f.topk_weights, s->o, s->hdr);
    }
    for (int r = 0; r < dl_layout_count(); r++)
        if (DL_ROWSET_HAS(p->writes, r) && slab(dl_layout_row(r)))
            return r == s->sink_row ? dl__golden_sink_put(s->sink, w, 1, s->dw) : DL_EINTERNAL;
    return 0;
}

static const dl_placement_t stream_placement = {bind, done};

/* Frees every value written to the file that no producer still to run
 * reads, so the peak stays at a few [M, f]. */
static void release(stream_t *s)
{
    const int passes = DL_SCHEDULE_FORWARD | (s->o->no_backward ? 0 : DL_SCHEDULE_BACKWARD);
    dl_rowset_t pending = 0;
    for (int i = s->next; i < dl_schedule_count(); i++) {
        const dl_producer_t *p = dl_schedule_producer(i);
        if (((passes >> p->backward) & 1) && dl_cond_applies(p->cond, &s->c->config) && in_file(s, p))
            pending |= dl_schedule_reads(p, &s->c->config);
    }
    for (int r = 0; r < dl_layout_count(); r++) {
        void **slot = dl_layout_slot(dl_layout_row(r), NULL, &s->f, &s->b);
        if (slot && *slot && DL_ROWSET_HAS(s->written, r) && !DL_ROWSET_HAS(pending, r)) {
            free(*slot);
            *slot = NULL;
        }
    }
}

/* One expert weight written expert by expert. */
static int put_weights(stream_t *s, int which, dl__golden_sink_t *sink, const char *phase)
{
    for (int64_t e = s->A; e < s->B; e++) {
        dl__case_expert_weight(s->c, which, e, s->wbuf[0]);
        int rc = dl__golden_sink_put(sink, e - s->A, 1, s->wbuf[0]);
        if (rc)
            return rc;
        progress(s, phase, 0.2 / (double)(s->B - s->A));
    }
    return 0;
}

/* Dataset ds: its producer (and any before it) run by the schedule, then
 * its array written (an expert array was, expert by expert). */
static int produce(void *vctx, const dl_golden_dataset_t *ds, dl__golden_sink_t *sink)
{
    stream_t *s = vctx;
    int row = -1;
    for (int r = 0; r < dl_layout_count(); r++)
        if (dl_golden_dataset(r) == ds)
            row = r;
    const dl_layout_row_t *lr = dl_layout_row(row);
    if (!lr)
        FAILMSG(DL_EINTERNAL, "case %s: %s: not a row of the table", s->c->name, ds->path);
    if (lr->group == DL_LAYOUT_INPUTS && slab(lr)) {
        int which = row == DL__ROW_IN_W_GATE ? DL__W_GATE : row == DL__ROW_IN_W_UP ? DL__W_UP : DL__W_DOWN;
        return put_weights(s, which, sink, ds->name);
    }
    int rc = 0;
    if (lr->group != DL_LAYOUT_INPUTS) {
        s->sink = sink;
        s->sink_row = row;
        const int passes = DL_SCHEDULE_FORWARD | (s->o->no_backward ? 0 : DL_SCHEDULE_BACKWARD);
        rc = dl_schedule_exec(&s->c->config, passes, &s->next, dl_schedule_writer(row),
                              &stream_placement, s);
    }
    if (rc) {
        if (rc == DL_ENOMEM)
            FAILMSG(rc, "case %s: %s: out of memory", s->c->name, ds->path);
        FAILMSG(rc, "case %s: computing %s: %s", s->c->name, ds->path, dl_strerror(rc));
    }
    s->written |= DL_ROWSET_BIT(row);
    if (!slab(lr)) {
        dl_golden_file_t view;
        memset(&view, 0, sizeof view);
        view.in = s->in;
        view.fwd = s->f;
        view.bwd = s->b;
        const void *p = *dl_golden_slot(&view, ds);
        int64_t dims[3];
        if (!p || shape_of(s, ds, dims) < 0)
            FAILMSG(DL_EINTERNAL, "case %s: %s: nothing computed", s->c->name, ds->path);
        if (lr->group == DL_LAYOUT_INPUTS && expert_rows(lr)) /* the slice's experts */
            p = (const float *)p + s->A * dl_layout_numel_rows(lr, &s->c->config, 1);
        rc = dl__golden_sink_put(sink, 0, dims[0], p);
        progress(s, ds->name, 0.02);
    }
    release(s);
    return rc;
}

/* The progress bar's whole: a share per expert producer, less for the rest. */
static double work_total(const stream_t *s)
{
    const int passes = DL_SCHEDULE_FORWARD | (s->o->no_backward ? 0 : DL_SCHEDULE_BACKWARD);
    double w = 0.0;
    for (int i = 0; i < dl_schedule_count(); i++) {
        const dl_producer_t *p = dl_schedule_producer(i);
        if (((passes >> p->backward) & 1) && dl_cond_applies(p->cond, &s->c->config))
            w += p->span == DL_SPAN_EXPERTS ? 1.0 : 0.04;
    }
    return w + (s->swiglu ? 0.6 : 0.2);
}

static void stream_free(stream_t *s)
{
    dl_golden_inputs_free(&s->in);
    dl_moe_forward_free(&s->f);
    dl_moe_backward_free(&s->b);
    free(s->wbuf[0]);
    free(s->wbuf[1]);
    free(s->dw);
}

int64_t dl_case_memory_bytes(const dl_case_t *c, const dl_golden_gen_opts_t *opts)
{
    if (!c)
        return DL_EINVAL;
    const int64_t scratch = INT64_C(192) << 20; /* GEMM scratch (<= 128 MiB) and the rest */
    int stream = opts && (opts->stream || opts->expert_end > 0);
    int64_t data = dl_case_data_bytes(c);
    if (data < 0)
        return DL_EOVERFLOW;
    if (!stream)
        return data > INT64_MAX - scratch ? DL_EOVERFLOW : data + scratch;
    /* streamed: the file less its expert weights and weight gradients, plus
     * one expert's weights (two buffers) and one weight gradient */
    const dl_moe_config_t *k = &c->config;
    double E = (double)k->route.experts, df = (double)k->hidden * (double)k->ffn;
    double nw = DL_FFN_GATED(k->ffn_kind) ? 3.0 : DL_FFN_HIDDEN(k->ffn_kind) ? 2.0 : 1.0;
    double est = (double)data - 2.0 * nw * E * df * 4.0 + 3.0 * df * 4.0 + (double)scratch;
    return est > 9e18 ? DL_EOVERFLOW : (int64_t)est;
}

int dl_golden_gen_stream(const dl_case_t *c, const char *path, const dl_golden_gen_opts_t *opts,
                         char *err, size_t errlen)
{
    if (!c || !path || !opts)
        return DL_EINVAL;
    const dl_moe_config_t *k = &c->config;
    /* the configuration, the expert range and the EP ranks (output.c), and
     * the output: refused before the work, not after it */
    int rc = dl_golden_gen_check(c, opts, err, errlen);
    if (!rc && k->route.zero_experts > 0) { /* the identity tail is no expert's window */
        snprintf(err, errlen, "case %s: zero_experts (identity experts) cannot be generated "
                 "expert by expert (--stream, --experts); generate it in memory", c->name);
        rc = DL_EINVAL;
    }
    if (!rc)
        rc = dl__out_check(path, opts->force, err, errlen);
    if (rc)
        return rc;
    int64_t E = k->route.experts, A = 0, B = E;
    if (opts->expert_end > 0) {
        A = opts->expert_begin;
        B = opts->expert_end;
    }
    stream_t s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.o = opts;
    s.A = A;
    s.B = B;
    s.full = A == 0 && B == E;
    s.swiglu = DL_FFN_HIDDEN(k->ffn_kind);
    s.err = err;
    s.errlen = errlen;
    s.work_total = work_total(&s);
    int64_t df = k->hidden * k->ffn;
    s.wbuf[0] = malloc((size_t)df * sizeof(float));
    s.wbuf[1] = malloc((size_t)df * sizeof(float));
    s.dw = malloc((size_t)df * sizeof(float));
    if (!s.wbuf[0] || !s.wbuf[1] || !s.dw) {
        stream_free(&s);
        dl__golden_msg(err, errlen, "case %s: out of memory", c->name);
        return DL_ENOMEM;
    }
    if ((rc = dl__case_inputs_small(c, &s.in))) {
        stream_free(&s);
        dl__golden_msg(err, errlen, "case %s: drawing the inputs: %s", c->name, dl_strerror(rc));
        return rc;
    }
    dl_golden_file_t hdr;
    memset(&hdr, 0, sizeof hdr);
    snprintf(hdr.case_name, sizeof hdr.case_name, "%s", c->name);
    hdr.seed = c->seed;
    hdr.config = *k;
    hdr.has_inputs = hdr.has_forward = 1;
    hdr.has_backward = !opts->no_backward;
    dl__golden_source_t src = {&s, shape_of, produce, A, s.full ? 0 : B};
    s.hdr = &hdr;
    rc = dl__golden_write_source(path, &hdr, &src, opts->force, NULL, NULL, err, errlen);
    stream_free(&s);
    dl_golden_free(&hdr);
    return rc;
}
