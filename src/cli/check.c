/* dropless check / dropless run: load files, call the runner, print
 * reports. All judgement lives in the library (check.h, run.h). */
#include "config.h"
#include <errno.h>
#include <inttypes.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dropless.h"
#include "cli.h"

#define MAX_BACKENDS 32
/* An unsealed file that takes HDF5 longer than this to parse is treated as
 * hostile; DROPLESS_PREFLIGHT_SECONDS overrides it (tests use a short one). */
#define PREFLIGHT_SECONDS 120

unsigned dl_cli_preflight_seconds(void)
{
    const char *s = getenv("DROPLESS_PREFLIGHT_SECONDS");
    char *end;
    long v = s ? strtol(s, &end, 10) : 0;
    return s && *s && !*end && v > 0 && v < 86400 ? (unsigned)v : PREFLIGHT_SECONDS;
}

typedef struct {
    const char *profile, *json, *junit, *stages, *require, *out;
    int all, force, forward_only, strict_storage, sealed_golden, quiet;
    const dl_check_profile_t *per_stage[DL_VALUE_COUNT]; /* from --profile PART=NAME,... */
    double time_limit;
    double false_alarm; /* --false-alarm P; 0: the library's default */
    const char *backends[MAX_BACKENDS];
    int nbackends;
} opts_t;

static void check_usage(FILE *f)
{
    fprintf(f,
            "usage: dropless check [options] GOLDEN.h5 CANDIDATE.h5\n"
            "  --profile NAME   the candidate's compute mode (default: its compute_mode\n"
            "                   attribute, else fp32), or per part: router=fp32,experts=bf16-acc\n"
            "                   (parts router, experts, combine, default, stage names); one of:");
    for (int i = 0; i < dl_check_profile_count(); i++)
        fprintf(f, " %s", dl_check_profile_at(i)->name);
    fprintf(f,
            "\n"
            "  --stages LIST    check only these stages (comma-separated dataset names)\n"
            "  --require LIST   these stages must be provided: one missing is a FAIL\n"
            "  --strict-storage a stage stored coarser than the case's type (bf16 weight\n"
            "                   gradients of an fp32 stage) FAILs instead of a NOTE\n"
            "  --false-alarm P  the statistical tier's false-alarm probability per case\n"
            "                   (default 1e-6; 0 < P < 1, or 'off'; doc/tolerances.md)\n"
            "  --json FILE      write the report as JSON ('-': stdout, instead of the table)\n"
            "  --junit FILE     write the report as JUnit XML ('-': stdout)\n"
            "  --force          replace existing report files\n"
            "  --require-sealed-golden  an unsealed golden file is an error (exit 2)\n"
            "  --all            list SKIP lines in the table too\n"
            "  -q, --quiet      no progress bar (a terminal gets one: stage, elements, rate)\n"
            "exit status: 0 conformant, 1 not conformant, 2 usage error or unreadable input\n");
}

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: dropless run --backend PLUGIN.so [--backend ...] [options] GOLDEN.h5\n"
            "  --backend PATH   a backend plugin (dropless/backend.h); repeat for several\n"
            "  --profile NAME   override every backend's declared compute mode\n"
            "  --time-limit S   seconds per stage call (default %.0f)\n"
            "  --forward-only   run the forward stages only\n"
            "  --out FILE       write the (single) backend's outputs as a candidate file\n"
            "  --force          replace --out and report files if they exist\n"
            "  --require LIST   stages every backend must provide (a missing one FAILs)\n"
            "  --json FILE, --junit FILE, --all, --require-sealed-golden   as for 'dropless check'\n"
            "exit status: 0 every backend conformant, 1 some backend not conformant,\n"
            "             2 usage error or unreadable input\n",
            DL_RUN_DEFAULT_TIME_LIMIT_S);
}

