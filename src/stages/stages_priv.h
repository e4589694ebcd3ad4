/* stages_priv.h: internals of the stages (src/stages/) shared between
 * stage files and with the layers above; not installed. */
#ifndef DL_STAGES_PRIV_H
#define DL_STAGES_PRIV_H

#include <math.h>
#include "core/core_priv.h"
#include "dropless/route.h"
#include "dropless/dispatch.h"
#include "dropless/gemm.h"
#include "dropless/moe.h"
#include "dropless/shared.h"
#include "dropless/values.h"
#include "dropless/schedule.h"

/* The position of each row in DL_VALUE_MAP (dl_layout_row's index):
 * DL__ROW_X, DL__ROW_ROUTER_LOGITS, ... (the schedule's read and write
 * sets are bits of these). */
#define DL__ROW_POS(g, E, n, st, dims, cond, ...) DL__ROW_##E,
enum { DL_VALUE_MAP(DL__ROW_POS) DL__ROW_COUNT };
_Static_assert(DL__ROW_COUNT <= DL_ROWSET_BITS, "the schedule's row sets (dl_rowset_t) are too narrow");
/* value sets (dl_valueset_t: require, bad_shape, the mutations' stages) */
_Static_assert(DL_VALUE_COUNT <= DL_ROWSET_BITS, "the value sets (dl_valueset_t) are too narrow");

/* The selection's key of expert e: its score plus its bias (when the
 * router has one) rounded once to fp32, as dl_route_topk ranks it. */
float dl__route_key(const dl_route_config_t *c, const float *s, const float *bias, int64_t e);
/* Group g's score as dl_route_topk's group limit ranks it: its best key,
 * or the sum of its dl_route_group_terms best keys rounded once to fp32,
 * into *gs. 0, DL_ENONFINITE or DL_ENOMEM. */
int dl__route_group_score(const dl_route_config_t *c, const float *s, const float *bias,
                          int64_t g, float *gs);
/* The experts' forward on sorted rows xr [off[E], d] grouped by off (E+1):
 * y = down(silu(x W_gate) * (x W_up)) (SwiGLU; down(x) in a plain FFN),
 * stage by stage with the stages' functions, rounded as the layer rounds
 * them; hg and hu scratch [off[E], f]. 0 or the stages' error. */
int dl__experts_forward_rows(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                             const float *xr, const int64_t *off, float *hg, float *hu,
                             float *y);
/* An expert projection over rows grouped by off (E+1; rows of them in
 * all): out = lhs W [K -> N] and, with c->ffn_bias, + bias [E, N] as a
 * second term (a column of ones times the bias) of the one exact sum,
 * rounded once to c->dtype. 0 or the grouped GEMM's error, DL_ENOMEM. */
int dl__expert_projection(const dl_moe_config_t *c, const float *lhs, int64_t K, const float *w,
                          const float *bias, int64_t N, int64_t rows, const int64_t *off,
                          int64_t E, float *out, dl_tier_stats_t *stats);

/* One token's score-function VJP (dl_route_scores_backward's row): d_logits
 * [E] from the stored scores s [E] and d_scores ds [E]. */
int dl__route_scores_vjp_row(const dl_route_config_t *c, const float *s, const float *ds,
                             float *dl);
/* n rows of k expert ids, each in [0, E) and none twice in a row:
 * 0, DL_ERANGE or DL_EINVAL (route_input.c). */
int dl__route_rows_ok(const int32_t *ids, int64_t n, int64_t k, int64_t E);
/* dl_route_scale_input on the sorted rows [r0, r1) only, out holding
 * r1 - r0 rows (the schedule's windows; arguments already checked). */
int dl__scale_input_rows(const float *x, int64_t d, int64_t k, const float *w_in,
                         const int32_t *sort_perm, int64_t r0, int64_t r1, dl_dtype_t t,
                         float *out);
