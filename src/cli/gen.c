/* dropless gen | cases | info: golden files from the command line. */
#include "config.h"
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "dropless.h"
#include "cli.h"

static void human(int64_t b, char *buf, size_t n)
{
    if (b < 0)
        snprintf(buf, n, "?");
    else if (b < 10 * 1024)
        snprintf(buf, n, "%" PRId64 " B", b);
    else if (b < 10 * 1024 * 1024)
        snprintf(buf, n, "%" PRId64 " KiB", b / 1024);
    else if (b < INT64_C(10) * 1024 * 1024 * 1024)
        snprintf(buf, n, "%" PRId64 " MiB", b / (1024 * 1024));
    else
        snprintf(buf, n, "%" PRId64 " GiB", b / (1024 * 1024 * 1024));
}

/* ------------------------------------------------------------------ gen */

static void gen_usage(FILE *f)
{
    fprintf(f,
            "usage: dropless gen [options] CASE...\n"
            "       dropless gen [options] --all\n"
            "       dropless gen [options] --config FILE\n"
            "Writes one golden file per case, DIR/CASE.h5 (see 'dropless cases', doc/cli.md).\n"
            "      --case NAME     a catalogue case (the same as giving NAME)\n"
            "  -o, --output FILE   output path (one case only)\n"
            "  -d, --dir DIR       output directory (default: .)\n"
            "  -f, --force         overwrite existing files\n"
            "  -c, --config FILE   a case file (key = value lines, doc/format.md)\n"
            "      --all           every catalogue case that is not layer-scale\n"
            "      --dtype T       fp32, bf16 or fp16 for every case (renames it: tiny-bf16)\n"
            "      --seed N        override the seed\n"
            "      --no-backward   skip the backward pass and /backward\n"
            "      --tier T        every case of tier T (vectors, kernel, layer)\n"
            "      --stream        generate expert by expert (automatic when the case does\n"
            "                      not fit in memory whole, and for the layer tier)\n"
            "      --experts A:B   only experts A..B-1 (an expert-parallel slice; streams);\n"
            "                      the file is DIR/CASE.experts-A-B.h5\n"
            "      --ep-ranks R,.. also write the expert-parallel layout /ep/ranks_R for each\n"
            "                      R (a divisor of the expert count; doc/format.md)\n"
            "      --layout K:P,.. also write kernel layout K (masked:MAX_M, contiguous:ALIGN,\n"
            "                      vllm-block:BLOCK, batched:MAX_TOKENS) as /layouts/K_P,\n"
            "                      with --ep-ranks each rank's variant too (doc/format.md)\n"
            "      --layout-poison the poisoned twin: the layouts' padding rows hold NaN\n"
            "      --slices        under mpirun: each rank writes its expert slice\n"
            "                      DIR/CASE.experts-A-B.h5 (doc/ep.md), not rank 0 the file\n"
            "      --ignore-memory generate even when the case needs more memory than is\n"
            "                      available\n"
            "  -q, --quiet         print nothing on success\n"
            "  -h, --help          this text\n");
}

/* Chooses in-memory or streamed generation for c and checks the estimate
 * against the memory available: 0, or 1 after printing the refusal. */
static int plan_memory(const dl_case_t *c, dl_golden_gen_opts_t *o, int ignore)
{
    int64_t avail = dl_memory_available();
    if (c->tier == DL_TIER_LAYER)
        o->stream = 1;
    int64_t need = dl_case_memory_bytes(c, o);
    if (!o->stream && avail >= 0 && (need < 0 || need > avail)) {
        o->stream = 1; /* the same bytes, a fraction of the memory */
        need = dl_case_memory_bytes(c, o);
    }
    if (ignore || avail < 0 || (need >= 0 && need <= avail))
        return 0;
    char a[32], b[32];
    human(need, a, sizeof a);
    human(avail, b, sizeof b);
    fprintf(stderr, "dropless gen: %s: needs about %s of memory%s, %s available; refusing "
                    "(--ignore-memory to try anyway)\n", c->name, need < 0 ? "more than 8 EiB" : a,
            o->stream ? " even streamed" : "", b);
    return 1;
}

