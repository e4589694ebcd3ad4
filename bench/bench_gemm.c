/* Benchmark of the exact grouped GEMMs against plain OpenBLAS dgemm and
 * sgemm on the same grouped shapes (their inputs already in double/float,
 * one call per non-empty group, conversion not timed).
 *
 *   bench_gemm [--quick] [--rounds N] [--case NAME] [--no-one-thread] [--ours-only]
 *              [--cpu-time]
 *
 * The three (ours, dgemm, sgemm) run interleaved for N rounds (default 3,
 * or DL_BENCH_PAIRS; bench_pairs.h): each ratio is the median of the
 * rounds' ratios, with their [min, max]; the 1-minute load before and
 * after the case is printed with the line.
 * Without --case every case runs in its own child process (so that each
 * line's peak RSS is its own). --quick shrinks T and the model dimensions
 * (by 8) for a smoke test. One line per case on stdout. --cpu-time times
 * the process's CPU time instead of wall time (with one thread and a
 * loaded machine, the work done rather than the time waited for a core;
 * the line says clock=cpu). */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <cblas.h>
#undef I
#include "dropless.h"
#include "bench_pairs.h"

typedef enum { G_GATE_UP, G_DOWN, G_DW } gemm_kind_t;

typedef struct {
    const char *name;  /* case name, for --case */
    const char *shape; /* model-like shape */
    int64_t E, k, d, f, T;
    double zipf;       /* 0: uniform top-k load, else Zipf exponent */
    gemm_kind_t kind;
    dl_dtype_t in_t, out_t;
} bench_case_t;

/* DeepSeek-V3's d, f and k with 64 of its 256 experts and T = 256: the
 * same 32 rows per expert as the real layer at T = 1024, in a quarter of
 * the memory (all 256 experts' weights are 15 GB as float containers, and
 * make bench must stay within 12 GiB). */
static const bench_case_t cases[] = {
    {"mixtral_gate_up", "mixtral", 8, 2, 4096, 14336, 1024, 0, G_GATE_UP, DL_BF16, DL_BF16},
    {"mixtral_down", "mixtral", 8, 2, 4096, 14336, 1024, 0, G_DOWN, DL_BF16, DL_BF16},
    {"mixtral_dw_down", "mixtral", 8, 2, 4096, 14336, 1024, 0, G_DW, DL_BF16, DL_BF16},
    {"mixtral_gate_up_fp32", "mixtral", 8, 2, 4096, 14336, 512, 0, G_GATE_UP, DL_F32, DL_F32},
    {"mixtral_down_bf16_to_fp32", "mixtral", 8, 2, 4096, 14336, 512, 0, G_DOWN, DL_BF16, DL_F32},
    {"deepseek_gate_up", "deepseek-v3", 64, 8, 7168, 2048, 256, 0, G_GATE_UP, DL_BF16, DL_BF16},
    {"deepseek_down", "deepseek-v3", 64, 8, 7168, 2048, 256, 0, G_DOWN, DL_BF16, DL_BF16},
    {"deepseek_dw_down", "deepseek-v3", 64, 8, 7168, 2048, 256, 0, G_DW, DL_BF16, DL_BF16},
    {"zipf_gate_up", "deepseek-v3-zipf1.2", 64, 8, 7168, 2048, 256, 1.2, G_GATE_UP, DL_BF16, DL_BF16},
    {"zipf_down", "deepseek-v3-zipf1.2", 64, 8, 7168, 2048, 256, 1.2, G_DOWN, DL_BF16, DL_BF16},
    {"zipf_dw_down", "deepseek-v3-zipf1.2", 64, 8, 7168, 2048, 256, 1.2, G_DW, DL_BF16, DL_BF16},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static int cpu_clock = 0; /* --cpu-time */

static double now(void)
{
    struct timespec t;
    clock_gettime(cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* An initialiser-like value: Irwin-Hall(4) scaled to unit variance (close
 * enough to normal for timing) times scale, on grid g. */
static float rand_val(uint64_t seed, int64_t i, double scale, dl_dtype_t g)
{
    uint64_t r = mix(seed + (uint64_t)i * UINT64_C(0x9e3779b97f4a7c15));
    double s = (double)(r & 0xffff) + (double)((r >> 16) & 0xffff) +
               (double)((r >> 32) & 0xffff) + (double)(r >> 48);
    double v = (s / 65536.0 - 2.0) * 1.7320508075688772 * scale;
    float x = (float)v;
    if (g == DL_BF16) {
        uint32_t b;
        memcpy(&b, &x, 4);
        b += 0x7fffu + ((b >> 16) & 1u);
        b &= 0xffff0000u;
        memcpy(&x, &b, 4);
    } else if (g == DL_F16) {
        x = (float)dl_round(v, DL_F16);
    }
    return x;
}

static void fill(float *x, int64_t n, uint64_t seed, double scale, dl_dtype_t g)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] = rand_val(seed, i, scale, g);
}

static void zero(float *x, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] = 0.0f;
}

