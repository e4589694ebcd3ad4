/* The kernel layout groups /layouts/NAME of golden files (doc/format.md,
 * "Kernel layouts"): computed by the stage dl_layout_compute from the
 * file's own group_sizes and sort_perm, filled from its x, x_sorted and
 * y_sorted (dl_layout_fill), written after every other group so that a
 * file without them keeps its bytes. */
#include "config.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hdf5.h>
#include "golden/golden_priv.h"

int dl__golden_layouts_check(const dl_moe_config_t *c, const dl_golden_gen_opts_t *o,
                             const char *name, char *err, size_t errlen)
{
    if (!o || o->n_layouts <= 0)
        return 0;
    (void)c;
    if (o->n_layouts > DL_GOLDEN_LAYOUT_MAX) {
        dl__golden_msg(err, errlen, "case %s: at most %d layouts", name, DL_GOLDEN_LAYOUT_MAX);
        return DL_EINVAL;
    }
    for (int i = 0; i < o->n_layouts; i++)
        if (!dl_layout_kind_name(o->layout_kind[i]) || o->layout_param[i] < 1) {
            dl__golden_msg(err, errlen, "case %s: layout %d is not a valid layout", name, i);
            return DL_EINVAL;
        }
    if (o->stream || o->expert_end > 0) {
        dl__golden_msg(err, errlen, "case %s: --layout needs the in-memory generator (not "
                       "--stream, --experts or a case too large for memory)", name);
        return DL_EINVAL;
    }
    return 0;
}

/* The group name: "masked_64", or "masked_64.ranks_4.rank_1". */
static void group_name(dl_layout_t *L)
{
    int n = snprintf(L->name, sizeof L->name, "%s_%" PRId64, dl_layout_kind_name(L->kind), L->param);
    if (L->rank >= 0 && n > 0 && (size_t)n < sizeof L->name)
        snprintf(L->name + n, sizeof L->name - (size_t)n, ".ranks_%" PRId64 ".rank_%" PRId64,
                 L->ranks, L->rank);
}

/* One layout of g's forward over the experts of rank r of R (r = -1:
 * whole), filled; a group beyond a fixed capacity is named. */
static int one(dl_golden_file_t *g, int kind, int64_t param, int64_t R, int64_t r, int poison,
               dl_layout_t *L, char *err, size_t errlen)
{
    const dl_moe_config_t *c = &g->config;
    const int64_t E = c->route.experts, per = E / R;
    const int64_t e0 = r < 0 ? 0 : r * per, e1 = r < 0 ? E : e0 + per;
    int rc = dl_layout_compute(kind, param, g->fwd.group_sizes, g->fwd.sort_perm, c->tokens,
                               c->route.top_k, E, e0, e1, L);
    if (rc == DL_ERANGE) {
        int64_t big = e0;
        for (int64_t e = e0; e < e1; e++)
            big = g->fwd.group_sizes[e] > g->fwd.group_sizes[big] ? e : big;
        dl__golden_msg(err, errlen, "case %s: --layout %s:%" PRId64 ": expert %" PRId64
                       " has %" PRId64 " rows, more than %s = %" PRId64, g->case_name,
                       dl_layout_kind_name(kind), param, big, g->fwd.group_sizes[big],
                       dl_layout_param_name(kind), param);
        return DL_EINVAL;
    }
    if (!rc)
        rc = dl_layout_fill(L, g->in.x, g->fwd.x_sorted, g->fwd.y_sorted, c->hidden, poison);
    if (rc) {
        dl__golden_msg(err, errlen, "case %s: layout %s:%" PRId64 ": %s", g->case_name,
                       dl_layout_kind_name(kind), param, dl_strerror(rc));
        return rc;
    }
    L->ranks = r < 0 ? 1 : R;
    L->rank = r;
    group_name(L);
    return 0;
}

