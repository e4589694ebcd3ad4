/* Reference grouped GEMMs: every output element through the exact
 * accumulator. Slow, obviously right; the fast path in gemm.c must give the
 * same bits. */
#include "config.h"
#include <math.h>
#include "stages/stages_priv.h"

int dl_gemm_grouped_ref(const dl_gemm_term_t *terms, int nterms, int64_t N,
                        const int64_t *offsets, int64_t E, dl_dtype_t out_t,
                        float *out)
{
    int rc = dl__gemm_check_grouped(terms, nterms, N, offsets, E, out, NULL, NULL);
    if (rc)
        return rc;
    if (out_t != DL_F32 && out_t != DL_BF16 && out_t != DL_F16)
        return DL_EDTYPE;
    int nonfinite = 0;
    for (int64_t e = 0; e < E; e++) {
        for (int64_t m = offsets[e]; m < offsets[e + 1]; m++) {
            for (int64_t n = 0; n < N; n++) {
                dl_acc_t acc;
                dl_acc_clear(&acc);
                for (int t = 0; t < nterms; t++) {
                    int64_t K = terms[t].K;
                    const float *a = terms[t].lhs + m * K;
                    const float *w = terms[t].rhs + e * K * N;
                    ptrdiff_t stride = terms[t].layout == DL_RHS_KN ? (ptrdiff_t)N : 1;
                    const float *b = terms[t].layout == DL_RHS_KN ? w + n : w + n * K;
                    for (int64_t k = 0; k < K; k++)
                        dl_acc_add(&acc, (double)a[k] * (double)b[k * stride]);
                }
                double r = dl_acc_round(&acc, out_t);
                nonfinite |= acc.nan | acc.pos_inf | acc.neg_inf;
                out[m * N + n] = (float)r;
            }
        }
    }
    return nonfinite ? DL_ENONFINITE : 0;
}

int dl_gemm_ragged_k_ref(const float *a, int64_t I, const float *b, int64_t J,
                         const int64_t *offsets, int64_t E, dl_dtype_t out_t,
                         float *out)
{
    int rc = dl__gemm_check_ragged(a, I, b, J, offsets, E, out, NULL);
    if (rc)
        return rc;
    if (out_t != DL_F32 && out_t != DL_BF16 && out_t != DL_F16)
        return DL_EDTYPE;
    int nonfinite = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; i < I; i++)
            for (int64_t j = 0; j < J; j++) {
                dl_acc_t acc;
                dl_acc_clear(&acc);
                for (int64_t m = offsets[e]; m < offsets[e + 1]; m++)
                    dl_acc_add(&acc, (double)a[m * I + i] * (double)b[m * J + j]);
                nonfinite |= acc.nan | acc.pos_inf | acc.neg_inf;
                out[(e * I + i) * J + j] = (float)dl_acc_round(&acc, out_t);
            }
    return nonfinite ? DL_ENONFINITE : 0;
}