/* "A:B" with 0 <= A < B: experts A..B-1. */
static int parse_experts(const char *s, int64_t *a, int64_t *b)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    long long x = strtoll(s, &end, 10);
    if (*end != ':' || end[1] < '0' || end[1] > '9')
        return -1;
    long long y = strtoll(end + 1, &end, 10);
    if (*end || x < 0 || y <= x || y > INT32_MAX)
        return -1;
    *a = x;
    *b = y;
    return 0;
}

/* gen's long options without a short form */
enum { O_ALL = 256, O_DTYPE, O_SEED, O_NOBACK, O_TIER, O_STREAM, O_EXPERTS, O_IGNMEM, O_EPRANKS,
       O_SLICES, O_LAYOUT, O_POISON };

/* The options of issue 13: --tier, --stream, --experts, --ignore-memory. */
typedef struct {
    int tier; /* -1: none */
    int stream, ignore_memory;
    int64_t ex_a, ex_b; /* ex_b > 0: --experts ex_a:ex_b */
    int n_ep;           /* --ep-ranks */
    int slices;         /* --slices (under mpirun) */
    int64_t ep[DL_GOLDEN_EP_MAX];
    int n_layout, poison; /* --layout (repeatable), --layout-poison */
    int layout_kind[DL_GOLDEN_LAYOUT_MAX];
    int64_t layout_param[DL_GOLDEN_LAYOUT_MAX];
} scale_opts_t;

/* "masked:64,vllm-block:16" appended to sc's layouts; 1 if malformed. */
static int parse_layouts(const char *s, scale_opts_t *sc)
{
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf || !*buf || *buf == ',' ||
        buf[strlen(buf) - 1] == ',' || strstr(buf, ",,"))
        return 1;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (sc->n_layout == DL_GOLDEN_LAYOUT_MAX ||
            dl_layout_parse(tok, &sc->layout_kind[sc->n_layout], &sc->layout_param[sc->n_layout]))
            return 1;
        sc->n_layout++;
    }
    return 0;
}

/* "1,2,4,8": positive rank counts (whether each divides E is the case's
 * to say); 1 if malformed. */
static int parse_ep_ranks(const char *s, scale_opts_t *sc)
{
    sc->n_ep = 0;
    while (*s) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 1 || errno || sc->n_ep == DL_GOLDEN_EP_MAX || (*end && *end != ','))
            return 1;
        sc->ep[sc->n_ep++] = v;
        s = *end ? end + 1 : end;
        if (*end && !*s)
            return 1;
    }
    return sc->n_ep == 0;
}

/* 0, or 1 after printing why arg is not a valid value of option ch. */
static int scale_option(int ch, const char *arg, scale_opts_t *sc)
{
    dl_case_tier_t t;
    switch (ch) {
    case O_STREAM: sc->stream = 1; return 0;
    case O_SLICES: sc->slices = 1; return 0;
    case O_POISON: sc->poison = 1; return 0;
    case O_LAYOUT:
        if (parse_layouts(arg, sc)) {
            fprintf(stderr, "dropless gen: --layout needs at most %d of masked:MAX_M, "
                            "contiguous:ALIGN, vllm-block:BLOCK, batched:MAX_TOKENS (positive "
                            "integers), not '%s'\n", DL_GOLDEN_LAYOUT_MAX, arg);
            return 1;
        }
        return 0;
    case O_IGNMEM: sc->ignore_memory = 1; return 0;
    case O_TIER:
        if (dl_case_tier_parse(arg, &t)) {
            fprintf(stderr, "dropless gen: --tier must be vectors, kernel or layer, not '%s'\n", arg);
            return 1;
        }
        sc->tier = (int)t;
        return 0;
    case O_EXPERTS:
        if (parse_experts(arg, &sc->ex_a, &sc->ex_b)) {
            fprintf(stderr, "dropless gen: --experts needs A:B with 0 <= A < B, not '%s'\n", arg);
            return 1;
        }
        return 0;
    case O_EPRANKS:
        if (parse_ep_ranks(arg, sc)) {
            fprintf(stderr, "dropless gen: --ep-ranks needs a comma-separated list of at most %d "
                            "positive rank counts, not '%s'\n", DL_GOLDEN_EP_MAX, arg);
            return 1;
        }
        return 0;
    default:
        return 1;
    }
}

