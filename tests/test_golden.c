/* Golden files: the PRNG and input generation against an independent
 * reading of doc/format.md (and MPFR for rounding and ln), the catalogue,
 * case files, the writer/reader round trip, byte-reproducibility, and the
 * readers on damaged, truncated and wrongly shaped files (written here with
 * the HDF5 C API). */
#include "config.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <hdf5.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "tap.h"
#include "mpref.h"
#include "dropless.h"
#include "golden/golden_priv.h"

/* Tolerances. Integer and bit-level results have none. */
#define LN_MAX_REL_ERR 0x1p-49    /* dl_golden_ln is a fixed series, not correctly rounded */
#define NORMAL_SAMPLES 200000
#define NORMAL_MEAN_TOL 0.01      /* ~4.5 sigma for 2e5 samples */
#define NORMAL_VAR_TOL 0.02
#define FULL_SIGNIFICAND_MIN 0.97 /* fraction of fp32 inputs off the tf32 grid */
#define FLIP_STRIDE 97            /* byte-flip test: every 97th byte of a file */

/* ------------------------------------------------------------ helpers */

static char tmpdir[256];

static void mk_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dl_golden_test_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static void rm_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    if (!d)
        return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(tmpdir);
}

static char *tpath(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    ck_assert(fread(b, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void spit(const char *path, const unsigned char *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert(fwrite(b, 1, n, f) == n);
    fclose(f);
}

static dl_moe_config_t small_config(dl_dtype_t t, int swiglu, int bias)
{
    dl_moe_config_t c = {.tokens = 6, .hidden = 5, .ffn = swiglu ? 7 : 5,
                         .route = {.experts = 4, .top_k = 2, .score_fn = DL_SCORE_SOFTMAX,
                                   .n_group = 1, .topk_group = 1, .group_score = DL_GROUP_MAX,
                                   .renormalize = 1, .scaling = 1.0, .has_bias = bias},
                         .ffn_kind = swiglu ? DL_FFN_SWIGLU : DL_FFN_PLAIN, .dtype = t};
    return c;
}

/* A synthetic, internally consistent file: random values on each dataset's
 * grid, random distinct ids, and the test's own counting sort. */
static void synth(dl_golden_file_t *g, const dl_moe_config_t *c, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    snprintf(g->case_name, sizeof g->case_name, "synthetic");
    g->seed = seed;
    g->config = *c;
    g->has_inputs = g->has_forward = g->has_backward = 1;
    dl_test_rng_t r = {seed};
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        if (!dl_golden_dataset_applies(ds, c))
            continue;
        int64_t dims[3];
        int64_t n = dl_golden_dataset_shape(ds, c, dims);
        ck_assert_int_ge(n, 0);
        size_t sz = ds->elem == DL_GOLDEN_INT64 ? 8 : 4;
        void *p = calloc((size_t)(n ? n : 1), sz);
        ck_assert_ptr_nonnull(p);
        *dl_golden_slot(g, ds) = p;
        if (ds->elem == DL_GOLDEN_FLOAT)
            for (int64_t j = 0; j < n; j++)
                ((float *)p)[j] = (float)dl_round(dl_test_normal(&r), dl_golden_dataset_dtype(ds, c));
    }
    int64_t T = c->tokens, k = c->route.top_k, E = c->route.experts;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(dl_test_next(&r) % (uint64_t)E);
                dup = 0;
                for (int64_t q = 0; q < j; q++)
                    dup |= g->fwd.topk_ids[t * k + q] == e;
            } while (dup);
            g->fwd.topk_ids[t * k + j] = e;
        }
    int64_t p = 0;
    g->fwd.group_offsets[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        for (int64_t f = 0; f < T * k; f++)
            if (g->fwd.topk_ids[f] == e) {
                g->fwd.sort_perm[p] = (int32_t)f;
                g->fwd.inv_perm[f] = (int32_t)p;
                p++;
                g->fwd.group_sizes[e]++;
            }
        g->fwd.group_offsets[e + 1] = p;
    }
}

static void assert_same_file_contents(dl_golden_file_t *a, dl_golden_file_t *b)
{
    ck_assert_str_eq(a->case_name, b->case_name);
    ck_assert(a->seed == b->seed);
    ck_assert(memcmp(&a->config.route.scaling, &b->config.route.scaling, sizeof(double)) == 0);
    ck_assert(a->config.tokens == b->config.tokens && a->config.hidden == b->config.hidden &&
              a->config.ffn == b->config.ffn && a->config.dtype == b->config.dtype &&
              a->config.ffn_kind == b->config.ffn_kind &&
              a->config.route.experts == b->config.route.experts &&
              a->config.route.top_k == b->config.route.top_k &&
              a->config.route.score_fn == b->config.route.score_fn &&
              a->config.route.n_group == b->config.route.n_group &&
              a->config.route.topk_group == b->config.route.topk_group &&
              a->config.route.group_score == b->config.route.group_score &&
              !a->config.route.renormalize == !b->config.route.renormalize &&
              !a->config.route.has_bias == !b->config.route.has_bias);
    ck_assert_int_eq(a->has_inputs, b->has_inputs);
    ck_assert_int_eq(a->has_forward, b->has_forward);
    ck_assert_int_eq(a->has_backward, b->has_backward);
    int has[3] = {a->has_inputs, a->has_forward, a->has_backward};
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        void *pa = *dl_golden_slot(a, ds), *pb = *dl_golden_slot(b, ds);
        if (!has[ds->group] || !dl_golden_dataset_applies(ds, &a->config)) {
            ck_assert_msg(pb == NULL, "%s should be absent", ds->path);
            continue;
        }
        ck_assert_msg(pa && pb, "%s missing", ds->path);
        int64_t dims[3];
        int64_t n = dl_golden_dataset_shape(ds, &a->config, dims);
        size_t sz = ds->elem == DL_GOLDEN_INT64 ? 8 : 4;
        ck_assert_msg(memcmp(pa, pb, (size_t)n * sz) == 0, "%s differs", ds->path);
    }
}

/* HDF5 edits of an existing golden file, for the negative tests; each
 * re-seals the file, so that the readers' own checks are what is tested. */
static void reseal(const char *path)
{
    char err[512];
    ck_assert_msg(dl_golden_seal(path, err, sizeof err) == 0, "%s", err);
}

static hid_t h5open_rw(const char *path)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    return f;
}

static void h5_attr_str(hid_t obj, const char *name, const char *v)
{
    if (H5Aexists(obj, name) > 0)
        ck_assert_int_ge(H5Adelete(obj, name), 0);
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, H5T_VARIABLE);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, st, sp, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(a, 0);
    ck_assert_int_ge(H5Awrite(a, st, &v), 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(st);
}

static void h5_attr_i64(hid_t obj, const char *name, int64_t v)
{
    if (H5Aexists(obj, name) > 0)
        ck_assert_int_ge(H5Adelete(obj, name), 0);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(a, 0);
    ck_assert_int_ge(H5Awrite(a, H5T_NATIVE_INT64, &v), 0);
    H5Aclose(a);
    H5Sclose(sp);
}

