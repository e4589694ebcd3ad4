/* dropless capacity: what capacity-factor routing drops and pads, against a
 * dropless layer (doc/capacity.md). The numbers are the library's
 * (dl_capacity_*); this file parses options, lays out the table and the
 * JSON, and hands the JSON to a small matplotlib script for --plot. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "dropless.h"
#include "cli.h"

#define ME "dropless capacity"
#define MAX_CF 1000
#define MAX_LIST 32
#define WASTE_MARK 0.30 /* the founding paper's "up to 30% ... on padded zeros" */
static const int64_t tile[] = {1, 64, 128};

/* The plotting script (tools/capacity_plot.py), as a C string. */
static const char plot_script[] =
#include "src/cli/capacity_plot.inc"
    ;

typedef struct {
    const char *kind; /* "case", "uniform", "zipf" */
    double s;
} routing_opt_t;

typedef struct {
    double cf[MAX_CF];
    int ncf;
    dl_drop_policy_t policy[3];
    int npolicy;
    dl_capacity_rule_t rule;
    routing_opt_t routing[MAX_LIST];
    int nrouting;
    int64_t tokens[MAX_LIST];
    int ntokens;
    const char *json, *plot, *input;
    int drops, force, quiet;
} opts_t;

/* One routing at one T: its rows. */
typedef struct {
    routing_opt_t how;
    dl_moe_config_t config;
    dl_capacity_routing_t r;
    dl_capacity_row_t *rows; /* [ncf * npolicy] */
    dl_capacity_cost_t dropless[3];
    int64_t c30;
    double cf30;
} series_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dropless capacity [options] CASE|GOLDEN.h5|CASEFILE\n"
            "What capacity-factor routing drops and pads, against dropless (doc/capacity.md).\n"
            "      --cf LIST       capacity factors, comma-separated; A:B:STEP is a range\n"
            "                      (default 1,1.25,1.5,2,4)\n"
            "      --policy LIST   drop policies: position, probs, slot (default position,probs)\n"
            "      --rule R        gshard: C = ceil(cf*T*k/E) (default); megatron: the same\n"
            "                      in binary64 as Megatron-Core evaluates it\n"
            "      --routing LIST  case (default: the case's router, a golden's topk_ids),\n"
            "                      uniform, zipf:S (popularity ~ (e+1)^-S)\n"
            "      --tokens LIST   token counts to sweep (default: the case's)\n"
            "      --drops         list the dropped (t, j) under each row\n"
            "      --json FILE     write the results as JSON ('-': stdout)\n"
            "      --plot FILE     draw FILE.png or FILE.svg (matplotlib)\n"
            "  -f, --force         overwrite existing --json/--plot files\n"
            "  -q, --quiet         no table on stdout\n"
            "  -h, --help          this text\n");
}

/* ------------------------------------------------------------- options */

static int bad(const char *what, const char *v)
{
    fprintf(stderr, ME ": %s, not '%s'\n", what, v);
    return DL_EXIT_USAGE;
}

static int parse_num(const char *s, double *v)
{
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return !*s || *end || errno || !isfinite(*v) ? -1 : 0;
}

static int cf_ok(double v)
{
    return v > 0 && v <= DL_CAPACITY_CF_MAX;
}