/* DIR/NAME.h5, DIR/NAME.experts-A-B.h5 for a slice, or the --output path;
 * 1 if it does not fit. */
static int output_path(const char *output, const char *dir, const char *name,
                       const scale_opts_t *sc, char *path, size_t n)
{
    char suffix[64] = "";
    if (sc->ex_b > 0)
        snprintf(suffix, sizeof suffix, ".experts-%lld-%lld", (long long)sc->ex_a,
                 (long long)sc->ex_b);
    int w = output ? snprintf(path, n, "%s", output)
                   : snprintf(path, n, "%s/%s%s.h5", dir, name, suffix);
    return w < 0 || (size_t)w >= n;
}

static int exit_for(int rc)
{
    return rc == DL_EEXIST || rc == DL_EINVAL || rc == DL_ENOTFOUND || rc == DL_EFORMAT
               ? DL_EXIT_USAGE
               : DL_EXIT_FAIL;
}

typedef struct {
    const char *output, *dir, *config;
    const char *named[64];
    int nnamed;
    int force, all, quiet, no_backward, have_dtype, have_seed;
    dl_dtype_t dtype;
    uint64_t seed;
    scale_opts_t sc; /* --tier, --stream, --experts, --ignore-memory */
} gen_opts_t;

/* An option's value that needs checking; 0 or an exit status. */
static int gen_value(gen_opts_t *o, int ch, const char *arg)
{
    switch (ch) {
    case 'o':
    case 'd':
        if (!*arg) {
            fprintf(stderr, "dropless gen: %s needs a non-empty %s\n",
                    ch == 'o' ? "--output" : "--dir", ch == 'o' ? "path" : "directory");
            return DL_EXIT_USAGE;
        }
        *(ch == 'o' ? &o->output : &o->dir) = arg;
        return 0;
    case 'C': /* --case NAME: the same as a positional NAME */
        if (o->nnamed == (int)(sizeof o->named / sizeof o->named[0])) {
            fprintf(stderr, "dropless gen: too many --case options\n");
            return DL_EXIT_USAGE;
        }
        o->named[o->nnamed++] = arg;
        return 0;
    case 'D':
        if (dl_dtype_parse(arg, &o->dtype) || o->dtype == DL_F64) {
            fprintf(stderr, "dropless gen: --dtype must be fp32, bf16 or fp16, not '%s'\n", arg);
            return DL_EXIT_USAGE;
        }
        o->have_dtype = 1;
        return 0;
    default: { /* 'S': --seed */
        char *end;
        errno = 0;
        o->seed = strtoull(arg, &end, 0);
        if (!*arg || *end || *arg == '-' || isspace((unsigned char)*arg) || errno) {
            fprintf(stderr, "dropless gen: --seed needs an unsigned 64-bit integer, not '%s'%s\n",
                    arg, errno == ERANGE ? " (too large)" : "");
            return DL_EXIT_USAGE;
        }
        o->have_seed = 1;
        return 0;
    }
    }
}

