/* Reading golden and candidate files. Every check ends in one line naming
 * the file and the object; HDF5's own error printing is silenced. Shapes
 * are checked before anything is allocated, so a damaged header cannot ask
 * for absurd amounts of memory. Floats are read with the same type as
 * stored (IEEE binary32 both sides): HDF5 never converts a float. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <hdf5.h>
#include "golden/golden_priv.h"
#include "dropless/quant.h"

typedef struct {
    const char *path;
    char *err;
    size_t errlen;
    int strict; /* golden file: complete groups, exact types, consistency */
    char why[320]; /* candidates: why the last dataset was set aside */
    int coarse;         /* candidates: the last float dataset is stored coarser than the case's type */
    dl_dtype_t store;   /* its storage type then */
} rctx_t;

/* Messages quote strings from the file (attribute values), which may hold
 * any byte: control characters become '?' so a message stays one line. */
static void one_line(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = '?';
}

#define FAILF(code, ...)                                         \
    do {                                                         \
        char m_[400];                                            \
        snprintf(m_, sizeof m_, __VA_ARGS__);                    \
        one_line(m_);                                            \
        dl__golden_msg(r->err, r->errlen, "%s: %s", r->path, m_); \
        rc = (code);                                             \
        goto fail;                                               \
    } while (0)

/* Closes an HDF5 object on the way out; a failure turns success into an
 * error. */