/* One --cf item: a number or A:B:STEP. */
static int add_cf(opts_t *o, char *item)
{
    const char *what = "--cf takes numbers in (0, 65536] or ranges A:B:STEP";
    char *c1 = strchr(item, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    double a, b, s;
    if (!c1) {
        if (parse_num(item, &a) || !cf_ok(a) || o->ncf == MAX_CF)
            return bad(what, item);
        o->cf[o->ncf++] = a;
        return 0;
    }
    if (!c2)
        return bad(what, item);
    *c1 = *c2 = 0;
    int err = parse_num(item, &a) || parse_num(c1 + 1, &b) || parse_num(c2 + 1, &s);
    *c1 = *c2 = ':';
    if (err || !cf_ok(a) || !cf_ok(b) || b < a || !(s > 0) || (b - a) / s >= MAX_CF - o->ncf)
        return bad(what, item);
    for (int64_t i = 0; a + (double)i * s <= b * (1 + 1e-12); i++)
        o->cf[o->ncf++] = a + (double)i * s;
    return 0;
}

static int add_routing(opts_t *o, const char *v)
{
    routing_opt_t r = {v, 0};
    const char *what = "--routing takes case, uniform or zipf:S with S in [0, 16]";
    if (o->nrouting == MAX_LIST)
        return bad(what, v);
    if (strncmp(v, "zipf", 4) == 0 && (v[4] == 0 || v[4] == ':')) {
        r.kind = "zipf";
        r.s = 1.2;
        if (v[4] == ':' && (parse_num(v + 5, &r.s) || r.s < 0 || r.s > 16))
            return bad(what, v);
    } else if (strcmp(v, "case") == 0 || strcmp(v, "uniform") == 0) {
        r.kind = strcmp(v, "case") == 0 ? "case" : "uniform";
    } else {
        return bad(what, v);
    }
    o->routing[o->nrouting++] = r;
    return 0;
}

static int add_item(opts_t *o, int opt, char *v)
{
    switch (opt) {
    case 'c':
        return add_cf(o, v);
    case 'p': {
        dl_drop_policy_t p;
        if (dl_drop_policy_parse(v, &p))
            return bad("--policy takes position, probs or slot", v);
        for (int i = 0; i < o->npolicy; i++)
            if (o->policy[i] == p)
                return 0;
        o->policy[o->npolicy++] = p;
        return 0;
    }
    case 'r':
        return add_routing(o, v);
    default: {
        char *end;
        errno = 0;
        long long t = strtoll(v, &end, 10);
        if (!*v || *end || errno || t < 0 || t > INT32_MAX || o->ntokens == MAX_LIST)
            return bad("--tokens takes token counts (integers >= 0)", v);
        o->tokens[o->ntokens++] = t;
        return 0;
    }
    }
}

/* A comma-separated list of items for option opt; an empty item is an error. */
static int add_list(opts_t *o, int opt, const char *list)
{
    char buf[4096];
    if (strlen(list) >= sizeof buf)
        return bad("option value too long", "...");
    strcpy(buf, list);
    for (char *it = buf, *next; it; it = next) {
        next = strchr(it, ',');
        if (next)
            *next++ = 0;
        if (!*it)
            return bad("empty item in the list", list);
        if (add_item(o, opt, it))
            return DL_EXIT_USAGE;
    }
    return 0;
}

/* 0 to go on, else the exit status. */
static int parse(int argc, char **argv, opts_t *o)
{
    enum { O_JSON = 256, O_PLOT, O_RULE, O_DROPS };
    static const struct option lo[] = {
        {"cf", required_argument, NULL, 'c'},      {"policy", required_argument, NULL, 'p'},
        {"routing", required_argument, NULL, 'r'}, {"tokens", required_argument, NULL, 't'},
        {"rule", required_argument, NULL, O_RULE}, {"drops", no_argument, NULL, O_DROPS},
        {"json", required_argument, NULL, O_JSON}, {"plot", required_argument, NULL, O_PLOT},
        {"force", no_argument, NULL, 'f'},         {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    opterr = 0;
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, ":fqh", lo, NULL)) != -1) {
        int rc = 0;
        switch (ch) {
        case 'c': case 'p': case 'r': case 't': rc = add_list(o, ch, optarg); break;
        case O_RULE:
            if (dl_capacity_rule_parse(optarg, &o->rule))
                rc = bad("--rule takes gshard or megatron", optarg);
            break;
        case O_DROPS: o->drops = 1; break;
        case O_JSON: o->json = optarg; break;
        case O_PLOT: o->plot = optarg; break;
        case 'f': o->force = 1; break;
        case 'q': o->quiet = 1; break;
        case 'h': usage(stdout); return DL_EXIT_OK;
        case ':':
            fprintf(stderr, ME ": option '%s' needs a value\n", argv[optind - 1]);
            return DL_EXIT_USAGE;
        default:
            fprintf(stderr, ME ": unknown option '%s' (try 'dropless capacity --help')\n",
                    argv[optind - 1]);
            return DL_EXIT_USAGE;
        }
        if (rc)
            return rc;
    }
    if (argc - optind != 1) {
        fprintf(stderr, ME ": give one CASE, GOLDEN.h5 or CASEFILE (try 'dropless capacity --help')\n");
        return DL_EXIT_USAGE;
    }
    o->input = argv[optind];
    if (o->plot) {
        const char *dot = strrchr(o->plot, '.');
        if (!dot || (strcmp(dot, ".png") != 0 && strcmp(dot, ".svg") != 0))
            return bad("--plot needs a file name ending in .png or .svg", o->plot);
    }
    return -1;
}

