/* The exact oracle as XLA FFI targets on the host (dropless.jax): the
 * layer's forward pass, dl_moe_forward, and its backward pass,
 * dl_moe_backward, over XLA's FFI C API (xla/ffi/api/c_api.h, shipped by
 * jaxlib). The handler converts buffers and nothing else: every value comes
 * from libdropless, so the outputs are the golden's bits.
 *
 * Calling convention (the Python side builds it from the same table,
 * DL_VALUE_MAP, through dropless.layout()):
 *   attribute "config"  the layer's configuration as case-file text
 *                       (dl_api_config_parse)
 *   operands            the inputs that apply to the configuration, in the
 *                       table's order (x, router_weight, [expert_bias],
 *                       [w_gate, w_up], w_down, ...), then d_out for the
 *                       backward, then [token_ids, hash_table] (int32, S32)
 *                       under hash routing
 *   results             the forward (or backward) stage values that apply,
 *                       in the table's order
 * Float buffers are of each array's storage type (bf16 and fp16 as XLA's
 * BF16 and F16: the same 16-bit patterns as the library's); int64 arrays
 * (group sizes and offsets) may also be S32, for JAX without x64: every
 * value is at most T * k, which the configuration bounds to int32.
 *
 * Built by dropless/jax/_build.py with the system C compiler; its symbols
 * from libdropless are resolved against the copy the package loaded. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "xla/ffi/api/c_api.h"
#include "dropless.h"

#define ERRLEN 1024
#define CONFIG_MAX 4096
#define MAX_OWNED 16 /* at least the input rows: x, router weight, weights, biases, d_out */

/* What the package checks before it registers the targets: the api.h
 * version this handler was compiled against. */
int dl_jax_ffi_api_version(void) { return DL_API_VERSION; }

typedef struct {
    const XLA_FFI_Api *api;
    const char *target;
    dl_moe_config_t c;
    dl_moe_inputs_t in;
    float *owned[MAX_OWNED]; /* 16-bit inputs widened to float */
    int nowned;
    char err[ERRLEN];
} job_t;

static XLA_FFI_Error *make_error(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *msg)
{
    XLA_FFI_Error_Create_Args a;
    memset(&a, 0, sizeof a);
    a.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    a.message = msg;
    a.errc = code;
    return api->XLA_FFI_Error_Create(&a);
}

/* A library code and message as an XLA error "target: message (DL_X)". */
static XLA_FFI_Error *job_error(job_t *j, int rc)
{
    char msg[ERRLEN + 128];
    snprintf(msg, sizeof msg, "%s: %s (%s)", j->target, j->err[0] ? j->err : dl_strerror(rc),
             dl_err_name(rc));
    return make_error(j->api, rc == DL_ENOMEM ? XLA_FFI_Error_Code_RESOURCE_EXHAUSTED
                                              : XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
}

#ifdef __GNUC__
__attribute__((format(printf, 3, 4)))
#endif
static int job_fail(job_t *j, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err, sizeof j->err, fmt, ap);
    va_end(ap);
    return rc;
}

static const char *type_name(XLA_FFI_DataType t)
{
    switch (t) {
    case XLA_FFI_DataType_F32: return "f32";
    case XLA_FFI_DataType_BF16: return "bf16";
    case XLA_FFI_DataType_F16: return "f16";
    case XLA_FFI_DataType_F64: return "f64";
    case XLA_FFI_DataType_S32: return "s32";
    case XLA_FFI_DataType_S64: return "s64";
    default: return "another type";
    }
}

/* The handshake XLA makes when the target is registered: the FFI version of
 * the header this file was compiled with, so that XLA refuses a handler it
 * cannot call instead of calling it wrongly. */
static XLA_FFI_Error *metadata(XLA_FFI_CallFrame *cf)
{
    XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)cf->extension_start;
    if (ext->extension_base.struct_size < XLA_FFI_Metadata_Extension_STRUCT_SIZE ||
        !ext->metadata || ext->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE)
        return make_error(cf->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                          "dropless FFI handler: XLA's metadata structs are older than the FFI "
                          "header it was compiled with: rebuild it against this jaxlib");
    XLA_FFI_Api_Version v;
    memset(&v, 0, sizeof v);
    v.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    v.major_version = XLA_FFI_API_MAJOR;
    v.minor_version = XLA_FFI_API_MINOR;
    ext->metadata->api_version = v;
    ext->metadata->traits = 0;
    return NULL;
}

