/* Fast grouped GEMM. Until the certified OpenBLAS path lands, the fast
 * entry points run the reference (same contract, same bits). */
#include "config.h"
#include "internal.h"

int dl_gemm_grouped(const dl_gemm_term_t *terms, int nterms, int64_t N,
                    const int64_t *offsets, int64_t E, dl_dtype_t out_t,
                    float *out, dl_tier_stats_t *stats)
{
    int rc = dl_gemm_grouped_ref(terms, nterms, N, offsets, E, out_t, out);
    if (stats && rc == 0)
        stats->exact += offsets[E] * N;
    return rc;
}

int dl_gemm_ragged_k(const float *a, int64_t I, const float *b, int64_t J,
                     const int64_t *offsets, int64_t E, dl_dtype_t out_t,
                     float *out, dl_tier_stats_t *stats)
{
    int rc = dl_gemm_ragged_k_ref(a, I, b, J, offsets, E, out_t, out);
    if (stats && rc == 0)
        stats->exact += E * I * J;
    return rc;
}
