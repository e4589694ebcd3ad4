/* Goldens behind handles for the bindings: the catalogue and the layout as
 * JSON, generation in memory, load and save, arrays by dataset name. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "api/api_priv.h"

static const char *const store_names[] = {"act", "f32", "i32", "i64", "rt"};
static const char *const group_names[] = {"inputs", "forward", "backward"};

const dl_golden_file_t *dl__api_golden_file(const dl_api_golden_t *g)
{
    return g && g->tag == DL__API_GOLDEN ? &g->g : NULL;
}

char *dl_api_cases_json(void)
{
    dl__api_text_t t = {0};
    dl__api_printf(&t, "[");
    for (int i = 0; i < dl_case_count(); i++) {
        const dl_case_t *c = dl_case_get(i);
        dl__api_printf(&t, "%s\n {\"name\": ", i ? "," : "");
        dl__api_json_str(&t, c->name);
        dl__api_printf(&t, ", \"description\": ");
        dl__api_json_str(&t, c->description);
        dl__api_printf(&t, ", \"seed\": %llu, \"large\": %s, \"tier\": ",
                       (unsigned long long)c->seed, c->large ? "true" : "false");
        dl__api_json_str(&t, dl_case_tier_name(c->tier));
        dl__api_printf(&t, ", \"data_bytes\": %lld, \"memory_bytes\": %lld, \"config\": {",
                       (long long)dl_case_data_bytes(c), (long long)dl_case_memory_bytes(c, NULL));
        dl__api_json_config(&t, &c->config);
        dl__api_printf(&t, "}, \"dims\": ");
        dl__api_json_dims(&t, &c->config);
        dl__api_printf(&t, "}");
    }
    dl__api_printf(&t, "\n]\n");
    return dl__api_text_take(&t);
}

char *dl_api_layout_json(void)
{
    dl__api_text_t t = {0};
    dl__api_printf(&t, "{\"format\": \"%s\", \"format_version\": %d, \"arrays\": [\n",
                   DL_GOLDEN_FORMAT, DL_GOLDEN_FORMAT_VERSION);
    for (int i = 0; i < dl_layout_count(); i++) {
        const dl_layout_row_t *r = dl_layout_row(i);
        dl__api_printf(&t, "  {\"group\": \"%s\", \"name\": \"%s\", \"path\": \"/%s/%s\", ",
                       group_names[r->group], r->name, group_names[r->group], r->name);
        if (r->value == DL_VALUE_NONE)
            dl__api_printf(&t, "\"value\": null, ");
        else
            dl__api_printf(&t, "\"value\": %d, ", (int)r->value);
        dl__api_printf(&t, "\"store\": \"%s\", \"dims\": \"%s\", \"cond\": \"%s\"}%s\n",
                       store_names[r->store], r->dims, dl_cond_name(r->cond),
                       i + 1 < dl_layout_count() ? "," : "");
    }
    dl__api_printf(&t, "]}\n");
    return dl__api_text_take(&t);
}

static int new_golden(dl_api_golden_t **out, char *err, size_t n)
{
    if (!out)
        return dl__api_fail(err, n, DL_EINVAL, "no place for the handle (NULL out)");
    *out = calloc(1, sizeof **out);
    if (!*out)
        return dl__api_fail(err, n, DL_ENOMEM, "out of memory");
    (*out)->tag = DL__API_GOLDEN;
    return 0;
}

/* A catalogue name, else a case file. */
static int find_case(const char *spec, dl_case_t *c, char *err, size_t n)
{
    if (dl_case_find(spec, c) == 0)
        return 0;
    if (access(spec, F_OK) != 0)
        return dl__api_fail(err, n, DL_ENOTFOUND,
                            "'%s' is neither a catalogue case (see dropless.cases()) nor a case file",
                            spec);
    return dl_case_parse_file(spec, c, err, n);
}