/* Replaces dataset dspath by one of the given file type and shape. */
static void h5_replace(const char *path, const char *dspath, hid_t ftype, int rank,
                       const hsize_t *dims, hid_t mtype, const void *data, const char *dtype_attr)
{
    hid_t f = h5open_rw(path);
    if (H5Lexists(f, dspath, H5P_DEFAULT) > 0)
        ck_assert_int_ge(H5Ldelete(f, dspath, H5P_DEFAULT), 0);
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t d = H5Dcreate2(f, dspath, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    if (data)
        ck_assert_int_ge(H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
    if (dtype_attr)
        h5_attr_str(d, "dtype", dtype_attr);
    H5Dclose(d);
    H5Sclose(sp);
    H5Fclose(f);    reseal(path);
}

/* Element `flat` of a one-dimensional int32 dataset. */
static int32_t h5_get_i32(const char *path, const char *dspath, hsize_t flat)
{
    hid_t f = h5open_rw(path);
    hid_t d = H5Dopen2(f, dspath, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    hid_t fs = H5Dget_space(d);
    hsize_t one = 1;
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, &flat, NULL, &one, NULL);
    hid_t ms = H5Screate_simple(1, &one, NULL);
    int32_t v = 0;
    ck_assert_int_ge(H5Dread(d, H5T_NATIVE_INT32, ms, fs, H5P_DEFAULT, &v), 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
    H5Fclose(f);
    return v;
}

static void h5_set_elem(const char *path, const char *dspath, hsize_t flat, hid_t mtype,
                        const void *v)
{
    hid_t f = h5open_rw(path);
    hid_t d = H5Dopen2(f, dspath, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    hid_t fs = H5Dget_space(d);
    int rank = H5Sget_simple_extent_ndims(fs);
    hsize_t dims[3], start[3], one[3] = {1, 1, 1};
    H5Sget_simple_extent_dims(fs, dims, NULL);
    for (int i = rank - 1; i >= 0; i--) {
        start[i] = flat % dims[i];
        flat /= dims[i];
    }
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, one, NULL);
    hid_t ms = H5Screate_simple(1, one, NULL);
    ck_assert_int_ge(H5Dwrite(d, mtype, ms, fs, H5P_DEFAULT, v), 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
    H5Fclose(f);    reseal(path);
}

static void h5_delete(const char *path, const char *objpath)
{
    hid_t f = h5open_rw(path);
    ck_assert_int_ge(H5Ldelete(f, objpath, H5P_DEFAULT), 0);
    H5Fclose(f);    reseal(path);
}

static void h5_obj_attr_str(const char *path, const char *obj, const char *name, const char *v)
{
    hid_t f = h5open_rw(path);
    hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
    ck_assert_int_ge(o, 0);
    h5_attr_str(o, name, v);
    H5Oclose(o);
    H5Fclose(f);    reseal(path);
}

static void h5_obj_attr_i64(const char *path, const char *obj, const char *name, int64_t v)
{
    hid_t f = h5open_rw(path);
    hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
    ck_assert_int_ge(o, 0);
    h5_attr_i64(o, name, v);
    H5Oclose(o);
    H5Fclose(f);    reseal(path);
}

/* A valid golden file at tmpdir/name for configuration c. */
static void write_valid(const char *name, const dl_moe_config_t *c)
{
    dl_golden_file_t g;
    synth(&g, c, 99);
    char err[512];
    int rc = dl_golden_write(tpath(name), &g, 1, NULL, NULL, err, sizeof err);
    ck_assert_msg(rc == 0, "write: %s", err);
    dl_golden_free(&g);
}

/* Loads and expects failure code `code` with a one-line message naming the
 * file and (if given) the object. */
static void expect_load_error(const char *path, int code, const char *object)
{
    dl_golden_file_t g;
    char err[512] = "";
    int rc = dl_golden_load(path, &g, err, sizeof err);
    ck_assert_msg(rc == code, "%s: got %s (%s), want %s", path, dl_err_name(rc), err,
                  dl_err_name(code));
    ck_assert_msg(strstr(err, path) == err, "message does not start with the file: %s", err);
    ck_assert_msg(!strchr(err, '\n'), "message has a newline: %s", err);
    if (object)
        ck_assert_msg(strstr(err, object), "message does not name %s: %s", object, err);
    ck_assert_ptr_null(g.in.x);
    ck_assert_ptr_null(g.fwd.out);
}

/* A backend's file: a few stages, written directly with HDF5 the way an
 * adapter would (int64 ids, no dtype attributes, its own root attributes). */
static void write_candidate(const char *path, const dl_moe_config_t *c, int64_t bad_id,
                            const char *out_dtype, float out0)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    h5_attr_str(f, "backend", "test-backend 1.0");
    h5_attr_str(f, "compute_mode", "bf16");
    hid_t g = H5Gcreate2(f, "forward", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int64_t T = c->tokens, k = c->route.top_k, d = c->hidden;
    int64_t ids[64], perm[64];
    for (int64_t i = 0; i < T * k; i++) {
        ids[i] = i % c->route.experts;
        perm[i] = i == 0 ? -1 : i; /* a dropped assignment */
    }
    ids[0] = bad_id >= 0 ? bad_id : ids[0];
    float out[64];
    for (int64_t i = 0; i < T * d; i++)
        out[i] = (float)i;
    out[0] = out0;
    hsize_t dk[2] = {(hsize_t)T, (hsize_t)k}, dm[1] = {(hsize_t)(T * k)}, dd[2] = {(hsize_t)T, (hsize_t)d};
    hid_t sp = H5Screate_simple(2, dk, NULL);
    hid_t ds = H5Dcreate2(g, "topk_ids", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, ids);
    H5Dclose(ds);
    H5Sclose(sp);
    sp = H5Screate_simple(1, dm, NULL);
    ds = H5Dcreate2(g, "sort_perm", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, perm);
    H5Dclose(ds);
    H5Sclose(sp);
    sp = H5Screate_simple(2, dd, NULL);
    ds = H5Dcreate2(g, "out", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out);
    if (out_dtype)
        h5_attr_str(ds, "dtype", out_dtype);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Gclose(g);
    H5Fclose(f);
}

/* --------------------------------------------------------------- PRNG */

static uint64_t ref_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

START_TEST(rng_splitmix_known_answers)
{
    /* seed 0, stream 0 is plain splitmix64 started at state 0 */
    ck_assert(dl_golden_rng_u64(0, 0, 0) == 0xe220a8397b1dcdafull);
    ck_assert(dl_golden_rng_u64(0, 0, 1) == 0x6e789e6aa1b965f4ull);
    ck_assert(dl_golden_rng_u64(0, 0, 2) == 0x06c45d188009454full);
}
END_TEST

START_TEST(rng_sequential_reading_of_spec)
{
    /* The spec read as a sequential generator: state = key; repeat
     * { state += gamma; output mix(state) }. */
    const uint64_t seeds[] = {0, 1, 12345, 0xffffffffffffffffull};
    for (int s = 0; s < 4; s++)
        for (uint64_t stream = 0; stream < 10; stream++) {
            uint64_t state = ref_mix(seeds[s] + stream * 0x9e3779b97f4a7c15ull);
            for (uint64_t n = 0; n < 300; n++) {
                state += 0x9e3779b97f4a7c15ull;
                ck_assert(dl_golden_rng_u64(seeds[s], stream, n) == ref_mix(state));
            }
        }
}
END_TEST

START_TEST(rng_normal_irwin_hall)
{
    double sum = 0, sum2 = 0;
    for (uint64_t i = 0; i < NORMAL_SAMPLES; i++) {
        uint64_t s = 0;
        for (int j = 0; j < 12; j++)
            s += dl_golden_rng_u64(7, 3, 12 * i + (uint64_t)j) >> 32;
        double want = ldexp((double)s, -32) - 6.0; /* exact: s < 2^36 */
        double z = dl_golden_rng_normal(7, 3, i);
        ck_assert(z == want);
        ck_assert(z >= -6.0 && z < 6.0);
        sum += z;
        sum2 += z * z;
    }
    double mean = sum / NORMAL_SAMPLES, var = sum2 / NORMAL_SAMPLES - mean * mean;
    ck_assert_msg(fabs(mean) < NORMAL_MEAN_TOL, "mean %g", mean);
    ck_assert_msg(fabs(var - 1.0) < NORMAL_VAR_TOL, "variance %g", var);
}
END_TEST

START_TEST(rng_ln_vs_mpfr)
{
    mpfr_t m;
    mpfr_init2(m, 200);
    dl_test_rng_t r = {5};
    for (int i = 0; i < 20000; i++) {
        double x = i < 1000 ? (double)(i + 1) : ldexp(1.0 + dl_test_unif(&r), (int)(dl_test_next(&r) % 200) - 100);
        mpfr_set_d(m, x, MPFR_RNDN);
        mpfr_log(m, m, MPFR_RNDN);
        double want = mpfr_get_d(m, MPFR_RNDN), got = dl_golden_ln(x);
        double tol = x == 1.0 ? 0.0 : LN_MAX_REL_ERR * fabs(want);
        ck_assert_msg(fabs(got - want) <= tol, "ln(%a) = %a, MPFR %a", x, got, want);
    }
    mpfr_clear(m);
    ck_assert(dl_golden_ln(1.0) == 0.0);
}
END_TEST

/* ------------------------------------------------------------- inputs */

static int64_t count_of(const dl_golden_dataset_t *ds, const dl_moe_config_t *c)
{
    int64_t dims[3];
    return dl_golden_dataset_shape(ds, c, dims);
}

START_TEST(inputs_on_grid_and_finite)
{
    for (int i = 0; i < dl_case_count(); i++) {
        const dl_case_t *c = dl_case_get(i);
        if (c->large)
            continue;
        dl_golden_file_t g;
        memset(&g, 0, sizeof g);
        ck_assert_int_eq(dl_case_inputs(c, &g.in), 0);
        for (int j = 0; j < dl_golden_dataset_count(); j++) {
            const dl_golden_dataset_t *ds = dl_golden_dataset(j);
            if (ds->group != DL_GOLDEN_INPUTS)
                continue;
            float *v = *(float **)dl_golden_slot(&g, ds);
            if (!dl_golden_dataset_applies(ds, &c->config)) {
                ck_assert_ptr_null(v);
                continue;
            }
            ck_assert_ptr_nonnull(v);
            dl_dtype_t t = dl_golden_dataset_dtype(ds, &c->config);
            int64_t n = count_of(ds, &c->config);
            for (int64_t e = 0; e < n; e++)
                ck_assert_msg(isfinite(v[e]) && mpref_round_d(v[e], t) == v[e],
                              "%s %s[%lld] = %a", c->name, ds->name, (long long)e, (double)v[e]);
        }
        dl_golden_inputs_free(&g.in);
    }
}
END_TEST

/* Recomputes inputs from the text of doc/format.md with MPFR rounding. */
START_TEST(inputs_follow_the_spec)
{
    const char *names[] = {"mixtral-small", "mixtral-small-bf16", "zipf-fp16", "deepseek-v3-small"};
    for (int ci = 0; ci < 4; ci++) {
        dl_case_t c;
        ck_assert_int_eq(dl_case_find(names[ci], &c), 0);
        dl_golden_inputs_t in;
        ck_assert_int_eq(dl_case_inputs(&c, &in), 0);
        const dl_moe_config_t *k = &c.config;
        int64_t T = k->tokens, d = k->hidden, f = k->ffn, E = k->route.experts;
        dl_dtype_t t = k->dtype;
        double sd = 1.0 / sqrt((double)d), sf = 1.0 / sqrt((double)f);
        for (int64_t r = 0; r < T; r++)
            for (int64_t col = 0; col < d; col++) {
                double z = dl_golden_rng_normal(c.seed, 1, (uint64_t)(r * d + col));
                double want = col == 0 ? mpref_round_d(8.0 + z / 16.0, t) : mpref_round_d(z, t);
                ck_assert(in.x[r * d + col] == want);
                ck_assert(in.d_out[r * d + col] ==
                          mpref_round_d(dl_golden_rng_normal(c.seed, 7, (uint64_t)(r * d + col)), t));
            }
        for (int64_t e = 0; e < E; e++) {
            double b = c.inputs == DL_INPUTS_ZIPF ? -c.zipf_s * dl_golden_ln((double)(e + 1))
                                                  : 0.5 * dl_golden_rng_normal(c.seed, 8, (uint64_t)e);
            double g = dl_golden_rng_normal(c.seed, 2, (uint64_t)e);
            ck_assert(in.router_weight[e] == mpref_round_d((b + g * sd) * 0.125, DL_F32));
            for (int64_t row = 1; row < d; row++)
                ck_assert(in.router_weight[row * E + e] ==
                          mpref_round_d(dl_golden_rng_normal(c.seed, 2, (uint64_t)(row * E + e)) * sd, DL_F32));
            if (k->route.has_bias)
                ck_assert(in.expert_bias[e] ==
                          mpref_round_d(dl_golden_rng_normal(c.seed, 3, (uint64_t)e) / 16.0, DL_F32));
        }
        for (int64_t i = 0; i < E * d * f; i++) {
            ck_assert(in.w_gate[i] == mpref_round_d(dl_golden_rng_normal(c.seed, 4, (uint64_t)i) * sd, t));
            ck_assert(in.w_up[i] == mpref_round_d(dl_golden_rng_normal(c.seed, 5, (uint64_t)i) * sd, t));
            ck_assert(in.w_down[i] == mpref_round_d(dl_golden_rng_normal(c.seed, 6, (uint64_t)i) * sf, t));
        }
        dl_golden_inputs_free(&in);
    }
}
END_TEST

START_TEST(inputs_fp32_full_significands)
{
    dl_case_t c;
    ck_assert_int_eq(dl_case_find("mixtral-small", &c), 0);
    dl_golden_inputs_t in;
    ck_assert_int_eq(dl_case_inputs(&c, &in), 0);
    const float *arrs[] = {in.x, in.w_gate, in.w_up, in.w_down, in.d_out, in.router_weight};
    int64_t T = c.config.tokens, d = c.config.hidden, f = c.config.ffn, E = c.config.route.experts;
    const int64_t ns[] = {T * d, E * d * f, E * d * f, E * f * d, T * d, d * E};
    for (int a = 0; a < 6; a++) {
        int64_t off = 0;
        for (int64_t i = 0; i < ns[a]; i++) {
            uint32_t bits;
            memcpy(&bits, &arrs[a][i], 4);
            off += (bits & 0x1fff) != 0; /* not on the tf32 (11-bit) grid */
        }
        ck_assert_msg((double)off / (double)ns[a] >= FULL_SIGNIFICAND_MIN,
                      "array %d: only %lld of %lld off the tf32 grid", a, (long long)off, (long long)ns[a]);
    }
    dl_golden_inputs_free(&in);
}
END_TEST

START_TEST(inputs_thread_invariant)
{
#ifdef _OPENMP
    dl_case_t c;
    ck_assert_int_eq(dl_case_find("mixtral-small", &c), 0);
    c.config.tokens = 300;
    c.config.hidden = 64;
    c.config.ffn = 160; /* 8*64*160 = 81920 elements: the parallel path */
    dl_golden_inputs_t a, b;
    omp_set_num_threads(1);
    ck_assert_int_eq(dl_case_inputs(&c, &a), 0);
    omp_set_num_threads(3);
    ck_assert_int_eq(dl_case_inputs(&c, &b), 0);
    int64_t n = 8 * 64 * 160;
    ck_assert(memcmp(a.w_gate, b.w_gate, (size_t)n * 4) == 0);
    ck_assert(memcmp(a.w_down, b.w_down, (size_t)n * 4) == 0);
    ck_assert(memcmp(a.x, b.x, 300 * 64 * 4) == 0);
    dl_golden_inputs_free(&a);
    dl_golden_inputs_free(&b);
#endif
}
END_TEST

START_TEST(inputs_constructions)
{
    dl_case_t c;
    dl_golden_inputs_t in;
    /* ties: experts 0..k identical, k+2.. near copies, group 1 = group 0, token 0 zero */
    ck_assert_int_eq(dl_case_find("ties-grouped", &c), 0);
    ck_assert_int_eq(dl_case_inputs(&c, &in), 0);
    int64_t d = c.config.hidden, E = c.config.route.experts, k = c.config.route.top_k;
    int64_t gs = E / c.config.route.n_group;
    for (int64_t r = 0; r < d; r++) {
        for (int64_t e = 1; e <= k; e++)
            ck_assert(in.router_weight[r * E + e] == in.router_weight[r * E]);
        for (int64_t e = 0; e < gs; e++)
            ck_assert(in.router_weight[r * E + gs + e] == in.router_weight[r * E + e]);
        ck_assert(in.x[r] == 0.0f);
    }
    for (int64_t e = 0; e < gs; e++)
        ck_assert(in.expert_bias[gs + e] == in.expert_bias[e]);
    /* near copies (those the group copy left alone) differ in one weight */
    for (int64_t e = 2 * gs + 1; e <= 2 * k + 1 && e < E; e++) {
        int diff = 0;
        for (int64_t r = 0; r < d; r++)
            diff += in.router_weight[r * E + e] != in.router_weight[r * E + e - 1];
        ck_assert_int_eq(diff, 1);
    }
    dl_golden_inputs_free(&in);
    /* empty experts: offset -40 through the offset feature (row 0 ~ -5) */
    ck_assert_int_eq(dl_case_find("empty-experts", &c), 0);
    ck_assert_int_eq(dl_case_inputs(&c, &in), 0);
    E = c.config.route.experts;
    for (int64_t e = 0; e < E; e++) {
        int empty = e == 0 || e == E / 2 || e == E - 1;
        ck_assert_msg(empty ? in.router_weight[e] < -4.5f : fabsf(in.router_weight[e]) < 1.0f,
                      "expert %lld: %g", (long long)e, (double)in.router_weight[e]);
    }
    dl_golden_inputs_free(&in);
}
END_TEST

/* ---------------------------------------------------------- catalogue */

/* The kernel tier covers the shapes issue 13 names: each listed value of
 * d or f, T, E, top-k and dtype occurs in some member, and some member has
 * a K that is not a multiple of 64. Every member is on demand. */
START_TEST(kernel_tier_coverage)
{
    static const int64_t dims[] = {512, 1024, 2048, 4096, 7168, 14336};
    static const int64_t toks[] = {1, 7, 33, 128, 1024, 4096};
    static const int64_t experts[] = {8, 64, 128, 256};
    static const int64_t topk[] = {1, 2, 6, 8};
    int n = 0, odd = 0, dt[3] = {0}, sizes = 0;
    uint64_t seen_d = 0, seen_t = 0, seen_e = 0, seen_k = 0;
    for (int i = 0; i < dl_case_count(); i++) {
        const dl_case_t *c = dl_case_get(i);
        if (c->tier != DL_TIER_KERNEL)
            continue;
        const dl_moe_config_t *k = &c->config;
        n++;
        ck_assert(c->large);
        odd |= k->hidden % 64 != 0 || k->ffn % 64 != 0;
        dt[k->dtype == DL_F32 ? 0 : k->dtype == DL_BF16 ? 1 : 2] = 1;
        sizes |= c->inputs == DL_INPUTS_SIZES;
        for (int j = 0; j < 6; j++) {
            if (k->hidden == dims[j] || k->ffn == dims[j])
                seen_d |= 1u << j;
            if (k->tokens == toks[j])
                seen_t |= 1u << j;
        }
        for (int j = 0; j < 4; j++) {
            if (k->route.experts == experts[j])
                seen_e |= 1u << j;
            if (k->route.top_k == topk[j])
                seen_k |= 1u << j;
        }
        /* each generates in at most 8 GiB: the whole file in memory */
        ck_assert_int_lt(dl_case_data_bytes(c), INT64_C(6) << 30);
    }
    ck_assert_int_ge(n, 8);
    ck_assert(odd && sizes && dt[0] && dt[1] && dt[2]);
    ck_assert_uint_eq(seen_d, 63);
    ck_assert_uint_eq(seen_t, 63);
    ck_assert_uint_eq(seen_e, 15);
    ck_assert_uint_eq(seen_k, 15);
    dl_case_tier_t t;
    ck_assert_int_eq(dl_case_tier_parse("kernel", &t), 0);
    ck_assert(t == DL_TIER_KERNEL);
    ck_assert_str_eq(dl_case_tier_name(DL_TIER_LAYER), "layer");
    ck_assert_int_eq(dl_case_tier_parse("kernels", &t), DL_ENOTFOUND);
    ck_assert_ptr_null(dl_case_tier_name((dl_case_tier_t)3));
}
END_TEST

/* inputs = sizes: the forward pass routes exactly the planted group sizes
 * (0, 1, 63, 64, 65, 127, 128, 129, every token to the hot expert E-1, the
 * fillers as equal as possible), on a small configuration and on the
 * kernel tier's member. */
START_TEST(planted_sizes_route_as_planned)
{
    dl_case_t cs[2];
    ck_assert_int_eq(dl_case_find("kernel-sizes-bf16", &cs[0]), 0);
    cs[1] = cs[0];
    cs[1].config.hidden = 80;
    cs[1].config.ffn = 8;
    cs[1].config.tokens = 300;
    cs[1].config.route.top_k = 3;
    cs[1].config.route.experts = 12;
    cs[1].config.dtype = DL_F16;
    for (int v = 0; v < 2; v++) {
        const dl_moe_config_t *k = &cs[v].config;
        int64_t E = k->route.experts, T = k->tokens, q[256];
        ck_assert_int_eq(dl__case_planted_sizes(k, q), 0);
        static const int64_t want[] = {0, 1, 63, 64, 65, 127, 128, 129};
        int64_t total = 0;
        for (int e = 0; e < 8; e++)
            ck_assert_int_eq(q[e], want[e]);
        ck_assert_int_eq(q[E - 1], T);
        for (int64_t e = 0; e < E; e++)
            total += q[e];
        ck_assert_int_eq(total, T * k->route.top_k);
        for (int64_t e = 8; e + 1 < E; e++)
            ck_assert(q[e] == q[8] || q[e] == q[8] - 1);
        dl_golden_file_t g;
        int berr;
        dl_golden_gen_opts_t o = {0};
        o.no_backward = 1;
        ck_assert_int_eq(dl_golden_generate(&cs[v], &o, &g, &berr, NULL, 0), 0);
        for (int64_t e = 0; e < E; e++)
            ck_assert_int_eq(g.fwd.group_sizes[e], q[e]);
        for (int64_t t = 0; t < T; t++) /* best first: the planted ranks */
            ck_assert(g.fwd.topk_weights[t * k->route.top_k] >
                      g.fwd.topk_weights[t * k->route.top_k + 1]);
        dl_golden_free(&g);
    }
    /* a plan that cannot fit: too few tokens for a run of 129 */
    dl_moe_config_t small = cs[1].config;
    small.tokens = 100;
    int64_t q[256];
    ck_assert_int_eq(dl__case_planted_sizes(&small, q), DL_EINVAL);
    small = cs[1].config;
    small.hidden = 11; /* needs d >= E + 1 */
    ck_assert_int_eq(dl__case_planted_sizes(&small, q), DL_EINVAL);
}
END_TEST

START_TEST(catalogue_valid_and_unique)
{
    static const char *const required[] = {
        "tiny", "ties", "empty-experts", "no-tokens", "one-hot", "single-token", "odd-shapes",
        "zipf", "mixtral-small", "deepseek-v3-small", "mixtral-layer", "deepseek-v3-layer"};
    int64_t committed = 0;
    for (int i = 0; i < dl_case_count(); i++) {
        const dl_case_t *c = dl_case_get(i);
        ck_assert_int_eq(dl_moe_config_validate(&c->config), 0);
        ck_assert_int_gt(dl_case_data_bytes(c), 0);
        for (int j = 0; j < i; j++)
            ck_assert_str_ne(dl_case_get(j)->name, c->name);
        dl_case_t f;
        ck_assert_int_eq(dl_case_find(c->name, &f), 0);
        ck_assert(memcmp(&f, c, sizeof f) == 0);
        if (!c->large)
            committed += dl_case_data_bytes(c);
        /* the -bf16 and -fp16 variants: same shapes and seed */
        for (int v = 0; v < 2; v++) {
            char name[80];
            snprintf(name, sizeof name, "%s%s", c->name, v ? "-fp16" : "-bf16");
            if (c->config.dtype != DL_F32 || c->tier == DL_TIER_KERNEL)
                continue; /* the kernel tier has one dtype per case */
            ck_assert_int_eq(dl_case_find(name, &f), 0);
            ck_assert(f.config.dtype == (v ? DL_F16 : DL_BF16));
            ck_assert(f.seed == c->seed && f.config.tokens == c->config.tokens &&
                      f.config.hidden == c->config.hidden && f.config.ffn == c->config.ffn);
        }
    }
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        dl_case_t f;
        ck_assert_msg(dl_case_find(required[i], &f) == 0, "%s", required[i]);
    }
    ck_assert_ptr_null(dl_case_get(-1));
    ck_assert_ptr_null(dl_case_get(dl_case_count()));
    /* 8 MiB: the shared experts' and the FFN variants' cases (gpt-oss-like,
     * swiglu-clamp-tight, geglu-tanh, nemotron-like) brought the vectors
     * tier to 4.2 MB of data, the routing variants' (llama4-like,
     * deepseek-v4-hash, longcat-like) and gpt-oss-full to 6.5 MB in the
     * extra-value build (its y_half adds to every case) */
    ck_assert_msg(committed < 8 * 1024 * 1024, "committed data %lld bytes", (long long)committed);
    dl_case_t f;
    ck_assert_int_eq(dl_case_find("no-such-case", &f), DL_ENOTFOUND);
    ck_assert_int_eq(dl_case_find("deepseek-v3-layer", &f), 0);
    ck_assert(f.large && f.config.route.experts == 256 && f.config.route.top_k == 8 &&
              f.config.hidden == 7168 && f.config.ffn == 2048 && f.config.route.n_group == 8 &&
              f.config.route.topk_group == 4 && f.config.route.scaling == 2.5 &&
              f.config.route.group_score == DL_GROUP_TOP2_SUM && f.config.route.has_bias);
    ck_assert_int_eq(dl_case_find("mixtral-layer", &f), 0);
    ck_assert(f.config.route.experts == 8 && f.config.route.top_k == 2 &&
              f.config.hidden == 4096 && f.config.ffn == 14336);
}
END_TEST

START_TEST(catalogue_set_dtype)
{
    dl_case_t c;
    ck_assert_int_eq(dl_case_find("tiny", &c), 0);
    ck_assert_int_eq(dl_case_set_dtype(&c, DL_BF16), 0);
    ck_assert_str_eq(c.name, "tiny-bf16");
    ck_assert(c.config.dtype == DL_BF16);
    ck_assert_int_eq(dl_case_set_dtype(&c, DL_F16), 0);
    ck_assert_str_eq(c.name, "tiny-fp16");
    ck_assert_int_eq(dl_case_set_dtype(&c, DL_F32), 0);
    ck_assert_str_eq(c.name, "tiny");
    ck_assert_int_eq(dl_case_set_dtype(&c, DL_F64), DL_EINVAL);
}
END_TEST

/* ---------------------------------------------------------- case files */

static int parse_text(const char *text, dl_case_t *c, char *err, size_t n)
{
    spit(tpath("case.txt"), (const unsigned char *)text, strlen(text));
    return dl_case_parse_file(tpath("case.txt"), c, err, n);
}

START_TEST(casefile_valid)
{
    mk_tmpdir();
    dl_case_t c;
    char err[512];
    const char *txt =
        "# a DeepSeek-like case\n"
        "name = my-case\n"
        "tokens = 40   # trailing comment\n"
        "hidden=12\n"
        "ffn = 6\n"
        "experts = 16\n"
        "top_k = 4\n"
        "score_function = sigmoid\n"
        "n_group = 4\n"
        "topk_group = 2\n"
        "group_score = top2_sum\n"
        "renormalize = true\n"
        "scaling = 2.5\n"
        "has_bias = yes\n"
        "ffn_kind = swiglu\n"
        "dtype = bf16\n"
        "\n"
        "seed = 0x10\n"
        "inputs = zipf\n"
        "zipf_s = 0.5\n";
    ck_assert_msg(parse_text(txt, &c, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.name, "my-case");
    ck_assert(c.config.tokens == 40 && c.config.hidden == 12 && c.config.ffn == 6);
    ck_assert(c.config.route.experts == 16 && c.config.route.top_k == 4);
    ck_assert(c.config.route.score_fn == DL_SCORE_SIGMOID && c.config.route.n_group == 4 &&
              c.config.route.topk_group == 2 && c.config.route.group_score == DL_GROUP_TOP2_SUM);
    ck_assert(c.config.route.renormalize == 1 && c.config.route.scaling == 2.5 &&
              c.config.route.has_bias == 1 && c.config.dtype == DL_BF16 && c.seed == 16 &&
              c.inputs == DL_INPUTS_ZIPF && c.zipf_s == 0.5 && !c.large);
    /* base + override; defaults for ffn (= hidden) in a minimal file */
    ck_assert_int_eq(parse_text("base = mixtral-small\ntokens = 3\ndtype = fp16\n", &c, err, sizeof err), 0);
    dl_case_t m;
    dl_case_find("mixtral-small", &m);
    ck_assert(c.config.tokens == 3 && c.config.hidden == m.config.hidden && c.seed == m.seed &&
              c.config.dtype == DL_F16);
    ck_assert_int_eq(parse_text("tokens=2\nhidden=8\nexperts=4\ntop_k=1\n", &c, err, sizeof err), 0);
    ck_assert(c.config.ffn == 8 && c.config.dtype == DL_F32 && !strcmp(c.name, "custom"));
    rm_tmpdir();
}
END_TEST

START_TEST(casefile_errors_name_file_and_line)
{
    mk_tmpdir();
    static const struct {
        const char *text;
        int code, line;
        const char *word;
    } bad[] = {
        {"tokens = 4\nhidden 8\n", DL_EFORMAT, 2, "key = value"},
        {"tokens = 4\ncolour = red\n", DL_EFORMAT, 2, "unknown key"},
        {"tokens = 4\ntokens = 5\n", DL_EFORMAT, 2, "twice"},
        {"tokens = four\n", DL_EFORMAT, 1, "tokens"},
        {"tokens = -1\n", DL_EFORMAT, 1, "tokens"},
        {"tokens = 99999999999\n", DL_EFORMAT, 1, "tokens"},
        {"# c\n\nrenormalize = maybe\n", DL_EFORMAT, 3, "renormalize"},
        {"dtype = fp64\n", DL_EFORMAT, 1, "dtype"},
        {"score_function = relu\n", DL_EFORMAT, 1, "score_function"},
        {"scaling = 0\n", DL_EFORMAT, 1, "scaling"},
        {"scaling = nan\n", DL_EFORMAT, 1, "scaling"},
        {"tokens = 4\nbase = tiny\n", DL_EFORMAT, 2, "base"},
        {"base = nothing\n", DL_EFORMAT, 1, "unknown base"},
        {"name = a/b\n", DL_EFORMAT, 1, "name"},
        {"seed =\n", DL_EFORMAT, 1, "no value"},
        {"tokens = 4\nhidden = 8\nexperts = 4\n", DL_EFORMAT, 0, "top_k"},
        {"tokens = 4\nhidden = 8\nexperts = 4\ntop_k = 5\n", DL_EINVAL, 4, "top_k"},
        {"tokens = 4\nhidden = 8\nexperts = 6\ntop_k = 2\nn_group = 4\n", DL_EINVAL, 5, "n_group"},
        {"tokens=4\nhidden=8\nexperts=4\ntop_k=1\nffn_kind=plain\nffn=3\n", DL_EINVAL, 6, "plain"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dl_case_t c;
        char err[512] = "", want[600];
        int rc = parse_text(bad[i].text, &c, err, sizeof err);
        ck_assert_msg(rc == bad[i].code, "case %zu: %s (%s)", i, dl_err_name(rc), err);
        if (bad[i].line) /* line 0: a whole-file problem, no line named (issue 17) */
            snprintf(want, sizeof want, "%s:%d: ", tpath("case.txt"), bad[i].line);
        else
            snprintf(want, sizeof want, "%s: ", tpath("case.txt"));
        ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "case %zu: '%s' lacks '%s'", i, err, want);
        ck_assert_msg(strstr(err, bad[i].word), "case %zu: '%s' lacks '%s'", i, err, bad[i].word);
        ck_assert(!strchr(err, '\n'));
    }
    char longline[3000];
    memset(longline, 'x', sizeof longline);
    longline[sizeof longline - 1] = '\0';
    dl_case_t c;
    char err[512];
    ck_assert_int_eq(parse_text(longline, &c, err, sizeof err), DL_EFORMAT);
    ck_assert_int_eq(dl_case_parse_file(tpath("missing.txt"), &c, err, sizeof err), DL_EIO);
    ck_assert(strstr(err, "missing.txt"));
    rm_tmpdir();
}
END_TEST

/* ------------------------------------------------------ write and read */

START_TEST(roundtrip_every_variant)
{
    mk_tmpdir();
    const dl_dtype_t ts[] = {DL_F32, DL_BF16, DL_F16};
    for (int ti = 0; ti < 3; ti++)
        for (int sw = 0; sw < 2; sw++)
            for (int bias = 0; bias < 2; bias++)
                for (int zero_t = 0; zero_t < 2; zero_t++) {
                    dl_moe_config_t c = small_config(ts[ti], sw, bias);
                    if (zero_t)
                        c.tokens = 0;
                    c.route.scaling = 0.1; /* a scaling that is not a dyadic */
                    dl_golden_file_t g, h;
                    synth(&g, &c, (uint64_t)(ti * 8 + sw * 4 + bias * 2 + zero_t));
                    g.has_backward = bias; /* an absent group, sometimes */
                    char err[512];
                    ck_assert_msg(dl_golden_write(tpath("rt.h5"), &g, 1, NULL, NULL, err, sizeof err) == 0,
                                  "%s", err);
                    ck_assert_msg(dl_golden_load(tpath("rt.h5"), &h, err, sizeof err) == 0, "%s", err);
                    ck_assert_str_eq(h.format, DL_GOLDEN_FORMAT);
                    ck_assert_int_eq(h.format_version, DL_GOLDEN_FORMAT_VERSION);
                    ck_assert(strncmp(h.generator, "dropless ", 9) == 0);
                    if (!g.has_backward)
                        for (int i = 0; i < dl_golden_dataset_count(); i++)
                            if (dl_golden_dataset(i)->group == DL_GOLDEN_BACKWARD) {
                                free(*dl_golden_slot(&g, dl_golden_dataset(i)));
                                *dl_golden_slot(&g, dl_golden_dataset(i)) = NULL;
                            }
                    assert_same_file_contents(&g, &h);
                    /* the same file read as a candidate: everything present */
                    dl_golden_file_t k;
                    ck_assert_msg(dl_golden_load_candidate(tpath("rt.h5"), &c, &k, err, sizeof err) == 0,
                                  "%s", err);
                    assert_same_file_contents(&h, &k);
                    dl_golden_free(&g);
                    dl_golden_free(&h);
                    dl_golden_free(&k);
                }
    rm_tmpdir();
}
END_TEST

START_TEST(write_is_byte_reproducible)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_BF16, 1, 1);
    dl_golden_file_t g;
    synth(&g, &c, 3);
    char err[512];
    ck_assert_int_eq(dl_golden_write(tpath("a.h5"), &g, 0, NULL, NULL, err, sizeof err), 0);
    sleep(1); /* a timestamp, if any were written, would now differ */
    ck_assert_int_eq(dl_golden_write(tpath("b.h5"), &g, 0, NULL, NULL, err, sizeof err), 0);
    size_t na, nb;
    unsigned char *a = slurp(tpath("a.h5"), &na), *b = slurp(tpath("b.h5"), &nb);
    ck_assert(na == nb && memcmp(a, b, na) == 0);
    /* and sensitive: another seed attribute gives other bytes */
    g.seed++;
    ck_assert_int_eq(dl_golden_write(tpath("c.h5"), &g, 0, NULL, NULL, err, sizeof err), 0);
    size_t nc;
    unsigned char *cc = slurp(tpath("c.h5"), &nc);
    ck_assert(nc != na || memcmp(a, cc, na) != 0);
    free(a);
    free(b);
    free(cc);
    dl_golden_free(&g);
    rm_tmpdir();
}
END_TEST

START_TEST(write_never_clobbers_never_leaves_partial_files)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_F32, 1, 0);
    dl_golden_file_t g;
    synth(&g, &c, 4);
    char err[512];
    ck_assert_int_eq(dl_golden_write(tpath("x.h5"), &g, 0, NULL, NULL, err, sizeof err), 0);
    size_t n0;
    unsigned char *orig = slurp(tpath("x.h5"), &n0);
    g.seed = 777;
    ck_assert_int_eq(dl_golden_write(tpath("x.h5"), &g, 0, NULL, NULL, err, sizeof err), DL_EEXIST);
    ck_assert(strstr(err, "--force") && strstr(err, "x.h5"));
    size_t n1;
    unsigned char *now = slurp(tpath("x.h5"), &n1);
    ck_assert(n0 == n1 && memcmp(orig, now, n0) == 0);
    free(now);
    ck_assert_int_eq(count_entries(tmpdir), 1);
    ck_assert_int_eq(dl_golden_write(tpath("x.h5"), &g, 1, NULL, NULL, err, sizeof err), 0);
    dl_golden_file_t h;
    ck_assert_int_eq(dl_golden_load(tpath("x.h5"), &h, err, sizeof err), 0);
    ck_assert(h.seed == 777);
    dl_golden_free(&h);
    ck_assert_int_eq(count_entries(tmpdir), 1);
    /* failures: a missing directory, a directory that is a file, a NULL array */
    ck_assert_int_eq(dl_golden_write(tpath("nodir/y.h5"), &g, 0, NULL, NULL, err, sizeof err), DL_EIO);
    ck_assert(strstr(err, "nodir/y.h5"));
    ck_assert_int_eq(dl_golden_write(tpath("x.h5/y.h5"), &g, 1, NULL, NULL, err, sizeof err), DL_EIO);
    free(g.fwd.h_act);
    g.fwd.h_act = NULL;
    ck_assert_int_eq(dl_golden_write(tpath("z.h5"), &g, 0, NULL, NULL, err, sizeof err), DL_EINVAL);
    ck_assert(strstr(err, "/forward/h_act"));
    g.has_inputs = 0;
    ck_assert_int_eq(dl_golden_write(tpath("z.h5"), &g, 0, NULL, NULL, err, sizeof err), DL_EINVAL);
    ck_assert_int_eq(count_entries(tmpdir), 1);
    free(orig);
    dl_golden_free(&g);
    rm_tmpdir();
}
END_TEST