#define CLOSE(fn, id)                                                                   \
    do {                                                                                \
        if ((id) >= 0 && fn(id) < 0 && rc >= 0) {                                       \
            dl__golden_msg(r->err, r->errlen, "%s: HDF5 error: " #fn " failed", r->path); \
            rc = DL_EFORMAT;                                                            \
        }                                                                               \
    } while (0)

/* ------------------------------------------------------------ attributes */

/* 1 present (value read), 0 absent (allowed unless required), < 0 error. */
static int attr_open(rctx_t *r, hid_t obj, const char *where, const char *name, int required,
                     H5T_class_t want, hid_t *a_out, hid_t *t_out)
{
    int rc = 0;
    hid_t a = -1, t = -1, sp = -1;
    htri_t ex = H5Aexists(obj, name);
    if (ex < 0)
        FAILF(DL_EFORMAT, "%s: cannot read attribute '%s'", where, name);
    if (ex == 0) {
        if (required)
            FAILF(DL_EFORMAT, "%s: attribute '%s' is missing", where, name);
        return 0;
    }
    if ((a = H5Aopen(obj, name, H5P_DEFAULT)) < 0 || (t = H5Aget_type(a)) < 0 ||
        (sp = H5Aget_space(a)) < 0)
        FAILF(DL_EFORMAT, "%s: cannot open attribute '%s'", where, name);
    if (H5Tget_class(t) != want)
        FAILF(DL_EFORMAT, "%s: attribute '%s' must be %s", where, name,
              want == H5T_STRING ? "a string" : want == H5T_INTEGER ? "an integer" : "a float");
    if (H5Sget_simple_extent_npoints(sp) != 1)
        FAILF(DL_EFORMAT, "%s: attribute '%s' must be a single value", where, name);
    rc = 1;
    CLOSE(H5Sclose, sp);
    sp = -1;
    if (rc < 0)
        goto fail;
    *a_out = a;
    *t_out = t;
    return 1;
fail:
    if (sp >= 0)
        H5Sclose(sp);
    if (t >= 0)
        H5Tclose(t);
    if (a >= 0)
        H5Aclose(a);
    return rc;
}

static int attr_str(rctx_t *r, hid_t obj, const char *where, const char *name, int required,
                    char *buf, size_t n)
{
    hid_t a = -1, t = -1, mt = -1;
    int rc = attr_open(r, obj, where, name, required, H5T_STRING, &a, &t);
    if (rc <= 0)
        return rc;
    htri_t var = H5Tis_variable_str(t);
    if (var < 0 || (mt = H5Tcopy(t)) < 0)
        FAILF(DL_EFORMAT, "%s: attribute '%s': bad string type", where, name);
    if (var) {
        char *s = NULL;
        if (H5Aread(a, mt, &s) < 0 || !s)
            FAILF(DL_EFORMAT, "%s: cannot read attribute '%s'", where, name);
        size_t len = strlen(s);
        if (len >= n) {
            H5free_memory(s);
            FAILF(DL_EFORMAT, "%s: attribute '%s' is longer than %zu characters", where, name, n - 1);
        }
        memcpy(buf, s, len + 1);
        H5free_memory(s);
    } else {
        size_t sz = H5Tget_size(t);
        if (sz == 0 || sz >= n)
            FAILF(DL_EFORMAT, "%s: attribute '%s' is longer than %zu characters", where, name, n - 1);
        memset(buf, 0, n);
        if (H5Aread(a, mt, buf) < 0)
            FAILF(DL_EFORMAT, "%s: cannot read attribute '%s'", where, name);
        buf[sz] = '\0';
    }
    rc = 1;
fail:
    CLOSE(H5Tclose, mt);
    CLOSE(H5Tclose, t);
    CLOSE(H5Aclose, a);
    return rc;
}

static int attr_num(rctx_t *r, hid_t obj, const char *where, const char *name, int required,
                    H5T_class_t cls, hid_t mtype, void *out)
{
    hid_t a = -1, t = -1;
    int rc = attr_open(r, obj, where, name, required, cls, &a, &t);
    if (rc <= 0)
        return rc;
    if (H5Aread(a, mtype, out) < 0)
        FAILF(DL_EFORMAT, "%s: cannot read attribute '%s'", where, name);
    rc = 1;
fail:
    CLOSE(H5Tclose, t);
    CLOSE(H5Aclose, a);
    return rc;
}

#define ATTR_I64(obj, where, name, req, out) \
    attr_num(r, obj, where, name, req, H5T_INTEGER, H5T_NATIVE_INT64, out)

/* ------------------------------------------------------------ /config */

/* The shared experts' attributes, written only when the layer has them
 * (absent: none). */
static int read_shared(rctx_t *r, hid_t g, dl_moe_config_t *c)
{
    static const char *const names[] = {"shared_experts", "shared_ffn", "shared_gate"};
    int64_t v[3] = {0, 0, 0};
    int rc = 0;
    for (int i = 0; i < 3; i++)
        if ((rc = ATTR_I64(g, "/config", names[i], 0, &v[i])) < 0)
            return rc;
    if (v[0] < 0 || v[0] > INT32_MAX || v[1] < 0 || v[1] > INT32_MAX || (v[2] != 0 && v[2] != 1))
        FAILF(DL_EFORMAT, "/config: shared_experts and shared_ffn must be in [0, 2147483647] "
                          "and shared_gate 0 or 1");
    c->shared_experts = v[0];
    c->shared_ffn = v[1];
    c->shared_gate = (int)v[2];
    return 0;
fail:
    return rc;
}

/* The variants' attributes: act_alpha and act_limit (binary64, required
 * with swiglu-clamp), router_dtype (a string, fp32 when absent). */
static int read_variant_attrs(rctx_t *r, hid_t g, dl_moe_config_t *c)
{
    int rc = 0, clamp = c->ffn_kind == DL_FFN_SWIGLU_CLAMP;
    if (clamp && ((rc = attr_num(r, g, "/config", "act_alpha", 1, H5T_FLOAT, H5T_NATIVE_DOUBLE,
                                 &c->act_alpha)) < 0 ||
                  (rc = attr_num(r, g, "/config", "act_limit", 1, H5T_FLOAT, H5T_NATIVE_DOUBLE,
                                 &c->act_limit)) < 0))
        return rc;
    char rt[32];
    if ((rc = attr_str(r, g, "/config", "router_dtype", 0, rt, sizeof rt)) < 0)
        return rc;
    if (rc == 1 && (dl_dtype_parse(rt, &c->router_dtype) || c->router_dtype == DL_F64))
        FAILF(DL_EFORMAT, "/config: router_dtype '%s' is not fp32, bf16 or fp16", rt);
    int64_t fb = 0;
    if ((rc = ATTR_I64(g, "/config", "ffn_bias", 0, &fb)) < 0)
        return rc;
    if (fb != 0 && fb != 1)
        FAILF(DL_EFORMAT, "/config: ffn_bias must be 0 or 1");
    c->ffn_bias = (int)fb;
    return 0;
fail:
    return rc;
}

static int read_config(rctx_t *r, hid_t file, dl_moe_config_t *c)
{
    int rc = 0;
    hid_t g = -1;
    htri_t ex = H5Lexists(file, "config", H5P_DEFAULT);
    if (ex <= 0)
        FAILF(DL_EFORMAT, "/config is missing");
    if ((g = H5Gopen2(file, "config", H5P_DEFAULT)) < 0)
        FAILF(DL_EFORMAT, "/config is not a group");
    int64_t v[9];
    static const char *const ints[] = {"tokens", "hidden", "ffn", "experts", "top_k",
                                       "n_group", "topk_group", "renormalize", "has_bias"};
    for (int i = 0; i < 9; i++)
        if ((rc = ATTR_I64(g, "/config", ints[i], 1, &v[i])) < 0)
            goto fail;
    char sf[32], gs[32], fk[32], dt[32], lp[32] = "none";
    double scaling;
    int has_lp = attr_str(r, g, "/config", "lowp", 0, lp, sizeof lp);
    if ((rc = has_lp) < 0)
        goto fail;
    int ilp = dl_lowp_layer_parse(lp);
    if (ilp < 0 || (has_lp && ilp == DL_LOWP_NONE))
        FAILF(DL_EFORMAT, "/config: lowp '%s' is not a layer recipe", lp);
    if ((rc = attr_str(r, g, "/config", "score_function", 1, sf, sizeof sf)) < 0 ||
        (rc = attr_str(r, g, "/config", "group_score", 1, gs, sizeof gs)) < 0 ||
        (rc = attr_str(r, g, "/config", "ffn_kind", 1, fk, sizeof fk)) < 0 ||
        (rc = attr_str(r, g, "/config", "dtype", 1, dt, sizeof dt)) < 0 ||
        (rc = attr_num(r, g, "/config", "scaling", 1, H5T_FLOAT, H5T_NATIVE_DOUBLE, &scaling)) < 0)
        goto fail;
    int isf = dl__golden_score_parse(sf), igs = dl__golden_group_parse(gs),
        ifk = dl__golden_ffn_parse(fk);
    dl_dtype_t t;
    if (isf < 0)
        FAILF(DL_EFORMAT, "/config: score_function '%s' is not softmax, sigmoid, sqrtsoftplus or softmax_topk", sf);
    if (igs < 0)
        FAILF(DL_EFORMAT, "/config: group_score '%s' is not max, top2_sum or topk_sum", gs);
    if (ifk < 0)
        FAILF(DL_EFORMAT, "/config: ffn_kind '%s' is not swiglu, plain, swiglu-clamp, geglu-tanh or relu2",
              fk);
    if (strcmp(dt, "fp32") && strcmp(dt, "bf16") && strcmp(dt, "fp16"))
        FAILF(DL_EFORMAT, "/config: dtype '%s' is not fp32, bf16 or fp16", dt);
    dl_dtype_parse(dt, &t);
    if ((v[7] != 0 && v[7] != 1) || (v[8] != 0 && v[8] != 1))
        FAILF(DL_EFORMAT, "/config: renormalize and has_bias must be 0 or 1");
    int64_t rbias = 0; /* optional: written only when set */
    if ((rc = ATTR_I64(g, "/config", "has_router_bias", 0, &rbias)) < 0)
        goto fail;
    if (rbias != 0 && rbias != 1)
        FAILF(DL_EFORMAT, "/config: has_router_bias must be 0 or 1");
    int64_t win = 0; /* optional: written only when set */
    if ((rc = ATTR_I64(g, "/config", "weight_on_input", 0, &win)) < 0)
        goto fail;
    if (win != 0 && win != 1)
        FAILF(DL_EFORMAT, "/config: weight_on_input must be 0 or 1");
    int64_t hv = 0; /* optional: written only when hash routing */
    if ((rc = ATTR_I64(g, "/config", "hash_vocab", 0, &hv)) < 0)
        goto fail;
    if (hv < 0 || hv > INT32_MAX)
        FAILF(DL_EFORMAT, "/config: hash_vocab must be in [0, 2^31 - 1]");
    int64_t zx = 0; /* optional: written only with zero experts */
    if ((rc = ATTR_I64(g, "/config", "zero_experts", 0, &zx)) < 0)
        goto fail;
    if (zx < 0 || zx > INT32_MAX)
        FAILF(DL_EFORMAT, "/config: zero_experts must be in [0, 2^31 - 1]");
    memset(c, 0, sizeof *c);
    c->tokens = v[0];
    c->hidden = v[1];
    c->ffn = v[2];
    c->route.experts = v[3];
    c->route.top_k = v[4];
    c->route.n_group = v[5];
    c->route.topk_group = v[6];
    c->route.renormalize = (int)v[7];
    c->route.has_bias = (int)v[8];
    c->route.has_router_bias = (int)rbias;
    c->route.weight_on_input = (int)win;
    c->route.hash_vocab = hv;
    c->route.zero_experts = zx;
    c->route.score_fn = (dl_score_fn_t)isf;
    c->route.group_score = (dl_group_score_t)igs;
    c->route.scaling = scaling;
    c->ffn_kind = (dl_ffn_t)ifk;
    c->dtype = t;
    c->lowp = ilp;
    if ((rc = read_shared(r, g, c)) < 0 || (rc = read_variant_attrs(r, g, c)) < 0)
        goto fail;
    char why[200];
    if (dl__golden_config_check(c, why, sizeof why))
        FAILF(DL_EFORMAT, "/config: invalid configuration: %s", why);
    if (dl_moe_config_validate(c))
        FAILF(DL_EFORMAT, "/config: invalid configuration (rejected by dl_moe_config_validate)");
    rc = 0;
fail:
    CLOSE(H5Gclose, g);
    return rc;
}

/* A candidate's /config, if present, must describe the golden's case. */
static int check_candidate_config(rctx_t *r, hid_t file, const dl_moe_config_t *c)
{
    int rc = 0;
    hid_t g = -1;
    htri_t ex = H5Lexists(file, "config", H5P_DEFAULT);
    if (ex < 0)
        FAILF(DL_EFORMAT, "cannot read the root group");
    if (ex == 0)
        return 0;
    if ((g = H5Gopen2(file, "config", H5P_DEFAULT)) < 0)
        FAILF(DL_EFORMAT, "/config is not a group");
    static const char *const ints[] = {"tokens", "hidden", "ffn", "experts", "top_k"};
    const int64_t want[] = {c->tokens, c->hidden, c->ffn, c->route.experts, c->route.top_k};
    for (int i = 0; i < 5; i++) {
        int64_t v;
        if ((rc = ATTR_I64(g, "/config", ints[i], 0, &v)) < 0)
            goto fail;
        if (rc == 1 && v != want[i])
            FAILF(DL_ESHAPE, "/config: %s = %" PRId64 ", the golden case has %" PRId64, ints[i], v,
                  want[i]);
    }
    char dt[32];
    if ((rc = attr_str(r, g, "/config", "dtype", 0, dt, sizeof dt)) < 0)
        goto fail;
    if (rc == 1 && strcmp(dt, dl_dtype_name(c->dtype)))
        FAILF(DL_EDTYPE, "/config: dtype = %s, the golden case has %s", dt, dl_dtype_name(c->dtype));
    rc = 0;
fail:
    CLOSE(H5Gclose, g);
    return rc;
}

/* ------------------------------------------------------------ datasets */

static void fmt_dims(char *buf, size_t n, const hsize_t *d, int rank)
{
    size_t w = 0;
    w += (size_t)snprintf(buf + w, n - w, "[");
    for (int i = 0; i < rank && w < n; i++)
        w += (size_t)snprintf(buf + w, n - w, i ? ",%llu" : "%llu", (unsigned long long)d[i]);
    if (w < n)
        snprintf(buf + w, n - w, "]");
}

static void fmt_index(char *buf, size_t n, int64_t flat, const int64_t *dims, int rank)
{
    int64_t idx[3] = {0, 0, 0};
    for (int i = rank - 1; i >= 0; i--) {
        idx[i] = dims[i] ? flat % dims[i] : 0;
        flat = dims[i] ? flat / dims[i] : 0;
    }
    hsize_t h[3] = {(hsize_t)idx[0], (hsize_t)idx[1], (hsize_t)idx[2]};
    fmt_dims(buf, n, h, rank);
}

static void describe_type(hid_t t, char *buf, size_t n)
{
    H5T_class_t c = H5Tget_class(t);
    size_t sz = H5Tget_size(t);
    H5T_order_t o = H5Tget_order(t);
    const char *cn = c == H5T_FLOAT ? "float" : c == H5T_INTEGER ? "integer"
                     : c == H5T_STRING ? "string" : c == H5T_COMPOUND ? "compound"
                     : c == H5T_ENUM ? "enum" : "non-numeric";
    snprintf(buf, n, "%zu-bit %s%s", sz * 8, cn,
             o == H5T_ORDER_BE ? " (big-endian)" : "");
}

static const char *elem_type_name(dl_golden_elem_t e)
{
    return e == DL_GOLDEN_INT32 ? "int32" : e == DL_GOLDEN_INT64 ? "int64" : "float32";
}

/* A candidate's float storage the runner converts itself (never HDF5):
 * IEEE float32 of either byte order, float64, IEEE half and a 2-byte bf16
 * (8 exponent bits, 7 significand bits). Returns the kind, -1 for any other
 * type; *be: big-endian. */
enum { FK_F32 = 0, FK_F64, FK_F16, FK_BF16 };
static int float_kind(hid_t t, int *be)
{
    if (H5Tget_class(t) != H5T_FLOAT)
        return -1;
    size_t spos, epos, esize, mpos, msize;
    if (H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize) < 0)
        return -1;
    const size_t sz = H5Tget_size(t), bias = H5Tget_ebias(t);
    *be = H5Tget_order(t) == H5T_ORDER_BE;
    if (H5Tget_offset(t) != 0 || H5Tget_precision(t) != sz * 8 || mpos != 0 || spos != sz * 8 - 1 ||
        epos != msize || H5Tget_norm(t) != H5T_NORM_IMPLIED)
        return -1;
    if (sz == 4 && esize == 8 && msize == 23 && bias == 127)
        return FK_F32;
    if (sz == 8 && esize == 11 && msize == 52 && bias == 1023)
        return FK_F64;
    if (sz == 2 && esize == 5 && msize == 10 && bias == 15)
        return FK_F16;
    if (sz == 2 && esize == 8 && msize == 7 && bias == 127)
        return FK_BF16;
    return -1;
}

