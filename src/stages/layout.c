/* The kernel layouts (dropless/layout.h): index arrays that place the flat
 * sorted rows of each expert into DeepGEMM's masked and contiguous layouts
 * and vLLM's block-aligned and batched ones. No float is computed: the
 * activations are row copies. */
#include "config.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "stages/stages_priv.h"
#include "dropless/layout.h"

typedef struct {
    const char *name, *param;
    int contract;
} kind_row_t;

static const kind_row_t kinds[DL_LAYOUT_KIND_COUNT] = {
#define X(id, name, param, contract) {name, param, contract},
    DL_LAYOUT_KIND_MAP(X)
#undef X
};

typedef struct {
    const char *name;
    int i64;
    const char *dims;
    unsigned kinds;
} ds_row_t;

static const ds_row_t table[DL_LAYOUT_DATASET_COUNT] = {
#define X(id, field, i64, dims, kinds) {#field, i64, dims, kinds},
    DL_LAYOUT_DATASET_MAP(X)
#undef X
};

const char *dl_layout_kind_name(int k)
{
    return k >= 0 && k < DL_LAYOUT_KIND_COUNT ? kinds[k].name : NULL;
}

const char *dl_layout_param_name(int k)
{
    return k >= 0 && k < DL_LAYOUT_KIND_COUNT ? kinds[k].param : NULL;
}

int dl_layout_contract(int k)
{
    return k >= 0 && k < DL_LAYOUT_KIND_COUNT ? kinds[k].contract : -1;
}

const char *dl_layout_dataset_name(int i)
{
    return i >= 0 && i < DL_LAYOUT_DATASET_COUNT ? table[i].name : NULL;
}

const char *dl_layout_dataset_dims(int i)
{
    return i >= 0 && i < DL_LAYOUT_DATASET_COUNT ? table[i].dims : NULL;
}

unsigned dl_layout_dataset_kinds(int i)
{
    return i >= 0 && i < DL_LAYOUT_DATASET_COUNT ? table[i].kinds : 0u;
}

int dl_layout_dataset_i64(int i)
{
    return i >= 0 && i < DL_LAYOUT_DATASET_COUNT ? table[i].i64 : -1;
}

int dl_layout_dataset_is_float(int i)
{
    return i == DL_LAYOUT_DS_ACT_X || i == DL_LAYOUT_DS_ACT_Y;
}

void **dl_layout_dataset_slot(dl_layout_t *L, int i)
{
    if (!L)
        return NULL;
    switch (i) {
#define X(id, field, i64, dims, kinds) \
    case DL_LAYOUT_DS_##id:            \
        return (void **)&L->field;
        DL_LAYOUT_DATASET_MAP(X)
#undef X
    default:
        return NULL;
    }
}

int dl_layout_dataset_shape(const dl_layout_t *L, int i, int64_t dims[2])
{
    if (!L || i < 0 || i >= DL_LAYOUT_DATASET_COUNT)
        return -1;
    int n = 0;
    for (const char *p = table[i].dims; *p && n < 2; p++)
        dims[n++] = *p == 'G' ? L->e1 - L->e0 : *p == 'P' ? L->e1 - L->e0 + 1
                    : *p == 'R' ? L->n_rows : *p == 'B' ? L->n_blocks : *p == '1' ? 1
                    : *p == 'X' ? L->n_x : *p == 'Y' ? L->n_y : L->hidden;
    return n;
}

int dl_layout_parse(const char *spec, int *kind, int64_t *param)
{
    const char *colon = spec ? strchr(spec, ':') : NULL;
    if (!colon || !kind || !param)
        return DL_EINVAL;
    int k = -1;
    for (int i = 0; i < DL_LAYOUT_KIND_COUNT; i++)
        if ((size_t)(colon - spec) == strlen(kinds[i].name) &&
            !strncmp(spec, kinds[i].name, (size_t)(colon - spec)))
            k = i;
    char *end = (char *)colon;
    errno = 0;
    long long v = colon[1] >= '0' && colon[1] <= '9' ? strtoll(colon + 1, &end, 10) : 0;
    if (k < 0 || v < 1 || v > (1 << 20) || errno || *end)
        return DL_EINVAL;
    *kind = k;
    *param = v;
    return 0;
}

void dl_layout_free(dl_layout_t *L)
{
    if (!L)
        return;
    for (int i = 0; i < DL_LAYOUT_DATASET_COUNT; i++)
        free(*dl_layout_dataset_slot(L, i));
    free(L->x_src);
    free(L->y_src);
    memset(L, 0, sizeof *L);
}

static int64_t round_up(int64_t n, int64_t a)
{
    return (n + a - 1) / a * a;
}

static void *alloc_n(int64_t n, size_t size)
{
    return calloc(n > 0 ? (size_t)n : 1, size);
}

