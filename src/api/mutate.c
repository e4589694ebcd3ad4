/* Mutants for the bindings (dropless.mutate): written to a directory
 * (dl_mutate_write) or built in memory as candidate handles, options as
 * "key=value" lines parsed by dl_mutate_opts_set. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "api/api_priv.h"
#include "dropless/mutate.h"

static int parse(const char *s, dl_mutate_opts_t *o, char *err, size_t n)
{
    char buf[4096];
    memset(o, 0, sizeof *o);
    if (!s)
        return 0;
    if (strlen(s) >= sizeof buf)
        return dl__api_fail(err, n, DL_EINVAL, "mutate options longer than %zu bytes", sizeof buf - 1);
    strcpy(buf, s);
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        if (!eq)
            return dl__api_fail(err, n, DL_EINVAL, "mutate option '%s' is not key=value", line);
        *eq = '\0';
        int rc = dl_mutate_opts_set(o, line, eq + 1, err, n);
        if (rc)
            return rc;
    }
    return 0;
}

int dl_api_mutate(const dl_api_golden_t *g, const char *dir, const char *options, char **manifest,
                  char *err, size_t errlen)
{
    const dl_golden_file_t *gf = dl__api_golden_file(g);
    dl_mutate_opts_t o;
    if (manifest)
        *manifest = NULL;
    if (!gf || !dir)
        return dl__api_fail(err, errlen, DL_EINVAL, "not a golden handle, or no directory");
    int rc = parse(options, &o, err, errlen);
    return rc ? rc : dl_mutate_write(gf, dir, &o, NULL, manifest, err, errlen);
}

int dl_api_mutant(const dl_api_golden_t *g, const char *mutation, const char *stage, const char *mode,
                  const char *options, dl_api_candidate_t **out, char *detail, size_t detail_len,
                  char *err, size_t errlen)
{
    const dl_golden_file_t *gf = dl__api_golden_file(g);
    dl_mutation_t m;
    dl_value_t s;
    dl_mutate_mode_t md;
    dl_mutate_opts_t o;
    if (out)
        *out = NULL;
    if (!gf || !out || !mutation || !stage || !mode)
        return dl__api_fail(err, errlen, DL_EINVAL, "not a golden handle, or a NULL argument");
    if (dl_mutation_parse(mutation, &m) || dl_value_parse(stage, &s) || dl_mutate_mode_parse(mode, &md))
        return dl__api_fail(err, errlen, DL_EINVAL, "unknown mutation '%s', stage '%s' or mode '%s'",
                            mutation, stage, mode);
    int rc = parse(options, &o, err, errlen);
    dl_api_candidate_t *c = rc ? NULL : calloc(1, sizeof *c);
    if (!rc && !c)
        return dl__api_fail(err, errlen, DL_ENOMEM, "out of memory");
    if (!rc && (rc = dl_mutant_build(gf, m, (int)s, &o, &c->f, detail, detail_len, err, errlen)) == 0) {
        dl_golden_file_t view;
        if (!dl_mutant_view(gf, &c->f, md, &view))
            rc = DL_ENOTFOUND; /* equivalent: the mode's stages are the golden's */
        for (int v = 0; !rc && v < DL_VALUE_COUNT; v++) {
            const dl_golden_dataset_t *ds = dl__api_dataset_of((dl_value_t)v);
            void **keep = ds ? dl_golden_slot(&view, ds) : NULL, **mine = ds ? dl_golden_slot(&c->f, ds) : NULL;
            if (mine && keep && !*keep) {
                free(*mine);
                *mine = NULL;
            }
        }
        free(c->f.fwd.tie_margin);
        c->f.fwd.tie_margin = NULL;
        c->f.has_backward = view.has_backward;
        memcpy(c->f.backend, view.backend, sizeof view.backend);
        memcpy(c->f.compute_mode, view.compute_mode, sizeof view.compute_mode);
    }
    if (rc) {
        if (c)
            dl_golden_free(&c->f);
        free(c);
        return rc == DL_ENOTFOUND ? dl__api_fail(err, errlen, rc, "%s at %s in mode %s: no such mutant "
                                                "(it does not apply, or is equivalent)", mutation, stage, mode)
                                  : rc;
    }
    c->tag = DL__API_CANDIDATE;
    *out = c;
    return 0;
}