/* The options; 0, -1 (--help printed) or an exit status. */
static int gen_parse(int argc, char **argv, gen_opts_t *o)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'}, {"dir", required_argument, NULL, 'd'},
        {"force", no_argument, NULL, 'f'},        {"config", required_argument, NULL, 'c'},
        {"all", no_argument, NULL, O_ALL},         {"dtype", required_argument, NULL, 'D'},
        {"seed", required_argument, NULL, 'S'},    {"no-backward", no_argument, NULL, O_NOBACK},
        {"quiet", no_argument, NULL, 'q'},        {"help", no_argument, NULL, 'h'},
        {"case", required_argument, NULL, 'C'},   {"tier", required_argument, NULL, O_TIER},
        {"stream", no_argument, NULL, O_STREAM},  {"experts", required_argument, NULL, O_EXPERTS},
        {"ignore-memory", no_argument, NULL, O_IGNMEM},
        {"ep-ranks", required_argument, NULL, O_EPRANKS}, {"slices", no_argument, NULL, O_SLICES},
        {"layout", required_argument, NULL, O_LAYOUT}, {"layout-poison", no_argument, NULL, O_POISON},
        {NULL, 0, NULL, 0}};
    memset(o, 0, sizeof *o);
    o->dir = ".";
    o->dtype = DL_F32;
    o->sc.tier = -1;
    opterr = 0;
    optind = 1;
    int ch, rc;
    while ((ch = getopt_long(argc, argv, ":o:d:fc:qh", opts, NULL)) != -1) {
        switch (ch) {
        case 'f': o->force = 1; break;
        case 'c': o->config = optarg; break;
        case 'q': o->quiet = 1; break;
        case 'h': gen_usage(stdout); return -1;
        case O_ALL: o->all = 1; break;
        case O_NOBACK: o->no_backward = 1; break;
        case O_STREAM: case O_IGNMEM: case O_TIER: case O_EXPERTS: case O_EPRANKS: case O_SLICES:
        case O_LAYOUT: case O_POISON:
            if (scale_option(ch, optarg, &o->sc))
                return DL_EXIT_USAGE;
            break;
        case 'o': case 'd': case 'C': case 'D': case 'S':
            if ((rc = gen_value(o, ch, optarg)))
                return rc;
            break;
        case ':':
            fprintf(stderr, "dropless gen: option '%s' needs a value\n", argv[optind - 1]);
            return DL_EXIT_USAGE;
        default:
            fprintf(stderr, "dropless gen: unknown option '%s' (try 'dropless gen --help')\n",
                    argv[optind - 1]);
            return DL_EXIT_USAGE;
        }
    }
    return 0;
}

/* The cases to write, in cases[] (*n of them): the case file, the names,
 * --all; --dtype and --seed applied, duplicates dropped. 0 or an exit
 * status. */
static int gen_cases(const gen_opts_t *o, int argc, char **argv, dl_case_t *cases, int *n)
{
    char err[512] = "";
    *n = 0;
    if (o->config) {
        if (dl_case_parse_file(o->config, &cases[*n], err, sizeof err)) {
            fprintf(stderr, "dropless gen: %s\n", err);
            return DL_EXIT_USAGE;
        }
        (*n)++;
    }
    for (int i = 0; i < o->nnamed + argc - optind; i++) {
        const char *name = i < o->nnamed ? o->named[i] : argv[optind + i - o->nnamed];
        if (dl_case_find(name, &cases[*n])) {
            fprintf(stderr, "dropless gen: unknown case '%s' (see 'dropless cases')\n", name);
            return DL_EXIT_USAGE;
        }
        (*n)++;
    }
    if (o->all)
        for (int i = 0; i < dl_case_count(); i++)
            if (!dl_case_get(i)->large)
                cases[(*n)++] = *dl_case_get(i);
    if (o->sc.tier >= 0)
        for (int i = 0; i < dl_case_count(); i++)
            if ((int)dl_case_get(i)->tier == o->sc.tier)
                cases[(*n)++] = *dl_case_get(i);
    for (int i = 0; i < *n; i++) {
        if (o->have_dtype && dl_case_set_dtype(&cases[i], o->dtype)) {
            fprintf(stderr, "dropless gen: case name too long for --dtype: %s\n", cases[i].name);
            return DL_EXIT_USAGE;
        }
        if (o->have_seed)
            cases[i].seed = o->seed;
    }
    /* --dtype may map two names onto one: keep the first */
    int m = 0;
    for (int i = 0; i < *n; i++) {
        int dup = 0;
        for (int j = 0; j < m; j++)
            dup |= strcmp(cases[j].name, cases[i].name) == 0;
        if (!dup)
            cases[m++] = cases[i];
    }
    *n = m;
    return 0;
}

