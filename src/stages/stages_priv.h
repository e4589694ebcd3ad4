/* stages_priv.h: internals of the stages (src/stages/) shared between
 * stage files and with the layers above; not installed. */
#ifndef DL_STAGES_PRIV_H
#define DL_STAGES_PRIV_H

#include "core/core_priv.h"
#include "dropless/route.h"
#include "dropless/dispatch.h"
#include "dropless/gemm.h"
#include "dropless/moe.h"
#include "dropless/values.h"

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
/* Tuning of the fast GEMM path, for tests and benchmarks (not thread-safe):
 * kc = dgemm chunk length along K, budget = scratch bytes; 0 = default. */
void dl__gemm_set_tuning(int64_t kc, int64_t budget_bytes);

/* The address of stage s's array pointer inside *f (forward values) or *b
 * (backward values); NULL for an unknown s or when that struct is NULL. */
void **dl__value_slot(dl_moe_forward_t *f, dl_moe_backward_t *b, dl_value_t s);
/* Allocates every array of *f (when not NULL) and of *b (when not NULL)
 * that exists for c, zero-filled, a zero-sized one as one element; 0 or
 * DL_ENOMEM (the arrays that were allocated stay, for the caller's free). */
int dl__moe_arrays_alloc(const dl_moe_config_t *c, dl_moe_forward_t *f, dl_moe_backward_t *b);
/* Frees every array of *f and *b (either may be NULL) and sets it NULL. */
void dl__moe_arrays_free(dl_moe_forward_t *f, dl_moe_backward_t *b);

#endif
