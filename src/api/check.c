/* The check for the bindings: options as "key=value" lines, the candidate
 * handle turned into the runner's candidate, reports as text. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "api/api_priv.h"

typedef struct {
    dl_check_options_t co;
    const char *isolated; /* NULL: not given */
    dl_valueset_t stages;      /* stages to check; all when none named */
    int strict_storage;
    char buf[4096];       /* the options, split in place */
} opts_t;

static int parse_flag(const char *k, const char *v, int *out, char *err, size_t n)
{
    if (strcmp(v, "0") && strcmp(v, "1"))
        return dl__api_fail(err, n, DL_EINVAL, "option %s: '%s' is not 0 or 1", k, v);
    *out = v[0] == '1';
    return 0;
}

static int parse_stages(char *v, dl_valueset_t *mask, char *err, size_t n)
{
    *mask = 0;
    for (char *save = NULL, *tok = strtok_r(v, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        dl_value_t s;
        if (dl_value_parse(tok, &s) != 0)
            return dl__api_fail(err, n, DL_EINVAL, "option stages: unknown stage '%s'", tok);
        *mask |= DL_VALUE_BIT(s);
    }
    if (!*mask)
        return dl__api_fail(err, n, DL_EINVAL, "option stages: no stage named");
    return 0;
}

static int parse_one(opts_t *o, char *k, char *v, char *err, size_t n)
{
    if (!strcmp(k, "profile")) {
        if (!(o->co.profile = dl_check_profile_find(v))) {
            char known[256] = "";
            for (int i = 0; i < dl_check_profile_count(); i++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? " " : "",
                         dl_check_profile_at(i)->name);
            return dl__api_fail(err, n, DL_EINVAL, "unknown profile '%s' (known: %s)", v, known);
        }
        return 0;
    }
    if (!strcmp(k, "isolated")) {
        o->isolated = v;
        return 0;
    }
    if (!strcmp(k, "stages"))
        return parse_stages(v, &o->stages, err, n);
    if (!strcmp(k, "strict_storage"))
        return parse_flag(k, v, &o->strict_storage, err, n);
    if (!strcmp(k, "diagnose_drops"))
        return parse_flag(k, v, &o->co.diagnose_drops, err, n);
    if (!strcmp(k, "recompute_all"))
        return parse_flag(k, v, &o->co.recompute_all, err, n);
    if (!strcmp(k, "max_listed")) {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno || x < 0 || x > 1000000)
            return dl__api_fail(err, n, DL_EINVAL, "option max_listed: '%s' is not a count", v);
        o->co.max_listed = x;
        return 0;
    }
    return dl__api_fail(err, n, DL_EINVAL,
                        "unknown check option '%s' (known: profile, isolated, stages, strict_storage, "
                        "diagnose_drops, max_listed, recompute_all)", k);
}

static int parse_options(const char *s, opts_t *o, char *err, size_t n)
{
    memset(o, 0, sizeof *o);
    dl_check_options_default(&o->co);
    if (!s)
        return 0;
    if (strlen(s) >= sizeof o->buf)
        return dl__api_fail(err, n, DL_EINVAL, "check options longer than %zu bytes", sizeof o->buf - 1);
    strcpy(o->buf, s);
    for (char *save = NULL, *line = strtok_r(o->buf, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        if (!eq)
            return dl__api_fail(err, n, DL_EINVAL, "check option '%s' is not key=value", line);
        *eq = '\0';
        int rc = parse_one(o, line, eq + 1, err, n);
        if (rc)
            return rc;
    }
    return 0;
}

int dl__api_groups(const char *spec, dl_valueset_t provided, dl_valueset_t *groups, int *ngroups, char *err,
                   size_t n)
{
    *ngroups = 0;
    if (!strcmp(spec, "*")) {
        for (int s = 0; s < DL_VALUE_COUNT; s++)
            if ((provided >> s) & 1)
                groups[(*ngroups)++] = DL_VALUE_BIT(s);
        return 0;
    }
    int ng = dl_check_parse_groups(spec, groups, DL_VALUE_COUNT);
    if (ng < 0)
        return dl__api_fail(err, n, DL_EINVAL,
                            "isolated: '%s' is not groups of stage names ('a,b;c')", spec);
    dl_valueset_t covered = 0;
    for (int i = 0; i < ng; i++) {
        if (groups[i] & covered)
            return dl__api_fail(err, n, DL_EINVAL, "isolated: a stage is in two groups of '%s'", spec);
        covered |= groups[i];
    }
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        dl_valueset_t bit = DL_VALUE_BIT(s);
        if ((covered & bit) && !(provided & bit))
            return dl__api_fail(err, n, DL_EINVAL, "isolated: %s is in a group but not provided",
                                dl_value_name((dl_value_t)s));
        if (!(covered & bit) && (provided & bit))
            return dl__api_fail(err, n, DL_EINVAL,
                                "isolated: %s is provided but in no group (every stage of a "
                                "stage-isolated candidate belongs to the call that computed it)",
                                dl_value_name((dl_value_t)s));
    }
    *ngroups = ng;
    return 0;
}

static int same_config(const dl_moe_config_t *a, const dl_moe_config_t *b)
{
    char x[1024], y[1024];
    return dl_golden_config_string(a, " ", x, sizeof x) == 0 &&
           dl_golden_config_string(b, " ", y, sizeof y) == 0 && !strcmp(x, y);
}