/* The generator's options for the command's (the memory plan aside). */
static dl_golden_gen_opts_t gen_opts_of(const gen_opts_t *o, int mpi)
{
    dl_golden_gen_opts_t go = {o->force, o->no_backward, NULL, NULL, mpi ? 0 : o->sc.stream,
                               o->sc.ex_a, o->sc.ex_b, 0, {0}, 0, {0}, {0}, 0};
    go.n_ep_ranks = o->sc.n_ep;
    memcpy(go.ep_ranks, o->sc.ep, sizeof go.ep_ranks);
    go.n_layouts = o->sc.n_layout;
    go.layout_poison = o->sc.poison;
    memcpy(go.layout_kind, o->sc.layout_kind, sizeof go.layout_kind);
    memcpy(go.layout_param, o->sc.layout_param, sizeof go.layout_param);
    return go;
}

/* Generates and writes one case to path with the options planned for it;
 * 0 or an exit status. */
static int gen_one(const gen_opts_t *o, const dl_case_t *c, const char *path,
                   dl_golden_gen_opts_t go)
{
    char err[512] = "";
    dl_cli_progress_t pr;
    dl_cli_progress_init(&pr, c->name);
    if (!o->quiet && isatty(2)) {
        go.progress = dl_cli_progress_cb;
        go.progress_ctx = &pr;
    }
    int berr = 0;
    int r = dl_golden_gen_file(c, path, &go, &berr, err, sizeof err);
    dl_cli_progress_end(&pr);
    if (r) {
        fprintf(stderr, "dropless gen: %s\n", err[0] ? err : dl_strerror(r));
        return exit_for(r);
    }
    if (berr)
        fprintf(stderr, "dropless gen: warning: %s: backward pass failed (%s): "
                        "written without /backward\n", c->name, dl_strerror(berr));
    if (!o->quiet) {
        struct stat st;
        char sz[32];
        human(stat(path, &st) == 0 ? (int64_t)st.st_size : -1, sz, sizeof sz);
        printf("wrote %s (%s)\n", path, sz);
    }
    return 0;
}

/* One case over the MPI processes (gen_mpi.c); 0 or an exit status. */
static int gen_one_mpi(const gen_opts_t *o, const dl_case_t *c, const char *path, int rank)
{
    dl_golden_gen_opts_t go = gen_opts_of(o, 1);
    char written[4096];
    int rc = dl_cli_gen_mpi(c, path, o->sc.slices ? o->dir : NULL, &go, written, sizeof written);
    if (rc == 0 && (rank == 0 || o->sc.slices) && !o->quiet) {
        struct stat st;
        char sz[32];
        human(stat(written, &st) == 0 ? (int64_t)st.st_size : -1, sz, sizeof sz);
        printf("wrote %s (%s, rank %d of %d)\n", written, sz, rank, dl_cli_mpi_size());
    }
    return rc;
}

/* The file this process writes for case c: path, or under mpirun with
 * --slices its rank's slice (the name gen_mpi.c gives it), or none (mpirun
 * ranks but 0 without --slices): 0, or 1 if it does not fit. */
static int own_output(const gen_opts_t *o, const dl_case_t *c, int mpi, int rank, char *path,
                      size_t n)
{
    if (!mpi || !o->sc.slices)
        return mpi && rank ? (*path = 0, 0) : output_path(o->output, o->dir, c->name, &o->sc, path, n);
    const int64_t R = dl_cli_mpi_size(), per = c->config.route.experts / R;
    scale_opts_t sc = o->sc;
    sc.ex_a = rank * per;
    sc.ex_b = (rank + 1) * per;
    return output_path(NULL, o->dir, c->name, &sc, path, n);
}

/* What mpirun refuses for every case alike (gen_mpi.c says it again per
 * case): 0, or 1 after rank 0 said why. */
static int mpi_refuses(const gen_opts_t *o, const dl_case_t *c, int rank)
{
    const int R = dl_cli_mpi_size();
    const long long E = (long long)c->config.route.experts;
    if (o->sc.ex_b > 0) {
        if (rank == 0)
            fprintf(stderr, "dropless gen: --experts is not supported under mpirun (each rank "
                            "computes its experts; --slices writes each rank's slice)\n");
        return 1;
    }
    if (E % R) {
        if (rank == 0)
            fprintf(stderr, "dropless gen: case %s: mpirun -np %d: the process count must divide "
                            "the %lld experts (each rank owns E/R of them)\n", c->name, R, E);
        return 1;
    }
    return 0;
}