int dl_api_golden_memory(const char *spec, int no_backward, int64_t *need, int64_t *avail,
                         char *err, size_t errlen)
{
    if (!spec || !need || !avail)
        return dl__api_fail(err, errlen, DL_EINVAL, "no case given, or a NULL argument");
    dl_case_t c;
    int rc = find_case(spec, &c, err, errlen);
    if (rc)
        return rc;
    dl_golden_gen_opts_t o = {0};
    o.no_backward = no_backward != 0;
    *need = dl_case_memory_bytes(&c, &o);
    *avail = dl_memory_available();
    return 0;
}

/* DL_ENOMEM, naming both figures, when c does not fit in memory. */
static int fits(const dl_case_t *c, const dl_golden_gen_opts_t *o, char *err, size_t n)
{
    int64_t need = dl_case_memory_bytes(c, o), avail = dl_memory_available();
    if (avail < 0 || (need >= 0 && need <= avail))
        return 0;
    return dl__api_fail(err, n, DL_ENOMEM, "case %s: generating it in memory needs about %.3g MiB, "
                        "%.3g MiB available; refusing (ignore_memory to try anyway, or `dropless "
                        "gen --stream` to a file)", c->name, need < 0 ? 8e12 : need / 1048576.0,
                        avail / 1048576.0);
}

int dl_api_golden_generate_ex(const char *spec, int has_seed, uint64_t seed, int no_backward,
                              int ignore_memory, void (*progress)(void *, const char *, double),
                              void *ctx, dl_api_golden_t **out, char *err, size_t errlen)
{
    if (out)
        *out = NULL;
    if (!spec)
        return dl__api_fail(err, errlen, DL_EINVAL, "no case given");
    dl_case_t c;
    int rc = find_case(spec, &c, err, errlen);
    if (rc)
        return rc;
    if (has_seed)
        c.seed = seed;
    dl_golden_gen_opts_t o = {0};
    o.no_backward = no_backward != 0;
    o.progress = progress;
    o.progress_ctx = ctx;
    if ((!ignore_memory && (rc = fits(&c, &o, err, errlen))) || (rc = new_golden(out, err, errlen)))
        return rc;
    int bwd = 0;
    rc = dl_golden_generate(&c, &o, &(*out)->g, &bwd, err, errlen);
    if (!rc && bwd)
        rc = dl__api_fail(err, errlen, bwd, "case %s: backward pass: %s", c.name, dl_strerror(bwd));
    if (rc) {
        dl_api_golden_free(*out);
        *out = NULL;
    }
    return rc;
}

int dl_api_golden_generate(const char *spec, int has_seed, uint64_t seed, int no_backward,
                           dl_api_golden_t **out, char *err, size_t errlen)
{
    return dl_api_golden_generate_ex(spec, has_seed, seed, no_backward, 1, NULL, NULL, out, err,
                                     errlen);
}

int dl_api_golden_open(const char *path, unsigned timeout_s, dl_api_golden_t **out, char *err,
                       size_t errlen)
{
    if (out)
        *out = NULL;
    if (!path)
        return dl__api_fail(err, errlen, DL_EINVAL, "no path given");
    int rc = new_golden(out, err, errlen);
    if (rc)
        return rc;
    rc = dl_golden_load_isolated(path, NULL, timeout_s, &(*out)->g, err, errlen);
    if (!rc && (!(*out)->g.has_inputs || !(*out)->g.has_forward))
        rc = dl__api_fail(err, errlen, DL_EFORMAT, "%s: not a golden file (no /inputs or /forward)",
                          path);
    if (rc) {
        dl_api_golden_free(*out);
        *out = NULL;
    }
    return rc;
}

int dl_api_golden_load(const char *path, dl_api_golden_t **out, char *err, size_t errlen)
{
    return dl_api_golden_open(path, DL_API_PREFLIGHT_SECONDS, out, err, errlen);
}

int dl_api_golden_save(const dl_api_golden_t *g, const char *path, int force, char *err,
                       size_t errlen)
{
    const dl_golden_file_t *f = dl__api_golden_file(g);
    if (!f || !path)
        return dl__api_fail(err, errlen, DL_EINVAL, "not a golden handle, or no path");
    return dl_golden_write(path, f, force, NULL, NULL, err, errlen);
}

void dl_api_golden_free(dl_api_golden_t *g)
{
    if (!g || g->tag != DL__API_GOLDEN)
        return;
    dl_golden_free(&g->g);
    g->tag = 0;
    free(g);
}