static int parse(int argc, char **argv, opts_t *o, int is_run)
{
    enum { O_PROFILE = 1, O_JSON, O_JUNIT, O_STAGES, O_ALL, O_BACKEND, O_LIMIT, O_FWD, O_OUT,
           O_FORCE, O_HELP, O_REQUIRE, O_STRICT_STORAGE, O_FALSE_ALARM, O_SEALED };
    static const struct option longopts[] = {
        {"profile", required_argument, 0, O_PROFILE}, {"json", required_argument, 0, O_JSON},
        {"junit", required_argument, 0, O_JUNIT},     {"stages", required_argument, 0, O_STAGES},
        {"all", no_argument, 0, O_ALL},               {"backend", required_argument, 0, O_BACKEND},
        {"time-limit", required_argument, 0, O_LIMIT}, {"forward-only", no_argument, 0, O_FWD},
        {"out", required_argument, 0, O_OUT},         {"force", no_argument, 0, O_FORCE},
        {"help", no_argument, 0, O_HELP},             {"require", required_argument, 0, O_REQUIRE},
        {"strict-storage", no_argument, 0, O_STRICT_STORAGE},
        {"false-alarm", required_argument, 0, O_FALSE_ALARM},
        {"require-sealed-golden", no_argument, 0, O_SEALED},
        {"quiet", no_argument, 0, 'q'},
        {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "hq", longopts, NULL)) != -1) {
        int run_only = ch == O_BACKEND || ch == O_LIMIT || ch == O_FWD || ch == O_OUT;
        if (run_only && !is_run)
            ch = '?';
        switch (ch) {
        case O_PROFILE: o->profile = optarg; break;
        case O_JSON: o->json = optarg; break;
        case O_JUNIT: o->junit = optarg; break;
        case O_STAGES: o->stages = optarg; break;
        case O_REQUIRE: o->require = optarg; break;
        case O_STRICT_STORAGE: o->strict_storage = 1; break;
        case O_FALSE_ALARM: {
            char *end;
            o->false_alarm = strcmp(optarg, "off") ? strtod(optarg, &end) : -1.0;
            if (o->false_alarm != -1.0 && (*end || !(o->false_alarm > 0 && o->false_alarm < 1))) {
                fprintf(stderr, "dropless %s: --false-alarm wants a probability in (0, 1) or "
                                "'off', not '%s'\n", argv[0], optarg);
                return DL_EXIT_USAGE;
            }
            break;
        }
        case O_SEALED: o->sealed_golden = 1; break;
        case 'q': o->quiet = 1; break;
        case O_ALL: o->all = 1; break;
        case O_FWD: o->forward_only = 1; break;
        case O_OUT: o->out = optarg; break;
        case O_FORCE: o->force = 1; break;
        case O_BACKEND:
            if (o->nbackends == MAX_BACKENDS) {
                fprintf(stderr, "dropless run: at most %d backends\n", MAX_BACKENDS);
                return DL_EXIT_USAGE;
            }
            o->backends[o->nbackends++] = optarg;
            break;
        case O_LIMIT: {
            char *end;
            o->time_limit = strtod(optarg, &end);
            if (*end || !(o->time_limit > 0 && o->time_limit <= 86400)) {
                fprintf(stderr, "dropless run: --time-limit wants seconds in (0, 86400], not '%s'\n", optarg);
                return DL_EXIT_USAGE;
            }
            break;
        }
        case 'h':
        case O_HELP:
            is_run ? run_usage(stdout) : check_usage(stdout);
            return -1;
        default:
            fprintf(stderr, "dropless %s: unknown or incomplete option '%s' (try --help)\n",
                    argv[0], argv[optind - 1]);
            return DL_EXIT_USAGE;
        }
    }
    return 0;
}

/* Parses a comma-separated list of stage names into a mask; an unknown
 * name or an empty list (nothing to check is never a check) is a usage
 * error. */
