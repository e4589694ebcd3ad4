/* dropless/moe.h: the whole dropless MoE layer, forward and backward (the
 * custom VJP). Part of the public API; include <dropless.h>. */
#ifndef DROPLESS_MOE_H
#define DROPLESS_MOE_H
#include "core.h"
#include "features.h"
#include "route.h"
#include "gemm.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DL_FFN_SWIGLU = 0, /* y = (silu(x Wg) * (x Wu)) Wd */
    DL_FFN_PLAIN = 1,  /* y = x Wd, Wd [E, d, d]: one grouped GEMM alone */
    /* gpt-oss: gc = min(x Wg, limit), uc = clamp(x Wu, -limit, limit),
     * y = ((uc + 1) * gc * sigmoid(alpha gc)) Wd (act_alpha, act_limit) */
    DL_FFN_SWIGLU_CLAMP = 2,
    DL_FFN_GEGLU_TANH = 3, /* y = (gelu_tanh(x Wg) * (x Wu)) Wd */
    DL_FFN_RELU2 = 4 /* non-gated (Nemotron): y = relu(x Wu)^2 Wd, no w_gate */
} dl_ffn_t;

/* 1 for the gated FFNs (h_gate, h_up, h_act exist), 0 for DL_FFN_PLAIN. */
#define DL_FFN_GATED(k) ((k) == DL_FFN_SWIGLU || (k) == DL_FFN_SWIGLU_CLAMP || \
                         (k) == DL_FFN_GEGLU_TANH)
/* 1 for the FFNs with a hidden layer (h_up, h_act exist): the gated ones
 * and DL_FFN_RELU2; 0 for DL_FFN_PLAIN. */
#define DL_FFN_HIDDEN(k) (DL_FFN_GATED(k) || (k) == DL_FFN_RELU2)

typedef struct {
    int64_t tokens, hidden, ffn; /* T, d, f (f = d in DL_FFN_PLAIN) */
    dl_route_config_t route;     /* experts E and top_k k live here */
    dl_ffn_t ffn_kind;
    dl_dtype_t dtype;            /* activations, expert weights, d_out */
    int lowp;                    /* the expert GEMMs' low-precision layer recipe:
                                  * DL_LOWP_* of quant.h (0: none, the default) */
    /* Shared experts (doc/reference_layer.md): shared_experts S >= 0 dense
     * experts of width shared_ffn f_s applied to every token, of the case's
     * activation ffn_kind (any but plain; relu2's ungated, no gate weight),
     * stored concatenated as one MLP of width S*f_s (every value is
     * an exact sum rounded once, so the S experts' summed outputs and the
     * concatenated MLP's are the same number); shared_gate 1: their output
     * is scaled by sigmoid(x shared_gate_weight) (Qwen2-MoE), 0: unscaled
     * (DeepSeek-V2/V3). All 0: no shared experts. */
    int64_t shared_experts, shared_ffn;
    int shared_gate;
    /* DL_FFN_SWIGLU_CLAMP's alpha and limit (gpt-oss: 1.702 and 7; binary64
     * values, exact in the stage's arithmetic); 0 for the other kinds */
    double act_alpha, act_limit;
    /* the router weight's storage type: 0 (= DL_F32, the default), DL_BF16
     * or DL_F16; its values lie on that grid, the router GEMM is fp32 */
    dl_dtype_t router_dtype;
    /* 1: biases on the expert projections (gated FFNs only), gpt-oss's:
     * h_gate = x Wg + b_gate, h_up = x Wu + b_up, y = h_act Wd + b_down,
     * each sum exact and rounded once */
    int ffn_bias;
} dl_moe_config_t;

/* "swiglu", "plain", "swiglu-clamp", "geglu-tanh" (NULL for an unknown
 * kind), and back (0 or DL_ENOTFOUND): the names of the case-file format. */
DL_EXTERN const char *dl_ffn_name(dl_ffn_t k);
DL_EXTERN int dl_ffn_parse(const char *s, dl_ffn_t *k);

