/* Regressions of the adversarial audit of issue 17 at the library level:
 * output files (reports, golden files) under signals, existing paths and
 * non-regular files; the isolated loader's messages; small lies in
 * messages. The CLI's side is tests/test_cli_hardening.sh. */
#include "config.h"
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tap.h"
#include "golden/golden_priv.h"
#include "check/check_priv.h"

static char dir[64];

static void mk_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/dl_harden_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void rm_dir(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (unlink(p) != 0)
                rmdir(p);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

static char *at(const char *name)
{
    static char p[4][512];
    static int i;
    i = (i + 1) % 4;
    snprintf(p[i], sizeof p[i], "%s/%s", dir, name);
    return p[i];
}

/* Names in dir containing ".tmp-": temporaries left behind. */
static int count_tmp(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        n += strstr(e->d_name, ".tmp-") != NULL;
    if (d)
        closedir(d);
    return n;
}

static void tiny(dl_golden_file_t *g)
{
    dl_case_t c;
    ck_assert_int_eq(dl_case_find("tiny", &c), 0);
    ck_assert_int_eq(dl_golden_generate(&c, NULL, g, NULL, NULL, 0), 0);
}

static const char *vectors(const char *name)
{
    static char p[1024];
    const char *s = getenv("top_srcdir");
    snprintf(p, sizeof p, "%s/vectors/%s", s ? s : ".", name);
    return p;
}

/* ---------------------------------------------------------- 1. reports */

static dl_check_report_t a_report(void)
{
    dl_check_report_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.case_name, sizeof r.case_name, "tiny");
    ck_assert_int_eq(dl_check_report_add(&r, DL_VALUE_NONE, "x", DL_VERDICT_PASS, "fine"), 0);
    return r;
}

