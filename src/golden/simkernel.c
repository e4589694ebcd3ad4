/* Simulated kernels: arithmetic that a defective or differently-declared
 * GPU kernel performs and the oracle never does. A GEMM whose accumulator
 * is bf16 (every partial sum rounded to bf16, the products exact, as a
 * tensor core's bf16 accumulation of bf16 operands), and TF32 operand
 * rounding (10 explicit significand bits, ties to even). These exist only
 * to make mutated candidates (mutate.c); nothing of the golden generator
 * or the checker calls them, and they are not the oracle's stage
 * arithmetic, which stays in src/stages/. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "golden/mutate_priv.h"

float dl__sim_tf32(float x)
{
    if (!isfinite(x))
        return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    uint64_t r = ((uint64_t)u + 0xFFFu + ((u >> 13) & 1u)) & 0xFFFFE000u;
    uint32_t v = (uint32_t)r;
    float y;
    memcpy(&y, &v, 4);
    return y;
}

/* One output element of a grouped GEMM, the terms' products added in
 * order k = 0, 1, ... into a bf16 accumulator. */
static double grouped_elem(const dl__mut_gemm_t *g, int64_t e, int64_t m, int64_t n)
{
    double acc = 0.0;
    for (int t = 0; t < g->nterms; t++) {
        const dl_gemm_term_t *tm = &g->terms[t];
        const float *row = tm->lhs + m * tm->K;
        const float *w = tm->rhs + e * tm->K * g->N;
        for (int64_t k = 0; k < tm->K; k++) {
            double b = tm->layout == DL_RHS_KN ? w[k * g->N + n] : w[n * tm->K + k];
            acc = dl_round(acc + (double)row[k] * b, DL_BF16);
        }
    }
    return acc;
}

int dl__sim_gemm_bf16acc(const dl__mut_gemm_t *g, float *out)
{
    const int64_t *off = g->off ? g->off : g->rows;
    if (g->ragged) {
        for (int64_t e = 0; e < g->E; e++) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < g->ni; i++)
                for (int64_t j = 0; j < g->nj; j++) {
                    double acc = 0.0;
                    for (int64_t m = off[e]; m < off[e + 1]; m++)
                        acc = dl_round(acc + (double)g->a[m * g->ni + i] * g->b[m * g->nj + j],
                                       DL_BF16);
                    out[(e * g->ni + i) * g->nj + j] = (float)dl_round(acc, g->out_t);
                }
        }
        return 0;
    }
    for (int64_t e = 0; e < g->E; e++) {
#pragma omp parallel for schedule(static)
        for (int64_t m = off[e]; m < off[e + 1]; m++)
            for (int64_t n = 0; n < g->N; n++)
                out[m * g->N + n] = (float)dl_round(grouped_elem(g, e, m, n), g->out_t);
    }
    return 0;
}
