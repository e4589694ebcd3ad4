/* Benchmark: a kernel-tier case under each layer recipe (kernel-sizes-fp8,
 * -mxfp4, -nvfp4) generated in memory (inputs, forward, backward:
 * dl_golden_generate) against its bf16 twin kernel-sizes-bf16, the same
 * shapes, routing and inputs. The machine is shared, so the cases run
 * interleaved (bench_pairs.h) and the figure is the median of the rounds'
 * ratios; the bound for FP8 is 2 x the twin.
 *
 *   bench_lowp_layer [--quick]   --quick: one round (a smoke test);
 *                                DL_BENCH_PAIRS sets the rounds (default 5) */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "dropless.h"
#include "bench_pairs.h"

static const char *const CASES[] = {"kernel-sizes-bf16", "kernel-sizes-fp8", "kernel-sizes-mxfp4",
                                    "kernel-sizes-nvfp4"};
#define NC ((int)(sizeof CASES / sizeof *CASES))

/* One in-memory generation of the case; seconds, or -1 on an error. */
static double gen_once(void *ctx)
{
    const dl_case_t *c = ctx;
    dl_golden_gen_opts_t o;
    memset(&o, 0, sizeof o);
    dl_golden_file_t g;
    memset(&g, 0, sizeof g);
    int bwd = 0;
    double t0 = bench_now();
    char err[256];
    int rc = dl_golden_generate(c, &o, &g, &bwd, err, sizeof err);
    double t = bench_now() - t0;
    dl_golden_free(&g);
    return rc || bwd ? -1 : t;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int rounds = quick ? 1 : bench_rounds_default();
    dl_case_t cs[NC];
    bench_fn_t fns[NC];
    void *ctx[NC];
    for (int i = 0; i < NC; i++) {
        if (dl_case_find(CASES[i], &cs[i])) {
            fprintf(stderr, "bench_lowp_layer: no case %s\n", CASES[i]);
            return 1;
        }
        fns[i] = gen_once, ctx[i] = &cs[i];
    }
    bench_env_line("bench_lowp_layer", rounds);
    static bench_rounds_t r;
    if (bench_interleave(fns, ctx, NC, rounds, &r)) {
        fprintf(stderr, "bench_lowp_layer: a generation failed\n");
        return 1;
    }
    printf("bench_lowp_layer: %s %.2f s (median)\n", CASES[0], bench_median_time(&r, 0));
    for (int i = 1; i < NC; i++) {
        bench_ratio_t q = bench_ratio(&r, i, 0);
        printf("bench_lowp_layer: %s %.2f s, %.2f x the bf16 twin [%.2f, %.2f]%s\n", CASES[i],
               bench_median_time(&r, i), q.med, q.lo, q.hi,
               i == 1 ? (q.med <= 2.0 ? " (bound 2: met)" : " (bound 2: NOT met)") : "");
    }
    return 0;
}
