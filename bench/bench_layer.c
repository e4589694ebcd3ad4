/* make bench: the whole layer, forward and backward, at real d, f, E, k with
 * T reduced for 2 cores. Ratios are against OpenBLAS dgemm (and sgemm with
 * --sgemm) on the same grouped shapes (one GEMM call per expert),
 * interleaved with ours round by round (bench_pairs.h): the median of the
 * rounds' ratios and their [min, max].
 *
 *   bench_layer [--quick] [--sgemm] [--stages] [full] [SHAPE]   (SHAPE d512: only when named)
 *
 * --stages: then each producer of both passes timed alone (stage_times).
 * --profile-backward: one forward, then only backward passes (fresh outputs
 * each), no baselines: what `perf record` should see.
 * DL_BENCH_CLOCK=cpu: CPU time instead of wall time (now()). */
#include "config.h"
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#include "dropless.h"
#include "bench_pairs.h"

typedef struct {
    const char *name;
    int64_t T, d, f, E, k;
    int sigmoid;     /* DeepSeek-style group-limited sigmoid with bias */
    double zipf;     /* > 0: power-law expert load with this exponent */
    int named;       /* run only when named on the command line */
} shape_t;

/* DL_BENCH_CLOCK=cpu: every time (ours and the baselines) is the process's
 * CPU time (all threads, kernel included: page faults count), which a
 * crowded machine inflates far less than wall time; the default is wall
 * time, the figure make bench reports. */
static int cpu_clock = -1;

static double now(void)
{
    struct timespec ts;
    if (cpu_clock < 0)
        cpu_clock = getenv("DL_BENCH_CLOCK") && !strcmp(getenv("DL_BENCH_CLOCK"), "cpu");
    clock_gettime(cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;
static double unif(void) /* xorshift64*: fast; a benchmark needs no statistics */
{
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1DULL) >> 11) * 0x1p-53;
}

/* RN-even of a finite float to bf16 by its bits (dl_bf16_from_float's
 * value, without two library calls per element: filling the weights was a
 * fifth of a shape's process) */
static float to_bf16(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    b += 0x7fffu + ((b >> 16) & 1u);
    b &= 0xffff0000u;
    memcpy(&x, &b, 4);
    return x;
}

static float *fill(int64_t n, double scale)
{
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = to_bf16((float)((2 * unif() - 1) * scale * 1.7320508));
    return p;
}

/* Time one GEMM shape per expert with BLAS, converting (untimed) one
 * expert's operands at a time so the baseline never holds a double copy of
 * all weights. op: 0 = [m,K]x[K,N], 1 = [K,m]^T x [m,N] (weight gradient). */
static double blas_time(int dbl, const int64_t *sizes, int64_t E, int64_t K, int64_t N, int op)
{
    int64_t maxm = 0;
    for (int64_t e = 0; e < E; e++)
        maxm = sizes[e] > maxm ? sizes[e] : maxm;
    size_t es = dbl ? sizeof(double) : sizeof(float);
    int64_t na = op == 0 ? maxm * K : K * maxm, nb = op == 0 ? K * N : maxm * N,
            nc = op == 0 ? maxm * N : K * N;
    void *a = calloc((size_t)na + 1, es), *b = calloc((size_t)nb + 1, es), *c = calloc((size_t)nc + 1, es);
    for (int64_t i = 0; i < na; i++)
        dbl ? (((double *)a)[i] = unif() - 0.5) : (((float *)a)[i] = (float)(unif() - 0.5));
    for (int64_t i = 0; i < nb; i++)
        dbl ? (((double *)b)[i] = unif() - 0.5) : (((float *)b)[i] = (float)(unif() - 0.5));
    double t = 0;
    for (int64_t e = 0; e < E; e++) {
        int m = (int)sizes[e];
        if (m == 0)
            continue;
        double t0 = now();
        if (op == 0 && dbl)
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, (int)N, (int)K, 1.0, a, (int)K, b, (int)N, 0.0, c, (int)N);
        else if (op == 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, (int)N, (int)K, 1.0f, a, (int)K, b, (int)N, 0.0f, c, (int)N);
        else if (dbl)
            cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)K, (int)N, m, 1.0, a, (int)K, b, (int)N, 0.0, c, (int)N);
        else
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)K, (int)N, m, 1.0f, a, (int)K, b, (int)N, 0.0f, c, (int)N);
        t += now() - t0;
    }
    free(a), free(b), free(c);
    return t;
}

