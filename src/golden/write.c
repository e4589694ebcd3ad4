/* Writing golden files, byte-reproducibly: object timestamps off, fixed
 * library-version bounds, contiguous layout, a fixed write order (the
 * dataset table's), no float conversion by HDF5 (file and memory types are
 * both IEEE binary32). Written to a temporary name and then linked or
 * renamed into place (src/core/outfile.c), so a reader never sees a
 * partial file. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hdf5.h>
#include "golden/golden_priv.h"
#include "dropless/quant.h"

typedef struct {
    const char *path;
    char *err;
    size_t errlen;
    hid_t gcpl, dcpl;
    int candidate; /* write only the arrays present, plus the backend's attributes */
    const dl__golden_source_t *src; /* datasets produced piece by piece (stream.c), or NULL */
} wctx_t;

/* One open dataset that a source fills by rows (dl__golden_sink_put). */
struct dl__golden_sink {
    wctx_t *w;
    const dl_golden_dataset_t *ds;
    hid_t d, mt;
    int rank;
    hsize_t dims[3];
    int64_t written; /* rows so far, in order */
};

/* HDF5 does not say why a write failed; the system's errno still does
 * when it is one a write sets (a full disk, a file-size limit). */
static const char *os_cause(void)
{
    static _Thread_local char buf[96];
    int e = errno;
    if (e != ENOSPC && e != EFBIG && e != EDQUOT && e != EIO)
        return "";
    snprintf(buf, sizeof buf, " (%s)", strerror(e));
    return buf;
}

#define H5TRY(expr, ...)                                                           \
    do {                                                                           \
        if ((expr) < 0) {                                                          \
            char m_[200];                                                          \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                  \
            dl__golden_msg(w->err, w->errlen, "%s: HDF5 error: %s%s", w->path, m_, \
                           os_cause());                                            \
            goto fail;                                                             \
        }                                                                          \
    } while (0)