static void defaults(opts_t *o)
{
    static const double cf[] = {1.0, 1.25, 1.5, 2.0, 4.0};
    if (o->ncf == 0)
        for (int i = 0; i < 5; i++)
            o->cf[o->ncf++] = cf[i];
    if (o->npolicy == 0) {
        o->policy[o->npolicy++] = DL_DROP_POSITION;
        o->policy[o->npolicy++] = DL_DROP_PROBS;
    }
    if (o->nrouting == 0)
        o->routing[o->nrouting++] = (routing_opt_t){"case", 0};
}

/* ----------------------------------------------------------- the input */

typedef struct {
    dl_case_t c;
    int golden;          /* the input is a golden file: its routing is its topk_ids */
    int catalogue;       /* the input is a catalogue case, no file */
    dl_golden_file_t g;
} input_t;

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static int load_input(const char *arg, input_t *in)
{
    char err[512];
    memset(in, 0, sizeof *in);
    if (dl_case_find(arg, &in->c) == 0) {
        in->catalogue = 1;
        return 0;
    }
    if (has_suffix(arg, ".h5") || has_suffix(arg, ".hdf5")) {
        /* parsed in a child process first unless sealed: HDF5 can hang or
         * crash on a damaged file (doc/cli.md, "Untrusted files") */
        if (dl_golden_load_isolated(arg, NULL, dl_cli_preflight_seconds(), &in->g, err, sizeof err)) {
            fprintf(stderr, ME ": %s\n", err);
            return DL_EXIT_USAGE;
        }
        if (!in->g.has_forward) {
            fprintf(stderr, ME ": %s: no /forward group (no routing to analyse)\n", arg);
            return DL_EXIT_USAGE;
        }
        in->golden = 1;
        snprintf(in->c.name, sizeof in->c.name, "%s", in->g.case_name);
        in->c.description = "";
        in->c.config = in->g.config;
        in->c.seed = in->g.seed;
        return 0;
    }
    if (access(arg, F_OK) != 0) {
        fprintf(stderr, ME ": unknown case '%s' and no such file (see 'dropless cases')\n", arg);
        return DL_EXIT_USAGE;
    }
    if (dl_case_parse_file(arg, &in->c, err, sizeof err)) {
        fprintf(stderr, ME ": %s\n", err);
        return DL_EXIT_USAGE;
    }
    return 0;
}

/* ------------------------------------------------------------- compute */

static int route(const input_t *in, const routing_opt_t *how, int64_t T, series_t *s)
{
    s->how = *how;
    s->config = in->c.config;
    s->config.tokens = T;
    if (strcmp(how->kind, "case") == 0 && in->golden)
        return dl_capacity_route_golden(&in->g, &s->r);
    dl_case_t c = in->c;
    c.config.tokens = T;
    if (strcmp(how->kind, "case") != 0) {
        /* popularity from the offsets alone: a random selection bias is a
         * popularity skew of its own (DeepSeek-V3's tunes it to balance) */
        c.inputs = DL_INPUTS_ZIPF;
        c.zipf_s = how->s;
        c.config.route.has_bias = 0;
    }
    return dl_capacity_route_case(&c, &s->r);
}

