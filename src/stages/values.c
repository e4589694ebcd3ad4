/* The layer's arrays and stage values, generated from DL_VALUE_MAP: their
 * names, struct slots, storage rules and shapes, and the allocation and
 * release of the forward and backward structs. Nothing here lists an array
 * by hand. */
#include "config.h"
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "stages/stages_priv.h"

typedef struct {
    dl_layout_row_t pub;
    size_t off; /* of the array pointer inside its struct */
} row_t;

#define GROUP_IN DL_LAYOUT_INPUTS
#define GROUP_FW DL_LAYOUT_FORWARD
#define GROUP_AUX DL_LAYOUT_FORWARD
#define GROUP_BW DL_LAYOUT_BACKWARD
#define STRUCT_IN dl_moe_inputs_t
#define STRUCT_FW dl_moe_forward_t
#define STRUCT_AUX dl_moe_forward_t
#define STRUCT_BW dl_moe_backward_t
#define VALUE_IN(E) DL_VALUE_NONE
#define VALUE_AUX(E) DL_VALUE_NONE
#define VALUE_FW(E) DL_VALUE_##E
#define VALUE_BW(E) DL_VALUE_##E

#define ROW(g, E, n, st, dims, cond, ...)                                                 \
    {{GROUP_##g, #n, VALUE_##g(E), DL_STORE_##st, dims, DL_COND_##cond},               \
     offsetof(STRUCT_##g, n)},
static const row_t rows[] = {DL_VALUE_MAP(ROW)};
#define NROWS ((int)(sizeof rows / sizeof *rows))

/* The row of each stage value: its position in the map. */
#define POS(g, E, n, st, dims, cond, ...) POS_##E,
enum { DL_VALUE_MAP(POS) NPOS };
#define VPOS_IN(E)
#define VPOS_AUX(E)
#define VPOS_FW(E) [DL_VALUE_##E] = POS_##E,
#define VPOS_BW(E) [DL_VALUE_##E] = POS_##E,
#define VPOS(g, E, n, st, dims, cond, ...) VPOS_##g(E)
static const int value_row[DL_VALUE_COUNT] = {DL_VALUE_MAP(VPOS)};

static const row_t *of_value(dl_value_t s)
{
    return (int)s >= 0 && s < DL_VALUE_COUNT ? &rows[value_row[s]] : NULL;
}

/* ---------------------------------------------------------------- rows */

int dl_layout_count(void) { return NROWS; }

const dl_layout_row_t *dl_layout_row(int i)
{
    return i >= 0 && i < NROWS ? &rows[i].pub : NULL;
}

const dl_layout_row_t *dl_layout_find(const char *name)
{
    for (int i = 0; name && i < NROWS; i++)
        if (!strcmp(rows[i].pub.name, name))
            return &rows[i].pub;
    return NULL;
}

static void **slot(const row_t *r, const void *in, const void *f, const void *b)
{
    const void *base = r->pub.group == DL_LAYOUT_INPUTS ? in
                       : r->pub.group == DL_LAYOUT_FORWARD ? f : b;
    return base ? (void **)((char *)(uintptr_t)base + r->off) : NULL;
}

const void *dl_layout_data(const dl_layout_row_t *r, const dl_moe_inputs_t *in,
                           const dl_moe_forward_t *f, const dl_moe_backward_t *b)
{
    if (!r)
        return NULL;
    void **p = slot((const row_t *)(const void *)r, in, f, b);
    return p ? *p : NULL;
}

void **dl_layout_slot(const dl_layout_row_t *r, dl_moe_inputs_t *in, dl_moe_forward_t *f,
                      dl_moe_backward_t *b)
{
    return r ? slot((const row_t *)(const void *)r, in, f, b) : NULL;
}

int64_t dl_layout_numel_rows(const dl_layout_row_t *r, const dl_moe_config_t *c, int64_t first)
{
    int64_t n = dl_layout_numel(r, c), dims[3];
    if (n <= 0 || first < 0)
        return n;
    int rank = dl_layout_shape(r, c, dims);
    n = first;
    for (int i = 1; i < rank; i++)
        n *= dims[i];
    return n;
}

const char *dl_cond_name(dl_cond_t cond)
{
#define COND_NAME(E, name, holds) name,
    static const char *const names[] = {DL_COND_MAP(COND_NAME)};
#undef COND_NAME
    return (int)cond >= 0 && cond < DL_COND_COUNT ? names[cond] : "?";
}

int dl_cond_applies(dl_cond_t cond, const dl_moe_config_t *c)
{
#define COND_HOLDS(E, name, holds) \
    case DL_COND_##E: return (holds) ? 1 : 0;
    switch (cond) {
    DL_COND_MAP(COND_HOLDS)
    default: return 0; /* not a condition */
    }
#undef COND_HOLDS
}

int64_t dl_value_dim(const dl_moe_config_t *c, char sym)
{
    int64_t v;
    switch (sym) {
    case 'T': return c->tokens;
    case 'd': return c->hidden;
    case 'f': return c->ffn;
    case 'F': return dl_mul_size(c->ffn, 2, &v) ? DL_EOVERFLOW : v; /* interleaved gate/up */
    case 'E': return c->route.experts;
    case 'k': return c->route.top_k;
    case 'P': return c->route.experts + 1;
    case 'M': return dl_mul_size(c->tokens, c->route.top_k, &v) ? DL_EOVERFLOW : v;
    case 'S': return dl_mul_size(c->shared_experts, c->shared_ffn, &v) ? DL_EOVERFLOW : v;
    case 'V': return c->route.hash_vocab;
    case 'R': return DL_ROUTE_WIDTH(&c->route); /* the router's width E + Z */
    default: return -1;
    }
}

int dl_layout_shape(const dl_layout_row_t *r, const dl_moe_config_t *c, int64_t dims[3])
{
    if (!r)
        return 0;
    int rank = (int)strlen(r->dims);
    for (int i = 0; i < rank; i++)
        dims[i] = dl_value_dim(c, r->dims[i]);
    return rank;
}

int64_t dl_layout_numel(const dl_layout_row_t *r, const dl_moe_config_t *c)
{
    if (!r || !dl_cond_applies(r->cond, c))
        return 0;
    int64_t dims[3], n = 1;
    int rank = dl_layout_shape(r, c, dims);
    for (int i = 0; i < rank; i++)
        n *= dims[i];
    return n;
}

/* -------------------------------------------------------- stage values */

const char *dl_value_name(dl_value_t s)
{
    if (s == DL_VALUE_NONE)
        return "case";
    const row_t *r = of_value(s);
    return r ? r->pub.name : NULL;
}

int dl_value_parse(const char *name, dl_value_t *s)
{
    const dl_layout_row_t *r = dl_layout_find(name);
    if (!r || r->value == DL_VALUE_NONE)
        return DL_ENOTFOUND;
    *s = r->value;
    return 0;
}

int dl_value_is_backward(dl_value_t s)
{
    const row_t *r = of_value(s);
    return r && r->pub.group == DL_LAYOUT_BACKWARD;
}

void **dl__value_slot(dl_moe_forward_t *f, dl_moe_backward_t *b, dl_value_t s)
{
    const row_t *r = of_value(s);
    return r ? slot(r, NULL, f, b) : NULL;
}

const void *dl_value_array(const dl_moe_forward_t *f, const dl_moe_backward_t *b, dl_value_t s)
{
    const row_t *r = of_value(s);
    return r ? dl_layout_data(&r->pub, NULL, f, b) : NULL;
}

dl_store_t dl_value_store(dl_value_t s)
{
    const row_t *r = of_value(s);
    return r ? r->pub.store : DL_STORE_F32;
}

const char *dl_value_dims(dl_value_t s)
{
    const row_t *r = of_value(s);
    return r ? r->pub.dims : "";
}

dl_dtype_t dl_value_dtype(const dl_moe_config_t *c, dl_value_t s)
{
    return dl_value_store(s) == DL_STORE_ACT ? c->dtype
           : dl_value_store(s) == DL_STORE_RT ? c->router_dtype : DL_F32;
}

int dl_value_shape(const dl_moe_config_t *c, dl_value_t s, int64_t dims[3])
{
    const row_t *r = of_value(s);
    return r ? dl_layout_shape(&r->pub, c, dims) : 0;
}

int64_t dl_value_numel(const dl_moe_config_t *c, dl_value_t s)
{
    const row_t *r = of_value(s);
    return r ? dl_layout_numel(&r->pub, c) : 0;
}

/* ------------------------------------------------- the structs' arrays */

/* One row's array into *p, zero-filled, except a backward expert array
 * (dims "E..": the weight and bias gradients, which dl_gemm_ragged_k
 * writes whole, empty experts' zeros too) on kept pages, which keeps the
 * last pass's bits until its producer writes it; a zero-sized one is still
 * allocated, so NULL means no memory. */
static int alloc_row(const row_t *r, const dl_moe_config_t *c, void **p)
{
    int64_t n = dl_layout_numel(&r->pub, c);
    const int whole = r->pub.group == DL_LAYOUT_BACKWARD && r->pub.dims[0] == 'E';
    *p = dl__keep_alloc((n > 0 ? (size_t)n : 1) * (r->pub.store == DL_STORE_I64 ? 8 : 4), !whole);
    return *p ? 0 : DL_ENOMEM;
}

int dl__moe_arrays_alloc(const dl_moe_config_t *c, dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    int rc = 0;
    for (int i = 0; i < NROWS; i++) {
        if (rows[i].pub.group == DL_LAYOUT_INPUTS || !dl_cond_applies(rows[i].pub.cond, c))
            continue;
        void **p = slot(&rows[i], NULL, f, b);
        if (p && alloc_row(&rows[i], c, p))
            rc = DL_ENOMEM;
    }
    return rc;
}

int dl__values_alloc(const dl_moe_config_t *c, dl_moe_forward_t *f, dl_moe_backward_t *b,
                     dl_valueset_t values)
{
    int rc = 0;
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        const row_t *r = of_value((dl_value_t)s);
        void **p = (values >> s) & 1 ? slot(r, NULL, f, b) : NULL;
        if (p && alloc_row(r, c, p))
            rc = DL_ENOMEM;
    }
    return rc;
}

void dl__moe_arrays_free(dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    for (int i = 0; i < NROWS; i++) {
        void **p = rows[i].pub.group == DL_LAYOUT_INPUTS ? NULL : slot(&rows[i], NULL, f, b);
        if (p) {
            dl__keep_free(*p);
            *p = NULL;
        }
    }
}
