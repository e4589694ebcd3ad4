/* The generator: a catalogue or file case -> its inputs, the oracle's forward
 * and backward pass -> a golden file. The arithmetic is the stages'; this
 * file only sequences them and names what failed. */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "golden/golden_priv.h"

/* Shares of the whole run reported to the progress callback: drawing the
 * inputs ~10%, the forward pass (a third of the GEMM work) ~25%, the
 * backward ~55%, writing ~10%; without the backward pass the forward
 * takes its share. */
static double no_bw_share(const dl_golden_gen_opts_t *o, double x)
{
    return o->no_backward ? x * 2.0 : x;
}

typedef struct {
    dl_golden_progress_fn fn;
    void *ctx;
} write_progress_t;

static void write_progress(void *vctx, const char *phase, double done)
{
    const write_progress_t *w = vctx;
    w->fn(w->ctx, phase, 0.9 + 0.1 * done);
}

void dl_golden_header(const dl_case_t *c, dl_golden_file_t *g)
{
    snprintf(g->format, sizeof g->format, "%s", DL_GOLDEN_FORMAT);
    g->format_version = DL_GOLDEN_FORMAT_VERSION;
    snprintf(g->generator, sizeof g->generator, "dropless %s", DL_VERSION_STRING);
    snprintf(g->case_name, sizeof g->case_name, "%s", c->name);
    g->seed = c->seed;
    g->config = c->config;
}

int dl_golden_generate(const dl_case_t *c, const dl_golden_gen_opts_t *opts,
                       dl_golden_file_t *g, int *backward_err, char *err, size_t errlen)
{
    if (backward_err)
        *backward_err = 0;
    if (!c || !g)
        return DL_EINVAL;
    memset(g, 0, sizeof *g);
    g->owner_ = DL__GOLDEN_OWNER_MOE;
    dl_golden_gen_opts_t o = {0};
    if (opts)
        o = *opts;
    int rc = dl_golden_gen_check(c, &o, err, errlen); /* the command's own check (output.c) */
    if (rc)
        return rc;
    dl_golden_header(c, g);
    if (o.progress)
        o.progress(o.progress_ctx, "inputs", 0.0);
    if ((rc = dl_case_inputs(c, &g->in))) {
        dl__golden_msg(err, errlen, "case %s: drawing the inputs: %s", c->name, dl_strerror(rc));
        return rc;
    }
    g->has_inputs = 1;
    dl_moe_inputs_t view = dl_golden_inputs_view(&g->in);
    if (o.progress)
        o.progress(o.progress_ctx, "forward", no_bw_share(&o, 0.1));
    if ((rc = dl_moe_forward(&g->config, &view, &g->fwd))) {
        dl__golden_msg(err, errlen, "case %s: forward pass: %s", c->name, dl_strerror(rc));
        return rc;
    }
    g->has_forward = 1;
    if ((rc = dl__golden_ep_layouts(&g->config, g->fwd.topk_ids, g->fwd.topk_weights, &o, g))) {
        dl__golden_msg(err, errlen, "case %s: expert-parallel layout: %s", c->name, dl_strerror(rc));
        return rc;
    }
    if ((rc = dl__golden_layouts_build(g, &o, err, errlen))) /* after /ep: its rank variants */
        return rc;
    if (!o.no_backward) {
        if (o.progress)
            o.progress(o.progress_ctx, "backward", 0.35);
        int brc = dl_moe_backward(&g->config, &view, &g->fwd, &g->bwd);
        if (brc == 0) {
            g->has_backward = 1;
        } else {
            dl_moe_backward_free(&g->bwd);
            memset(&g->bwd, 0, sizeof g->bwd);
            if (backward_err)
                *backward_err = brc;
        }
    }
    return 0;
}

int dl_golden_gen_file(const dl_case_t *c, const char *path, const dl_golden_gen_opts_t *opts,
                       int *backward_err, char *err, size_t errlen)
{
    if (backward_err)
        *backward_err = 0;
    if (!c || !path)
        return DL_EINVAL;
    if (opts && (opts->stream || opts->expert_end > 0))
        return dl_golden_gen_stream(c, path, opts, err, errlen);
    int rc = dl__golden_ep_check_ranks(&c->config, opts, c->name, err, errlen);
    if (rc)
        return rc;
    /* refused before the work, not after it */
    rc = dl__out_check(path, opts && opts->force, err, errlen);
    if (rc)
        return rc;
    dl_golden_file_t g;
    rc = dl_golden_generate(c, opts, &g, backward_err, err, errlen);
    write_progress_t wp = {opts ? opts->progress : NULL, opts ? opts->progress_ctx : NULL};
    if (rc == 0)
        rc = dl_golden_write(path, &g, opts ? opts->force : 0, wp.fn ? write_progress : NULL, &wp,
                             err, errlen);
    dl_golden_free(&g);
    return rc;
}