/* Checks shapes, routing and sizes (every tensor's element count must fit
 * int64 and T*k int32). Returns 0, DL_EINVAL or DL_EOVERFLOW. */
DL_EXTERN int dl_moe_config_validate(const dl_moe_config_t *c);

/* The layer's inputs, caller-owned. Shapes: x [T,d], router_weight [d,E]
 * (fp32 values on the grid of router_dtype), expert_bias [E] (fp32, only with route.has_bias), w_gate and w_up
 * [E,d,f], w_down [E,f,d], d_out [T,d] (backward only). Unused pointers may
 * be NULL. */
typedef struct {
    const float *x, *router_weight, *expert_bias;
    const float *w_gate, *w_up, *w_down;
    const float *d_out;
    /* shared experts only: shared_w_gate, shared_w_up [d,S*f_s] and
     * shared_w_down [S*f_s,d] and shared_gate_weight [d] (only with
     * shared_gate), all in the dtype */
    const float *shared_w_gate, *shared_w_up, *shared_w_down, *shared_gate_weight;
    const float *router_bias; /* [E] fp32, only with route.has_router_bias */
    const float *b_gate, *b_up, *b_down; /* [E,f], [E,f], [E,d] (act): ffn_bias only */
    /* hash routing only (route.hash_vocab = V > 0): token_ids [T] in [0, V),
     * hash_table [V, k] of distinct experts */
    const int32_t *token_ids, *hash_table;
} dl_moe_inputs_t;

/* Checks the inputs: present where needed, finite, and each on the grid
 * of its storage type. Returns 0, DL_EINVAL, DL_ENONFINITE or DL_EGRID. */
DL_EXTERN int dl_moe_inputs_validate(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                                     int need_backward);

/* Every stage of the forward pass (M = T*k rows in sorted order). */
typedef struct {
    float *router_logits;   /* [T,E] fp32 */
    float *router_scores;   /* [T,E] fp32 */
    int32_t *topk_ids;      /* [T,k] */
    float *topk_weights;    /* [T,k] fp32 */
    float *tie_margin;      /* [T] fp32 */
    int32_t *sort_perm;     /* [M] sorted position -> t*k+j */
    int32_t *inv_perm;      /* [M] t*k+j -> sorted position */
    int64_t *group_sizes;   /* [E] */
    int64_t *group_offsets; /* [E+1] */
    float *x_sorted;        /* [M,d] act */
    float *h_gate, *h_up;   /* [M,f] act (NULL in DL_FFN_PLAIN) */
    float *h_act;           /* [M,f] act (NULL in DL_FFN_PLAIN) */
    float *y_sorted;        /* [M,d] act */
#if DL_EXTRA_VALUE
    float *y_half;          /* [M,d] act: dl_extra_half(y_sorted) (--enable-extra-value) */
#endif
    /* shared experts only (F = S*f_s): */
    float *shared_h_gate, *shared_h_up; /* [T,F] act: x Wsg, x Wsu */
    float *shared_h_act;    /* [T,F] act: dl_swiglu */
    float *shared_y;        /* [T,d] act: shared_h_act Wsd */
    float *shared_gate_logit; /* [T] fp32: x w_sg (shared_gate only) */
    float *shared_gate;     /* [T] fp32: sigmoid(shared_gate_logit) (shared_gate only) */
    float *out;             /* [T,d] act: the combine + (g_t) shared_y */
    dl_tier_stats_t stats;  /* tiers taken by all the GEMMs */
} dl_moe_forward_t;

/* Runs the forward pass; allocates every array of *f (free with
 * dl_moe_forward_free, also after an error). Errors: those of
 * dl_moe_config_validate, dl_moe_inputs_validate, DL_ENOMEM. The free
 * functions keep arrays of 1 MiB and more (at most a quarter of the
 * machine's memory) for the next pass's arrays of the same sizes, whose
 * pages are then already there; an allocation that finds none of its size
 * returns them all first. DROPLESS_KEEP=0 in the environment frees at once. */