/* The call frame is one this handler can read: a call of another major
 * version, or of an older struct layout, is refused. */
static XLA_FFI_Error *frame_check(XLA_FFI_CallFrame *cf, const char *target)
{
    char msg[256];
    if (cf->struct_size < XLA_FFI_CallFrame_STRUCT_SIZE ||
        cf->api->api_version.major_version != XLA_FFI_API_MAJOR) {
        snprintf(msg, sizeof msg, "%s: XLA FFI API %d.%d (call frame of %zu bytes) cannot call a "
                 "handler built for %d.%d: rebuild it against this jaxlib", target,
                 cf->api->api_version.major_version, cf->api->api_version.minor_version,
                 cf->struct_size, XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
        return make_error(cf->api, XLA_FFI_Error_Code_FAILED_PRECONDITION, msg);
    }
    if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE) {
        snprintf(msg, sizeof msg, "%s: called at execution stage %d, registered for execute only",
                 target, (int)cf->stage);
        return make_error(cf->api, XLA_FFI_Error_Code_INTERNAL, msg);
    }
    return NULL;
}

/* The "config" attribute, parsed by the library. */
static int parse_config(job_t *j, const XLA_FFI_CallFrame *cf)
{
    for (int64_t i = 0; i < cf->attrs.size; i++) {
        const XLA_FFI_ByteSpan *name = cf->attrs.names[i];
        if (name->len != 6 || memcmp(name->ptr, "config", 6) != 0)
            continue;
        if (cf->attrs.types[i] != XLA_FFI_AttrType_STRING)
            return job_fail(j, DL_EINVAL, "attribute config is not a string");
        const XLA_FFI_ByteSpan *v = cf->attrs.attrs[i];
        char text[CONFIG_MAX + 1];
        if (v->len > CONFIG_MAX)
            return job_fail(j, DL_EOVERFLOW, "attribute config is too long");
        memcpy(text, v->ptr, v->len);
        text[v->len] = '\0';
        return dl_api_config_parse(text, &j->c, NULL, 0, j->err, sizeof j->err);
    }
    return job_fail(j, DL_EINVAL, "no attribute config");
}

/* The XLA element type that holds a row's values (alt: also accepted). */
static XLA_FFI_DataType row_type(const dl_layout_row_t *r, const dl_moe_config_t *c,
                                 XLA_FFI_DataType *alt)
{
    *alt = XLA_FFI_DataType_INVALID;
    switch (r->store) {
    case DL_STORE_ACT:
    case DL_STORE_RT: { /* the case's dtype; the router weight's own storage type */
        const dl_dtype_t t = r->store == DL_STORE_ACT ? c->dtype : c->router_dtype;
        return t == DL_BF16 ? XLA_FFI_DataType_BF16
               : t == DL_F16 ? XLA_FFI_DataType_F16 : XLA_FFI_DataType_F32;
    }
    case DL_STORE_I32:
        return XLA_FFI_DataType_S32;
    case DL_STORE_I64:
        *alt = XLA_FFI_DataType_S32;
        return XLA_FFI_DataType_S64;
    default:
        return XLA_FFI_DataType_F32;
    }
}

static void shape_text(char *buf, size_t n, int rank, const int64_t *dims)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < rank && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