START_TEST(hdf5_errors_are_silenced)
{
    mk_tmpdir();
    fflush(stderr);
    int saved = dup(2);
    int fd = open(tpath("stderr.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
    dl_golden_file_t g;
    char err[512];
    spit(tpath("junk.h5"), (const unsigned char *)"not hdf5 at all", 15);
    ck_assert_int_eq(dl_golden_load(tpath("junk.h5"), &g, err, sizeof err), DL_EFORMAT);
    dl_moe_config_t c = small_config(DL_F32, 1, 0);
    write_valid("v.h5", &c);
    h5_delete(tpath("v.h5"), "/forward/out");
    ck_assert_int_eq(dl_golden_load(tpath("v.h5"), &g, err, sizeof err), DL_EFORMAT);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    struct stat st;
    ck_assert_int_eq(stat(tpath("stderr.txt"), &st), 0);
    ck_assert_msg(st.st_size == 0, "HDF5 printed %lld bytes", (long long)st.st_size);
    /* and the caller's HDF5 error handler is restored */
    H5E_auto2_t fn = NULL;
    void *data = NULL;
    H5Eset_auto2(H5E_DEFAULT, (H5E_auto2_t)H5Eprint2, stderr);
    dl_golden_load(tpath("junk.h5"), &g, err, sizeof err);
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    ck_assert(fn == (H5E_auto2_t)H5Eprint2 && data == stderr);
    rm_tmpdir();
}
END_TEST

/* ------------------------------------------------------ damaged files */

START_TEST(read_missing_and_non_hdf5)
{
    mk_tmpdir();
    expect_load_error(tpath("absent.h5"), DL_EIO, "absent.h5");
    spit(tpath("text.h5"), (const unsigned char *)"hello\n", 6);
    expect_load_error(tpath("text.h5"), DL_EFORMAT, "HDF5");
    spit(tpath("empty.h5"), (const unsigned char *)"", 0);
    expect_load_error(tpath("empty.h5"), DL_EFORMAT, NULL);
    rm_tmpdir();
}
END_TEST

START_TEST(read_truncated)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_BF16, 1, 1);
    write_valid("v.h5", &c);
    size_t n;
    unsigned char *b = slurp(tpath("v.h5"), &n);
    const size_t cuts[] = {1, 8, 100, 512, 2048, n / 3, n / 2, 2 * n / 3, n - 100, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(tpath("t.h5"), b, cuts[i]);
        dl_golden_file_t g;
        char err[512] = "";
        int rc = dl_golden_load(tpath("t.h5"), &g, err, sizeof err);
        ck_assert_msg(rc < 0, "truncated at %zu of %zu: loaded", cuts[i], n);
        ck_assert(strstr(err, "t.h5") && !strchr(err, '\n'));
    }
    free(b);
    rm_tmpdir();
}
END_TEST

