/* make bench: what checking costs against what generating costs, on three
 * case sizes (the small catalogue case mixtral-small-bf16; T = 256,
 * d = f = 512, E = 8, k = 2, bf16; the kernel-tier kernel-sizes-bf16) and
 * in the three candidate modes of issue 31, every provided stage perturbed
 * (every 7th nonzero element one step of its storage type up):
 *   full   every stage value (the integer ones as the golden's),
 *   fused  out and d_x only (what a fused kernel hands over),
 *   out    out only;
 * and the golden itself as a candidate (every stage reused). Generating
 * (dl_moe_forward + dl_moe_backward on the case's inputs) and the checks
 * run interleaved round by round (bench_pairs.h): each ratio is the median
 * of the rounds' ratios, [min, max]. Each case runs in its own process, at
 * the default threads and then at one thread (the kernel-tier case at one
 * thread only with --all-one-thread: its rounds are long).
 *
 *   bench_check [--rounds N] [--case NAME] [--no-one-thread] [--all-one-thread]
 *               [--modes full,fused,out,reuse] */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dropless.h"
#include "bench_pairs.h"

/* The cases: a catalogue name, with the shape replaced where T > 0. */
typedef struct {
    const char *name, *base;
    int64_t T, d, f, E, k;
    int rounds; /* rounds by default (0: DL_BENCH_PAIRS, default 5) */
} bench_case_t;

static const bench_case_t cases[] = {
    {"small", "mixtral-small-bf16", 0, 0, 0, 0, 0, 0},
    {"d512", "mixtral-small-bf16", 256, 512, 512, 8, 2, 0},
    {"kernel", "kernel-sizes-bf16", 0, 0, 0, 0, 0, 3},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

enum { M_GEN, M_REUSE, M_FULL, M_FUSED, M_OUT, NMODES };
static const char *const mode_name[NMODES] = {"generate", "reuse", "full", "fused", "out"};
static const char *const mode_what[NMODES] = {
    "generate (forward+backward)", "the golden itself (reuse)", "full, every stage perturbed",
    "fused (out, d_x) perturbed", "out only, perturbed"};

/* One timed computation, repeated reps times (small cases are too short to
 * time once). */
typedef struct {
    const dl_moe_config_t *c;
    const dl_moe_inputs_t *in;
    const dl_check_golden_t *g;
    const dl_check_candidate_t *cand; /* NULL: generate */
    dl_check_options_t o;
    int reps, rc;
    dl_verdict_t verdict;
} check_ctx_t;

static double run_one(void *p)
{
    check_ctx_t *x = p;
    double t0 = bench_now();
    for (int i = 0; i < x->reps && !x->rc; i++) {
        if (!x->cand) {
            dl_moe_forward_t f;
            dl_moe_backward_t b;
            if ((x->rc = dl_moe_forward(x->c, x->in, &f)))
                break;
            if (!(x->rc = dl_moe_backward(x->c, x->in, &f, &b)))
                dl_moe_backward_free(&b);
            dl_moe_forward_free(&f);
            continue;
        }
        dl_check_report_t r;
        if ((x->rc = dl_check_run(x->g, x->cand, &x->o, &r)))
            break;
        x->verdict = r.verdict;
        const char *verbose = getenv("DL_BENCH_VERBOSE"); /* "json": every figure in full */
        if (verbose && i == 0) {
            const dl_check_report_t *rr = &r;
            dl_check_write(stdout, strcmp(verbose, "json") ? DL_REPORT_TABLE : DL_REPORT_JSON,
                           &rr, 1, 0);
        }
        dl_check_report_free(&r);
    }
    double t = bench_now() - t0;
    return x->rc ? -1 : t;
}

/* v one step of storage type t up (away from zero for negatives too: any
 * neighbour will do, it only has to differ). */
static float step_up(float v, dl_dtype_t t)
{
    double step = fabs((double)v) * 0x1p-24;
    if (step < 0x1p-149)
        step = 0x1p-149;
    for (int i = 0; i < 64; i++, step *= 2) {
        float w = (float)dl_round((double)v + (v < 0 ? -step : step), t);
        if (w != v && isfinite(w))
            return w;
    }
    return v;
}

/* Stages kept unperturbed in the full candidate: the integer ones (a wrong
 * id is another check) and x_sorted (a gather, judged exactly). */
static int kept_exact(dl_value_t s)
{
    return dl_value_store(s) >= DL_STORE_I32 || s == DL_VALUE_X_SORTED;
}

/* The candidate of a mode: slots of golden g's forward/backward, each
 * perturbed copy in copies[] (freed by the caller). */
static int make_candidate(dl_golden_file_t *g, int mode, dl_check_candidate_t *cand, float **copies)
{
    dl_golden_file_t v = *g;
    memset(cand, 0, sizeof *cand);
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        dl_value_t s;
        if (ds->group == DL_GOLDEN_INPUTS || dl_value_parse(ds->name, &s) != 0)
            continue;
        void **slot = dl_golden_slot(&v, ds);
        const int want = mode == M_FULL || mode == M_REUSE ||
                         (mode == M_FUSED && (s == DL_VALUE_OUT || s == DL_VALUE_D_X)) ||
                         (mode == M_OUT && s == DL_VALUE_OUT);
        if (!want || !*slot) {
            *slot = NULL;
            continue;
        }
        if (mode == M_REUSE || kept_exact(s))
            continue;
        const int64_t n = dl_value_numel(&g->config, s);
        const float *src = *slot;
        float *cp = malloc((size_t)(n > 0 ? n : 1) * sizeof *cp);
        if (!cp)
            return DL_ENOMEM;
        const dl_dtype_t t = dl_value_dtype(&g->config, s);
        /* DL_BENCH_STEPS=N: N steps instead of one (defective candidates,
         * to compare the reports' figures of two builds) */
        const int steps = getenv("DL_BENCH_STEPS") ? atoi(getenv("DL_BENCH_STEPS")) : 1;
        for (int64_t j = 0; j < n; j++) {
            cp[j] = src[j];
            for (int q = 0; q < steps && j % 7 == 0 && src[j] != 0; q++)
                cp[j] = step_up(cp[j], t); /* zeros stay: an empty expert's gradient must be 0 */
        }
        copies[s] = cp;
        *slot = cp;
    }
    cand->fwd = v.fwd;
    cand->bwd = v.bwd;
    return 0;
}