static int compute(const opts_t *o, series_t *s)
{
    int rc = 0, n = o->ncf * o->npolicy;
    s->rows = calloc((size_t)n, sizeof *s->rows);
    if (!s->rows)
        return DL_ENOMEM;
    for (int i = 0; i < n && !rc; i++)
        rc = dl_capacity_analyze(&s->config, s->r.ids, s->r.prob, o->rule, o->cf[i / o->npolicy],
                                 o->policy[i % o->npolicy], &s->rows[i]);
    for (int b = 0; b < 3 && !rc; b++)
        rc = dl_capacity_dropless(&s->config, s->r.group_sizes, tile[b], &s->dropless[b]);
    if (!rc)
        rc = dl_capacity_waste_threshold(&s->config, s->r.group_sizes, WASTE_MARK, &s->c30,
                                         &s->cf30);
    return rc;
}

static void series_free(series_t *s, int nrows)
{
    for (int i = 0; s->rows && i < nrows; i++)
        dl_capacity_row_free(&s->rows[i]);
    free(s->rows);
    dl_capacity_routing_free(&s->r);
}

/* ---------------------------------------------------------------- text */

static void human_bytes(int64_t b, char *buf, size_t n)
{
    if (b < 10 * 1024)
        snprintf(buf, n, "%" PRId64 " B", b);
    else if (b < 10 * 1024 * 1024)
        snprintf(buf, n, "%.1f KiB", (double)b / 1024);
    else if (b < INT64_C(10) * 1024 * 1024 * 1024)
        snprintf(buf, n, "%.1f MiB", (double)b / (1024 * 1024));
    else
        snprintf(buf, n, "%.1f GiB", (double)b / (1024.0 * 1024 * 1024));
}

static void print_cost(const dl_capacity_cost_t *c)
{
    char mem[32];
    human_bytes(c->extra_bytes, mem, sizeof mem);
    printf(" %9" PRId64 " %6.2f%%  %9.3g/%-9.3g %10s\n", c->padded_rows, 100.0 * c->waste,
           (double)c->waste_flops_fwd, (double)c->waste_flops_bwd, mem);
}

static void print_drops(const dl_capacity_row_t *r, int64_t k)
{
    for (int64_t i = 0; i < r->dropped; i++)
        printf("%s(%" PRId64 ",%" PRId64 ")%s", i % 10 == 0 ? "      dropped (t,j): " : " ",
               (int64_t)r->dropped_at[i] / k, (int64_t)r->dropped_at[i] % k,
               i % 10 == 9 || i == r->dropped - 1 ? "\n" : "");
}

static void print_loads(const series_t *s)
{
    const int64_t E = s->r.experts;
    int64_t mx = 0, mn = INT64_MAX, N = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t n = s->r.group_sizes[e];
        mx = n > mx ? n : mx, mn = n < mn ? n : mn, N += n;
    }
    printf("  expert loads: min %" PRId64 ", mean %.2f, max %" PRId64 " (max/mean %.2f)", mn,
           (double)N / (double)E, mx, N ? (double)mx * (double)E / (double)N : 0.0);
    for (int64_t e = 0; E <= 16 && e < E; e++)
        printf("%s%" PRId64, e ? " " : ": ", s->r.group_sizes[e]);
    printf("\n");
}