/* Every case and option checked against every other before the first
 * write: each case's configuration, --ep-ranks, --experts and memory plan
 * (into go[i]), under mpirun the process count; then every output reserved
 * (never the case file, never one path twice). 0 or an exit status. */
static int gen_prepare(const gen_opts_t *o, const dl_case_t *cases, int n, int mpi, int rank,
                       dl_golden_gen_opts_t *go)
{
    char err[512] = "", path[4096];
    if (o->config)
        dl_golden_output_input(o->config);
    if (o->sc.poison && !o->sc.n_layout) {
        if (rank == 0)
            fprintf(stderr, "dropless gen: --layout-poison needs --layout\n");
        return DL_EXIT_USAGE;
    }
    if (mpi && (o->sc.n_layout || o->sc.poison)) {
        if (rank == 0)
            fprintf(stderr, "dropless gen: --layout is not supported under mpirun (generate the "
                            "layouts with one process)\n");
        return DL_EXIT_USAGE;
    }
    for (int i = 0; i < n; i++) {
        go[i] = gen_opts_of(o, mpi);
        if (dl_golden_gen_check(&cases[i], &go[i], err, sizeof err)) {
            if (rank == 0)
                fprintf(stderr, "dropless gen: %s\n", err);
            return DL_EXIT_USAGE;
        }
        if (mpi ? mpi_refuses(o, &cases[i], rank) : plan_memory(&cases[i], &go[i], o->sc.ignore_memory))
            return DL_EXIT_USAGE;
    }
    for (int i = 0; i < n; i++) {
        if (own_output(o, &cases[i], mpi, rank, path, sizeof path)) {
            fprintf(stderr, "dropless gen: output path too long\n");
            return DL_EXIT_USAGE;
        }
        if (*path && dl_golden_output_reserve(path, o->force, err, sizeof err)) {
            fprintf(stderr, "dropless gen: %s\n", err);
            return DL_EXIT_USAGE;
        }
    }
    return 0;
}

int dl_cli_gen(int argc, char **argv)
{
    gen_opts_t o;
    int rc = gen_parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? DL_EXIT_OK : rc;
    int n = 0, cap = argc + o.nnamed + 2 * dl_case_count() + 1; /* --all and --tier */
    dl_case_t *cases = calloc((size_t)cap, sizeof *cases);
    dl_golden_gen_opts_t *go = calloc((size_t)cap, sizeof *go);
    if (!cases || !go) {
        free(cases);
        free(go);
        fprintf(stderr, "dropless gen: out of memory\n");
        return DL_EXIT_FAIL;
    }
    if ((rc = gen_cases(&o, argc, argv, cases, &n)))
        goto done;
    rc = DL_EXIT_USAGE;
    if (n == 0) {
        fprintf(stderr, "dropless gen: no case given (try 'dropless gen --help')\n");
        goto done;
    }
    if (o.output && n > 1) {
        fprintf(stderr, "dropless gen: --output takes one case, %d given (use --dir)\n", n);
        goto done;
    }
    /* under mpirun: every process runs each case, rank 0 writes it */
    int mpi = dl_cli_mpi_size() > 1, mrank = 0;
    if (o.sc.slices && (!mpi || o.output)) {
        fprintf(stderr, "dropless gen: --slices %s\n", mpi ? "writes one file per rank into --dir, "
                "not --output" : "needs mpirun (for one slice: --experts A:B)");
        goto done;
    }
    if (mpi && (rc = dl_cli_gen_mpi_begin(&mrank)))
        goto done;
    rc = gen_prepare(&o, cases, n, mpi, mrank, go);
    if (mpi)
        rc = dl_cli_gen_mpi_agree(rc); /* every rank refuses if one does */
    for (int i = 0; i < n && rc == DL_EXIT_OK; i++) {
        char path[4096];
        if (output_path(o.output, o.dir, cases[i].name, &o.sc, path, sizeof path)) {
            fprintf(stderr, "dropless gen: output path too long\n");
            rc = DL_EXIT_USAGE;
            break;
        }
        rc = mpi ? gen_one_mpi(&o, &cases[i], path, mrank) : gen_one(&o, &cases[i], path, go[i]);
    }
    if (mpi)
        dl_cli_gen_mpi_end();
done:
    free(cases);
    free(go);
    return rc;
}