/* Raw element i of a buffer of kind fk as a double (exact for every kind). */
static double float_at(const unsigned char *raw, int fk, int be, int64_t i)
{
    const size_t sz = fk == FK_F64 ? 8 : fk == FK_F32 ? 4 : 2;
    uint64_t u = 0;
    for (size_t b = 0; b < sz; b++) /* the file's byte order, whatever the host's */
        u |= (uint64_t)raw[(size_t)i * sz + (be ? sz - 1 - b : b)] << (8 * b);
    if (fk == FK_F64) {
        double v;
        memcpy(&v, &u, sizeof v);
        return v;
    }
    if (fk == FK_BF16)
        u <<= 16;
    if (fk == FK_F32 || fk == FK_BF16) {
        uint32_t w = (uint32_t)u;
        float v;
        memcpy(&v, &w, sizeof v);
        return v;
    }
    const int sgn = (int)(u >> 15) & 1, ex = (int)(u >> 10) & 31, m = (int)(u & 1023);
    double v = ex == 31 ? (m ? NAN : INFINITY) : ex ? ldexp(1024 + m, ex - 25) : ldexp(m, -24);
    return sgn ? -v : v;
}

/* A problem confined to one dataset: in a golden file an error naming the
 * dataset; in a candidate the dataset is set aside (returns 2) with the
 * reason in r->why, and loading goes on. */
