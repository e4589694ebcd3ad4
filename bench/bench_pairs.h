/* Timing that survives a noisy machine (make bench's programs include it).
 *
 * A ratio of two timings taken minutes apart on a shared machine measures
 * the neighbours as much as the code: the load moves between them. Here
 * the computations being compared run interleaved, one round at a time
 * (A B C, A B C, ...: each round runs every computation once, in order),
 * and each round gives one ratio per pair, A's time over B's in that same
 * round; the figure reported is the median of the rounds' ratios, with
 * their smallest and largest as the spread. A neighbour that slows one
 * round slows both sides of its ratio, and one outlying round moves the
 * median little.
 *
 * Every program prints bench_env_line() first: the CPU's vector flags
 * (AVX-512 or only AVX2 changes the figures), the threads (OpenMP's, which
 * OpenBLAS's OpenMP build also uses) and the 1-minute load before and
 * after. */
#ifndef DL_BENCH_PAIRS_H
#define DL_BENCH_PAIRS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* A computation run once; returns the seconds it measured of itself (so
 * that untimed work, such as a baseline's operand conversion, stays out). */
typedef double (*bench_fn_t)(void *ctx);

#define BENCH_MAX_FNS 8
#define BENCH_MAX_ROUNDS 64

typedef struct {
    int n;                                  /* rounds */
    double t[BENCH_MAX_FNS][BENCH_MAX_ROUNDS]; /* seconds per computation and round */
} bench_rounds_t;

typedef struct {
    double med, lo, hi; /* median ratio and the spread (min, max) of the rounds' ratios */
} bench_ratio_t;

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double bench_load1(void)
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

static inline int bench_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Rounds from the environment (DL_BENCH_PAIRS, default 5), clamped to
 * [1, BENCH_MAX_ROUNDS]. */
static inline int bench_rounds_default(void)
{
    const char *s = getenv("DL_BENCH_PAIRS");
    int n = s ? atoi(s) : 5;
    return n < 1 ? 1 : n > BENCH_MAX_ROUNDS ? BENCH_MAX_ROUNDS : n;
}

/* The vector extensions that matter here, as listed in /proc/cpuinfo's
 * first "flags" line, comma-separated, into buf. */
static inline const char *bench_vector_flags(char *buf, size_t len)
{
    static const char *want[] = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx2", "fma",
                                 "f16c"};
    char line[8192];
    buf[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return strncpy(buf, "unknown", len);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "flags", 5) == 0)
            break;
    fclose(f);
    size_t used = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char pat[32];
        snprintf(pat, sizeof pat, " %s", want[i]);
        const char *p = strstr(line, pat);
        size_t wl = strlen(pat);
        if (p && (p[wl] == ' ' || p[wl] == '\n' || p[wl] == 0) && used + wl + 1 < len) {
            used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? "," : "", want[i]);
        }
    }
    if (!used)
        strncpy(buf, "none", len);
    return buf;
}

/* "# PROG: vector=... threads=N wait=W load1=L rounds=R" on stdout; wait is
 * OMP_WAIT_POLICY as set (libgomp's default, spinning a while before
 * sleeping, when unset): under load it moves the 2-thread figures of the
 * many short parallel regions (doc/performance.md). */
static inline void bench_env_line(const char *prog, int rounds)
{
    char flags[256];
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("# %s: vector=%s threads=%d wait=%s load1=%.2f rounds=%d (ratios: median of "
           "interleaved rounds, [min, max])\n",
           prog, bench_vector_flags(flags, sizeof flags), bench_threads(),
           wait && *wait ? wait : "default", bench_load1(), rounds);
    fflush(stdout);
}

/* Runs fns[0..nf) interleaved for n rounds; r->t[i][round] their seconds.
 * Returns the first nonzero result of a computation that reports failure
 * by a negative time (the round stops there), else 0. */
static inline int bench_interleave(bench_fn_t *fns, void **ctx, int nf, int n, bench_rounds_t *r)
{
    r->n = 0;
    for (int round = 0; round < n && round < BENCH_MAX_ROUNDS; round++) {
        for (int i = 0; i < nf && i < BENCH_MAX_FNS; i++) {
            double t = fns[i](ctx[i]);
            if (t < 0)
                return 1;
            r->t[i][round] = t;
        }
        r->n = round + 1;
    }
    return 0;
}

static inline int bench__cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double bench__median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench__cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The ratio of computation a over b, round by round. */
static inline bench_ratio_t bench_ratio(const bench_rounds_t *r, int a, int b)
{
    double q[BENCH_MAX_ROUNDS];
    bench_ratio_t out = {0, 0, 0};
    if (r->n < 1)
        return out;
    for (int i = 0; i < r->n; i++)
        q[i] = r->t[b][i] > 0 ? r->t[a][i] / r->t[b][i] : 0;
    out.med = bench__median(q, r->n); /* sorts q */
    out.lo = q[0];
    out.hi = q[r->n - 1];
    return out;
}

/* The median seconds of computation a over the rounds. */
static inline double bench_median_time(const bench_rounds_t *r, int a)
{
    double v[BENCH_MAX_ROUNDS];
    for (int i = 0; i < r->n; i++)
        v[i] = r->t[a][i];
    return r->n ? bench__median(v, r->n) : 0;
}

/* Runs this program again as argv (argv[0] ignored: /proc/self/exe) in a
 * child process, so that each case's peak RSS and OpenMP pool are its own,
 * at one thread (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1) when
 * one_thread. Returns 0 when it exits 0, else 1 (a line on stderr). */
static inline int bench_run_child(char *const *argv, int one_thread)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (one_thread) {
            setenv("OMP_NUM_THREADS", "1", 1);
            setenv("OPENBLAS_NUM_THREADS", "1", 1);
        }
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "%s: a child run failed\n", argv[0]);
        return 1;
    }
    return 0;
}

/* This process's peak resident set, MiB. */
static inline double bench_peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

#endif