/* The runner's candidate: a shallow copy of the handle's arrays without the
 * stages not selected and those set aside (bad or, strictly, off grid). */
static void build(const dl_api_candidate_t *h, const opts_t *o, dl_golden_file_t *view,
                  dl_check_candidate_t *c, dl_valueset_t *provided)
{
    *view = h->f;
    dl_valueset_t bad = h->bad | (o->strict_storage ? h->off_grid : 0);
    *provided = 0;
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        dl_valueset_t bit = DL_VALUE_BIT(s);
        void **slot = dl_golden_slot(view, dl__api_dataset_of((dl_value_t)s));
        int wanted = !o->stages || (o->stages & bit);
        if (!wanted) {
            *slot = NULL;
            bad &= ~bit;
        } else if (bad & bit) {
            *slot = NULL;
        }
        if (*slot || (bad & bit))
            *provided |= bit;
    }
    memset(c, 0, sizeof *c);
    c->fwd = view->fwd;
    c->bwd = view->bwd;
    c->bad_shape = bad;
    c->backend = view->backend[0] ? view->backend : NULL;
    c->backend_version = view->backend_version[0] ? view->backend_version : NULL;
    c->compute_mode = view->compute_mode[0] ? view->compute_mode : NULL;
    c->n_ep = h->f.n_ep;
    c->ep = h->f.ep;
    c->n_layouts = h->f.n_layouts;
    c->layouts = h->f.layouts;
}

int dl_api_check(const dl_api_golden_t *g, const dl_api_candidate_t *c, const char *options,
                 dl_api_report_t **out, char *err, size_t errlen)
{
    return dl_api_check_ex(g, c, options, NULL, NULL, out, err, errlen);
}

int dl_api_check_ex(const dl_api_golden_t *g, const dl_api_candidate_t *c, const char *options,
                    void (*progress)(void *ctx, const char *stage, double done), void *ctx,
                    dl_api_report_t **out, char *err, size_t errlen)
{
    const dl_golden_file_t *gf = dl__api_golden_file(g);
    const dl_api_candidate_t *h = c && c->tag == DL__API_CANDIDATE ? c : NULL;
    if (out)
        *out = NULL;
    if (!gf || !h || !out)
        return dl__api_fail(err, errlen, DL_EINVAL, "not a golden and a candidate handle, or NULL out");
    if (!same_config(&gf->config, &h->f.config))
        return dl__api_fail(err, errlen, DL_ESHAPE, "the candidate was made for another configuration "
                            "than golden %s", gf->case_name);
    opts_t *o = malloc(sizeof *o);
    if (!o)
        return dl__api_fail(err, errlen, DL_ENOMEM, "out of memory");
    int rc = parse_options(options, o, err, errlen);
    o->co.progress = progress;
    o->co.progress_ctx = ctx;
    dl_golden_file_t view;
    dl_check_candidate_t cand;
    dl_valueset_t provided, groups[DL_VALUE_COUNT];
    int ng = 0;
    build(h, o, &view, &cand, &provided);
    if (!rc && o->isolated && *o->isolated)
        rc = dl__api_groups(o->isolated, provided, groups, &ng, err, errlen);
    else if (!rc && !o->isolated && h->from_file && h->f.isolated_groups[0] &&
             (ng = dl_check_parse_groups(h->f.isolated_groups, groups, DL_VALUE_COUNT)) < 0)
        rc = dl__api_fail(err, errlen, DL_EFORMAT, "the candidate file's isolated_groups is malformed");
    if (!rc && !(*out = calloc(1, sizeof **out)))
        rc = dl__api_fail(err, errlen, DL_ENOMEM, "out of memory");
    if (!rc) {
        dl_moe_inputs_t in = dl_golden_inputs_view(&gf->in);
        dl_check_golden_t gold = {&gf->config, &in, &gf->fwd, gf->has_backward ? &gf->bwd : NULL,
                                  gf->case_name};
        (*out)->tag = DL__API_REPORT;
        rc = ng > 0 ? dl_check_run_isolated(&gold, &cand, &o->co, groups, ng, &(*out)->r)
                    : dl_check_run(&gold, &cand, &o->co, &(*out)->r);
        if (rc) {
            dl__api_fail(err, errlen, rc, "checking against %s: %s", gf->case_name, dl_strerror(rc));
            dl_api_report_free(*out);
            *out = NULL;
        }
    }
    free(o);
    return rc;
}

char *dl_api_report_text(const dl_api_report_t *r, const char *format, int all)
{
    dl_report_format_t fmt;
    if (!r || r->tag != DL__API_REPORT || !format || dl_report_format_parse(format, &fmt) != 0)
        return NULL;
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    if (!f)
        return NULL;
    const dl_check_report_t *rp = &r->r;
    int rc = dl_check_write(f, fmt, &rp, 1, all ? DL_REPORT_ALL : 0);
    if (fclose(f) != 0 || rc != 0) {
        free(s);
        return NULL;
    }
    return s;
}

int dl_api_report_conformant(const dl_api_report_t *r)
{
    return r && r->tag == DL__API_REPORT ? dl_check_conformant(&r->r) : DL_EINVAL;
}

void dl_api_report_free(dl_api_report_t *r)
{
    if (!r || r->tag != DL__API_REPORT)
        return;
    dl_check_report_free(&r->r);
    r->tag = 0;
    free(r);
}