START_TEST(report_refuses_existing_and_nonregular)
{
    mk_dir();
    dl_check_report_t r = a_report();
    const dl_check_report_t *rp = &r;
    FILE *f = fopen(at("r.json"), "w");
    fputs("keep", f);
    fclose(f);
    ck_assert_int_eq(dl_check_save(at("r.json"), DL_REPORT_JSON, &rp, 1, 0), DL_EEXIST);
    char buf[16] = "";
    f = fopen(at("r.json"), "r");
    ck_assert(fgets(buf, sizeof buf, f) && !strcmp(buf, "keep"));
    fclose(f);
    ck_assert_int_eq(dl_check_save(at("r.json"), DL_REPORT_JSON, &rp, 1, DL_REPORT_FORCE), 0);
    f = fopen(at("r.json"), "r");
    ck_assert(fgets(buf, sizeof buf, f) && !strncmp(buf, "{\"format\"", 9));
    fclose(f);
    /* never anything but a regular file, even with force */
    ck_assert_int_eq(mkfifo(at("fifo"), 0600), 0);
    ck_assert_int_eq(symlink(at("r.json"), at("link")), 0);
    ck_assert_int_eq(mkdir(at("sub"), 0700), 0);
    const char *nonreg[] = {at("fifo"), at("link"), at("sub"), "/dev/null"};
    for (int i = 0; i < 4; i++) {
        dl_report_out_t *o = NULL;
        char err[256] = "";
        ck_assert_int_eq(dl_report_open(nonreg[i], DL_REPORT_FORCE, &o, err, sizeof err), DL_EEXIST);
        ck_assert_ptr_null(o);
        ck_assert_msg(strstr(err, nonreg[i]) && strstr(err, "not replaced"), "%s", err);
    }
    struct stat st;
    ck_assert(lstat(at("fifo"), &st) == 0 && S_ISFIFO(st.st_mode));
    ck_assert(lstat(at("link"), &st) == 0 && S_ISLNK(st.st_mode));
    ck_assert(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
    /* reserved before the work: a discarded reservation leaves nothing */
    dl_report_out_t *o;
    ck_assert_int_eq(dl_report_open(at("new.xml"), 0, &o, NULL, 0), 0);
    ck_assert_int_eq(count_tmp(), 1);
    dl_report_discard(o);
    ck_assert_int_eq(count_tmp(), 0);
    ck_assert_int_eq(access(at("new.xml"), F_OK), -1);
    char err[256] = "";
    ck_assert_int_eq(dl_report_open("", 0, &o, err, sizeof err), DL_EINVAL);
    ck_assert(err[0]);
    dl_check_report_free(&r);
    rm_dir();
}
END_TEST

/* ------------------------------------------------ 3. an empty output path */

START_TEST(empty_output_path_has_a_message)
{
    dl_golden_file_t g;
    tiny(&g);
    char err[256];
    memset(err, 'X', sizeof err); /* uninitialised-looking bytes must not survive */
    err[sizeof err - 1] = 0;
    ck_assert_int_eq(dl_golden_write("", &g, 0, NULL, NULL, err, sizeof err), DL_EINVAL);
    ck_assert_msg(strstr(err, "empty") != NULL, "'%s'", err);
    memset(err, 'X', sizeof err - 1);
    ck_assert_int_eq(dl_golden_write_candidate("", &g, 1, err, sizeof err), DL_EINVAL);
    ck_assert_msg(strstr(err, "empty") != NULL, "'%s'", err);
    dl_golden_free(&g);
}
END_TEST

/* ------------------------------ 8. the isolated loader names the file */

START_TEST(isolated_loader_names_the_file)
{
    static const char *const crashers[] = {
        "crash-hbo-H5HG_read-ca83fb89.h5",       "crash-hbo-H5MM_strdup-d0c9b718.h5",
        "crash-hbo-H5MM_xstrdup-170152d9.h5",    "crash-hbo-H5O_attr_exists-931675f3.h5",
        "crash-overlap-H5HG_read-ee1104eb.h5",   "crash-segv-H5O_attr_exists-fec5c102.h5",
        "crash-segv-H5O_msg_iterate-f742bb7f.h5", "crash-segv-H5VM_memcpyvv-ee5b0cec.h5",
        "oom-H5C_protect-059ecea1.h5"};
    dl_case_t c;
    ck_assert_int_eq(dl_case_find("tiny", &c), 0);
    const char *s = getenv("top_srcdir");
    for (size_t i = 0; i < sizeof crashers / sizeof crashers[0]; i++) {
        char p[1024], err[512] = "";
        snprintf(p, sizeof p, "%s/tests/fuzz/corpus/%s", s ? s : ".", crashers[i]);
        for (int as_golden = 0; as_golden < 2; as_golden++) {
            dl_golden_file_t g;
            int rc = dl_golden_load_isolated(p, as_golden ? NULL : &c.config, 10, &g, err, sizeof err);
            ck_assert_msg(rc < 0, "%s loads", p);
            ck_assert_msg(strstr(err, p) && !strchr(err, '\n'), "'%s' does not name %s", err, p);
        }
    }
    /* a golden file that sends HDF5 into an endless loop (deterministic):
     * the child is given up on at the time limit */
    {
        char p[1024], err[512] = "";
        snprintf(p, sizeof p, "%s/tests/fuzz/corpus/hang-golden-H5HG_protect-93777a74.h5",
                 s ? s : ".");
        dl_golden_file_t g;
        ck_assert_int_eq(dl_golden_load_isolated(p, NULL, 2, &g, err, sizeof err), DL_EFORMAT);
        ck_assert_msg(strstr(err, p) && strstr(err, "hung"), "%s", err);
    }
    /* a sealed golden skips the child, and still loads */
    dl_golden_file_t g;
    char err[512] = "";
    ck_assert_int_eq(dl_golden_load_isolated(vectors("tiny.h5"), NULL, 10, &g, err, sizeof err), 0);
    ck_assert(g.sealed && g.has_case && g.has_seed);
    dl_golden_free(&g);
}
END_TEST

/* ------------------------------------------- 9. signals and a killed writer */

static int g_sig;
static void raise_in_write(void *ctx, const char *phase, double done)
{
    (void)ctx;
    if (!strcmp(phase, "write") && done > 0.5)
        raise(g_sig);
}

/* Forks a writer that gets sig halfway through writing; returns how the
 * child ended. */
static int write_and_signal(int sig, const char *path)
{
    fflush(NULL);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        dl_golden_file_t g;
        tiny(&g);
        g_sig = sig;
        signal(sig, SIG_DFL); /* a background job's shell ignores SIGINT */
        dl_golden_write(path, &g, 0, raise_in_write, NULL, NULL, 0);
        _exit(0);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return st;
}

START_TEST(signals_remove_the_temporary)
{
    mk_dir();
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++) {
        int st = write_and_signal(sigs[i], at("g.h5"));
        ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == sigs[i], "signal %d: status %d", sigs[i], st);
        ck_assert_msg(count_tmp() == 0, "signal %d left the temporary", sigs[i]);
        ck_assert_int_eq(access(at("g.h5"), F_OK), -1);
    }
    rm_dir();
}
END_TEST

