/* dropless/core.h: errors, storage types, correct rounding, the exact accumulator.
 * Part of the public API; include <dropless.h>, not this file. */
#ifndef DROPLESS_CORE_H
#define DROPLESS_CORE_H

#include <stddef.h>
#include <stdint.h>

#define DL_VERSION_STRING "0.1.0"

/* Marks the public API: the library is built with -fvisibility=hidden, so
 * only what is declared with DL_EXTERN is exported from libdropless.so. */
#if defined(__GNUC__) && __GNUC__ >= 4
#define DL_EXTERN extern __attribute__((visibility("default")))
#else
#define DL_EXTERN extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A set of the layer's arrays: bit i for row i of DL_VALUE_MAP (values.h),
 * which is also dataset i of the golden format. 128 bits wide (the table
 * outgrew 64 rows with the model variants); the compiler must have a
 * 128-bit integer (gcc and clang do on every 64-bit target). */
#if !defined(__SIZEOF_INT128__)
#error "dropless needs unsigned __int128 (gcc or clang on a 64-bit target)"
#endif
__extension__ typedef unsigned __int128 dl_rowset_t;
#define DL_ROWSET_BITS 128
/* The set holding row i alone; 1 if set s holds row i. */
#define DL_ROWSET_BIT(i) ((dl_rowset_t)1 << (i))
#define DL_ROWSET_HAS(s, i) ((int)(((s) >> (i)) & 1))

/* ---------------------------------------------------------------- errors */

/* Every function that can fail returns 0 or one of these negative codes. */
#define DL_ERRNO_MAP(X)                                                     \
    X(EINVAL, -1, "invalid argument")                                       \
    X(ENOMEM, -2, "out of memory")                                          \
    X(EOVERFLOW, -3, "size overflows 64-bit arithmetic or the allowed maximum") \
    X(ENONFINITE, -4, "NaN or infinity in an input")                        \
    X(ERANGE, -5, "index out of range")                                     \
    X(ESHAPE, -6, "shape mismatch")                                         \
    X(EDTYPE, -7, "unsupported or mismatched data type")                    \
    X(EIO, -8, "I/O error")                                                 \
    X(EFORMAT, -9, "malformed or unsupported file")                         \
    X(EEXIST, -10, "output file exists (use --force)")                      \
    X(ENOTFOUND, -11, "not found")                                          \
    X(EPLUGIN, -12, "backend plugin failed")                                \
    X(EGRID, -13, "value not representable in the declared storage type")   \
    X(EINTERNAL, -14, "internal error (a bug in dropless)")

typedef enum {
#define DL__ERR_ENUM(name, val, msg) DL_##name = val,
    DL_ERRNO_MAP(DL__ERR_ENUM)
#undef DL__ERR_ENUM
    DL_ERRNO_MIN = -15
} dl_errno_t;

/* A static, human-readable message for an error code; "unknown error" for
 * anything not in the table, "success" for 0. Never NULL. */
DL_EXTERN const char *dl_strerror(int err);

/* The symbolic name of an error code ("DL_EINVAL"), or "DL_UNKNOWN". */
DL_EXTERN const char *dl_err_name(int err);

/* ---------------------------------------------------------- storage types */

/* The grids a stage value may be rounded to. In memory every fp32/bf16/fp16
 * value is held in a float (each bf16 and fp16 value is exactly a float);
 * DL_F64 values are held in doubles. */
typedef enum {
    DL_F32 = 0,
    DL_BF16 = 1,
    DL_F16 = 2,
    DL_F64 = 3
} dl_dtype_t;

/* "fp32", "bf16", "fp16", "fp64"; NULL for an unknown value. */
DL_EXTERN const char *dl_dtype_name(dl_dtype_t t);
/* Parses the names above (also "float32", "bfloat16", "float16", "float64").
 * Returns 0 and sets *t, or DL_EDTYPE. */
DL_EXTERN int dl_dtype_parse(const char *name, dl_dtype_t *t);
/* Significand bits including the implicit bit: 24, 8, 11, 53. */
DL_EXTERN int dl_dtype_precision(dl_dtype_t t);
/* Unit roundoff 2^-p of the type. */
DL_EXTERN double dl_dtype_unit_roundoff(dl_dtype_t t);

