/* Reading /layouts/NAME groups. The name says the layout:
 * KIND_PARAM (whole) or KIND_PARAM.ranks_R.rank_r (rank r's variant). A
 * golden's must be complete and equal to the stage's layout of its own
 * forward. A candidate's hold any subset at their own extents (the
 * checker compares them with the golden's), bounded so that a hostile
 * shape cannot ask for absurd memory; a dataset of the wrong rank, width
 * or type is set aside (its bit in bad, the reason kept). */
#include "config.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hdf5.h>
#include "golden/golden_priv.h"

typedef struct {
    const char *path;
    char *err;
    size_t errlen;
    int strict;
    char where[96];
} lctx_t;

#define LFAIL(code, ...) DL__GOLDEN_CTX_FAIL(x, code, __VA_ARGS__)

/* "masked_64" or "masked_64.ranks_4.rank_1"; 0 or DL_EFORMAT. */
static int parse_name(const char *name, const dl_moe_config_t *c, dl_layout_t *L)
{
    char spec[64];
    snprintf(spec, sizeof spec, "%s", name);
    char *dot = strchr(spec, '.'), *u;
    if (dot)
        *dot = 0;
    if (!(u = strrchr(spec, '_')))
        return DL_EFORMAT;
    *u = ':';
    long long R = 1, r = -1;
    int used = 0;
    if (dl_layout_parse(spec, &L->kind, &L->param))
        return DL_EFORMAT;
    if (dot && (sscanf(dot + 1, "ranks_%lld.rank_%lld%n", &R, &r, &used) != 2 || dot[1 + used] ||
                R < 1 || r < 0 || r >= R || c->route.experts % R))
        return DL_EFORMAT;
    L->ranks = R;
    L->rank = r;
    L->e0 = r < 0 ? 0 : r * (c->route.experts / R);
    L->e1 = r < 0 ? c->route.experts : L->e0 + c->route.experts / R;
    return 0;
}

static int set_aside(lctx_t *x, dl_layout_t *L, int i, const char *why)
{
    if (x->strict)
        LFAIL(DL_EFORMAT, "%s: %s", dl_layout_dataset_name(i), why);
    if (!L->bad)
        snprintf(L->bad_reason, sizeof L->bad_reason, "%s: %s", dl_layout_dataset_name(i), why);
    L->bad |= UINT32_C(1) << i;
    return 0;
}