/* Group sizes for T tokens routed to k distinct experts each, uniformly or
 * with Zipf(s) popularity. */
static void route(int64_t T, int64_t k, int64_t E, double s, int64_t *off)
{
    double *cdf = malloc((size_t)E * sizeof(double));
    int64_t *cnt = calloc((size_t)E, sizeof(int64_t));
    int64_t *pick = malloc((size_t)k * sizeof(int64_t));
    double tot = 0;
    for (int64_t e = 0; e < E; e++) {
        tot += s > 0 ? pow((double)(e + 1), -s) : 1.0;
        cdf[e] = tot;
    }
    uint64_t st = 12345;
    for (int64_t t = 0; t < T; t++) {
        int64_t got = 0;
        while (got < k) {
            double u = (double)(mix(st++) >> 11) * 0x1p-53 * tot;
            int64_t lo = 0, hi = E - 1;
            while (lo < hi) {
                int64_t mid = (lo + hi) / 2;
                if (cdf[mid] > u)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            int dup = 0;
            for (int64_t j = 0; j < got; j++)
                dup |= pick[j] == lo;
            if (!dup)
                pick[got++] = lo;
        }
        for (int64_t j = 0; j < k; j++)
            cnt[pick[j]]++;
    }
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = off[e] + cnt[e];
    free(cdf);
    free(cnt);
    free(pick);
}

static double *to_double(const float *x, int64_t n, double *buf)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        buf[i] = x[i];
    return buf;
}

static int rounds = 5;
static int ours_only = 0; /* --ours-only: no baselines (for profiling our call alone) */
static int dgemm_only = 0; /* --dgemm-only: the dgemm baseline alone (its profile) */

/* internal tuning knobs of the library (src/stages/stages_priv.h), for experiments:
 * DL_GEMM_KC=<chunk length>, DL_GEMM_BUDGET=<scratch bytes>, DL_GEMM_SUB in the environment */
void dl__gemm_set_tuning(int64_t kc, int64_t budget_bytes);
void dl__gemm_set_subblock(int64_t cols); /* DL_GEMM_SUB=<columns per sub-block> */

/* One case's operands and the three computations timed on them. */
typedef struct {
    const bench_case_t *c;
    const int64_t *off;
    int64_t E, K, N, f, d, maxme;
    float *lhs, *rhs, *out;
    double *Ad, *Bd, *Cd; /* the dgemm baseline's operands, one expert at a time */
    dl_tier_stats_t st;
    int rc, bad, checked;
} gemm_ctx_t;

/* The exact GEMM against the exact dot product on 16 elements. */
static int spot_check(const gemm_ctx_t *g)
{
    const int64_t E = g->E, K = g->K, N = g->N, f = g->f, d = g->d, *off = g->off;
    int bad = 0;
    for (int s = 0; s < 16; s++) {
        int64_t e = (int64_t)(mix((uint64_t)s + 77) % (uint64_t)E);
        if (off[e + 1] == off[e])
            continue;
        if (g->c->kind != G_DW) {
            int64_t m = off[e] + (int64_t)(mix((uint64_t)s) % (uint64_t)(off[e + 1] - off[e]));
            int64_t n = (int64_t)(mix((uint64_t)s + 9) % (uint64_t)N);
            double want = dl_dot_exact_f32(g->lhs + m * K, 1, g->rhs + e * K * N + n, N, (size_t)K,
                                           g->c->out_t);
            bad += (float)want != g->out[m * N + n];
        } else {
            int64_t i = (int64_t)(mix((uint64_t)s) % (uint64_t)f), j = (int64_t)(mix((uint64_t)s + 9) % (uint64_t)d);
            double want = dl_dot_exact_f32(g->lhs + off[e] * f + i, f, g->rhs + off[e] * d + j, d,
                                           (size_t)(off[e + 1] - off[e]), g->c->out_t);
            bad += (float)want != g->out[(e * f + i) * d + j];
        }
    }
    return bad;
}

/* ours: the exact grouped GEMM (or ragged-K weight gradient); its first run
 * is spot-checked before the baselines overwrite the output */