static void print_series(const opts_t *o, const input_t *in, const series_t *s)
{
    const dl_moe_config_t *c = &s->config;
    printf("\n%s, routing %s", in->c.name, s->how.kind);
    if (strcmp(s->how.kind, "zipf") == 0)
        printf(" (s = %g)", s->how.s);
    printf(": T = %" PRId64 ", k = %" PRId64 ", E = %" PRId64 ", d = %" PRId64 ", f = %" PRId64
           " (%s, %s)\n", c->tokens, c->route.top_k, c->route.experts, c->hidden, c->ffn,
           dl_ffn_name(c->ffn_kind), dl_dtype_name(c->dtype));
    print_loads(s);
    printf("  %-12s %7s %-9s %8s %7s %6s %7s %9s %7s  %-19s %10s\n", "cf", "C", "policy",
           "dropped", "drop%", "all-k", "mass%", "padded", "waste%", "waste FLOP fwd/bwd",
           "extra mem");
    for (int i = 0; i < o->ncf * o->npolicy; i++) {
        const dl_capacity_row_t *r = &s->rows[i];
        printf("  %-12.4g %7" PRId64 " %-9s %8" PRId64 " %6.2f%% %6" PRId64 " %6.2f%%", r->cf,
               r->capacity, dl_drop_policy_name(r->policy), r->dropped, r->dropped_pct,
               r->tokens_all_dropped, r->dropped_mass_pct);
        print_cost(&r->cost);
        if (o->drops)
            print_drops(r, c->route.top_k);
    }
    for (int b = 0; b < 3; b++) {
        char name[32];
        snprintf(name, sizeof name, b ? "dropless/%" PRId64 : "dropless", tile[b]);
        printf("  %-12s %7s %-9s %8d %6.2f%% %6d %6.2f%%", name, "-", "-", 0, 0.0, 0, 0.0);
        print_cost(&s->dropless[b]);
    }
    if (s->c30 > 0)
        printf("  padding reaches %.0f%% of the expert rows from C = %" PRId64
               ", i.e. for every cf > %.4g (rule gshard)\n", 100 * WASTE_MARK, s->c30, s->cf30);
}

static void print_table(const opts_t *o, const input_t *in, const series_t *s, int ns)
{
    printf("dropless capacity: %s%s; capacity rule %s: %s; padded rows: fixed [E, C] buffers\n",
           in->golden ? "golden file " : "case ", in->golden ? o->input : in->c.name,
           dl_capacity_rule_name(o->rule),
           o->rule == DL_CAPACITY_GSHARD ? "C = ceil(cf*T*k/E)" : "C = ceil(fl(fl(T*k/E)*cf))");
    printf("dropped = assignments over capacity; all-k = tokens with every slot dropped; "
           "mass = router probability dropped\n");
    for (int i = 0; i < ns; i++)
        print_series(o, in, &s[i]);
}

/* ---------------------------------------------------------------- JSON */

/* A double as JSON: the shortest of %.15g/%.17g that reads back, null if
 * not finite. */
static void jnum(FILE *f, double v)
{
    char buf[40];
    if (!isfinite(v)) {
        fputs("null", f);
        return;
    }
    snprintf(buf, sizeof buf, "%.15g", v);
    if (strtod(buf, NULL) != v)
        snprintf(buf, sizeof buf, "%.17g", v);
    fputs(buf, f);
}

static void jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void jcost(FILE *f, const dl_capacity_cost_t *c)
{
    fprintf(f, "\"rows\": %" PRId64 ", \"padded_rows\": %" PRId64 ", \"waste_pct\": ", c->rows,
            c->padded_rows);
    jnum(f, 100.0 * c->waste);
    fprintf(f, ", \"flops_fwd\": %" PRId64 ", \"flops_bwd\": %" PRId64
            ", \"waste_flops_fwd\": %" PRId64 ", \"waste_flops_bwd\": %" PRId64
            ", \"extra_bytes\": %" PRId64, c->flops_fwd, c->flops_bwd, c->waste_flops_fwd,
            c->waste_flops_bwd, c->extra_bytes);
}

static void jrow(FILE *f, const dl_capacity_row_t *r, int64_t k)
{
    fputs("{\"cf\": ", f);
    jnum(f, r->cf);
    fprintf(f, ", \"capacity\": %" PRId64 ", \"policy\": \"%s\", \"assignments\": %" PRId64
            ", \"dropped\": %" PRId64 ", \"dropped_pct\": ", r->capacity,
            dl_drop_policy_name(r->policy), r->assignments, r->dropped);
    jnum(f, r->dropped_pct);
    fprintf(f, ", \"tokens_all_dropped\": %" PRId64 ", \"dropped_mass_pct\": ",
            r->tokens_all_dropped);
    jnum(f, r->dropped_mass_pct);
    fputs(", ", f);
    jcost(f, &r->cost);
    fputs(", \"dropped_at\": [", f);
    for (int64_t i = 0; i < r->dropped; i++)
        fprintf(f, "%s[%" PRId64 ", %" PRId64 "]", i ? ", " : "", (int64_t)r->dropped_at[i] / k,
                (int64_t)r->dropped_at[i] % k);
    fputs("]}", f);
}

