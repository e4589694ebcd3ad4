/* Runs Check suites with TAP on stdout, one line per test, for automake's
 * TAP driver. Shared by every test program. */
#ifndef DL_TEST_TAP_H
#define DL_TEST_TAP_H
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tests a program cannot run here (a tool missing), reported as TAP SKIPs
 * after Check's own lines: Check itself has no skipped tests. */
#define DL_TEST_MAX_SKIPS 16
static const char *dl__test_skips[DL_TEST_MAX_SKIPS];
static int dl__test_nskips;
static inline void dl_test_skip(const char *what)
{
    if (dl__test_nskips < DL_TEST_MAX_SKIPS)
        dl__test_skips[dl__test_nskips++] = what;
}

/* Runs the suites with Check's TAP output, then the skips, then the plan. */
static inline int dl_test_run(Suite **suites, int n)
{
    SRunner *sr = srunner_create(suites[0]);
    for (int i = 1; i < n; i++)
        srunner_add_suite(sr, suites[i]);
    char path[] = "/tmp/dl_tap_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return EXIT_FAILURE;
    close(fd);
    srunner_set_tap(sr, path);
    srunner_run_all(sr, CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    FILE *f = fopen(path, "r");
    char line[4096];
    int count = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "1..", 3))
            continue; /* the plan comes last, with the skips counted */
        count += !strncmp(line, "ok ", 3) || !strncmp(line, "not ok ", 7);
        fputs(line, stdout);
    }
    if (f)
        fclose(f);
    unlink(path);
    for (int i = 0; i < dl__test_nskips; i++)
        printf("ok %d # SKIP %s\n", ++count, dl__test_skips[i]);
    printf("1..%d\n", count);
    return failed || !f ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* One row of a test program's table: the suite and test case it belongs to
 * (each created on first use, in table order), the Check test (a
 * START_TEST name), a loop range [lo, hi) for tcase_add_loop_test (hi = 0:
 * run once) and the test case's timeout in seconds (0: Check's default).
 * Every test program registers its tests this one way. */
typedef struct {
    const char *suite, *tcase;
    const TTest *test;
    int lo, hi;
    double timeout;
} dl_test_t;
#define DL_TEST(suite, tcase, fn, timeout) {suite, tcase, fn, 0, 0, timeout}
#define DL_TEST_LOOP(suite, tcase, fn, lo, hi, timeout) {suite, tcase, fn, lo, hi, timeout}
#define DL_TEST_MAX_SUITES 32
#define DL_TEST_MAX_TCASES 128

/* Builds the suites from the table and runs them (dl_test_run). */
static inline int dl_test_main(const dl_test_t *t, int n)
{
    Suite *su[DL_TEST_MAX_SUITES];
    const char *su_name[DL_TEST_MAX_SUITES];
    TCase *tc[DL_TEST_MAX_TCASES];
    const char *tc_name[DL_TEST_MAX_TCASES];
    int tc_suite[DL_TEST_MAX_TCASES], ns = 0, nt = 0;
    for (int i = 0; i < n; i++) {
        int s = 0, c = 0;
        while (s < ns && strcmp(su_name[s], t[i].suite))
            s++;
        if (s == ns) {
            if (ns == DL_TEST_MAX_SUITES)
                return EXIT_FAILURE;
            su_name[ns] = t[i].suite;
            su[ns++] = suite_create(t[i].suite);
        }
        while (c < nt && (tc_suite[c] != s || strcmp(tc_name[c], t[i].tcase)))
            c++;
        if (c == nt) {
            if (nt == DL_TEST_MAX_TCASES)
                return EXIT_FAILURE;
            tc_name[nt] = t[i].tcase;
            tc_suite[nt] = s;
            tc[nt] = tcase_create(t[i].tcase);
            suite_add_tcase(su[s], tc[nt++]);
        }
        if (t[i].timeout > 0)
            tcase_set_timeout(tc[c], t[i].timeout);
        if (t[i].hi > 0)
            tcase_add_loop_test(tc[c], t[i].test, t[i].lo, t[i].hi);
        else
            tcase_add_test(tc[c], t[i].test);
    }
    return ns ? dl_test_run(su, ns) : EXIT_FAILURE;
}

/* splitmix64: a tiny reproducible generator for test inputs. */
typedef struct { uint64_t s; } dl_test_rng_t;
static inline uint64_t dl_test_next(dl_test_rng_t *r)
{
    uint64_t z = (r->s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}
/* uniform in [0, 1) with 53 random bits */
static inline double dl_test_unif(dl_test_rng_t *r)
{
    return (double)(dl_test_next(r) >> 11) * 0x1p-53;
}
/* a standard normal (Box-Muller; the test only needs a spread of values) */
double dl_test_normal(dl_test_rng_t *r);
#include <math.h>
inline double dl_test_normal(dl_test_rng_t *r)
{
    double u1 = dl_test_unif(r), u2 = dl_test_unif(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
#endif
