/* dropless/capacity.h: the legacy baseline, capacity-factor routing, and
 * what it costs against a dropless layer: dropped assignments, padded rows,
 * wasted FLOPs and activation memory (doc/capacity.md). Part of the public
 * API; include <dropless.h>. */
#ifndef DROPLESS_CAPACITY_H
#define DROPLESS_CAPACITY_H
#include "core.h"
#include "moe.h"
#include "golden.h"
#ifdef __cplusplus
extern "C" {
#endif

/* How the capacity per expert follows from the capacity factor cf, with
 * N = T*k assignments over E experts. */
typedef enum {
    DL_CAPACITY_GSHARD = 0,  /* C = ceil(cf * N / E) exactly, cf read as the
                              * shortest decimal that is its binary64 value
                              * (1.1 is 11/10): GShard, Switch, DeepSpeed */
    DL_CAPACITY_MEGATRON = 1 /* C = ceil(fl(fl(N / E) * cf)) in binary64, as
                              * Megatron-Core's get_capacity evaluates it: one
                              * more than GShard where rounding lifts an exact
                              * integer (cf 1.1, N 50, E 1: 56, not 55) */
} dl_capacity_rule_t;

/* Which assignments an expert over capacity drops. Each expert keeps C of
 * its assignments; only which ones differs, never how many. */
typedef enum {
    DL_DROP_POSITION = 0, /* keeps its earliest tokens (Megatron drop_policy "position") */
    DL_DROP_PROBS = 1,    /* keeps its highest router probabilities, drops the lowest
                           * first; equal ones: the earlier token kept (Megatron "probs") */
    DL_DROP_SLOT = 2      /* every token's top-1 choice before any top-2 choice, tokens
                           * in order within a slot (GShard, Switch) */
} dl_drop_policy_t;

/* Largest capacity factor accepted: beyond it capacity is not a limit. */
#define DL_CAPACITY_CF_MAX 65536.0

/* Names: "gshard", "megatron"; "position", "probs", "slot". NULL for an
 * unknown value. The parsers return 0 and set *out, or DL_EINVAL. */
DL_EXTERN const char *dl_capacity_rule_name(dl_capacity_rule_t r);
DL_EXTERN int dl_capacity_rule_parse(const char *s, dl_capacity_rule_t *out);
DL_EXTERN const char *dl_drop_policy_name(dl_drop_policy_t p);
DL_EXTERN int dl_drop_policy_parse(const char *s, dl_drop_policy_t *out);

/* The capacity per expert: *C as the rule says, 0 when T = 0. The one
 * implementation of the rule (the capacity-factor example backend calls
 * it). Errors: DL_EINVAL (cf NaN, <= 0 or above DL_CAPACITY_CF_MAX, T < 0,
 * k < 1, E < 1, unknown rule, C NULL), DL_EOVERFLOW (T*k beyond int32). */
DL_EXTERN int dl_capacity(dl_capacity_rule_t rule, double cf, int64_t T, int64_t k, int64_t E,
                          int64_t *C);

/* Which assignments survive capacity C: keep[t*k+j] = 1 if assignment
 * (t, j) of ids [T, k] is kept, 0 if dropped, admitting assignments in the
 * policy's priority order while their expert holds fewer than C. prob
 * [T, k] (the router probability of each selected expert) is read by
 * DL_DROP_PROBS only and may be NULL otherwise. keep is caller-owned.
 * Errors: DL_EINVAL (NULL arrays, T < 0, k < 1, E < 1, C < 0, unknown
 * policy), DL_ERANGE (an id outside [0, E)), DL_ENONFINITE (a NaN prob),
 * DL_EOVERFLOW, DL_ENOMEM. */
DL_EXTERN int dl_capacity_keep(const int32_t *ids, const float *prob, int64_t T, int64_t k,
                               int64_t E, int64_t C, dl_drop_policy_t policy, uint8_t *keep);

/* What the expert GEMMs compute: rows (real and padding), FLOPs of the
 * layer's expert GEMMs on them (forward: gate, up and down, 2*3*d*f per
 * row with SwiGLU, 2*d*d with a plain FFN; backward twice that: each GEMM's
 * input and weight gradients), and the padding's share of it. Extra memory
 * is the padded rows' forward activations (x_sorted and y_sorted, d each;
 * h_gate, h_up, h_act, f each with SwiGLU) in the case's storage type. */
typedef struct {
    int64_t rows;              /* rows the expert GEMMs compute */
    int64_t padded_rows;       /* of which padding (zeros) */
    double waste;              /* padded_rows / rows; 0 when rows = 0 */
    int64_t flops_fwd, flops_bwd;             /* on all rows */
    int64_t waste_flops_fwd, waste_flops_bwd; /* on padded rows */
    int64_t extra_bytes;       /* activation memory of the padded rows */
} dl_capacity_cost_t;

/* One capacity factor under one drop policy. */
typedef struct {
    double cf;
    dl_capacity_rule_t rule;
    dl_drop_policy_t policy;
    int64_t capacity;           /* C per expert */
    int64_t assignments;        /* T*k */
    int64_t dropped;            /* assignments over capacity: sum_e max(0, n_e - C) */
    double dropped_pct;         /* 100 * dropped / assignments; 0 when T = 0 */
    int64_t tokens_all_dropped; /* tokens whose k assignments are all dropped */
    double dropped_mass_pct;    /* 100 * sum of prob dropped / sum of prob (binary64
                                 * sums in flat order); 0 without prob */
    int32_t *dropped_at;        /* [dropped] flat indices t*k+j, ascending (malloc'ed;
                                 * NULL when none) */
    dl_capacity_cost_t cost;    /* fixed [E, C] buffers, every expert padded to C */
} dl_capacity_row_t;

/* Analyses capacity factor cf for routing ids [T, k] (prob as for
 * dl_capacity_keep) of a layer shaped c (T = c->tokens, k, E, d, f,
 * ffn_kind and dtype are read; nothing else). row->dropped_at is allocated:
 * free with dl_capacity_row_free, also after an error. Errors: those of
 * dl_capacity and dl_capacity_keep, DL_EINVAL for an invalid c. */
DL_EXTERN int dl_capacity_analyze(const dl_moe_config_t *c, const int32_t *ids, const float *prob,
                                  dl_capacity_rule_t rule, double cf, dl_drop_policy_t policy,
                                  dl_capacity_row_t *row);
DL_EXTERN void dl_capacity_row_free(dl_capacity_row_t *row);

/* The dropless layer's cost for group sizes [E]: no drops; block = 1 for
 * grouped GEMMs over exact group sizes (no padding), or block > 1 for
 * block-aligned grouped GEMMs that round each expert's rows up to a
 * multiple of block (64, 128: DeepGEMM's contiguous layout, the padded
 * example backend; an empty expert takes no rows). Errors: DL_EINVAL
 * (NULL, block < 1, a negative size, invalid c), DL_EOVERFLOW. */
DL_EXTERN int dl_capacity_dropless(const dl_moe_config_t *c, const int64_t *group_sizes,
                                   int64_t block, dl_capacity_cost_t *cost);

/* The smallest capacity at which padding takes at least frac of the rows
 * of fixed [E, C] buffers (padded >= frac * E * C, in binary64), for group
 * sizes [E] summing to N = T*k. Padding never shrinks as C grows, so every
 * larger C pads at least as much; under DL_CAPACITY_GSHARD that is every
 * cf > *cf_above = (C - 1) * E / N. *C = 0 (and *cf_above = +inf) when no
 * capacity pads that much (N = 0). Errors: DL_EINVAL (frac not in (0, 1),
 * NULL, invalid c), DL_EOVERFLOW. */
DL_EXTERN int dl_capacity_waste_threshold(const dl_moe_config_t *c, const int64_t *group_sizes,
                                          double frac, int64_t *C, double *cf_above);

/* ------------------------------------------------------------- routings */

/* A routing to analyse: for each token its k experts, best first, the
 * router probability (score) of each, and the experts' loads. */
typedef struct {
    int64_t tokens, top_k, experts;
    int32_t *ids;         /* [T, k] */
    float *prob;          /* [T, k]: router_scores[t, ids[t, j]] */
    int64_t *group_sizes; /* [E] */
} dl_capacity_routing_t;

/* Routes case c's tokens with the library's own router (the case's inputs,
 * router GEMM, dl_route_scores and dl_route_topk): the topk_ids a golden
 * file of c holds. Only x and the router are drawn (c's FFN is never
 * allocated), so memory is O(T*d + T*E) whatever f. Uniform and Zipf(s)
 * popularity are cases with inputs DL_INPUTS_ZIPF and zipf_s 0 or s
 * (`dropless capacity` also switches a selection bias off for them).
 * Free r with dl_capacity_routing_free, also after an error. Errors: those
 * of dl_case_inputs and the routing stages, DL_ENOMEM. */
DL_EXTERN int dl_capacity_route_case(const dl_case_t *c, dl_capacity_routing_t *r);

/* The routing a loaded golden file holds (its topk_ids, router_scores and
 * group_sizes, copied). Errors: DL_EINVAL (no forward group), DL_ENOMEM. */
DL_EXTERN int dl_capacity_route_golden(const dl_golden_file_t *g, dl_capacity_routing_t *r);
DL_EXTERN void dl_capacity_routing_free(dl_capacity_routing_t *r);

#ifdef __cplusplus
}
#endif
#endif