int dl__golden_layouts_build(dl_golden_file_t *g, const dl_golden_gen_opts_t *o, char *err,
                             size_t errlen)
{
    if (!o || o->n_layouts <= 0)
        return 0;
    if (!g->fwd.group_sizes || !g->fwd.sort_perm || !g->fwd.y_sorted || !g->fwd.x_sorted || !g->in.x)
        return DL_EINVAL;
    int64_t total = 1;
    for (int i = 0; i < o->n_ep_ranks; i++)
        total += o->ep_ranks[i];
    total *= o->n_layouts;
    free(g->layouts);
    if (!(g->layouts = calloc((size_t)total, sizeof *g->layouts)))
        return DL_ENOMEM;
    g->n_layouts = 0;
    for (int i = 0; i < o->n_layouts; i++) {
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= o->layout_kind[j] == o->layout_kind[i] && o->layout_param[j] == o->layout_param[i];
        if (dup)
            continue;
        int rc = one(g, o->layout_kind[i], o->layout_param[i], 1, -1, o->layout_poison,
                     &g->layouts[g->n_layouts++], err, errlen);
        for (int e = 0; !rc && e < g->n_ep; e++) /* ascending R, as /ep */
            for (int64_t r = 0; !rc && r < g->ep[e].ranks; r++)
                rc = one(g, o->layout_kind[i], o->layout_param[i], g->ep[e].ranks, r,
                         o->layout_poison, &g->layouts[g->n_layouts++], err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* ----------------------------------------------------------------- write */

static int write_one(hid_t grp, hid_t dcpl, const dl_layout_t *L, int i, const char *act)
{
    const void *data = *dl_layout_dataset_slot((dl_layout_t *)L, i);
    if (!data)
        return 0;
    int64_t dims[2];
    int nd = dl_layout_dataset_shape(L, i, dims);
    hsize_t hd[2] = {(hsize_t)dims[0], nd == 2 ? (hsize_t)dims[1] : 1};
    const int fl = dl_layout_dataset_is_float(i), i64 = dl_layout_dataset_i64(i);
    hid_t ft = fl ? H5T_IEEE_F32LE : i64 ? H5T_STD_I64LE : H5T_STD_I32LE;
    hid_t mt = fl ? H5T_NATIVE_FLOAT : i64 ? H5T_NATIVE_INT64 : H5T_NATIVE_INT32;
    hid_t sp = H5Screate_simple(nd, hd, NULL), d = -1;
    int ok = sp >= 0 && (d = H5Dcreate2(grp, dl_layout_dataset_name(i), ft, sp, H5P_DEFAULT, dcpl,
                                        H5P_DEFAULT)) >= 0;
    if (ok && hd[0] * hd[1] > 0)
        ok = H5Dwrite(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    ok = ok && dl__golden_attr_put(d, "dtype", fl ? act : i64 ? "int64" : "int32", 0) == 0;
    if (d >= 0 && H5Dclose(d) < 0)
        ok = 0;
    if (sp >= 0 && H5Sclose(sp) < 0)
        ok = 0;
    return ok ? 0 : DL_EIO;
}

/* The group's attributes: what the layout is and which experts it holds. */
static int write_attrs(hid_t grp, const dl_layout_t *L)
{
    const int64_t v[] = {L->param, L->ranks, L->rank, L->e0, L->e1, L->poisoned, L->expected_m};
    const char *n[] = {"param", "ranks", "rank", "expert_begin", "expert_end", "poisoned",
                       "expected_m"};
    int rc = dl__golden_attr_put(grp, "kind", dl_layout_kind_name(L->kind), 0) ||
             dl__golden_attr_put(grp, "contract", dl_layout_contract(L->kind) == DL_LAYOUT_ZERO
                                 ? "zero" : "untouched", 0);
    for (int i = 0; !rc && i < (int)(sizeof v / sizeof v[0]); i++)
        if (i < 6 || L->kind == DL_LAYOUT_MASKED)
            rc = dl__golden_attr_put(grp, n[i], NULL, v[i]);
    return rc ? DL_EIO : 0;
}

int dl__golden_layouts_write(int64_t file, int64_t gcpl, int64_t dcpl, const dl_golden_file_t *g,
                             const char *path, char *err, size_t errlen)
{
    if (g->n_layouts <= 0)
        return 0;
    hid_t top = H5Gcreate2(file, "layouts", H5P_DEFAULT, gcpl, H5P_DEFAULT);
    int rc = top < 0 ? DL_EIO : 0;
    const char *act = dl_dtype_name(g->config.dtype);
    for (int e = 0; !rc && e < g->n_layouts; e++) {
        const dl_layout_t *L = &g->layouts[e];
        hid_t grp = H5Gcreate2(top, L->name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
        rc = grp < 0 ? DL_EIO : write_attrs(grp, L);
        for (int i = 0; !rc && i < DL_LAYOUT_DATASET_COUNT; i++)
            rc = write_one(grp, dcpl, L, i, act);
        if (grp >= 0 && H5Gclose(grp) < 0)
            rc = DL_EIO;
        if (rc)
            dl__golden_msg(err, errlen, "%s: HDF5 error: writing /layouts/%s", path, L->name);
    }
    if (top >= 0 && H5Gclose(top) < 0 && !rc) {
        dl__golden_msg(err, errlen, "%s: HDF5 error: closing /layouts", path);
        rc = DL_EIO;
    }
    if (top < 0)
        dl__golden_msg(err, errlen, "%s: HDF5 error: creating /layouts", path);
    return rc;
}
