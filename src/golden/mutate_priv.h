/* mutate_priv.h: internals of the mutation engine (mutate.c, replay.c,
 * simkernel.c in src/golden/); not installed. */
#ifndef DL_MUTATE_PRIV_H
#define DL_MUTATE_PRIV_H

#include "golden/golden_priv.h"
#include "dropless/mutate.h"

#define DL__BIT(s) DL_VALUE_BIT(s) /* a member of a value (or mutation) set */

/* One GEMM stage of the layer as the oracle computes it: a grouped GEMM
 * (terms over the sorted rows, or over all T rows as one group for the
 * router) or a ragged-K one (the weight gradients, and the router's with
 * one group of T rows). off NULL means rows ({0, T}). */
typedef struct {
    int ragged;
    dl_gemm_term_t terms[2];
    int nterms;
    int64_t N;
    const float *a, *b; /* ragged: out[e] = a_e^T b_e */
    int64_t ni, nj;
    const int64_t *off;
    int64_t rows[2];
    int64_t E;
    dl_dtype_t out_t;
} dl__mut_gemm_t;

/* replay.c. The GEMM of stage s on the stored values of f and b, or
 * DL_ENOTFOUND when s is no GEMM stage; expert: 1 for the expert GEMMs
 * (grouped over the experts), 0 for the router's. */
int dl__mut_gemm_of(const dl_moe_config_t *c, const dl_moe_inputs_t *in, const dl_moe_forward_t *f,
                    const dl_moe_backward_t *b, int s, dl__mut_gemm_t *g, int *expert);
/* Runs it with the oracle's exact stage functions into out. */
int dl__mut_gemm_run(const dl__mut_gemm_t *g, float *out);
/* The array of stage s in f or b (writable: the caller owns them). */
void *dl__mut_array(dl_moe_forward_t *f, dl_moe_backward_t *b, int s);
/* Recomputes, in dependency order, every stage that depends (directly or
 * not) on a stage of dirty (bits 1 << dl_value_t), by the oracle's stage
 * functions on the stored values, except the stages of fixed. */
int dl__mut_replay(const dl_moe_config_t *c, const dl_moe_inputs_t *in, dl_moe_forward_t *f,
                   dl_moe_backward_t *b, dl_valueset_t dirty, dl_valueset_t fixed);

/* simkernel.c: simulated kernels, NOT the oracle's arithmetic: what a GPU
 * kernel that accumulates in bf16 gives, and TF32 operand rounding. Only
 * the mutation engine calls them. */
float dl__sim_tf32(float x);
int dl__sim_gemm_bf16acc(const dl__mut_gemm_t *g, float *out);

#endif