DL_EXTERN int dl_moe_forward(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                             dl_moe_forward_t *f);
DL_EXTERN void dl_moe_forward_free(dl_moe_forward_t *f);

/* The router and the dispatch of dl_moe_forward, alone, into arrays of *f
 * the caller allocated (f keeps no ownership it did not have): the router
 * GEMM (router_logits), dl_route_scores (router_scores), dl_route_topk
 * (topk_ids, topk_weights; tie_margin when not NULL); then, when sort_perm
 * is not NULL, dl_sort_assignments (sort_perm, inv_perm, group_sizes,
 * group_offsets), and when x_sorted is not NULL too, dl_permute. Needs only
 * in->x, in->router_weight and, with route.has_bias, in->expert_bias; the
 * tiers taken are added to f->stats. The one sequence the oracle, the
 * streaming generator and the capacity analysis run. Errors: those of
 * dl_moe_config_validate, DL_EINVAL (a needed array NULL), and those of the
 * stages (DL_ENONFINITE, DL_EGRID, DL_ERANGE, DL_ENOMEM). */
DL_EXTERN int dl_moe_route(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                           dl_moe_forward_t *f);

/* The gated activation of c->ffn_kind (any gated kind, in c->dtype):
 * h[i] = RN(act(g[i], u[i])), each exactly rounded once (certified
 * binary64, MPFR intervals when undecided; no libm exp). SwiGLU is
 * dl_swiglu; DL_FFN_SWIGLU_CLAMP (uc + 1) gc sigmoid(alpha gc);
 * DL_FFN_GEGLU_TANH u g S(2c g (1 + b g^2)) = u gelu_tanh(g), c =
 * sqrt(2/pi), b = 0.044715 as real numbers. An exact zero is +0. h may
 * alias g or u. Errors: DL_EINVAL (also: a kind that is not gated),
 * DL_EDTYPE, DL_ENONFINITE. */
DL_EXTERN int dl_ffn_act(const dl_moe_config_t *c, const float *g, const float *u, int64_t n,
                         float *h);
/* Its VJP: d_g[i] = RN(dh[i] dact/dg), d_u[i] = RN(dh[i] dact/du). At the
 * clamps of DL_FFN_SWIGLU_CLAMP the subgradient is PyTorch's: the clamp's
 * derivative is 1 on the closed range (g <= limit, |u| <= limit) and 0
 * outside. Either output may be NULL; outputs may alias inputs. Errors as
 * dl_ffn_act. */
DL_EXTERN int dl_ffn_act_backward(const dl_moe_config_t *c, const float *g, const float *u,
                                  const float *dh, int64_t n, float *d_g, float *d_u);

/* The activation's value and derivatives at (g, u) in binary64 (not
 * rounded: for the runner's tolerances): h, dh/dg, dh/du, d2h/dg2,
 * d2h/dgdu, d2h/du2 (huu: 0 but for relu2, whose h = relu(u)^2 is in u
 * alone, g unused); and the scales of the rounding
 * errors of the usual evaluations, the sums of their terms' magnitudes:
 * hm of h, hum of dh/du, hgm of dh/dg (GeGLU-tanh: of the model code's
 * g (1 + tanh) / 2, whose 1 + tanh cancels for negative g). At a clamp the
 * derivatives are those of the unclamped branch at the clamped point (an
 * upper bound of both one-sided ones in magnitude). */
typedef struct { double h, hg, hu, hgg, hgu, hm, hum, hgm, huu; } dl_ffn_act_deriv_t;
DL_EXTERN void dl_ffn_act_deriv(const dl_moe_config_t *c, double g, double u,
                                dl_ffn_act_deriv_t *d);

#if DL_EXTRA_VALUE
/* The synthetic stage of configure --enable-extra-value: out[i] =
 * RN_t(y[i] / 2), exact and rounded once, for n elements of type t.
 * Errors: DL_EINVAL (NULL arrays with n > 0, an unknown t), DL_ENONFINITE. */
DL_EXTERN int dl_extra_half(const float *y, int64_t n, dl_dtype_t t, float *out);
#endif