/* ---------------------------------------------------------------- cases */

static void cases_usage(FILE *f)
{
    fprintf(f,
            "usage: dropless cases [--tier vectors|kernel|layer] [--names] [--verbose]\n"
            "Lists the catalogue: name, shapes (T tokens, d hidden, f ffn, E experts, k top-k),\n"
            "routing, dtype and the file's data size; 'on demand' marks the kernel-scale and\n"
            "layer-scale cases that 'dropless gen --all' and vectors/ leave out.\n"
            "  --tier T    only the cases of tier T\n"
            "  --names     names only\n"
            "  --verbose   add each case's description\n");
}

int dl_cli_cases(int argc, char **argv)
{
    int names = 0, verbose = 0, tier = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tier")) {
            dl_case_tier_t t;
            if (i + 1 >= argc || dl_case_tier_parse(argv[i + 1], &t)) {
                fprintf(stderr, "dropless cases: --tier needs vectors, kernel or layer\n");
                return DL_EXIT_USAGE;
            }
            tier = (int)t;
            i++;
        } else if (!strcmp(argv[i], "--names"))
            names = 1;
        else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v"))
            verbose = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            cases_usage(stdout);
            return DL_EXIT_OK;
        } else {
            fprintf(stderr, "dropless cases: unknown argument '%s'\n", argv[i]);
            return DL_EXIT_USAGE;
        }
    }
    for (int i = 0; i < dl_case_count(); i++) {
        const dl_case_t *c = dl_case_get(i);
        if (tier >= 0 && (int)c->tier != tier)
            continue;
        if (names) {
            printf("%s\n", c->name);
            continue;
        }
        const dl_moe_config_t *k = &c->config;
        const dl_route_config_t *r = &k->route;
        char route[64], sz[32];
        const char *gs = r->group_score == DL_GROUP_MAX ? "max"
                         : r->group_score == DL_GROUP_TOP2_SUM ? "top2_sum" : "topk_sum";
        const char *bias = r->has_bias ? (r->has_router_bias ? "+bias+logit_bias" : "+bias")
                                       : (r->has_router_bias ? "+logit_bias" : "");
        if (r->n_group > 1)
            snprintf(route, sizeof route, "%s%s g%" PRId64 "/%" PRId64 ":%s",
                     dl_route_score_name(r->score_fn), bias, r->n_group, r->topk_group, gs);
        else
            snprintf(route, sizeof route, "%s%s%s", dl_route_score_name(r->score_fn), bias,
                     r->weight_on_input ? "@input" : r->hash_vocab > 0 ? "@hash" : "");
        if (r->zero_experts > 0) /* LongCat-Flash's identity experts */
            snprintf(route + strlen(route), sizeof route - strlen(route), "+z%" PRId64,
                     r->zero_experts);
        human(dl_case_data_bytes(c), sz, sizeof sz);
        char sh[64] = ""; /* the shared experts: S x f_s, gated or not */
        if (k->shared_experts > 0)
            snprintf(sh, sizeof sh, "  shared %" PRId64 "x%" PRId64 "%s", k->shared_experts,
                     k->shared_ffn, k->shared_gate ? " gated" : "");
        char var[96] = ""; /* the FFN variants' keys, where a case has them */
        size_t vl = 0;
        if (k->ffn_kind == DL_FFN_SWIGLU_CLAMP)
            vl += (size_t)snprintf(var + vl, sizeof var - vl, "  alpha %g limit %g", k->act_alpha,
                                   k->act_limit);
        if (k->ffn_bias && vl < sizeof var)
            vl += (size_t)snprintf(var + vl, sizeof var - vl, "  ffn_bias");
        if (k->router_dtype != DL_F32 && vl < sizeof var)
            snprintf(var + vl, sizeof var - vl, "  router %s", dl_dtype_name(k->router_dtype));
        printf("%-24s T=%-5" PRId64 " d=%-5" PRId64 " f=%-6" PRId64 " E=%-4" PRId64
               " k=%-2" PRId64 " %-28s %-6s %s %-4s %9s%s%s%s\n",
               c->name, k->tokens, k->hidden, k->ffn, r->experts, r->top_k, route,
               dl_ffn_name(k->ffn_kind), dl_dtype_name(k->dtype),
               r->renormalize ? "norm" : "", sz,
               c->tier == DL_TIER_KERNEL  ? "  on demand (kernel)"
               : c->tier == DL_TIER_LAYER ? "  on demand (layer)"
                                          : "",
               sh, var);
        if (verbose)
            printf("    %s\n", c->description);
    }
    return DL_EXIT_OK;
}