/* Every flipped byte is caught by the seal before HDF5 reads the file
 * (HDF5 1.10 crashes on some damaged headers), except flips in the user
 * block's padding, which change nothing that is read. */
START_TEST(read_flipped_bytes)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_F32, 1, 1);
    write_valid("v.h5", &c);
    size_t n;
    unsigned char *b = slurp(tpath("v.h5"), &n);
    int errors = 0, loaded = 0;
    for (size_t off = 0; off < n; off += off < 1024 ? 1 : FLIP_STRIDE) {
        b[off] ^= 0xff;
        spit(tpath("f.h5"), b, n);
        b[off] ^= 0xff;
        dl_golden_file_t g;
        char err[512] = "";
        int rc = dl_golden_load(tpath("f.h5"), &g, err, sizeof err);
        if (rc == 0) {
            ck_assert_msg(off < DL__GOLDEN_USERBLOCK, "flip at %zu loaded", off);
            loaded++;
            dl_golden_free(&g);
        } else {
            ck_assert_msg(rc == DL_EFORMAT && strstr(err, "f.h5") && strstr(err, "damaged") &&
                          !strchr(err, '\n'), "offset %zu: %d '%s'", off, rc, err);
            errors++;
        }
    }
    ck_assert_int_gt(errors, 0);
    ck_assert_int_gt(loaded, 0);
    /* the digest is the plain SHA-256 of the bytes after the user block */
    dl__sha256_t s;
    dl__sha256_init(&s);
    dl__sha256_update(&s, b + DL__GOLDEN_USERBLOCK, n - DL__GOLDEN_USERBLOCK);
    unsigned char d[32];
    char hex[65];
    dl__sha256_final(&s, d);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    ck_assert(memmem(b, DL__GOLDEN_USERBLOCK, hex, 64) != NULL);
    /* without its seal (user block zeroed) the file still loads, unverified */
    memset(b, 0, DL__GOLDEN_USERBLOCK);
    spit(tpath("u.h5"), b, n);
    dl_golden_file_t g;
    char err[512];
    ck_assert_msg(dl_golden_load(tpath("u.h5"), &g, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(g.sealed, 0);
    dl_golden_free(&g);
    ck_assert_int_eq(dl_golden_load(tpath("v.h5"), &g, err, sizeof err), 0);
    ck_assert_int_eq(g.sealed, 1);
    dl_golden_free(&g);
    /* sealing refuses a file without a user block */
    write_candidate(tpath("c.h5"), &c, -1, NULL, 0.5f);
    ck_assert_int_eq(dl_golden_seal(tpath("c.h5"), err, sizeof err), DL_EFORMAT);
    free(b);
    rm_tmpdir();
}
END_TEST

START_TEST(sha256_known_answers)
{
    static const struct { const char *msg; size_t reps; const char *hex; } kat[] = {
        {"", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"a", 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        dl__sha256_t s;
        dl__sha256_init(&s);
        for (size_t r = 0; r < kat[i].reps; r++)
            dl__sha256_update(&s, kat[i].msg, strlen(kat[i].msg));
        unsigned char d[32];
        char hex[65];
        dl__sha256_final(&s, d);
        for (int j = 0; j < 32; j++)
            snprintf(hex + 2 * j, 3, "%02x", d[j]);
        ck_assert_str_eq(hex, kat[i].hex);
    }
}
END_TEST

START_TEST(read_wrong_shapes_and_types)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_F32, 1, 0);
    const char *v = tpath("v.h5");
    float buf[64] = {0};
    hsize_t d2[2] = {6, 6}, d1[1] = {12}, d3[3] = {4, 5, 7};
    /* shape: x is [T,d] = [6,5] */
    write_valid("v.h5", &c);
    h5_replace(v, "/inputs/x", H5T_IEEE_F32LE, 2, d2, H5T_NATIVE_FLOAT, buf, "fp32");
    expect_load_error(v, DL_ESHAPE, "/inputs/x");
    /* rank */
    write_valid("v.h5", &c);
    h5_replace(v, "/forward/out", H5T_IEEE_F32LE, 3, d3, H5T_NATIVE_FLOAT, NULL, "fp32");
    expect_load_error(v, DL_ESHAPE, "/forward/out");
    /* a float64 dataset: never converted */
    write_valid("v.h5", &c);
    hsize_t dout[2] = {6, 5};
    h5_replace(v, "/forward/out", H5T_IEEE_F64LE, 2, dout, H5T_NATIVE_FLOAT, buf, "fp32");
    expect_load_error(v, DL_EDTYPE, "/forward/out");
    /* big-endian float32 */
    write_valid("v.h5", &c);
    h5_replace(v, "/forward/out", H5T_IEEE_F32BE, 2, dout, H5T_NATIVE_FLOAT, buf, "fp32");
    expect_load_error(v, DL_EDTYPE, "/forward/out");
    /* ids as int64 in a golden file */
    write_valid("v.h5", &c);
    int64_t ids[12] = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
    hsize_t dids[2] = {6, 2};
    h5_replace(v, "/forward/topk_ids", H5T_STD_I64LE, 2, dids, H5T_NATIVE_INT64, ids, "int32");
    expect_load_error(v, DL_EDTYPE, "/forward/topk_ids");
    /* sort_perm of the wrong length */
    write_valid("v.h5", &c);
    int32_t perm[12] = {0};
    hsize_t d11[1] = {11};
    h5_replace(v, "/forward/sort_perm", H5T_STD_I32LE, 1, d11, H5T_NATIVE_INT32, perm, "int32");
    expect_load_error(v, DL_ESHAPE, "/forward/sort_perm");
    (void)d1;
    /* a missing dataset in a present group */
    write_valid("v.h5", &c);
    h5_delete(v, "/backward/d_x");
    expect_load_error(v, DL_EFORMAT, "/backward/d_x");
    /* a group that is a dataset */
    write_valid("v.h5", &c);
    h5_delete(v, "/backward");
    h5_replace(v, "/backward", H5T_IEEE_F32LE, 1, d1, H5T_NATIVE_FLOAT, buf, NULL);
    expect_load_error(v, DL_EFORMAT, "/backward");
    rm_tmpdir();
}
END_TEST

