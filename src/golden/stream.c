/* The streaming generator: a golden file written dataset by dataset in the
 * format's order, the expert weights drawn one expert at a time (the input
 * PRNG is addressed by element, so expert e's slab is the same values
 * dl_case_inputs draws) and never held whole, the weight gradients written
 * one expert at a time. What stays in memory is the token-sized inputs,
 * the routing, the sorted-row activations of the experts written, and one
 * expert's weights: for mixtral-layer about 4 GB instead of the file's
 * 13 GiB. The stages are the layer's own (the same calls as
 * dl_moe_forward/backward, per expert), and every value is the exact
 * result rounded once, so the bytes are those of the in-memory generator.
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
    dl_moe_forward_t f;    /* router stages and x_sorted whole; the rest rows [r0, r1) */
    dl_moe_backward_t b;
    dl_golden_file_t *hdr; /* the file's header: the layouts go there */
    float *wbuf[2];        /* one expert's weights */
    float *dw;             /* one expert's weight gradient */
    dl_tier_stats_t stats;
    double work_done, work_total;
    char *err;
    size_t errlen;
} stream_t;

/* Datasets that need every expert's rows, so are not in a slice: the
 * values downstream of the experts' outputs (past y_sorted, through the
 * combine) that are not themselves per-expert rows (M) or per-expert
 * weights (E): out, d_topk_weights, the router gradients, d_x. */
static int needs_all_experts(const dl_golden_dataset_t *ds)
{
    dl_value_t v;
    if (dl_value_parse(ds->name, &v) || v <= DL_VALUE_Y_SORTED)
        return 0;
    return !strchr("ME", dl_value_dims(v)[0]);
}

