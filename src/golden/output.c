/* The output-file rules of src/util/outfile.c for the command line and other
 * programs that write files: a command's inputs and outputs told apart by
 * identity and reserved before the work, plain files (a plot, a JSON
 * document) written under a temporary name, and the checks a generator
 * makes before any work. Thin: the rules are util's and the generator's. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "golden/golden_priv.h"

int dl_golden_output_input(const char *path)
{
    return dl__out_input(path);
}

int dl_golden_output_reserve(const char *path, int force, char *err, size_t errlen)
{
    return dl__out_reserve(path, force, err, errlen);
}

void dl_golden_output_release(void)
{
    dl__out_release();
}

struct dl_golden_output {
    dl__outfile_t file;
    int force;
};

int dl_golden_output_open(const char *path, int force, dl_golden_output_t **out, char *err,
                          size_t errlen)
{
    if (!out)
        return DL_EINVAL;
    *out = calloc(1, sizeof **out);
    if (!*out) {
        dl__golden_msg(err, errlen, "%s: out of memory", path ? path : "output");
        return DL_ENOMEM;
    }
    (*out)->force = force;
    int rc = dl__out_begin(&(*out)->file, path, force, err, errlen);
    if (rc) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

int dl_golden_output_fd(const dl_golden_output_t *o)
{
    return o ? o->file.fd : -1;
}

const char *dl_golden_output_tmp(const dl_golden_output_t *o)
{
    return o ? o->file.tmp : NULL;
}

int dl_golden_output_commit(dl_golden_output_t *o, char *err, size_t errlen)
{
    if (!o)
        return DL_EINVAL;
    int rc = dl__out_commit(&o->file, o->force, err, errlen);
    free(o);
    return rc;
}

void dl_golden_output_abort(dl_golden_output_t *o)
{
    if (!o)
        return;
    dl__out_abort(&o->file);
    free(o);
}

int dl_golden_gen_check(const dl_case_t *c, const dl_golden_gen_opts_t *opts, char *err,
                        size_t errlen)
{
    if (!c)
        return DL_EINVAL;
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
    if ((rc = dl__golden_ep_check_ranks(&c->config, opts, c->name, err, errlen)) ||
        (rc = dl__golden_layouts_check(&c->config, opts, c->name, err, errlen)))
        return rc;
    const int64_t E = c->config.route.experts;
    if (opts && opts->expert_end > 0 &&
        (opts->expert_begin < 0 || opts->expert_begin >= opts->expert_end || opts->expert_end > E)) {
        dl__golden_msg(err, errlen, "case %s: expert range %lld:%lld is not within [0, %lld]",
                       c->name, (long long)opts->expert_begin, (long long)opts->expert_end,
                       (long long)E);
        return DL_EINVAL;
    }
    return 0;
}