static void jseries(FILE *f, const opts_t *o, const series_t *s)
{
    const dl_moe_config_t *c = &s->config;
    fputs("{\"routing\": ", f);
    jstr(f, s->how.kind);
    fputs(", \"zipf_s\": ", f);
    jnum(f, strcmp(s->how.kind, "zipf") == 0 ? s->how.s : NAN);
    fprintf(f, ", \"tokens\": %" PRId64 ", \"top_k\": %" PRId64 ", \"experts\": %" PRId64
            ", \"group_sizes\": [", c->tokens, c->route.top_k, c->route.experts);
    for (int64_t e = 0; e < c->route.experts; e++)
        fprintf(f, "%s%" PRId64, e ? ", " : "", s->r.group_sizes[e]);
    fputs("],\n  \"capacity_rows\": [\n", f);
    for (int i = 0; i < o->ncf * o->npolicy; i++) {
        fputs(i ? ",\n   " : "   ", f);
        jrow(f, &s->rows[i], c->route.top_k);
    }
    fputs("],\n  \"dropless_rows\": [\n", f);
    for (int b = 0; b < 3; b++) {
        fprintf(f, "%s{\"block\": %" PRId64 ", \"dropped\": 0, ", b ? ",\n   " : "   ", tile[b]);
        jcost(f, &s->dropless[b]);
        fputs("}", f);
    }
    fputs("],\n  \"waste_mark\": {\"fraction\": ", f);
    jnum(f, WASTE_MARK);
    fputs(", \"capacity\": ", f);
    if (s->c30 > 0)
        fprintf(f, "%" PRId64, s->c30);
    else
        fputs("null", f);
    fputs(", \"cf_above\": ", f);
    jnum(f, s->cf30);
    fputs("}}", f);
}

static void write_json(FILE *f, const opts_t *o, const input_t *in, const series_t *s, int ns)
{
    const dl_moe_config_t *c = &in->c.config;
    fputs("{\"tool\": \"dropless capacity\", \"version\": \"" DL_VERSION_STRING "\", \"input\": ", f);
    jstr(f, o->input);
    fputs(", \"case\": ", f);
    jstr(f, in->c.name);
    fprintf(f, ", \"golden\": %s, \"rule\": \"%s\",\n \"layer\": {\"hidden\": %" PRId64
            ", \"ffn\": %" PRId64 ", \"ffn_kind\": \"%s\", \"dtype\": \"%s\", \"experts\": %" PRId64
            ", \"top_k\": %" PRId64 "},\n \"series\": [\n ",
            in->golden ? "true" : "false", dl_capacity_rule_name(o->rule), c->hidden, c->ffn,
            dl_ffn_name(c->ffn_kind), dl_dtype_name(c->dtype),
            c->route.experts, c->route.top_k);
    for (int i = 0; i < ns; i++) {
        fputs(i ? ",\n " : "", f);
        jseries(f, o, &s[i]);
    }
    fputs("]}\n", f);
}

/* --------------------------------------------------------------- files */

/* The outputs, reserved before the work (doc/cli.md, "Output files"):
 * never the input file, never both options on one file. 0 or the exit
 * status (after one line on stderr). */
static int reserve(const char *opt, const char *path, int force)
{
    char err[512];
    if (!*path) {
        fprintf(stderr, ME ": %s needs a file name\n", opt);
        return DL_EXIT_USAGE;
    }
    if (dl_golden_output_reserve(path, force, err, sizeof err)) {
        fprintf(stderr, ME ": %s: %s\n", opt, err);
        return DL_EXIT_USAGE;
    }
    return 0;
}