static double run_ours(void *p)
{
    gemm_ctx_t *g = p;
    dl_tier_stats_t s1 = {0, 0, 0};
    double t0 = now();
    if (g->c->kind != G_DW) {
        dl_gemm_term_t term = {g->lhs, g->K, g->rhs, DL_RHS_KN};
        g->rc = dl_gemm_grouped(&term, 1, g->N, g->off, g->E, g->c->out_t, g->out, &s1);
    } else {
        g->rc = dl_gemm_ragged_k(g->lhs, g->f, g->rhs, g->d, g->off, g->E, g->c->out_t, g->out, &s1);
    }
    t0 = now() - t0;
    if (g->rc)
        return -1;
    g->st = s1;
    if (!g->checked) {
        g->bad = spot_check(g);
        g->checked = 1;
    }
    return t0;
}

/* OpenBLAS dgemm, one call per non-empty group; each expert's operands are
 * converted to double untimed, one expert at a time (never a double copy
 * of every weight) */
static double run_dgemm(void *p)
{
    gemm_ctx_t *g = p;
    const int64_t K = g->K, N = g->N, f = g->f, d = g->d, *off = g->off;
    double t = 0;
    for (int64_t e = 0; e < g->E; e++) {
        int64_t me = off[e + 1] - off[e];
        if (!me)
            continue;
        double t0;
        if (g->c->kind != G_DW) {
            to_double(g->lhs + off[e] * K, me * K, g->Ad);
            to_double(g->rhs + e * K * N, K * N, g->Bd);
            t0 = now();
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)me, (int)N, (int)K, 1.0,
                        g->Ad, (int)K, g->Bd, (int)N, 0.0, g->Cd, (int)N);
        } else {
            to_double(g->lhs + off[e] * f, me * f, g->Ad);
            to_double(g->rhs + off[e] * d, me * d, g->Bd);
            t0 = now();
            cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)f, (int)d, (int)me, 1.0,
                        g->Ad, (int)f, g->Bd, (int)d, 0.0, g->Cd, (int)d);
        }
        t += now() - t0;
    }
    return t;
}

/* OpenBLAS sgemm likewise (no conversion); for the weight gradient an
 * empty expert's output is zeroed, as the exact path writes it */
static double run_sgemm(void *p)
{
    gemm_ctx_t *g = p;
    const int64_t K = g->K, N = g->N, f = g->f, d = g->d, *off = g->off;
    double t = 0;
    for (int64_t e = 0; e < g->E; e++) {
        int64_t me = off[e + 1] - off[e];
        double t0 = now();
        if (g->c->kind != G_DW) {
            if (!me)
                continue;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)me, (int)N, (int)K, 1.0f,
                        g->lhs + off[e] * K, (int)K, g->rhs + e * K * N, (int)N, 0.0f,
                        g->out + off[e] * N, (int)N);
        } else if (!me) {
            memset(g->out + e * f * d, 0, (size_t)(f * d) * sizeof(float));
        } else {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)f, (int)d, (int)me, 1.0f,
                        g->lhs + off[e] * f, (int)f, g->rhs + off[e] * d, (int)d, 0.0f,
                        g->out + e * f * d, (int)d);
        }
        t += now() - t0;
    }
    return t;
}

/* Operands of case c (weights of experts without tokens are never read and
 * stay unset); io_bytes and flops of the GEMM. The output's pages are
 * touched here (zeroed), as the baselines' reused buffers are after their
 * first call: else the first round of ours alone pays the page faults of
 * a fresh output (3.7 GB for the DeepSeek weight gradient). */
static void setup(gemm_ctx_t *g, double *io_bytes, double *flops)
{
    const bench_case_t *c = g->c;
    const int64_t E = g->E, M = g->off[E], K = g->K, N = g->N, f = g->f, d = g->d;
    int64_t nonempty = 0;
    for (int64_t e = 0; e < E; e++)
        nonempty += g->off[e + 1] > g->off[e];
    if (c->kind != G_DW) {
        g->lhs = malloc((size_t)(M * K) * sizeof(float));
        g->rhs = malloc((size_t)(E * K * N) * sizeof(float));
        g->out = malloc((size_t)(M * N) * sizeof(float));
        zero(g->out, M * N);
        fill(g->lhs, M * K, 1, 1.0, c->in_t);
        for (int64_t e = 0; e < E; e++)
            if (g->off[e + 1] > g->off[e])
                fill(g->rhs + e * K * N, K * N, 1000 + (uint64_t)e, 1.0 / sqrt((double)K), c->in_t);
        g->Ad = malloc((size_t)(g->maxme * K) * sizeof(double));
        g->Bd = malloc((size_t)(K * N) * sizeof(double));
        g->Cd = malloc((size_t)(g->maxme * N) * sizeof(double));
        *io_bytes = 4.0 * ((double)M * K + (double)nonempty * K * N + (double)M * N);
        *flops = 2.0 * (double)M * K * N;
    } else { /* a = h [M, f], b = dy [M, d], out [E, f, d] */
        g->lhs = malloc((size_t)(M * f) * sizeof(float));
        g->rhs = malloc((size_t)(M * d) * sizeof(float));
        g->out = malloc((size_t)(E * f * d) * sizeof(float));
        zero(g->out, E * f * d);
        fill(g->lhs, M * f, 2, 1.0, c->in_t);
        fill(g->rhs, M * d, 3, 1.0 / sqrt((double)d), c->in_t);
        g->Ad = malloc((size_t)(g->maxme * f) * sizeof(double));
        g->Bd = malloc((size_t)(g->maxme * d) * sizeof(double));
        g->Cd = malloc((size_t)(f * d) * sizeof(double));
        *io_bytes = 4.0 * ((double)M * f + (double)M * d + (double)E * f * d);
        *flops = 2.0 * (double)M * f * d;
    }
}

