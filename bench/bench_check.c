/* make bench: what checking costs against what generating costs. One
 * medium case: generating (forward+backward) and dl_check_run run
 * interleaved round by round (bench_pairs.h; each ratio the median of the
 * rounds' ratios, [min, max]), the checks on
 * (a) the golden itself (every stage reused), (b) a candidate whose every
 * stage differs in some elements by 1 ulp (every stage recomputed, M by
 * OpenBLAS), (c) recompute_all on the golden. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dropless.h"
#include "bench_pairs.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t st = 0x9E3779B97F4A7C15ULL;
static double normal(void)
{
    double s = 0;
    for (int i = 0; i < 12; i++) {
        st ^= st >> 12, st ^= st << 25, st ^= st >> 27;
        s += (double)((st * 0x2545F4914F6CDD1DULL) >> 11) * 0x1p-53;
    }
    return s - 6.0;
}

static float *fill(int64_t n, double scale)
{
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)(normal() * scale);
    return p;
}

/* One timed computation: generating (c, in) or a check (g, cand, o). */
typedef struct {
    const dl_moe_config_t *c;
    const dl_moe_inputs_t *in;
    const dl_check_golden_t *g;
    const dl_check_candidate_t *cand;
    dl_check_options_t o;
    int rc;
    dl_verdict_t verdict;
} check_ctx_t;

static double run_generate(void *p)
{
    check_ctx_t *x = p;
    dl_moe_forward_t f;
    dl_moe_backward_t b;
    double t0 = now();
    x->rc = dl_moe_forward(x->c, x->in, &f);
    if (!x->rc) {
        x->rc = dl_moe_backward(x->c, x->in, &f, &b);
        if (!x->rc)
            dl_moe_backward_free(&b);
        dl_moe_forward_free(&f);
    }
    t0 = now() - t0;
    return x->rc ? -1 : t0;
}

static double run_check(void *p)
{
    check_ctx_t *x = p;
    dl_check_report_t r;
    double t0 = now();
    x->rc = dl_check_run(x->g, x->cand, &x->o, &r);
    t0 = now() - t0;
    if (x->rc)
        return -1;
    x->verdict = r.verdict;
    if (getenv("DL_BENCH_VERBOSE")) {
        const dl_check_report_t *rr = &r;
        dl_check_write(stdout, DL_REPORT_TABLE, &rr, 1, 0);
    }
    dl_check_report_free(&r);
    return t0;
}

int main(int argc, char **argv)
{
    int64_t T = argc > 1 ? atoll(argv[1]) : 256, d = argc > 2 ? atoll(argv[2]) : 256,
            f = argc > 3 ? atoll(argv[3]) : 512, E = 16, k = 4;
    dl_moe_config_t c = {.tokens = T, .hidden = d, .ffn = f, .ffn_kind = DL_FFN_SWIGLU,
                         .dtype = DL_F32};
    c.route = (dl_route_config_t){.experts = E, .top_k = k, .n_group = 1, .topk_group = 1,
                                  .renormalize = 1, .scaling = 1.0};
    dl_moe_inputs_t in = {fill(T * d, 1), fill(d * E, 1 / sqrt((double)d)), NULL,
                          fill(E * d * f, 1 / sqrt((double)d)), fill(E * d * f, 1 / sqrt((double)d)),
                          fill(E * f * d, 1 / sqrt((double)f)), fill(T * d, 1)};
    dl_moe_forward_t gf;
    dl_moe_backward_t gb;
    double t0 = now();
    if (dl_moe_forward(&c, &in, &gf) || dl_moe_backward(&c, &in, &gf, &gb)) {
        fprintf(stderr, "bench_check: generation failed\n");
        return 1;
    }
    const double tgen = now() - t0;
    dl_check_golden_t g = {&c, &in, &gf, &gb, "bench"};

    /* (b): a copy of every float stage with every 7th element 1 ulp up */
    dl_check_candidate_t cand = {.fwd = gf, .bwd = gb};
    float *copies[DL_VALUE_COUNT] = {0};
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        if (s == DL_VALUE_TOPK_IDS || (s >= DL_VALUE_SORT_PERM && s <= DL_VALUE_GROUP_OFFSETS) ||
            s == DL_VALUE_X_SORTED)
            continue;
        const int64_t n = dl_value_numel(&c, (dl_value_t)s);
        const float *src = dl_value_array(&gf, &gb, (dl_value_t)s);
        if (!n || !src)
            continue;
        copies[s] = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++)
            copies[s][i] = i % 7 ? src[i] : nextafterf(src[i], INFINITY);
    }
