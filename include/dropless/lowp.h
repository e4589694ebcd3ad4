/* dropless/lowp.h: low-precision element and scale formats (FP8 E4M3 and
 * E5M2, FP4 E2M1, the UE8M0 scale), exact encode and decode.
 * Part of the public API; include <dropless.h>, not this file.
 * The contract is doc/lowprecision.md. */
#ifndef DROPLESS_LOWP_H
#define DROPLESS_LOWP_H
#include "core.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The formats, one row each: X(ENUM, name, bits, p, emin, emax, max, kind)
 *   bits  storage bits of one code; p significand bits with the implicit one;
 *   emin  exponent of the smallest normal; emax of the largest finite;
 *   max   largest finite value;
 *   kind  FN   finite + NaN, no infinity (OCP E4M3: S.1111.111 is NaN),
 *         IEEE infinities and NaNs (E5M2: exponent 11111),
 *         FIN  finite only (E2M1: no NaN, no infinity),
 *         POW2 unsigned powers of two 2^(c-127), c = 255 is NaN, no zero (UE8M0).
 * FP32 scales are plain binary32 (dl_round(x, DL_F32)) and have no row. */
#define DL_QFMT_MAP(X)                                   \
    X(E4M3, "e4m3", 8, 4, -6, 8, 448.0, FN)               \
    X(E5M2, "e5m2", 8, 3, -14, 15, 57344.0, IEEE)         \
    X(E2M1, "e2m1", 4, 2, 0, 2, 6.0, FIN)                 \
    X(UE8M0, "ue8m0", 8, 1, -127, 127, 0x1p127, POW2)

typedef enum {
#define DL__QF_ENUM(E, name, bits, p, emin, emax, max, kind) DL_Q_##E,
    DL_QFMT_MAP(DL__QF_ENUM)
#undef DL__QF_ENUM
    DL_Q_NFMT
} dl_qfmt_t;

/* Rounding of an encode: to nearest, ties to even (the default everywhere),
 * to nearest with ties away from zero, toward zero (truncation), toward
 * +infinity (UE8M0 ceil), toward -infinity (UE8M0 floor), to nearest with
 * ties toward zero (DeepGEMM's test quantizer). */
typedef enum {
    DL_QR_RNE = 0,
    DL_QR_AWAY = 1,
    DL_QR_ZERO = 2,
    DL_QR_UP = 3,
    DL_QR_DOWN = 4,
    DL_QR_TIEZERO = 5
} dl_qround_t;

/* "e4m3", ...; NULL for an unknown value. dl_qfmt_parse: 0 or DL_EDTYPE. */
DL_EXTERN const char *dl_qfmt_name(dl_qfmt_t f);
DL_EXTERN int dl_qfmt_parse(const char *name, dl_qfmt_t *f);
/* The largest finite value of f (448, 57344, 6, 2^127). */
DL_EXTERN double dl_qfmt_max(dl_qfmt_t f);
/* Exponent of f's largest normal binade (OCP MX "emax_elem": 8, 15, 2). */
DL_EXTERN int dl_qfmt_emax(dl_qfmt_t f);
/* Storage bits of one code (8, 8, 4, 8). */
DL_EXTERN int dl_qfmt_bits(dl_qfmt_t f);

/* Encodes x (any binary64) into f's code, rounded once with mode r.
 * saturate != 0: a finite result beyond max (and an infinity) becomes
 * +-max; saturate == 0: it becomes infinity (E5M2) or NaN (E4M3, UE8M0);
 * E2M1 always saturates (it has neither). NaN gives f's NaN code (E4M3
 * 0x7f, E5M2 0x7e, UE8M0 0xff; E2M1: 0, and *nan_lost set when not NULL).
 * UE8M0 is unsigned and has no zero: x <= 0 and anything that rounds
 * below 2^-127 give code 0 (2^-127); to nearest, the midpoint 1.5 2^c of
 * 2^c and 2^(c+1) goes up (one significand bit: 1.1b rounds to the even
 * 10b, as ml_dtypes's float8_e8m0fnu does), DL_QR_TIEZERO takes it down.
 * Signed zeros are kept (E4M3, E5M2, E2M1). The code is in the low bits. */
DL_EXTERN unsigned dl_qencode(double x, dl_qfmt_t f, dl_qround_t r, int saturate, int *nan_lost);
/* The exact value of a code (NaN for NaN codes, +-infinity for E5M2's). */
DL_EXTERN double dl_qdecode(unsigned code, dl_qfmt_t f);
/* dl_qdecode(dl_qencode(x, f, DL_QR_RNE, 1, NULL), f): x rounded to f. */
DL_EXTERN double dl_qround(double x, dl_qfmt_t f);

/* The same over arrays, for bindings: codes[i] = dl_qencode(x[i], ...),
 * x[i] = dl_qdecode(codes[i], f). Returns the number of NaNs lost (E2M1). */
DL_EXTERN size_t dl_qencode_array(const double *x, size_t n, dl_qfmt_t f, dl_qround_t r,
                                  int saturate, uint8_t *codes);
DL_EXTERN void dl_qdecode_array(const uint8_t *codes, size_t n, dl_qfmt_t f, double *x);

/* FP4 packing: two E2M1 codes per byte, element 2i in the low nibble
 * (bits 0-3) and element 2i+1 in the high nibble (bits 4-7), as PyTorch's
 * float4_e2m1fn_x2, triton_kernels and the OCP MX reference pack them; an
 * odd count leaves the last high nibble zero. dst holds (n + 1) / 2 bytes. */
DL_EXTERN void dl_fp4_pack(const uint8_t *codes, size_t n, uint8_t *dst);
DL_EXTERN void dl_fp4_unpack(const uint8_t *src, size_t n, uint8_t *codes);

/* Packed UE8M0 scales (DeepGEMM on SM100): four codes per int32, code
 * 4g + i in byte i (bits 8i..8i+7) of word g, so a little-endian view of
 * the words is the bytes in order; a last partial word is padded with
 * code 127 (1.0). dst holds (n + 3) / 4 words. */
DL_EXTERN void dl_ue8m0_pack(const uint8_t *codes, size_t n, uint32_t *dst);
DL_EXTERN void dl_ue8m0_unpack(const uint32_t *src, size_t n, uint8_t *codes);

#ifdef __cplusplus
}
#endif
#endif