/* dl_input_backward_shared with the routed input's weights w_in [T, k]
 * (route.weight_on_input: d_x[t] gets sum_j w_in[t, j] d_x_sorted[inv[t, j]],
 * each product exact) or, w_in NULL, without (dispatch.c). */
int dl__input_backward_w(const float *d_x_sorted, const float *w_in, const int32_t *inv_perm,
                         const float *d_logits, const float *w_r, const dl_shared_grad_t *sh,
                         int64_t T, int64_t k, int64_t d, int64_t E, dl_dtype_t t, float *d_x);
/* top_k beyond this is not a MoE router; it bounds per-token stack buffers */
#define DL__MAX_TOPK 1024

/* 0 if offsets is a valid [E+1] exclusive prefix sum (starts at 0, never
 * decreases), else DL_EINVAL. */
int dl__gemm_check_offsets(const int64_t *offsets, int64_t E);

/* Argument checks shared by the grouped GEMMs and their references: 0 or
 * DL_EINVAL / DL_EOVERFLOW. On success *ks_out (if not NULL) is the summed K
 * of all terms and *io_out the bytes of inputs plus outputs (as floats). */
int dl__gemm_check_grouped(const dl_gemm_term_t *terms, int nterms, int64_t N,
                           const int64_t *offsets, int64_t E, const float *out,
                           int64_t *ks_out, int64_t *io_out);
int dl__gemm_check_ragged(const float *a, int64_t I, const float *b, int64_t J,
                          const int64_t *offsets, int64_t E, const float *out,
                          int64_t *io_out);
/* The combine's backward over the sorted rows [r0, r1): d_y[p - r0, :] =
 * RN_t(w[fl] d_out[fl / k, :]) for the assignment fl at p = inv_perm[fl],
 * and, if d_w is not NULL (it needs every row of y_sorted),
 * d_w[fl] = RN_fp32(<d_out[fl / k], y_sorted[p]>). inv_perm must be a
 * valid permutation of [0, T*k). 0 or DL_ENONFINITE. */
int dl__combine_backward(const float *y_sorted, const float *w, const int32_t *inv_perm,
                         const float *d_out, int64_t T, int64_t k, int64_t d, dl_dtype_t t,
                         int64_t r0, int64_t r1, float *d_w, float *d_y);
/* n floats of 1.0f (malloc'ed; NULL when out of memory): the bias terms' column. */
float *dl__ones(int64_t n);

/* dl_sort_assignments with Z zero (identity) experts, ids in [E, E + Z)
 * (LongCat-Flash): their rows are the sorted array's tail
 * [group_offsets[E], M), by zero expert then flat index; group_sizes [E]
 * and group_offsets [E + 1] are the real experts'. Z = 0 is
 * dl_sort_assignments. Errors as dl_sort_assignments. */
int dl__sort_assignments_z(const int32_t *ids, int64_t T, int64_t k, int64_t E, int64_t Z,
                           int32_t *sort_perm, int32_t *inv_perm, int64_t *group_sizes,
                           int64_t *group_offsets);
/* The identity tail of a window of `rows` sorted rows whose groups are
 * off[0..ne] (the rows past its last group, [off[ne] - off[0], rows): the
 * zero experts' rows): dst's tail rows (n floats each) = src's (an exact
 * copy), or +0 with src NULL; nothing without zero experts. Returns 0. */
int dl__identity_tail(const dl_moe_config_t *c, int64_t rows, const int64_t *off, int64_t ne,
                      const float *src, int64_t n, float *dst);

/* x_sorted rows [r0, r1) of dl_permute into out (row r0 first). sort_perm
 * is checked by the caller (dl_permute) or comes from dl_sort_assignments. */
int dl__permute_rows(const float *x, int64_t d, int64_t k, const int32_t *sort_perm, int64_t r0,
                     int64_t r1, float *out);
