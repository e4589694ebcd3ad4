/* Token bookkeeping: argsort, sizes, offsets, permute, combine, un-permute. */
#include "config.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "mpref.h"

/* Tolerances: none; combine must equal MPFR's exact weighted sum rounded once. */

typedef struct {
    int64_t T, k, E;
    int32_t *ids, *perm, *inv;
    int64_t *sizes, *offsets;
} sorted_t;

static sorted_t *sort_new(int64_t T, int64_t k, int64_t E)
{
    sorted_t *s = calloc(1, sizeof *s);
    s->T = T, s->k = k, s->E = E;
    s->ids = calloc((size_t)(T * k + 1), sizeof(int32_t));
    s->perm = calloc((size_t)(T * k + 1), sizeof(int32_t));
    s->inv = calloc((size_t)(T * k + 1), sizeof(int32_t));
    s->sizes = calloc((size_t)E, sizeof(int64_t));
    s->offsets = calloc((size_t)E + 1, sizeof(int64_t));
    return s;
}

static void sort_free(sorted_t *s)
{
    free(s->ids), free(s->perm), free(s->inv), free(s->sizes), free(s->offsets), free(s);
}

/* Properties every sort must have, checked against a recount. The
 * properties are collected and asserted once each: Check's assertions
 * cost a message to the parent process apiece, which made this test
 * exceed Check's time-out under a sanitizer build (issue 17). */
static void check_sorted(const sorted_t *s)
{
    int64_t M = s->T * s->k;
    ck_assert_int_eq(dl_sort_assignments(s->ids, s->T, s->k, s->E, s->perm, s->inv, s->sizes,
                                         s->offsets), 0);
    char *seen = calloc((size_t)M + 1, 1);
    int64_t *count = calloc((size_t)s->E + 1, sizeof *count);
    ck_assert(seen && count);
    for (int64_t f = 0; f < M; f++)
        count[s->ids[f]]++;
    int64_t total = 0, bad_size = -1, bad_offset = -1, bad_perm = -1;
    for (int64_t e = 0; e < s->E; e++) {
        if (s->sizes[e] != count[e] && bad_size < 0)
            bad_size = e;
        if (s->offsets[e] != total && bad_offset < 0)
            bad_offset = e;
        total += count[e];
    }
    ck_assert_msg(bad_size < 0, "sizes[%lld] is not the recount", (long long)bad_size);
    ck_assert_msg(bad_offset < 0, "offsets[%lld] is not the prefix sum", (long long)bad_offset);
    ck_assert_int_eq(s->offsets[s->E], M); /* sizes sum to T*k */
    for (int64_t p = 0; p < M && bad_perm < 0; p++) {
        int32_t f = s->perm[p];
        if (f < 0 || f >= M || seen[f] || s->inv[f] != p) { /* a bijection, inv its inverse */
            bad_perm = p;
            break;
        }
        seen[f] = 1;
        int32_t e = s->ids[f];
        if (p < s->offsets[e] || p >= s->offsets[e + 1] || /* in its group */
            (p > s->offsets[e] && s->perm[p - 1] >= f))   /* stable: flat order within a group */
            bad_perm = p;
    }
    ck_assert_msg(bad_perm < 0, "perm[%lld] breaks the sort's properties", (long long)bad_perm);
    free(seen);
    free(count);
}

START_TEST(sort_random)
{
    dl_test_rng_t r = {11};
    for (int it = 0; it < 200; it++) {
        int64_t E = 1 + dl_test_next(&r) % 40, k = 1 + dl_test_next(&r) % E,
                T = dl_test_next(&r) % 100;
        sorted_t *s = sort_new(T, k, E);
        for (int64_t f = 0; f < T * k; f++)
            s->ids[f] = (int32_t)(dl_test_next(&r) % E);
        check_sorted(s);
        sort_free(s);
    }
}
END_TEST

