/* The streaming generator (src/golden/stream.c): whole files byte-identical
 * to the in-memory generator's, expert slices equal element for element to
 * the same slice of the whole file, bad ranges refused without leaving a
 * file, and the memory estimate that `dropless gen` refuses by. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <hdf5.h>
#include "tap.h"
#include "dropless.h"
#include "golden/golden_priv.h"

static char dir[256];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "%s/dl_stream.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* The whole content of a file, or NULL. */
static unsigned char *slurp(const char *path, long *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)*n + 1);
    if (p && fread(p, 1, (size_t)*n, f) != (size_t)*n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    return p;
}

static const char *const small_cases[] = {"mixtral-small", "deepseek-v3-small-bf16",
                                          "empty-experts-fp16", "plain-ffn", "no-tokens",
                                          "zipf", "ties-grouped", "odd-shapes-bf16"};
#define NSMALL ((int)(sizeof small_cases / sizeof small_cases[0]))

START_TEST(stream_bytes_equal_in_memory_bytes)
{
    make_dir();
    for (int i = 0; i < NSMALL; i++) {
        dl_case_t c;
        ck_assert_int_eq(dl_case_find(small_cases[i], &c), 0);
        char a[400], b[400], err[512];
        snprintf(a, sizeof a, "%s/%s.mem.h5", dir, c.name);
        snprintf(b, sizeof b, "%s/%s.stream.h5", dir, c.name);
        dl_golden_gen_opts_t om = {0}, os = {0};
        os.stream = 1;
        ck_assert_int_eq(dl_golden_gen_file(&c, a, &om, NULL, err, sizeof err), 0);
        ck_assert_msg(dl_golden_gen_file(&c, b, &os, NULL, err, sizeof err) == 0, "%s", err);
        long na, nb;
        unsigned char *pa = slurp(a, &na), *pb = slurp(b, &nb);
        ck_assert_ptr_nonnull(pa);
        ck_assert_ptr_nonnull(pb);
        ck_assert_msg(na == nb && memcmp(pa, pb, (size_t)na) == 0, "%s: streamed bytes differ",
                      c.name);
        /* negative control: one changed byte is seen */
        pb[na / 2] ^= 1;
        ck_assert(memcmp(pa, pb, (size_t)na) != 0);
        free(pa);
        free(pb);
        /* and it loads as a golden file */
        dl_golden_file_t g;
        ck_assert_msg(dl_golden_load(b, &g, err, sizeof err) == 0, "%s", err);
        ck_assert(g.sealed && g.has_backward);
        dl_golden_free(&g);
    }
    remove_dir();
}
END_TEST

/* Reads dataset path of an HDF5 file as floats or int64 (by elem), all of
 * it; *n elements; NULL if absent. */
static void *read_ds(hid_t f, const dl_golden_dataset_t *ds, int64_t *n)
{
    if (H5Lexists(f, ds->path, H5P_DEFAULT) <= 0)
        return NULL;
    hid_t d = H5Dopen2(f, ds->path, H5P_DEFAULT);
    hid_t sp = H5Dget_space(d);
    *n = (int64_t)H5Sget_simple_extent_npoints(sp);
    size_t sz = ds->elem == DL_GOLDEN_INT64 ? 8 : 4;
    void *p = malloc((size_t)(*n > 0 ? *n : 1) * sz);
    hid_t mt = ds->elem == DL_GOLDEN_FLOAT   ? H5T_NATIVE_FLOAT
               : ds->elem == DL_GOLDEN_INT32 ? H5T_NATIVE_INT32
                                             : H5T_NATIVE_INT64;
    if (*n > 0)
        ck_assert_int_ge(H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, p), 0);
    H5Sclose(sp);
    H5Dclose(d);
    return p;
}

static int64_t root_attr(hid_t f, const char *name)
{
    int64_t v = -1;
    if (H5Aexists(f, name) <= 0)
        return -1;
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    ck_assert_int_ge(H5Aread(a, H5T_NATIVE_INT64, &v), 0);
    H5Aclose(a);
    return v;
}

/* Checks a slice file against the in-memory generation g: every dataset
 * present is the same bytes as g's slice of it, and exactly the ones that
 * need every expert are absent. */
static void check_slice(const char *path, dl_golden_file_t *g, int64_t A, int64_t B)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    ck_assert_int_eq(root_attr(f, "expert_begin"), A);
    ck_assert_int_eq(root_attr(f, "expert_end"), B);
    const dl_moe_config_t *c = &g->config;
    const int64_t d = c->hidden, ff = c->ffn, r0 = g->fwd.group_offsets[A],
                  r1 = g->fwd.group_offsets[B];
    int compared = 0;
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        if (!dl_golden_dataset_applies(ds, c))
            continue;
        int64_t n, dims[3], full = dl_golden_dataset_shape(ds, c, dims);
        void *got = read_ds(f, ds, &n);
        int whole_only = !strcmp(ds->name, "out") || !strcmp(ds->name, "d_topk_weights") ||
                         !strcmp(ds->name, "d_x") || !strncmp(ds->name, "d_router_", 9);
        if (whole_only) {
            ck_assert_msg(got == NULL, "%s present in a slice", ds->path);
            continue;
        }
        ck_assert_msg(got != NULL, "%s absent from a slice", ds->path);
        const char *want = *(const char **)dl_golden_slot(g, ds);
        size_t sz = ds->elem == DL_GOLDEN_INT64 ? 8 : 4;
        int64_t from = 0, count = full;
        if (ds->rank == 3 && ds->dims[0] == 'E') {
            int64_t per = full / dims[0];
            from = A * per;
            count = (B - A) * per;
        } else if (ds->rank == 2 && ds->dims[0] == 'M') {
            int64_t per = ds->dims[1] == 'd' ? d : ff;
            from = r0 * per;
            count = (r1 - r0) * per;
        }
        ck_assert_int_eq(n, count);
        ck_assert_msg(count == 0 || memcmp(got, want + from * (int64_t)sz, (size_t)count * sz) == 0,
                      "%s: slice %lld:%lld differs", ds->path, (long long)A, (long long)B);
        compared++;
        free(got);
    }
    ck_assert_int_ge(compared, 15);
    H5Fclose(f);
}

