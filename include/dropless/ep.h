/* dropless/ep.h: expert parallelism: the dispatch layout of R
 * expert-parallel ranks (DeepEP's get_dispatch_layout and the ragged
 * all-to-all of torch.distributed.all_to_all_single), a pure function of
 * topk_ids and topk_weights. Part of the public API; include <dropless.h>.
 * doc/format.md, "Expert parallelism", gives the golden group /ep/ranks_R
 * these arrays are written to and the correspondence to DeepEP's names.
 *
 * Ranks: R divides E; rank r owns experts [r*E/R, (r+1)*E/R). Source
 * ranks: source s owns tokens [floor(s*T/R), floor((s+1)*T/R)). A token is
 * "in rank r" when one of its k slots' experts lives on r; one copy of its
 * row goes to each such rank (not one per slot). Canonical receive order on
 * each destination: by source rank, then token (so ascending token ids). */
#ifndef DROPLESS_EP_H
#define DROPLESS_EP_H
#include "core.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Element types of the layout's arrays. */
typedef enum {
    DL_EP_I64 = 0, /* int64_t */
    DL_EP_I32 = 1, /* int32_t */
    DL_EP_BOOL = 2, /* uint8_t 0/1 (stored as uint8, dtype attribute "bool") */
    DL_EP_F32 = 3  /* float, copied bit for bit */
} dl_ep_elem_t;

/* Which form holds a dataset: the whole layout (golden files), the view of
 * one rank's process (DeepEP's per-rank outputs), or both. */
#define DL_EP_WHOLE 1
#define DL_EP_VIEW 2

/* The layout's datasets: X(ID, field, elem, dims, forms). dims: 'R' ranks,
 * 'E' experts, 'k' top_k, 'P' R+1, 'T' tokens of the form (T whole, the
 * rank's own T_r in a view), 'N' received rows (N whole, N_r in a view). */
#define DL_EP_DATASET_MAP(X)                                                          \
    X(NUM_TOKENS_PER_RANK, num_tokens_per_rank, DL_EP_I64, "R", DL_EP_WHOLE | DL_EP_VIEW) \
    X(NUM_TOKENS_PER_EXPERT, num_tokens_per_expert, DL_EP_I64, "E", DL_EP_WHOLE | DL_EP_VIEW) \
    X(IS_TOKEN_IN_RANK, is_token_in_rank, DL_EP_BOOL, "TR", DL_EP_WHOLE | DL_EP_VIEW)   \
    X(SEND_COUNTS, send_counts, DL_EP_I64, "RR", DL_EP_WHOLE)                           \
    X(SEND_DISPLS, send_displs, DL_EP_I64, "RR", DL_EP_WHOLE)                           \
    X(RECV_DISPLS, recv_displs, DL_EP_I64, "RR", DL_EP_WHOLE)                           \
    X(SEND_EXPERT_COUNTS, send_expert_counts, DL_EP_I64, "RE", DL_EP_WHOLE)             \
    X(RECV_OFFSETS, recv_offsets, DL_EP_I64, "P", DL_EP_WHOLE)                          \
    X(RECV_COUNTS, recv_counts, DL_EP_I64, "R", DL_EP_VIEW)                             \
    X(RECV_TOKEN, recv_token, DL_EP_I32, "N", DL_EP_WHOLE | DL_EP_VIEW)                 \
    X(RECV_TOPK_IDX, recv_topk_idx, DL_EP_I32, "Nk", DL_EP_WHOLE | DL_EP_VIEW)          \
    X(RECV_TOPK_WEIGHTS, recv_topk_weights, DL_EP_F32, "Nk", DL_EP_WHOLE | DL_EP_VIEW)

typedef enum {
#define DL_EP_X_ENUM(id, field, elem, dims, forms) DL_EP_##id,
    DL_EP_DATASET_MAP(DL_EP_X_ENUM)
#undef DL_EP_X_ENUM
    DL_EP_DATASET_COUNT
} dl_ep_dataset_t;

/* One layout, whole (rank = -1) or one rank's view (rank = r). A NULL
 * array is a dataset not present (candidates hold any subset). Shapes as
 * DL_EP_DATASET_MAP with T = n_tokens and N = n_recv. */