static int parse_stage_list(const char *cmd, const char *opt, const char *list, dl_valueset_t *mask)
{
    *mask = 0;
    char *copy = strdup(list), *save = NULL;
    if (!copy)
        return DL_ENOMEM;
    for (char *tok = strtok_r(copy, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        dl_value_t v;
        if (dl_value_parse(tok, &v) != 0 || v == DL_VALUE_NONE || (int)v < 0 || (int)v >= 64) {
            const char *near = dl_golden_nearest_dataset(tok, NULL);
            if (near && !strcmp(strrchr(near, '/') + 1, tok)) {
                fprintf(stderr, "dropless %s: --%s: '%s' is a dataset of the golden file (%s) "
                        "but not a stage the checker judges\n", cmd, opt, tok, near);
                free(copy);
                return DL_EINVAL;
            }
            fprintf(stderr, "dropless %s: --%s: unknown stage '%s'%s%s%s\n", cmd, opt, tok,
                    near ? " (did you mean " : "", near ? strrchr(near, '/') + 1 : "",
                    near ? "?)" : "");
            free(copy);
            return DL_EINVAL;
        }
        *mask |= DL_VALUE_BIT(v);
    }
    free(copy);
    if (!*mask) {
        fprintf(stderr, "dropless %s: --%s: no stage named (an empty list checks nothing)\n", cmd, opt);
        return DL_EINVAL;
    }
    return 0;
}

/* Keeps only the candidate stages in want; the others are moved to *kept so
 * they can be restored (and freed) afterwards. */
static void select_stages(dl_golden_file_t *cand, dl_valueset_t want, void **kept)
{
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        dl_value_t v;
        if (ds->group == DL_GOLDEN_INPUTS || dl_value_parse(ds->name, &v) != 0 ||
            ((want >> v) & 1))
            continue;
        void **slot = dl_golden_slot(cand, ds);
        kept[i] = *slot;
        *slot = NULL;
        cand->bad_datasets &= ~DL_ROWSET_BIT(i);
    }
}

static void restore_stages(dl_golden_file_t *cand, void **kept)
{
    for (int i = 0; i < dl_golden_dataset_count(); i++)
        if (kept[i])
            *dl_golden_slot(cand, dl_golden_dataset(i)) = kept[i];
}

static int resolve_profile(const char *name, const char *cmd, const dl_check_profile_t **p,
                           const dl_check_profile_t **per_stage)
{
    *p = NULL;
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        per_stage[s] = NULL;
    if (!name)
        return 0;
    if (dl_check_parse_profiles(name, p, per_stage) != 0) {
        fprintf(stderr, "dropless %s: unknown profile or part in '%s' (parts: router, experts, "
                "combine, default, stage names; profiles:", cmd, name);
        for (int i = 0; i < dl_check_profile_count(); i++)
            fprintf(stderr, " %s", dl_check_profile_at(i)->name);
        fprintf(stderr, ")\n");
        return DL_EXIT_USAGE;
    }
    return 0;
}

/* The report files, reserved before the work: a path that cannot be
 * written is a usage error at once, not after a long check. */
typedef struct {
    dl_report_out_t *json, *junit;
} reports_t;

/* An output path must be non-empty, and is reserved at once: not an input
 * of the command (--force or not: the golden file is not a scratch file),
 * not another of its outputs, by file identity (doc/cli.md). */
static int output_ok(const char *cmd, const char *opt, const char *path, int force)
{
    char err[512];
    if (!*path) {
        fprintf(stderr, "dropless %s: %s needs a file name%s\n", cmd, opt,
                strcmp(opt, "--out") ? " ('-' for stdout)" : "");
        return DL_EXIT_USAGE;
    }
    if (strcmp(path, "-") && dl_golden_output_reserve(path, force, err, sizeof err)) {
        fprintf(stderr, "dropless %s: %s: %s\n", cmd, opt, err);
        return DL_EXIT_USAGE;
    }
    return 0;
}

/* The command's inputs, which no output replaces. */
static void register_inputs(const char *const *inputs, int n)
{
    for (int i = 0; i < n; i++)
        dl_golden_output_input(inputs[i]);
}

static int open_reports(const opts_t *o, const char *cmd, reports_t *rp)
{
    memset(rp, 0, sizeof *rp);
    const char *paths[2] = {o->json, o->junit}, *names[2] = {"--json", "--junit"};
    dl_report_out_t **outs[2] = {&rp->json, &rp->junit};
    if (o->json && o->junit && !strcmp(o->json, "-") && !strcmp(o->junit, "-")) {
        fprintf(stderr, "dropless %s: --json and --junit both name standard output\n", cmd);
        return DL_EXIT_USAGE;
    }
    for (int i = 0; i < 2; i++) {
        if (!paths[i])
            continue;
        char err[512];
        int rc = output_ok(cmd, names[i], paths[i], o->force);
        if (!rc && dl_report_open(paths[i], o->force ? DL_REPORT_FORCE : 0, outs[i], err, sizeof err)) {
            fprintf(stderr, "dropless %s: %s\n", cmd, err);
            rc = DL_EXIT_USAGE;
        }
        if (rc) {
            dl_report_discard(rp->json);
            rp->json = NULL;
            return rc;
        }
    }
    return 0;
}