static int run_case(const bench_case_t *bc, int rounds, unsigned modes)
{
    dl_case_t c;
    if (dl_case_find(bc->base, &c)) {
        fprintf(stderr, "bench_check: no case %s\n", bc->base);
        return 2;
    }
    if (bc->T > 0) {
        c.config.tokens = bc->T, c.config.hidden = bc->d, c.config.ffn = bc->f;
        c.config.route.experts = bc->E, c.config.route.top_k = bc->k;
    }
    dl_golden_gen_opts_t go = {0};
    dl_golden_file_t gf;
    char err[256] = "";
    int bwd_err = 0;
    double t0 = bench_now();
    if (dl_golden_generate(&c, &go, &gf, &bwd_err, err, sizeof err) || bwd_err) {
        fprintf(stderr, "bench_check: generating %s: %s\n", bc->name, err);
        return 1;
    }
    const double tgen = bench_now() - t0;
    dl_moe_inputs_t in = dl_golden_inputs_view(&gf.in);
    dl_check_golden_t g = {&gf.config, &in, &gf.fwd, &gf.bwd, bc->name};
    /* each timing about 0.1 s or more (at most 100 repetitions) */
    check_ctx_t cal = {.c = &gf.config, .in = &in, .reps = 1};
    double tc[5]; /* the median of five: the first pays for thread start-up, and a
                   * lucky or unlucky one under load would set reps far off */
    for (int i = 0; i < 5; i++)
        tc[i] = run_one(&cal);
    const double t1 = bench__median(tc, 5);
    const int reps = t1 < 0 || t1 >= 0.1 ? 1 : t1 < 1e-3 ? 100 : (int)ceil(0.1 / t1);
    float *copies[NMODES][DL_VALUE_COUNT] = {{0}};
    dl_check_candidate_t cand[NMODES];
    check_ctx_t cx[NMODES];
    bench_fn_t fns[NMODES];
    void *ctx[NMODES];
    int idx[NMODES], nf = 0, rc = 0;
    for (int m = 0; m < NMODES && !rc; m++) {
        if (m != M_GEN && !((modes >> m) & 1))
            continue;
        cx[nf] = (check_ctx_t){.c = &gf.config, .in = &in, .g = &g, .reps = reps};
        dl_check_options_default(&cx[nf].o);
        if (m != M_GEN) {
            rc = make_candidate(&gf, m, &cand[m], copies[m]);
            cx[nf].cand = &cand[m];
        }
        fns[nf] = run_one, ctx[nf] = &cx[nf], idx[nf++] = m;
    }
    bench_rounds_t r;
    const double load0 = bench_load1();
    if (!rc)
        rc = bench_interleave(fns, ctx, nf, rounds, &r);
    printf("case %s (%s T=%lld d=%lld f=%lld E=%lld k=%lld %s), threads %d, load %.2f -> %.2f, "
           "%d rounds x %d reps; generate %.4f s (with drawing the inputs, once: %.3f s)\n",
           bc->name, bc->base, (long long)c.config.tokens, (long long)c.config.hidden,
           (long long)c.config.ffn, (long long)c.config.route.experts,
           (long long)c.config.route.top_k, dl_dtype_name(c.config.dtype), bench_threads(), load0,
           bench_load1(), r.n, reps, bench_median_time(&r, 0) / reps, tgen);
    for (int i = 1; i < nf && !rc; i++) {
        bench_ratio_t q = bench_ratio(&r, i, 0);
        printf("  check %-6s %-30s %8.4f s  %.2fx generate [%.2f, %.2f]  verdict %s\n",
               mode_name[idx[i]], mode_what[idx[i]], bench_median_time(&r, i) / reps, q.med, q.lo,
               q.hi, dl_verdict_name(cx[i].verdict));
    }
    printf("  peak RSS %.0f MiB\n", bench_peak_rss_mb());
    for (int i = 0; i < nf && rc; i++)
        if (cx[i].rc)
            fprintf(stderr, "bench_check: %s %s: %s\n", bc->name, mode_name[idx[i]],
                    dl_strerror(cx[i].rc));
    for (int m = 0; m < NMODES; m++)
        for (int s = 0; s < DL_VALUE_COUNT; s++)
            free(copies[m][s]);
    dl_golden_free(&gf);
    return rc ? 1 : 0;
}