START_TEST(sort_edges)
{
    /* T = 0 */
    sorted_t *s = sort_new(0, 2, 4);
    check_sorted(s);
    for (int e = 0; e < 4; e++)
        ck_assert_int_eq(s->sizes[e], 0);
    sort_free(s);
    /* E = 1, k = 1 */
    s = sort_new(5, 1, 1);
    check_sorted(s);
    ck_assert_int_eq(s->sizes[0], 5);
    sort_free(s);
    /* k = E: every expert once per token */
    s = sort_new(7, 4, 4);
    for (int t = 0; t < 7; t++)
        for (int j = 0; j < 4; j++)
            s->ids[t * 4 + j] = 3 - j;
    check_sorted(s);
    sort_free(s);
    /* all tokens to one expert; empty experts first, middle, last */
    int32_t hot[] = {0, 2, 5};
    for (int h = 0; h < 3; h++) {
        s = sort_new(9, 1, 6);
        for (int t = 0; t < 9; t++)
            s->ids[t] = hot[h];
        check_sorted(s);
        ck_assert_int_eq(s->sizes[hot[h]], 9);
        sort_free(s);
    }
    s = sort_new(6, 2, 5); /* experts 0, 2, 4 empty */
    int32_t ids[] = {1, 3, 3, 1, 1, 3, 3, 1, 1, 3, 3, 1};
    memcpy(s->ids, ids, sizeof ids);
    check_sorted(s);
    ck_assert(s->sizes[0] == 0 && s->sizes[2] == 0 && s->sizes[4] == 0);
    sort_free(s);
}
END_TEST

START_TEST(sort_bad_input)
{
    int32_t ids[4] = {0, 1, 4, 2}, perm[4];
    int64_t sizes[4], off[5];
    ck_assert_int_eq(dl_sort_assignments(ids, 2, 2, 4, perm, NULL, sizes, off), DL_ERANGE);
    ids[2] = -1;
    ck_assert_int_eq(dl_sort_assignments(ids, 2, 2, 4, perm, NULL, sizes, off), DL_ERANGE);
    ck_assert_int_eq(dl_sort_assignments(ids, -1, 2, 4, perm, NULL, sizes, off), DL_EINVAL);
    ck_assert_int_eq(dl_sort_assignments(ids, 2, 0, 4, perm, NULL, sizes, off), DL_EINVAL);
    /* T*k past int32 and past int64 */
    ck_assert_int_eq(dl_sort_assignments(ids, INT64_C(1) << 30, 4, 4, perm, NULL, sizes, off),
                     DL_EOVERFLOW);
    ck_assert_int_eq(dl_sort_assignments(ids, INT64_MAX / 2, 4, 4, perm, NULL, sizes, off),
                     DL_EOVERFLOW);
}
END_TEST

START_TEST(permute_rows)
{
    dl_test_rng_t r = {5};
    int64_t T = 13, k = 3, E = 5, d = 7;
    sorted_t *s = sort_new(T, k, E);
    for (int64_t f = 0; f < T * k; f++)
        s->ids[f] = (int32_t)(dl_test_next(&r) % E);
    check_sorted(s);
    float *x = malloc(T * d * sizeof *x), *xs = malloc(T * k * d * sizeof *xs);
    for (int64_t i = 0; i < T * d; i++)
        x[i] = (float)dl_test_normal(&r);
    ck_assert_int_eq(dl_permute(x, T, d, k, s->perm, xs), 0);
    for (int64_t p = 0; p < T * k; p++)
        ck_assert(memcmp(xs + p * d, x + (s->perm[p] / k) * d, d * sizeof *x) == 0);
    s->perm[3] = (int32_t)(T * k);
    ck_assert_int_eq(dl_permute(x, T, d, k, s->perm, xs), DL_ERANGE);
    free(x), free(xs);
    sort_free(s);
}
END_TEST

/* combine and un-permute against MPFR, at random and with cancellation
 * engineered so that the binary64 certificate fails and the exact path runs. */