START_TEST(read_bad_values)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_BF16, 1, 0);
    const char *v = tpath("v.h5");
    /* an fp32 value in a bf16 dataset */
    write_valid("v.h5", &c);
    float off = 1.0f + 0x1p-12f;
    h5_set_elem(v, "/forward/out", 7, H5T_NATIVE_FLOAT, &off);
    expect_load_error(v, DL_EGRID, "/forward/out");
    dl_golden_file_t g;
    char err[512];
    dl_golden_load(v, &g, err, sizeof err);
    ck_assert_msg(strstr(err, "[1,2]") && strstr(err, "bf16"), "%s", err);
    /* the same in an fp16 case: 1 + 2^-12 is not an fp16 value either */
    dl_moe_config_t c16 = small_config(DL_F16, 1, 0);
    write_valid("v.h5", &c16);
    h5_set_elem(v, "/inputs/w_up", 3, H5T_NATIVE_FLOAT, &off);
    expect_load_error(v, DL_EGRID, "/inputs/w_up");
    /* but fine in fp32-typed datasets of a bf16 case */
    write_valid("v.h5", &c);
    h5_set_elem(v, "/forward/router_logits", 3, H5T_NATIVE_FLOAT, &off);
    ck_assert_int_eq(dl_golden_load(v, &g, err, sizeof err), 0);
    dl_golden_free(&g);
    /* ids out of range, negative permutation entries, negative sizes */
    write_valid("v.h5", &c);
    int32_t big = 4;
    h5_set_elem(v, "/forward/topk_ids", 5, H5T_NATIVE_INT32, &big);
    expect_load_error(v, DL_ERANGE, "/forward/topk_ids");
    write_valid("v.h5", &c);
    int32_t neg = -1;
    h5_set_elem(v, "/forward/sort_perm", 0, H5T_NATIVE_INT32, &neg);
    expect_load_error(v, DL_ERANGE, "/forward/sort_perm");
    write_valid("v.h5", &c);
    int64_t negs = -3;
    h5_set_elem(v, "/forward/group_sizes", 1, H5T_NATIVE_INT64, &negs);
    expect_load_error(v, DL_ERANGE, "/forward/group_sizes");
    /* consistent ranges, inconsistent bookkeeping */
    write_valid("v.h5", &c);
    int64_t wrong = 1;
    h5_set_elem(v, "/forward/group_offsets", 0, H5T_NATIVE_INT64, &wrong);
    expect_load_error(v, DL_EFORMAT, "/forward/group_offsets");
    write_valid("v.h5", &c);
    /* sort_perm[1] = sort_perm[0]: a duplicate found at [1], whatever the
     * synthetic values (the inverse holds at [0], so it is not what fails) */
    int32_t first = h5_get_i32(v, "/forward/sort_perm", 0);
    h5_set_elem(v, "/forward/sort_perm", 1, H5T_NATIVE_INT32, &first);
    expect_load_error(v, DL_EFORMAT, "/forward/sort_perm");
    rm_tmpdir();
}
END_TEST

/* A golden with NaN/Inf where its inputs are finite is refused (issue 11,
 * item 9): forward and backward, NaN and Inf, naming dataset and element;
 * with a non-finite input the same values are legitimate. */
START_TEST(read_nonfinite_golden)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_F32, 1, 0);
    const char *v = tpath("nf.h5");
    dl_golden_file_t g;
    char err[512];
    write_valid("nf.h5", &c);
    ck_assert_int_eq(dl_golden_load(v, &g, err, sizeof err), 0); /* the control */
    dl_golden_free(&g);
    float nan = NAN, inf = INFINITY;
    h5_set_elem(v, "/forward/out", 7, H5T_NATIVE_FLOAT, &nan);
    expect_load_error(v, DL_EFORMAT, "/forward/out");
    dl_golden_load(v, &g, err, sizeof err);
    ck_assert_msg(strstr(err, "[1,2]") && strstr(err, "nan") && strstr(err, "inputs are all finite"),
                  "%s", err);
    write_valid("nf.h5", &c);
    h5_set_elem(v, "/backward/d_x", 0, H5T_NATIVE_FLOAT, &inf);
    expect_load_error(v, DL_EFORMAT, "/backward/d_x");
    write_valid("nf.h5", &c);
    h5_set_elem(v, "/forward/tie_margin", 1, H5T_NATIVE_FLOAT, &inf); /* no stage: +Inf is legal */
    ck_assert_msg(dl_golden_load(v, &g, err, sizeof err) == 0, "%s", err);
    dl_golden_free(&g);
    h5_set_elem(v, "/forward/router_logits", 1, H5T_NATIVE_FLOAT, &inf);
    expect_load_error(v, DL_EFORMAT, "/forward/router_logits");
    /* a non-finite input makes non-finite stages legitimate */
    h5_set_elem(v, "/inputs/x", 0, H5T_NATIVE_FLOAT, &nan);
    ck_assert_msg(dl_golden_load(v, &g, err, sizeof err) == 0, "%s", err);
    dl_golden_free(&g);
    rm_tmpdir();
}
END_TEST

START_TEST(read_bad_attributes)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_BF16, 1, 0);
    const char *v = tpath("v.h5");
    write_valid("v.h5", &c);
    h5_obj_attr_str(v, "/", "format", "something-else");
    expect_load_error(v, DL_EFORMAT, "format");
    write_valid("v.h5", &c);
    h5_obj_attr_i64(v, "/", "format_version", 2);
    expect_load_error(v, DL_EFORMAT, "format_version 2");
    write_valid("v.h5", &c);
    h5_delete(v, "/config");
    expect_load_error(v, DL_EFORMAT, "/config");
    write_valid("v.h5", &c);
    h5_obj_attr_str(v, "/config", "tokens", "six");
    expect_load_error(v, DL_EFORMAT, "tokens");
    write_valid("v.h5", &c);
    h5_obj_attr_i64(v, "/config", "top_k", 9);
    expect_load_error(v, DL_EFORMAT, "/config");
    write_valid("v.h5", &c);
    h5_obj_attr_str(v, "/config", "dtype", "fp8");
    expect_load_error(v, DL_EFORMAT, "dtype");
    write_valid("v.h5", &c);
    h5_obj_attr_str(v, "/config", "dtype", "fp32"); /* now x's dtype attribute disagrees */
    expect_load_error(v, DL_EDTYPE, "/inputs/x");
    write_valid("v.h5", &c);
    h5_obj_attr_str(v, "/forward/h_up", "dtype", "fp16");
    expect_load_error(v, DL_EDTYPE, "/forward/h_up");
    write_valid("v.h5", &c);
    h5_obj_attr_i64(v, "/config", "tokens", 7); /* every [T,...] shape is now wrong */
    expect_load_error(v, DL_ESHAPE, "/inputs/x");
    rm_tmpdir();
}
END_TEST

/* ------------------------------------------------------ candidates */

