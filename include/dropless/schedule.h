/* dropless/schedule.h: the one schedule of the layer. Every stage of the
 * forward and backward pass is a producer: a row of one table saying which
 * arrays it reads and writes (as rows of DL_VALUE_MAP) and over which part
 * of the layer it can run. One scheduler walks that table; a placement
 * says where each producer runs and on which arrays: the whole layer
 * (dl_moe_forward/dl_moe_backward), one expert at a time (the streaming
 * generator and its expert slices), or one MPI rank (`mpirun dropless
 * gen`). Every producer computes each value of its window exactly, rounded
 * once, so no placement can change a bit. Part of the public API; include
 * <dropless.h>. */
#ifndef DROPLESS_SCHEDULE_H
#define DROPLESS_SCHEDULE_H
#include "core.h"
#include "moe.h"
#include "values.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Over which part of the layer a producer can run. */
typedef enum {
    DL_SPAN_TOKENS = 0,   /* any tokens: per-token arrays; the sorted rows of
                           * its tokens through inv_perm (the combine and its
                           * gradients), which a window must hold whole */
    DL_SPAN_EXPERTS = 1,  /* any experts: their sorted rows and weight slabs */
    DL_SPAN_ALL = 2,      /* every token at once (the sort, the router
                           * weight's gradient) */
    DL_SPAN_DISPATCH = 3  /* copies token rows to sorted rows (x_sorted): a
                           * placement that holds them apart moves them */
} dl_span_t;

/* One producer (a row of the schedule). reads and writes have bit i for
 * row i of DL_VALUE_MAP (dl_layout_row(i)); reads_plain is what it reads
 * in a DL_FFN_PLAIN layer. */
typedef struct {
    const char *name;    /* its first value's name: "router_logits", ... */
    dl_span_t span;
    int backward;        /* 1: a stage of the backward pass */
    dl_cond_t cond;      /* when it runs */
    dl_rowset_t reads, reads_plain, writes;
} dl_producer_t;

/* The window a producer runs on, filled by the placement. Per-token arrays
 * (dims "T..") hold the window's c.tokens tokens; sorted-row arrays of
 * rank 2 (dims "M?") hold rows [row0, row0 + rows) of the layer's sorted
 * order (sort_perm and inv_perm, rank 1, are whole for the window's
 * tokens); expert arrays (dims "E..") hold the window's ne experts, whose
 * rows are off[0..ne] (from 0). */
typedef struct {
    dl_moe_config_t c;
    dl_moe_inputs_t in;
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    int64_t row0, rows;
    const int64_t *off;
    int64_t ne;
    dl_tier_stats_t *stats; /* tiers taken are added here (may be NULL) */
} dl_stage_view_t;

/* The number of producers; the i-th (NULL outside [0, count)); the index of
 * the producer that writes layout row `row` (-1 if none: an input). Static
 * data: nothing to free. */
DL_EXTERN int dl_schedule_count(void);
DL_EXTERN const dl_producer_t *dl_schedule_producer(int i);
DL_EXTERN int dl_schedule_writer(int row);
/* What producer p reads for configuration c (reads or reads_plain; an
 * EXPERTS producer reads group_offsets too: its window is groups of rows). */
DL_EXTERN dl_rowset_t dl_schedule_reads(const dl_producer_t *p, const dl_moe_config_t *c);

/* The rows only every expert's sorted rows give (bit i: layout row i):
 * those written by TOKENS or ALL producers that read a sorted-row array of
 * rank 2, or a row such a producer wrote (out, d_topk_weights, the router
 * gradients, d_x): what an expert slice cannot hold. */
DL_EXTERN dl_rowset_t dl_schedule_needs_experts(const dl_moe_config_t *c);

/* Runs producer i on the window *v: its stage functions on the arrays the
 * view holds (all caller-owned). Errors: DL_EINVAL (unknown i, or an array
 * it reads or writes is NULL), and those of its stages. */
DL_EXTERN int dl_schedule_run(int i, const dl_stage_view_t *v);

/* A placement. bind(ctx, i, w, v) fills *v for window w (0, 1, ...) of
 * producer i and returns 0 (run it there), DL_SCHEDULE_SKIP (not this
 * window: the placement moved the data itself, or the values are not its
 * own) or DL_SCHEDULE_END (no more windows), or an error (< 0). done, when
 * not NULL, is called after each window that ran; an error stops the walk. */
#define DL_SCHEDULE_SKIP 1
#define DL_SCHEDULE_END 2
typedef struct {
    int (*bind)(void *ctx, int i, int w, dl_stage_view_t *v);
    int (*done)(void *ctx, int i, int w, const dl_stage_view_t *v);
} dl_placement_t;

/* The passes to walk. */
#define DL_SCHEDULE_FORWARD 1
#define DL_SCHEDULE_BACKWARD 2

/* The scheduler: walks producers *next .. last (upto < 0: to the end) in
 * order, those of the passes whose condition holds for c, each on the
 * windows the placement binds, and leaves *next past the last one walked
 * (next may be NULL: from 0). Returns 0 or the first error. */
DL_EXTERN int dl_schedule_exec(const dl_moe_config_t *c, int passes, int *next, int upto,
                               const dl_placement_t *pl, void *ctx);

/* The elements of layout row r for c with its first dimension `first` rows
 * long (first < 0: as c has it); 0 when its condition does not hold. */
DL_EXTERN int64_t dl_layout_numel_rows(const dl_layout_row_t *r, const dl_moe_config_t *c,
                                       int64_t first);
/* The address of row r's array pointer in *in, *f or *b (each may be NULL:
 * then NULL). */
DL_EXTERN void **dl_layout_slot(const dl_layout_row_t *r, dl_moe_inputs_t *in,
                                dl_moe_forward_t *f, dl_moe_backward_t *b);

#ifdef __cplusplus
}
#endif
#endif
