/* dropless/layout.h: the row layouts GPU grouped GEMMs consume, as index
 * arrays over the flat sorted layout (x_sorted / y_sorted rows grouped by
 * expert, group_offsets): DeepGEMM's masked and aligned-contiguous layouts,
 * vLLM's moe_align_block_size and its batched format. Integers only; the
 * activations in a layout are copies of sorted rows. Part of the public
 * API; include <dropless.h>. doc/format.md, "Kernel layouts", gives the
 * golden groups /layouts/NAME and the correspondence to DeepGEMM's, vLLM's
 * and DeepEP's names.
 *
 * Within an expert the rows keep the flat sorted order (ascending t*k+j,
 * the stable sort of sort_perm). A layout may cover only the local experts
 * [e0, e1) of an expert-parallel rank (R divides E; rank r owns
 * [r*E/R, (r+1)*E/R)); their local ids are e - e0, every other expert -1. */
#ifndef DROPLESS_LAYOUT_H
#define DROPLESS_LAYOUT_H
#include "core.h"
#ifdef __cplusplus
extern "C" {
#endif

/* What a kernel must leave in a padding row of its output. */
#define DL_LAYOUT_UNTOUCHED 0 /* the bits the buffer held before the call */
#define DL_LAYOUT_ZERO 1      /* +0 or -0 in every element */

/* The layouts: X(ID, spec name, parameter name, padding contract). */
#define DL_LAYOUT_KIND_MAP(X)                                     \
    X(MASKED, "masked", "MAX_M", DL_LAYOUT_UNTOUCHED)            \
    X(CONTIGUOUS, "contiguous", "ALIGN", DL_LAYOUT_ZERO)         \
    X(VLLM_BLOCK, "vllm-block", "BLOCK", DL_LAYOUT_UNTOUCHED)    \
    X(BATCHED, "batched", "MAX_TOKENS", DL_LAYOUT_UNTOUCHED)

typedef enum {
#define DL_LAYOUT_X_ENUM(id, name, param, contract) DL_LAYOUT_##id,
    DL_LAYOUT_KIND_MAP(DL_LAYOUT_X_ENUM)
#undef DL_LAYOUT_X_ENUM
    DL_LAYOUT_KIND_COUNT
} dl_layout_kind_t;

/* The datasets of a layout: X(ID, field, int64 (else int32/float), dims,
 * kinds mask (1 << kind)). dims: 'G' experts of the layout (e1 - e0), 'P'
 * G + 1, 'R' index rows, 'B' blocks, '1' one element, 'X' / 'Y' rows of
 * the activations / outputs, 'd' hidden. x and y are floats. */
#define DL_LAYOUT_DATASET_MAP(X)                                                      \
    X(MASKED_M, masked_m, 0, "G", 1u << DL_LAYOUT_MASKED)                              \
    X(EXPERT_NUM_TOKENS, expert_num_tokens, 0, "G", 1u << DL_LAYOUT_BATCHED)           \
    X(M_INDICES, m_indices, 0, "R", 1u << DL_LAYOUT_CONTIGUOUS)                        \
    X(GROUP_OFFSETS, group_offsets, 1, "P", 1u << DL_LAYOUT_CONTIGUOUS)                \
    X(SORTED_TOKEN_IDS, sorted_token_ids, 0, "R", 1u << DL_LAYOUT_VLLM_BLOCK)          \
    X(EXPERT_IDS, expert_ids, 0, "B", 1u << DL_LAYOUT_VLLM_BLOCK)                      \
    X(NUM_TOKENS_POST_PADDED, num_tokens_post_padded, 0, "1", 1u << DL_LAYOUT_VLLM_BLOCK) \
    X(ACT_X, x, 0, "Xd", 0xFu)                                                             \
    X(ACT_Y, y, 0, "Yd", 0xFu)

typedef enum {
#define DL_LAYOUT_X_DS(id, field, i64, dims, kinds) DL_LAYOUT_DS_##id,
    DL_LAYOUT_DATASET_MAP(DL_LAYOUT_X_DS)
#undef DL_LAYOUT_X_DS
    DL_LAYOUT_DATASET_COUNT
} dl_layout_dataset_t;

/* Row codes of x_src / y_src below. */
#define DL_LAYOUT_PAD (-1)  /* a padding row: the layout's contract */
#define DL_LAYOUT_NONLOCAL (-2) /* vllm-block, expert-parallel: another rank's row, zero */

/* One layout. A NULL array is a dataset not present (candidates). */
typedef struct {
    int kind;                 /* dl_layout_kind_t */
    int64_t param;            /* MAX_M, ALIGN, BLOCK or MAX_TOKENS */
    int64_t tokens, top_k, experts, hidden; /* T, k, E, d */
    int64_t ranks, rank;      /* expert-parallel variant: R and r; whole: 1 and -1 */
    int64_t e0, e1;           /* the layout's experts [e0, e1) */
    int64_t n_rows, n_blocks; /* R and B of the dims above */
    int64_t n_x, n_y;         /* rows of x and y */
    int64_t expected_m;       /* masked: DeepGEMM's expected_m hint (else 0) */
    int poisoned;             /* x's padding rows and y's untouched rows hold NaN */
    int32_t *masked_m;        /* [G] rows of expert e0 + g */
    int32_t *expert_num_tokens; /* [G] the same, vLLM's name */
    int32_t *m_indices;       /* [R] local expert of each row, -1 for padding */
    int64_t *group_offsets;   /* [G+1] padded group starts */
    int32_t *sorted_token_ids; /* [R] flat assignment t*k+j per slot, sentinel numel = T*k */
    int32_t *expert_ids;      /* [B] local expert of each block, -1 non-local or unused */
    int32_t *num_tokens_post_padded; /* [1] */
    float *x, *y;             /* [n_x, d], [n_y, d] */
    /* derived (never written): the source of each x / y row: a sorted row
     * (x of vllm-block: a token row of /inputs/x), or DL_LAYOUT_PAD,
     * DL_LAYOUT_NONLOCAL */
    int32_t *x_src, *y_src;
    int64_t len[DL_LAYOUT_DATASET_COUNT]; /* candidates: each read dataset's first extent */
    uint32_t bad;             /* candidates: datasets set aside, bit (1 << dataset) */
    char bad_reason[160];
    char name[64];            /* the group's name: "masked_64", "masked_64.ranks_4.rank_1" */
} dl_layout_t;

/* Names: the kind's spec name ("vllm-block") and parameter name, its
 * padding contract; the dataset's name, dims and kinds mask; NULL / -1
 * outside the tables. */
DL_EXTERN const char *dl_layout_kind_name(int kind);
DL_EXTERN const char *dl_layout_param_name(int kind);
DL_EXTERN int dl_layout_contract(int kind);
DL_EXTERN const char *dl_layout_dataset_name(int i);
DL_EXTERN const char *dl_layout_dataset_dims(int i);
DL_EXTERN unsigned dl_layout_dataset_kinds(int i);
/* 1 if dataset i holds int64 (group_offsets), 0 int32, and x, y floats
 * (dl_layout_dataset_is_float). */
DL_EXTERN int dl_layout_dataset_i64(int i);
DL_EXTERN int dl_layout_dataset_is_float(int i);
/* The address of dataset i's array pointer in L, or NULL. */
DL_EXTERN void **dl_layout_dataset_slot(dl_layout_t *L, int i);
/* Fills dims[0..1] of dataset i of L's shape; returns its rank (1, 2), or
 * -1. */
DL_EXTERN int dl_layout_dataset_shape(const dl_layout_t *L, int i, int64_t dims[2]);

/* Parses "masked:64", "contiguous:128", "vllm-block:16", "batched:32":
 * 0, or DL_EINVAL (unknown kind, a parameter not a positive integer up
 * to 2^20). */
DL_EXTERN int dl_layout_parse(const char *spec, int *kind, int64_t *param);

/* The index arrays of layout (kind, param) of the sorted assignments
 * (group_sizes [E], sort_perm [T*k]) over the experts [e0, e1) (0, E: the
 * whole layout), into *L: every index dataset of the kind and x_src,
 * y_src allocated, x and y NULL, rank -1 and ranks 1 (the caller sets
 * them for a variant). Capacities: masked and batched [G, param] (every
 * group_sizes[e] of the layout must fit: DL_ERANGE names none, the caller
 * does), contiguous sum of the groups rounded up to param, vllm-block
 * numel + E*(param - 1). Errors: DL_EINVAL (NULL arrays, a bad range or
 * parameter), DL_ERANGE (a group larger than MAX_M / MAX_TOKENS, sizes
 * not summing to T*k), DL_EOVERFLOW, DL_ENOMEM; free with
 * dl_layout_free, also after an error. O(rows + E). */
DL_EXTERN int dl_layout_compute(int kind, int64_t param, const int64_t *group_sizes,
                                const int32_t *sort_perm, int64_t T, int64_t k, int64_t E,
                                int64_t e0, int64_t e1, dl_layout_t *L);

/* Fills L->x [n_x, d] and L->y [n_y, d] (allocated here) from x (vllm-block)
 * or x_sorted, and y_sorted ([T*k, d]): each row its source row, padding
 * rows 0, or NaN (0x7fc00000) with poison (then L->poisoned = 1), rows of
 * other ranks 0. Errors: DL_EINVAL, DL_ENOMEM. */
DL_EXTERN int dl_layout_fill(dl_layout_t *L, const float *x, const float *x_sorted,
                             const float *y_sorted, int64_t d, int poison);

/* Frees every array of L and zeroes it. */
DL_EXTERN void dl_layout_free(dl_layout_t *L);

#ifdef __cplusplus
}
#endif
#endif
