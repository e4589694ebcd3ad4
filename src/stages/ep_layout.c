/* The expert-parallel dispatch layout (dropless/ep.h): integer bookkeeping
 * of which token rows travel from which source rank to which expert rank,
 * and in which order they land. No float is computed; the weights are
 * copied. One pass over the T*k assignments builds every count, a second
 * places the rows, so R = 256 on a DeepSeek-V3 batch costs O(T*k + R*E). */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "stages/stages_priv.h"
#include "dropless/ep.h"

typedef struct {
    const char *name;
    int elem;
    const char *dims;
    int forms;
} ep_row_t;

static const ep_row_t table[DL_EP_DATASET_COUNT] = {
#define X(id, field, elem, dims, forms) {#field, elem, dims, forms},
    DL_EP_DATASET_MAP(X)
#undef X
};

const char *dl_ep_dataset_name(int i)
{
    return i >= 0 && i < DL_EP_DATASET_COUNT ? table[i].name : NULL;
}

int dl_ep_dataset_elem(int i)
{
    return i >= 0 && i < DL_EP_DATASET_COUNT ? table[i].elem : -1;
}

const char *dl_ep_dataset_dims(int i)
{
    return i >= 0 && i < DL_EP_DATASET_COUNT ? table[i].dims : NULL;
}

int dl_ep_dataset_forms(int i)
{
    return i >= 0 && i < DL_EP_DATASET_COUNT ? table[i].forms : -1;
}

int dl_ep_dataset_find(const char *name)
{
    for (int i = 0; name && i < DL_EP_DATASET_COUNT; i++)
        if (!strcmp(name, table[i].name))
            return i;
    return -1;
}

void **dl_ep_slot(dl_ep_layout_t *L, int i)
{
    if (!L)
        return NULL;
    switch (i) {
#define X(id, field, elem, dims, forms) \
    case DL_EP_##id:                    \
        return (void **)&L->field;
        DL_EP_DATASET_MAP(X)
#undef X
    default:
        return NULL;
    }
}

int dl_ep_dataset_shape(const dl_ep_layout_t *L, int i, int64_t dims[2])
{
    if (!L || i < 0 || i >= DL_EP_DATASET_COUNT)
        return -1;
    int n = 0;
    for (const char *p = table[i].dims; *p && n < 2; p++)
        dims[n++] = *p == 'R' ? L->ranks : *p == 'E' ? L->experts : *p == 'k' ? L->top_k
                    : *p == 'P' ? L->ranks + 1 : *p == 'T' ? L->n_tokens : L->n_recv;
    return n;
}

void dl_ep_source_range(int64_t T, int64_t R, int64_t s, int64_t *begin, int64_t *end)
{
    /* s*T fits: T*k fits int32 and s <= R <= E */
    *begin = R > 0 ? s * T / R : 0;
    *end = R > 0 ? (s + 1) * T / R : 0;
}

void dl_ep_layout_free(dl_ep_layout_t *L)
{
    if (!L)
        return;
    for (int i = 0; i < DL_EP_DATASET_COUNT; i++)
        free(*dl_ep_slot(L, i));
    memset(L, 0, sizeof *L);
}

static size_t elem_size(int e)
{
    return e == DL_EP_I64 ? 8 : e == DL_EP_BOOL ? 1 : 4;
}

/* Every dataset of the forms asked for, zeroed, at L's shape. */
static int alloc_form(dl_ep_layout_t *L, int form)
{
    for (int i = 0; i < DL_EP_DATASET_COUNT; i++) {
        if (!(table[i].forms & form))
            continue;
        int64_t dims[2] = {1, 1};
        int nd = dl_ep_dataset_shape(L, i, dims);
        int64_t n = nd == 2 ? dims[0] * dims[1] : dims[0];
        void **slot = dl_ep_slot(L, i);
        if (!(*slot = calloc(n > 0 ? (size_t)n : 1, elem_size(table[i].elem))))
            return DL_ENOMEM;
    }
    return 0;
}

/* Exclusive prefix sums of a [R, R] count matrix, along rows and columns. */
static void prefixes(dl_ep_layout_t *L)
{
    const int64_t R = L->ranks;
    for (int64_t s = 0; s < R; s++)
        for (int64_t r = 1; r < R; r++)
            L->send_displs[s * R + r] = L->send_displs[s * R + r - 1] + L->send_counts[s * R + r - 1];
    for (int64_t r = 0; r < R; r++)
        for (int64_t s = 1; s < R; s++)
            L->recv_displs[r * R + s] = L->recv_displs[r * R + s - 1] + L->send_counts[(s - 1) * R + r];
    for (int64_t r = 0; r < R; r++)
        L->recv_offsets[r + 1] = L->recv_offsets[r] + L->num_tokens_per_rank[r];
}

/* The counts: is_token_in_rank, per rank, per expert, per source. */
static void count(dl_ep_layout_t *L, const int32_t *ids)
{
    const int64_t R = L->ranks, E = L->experts, k = L->top_k, per = E / R;
    for (int64_t s = 0; s < R; s++) {
        int64_t b, e;
        dl_ep_source_range(L->tokens, R, s, &b, &e);
        for (int64_t t = b; t < e; t++) {
            uint8_t *in = L->is_token_in_rank + t * R;
            for (int64_t j = 0; j < k; j++) {
                int64_t x = ids[t * k + j];
                in[x / per] = 1;
                L->num_tokens_per_expert[x]++;
                L->send_expert_counts[s * E + x]++;
            }
            for (int64_t r = 0; r < R; r++) {
                L->send_counts[s * R + r] += in[r];
                L->num_tokens_per_rank[r] += in[r];
            }
        }
    }
}