/* Bit tests of one float: 2 = NaN or infinity, 1 = finite but off the
 * grid of t, 0 = fine. The same verdicts as isfinite and dl_on_grid, on the
 * bits and branch-free so that the loop over a tensor vectorises (input
 * validation was a large share of the layer before). bf16 has fp32's
 * exponent range, so its grid is "the low 16 bits are zero"; fp16 normals
 * (2^-14 <= |v| <= 65504) keep 10 fraction bits, fp16 subnormals are the
 * multiples of 2^-24 below 2^-14. */
static inline int dl__float_verdict(uint32_t b, dl_dtype_t t)
{
    uint32_t a = b & 0x7fffffffu;
    int nonfinite = a >= 0x7f800000u;
    if (t == DL_F32)
        return nonfinite ? 2 : 0;
    if (t == DL_BF16)
        return nonfinite ? 2 : (b & 0xffffu) != 0;
    int e = (int)(a >> 23) - 127;
    uint32_t sub_mask = e < -14 && e >= -24 ? (UINT32_C(1) << (-1 - e)) - 1 : 0;
    int ok = a == 0 || (a <= 0x477fe000u && e >= -24 &&
                        (e >= -14 ? (a & 0x1fffu) == 0 : (a & sub_mask) == 0));
    return nonfinite ? 2 : !ok;
}

/* The routing rules of route_fn.c, each exact then rounded once to fp32 (0
 * or DL_EINTERNAL when MPFR's loop gives up: a bug):
 *   dl__sqrtsoftplus:     s = sqrt(softplus(l)) = sqrt(log(1 + exp(l)))
 *   dl__sqrtsoftplus_vjp: dl = ds (1 - exp(-s^2)) / (2 s) at the stored s
 *                         (+0 for s = 0 or ds = 0)
 *   dl__softmax_topk_weights: w[j] = c exp(s_j) / sum_i exp(s_i) over the
 *                         k selected scores s_i = s[ids[i]]
 *   dl__softmax_topk_dscores: ds[j] = c p_j (dw_j - sum_i p_i dw_i), p the
 *                         exact softmax of the selected scores; exact zeros +0 */
int dl__sqrtsoftplus(float l, float *s);
int dl__sqrtsoftplus_vjp(float s, float ds, float *dl);
int dl__softmax_topk_weights(double c, const float *s, const int32_t *ids, int64_t k, float *w);
int dl__softmax_topk_dscores(double c, const float *s, const int32_t *ids, const float *dw,
                             int64_t k, float *ds);

/* Tuning of the fast GEMM path, for tests and benchmarks (not thread-safe):
 * kc = dgemm chunk length along K, budget = scratch bytes; 0 = default. */
void dl__gemm_set_tuning(int64_t kc, int64_t budget_bytes);
/* Columns per sub-block of a tile (each K-chunk of B is converted and
 * multiplied that many columns at a time); 0 = default. */
void dl__gemm_set_subblock(int64_t cols);
/* The GEMM's tier-1 certificate of one element, for tests: when every real
 * in [y - err, y + err] rounds to one value of t, stores it and returns 1,
 * else stores a NaN and returns 0; fast = 1: the test every element takes
 * first, 0: the full one (cert_one in gemm.c). */
int dl__gemm_certify(double y, double err, dl_dtype_t t, int fast, float *out);

/* The address of stage s's array pointer inside *f (forward values) or *b
 * (backward values); NULL for an unknown s or when that struct is NULL. */
void **dl__value_slot(dl_moe_forward_t *f, dl_moe_backward_t *b, dl_value_t s);
/* Allocates every array of *f (when not NULL) and of *b (when not NULL)
 * that exists for c, zero-filled, a zero-sized one as one element; 0 or
 * DL_ENOMEM (the arrays that were allocated stay, for the caller's free). */