/* masked and batched: [G, cap] rows, group g's first sizes[e0+g] rows its
 * sorted rows in order, the rest padding. */
static int lay_dense(dl_layout_t *L, const int64_t *sizes, const int64_t *off)
{
    const int64_t G = L->e1 - L->e0, cap = L->param;
    int32_t *cnt = alloc_n(G, sizeof *cnt);
    L->n_rows = L->n_x = L->n_y = G * cap;
    L->x_src = alloc_n(L->n_x, sizeof *L->x_src);
    L->y_src = alloc_n(L->n_y, sizeof *L->y_src);
    if (!cnt || !L->x_src || !L->y_src) {
        free(cnt);
        return DL_ENOMEM;
    }
    *(L->kind == DL_LAYOUT_MASKED ? &L->masked_m : &L->expert_num_tokens) = cnt;
    int64_t used = 0;
    for (int64_t g = 0; g < G; g++) {
        const int64_t n = sizes[L->e0 + g];
        if (n > cap)
            return DL_ERANGE;
        cnt[g] = (int32_t)n;
        used += n;
        for (int64_t i = 0; i < cap; i++)
            L->x_src[g * cap + i] = i < n ? (int32_t)(off[L->e0 + g] + i) : DL_LAYOUT_PAD;
    }
    memcpy(L->y_src, L->x_src, (size_t)L->n_x * sizeof *L->y_src);
    /* DeepGEMM's hint: the mean group size, rounded up, at least 1 */
    if (L->kind == DL_LAYOUT_MASKED)
        L->expected_m = G > 0 && used > 0 ? (used + G - 1) / G : 1;
    return 0;
}

/* contiguous: the groups one after another, each rounded up to ALIGN rows
 * (an empty group takes none), m_indices the local expert or -1. */
static int lay_contiguous(dl_layout_t *L, const int64_t *sizes, const int64_t *off)
{
    const int64_t G = L->e1 - L->e0, a = L->param;
    if (!(L->group_offsets = alloc_n(G + 1, sizeof *L->group_offsets)))
        return DL_ENOMEM;
    for (int64_t g = 0; g < G; g++) {
        const int64_t p = round_up(sizes[L->e0 + g], a);
        if (p > INT32_MAX - L->group_offsets[g])
            return DL_EOVERFLOW;
        L->group_offsets[g + 1] = L->group_offsets[g] + p;
    }
    L->n_rows = L->n_x = L->n_y = L->group_offsets[G];
    L->m_indices = alloc_n(L->n_rows, sizeof *L->m_indices);
    L->x_src = alloc_n(L->n_x, sizeof *L->x_src);
    L->y_src = alloc_n(L->n_y, sizeof *L->y_src);
    if (!L->m_indices || !L->x_src || !L->y_src)
        return DL_ENOMEM;
    for (int64_t g = 0; g < G; g++) {
        const int64_t n = sizes[L->e0 + g], b = L->group_offsets[g];
        for (int64_t i = b; i < L->group_offsets[g + 1]; i++) {
            const int in = i - b < n;
            L->m_indices[i] = in ? (int32_t)g : -1;
            L->x_src[i] = L->y_src[i] = in ? (int32_t)(off[L->e0 + g] + i - b) : DL_LAYOUT_PAD;
        }
    }
    return 0;
}

/* vllm-block: moe_align_block_size over every expert (local or not), each
 * segment rounded up to BLOCK slots filled with the sentinel numel. */
static int lay_vllm(dl_layout_t *L, const int64_t *sizes, const int64_t *off, const int32_t *perm)
{
    const int64_t E = L->experts, B = L->param, numel = L->tokens * L->top_k;
    if (numel > INT32_MAX - E * (B - 1))
        return DL_EOVERFLOW;
    L->n_rows = numel + E * (B - 1);
    L->n_blocks = (L->n_rows + B - 1) / B;
    L->n_x = L->tokens + 1; /* the sentinel's token row numel / k = T */
    L->n_y = numel + 1;     /* the sentinel's output row */
    L->sorted_token_ids = alloc_n(L->n_rows, sizeof(int32_t));
    L->expert_ids = alloc_n(L->n_blocks, sizeof(int32_t));
    L->num_tokens_post_padded = alloc_n(1, sizeof(int32_t));
    L->x_src = alloc_n(L->n_x, sizeof *L->x_src);
    L->y_src = alloc_n(L->n_y, sizeof *L->y_src);
    if (!L->sorted_token_ids || !L->expert_ids || !L->num_tokens_post_padded || !L->x_src ||
        !L->y_src)
        return DL_ENOMEM;
    for (int64_t i = 0; i < L->n_rows; i++)
        L->sorted_token_ids[i] = (int32_t)numel;
    for (int64_t b = 0; b < L->n_blocks; b++)
        L->expert_ids[b] = -1;
    int64_t pos = 0;
    for (int64_t e = 0; e < E; e++) {
        const int local = e >= L->e0 && e < L->e1;
        for (int64_t i = 0; i < sizes[e]; i++) {
            const int32_t f = perm[off[e] + i];
            L->sorted_token_ids[pos + i] = f;
            L->y_src[f] = local ? (int32_t)(off[e] + i) : DL_LAYOUT_NONLOCAL;
        }
        for (int64_t b = pos / B; b < (pos + round_up(sizes[e], B)) / B; b++)
            L->expert_ids[b] = local ? (int32_t)(e - L->e0) : -1;
        pos += round_up(sizes[e], B);
    }
    L->num_tokens_post_padded[0] = (int32_t)pos;
    for (int64_t t = 0; t < L->tokens; t++)
        L->x_src[t] = (int32_t)t;
    L->x_src[L->tokens] = L->y_src[numel] = DL_LAYOUT_PAD;
    return 0;
}

