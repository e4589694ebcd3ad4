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

/* X(group, ENUM, name, store, dims, cond), one row per array:
 *   group  IN an input (dl_moe_inputs_t), FW a forward stage value
 *          (dl_moe_forward_t), AUX a forward array that is not a stage value
 *          (tie_margin: the runner derives margins itself), BW a backward
 *          stage value (dl_moe_backward_t);
 *   ENUM   the dl_value_t suffix (FW and BW rows only get an enumerator);
 *   name   the struct member and the dataset name;
 *   store  ACT the case's dtype, F32, I32 (int32_t), I64 (int64_t);
 *   dims   one symbol per dimension: T tokens, d hidden, f ffn, E experts,
 *          k top_k, M = T*k, P = E+1, S = shared_experts * shared_ffn (the
 *          shared experts' concatenated width);
 *   cond   ALWAYS, BIAS (route.has_bias only), SWIGLU (DL_FFN_SWIGLU only),
 *          SHARED (shared_experts > 0 only), SHARED_GATE (shared_gate only).
 * Adding a row is all it takes to add an array to the format, the enum and
 * the runner's bookkeeping (doc/architecture.md has the checklist). */
#if DL_EXTRA_VALUE
/* configure --enable-extra-value: the synthetic value y_half (moe.h) */
#define DL__EXTRA_VALUE_ROW(X) X(FW, Y_HALF, y_half, ACT, "Md", ALWAYS)
#else
#define DL__EXTRA_VALUE_ROW(X)
#endif
#define DL_VALUE_MAP(X)                                             \
    X(IN, IN_X, x, ACT, "Td", ALWAYS)                                  \
    X(IN, IN_ROUTER_WEIGHT, router_weight, F32, "dE", ALWAYS)       \
    X(IN, IN_EXPERT_BIAS, expert_bias, F32, "E", BIAS)                 \
    X(IN, IN_W_GATE, w_gate, ACT, "Edf", SWIGLU)                       \
    X(IN, IN_W_UP, w_up, ACT, "Edf", SWIGLU)                           \
    X(IN, IN_W_DOWN, w_down, ACT, "Efd", ALWAYS)                       \
    X(IN, IN_SHARED_W_GATE, shared_w_gate, ACT, "dS", SHARED)          \
    X(IN, IN_SHARED_W_UP, shared_w_up, ACT, "dS", SHARED)              \
    X(IN, IN_SHARED_W_DOWN, shared_w_down, ACT, "Sd", SHARED)          \
    X(IN, IN_SHARED_GATE_WEIGHT, shared_gate_weight, ACT, "d", SHARED_GATE) \
    X(IN, IN_D_OUT, d_out, ACT, "Td", ALWAYS)                          \
    X(FW, ROUTER_LOGITS, router_logits, F32, "TE", ALWAYS)          \
    X(FW, ROUTER_SCORES, router_scores, F32, "TE", ALWAYS)          \
    X(FW, TOPK_IDS, topk_ids, I32, "Tk", ALWAYS)                    \
    X(FW, TOPK_WEIGHTS, topk_weights, F32, "Tk", ALWAYS)            \
    X(AUX, TIE_MARGIN, tie_margin, F32, "T", ALWAYS)                \
    X(FW, SORT_PERM, sort_perm, I32, "M", ALWAYS)                   \
    X(FW, INV_PERM, inv_perm, I32, "M", ALWAYS)                     \
    X(FW, GROUP_SIZES, group_sizes, I64, "E", ALWAYS)               \
    X(FW, GROUP_OFFSETS, group_offsets, I64, "P", ALWAYS)           \
    X(FW, X_SORTED, x_sorted, ACT, "Md", ALWAYS)                    \
    X(FW, H_GATE, h_gate, ACT, "Mf", SWIGLU)                        \
    X(FW, H_UP, h_up, ACT, "Mf", SWIGLU)                            \
    X(FW, H_ACT, h_act, ACT, "Mf", SWIGLU)                          \
    X(FW, Y_SORTED, y_sorted, ACT, "Md", ALWAYS)                    \
    DL__EXTRA_VALUE_ROW(X)                                          \
    X(FW, SHARED_H_GATE, shared_h_gate, ACT, "TS", SHARED)          \
    X(FW, SHARED_H_UP, shared_h_up, ACT, "TS", SHARED)              \
    X(FW, SHARED_H_ACT, shared_h_act, ACT, "TS", SHARED)            \
    X(FW, SHARED_Y, shared_y, ACT, "Td", SHARED)                    \
    X(FW, SHARED_GATE_LOGIT, shared_gate_logit, F32, "T", SHARED_GATE) \
    X(FW, SHARED_GATE, shared_gate, F32, "T", SHARED_GATE)          \
    X(FW, OUT, out, ACT, "Td", ALWAYS)                              \
    X(BW, D_TOPK_WEIGHTS, d_topk_weights, F32, "Tk", ALWAYS)        \
    X(BW, D_Y_SORTED, d_y_sorted, ACT, "Md", ALWAYS)                \
    X(BW, D_H_ACT, d_h_act, ACT, "Mf", SWIGLU)                      \
    X(BW, D_W_DOWN, d_w_down, F32, "Efd", ALWAYS)                   \
    X(BW, D_H_GATE, d_h_gate, ACT, "Mf", SWIGLU)                    \
    X(BW, D_H_UP, d_h_up, ACT, "Mf", SWIGLU)                        \
    X(BW, D_X_SORTED, d_x_sorted, ACT, "Md", ALWAYS)                \
    X(BW, D_W_GATE, d_w_gate, F32, "Edf", SWIGLU)                   \
    X(BW, D_W_UP, d_w_up, F32, "Edf", SWIGLU)                       \
    X(BW, D_ROUTER_SCORES, d_router_scores, F32, "TE", ALWAYS)      \
    X(BW, D_ROUTER_LOGITS, d_router_logits, F32, "TE", ALWAYS)      \
    X(BW, D_ROUTER_WEIGHT, d_router_weight, F32, "dE", ALWAYS)      \
    X(BW, D_SHARED_GATE, d_shared_gate, F32, "T", SHARED_GATE)      \
    X(BW, D_SHARED_GATE_LOGIT, d_shared_gate_logit, F32, "T", SHARED_GATE) \
    X(BW, D_SHARED_GATE_WEIGHT, d_shared_gate_weight, F32, "d", SHARED_GATE) \
    X(BW, D_SHARED_Y, d_shared_y, ACT, "Td", SHARED)                \
    X(BW, D_SHARED_H_ACT, d_shared_h_act, ACT, "TS", SHARED)        \
    X(BW, D_SHARED_W_DOWN, d_shared_w_down, F32, "Sd", SHARED)      \
    X(BW, D_SHARED_H_GATE, d_shared_h_gate, ACT, "TS", SHARED)      \
    X(BW, D_SHARED_H_UP, d_shared_h_up, ACT, "TS", SHARED)          \
    X(BW, D_SHARED_W_GATE, d_shared_w_gate, F32, "dS", SHARED)      \
    X(BW, D_SHARED_W_UP, d_shared_w_up, F32, "dS", SHARED)          \
    X(BW, D_X, d_x, ACT, "Td", ALWAYS)