#define SET(S, m) if (copies[S]) cand.fwd.m = copies[S];
#define SETB(S, m) if (copies[S]) cand.bwd.m = copies[S];
    SET(DL_VALUE_ROUTER_LOGITS, router_logits) SET(DL_VALUE_ROUTER_SCORES, router_scores)
    SET(DL_VALUE_TOPK_WEIGHTS, topk_weights) SET(DL_VALUE_H_GATE, h_gate) SET(DL_VALUE_H_UP, h_up)
    SET(DL_VALUE_H_ACT, h_act) SET(DL_VALUE_Y_SORTED, y_sorted) SET(DL_VALUE_OUT, out)
    SETB(DL_VALUE_D_TOPK_WEIGHTS, d_topk_weights) SETB(DL_VALUE_D_Y_SORTED, d_y_sorted)
    SETB(DL_VALUE_D_H_ACT, d_h_act) SETB(DL_VALUE_D_W_DOWN, d_w_down)
    SETB(DL_VALUE_D_H_GATE, d_h_gate) SETB(DL_VALUE_D_H_UP, d_h_up)
    SETB(DL_VALUE_D_X_SORTED, d_x_sorted) SETB(DL_VALUE_D_W_GATE, d_w_gate)
    SETB(DL_VALUE_D_W_UP, d_w_up) SETB(DL_VALUE_D_ROUTER_SCORES, d_router_scores)
    SETB(DL_VALUE_D_ROUTER_LOGITS, d_router_logits) SETB(DL_VALUE_D_ROUTER_WEIGHT, d_router_weight)
    SETB(DL_VALUE_D_X, d_x)

    dl_check_candidate_t same = {.fwd = gf, .bwd = gb};
    check_ctx_t cx[4] = {{.c = &c, .in = &in}};
    dl_check_options_t o;
    dl_check_options_default(&o);
    for (int i = 1; i < 4; i++) {
        cx[i] = (check_ctx_t){.g = &g, .cand = i == 2 ? &cand : &same, .o = o};
        cx[i].o.recompute_all = i == 3;
    }
    bench_fn_t fns[4] = {run_generate, run_check, run_check, run_check};
    void *ctx[4] = {&cx[0], &cx[1], &cx[2], &cx[3]};
    bench_rounds_t r;
    int rounds = bench_rounds_default();
    bench_env_line("bench_check", rounds);
    printf("case T=%lld d=%lld f=%lld E=%lld k=%lld: generate (forward+backward) first run %.3f s\n",
           (long long)T, (long long)d, (long long)f, (long long)E, (long long)k, tgen);
    if (bench_interleave(fns, ctx, 4, rounds, &r)) {
        fprintf(stderr, "bench_check: %s\n", dl_strerror(cx[0].rc ? cx[0].rc : 1));
        return 1;
    }
    const char *what[4] = {"generate (forward+backward)", "golden as candidate (reuse)",
                           "every stage 1 ulp off (recompute)", "recompute_all on the golden"};
    for (int i = 1; i < 4; i++) {
        bench_ratio_t q = bench_ratio(&r, i, 0);
        printf("  check, %-36s %.3f s (%.2fx generate [%.2f,%.2f]), verdict %s\n", what[i],
               bench_median_time(&r, i), q.med, q.lo, q.hi, dl_verdict_name(cx[i].verdict));
    }
    printf("  (%s: %.3f s, median of %d rounds)\n", what[0], bench_median_time(&r, 0), r.n);
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        free(copies[s]);
    dl_moe_forward_free(&gf);
    dl_moe_backward_free(&gb);
    free((void *)in.x), free((void *)in.router_weight), free((void *)in.w_gate);
    free((void *)in.w_up), free((void *)in.w_down), free((void *)in.d_out);
    return 0;
}