int dl__moe_arrays_alloc(const dl_moe_config_t *c, dl_moe_forward_t *f, dl_moe_backward_t *b);
/* Allocates, zero-filled, the arrays of the stage values in the mask
 * (bit s for dl_value_t s) that live in *f or *b (either may be NULL); 0 or
 * DL_ENOMEM. */
int dl__values_alloc(const dl_moe_config_t *c, dl_moe_forward_t *f, dl_moe_backward_t *b,
                     dl_valueset_t values);
/* Frees every array of *f and *b (either may be NULL) and sets it NULL. */
void dl__moe_arrays_free(dl_moe_forward_t *f, dl_moe_backward_t *b);


/* ------------------------------------------ each stage's checking side */
/* Beside each stage, the way BLIS keeps an operation's _check beside its
 * _ref: the functions the conformance runner (src/check/) judges a stage
 * value with, named after its row of DL_VALUE_MAP (its check and prop
 * columns say which exist). They take the runner's effective values and
 * never reimplement a stage: the exact value is a call of the stage, the
 * magnitudes are of its own arithmetic. */

/* How M = (|A||B|)_ij, the scale of the accumulation error, is obtained for
 * a value: from |g| (no products), a precomputed array, or the GEMM of
 * absolute values, in bulk (OpenBLAS dgemm per group) or per element. */
typedef enum {
    DL__M_ABS_G = 0,   /* M = |g| */
    DL__M_ARRAY,       /* M = arr[idx] */
    DL__M_GROUPED,     /* sum over terms of |lhs| |op(rhs[e])|, rows grouped by offsets */
    DL__M_RAGGED       /* out[e, i, j] = sum_{m in e} |a[m,i]| |b[m,j]| */
} dl__mkind_t;

typedef struct {
    dl__mkind_t kind;
    const double *arr;
    dl_gemm_term_t terms[2];
    int nterms;
    int64_t N;                 /* grouped: columns; ragged: J */
    const float *a, *b;        /* ragged */
    int64_t I;
    const int64_t *off;
    int64_t E;
} dl__mprov_t;

/* The runner's view of the layer for one value: the case, its inputs, the
 * effective value of every stage (v[s]: the candidate's where it provides
 * a finite one, else the exact one), the exact selection on the effective
 * scores, and memory owned by the runner (alloc: zeroed, freed with the
 * run, NULL on no memory). For dl__prop_<name>: delta[s] the per-element
 * bound (or statistical scale) on the error of absent value s, NULL where
 * none; bit s of rss: s's terms add as a root sum of squares. */
/* Elements below which a checking loop runs on one thread: a parallel
 * region costs more than such a loop (and far more on a loaded machine,
 * where the second thread waits for a core); results do not depend on it. */
#define DL__PAR_MIN 16384

/* The second output of a two-output exact function (the SwiGLU backward
 * gives d_h_gate and d_h_up in one pass), kept by the runner for the call
 * that asks for it: the gate flag of that call, the producer's first
 * operand (key), the effective operands it was computed on, n elements. */
typedef struct {
    float *v; /* NULL: nothing kept */
    int key, gate;
    const void *on[3];
    int64_t n;
} dl__spare_t;

/* The logistic function of a whole array of gate values, kept by the
 * runner: M and every tier's propagation of SwiGLU values need it again
 * (activation_check.c). Two slots (the routed experts' gate, the shared
 * ones'), replaced in turn. */
typedef struct {
    struct {
        const float *key; /* the effective gate values */
        int64_t n;
        double *v;
    } slot[2];
    int next;
} dl__memo_t;

typedef struct {
    const dl_moe_config_t *c;
    const dl_moe_inputs_t *in;
    const void *v[DL_VALUE_COUNT];
    int64_t T, d, f, E, k, M;
    int swiglu;
    dl_dtype_t act;
    const int32_t *sel_ids;
    const float *sel_weights;
    void *(*alloc)(void *actx, int64_t n, size_t size);
    void *actx;
    const double *delta[DL_VALUE_COUNT];
    uint64_t rss;
    dl__spare_t *spare; /* the runner's keep of a second output, or NULL */
    dl__memo_t *memo;   /* the runner's logistic values, or NULL */
} dl__vctx_t;

