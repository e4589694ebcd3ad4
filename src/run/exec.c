/* The plugin executor: runs a backend's stages on golden inputs, each call
 * in a sandboxed child (sandbox.c) with poisoned shared output buffers and
 * a time limit, twice, and turns whatever happened into diagnostics.
 * Nothing the plugin does may crash or hang the caller, so the plugin is
 * only ever loaded in children. */
#include "config.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "run/run_priv.h"

static void diag_set(dl_run_diag_t *g, dl_run_status_t st, const char *fmt, ...)
{
    g->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->message, sizeof g->message, fmt, ap);
    va_end(ap);
}

/* Appends to a diagnostic's message, keeping it one bounded line. */
static void diag_append(dl_run_diag_t *g, const char *fmt, ...)
{
    size_t n = strlen(g->message);
    if (n + 1 >= sizeof g->message)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->message + n, sizeof g->message - n, fmt, ap);
    va_end(ap);
}

static void poison(unsigned char *p, const tens_t *t)
{
    int64_t n = dl__run_count(t);
    if (t->kind == K_F32) {
        uint32_t v = DL_BACKEND_POISON_F32_BITS;
        for (int64_t i = 0; i < n; i++)
            memcpy(p + 4 * i, &v, 4);
    } else if (t->kind == K_I32) {
        int32_t v = INT32_MIN;
        for (int64_t i = 0; i < n; i++)
            memcpy(p + 4 * i, &v, 4);
    } else {
        int64_t v = INT64_MIN;
        for (int64_t i = 0; i < n; i++)
            memcpy(p + 8 * i, &v, 8);
    }
}

static int64_t count_poison(const unsigned char *p, const tens_t *t)
{
    int64_t n = dl__run_count(t), left = 0;
    if (t->kind == K_F32) {
        for (int64_t i = 0; i < n; i++) {
            uint32_t v;
            memcpy(&v, p + 4 * i, 4);
            left += v == DL_BACKEND_POISON_F32_BITS;
        }
    } else if (t->kind == K_I32) {
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, p + 4 * i, 4);
            left += v == INT32_MIN;
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            left += v == INT64_MIN;
        }
    }
    return left;
}

static int64_t count_differing(const unsigned char *a, const unsigned char *b, const tens_t *t)
{
    int64_t n = dl__run_count(t), diff = 0;
    size_t w = dl__run_kind_size(t->kind);
    for (int64_t i = 0; i < n; i++)
        diff += memcmp(a + (size_t)i * w, b + (size_t)i * w, w) != 0;
    return diff;
}

/* Frees and clears the candidate slot of an output. */
static void dst_slot_free(tens_t *t)
{
    free(*t->dst);
    *t->dst = NULL;
}

static int dst_alloc(tens_t *t, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        return DL_ENOMEM;
    *t->dst = p;
    return 0;
}

static dl_run_status_t child_status(child_out_t o)
{
    switch (o) {
    case CH_TIMEOUT: return DL_RUN_TIMEOUT;
    case CH_ABI: return DL_RUN_ABI_MISMATCH;
    case CH_LOAD_FAILED: return DL_RUN_LOAD_FAILED;
    default: return DL_RUN_CRASHED;
    }
}

/* Runs one implemented stage twice and fills its diagnostic and outputs. */
static int exec_stage(const job_t *job, ctrl_t *ctl, dl_run_stage_t s, stage_io_t *io,
                      double limit, dl_run_diag_t *g)
{
    size_t off[MAX_OUT], total = 0;
    for (int o = 0; o < io->nout; o++) {
        off[o] = total;
        if (io->out[o].present)
            total += dl__run_round_up((size_t)dl__run_count(&io->out[o]) * dl__run_kind_size(io->out[o].kind), ALIGN);
    }
    size_t len = total ? total : ALIGN;
    unsigned char *shared = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED)
        return DL_ENOMEM;
    int rc = 0;
    char why[256];
    for (int run = 0; run < 2; run++) {
        for (int o = 0; o < io->nout; o++)
            if (io->out[o].present)
                poison(shared + off[o], &io->out[o]);
        child_out_t res;
        if ((rc = dl__run_child(job, ctl, (int)s, io, shared, off, limit, &res, why, sizeof why)))
            goto done;
        if (res == CH_NOMEM) {
            rc = DL_ENOMEM;
            goto done;
        }
        const char *which = run ? " (second run)" : "";
        if (res != CH_OK || ctl->rc != 0) {
            if (res != CH_OK)
                diag_set(g, child_status(res), "%s%s", why, which);
            else
                diag_set(g, DL_RUN_ERROR_RETURN, "the stage returned %d%s", ctl->rc, which);
            for (int o = 0; o < io->nout; o++)
                if (io->out[o].present)
                    dst_slot_free(&io->out[o]);
            goto done;
        }
        if (run == 0) {
            g->seconds = ctl->seconds;
            for (int o = 0; o < io->nout; o++) {
                tens_t *t = &io->out[o];
                if (!t->present)
                    continue;
                size_t bytes = (size_t)dl__run_count(t) * dl__run_kind_size(t->kind);
                if ((rc = dst_alloc(t, bytes)))
                    goto done;
                memcpy(*t->dst, shared + off[o], bytes);
                int64_t left = count_poison(shared + off[o], t);
                if (left) {
                    g->unwritten += left;
                    if (g->status != DL_RUN_UNWRITTEN)
                        diag_set(g, DL_RUN_UNWRITTEN, "unwritten:");
                    diag_append(g, " %s %lld of %lld;", t->name, (long long)left,
                                (long long)dl__run_count(t));
                }
            }
        } else {
            int first = 1;
            for (int o = 0; o < io->nout; o++) {
                tens_t *t = &io->out[o];
                if (!t->present)
                    continue;
                int64_t diff = count_differing(*t->dst, shared + off[o], t);
                if (!diff)
                    continue;
                g->differing += diff;
                if (g->status == DL_RUN_OK)
                    g->status = DL_RUN_NONDETERMINISTIC;
                diag_append(g, "%s%s %lld of %lld;", first ? " repeat run differs:" : "",
                            t->name, (long long)diff, (long long)dl__run_count(t));
                first = 0;
            }
        }
    }