int dl_layout_compute(int kind, int64_t param, const int64_t *group_sizes, const int32_t *sort_perm,
                      int64_t T, int64_t k, int64_t E, int64_t e0, int64_t e1, dl_layout_t *L)
{
    if (!L)
        return DL_EINVAL;
    memset(L, 0, sizeof *L);
    if (!group_sizes || !sort_perm || kind < 0 || kind >= DL_LAYOUT_KIND_COUNT || param < 1 ||
        T < 0 || k < 1 || E < 1 || e0 < 0 || e1 > E || e0 >= e1)
        return DL_EINVAL;
    if (T > INT32_MAX / k)
        return DL_EOVERFLOW;
    int64_t *off = malloc((size_t)(E + 1) * sizeof *off);
    if (!off)
        return DL_ENOMEM;
    off[0] = 0;
    int rc = 0;
    for (int64_t e = 0; e < E && !rc; e++) {
        rc = group_sizes[e] < 0 ? DL_ERANGE : 0;
        off[e + 1] = off[e] + group_sizes[e];
    }
    if (!rc && off[E] != T * k)
        rc = DL_ERANGE;
    for (int64_t p = 0; !rc && p < T * k; p++)
        rc = sort_perm[p] < 0 || sort_perm[p] >= T * k ? DL_ERANGE : 0;
    *L = (dl_layout_t){.kind = kind, .param = param, .tokens = T, .top_k = k, .experts = E,
                       .ranks = 1, .rank = -1, .e0 = e0, .e1 = e1, .expected_m = 0};
    if (!rc)
        rc = kind == DL_LAYOUT_CONTIGUOUS   ? lay_contiguous(L, group_sizes, off)
             : kind == DL_LAYOUT_VLLM_BLOCK ? lay_vllm(L, group_sizes, off, sort_perm)
                                            : lay_dense(L, group_sizes, off);
    free(off);
    if (rc)
        dl_layout_free(L);
    return rc;
}

/* Rows of dst from src by code: a source row, else 0 or the poison. */
static void fill_rows(float *dst, const int32_t *code, int64_t n, const float *src, int64_t d,
                      int poison)
{
    const uint32_t nan_bits = 0x7fc00000u;
    float nan;
    memcpy(&nan, &nan_bits, sizeof nan);
    for (int64_t i = 0; i < n; i++) {
        float *row = dst + i * d;
        if (code[i] >= 0)
            memcpy(row, src + (int64_t)code[i] * d, (size_t)d * sizeof *row);
        else
            for (int64_t c = 0; c < d; c++)
                row[c] = poison && code[i] == DL_LAYOUT_PAD ? nan : 0.0f;
    }
}

int dl_layout_fill(dl_layout_t *L, const float *x, const float *x_sorted, const float *y_sorted,
                   int64_t d, int poison)
{
    const float *xs = L && L->kind == DL_LAYOUT_VLLM_BLOCK ? x : x_sorted;
    const int64_t M = L ? L->tokens * L->top_k : 0;
    if (!L || !L->x_src || !L->y_src || d < 0 || ((!xs || !y_sorted) && M > 0))
        return DL_EINVAL;
    free(L->x);
    free(L->y);
    L->hidden = d;
    L->x = alloc_n(L->n_x * d, sizeof(float));
    L->y = alloc_n(L->n_y * d, sizeof(float));
    if (!L->x || !L->y)
        return DL_ENOMEM;
    fill_rows(L->x, L->x_src, L->n_x, xs, d, poison);
    fill_rows(L->y, L->y_src, L->n_y, y_sorted, d, poison);
    L->poisoned = poison != 0;
    return 0;
}