/* What dl__mag_<name> sets up for the comparison of a value: mp (preset,
 * zeroed but for the effective group offsets and E; set it NULL for
 * M = |g|), the contraction length K (or per row, row_K), the comparison's
 * rows and columns (0: the value's shape), elem (an elementwise
 * transcendental), short_sum (a short sum of separately rounded parts),
 * prod_store (products that may each be rounded to the case's type),
 * and the storage types of the nops GEMM operands (the runner counts those
 * off its profile's input grid). */
typedef struct {
    dl__mprov_t *mp;
    int64_t K;
    const int64_t *row_K;
    int64_t rows, cols;
    int elem, short_sum;
    int prod_store; /* a dot whose products a framework stores in the case's
                     * type before an fp32 sum (autograd's VJP of a
                     * broadcast multiply: (d_out * y).sum(-1)) */
    int nops;
    dl_dtype_t op[2];
} dl__mag_t;

/* The functions of one row, declared from DL_VALUE_MAP: a NUM, DW, END or
 * OUT row has dl__exact_<name> (its exact value on the effective upstream
 * into out, numel floats) and dl__mag_<name> (g its exact value); a COPY
 * row dl__exact_<name>; a prop ELEM row dl__prop_<name> (adds the first-
 * order error its absent upstream propagates into out[numel]; 1 when
 * some upstream carried one, 0 when none did). Missing one fails the link
 * with the value's name in the symbol. */
#define DL__EXACT_DECL(nm) int dl__exact_##nm(const dl__vctx_t *v, float *out);
#define DL__MAG_DECL(nm) int dl__mag_##nm(const dl__vctx_t *v, const float *g, int64_t numel, \
                                          dl__mag_t *m);
#define DL__CHECK_FNS_NONE(nm)
#define DL__CHECK_FNS_IDS(nm)
#define DL__CHECK_FNS_TOKENS(nm)
#define DL__CHECK_FNS_SORTED(nm)
#define DL__CHECK_FNS_COPY(nm) DL__EXACT_DECL(nm)
#define DL__CHECK_FNS_NUM(nm) DL__EXACT_DECL(nm) DL__MAG_DECL(nm)
#define DL__CHECK_FNS_DW(nm) DL__CHECK_FNS_NUM(nm)
#define DL__CHECK_FNS_END(nm) DL__CHECK_FNS_NUM(nm)
#define DL__CHECK_FNS_OUT(nm) DL__CHECK_FNS_NUM(nm)
#define DL__PROP_FNS_NONE(nm)
#define DL__PROP_FNS_GEMM(nm)
#define DL__PROP_FNS_ELEM(nm) int dl__prop_##nm(const dl__vctx_t *v, const float *g, \
                                                int64_t numel, double *out);
#define DL__CHECK_DECL(g, E, nm, st, dims, cond, ck, prop, ...) \
    DL__CHECK_FNS_##ck(nm) DL__PROP_FNS_##prop(nm)
DL_VALUE_MAP(DL__CHECK_DECL)

/* The router GEMM's magnitude for token t and expert e, as
 * dl__mag_router_logits describes it: sum_i |x[t,i]| |W[i,e]| (+ |b[e]|
 * with a router-logit bias), and its contraction length (d, or d + 1);
 * for the runner's hidden router (a selection made on logits it does not
 * see). */
double dl__route_logit_m(const dl_moe_config_t *c, const dl_moe_inputs_t *in, int64_t t,
                         int64_t e);
int64_t dl__route_logit_k(const dl_moe_config_t *c);
/* The score function's magnitudes (route_check.c), for the runner's
 * routing tolerances too: the row terms of token row l (logits), s
 * (scores) of E experts (softmax: mx = max l, zs = sum_j |s_j| |l_j - mx|;
 * sigmoid: none), M of its score e, and the first-order error of its
 * scores from errors dl of its logits into out[E] (out may be dl). */