START_TEST(candidate_subsets)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_BF16, 1, 0);
    const char *p = tpath("cand.h5");
    dl_golden_file_t g;
    char err[512];
    write_candidate(p, &c, -1, NULL, 0.1f); /* 0.1f is off the bf16 grid: no dtype, not checked */
    ck_assert_msg(dl_golden_load_candidate(p, &c, &g, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(g.backend, "test-backend 1.0");
    ck_assert_str_eq(g.compute_mode, "bf16");
    ck_assert(g.has_forward && !g.has_inputs && !g.has_backward);
    ck_assert_ptr_nonnull(g.fwd.topk_ids);
    ck_assert_ptr_nonnull(g.fwd.out);
    ck_assert_ptr_null(g.fwd.router_logits);
    ck_assert_ptr_null(g.fwd.h_act);
    ck_assert_int_eq(g.fwd.sort_perm[0], -1);
    ck_assert_int_eq(g.fwd.topk_ids[3], 3);
    ck_assert(g.fwd.out[0] == 0.1f);
    dl_golden_free(&g);
    /* not a golden file: the strict loader refuses it */
    ck_assert_int_eq(dl_golden_load(p, &g, err, sizeof err), DL_EFORMAT);
    /* the dtype attribute, when given, is verified (a bad dataset is set
     * aside, not an error: candidate_bad_datasets_set_aside) */
    int iout = -1;
    for (int i = 0; i < dl_golden_dataset_count(); i++)
        if (!strcmp(dl_golden_dataset(i)->path, "/forward/out"))
            iout = i;
    write_candidate(p, &c, -1, "bf16", 0.1f);
    ck_assert_int_eq(dl_golden_load_candidate(p, &c, &g, err, sizeof err), 0);
    ck_assert(g.bad_datasets == DL_ROWSET_BIT(iout) && !g.fwd.out);
    dl_golden_free(&g);
    write_candidate(p, &c, -1, "bf16", 0.5f);
    ck_assert_int_eq(dl_golden_load_candidate(p, &c, &g, err, sizeof err), 0);
    ck_assert(g.bad_datasets == 0 && g.fwd.out);
    dl_golden_free(&g);
    /* fp32 storage in a bf16 case is finer: read, judged at the case's type */
    write_candidate(p, &c, -1, "fp32", 0.1f);
    ck_assert_int_eq(dl_golden_load_candidate(p, &c, &g, err, sizeof err), 0);
    ck_assert(g.bad_datasets == 0 && g.fwd.out && g.fwd.out[0] == 0.1f && !g.coarse_datasets);
    dl_golden_free(&g);
    /* ids out of range are kept for the check to report */
    write_candidate(p, &c, 4, NULL, 0.5f);
    ck_assert_int_eq(dl_golden_load_candidate(p, &c, &g, err, sizeof err), 0);
    ck_assert_int_eq(g.fwd.topk_ids[0], 4);
    dl_golden_free(&g);
    /* shapes against the golden's configuration */
    write_candidate(p, &c, -1, NULL, 0.5f);
    dl_moe_config_t other = c;
    other.tokens = 5;
    ck_assert_int_eq(dl_golden_load_candidate(p, &other, &g, err, sizeof err), 0);
    ck_assert(g.bad_datasets && !g.fwd.out && !g.fwd.topk_ids && !g.fwd.sort_perm);
    dl_golden_free(&g);
    /* a /config that disagrees */
    write_valid("gold.h5", &c);
    dl_moe_config_t c2 = c;
    c2.hidden = 6;
    ck_assert_int_eq(dl_golden_load_candidate(tpath("gold.h5"), &c2, &g, err, sizeof err), DL_ESHAPE);
    ck_assert(strstr(err, "hidden"));
    rm_tmpdir();
}
END_TEST

/* ------------------------------------------- candidates: set aside, kept */

/* Index of a dataset in the table (the bit in bad_datasets). */
static int ds_index(const char *path)
{
    for (int i = 0; i < dl_golden_dataset_count(); i++)
        if (!strcmp(dl_golden_dataset(i)->path, path))
            return i;
    ck_abort_msg("no dataset %s", path);
    return -1;
}

/* A fresh candidate file with empty /forward and /backward groups. */
static hid_t cand_create(const char *path)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    ck_assert_int_ge(H5Gclose(H5Gcreate2(f, "forward", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), 0);
    ck_assert_int_ge(H5Gclose(H5Gcreate2(f, "backward", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), 0);
    return f;
}

/* Adds dataset dspath of file type ftype; rank < 0 makes a scalar. */
static void cand_ds(hid_t f, const char *dspath, hid_t ftype, int rank, const hsize_t *dims,
                    hid_t mtype, const void *data, const char *dtype_attr)
{
    hid_t sp = rank < 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, NULL);
    hid_t d = H5Dcreate2(f, dspath, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_msg(d >= 0, "create %s", dspath);
    if (data)
        ck_assert_int_ge(H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
    if (dtype_attr)
        h5_attr_str(d, "dtype", dtype_attr);
    H5Dclose(d);
    H5Sclose(sp);
}

/* Loads a candidate that must load; checks the bad-dataset bookkeeping:
 * exactly the datasets of `bad` (NULL-terminated paths) are set aside, each
 * with a NULL array and a one-line reason containing the matching word of
 * `why` (parallel to bad). */
static void expect_set_aside(const char *path, const dl_moe_config_t *c, dl_golden_file_t *g,
                             const char *const *bad, const char *const *why)
{
    char err[512] = "";
    int rc = dl_golden_load_candidate(path, c, g, err, sizeof err);
    ck_assert_msg(rc == 0, "%s: %s (%s)", path, dl_err_name(rc), err);
    dl_rowset_t want = 0;
    for (int j = 0; bad[j]; j++) {
        int i = ds_index(bad[j]);
        want |= DL_ROWSET_BIT(i);
        ck_assert_msg(*dl_golden_slot(g, dl_golden_dataset(i)) == NULL, "%s has an array", bad[j]);
        ck_assert_msg(strstr(g->bad_reason[i], why[j]), "%s: reason '%s' lacks '%s'", bad[j],
                      g->bad_reason[i], why[j]);
        ck_assert(!strchr(g->bad_reason[i], '\n'));
    }
    ck_assert_msg(g->bad_datasets == want, "bad_datasets %llx:%llx, want %llx:%llx",
                  (unsigned long long)(g->bad_datasets >> 64), (unsigned long long)g->bad_datasets,
                  (unsigned long long)(want >> 64), (unsigned long long)want);
    for (int i = 0; i < DL_GOLDEN_DATASET_MAX; i++)
        if (!DL_ROWSET_HAS(want, i))
            ck_assert_msg(g->bad_reason[i][0] == '\0', "reason for %d: %s", i, g->bad_reason[i]);
}

/* Shapes and ranks: the bad datasets go, the good ones stay. */
START_TEST(candidate_bad_shapes_set_aside)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_F32, 1, 0); /* T 6, d 5, f 7, E 4, k 2 */
    const char *p = tpath("c.h5");
    float fb[512];
    for (int i = 0; i < 512; i++)
        fb[i] = (float)i * 0.25f;
    int32_t ids[12] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    hsize_t d_out_t[2] = {5, 6}, d_out_w[2] = {6, 6}, d3[3] = {6, 4, 1}, d_tk[2] = {6, 2},
            d_ms[1] = {11}, d_hg[2] = {12, 7};
    hid_t f = cand_create(p);
    cand_ds(f, "/forward/out", H5T_IEEE_F32LE, 2, d_out_t, H5T_NATIVE_FLOAT, fb, NULL);
    cand_ds(f, "/forward/router_logits", H5T_IEEE_F32LE, 3, d3, H5T_NATIVE_FLOAT, fb, NULL);
    cand_ds(f, "/forward/topk_weights", H5T_IEEE_F32LE, -1, NULL, H5T_NATIVE_FLOAT, fb, NULL);
    cand_ds(f, "/forward/sort_perm", H5T_STD_I32LE, 1, d_ms, H5T_NATIVE_INT32, ids, NULL);
    cand_ds(f, "/forward/topk_ids", H5T_STD_I32LE, 2, d_tk, H5T_NATIVE_INT32, ids, NULL);
    cand_ds(f, "/forward/h_gate", H5T_IEEE_F32LE, 2, d_hg, H5T_NATIVE_FLOAT, fb, NULL);
    cand_ds(f, "/backward/d_x", H5T_IEEE_F32LE, 2, d_out_w, H5T_NATIVE_FLOAT, fb, NULL);
    /* a group where a dataset belongs */
    ck_assert_int_ge(H5Gclose(H5Gcreate2(f, "/forward/y_sorted", H5P_DEFAULT, H5P_DEFAULT,
                                         H5P_DEFAULT)), 0);
    H5Fclose(f);
    dl_golden_file_t g;
    const char *bad[] = {"/forward/out", "/forward/router_logits", "/forward/topk_weights",
                         "/forward/sort_perm", "/backward/d_x", "/forward/y_sorted", NULL};
    const char *why[] = {"shape [5,6], expected [6,5]", "3 dimensions", "scalar", "[11]",
                         "[6,6]", "not a dataset"};
    expect_set_aside(p, &c, &g, bad, why);
    ck_assert(g.has_forward && g.has_backward && !g.has_inputs);
    ck_assert_ptr_nonnull(g.fwd.topk_ids);
    ck_assert_int_eq(g.fwd.topk_ids[5], 1);
    ck_assert_ptr_nonnull(g.fwd.h_gate);
    ck_assert(g.fwd.h_gate[83] == 83 * 0.25f);
    dl_golden_free(&g);
    ck_assert(g.bad_datasets == 0 && g.bad_reason[ds_index("/forward/out")][0] == '\0');
    rm_tmpdir();
}
END_TEST

/* Types: floats only as IEEE float32 LE, integers of any integer type that
 * holds the values. */
START_TEST(candidate_bad_types_set_aside)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_F32, 1, 0);
    const char *p = tpath("c.h5");
    double db[64] = {0};
    float fb[64] = {0};
    int64_t wide[12] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    wide[7] = (int64_t)1 << 40; /* does not fit the int32 array */
    int16_t narrow[12] = {3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, -1};
    uint8_t u8[4] = {1, 2, 3, 6};
    hsize_t d_out[2] = {6, 5}, d_tk[2] = {6, 2}, d_m[1] = {12}, d_e[1] = {4}, d_p[1] = {5};
    hid_t f = cand_create(p);
    for (int i = 0; i < 64; i++) {
        db[i] = 0.1 * (i - 7); /* rounds to float32 on reading */
        fb[i] = 0.5f * (float)(i - 9);
    }
    cand_ds(f, "/forward/out", H5T_IEEE_F64LE, 2, d_out, H5T_NATIVE_DOUBLE, db, NULL);
    hsize_t d_te[2] = {6, 4};
    cand_ds(f, "/forward/router_scores", H5T_IEEE_F32BE, 2, d_te, H5T_NATIVE_FLOAT, fb, NULL);
    cand_ds(f, "/forward/router_logits", H5T_NATIVE_LDOUBLE, 2, d_te, H5T_NATIVE_DOUBLE, db, NULL);
    cand_ds(f, "/forward/topk_weights", H5T_STD_I32LE, 2, d_tk, H5T_NATIVE_INT64, wide, NULL);
    cand_ds(f, "/forward/topk_ids", H5T_STD_I64LE, 2, d_tk, H5T_NATIVE_INT64, wide, NULL);
    cand_ds(f, "/forward/sort_perm", H5T_STD_I16BE, 1, d_m, H5T_NATIVE_INT16, narrow, NULL);
    cand_ds(f, "/forward/inv_perm", H5T_IEEE_F32LE, 1, d_m, H5T_NATIVE_FLOAT, fb, NULL);
    cand_ds(f, "/forward/group_sizes", H5T_STD_U8LE, 1, d_e, H5T_NATIVE_UINT8, u8, NULL);
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, 4);
    char strs[5][4] = {"a", "b", "c", "d", "e"};
    cand_ds(f, "/forward/group_offsets", st, 1, d_p, st, strs, NULL);
    H5Tclose(st);
    H5Fclose(f);
    dl_golden_file_t g;
    const char *bad[] = {"/forward/router_logits", "/forward/topk_weights",
                         "/forward/topk_ids", "/forward/inv_perm", "/forward/group_offsets", NULL};
    const char *why[] = {"float64, IEEE half or a 2-byte bf16", "integer",
                         "[3,1] = 1099511627776", "float", "string"};
    expect_set_aside(p, &c, &g, bad, why);
    /* float64 and big-endian float32 are converted by the runner itself */
    ck_assert_ptr_nonnull(g.fwd.out);
    for (int i = 0; i < 30; i++)
        ck_assert(g.fwd.out[i] == (float)db[i]);
    ck_assert_ptr_nonnull(g.fwd.router_scores);
    for (int i = 0; i < 24; i++)
        ck_assert(g.fwd.router_scores[i] == fb[i]);
    ck_assert_ptr_nonnull(g.fwd.sort_perm);
    ck_assert_int_eq(g.fwd.sort_perm[0], 3);
    ck_assert_int_eq(g.fwd.sort_perm[11], -1);
    ck_assert_ptr_nonnull(g.fwd.group_sizes);
    ck_assert(g.fwd.group_sizes[3] == 6);
    dl_golden_free(&g);
    rm_tmpdir();
}
END_TEST

/* dtype attributes: another type, not a string, or values off the grid
 * they declare; fp32-typed stages of a bf16 case are not on that grid. */