START_TEST(killed_writer_leaves_nothing_that_loads)
{
    mk_dir();
    int st = write_and_signal(SIGKILL, at("g.h5"));
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    ck_assert_int_eq(count_tmp(), 1); /* SIGKILL cannot be caught */
    DIR *d = opendir(dir);
    struct dirent *e;
    char tmp[512] = "";
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp-"))
            snprintf(tmp, sizeof tmp, "%s", at(e->d_name));
    closedir(d);
    dl_golden_file_t g;
    char err[512] = "";
    ck_assert_int_eq(dl_golden_load(tmp, &g, err, sizeof err), DL_EFORMAT);
    ck_assert_msg(strstr(err, "incomplete") != NULL, "%s", err);
    rm_dir();
}
END_TEST

/* ----------------------------------------------------- 10. small lies */

START_TEST(golden_case_attribute_must_be_a_name)
{
    mk_dir();
    dl_golden_file_t g;
    tiny(&g);
    snprintf(g.case_name, sizeof g.case_name, "zzqqzz");
    ck_assert_int_eq(dl_golden_write(at("n.h5"), &g, 0, NULL, NULL, NULL, 0), 0);
    dl_golden_free(&g);
    /* the fixed-length string sits in the root object header: patch it, reseal */
    FILE *f = fopen(at("n.h5"), "r+b");
    static unsigned char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    unsigned char *p = memmem(buf, n, "zzqqzz", 6);
    ck_assert_ptr_nonnull(p);
    fseek(f, (long)(p - buf), SEEK_SET);
    fwrite("zz/\001zz", 1, 6, f);
    fclose(f);
    ck_assert_int_eq(dl_golden_seal(at("n.h5"), NULL, 0), 0);
    char err[512] = "";
    ck_assert_int_eq(dl_golden_load(at("n.h5"), &g, err, sizeof err), DL_EFORMAT);
    ck_assert_msg(strstr(err, "'case'") && !strchr(err, '\001'), "%s", err);
    rm_dir();
}
END_TEST

START_TEST(group_sizes_message_does_not_clamp)
{
    dl_golden_file_t g;
    tiny(&g);
    dl_moe_inputs_t in = dl_golden_inputs_view(&g.in);
    dl_check_golden_t gold = {&g.config, &in, &g.fwd, &g.bwd, "tiny"};
    const int64_t E = g.config.route.experts, M = g.config.tokens * g.config.route.top_k;
    int64_t sizes[64];
    memcpy(sizes, g.fwd.group_sizes, (size_t)E * sizeof *sizes);
    dl_moe_forward_t f = g.fwd;
    f.group_sizes = sizes;
    sizes[0] = -7; /* out of range: must not be counted as M + 1 */
    dl_check_candidate_t c = {.fwd = f, .backend = "test"};
    dl_check_report_t r;
    ck_assert_int_eq(dl_check_run(&gold, &c, NULL, &r), 0);
    int found = 0;
    for (size_t i = 0; i < r.n; i++)
        if (!strcmp(r.results[i].check, "zero_drops")) {
            found = 1;
            ck_assert_int_eq(r.results[i].verdict, DL_VERDICT_FAIL);
            ck_assert_msg(strstr(r.results[i].message, "outside [0,") &&
                              !strstr(r.results[i].message, "account for"),
                          "%s", r.results[i].message);
        }
    ck_assert(found);
    dl_check_report_free(&r);
    /* in range but not summing to M: the real sum */
    memcpy(sizes, g.fwd.group_sizes, (size_t)E * sizeof *sizes);
    sizes[0] += 1;
    ck_assert_int_eq(dl_check_run(&gold, &c, NULL, &r), 0);
    char want[64];
    snprintf(want, sizeof want, "account for %lld of %lld", (long long)M + 1, (long long)M);
    found = 0;
    for (size_t i = 0; i < r.n; i++)
        found |= !strcmp(r.results[i].check, "zero_drops") && strstr(r.results[i].message, want);
    ck_assert_msg(found, "no zero_drops message with '%s'", want);
    dl_check_report_free(&r);
    dl_golden_free(&g);
}
END_TEST