static void discard_reports(reports_t *rp)
{
    dl_report_discard(rp->json);
    dl_report_discard(rp->junit);
    rp->json = rp->junit = NULL;
}

/* Prints the table and writes the reserved files; returns the exit status:
 * the verdicts', or 1 when a report could not be written. */
static int emit(const opts_t *o, const char *cmd, reports_t *rp, const dl_check_report_t *const *r,
                size_t n)
{
    unsigned flags = o->all ? DL_REPORT_ALL : 0;
    if (isatty(STDOUT_FILENO) && !getenv("NO_COLOR"))
        flags |= DL_REPORT_COLOUR;
    int to_stdout = (o->json && strcmp(o->json, "-") == 0) || (o->junit && strcmp(o->junit, "-") == 0);
    if (!to_stdout)
        dl_check_write(stdout, DL_REPORT_TABLE, r, n, flags);
    int status = dl_check_exit_status(r, n);
    dl_report_out_t *outs[2] = {rp->json, rp->junit};
    const char *paths[2] = {o->json, o->junit};
    const dl_report_format_t fmts[2] = {DL_REPORT_JSON, DL_REPORT_JUNIT};
    rp->json = rp->junit = NULL;
    for (int i = 0; i < 2; i++) {
        char err[512];
        if (outs[i] && dl_report_commit(outs[i], fmts[i], r, n, 0, err, sizeof err)) {
            if (strcmp(paths[i], "-")) /* stdout's errors are main's to report, once */
                fprintf(stderr, "dropless %s: %s\n", cmd, err);
            status = DL_EXIT_FAIL;
        }
    }
    return status;
}

/* The golden file, parsed in a child unless sealed; with require_sealed
 * an unsealed one is refused. */
static int load_golden(const char *cmd, const char *path, int require_sealed, dl_golden_file_t *g)
{
    char err[512];
    int rc = dl_golden_load_isolated(path, NULL, dl_cli_preflight_seconds(), g, err, sizeof err);
    if (rc) {
        fprintf(stderr, "dropless %s: %s\n", cmd, err);
        return DL_EXIT_USAGE;
    }
    if (require_sealed && g->sealed != 1) {
        fprintf(stderr, "dropless %s: %s: the golden file is not sealed (no SHA-256 seal that "
                "verifies: edited or not written by dropless), refused (--require-sealed-golden)\n",
                cmd, path);
        dl_golden_free(g);
        return DL_EXIT_USAGE;
    }
    if (!g->has_inputs || !g->has_forward) {
        fprintf(stderr, "dropless %s: %s: not a golden file (no /inputs or /forward)\n", cmd, path);
        dl_golden_free(g);
        return DL_EXIT_USAGE;
    }
    return 0;
}

/* A candidate that says it was computed for another case or seed is
 * flagged, whatever its values say. */
static void note_provenance(dl_check_report_t *rep, const dl_golden_file_t *g,
                            const dl_golden_file_t *cand)
{
    char msg[256];
    if (cand->has_case && strcmp(cand->case_name, g->case_name)) {
        snprintf(msg, sizeof msg, "the candidate's case is '%s', the golden's '%s'",
                 cand->case_name, g->case_name);
        dl_check_report_add(rep, DL_VALUE_NONE, "provenance", DL_VERDICT_WARN, msg);
    }
    if (cand->has_seed && cand->seed != g->seed) {
        snprintf(msg, sizeof msg, "the candidate's seed is %" PRIu64 ", the golden's %" PRIu64,
                 cand->seed, g->seed);
        dl_check_report_add(rep, DL_VALUE_NONE, "provenance", DL_VERDICT_WARN, msg);
    }
}

/* An unsealed golden file (edited, or written by another tool) is a WARN
 * in the report, since its values decide every verdict; a sealed one, the
 * files dropless writes, adds nothing (the reports of the Python package,
 * which checks objects, stay the same). */
static void note_golden_seal(dl_check_report_t *rep, const dl_golden_file_t *g)
{
    if (g->sealed != 1)
        dl_check_report_add(rep, DL_VALUE_NONE, "golden_seal", DL_VERDICT_WARN,
                            "the golden file is NOT sealed: its values are not protected against "
                            "editing or damage, and decide every verdict (--require-sealed-golden "
                            "refuses it)");
}