#define BAD(code, ...)                                                  \
    do {                                                                \
        snprintf(r->why, sizeof r->why, __VA_ARGS__);                   \
        one_line(r->why);                                               \
        if (r->strict)                                                  \
            FAILF(code, "%s: %s", p, r->why);                           \
        rc = 2;                                                         \
        goto fail;                                                      \
    } while (0)

/* A candidate float dataset's storage type: the dtype attribute (dt, may
 * be NULL), else a 2-byte HDF5 type's; finer than the case's type st is
 * fine, coarser is marked (r->coarse, r->store) for the runner to judge at
 * its own precision; values must lie on the declared grid. Returns 0, or
 * 2 with the dataset set aside (reason in r->why). */
static int cand_storage(rctx_t *r, int fk, const char *dt, dl_dtype_t st, const float *v,
                        int64_t n, const int64_t *dims, int rank)
{
    int has = fk == FK_F16 || fk == FK_BF16;
    dl_dtype_t store = fk == FK_F16 ? DL_F16 : DL_BF16, at;
    r->coarse = 0;
    if (dt) {
        if (dl_dtype_parse(dt, &at) != 0 || at == DL_F64) {
            snprintf(r->why, sizeof r->why, "dtype attribute '%s' is not fp32, bf16 or fp16", dt);
            return 2;
        }
        if (has && at != store) {
            snprintf(r->why, sizeof r->why, "dtype attribute is '%s' but the data are stored as %s",
                     dt, dl_dtype_name(store));
            return 2;
        }
        store = at;
        has = 1;
    }
    if (!has)
        return 0; /* float32/float64 without a grid: judged at the case's type */
    for (int64_t i = 0; store != DL_F32 && i < n; i++)
        if (!dl_on_grid((double)v[i], store)) {
            char at_s[96];
            fmt_index(at_s, sizeof at_s, i, dims, rank);
            snprintf(r->why, sizeof r->why, "element %s = %a is not a %s value", at_s, (double)v[i],
                     dl_dtype_name(store));
            one_line(r->why);
            return 2;
        }
    r->coarse = dl_dtype_unit_roundoff(store) > dl_dtype_unit_roundoff(st);
    r->store = store;
    return 0;
}

/* Opens the dataset: 1 open (*d, *t, *sp set), 0 absent, 2 set aside,
 * < 0 error. */