/* Buffer b holds row r for the configuration: element type and shape. */
static int buffer_check(job_t *j, const dl_layout_row_t *r, const XLA_FFI_Buffer *b)
{
    if (b->struct_size < XLA_FFI_Buffer_STRUCT_SIZE)
        return job_fail(j, DL_EINVAL, "%s: a buffer of an older FFI layout", r->name);
    XLA_FFI_DataType alt, want = row_type(r, &j->c, &alt);
    if (b->dtype != want && (alt == XLA_FFI_DataType_INVALID || b->dtype != alt))
        return job_fail(j, DL_EDTYPE, "%s: element type %s, the configuration needs %s%s", r->name,
                        type_name(b->dtype), type_name(want), alt ? " or s32" : "");
    int64_t dims[3];
    int rank = dl_layout_shape(r, &j->c, dims), same = b->rank == rank;
    for (int i = 0; same && i < rank; i++)
        same = b->dims[i] == dims[i];
    if (!same) {
        char got[96], need[96];
        shape_text(got, sizeof got, (int)(b->rank < 3 ? b->rank : 3), b->dims);
        shape_text(need, sizeof need, rank, dims);
        return job_fail(j, DL_ESHAPE, "%s: shape %s, the configuration needs %s", r->name, got, need);
    }
    return 0;
}

/* Input row `name` of j->in (DL_VALUE_MAP's IN rows) set to p: float
 * rows and the int32 ones of hash routing (token_ids, hash_table) alike,
 * each member of its own pointer type. Returns 0, or -1 for no such row. */
static int set_input(dl_moe_inputs_t *in, const char *name, const void *p)
{
#define SLOT_IN(n) if (!strcmp(name, #n)) { in->n = p; return 0; }
#define SLOT_FW(n)
#define SLOT_AUX(n)
#define SLOT_BW(n)
#define SLOT(g, E, n, st, dims, cond, ...) SLOT_##g(n)
    DL_VALUE_MAP(SLOT)
#undef SLOT
#undef SLOT_IN
#undef SLOT_FW
#undef SLOT_AUX
#undef SLOT_BW
    return -1;
}

static int put_input(job_t *j, const dl_layout_row_t *r, const void *p)
{
    return set_input(&j->in, r->name, p) ? job_fail(j, DL_EINTERNAL, "%s: not an input row",
                                                    r->name) : 0;
}

/* Buffer b as the values of input row r: float (16-bit patterns widened;
 * exact) or int32 (hash routing's token ids and table, as they are). */
static int take_input(job_t *j, const dl_layout_row_t *r, const XLA_FFI_Buffer *b)
{
    int rc = buffer_check(j, r, b);
    if (rc)
        return rc;
    int64_t n = dl_layout_numel(r, &j->c);
    if (b->dtype == XLA_FFI_DataType_F32 || b->dtype == XLA_FFI_DataType_S32 || n == 0)
        return put_input(j, r, b->data);
    if (j->nowned == MAX_OWNED)
        return job_fail(j, DL_EINTERNAL, "%s: too many 16-bit inputs", r->name);
    float *w = malloc((size_t)n * sizeof *w);
    if (!w)
        return job_fail(j, DL_ENOMEM, "%s: out of memory", r->name);
    j->owned[j->nowned++] = w;
    const uint16_t *h = b->data;
    for (int64_t i = 0; i < n; i++)
        w[i] = b->dtype == XLA_FFI_DataType_BF16 ? dl_bf16_to_float(h[i]) : dl_f16_to_float(h[i]);
    return put_input(j, r, w);
}

/* The operands: every input row that applies, d_out only for the backward. */
static int take_inputs(job_t *j, const XLA_FFI_CallFrame *cf, int backward)
{
    int64_t next = 0;
    for (int i = 0; i < dl_layout_count(); i++) {
        const dl_layout_row_t *r = dl_layout_row(i);
        if (r->group != DL_LAYOUT_INPUTS || !dl_cond_applies(r->cond, &j->c) ||
            (!backward && !strcmp(r->name, "d_out")))
            continue;
        if (next >= cf->args.size || cf->args.types[next] != XLA_FFI_ArgType_BUFFER)
            return job_fail(j, DL_EINVAL, "operand %s missing (%s)", r->name,
                            next >= cf->args.size ? "too few operands" : "not a buffer");
        int rc = take_input(j, r, cf->args.args[next++]);
        if (rc)
            return rc;
    }
    if (next != cf->args.size)
        return job_fail(j, DL_EINVAL, "more operands than the configuration's inputs");
    return 0;
}

