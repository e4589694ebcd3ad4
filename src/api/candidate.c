/* Candidates behind handles for the bindings: stage values set by name
 * from flat arrays of any element type the binding hands over, candidate
 * files loaded and written. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "api/api_priv.h"

static const char *const elem_names[] = {"float32", "float64", "bfloat16", "float16", "int32", "int64"};

static dl_api_candidate_t *cand_of(const dl_api_candidate_t *c)
{
    return c && c->tag == DL__API_CANDIDATE ? (dl_api_candidate_t *)c : NULL;
}

static int new_candidate(const dl_golden_file_t *g, dl_api_candidate_t **out, char *err, size_t n)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return dl__api_fail(err, n, DL_ENOMEM, "out of memory");
    (*out)->tag = DL__API_CANDIDATE;
    (*out)->f.config = g->config;
    (*out)->f.seed = g->seed;
    snprintf((*out)->f.case_name, sizeof (*out)->f.case_name, "%s", g->case_name);
    return 0;
}

int dl_api_candidate_set_attr(dl_api_candidate_t *c, const char *name, const char *value,
                              char *err, size_t errlen)
{
    dl_api_candidate_t *h = cand_of(c);
    if (!h || !name)
        return dl__api_fail(err, errlen, DL_EINVAL, "not a candidate handle, or no name");
    char *field;
    size_t size;
    if (!strcmp(name, "backend"))
        field = h->f.backend, size = sizeof h->f.backend;
    else if (!strcmp(name, "backend_version"))
        field = h->f.backend_version, size = sizeof h->f.backend_version;
    else if (!strcmp(name, "compute_mode"))
        field = h->f.compute_mode, size = sizeof h->f.compute_mode;
    else if (!strcmp(name, "device"))
        field = h->f.device, size = sizeof h->f.device;
    else
        return dl__api_fail(err, errlen, DL_EINVAL,
                            "unknown candidate attribute '%s' (backend, backend_version, "
                            "compute_mode, device)", name);
    if (!value)
        value = "";
    if (strlen(value) >= size)
        return dl__api_fail(err, errlen, DL_EOVERFLOW, "%s: '%.40s...' is longer than %zu bytes",
                            name, value, size - 1);
    if (field == h->f.compute_mode && *value && !dl_check_profile_find(value))
        return dl__api_fail(err, errlen, DL_EINVAL, "unknown compute mode '%s' (not a profile)", value);
    snprintf(field, size, "%s", value);
    return 0;
}

int dl_api_candidate_new(const dl_api_golden_t *g, const char *backend, const char *compute_mode,
                         dl_api_candidate_t **out, char *err, size_t errlen)
{
    const dl_golden_file_t *gf = dl__api_golden_file(g);
    if (out)
        *out = NULL;
    if (!gf || !out)
        return dl__api_fail(err, errlen, DL_EINVAL, "not a golden handle, or NULL out");
    int rc = new_candidate(gf, out, err, errlen);
    if (!rc && !(rc = dl_api_candidate_set_attr(*out, "backend", backend, err, errlen)))
        rc = dl_api_candidate_set_attr(*out, "compute_mode", compute_mode, err, errlen);
    if (rc) {
        dl_api_candidate_free(*out);
        *out = NULL;
    }
    return rc;
}

static int stage_of(const dl_moe_config_t *c, const char *name, dl_value_t *v, char *err, size_t n)
{
    const dl_layout_row_t *r = dl_layout_find(name);
    if (!r)
        return dl__api_fail(err, n, DL_ENOTFOUND, "'%s' is not a stage value of the layer", name);
    if (r->group == DL_LAYOUT_INPUTS)
        return dl__api_fail(err, n, DL_ENOTFOUND, "%s is an input: a candidate holds stage values only",
                            name);
    if (dl_value_parse(name, v) != 0)
        return dl__api_fail(err, n, DL_ENOTFOUND, "%s is not a checked stage value", name);
    if (dl_value_numel(c, *v) == 0 && !dl_cond_applies(r->cond, c))
        return dl__api_fail(err, n, DL_ENOTFOUND, "this layer has no %s (%s FFN)", name,
                            c->ffn_kind == DL_FFN_PLAIN ? "plain" : "SwiGLU");
    return 0;
}

/* Float stage values from any float element type, exactly. */
static int to_float(float *dst, const void *src, int elem, int64_t n, const char *name, char *err,
                    size_t len)
{
    for (int64_t i = 0; i < n; i++) {
        switch (elem) {
        case DL_API_F32: dst[i] = ((const float *)src)[i]; break;
        case DL_API_BF16: dst[i] = dl_bf16_to_float(((const uint16_t *)src)[i]); break;
        case DL_API_F16: dst[i] = dl_f16_to_float(((const uint16_t *)src)[i]); break;
        default: {
            double x = ((const double *)src)[i];
            dst[i] = (float)x;
            if (!isnan(x) && (double)dst[i] != x)
                return dl__api_fail(err, len, DL_EGRID,
                                    "%s: float64 element %lld = %.17g is not a float32 value (store "
                                    "the stage in its storage type; nothing is rounded for you)",
                                    name, (long long)i, x);
        }
        }
    }
    return 0;
}