int64_t dl__golden_slice_shape(const dl_golden_dataset_t *ds, const dl_moe_config_t *c, int full,
                               int64_t n_experts, int64_t n_rows, int64_t dims[3])
{
    if (!full && needs_all_experts(ds))
        return -1;
    int64_t n = dl_golden_dataset_shape(ds, c, dims);
    if (n < 0 || full)
        return n;
    if (ds->rank == 3 && ds->dims[0] == 'E')
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

/* The router stages, the sort and x_sorted: dl_moe_route, as dl_moe_forward runs it. */
static int route(stream_t *s)
{
    const dl_moe_config_t *c = &s->c->config;
    dl_moe_forward_t *f = &s->f;
    /* the values up to x_sorted by the table, and the margins (no value) */
    uint64_t upto = 0;
    for (int v = 0; v <= DL_VALUE_X_SORTED; v++)
        upto |= UINT64_C(1) << v;
    f->tie_margin = alloc0(c->tokens, sizeof(float));
    if (dl__values_alloc(c, f, NULL, upto) || !f->tie_margin)
        return DL_ENOMEM;
    dl_moe_inputs_t view = dl_golden_inputs_view(&s->in);
    int rc = dl_moe_route(c, &view, f);
    s->stats = f->stats;
    if (rc)
        return rc;
    s->r0 = f->group_offsets[s->A];
    s->r1 = f->group_offsets[s->B];
    /* written after every other group, by then from the header */
    return dl__golden_ep_layouts(c, f->topk_ids, f->topk_weights, s->o, s->hdr);
}

/* Rows of expert e relative to the slice's first row, and their count. */
static int64_t rows_of(const stream_t *s, int64_t e, int64_t *n)
{
    *n = s->f.group_offsets[e + 1] - s->f.group_offsets[e];
    return s->f.group_offsets[e] - s->r0;
}

/* out[rows of e, N] = sum over terms of lhs[rows of e, K] x w (one expert's
 * weights), for every expert of the slice; weights drawn per expert. */
typedef struct {
    const float *lhs;  /* slice-relative rows, K columns */
    int64_t K;
    int which;         /* DL__W_GATE, DL__W_UP, DL__W_DOWN */
    dl_rhs_layout_t layout;
} term_spec_t;

static int per_expert_gemm(stream_t *s, const term_spec_t *ts, int nterms, int64_t N,
                           float *out, const char *phase, double work)
{
    for (int64_t e = s->A; e < s->B; e++) {
        int64_t n, r = rows_of(s, e, &n);
        progress(s, phase, work / (double)(s->B - s->A));
        if (n == 0)
            continue;
        dl_gemm_term_t terms[2];
        for (int i = 0; i < nterms; i++) {
            dl__case_expert_weight(s->c, ts[i].which, e, s->wbuf[i]);
            terms[i] = (dl_gemm_term_t){ts[i].lhs + r * ts[i].K, ts[i].K, s->wbuf[i], ts[i].layout};
        }
        const int64_t off[2] = {0, n};
        int rc = dl_gemm_grouped(terms, nterms, N, off, 1, s->c->config.dtype, out + r * N,
                                 &s->stats);
        if (rc)
            return rc;
    }
    return 0;
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

/* dW[e] = a_e^T b_e (fp32) per expert, written as computed: ragged-K GEMMs. */
static int put_dw(stream_t *s, const float *a, int64_t I, const float *b, int64_t J,
                  dl__golden_sink_t *sink, const char *phase)
{
    for (int64_t e = s->A; e < s->B; e++) {
        int64_t n, r = rows_of(s, e, &n);
        const int64_t off[2] = {0, n};
        int rc = dl_gemm_ragged_k(a + r * I, I, b + r * J, J, off, 1, DL_F32, s->dw, &s->stats);
        if (rc || (rc = dl__golden_sink_put(sink, e - s->A, 1, s->dw)))
            return rc;
        progress(s, phase, 1.0 / (double)(s->B - s->A));
    }
    return 0;
}

static int forward_rows(stream_t *s, const char *name)
{
    const dl_moe_config_t *c = &s->c->config;
    const int64_t d = c->hidden, ff = c->ffn, Ms = s->r1 - s->r0;
    dl_moe_forward_t *f = &s->f;
    const float *xs = f->x_sorted + s->r0 * d;
    int rc;
    if (!strcmp(name, "h_gate")) {
        f->h_gate = alloc0(Ms * ff, sizeof(float));
        f->h_up = alloc0(Ms * ff, sizeof(float));
        f->h_act = alloc0(Ms * ff, sizeof(float));
        if (!f->h_gate || !f->h_up || !f->h_act)
            return DL_ENOMEM;
        term_spec_t g = {xs, d, DL__W_GATE, DL_RHS_KN}, u = {xs, d, DL__W_UP, DL_RHS_KN};
        if ((rc = per_expert_gemm(s, &g, 1, ff, f->h_gate, "h_gate", 1.0)) ||
            (rc = per_expert_gemm(s, &u, 1, ff, f->h_up, "h_up", 1.0)))
            return rc;
        return dl_swiglu(f->h_gate, f->h_up, Ms * ff, c->dtype, f->h_act);
    }
    if (!strcmp(name, "y_sorted")) {
        f->y_sorted = alloc0(Ms * d, sizeof(float));
        if (!f->y_sorted)
            return DL_ENOMEM;
        term_spec_t t = s->swiglu ? (term_spec_t){f->h_act, ff, DL__W_DOWN, DL_RHS_KN}
                                  : (term_spec_t){xs, d, DL__W_DOWN, DL_RHS_KN};
        if ((rc = per_expert_gemm(s, &t, 1, d, f->y_sorted, "y_sorted", 1.0)))
            return rc;
        if (!s->full)
            return 0;
        f->out = alloc0(c->tokens * d, sizeof(float));
        if (!f->out)
            return DL_ENOMEM;
        return dl_combine(f->y_sorted, f->topk_weights, f->inv_perm, c->tokens,
                          c->route.top_k, d, c->dtype, f->out);
    }
    return 0;
}

static int backward_rows(stream_t *s, const char *name)
{
    const dl_moe_config_t *c = &s->c->config;
    const int64_t T = c->tokens, d = c->hidden, ff = c->ffn,
                  k = c->route.top_k, Ms = s->r1 - s->r0;
    dl_moe_forward_t *f = &s->f;
    dl_moe_backward_t *b = &s->b;
    int rc;
    /* d_topk_weights comes first in a whole file, d_y_sorted in a slice */
    if (!strcmp(name, s->full ? "d_topk_weights" : "d_y_sorted")) {
        b->d_y_sorted = alloc0(Ms * d, sizeof(float));
        b->d_topk_weights = s->full ? alloc0(T * k, sizeof(float)) : NULL;
        if (!b->d_y_sorted || (s->full && !b->d_topk_weights))
            return DL_ENOMEM;
        return dl__combine_backward(f->y_sorted, f->topk_weights, f->inv_perm, s->in.d_out, T,
                                    k, d, c->dtype, s->r0, s->r1, b->d_topk_weights,
                                    b->d_y_sorted);
    }
    if (!strcmp(name, s->swiglu ? "d_h_act" : "d_x_sorted")) {
        int64_t N = s->swiglu ? ff : d;
        float **dst = s->swiglu ? &b->d_h_act : &b->d_x_sorted;
        if (!(*dst = alloc0(Ms * N, sizeof(float))))
            return DL_ENOMEM;
        term_spec_t t = {b->d_y_sorted, d, DL__W_DOWN, DL_RHS_NK};
        if ((rc = per_expert_gemm(s, &t, 1, N, *dst, name, 1.0)) || !s->swiglu)
            return rc;
        return 0;
    }
    if (s->swiglu && !strcmp(name, "d_h_gate")) {
        b->d_h_gate = alloc0(Ms * ff, sizeof(float));
        b->d_h_up = alloc0(Ms * ff, sizeof(float));
        if (!b->d_h_gate || !b->d_h_up)
            return DL_ENOMEM;
        return dl_swiglu_backward(f->h_gate, f->h_up, b->d_h_act, Ms * ff, c->dtype, b->d_h_gate,
                                  b->d_h_up);
    }
    if (s->swiglu && !strcmp(name, "d_x_sorted")) {
        if (!(b->d_x_sorted = alloc0(Ms * d, sizeof(float))))
            return DL_ENOMEM;
        term_spec_t t[2] = {{b->d_h_gate, ff, DL__W_GATE, DL_RHS_NK},
                            {b->d_h_up, ff, DL__W_UP, DL_RHS_NK}};
        return per_expert_gemm(s, t, 2, d, b->d_x_sorted, name, 2.0);
    }
    if (!strcmp(name, "d_router_scores")) {
        const uint64_t tail = UINT64_C(1) << DL_VALUE_D_ROUTER_SCORES |
                              UINT64_C(1) << DL_VALUE_D_ROUTER_LOGITS |
                              UINT64_C(1) << DL_VALUE_D_ROUTER_WEIGHT | UINT64_C(1) << DL_VALUE_D_X;
        if (dl__values_alloc(c, NULL, b, tail))
            return DL_ENOMEM;
        dl_moe_inputs_t view = dl_golden_inputs_view(&s->in);
        return dl_moe_route_backward(c, &view, f, b);
    }
    return 0;
}

/* Frees what no later dataset needs, so the peak stays at a few [M, f]. */
static void release_after(stream_t *s, const char *name)
{
    if (!strcmp(name, "d_w_down")) {
        free(s->f.h_act);
        s->f.h_act = NULL;
    } else if (!strcmp(name, "d_h_up")) {
        free(s->b.d_h_act);
        free(s->f.h_gate);
        free(s->f.h_up);
        s->b.d_h_act = s->f.h_gate = s->f.h_up = NULL;
    } else if (!strcmp(name, "d_w_gate")) {
        free(s->b.d_h_gate);
        s->b.d_h_gate = NULL;
    }
}

/* The array that holds dataset ds (rows [r0, r1) for sorted-row ones). */
static const void *array_of(stream_t *s, const dl_golden_dataset_t *ds)
{
    dl_golden_file_t view;
    memset(&view, 0, sizeof view);
    view.in = s->in;
    view.fwd = s->f;
    view.bwd = s->b;
    const void *p = *dl_golden_slot(&view, ds);
    if (p && !strcmp(ds->name, "x_sorted"))
        p = s->f.x_sorted + s->r0 * s->c->config.hidden;
    return p;
}

static int produce(void *vctx, const dl_golden_dataset_t *ds, dl__golden_sink_t *sink)
{
    stream_t *s = vctx;
    const dl_moe_config_t *c = &s->c->config;
    const int64_t d = c->hidden, ff = c->ffn;
    const char *nm = ds->name;
    int rc = 0;
    if (!strcmp(nm, "w_gate") || !strcmp(nm, "w_up") || !strcmp(nm, "w_down"))
        return put_weights(s, nm[2] == 'g' ? DL__W_GATE : nm[2] == 'u' ? DL__W_UP : DL__W_DOWN,
                           sink, nm);
    if (!strcmp(nm, "router_logits"))
        rc = route(s);
    else if (ds->group == DL_GOLDEN_FORWARD)
        rc = forward_rows(s, nm);
    else if (!strcmp(nm, "d_w_down"))
        rc = s->swiglu ? put_dw(s, s->f.h_act, ff, s->b.d_y_sorted, d, sink, nm)
                       : put_dw(s, s->f.x_sorted + s->r0 * d, d, s->b.d_y_sorted, d, sink, nm);
    else if (!strcmp(nm, "d_w_gate") || !strcmp(nm, "d_w_up"))
        rc = put_dw(s, s->f.x_sorted + s->r0 * d, d, nm[4] == 'g' ? s->b.d_h_gate : s->b.d_h_up,
                    ff, sink, nm);
    else if (ds->group == DL_GOLDEN_BACKWARD)
        rc = backward_rows(s, nm);
    if (rc) {
        if (rc == DL_ENOMEM)
            FAILMSG(rc, "case %s: %s: out of memory", s->c->name, ds->path);
        FAILMSG(rc, "case %s: computing %s: %s", s->c->name, ds->path, dl_strerror(rc));
    }
    if (ds->rank == 3 && ds->dims[0] == 'E') { /* written expert by expert above */
        release_after(s, nm);
        return 0;
    }
    const void *p = array_of(s, ds);
    int64_t dims[3];
    if (!p || shape_of(s, ds, dims) < 0)
        FAILMSG(DL_EINTERNAL, "case %s: %s: nothing computed", s->c->name, ds->path);
    rc = dl__golden_sink_put(sink, 0, dims[0], p);
    progress(s, nm, 0.02);
    release_after(s, nm);
    return rc;
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
    double nw = k->ffn_kind == DL_FFN_SWIGLU ? 3.0 : 1.0;
    double est = (double)data - 2.0 * nw * E * df * 4.0 + 3.0 * df * 4.0 + (double)scratch;
    return est > 9e18 ? DL_EOVERFLOW : (int64_t)est;
}

int dl_golden_gen_stream(const dl_case_t *c, const char *path, const dl_golden_gen_opts_t *opts,
                         char *err, size_t errlen)
{
    if (!c || !path || !opts)
        return DL_EINVAL;
    const dl_moe_config_t *k = &c->config;
    char why[200];
    int rc = dl__golden_config_check(k, why, sizeof why);
    if (!rc && dl_moe_config_validate(k)) {
        rc = DL_EINVAL;
        snprintf(why, sizeof why, "rejected by dl_moe_config_validate");
    }
    if (rc) {
        dl__golden_msg(err, errlen, "case %s: invalid configuration: %s", c->name, why);
        return rc;
    }
    int64_t E = k->route.experts, A = 0, B = E;
    if (opts->expert_end > 0) {
        A = opts->expert_begin;
        B = opts->expert_end;
        if (A < 0 || A >= B || B > E) {
            dl__golden_msg(err, errlen, "case %s: expert range %lld:%lld is not within [0, %lld]",
                           c->name, (long long)A, (long long)B, (long long)E);
            return DL_EINVAL;
        }
    }
    /* refused before the work, not after it */
    int orc = dl__out_check(path, opts->force, err, errlen);
    if (!orc)
        orc = dl__golden_ep_check_ranks(k, opts, c->name, err, errlen);
    if (orc)
        return orc;
    stream_t s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.o = opts;
    s.A = A;
    s.B = B;
    s.full = A == 0 && B == E;
    s.swiglu = k->ffn_kind == DL_FFN_SWIGLU;
    s.err = err;
    s.errlen = errlen;
    s.work_total = 0.6 + (s.swiglu ? 3.0 : 1.0) + (opts->no_backward ? 0 : (s.swiglu ? 6.0 : 3.0)) + 0.5;
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
