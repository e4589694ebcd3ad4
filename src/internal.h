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

/* The exact sum of n binary64 values rounded once to t: a certified
 * binary64 sum, falling back to the exact accumulator when undecided. For
 * short sums (combine, un-permute). Sets *nonfinite if a term is NaN/Inf. */
double dl__sum_exact(const double *p, int64_t n, dl_dtype_t t, int *nonfinite);

/* The exact dot product of floats rounded once to t, certified from a
 * binary64 sum where possible (the common case), else exact. */
double dl__dot_cert(const float *a, ptrdiff_t inca, const float *b, ptrdiff_t incb,
                    int64_t n, dl_dtype_t t, int *nonfinite);

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

/* The exact sum of n binary64 values rounded once to t: a certified
 * binary64 sum, falling back to the exact accumulator when undecided. For
 * short sums (combine, un-permute). Sets *nonfinite if a term is NaN/Inf. */
double dl__sum_exact(const double *p, int64_t n, dl_dtype_t t, int *nonfinite);

/* The exact dot product of floats rounded once to t, certified from a
 * binary64 sum where possible (the common case), else exact. */
double dl__dot_cert(const float *a, ptrdiff_t inca, const float *b, ptrdiff_t incb,
                    int64_t n, dl_dtype_t t, int *nonfinite);

#endif