/* Reads dataset i of the group into L at its own first extent. */
static int read_one(lctx_t *x, hid_t grp, dl_layout_t *L, int i, int64_t bound)
{
    const char *name = dl_layout_dataset_name(i);
    htri_t ex = H5Lexists(grp, name, H5P_DEFAULT);
    if (ex <= 0)
        return ex < 0 ? DL_EFORMAT : 0;
    hid_t d = H5Dopen2(grp, name, H5P_DEFAULT), sp = d >= 0 ? H5Dget_space(d) : -1;
    hid_t t = d >= 0 ? H5Dget_type(d) : -1;
    int rc = d < 0 || sp < 0 || t < 0 ? set_aside(x, L, i, "not a readable dataset") : 1;
    int64_t want[2];
    const int nd = dl_layout_dataset_shape(L, i, want), fl = dl_layout_dataset_is_float(i);
    hsize_t have[2] = {0, 1};
    if (rc == 1 && (H5Sget_simple_extent_ndims(sp) != nd ||
                    H5Sget_simple_extent_dims(sp, have, NULL) < 0))
        rc = set_aside(x, L, i, "wrong number of dimensions");
    if (rc == 1 && ((nd == 2 && (int64_t)have[1] != want[1]) || (int64_t)have[0] > bound))
        rc = set_aside(x, L, i, nd == 2 && (int64_t)have[1] != want[1] ? "wrong row width"
                                                                        : "implausibly many rows");
    if (rc == 1 && (fl ? H5Tget_class(t) != H5T_FLOAT || H5Tget_size(t) != 4
                       : H5Tget_class(t) != H5T_INTEGER))
        rc = set_aside(x, L, i, fl ? "not float32" : "not an integer type");
    const int64_t n = (int64_t)have[0] * (nd == 2 ? (int64_t)have[1] : 1);
    void *buf = rc == 1 ? calloc(n > 0 ? (size_t)n : 1, 8) : NULL;
    if (rc == 1 && (!buf || (n > 0 && H5Dread(d, fl ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT64,
                                                H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)))
        rc = buf ? set_aside(x, L, i, "unreadable data") : DL_ENOMEM;
    if (rc == 1 && !fl && !dl_layout_dataset_i64(i)) { /* int32 fields */
        const int64_t *v = buf;
        int32_t *w = buf;
        for (int64_t q = 0; q < n && rc == 1; q++)
            if (v[q] < INT32_MIN || v[q] > INT32_MAX)
                rc = set_aside(x, L, i, "a value outside int32");
            else
                w[q] = (int32_t)v[q];
    }
    if (rc == 1) {
        *dl_layout_dataset_slot(L, i) = buf;
        L->len[i] = (int64_t)have[0];
        buf = NULL;
        rc = 0;
    }
    free(buf);
    if (t >= 0)
        H5Tclose(t);
    if (sp >= 0)
        H5Sclose(sp);
    if (d >= 0)
        H5Dclose(d);
    return rc;
}

/* The group's optional int64 attribute "poisoned" (0 when absent). */
static int64_t poisoned(hid_t grp)
{
    int64_t v = 0;
    if (H5Aexists(grp, "poisoned") > 0) {
        hid_t a = H5Aopen(grp, "poisoned", H5P_DEFAULT);
        if (a < 0 || H5Aread(a, H5T_NATIVE_INT64, &v) < 0)
            v = 0;
        if (a >= 0)
            H5Aclose(a);
    }
    return v;
}

/* A golden's layout must be the stage's own of its forward: then it is
 * replaced by that one (which carries x_src and y_src). */
static int same_as_stage(lctx_t *x, dl_golden_file_t *g, dl_layout_t *L)
{
    const dl_moe_config_t *c = &g->config;
    if (!g->has_forward || !g->has_inputs)
        LFAIL(DL_EFORMAT, "a layout needs /inputs and /forward");
    dl_layout_t ref;
    int rc = dl_layout_compute(L->kind, L->param, g->fwd.group_sizes, g->fwd.sort_perm, c->tokens,
                               c->route.top_k, c->route.experts, L->e0, L->e1, &ref);
    if (!rc)
        rc = dl_layout_fill(&ref, g->in.x, g->fwd.x_sorted, g->fwd.y_sorted, c->hidden,
                            L->poisoned);
    if (rc) {
        dl_layout_free(&ref);
        LFAIL(rc == DL_ENOMEM ? rc : DL_EFORMAT, "not a layout of this file's routing (%s)",
              dl_strerror(rc));
    }
    for (int i = 0; i < DL_LAYOUT_DATASET_COUNT && !rc; i++) {
        if (!(dl_layout_dataset_kinds(i) & (1u << L->kind)))
            continue;
        int64_t dims[2];
        const int nd = dl_layout_dataset_shape(&ref, i, dims);
        const int64_t n = dims[0] * (nd == 2 ? dims[1] : 1);
        const size_t es = dl_layout_dataset_i64(i) ? 8 : 4;
        const void *got = *dl_layout_dataset_slot(L, i), *want = *dl_layout_dataset_slot(&ref, i);
        if (!got)
            rc = DL_EFORMAT, dl__golden_msg(x->err, x->errlen, "%s: %s/%s is missing", x->path,
                                            x->where, dl_layout_dataset_name(i));
        else if (L->len[i] != dims[0] || (n > 0 && memcmp(got, want, (size_t)n * es)))
            rc = DL_EFORMAT, dl__golden_msg(x->err, x->errlen, "%s: %s/%s is not the layout of "
                                            "this file's routing", x->path, x->where,
                                            dl_layout_dataset_name(i));
    }
    snprintf(ref.name, sizeof ref.name, "%s", L->name);
    ref.ranks = L->ranks;
    ref.rank = L->rank;
    dl_layout_free(L);
    *L = ref;
    return rc;
}

static int read_group(lctx_t *x, hid_t top, const char *name, dl_golden_file_t *g, dl_layout_t *L)
{
    const dl_moe_config_t *c = &g->config;
    snprintf(x->where, sizeof x->where, "/layouts/%.60s", name);
    memset(L, 0, sizeof *L);
    if (parse_name(name, c, L))
        LFAIL(DL_EFORMAT, "not a layout name KIND_PARAM[.ranks_R.rank_r]");
    snprintf(L->name, sizeof L->name, "%s", name);
    L->tokens = c->tokens;
    L->top_k = c->route.top_k;
    L->experts = c->route.experts;
    L->hidden = c->hidden;
    hid_t grp = H5Gopen2(top, name, H5P_DEFAULT);
    if (grp < 0)
        LFAIL(DL_EFORMAT, "not a group");
    L->poisoned = poisoned(grp) != 0;
    const int64_t M = c->tokens * c->route.top_k;
    const int64_t bound = 4 * (M + c->tokens + 1 + c->route.experts * L->param) + 16;
    int rc = 0;
    for (int i = 0; !rc && i < DL_LAYOUT_DATASET_COUNT; i++)
        if (dl_layout_dataset_kinds(i) & (1u << L->kind))
            rc = read_one(x, grp, L, i, bound);
    H5Gclose(grp);
    if (!rc && x->strict)
        rc = same_as_stage(x, g, L);
    return rc;
}

int dl__golden_layouts_read(int64_t file, dl_golden_file_t *g, int strict, const char *path,
                            char *err, size_t errlen)
{
    lctx_t xx = {path, err, errlen, strict, "/layouts"}, *x = &xx;
    hid_t top;
    uint64_t nl;
    int ex = dl__h5_group_members(file, "layouts", &top, &nl);
    if (ex < 0)
        LFAIL(DL_EFORMAT, ex == -1 ? "cannot look it up" : "not a group");
    if (ex == 0)
        return 0;
    int rc = nl > 4096 ? DL_EFORMAT : 0;
    if (rc)
        dl__golden_msg(err, errlen, "%s: /layouts: more than 4096 groups", path);
    if (!rc && !(g->layouts = calloc(nl ? (size_t)nl : 1, sizeof *g->layouts)))
        rc = DL_ENOMEM;
    for (uint64_t i = 0; !rc && i < nl; i++) {
        char name[64];
        if (dl__h5_member_name(top, i, name, sizeof name)) {
            dl__golden_msg(err, errlen, "%s: /layouts: a member with an unreadable or long name", path);
            rc = DL_EFORMAT;
            break;
        }
        rc = read_group(x, top, name, g, &g->layouts[g->n_layouts]);
        g->n_layouts++;
    }
    H5Gclose(top);
    return rc;
}