/* The loader's findings that are no verdict: datasets no value of the case
 * (a typo, a wrong place), as a NOTE (an INFO line) in the report. */
static void add_loader_notes(dl_check_report_t *rep, const char *unknown, int n_unknown, int sealed)
{
    char msg[256];
    if (sealed < 0)
        dl_check_report_add(rep, DL_VALUE_NONE, "note", DL_VERDICT_INFO,
                            "NOTE: the candidate's seal does not match its bytes (edited after "
                            "sealing); a candidate needs no seal, a golden keeps it strict");
    else if (sealed == 0)
        dl_check_report_add(rep, DL_VALUE_NONE, "note", DL_VERDICT_INFO,
                            "NOTE: the candidate is not sealed (a candidate needs no seal)");
    if (n_unknown) {
        snprintf(msg, sizeof msg, "NOTE: %d dataset%s ignored, no value of this case: %s", n_unknown,
                 n_unknown == 1 ? "" : "s", unknown);
        dl_check_report_add(rep, DL_VALUE_NONE, "note", DL_VERDICT_INFO, msg);
    }
}

/* The candidate as the runner takes it: datasets the loader set aside
 * (wrong shape, type or grid) FAIL as such, with the loader's reason;
 * coarser storage is judged at its precision. */
static dl_check_candidate_t candidate_of(const dl_golden_file_t *cand, const char *cpath)
{
    dl_check_candidate_t c = {.fwd = cand->fwd, .bwd = cand->bwd,
                              .backend = cand->backend[0] ? cand->backend : cpath,
                              .backend_version = cand->backend_version[0] ? cand->backend_version : NULL,
                              .compute_mode = cand->compute_mode[0] ? cand->compute_mode : NULL,
                              .n_ep = cand->n_ep, .ep = cand->ep,
                              .n_layouts = cand->n_layouts, .layouts = cand->layouts};
    for (int i = 0; i < dl_golden_dataset_count() && i < DL_GOLDEN_DATASET_MAX; i++) {
        dl_value_t v;
        if (dl_value_parse(dl_golden_dataset(i)->name, &v) != 0 || v == DL_VALUE_NONE)
            continue;
        if DL_ROWSET_HAS(cand->bad_datasets, i) {
            c.bad_shape |= DL_VALUE_BIT(v);
            c.bad_reason[v] = cand->bad_reason[i];
            fprintf(stderr, "dropless check: %s: %s: %s\n", cpath, dl_golden_dataset(i)->path,
                    cand->bad_reason[i]);
        }
        if DL_ROWSET_HAS(cand->coarse_datasets, i) {
            c.coarse |= DL_VALUE_BIT(v);
            c.store[v] = cand->store[i];
        }
    }
    return c;
}

/* Checks the loaded candidate against the golden file into *rep; 0 or
 * an exit status (the message printed). */
static int judge(const opts_t *o, const dl_check_profile_t *profile, dl_valueset_t require,
                 const dl_golden_file_t *g, const dl_golden_file_t *cand, const char *gpath,
                 const char *cpath, dl_check_report_t *rep)
{
    dl_moe_inputs_t in = dl_golden_inputs_view(&g->in);
    dl_check_golden_t gold = {&g->config, &in, &g->fwd, g->has_backward ? &g->bwd : NULL,
                              g->case_name};
    dl_check_candidate_t c = candidate_of(cand, cpath);
    dl_check_options_t co;
    dl_check_options_default(&co);
    co.profile = profile;
    memcpy(co.stage_profile, o->per_stage, sizeof co.stage_profile);
    co.require = require;
    co.strict_storage = o->strict_storage;
    if (o->false_alarm != 0.0)
        co.false_alarm = o->false_alarm;
    dl_cli_progress_t bar;
    dl_cli_progress_init(&bar, g->case_name[0] ? g->case_name : "check");
    for (int s = 0; s < DL_VALUE_COUNT; s++) /* the runner's share done is of these */
        bar.total += (double)dl_value_numel(&g->config, (dl_value_t)s);
    if (!o->quiet && isatty(2)) {
        co.progress = dl_cli_progress_cb;
        co.progress_ctx = &bar;
    }
    int rc;
    if (cand->isolated_groups[0]) {
        /* the backend fed each group the golden inputs: judge each on golden upstream */
        dl_valueset_t groups[DL_VALUE_COUNT];
        int ng = dl_check_parse_groups(cand->isolated_groups, groups, DL_VALUE_COUNT);
        if (ng < 0) {
            fprintf(stderr, "dropless check: %s: malformed isolated_groups attribute\n", cpath);
            return DL_EXIT_USAGE;
        }
        rc = dl_check_run_isolated(&gold, &c, &co, groups, ng, rep);
    } else {
        rc = dl_check_run(&gold, &c, &co, rep);
    }
    dl_cli_progress_end(&bar);
    if (rc) {
        fprintf(stderr, "dropless check: %s: %s\n", gpath, dl_strerror(rc));
        dl_check_report_free(rep);
        return rc == DL_ENOMEM ? DL_EXIT_FAIL : DL_EXIT_USAGE;
    }
    note_provenance(rep, g, cand);
    note_golden_seal(rep, g);
    return 0;
}

