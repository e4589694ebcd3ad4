/* The golden-file layout (format v1) as one table, shared by the writer,
 * the readers, `dropless info` and the conformance runner. The order of
 * the table is the write order, so it is part of the byte-level format. */
#include "config.h"
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "golden/golden_priv.h"

typedef struct {
    dl_golden_dataset_t pub;
    size_t off; /* of the array pointer inside dl_golden_file_t */
} entry_t;

/* The rows of DL_VALUE_MAP (dropless/values.h), in its order, as datasets. */
#define GROUP_IN DL_GOLDEN_INPUTS
#define GROUP_FW DL_GOLDEN_FORWARD
#define GROUP_AUX DL_GOLDEN_FORWARD
#define GROUP_BW DL_GOLDEN_BACKWARD
#define GNAME_IN "inputs"
#define GNAME_FW "forward"
#define GNAME_AUX "forward"
#define GNAME_BW "backward"
#define MEMBER_IN in
#define MEMBER_FW fwd
#define MEMBER_AUX fwd
#define MEMBER_BW bwd
#define ELEM_ACT DL_GOLDEN_FLOAT
#define ELEM_F32 DL_GOLDEN_FLOAT
#define ELEM_I32 DL_GOLDEN_INT32
#define ELEM_I64 DL_GOLDEN_INT64
#define ELEM_RT DL_GOLDEN_FLOAT
#define ACT_ACT 1
#define ACT_F32 0
#define ACT_I32 0
#define ACT_I64 0
#define ACT_RT 2
#define DS(g, E, n, st, dims, cond, ...)                                                   \
    {{GROUP_##g, #n, "/" GNAME_##g "/" #n, ELEM_##st, ACT_##st, (int)sizeof dims - 1, \
      dims, DL_COND_##cond},                                                              \
     offsetof(dl_golden_file_t, MEMBER_##g.n)},

static const entry_t table[] = {DL_VALUE_MAP(DS)};
#define NTABLE ((int)(sizeof table / sizeof table[0]))

_Static_assert(NTABLE <= DL_GOLDEN_DATASET_MAX, "more datasets than dl_golden_file_t's sets hold");

int dl_golden_dataset_count(void) { return NTABLE; }

const dl_golden_dataset_t *dl_golden_dataset(int i)
{
    return i >= 0 && i < NTABLE ? &table[i].pub : NULL;
}

const dl_golden_dataset_t *dl_golden_dataset_find(const char *path)
{
    if (!path)
        return NULL;
    for (int i = 0; i < NTABLE; i++)
        if (strcmp(table[i].pub.path, path) == 0)
            return &table[i].pub;
    return NULL;
}

int dl_golden_dataset_applies(const dl_golden_dataset_t *ds, const dl_moe_config_t *c)
{
    return dl_cond_applies((dl_cond_t)ds->cond, c);
}

int64_t dl_golden_dataset_shape(const dl_golden_dataset_t *ds, const dl_moe_config_t *c,
                                int64_t dims[3])
{
    int64_t n = 1;
    for (int i = 0; i < ds->rank; i++) {
        if (!strchr("TdfFEkMPSVR", ds->dims[i]))
            return DL_EINTERNAL;
        int64_t v = dl_value_dim(c, ds->dims[i]);
        if (v < 0)
            return DL_EOVERFLOW;
        dims[i] = v;
        if (dl_mul_size(n, v, &n))
            return DL_EOVERFLOW;
    }
    return n;
}

dl_dtype_t dl_golden_dataset_dtype(const dl_golden_dataset_t *ds, const dl_moe_config_t *c)
{
    return ds->act == 1 ? c->dtype : ds->act == 2 ? c->router_dtype : DL_F32;
}

void **dl_golden_slot(dl_golden_file_t *g, const dl_golden_dataset_t *ds)
{
    const entry_t *e = (const entry_t *)(const void *)ds;
    if (e < table || e >= table + NTABLE)
        return NULL;
    return (void **)(void *)((char *)g + e->off);
}

void dl_golden_free(dl_golden_file_t *g)
{
    if (!g)
        return;
    if (g->owner_ == DL__GOLDEN_OWNER_MOE) {
        for (int i = 0; i < NTABLE; i++)
            if (table[i].pub.group == DL_GOLDEN_INPUTS)
                free(*dl_golden_slot(g, &table[i].pub));
        dl_moe_forward_free(&g->fwd);
        dl_moe_backward_free(&g->bwd);
    } else {
        for (int i = 0; i < NTABLE; i++)
            free(*dl_golden_slot(g, &table[i].pub));
    }
    for (int i = 0; i < g->n_ep && i < DL_GOLDEN_EP_MAX; i++)
        dl_ep_layout_free(&g->ep[i]);
    for (int i = 0; g->layouts && i < g->n_layouts; i++)
        dl_layout_free(&g->layouts[i]);
    free(g->layouts);
    memset(g, 0, sizeof *g);
}

/* ------------------------------------------------------------ names */

static const char *const group_names[] = {"max", "top2_sum", "topk_sum"};
static const char *const inputs_names[] = {"random", "zipf", "ties", "empty-experts", "one-hot",
                                           "sizes"};
#define NINPUTS ((int)(sizeof inputs_names / sizeof inputs_names[0]))

static int lookup(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], s) == 0)
            return i;
    return -1;
}

const char *dl__golden_score_name(int v) { return dl_route_score_name((dl_score_fn_t)v); }
const char *dl__golden_group_name(int v) { return v >= 0 && v < 3 ? group_names[v] : NULL; }
const char *dl__golden_ffn_name(int v) { return dl_ffn_name((dl_ffn_t)v); }
const char *dl__golden_inputs_name(int v) { return v >= 0 && v < NINPUTS ? inputs_names[v] : NULL; }
int dl__golden_score_parse(const char *s) { return dl_route_score_parse(s); }
int dl__golden_group_parse(const char *s) { return lookup(group_names, 3, s); }
int dl__golden_ffn_parse(const char *s)
{
    dl_ffn_t k;
    return dl_ffn_parse(s, &k) ? -1 : (int)k;
}
int dl__golden_inputs_parse(const char *s) { return lookup(inputs_names, NINPUTS, s); }

/* One-line messages: "<file>: <what>". */
void dl__golden_msg(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    for (char *p = err; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}
