/* dropless/values.h: the one table of the layer's arrays. Every input, every
 * stage value of the forward and backward pass, in dependency order (which
 * is also the golden file's write order). Everything that lists them (the
 * dl_value_t enum and its names, the golden format's dataset table, the
 * struct slots, shapes and storage types, the runner's and the executor's
 * tables, `dropless info --layout --json` and through it the Python side)
 * is generated from DL_VALUE_MAP. Part of the public API; include
 * <dropless.h>, not this file. */
#ifndef DROPLESS_VALUES_H
#define DROPLESS_VALUES_H
#include "core.h"
#include "moe.h"
#ifdef __cplusplus
extern "C" {
#endif

/* X(group, ENUM, name, store, dims, cond, check, prop, up, up_plain, part, reuse),
 * one row per array:
 *   group  IN an input (dl_moe_inputs_t), FW a forward stage value
 *          (dl_moe_forward_t), AUX a forward array that is not a stage value
 *          (tie_margin: the runner derives margins itself), BW a backward
 *          stage value (dl_moe_backward_t);
 *   ENUM   the dl_value_t suffix (FW and BW rows only get an enumerator);
 *   name   the struct member and the dataset name;
 *   store  ACT the case's dtype, F32, I32 (int32_t), I64 (int64_t), RT the
 *          case's router_dtype (fp32 unless a case asks for bf16 or fp16);
 *   dims   one symbol per dimension: T tokens, d hidden, f ffn, E experts,
 *          k top_k, M = T*k, P = E+1, S = shared_experts * shared_ffn (the
 *          shared experts' concatenated width), V = route.hash_vocab (the
 *          hash table's rows), R = E + route.zero_experts (the router's
 *          width, DL_ROUTE_WIDTH: E without zero experts);
 *   cond   ALWAYS, BIAS (route.has_bias only), SWIGLU (an FFN with a hidden
 *          layer: the gated ones and relu2), GATE (a gated FFN only),
 *          SHARED (shared_experts > 0 only), SHARED_GATE (shared_gate only),
 *          ROUTER_BIAS (route.has_router_bias only), FFN_BIAS (ffn_bias
 *          only: the expert projections' biases and their gradients), HASH
 *          (route.hash_vocab > 0: the token ids and the hash table).
 * What the conformance runner needs (doc/architecture.md, "Adding a stage
 * value"; IN and AUX rows: NONE, NONE, 0, 0, NONE, NONE):
 *   check  how the value is judged: NUM against its exact value within the
 *          tolerance, DW the same plus "an empty expert's gradient is
 *          zero", END the same plus drift against the golden (an end
 *          result), OUT END plus the zero-drop proof (the layer's output),
 *          COPY bitwise (a permutation of an input), IDS the routing check,
 *          TOKENS the token accounting, SORTED checked with sort_perm by
 *          the token accounting. NUM, DW, END, OUT and COPY rows name
 *          functions beside their stage (src/stages/, declared from this
 *          table in stages_priv.h): dl__exact_<name> (the exact value on
 *          the effective upstream) and, but for COPY, dl__mag_<name> (the
 *          scale M of its rounding error); the build fails on a missing one,
 *          naming the value;
 *   prop   how the error of an absent upstream value propagates into it:
 *          GEMM through the magnitude GEMMs its dl__mag_<name> describes,
 *          ELEM through its derivative magnitudes dl__prop_<name> (beside
 *          the stage), NONE for the other kinds;
 *   up     the values it is a function of: DL__UP(ENUM) | ..., with
 *          DL__UP_DISPATCH for sort_perm, inv_perm, group_sizes and
 *          group_offsets; 0 for none;
 *   up_plain  the same for DL_FFN_PLAIN where it differs, else 0;
 *   part   the part of the layer a per-part profile names it by (a
 *          compute_mode such as "router=fp32,experts=bf16-acc",
 *          doc/tolerances.md): ROUTER, EXPERTS or COMBINE; NONE for the
 *          rows judged exactly (IDS, TOKENS, SORTED, COPY) and IN and AUX
 *          rows. The runner refuses to start on a NUM, DW, END or OUT row
 *          whose part is NONE, naming the value. It is the last column so
 *          that a row written before it merges by one added ", PART" at
 *          its end (the build fails on a row without it: desc.c's DESC
 *          takes every column);
 *   reuse  what an element of the value depends on, so that the runner
 *          recomputes only what a candidate's upstream changes (its exact
 *          value starts as the golden's and only the changed part goes
 *          through dl__exact_<name> on compact copies, src/check/reuse.c):
 *          EACH element i on element i of each upstream value (same
 *          dims), ROW row r of its first dimension on row r of each
 *          upstream value (a GEMM's output row on its lhs row, a token's
 *          softmax on its row), EXPERT an expert's slab on that expert's
 *          sorted rows (a ragged-K weight gradient), ALL on everything (or
 *          on an input row by row: recomputed whole), NONE for the rows
 *          not recomputed by a function (IN, AUX, IDS, TOKENS, SORTED). A
 *          row added before it merges by one more ", ALL".
 * Adding a row (and its stage's functions) is all it takes to add an array
 * to the format, the enum, the schedule's bookkeeping and the runner. */
#if DL_EXTRA_VALUE
/* configure --enable-extra-value: the synthetic value y_half (moe.h) */
#define DL__EXTRA_VALUE_ROW(X) X(FW, Y_HALF, y_half, ACT, "Md", ALWAYS, NUM, ELEM, DL__UP(Y_SORTED) | DL__UP_DISPATCH, 0, EXPERTS, ALL)
#else
#define DL__EXTRA_VALUE_ROW(X)
#endif
#define DL_VALUE_MAP(X)                                             \
    X(IN, IN_X, x, ACT, "Td", ALWAYS, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_ROUTER_WEIGHT, router_weight, RT, "dR", ALWAYS, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_EXPERT_BIAS, expert_bias, F32, "R", BIAS, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_ROUTER_BIAS, router_bias, F32, "R", ROUTER_BIAS, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_W_GATE, w_gate, ACT, "Edf", GATE, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_W_UP, w_up, ACT, "Edf", SWIGLU, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_W_DOWN, w_down, ACT, "Efd", ALWAYS, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_B_GATE, b_gate, ACT, "Ef", FFN_BIAS, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_B_UP, b_up, ACT, "Ef", FFN_BIAS, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_B_DOWN, b_down, ACT, "Ed", FFN_BIAS, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_SHARED_W_GATE, shared_w_gate, ACT, "dS", SHARED_GATED, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_SHARED_W_UP, shared_w_up, ACT, "dS", SHARED, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_SHARED_W_DOWN, shared_w_down, ACT, "Sd", SHARED, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_SHARED_GATE_WEIGHT, shared_gate_weight, ACT, "d", SHARED_GATE, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_D_OUT, d_out, ACT, "Td", ALWAYS, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_TOKEN_IDS, token_ids, I32, "T", HASH, NONE, NONE, 0, 0, NONE, NONE) \
    X(IN, IN_HASH_TABLE, hash_table, I32, "Vk", HASH, NONE, NONE, 0, 0, NONE, NONE) \
    X(FW, ROUTER_LOGITS, router_logits, F32, "TR", ALWAYS, NUM, GEMM, 0, 0, ROUTER, ALL) \
    X(FW, ROUTER_SCORES, router_scores, F32, "TR", ALWAYS, NUM, ELEM, DL__UP(ROUTER_LOGITS), 0, ROUTER, ROW) \
    X(FW, TOPK_IDS, topk_ids, I32, "Tk", ALWAYS, IDS, NONE, DL__UP(ROUTER_SCORES) | DL__UP(ROUTER_LOGITS), 0, NONE, NONE) \
    X(FW, TOPK_WEIGHTS, topk_weights, F32, "Tk", ALWAYS, NUM, ELEM, DL__UP(ROUTER_SCORES) | DL__UP(TOPK_IDS), 0, ROUTER, ALL) \
    X(AUX, TIE_MARGIN, tie_margin, F32, "T", ALWAYS, NONE, NONE, 0, 0, NONE, NONE) \
    X(FW, SORT_PERM, sort_perm, I32, "M", ALWAYS, TOKENS, NONE, DL__UP(TOPK_IDS), 0, NONE, NONE) \
    X(FW, INV_PERM, inv_perm, I32, "M", ALWAYS, SORTED, NONE, DL__UP(TOPK_IDS), 0, NONE, NONE) \
    X(FW, GROUP_SIZES, group_sizes, I64, "E", ALWAYS, SORTED, NONE, DL__UP(TOPK_IDS), 0, NONE, NONE) \
    X(FW, GROUP_OFFSETS, group_offsets, I64, "P", ALWAYS, SORTED, NONE, DL__UP(TOPK_IDS), 0, NONE, NONE) \
    X(FW, X_SORTED, x_sorted, ACT, "Md", ALWAYS, COPY, NONE, DL__UP_DISPATCH | DL__UP(ROUTER_SCORES), 0, NONE, ALL) \
    X(FW, H_GATE, h_gate, ACT, "Mf", GATE, NUM, GEMM, DL__UP(X_SORTED) | DL__UP_DISPATCH, 0, EXPERTS, ROW) \
    X(FW, H_UP, h_up, ACT, "Mf", SWIGLU, NUM, GEMM, DL__UP(X_SORTED) | DL__UP_DISPATCH, 0, EXPERTS, ROW) \
    X(FW, H_ACT, h_act, ACT, "Mf", SWIGLU, NUM, ELEM, DL__UP(H_GATE) | DL__UP(H_UP), 0, EXPERTS, EACH) \
    X(FW, Y_SORTED, y_sorted, ACT, "Md", ALWAYS, NUM, GEMM, DL__UP(H_ACT) | DL__UP_DISPATCH, DL__UP(X_SORTED) | DL__UP_DISPATCH, EXPERTS, ROW) \
    DL__EXTRA_VALUE_ROW(X)                                          \
    X(FW, SHARED_H_GATE, shared_h_gate, ACT, "TS", SHARED_GATED, NUM, GEMM, 0, 0, EXPERTS, ALL) \
    X(FW, SHARED_H_UP, shared_h_up, ACT, "TS", SHARED, NUM, GEMM, 0, 0, EXPERTS, ALL) \
    X(FW, SHARED_H_ACT, shared_h_act, ACT, "TS", SHARED, NUM, ELEM, DL__UP(SHARED_H_GATE) | DL__UP(SHARED_H_UP), 0, EXPERTS, EACH) \
    X(FW, SHARED_Y, shared_y, ACT, "Td", SHARED, NUM, GEMM, DL__UP(SHARED_H_ACT), 0, EXPERTS, ROW) \
    X(FW, SHARED_GATE_LOGIT, shared_gate_logit, F32, "T", SHARED_GATE, NUM, GEMM, 0, 0, ROUTER, ALL) \
    X(FW, SHARED_GATE, shared_gate, F32, "T", SHARED_GATE, NUM, ELEM, DL__UP(SHARED_GATE_LOGIT), 0, ROUTER, EACH) \
    X(FW, OUT, out, ACT, "Td", ALWAYS, OUT, ELEM, DL__UP(Y_SORTED) | DL__UP(TOPK_WEIGHTS) | DL__UP_DISPATCH | DL__UP(SHARED_Y) | DL__UP(SHARED_GATE), 0, COMBINE, ALL) \
    X(BW, D_TOPK_WEIGHTS, d_topk_weights, F32, "Tk", ALWAYS, NUM, ELEM, DL__UP(Y_SORTED) | DL__UP_DISPATCH, 0, COMBINE, ALL) \
    X(BW, D_Y_SORTED, d_y_sorted, ACT, "Md", ALWAYS, NUM, ELEM, DL__UP(TOPK_WEIGHTS) | DL__UP_DISPATCH, 0, COMBINE, ALL) \
    X(BW, D_H_ACT, d_h_act, ACT, "Mf", SWIGLU, NUM, GEMM, DL__UP(D_Y_SORTED) | DL__UP_DISPATCH, 0, EXPERTS, ROW) \
    X(BW, D_W_DOWN, d_w_down, F32, "Efd", ALWAYS, DW, GEMM, DL__UP(H_ACT) | DL__UP(D_Y_SORTED) | DL__UP_DISPATCH, DL__UP(X_SORTED) | DL__UP(D_Y_SORTED) | DL__UP_DISPATCH, EXPERTS, EXPERT) \
    X(BW, D_H_GATE, d_h_gate, ACT, "Mf", GATE, NUM, ELEM, DL__UP(H_GATE) | DL__UP(H_UP) | DL__UP(D_H_ACT), 0, EXPERTS, EACH) \
    X(BW, D_H_UP, d_h_up, ACT, "Mf", SWIGLU, NUM, ELEM, DL__UP(H_GATE) | DL__UP(H_UP) | DL__UP(D_H_ACT), 0, EXPERTS, EACH) \
    X(BW, D_X_SORTED, d_x_sorted, ACT, "Md", ALWAYS, NUM, GEMM, DL__UP(D_H_GATE) | DL__UP(D_H_UP) | DL__UP_DISPATCH, DL__UP(D_Y_SORTED) | DL__UP_DISPATCH, EXPERTS, ROW) \
    X(BW, D_W_GATE, d_w_gate, F32, "Edf", GATE, DW, GEMM, DL__UP(X_SORTED) | DL__UP(D_H_GATE) | DL__UP_DISPATCH, 0, EXPERTS, EXPERT) \
    X(BW, D_W_UP, d_w_up, F32, "Edf", SWIGLU, DW, GEMM, DL__UP(X_SORTED) | DL__UP(D_H_UP) | DL__UP_DISPATCH, 0, EXPERTS, EXPERT) \
    X(BW, D_B_DOWN, d_b_down, F32, "Ed", FFN_BIAS, DW, GEMM, DL__UP(D_Y_SORTED) | DL__UP_DISPATCH, 0, EXPERTS, EXPERT) \
    X(BW, D_B_GATE, d_b_gate, F32, "Ef", FFN_BIAS, DW, GEMM, DL__UP(D_H_GATE) | DL__UP_DISPATCH, 0, EXPERTS, EXPERT) \
    X(BW, D_B_UP, d_b_up, F32, "Ef", FFN_BIAS, DW, GEMM, DL__UP(D_H_UP) | DL__UP_DISPATCH, 0, EXPERTS, EXPERT) \
    X(BW, D_ROUTER_SCORES, d_router_scores, F32, "TR", ALWAYS, NUM, ELEM, DL__UP(ROUTER_SCORES) | DL__UP(TOPK_IDS) | DL__UP(D_TOPK_WEIGHTS) | DL__UP(D_X_SORTED) | DL__UP_DISPATCH, 0, ROUTER, ALL) \
    X(BW, D_ROUTER_LOGITS, d_router_logits, F32, "TR", ALWAYS, NUM, ELEM, DL__UP(ROUTER_SCORES) | DL__UP(D_ROUTER_SCORES), 0, ROUTER, ROW) \
    X(BW, D_ROUTER_WEIGHT, d_router_weight, F32, "dR", ALWAYS, NUM, GEMM, DL__UP(D_ROUTER_LOGITS), 0, ROUTER, ALL) \
    X(BW, D_ROUTER_BIAS, d_router_bias, F32, "R", ROUTER_BIAS, NUM, GEMM, DL__UP(D_ROUTER_LOGITS), 0, ROUTER, ALL) \
    X(BW, D_SHARED_GATE, d_shared_gate, F32, "T", SHARED_GATE, NUM, ELEM, DL__UP(SHARED_Y) | DL__UP(SHARED_GATE), 0, COMBINE, ALL) \
    X(BW, D_SHARED_GATE_LOGIT, d_shared_gate_logit, F32, "T", SHARED_GATE, NUM, ELEM, DL__UP(SHARED_GATE) | DL__UP(D_SHARED_GATE), 0, ROUTER, EACH) \
    X(BW, D_SHARED_GATE_WEIGHT, d_shared_gate_weight, F32, "d", SHARED_GATE, NUM, GEMM, DL__UP(D_SHARED_GATE_LOGIT), 0, ROUTER, ALL) \
    X(BW, D_SHARED_Y, d_shared_y, ACT, "Td", SHARED, NUM, ELEM, DL__UP(SHARED_GATE), 0, COMBINE, ALL) \
    X(BW, D_SHARED_H_ACT, d_shared_h_act, ACT, "TS", SHARED, NUM, GEMM, DL__UP(D_SHARED_Y), 0, EXPERTS, ROW) \
    X(BW, D_SHARED_W_DOWN, d_shared_w_down, F32, "Sd", SHARED, NUM, GEMM, DL__UP(SHARED_H_ACT) | DL__UP(D_SHARED_Y), 0, EXPERTS, ALL) \
    X(BW, D_SHARED_H_GATE, d_shared_h_gate, ACT, "TS", SHARED_GATED, NUM, ELEM, DL__UP(SHARED_H_GATE) | DL__UP(SHARED_H_UP) | DL__UP(D_SHARED_H_ACT), 0, EXPERTS, EACH) \
    X(BW, D_SHARED_H_UP, d_shared_h_up, ACT, "TS", SHARED, NUM, ELEM, DL__UP(SHARED_H_GATE) | DL__UP(SHARED_H_UP) | DL__UP(D_SHARED_H_ACT), 0, EXPERTS, EACH) \
    X(BW, D_SHARED_W_GATE, d_shared_w_gate, F32, "dS", SHARED_GATED, NUM, GEMM, DL__UP(D_SHARED_H_GATE), 0, EXPERTS, ALL) \
    X(BW, D_SHARED_W_UP, d_shared_w_up, F32, "dS", SHARED, NUM, GEMM, DL__UP(D_SHARED_H_UP), 0, EXPERTS, ALL) \
    X(BW, D_X, d_x, ACT, "Td", ALWAYS, END, ELEM, DL__UP(D_X_SORTED) | DL__UP(ROUTER_SCORES) | DL__UP(TOPK_IDS) | DL__UP(D_ROUTER_LOGITS) | DL__UP_DISPATCH | DL__UP(D_SHARED_H_GATE) | DL__UP(D_SHARED_H_UP) | DL__UP(D_SHARED_GATE_LOGIT), 0, COMBINE, ALL)

/* The row's enumerator, for FW and BW rows only. */
#define DL__VALUE_ENUM_IN(E)
#define DL__VALUE_ENUM_AUX(E)
#define DL__VALUE_ENUM_FW(E) DL_VALUE_##E,
#define DL__VALUE_ENUM_BW(E) DL_VALUE_##E,
#define DL__VALUE_ENUM(g, E, n, st, dims, cond, ...) DL__VALUE_ENUM_##g(E)

/* The value every stage of the forward and backward pass stores, in
 * dependency order: what the runner checks. The names (dl_value_name) are
 * the dataset names of the golden file layout. (Not the plugin ABI's
 * dl_run_stage_t, whose stages each produce several of these.) */
typedef enum {
    DL_VALUE_MAP(DL__VALUE_ENUM)
    DL_VALUE_COUNT,
    DL_VALUE_NONE = -1 /* a check about the whole case (token accounting) */
} dl_value_t;

/* A set of values: bit v for value v (DL_VALUE_BIT(v)), as in
 * dl_check_options_t.require, dl_check_candidate_t.bad_shape, the isolated
 * check's groups and the mutations' stages. 128 bits, as the schedule's row
 * sets (the model variants outgrew 64); test a member with
 * DL_VALUE_HAS(set, v). */
typedef dl_rowset_t dl_valueset_t;
#define DL_VALUE_BIT(v) DL_ROWSET_BIT(v)
#define DL_VALUE_HAS(s, v) DL_ROWSET_HAS(s, v)

/* The up and up_plain columns' bits. */
#define DL__UP(E) DL_VALUE_BIT(DL_VALUE_##E)
#define DL__UP_DISPATCH \
    (DL__UP(SORT_PERM) | DL__UP(INV_PERM) | DL__UP(GROUP_SIZES) | DL__UP(GROUP_OFFSETS))

/* How a value is stored: the case's dtype, fp32, int32 or int64. */
typedef enum {
    DL_STORE_ACT = 0,
    DL_STORE_F32 = 1,
    DL_STORE_I32 = 2,
    DL_STORE_I64 = 3,
    DL_STORE_RT = 4 /* floats on the grid of router_dtype (the router weight) */
} dl_store_t;

/* When an array exists: X(ENUM, name, holds), in the order of their
 * numbers; holds is the test on the configuration `c` (a const
 * dl_moe_config_t *) that dl_cond_applies evaluates. The names are those of
 * `dropless info --layout` and its JSON. */
#define DL_COND_MAP(X)                                                                    \
    X(ALWAYS, "always", 1)                                                                \
    X(BIAS, "bias", c->route.has_bias != 0)                                               \
    X(SWIGLU, "swiglu", DL_FFN_HIDDEN(c->ffn_kind)) /* a hidden layer: gated or relu2 */  \
    X(SHARED, "shared", c->shared_experts > 0)                                            \
    X(SHARED_GATE, "shared_gate", c->shared_experts > 0 && c->shared_gate)                \
    X(ROUTER_BIAS, "router_bias", c->route.has_router_bias != 0)                          \
    X(FFN_BIAS, "ffn_bias", c->ffn_bias != 0)                                             \
    X(GATE, "gate", DL_FFN_GATED(c->ffn_kind)) /* a gated FFN */                           \
    X(HASH, "hash", c->route.hash_vocab > 0) /* hash routing: token ids, table */            \
    /* shared experts of a gated FFN: their gate projection (relu2's have none) */           \
    X(SHARED_GATED, "shared_gated", c->shared_experts > 0 && DL_FFN_GATED(c->ffn_kind))
#define DL__COND_ENUM(E, name, holds) DL_COND_##E,
typedef enum { DL_COND_MAP(DL__COND_ENUM) DL_COND_COUNT } dl_cond_t;

/* Which struct an array lives in. */
typedef enum {
    DL_LAYOUT_INPUTS = 0,  /* dl_moe_inputs_t */
    DL_LAYOUT_FORWARD = 1, /* dl_moe_forward_t */
    DL_LAYOUT_BACKWARD = 2 /* dl_moe_backward_t */
} dl_layout_group_t;

/* One row of DL_VALUE_MAP. */
typedef struct {
    dl_layout_group_t group;
    const char *name;  /* "x", "router_logits", ...: member and dataset name */
    dl_value_t value;  /* DL_VALUE_NONE for inputs and tie_margin */
    dl_store_t store;
    const char *dims;  /* "TE", ...; the rank is its length (1 to 3) */
    dl_cond_t cond;
} dl_layout_row_t;

/* The number of rows, the i-th (0 <= i < count; NULL otherwise), the row
 * called `name` (NULL if none). Static data: nothing to free. */
DL_EXTERN int dl_layout_count(void);
DL_EXTERN const dl_layout_row_t *dl_layout_row(int i);
DL_EXTERN const dl_layout_row_t *dl_layout_find(const char *name);
/* The row's array in the structs (each may be NULL: then NULL). */
DL_EXTERN const void *dl_layout_data(const dl_layout_row_t *r, const dl_moe_inputs_t *in,
                                     const dl_moe_forward_t *f, const dl_moe_backward_t *b);
/* The row's element count for c (0 when its condition does not hold), and
 * its shape in dims[0..rank-1]; returns the rank. */
DL_EXTERN int64_t dl_layout_numel(const dl_layout_row_t *r, const dl_moe_config_t *c);
DL_EXTERN int dl_layout_shape(const dl_layout_row_t *r, const dl_moe_config_t *c,
                              int64_t dims[3]);

/* "router_logits", ..., "d_x"; "case" for DL_VALUE_NONE; NULL otherwise. */
DL_EXTERN const char *dl_value_name(dl_value_t s);
/* Parses a stage name. Returns 0 and sets *s, or DL_ENOTFOUND. */
DL_EXTERN int dl_value_parse(const char *name, dl_value_t *s);
/* 1 if the stage belongs to the backward pass. */
DL_EXTERN int dl_value_is_backward(dl_value_t s);
/* The candidate's (or golden's) array for stage s, NULL when absent; the
 * pointer is to float, int32_t or int64_t data as the struct declares.
 * tie_margin is not a stage: the runner derives margins itself. */
DL_EXTERN const void *dl_value_array(const dl_moe_forward_t *f, const dl_moe_backward_t *b,
                                     dl_value_t s);
/* Elements of stage s for configuration c (0 for the SwiGLU-only stages of a
 * DL_FFN_PLAIN layer: they do not exist there; 0 for an unknown s). */
DL_EXTERN int64_t dl_value_numel(const dl_moe_config_t *c, dl_value_t s);
/* The row's storage rule and dimension symbols ("TE", ...); DL_STORE_F32
 * and "" for an unknown s. */
DL_EXTERN dl_store_t dl_value_store(dl_value_t s);
DL_EXTERN const char *dl_value_dims(dl_value_t s);
/* The storage type of a float stage for c: c->dtype for DL_STORE_ACT rows,
 * else DL_F32 (also for the integer stages, which are not rounded). */
DL_EXTERN dl_dtype_t dl_value_dtype(const dl_moe_config_t *c, dl_value_t s);
/* Fills dims[0..rank-1] with stage s's shape for c and returns the rank (1
 * to 3); 0 for an unknown s. Sizes are not checked for overflow:
 * dl_moe_config_validate bounds them. */
DL_EXTERN int dl_value_shape(const dl_moe_config_t *c, dl_value_t s, int64_t dims[3]);
/* The size of one dimension symbol (T, d, f, E, k, M, P) for c (as the
 * configuration holds it, not validated), DL_EOVERFLOW when M = T*k
 * overflows, -1 for an unknown symbol. */
DL_EXTERN int64_t dl_value_dim(const dl_moe_config_t *c, char sym);
/* 1 when an array with condition cond exists for c. */
DL_EXTERN int dl_cond_applies(dl_cond_t cond, const dl_moe_config_t *c);
/* "always", "bias", ...: the condition's name (DL_COND_MAP); "?" for
 * none. Static: nothing to free. */
DL_EXTERN const char *dl_cond_name(dl_cond_t cond);

#ifdef __cplusplus
}
#endif
#endif