int dl_cli_check(int argc, char **argv)
{
    opts_t o;
    int rc = parse(argc, argv, &o, 0);
    if (rc)
        return rc < 0 ? DL_EXIT_OK : rc;
    if (argc - optind != 2) {
        fprintf(stderr, "dropless check: needs GOLDEN.h5 CANDIDATE.h5, %d file%s given "
                "(try 'dropless check --help')\n", argc - optind, argc - optind == 1 ? "" : "s");
        return DL_EXIT_USAGE;
    }
    const char *gpath = argv[optind], *cpath = argv[optind + 1];
    const char *inputs[2] = {gpath, cpath};
    const dl_check_profile_t *profile;
    reports_t reports;
    dl_valueset_t want = 0, require = 0;
    if ((rc = resolve_profile(o.profile, "check", &profile, o.per_stage)))
        return rc;
    if ((o.stages && parse_stage_list("check", "stages", o.stages, &want)) ||
        (o.require && parse_stage_list("check", "require", o.require, &require)))
        return DL_EXIT_USAGE;
    register_inputs(inputs, 2);
    if ((rc = open_reports(&o, "check", &reports)))
        return rc;
    dl_golden_file_t g, cand;
    memset(&cand, 0, sizeof cand);
    if ((rc = load_golden("check", gpath, o.sealed_golden, &g))) {
        discard_reports(&reports);
        return rc;
    }
    char err[512];
    int status = DL_EXIT_USAGE;
    void *kept[128] = {0};
    if (dl_golden_load_isolated(cpath, &g.config, dl_cli_preflight_seconds(), &cand, err, sizeof err)) {
        fprintf(stderr, "dropless check: %s\n", err);
        goto out;
    }
    if (o.stages)
        select_stages(&cand, want, kept);
    char unknown[200];
    int n_unknown = 0;
    if (dl_golden_unknown_datasets(cpath, &g.config, unknown, sizeof unknown, &n_unknown) != 0)
        n_unknown = 0;
    dl_check_report_t rep;
    if ((status = judge(&o, profile, require, &g, &cand, gpath, cpath, &rep)))
        goto out;
    if (!dl_check_checked(&rep)) {
        /* no report: a CI job must not go green on a writer that wrote nothing usable */
        fprintf(stderr, "dropless check: %s: nothing to check: no stage of case %s%s%s%s\n", cpath,
                g.case_name, o.stages ? " among --stages" : "", n_unknown ? "; ignored: " : "",
                n_unknown ? unknown : "");
        status = DL_EXIT_USAGE;
    } else {
        add_loader_notes(&rep, unknown, n_unknown, cand.sealed);
        const dl_check_report_t *rp = &rep;
        status = emit(&o, "check", &reports, &rp, 1);
    }
    dl_check_report_free(&rep);
out:
    discard_reports(&reports);
    restore_stages(&cand, kept);
    dl_golden_free(&cand);
    dl_golden_free(&g);
    return status;
}