typedef struct {
    int64_t ranks, experts, top_k; /* R, E, k */
    int64_t tokens;                /* T, all tokens */
    int64_t rank;                  /* -1: the whole layout; r: rank r's view */
    int64_t n_tokens;              /* rows of is_token_in_rank: T, or the view's T_r */
    int64_t n_recv;                /* rows of recv_*: N, or the view's N_r */
    int64_t *num_tokens_per_rank;   /* [R] tokens in rank r (view: its own tokens') */
    int64_t *num_tokens_per_expert; /* [E] assignments per expert (view: its own tokens') */
    uint8_t *is_token_in_rank;      /* [T, R] */
    int64_t *send_counts;           /* [R, R] [s, r] tokens of source s in rank r */
    int64_t *send_displs;           /* [R, R] exclusive prefix over r of send_counts[s, :] */
    int64_t *recv_displs;           /* [R, R] [r, s] exclusive prefix over s of send_counts[:, r] */
    int64_t *send_expert_counts;    /* [R, E] [s, e] tokens of source s routed to expert e */
    int64_t *recv_offsets;          /* [R+1] exclusive prefix of num_tokens_per_rank */
    int64_t *recv_counts;           /* [R] view only: send_counts[:, rank] */
    int32_t *recv_token;            /* [N] global token id of each received row */
    int32_t *recv_topk_idx;         /* [N, k] local expert id of slot j, or -1 */
    float *recv_topk_weights;       /* [N, k] topk_weights[t, j] where idx != -1, else 0 */
    uint32_t bad;                   /* candidates: datasets set aside, bit (1 << dl_ep_dataset_t) */
    char bad_reason[160];           /* why the first of them was */
} dl_ep_layout_t;

/* The name of dataset i ("send_counts"), its element type, dims symbols
 * and forms (DL_EP_WHOLE, DL_EP_VIEW); NULL / -1 outside the table. */
DL_EXTERN const char *dl_ep_dataset_name(int i);
DL_EXTERN int dl_ep_dataset_elem(int i);
DL_EXTERN const char *dl_ep_dataset_dims(int i);
DL_EXTERN int dl_ep_dataset_forms(int i);
/* The dataset named name, or -1. */
DL_EXTERN int dl_ep_dataset_find(const char *name);
/* The address of dataset i's array pointer in L (an int64_t **, int32_t **,
 * uint8_t ** or float ** by its element type), or NULL. */
DL_EXTERN void **dl_ep_slot(dl_ep_layout_t *L, int i);
/* Fills dims[0..1] of dataset i in L (n_tokens and n_recv as set) and
 * returns its rank (1 or 2), or -1. */
DL_EXTERN int dl_ep_dataset_shape(const dl_ep_layout_t *L, int i, int64_t dims[2]);

/* Source rank s's tokens, [*begin, *end) = [floor(s*T/R), floor((s+1)*T/R)). */
DL_EXTERN void dl_ep_source_range(int64_t T, int64_t R, int64_t s, int64_t *begin, int64_t *end);

/* The whole layout of topk_ids [T, k] (and topk_weights [T, k], copied bit
 * for bit) over R ranks: every array of *L allocated but recv_counts (free
 * with dl_ep_layout_free, also after an error); rank = -1. Errors:
 * DL_EINVAL (NULL arrays, R < 1, R not dividing E, T < 0, k < 1),
 * DL_ERANGE (an id outside [0, E)), DL_EOVERFLOW (N beyond int32),
 * DL_ENOMEM. O(T*k + R*(R+E)). */
DL_EXTERN int dl_ep_layout(const int32_t *topk_ids, const float *topk_weights, int64_t T,
                           int64_t k, int64_t E, int64_t R, dl_ep_layout_t *L);

/* Rank r's view of a whole layout (every view dataset allocated; free with
 * dl_ep_layout_free). Errors: DL_EINVAL (not a complete whole layout, r
 * outside [0, R)), DL_ENOMEM. */
DL_EXTERN int dl_ep_layout_view(const dl_ep_layout_t *whole, int64_t r, dl_ep_layout_t *view);

/* Frees every array of L and zeroes it. */
DL_EXTERN void dl_ep_layout_free(dl_ep_layout_t *L);

#ifdef __cplusplus
}
#endif
#endif