/* A temporary beside path (or NULL after one line on stderr). */
static dl_golden_output_t *open_out(const char *path, int force)
{
    char err[512];
    dl_golden_output_t *out;
    if (dl_golden_output_open(path, force, &out, err, sizeof err)) {
        fprintf(stderr, ME ": %s\n", err);
        return NULL;
    }
    return out;
}

/* Publishes the finished temporary; 0 or the exit status. */
static int commit(dl_golden_output_t *out)
{
    char err[512];
    int rc = dl_golden_output_commit(out, err, sizeof err);
    if (rc)
        fprintf(stderr, ME ": %s\n", err);
    return rc == 0 ? 0 : rc == DL_EEXIST ? DL_EXIT_USAGE : DL_EXIT_FAIL;
}

static int save_json(const opts_t *o, const input_t *in, const series_t *s, int ns)
{
    if (strcmp(o->json, "-") == 0) {
        write_json(stdout, o, in, s, ns);
        return 0; /* stdout's errors are main's to report, once */
    }
    dl_golden_output_t *out = open_out(o->json, o->force);
    if (!out)
        return DL_EXIT_FAIL;
    int fd = dup(dl_golden_output_fd(out));
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
    if (!f) {
        fprintf(stderr, ME ": %s: cannot write: %s\n", o->json, strerror(errno));
        if (fd >= 0)
            close(fd);
        dl_golden_output_abort(out);
        return DL_EXIT_FAIL;
    }
    write_json(f, o, in, s, ns);
    if ((ferror(f) | fclose(f)) != 0) {
        fprintf(stderr, ME ": %s: write error: %s\n", o->json, strerror(errno));
        dl_golden_output_abort(out);
        return DL_EXIT_FAIL;
    }
    return commit(out);
}

/* ---------------------------------------------------------------- plot */

/* Runs the plotting script on the JSON at jpath, writing out in fmt; its
 * stderr is collected so that a failure is one line. */
static int run_plotter(const char *py, const char *jpath, const char *out, const char *fmt,
                       char *why, size_t n)
{
    int p[2];
    if (pipe(p) != 0)
        return snprintf(why, n, "pipe: %s", strerror(errno)), -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]), close(p[1]);
        return snprintf(why, n, "fork: %s", strerror(errno)), -1;
    }
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]), close(p[1]);
        execl(py, py, "-c", plot_script, jpath, out, fmt, (char *)NULL);
        fprintf(stderr, "cannot run %s: %s\n", py, strerror(errno));
        _exit(127);
    }
    close(p[1]);
    char buf[4096], last[512] = "";
    size_t len = 0;
    ssize_t got;
    while ((got = read(p[0], buf + len, sizeof buf - 1 - len)) > 0) {
        len += (size_t)got;
        buf[len] = 0;
        for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
            snprintf(last, sizeof last, "%s", line);
        len = 0;
    }
    close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    snprintf(why, n, "%s", *last ? last : "the plotting script failed");
    return -1;
}

static int save_plot(const opts_t *o, const input_t *in, const series_t *s, int ns)
{
    const char *py = getenv("DROPLESS_PYTHON");
    if (!py || !*py)
        py = "/usr/bin/python3";
    if (access(py, X_OK) != 0) {
        fprintf(stderr, ME ": %s: no Python to plot with (install python3-matplotlib, or set "
                        "DROPLESS_PYTHON)\n", py);
        return DL_EXIT_FAIL;
    }
    const char *tdir = getenv("TMPDIR");
    char jpath[4096];
    snprintf(jpath, sizeof jpath, "%s/dropless-capacity-XXXXXX", tdir && *tdir ? tdir : "/tmp");
    int jfd = mkstemp(jpath);
    FILE *jf = jfd < 0 ? NULL : fdopen(jfd, "w");
    dl_golden_output_t *out = NULL;
    int rc = DL_EXIT_FAIL;
    if (!jf) {
        fprintf(stderr, ME ": %s: cannot write: %s\n", jpath, strerror(errno));
    } else if ((out = open_out(o->plot, o->force)) != NULL) {
        const char *tmp = dl_golden_output_tmp(out);
        write_json(jf, o, in, s, ns);
        char why[600];
        const char *fmt = has_suffix(o->plot, ".svg") ? "svg" : "png";
        struct stat st;
        if ((ferror(jf) | fflush(jf)) != 0)
            fprintf(stderr, ME ": %s: write error\n", jpath);
        else if (run_plotter(py, jpath, tmp, fmt, why, sizeof why) != 0)
            fprintf(stderr, ME ": %s: cannot plot: %s\n", o->plot, why);
        else if (stat(tmp, &st) != 0 || st.st_size == 0)
            fprintf(stderr, ME ": %s: the plotting script wrote nothing\n", o->plot);
        else
            rc = commit(out), out = NULL;
    }
    if (jf)
        fclose(jf);
    else if (jfd >= 0)
        close(jfd);
    if (jfd >= 0)
        unlink(jpath);
    dl_golden_output_abort(out);
    return rc;
}