static int run_case(const bench_case_t *c, int quick)
{
    gemm_ctx_t g = {.c = c, .E = c->E, .d = c->d, .f = c->f};
    int64_t T = c->T;
    if (quick) {
        g.d /= 8;
        g.f /= 8;
        T = 64;
    }
    int64_t *off = malloc((size_t)(g.E + 1) * sizeof(int64_t));
    route(T, c->k, g.E, c->zipf, off);
    g.off = off;
    int64_t nonempty = 0;
    for (int64_t e = 0; e < g.E; e++) {
        nonempty += off[e + 1] > off[e];
        if (off[e + 1] - off[e] > g.maxme)
            g.maxme = off[e + 1] - off[e];
    }
    /* gate/up: [M,d] x [d,f]; down: [M,f] x [f,d]; dW_down[e] = h_e^T dy_e */
    g.K = c->kind == G_GATE_UP ? g.d : g.f;
    g.N = c->kind == G_GATE_UP ? g.f : g.d;
    const char *gname = c->kind == G_GATE_UP ? "gate_up" : c->kind == G_DOWN ? "down" : "dW_down";
    double io_bytes, flops;
    setup(&g, &io_bytes, &flops);
    /* warm OpenBLAS's threads outside the timing */
    {
        double a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4}, cc[4];
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1, a, 2, b, 2, 0, cc, 2);
    }
    double load0 = bench_load1();
    bench_fn_t fns[3] = {run_ours, run_dgemm, run_sgemm};
    void *ctx[3] = {&g, &g, &g};
    bench_rounds_t r;
    int fail = dgemm_only ? bench_interleave(fns + 1, ctx, 1, rounds, &r)
                          : bench_interleave(fns, ctx, ours_only ? 1 : 3, rounds, &r);
    double rss = bench_peak_rss_mb();
    if (fail) {
        fprintf(stderr, "%s: %s\n", c->name, dl_strerror(g.rc));
        return 1;
    }
    if (dgemm_only) { /* no ratio: only the baseline ran */
        printf("case=%s dgemm_only threads=%d rounds=%d dgemm_s=%.3f load=%.2f-%.2f\n", c->name,
               bench_threads(), r.n, bench_median_time(&r, 0), load0, bench_load1());
        free(off);
        free(g.lhs), free(g.rhs), free(g.out), free(g.Ad), free(g.Bd), free(g.Cd);
        return 0;
    }
    bench_ratio_t rd = bench_ratio(&r, 0, 1), rs = bench_ratio(&r, 0, 2);
    double t_ours = bench_median_time(&r, 0);
    double tot = (double)(g.st.fast + g.st.middle + g.st.exact);
    printf("case=%s shape=%s gemm=%s E=%lld k=%lld d=%lld f=%lld T=%lld M=%lld groups=%lld "
           "in=%s out=%s threads=%d rounds=%d time_s=%.3f gflops=%.1f fast=%.5f%% middle=%.5f%% "
           "exact=%.5f%% peak_rss_mb=%.0f io_mb=%.0f rss_over_io=%.3f dgemm_s=%.3f sgemm_s=%.3f "
           "spot_check_errors=%d load=%.2f-%.2f ratio_vs_dgemm=%.3f [%.3f,%.3f] "
           "ratio_vs_sgemm=%.3f [%.3f,%.3f]%s\n",
           c->name, c->shape, gname, (long long)g.E, (long long)c->k, (long long)g.d,
           (long long)g.f, (long long)T, (long long)off[g.E], (long long)nonempty,
           dl_dtype_name(c->in_t), dl_dtype_name(c->out_t), bench_threads(), r.n, t_ours,
           flops / t_ours * 1e-9, 100.0 * (double)g.st.fast / tot, 100.0 * (double)g.st.middle / tot,
           100.0 * (double)g.st.exact / tot, rss, io_bytes / 1048576.0,
           rss / (io_bytes / 1048576.0), bench_median_time(&r, 1), bench_median_time(&r, 2), g.bad,
           load0, bench_load1(), rd.med, rd.lo, rd.hi, rs.med, rs.lo, rs.hi,
           cpu_clock ? " clock=cpu" : "");
    fflush(stdout);
    free(off);
    free(g.lhs), free(g.rhs), free(g.out), free(g.Ad), free(g.Bd), free(g.Cd);
    return g.bad != 0;
}

