/* dropless/qgolden.h: golden files of the block-scaled grouped GEMM (the
 * "lowp-*" family, doc/lowprecision.md). Part of the public API; include
 * <dropless.h>, not this file. */
#ifndef DROPLESS_QGOLDEN_H
#define DROPLESS_QGOLDEN_H
#include "quant.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The families: X(name, activation recipe or NULL (bf16, unquantized),
 * weight recipe, N, K, inputs). Every file has E = 4 experts (one empty),
 * M = 64 rows, a bf16 output, inputs on the bf16 grid from the seed:
 * SIGNED normals, or SAME-SIGN magnitudes (|normal|), where a running sum
 * grows with k, which is what exposes an FP8 accumulator never promoted
 * (doc/lowprecision.md). */
#define DL_QGOLDEN_MAP(X)                                                                   \
    X("lowp-fp8-deepseek-v3", "deepseek-v3-act", "deepseek-v3-weight", 256, 512, SIGNED)      \
    X("lowp-fp8-deepseek-v3-ue8m0", "deepseek-v3-act-ue8m0", "deepseek-v3-weight-ue8m0", 256, 512, SIGNED) \
    X("lowp-fp8-promotion", "deepseek-v3-act", "deepseek-v3-weight", 128, 4096, SAME_SIGN)   \
    X("lowp-mxfp8", "mxfp8", "mxfp8", 256, 512, SIGNED)                                      \
    X("lowp-mxfp4-gpt-oss", NULL, "mxfp4", 256, 512, SIGNED)                                 \
    X("lowp-nvfp4", "nvfp4", "nvfp4", 256, 512, SIGNED)

/* The name of family i (0, 1, ...), NULL past the last. */
DL_EXTERN const char *dl_qgolden_family(int i);

/* Writes family's golden file to path (a temporary, renamed when complete;
 * an existing path only with force): group /lowp with the inputs x [M, K]
 * and w [E, N, K] (fp32 holding bf16), offsets [E+1], the quantized
 * operands a_q, a_s, b_q, b_s in the layouts of dropless/quant.h, and out
 * [M, N] (fp32 holding bf16) = dl_gemm_block_scaled. Same bytes for any
 * thread count. 0, DL_ENOTFOUND (family), DL_EEXIST, DL_EIO, DL_ENOMEM,
 * with a one-line message in err. */
DL_EXTERN int dl_qgolden_write(const char *family, const char *path, uint64_t seed, int force,
                               char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