void dl__route_score_m_row(const dl_route_config_t *c, int64_t E, const float *l, const float *s,
                           double *mx, double *zs);
double dl__route_score_m(const dl_route_config_t *c, const float *l, const float *s, int64_t e,
                         double mx, double zs);
void dl__route_score_prop_row(const dl_route_config_t *c, int64_t E, const float *s,
                              const double *dl, double *out);

/* Shared by the stages' checking sides (gemm_check.c). */
/* One grouped GEMM term over the effective group offsets. */
int dl__exact_grouped1(const float *lhs, int64_t K, const float *rhs, dl_rhs_layout_t lay,
                       int64_t N, const int64_t *off, int64_t E, dl_dtype_t t, float *out);
/* M of a grouped GEMM of one term over the sorted rows (operands of the
 * case's type). */
void dl__mag_grouped(const dl__vctx_t *v, dl__mag_t *m, const float *lhs, int64_t K,
                     const float *rhs, dl_rhs_layout_t lay, int64_t N);
/* M given element by element: n doubles owned by the runner, or NULL. */
double *dl__mag_array(const dl__vctx_t *v, dl__mag_t *m, int64_t n);
/* The effective value of stage s as floats. */
#define DL__EF(v, s) ((const float *)(v)->v[DL_VALUE_##s])
/* The router's width E + Z (the logits' and scores' columns; E without
 * zero experts), and the first sorted row of the identity tail. */
#define DL__RW(v) DL_ROUTE_WIDTH(&(v)->c->route)
/* The error bound of absent upstream s (NULL: none), whether its terms add
 * as a root sum of squares, and first-order sums of such terms. */
#define DL__DL(v, s) ((v)->delta[DL_VALUE_##s])
#define DL__RSS(v, s) ((int)(((v)->rss >> DL_VALUE_##s) & 1))
/* lin + sqrt(sq): linear terms plus the root sum of squares of the rest. */
static inline double dl__comb(double lin, double sq)
{
    return lin + sqrt(sq);
}

/* Llama-4's weights on the input on the runner's effective scores and ids,
 * [T, k] in the runner's memory (route_check.c); NULL on no memory or a
 * selection they do not fit. */
const float *dl__route_input_w(const dl__vctx_t *v);

/* The SwiGLU's values for its checking side (activation_check.c): gate,
 * up and the gradient into its output, the routed experts' (h_gate, h_up,
 * d_h_act) or the shared experts' (shared_check.c). dl__swiglu_mag and
 * dl__swiglu_prop are h_act's M and propagation, the _d ones those of
 * d_h_gate (gate 1) or d_h_up (gate 0); dl__swiglu_exact_d the exact
 * gradient, n elements (both come out of one pass: the other is kept in
 * v->spare, where set, for the call that asks for it on the same
 * operands). */
typedef struct {
    dl_value_t g, u, dh;
} dl__swiglu_vals_t;
int dl__swiglu_mag(const dl__vctx_t *v, dl__swiglu_vals_t o, int64_t n, dl__mag_t *m);
int dl__swiglu_prop(const dl__vctx_t *v, dl__swiglu_vals_t o, int64_t n, double *out);
int dl__swiglu_exact_d(const dl__vctx_t *v, dl__swiglu_vals_t o, int gate, int64_t n, float *out);
int dl__swiglu_mag_d(const dl__vctx_t *v, dl__swiglu_vals_t o, int gate, int64_t n, dl__mag_t *m);
int dl__swiglu_prop_d(const dl__vctx_t *v, dl__swiglu_vals_t o, int gate, int64_t n, double *out);