done:
    munmap(shared, len);
    return rc;
}

void dl_run_result_free(dl_run_result_t *r)
{
    if (!r)
        return;
    dl__moe_arrays_free(&r->fwd, &r->bwd);
    memset(&r->fwd, 0, sizeof r->fwd);
    memset(&r->bwd, 0, sizeof r->bwd);
}

int dl_run_backend(const char *path, const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                   const dl_moe_forward_t *gf, const dl_moe_backward_t *gb,
                   const dl_run_options_t *opt, dl_run_result_t *r)
{
    if (!r)
        return DL_EINVAL;
    memset(r, 0, sizeof *r);
    r->backend.abi_version = -1;
    for (int s = 0; s < DL_STAGE_COUNT; s++) {
        r->stage[s].stage = (dl_run_stage_t)s;
        r->stage[s].status = DL_RUN_SKIPPED;
    }
    if (!path || !c || !in || !gf)
        return DL_EINVAL;
    int rc = dl_moe_config_validate(c);
    if (rc)
        return rc;
    if (!dl_run_expressible(c, NULL, 0)) /* the ABI has no FFN variants */
        return DL_EINVAL;
    double limit = opt && opt->time_limit_s > 0 ? opt->time_limit_s : DL_RUN_DEFAULT_TIME_LIMIT_S;
    int forward_only = opt && opt->forward_only;

    job_t job;
    memset(&job, 0, sizeof job);
    job.path = path;
    job.parent = getpid();
    job.cfg = (dl_backend_config_t){c->tokens, c->hidden, c->ffn, c->route.experts,
                                    c->route.top_k, (dl_backend_dtype_t)c->dtype,
                                    (dl_backend_ffn_t)c->ffn_kind,
                                    (dl_backend_score_fn_t)c->route.score_fn,
                                    c->route.n_group, c->route.topk_group,
                                    (dl_backend_group_score_t)c->route.group_score,
                                    c->route.renormalize != 0, c->route.has_bias != 0,
                                    c->route.scaling};

    ctrl_t *ctl = mmap(NULL, sizeof *ctl, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ctl == MAP_FAILED)
        return DL_ENOMEM;

    /* Probe: load once in a child to read the table. */
    child_out_t res;
    char why[256];
    if ((rc = dl__run_child(&job, ctl, -1, NULL, NULL, NULL, limit, &res, why, sizeof why)))
        goto done;
    r->backend.abi_version = ctl->abi_version;
    if (res != CH_OK) {
        dl_run_status_t st = child_status(res);
        diag_set(&r->load, st, "%s", why);
        for (int s = 0; s < DL_STAGE_COUNT; s++)
            diag_set(&r->stage[s], st, "the plugin did not load: %s", why);
        goto done;
    }
    r->loaded = 1;
    r->load.status = DL_RUN_OK;
    memcpy(r->backend.name, ctl->name, sizeof r->backend.name);
    memcpy(r->backend.version, ctl->version, sizeof r->backend.version);
    memcpy(r->backend.compute_mode, ctl->compute_mode, sizeof r->backend.compute_mode);
    r->backend.implemented = ctl->implemented;

    for (int s = 0; s < DL_STAGE_COUNT; s++) {
        dl_run_diag_t *g = &r->stage[s];
        if (!(r->backend.implemented & (1u << s))) {
            diag_set(g, DL_RUN_NOT_IMPLEMENTED, "");
            continue;
        }
        if (dl__run_stage_is_backward((dl_run_stage_t)s) && (forward_only || !gb)) {
            diag_set(g, DL_RUN_SKIPPED, forward_only ? "forward only" : "no golden backward");
            continue;
        }
        stage_io_t io;
        dl__run_stage_io((dl_run_stage_t)s, c, in, gf, gb, r, &io);
        const char *missing = NULL;
        for (int i = 0; i < io.nin && !missing; i++)
            if (io.in[i].present && !io.in[i].src && dl__run_count(&io.in[i]) > 0)
                missing = io.in[i].name;
        if (missing) {
            diag_set(g, DL_RUN_SKIPPED, "the golden values lack input %s", missing);
            continue;
        }
        g->status = DL_RUN_OK;
        if ((rc = exec_stage(&job, ctl, (dl_run_stage_t)s, &io, limit, g)))
            goto done;
    }
done:
    munmap(ctl, sizeof *ctl);
    return rc;
}