static int to_int(void *dst, int store, const void *src, int elem, int64_t n, const char *name,
                  char *err, size_t len)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t x = elem == DL_API_I32 ? ((const int32_t *)src)[i] : ((const int64_t *)src)[i];
        if (store == DL_STORE_I64) {
            ((int64_t *)dst)[i] = x;
        } else if (x < INT32_MIN || x > INT32_MAX) {
            return dl__api_fail(err, len, DL_ERANGE, "%s: element %lld = %lld does not fit int32", name,
                                (long long)i, (long long)x);
        } else {
            ((int32_t *)dst)[i] = (int32_t)x;
        }
    }
    return 0;
}

static int check_shape(const dl_moe_config_t *c, dl_value_t v, int rank, const int64_t *dims,
                       char *err, size_t n)
{
    int64_t want[3];
    int wr = dl_value_shape(c, v, want);
    int same = rank == wr && (rank == 0 || dims);
    for (int i = 0; same && i < rank; i++)
        same = dims[i] == want[i];
    if (same)
        return 0;
    char a[96], b[96];
    return dl__api_fail(err, n, DL_ESHAPE, "%s: shape %s, the case needs %s", dl_value_name(v),
                        rank >= 0 && rank <= 8 && (dims || !rank) ? dl__api_shape_str(a, sizeof a, rank, dims)
                                                                  : "(invalid)",
                        dl__api_shape_str(b, sizeof b, wr, want));
}

int dl_api_candidate_set(dl_api_candidate_t *c, const char *name, const void *data, int elem,
                         int rank, const int64_t *dims, char *err, size_t errlen)
{
    dl_api_candidate_t *h = cand_of(c);
    if (!h || !name)
        return dl__api_fail(err, errlen, DL_EINVAL, "not a candidate handle, or no stage name");
    dl_value_t v;
    int rc = stage_of(&h->f.config, name, &v, err, errlen);
    if (rc || (rc = check_shape(&h->f.config, v, rank, dims, err, errlen)))
        return rc;
    if (elem < DL_API_F32 || elem > DL_API_I64)
        return dl__api_fail(err, errlen, DL_EDTYPE, "%s: unknown element type %d", name, elem);
    dl_store_t store = dl_value_store(v);
    int is_int = store == DL_STORE_I32 || store == DL_STORE_I64;
    if (is_int != (elem == DL_API_I32 || elem == DL_API_I64))
        return dl__api_fail(err, errlen, DL_EDTYPE, "%s: a %s array for a%s stage (%s)", name,
                            elem_names[elem], is_int ? "n integer" : " floating-point",
                            is_int ? (store == DL_STORE_I32 ? "int32" : "int64")
                                   : dl_dtype_name(dl_value_dtype(&h->f.config, v)));
    int64_t n = dl_value_numel(&h->f.config, v);
    if (n > 0 && !data)
        return dl__api_fail(err, errlen, DL_EINVAL, "%s: no data", name);
    size_t esz = store == DL_STORE_I64 ? 8 : 4;
    void *buf = malloc(n > 0 ? (size_t)n * esz : 1);
    if (!buf)
        return dl__api_fail(err, errlen, DL_ENOMEM, "%s: out of memory", name);
    rc = is_int ? to_int(buf, store, data, elem, n, name, err, errlen)
                : to_float(buf, data, elem, n, name, err, errlen);
    if (rc) {
        free(buf);
        return rc;
    }
    void **slot = dl_golden_slot(&h->f, dl__api_dataset_of(v));
    free(*slot);
    *slot = buf;
    dl_valueset_t bit = DL_VALUE_BIT(v);
    h->bad &= ~bit;
    h->off_grid &= ~bit;
    dl_dtype_t st = dl_value_dtype(&h->f.config, v);
    for (int64_t i = 0; !is_int && st != DL_F32 && i < n; i++)
        if (!dl_on_grid((double)((float *)buf)[i], st)) {
            h->off_grid |= bit;
            break;
        }
    return 0;
}

