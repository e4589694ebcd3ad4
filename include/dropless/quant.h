/* dropless/quant.h: block-scaled quantization under a declared rule and
 * the block-scaled grouped GEMM. Part of the public API; include
 * <dropless.h>, not this file. The contract is doc/lowprecision.md. */
#ifndef DROPLESS_QUANT_H
#define DROPLESS_QUANT_H
#include "core.h"
#include "gemm.h"
#include "lowp.h"
#ifdef __cplusplus
extern "C" {
#endif

/* How a block's scale is stored: an fp32 value, a UE8M0 code (one byte, or
 * four per int32 with DL_QF_PACKED), or an E4M3 code times the rule's fp32
 * global scale (NVFP4). */
typedef enum { DL_QSCALE_F32 = 0, DL_QSCALE_UE8M0 = 1, DL_QSCALE_E4M3 = 2 } dl_qscale_t;

/* How a block's scale s is computed from its amax (fmax = the element
 * format's max, sf = RN_fp32(amax / fmax)):
 *   DIV     s = RN_scale(amax / fmax) correctly rounded (fp32 scales), or
 *           RN_e4m3(amax / (fmax g)) (NVFP4, g = the global scale);
 *   CEIL    s = 2^ceil(log2 sf) on the bits of sf: exponent + (mantissa != 0)
 *           (UE8M0, DeepGEMM and DeepSeek-V3 on SM100);
 *   MX      s = 2^(floor(log2 amax) - emax_elem) (OCP MX v1.0, §6.3);
 *   FLOOR   s = 2^floor(log2 sf): the mantissa truncated (a defect variant);
 *   LOG2    s = 2^ceil((float)log2(sf)): a float log2 that rounds a value
 *           just above a power of two onto it (a defect variant);
 *   LOG2P1  s = 2^(floor(log2 sf) + 1): one too large on exact powers. */
typedef enum {
    DL_QS_DIV = 0, DL_QS_CEIL, DL_QS_MX, DL_QS_FLOOR, DL_QS_LOG2, DL_QS_LOG2P1
} dl_qsrule_t;

/* Flags of a rule. RECIP: elements are RN_elem(RN_fp32(x * RN_fp32(1/s)))
 * instead of RN_elem(x / s) exactly. POW2_AFTER: elements are quantized with
 * sf, the stored scale is then CEIL's (SGLang #28418). NOSAT: elements beyond
 * the format's max overflow (E4M3: NaN) instead of saturating. PACKED:
 * UE8M0 scales four per int32 along K (dl_ue8m0_pack). */
#define DL_QF_RECIP 1u
#define DL_QF_POW2_AFTER 2u
#define DL_QF_NOSAT 4u
#define DL_QF_PACKED 8u
/* MULAMAX: elements RN_elem(RN_fp32(x * RN_fp32(fmax / amax))), the earlier
 * DeepGEMM test cast; fp32 DIV scales only (the scale stored is still sf). */
#define DL_QF_MULAMAX 16u
/* DIV32: elements RN_elem(RN_fp32(x / s)): the quotient rounded to fp32
 * first, as a kernel dividing in fp32 does (vLLM's per-token-group cast). */
#define DL_QF_DIV32 32u

/* A quantization rule over a row-major [rows, cols] matrix whose K axis is
 * the last one, cut into br x bc blocks (1x128 activation tiles, 128x128
 * weight blocks, MX 1x32, NVFP4 1x16); edge blocks are partial. In each
 * block: amax = max |x| (at least amax_floor); a block with amax 0 gets
 * scale 1.0 (E4M3: the code of 1.0 times g) and zero elements. */
typedef struct {
    dl_qfmt_t elem;      /* DL_Q_E4M3, DL_Q_E5M2 or DL_Q_E2M1 */
    dl_qscale_t scale;
    int64_t br, bc;
    dl_qsrule_t srule;
    dl_qround_t eround;  /* element rounding, DL_QR_RNE declared everywhere */
    unsigned flags;
    float amax_floor;    /* DeepGEMM clamps amax to 1e-4; 0 = no clamp */
    float global;        /* NVFP4's fp32 global scale g (E4M3 scales); else 1 */
} dl_qrule_t;

/* A quantized matrix [rows, cols]: element codes q (one byte each; E2M1
 * two per byte in dl_fp4_pack's order, cols even) and scales s laid out
 * [ceil(rows/br), ceil(cols/bc)] row-major: float values (F32), byte
 * codes (UE8M0, E4M3) or, with DL_QF_PACKED, ceil(ncb/4) words per block
 * row. rule == NULL: an unquantized operand, s its floats [rows, cols]
 * (gpt-oss's bf16 activations), q unused. The memory is the caller's. */
typedef struct {
    const dl_qrule_t *rule;
    int64_t rows, cols;
    const uint8_t *q;
    const void *s;
} dl_qmat_t;

/* The recipes' declared rules, one row each (doc/lowprecision.md gives
 * their sources): X(ENUM, name, elem, scale, br, bc, srule, flags). */
#define DL_QRECIPE_MAP(X)                                                              \
    X(DSV3_ACT, "deepseek-v3-act", E4M3, F32, 1, 128, DIV, 0)                           \
    X(DSV3_W, "deepseek-v3-weight", E4M3, F32, 128, 128, DIV, 0)                        \
    X(DSV3_ACT_UE8M0, "deepseek-v3-act-ue8m0", E4M3, UE8M0, 1, 128, CEIL, DL_QF_PACKED)  \
    X(DSV3_W_UE8M0, "deepseek-v3-weight-ue8m0", E4M3, UE8M0, 128, 128, CEIL, 0)          \
    X(MXFP8, "mxfp8", E4M3, UE8M0, 1, 32, MX, 0)                                        \
    X(MXFP4, "mxfp4", E2M1, UE8M0, 1, 32, MX, 0)                                        \
    X(NVFP4, "nvfp4", E2M1, E4M3, 1, 16, DIV, 0)

/* The rule of a recipe by name (elements RNE, no amax floor, global scale
 * 1: an NVFP4 caller sets it, dl_nvfp4_global). 0 or DL_ENOTFOUND. */
DL_EXTERN int dl_quant_recipe(const char *name, dl_qrule_t *out);
/* The name of recipe i (0, 1, ...), NULL past the last. */
DL_EXTERN const char *dl_quant_recipe_name(int i);

/* Bytes of q and of s for a rule and shape (0 on an invalid rule). */
DL_EXTERN int64_t dl_quant_qbytes(const dl_qrule_t *r, int64_t rows, int64_t cols);
DL_EXTERN int64_t dl_quant_sbytes(const dl_qrule_t *r, int64_t rows, int64_t cols);
/* 0 if the rule is consistent (formats, block sizes >= 1, packing only for
 * UE8M0, FP4 with even cols when cols is given), else DL_EINVAL. */
DL_EXTERN int dl_quant_rule_check(const dl_qrule_t *r, int64_t cols);

/* Quantizes x [rows, cols] (finite floats) under rule r into q and s
 * (caller-owned, dl_quant_qbytes / dl_quant_sbytes bytes, fully written).
 * Same bits for any thread count. Errors: DL_EINVAL (rule, NULL, sizes),
 * DL_ENONFINITE (a NaN or infinity in x). */
DL_EXTERN int dl_quantize(const dl_qrule_t *r, const float *x, int64_t rows, int64_t cols,
                          uint8_t *q, void *s);

/* The value of block (bi, bj)'s scale of m, with the global scale applied
 * (exact in binary64). */
DL_EXTERN double dl_quant_scale(const dl_qmat_t *m, int64_t bi, int64_t bj);
/* The element code of m at (i, j), unpacked. */
DL_EXTERN unsigned dl_quant_code(const dl_qmat_t *m, int64_t i, int64_t j);
/* dequant(m)[i, j] = decode(code) * scale, exact in binary64. */
DL_EXTERN double dl_dequant(const dl_qmat_t *m, int64_t i, int64_t j);

/* The NVFP4 global scale of a tensor: RN_fp32(amax / (6 * 448)), 1 for an
 * all-zero tensor. */
DL_EXTERN float dl_nvfp4_global(const float *x, int64_t n);

/* Block-scaled grouped GEMM over the flat ragged layout:
 *   out[m, n] = RN_out_t( sum_k dequant(a)[m, k] * dequant(b_e)[n, k] )
 * for m in group e = [offsets[e], offsets[e+1]), a is [M_total, K] and b[e]
 * is [N, K] (experts quantized one by one, b[e] = E consecutive matrices),
 * the exact sum rounded once, through dl_gemm_grouped: each dequantized
 * operand is split exactly into a float and a float remainder (zero for
 * power-of-two scales), and the products of the parts are its terms.
 * Errors: as dl_gemm_grouped; DL_ESHAPE (shapes disagree), DL_ERANGE (a
 * dequantized value not the exact sum of two floats: beyond 2^128 or finer
 * than 2^-149), DL_ENONFINITE (a NaN element or scale that takes part). */
DL_EXTERN int dl_gemm_block_scaled(const dl_qmat_t *a, const dl_qmat_t *b, int64_t E,
                                   const int64_t *offsets, dl_dtype_t out_t, float *out,
                                   dl_tier_stats_t *stats);

/* The layer recipes: which operands of the expert GEMMs a recipe quantizes
 * and how (doc/lowprecision.md, "The layer recipes"). The forward GEMMs
 * take x (the gate/up input) under x, the weights under w and the down
 * projection's input under h (NULL: unquantized, the case's dtype); with
 * dgrad set the backward GEMMs on activation gradients (d_h_act, d_x_sorted)
 * take the gradient under x and the same weights. Scales that need a
 * global scale (NVFP4) take it per expert over that expert's operand.
 * L(ENUM, name, x, w, h, dgrad). */
#define DL_LOWP_LAYER_MAP(L)                                                              \
    L(DSV3_FP8, "deepseek-v3-fp8", "deepseek-v3-act", "deepseek-v3-weight", "deepseek-v3-act", 1) \
    L(GPT_OSS_MXFP4, "gpt-oss-mxfp4", NULL, "mxfp4", NULL, 0)                               \
    L(NVFP4, "nvfp4", "nvfp4", "nvfp4", "nvfp4", 0)

#define DL__LOWP_ENUM(id, nm, x, w, h, dg) DL_LOWP_##id,
typedef enum { DL_LOWP_NONE = 0, DL_LOWP_LAYER_MAP(DL__LOWP_ENUM) DL_LOWP_COUNT } dl_lowp_layer_t;
#undef DL__LOWP_ENUM

/* A layer recipe's row: its name and the recipe names of its operands. */
typedef struct {
    const char *name, *x, *w, *h;
    int dgrad;
} dl_lowp_layer_row_t;

/* The row of layer recipe id (1 .. DL_LOWP_COUNT - 1), NULL otherwise
 * (DL_LOWP_NONE has none). Static data. */
DL_EXTERN const dl_lowp_layer_row_t *dl_lowp_layer(int id);
/* The id of the layer recipe named s ("none" is 0), or -1. */
DL_EXTERN int dl_lowp_layer_parse(const char *s);

#ifdef __cplusplus
}
#endif
#endif
