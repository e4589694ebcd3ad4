/* The expert-parallel layout groups /ep/ranks_R of golden and candidate
 * files (doc/format.md, "Expert parallelism"): computed by the stage
 * dl_ep_layout from the file's own topk_ids, written after the other
 * groups (so a file without them keeps its bytes), read back strictly
 * (a golden's must equal the stage's layout of its routing) or as a
 * candidate's (any subset, a rank's view, shapes of its own). */
#include "config.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hdf5.h>
#include "golden/golden_priv.h"

int dl__golden_ep_check_ranks(const dl_moe_config_t *c, const dl_golden_gen_opts_t *o,
                              const char *name, char *err, size_t errlen)
{
    if (!o || o->n_ep_ranks <= 0)
        return 0;
    const int64_t E = c->route.experts;
    if (o->n_ep_ranks > DL_GOLDEN_EP_MAX) {
        dl__golden_msg(err, errlen, "case %s: at most %d expert-parallel rank counts", name,
                       DL_GOLDEN_EP_MAX);
        return DL_EINVAL;
    }
    for (int i = 0; i < o->n_ep_ranks; i++)
        if (o->ep_ranks[i] < 1 || E % o->ep_ranks[i]) {
            dl__golden_msg(err, errlen,
                           "case %s: --ep-ranks %" PRId64 " does not divide the %" PRId64
                           " experts (each rank owns E/R of them)",
                           name, o->ep_ranks[i], E);
            return DL_EINVAL;
        }
    return 0;
}

int dl__golden_ep_layouts(const dl_moe_config_t *c, const int32_t *ids, const float *w,
                          const dl_golden_gen_opts_t *o, dl_golden_file_t *g)
{
    int64_t rs[DL_GOLDEN_EP_MAX];
    int n = 0;
    for (int i = 0; o && i < o->n_ep_ranks && i < DL_GOLDEN_EP_MAX; i++) {
        int dup = 0;
        for (int j = 0; j < n; j++)
            dup |= rs[j] == o->ep_ranks[i];
        if (!dup)
            rs[n++] = o->ep_ranks[i];
    }
    for (int i = 1; i < n; i++) /* ascending: the file does not depend on the option's order */
        for (int j = i; j > 0 && rs[j - 1] > rs[j]; j--) {
            int64_t x = rs[j];
            rs[j] = rs[j - 1];
            rs[j - 1] = x;
        }
    for (int i = 0; i < n; i++) {
        int rc = dl_ep_layout(ids, w, c->tokens, c->route.top_k, c->route.experts, rs[i], &g->ep[i]);
        if (rc)
            return rc;
        g->n_ep = i + 1;
    }
    return 0;
}

int dl_golden_add_ep_layouts(dl_golden_file_t *g, const dl_golden_gen_opts_t *opts, char *err,
                             size_t errlen)
{
    if (!g || !opts || !g->fwd.topk_ids || !g->fwd.topk_weights || g->n_ep)
        return DL_EINVAL;
    int rc = dl__golden_ep_check_ranks(&g->config, opts, g->case_name, err, errlen);
    if (!rc && (rc = dl__golden_ep_layouts(&g->config, g->fwd.topk_ids, g->fwd.topk_weights, opts, g)))
        dl__golden_msg(err, errlen, "case %s: expert-parallel layout: %s", g->case_name,
                       dl_strerror(rc));
    return rc;
}

/* ----------------------------------------------------------------- write */

static hid_t file_type(int elem)
{
    return elem == DL_EP_I64 ? H5T_STD_I64LE : elem == DL_EP_I32 ? H5T_STD_I32LE
           : elem == DL_EP_BOOL ? H5T_STD_U8LE : H5T_IEEE_F32LE;
}

static hid_t mem_type(int elem)
{
    return elem == DL_EP_I64 ? H5T_NATIVE_INT64 : elem == DL_EP_I32 ? H5T_NATIVE_INT32
           : elem == DL_EP_BOOL ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT;
}

static const char *dtype_attr(int elem)
{
    return elem == DL_EP_I64 ? "int64" : elem == DL_EP_I32 ? "int32"
           : elem == DL_EP_BOOL ? "bool" : "fp32";
}

static int write_one(hid_t grp, hid_t dcpl, const dl_ep_layout_t *L, int i)
{
    const void *data = *dl_ep_slot((dl_ep_layout_t *)L, i);
    if (!data)
        return 0;
    int64_t dims[2];
    int nd = dl_ep_dataset_shape(L, i, dims);
    hsize_t hd[2] = {(hsize_t)dims[0], nd == 2 ? (hsize_t)dims[1] : 1};
    const int elem = dl_ep_dataset_elem(i);
    hid_t sp = H5Screate_simple(nd, hd, NULL), d = -1;
    int ok = sp >= 0 && (d = H5Dcreate2(grp, dl_ep_dataset_name(i), file_type(elem), sp,
                                        H5P_DEFAULT, dcpl, H5P_DEFAULT)) >= 0;
    if (ok && hd[0] * hd[1] > 0)
        ok = H5Dwrite(d, mem_type(elem), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    ok = ok && dl__golden_attr_put(d, "dtype", dtype_attr(elem), 0) == 0;
    if (d >= 0 && H5Dclose(d) < 0)
        ok = 0;
    if (sp >= 0 && H5Sclose(sp) < 0)
        ok = 0;
    return ok ? 0 : DL_EIO;
}

int dl__golden_ep_write(int64_t file, int64_t gcpl, int64_t dcpl, const dl_golden_file_t *g,
                        const char *path, char *err, size_t errlen)
{
    if (g->n_ep <= 0)
        return 0;
    hid_t top = H5Gcreate2(file, "ep", H5P_DEFAULT, gcpl, H5P_DEFAULT);
    int rc = top < 0 ? DL_EIO : 0;
    for (int e = 0; !rc && e < g->n_ep; e++) {
        const dl_ep_layout_t *L = &g->ep[e];
        char name[48];
        snprintf(name, sizeof name, "ranks_%" PRId64, L->ranks);
        hid_t grp = H5Gcreate2(top, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
        rc = grp < 0 || dl__golden_attr_put(grp, "ranks", NULL, L->ranks) ||
                     dl__golden_attr_put(grp, "experts_per_rank", NULL, L->experts / L->ranks) ||
                     (L->rank >= 0 && dl__golden_attr_put(grp, "rank", NULL, L->rank))
                 ? DL_EIO : 0;
        for (int i = 0; !rc && i < DL_EP_DATASET_COUNT; i++)
            rc = write_one(grp, dcpl, L, i);
        if (grp >= 0 && H5Gclose(grp) < 0)
            rc = DL_EIO;
        if (rc)
            dl__golden_msg(err, errlen, "%s: HDF5 error: writing /ep/%s", path, name);
    }
    if (top >= 0 && H5Gclose(top) < 0 && !rc) {
        dl__golden_msg(err, errlen, "%s: HDF5 error: closing /ep", path);
        rc = DL_EIO;
    }
    if (top < 0)
        dl__golden_msg(err, errlen, "%s: HDF5 error: creating /ep", path);
    return rc;
}
