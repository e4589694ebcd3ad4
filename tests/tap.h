/* Runs Check suites with TAP on stdout, one line per test, for automake's
 * TAP driver. Shared by every test program. */
#ifndef DL_TEST_TAP_H
#define DL_TEST_TAP_H
#include <check.h>
#include <stdlib.h>

static inline int dl_test_run(Suite **suites, int n)
{
    SRunner *sr = srunner_create(suites[0]);
    for (int i = 1; i < n; i++)
        srunner_add_suite(sr, suites[i]);
    srunner_set_tap(sr, "-");
    srunner_run_all(sr, CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
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
