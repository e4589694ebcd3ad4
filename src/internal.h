/* Internal helpers shared by the library's sources; not installed. */
#ifndef DL_INTERNAL_H
#define DL_INTERNAL_H

#include <float.h>
#include "dropless.h"

/* Golden bits must not depend on excess precision in registers. */
_Static_assert(FLT_EVAL_METHOD == 0, "dropless needs FLT_EVAL_METHOD == 0 (SSE2 or similar)");

#ifdef __GNUC__
#define DL__UNUSED __attribute__((unused))
#define DL__LIKELY(x) __builtin_expect(!!(x), 1)
#define DL__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define DL__UNUSED
#define DL__LIKELY(x) (x)
#define DL__UNLIKELY(x) (x)
/* 0 if offsets is a valid [E+1] exclusive prefix sum (starts at 0, never
 * decreases), else DL_EINVAL. */
int dl__gemm_check_offsets(const int64_t *offsets, int64_t E);

#endif

__extension__ typedef unsigned __int128 dl__u128;

/* Interval certification: the exact value is known to lie within
 * [y - err, y + err] (err >= 0, both finite). If every real in that interval
 * rounds to the same value of t (same sign of zero too), stores it in *out
 * and returns 1; else returns 0 and the caller must take a slower path. */
int dl__certify(double y, double err, dl_dtype_t t, double *out);

/* Propagates carries so that every limb but the top one is in [0, 2^32). */
void dl__acc_normalize(dl_acc_t *acc);

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

#endif
