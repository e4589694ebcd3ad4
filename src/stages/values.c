/* The stage values of the layer, generated from DL_VALUE_MAP: their names,
 * struct slots, storage rules and shapes, and the allocation and release of
 * the forward and backward structs. Nothing here lists a value by hand. */
#include "config.h"
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "stages/stages_priv.h"

typedef struct {
    const char *name;
    int backward;
    size_t off; /* of the array pointer inside dl_moe_forward_t or dl_moe_backward_t */
    dl_store_t store;
    const char *dims;
    dl_cond_t cond;
} vrow_t;

#define VROW_IN(n, st, dims, cond)
#define VROW_AUX(n, st, dims, cond)
#define VROW_FW(n, st, dims, cond) \
    {#n, 0, offsetof(dl_moe_forward_t, n), DL_STORE_##st, dims, DL_COND_##cond},
#define VROW_BW(n, st, dims, cond) \
    {#n, 1, offsetof(dl_moe_backward_t, n), DL_STORE_##st, dims, DL_COND_##cond},
#define VROW(g, E, n, st, dims, cond) VROW_##g(n, st, dims, cond)

static const vrow_t rows[DL_VALUE_COUNT] = {DL_VALUE_MAP(VROW)};

/* Every array of the two structs, stage values or not (tie_margin), for
 * allocation and release. */
typedef struct {
    int backward;
    size_t off;
    dl_store_t store;
    const char *dims;
    dl_cond_t cond;
} arow_t;

#define AROW_IN(n, st, dims, cond)
#define AROW_FW(n, st, dims, cond) \
    {0, offsetof(dl_moe_forward_t, n), DL_STORE_##st, dims, DL_COND_##cond},
#define AROW_AUX AROW_FW
#define AROW_BW(n, st, dims, cond) \
    {1, offsetof(dl_moe_backward_t, n), DL_STORE_##st, dims, DL_COND_##cond},
#define AROW(g, E, n, st, dims, cond) AROW_##g(n, st, dims, cond)

static const arow_t arrays[] = {DL_VALUE_MAP(AROW)};
#define NARRAYS (sizeof arrays / sizeof *arrays)

static int known(dl_value_t s)
{
    return (int)s >= 0 && s < DL_VALUE_COUNT;
}

const char *dl_value_name(dl_value_t s)
{
    if (s == DL_VALUE_NONE)
        return "case";
    return known(s) ? rows[s].name : NULL;
}

int dl_value_parse(const char *name, dl_value_t *s)
{
    for (int i = 0; name && i < DL_VALUE_COUNT; i++)
        if (!strcmp(name, rows[i].name)) {
            *s = (dl_value_t)i;
            return 0;
        }
    return DL_ENOTFOUND;
}

int dl_value_is_backward(dl_value_t s)
{
    return known(s) && rows[s].backward;
}

void **dl__value_slot(dl_moe_forward_t *f, dl_moe_backward_t *b, dl_value_t s)
{
    if (!known(s))
        return NULL;
    char *base = rows[s].backward ? (char *)b : (char *)f;
    return base ? (void **)(base + rows[s].off) : NULL;
}

const void *dl_value_array(const dl_moe_forward_t *f, const dl_moe_backward_t *b, dl_value_t s)
{
    /* the slot is only read here */
    void **p = dl__value_slot((dl_moe_forward_t *)f, (dl_moe_backward_t *)b, s);
    return p ? *p : NULL;
}

dl_store_t dl_value_store(dl_value_t s)
{
    return known(s) ? rows[s].store : DL_STORE_F32;
}

const char *dl_value_dims(dl_value_t s)
{
    return known(s) ? rows[s].dims : "";
}

dl_dtype_t dl_value_dtype(const dl_moe_config_t *c, dl_value_t s)
{
    return known(s) && rows[s].store == DL_STORE_ACT ? c->dtype : DL_F32;
}

int dl_cond_applies(dl_cond_t cond, const dl_moe_config_t *c)
{
    switch (cond) {
    case DL_COND_BIAS: return c->route.has_bias != 0;
    case DL_COND_SWIGLU: return c->ffn_kind == DL_FFN_SWIGLU;
    default: return 1;
    }
}

int64_t dl_value_dim(const dl_moe_config_t *c, char sym)
{
    int64_t v;
    switch (sym) {
    case 'T': return c->tokens;
    case 'd': return c->hidden;
    case 'f': return c->ffn;
    case 'E': return c->route.experts;
    case 'k': return c->route.top_k;
    case 'P': return c->route.experts + 1;
    case 'M': return dl_mul_size(c->tokens, c->route.top_k, &v) ? DL_EOVERFLOW : v;
    default: return -1;
    }
}

/* Elements of an array with these dimension symbols for c; 0 when its
 * condition does not hold. */
static int64_t numel_of(const dl_moe_config_t *c, const char *dims, dl_cond_t cond)
{
    if (!dl_cond_applies(cond, c))
        return 0;
    int64_t n = 1;
    for (const char *p = dims; *p; p++)
        n *= dl_value_dim(c, *p);
    return n;
}

int dl_value_shape(const dl_moe_config_t *c, dl_value_t s, int64_t dims[3])
{
    if (!known(s))
        return 0;
    int rank = (int)strlen(rows[s].dims);
    for (int i = 0; i < rank; i++)
        dims[i] = dl_value_dim(c, rows[s].dims[i]);
    return rank;
}

int64_t dl_value_numel(const dl_moe_config_t *c, dl_value_t s)
{
    return known(s) ? numel_of(c, rows[s].dims, rows[s].cond) : 0;
}

/* ------------------------------------------------- the structs' arrays */

static void **array_slot(const arow_t *a, dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    char *base = a->backward ? (char *)b : (char *)f;
    return base ? (void **)(base + a->off) : NULL;
}

int dl__moe_arrays_alloc(const dl_moe_config_t *c, dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    int rc = 0;
    for (size_t i = 0; i < NARRAYS; i++) {
        void **p = array_slot(&arrays[i], f, b);
        if (!p || !dl_cond_applies(arrays[i].cond, c))
            continue;
        int64_t n = numel_of(c, arrays[i].dims, arrays[i].cond);
        /* a zero-sized array is still allocated, so NULL means no memory */
        *p = calloc(n > 0 ? (size_t)n : 1, arrays[i].store == DL_STORE_I64 ? 8 : 4);
        if (!*p)
            rc = DL_ENOMEM;
    }
    return rc;
}

void dl__moe_arrays_free(dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    for (size_t i = 0; i < NARRAYS; i++) {
        void **p = array_slot(&arrays[i], f, b);
        if (p) {
            free(*p);
            *p = NULL;
        }
    }
}