/* Every gradient of the backward pass, each an exact function of stored
 * forward values and upstream gradients, rounded once. */
typedef struct {
    float *d_topk_weights;  /* [T,k] fp32: <d_out[t], y[t,j]> */
    float *d_y_sorted;      /* [M,d] act: w[t,j] d_out[t] */
    float *d_h_act;         /* [M,f] act: d_y Wd^T */
    float *d_w_down;        /* [E,f,d] fp32: h_act_e^T d_y_e */
    float *d_h_gate, *d_h_up; /* [M,f] act: SwiGLU backward */
    float *d_x_sorted;      /* [M,d] act: d_h_gate Wg^T + d_h_up Wu^T */
    float *d_w_gate, *d_w_up; /* [E,d,f] fp32 */
    float *d_router_scores; /* [T,E] fp32 */
    float *d_router_logits; /* [T,E] fp32 */
    float *d_router_weight; /* [d,E] fp32: x^T d_router_logits */
    /* shared experts only (F = S*f_s): */
    float *d_shared_gate;   /* [T] fp32: <d_out[t], shared_y[t]> (shared_gate only) */
    float *d_shared_gate_logit; /* [T] fp32: d_shared_gate g (1 - g) (shared_gate only) */
    float *d_shared_gate_weight; /* [d] fp32: x^T d_shared_gate_logit (shared_gate only) */
    float *d_shared_y;      /* [T,d] act: g_t d_out (d_out without the gate) */
    float *d_shared_h_act;  /* [T,F] act: d_shared_y Wsd^T */
    float *d_shared_w_down; /* [F,d] fp32: shared_h_act^T d_shared_y */
    float *d_shared_h_gate, *d_shared_h_up; /* [T,F] act: SwiGLU backward */
    float *d_shared_w_gate, *d_shared_w_up; /* [d,F] fp32: x^T d_shared_h_gate, _up */
    float *d_x;             /* [T,d] act: un-permuted d_x_sorted + d_router_logits W_r^T
                             * (+ the shared experts' d_shared_h_gate Wsg^T +
                             * d_shared_h_up Wsu^T + d_shared_gate_logit w_sg^T) */
    float *d_router_bias;   /* [E] fp32: sum over tokens of d_router_logits (has_router_bias) */
    float *d_b_down;        /* [E,d] fp32: the column sums of d_y_e (ffn_bias only) */
    float *d_b_gate, *d_b_up; /* [E,f] fp32: those of d_h_gate_e, d_h_up_e (ffn_bias only) */
    dl_tier_stats_t stats;
} dl_moe_backward_t;

/* Runs the backward pass for d_out = in->d_out at the stored forward values
 * *f (caller-owned, from dl_moe_forward); allocates every array of *b (free
 * with dl_moe_backward_free, also after an error). Errors: DL_EINVAL (NULL
 * f or b; those of dl_moe_config_validate), DL_EOVERFLOW, DL_ENONFINITE and
 * DL_EGRID (dl_moe_inputs_validate with d_out), DL_ERANGE (an invalid
 * permutation in *f), DL_ENOMEM. */
DL_EXTERN int dl_moe_backward(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                              const dl_moe_forward_t *f, dl_moe_backward_t *b);
DL_EXTERN void dl_moe_backward_free(dl_moe_backward_t *b);

/* The tail of dl_moe_backward, alone, into arrays of *b the caller
 * allocated: dl_route_backward (d_router_scores, d_router_logits from the
 * stored d_topk_weights), the router weight gradient d_router_weight =
 * x^T d_router_logits, and dl_input_backward (d_x, from the stored
 * d_x_sorted). The one sequence the oracle and the streaming generator run.
 * Errors: those of dl_moe_config_validate, DL_EINVAL (a needed array NULL),
 * and those of the stages. */
DL_EXTERN int dl_moe_route_backward(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                                    const dl_moe_forward_t *f, dl_moe_backward_t *b);

#ifdef __cplusplus
}
#endif
#endif