START_TEST(candidate_bad_dtype_attributes_set_aside)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_BF16, 1, 0);
    const char *p = tpath("c.h5");
    float on[64], off[64];
    for (int i = 0; i < 64; i++) {
        on[i] = (float)dl_round(0.37 * (i - 20), DL_BF16);
        off[i] = on[i];
    }
    off[13] = 1.0f + 0x1p-12f;
    hsize_t d_td[2] = {6, 5}, d_md[2] = {12, 5}, d_te[2] = {6, 4}, d_tk[2] = {6, 2};
    hid_t f = cand_create(p);
    cand_ds(f, "/forward/out", H5T_IEEE_F32LE, 2, d_td, H5T_NATIVE_FLOAT, on, "fp32");
    cand_ds(f, "/forward/y_sorted", H5T_IEEE_F32LE, 2, d_md, H5T_NATIVE_FLOAT, off, "bf16");
    cand_ds(f, "/forward/x_sorted", H5T_IEEE_F32LE, 2, d_md, H5T_NATIVE_FLOAT, off, NULL);
    cand_ds(f, "/forward/router_logits", H5T_IEEE_F32LE, 2, d_te, H5T_NATIVE_FLOAT, off, "fp32");
    cand_ds(f, "/backward/d_x", H5T_IEEE_F32LE, 2, d_td, H5T_NATIVE_FLOAT, on, "bf16");
    cand_ds(f, "/forward/topk_weights", H5T_IEEE_F32LE, 2, d_tk, H5T_NATIVE_FLOAT, on, NULL);
    hid_t o = H5Dopen2(f, "/forward/topk_weights", H5P_DEFAULT);
    h5_attr_i64(o, "dtype", 32);
    H5Dclose(o);
    H5Fclose(f);
    dl_golden_file_t g;
    const char *bad[] = {"/forward/y_sorted", "/forward/topk_weights", NULL};
    const char *why[] = {"[2,3]", "dtype"};
    expect_set_aside(p, &c, &g, bad, why);
    ck_assert(strstr(g.bad_reason[ds_index("/forward/y_sorted")], "bf16"));
    /* fp32 storage in a bf16 stage is finer: read, not marked */
    ck_assert_ptr_nonnull(g.fwd.out);
    ck_assert(!DL_ROWSET_HAS(g.coarse_datasets, ds_index("/forward/out")));
    ck_assert_ptr_nonnull(g.fwd.x_sorted); /* no dtype attribute: values not judged */
    ck_assert(g.fwd.x_sorted[13] == off[13]);
    ck_assert_ptr_nonnull(g.fwd.router_logits);
    ck_assert_ptr_nonnull(g.bwd.d_x);
    dl_golden_free(&g);
    rm_tmpdir();
}
END_TEST

/* A 2-byte HDF5 float type: IEEE half, or bf16 (8 exponent, 7 significand
 * bits); created here, read by the runner's own conversion. */
static hid_t half_type(int bf)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    ck_assert_int_ge(H5Tset_fields(t, 15, bf ? 7 : 10, bf ? 8 : 5, 0, bf ? 7 : 10), 0);
    ck_assert_int_ge(H5Tset_offset(t, 0), 0);
    ck_assert_int_ge(H5Tset_precision(t, 16), 0);
    ck_assert_int_ge(H5Tset_size(t, 2), 0);
    ck_assert_int_ge(H5Tset_ebias(t, bf ? 127 : 15), 0);
    return t;
}

/* Storage types (issue 11, item 5): 2-byte half and bf16 read exactly;
 * a coarser storage (bf16 in an fp32 stage, by the HDF5 type or the dtype
 * attribute) is read and marked coarse with its type; a dtype attribute
 * that contradicts a 2-byte type, or values off the declared grid, set the
 * dataset aside. */
START_TEST(candidate_storage_types)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_F32, 1, 0);
    const char *p = tpath("c.h5");
    float v[64];
    for (int i = 0; i < 64; i++)
        v[i] = (float)dl_round(0.37 * (i - 20) + 1e-3 * i, DL_BF16); /* on bf16's grid and fp16's */
    for (int i = 0; i < 64; i++)
        v[i] = (float)dl_round(v[i], DL_F16);
    hsize_t d_td[2] = {6, 5}, d_te[2] = {6, 4}, d_md[2] = {12, 5}, d_tk[2] = {6, 2};
    hid_t f = cand_create(p), h16 = half_type(0), b16 = half_type(1);
    cand_ds(f, "/forward/out", h16, 2, d_td, H5T_NATIVE_FLOAT, v, NULL);
    cand_ds(f, "/forward/router_logits", b16, 2, d_te, H5T_NATIVE_FLOAT, v, NULL);
    cand_ds(f, "/forward/y_sorted", H5T_IEEE_F32LE, 2, d_md, H5T_NATIVE_FLOAT, v, "bf16");
    cand_ds(f, "/forward/router_scores", b16, 2, d_te, H5T_NATIVE_FLOAT, v, "fp16");
    cand_ds(f, "/forward/topk_weights", H5T_IEEE_F32LE, 2, d_tk, H5T_NATIVE_FLOAT, v, "fp64");
    H5Tclose(h16);
    H5Tclose(b16);
    H5Fclose(f);
    dl_golden_file_t g;
    const char *bad[] = {"/forward/router_scores", "/forward/topk_weights", NULL};
    const char *why[] = {"stored as bf16", "not fp32, bf16 or fp16"};
    expect_set_aside(p, &c, &g, bad, why);
    ck_assert_ptr_nonnull(g.fwd.out);
    ck_assert_ptr_nonnull(g.fwd.router_logits);
    ck_assert_ptr_nonnull(g.fwd.y_sorted);
    for (int i = 0; i < 24; i++)
        ck_assert_msg(g.fwd.out[i] == v[i] && g.fwd.router_logits[i] == v[i], "element %d", i);
    const int io = ds_index("/forward/out"), il = ds_index("/forward/router_logits"),
              iy = ds_index("/forward/y_sorted");
    ck_assert(g.coarse_datasets == (DL_ROWSET_BIT(io) | DL_ROWSET_BIT(il) | DL_ROWSET_BIT(iy)));
    ck_assert_int_eq(g.store[io], DL_F16);
    ck_assert_int_eq(g.store[il], DL_BF16);
    ck_assert_int_eq(g.store[iy], DL_BF16);
    dl_golden_free(&g);
    rm_tmpdir();
}
END_TEST

/* Out-of-range ids, permutation entries and sizes are kept as stored. */
START_TEST(candidate_values_never_judged)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_F32, 0, 1);
    const char *p = tpath("c.h5");
    int32_t ids[12] = {-5, 4, 1000, INT32_MAX, INT32_MIN, 0, 1, 2, 3, 3, 3, 3};
    int64_t perm[12] = {-7, 12, -1, 13, 0, 1, 2, 3, 4, 5, 6, INT32_MIN};
    int64_t sizes[4] = {-3, 0, INT64_MAX, 1}, offs[5] = {5, -1, 7, 7, INT64_MIN};
    hsize_t d_tk[2] = {6, 2}, d_m[1] = {12}, d_e[1] = {4}, d_p[1] = {5};
    hid_t f = cand_create(p);
    cand_ds(f, "/forward/topk_ids", H5T_STD_I32LE, 2, d_tk, H5T_NATIVE_INT32, ids, NULL);
    cand_ds(f, "/forward/sort_perm", H5T_STD_I64LE, 1, d_m, H5T_NATIVE_INT64, perm, NULL);
    cand_ds(f, "/forward/inv_perm", H5T_STD_I32LE, 1, d_m, H5T_NATIVE_INT64, perm, "int32");
    cand_ds(f, "/forward/group_sizes", H5T_STD_I64LE, 1, d_e, H5T_NATIVE_INT64, sizes, NULL);
    cand_ds(f, "/forward/group_offsets", H5T_STD_I64BE, 1, d_p, H5T_NATIVE_INT64, offs, NULL);
    H5Fclose(f);
    dl_golden_file_t g;
    char err[512];
    ck_assert_msg(dl_golden_load_candidate(p, &c, &g, err, sizeof err) == 0, "%s", err);
    ck_assert(g.bad_datasets == 0);
    for (int i = 0; i < 12; i++) {
        ck_assert_int_eq(g.fwd.topk_ids[i], ids[i]);
        ck_assert_int_eq(g.fwd.sort_perm[i], perm[i]);
        ck_assert_int_eq(g.fwd.inv_perm[i], perm[i]);
    }
    for (int i = 0; i < 4; i++)
        ck_assert(g.fwd.group_sizes[i] == sizes[i]);
    for (int i = 0; i < 5; i++)
        ck_assert(g.fwd.group_offsets[i] == offs[i]);
    dl_golden_free(&g);
    /* the golden loader still refuses them */
    ck_assert_int_eq(dl_golden_load(p, &g, err, sizeof err), DL_EFORMAT);
    rm_tmpdir();
}
END_TEST

/* Whole-file problems stay errors, one line naming the file (and object). */
static void expect_candidate_error(const char *path, const dl_moe_config_t *c, int code,
                                   const char *object)
{
    dl_golden_file_t g;
    char err[512] = "";
    int rc = dl_golden_load_candidate(path, c, &g, err, sizeof err);
    ck_assert_msg(rc == code, "%s: got %s (%s), want %s", path, dl_err_name(rc), err,
                  dl_err_name(code));
    ck_assert_msg(strstr(err, path) == err, "message does not start with the file: %s", err);
    ck_assert_msg(!strchr(err, '\n'), "message has a newline: %s", err);
    if (object)
        ck_assert_msg(strstr(err, object), "message does not name %s: %s", object, err);
}

START_TEST(candidate_whole_file_errors)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_BF16, 1, 0);
    expect_candidate_error(tpath("absent.h5"), &c, DL_EIO, NULL);
    spit(tpath("text.h5"), (const unsigned char *)"not hdf5\n", 9);
    expect_candidate_error(tpath("text.h5"), &c, DL_EFORMAT, "HDF5");
    /* an edited copy of a golden (the seal now stale) is a fine candidate,
     * marked sealed = -1; as a golden it stays refused (issue 11, item 4) */
    write_valid("v.h5", &c);
    {
        dl_golden_file_t g;
        char err[512];
        ck_assert_int_eq(dl_golden_load_candidate(tpath("v.h5"), &c, &g, err, sizeof err), 0);
        ck_assert_int_eq(g.sealed, 1);
        dl_golden_free(&g);
        hid_t f = h5open_rw(tpath("v.h5")); /* what h5py 'r+' does: no reseal */
        hid_t d = H5Dopen2(f, "/forward/out", H5P_DEFAULT);
        float *o = malloc(sizeof(float) * 4096);
        ck_assert_int_ge(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, o), 0);
        float was = o[0];
        o[0] = was == 0 ? 1.0f : 2.0f * was; /* stays on the bf16 grid */
        ck_assert_int_ge(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, o), 0);
        H5Dclose(d);
        H5Fclose(f);
        ck_assert_msg(dl_golden_load_candidate(tpath("v.h5"), &c, &g, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(g.sealed, -1);
        ck_assert(g.fwd.out[0] == o[0]);
        dl_golden_free(&g);
        free(o);
        expect_load_error(tpath("v.h5"), DL_EFORMAT, "damaged");
    }
    /* /config disagreeing with the golden's */
    write_valid("v.h5", &c);
    h5_obj_attr_i64(tpath("v.h5"), "/config", "experts", 5);
    expect_candidate_error(tpath("v.h5"), &c, DL_ESHAPE, "/config");
    write_valid("v.h5", &c);
    h5_obj_attr_str(tpath("v.h5"), "/config", "dtype", "fp16");
    expect_candidate_error(tpath("v.h5"), &c, DL_EDTYPE, "/config");
    /* a group that is a dataset */
    write_valid("v.h5", &c);
    h5_delete(tpath("v.h5"), "/forward");
    float fb[4] = {0};
    hsize_t d1[1] = {4};
    h5_replace(tpath("v.h5"), "/forward", H5T_IEEE_F32LE, 1, d1, H5T_NATIVE_FLOAT, fb, NULL);
    expect_candidate_error(tpath("v.h5"), &c, DL_EFORMAT, "/forward");
    /* a root attribute of the wrong kind */
    write_candidate(tpath("c.h5"), &c, -1, NULL, 0.5f);
    hid_t f = h5open_rw(tpath("c.h5"));
    h5_attr_i64(f, "backend_version", 3);
    H5Fclose(f);
    expect_candidate_error(tpath("c.h5"), &c, DL_EFORMAT, "backend_version");
    rm_tmpdir();
}
END_TEST