/* Round x to the nearest value of type t, ties to even, with the type's
 * subnormals, signed zeros, overflow to +-infinity and NaN propagation. The
 * result is returned as a double that is exactly a value of t. */
DL_EXTERN double dl_round(double x, dl_dtype_t t);

/* 1 if x is exactly a value of type t (NaN and infinities count), else 0. */
DL_EXTERN int dl_on_grid(double x, dl_dtype_t t);

/* Bit-level conversions for exchanging real 16-bit buffers (DLPack, files).
 * From a float: round to nearest even. To a float: exact. */
DL_EXTERN uint16_t dl_bf16_from_float(float x);
DL_EXTERN float dl_bf16_to_float(uint16_t b);
DL_EXTERN uint16_t dl_f16_from_float(float x);
DL_EXTERN float dl_f16_to_float(uint16_t h);

/* Round a value given as sign * (hi * 2^exp + a positive amount below
 * 2^exp when sticky) to type t. hi must have bit 63 set, or be 0 (then the
 * value is zero or a quantity below 2^exp, which must then be zero). This is
 * the one rounding primitive; everything else reduces to it. */
DL_EXTERN double dl_round_parts(int negative, uint64_t hi, int exp, int sticky, dl_dtype_t t);

/* ------------------------------------------------------ exact accumulator */

/* A fixed-point accumulator wide enough to hold any sum of products of two
 * binary64 values exactly: bit 0 weighs 2^-2148 (the smallest product of
 * subnormals), the top limb 2^2172, leaving 156 bits of headroom above the
 * largest product (< 2^2048). Limbs hold 32-bit digits in int64; carries are
 * propagated every 2^29 adds, before any limb can overflow.
 * NaN and infinities are tracked as flags, with IEEE semantics for the
 * result. The struct is public so it can live on the stack; treat its
 * fields as private. */
#define DL_ACC_LSB_EXP (-2148)
#define DL_ACC_LIMBS 136
typedef struct {
    int64_t limb[DL_ACC_LIMBS];
    int lo, hi;         /* range of limbs touched since the last clear */
    uint32_t pending;   /* adds since the last carry propagation */
    uint8_t pos_inf, neg_inf, nan;
} dl_acc_t;

/* Sets the accumulator to exact zero. */
DL_EXTERN void dl_acc_clear(dl_acc_t *acc);
/* acc += x, exactly. */
DL_EXTERN void dl_acc_add(dl_acc_t *acc, double x);
/* acc += a * b, exactly (any binary64 a, b). */
DL_EXTERN void dl_acc_add_prod(dl_acc_t *acc, double a, double b);
/* acc += other, exactly. */
DL_EXTERN void dl_acc_add_acc(dl_acc_t *acc, const dl_acc_t *other);
/* The exact value rounded once to type t (a double exactly in t). An exact
 * zero sum is +0. */
DL_EXTERN double dl_acc_round(const dl_acc_t *acc, dl_dtype_t t);
/* -1, 0 or +1: the sign of the exact value (NaN: 0, infinities: +-1). */
DL_EXTERN int dl_acc_sign(const dl_acc_t *acc);

/* The exact dot product sum_i a[i*inca] * b[i*incb] of floats, rounded once
 * to t. */
DL_EXTERN double dl_dot_exact_f32(const float *a, ptrdiff_t inca, const float *b,
                                  ptrdiff_t incb, size_t n, dl_dtype_t t);
/* The same over doubles. */
DL_EXTERN double dl_dot_exact_f64(const double *a, ptrdiff_t inca, const double *b,
                                  ptrdiff_t incb, size_t n, dl_dtype_t t);

/* --------------------------------------------------- checked size arithmetic */

/* *r = a * b (a, b >= 0); DL_EOVERFLOW if the product exceeds INT64_MAX. */
DL_EXTERN int dl_mul_size(int64_t a, int64_t b, int64_t *r);

#ifdef __cplusplus
}
#endif
#endif
