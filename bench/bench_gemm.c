/* Benchmark of the exact grouped GEMMs against plain OpenBLAS dgemm and
 * sgemm on the same grouped shapes (their inputs already in double/float,
 * one call per non-empty group, conversion not timed).
 *
 *   bench_gemm [--quick] [--reps R] [--case NAME]
 *
 * Each timing is the best of R runs (default 2), so that a busy neighbour on
 * a shared machine costs less; /proc/loadavg at the end of the case is
 * printed with the line.
 * Without --case every case runs in its own child process (so that each
 * line's peak RSS is its own). --quick shrinks T and the model dimensions
 * (by 8) for a smoke test. One line per case on stdout. */
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

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* Linux: KiB */
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

static int reps = 2;

/* internal tuning knob of the library (src/stages/stages_priv.h), for experiments:
 * DL_GEMM_KC=<chunk length> in the environment */
void dl__gemm_set_tuning(int64_t kc, int64_t budget_bytes);

static double loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

static int run_case(const bench_case_t *c, int quick)
{
    int64_t E = c->E, k = c->k, d = c->d, f = c->f, T = c->T;
    if (quick) {
        d /= 8;
        f /= 8;
        T = 64;
    }
    int64_t *off = malloc((size_t)(E + 1) * sizeof(int64_t));
    route(T, k, E, c->zipf, off);
    int64_t M = off[E], nonempty = 0, maxme = 0;
    for (int64_t e = 0; e < E; e++) {
        nonempty += off[e + 1] > off[e];
        if (off[e + 1] - off[e] > maxme)
            maxme = off[e + 1] - off[e];
    }
    /* gate/up: [M,d] x [d,f]; down: [M,f] x [f,d]; dW_down[e] = h_e^T dy_e */
    int64_t K = c->kind == G_GATE_UP ? d : f, N = c->kind == G_GATE_UP ? f : d;
    const char *gname = c->kind == G_GATE_UP ? "gate_up" : c->kind == G_DOWN ? "down" : "dW_down";
    float *lhs, *rhs = NULL, *out;
    double io_bytes, flops;
    dl_tier_stats_t st = {0, 0, 0};
    double t0, t_ours;
    int rc = 0;
    /* warm OpenBLAS's threads outside the timing */
    {
        double a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4}, cc[4];
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1, a, 2, b, 2, 0, cc, 2);
    }
    if (c->kind != G_DW) {
        lhs = malloc((size_t)(M * K) * sizeof(float));
        /* weights of experts without tokens are never read: leave them untouched */
        rhs = malloc((size_t)(E * K * N) * sizeof(float));
        out = malloc((size_t)(M * N) * sizeof(float));
        fill(lhs, M * K, 1, 1.0, c->in_t);
        for (int64_t e = 0; e < E; e++)
            if (off[e + 1] > off[e])
                fill(rhs + e * K * N, K * N, 1000 + (uint64_t)e, 1.0 / sqrt((double)K), c->in_t);
        memset(out, 0, (size_t)(M * N) * sizeof(float));
        io_bytes = 4.0 * ((double)M * K + (double)nonempty * K * N + (double)M * N);
        flops = 2.0 * (double)M * K * N;
        dl_gemm_term_t term = {lhs, K, rhs, DL_RHS_KN};
        t_ours = 1e300;
        for (int r = 0; r < reps; r++) {
            dl_tier_stats_t s1 = {0, 0, 0};
            t0 = now();
            rc = dl_gemm_grouped(&term, 1, N, off, E, c->out_t, out, &s1);
            t0 = now() - t0;
            t_ours = t0 < t_ours ? t0 : t_ours;
            st = s1;
        }
    } else {
        /* a = h [M, f], b = dy [M, d], out [E, f, d] */
        K = 0;
        lhs = malloc((size_t)(M * f) * sizeof(float));
        rhs = malloc((size_t)(M * d) * sizeof(float));
        out = malloc((size_t)(E * f * d) * sizeof(float));
        fill(lhs, M * f, 2, 1.0, c->in_t);
        fill(rhs, M * d, 3, 1.0 / sqrt((double)d), c->in_t);
        memset(out, 0, (size_t)(E * f * d) * sizeof(float));
        io_bytes = 4.0 * ((double)M * f + (double)M * d + (double)E * f * d);
        flops = 2.0 * (double)M * f * d;
        t_ours = 1e300;
        for (int r = 0; r < reps; r++) {
            dl_tier_stats_t s1 = {0, 0, 0};
            t0 = now();
            rc = dl_gemm_ragged_k(lhs, f, rhs, d, off, E, c->out_t, out, &s1);
            t0 = now() - t0;
            t_ours = t0 < t_ours ? t0 : t_ours;
            st = s1;
        }
    }
    double rss = peak_rss_mb();
    if (rc) {
        fprintf(stderr, "%s: %s\n", c->name, dl_strerror(rc));
        return 1;
    }
    /* spot check against the exact dot product */
    int bad = 0;
    for (int s = 0; s < 16; s++) {
        int64_t e = (int64_t)(mix((uint64_t)s + 77) % (uint64_t)E);
        if (off[e + 1] == off[e])
            continue;
        if (c->kind != G_DW) {
            int64_t m = off[e] + (int64_t)(mix((uint64_t)s) % (uint64_t)(off[e + 1] - off[e]));
            int64_t n = (int64_t)(mix((uint64_t)s + 9) % (uint64_t)N);
            double want = dl_dot_exact_f32(lhs + m * K, 1, rhs + e * K * N + n, N, (size_t)K, c->out_t);
            bad += (float)want != out[m * N + n];
        } else {
            int64_t i = (int64_t)(mix((uint64_t)s) % (uint64_t)f), j = (int64_t)(mix((uint64_t)s + 9) % (uint64_t)d);
            double want = dl_dot_exact_f32(lhs + off[e] * f + i, f, rhs + off[e] * d + j, d,
                                           (size_t)(off[e + 1] - off[e]), c->out_t);
            bad += (float)want != out[(e * f + i) * d + j];
        }
    }
    /* the baselines, one call per non-empty group */
    double t_d = 0, t_s = 0;
    if (c->kind != G_DW) {
        double *Ad = malloc((size_t)(maxme * K) * sizeof(double));
        double *Bd = malloc((size_t)(K * N) * sizeof(double));
        double *Cd = malloc((size_t)(maxme * N) * sizeof(double));
        for (int64_t e = 0; e < E; e++) {
            int64_t me = off[e + 1] - off[e];
            if (!me)
                continue;
            to_double(lhs + off[e] * K, me * K, Ad);
            to_double(rhs + e * K * N, K * N, Bd);
            double best = 1e300;
            for (int r = 0; r < reps; r++) {
                t0 = now();
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)me, (int)N, (int)K,
                            1.0, Ad, (int)K, Bd, (int)N, 0.0, Cd, (int)N);
                t0 = now() - t0;
                best = t0 < best ? t0 : best;
            }
            t_d += best;
        }
        free(Ad);
        free(Bd);
        free(Cd);
        for (int64_t e = 0; e < E; e++) {
            int64_t me = off[e + 1] - off[e];
            if (!me)
                continue;
            double best = 1e300;
            for (int r = 0; r < reps; r++) {
                t0 = now();
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)me, (int)N, (int)K,
                            1.0f, lhs + off[e] * K, (int)K, rhs + e * K * N, (int)N, 0.0f,
                            out + off[e] * N, (int)N);
                t0 = now() - t0;
                best = t0 < best ? t0 : best;
            }
            t_s += best;
        }
    } else {
        double *Ad = malloc((size_t)(maxme * f) * sizeof(double));
        double *Bd = malloc((size_t)(maxme * d) * sizeof(double));
        double *Cd = malloc((size_t)(f * d) * sizeof(double));
        for (int64_t e = 0; e < E; e++) {
            int64_t me = off[e + 1] - off[e];
            if (!me)
                continue;
            to_double(lhs + off[e] * f, me * f, Ad);
            to_double(rhs + off[e] * d, me * d, Bd);
            double best = 1e300;
            for (int r = 0; r < reps; r++) {
                t0 = now();
                cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)f, (int)d, (int)me, 1.0,
                            Ad, (int)f, Bd, (int)d, 0.0, Cd, (int)d);
                t0 = now() - t0;
                best = t0 < best ? t0 : best;
            }
            t_d += best;
        }
        free(Ad);
        free(Bd);
        free(Cd);
        for (int64_t e = 0; e < E; e++) {
            int64_t me = off[e + 1] - off[e];
            if (!me) /* the exact path writes zeros here; so must the baseline */
            {
                t0 = now();
                memset(out + e * f * d, 0, (size_t)(f * d) * sizeof(float));
                t_s += now() - t0;
                continue;
            }
            double best = 1e300;
            for (int r = 0; r < reps; r++) {
                t0 = now();
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)f, (int)d, (int)me, 1.0f,
                            lhs + off[e] * f, (int)f, rhs + off[e] * d, (int)d, 0.0f,
                            out + e * f * d, (int)d);
                t0 = now() - t0;
                best = t0 < best ? t0 : best;
            }
            t_s += best;
        }
    }
    double tot = (double)(st.fast + st.middle + st.exact);
    printf("case=%s shape=%s gemm=%s E=%lld k=%lld d=%lld f=%lld T=%lld M=%lld groups=%lld "
           "in=%s out=%s time_s=%.3f gflops=%.1f fast=%.5f%% middle=%.5f%% exact=%.5f%% "
           "peak_rss_mb=%.0f io_mb=%.0f rss_over_io=%.3f dgemm_s=%.3f sgemm_s=%.3f "
           "spot_check_errors=%d load=%.2f ratio_vs_dgemm=%.3f ratio_vs_sgemm=%.3f\n",
           c->name, c->shape, gname, (long long)E, (long long)k, (long long)d, (long long)f,
           (long long)T, (long long)M, (long long)nonempty, dl_dtype_name(c->in_t),
           dl_dtype_name(c->out_t), t_ours, flops / t_ours * 1e-9, 100.0 * (double)st.fast / tot,
           100.0 * (double)st.middle / tot, 100.0 * (double)st.exact / tot, rss,
           io_bytes / 1048576.0, rss / (io_bytes / 1048576.0), t_d, t_s, bad, loadavg(), t_ours / t_d,
           t_ours / t_s);
    fflush(stdout);
    free(off);
    free(lhs);
    free(rhs);
    free(out);
    return bad != 0;
}

int main(int argc, char **argv)
{
    int quick = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1;
        else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--reps R] [--case NAME]\ncases:", argv[0]);
            for (int c = 0; c < NCASES; c++)
                fprintf(stderr, " %s", cases[c].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    if (getenv("DL_GEMM_KC"))
        dl__gemm_set_tuning(atoll(getenv("DL_GEMM_KC")), 0);
    if (only) {
        for (int c = 0; c < NCASES; c++)
            if (strcmp(cases[c].name, only) == 0)
                return run_case(&cases[c], quick);
        fprintf(stderr, "unknown case %s\n", only);
        return 2;
    }
    int fails = 0;
    for (int c = 0; c < NCASES; c++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            char rs[16];
            snprintf(rs, sizeof rs, "%d", reps);
            char *args[] = {argv[0], "--reps", rs, "--case", (char *)cases[c].name,
                            quick ? "--quick" : NULL, NULL};
            execv("/proc/self/exe", args);
            _exit(127);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            fprintf(stderr, "case %s failed\n", cases[c].name);
            fails++;
        }
    }
    return fails ? 1 : 0;
}