static int open_dataset(rctx_t *r, hid_t grp, const dl_golden_dataset_t *ds, hid_t *d, hid_t *t,
                        hid_t *sp)
{
    int rc = 0;
    const char *p = ds->path;
    htri_t ex = H5Lexists(grp, ds->name, H5P_DEFAULT);
    if (ex < 0)
        FAILF(DL_EFORMAT, "%s: cannot look it up (damaged group)", p);
    if (ex == 0)
        return 0;
    if ((*d = H5Dopen2(grp, ds->name, H5P_DEFAULT)) < 0) {
        /* a group or named type in its place is the dataset's problem; an
         * object HDF5 cannot even identify is a damaged file */
        H5O_info_t oi;
        if (H5Oget_info_by_name2(grp, ds->name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0 ||
            oi.type == H5O_TYPE_DATASET)
            FAILF(DL_EFORMAT, "%s: cannot open the dataset (damaged)", p);
        BAD(DL_EFORMAT, "not a dataset");
    }
    if ((*t = H5Dget_type(*d)) < 0 || (*sp = H5Dget_space(*d)) < 0)
        FAILF(DL_EFORMAT, "%s: cannot read its type or shape", p);
    return 1;
fail:
    return rc;
}

/* The stored shape must be the one the configuration gives (dims, n). */
static int check_shape(rctx_t *r, const dl_golden_dataset_t *ds, hid_t sp, const int64_t *dims)
{
    int rc = 0;
    const char *p = ds->path;
    hsize_t want[3], have[H5S_MAX_RANK];
    for (int i = 0; i < ds->rank; i++)
        want[i] = (hsize_t)dims[i];
    char ws[96], hs[96];
    fmt_dims(ws, sizeof ws, want, ds->rank);
    H5S_class_t scls = H5Sget_simple_extent_type(sp);
    if (scls == H5S_NO_CLASS)
        FAILF(DL_EFORMAT, "%s: cannot read its shape", p);
    if (scls != H5S_SIMPLE)
        BAD(DL_ESHAPE, "%s, expected an array of shape %s (%.3s)",
            scls == H5S_SCALAR ? "a scalar" : "empty (null dataspace)", ws, ds->dims);
    int nd = H5Sget_simple_extent_ndims(sp);
    if (nd < 0 || nd > H5S_MAX_RANK)
        FAILF(DL_EFORMAT, "%s: cannot read its shape", p);
    if (nd != ds->rank)
        BAD(DL_ESHAPE, "%d dimensions, expected shape %s (%.3s)", nd, ws, ds->dims);
    if (H5Sget_simple_extent_dims(sp, have, NULL) < 0)
        FAILF(DL_EFORMAT, "%s: cannot read its shape", p);
    fmt_dims(hs, sizeof hs, have, nd);
    for (int i = 0; i < nd; i++)
        if (have[i] != want[i])
            BAD(DL_ESHAPE, "shape %s, expected %s (%.3s)", hs, ws, ds->dims);
fail:
    return rc;
}

/* The stored type: exact, or (candidates) any integer type, read wide
 * (*wide_read = 1), or a float kind the runner converts (*wide_read = 2,
 * the kind in *fk, big-endian in *be). */
static int check_type(rctx_t *r, const dl_golden_dataset_t *ds, hid_t t, int *wide_read, int *fk,
                      int *be)
{
    int rc = 0;
    const char *p = ds->path;
    char tdesc[64];
    describe_type(t, tdesc, sizeof tdesc);
    hid_t exact = ds->elem == DL_GOLDEN_FLOAT ? H5T_IEEE_F32LE
                  : ds->elem == DL_GOLDEN_INT32 ? H5T_STD_I32LE : H5T_STD_I64LE;
    htri_t eq = H5Tequal(t, exact);
    if (eq < 0)
        FAILF(DL_EFORMAT, "%s: cannot read its type", p);
    *wide_read = 0;
    *fk = FK_F32;
    *be = 0;
    if (!eq && ds->elem == DL_GOLDEN_FLOAT) {
        if (r->strict || (*fk = float_kind(t, be)) < 0)
            BAD(DL_EDTYPE, "stored as %s; float datasets must be %s", tdesc,
                r->strict ? "IEEE float32 little-endian (H5T_IEEE_F32LE)"
                          : "float32, float64, IEEE half or a 2-byte bf16 float");
        *wide_read = 2; /* a candidate's floats: read as stored, converted here */
    } else if (!eq) {
        if (r->strict || H5Tget_class(t) != H5T_INTEGER || H5Tget_size(t) > 8)
            BAD(DL_EDTYPE, "stored as %s, must be %s%s", tdesc, r->strict ? "" : "an integer type like ",
                elem_type_name(ds->elem));
        *wide_read = 1; /* a candidate's integers: any width, read as int64 */
    }
fail:
    return rc;
}

/* Reads the n elements into a fresh *out; the count comes from the
 * configuration, never the file. */
static int read_data(rctx_t *r, const dl_golden_dataset_t *ds, hid_t d, hid_t t, int64_t n,
                     const int64_t *dims, int wide_read, int fk, int be, void **out)
{
    int rc = 0;
    const char *p = ds->path;
    void *buf = NULL;
    int64_t *wide = NULL;
    size_t esz = ds->elem == DL_GOLDEN_INT64 ? 8 : 4;
    if ((uint64_t)n > SIZE_MAX / 8)
        FAILF(DL_ENOMEM, "%s: too large for this machine", p);
    size_t cnt = (size_t)(n > 0 ? n : 1);
    buf = malloc(cnt * esz);
    if (wide_read)
        wide = malloc(cnt * 8); /* as wide as any stored element */
    if (!buf || (wide_read && !wide))
        FAILF(DL_ENOMEM, "%s: out of memory (%" PRId64 " elements)", p, n);
    if (n > 0) {
        /* floats read with the file's own type: HDF5 copies bytes, converts nothing */
        hid_t mt = wide_read == 2 ? t : wide_read ? H5T_NATIVE_INT64
                   : ds->elem == DL_GOLDEN_FLOAT ? H5T_NATIVE_FLOAT
                   : ds->elem == DL_GOLDEN_INT32 ? H5T_NATIVE_INT32 : H5T_NATIVE_INT64;
        if (H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, wide_read ? (void *)wide : buf) < 0)
            FAILF(DL_EFORMAT, "%s: cannot read the data (file truncated or damaged)", p);
    }
    for (int64_t i = 0; wide_read == 2 && i < n; i++) /* float64 rounds to nearest: finer than any case */
        ((float *)buf)[i] = (float)float_at((const unsigned char *)wide, fk, be, i);
    for (int64_t i = 0; wide_read == 1 && i < n; i++) {
        if (ds->elem == DL_GOLDEN_INT32) {
            if (wide[i] < INT32_MIN || wide[i] > INT32_MAX) {
                char hs[96];
                fmt_index(hs, sizeof hs, i, dims, ds->rank);
                BAD(DL_ERANGE, "element %s = %" PRId64 " does not fit int32", hs, wide[i]);
            }
            ((int32_t *)buf)[i] = (int32_t)wide[i];
        } else {
            ((int64_t *)buf)[i] = wide[i];
        }
    }
    *out = buf;
    buf = NULL;
    rc = 1;
fail:
    free(buf);
    free(wide);
    return rc;
}

/* The dataset's dtype attribute; on a bf16/fp16 grid every value is
 * verified. */
static int check_dtype(rctx_t *r, const dl_golden_dataset_t *ds, const dl_moe_config_t *c,
                       hid_t d, int fk, const void *buf, int64_t n, const int64_t *dims)
{
    int rc = 0;
    const char *p = ds->path;
    dl_dtype_t st = dl_golden_dataset_dtype(ds, c);
    const char *want_dt = ds->elem == DL_GOLDEN_FLOAT ? dl_dtype_name(st) : elem_type_name(ds->elem);
    char dt[32];
    int have_dt = 0;
    if (r->strict || ds->elem == DL_GOLDEN_FLOAT) {
        /* a candidate's unreadable dtype attribute sets the dataset aside */
        rctx_t ra = *r;
        char aerr[400] = "";
        if (!r->strict) {
            ra.err = aerr;
            ra.errlen = sizeof aerr;
            ra.path = "";
        }
        if ((rc = attr_str(&ra, d, p, "dtype", r->strict, dt, sizeof dt)) < 0) {
            if (r->strict)
                goto fail;
            /* aerr is ": <dataset>: <what>"; keep <what> */
            const char *w = strstr(aerr, p);
            w = w ? w + strlen(p) : aerr;
            while (*w == ':' || *w == ' ')
                w++;
            BAD(DL_EFORMAT, "%s", w);
        }
        have_dt = rc;
        rc = 0;
        if (!r->strict && ds->elem == DL_GOLDEN_FLOAT) {
            if ((rc = cand_storage(r, fk, have_dt ? dt : NULL, st, buf, n, dims, ds->rank)) != 0) {
                one_line(r->why); /* it quotes the file's attribute */
                goto fail;
            }
            have_dt = 0; /* the grid is verified */
        } else if (have_dt && strcmp(dt, want_dt)) {
            BAD(DL_EDTYPE, "dtype attribute is '%s', the case needs '%s'", dt, want_dt);
        }
    }
    if (ds->elem == DL_GOLDEN_FLOAT && have_dt && st != DL_F32) {
        const float *v = buf;
        for (int64_t i = 0; i < n; i++)
            if (!dl_on_grid((double)v[i], st)) {
                char hs[96];
                fmt_index(hs, sizeof hs, i, dims, ds->rank);
                BAD(DL_EGRID, "element %s = %a is not a %s value", hs, (double)v[i],
                    dl_dtype_name(st));
            }
    }
fail:
    return rc;
}

/* Ranges of indices and sizes: a golden file's only; a candidate's values
 * are the conformance check's to judge. */