static int rounds = 3;
static int with_sgemm = 0; /* --sgemm: the sgemm baselines too (0 ratios without) */

/* One shape's layer and the computations timed on it. */
typedef struct {
    const dl_moe_config_t *c;
    const dl_moe_inputs_t *in;
    int64_t E, d, f;
    dl_moe_forward_t F;
    dl_moe_backward_t B;
    int have_f, have_b, rc;
    const char *what;
} layer_ctx_t;

static double run_forward(void *p)
{
    layer_ctx_t *L = p;
    if (L->have_b)
        dl_moe_backward_free(&L->B), L->have_b = 0;
    if (L->have_f)
        dl_moe_forward_free(&L->F), L->have_f = 0;
    double t0 = now();
    L->rc = dl_moe_forward(L->c, L->in, &L->F);
    t0 = now() - t0;
    L->what = "forward";
    L->have_f = !L->rc;
    return L->rc ? -1 : t0;
}

static double run_backward(void *p)
{
    layer_ctx_t *L = p;
    double t0 = now();
    L->rc = dl_moe_backward(L->c, L->in, &L->F, &L->B);
    t0 = now() - t0;
    L->what = "backward";
    L->have_b = !L->rc;
    return L->rc ? -1 : t0;
}

/* The same grouped shapes through BLAS, on the last forward's group sizes:
 * 3 GEMMs forward, 6 backward (2 weight gradients of [d, f], one of [f, d]). */
static double blas_fwd(layer_ctx_t *L, int dbl)
{
    const int64_t *g = L->F.group_sizes;
    return 2 * blas_time(dbl, g, L->E, L->d, L->f, 0) + blas_time(dbl, g, L->E, L->f, L->d, 0);
}

static double blas_bwd(layer_ctx_t *L, int dbl)
{
    const int64_t *g = L->F.group_sizes;
    return blas_time(dbl, g, L->E, L->d, L->f, 0) + 2 * blas_time(dbl, g, L->E, L->f, L->d, 0) +
           blas_time(dbl, g, L->E, L->f, L->d, 1) + 2 * blas_time(dbl, g, L->E, L->d, L->f, 1);
}

static double blas_fwd_d(void *p) { return blas_fwd(p, 1); }
static double blas_fwd_s(void *p) { return blas_fwd(p, 0); }
static double blas_bwd_d(void *p) { return blas_bwd(p, 1); }
static double blas_bwd_s(void *p) { return blas_bwd(p, 0); }

/* --stages: each producer of the pass timed alone (bench/bench_layer's
 * profile of where a pass goes), through a placement of the whole layer
 * that times each window. The arrays are the last run's, so the page
 * faults of fresh outputs and the validation are not in any row: the
 * pass's own time less the rows' sum is them. */
typedef struct {
    dl_stage_view_t v;
    double t0, t[64];
} stage_clock_t;

static int clock_bind(void *ctx, int i, int w, dl_stage_view_t *v)
{
    stage_clock_t *k = ctx;
    if (w > 0)
        return DL_SCHEDULE_END;
    *v = k->v;
    k->t0 = now();
    return 0;
}

static int clock_done(void *ctx, int i, int w, const dl_stage_view_t *v)
{
    stage_clock_t *k = ctx;
    (void)w, (void)v;
    if (i < 64)
        k->t[i] += now() - k->t0;
    return 0;
}

/* The dgemm baseline of a GEMM stage (blas_fwd/blas_bwd's terms), 0 for
 * the others: op 0 [m, K] x [K, N], 1 the weight gradient, times n terms. */