/* Row r's values (src, as the library stores them) into result buffer b. */
static void put_result(const dl_layout_row_t *r, const dl_moe_config_t *c, const void *src,
                       const XLA_FFI_Buffer *b)
{
    int64_t n = dl_layout_numel(r, c);
    if (n == 0 || !src)
        return;
    if (b->dtype == XLA_FFI_DataType_BF16 || b->dtype == XLA_FFI_DataType_F16) {
        const float *s = src;
        uint16_t *d = b->data;
        for (int64_t i = 0; i < n; i++) /* exact: the value is on the 16-bit grid */
            d[i] = b->dtype == XLA_FFI_DataType_BF16 ? dl_bf16_from_float(s[i]) : dl_f16_from_float(s[i]);
    } else if (r->store == DL_STORE_I64 && b->dtype == XLA_FFI_DataType_S32) {
        const int64_t *s = src;
        int32_t *d = b->data;
        for (int64_t i = 0; i < n; i++)
            d[i] = (int32_t)s[i];
    } else {
        memcpy(b->data, src, (size_t)n * (r->store == DL_STORE_I64 ? 8 : 4));
    }
}

/* The results: every stage row of `group` that applies; checked (write 0:
 * before the pass runs, so a wrong call costs nothing) or written from f
 * and bw. */
static int results(job_t *j, const XLA_FFI_CallFrame *cf, dl_layout_group_t group, int write,
                   const dl_moe_forward_t *f, const dl_moe_backward_t *bw)
{
    int64_t next = 0;
    for (int i = 0; i < dl_layout_count(); i++) {
        const dl_layout_row_t *r = dl_layout_row(i);
        if (r->group != group || r->value == DL_VALUE_NONE || !dl_cond_applies(r->cond, &j->c))
            continue;
        if (next >= cf->rets.size || cf->rets.types[next] != XLA_FFI_RetType_BUFFER)
            return job_fail(j, DL_EINVAL, "result %s missing", r->name);
        const XLA_FFI_Buffer *b = cf->rets.rets[next++];
        int rc = write ? 0 : buffer_check(j, r, b);
        if (rc)
            return rc;
        if (write)
            put_result(r, &j->c, dl_layout_data(r, NULL, f, bw), b);
    }
    if (next != cf->rets.size)
        return job_fail(j, DL_EINVAL, "more results than the configuration's stages");
    return 0;
}

/* One call: the configuration, the operands, the library's pass, the
 * results; the forward pass alone, or with the backward pass after it. */
static XLA_FFI_Error *run(XLA_FFI_CallFrame *cf, const char *target, int backward)
{
    if (cf->extension_start && cf->extension_start->type == XLA_FFI_Extension_Metadata)
        return metadata(cf);
    XLA_FFI_Error *e = frame_check(cf, target);
    if (e)
        return e;
    job_t j;
    memset(&j, 0, sizeof j);
    j.api = cf->api;
    j.target = target;
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    memset(&f, 0, sizeof f);
    memset(&b, 0, sizeof b);
    dl_layout_group_t group = backward ? DL_LAYOUT_BACKWARD : DL_LAYOUT_FORWARD;
    int rc = parse_config(&j, cf);
    if (!rc)
        rc = take_inputs(&j, cf, backward);
    if (!rc)
        rc = results(&j, cf, group, 0, NULL, NULL);
    if (!rc && (rc = dl_moe_forward(&j.c, &j.in, &f)))
        snprintf(j.err, sizeof j.err, "dl_moe_forward: %s", dl_strerror(rc));
    if (!rc && backward && (rc = dl_moe_backward(&j.c, &j.in, &f, &b)))
        snprintf(j.err, sizeof j.err, "dl_moe_backward: %s", dl_strerror(rc));
    if (!rc)
        rc = results(&j, cf, group, 1, &f, &b);
    dl_moe_backward_free(&b);
    dl_moe_forward_free(&f);
    for (int i = 0; i < j.nowned; i++)
        free(j.owned[i]);
    return rc ? job_error(&j, rc) : NULL;
}

XLA_FFI_Error *dl_jax_moe_forward(XLA_FFI_CallFrame *cf)
{
    return run(cf, "dropless_moe_forward", 0);
}

XLA_FFI_Error *dl_jax_moe_backward(XLA_FFI_CallFrame *cf)
{
    return run(cf, "dropless_moe_backward", 1);
}