int dl_api_candidate_load(const dl_api_golden_t *g, const char *path, dl_api_candidate_t **out,
                          char *err, size_t errlen)
{
    return dl_api_candidate_open(g, path, DL_API_PREFLIGHT_SECONDS, out, err, errlen);
}

int dl_api_candidate_open(const dl_api_golden_t *g, const char *path, unsigned timeout_s,
                          dl_api_candidate_t **out, char *err, size_t errlen)
{
    const dl_golden_file_t *gf = dl__api_golden_file(g);
    if (out)
        *out = NULL;
    if (!gf || !out || !path)
        return dl__api_fail(err, errlen, DL_EINVAL, "not a golden handle, or a NULL argument");
    int rc = new_candidate(gf, out, err, errlen);
    if (rc)
        return rc;
    dl_api_candidate_t *h = *out;
    if ((rc = dl_golden_load_isolated(path, &gf->config, timeout_s, &h->f, err, errlen))) {
        free(h);
        *out = NULL;
        return rc;
    }
    for (int i = 0; i < dl_golden_dataset_count() && i < DL_GOLDEN_DATASET_MAX; i++) {
        dl_value_t v;
        if (DL_ROWSET_HAS(h->f.bad_datasets, i) && dl_value_parse(dl_golden_dataset(i)->name, &v) == 0)
            h->bad |= DL_VALUE_BIT(v);
    }
    h->from_file = 1;
    h->tag = DL__API_CANDIDATE;
    return 0;
}

int dl_api_candidate_save(const dl_api_candidate_t *c, const char *path, const char *isolated,
                          int force, char *err, size_t errlen)
{
    const dl_api_candidate_t *h = cand_of(c);
    if (!h || !path)
        return dl__api_fail(err, errlen, DL_EINVAL, "not a candidate handle, or no path");
    dl_golden_file_t f = h->f; /* a shallow copy: the arrays stay the handle's */
    dl_valueset_t have = 0;
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        const void *a = dl_value_array(&f.fwd, &f.bwd, (dl_value_t)s);
        if (a && dl_value_is_backward((dl_value_t)s))
            f.has_backward = 1;
        else if (a)
            f.has_forward = 1;
        have |= a ? DL_VALUE_BIT(s) : 0;
        if ((h->off_grid >> s) & 1)
            return dl__api_fail(err, errlen, DL_EGRID,
                                "%s: values off the %s grid cannot be written: the file stores each "
                                "stage in its storage type", dl_value_name((dl_value_t)s),
                                dl_dtype_name(dl_value_dtype(&f.config, (dl_value_t)s)));
    }
    f.isolated_groups[0] = '\0';
    if (isolated && *isolated) {
        dl_valueset_t groups[DL_VALUE_COUNT];
        int ng = 0, rc = dl__api_groups(isolated, have, groups, &ng, err, errlen);
        if (rc)
            return rc;
        if (dl_check_format_groups(groups, ng, f.isolated_groups, sizeof f.isolated_groups))
            return dl__api_fail(err, errlen, DL_EINVAL, "isolated: the groups do not fit the attribute");
    }
    f.bad_datasets = 0;
    return dl_golden_write_candidate(path, &f, force, err, errlen);
}

void dl_api_candidate_free(dl_api_candidate_t *c)
{
    dl_api_candidate_t *h = cand_of(c);
    if (!h)
        return;
    dl_golden_free(&h->f);
    h->tag = 0;
    free(h);
}
