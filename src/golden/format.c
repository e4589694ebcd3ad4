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

#define DS(g, gname, field, elem, act, rank, dims, cond, member)                     \
    {{g, #field, "/" gname "/" #field, elem, act, rank, dims, cond},                 \
     offsetof(dl_golden_file_t, member.field)}

#define IN(field, elem, act, rank, dims, cond) \
    DS(DL_GOLDEN_INPUTS, "inputs", field, elem, act, rank, dims, cond, in)
#define FW(field, elem, act, rank, dims, cond) \
    DS(DL_GOLDEN_FORWARD, "forward", field, elem, act, rank, dims, cond, fwd)
#define BW(field, elem, act, rank, dims, cond) \
    DS(DL_GOLDEN_BACKWARD, "backward", field, elem, act, rank, dims, cond, bwd)

#define FL DL_GOLDEN_FLOAT
#define I32 DL_GOLDEN_INT32
#define I64 DL_GOLDEN_INT64
#define ALW DL_GOLDEN_ALWAYS
#define BIAS DL_GOLDEN_IF_BIAS
#define SWI DL_GOLDEN_IF_SWIGLU

static const entry_t table[] = {
    IN(x, FL, 1, 2, "Td", ALW),
    IN(router_weight, FL, 0, 2, "dE", ALW),
    IN(expert_bias, FL, 0, 1, "E", BIAS),
    IN(w_gate, FL, 1, 3, "Edf", SWI),
    IN(w_up, FL, 1, 3, "Edf", SWI),
    IN(w_down, FL, 1, 3, "Efd", ALW),
    IN(d_out, FL, 1, 2, "Td", ALW),

    FW(router_logits, FL, 0, 2, "TE", ALW),
    FW(router_scores, FL, 0, 2, "TE", ALW),
    FW(topk_ids, I32, 0, 2, "Tk", ALW),
    FW(topk_weights, FL, 0, 2, "Tk", ALW),
    FW(tie_margin, FL, 0, 1, "T", ALW),
    FW(sort_perm, I32, 0, 1, "M", ALW),
    FW(inv_perm, I32, 0, 1, "M", ALW),
    FW(group_sizes, I64, 0, 1, "E", ALW),
    FW(group_offsets, I64, 0, 1, "P", ALW),
    FW(x_sorted, FL, 1, 2, "Md", ALW),
    FW(h_gate, FL, 1, 2, "Mf", SWI),
    FW(h_up, FL, 1, 2, "Mf", SWI),
    FW(h_act, FL, 1, 2, "Mf", SWI),
    FW(y_sorted, FL, 1, 2, "Md", ALW),
    FW(out, FL, 1, 2, "Td", ALW),

    BW(d_topk_weights, FL, 0, 2, "Tk", ALW),
    BW(d_y_sorted, FL, 1, 2, "Md", ALW),
    BW(d_h_act, FL, 1, 2, "Mf", SWI),
    BW(d_w_down, FL, 0, 3, "Efd", ALW),
    BW(d_h_gate, FL, 1, 2, "Mf", SWI),
    BW(d_h_up, FL, 1, 2, "Mf", SWI),
    BW(d_x_sorted, FL, 1, 2, "Md", ALW),
    BW(d_w_gate, FL, 0, 3, "Edf", SWI),
    BW(d_w_up, FL, 0, 3, "Edf", SWI),
    BW(d_router_scores, FL, 0, 2, "TE", ALW),
    BW(d_router_logits, FL, 0, 2, "TE", ALW),
    BW(d_router_weight, FL, 0, 2, "dE", ALW),
    BW(d_x, FL, 1, 2, "Td", ALW),
};
#define NTABLE ((int)(sizeof table / sizeof table[0]))

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
    switch (ds->cond) {
    case DL_GOLDEN_IF_BIAS:
        return c->route.has_bias != 0;
    case DL_GOLDEN_IF_SWIGLU:
        return c->ffn_kind == DL_FFN_SWIGLU;
    default:
        return 1;
    }
}

int64_t dl_golden_dataset_shape(const dl_golden_dataset_t *ds, const dl_moe_config_t *c,
                                int64_t dims[3])
{
    int64_t n = 1;
    for (int i = 0; i < ds->rank; i++) {
        int64_t v;
        switch (ds->dims[i]) {
        case 'T': v = c->tokens; break;
        case 'd': v = c->hidden; break;
        case 'f': v = c->ffn; break;
        case 'E': v = c->route.experts; break;
        case 'k': v = c->route.top_k; break;
        case 'P': v = c->route.experts + 1; break;
        case 'M':
            if (dl_mul_size(c->tokens, c->route.top_k, &v))
                return DL_EOVERFLOW;
            break;
        default: return DL_EINTERNAL;
        }
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
    return ds->act ? c->dtype : DL_F32;
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
    memset(g, 0, sizeof *g);
}

/* ------------------------------------------------------------ names */

static const char *const score_names[] = {"softmax", "sigmoid"};
static const char *const group_names[] = {"max", "top2_sum", "topk_sum"};
static const char *const ffn_names[] = {"swiglu", "plain"};
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

const char *dl__golden_score_name(int v) { return v >= 0 && v < 2 ? score_names[v] : NULL; }
const char *dl__golden_group_name(int v) { return v >= 0 && v < 3 ? group_names[v] : NULL; }
const char *dl__golden_ffn_name(int v) { return v >= 0 && v < 2 ? ffn_names[v] : NULL; }
const char *dl__golden_inputs_name(int v) { return v >= 0 && v < NINPUTS ? inputs_names[v] : NULL; }
int dl__golden_score_parse(const char *s) { return lookup(score_names, 2, s); }
int dl__golden_group_parse(const char *s) { return lookup(group_names, 3, s); }
int dl__golden_ffn_parse(const char *s) { return lookup(ffn_names, 2, s); }
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
