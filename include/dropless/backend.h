/* dropless/backend.h: the plugin ABI of `dropless run --backend PLUGIN.so`.
 *
 * A backend is a shared object that exports one function,
 *
 *     const dl_backend_t *dropless_backend(void);
 *
 * returning a static table: an ABI version, a name, a version, a compute
 * mode, and one function pointer per stage of the MoE layer (NULL for a
 * stage the backend does not implement). The runner feeds every stage the
 * GOLDEN values of that stage's inputs (stage isolation: errors never
 * compound), poisons every output, calls the stage twice in a fresh forked
 * process under a time limit, and hands the outputs to the checker.
 *
 * This header depends on DLPack and <stdint.h> alone: a backend needs
 * nothing else to build (no libdropless, no HDF5). See doc/backends.md.
 *
 * Tensors: every tensor is a compact row-major DLTensor on the CPU
 * (device kDLCPU, strides NULL, byte_offset 0, data aligned to 256 bytes).
 *   float stages: kDLFloat, 32 bits. bf16 and fp16 stage values travel as
 *     float32 numbers that lie exactly on the bf16/fp16 grid; an output of
 *     such a stage must be written as float32 values on that grid (round
 *     your bf16/fp16 result to float32: exact).
 *   topk_ids, sort_perm: kDLInt, 32 bits.
 *   group_sizes, group_offsets: kDLInt, 64 bits.
 * Input tensors are read-only (and private to the call); output tensors are
 * filled with poison (a quiet NaN, or INT32_MIN / INT64_MIN) before each
 * call and every element must be written. A stage returns 0 on success,
 * anything else to report an error.
 *
 * Shapes (T tokens, d hidden, f ffn, E experts, k top_k, M = T*k rows in
 * expert-sorted order; act = the case's dtype, see dl_backend_config_t):
 *   x [T,d] act, router_weight [d,E] fp32, expert_bias [E] fp32,
 *   w_gate, w_up [E,d,f] act, w_down [E,f,d] act (plain FFN: [E,d,d]),
 *   d_out [T,d] act,
 *   router_logits, router_scores [T,E] fp32, topk_ids [T,k] int32,
 *   topk_weights [T,k] fp32, sort_perm [M] int32 (sorted position -> t*k+j),
 *   group_sizes [E] int64, group_offsets [E+1] int64,
 *   x_sorted [M,d] act, h_gate, h_up, h_act [M,f] act, y_sorted [M,d] act,
 *   out [T,d] act,
 *   d_topk_weights [T,k] fp32, d_y_sorted [M,d] act, d_h_act, d_h_gate,
 *   d_h_up [M,f] act, d_x_sorted [M,d] act, d_w_gate, d_w_up [E,d,f] fp32,
 *   d_w_down [E,f,d] fp32, d_router_scores, d_router_logits [T,E] fp32,
 *   d_router_weight [d,E] fp32, d_x [T,d] act.
 */
#ifndef DROPLESS_BACKEND_H
#define DROPLESS_BACKEND_H

#include <stdint.h>
#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of the structs below. The runner
 * refuses a table whose abi_version differs (an "abi-mismatch"). */
#define DL_BACKEND_ABI_VERSION 1

/* The name of the one exported symbol, a dl_backend_entry_t. */
#define DL_BACKEND_SYMBOL "dropless_backend"

/* The poison written into every float output element before each call: a
 * quiet NaN with a recognisable payload. Arithmetic on it keeps the payload
 * (x86, ARM), so an output accumulated into without first being cleared
 * still reads as unwritten. Integer outputs are poisoned with INT32_MIN
 * and INT64_MIN. */
#define DL_BACKEND_POISON_F32_BITS 0x7FDEAD00u

/* Storage type of the activations and expert weights (same values as the
 * library's dl_dtype_t). Router tensors and weight gradients are fp32. */
typedef enum {
    DL_BACKEND_FP32 = 0,
    DL_BACKEND_BF16 = 1,
    DL_BACKEND_FP16 = 2
} dl_backend_dtype_t;

typedef enum {
    DL_BACKEND_SWIGLU = 0, /* y = (silu(x Wg) * (x Wu)) Wd */
    DL_BACKEND_PLAIN = 1   /* y = x Wd, Wd [E,d,d]; no gate/up tensors */
} dl_backend_ffn_t;

