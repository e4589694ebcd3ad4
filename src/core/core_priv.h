/* core_priv.h: the exact arithmetic core's internals (src/core/), shared
 * with the layers above; not installed. Includes no other layer. */
#ifndef DL_CORE_PRIV_H
#define DL_CORE_PRIV_H

#include <float.h>
#include <string.h>
#include "dropless/core.h"
#include "dropless/lowp.h"

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
#endif

/* Vector clones of a hot loop where the compiler and CPU allow it (the
 * clones do the same IEEE operations: the build has -ffp-contract=off). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define DL__VEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DL__VEC_CLONES
#endif
#ifdef __GNUC__
#define DL__ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define DL__ALWAYS_INLINE static inline
#endif

__extension__ typedef unsigned __int128 dl__u128;

/* Interval certification: the exact value is known to lie within
 * [y - err, y + err] (err >= 0, both finite). If every real in that interval
 * rounds to the same value of t (same sign of zero too), stores it in *out
 * and returns 1; else returns 0 and the caller must take a slower path. */
int dl__certify(double y, double err, dl_dtype_t t, double *out);

/* Propagates carries so that every limb but the top one is in [0, 2^32). */
void dl__acc_normalize(dl_acc_t *acc);

/* out[i] = w g[i] rounded once to t, i < n (round.c; w a float's value,
 * so each product is exact): dl_round's bits, vectorised. */
void dl__round_scaled(const float *g, double w, int64_t n, dl_dtype_t t, float *out);

/* The exact sum of n binary64 values rounded once to t: a certified
 * binary64 sum, falling back to the exact accumulator when undecided. For
 * short sums (combine, un-permute). Sets *nonfinite if a term is NaN/Inf. */
double dl__sum_exact(const double *p, int64_t n, dl_dtype_t t, int *nonfinite);

/* The exact dot product of floats rounded once to t, certified from a
 * binary64 sum where possible (the common case), else exact. */
double dl__dot_cert(const float *a, ptrdiff_t inca, const float *b, ptrdiff_t incb,
                    int64_t n, dl_dtype_t t, int *nonfinite);

/* ------------------------------------------------ low-precision formats (lowp.c) */

/* Significand bits (implicit one included) and the smallest normal's
 * exponent of an element format (E4M3, E5M2, E2M1). */
void dl__qfmt_params(dl_qfmt_t f, int *p, int *emin);

/* The magnitude code of a in [2^emin, max] of a format with p significand
 * bits, rounded to nearest even on the binary64 bits: a carry into the
 * exponent is the right answer, and nothing at or below max rounds beyond
 * it. The hot path of dl_qencode and of the quantizer. */
static inline unsigned dl__qencode_normal(double a, int p, int emin)
{
    uint64_t bits;
    memcpy(&bits, &a, 8);
    int drop = 52 - (p - 1);
    bits += (UINT64_C(1) << (drop - 1)) - 1 + ((bits >> drop) & 1);
    int ex = (int)(bits >> 52) - 1023;
    unsigned mant = (unsigned)(bits >> drop) & ((1u << (p - 1)) - 1);
    return (unsigned)(ex - emin + 1) << (p - 1) | mant;
}

/* ------------------------------------------ certified transcendentals (transc.c) */

/* Relative error bound of dl__exp_parts (the proof is in src/core/transc.c). */
#define DL__EXP_REL 0x1p-50

/* exp(x + xl) = y * 2^k * (1 + theta), |theta| <= DL__EXP_REL, for
 * |x| <= 1100 and |xl| <= 2^-40; returns y (in [0.70, 1.42]) and sets *k.
 * Uses no libm exp/log, so the bits are the same on every platform. */
double dl__exp_parts(double x, double xl, int *k);

/* Correctly rounded to t (certified binary64, MPFR when undecided); x, g,
 * u finite. Return 0 or DL_EINTERNAL (the MPFR loop gave up: a bug). An
 * exact zero result is +0.
 *   dl__sigmoid:   1 / (1 + exp(-x))
 *   dl__silu_mul:  silu(g) * u
 *   dl__dsilu_mul: silu'(g) * p, p = the exact product of two floats */
int dl__sigmoid(double x, dl_dtype_t t, double *out);
int dl__silu_mul(double g, double u, dl_dtype_t t, double *out);
int dl__dsilu_mul(double g, double p, dl_dtype_t t, double *out);
/* Over arrays (out may be g, u or dh, element for element): which
 * DL__ACT_H out = silu(g) u, DL__ACT_DU silu(g) dh, DL__ACT_DG silu'(g) dh u
 * (the scalar functions' results, bit for bit; a vector fast path for the
 * common lanes). Returns 0 or the scalar functions' error. */
int dl__silu_array(int which, const float *g, const float *u, const float *dh, int64_t n,
                   dl_dtype_t t, float *out);

/* The activations of act.c, correctly rounded to t (the stages' types
 * fp32, bf16, fp16; DL_F64 only where the interval path resolves it):
 *   kind DL__ACT_OAI    gpt-oss: gc = min(g, limit), uc = clamp(u, +-limit),
 *                       h = (uc + 1) gc S(alpha gc)
 *        DL__ACT_GELU   GeGLU-tanh: h = u gelu_tanh(g)
 *        DL__ACT_RELU2  h = relu(g)^2 (u unused)
 *   which DL__ACT_H   h;  DL__ACT_DG  dh dh/dg;  DL__ACT_DU  dh dh/du.
 * The clamps' derivative is 1 on the closed range, 0 outside (PyTorch's
 * clamp); relu's is 0 at 0. g, u, dh: finite floats; alpha, limit finite.
 * An exact zero is +0. Returns 0 or DL_EINTERNAL (the MPFR loop gave up). */
enum { DL__ACT_OAI = 1, DL__ACT_GELU = 2, DL__ACT_RELU2 = 3 };
enum { DL__ACT_H = 0, DL__ACT_DG = 1, DL__ACT_DU = 2 };
int dl__act_eval(int kind, double alpha, double limit, int which, double g, double u,
                 double dh, dl_dtype_t t, double *out);

/* out[e] = softmax(l)[e] for a row of n finite logits, each correctly
 * rounded to t (stored as float, so t must not be DL_F64). */
int dl__softmax_row(const float *l, int64_t n, dl_dtype_t t, float *out);

/* How many evaluations so far took the MPFR fallback (all threads). */
uint64_t dl__mpfr_fallbacks(void);
/* Adds one to that count; for other modules' MPFR fallbacks. */
void dl__mpfr_fallback_note(void);

#ifdef MPFR_VERSION
/* x rounded once to t, with t's subnormals and overflow, through
 * dl_round_parts; touches no MPFR global state. */
double dl__mpfr_round(mpfr_srcptr x, dl_dtype_t t);

/* Ziv's loop over an interval evaluator: eval(lo, hi, ctx) must set lo <= exact
 * <= hi at the precision of lo and hi (both set to p by the loop). Doubles p
 * from 128 bits until both ends round to the same value of t. Counts one
 * fallback. The caller must hold `#pragma omp critical(dl__mpfr)`. Returns 0
 * or DL_EINTERNAL past 2^16 bits. */
typedef void (*dl__ival_fn)(mpfr_ptr lo, mpfr_ptr hi, const void *ctx);
int dl__ziv(dl__ival_fn eval, const void *ctx, dl_dtype_t t, double *out);
/* dl__ziv inside that critical section. */
int dl__ziv_locked(dl__ival_fn eval, const void *ctx, dl_dtype_t t, double *out);
#endif

#endif
