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