typedef enum {
    DL_BACKEND_SOFTMAX = 0, /* scores = softmax over all E logits */
    DL_BACKEND_SIGMOID = 1, /* scores = sigmoid of each logit */
    DL_BACKEND_SQRTSOFTPLUS = 2, /* scores = sqrt(softplus) of each logit */
    DL_BACKEND_SOFTMAX_TOPK = 3  /* scores = the logits; weights = scaling times
                                    the softmax over the k selected */
} dl_backend_score_fn_t;

typedef enum {
    DL_BACKEND_GROUP_MAX = 0,      /* group score: best key in the group */
    DL_BACKEND_GROUP_TOP2_SUM = 1, /* sum of the 2 best keys */
    DL_BACKEND_GROUP_TOPK_SUM = 2  /* sum of the top_k/topk_group best keys */
} dl_backend_group_score_t;

/* The case, as plain values. Routing: key[e] = score[e] (+ expert_bias[e]
 * with has_bias, selection only); with n_group > 1 the experts form n_group
 * equal groups, groups are scored by group_score over keys and the best
 * topk_group groups are kept; then the top_k best keys among kept experts,
 * ties to the lower index, best first. weights[t,j] = scaling * s[id_j]
 * (/ sum of the selected scores with renormalize). */
typedef struct {
    int64_t tokens, hidden, ffn, experts, top_k; /* T, d, f, E, k */
    dl_backend_dtype_t dtype;
    dl_backend_ffn_t ffn_kind;
    dl_backend_score_fn_t score_fn;
    int64_t n_group, topk_group;
    dl_backend_group_score_t group_score;
    int32_t renormalize, has_bias;
    double scaling;
} dl_backend_config_t;

/* ------------------------------------------------------- forward stages */

/* router: logits = x . router_weight, scores, top-k ids and weights. */
typedef struct {
    const DLTensor *x, *router_weight;
    const DLTensor *expert_bias; /* NULL without has_bias */
    DLTensor *router_logits, *router_scores, *topk_ids, *topk_weights;
} dl_backend_router_args_t;

/* dispatch: a stable sort of the T*k assignments by expert over the flat
 * index t*k+j; group_offsets is the exclusive prefix sum of group_sizes,
 * group_offsets[E] = T*k. */
typedef struct {
    const DLTensor *topk_ids;
    DLTensor *sort_perm, *group_sizes, *group_offsets;
} dl_backend_dispatch_args_t;

/* permute: x_sorted[p,:] = x[sort_perm[p] / k, :]. */
typedef struct {
    const DLTensor *x, *sort_perm;
    DLTensor *x_sorted;
} dl_backend_permute_args_t;

/* expert_forward, for the rows [group_offsets[e], group_offsets[e+1]) of
 * each expert e: h_gate = x_sorted Wg[e], h_up = x_sorted Wu[e],
 * h_act = silu(h_gate) * h_up, y_sorted = h_act Wd[e]. Plain FFN:
 * y_sorted = x_sorted Wd[e]; w_gate, w_up, h_gate, h_up, h_act are NULL. */
typedef struct {
    const DLTensor *x_sorted, *group_sizes, *group_offsets;
    const DLTensor *w_gate, *w_up, *w_down;
    DLTensor *h_gate, *h_up, *h_act, *y_sorted;
} dl_backend_expert_forward_args_t;

/* combine: out[t,:] = sum_j topk_weights[t,j] * y_sorted[pos(t*k+j),:]
 * where sort_perm[pos(f)] = f. */
typedef struct {
    const DLTensor *y_sorted, *topk_weights, *topk_ids, *sort_perm;
    DLTensor *out;
} dl_backend_combine_args_t;

/* ------------------------------------------------------ backward stages */

/* combine_backward: d_topk_weights[t,j] = <d_out[t,:], y_sorted[pos(t*k+j),:]>,
 * d_y_sorted[pos(t*k+j),:] = topk_weights[t,j] * d_out[t,:]. */
typedef struct {
    const DLTensor *d_out, *y_sorted, *topk_weights, *topk_ids, *sort_perm;
    DLTensor *d_topk_weights, *d_y_sorted;
} dl_backend_combine_backward_args_t;