START_TEST(seal_says_appended_or_truncated)
{
    mk_dir();
    dl_golden_file_t g;
    tiny(&g);
    ck_assert_int_eq(dl_golden_write(at("s.h5"), &g, 0, NULL, NULL, NULL, 0), 0);
    dl_golden_free(&g);
    FILE *f = fopen(at("s.h5"), "ab");
    fputs("trailing", f);
    fclose(f);
    char err[512] = "";
    ck_assert_int_eq(dl_golden_load(at("s.h5"), &g, err, sizeof err), DL_EFORMAT);
    ck_assert_msg(strstr(err, "appended") && !strstr(err, "truncated"), "%s", err);
    ck_assert_int_eq(truncate(at("s.h5"), 4000), 0);
    ck_assert_int_eq(dl_golden_load(at("s.h5"), &g, err, sizeof err), DL_EFORMAT);
    ck_assert_msg(strstr(err, "truncated") != NULL, "%s", err);
    ck_assert_int_eq(dl_golden_load(dir, &g, err, sizeof err), DL_EIO);
    ck_assert_msg(strstr(err, "is a directory") != NULL, "%s", err);
    rm_dir();
}
END_TEST

/* ------------------------- the case-file fuzz corpus: expected outcomes */

/* tests/fuzz/cases: ok-* parse to a valid case, error-* fail with one
 * line naming the file (and never line 0). */
START_TEST(case_corpus_outcomes)
{
    const char *s = getenv("top_srcdir");
    char d[1024];
    snprintf(d, sizeof d, "%s/tests/fuzz/cases", s ? s : ".");
    DIR *dp = opendir(d);
    ck_assert_ptr_nonnull(dp);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(dp))) {
        int ok = !strncmp(e->d_name, "ok-", 3), bad = !strncmp(e->d_name, "error-", 6);
        if (!ok && !bad)
            continue;
        char p[1400], zero[1410], err[512] = "";
        snprintf(p, sizeof p, "%s/%s", d, e->d_name);
        snprintf(zero, sizeof zero, "%s:0:", p);
        dl_case_t c;
        int rc = dl_case_parse_file(p, &c, err, sizeof err);
        if (ok)
            ck_assert_msg(rc == 0 && dl_moe_config_validate(&c.config) == 0, "%s: %s", p, err);
        else
            ck_assert_msg(rc < 0 && !strncmp(err, p, strlen(p)) && !strchr(err, '\n') &&
                              strncmp(err, zero, strlen(zero)),
                          "%s: rc %d, '%s'", p, rc, err);
        n++;
    }
    closedir(dp);
    ck_assert_int_ge(n, 4);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("hardening", "outputs", report_refuses_existing_and_nonregular, 60),
        DL_TEST("hardening", "outputs", empty_output_path_has_a_message, 60),
        DL_TEST("hardening", "outputs", signals_remove_the_temporary, 60),
        DL_TEST("hardening", "outputs", killed_writer_leaves_nothing_that_loads, 60),
        DL_TEST("hardening", "inputs", isolated_loader_names_the_file, 120),
        DL_TEST("hardening", "inputs", golden_case_attribute_must_be_a_name, 120),
        DL_TEST("hardening", "inputs", group_sizes_message_does_not_clamp, 120),
        DL_TEST("hardening", "inputs", seal_says_appended_or_truncated, 120),
        DL_TEST("hardening", "inputs", case_corpus_outcomes, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