static double stage_dgemm(layer_ctx_t *L, const char *stage)
{
    static const struct { const char *name; int kd, op, n; } g[] = {
        {"h_gate", 1, 0, 1}, {"h_up", 1, 0, 1}, {"y_sorted", 0, 0, 1}, {"d_h_act", 1, 0, 1},
        {"d_x_sorted", 0, 0, 2}, {"d_w_down", 0, 1, 1}, {"d_w_gate", 1, 1, 1}, {"d_w_up", 1, 1, 1}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (!strcmp(stage, g[i].name)) { /* kd: K = d, N = f; else K = f, N = d */
            double t = 0;
            for (int r = 0; r < rounds; r++)
                t += g[i].n * blas_time(1, L->F.group_sizes, L->E, g[i].kd ? L->d : L->f,
                                        g[i].kd ? L->f : L->d, g[i].op);
            return t / rounds;
        }
    return 0;
}

static void stage_times(const char *name, layer_ctx_t *L, int passes, double whole)
{
    const dl_moe_config_t *c = L->c;
    stage_clock_t k = {.v = {.c = *c, .in = *L->in, .f = L->F, .b = L->B,
                        .rows = c->tokens * c->route.top_k, .off = L->F.group_offsets,
                        .ne = c->route.experts}, .t0 = 0};
    const dl_placement_t pl = {clock_bind, clock_done};
    for (int r = 0; r < rounds; r++)
        if (dl_schedule_exec(c, passes, NULL, -1, &pl, &k))
            exit(1);
    double sum = 0, tv = now();
    for (int r = 0; r < rounds; r++)
        if (dl_moe_inputs_validate(c, L->in, passes == DL_SCHEDULE_BACKWARD))
            exit(1);
    tv = (now() - tv) / rounds;
    printf("%-18s stage    %-8s %-20s %.4fs %5.1f%% (dl_moe_inputs_validate)\n", name,
           passes == DL_SCHEDULE_FORWARD ? "forward" : "backward", "(validate)", tv,
           100 * tv / whole);
    for (int i = 0; i < dl_schedule_count() && i < 64; i++)
        sum += k.t[i] / rounds;
    for (int i = 0; i < dl_schedule_count() && i < 64; i++) {
        if (k.t[i] <= 0)
            continue;
        double tb = stage_dgemm(L, dl_schedule_producer(i)->name);
        printf("%-18s stage    %-8s %-20s %.4fs %5.1f%%", name,
               passes == DL_SCHEDULE_FORWARD ? "forward" : "backward",
               dl_schedule_producer(i)->name, k.t[i] / rounds, 100 * k.t[i] / rounds / whole);
        if (tb > 0)
            printf(" dgemm %.4fs ratio %.2f", tb, k.t[i] / rounds / tb);
        printf("\n");
    }
    printf("%-18s stage    %-8s %-20s %.4fs %5.1f%% (the pass less its stages: validation, "
           "allocation, fresh pages)\n", name, passes == DL_SCHEDULE_FORWARD ? "forward" : "backward",
           "(rest)", whole - sum, 100 * (whole - sum) / whole);
}

static int profile_backward = 0; /* --profile-backward: for perf record */
static int with_stages = 0; /* --stages: stage_times after the rounds */

static void run(const shape_t *s)
{
    dl_moe_config_t c = {0};
    c.tokens = s->T, c.hidden = s->d, c.ffn = s->f;
    c.route.experts = s->E, c.route.top_k = s->k;
    c.route.score_fn = s->sigmoid ? DL_SCORE_SIGMOID : DL_SCORE_SOFTMAX;
    c.route.n_group = s->sigmoid ? 8 : 1;
    c.route.topk_group = s->sigmoid ? 4 : 1;
    c.route.group_score = DL_GROUP_TOP2_SUM;
    c.route.renormalize = 1;
    c.route.scaling = s->sigmoid ? 2.5 : 1.0;
    c.route.has_bias = s->sigmoid;
    c.ffn_kind = DL_FFN_SWIGLU, c.dtype = DL_BF16;
    const int64_t T = s->T, d = s->d, f = s->f, E = s->E;
    float *x = fill(T * d, 1.0), *wr = fill(d * E, 1.0 / sqrt((double)d));
    float *bias = calloc((size_t)E, sizeof *bias);
    float *wg = fill(E * d * f, 1.0 / sqrt((double)d)), *wu = fill(E * d * f, 1.0 / sqrt((double)d));
    float *wd = fill(E * f * d, 1.0 / sqrt((double)f)), *dout = fill(T * d, 1.0);
    if (s->zipf > 0) { /* feature 0 is constant; its router row carries log p(e) ~ -zipf log(e+1) */
        for (int64_t t = 0; t < T; t++)
            x[t * d] = 1.0f;
        for (int64_t e = 0; e < E; e++)
            wr[e] = (float)(-s->zipf * log((double)e + 1.0));
    }
    dl_moe_inputs_t in = {.x = x, .router_weight = wr, .expert_bias = bias, .w_gate = wg,
                          .w_up = wu, .w_down = wd, .d_out = dout};
    layer_ctx_t L = {.c = &c, .in = &in, .E = E, .d = d, .f = f};
    /* each round: forward, backward, then the BLAS baselines on that
     * forward's group sizes (bench_pairs.h) */
    bench_fn_t fns[6] = {run_forward, run_backward, blas_fwd_d, blas_bwd_d, blas_fwd_s, blas_bwd_s};
    void *ctx[6] = {&L, &L, &L, &L, &L, &L};
    bench_rounds_t r;
    memset(&r, 0, sizeof r); /* the sgemm rows stay 0 without --sgemm */
    if (profile_backward) { /* --profile-backward: one forward, then backward only */
        if (run_forward(&L) < 0)
            exit(1);
        for (int i = 0; i < rounds; i++) {
            if (L.have_b)
                dl_moe_backward_free(&L.B), L.have_b = 0;
            printf("%-18s backward %.3fs\n", s->name, run_backward(&L));
        }
        exit(0);
    }
    if (bench_interleave(fns, ctx, with_sgemm ? 6 : 4, rounds, &r)) {
        printf("%s: %s failed: %s\n", s->name, L.what, dl_strerror(L.rc));
        exit(1);
    }
    double tf = bench_median_time(&r, 0), tb = bench_median_time(&r, 1);
    bench_ratio_t fdr = bench_ratio(&r, 0, 2), fsr = bench_ratio(&r, 0, 4);
    bench_ratio_t bdr = bench_ratio(&r, 1, 3), bsr = bench_ratio(&r, 1, 5);
    if (with_stages) {
        stage_times(s->name, &L, DL_SCHEDULE_FORWARD, tf);
        stage_times(s->name, &L, DL_SCHEDULE_BACKWARD, tb);
    }
    dl_moe_forward_t F = L.F;
    dl_moe_backward_t B = L.B;
    double rss = bench_peak_rss_mb();
    const int64_t M = T * s->k;
    double in_b = 4.0 * (T * d * 2 + d * E + E + 3 * E * d * f);
    double fw_b = 4.0 * (2 * T * E + 3 * M + T + 2 * M + E * 3 + 2 * M * d + 3 * M * f + T * d);
    double bw_b = 4.0 * (M + 2 * M * d + 3 * M * f + 3 * E * d * f + 2 * T * E + d * E + T * d);
    int64_t hist_max = 0, empty = 0;
    for (int64_t e = 0; e < E; e++) {
        hist_max = F.group_sizes[e] > hist_max ? F.group_sizes[e] : hist_max;
        empty += F.group_sizes[e] == 0;
    }
    double ffl = 6.0 * M * d * f, bfl = 12.0 * M * d * f;
    const dl_tier_stats_t *sf = &F.stats, *sb = &B.stats;
    double nf = (double)(sf->fast + sf->middle + sf->exact), nb = (double)(sb->fast + sb->middle + sb->exact);
    printf("%-18s forward  T=%lld d=%lld f=%lld E=%lld k=%lld threads=%d rounds=%d time=%.2fs "
           "GFLOP/s=%.1f middle=%.4f%% exact=%.4f%% ratio_vs_dgemm=%.2f [%.2f,%.2f] "
           "ratio_vs_sgemm=%.2f [%.2f,%.2f]\n",
           s->name, (long long)T, (long long)d, (long long)f, (long long)E, (long long)s->k,
           bench_threads(), r.n, tf, ffl / tf * 1e-9, 100 * sf->middle / nf, 100 * sf->exact / nf,
           fdr.med, fdr.lo, fdr.hi, fsr.med, fsr.lo, fsr.hi);
    printf("%-18s backward time=%.2fs GFLOP/s=%.1f middle=%.4f%% exact=%.4f%% "
           "ratio_vs_dgemm=%.2f [%.2f,%.2f] ratio_vs_sgemm=%.2f [%.2f,%.2f] load=%.2f\n",
           s->name, tb, bfl / tb * 1e-9, 100 * sb->middle / nb, 100 * sb->exact / nb, bdr.med,
           bdr.lo, bdr.hi, bsr.med, bsr.lo, bsr.hi, bench_load1());
    printf("%-18s memory   peak_rss=%.0fMB inputs+outputs=%.0fMB rss_ratio=%.2f "
           "load: max_group=%lld empty_experts=%lld\n",
           s->name, rss, (in_b + fw_b + bw_b) / 1048576.0, rss * 1048576.0 / (in_b + fw_b + bw_b),
           (long long)hist_max, (long long)empty);
    fflush(stdout);
    dl_moe_forward_free(&F);
    dl_moe_backward_free(&B);
    free(x), free(wr), free(bias), free(wg), free(wu), free(wd), free(dout);
}

int main(int argc, char **argv)
{
    int quick = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--sgemm") == 0)
            with_sgemm = 1;
        else if (strcmp(argv[i], "--stages") == 0)
            with_stages = 1;
        else if (strcmp(argv[i], "--profile-backward") == 0)
            profile_backward = 1;
        else if (strcmp(argv[i], "full") != 0)
            only = argv[i];
    }
    shape_t shapes[] = {
        /* Expert counts are cut so that each shape stays near 6 GB (make
         * bench must complete within 12 GiB on a shared 24 GB machine): the
         * weights and weight gradients are E d f floats each, three times.
         * Mixtral: 4 of its 8 experts, 256 rows each. DeepSeek-V3: 16 of its
         * 256 experts (45 GB of float weights, plus as much again of weight
         * gradients), d, f, k and the 8-group/keep-4 routing real. T = 256
         * for both (128 rows per expert; 512 until 2026-12-02 c): a round of
         * either at T = 512 was over a minute of an idle machine, and three
         * rounds of three shapes did not leave make bench its 20 minutes. */
        {"mixtral-like", quick ? 16 : 256, 4096, 14336, 4, 2, 0, 0, 0},
        {"deepseek-v3-like", quick ? 16 : 256, 7168, 2048, 16, 8, 1, 0, 0},
        {"zipf-1.2", quick ? 32 : 1024, 2048, 1408, 64, 6, 0, 1.2, 0},
        /* issue 31's case (bench_check's d512): small enough that the
         * non-GEMM work is a fifth of the layer; for profiling, only named */
        {"d512", 256, 512, 512, 8, 2, 0, 0, 1},
    };
    /* three rounds by default: a round of the largest shape is a minute or
     * two (DL_BENCH_PAIRS sets it, as for every program of make bench) */
    rounds = getenv("DL_BENCH_PAIRS") ? bench_rounds_default() : 3;
    bench_env_line("bench_layer", rounds);
    now();
    printf("# bench_layer: bf16 activations and weights, fp32 weight gradients; %s; %s; %s time\n",
           quick ? "--quick" : "full",
           with_sgemm ? "sgemm baselines too" : "dgemm baselines only (ratio_vs_sgemm=0: --sgemm)",
           cpu_clock ? "CPU (DL_BENCH_CLOCK=cpu)" : "wall");
    int status = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        if (only ? strcmp(only, shapes[i].name) != 0 : shapes[i].named)
            continue;
        /* one process per shape, so that peak RSS is that shape's alone */
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            run(&shapes[i]);
            _exit(0);
        }
        int st = 1;
        if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            status = 1;
    }
    return status;
}