/* expert_backward, per expert over its rows: d_h_act = d_y Wd^T,
 * d_w_down = h_act^T d_y, (d_h_gate, d_h_up) = SwiGLU backward,
 * d_x_sorted = d_h_gate Wg^T + d_h_up Wu^T, d_w_gate = x_sorted^T d_h_gate,
 * d_w_up = x_sorted^T d_h_up. An expert with no rows has exactly zero weight
 * gradients, which must be written. Plain FFN: d_x_sorted = d_y Wd^T,
 * d_w_down = x_sorted^T d_y; the SwiGLU tensors are NULL. */
typedef struct {
    const DLTensor *d_y_sorted, *x_sorted, *h_gate, *h_up, *h_act;
    const DLTensor *group_sizes, *group_offsets;
    const DLTensor *w_gate, *w_up, *w_down;
    DLTensor *d_h_act, *d_w_down, *d_h_gate, *d_h_up, *d_x_sorted;
    DLTensor *d_w_gate, *d_w_up;
} dl_backend_expert_backward_args_t;

/* router_backward: d_router_scores = the VJP of topk_weights w.r.t. the
 * scores (zero for unselected experts; the bias and the selection get no
 * gradient), d_router_logits = the VJP of the score function,
 * d_router_weight = x^T d_router_logits. */
typedef struct {
    const DLTensor *d_topk_weights, *router_logits, *router_scores, *topk_ids;
    const DLTensor *x, *router_weight;
    DLTensor *d_router_scores, *d_router_logits, *d_router_weight;
} dl_backend_router_backward_args_t;

/* input_backward: the whole gradient reaching x,
 * d_x[t,:] = sum_j d_x_sorted[pos(t*k+j),:] + d_router_logits[t,:] . router_weight^T. */
typedef struct {
    const DLTensor *d_x_sorted, *sort_perm, *topk_ids;
    const DLTensor *d_router_logits, *router_weight;
    DLTensor *d_x;
} dl_backend_input_backward_args_t;

/* ------------------------------------------------------------ the table */

typedef struct dl_backend {
    uint32_t abi_version;     /* DL_BACKEND_ABI_VERSION */
    const char *name;         /* short identifier, e.g. "plain-fp32" */
    const char *version;      /* the backend's own version string */
    const char *compute_mode; /* "fp32", "tf32", "bf16", "fp16", ...: selects
                               * the tolerance profile the checker applies */
    int (*router)(const dl_backend_config_t *c,
                  const dl_backend_router_args_t *a);
    int (*dispatch)(const dl_backend_config_t *c,
                  const dl_backend_dispatch_args_t *a);
    int (*permute)(const dl_backend_config_t *c,
                  const dl_backend_permute_args_t *a);
    int (*expert_forward)(const dl_backend_config_t *c,
                  const dl_backend_expert_forward_args_t *a);
    int (*combine)(const dl_backend_config_t *c,
                  const dl_backend_combine_args_t *a);
    int (*combine_backward)(const dl_backend_config_t *c,
                  const dl_backend_combine_backward_args_t *a);
    int (*expert_backward)(const dl_backend_config_t *c,
                  const dl_backend_expert_backward_args_t *a);
    int (*router_backward)(const dl_backend_config_t *c,
                  const dl_backend_router_backward_args_t *a);
    int (*input_backward)(const dl_backend_config_t *c,
                  const dl_backend_input_backward_args_t *a);
    /* Room for stages added in later minor revisions without an ABI bump;
     * leave zero (a static table with designated initialisers does). */
    void (*reserved[8])(void);
} dl_backend_t;

/* The type of the exported symbol DL_BACKEND_SYMBOL. */
typedef const dl_backend_t *(*dl_backend_entry_t)(void);

/* Typed views of a tensor's data (NULL for a NULL tensor). */
static inline float *dl_backend_f32(const DLTensor *t)
{
    return t ? (float *)t->data : (float *)0;
}
static inline int32_t *dl_backend_i32(const DLTensor *t)
{
    return t ? (int32_t *)t->data : (int32_t *)0;
}
static inline int64_t *dl_backend_i64(const DLTensor *t)
{
    return t ? (int64_t *)t->data : (int64_t *)0;
}

#ifdef __cplusplus
}
#endif
#endif