static int check_ranges(rctx_t *r, const dl_golden_dataset_t *ds, const dl_moe_config_t *c,
                        const void *buf, int64_t n, const int64_t *dims)
{
    int rc = 0;
    const char *p = ds->path;
    char hs[96];
    int64_t M = c->tokens * c->route.top_k;
    if (r->strict && ds->elem == DL_GOLDEN_INT32) {
        const int32_t *v = buf;
        int is_ids = !strcmp(ds->name, "topk_ids");
        int64_t hi = is_ids ? DL_ROUTE_WIDTH(&c->route) : M; /* zero experts: ids up to E + Z */
        for (int64_t i = 0; i < n; i++)
            if (v[i] < 0 || v[i] >= hi) {
                fmt_index(hs, sizeof hs, i, dims, ds->rank);
                FAILF(DL_ERANGE, "%s: element %s = %" PRId32 " is outside [0, %" PRId64 ")",
                      p, hs, v[i], hi);
            }
    } else if (r->strict && ds->elem == DL_GOLDEN_INT64) {
        const int64_t *v = buf;
        for (int64_t i = 0; i < n; i++)
            if (v[i] < 0) {
                fmt_index(hs, sizeof hs, i, dims, ds->rank);
                FAILF(DL_ERANGE, "%s: element %s = %" PRId64 " is negative", p, hs, v[i]);
            }
    }
fail:
    return rc;
}

/* Reads one dataset into a fresh array at *slot. Returns 1 read, 0 absent,
 * 2 set aside (candidates only; reason in r->why), < 0 error. */
static int read_dataset(rctx_t *r, hid_t grp, const dl_golden_dataset_t *ds,
                        const dl_moe_config_t *c, void **slot)
{
    hid_t d = -1, t = -1, sp = -1;
    void *buf = NULL;
    int64_t dims[3];
    int wide_read = 0, fk = FK_F32, be = 0;
    r->why[0] = '\0';
    r->coarse = 0;
    int rc = open_dataset(r, grp, ds, &d, &t, &sp);
    if (rc != 1)
        goto fail;
    int64_t n = dl_golden_dataset_shape(ds, c, dims);
    if (n < 0) {
        const char *p = ds->path;
        FAILF(DL_EOVERFLOW, "%s: the configuration's shape overflows", p);
    }
    if ((rc = check_shape(r, ds, sp, dims)) || (rc = check_type(r, ds, t, &wide_read, &fk, &be)) ||
        (rc = read_data(r, ds, d, t, n, dims, wide_read, fk, be, &buf)) != 1 ||
        (rc = check_dtype(r, ds, c, d, fk, buf, n, dims)) ||
        (rc = check_ranges(r, ds, c, buf, n, dims)))
        goto fail;
    *slot = buf;
    buf = NULL;
    rc = 1;
fail:
    free(buf);
    CLOSE(H5Sclose, sp);
    CLOSE(H5Tclose, t);
    CLOSE(H5Dclose, d);
    return rc;
}

/* A golden file's discrete stages must agree with one another. */
static int check_forward(rctx_t *r, const dl_golden_file_t *g)
{
    int rc = 0;
    const dl_moe_forward_t *f = &g->fwd;
    int64_t T = g->config.tokens, k = g->config.route.top_k, E = g->config.route.experts;
    int64_t M = T * k;
    /* zero experts' ids count in [E, E + Z): their rows are the tail */
    int64_t *count = calloc((size_t)DL_ROUTE_WIDTH(&g->config.route) + 1, sizeof *count);
    char *seen = calloc((size_t)(M > 0 ? M : 1), 1);
    if (!count || !seen)
        FAILF(DL_ENOMEM, "out of memory");
    for (int64_t i = 0; i < M; i++)
        count[f->topk_ids[i]]++;
    if (f->group_offsets[0] != 0)
        FAILF(DL_EFORMAT, "/forward/group_offsets: must start at 0");
    for (int64_t e = 0; e < E; e++) {
        if (f->group_sizes[e] != count[e])
            FAILF(DL_EFORMAT, "/forward/group_sizes: [%" PRId64 "] = %" PRId64 " but topk_ids "
                  "assign %" PRId64 " rows to expert %" PRId64, e, f->group_sizes[e], count[e], e);
        if (f->group_offsets[e + 1] != f->group_offsets[e] + f->group_sizes[e])
            FAILF(DL_EFORMAT, "/forward/group_offsets: [%" PRId64 "] is not the prefix sum of "
                  "group_sizes", e + 1);
    }
    for (int64_t p = 0; p < M; p++) {
        int32_t s = f->sort_perm[p];
        if (seen[s])
            FAILF(DL_EFORMAT, "/forward/sort_perm: %" PRId32 " appears twice", s);
        seen[s] = 1;
        if (f->inv_perm[s] != p)
            FAILF(DL_EFORMAT, "/forward/inv_perm: not the inverse of sort_perm at [%" PRId32 "]", s);
    }
fail:
    free(count);
    free(seen);
    return rc;
}

/* A golden value that is NaN or Inf where every input is finite is a
 * damaged golden, not an answer: the oracle rounds finite exact values and
 * the case generator never overflows; against such a value every candidate
 * value would "match" or none could. Inputs holding NaN/Inf make
 * non-finite stages legitimate. */
static int check_finite(rctx_t *r, dl_golden_file_t *g)
{
    int rc = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < dl_golden_dataset_count(); i++) {
            const dl_golden_dataset_t *ds = dl_golden_dataset(i);
            dl_value_t sv;
            if (ds->elem != DL_GOLDEN_FLOAT || (ds->group == DL_GOLDEN_INPUTS) != (pass == 0))
                continue;
            /* tie_margin is no stage: +Inf is its value where nothing competes */
            if (pass == 1 && (dl_value_parse(ds->name, &sv) != 0 || sv == DL_VALUE_NONE))
                continue;
            const float *v = *dl_golden_slot(g, ds);
            int64_t dims[3];
            int64_t n = v ? dl_golden_dataset_shape(ds, &g->config, dims) : 0;
            for (int64_t e = 0; e < n; e++) {
                if (isfinite(v[e]))
                    continue;
                if (pass == 0)
                    return 0; /* non-finite inputs: nothing to refuse */
                char at[96];
                fmt_index(at, sizeof at, e, dims, ds->rank);
                FAILF(DL_EFORMAT, "%s: element %s = %g where the case's inputs are all finite "
                      "(a damaged golden)", ds->path, at, (double)v[e]);
            }
        }
    }
fail:
    return rc;
}

/* ------------------------------------------------------------ loading */

/* Opens path read-only after its seal (when it has one) checked out,
 * unless the caller verified it already (*sealed set). */