START_TEST(slices_equal_the_whole_files_slice)
{
    make_dir();
    static const struct { const char *name; int64_t a, b; } sl[] = {
        {"mixtral-small", 0, 1},          {"mixtral-small", 2, 5},
        {"mixtral-small", 7, 8},          {"deepseek-v3-small-bf16", 8, 24},
        {"empty-experts-fp16", 0, 1},     /* an expert without tokens: zero rows */
        {"empty-experts-fp16", 3, 8},     {"plain-ffn", 1, 4},
        {"zipf", 5, 16},
    };
    for (size_t i = 0; i < sizeof sl / sizeof sl[0]; i++) {
        dl_case_t c;
        ck_assert_int_eq(dl_case_find(sl[i].name, &c), 0);
        dl_golden_file_t g;
        ck_assert_int_eq(dl_golden_generate(&c, NULL, &g, NULL, NULL, 0), 0);
        char p[400], err[512];
        snprintf(p, sizeof p, "%s/%s.%lld.h5", dir, c.name, (long long)sl[i].a);
        dl_golden_gen_opts_t o = {0};
        o.expert_begin = sl[i].a;
        o.expert_end = sl[i].b;
        ck_assert_msg(dl_golden_gen_file(&c, p, &o, NULL, err, sizeof err) == 0, "%s", err);
        check_slice(p, &g, sl[i].a, sl[i].b);
        dl_golden_free(&g);
    }
    remove_dir();
}
END_TEST

START_TEST(bad_ranges_refused_nothing_written)
{
    make_dir();
    dl_case_t c;
    ck_assert_int_eq(dl_case_find("mixtral-small", &c), 0);
    static const int64_t bad[][2] = {{3, 3}, {5, 2}, {0, 9}, {-1, 2}, {8, 9}};
    char p[400], err[512];
    snprintf(p, sizeof p, "%s/x.h5", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dl_golden_gen_opts_t o = {0};
        o.expert_begin = bad[i][0];
        o.expert_end = bad[i][1];
        err[0] = '\0';
        ck_assert_int_eq(dl_golden_gen_file(&c, p, &o, NULL, err, sizeof err), DL_EINVAL);
        ck_assert_msg(strstr(err, "expert range") != NULL, "%s", err);
        struct stat st;
        ck_assert_int_ne(stat(p, &st), 0);
    }
    /* an existing file is kept without force */
    dl_golden_gen_opts_t o = {0};
    o.stream = 1;
    ck_assert_int_eq(dl_golden_gen_file(&c, p, &o, NULL, err, sizeof err), 0);
    ck_assert_int_eq(dl_golden_gen_file(&c, p, &o, NULL, err, sizeof err), DL_EEXIST);
    o.force = 1;
    ck_assert_int_eq(dl_golden_gen_file(&c, p, &o, NULL, err, sizeof err), 0);
    /* no temporary file is left behind */
    char cmd[400];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -q tmp-", dir);
    ck_assert_int_ne(system(cmd), 0);
    remove_dir();
}
END_TEST

START_TEST(memory_estimates)
{
    dl_case_t c;
    ck_assert_int_eq(dl_case_find("mixtral-layer", &c), 0);
    dl_golden_gen_opts_t s = {0};
    s.stream = 1;
    int64_t mem = dl_case_memory_bytes(&c, NULL), str = dl_case_memory_bytes(&c, &s);
    ck_assert_int_ge(mem, dl_case_data_bytes(&c));
    ck_assert_int_lt(str, INT64_C(6) << 30); /* inputs + activations + one expert */
    ck_assert_int_gt(str, INT64_C(2) << 30);
    /* a slice is streamed */
    dl_golden_gen_opts_t e = {0};
    e.expert_end = 1;
    ck_assert_int_eq(dl_case_memory_bytes(&c, &e), str);
    /* a case file's absurd token count: far beyond any machine */
    c.config.tokens = 1000000000;
    c.config.route.top_k = 2;
    ck_assert_int_gt(dl_case_memory_bytes(&c, &s), INT64_C(1) << 44);
    ck_assert_int_eq(dl_case_memory_bytes(NULL, NULL), DL_EINVAL);
    /* the small cases: about their file */
    ck_assert_int_eq(dl_case_find("tiny", &c), 0);
    ck_assert_int_lt(dl_case_memory_bytes(&c, NULL), INT64_C(256) << 20);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("stream", "stream_bytes_equal_in_memory_bytes", stream_bytes_equal_in_memory_bytes, 120),
        DL_TEST("stream", "slices_equal_the_whole_files_slice", slices_equal_the_whole_files_slice, 120),
        DL_TEST("stream", "bad_ranges_refused_nothing_written", bad_ranges_refused_nothing_written, 120),
        DL_TEST("stream", "memory_estimates", memory_estimates, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