/* ---------------------------------------------------------------- main */

static int exit_for(int rc)
{
    return rc == DL_EINVAL || rc == DL_ERANGE || rc == DL_EOVERFLOW ? DL_EXIT_USAGE : DL_EXIT_FAIL;
}

/* Every routing at every T, computed. Returns 0 or the exit status. */
static int build(const opts_t *o, const input_t *in, series_t *s, int *ns)
{
    for (int i = 0; i < o->nrouting; i++)
        for (int j = 0; j < o->ntokens; j++) {
            series_t *x = &s[(*ns)++];
            int rc = route(in, &o->routing[i], o->tokens[j], x);
            if (!rc)
                rc = compute(o, x);
            if (rc) {
                fprintf(stderr, ME ": %s: routing %s, T = %" PRId64 ": %s\n", o->input,
                        o->routing[i].kind, o->tokens[j], dl_strerror(rc));
                return exit_for(rc);
            }
        }
    return 0;
}

int dl_cli_capacity(int argc, char **argv)
{
    opts_t *o = calloc(1, sizeof *o);
    input_t *in = calloc(1, sizeof *in);
    series_t *s = NULL;
    int ns = 0, rc = DL_EXIT_FAIL;
    if (!o || !in) {
        fprintf(stderr, ME ": out of memory\n");
        goto done;
    }
    if ((rc = parse(argc, argv, o)) >= 0)
        goto done;
    defaults(o);
    if ((rc = load_input(o->input, in)))
        goto done;
    if (o->ntokens == 0)
        o->tokens[o->ntokens++] = in->c.config.tokens;
    for (int i = 0; in->golden && i < o->ntokens; i++)
        for (int j = 0; j < o->nrouting; j++)
            if (strcmp(o->routing[j].kind, "case") == 0 && o->tokens[i] != in->c.config.tokens) {
                fprintf(stderr, ME ": %s: a golden file's routing has T = %" PRId64
                        " (--tokens applies to uniform and zipf routings)\n", o->input,
                        in->c.config.tokens);
                rc = DL_EXIT_USAGE;
                goto done;
            }
    if (!in->catalogue)
        dl_golden_output_input(o->input);
    if ((o->json && strcmp(o->json, "-") != 0 && (rc = reserve("--json", o->json, o->force))) ||
        (o->plot && (rc = reserve("--plot", o->plot, o->force))))
        goto done;
    s = calloc((size_t)(o->nrouting * o->ntokens), sizeof *s);
    if (!s) {
        fprintf(stderr, ME ": out of memory\n");
        rc = DL_EXIT_FAIL;
        goto done;
    }
    if ((rc = build(o, in, s, &ns)))
        goto done;
    if (!o->quiet && !(o->json && strcmp(o->json, "-") == 0))
        print_table(o, in, s, ns);
    if ((o->json && (rc = save_json(o, in, s, ns))) || (o->plot && (rc = save_plot(o, in, s, ns))))
        goto done;
    rc = DL_EXIT_OK;
done:
    for (int i = 0; s && i < ns; i++)
        series_free(&s[i], o->ncf * o->npolicy);
    free(s);
    if (in && in->golden)
        dl_golden_free(&in->g);
    free(in);
    free(o);
    return rc;
}
