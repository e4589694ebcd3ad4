/* Benchmark: the block-scaled grouped GEMM (quantization included) against
 * its bf16 twin (dl_gemm_grouped on the same inputs rounded to bf16), on a
 * DeepSeek-V3 gate/up shape: K = 7168, N = 1024 (half of 2 * 2048), 8
 * experts of 128 rows (T = 4096 tokens, top-8 of 256 experts). One line per recipe pair: seconds and the ratio to
 * the twin (the bound is 2).
 *
 *   bench_lowp [--quick]      --quick: K = 1024, N = 256 (a smoke test) */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dropless.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fill(float *x, int64_t n, uint64_t seed, double sigma)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)dl_round(sigma * dl_golden_rng_normal(seed, 0, (uint64_t)i), DL_BF16);
}

/* Quantizes x and the E weights under the recipes, multiplies; seconds. */
static double run_pair(const char *ra_name, const char *rb_name, const float *x, const float *w,
                       int64_t E, const int64_t *off, int64_t N, int64_t K, float *out)
{
    dl_qrule_t ra, rb;
    if (dl_quant_recipe(ra_name, &ra) || dl_quant_recipe(rb_name, &rb))
        return -1;
    int64_t M = off[E], qa = dl_quant_qbytes(&ra, M, K), sa = dl_quant_sbytes(&ra, M, K);
    int64_t qb = dl_quant_qbytes(&rb, N, K), sb = dl_quant_sbytes(&rb, N, K);
    uint8_t *aq = malloc((size_t)qa), *as = malloc((size_t)sa), *bq = malloc((size_t)(E * qb)),
            *bs = malloc((size_t)(E * sb));
    double t0 = now();
    int rc = dl_quantize(&ra, x, M, K, aq, as);
    for (int64_t e = 0; e < E && !rc; e++)
        rc = dl_quantize(&rb, w + e * N * K, N, K, bq + e * qb, bs + e * sb);
    dl_qmat_t a = {&ra, M, K, aq, as}, b = {&rb, N, K, bq, bs};
    if (!rc)
        rc = dl_gemm_block_scaled(&a, &b, E, off, DL_BF16, out, NULL);
    double t = now() - t0;
    free(aq), free(as), free(bq), free(bs);
    return rc ? -1 : t;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int64_t E = 8, K = quick ? 1024 : 7168, N = quick ? 256 : 1024, off[9];
    for (int64_t e = 0; e <= E; e++)
        off[e] = 128 * e;
    int64_t M = off[E];
    float *x = malloc((size_t)(M * K) * sizeof(float)), *w = malloc((size_t)(E * N * K) * sizeof(float));
    float *out = malloc((size_t)(M * N) * sizeof(float));
    fill(x, M * K, 1, 1.0);
    fill(w, E * N * K, 2, 0.02);
    dl_gemm_term_t t = {x, K, w, DL_RHS_NK};
    double t0 = now();
    if (dl_gemm_grouped(&t, 1, N, off, E, DL_BF16, out, NULL))
        return 1;
    double twin = now() - t0;
    printf("bench_lowp: M %ld N %ld K %ld E %ld: bf16 twin %.3f s\n", (long)M, (long)N, (long)K,
           (long)E, twin);
    static const char *pairs[][2] = {{"deepseek-v3-act", "deepseek-v3-weight"},
                                     {"deepseek-v3-act-ue8m0", "deepseek-v3-weight-ue8m0"},
                                     {"mxfp8", "mxfp4"},
                                     {"nvfp4", "nvfp4"}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        double s = run_pair(pairs[i][0], pairs[i][1], x, w, E, off, N, K, out);
        if (s < 0)
            return 1;
        printf("bench_lowp: %s x %s: %.3f s, %.2f x the bf16 twin\n", pairs[i][0], pairs[i][1], s,
               s / twin);
    }
    free(x), free(w), free(out);
    return 0;
}
