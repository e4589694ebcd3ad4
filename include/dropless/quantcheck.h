/* dropless/quantcheck.h: checks of a candidate's quantized bytes and
 * scales against a declared rule (naming the rule they follow instead),
 * and of a block-scaled GEMM's output under an accumulation profile.
 * Part of the public API; include <dropless.h>. doc/lowprecision.md. */
#ifndef DROPLESS_QUANTCHECK_H
#define DROPLESS_QUANTCHECK_H
#include "quant.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The named rule variants the checker tries when a candidate does not
 * follow the declared rule, in this order: X(ENUM, name, what). A variant
 * that would not change the declared rule is skipped. */
#define DL_QVARIANT_MAP(X)                                                                  \
    X(DIV32, "fp32-division", "elements RN(RN32(x / s)): the quotient rounded to fp32 first")  \
    X(TIES_AWAY, "ties-away", "elements rounded to nearest, ties away from zero")            \
    X(TIES_ZERO, "ties-toward-zero", "elements rounded to nearest, ties toward zero")         \
    X(TOWARD_ZERO, "toward-zero", "elements truncated toward zero")                          \
    X(MULAMAX, "multiply-fmax-over-amax", "elements RN(x * RN32(fmax/amax)) in fp32 (the earlier DeepGEMM test cast)") \
    X(RECIP, "reciprocal-multiply", "elements RN(x * RN32(1/s)) in fp32, not x / s")         \
    X(NOSAT, "no-saturation", "elements beyond the format's max overflow (E4M3: NaN)")       \
    X(POW2_AFTER, "pow2-after-quantize", "elements quantized with the fp32 scale, the stored scale rounded up to a power of two afterwards") \
    X(UE8M0_FLOOR, "ue8m0-floor", "power-of-two scale with the mantissa truncated (floor)")  \
    X(UE8M0_CEIL, "ue8m0-ceil", "power-of-two scale 2^ceil(log2(amax/max)) on the bits")     \
    X(OCP_MX, "ocp-mx", "power-of-two scale 2^(floor(log2 amax) - emax_elem)")               \
    X(LOG2_FLOAT, "log2-ceil-float", "power-of-two scale 2^ceil(log2f(sf)): misses values just above a power of two") \
    X(LOG2_PLUS1, "log2-ceil-off-by-one", "power-of-two scale 2^(floor(log2 sf) + 1): one too large on exact powers")

typedef enum {
#define DL__QV_ENUM(E, name, what) DL_QV_##E,
    DL_QVARIANT_MAP(DL__QV_ENUM)
#undef DL__QV_ENUM
    DL_QV_N
} dl_qvariant_t;

/* Layout defects the checker recognises when no rule variant matches. */
#define DL_QDEFECT_MAP(X)                                                               \
    X(NIBBLES, "swapped-nibbles", "FP4 elements 2i and 2i+1 swapped in each byte")       \
    X(SHIFTED, "scale-block-shifted", "each scale belongs to the neighbouring block along K") \
    X(LEAKED, "leaked-ue8m0-bits", "packed UE8M0 bytes carry extra (mantissa) bits")      \
    X(NAN, "nan-elements", "NaN element codes where the declared rule has finite values")

typedef enum {
#define DL__QD_ENUM(E, name, what) DL_QD_##E,
    DL_QDEFECT_MAP(DL__QD_ENUM)
#undef DL__QD_ENUM
    DL_QD_N
} dl_qdefect_t;

/* The verdict of dl_qcheck. */
typedef struct {
    int conformant;           /* 1: bit-identical to the declared rule */
    int64_t elements, blocks; /* compared */
    int64_t elem_diff;        /* element codes that differ from the declared rule */
    int64_t scale_diff;       /* scales that differ (all-zero blocks: only a NaN scale) */
    int64_t first_elem[2];    /* (row, col) of the first differing element, or -1 */
    unsigned cand_code, want_code;
    int64_t first_block[2];   /* (block row, block col) of the first differing scale, or -1 */
    double cand_scale, want_scale;
    int variant;              /* the dl_qvariant_t reproducing the candidate bit-exactly, or -1 */
    int defect;               /* the dl_qdefect_t recognised, or -1 */
} dl_qcheck_t;

/* Checks a candidate's quantization cand (its rule pointer is ignored: the
 * candidate's bytes are read with the declared rule's layout) of x [rows,
 * cols] against rule r. Fills *res; returns 0, or DL_EINVAL / DL_ENOMEM /
 * DL_ENONFINITE (x). */
DL_EXTERN int dl_qcheck(const dl_qrule_t *r, const float *x, int64_t rows, int64_t cols,
                        const dl_qmat_t *cand, dl_qcheck_t *res);
/* The name and description of a variant or defect; NULL when out of range. */
DL_EXTERN const char *dl_qvariant_name(int v);
DL_EXTERN const char *dl_qvariant_what(int v);
DL_EXTERN const char *dl_qdefect_name(int d);
DL_EXTERN const char *dl_qdefect_what(int d);
/* One line: "CONFORMANT ..." or "NOT CONFORMANT: follows <variant> ..." */
DL_EXTERN int dl_qcheck_format(const dl_qcheck_t *res, char *buf, size_t len);

/* Accumulation profiles of a block-scaled GEMM (doc/lowprecision.md):
 *   EXACT   bit-identical to dl_gemm_block_scaled;
 *   FP32    fp32 partial sums per K-block, scaled per block, summed in fp32
 *           (TOSA 1.1 MATMUL_T_BLOCK_SCALED's order);
 *   HOPPER  FP8 tensor cores: a ~14-bit truncating accumulator, promoted to
 *           fp32 every N_C = 128 products (DeepSeek-V3 report §3.3). */
typedef enum { DL_QACC_EXACT = 0, DL_QACC_FP32 = 1, DL_QACC_HOPPER = 2 } dl_qacc_t;

typedef struct {
    int64_t checked, failed;
    int64_t first[2];       /* (row, col) of the worst failure, or -1 */
    double worst_ratio;     /* max |cand - golden| / tolerance */
    double cand, want, tol; /* at the worst element */
} dl_qgemm_check_t;

/* Checks cand [M_total, N] against dl_gemm_block_scaled(a, b, ...) under
 * profile p: |cand - golden| <= tol(m, n) element by element, with tol
 * from the profile's bound (doc/lowprecision.md). A NaN where the golden
 * is finite fails. 0 or the GEMM's errors. */
DL_EXTERN int dl_qcheck_gemm(const dl_qmat_t *a, const dl_qmat_t *b, int64_t E,
                             const int64_t *offsets, dl_dtype_t out_t, dl_qacc_t p,
                             const float *cand, dl_qgemm_check_t *res);

#ifdef __cplusplus
}
#endif
#endif
