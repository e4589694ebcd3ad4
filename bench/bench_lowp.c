/* Benchmark: the block-scaled grouped GEMM (quantization included) against
 * its bf16 twin (dl_gemm_grouped on the same inputs rounded to bf16), on a
 * DeepSeek-V3 gate/up shape: K = 7168, N = 1024 (half of 2 * 2048), 8
 * experts of 128 rows (T = 4096 tokens, top-8 of 256 experts). The twin and
 * every recipe pair run interleaved round by round (bench_pairs.h): one line
 * per recipe pair with its median seconds and the median of the rounds'
 * ratios to the twin, [min, max] (the bound is 2).
 *
 *   bench_lowp [--quick]      --quick: K = 1024, N = 256 (a smoke test);
 *                             DL_BENCH_PAIRS sets the rounds (default 5) */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dropless.h"
#include "bench_pairs.h"

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
    double t0 = bench_now();
    int rc = dl_quantize(&ra, x, M, K, aq, as);
    for (int64_t e = 0; e < E && !rc; e++)
        rc = dl_quantize(&rb, w + e * N * K, N, K, bq + e * qb, bs + e * sb);
    dl_qmat_t a = {&ra, M, K, aq, as}, b = {&rb, N, K, bq, bs};
    if (!rc)
        rc = dl_gemm_block_scaled(&a, &b, E, off, DL_BF16, out, NULL);
    double t = bench_now() - t0;
    free(aq), free(as), free(bq), free(bs);
    return rc ? -1 : t;
}

/* The operands every computation shares; which pair a computation runs. */
typedef struct {
    const float *x, *w;
    int64_t E, N, K;
    const int64_t *off;
    float *out;
} operands_t;

typedef struct {
    const operands_t *op;
    const char *ra, *rb; /* NULL: the bf16 twin */
} lowp_ctx_t;

static double run_lowp(void *p)
{
    const lowp_ctx_t *c = p;
    const operands_t *o = c->op;
    if (c->ra)
        return run_pair(c->ra, c->rb, o->x, o->w, o->E, o->off, o->N, o->K, o->out);
    dl_gemm_term_t t = {o->x, o->K, o->w, DL_RHS_NK};
    double t0 = bench_now();
    int rc = dl_gemm_grouped(&t, 1, o->N, o->off, o->E, DL_BF16, o->out, NULL);
    return rc ? -1 : bench_now() - t0;
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
    static const char *pairs[][2] = {{"deepseek-v3-act", "deepseek-v3-weight"},
                                     {"deepseek-v3-act-ue8m0", "deepseek-v3-weight-ue8m0"},
                                     {"mxfp8", "mxfp4"},
                                     {"nvfp4", "nvfp4"}};
    enum { NP = sizeof pairs / sizeof *pairs };
    operands_t op = {x, w, E, N, K, off, out};
    lowp_ctx_t cx[NP + 1] = {{&op, NULL, NULL}};
    bench_fn_t fns[NP + 1] = {run_lowp};
    void *ctx[NP + 1] = {&cx[0]};
    for (int i = 0; i < NP; i++) {
        cx[i + 1] = (lowp_ctx_t){&op, pairs[i][0], pairs[i][1]};
        fns[i + 1] = run_lowp, ctx[i + 1] = &cx[i + 1];
    }
    const int rounds = bench_rounds_default();
    bench_env_line("bench_lowp", rounds);
    static bench_rounds_t r;
    if (bench_interleave(fns, ctx, NP + 1, rounds, &r))
        return 1;
    printf("bench_lowp: M %ld N %ld K %ld E %ld: bf16 twin %.3f s (median of %d rounds)\n", (long)M,
           (long)N, (long)K, (long)E, bench_median_time(&r, 0), r.n);
    for (int i = 0; i < NP; i++) {
        bench_ratio_t q = bench_ratio(&r, i + 1, 0);
        printf("bench_lowp: %s x %s: %.3f s, %.2f x the bf16 twin [%.2f, %.2f]\n", pairs[i][0],
               pairs[i][1], bench_median_time(&r, i + 1), q.med, q.lo, q.hi);
    }
    free(x), free(w), free(out);
    return 0;
}