/* The executor's findings, added to the check report of the same backend. */
static void add_diagnostics(dl_check_report_t *rep, const dl_run_result_t *res)
{
    char msg[400];
    if (!res->loaded) {
        snprintf(msg, sizeof msg, "plugin not loaded: %s: %s",
                 dl_run_status_name(res->load.status), res->load.message);
        dl_check_report_add(rep, DL_VALUE_NONE, "load", DL_VERDICT_FAIL, msg);
        return;
    }
    for (int s = 0; s < DL_STAGE_COUNT; s++) {
        const dl_run_diag_t *d = &res->stage[s];
        if (d->status == DL_RUN_OK || d->status == DL_RUN_NOT_IMPLEMENTED || d->status == DL_RUN_SKIPPED)
            continue;
        const char *status = dl_run_status_name(d->status), *detail = d->message;
        size_t sl = strlen(status);
        if (!strncmp(detail, status, sl) && detail[sl] == ':') /* the message names it already */
            detail += sl + 1;
        while (*detail == ' ')
            detail++;
        snprintf(msg, sizeof msg, "stage %s: %s%s%s", dl_run_stage_name(d->stage), status,
                 *detail ? ": " : "", detail);
        int fail = dl_run_status_is_failure(d->status);
        dl_check_report_add(rep, DL_VALUE_NONE, fail ? "execution" : "determinism",
                            fail ? DL_VERDICT_FAIL : DL_VERDICT_WARN, msg);
    }
}

static int write_candidate(const opts_t *o, const dl_golden_file_t *g, const dl_run_result_t *res)
{
    dl_golden_file_t cf;
    memset(&cf, 0, sizeof cf);
    cf.config = g->config;
    cf.seed = g->seed;
    snprintf(cf.case_name, sizeof cf.case_name, "%s", g->case_name);
    snprintf(cf.backend, sizeof cf.backend, "%s", res->backend.name);
    snprintf(cf.compute_mode, sizeof cf.compute_mode, "%s", res->backend.compute_mode);
    cf.fwd = res->fwd; /* borrowed: cf is never freed */
    cf.bwd = res->bwd;
    cf.has_forward = 1;
    cf.has_backward = !o->forward_only;
    dl_valueset_t groups[DL_STAGE_COUNT];
    for (int s = 0; s < DL_STAGE_COUNT; s++)
        groups[s] = dl_run_stage_values((dl_run_stage_t)s);
    if (dl_check_format_groups(groups, DL_STAGE_COUNT, cf.isolated_groups, sizeof cf.isolated_groups)) {
        fprintf(stderr, "dropless run: internal error formatting the stage groups\n");
        return DL_EXIT_USAGE;
    }
    char err[512];
    int rc = dl_golden_write_candidate(o->out, &cf, o->force, err, sizeof err);
    if (rc) {
        fprintf(stderr, "dropless run: %s\n", err);
        return rc == DL_EEXIST || rc == DL_EINVAL ? DL_EXIT_USAGE : DL_EXIT_FAIL;
    }
    return 0;
}

/* Runs one backend and checks what it produced into *rep; 0 or an exit
 * status (the message printed). */