/* The storage type of row r for c, by name. */
static const char *row_dtype(const dl_layout_row_t *r, const dl_moe_config_t *c)
{
    switch (r->store) {
    case DL_STORE_ACT: return dl_dtype_name(c->dtype);
    case DL_STORE_I32: return "int32";
    case DL_STORE_I64: return "int64";
    case DL_STORE_RT: return dl_dtype_name(c->router_dtype);
    default: return "fp32";
    }
}

/* The row's array in f, or NULL (absent, or not applicable). */
static const void *row_data(const dl_layout_row_t *r, const dl_golden_file_t *f)
{
    dl_moe_inputs_t in = dl_golden_inputs_view(&f->in);
    if ((r->group == DL_LAYOUT_INPUTS && !f->has_inputs) ||
        (r->group == DL_LAYOUT_FORWARD && !f->has_forward) ||
        (r->group == DL_LAYOUT_BACKWARD && !f->has_backward))
        return NULL;
    if (!dl_cond_applies(r->cond, &f->config))
        return NULL;
    return dl_layout_data(r, &in, &f->fwd, &f->bwd);
}

char *dl_api_golden_info_json(const dl_api_golden_t *g)
{
    const dl_golden_file_t *f = dl__api_golden_file(g);
    if (!f)
        return NULL;
    dl__api_text_t t = {0};
    dl__api_printf(&t, "{\"case\": ");
    dl__api_json_str(&t, f->case_name);
    dl__api_printf(&t, ", \"seed\": %llu, \"generator\": ", (unsigned long long)f->seed);
    dl__api_json_str(&t, f->generator);
    dl__api_printf(&t, ", \"has_backward\": %s, \"config\": {", f->has_backward ? "true" : "false");
    dl__api_json_config(&t, &f->config);
    dl__api_printf(&t, "}, \"dims\": ");
    dl__api_json_dims(&t, &f->config);
    dl__api_printf(&t, ", \"arrays\": [");
    for (int i = 0; i < dl_layout_count(); i++) {
        const dl_layout_row_t *r = dl_layout_row(i);
        int64_t dims[3];
        int rank = dl_layout_shape(r, &f->config, dims);
        dl__api_printf(&t, "%s\n  {\"name\": \"%s\", \"group\": \"%s\", \"store\": \"%s\", "
                           "\"dtype\": \"%s\", \"applies\": %s, \"present\": %s, \"shape\": [",
                       i ? "," : "", r->name, group_names[r->group], store_names[r->store],
                       row_dtype(r, &f->config), dl_cond_applies(r->cond, &f->config) ? "true" : "false",
                       row_data(r, f) ? "true" : "false");
        for (int d = 0; d < rank; d++)
            dl__api_printf(&t, "%s%lld", d ? ", " : "", (long long)dims[d]);
        dl__api_printf(&t, "]}");
    }
    dl__api_printf(&t, "\n]}\n");
    return dl__api_text_take(&t);
}

int dl_api_golden_array(const dl_api_golden_t *g, const char *name, const void **data, int *elem,
                        int *rank, int64_t dims[3], char *err, size_t errlen)
{
    const dl_golden_file_t *f = dl__api_golden_file(g);
    if (!f || !name || !data || !elem || !rank || !dims)
        return dl__api_fail(err, errlen, DL_EINVAL, "not a golden handle, or a NULL argument");
    const dl_layout_row_t *r = dl_layout_find(name);
    if (!r)
        return dl__api_fail(err, errlen, DL_ENOTFOUND, "'%s' is not an array of the layer", name);
    *data = row_data(r, f);
    if (!*data)
        return dl__api_fail(err, errlen, DL_ENOTFOUND, "case %s has no %s (%s)", f->case_name, name,
                            !dl_cond_applies(r->cond, &f->config) ? "not part of this layer"
                                                                   : "its group is absent");
    *elem = r->store == DL_STORE_I32 ? DL_API_I32 : r->store == DL_STORE_I64 ? DL_API_I64 : DL_API_F32;
    *rank = dl_layout_shape(r, &f->config, dims);
    return 0;
}