/* ----------------------------------------------------------------- info */

static void info_usage(FILE *f)
{
    fprintf(f,
            "usage: dropless info FILE...\n"
            "       dropless info --layout [--json]   the format's arrays (one table)\n"
            "Validates each golden file (types, shapes, dtype grids, ranges) and prints its\n"
            "case, configuration and datasets. A file that fails validation: one line on\n"
            "stderr naming the file and the dataset, exit status 2.\n");
}

int dl_cli_info(int argc, char **argv)
{
    int nfiles = 0, rc = DL_EXIT_OK;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--layout"))
            return dl_cli_layout(argc, argv);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            info_usage(stdout);
            return DL_EXIT_OK;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "dropless info: unknown option '%s'\n", argv[i]);
            return DL_EXIT_USAGE;
        }
    }
    for (int i = 1; i < argc; i++) {
        nfiles++;
        dl_golden_file_t g;
        char err[512];
        if (dl_golden_load_isolated(argv[i], NULL, dl_cli_preflight_seconds(), &g, err, sizeof err)) {
            fprintf(stderr, "dropless info: %s\n", err);
            rc = DL_EXIT_USAGE;
            continue;
        }
        char cfg[1024];
        dl_golden_config_string(&g.config, "\n    ", cfg, sizeof cfg);
        printf("%s\n  format: %s version %" PRId64 ", written by %s\n  seal: %s\n"
               "  case: %s (seed %" PRIu64 ")\n  config:\n    %s\n",
               argv[i], g.format, g.format_version, g.generator,
               g.sealed ? "SHA-256 verified"
                        : "unsealed (no SHA-256 seal: the file is not protected against damage)",
               g.case_name, g.seed, cfg);
        int has[3] = {g.has_inputs, g.has_forward, g.has_backward};
        static const char *const gn[] = {"/inputs", "/forward", "/backward"};
        int cur = -1;
        for (int j = 0; j < dl_golden_dataset_count(); j++) {
            const dl_golden_dataset_t *ds = dl_golden_dataset(j);
            if ((int)ds->group != cur) {
                cur = ds->group;
                printf("  %s%s\n", gn[cur], has[cur] ? "" : ": absent");
            }
            if (!has[cur] || !dl_golden_dataset_applies(ds, &g.config))
                continue;
            int64_t dims[3];
            dl_golden_dataset_shape(ds, &g.config, dims);
            char shape[96];
            int w = snprintf(shape, sizeof shape, "[");
            for (int d = 0; d < ds->rank; d++)
                w += snprintf(shape + w, sizeof shape - (size_t)w, d ? ",%" PRId64 : "%" PRId64, dims[d]);
            snprintf(shape + w, sizeof shape - (size_t)w, "]");
            const char *ty = ds->elem == DL_GOLDEN_INT32 ? "int32"
                             : ds->elem == DL_GOLDEN_INT64 ? "int64" : "float32";
            char grid[32] = "";
            if (ds->elem == DL_GOLDEN_FLOAT)
                snprintf(grid, sizeof grid, "%s values", dl_dtype_name(dl_golden_dataset_dtype(ds, &g.config)));
            printf("    %-16s %-8s %-18s %s\n", ds->name, ty, shape, grid);
        }
        dl_golden_free(&g);
    }
    if (nfiles == 0) {
        fprintf(stderr, "dropless info: no file given (try 'dropless info --help')\n");
        return DL_EXIT_USAGE;
    }
    return rc;
}