static int open_file(rctx_t *r, int seal_checked, dl_golden_file_t *g, hid_t *fapl, hid_t *file)
{
    int rc = 0;
    struct stat st;
    if (stat(r->path, &st) != 0 || access(r->path, R_OK) != 0)
        FAILF(DL_EIO, "cannot open: %s", strerror(errno));
    if (S_ISDIR(st.st_mode))
        FAILF(DL_EIO, "is a directory, not a file");
    if (!S_ISREG(st.st_mode))
        FAILF(DL_EIO, "not a regular file");
    if (seal_checked)
        g->sealed = 1;
    else if ((rc = dl__golden_check_seal(r->path, r->strict, &g->sealed, r->err, r->errlen)) < 0)
        goto fail;
    if ((*fapl = H5Pcreate(H5P_FILE_ACCESS)) < 0 ||
        H5Pset_fclose_degree(*fapl, H5F_CLOSE_STRONG) < 0)
        FAILF(DL_EIO, "HDF5 error: property list");
    if ((*file = H5Fopen(r->path, H5F_ACC_RDONLY, *fapl)) < 0)
        FAILF(DL_EFORMAT, "not an HDF5 file, or damaged");
    rc = 0;
fail:
    return rc;
}

/* The root attributes. */
static int read_root(rctx_t *r, hid_t file, dl_golden_file_t *g)
{
    const int strict = r->strict;
    int rc;
    if ((rc = attr_str(r, file, "/", "format", strict, g->format, sizeof g->format)) < 0)
        goto fail;
    if (strict && strcmp(g->format, DL_GOLDEN_FORMAT))
        FAILF(DL_EFORMAT, "not a dropless golden file (format = '%.40s')", g->format);
    if ((rc = ATTR_I64(file, "/", "format_version", strict, &g->format_version)) < 0)
        goto fail;
    if (rc == 1 && g->format_version != DL_GOLDEN_FORMAT_VERSION)
        FAILF(DL_EFORMAT, "format_version %" PRId64 " is not %d, the version this dropless reads",
              g->format_version, DL_GOLDEN_FORMAT_VERSION);
    if ((rc = attr_str(r, file, "/", "generator", strict, g->generator, sizeof g->generator)) < 0 ||
        (rc = attr_str(r, file, "/", "case", strict, g->case_name, sizeof g->case_name)) < 0)
        goto fail;
    g->has_case = rc == 1;
    if (strict && !dl__golden_name_ok(g->case_name))
        FAILF(DL_EFORMAT, "/: attribute 'case' = '%.64s' is not 1-%d of [A-Za-z0-9._-]",
              g->case_name, DL_GOLDEN_NAME_MAX);
    if ((rc = attr_num(r, file, "/", "seed", strict, H5T_INTEGER, H5T_NATIVE_UINT64, &g->seed)) < 0)
        goto fail;
    g->has_seed = rc == 1;
    if ((rc = attr_str(r, file, "/", "backend", 0, g->backend, sizeof g->backend)) < 0 ||
        (rc = attr_str(r, file, "/", "compute_mode", 0, g->compute_mode, sizeof g->compute_mode)) < 0 ||
        (rc = attr_str(r, file, "/", "backend_version", 0, g->backend_version,
                       sizeof g->backend_version)) < 0 ||
        (rc = attr_str(r, file, "/", "device", 0, g->device, sizeof g->device)) < 0 ||
        (rc = attr_str(r, file, "/", "isolated_groups", 0, g->isolated_groups,
                       sizeof g->isolated_groups)) < 0)
        goto fail;
    /* an expert slice (gen --experts) is named as such, not as a wrong shape */
    int64_t a = -1, b = -1;
    int ha, hb;
    if ((rc = ha = ATTR_I64(file, "/", "expert_begin", 0, &a)) < 0 ||
        (rc = hb = ATTR_I64(file, "/", "expert_end", 0, &b)) < 0)
        goto fail;
    if (ha || hb)
        FAILF(DL_EFORMAT, "an expert slice (expert_begin %lld, expert_end %lld; gen --experts), "
              "not a whole golden file: read it with HDF5 or h5py (doc/format.md#expert-slices)",
              (long long)a, (long long)b);
    rc = 0;
fail:
    return rc;
}

/* /inputs, /forward, /backward: every applicable dataset of each present
 * group (a golden file's groups must be complete). */
static int read_groups(rctx_t *r, hid_t file, dl_golden_file_t *g)
{
    static const char *const gnames[] = {"inputs", "forward", "backward"};
    int *has[] = {&g->has_inputs, &g->has_forward, &g->has_backward};
    int rc = 0;
    hid_t grp = -1;
    for (int gi = 0; gi < 3; gi++) {
        htri_t ex = H5Lexists(file, gnames[gi], H5P_DEFAULT);
        if (ex < 0)
            FAILF(DL_EFORMAT, "cannot read the root group");
        if (ex == 0)
            continue;
        if ((grp = H5Gopen2(file, gnames[gi], H5P_DEFAULT)) < 0)
            FAILF(DL_EFORMAT, "/%s is not a group", gnames[gi]);
        *has[gi] = 1;
        for (int i = 0; i < dl_golden_dataset_count(); i++) {
            const dl_golden_dataset_t *ds = dl_golden_dataset(i);
            if ((int)ds->group != gi || !dl_golden_dataset_applies(ds, &g->config))
                continue;
            if ((rc = read_dataset(r, grp, ds, &g->config, dl_golden_slot(g, ds))) < 0)
                goto fail;
            if (rc == 2) {
                g->bad_datasets |= DL_ROWSET_BIT(i);
                snprintf(g->bad_reason[i], sizeof g->bad_reason[i], "%s", r->why);
            }
            if (rc == 1 && !r->strict && r->coarse) {
                g->coarse_datasets |= DL_ROWSET_BIT(i);
                g->store[i] = r->store;
            }
            if (rc == 0 && r->strict)
                FAILF(DL_EFORMAT, "%s is missing", ds->path);
        }
        rc = 0;
        CLOSE(H5Gclose, grp);
        grp = -1;
        if (rc < 0)
            goto fail;
    }
fail:
    CLOSE(H5Gclose, grp);
    return rc;
}

/* Interleaved gate/up storage (gpt-oss's gate_up_proj [E, d, 2f]: gate in
 * the even columns, up in the odd): a candidate may hand over the pair as
 * one dataset NAME [.., 2f] in place of GATE and UP; the reader splits it
 * (doc/format.md, "Interleaved gate/up"). */