/* Places each token's copy on each of its ranks, in ascending token order
 * (source ranks own ascending contiguous ranges, so this is the canonical
 * order: by source, then token). */
static void place(dl_ep_layout_t *L, const int32_t *ids, const float *w, int64_t *cursor)
{
    const int64_t R = L->ranks, k = L->top_k, per = L->experts / R;
    memcpy(cursor, L->recv_offsets, (size_t)R * sizeof *cursor);
    for (int64_t t = 0; t < L->tokens; t++)
        for (int64_t r = 0; r < R; r++) {
            if (!L->is_token_in_rank[t * R + r])
                continue;
            int64_t row = cursor[r]++;
            L->recv_token[row] = (int32_t)t;
            for (int64_t j = 0; j < k; j++) {
                int64_t x = ids[t * k + j];
                int on = x / per == r;
                L->recv_topk_idx[row * k + j] = on ? (int32_t)(x - r * per) : -1;
                /* the weight's bits, not a float operation */
                if (on)
                    memcpy(&L->recv_topk_weights[row * k + j], &w[t * k + j], sizeof(float));
            }
        }
}

int dl_ep_layout(const int32_t *topk_ids, const float *topk_weights, int64_t T, int64_t k,
                 int64_t E, int64_t R, dl_ep_layout_t *L)
{
    if (!L)
        return DL_EINVAL;
    memset(L, 0, sizeof *L);
    if (!topk_ids || !topk_weights || T < 0 || k < 1 || E < 1 || R < 1 || E % R)
        return DL_EINVAL;
    if (T > INT32_MAX / k)
        return DL_EOVERFLOW;
    for (int64_t i = 0; i < T * k; i++)
        if (topk_ids[i] < 0 || topk_ids[i] >= E)
            return DL_ERANGE;
    L->ranks = R;
    L->experts = E;
    L->top_k = k;
    L->tokens = L->n_tokens = T;
    L->rank = -1;
    /* N <= T*k <= INT32_MAX, so recv_* are sized after the counts */
    L->n_recv = 0;
    int64_t *cursor = malloc((size_t)R * sizeof *cursor);
    int rc = cursor ? alloc_form(L, DL_EP_WHOLE) : DL_ENOMEM;
    if (rc)
        goto out;
    count(L, topk_ids);
    prefixes(L);
    L->n_recv = L->recv_offsets[R];
    free(L->recv_token);
    free(L->recv_topk_idx);
    free(L->recv_topk_weights);
    L->recv_token = calloc(L->n_recv ? (size_t)L->n_recv : 1, sizeof(int32_t));
    L->recv_topk_idx = calloc(L->n_recv ? (size_t)(L->n_recv * k) : 1, sizeof(int32_t));
    L->recv_topk_weights = calloc(L->n_recv ? (size_t)(L->n_recv * k) : 1, sizeof(float));
    if (!L->recv_token || !L->recv_topk_idx || !L->recv_topk_weights) {
        rc = DL_ENOMEM;
        goto out;
    }
    place(L, topk_ids, topk_weights, cursor);
out:
    free(cursor);
    if (rc)
        dl_ep_layout_free(L);
    return rc;
}

int dl_ep_layout_view(const dl_ep_layout_t *w, int64_t r, dl_ep_layout_t *v)
{
    if (!v)
        return DL_EINVAL;
    memset(v, 0, sizeof *v);
    if (!w || w->rank != -1 || r < 0 || r >= w->ranks)
        return DL_EINVAL;
    for (int i = 0; i < DL_EP_DATASET_COUNT; i++)
        if ((table[i].forms & DL_EP_WHOLE) && !*dl_ep_slot((dl_ep_layout_t *)w, i))
            return DL_EINVAL;
    const int64_t R = w->ranks, E = w->experts, k = w->top_k;
    int64_t b, e;
    dl_ep_source_range(w->tokens, R, r, &b, &e);
    *v = (dl_ep_layout_t){.ranks = R, .experts = E, .top_k = k, .tokens = w->tokens, .rank = r,
                          .n_tokens = e - b,
                          .n_recv = w->recv_offsets[r + 1] - w->recv_offsets[r]};
    int rc = alloc_form(v, DL_EP_VIEW);
    if (rc) {
        dl_ep_layout_free(v);
        return rc;
    }
    for (int64_t x = 0; x < R; x++) {
        v->num_tokens_per_rank[x] = w->send_counts[r * R + x];
        v->recv_counts[x] = w->send_counts[x * R + r];
    }
    memcpy(v->num_tokens_per_expert, w->send_expert_counts + r * E, (size_t)E * sizeof(int64_t));
    memcpy(v->is_token_in_rank, w->is_token_in_rank + b * R, (size_t)((e - b) * R));
    int64_t r0 = w->recv_offsets[r];
    memcpy(v->recv_token, w->recv_token + r0, (size_t)v->n_recv * sizeof(int32_t));
    memcpy(v->recv_topk_idx, w->recv_topk_idx + r0 * k, (size_t)(v->n_recv * k) * sizeof(int32_t));
    memcpy(v->recv_topk_weights, w->recv_topk_weights + r0 * k,
           (size_t)(v->n_recv * k) * sizeof(float));
    return 0;
}