START_TEST(candidate_root_attributes)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_BF16, 1, 0);
    const char *p = tpath("c.h5");
    dl_golden_file_t g;
    char err[512];
    write_candidate(p, &c, -1, NULL, 0.5f);
    ck_assert_msg(dl_golden_load_candidate(p, &c, &g, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(g.backend_version, "");
    ck_assert_str_eq(g.device, "");
    dl_golden_free(&g);
    hid_t f = h5open_rw(p);
    h5_attr_str(f, "backend_version", "2.3.1+cu124");
    h5_attr_str(f, "device", "NVIDIA H200");
    H5Fclose(f);
    ck_assert_msg(dl_golden_load_candidate(p, &c, &g, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(g.backend, "test-backend 1.0");
    ck_assert_str_eq(g.backend_version, "2.3.1+cu124");
    ck_assert_str_eq(g.device, "NVIDIA H200");
    ck_assert_str_eq(g.compute_mode, "bf16");
    dl_golden_free(&g);
    rm_tmpdir();
}
END_TEST

/* Attribute values quoted in reasons and errors come from the file: a
 * control character in them must not break the one-line contract (found by
 * the fuzzer: a dtype attribute "fp\n2"). */
START_TEST(candidate_messages_stay_one_line)
{
    mk_tmpdir();
    dl_moe_config_t c = small_config(DL_F32, 1, 0);
    const char *p = tpath("c.h5");
    float fb[64] = {0};
    hsize_t d_td[2] = {6, 5};
    hid_t f = cand_create(p);
    cand_ds(f, "/forward/out", H5T_IEEE_F32LE, 2, d_td, H5T_NATIVE_FLOAT, fb, "fp\n2\r\t");
    H5Fclose(f);
    dl_golden_file_t g;
    const char *bad[] = {"/forward/out", NULL};
    const char *why[] = {"'fp?2\?\?'"};
    expect_set_aside(p, &c, &g, bad, why);
    dl_golden_free(&g);
    f = h5open_rw(p);
    hid_t cg = H5Gcreate2(f, "config", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    h5_attr_str(cg, "dtype", "bf16\nfp32");
    H5Gclose(cg);
    H5Fclose(f);
    expect_candidate_error(p, &c, DL_EDTYPE, "bf16?fp32");
    rm_tmpdir();
}
END_TEST

/* ------------------------------------------------------ generation */

START_TEST(generate_write_load)
{
    mk_tmpdir();
    const char *names[] = {"tiny", "no-tokens-bf16", "plain-ffn-fp16", "deepseek-v3-small"};
    for (int i = 0; i < 4; i++) {
        dl_case_t c;
        ck_assert_int_eq(dl_case_find(names[i], &c), 0);
        dl_golden_file_t g, h;
        int berr = -99;
        char err[512];
        ck_assert_msg(dl_golden_generate(&c, NULL, &g, &berr, err, sizeof err) == 0, "%s", err);
        ck_assert(g.has_inputs && g.has_forward);
        ck_assert_int_eq(berr, g.has_backward ? 0 : berr);
        ck_assert_msg(dl_golden_write(tpath("g.h5"), &g, 1, NULL, NULL, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(dl_golden_load(tpath("g.h5"), &h, err, sizeof err) == 0, "%s", err);
        assert_same_file_contents(&g, &h);
        ck_assert_str_eq(h.case_name, names[i]);
        dl_golden_free(&g);
        dl_golden_free(&h);
    }
    /* gen_file refuses an existing output before doing any work */
    dl_case_t c;
    dl_case_find("tiny", &c);
    char err[512];
    ck_assert_int_eq(dl_golden_gen_file(&c, tpath("g.h5"), NULL, NULL, err, sizeof err), DL_EEXIST);
    dl_golden_gen_opts_t o = {.force = 1, .no_backward = 1};
    ck_assert_int_eq(dl_golden_gen_file(&c, tpath("g.h5"), &o, NULL, err, sizeof err), 0);
    dl_golden_file_t h;
    ck_assert_int_eq(dl_golden_load(tpath("g.h5"), &h, err, sizeof err), 0);
    ck_assert(h.has_forward && !h.has_backward);
    dl_golden_free(&h);
    rm_tmpdir();
}
END_TEST

/* The constructed cases do what their names say, in the real forward pass. */
START_TEST(generate_special_cases_route_as_named)
{
    const dl_dtype_t ts[] = {DL_F32, DL_BF16, DL_F16};
    for (int ti = 0; ti < 3; ti++) {
        dl_case_t c;
        dl_golden_file_t g;
        char err[512];
        dl_golden_gen_opts_t o = {.no_backward = 1};
        ck_assert_int_eq(dl_case_find("empty-experts", &c), 0);
        dl_case_set_dtype(&c, ts[ti]);
        ck_assert_msg(dl_golden_generate(&c, &o, &g, NULL, err, sizeof err) == 0, "%s", err);
        int64_t E = c.config.route.experts;
        for (int64_t e = 0; e < E; e++) {
            int empty = e == 0 || e == E / 2 || e == E - 1;
            ck_assert_msg(empty == (g.fwd.group_sizes[e] == 0), "%s: expert %lld has %lld",
                          c.name, (long long)e, (long long)g.fwd.group_sizes[e]);
        }
        dl_golden_free(&g);

        ck_assert_int_eq(dl_case_find("one-hot", &c), 0);
        dl_case_set_dtype(&c, ts[ti]);
        ck_assert_int_eq(dl_golden_generate(&c, &o, &g, NULL, err, sizeof err), 0);
        ck_assert(g.fwd.group_sizes[c.config.route.experts / 2] == c.config.tokens);
        dl_golden_free(&g);

        const char *tie_cases[] = {"ties", "ties-grouped"};
        for (int tc = 0; tc < 2; tc++) {
            ck_assert_int_eq(dl_case_find(tie_cases[tc], &c), 0);
            dl_case_set_dtype(&c, ts[ti]);
            ck_assert_int_eq(dl_golden_generate(&c, &o, &g, NULL, err, sizeof err), 0);
            int exact = 0, near = 0;
            for (int64_t t = 0; t < c.config.tokens; t++) {
                exact += g.fwd.tie_margin[t] == 0.0f;
                near += g.fwd.tie_margin[t] > 0.0f && g.fwd.tie_margin[t] < 1e-5f;
            }
            ck_assert_msg(exact >= 2 && near >= 1, "%s: %d exact, %d near ties", c.name, exact, near);
            /* token 0 (all zeros): the k lowest-index selectable experts */
            dl_golden_free(&g);
        }

        ck_assert_int_eq(dl_case_find("zipf", &c), 0);
        dl_case_set_dtype(&c, ts[ti]);
        ck_assert_int_eq(dl_golden_generate(&c, &o, &g, NULL, err, sizeof err), 0);
        int64_t head = g.fwd.group_sizes[0] + g.fwd.group_sizes[1] + g.fwd.group_sizes[2];
        ck_assert_msg(head * 2 > c.config.tokens * c.config.route.top_k, "zipf head %lld", (long long)head);
        dl_golden_free(&g);
    }
}
END_TEST

/* The committed vectors hold exactly what this build generates: values
 * compared after loading, so this holds under any HDF5 version (the
 * byte-level check is tests/test_vectors.sh). */
START_TEST(committed_vectors_match_generation)
{
    const char *src = getenv("top_srcdir");
    char path[1024];
    snprintf(path, sizeof path, "%s/vectors/SHA256SUMS", src ? src : ".");
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char line[512];
    int files = 0;
    while (fgets(line, sizeof line, f)) {
        char sum[80], name[256];
        if (sscanf(line, "%79s %255s", sum, name) != 2)
            continue;
        char *nm = name[0] == '*' ? name + 1 : name;
        char cname[256];
        snprintf(cname, sizeof cname, "%s", nm);
        char *dot = strstr(cname, ".h5");
        ck_assert_ptr_nonnull(dot);
        *dot = '\0';
        dl_case_t c;
        ck_assert_msg(dl_case_find(cname, &c) == 0, "vectors/%s: no such case", nm);
        dl_golden_file_t g, h;
        char err[512];
        ck_assert_msg(dl_golden_generate(&c, NULL, &g, NULL, err, sizeof err) == 0, "%s", err);
        snprintf(path, sizeof path, "%s/vectors/%s", src ? src : ".", nm);
        ck_assert_msg(dl_golden_load(path, &h, err, sizeof err) == 0, "%s", err);
        assert_same_file_contents(&g, &h);
        dl_golden_free(&g);
        dl_golden_free(&h);
        files++;
    }
    fclose(f);
    ck_assert_int_gt(files, 0);
}
END_TEST

/* ------------------------------------------------------------------ */

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("rng", "rng_splitmix_known_answers", rng_splitmix_known_answers, 60),
        DL_TEST("rng", "rng_sequential_reading_of_spec", rng_sequential_reading_of_spec, 60),
        DL_TEST("rng", "rng_normal_irwin_hall", rng_normal_irwin_hall, 60),
        DL_TEST("rng", "rng_ln_vs_mpfr", rng_ln_vs_mpfr, 60),
        DL_TEST("inputs", "inputs_on_grid_and_finite", inputs_on_grid_and_finite, 60),
        DL_TEST("inputs", "inputs_follow_the_spec", inputs_follow_the_spec, 60),
        DL_TEST("inputs", "inputs_fp32_full_significands", inputs_fp32_full_significands, 60),
        DL_TEST("inputs", "inputs_thread_invariant", inputs_thread_invariant, 60),
        DL_TEST("inputs", "inputs_constructions", inputs_constructions, 60),
        DL_TEST("catalogue", "catalogue_valid_and_unique", catalogue_valid_and_unique, 30),
        DL_TEST("catalogue", "catalogue_set_dtype", catalogue_set_dtype, 30),
        DL_TEST("kernel tier", "kernel_tier_coverage", kernel_tier_coverage, 120),
        DL_TEST("kernel tier", "planted_sizes_route_as_planned", planted_sizes_route_as_planned, 120),
        DL_TEST("case files", "casefile_valid", casefile_valid, 30),
        DL_TEST("case files", "casefile_errors_name_file_and_line", casefile_errors_name_file_and_line, 30),
        DL_TEST("write", "roundtrip_every_variant", roundtrip_every_variant, 60),
        DL_TEST("write", "write_is_byte_reproducible", write_is_byte_reproducible, 60),
        DL_TEST("write", "write_never_clobbers_never_leaves_partial_files", write_never_clobbers_never_leaves_partial_files, 60),
        DL_TEST("write", "hdf5_errors_are_silenced", hdf5_errors_are_silenced, 60),
        DL_TEST("damaged files", "sha256_known_answers", sha256_known_answers, 120),
        DL_TEST("damaged files", "read_missing_and_non_hdf5", read_missing_and_non_hdf5, 120),
        DL_TEST("damaged files", "read_truncated", read_truncated, 120),
        DL_TEST("damaged files", "read_flipped_bytes", read_flipped_bytes, 120),
        DL_TEST("damaged files", "read_wrong_shapes_and_types", read_wrong_shapes_and_types, 120),
        DL_TEST("damaged files", "read_bad_values", read_bad_values, 120),
        DL_TEST("damaged files", "read_nonfinite_golden", read_nonfinite_golden, 120),
        DL_TEST("damaged files", "read_bad_attributes", read_bad_attributes, 120),
        DL_TEST("candidates", "candidate_subsets", candidate_subsets, 30),
        DL_TEST("candidate loader", "candidate_bad_shapes_set_aside", candidate_bad_shapes_set_aside, 60),
        DL_TEST("candidate loader", "candidate_bad_types_set_aside", candidate_bad_types_set_aside, 60),
        DL_TEST("candidate loader", "candidate_bad_dtype_attributes_set_aside", candidate_bad_dtype_attributes_set_aside, 60),
        DL_TEST("candidate loader", "candidate_storage_types", candidate_storage_types, 60),
        DL_TEST("candidate loader", "candidate_values_never_judged", candidate_values_never_judged, 60),
        DL_TEST("candidate loader", "candidate_whole_file_errors", candidate_whole_file_errors, 60),
        DL_TEST("candidate loader", "candidate_root_attributes", candidate_root_attributes, 60),
        DL_TEST("candidate loader", "candidate_messages_stay_one_line", candidate_messages_stay_one_line, 60),
        DL_TEST("generation", "generate_write_load", generate_write_load, 120),
        DL_TEST("generation", "generate_special_cases_route_as_named", generate_special_cases_route_as_named, 120),
        DL_TEST("generation", "committed_vectors_match_generation", committed_vectors_match_generation, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