/* The shared experts' term of out[t, i] (shared.h): g_t y[t, i], exact in
 * binary64 (a product of two floats), g_t = 1 without the gate (g NULL);
 * 0 without shared experts (y NULL). A shared expert is never dropped. */
static inline double dl__shared_out_term(const float *y, const float *g, int64_t d, int64_t t,
                                         int64_t i)
{
    return y ? (g ? (double)g[t] : 1.0) * (double)y[t * d + i] : 0.0;
}
/* The first-order error the bounds dy on y and dg on g (NULL: none) carry
 * into that term: |g| dy + |y| dg. */
static inline double dl__shared_out_delta(const float *y, const float *g, const double *dy,
                                          const double *dg, int64_t d, int64_t t, int64_t i)
{
    if (!y)
        return 0.0;
    return (dy ? (g ? fabs((double)g[t]) : 1.0) * dy[t * d + i] : 0.0) +
           (g && dg ? dg[t] * fabs((double)y[t * d + i]) : 0.0);
}
/* The shared experts' effective shared_y and gate (NULL where the case has
 * none), for the combine's checking side (dispatch_check.c). */
void dl__shared_out_operands(const dl__vctx_t *v, const float **y, const float **g);
/* The terms of the combine's element out[t, i] (dl_combine_shared): the
 * products w[t,j] y[inv[t,j], i], exact in binary64, of the slots not in
 * drop (bit j: slot j left out, j < 64), then the shared experts' term
 * (dl__shared_out_term; sy NULL: none), into p; their count. */
static inline int64_t dl__combine_terms(const float *y, const float *w, const int32_t *inv,
                                        const float *sy, const float *sg, int64_t k, int64_t d,
                                        int64_t t, int64_t i, uint64_t drop, double *p)
{
    int64_t n = 0;
    for (int64_t j = 0; j < k; j++)
        if (j >= 64 || !((drop >> j) & 1))
            p[n++] = (double)w[t * k + j] * (double)y[(int64_t)inv[t * k + j] * d + i];
    if (sy)
        p[n++] = dl__shared_out_term(sy, sg, d, t, i);
    return n;
}
/* The combine's element out[t, i] on the effective values of v with the
 * slots in drop left out (the zero-drop diagnosis asks "is this row the
 * combine without these slots?"), as the stage computes it and as its
 * checking side judges it (dispatch_check.c): _exact its value, rounded as
 * the stage rounds it (*bad set on a non-finite one); _mag its M, the sum
 * of its terms' magnitudes; _prop the first-order error v's deltas carry
 * into the terms kept (the same as dl__prop_out's element with drop 0);
 * dl__out_slot |w[t,j] y[inv[t,j], i]|, slot j's part of it; dl__out_terms
 * the number of terms of the full sum (the comparison's K). */
double dl__out_exact_elem(const dl__vctx_t *v, int64_t t, int64_t i, uint64_t drop, int *bad);
double dl__out_mag_elem(const dl__vctx_t *v, int64_t t, int64_t i, uint64_t drop);
double dl__out_prop_elem(const dl__vctx_t *v, int64_t t, int64_t i, uint64_t drop);
double dl__out_slot(const dl__vctx_t *v, int64_t t, int64_t j, int64_t i);
int64_t dl__out_terms(const dl__vctx_t *v);
/* The shared path's terms of d_x on the effective values (sh->width 0
 * without shared experts), the magnitudes of its terms of d_x[t, i], their
 * count in the sum, and the first-order error their absent upstream
 * carries into d_x[t, i], added to *lin and *sq (shared_check.c). */
void dl__shared_grad(const dl__vctx_t *v, dl_shared_grad_t *sh);
double dl__shared_dx_m(const dl_shared_grad_t *sh, int64_t t, int64_t i);
int64_t dl__shared_dx_terms(const dl_shared_grad_t *sh);
void dl__shared_dx_prop(const dl__vctx_t *v, int64_t t, int64_t i, double *lin, double *sq);

#endif