/* The row's enumerator, for FW and BW rows only. */
#define DL__VALUE_ENUM_IN(E)
#define DL__VALUE_ENUM_AUX(E)
#define DL__VALUE_ENUM_FW(E) DL_VALUE_##E,
#define DL__VALUE_ENUM_BW(E) DL_VALUE_##E,
#define DL__VALUE_ENUM(g, E, n, st, dims, cond) DL__VALUE_ENUM_##g(E)

/* The value every stage of the forward and backward pass stores, in
 * dependency order: what the runner checks. The names (dl_value_name) are
 * the dataset names of the golden file layout. (Not the plugin ABI's
 * dl_run_stage_t, whose stages each produce several of these.) */
typedef enum {
    DL_VALUE_MAP(DL__VALUE_ENUM)
    DL_VALUE_COUNT,
    DL_VALUE_NONE = -1 /* a check about the whole case (token accounting) */
} dl_value_t;

/* How a value is stored: the case's dtype, fp32, int32 or int64. */
typedef enum {
    DL_STORE_ACT = 0,
    DL_STORE_F32 = 1,
    DL_STORE_I32 = 2,
    DL_STORE_I64 = 3
} dl_store_t;

/* When an array exists. */
typedef enum {
    DL_COND_ALWAYS = 0,
    DL_COND_BIAS = 1,  /* only when route.has_bias */
    DL_COND_SWIGLU = 2, /* only with DL_FFN_SWIGLU */
    DL_COND_SHARED = 3, /* only with shared experts (shared_experts > 0) */
    DL_COND_SHARED_GATE = 4 /* only with the shared experts' sigmoid gate */
} dl_cond_t;

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

#ifdef __cplusplus
}
#endif
#endif