static int run_one(const opts_t *o, const char *backend, const dl_check_profile_t *profile,
                   dl_valueset_t require, const dl_golden_file_t *g, const char *gpath,
                   dl_check_report_t *rep)
{
    dl_moe_inputs_t in = dl_golden_inputs_view(&g->in);
    dl_check_golden_t gold = {&g->config, &in, &g->fwd, g->has_backward ? &g->bwd : NULL,
                              g->case_name};
    dl_run_options_t ro = {o->time_limit, o->forward_only};
    dl_run_result_t res;
    char why[160];
    if (!dl_run_expressible(&g->config, why, sizeof why)) {
        fprintf(stderr, "dropless run: %s: case %s: %s\n", backend, g->case_name, why);
        return DL_EXIT_USAGE;
    }
    int rc = dl_run_backend(backend, &g->config, &in, &g->fwd, g->has_backward ? &g->bwd : NULL,
                            &ro, &res);
    if (rc) {
        fprintf(stderr, "dropless run: %s: %s\n", backend, dl_strerror(rc));
        dl_run_result_free(&res);
        return rc == DL_ENOMEM ? DL_EXIT_FAIL : DL_EXIT_USAGE;
    }
    if (o->out && (rc = write_candidate(o, g, &res))) {
        dl_run_result_free(&res);
        return rc;
    }
    dl_check_candidate_t c = {.fwd = res.fwd, .bwd = res.bwd,
                              .backend = res.backend.name[0] ? res.backend.name : backend,
                              .backend_version = res.backend.version,
                              .compute_mode = res.backend.compute_mode[0] ? res.backend.compute_mode
                                                                          : NULL};
    dl_check_options_t co;
    dl_check_options_default(&co);
    co.profile = profile;
    memcpy(co.stage_profile, o->per_stage, sizeof co.stage_profile);
    co.require = require;
    /* each stage was fed golden inputs: judge each on golden upstream */
    dl_valueset_t groups[DL_STAGE_COUNT];
    for (int s = 0; s < DL_STAGE_COUNT; s++)
        groups[s] = dl_run_stage_values((dl_run_stage_t)s);
    rc = dl_check_run_isolated(&gold, &c, &co, groups, DL_STAGE_COUNT, rep);
    if (rc) {
        fprintf(stderr, "dropless run: %s: %s\n", gpath, dl_strerror(rc));
        dl_check_report_free(rep);
        dl_run_result_free(&res);
        return rc == DL_ENOMEM ? DL_EXIT_FAIL : DL_EXIT_USAGE;
    }
    add_diagnostics(rep, &res);
    note_golden_seal(rep, g);
    dl_run_result_free(&res);
    return 0;
}

/* What can be refused before any plugin runs: the plugin files, --out
 * (never the golden file or a plugin, by identity). */
static int run_preconditions(const opts_t *o, const char *gpath)
{
    for (int b = 0; b < o->nbackends; b++)
        if (access(o->backends[b], R_OK) != 0) {
            fprintf(stderr, "dropless run: %s: %s\n", o->backends[b], strerror(errno));
            return DL_EXIT_USAGE;
        }
    register_inputs(&gpath, 1);
    register_inputs(o->backends, o->nbackends);
    return o->out ? output_ok("run", "--out", o->out, o->force) : 0;
}

int dl_cli_run(int argc, char **argv)
{
    opts_t o;
    int rc = parse(argc, argv, &o, 1);
    if (rc)
        return rc < 0 ? DL_EXIT_OK : rc;
    if (argc - optind != 1 || o.nbackends == 0) {
        fprintf(stderr, "dropless run: needs --backend PLUGIN.so and one GOLDEN.h5 (%d backend%s, "
                "%d file%s given; try 'dropless run --help')\n", o.nbackends,
                o.nbackends == 1 ? "" : "s", argc - optind, argc - optind == 1 ? "" : "s");
        return DL_EXIT_USAGE;
    }
    if (o.out && o.nbackends > 1) {
        fprintf(stderr, "dropless run: --out takes exactly one --backend\n");
        return DL_EXIT_USAGE;
    }
    const char *gpath = argv[optind];
    const dl_check_profile_t *profile;
    reports_t reports;
    dl_valueset_t require = 0;
    if ((rc = resolve_profile(o.profile, "run", &profile, o.per_stage)))
        return rc;
    if (o.stages) {
        fprintf(stderr, "dropless run: --stages is for 'dropless check'\n");
        return DL_EXIT_USAGE;
    }
    if (o.require && parse_stage_list("run", "require", o.require, &require))
        return DL_EXIT_USAGE;
    if ((rc = run_preconditions(&o, gpath)) || (rc = open_reports(&o, "run", &reports)))
        return rc;
    dl_golden_file_t g;
    if ((rc = load_golden("run", gpath, o.sealed_golden, &g))) {
        discard_reports(&reports);
        return rc;
    }
    dl_check_report_t reps[MAX_BACKENDS];
    const dl_check_report_t *rp[MAX_BACKENDS];
    int nrep = 0, status = DL_EXIT_USAGE;
    for (int b = 0; b < o.nbackends; b++) {
        if ((status = run_one(&o, o.backends[b], profile, require, &g, gpath, &reps[nrep])))
            goto out;
        rp[nrep] = &reps[nrep];
        nrep++;
    }
    status = emit(&o, "run", &reports, rp, (size_t)nrep);
out:
    discard_reports(&reports);
    for (int i = 0; i < nrep; i++)
        dl_check_report_free(&reps[i]);
    dl_golden_free(&g);
    return status;
}