/* Closes an HDF5 object on the way out; a failure turns success into DL_EIO. */
#define CLOSE(fn, id)                                                               \
    do {                                                                            \
        if ((id) >= 0 && fn(id) < 0 && rc >= 0) {                                   \
            dl__golden_msg(w->err, w->errlen, "%s: HDF5 error: " #fn " failed", w->path); \
            rc = DL_EIO;                                                            \
        }                                                                           \
    } while (0)

static int attr_write(wctx_t *w, hid_t obj, const char *name, hid_t ftype, hid_t mtype,
                      const void *val)
{
    hid_t sp = -1, a = -1;
    int rc = DL_EIO;
    H5TRY(sp = H5Screate(H5S_SCALAR), "scalar dataspace for attribute %s", name);
    H5TRY(a = H5Acreate2(obj, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT),
          "creating attribute %s", name);
    H5TRY(H5Awrite(a, mtype, val), "writing attribute %s", name);
    rc = 0;
fail:
    if (a >= 0 && H5Aclose(a) < 0 && rc == 0) {
        dl__golden_msg(w->err, w->errlen, "%s: HDF5 error: closing attribute %s", w->path, name);
        rc = DL_EIO;
    }
    CLOSE(H5Sclose, sp);
    return rc;
}

/* Strings are fixed-length ASCII (NUL-padded, no terminator). Variable-
 * length strings would live in a global heap, whose parser in HDF5 1.10
 * crashes on damaged files; fixed-length ones sit in the object header. */
static int attr_str(wctx_t *w, hid_t obj, const char *name, const char *val)
{
    hid_t st = -1;
    int rc = DL_EIO;
    size_t len = strlen(val);
    H5TRY(st = H5Tcopy(H5T_C_S1), "string type");
    H5TRY(H5Tset_size(st, len ? len : 1), "string type");
    H5TRY(H5Tset_strpad(st, H5T_STR_NULLPAD), "string type");
    H5TRY(H5Tset_cset(st, H5T_CSET_ASCII), "string type");
    /* the type holds max(len, 1) bytes; val has len + 1 of them */
    rc = attr_write(w, obj, name, st, st, val);
fail:
    CLOSE(H5Tclose, st);
    return rc;
}

static int attr_i64(wctx_t *w, hid_t obj, const char *name, int64_t v)
{
    return attr_write(w, obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}

static int write_dataset(wctx_t *w, hid_t grp, const dl_golden_dataset_t *ds,
                         const dl_moe_config_t *c, const void *data)
{
    hid_t sp = -1, d = -1;
    int rc = DL_EIO;
    int64_t dims[3];
    hsize_t hd[3];
    int64_t n = w->src ? w->src->shape(w->src->ctx, ds, dims) : dl_golden_dataset_shape(ds, c, dims);
    if (n < 0) {
        dl__golden_msg(w->err, w->errlen, "%s: %s: size overflows", w->path, ds->path);
        return DL_EOVERFLOW;
    }
    for (int i = 0; i < ds->rank; i++)
        hd[i] = (hsize_t)dims[i];
    hid_t ft = ds->elem == DL_GOLDEN_FLOAT ? H5T_IEEE_F32LE
               : ds->elem == DL_GOLDEN_INT32 ? H5T_STD_I32LE : H5T_STD_I64LE;
    hid_t mt = ds->elem == DL_GOLDEN_FLOAT ? H5T_NATIVE_FLOAT
               : ds->elem == DL_GOLDEN_INT32 ? H5T_NATIVE_INT32 : H5T_NATIVE_INT64;
    H5TRY(sp = H5Screate_simple(ds->rank, hd, NULL), "dataspace of %s", ds->path);
    H5TRY(d = H5Dcreate2(grp, ds->name, ft, sp, H5P_DEFAULT, w->dcpl, H5P_DEFAULT),
          "creating %s", ds->path);
    if (w->src) {
        struct dl__golden_sink sink = {w, ds, d, mt, ds->rank, {hd[0], hd[1], hd[2]}, 0};
        if ((rc = w->src->produce(w->src->ctx, ds, &sink)))
            goto fail;
        rc = DL_EIO;
        if (sink.written != (int64_t)hd[0] && n > 0) {
            dl__golden_msg(w->err, w->errlen, "%s: %s: %lld of %lld rows produced", w->path,
                           ds->path, (long long)sink.written, (long long)hd[0]);
            rc = DL_EINTERNAL;
            goto fail;
        }
    } else if (n > 0)
        H5TRY(H5Dwrite(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "writing %s", ds->path);
    const char *tn = ds->elem == DL_GOLDEN_INT32   ? "int32"
                     : ds->elem == DL_GOLDEN_INT64 ? "int64"
                                                   : dl_dtype_name(dl_golden_dataset_dtype(ds, c));
    if ((rc = attr_str(w, d, "dtype", tn)))
        goto fail;
    rc = DL_EIO;
    H5TRY(H5Dclose(d), "closing %s", ds->path);
    d = -1;
    rc = 0;
fail:
    CLOSE(H5Dclose, d);
    CLOSE(H5Sclose, sp);
    return rc;
}

int dl__golden_sink_put(dl__golden_sink_t *s, int64_t row0, int64_t nrows, const void *data)
{
    wctx_t *w = s->w;
    const dl_golden_dataset_t *ds = s->ds;
    hid_t fs = -1, ms = -1;
    int rc = DL_EIO;
    if (row0 != s->written || nrows < 0 || (hsize_t)(row0 + nrows) > s->dims[0]) {
        dl__golden_msg(w->err, w->errlen, "%s: %s: rows %lld+%lld out of order", w->path,
                       ds->path, (long long)row0, (long long)nrows);
        return DL_EINTERNAL;
    }
    hsize_t start[3] = {(hsize_t)row0, 0, 0}, count[3] = {(hsize_t)nrows, s->dims[1], s->dims[2]};
    int64_t rest = 1;
    for (int i = 1; i < s->rank; i++)
        rest *= (int64_t)s->dims[i];
    s->written += nrows;
    if (nrows == 0 || rest == 0)
        return 0;
    H5TRY(fs = H5Dget_space(s->d), "dataspace of %s", ds->path);
    H5TRY(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL), "selecting rows of %s",
          ds->path);
    H5TRY(ms = H5Screate_simple(s->rank, count, NULL), "dataspace of %s", ds->path);
    H5TRY(H5Dwrite(s->d, s->mt, ms, fs, H5P_DEFAULT, data), "writing %s", ds->path);
    rc = 0;
fail:
    CLOSE(H5Sclose, ms);
    CLOSE(H5Sclose, fs);
    return rc;
}

static int write_config(wctx_t *w, hid_t file, const dl_moe_config_t *c)
{
    hid_t g = -1;
    int rc = DL_EIO;
    const dl_route_config_t *r = &c->route;
    H5TRY(g = H5Gcreate2(file, "config", H5P_DEFAULT, w->gcpl, H5P_DEFAULT), "creating /config");
    if ((rc = attr_i64(w, g, "tokens", c->tokens)) || (rc = attr_i64(w, g, "hidden", c->hidden)) ||
        (rc = attr_i64(w, g, "ffn", c->ffn)) || (rc = attr_i64(w, g, "experts", r->experts)) ||
        (rc = attr_i64(w, g, "top_k", r->top_k)) ||
        (rc = attr_str(w, g, "score_function", dl__golden_score_name(r->score_fn))) ||
        (rc = attr_i64(w, g, "n_group", r->n_group)) ||
        (rc = attr_i64(w, g, "topk_group", r->topk_group)) ||
        (rc = attr_str(w, g, "group_score", dl__golden_group_name(r->group_score))) ||
        (rc = attr_i64(w, g, "renormalize", r->renormalize != 0)) ||
        (rc = attr_write(w, g, "scaling", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &r->scaling)) ||
        (rc = attr_i64(w, g, "has_bias", r->has_bias != 0)) ||
        (rc = attr_str(w, g, "ffn_kind", dl__golden_ffn_name(c->ffn_kind))) ||
        (rc = attr_str(w, g, "dtype", dl_dtype_name(c->dtype))) ||
        (r->has_router_bias && (rc = attr_i64(w, g, "has_router_bias", 1))) || /* only when set */
        (r->weight_on_input && (rc = attr_i64(w, g, "weight_on_input", 1))) ||
        (r->hash_vocab > 0 && (rc = attr_i64(w, g, "hash_vocab", r->hash_vocab))) ||
        (r->zero_experts > 0 && (rc = attr_i64(w, g, "zero_experts", r->zero_experts))))
        goto fail;
    /* only a layer recipe's case has the attribute: other goldens keep their bytes */
    if (c->lowp && (rc = attr_str(w, g, "lowp", dl_lowp_layer(c->lowp)->name)))
        goto fail;
    /* the shared experts' keys only where there are shared experts: every
     * other case's /config (and bytes) stay as they were */
    if (c->shared_experts > 0 &&
        ((rc = attr_i64(w, g, "shared_experts", c->shared_experts)) ||
         (rc = attr_i64(w, g, "shared_ffn", c->shared_ffn)) ||
         (rc = attr_i64(w, g, "shared_gate", c->shared_gate != 0))))
        goto fail;
    /* the variants' attributes only where a case uses them */
    if (c->ffn_kind == DL_FFN_SWIGLU_CLAMP &&
        ((rc = attr_write(w, g, "act_alpha", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &c->act_alpha)) ||
         (rc = attr_write(w, g, "act_limit", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &c->act_limit))))
        goto fail;
    if (c->router_dtype != DL_F32 &&
        (rc = attr_str(w, g, "router_dtype", dl_dtype_name(c->router_dtype))))
        goto fail;
    if (c->ffn_bias && (rc = attr_i64(w, g, "ffn_bias", 1)))
        goto fail;
    rc = DL_EIO;
    H5TRY(H5Gclose(g), "closing /config");
    return 0;
fail:
    if (g >= 0)
        H5Gclose(g);
    return rc;
}

static const char *const group_names[] = {"inputs", "forward", "backward"};

/* The root attributes and /config; candidates' backend attributes, a
 * slice's expert range. */
static int write_root(wctx_t *w, hid_t file, const dl_golden_file_t *g)
{
    int rc;
    char gen[64];
    snprintf(gen, sizeof gen, "dropless %s", DL_VERSION_STRING);
    if ((rc = attr_str(w, file, "format", DL_GOLDEN_FORMAT)) ||
        (rc = attr_i64(w, file, "format_version", DL_GOLDEN_FORMAT_VERSION)) ||
        (rc = attr_str(w, file, "generator", gen)) ||
        (rc = attr_str(w, file, "case", g->case_name)) ||
        (rc = attr_write(w, file, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &g->seed)) ||
        (rc = write_config(w, file, &g->config)))
        return rc;
    if (w->src && w->src->expert_end > 0 &&
        ((rc = attr_i64(w, file, "expert_begin", w->src->expert_begin)) ||
         (rc = attr_i64(w, file, "expert_end", w->src->expert_end))))
        return rc;
    if (w->candidate && ((g->backend[0] && (rc = attr_str(w, file, "backend", g->backend))) ||
                         (g->compute_mode[0] &&
                          (rc = attr_str(w, file, "compute_mode", g->compute_mode))) ||
                         (g->backend_version[0] &&
                          (rc = attr_str(w, file, "backend_version", g->backend_version))) ||
                         (g->device[0] && (rc = attr_str(w, file, "device", g->device))) ||
                         (g->isolated_groups[0] &&
                          (rc = attr_str(w, file, "isolated_groups", g->isolated_groups)))))
        return rc;
    return 0;
}

/* The whole file into an HDF5 file at tmp. */
static int write_h5(wctx_t *w, const char *tmp, int fd, const dl_golden_file_t *g,
                    dl_golden_progress_fn progress, void *pctx)
{
    hid_t fcpl = -1, fapl = -1, file = -1, grp = -1;
    int rc = DL_EIO;
    w->gcpl = w->dcpl = -1;
    errno = 0; /* os_cause() must not blame an earlier call */
    H5TRY(fcpl = H5Pcreate(H5P_FILE_CREATE), "property list");
    H5TRY(H5Pset_obj_track_times(fcpl, 0), "property list"); /* the root group */
    H5TRY(H5Pset_userblock(fcpl, DL__GOLDEN_USERBLOCK), "user block");
    H5TRY(fapl = H5Pcreate(H5P_FILE_ACCESS), "property list");
    H5TRY(H5Pset_libver_bounds(fapl, H5F_LIBVER_EARLIEST, H5F_LIBVER_V18), "libver bounds");
    H5TRY(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG), "property list");
    H5TRY(w->gcpl = H5Pcreate(H5P_GROUP_CREATE), "property list");
    H5TRY(H5Pset_obj_track_times(w->gcpl, 0), "property list");
    H5TRY(w->dcpl = H5Pcreate(H5P_DATASET_CREATE), "property list");
    H5TRY(H5Pset_obj_track_times(w->dcpl, 0), "property list");
    H5TRY(H5Pset_layout(w->dcpl, H5D_CONTIGUOUS), "property list");
    H5TRY(H5Pset_fill_time(w->dcpl, H5D_FILL_TIME_NEVER), "property list");
    H5TRY(file = H5Fcreate(tmp, H5F_ACC_TRUNC, fcpl, fapl), "creating %s", tmp);
    /* HDF5 never writes the user block: it says "incomplete" until sealed */
    if ((rc = dl__golden_mark_incomplete(fd, w->err, w->errlen, w->path)))
        goto fail;

    if ((rc = write_root(w, file, g)))
        goto fail;

    int has[3] = {g->has_inputs, g->has_forward, g->has_backward};
    int nds = dl_golden_dataset_count(), done = 0, todo = 0;
    for (int i = 0; i < nds; i++)
        todo += has[dl_golden_dataset(i)->group] != 0;
    int cur = -1;
    for (int i = 0; i < nds; i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        if (!has[ds->group])
            continue;
        if ((int)ds->group != cur) {
            rc = DL_EIO;
            if (grp >= 0) {
                H5TRY(H5Gclose(grp), "closing a group");
                grp = -1;
            }
            cur = ds->group;
            H5TRY(grp = H5Gcreate2(file, group_names[cur], H5P_DEFAULT, w->gcpl, H5P_DEFAULT),
                  "creating /%s", group_names[cur]);
        }
        int64_t sdims[3];
        if (w->src && (!dl_golden_dataset_applies(ds, &g->config) ||
                       w->src->shape(w->src->ctx, ds, sdims) < 0)) {
            /* left out of this file (a slice) */
        } else if (w->src) {
            if ((rc = write_dataset(w, grp, ds, &g->config, NULL)))
                goto fail;
        } else if (dl_golden_dataset_applies(ds, &g->config)) {
            void **slot = dl_golden_slot((dl_golden_file_t *)g, ds);
            if (!*slot && w->candidate) {
                /* a stage the backend did not produce */
            } else if (!*slot) {
                dl__golden_msg(w->err, w->errlen, "%s: %s: no data to write", w->path, ds->path);
                rc = DL_EINVAL;
                goto fail;
            }
            else if ((rc = write_dataset(w, grp, ds, &g->config, *slot)))
                goto fail;
        }
        if (progress)
            progress(pctx, "write", (double)++done / (double)(todo ? todo : 1));
    }
    rc = DL_EIO;
    if (grp >= 0) {
        H5TRY(H5Gclose(grp), "closing a group");
        grp = -1;
    }
    /* last, so that a file without layouts keeps its bytes */
    if ((rc = dl__golden_ep_write(file, w->gcpl, w->dcpl, g, w->path, w->err, w->errlen)) ||
        (rc = dl__golden_layouts_write(file, w->gcpl, w->dcpl, g, w->path, w->err, w->errlen)))
        goto fail;
    rc = DL_EIO;
    H5TRY(H5Fclose(file), "closing %s", tmp);
    file = -1;
    rc = 0;
fail:
    if (grp >= 0)
        H5Gclose(grp);
    if (file >= 0)
        H5Fclose(file);
    CLOSE(H5Pclose, w->dcpl);
    CLOSE(H5Pclose, w->gcpl);
    CLOSE(H5Pclose, fapl);
    CLOSE(H5Pclose, fcpl);
    return rc;
}

/* HDF5 would print its error stack to stderr; errors are reported as one
 * line each instead. The caller's handler is restored afterwards. */
static int valid_for_write(const dl_golden_file_t *g, int candidate, char *why, size_t n)
{
    if (dl__golden_config_check(&g->config, why, n))
        return DL_EINVAL;
    if (!g->has_inputs && !candidate) {
        dl__golden_msg(why, n, "a golden file needs its inputs");
        return DL_EINVAL;
    }
    size_t len = strlen(g->case_name);
    if (len == 0 || len > DL_GOLDEN_NAME_MAX) {
        dl__golden_msg(why, n, "the case name must have 1 to %d characters", DL_GOLDEN_NAME_MAX);
        return DL_EINVAL;
    }
    return 0;
}

static int write_file(const char *path, const dl_golden_file_t *g, int force, int candidate,
                      const dl__golden_source_t *src, dl_golden_progress_fn progress, void *pctx,
                      char *err, size_t errlen)
{
    if (!path || !g)
        return DL_EINVAL;
    char why[200];
    int rc = *path ? valid_for_write(g, candidate, why, sizeof why) : 0;
    if (rc) {
        dl__golden_msg(err, errlen, "%s: %s", path, why);
        return rc;
    }
    dl__outfile_t o;
    if ((rc = dl__out_begin(&o, path, force, err, errlen)))
        return rc;
    wctx_t w = {path, err, errlen, -1, -1, candidate, src};
    dl__h5_quiet_t q;
    dl__h5_quiet_on(&q);
    rc = write_h5(&w, o.tmp, o.fd, g, progress, pctx);
    dl__h5_quiet_off(&q);
    if (rc == 0)
        rc = dl_golden_seal(o.tmp, err, errlen);
    if (rc) {
        dl__out_abort(&o);
        return rc;
    }
    return dl__out_commit(&o, force, err, errlen);
}

int dl_golden_write(const char *path, const dl_golden_file_t *g, int force,
                    dl_golden_progress_fn progress, void *pctx, char *err, size_t errlen)
{
    return write_file(path, g, force, 0, NULL, progress, pctx, err, errlen);
}

int dl__golden_write_source(const char *path, const dl_golden_file_t *hdr,
                            const dl__golden_source_t *src, int force,
                            dl_golden_progress_fn progress, void *pctx, char *err, size_t errlen)
{
    return write_file(path, hdr, force, 0, src, progress, pctx, err, errlen);
}

int dl_golden_write_candidate(const char *path, const dl_golden_file_t *g, int force,
                              char *err, size_t errlen)
{
    return write_file(path, g, force, 1, NULL, NULL, NULL, err, errlen);
}

int dl_golden_check_output(const char *path, int force, char *err, size_t errlen)
{
    return dl__out_check(path, force, err, errlen);
}