static const struct {
    const char *name, *gate, *up;
} gate_up_pairs[] = {{"/forward/h_gate_up", "/forward/h_gate", "/forward/h_up"},
                     {"/backward/d_h_gate_up", "/backward/d_h_gate", "/backward/d_h_up"},
                     {"/backward/d_w_gate_up", "/backward/d_w_gate", "/backward/d_w_up"}};

static int dataset_index(const char *path)
{
    for (int i = 0; i < dl_golden_dataset_count(); i++)
        if (!strcmp(dl_golden_dataset(i)->path, path))
            return i;
    return -1;
}

/* Both halves set aside with the reason, or given the split arrays. */
static void gate_up_put(rctx_t *r, dl_golden_file_t *g, const int idx[2], int rc, float *buf,
                        int64_t n)
{
    const int64_t f = g->config.ffn, rows = f > 0 ? n / (2 * f) : 0;
    for (int h = 0; h < 2; h++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(idx[h]);
        float **slot = (float **)dl_golden_slot(g, ds), *a = NULL;
        if (rc == 1 && !(a = malloc((size_t)(n > 1 ? n / 2 : 1) * sizeof *a)))
            rc = DL_ENOMEM;
        if (rc != 1) { /* set aside: no array */
            free(*slot);
            *slot = NULL;
            g->bad_datasets |= DL_ROWSET_BIT(idx[h]);
            snprintf(g->bad_reason[idx[h]], sizeof g->bad_reason[idx[h]], "%s",
                     rc == DL_ENOMEM ? "out of memory" : r->why);
            continue;
        }
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < f; j++)
                a[i * f + j] = buf[i * 2 * f + 2 * j + h];
        free(*slot);
        *slot = a;
        if (r->coarse) {
            g->coarse_datasets |= DL_ROWSET_BIT(idx[h]);
            g->store[idx[h]] = r->store;
        }
    }
}

static int read_gate_up(rctx_t *r, hid_t file, dl_golden_file_t *g)
{
    int rc = 0;
    for (size_t k = 0; k < sizeof gate_up_pairs / sizeof *gate_up_pairs; k++) {
        const int idx[2] = {dataset_index(gate_up_pairs[k].gate), dataset_index(gate_up_pairs[k].up)};
        const dl_golden_dataset_t *gd = idx[0] < 0 ? NULL : dl_golden_dataset(idx[0]);
        const char *nm = strrchr(gate_up_pairs[k].name, '/') + 1;
        if (!gd || idx[1] < 0 || !dl_golden_dataset_applies(gd, &g->config))
            continue;
        /* its group first: HDF5 cannot look a path up through an absent group */
        const char *gname = gd->group == DL_GOLDEN_FORWARD ? "forward" : "backward";
        htri_t ex = H5Lexists(file, gname, H5P_DEFAULT);
        if (ex > 0)
            ex = H5Lexists(file, gate_up_pairs[k].name, H5P_DEFAULT);
        if (ex < 0)
            FAILF(DL_EFORMAT, "%s: cannot look it up (damaged group)", gate_up_pairs[k].name);
        if (ex == 0)
            continue;
        dl_golden_dataset_t ds = *gd; /* the gate's row, its last extent 2f */
        ds.name = nm;
        ds.path = gate_up_pairs[k].name;
        ds.dims[ds.rank - 1] = 'F';
        float *buf = NULL;
        int64_t dims[3], n = dl_golden_dataset_shape(&ds, &g->config, dims);
        void *const *sg = dl_golden_slot(g, gd), *const *su = dl_golden_slot(g, dl_golden_dataset(idx[1]));
        hid_t grp = H5Gopen2(file, gname, H5P_DEFAULT);
        if (grp < 0)
            FAILF(DL_EFORMAT, "%s: cannot open its group", ds.path);
        if (*sg || *su || (g->bad_datasets & (DL_ROWSET_BIT(idx[0]) | DL_ROWSET_BIT(idx[1])))) {
            snprintf(r->why, sizeof r->why, "given twice: as %s and interleaved as %s",
                     *sg || DL_ROWSET_HAS(g->bad_datasets, idx[0]) ? gd->name
                                                                  : dl_golden_dataset(idx[1])->name,
                     nm);
            rc = 2;
        } else {
            rc = read_dataset(r, grp, &ds, &g->config, (void **)&buf);
        }
        H5Gclose(grp);
        if (rc < 0)
            goto fail;
        gate_up_put(r, g, idx, rc, buf, n);
        free(buf);
        rc = 0;
    }
fail:
    return rc;
}

int dl__golden_load(const char *path, const dl_moe_config_t *expect, int strict, int seal_checked,
                    dl_golden_file_t *g, char *err, size_t errlen)
{
    if (!path || !g || (!strict && !expect))
        return DL_EINVAL;
    memset(g, 0, sizeof *g);
    g->owner_ = DL__GOLDEN_OWNER_MALLOC;
    rctx_t rr = {path, err, errlen, strict, "", 0, DL_F32}, *r = &rr;
    int rc = 0;
    hid_t fapl = -1, file = -1;
    dl__h5_quiet_t q;
    dl__h5_quiet_on(&q);
    if ((rc = open_file(r, seal_checked, g, &fapl, &file)) < 0 || (rc = read_root(r, file, g)) < 0)
        goto fail;
    if (strict) {
        if ((rc = read_config(r, file, &g->config)) < 0)
            goto fail;
    } else {
        g->config = *expect;
        if ((rc = check_candidate_config(r, file, expect)) < 0)
            goto fail;
    }
    if ((rc = read_groups(r, file, g)) < 0 || (!strict && (rc = read_gate_up(r, file, g)) < 0))
        goto fail;
    if (strict && g->has_forward && (rc = check_forward(r, g)) < 0)
        goto fail;
    if ((rc = dl__golden_ep_read(file, g, strict, path, err, errlen)) < 0 ||
        (rc = dl__golden_layouts_read(file, g, strict, path, err, errlen)) < 0)
        goto fail;
    if (strict && g->has_inputs && (rc = check_finite(r, g)) < 0)
        goto fail;
    rc = 0;
fail:
    CLOSE(H5Fclose, file);
    CLOSE(H5Pclose, fapl);
    dl__h5_quiet_off(&q);
    if (rc < 0)
        dl_golden_free(g);
    return rc < 0 ? rc : 0;
}

int dl_golden_load(const char *path, dl_golden_file_t *g, char *err, size_t errlen)
{
    return dl__golden_load(path, NULL, 1, 0, g, err, errlen);
}

int dl_golden_load_candidate(const char *path, const dl_moe_config_t *expect,
                             dl_golden_file_t *g, char *err, size_t errlen)
{
    return dl__golden_load(path, expect, 0, 0, g, err, errlen);
}
