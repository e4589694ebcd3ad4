/* The generator: a catalogue or file case -> its inputs, the oracle's forward
 * and backward pass -> a golden file. The arithmetic is the stages'; this
 * file only sequences them and names what failed. */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "golden/golden_priv.h"

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
    char why[200];
    int rc = dl__golden_config_check(&c->config, why, sizeof why);
    if (!rc && dl_moe_config_validate(&c->config)) {
        rc = DL_EINVAL;
        snprintf(why, sizeof why, "rejected by dl_moe_config_validate");
    }
    if (rc) {
        dl__golden_msg(err, errlen, "case %s: invalid configuration: %s", c->name, why);
        return rc;
    }
    snprintf(g->format, sizeof g->format, "%s", DL_GOLDEN_FORMAT);
    g->format_version = DL_GOLDEN_FORMAT_VERSION;
    snprintf(g->generator, sizeof g->generator, "dropless %s", DL_VERSION_STRING);
    snprintf(g->case_name, sizeof g->case_name, "%s", c->name);
    g->seed = c->seed;
    g->config = c->config;
    if (o.progress)
        o.progress(o.progress_ctx, "inputs", 0.0);
    if ((rc = dl_case_inputs(c, &g->in))) {
        dl__golden_msg(err, errlen, "case %s: drawing the inputs: %s", c->name, dl_strerror(rc));
        return rc;
    }
    g->has_inputs = 1;
    dl_moe_inputs_t view = dl_golden_inputs_view(&g->in);
    if (o.progress)
        o.progress(o.progress_ctx, "forward", 0.0);
    if ((rc = dl_moe_forward(&g->config, &view, &g->fwd))) {
        dl__golden_msg(err, errlen, "case %s: forward pass: %s", c->name, dl_strerror(rc));
        return rc;
    }
    g->has_forward = 1;
    if (!o.no_backward) {
        if (o.progress)
            o.progress(o.progress_ctx, "backward", 0.0);
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
    /* refused before the work, not after it */
    int rc = dl__out_check(path, opts && opts->force, err, errlen);
    if (rc)
        return rc;
    dl_golden_file_t g;
    rc = dl_golden_generate(c, opts, &g, backward_err, err, errlen);
    if (rc == 0)
        rc = dl_golden_write(path, &g, opts ? opts->force : 0, opts ? opts->progress : NULL,
                             opts ? opts->progress_ctx : NULL, err, errlen);
    dl_golden_free(&g);
    return rc;
}