/* Runs case c in a child process (its peak RSS its own), with
 * OMP_NUM_THREADS=1 when one_thread. */
static int run_child(char *prog, const bench_case_t *c, int quick, int one_thread)
{
    char rs[16];
    snprintf(rs, sizeof rs, "%d", rounds);
    char *args[] = {prog, "--rounds", rs, "--case", (char *)c->name, quick ? "--quick" : NULL, NULL};
    if (bench_run_child(args, one_thread)) {
        fprintf(stderr, "case %s failed\n", c->name);
        return 1;
    }
    return 0;
}

/* The one-thread pass: the fp32-output GEMM with the most misses and the
 * ragged weight gradient with short groups (two more one-thread cases took
 * make bench past its 20 minutes; bench_gemm --case NAME under
 * OMP_NUM_THREADS=1 runs any other). */
static const char *const one_thread_cases[] = {"mixtral_down_bf16_to_fp32", "zipf_dw_down"};

int main(int argc, char **argv)
{
    int quick = 0, all_threads_only = 0;
    const char *only = NULL;
    /* three rounds unless DL_BENCH_PAIRS says: at five, the 11 cases and the
     * one-thread pass alone would take make bench's 20 minutes on 2 cores */
    rounds = getenv("DL_BENCH_PAIRS") ? bench_rounds_default() : 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if ((strcmp(argv[i], "--rounds") == 0 || strcmp(argv[i], "--reps") == 0) &&
                 i + 1 < argc)
            rounds = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1;
        else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--no-one-thread") == 0)
            all_threads_only = 1;
        else if (strcmp(argv[i], "--ours-only") == 0)
            ours_only = 1;
        else if (strcmp(argv[i], "--dgemm-only") == 0)
            dgemm_only = 1;
        else if (strcmp(argv[i], "--cpu-time") == 0)
            cpu_clock = 1;
        else {
            fprintf(stderr, "usage: %s [--quick] [--rounds N] [--case NAME] [--no-one-thread] "
                            "[--ours-only] [--cpu-time]\n"
                            "cases:", argv[0]);
            for (int c = 0; c < NCASES; c++)
                fprintf(stderr, " %s", cases[c].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    if (rounds > BENCH_MAX_ROUNDS)
        rounds = BENCH_MAX_ROUNDS;
    if (getenv("DL_GEMM_KC") || getenv("DL_GEMM_BUDGET"))
        dl__gemm_set_tuning(getenv("DL_GEMM_KC") ? atoll(getenv("DL_GEMM_KC")) : 0,
                            getenv("DL_GEMM_BUDGET") ? atoll(getenv("DL_GEMM_BUDGET")) : 0);
    if (getenv("DL_GEMM_SUB"))
        dl__gemm_set_subblock(atoll(getenv("DL_GEMM_SUB")));
    if (only) {
        for (int c = 0; c < NCASES; c++)
            if (strcmp(cases[c].name, only) == 0)
                return run_case(&cases[c], quick);
        fprintf(stderr, "unknown case %s\n", only);
        return 2;
    }
    bench_env_line("bench_gemm", rounds);
    int fails = 0;
    for (int c = 0; c < NCASES; c++)
        fails += run_child(argv[0], &cases[c], quick, 0);
    if (!all_threads_only && bench_threads() > 1) {
        printf("# bench_gemm: one thread (OMP_NUM_THREADS=1)\n");
        for (size_t i = 0; i < sizeof one_thread_cases / sizeof one_thread_cases[0]; i++)
            for (int c = 0; c < NCASES; c++)
                if (strcmp(cases[c].name, one_thread_cases[i]) == 0)
                    fails += run_child(argv[0], &cases[c], quick, 1);
    }
    return fails ? 1 : 0;
}