static unsigned parse_modes(const char *s)
{
    unsigned m = 0;
    for (int i = 1; i < NMODES; i++)
        if (strstr(s, mode_name[i]))
            m |= 1u << i;
    return m;
}

int main(int argc, char **argv)
{
    int rounds = bench_rounds_default(), rounds_given = 0, one = 1, all_one = 0;
    const char *only = NULL, *modes_s = "reuse,full,fused,out";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1, rounds_given = 1;
        else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--modes") == 0 && i + 1 < argc)
            modes_s = argv[++i];
        else if (strcmp(argv[i], "--no-one-thread") == 0)
            one = 0;
        else if (strcmp(argv[i], "--all-one-thread") == 0)
            all_one = 1;
        else {
            fprintf(stderr, "usage: %s [--rounds N] [--case small|d512|kernel] [--no-one-thread] "
                            "[--all-one-thread] [--modes full,fused,out,reuse]\n", argv[0]);
            return 2;
        }
    }
    if (getenv("DL_BENCH_PAIRS"))
        rounds_given = 1;
    if (only) {
        for (int c = 0; c < NCASES; c++)
            if (strcmp(cases[c].name, only) == 0)
                return run_case(&cases[c], rounds_given || !cases[c].rounds ? rounds
                                                                             : cases[c].rounds,
                                parse_modes(modes_s));
        fprintf(stderr, "bench_check: unknown case %s\n", only);
        return 2;
    }
    bench_env_line("bench_check", rounds);
    int fails = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && (!one || bench_threads() == 1))
            break;
        if (pass == 1)
            printf("# bench_check: one thread (OMP_NUM_THREADS=1)\n");
        for (int c = 0; c < NCASES; c++) {
            if (pass == 1 && cases[c].rounds && !all_one)
                continue;
            char rs[16];
            snprintf(rs, sizeof rs, "%d", rounds);
            char *args[] = {argv[0], "--case", (char *)cases[c].name, "--modes", (char *)modes_s,
                            rounds_given ? "--rounds" : NULL, rs, NULL};
            fails += bench_run_child(args, pass == 1);
        }
    }
    return fails ? 1 : 0;
}