static void combine_case(dl_test_rng_t *r, int64_t T, int64_t k, int64_t E, int64_t d,
                         dl_dtype_t t, int cancel)
{
    sorted_t *s = sort_new(T, k, E);
    for (int64_t f = 0; f < T * k; f++)
        s->ids[f] = (int32_t)(dl_test_next(r) % E);
    check_sorted(s);
    int64_t M = T * k;
    float *y = malloc((M * d + 1) * sizeof *y), *w = malloc((M + 1) * sizeof *w);
    float *out = malloc((T * d + 1) * sizeof *out), *out2 = malloc((T * d + 1) * sizeof *out2);
    for (int64_t i = 0; i < M * d; i++)
        y[i] = (float)dl_round(dl_test_normal(r) * ldexp(1, (int)(dl_test_next(r) % 16) - (t == DL_F16 ? 12 : 8)), t);
    for (int64_t i = 0; i < M; i++)
        w[i] = (float)dl_test_unif(r);
    if (cancel && k >= 2) /* slot 1 cancels slot 0 up to a tiny residue */
        for (int64_t tk = 0; tk < T; tk++) {
            w[tk * k + 1] = w[tk * k];
            for (int64_t i = 0; i < d; i++)
                y[s->inv[tk * k + 1] * d + i] = -y[s->inv[tk * k] * d + i];
        }
    ck_assert_int_eq(dl_combine(y, w, s->inv, T, k, d, t, out), 0);
    double *a = malloc(k * sizeof *a), *b = malloc(k * sizeof *b);
    for (int64_t tk = 0; tk < T; tk++)
        for (int64_t i = 0; i < d; i++) {
            for (int64_t j = 0; j < k; j++) {
                a[j] = w[tk * k + j];
                b[j] = y[s->inv[tk * k + j] * d + i];
            }
            double want = mpref_dot(a, b, k, t);
            ck_assert_msg(same_value(out[tk * d + i], want), "combine t=%lld i=%lld: %a vs %a",
                          (long long)tk, (long long)i, (double)out[tk * d + i], want);
        }
    ck_assert_int_eq(dl_unpermute_sum(y, s->inv, T, k, d, t, out2), 0);
    for (int64_t tk = 0; tk < T; tk++)
        for (int64_t i = 0; i < d; i++) {
            for (int64_t j = 0; j < k; j++) {
                a[j] = 1.0;
                b[j] = y[s->inv[tk * k + j] * d + i];
            }
            ck_assert(same_value(out2[tk * d + i], mpref_dot(a, b, k, t)));
        }
    /* thread count cannot change a bit */
    omp_set_num_threads(1);
    float *o1 = malloc((T * d + 1) * sizeof *o1);
    dl_combine(y, w, s->inv, T, k, d, t, o1);
    omp_set_num_threads(2);
    ck_assert(memcmp(o1, out, T * d * sizeof *o1) == 0);
    free(o1), free(a), free(b), free(y), free(w), free(out), free(out2);
    sort_free(s);
}

START_TEST(combine_exact)
{
    dl_test_rng_t r = {77};
    static const dl_dtype_t ts[] = {DL_F32, DL_BF16, DL_F16};
    for (int it = 0; it < 60; it++) {
        int64_t E = 1 + dl_test_next(&r) % 9, k = 1 + dl_test_next(&r) % E;
        combine_case(&r, dl_test_next(&r) % 20, k, E, 1 + dl_test_next(&r) % 9, ts[it % 3],
                     it % 2);
    }
    combine_case(&r, 0, 2, 4, 8, DL_F32, 0); /* no tokens */
}
END_TEST

START_TEST(combine_bad_input)
{
    float y[4] = {1, 2, 3, NAN}, w[2] = {1, 1}, out[2];
    int32_t inv[2] = {0, 1};
    ck_assert_int_eq(dl_combine(y, w, inv, 1, 2, 2, DL_F32, out), DL_ENONFINITE);
    inv[1] = 2;
    ck_assert_int_eq(dl_combine(y, w, inv, 1, 2, 2, DL_F32, out), DL_ERANGE);
    ck_assert_int_eq(dl_combine(y, w, inv, 1, 0, 2, DL_F32, out), DL_EINVAL);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("argsort", "sort", sort_random, 0),
        DL_TEST("argsort", "sort", sort_edges, 0),
        DL_TEST("argsort", "sort", sort_bad_input, 0),
        DL_TEST("permute-combine", "rows", permute_rows, 120),
        DL_TEST("permute-combine", "rows", combine_exact, 120),
        DL_TEST("permute-combine", "rows", combine_bad_input, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
