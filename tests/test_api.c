/* The bindings' API (dropless/api.h): handles, arrays by name, every
 * refusal with its code and message, the check's options, reports, and
 * files written and read back through it. Both directions: the golden's
 * own values conform, a perturbed stage does not. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "tap.h"
#include "dropless.h"

static char err[512];

static dl_api_golden_t *gen(const char *name)
{
    dl_api_golden_t *g = NULL;
    int rc = dl_api_golden_generate(name, 0, 0, 0, &g, err, sizeof err);
    ck_assert_msg(rc == 0 && g, "%s: %s", name, err);
    return g;
}

/* A candidate holding every golden stage value (as float32/int arrays). */
static dl_api_candidate_t *copy_all(dl_api_golden_t *g, const char *skip)
{
    dl_api_candidate_t *c = NULL;
    ck_assert_int_eq(dl_api_candidate_new(g, "test", NULL, &c, err, sizeof err), 0);
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        const char *name = dl_value_name((dl_value_t)s);
        const void *data;
        int elem, rank;
        int64_t dims[3];
        if (skip && !strcmp(skip, name))
            continue;
        if (dl_api_golden_array(g, name, &data, &elem, &rank, dims, err, sizeof err) != 0)
            continue; /* not part of this layer */
        ck_assert_msg(dl_api_candidate_set(c, name, data, elem, rank, dims, err, sizeof err) == 0,
                      "%s: %s", name, err);
    }
    return c;
}

/* Equal texts; on a difference, the first differing part. */
static void same_text(const char *a, const char *b)
{
    size_t i = 0;
    while (a[i] && a[i] == b[i])
        i++;
    ck_assert_msg(a[i] == b[i], "texts differ at byte %zu: '%.80s' vs '%.80s'", i, a + i, b + i);
}

static int conformant(dl_api_golden_t *g, dl_api_candidate_t *c, const char *opts)
{
    dl_api_report_t *r = NULL;
    int rc = dl_api_check(g, c, opts, &r, err, sizeof err);
    ck_assert_msg(rc == 0, "check: %s", err);
    int ok = dl_api_report_conformant(r);
    dl_api_report_free(r);
    return ok;
}

START_TEST(tables)
{
    char *s = dl_api_cases_json();
    ck_assert_ptr_nonnull(s);
    int n = 0;
    for (const char *p = s; (p = strstr(p, "\"name\": ")); p++)
        n++;
    ck_assert_int_eq(n, dl_case_count());
    ck_assert_ptr_nonnull(strstr(s, "\"name\": \"mixtral-small-bf16\""));
    ck_assert_ptr_nonnull(strstr(s, "\"scaling\": 2.5"));
    dl_api_free_text(s);
    s = dl_api_layout_json();
    ck_assert_ptr_nonnull(s);
    ck_assert_ptr_nonnull(strstr(s, "\"name\": \"d_router_weight\""));
    dl_api_free_text(s);
    ck_assert_int_eq(dl_api_version(), DL_API_VERSION);
}
END_TEST

START_TEST(golden_handles)
{
    dl_api_golden_t *g = NULL;
    ck_assert_int_eq(dl_api_golden_generate("no-such-case", 0, 0, 0, &g, err, sizeof err), DL_ENOTFOUND);
    ck_assert_ptr_null(g);
    ck_assert_ptr_nonnull(strstr(err, "no-such-case"));
    ck_assert_int_eq(dl_api_golden_load("/nonexistent.h5", &g, err, sizeof err), DL_EIO);
    g = gen("tiny");
    const void *data;
    int elem, rank;
    int64_t dims[3];
    ck_assert_int_eq(dl_api_golden_array(g, "router_weight", &data, &elem, &rank, dims, err, sizeof err), 0);
    ck_assert_int_eq(elem, DL_API_F32);
    ck_assert_int_eq(rank, 2);
    ck_assert_int_eq(dims[0], 4); /* tiny: d = 4, E = 4 */
    ck_assert_int_eq(dims[1], 4);
    ck_assert_int_eq(dl_api_golden_array(g, "topk_ids", &data, &elem, &rank, dims, err, sizeof err), 0);
    ck_assert_int_eq(elem, DL_API_I32);
    ck_assert_int_eq(dl_api_golden_array(g, "nonsense", &data, &elem, &rank, dims, err, sizeof err),
                     DL_ENOTFOUND);
    char *info = dl_api_golden_info_json(g);
    ck_assert_ptr_nonnull(strstr(info, "\"case\": \"tiny\""));
    dl_api_free_text(info);
    /* a handle of the wrong kind is refused */
    dl_api_candidate_t *c = copy_all(g, NULL);
    ck_assert_int_eq(dl_api_golden_array((dl_api_golden_t *)c, "x", &data, &elem, &rank, dims, err,
                                         sizeof err), DL_EINVAL);
    dl_api_report_t *r = NULL;
    ck_assert_int_eq(dl_api_check((dl_api_golden_t *)c, c, NULL, &r, err, sizeof err), DL_EINVAL);
    ck_assert_ptr_null(dl_api_golden_info_json((dl_api_golden_t *)c));
    dl_api_candidate_free(c);
    dl_api_golden_free(g);
    dl_api_golden_free(NULL);
}
END_TEST

START_TEST(both_directions)
{
    const char *cases[] = {"tiny", "plain-ffn-bf16", "deepseek-v3-small-fp16"};
    dl_api_golden_t *g = gen(cases[_i]);
    dl_api_candidate_t *c = copy_all(g, NULL);
    ck_assert(conformant(g, c, NULL));
    ck_assert(conformant(g, c, "isolated=*\nprofile=fp32"));
    /* out with one element off by a lot */
    const void *data;
    int elem, rank;
    int64_t dims[3];
    ck_assert_int_eq(dl_api_golden_array(g, "out", &data, &elem, &rank, dims, err, sizeof err), 0);
    float *bad = malloc(sizeof(float) * (size_t)(dims[0] * dims[1]));
    memcpy(bad, data, sizeof(float) * (size_t)(dims[0] * dims[1]));
    bad[3] += 1.0f;
    ck_assert_int_eq(dl_api_candidate_set(c, "out", bad, DL_API_F32, rank, dims, err, sizeof err), 0);
    ck_assert(!conformant(g, c, NULL));
    ck_assert(conformant(g, c, "stages=router_logits,topk_ids")); /* out not selected */
    free(bad);
    dl_api_candidate_free(c);
    dl_api_golden_free(g);
}
END_TEST

START_TEST(refusals)
{
    dl_api_golden_t *g = gen("tiny-bf16");
    dl_api_candidate_t *c = NULL;
    ck_assert_int_eq(dl_api_candidate_new(g, "t", "no-such-profile", &c, err, sizeof err), DL_EINVAL);
    ck_assert_int_eq(dl_api_candidate_new(g, "t", "bf16", &c, err, sizeof err), 0);
    const void *data;
    int elem, rank;
    int64_t dims[3], d2[3];
    ck_assert_int_eq(dl_api_golden_array(g, "h_gate", &data, &elem, &rank, dims, err, sizeof err), 0);
    memcpy(d2, dims, sizeof d2);
    d2[1] += 1;
    ck_assert_int_eq(dl_api_candidate_set(c, "h_gate", data, elem, rank, d2, err, sizeof err), DL_ESHAPE);
    ck_assert_msg(strstr(err, "h_gate") && strstr(err, "[8, 5]") && strstr(err, "[8, 4]"), "%s", err);
    ck_assert_int_eq(dl_api_candidate_set(c, "h_gate", data, DL_API_I32, rank, dims, err, sizeof err),
                     DL_EDTYPE);
    ck_assert_int_eq(dl_api_candidate_set(c, "h_gate", data, 99, rank, dims, err, sizeof err), DL_EDTYPE);
    ck_assert_int_eq(dl_api_candidate_set(c, "x", data, elem, rank, dims, err, sizeof err), DL_ENOTFOUND);
    ck_assert_int_eq(dl_api_candidate_set(c, "tie_margin", data, elem, 1, dims, err, sizeof err),
                     DL_ENOTFOUND);
    ck_assert_int_eq(dl_api_candidate_set(c, "h_gaet", data, elem, rank, dims, err, sizeof err),
                     DL_ENOTFOUND);
    ck_assert_int_eq(dl_api_candidate_set(c, "h_gate", NULL, elem, rank, dims, err, sizeof err), DL_EINVAL);
    ck_assert_int_eq(dl_api_candidate_set(c, "h_gate", data, elem, -1, dims, err, sizeof err), DL_ESHAPE);
    /* int64 ids that do not fit int32; float ids */
    int64_t ids[8] = {0, 1, 2, 3, 0, 1, (int64_t)1 << 40, 3};
    int64_t idims[2] = {4, 2};
    ck_assert_int_eq(dl_api_candidate_set(c, "topk_ids", ids, DL_API_I64, 2, idims, err, sizeof err),
                     DL_ERANGE);
    ck_assert_int_eq(dl_api_candidate_set(c, "topk_ids", data, DL_API_F32, 2, idims, err, sizeof err),
                     DL_EDTYPE);
    /* float64 values that are not float32 values are not rounded silently */
    double v[32];
    for (int i = 0; i < 32; i++)
        v[i] = 0.1;
    int64_t ldims[2] = {4, 4};
    ck_assert_int_eq(dl_api_candidate_set(c, "router_logits", v, DL_API_F64, 2, ldims, err, sizeof err),
                     DL_EGRID);
    for (int i = 0; i < 32; i++)
        v[i] = i == 5 ? NAN : 0.5;
    ck_assert_int_eq(dl_api_candidate_set(c, "router_logits", v, DL_API_F64, 2, ldims, err, sizeof err), 0);
    ck_assert(!conformant(g, c, NULL)); /* the NaN is a finding */
    /* options */
    dl_api_report_t *r = NULL;
    ck_assert_int_eq(dl_api_check(g, c, "no_such_option=1", &r, err, sizeof err), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "no_such_option"));
    ck_assert_int_eq(dl_api_check(g, c, "profile=fp33", &r, err, sizeof err), DL_EINVAL);
    ck_assert_int_eq(dl_api_check(g, c, "profile", &r, err, sizeof err), DL_EINVAL);
    ck_assert_int_eq(dl_api_check(g, c, "isolated=router_logits;h_act", &r, err, sizeof err), DL_EINVAL);
    ck_assert_int_eq(dl_api_check(g, c, "stages=nope", &r, err, sizeof err), DL_EINVAL);
    ck_assert_int_eq(dl_api_check(g, c, "strict_storage=2", &r, err, sizeof err), DL_EINVAL);
    ck_assert_ptr_null(r);
    /* a candidate of another configuration */
    dl_api_golden_t *g2 = gen("tiny");
    ck_assert_int_eq(dl_api_check(g2, c, NULL, &r, err, sizeof err), DL_ESHAPE);
    dl_api_golden_free(g2);
    dl_api_candidate_free(c);
    dl_api_golden_free(g);
}
END_TEST

START_TEST(storage)
{
    dl_api_golden_t *g = gen("tiny-bf16");
    dl_api_candidate_t *c = copy_all(g, "h_gate");
    const void *data;
    int elem, rank;
    int64_t dims[3];
    ck_assert_int_eq(dl_api_golden_array(g, "h_gate", &data, &elem, &rank, dims, err, sizeof err), 0);
    size_t n = (size_t)(dims[0] * dims[1]);
    uint16_t *bits = malloc(n * sizeof *bits);
    float *off = malloc(n * sizeof *off);
    for (size_t i = 0; i < n; i++) {
        bits[i] = dl_bf16_from_float(((const float *)data)[i]);
        off[i] = ((const float *)data)[i] * (1.0f + 0x1p-12f); /* off the bf16 grid, within its bound */
    }
    ck_assert_int_eq(dl_api_candidate_set(c, "h_gate", bits, DL_API_BF16, rank, dims, err, sizeof err), 0);
    ck_assert(conformant(g, c, "strict_storage=1"));
    ck_assert_int_eq(dl_api_candidate_set(c, "h_gate", off, DL_API_F32, rank, dims, err, sizeof err), 0);
    ck_assert(conformant(g, c, NULL));
    ck_assert(!conformant(g, c, "strict_storage=1"));
    char path[] = "/tmp/dl_api_XXXXXX.h5";
    int fd = mkstemps(path, 3);
    close(fd);
    unlink(path);
    ck_assert_int_eq(dl_api_candidate_save(c, path, NULL, 0, err, sizeof err), DL_EGRID);
    ck_assert_int_eq(access(path, F_OK), -1);
    free(bits);
    free(off);
    dl_api_candidate_free(c);
    dl_api_golden_free(g);
}
END_TEST

/* The JSON report without its wall time. */
static char *json_of(dl_api_golden_t *g, dl_api_candidate_t *c, const char *opts)
{
    dl_api_report_t *r = NULL;
    ck_assert_msg(dl_api_check(g, c, opts, &r, err, sizeof err) == 0, "%s", err);
    char *s = dl_api_report_text(r, "json", 0);
    ck_assert_ptr_nonnull(s);
    char *t = strstr(s, "\"seconds\":");
    ck_assert_ptr_nonnull(t);
    char *end = strchr(t += 10, ',');
    ck_assert_ptr_nonnull(end);
    memmove(t, end, strlen(end) + 1);
    ck_assert_ptr_null(dl_api_report_text(r, "yaml", 0));
    char *junit = dl_api_report_text(r, "junit", 0), *table = dl_api_report_text(r, "table", 1);
    ck_assert_ptr_nonnull(strstr(junit, "<testsuite"));
    ck_assert_ptr_nonnull(strstr(table, "dropless check: case"));
    dl_api_free_text(junit);
    dl_api_free_text(table);
    dl_api_report_free(r);
    return s;
}

START_TEST(files)
{
    dl_api_golden_t *g = gen("mixtral-small-bf16"), *g2 = NULL;
    char dir[] = "/tmp/dl_api_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char gp[64], cp[64];
    snprintf(gp, sizeof gp, "%s/g.h5", dir);
    snprintf(cp, sizeof cp, "%s/c.h5", dir);
    ck_assert_int_eq(dl_api_golden_save(g, gp, 0, err, sizeof err), 0);
    ck_assert_int_eq(dl_api_golden_save(g, gp, 0, err, sizeof err), DL_EEXIST);
    ck_assert_int_eq(dl_api_golden_load(gp, &g2, err, sizeof err), 0);
    dl_api_candidate_t *c = copy_all(g, NULL), *c2 = NULL;
    ck_assert_int_eq(dl_api_candidate_set_attr(c, "backend_version", "v1.2", err, sizeof err), 0);
    ck_assert_int_eq(dl_api_candidate_set_attr(c, "device", "a CPU", err, sizeof err), 0);
    ck_assert_int_eq(dl_api_candidate_set_attr(c, "colour", "red", err, sizeof err), DL_EINVAL);
    ck_assert_int_eq(dl_api_candidate_set_attr(c, "compute_mode", "fp33", err, sizeof err), DL_EINVAL);
    char longv[300];
    memset(longv, 'v', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    ck_assert_int_eq(dl_api_candidate_set_attr(c, "backend_version", longv, err, sizeof err),
                     DL_EOVERFLOW);
    const char *iso = "h_gate,h_up;h_act;y_sorted";
    ck_assert_int_eq(dl_api_candidate_save(c, cp, "h_gate;nope", 0, err, sizeof err), DL_EINVAL);
    ck_assert_int_eq(dl_api_candidate_save(c, cp, NULL, 0, err, sizeof err), 0);
    ck_assert_int_eq(dl_api_candidate_save(c, cp, NULL, 0, err, sizeof err), DL_EEXIST);
    ck_assert_int_eq(dl_api_candidate_load(g2, cp, &c2, err, sizeof err), 0);
    char *a = json_of(g, c, NULL), *b = json_of(g2, c2, NULL);
    same_text(a, b);
    ck_assert_ptr_nonnull(strstr(b, "\"backend_version\":\"v1.2\""));
    dl_api_free_text(a);
    dl_api_free_text(b);
    dl_api_candidate_free(c2);
    /* the isolated groups travel in the file */
    dl_api_candidate_free(c);
    c = NULL;
    ck_assert_int_eq(dl_api_candidate_new(g, "iso", NULL, &c, err, sizeof err), 0);
    const char *names[] = {"h_gate", "h_up", "h_act", "y_sorted"};
    for (int i = 0; i < 4; i++) {
        const void *data;
        int elem, rank;
        int64_t dims[3];
        ck_assert_int_eq(dl_api_golden_array(g, names[i], &data, &elem, &rank, dims, err, sizeof err), 0);
        ck_assert_int_eq(dl_api_candidate_set(c, names[i], data, elem, rank, dims, err, sizeof err), 0);
    }
    ck_assert_int_eq(dl_api_candidate_save(c, cp, iso, 1, err, sizeof err), 0);
    ck_assert_int_eq(dl_api_candidate_load(g2, cp, &c2, err, sizeof err), 0);
    char *opts = malloc(strlen(iso) + 16);
    sprintf(opts, "isolated=%s", iso);
    a = json_of(g, c, opts);
    b = json_of(g2, c2, NULL);
    same_text(a, b);
    free(opts);
    dl_api_free_text(a);
    dl_api_free_text(b);
    dl_api_candidate_free(c2);
    dl_api_candidate_free(c);
    dl_api_golden_free(g2);
    dl_api_golden_free(g);
    unlink(gp);
    unlink(cp);
    rmdir(dir);
}
END_TEST

/* Configurations from text: the case-file parser's keys, rules and
 * messages, the canonical text back, and its parse the same struct. */
START_TEST(config_text)
{
    dl_moe_config_t c, c2;
    char canon[1024], canon2[1024];
    ck_assert_int_eq(dl_api_config_parse("base = mixtral-small-bf16\ntokens = 5 # a comment\n", &c,
                                         canon, sizeof canon, err, sizeof err), 0);
    dl_case_t ref;
    ck_assert_int_eq(dl_case_find("mixtral-small-bf16", &ref), 0);
    ref.config.tokens = 5;
    char want[1024], got[1024];
    ck_assert_int_eq(dl_golden_config_string(&ref.config, "\n", want, sizeof want), 0);
    ck_assert_int_eq(dl_golden_config_string(&c, "\n", got, sizeof got), 0);
    ck_assert_str_eq(got, want);
    ck_assert_str_eq(canon, want);
    ck_assert_msg(strstr(canon, "tokens = 5\n") && strstr(canon, "dtype = bf16"), "%s", canon);
    ck_assert_int_eq(dl_api_config_parse(canon, &c2, canon2, sizeof canon2, err, sizeof err), 0);
    ck_assert_str_eq(canon, canon2);
    ck_assert(c2.tokens == 5 && c2.route.top_k == 2 && c2.dtype == DL_BF16);
    ck_assert_int_eq(dl_api_config_parse(canon, NULL, NULL, 0, err, sizeof err), 0);
    /* refusals, each naming the line as a case file's would */
    ck_assert_int_eq(dl_api_config_parse("tokens = 4\nhidden = 4\nexperts = 4\ntop_k = 9\n", &c,
                                         NULL, 0, err, sizeof err), DL_EINVAL);
    ck_assert_msg(strstr(err, "config:4: invalid configuration: top_k"), "%s", err);
    ck_assert_int_eq(dl_api_config_parse("tokens = 4\ntopk = 2", &c, NULL, 0, err, sizeof err),
                     DL_EFORMAT);
    ck_assert_msg(!strcmp(err, "config:2: unknown key 'topk'"), "%s", err);
    ck_assert_int_eq(dl_api_config_parse("hidden = 4", &c, NULL, 0, err, sizeof err), DL_EFORMAT);
    ck_assert_msg(strstr(err, "config: missing key 'tokens'"), "%s", err);
    ck_assert_int_eq(dl_api_config_parse(NULL, &c, NULL, 0, err, sizeof err), DL_EINVAL);
    ck_assert_int_eq(dl_api_config_parse(canon, &c, canon2, 8, err, sizeof err), DL_EOVERFLOW);
    char *big = malloc(8192);
    memset(big, '#', 8191);
    big[8191] = '\0';
    ck_assert_int_eq(dl_api_config_parse(big, &c, NULL, 0, err, sizeof err), DL_EOVERFLOW);
    free(big);
}
END_TEST

/* Untrusted files through the bindings' loaders: a file that crashes HDF5
 * and one that hangs it are parsed in a child first, so each is DL_EFORMAT
 * naming the file, and this process lives on (the hang within its limit). */
START_TEST(untrusted)
{
    const char *top = getenv("top_srcdir");
    const char *files[] = {"crash-segv-H5HG_read-4d98accd.h5", "hang-golden-H5HG_protect-93777a74.h5"};
    dl_api_golden_t *g = gen("tiny"), *bad = NULL;
    for (int i = 0; i < 2; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/tests/fuzz/corpus/%s", top ? top : ".", files[i]);
        ck_assert_int_eq(dl_api_golden_open(p, 2, &bad, err, sizeof err), DL_EFORMAT);
        ck_assert_ptr_null(bad);
        ck_assert_ptr_nonnull(strstr(err, p));
        dl_api_candidate_t *c = NULL;
        int rc = dl_api_candidate_open(g, p, 2, &c, err, sizeof err);
        ck_assert_int_lt(rc, 0);
        ck_assert_ptr_null(c);
        ck_assert_ptr_nonnull(strstr(err, p));
    }
    dl_api_golden_free(g);
}
END_TEST

/* generate refuses a case that does not fit before allocating: under an
 * 8 GiB address-space limit (this test's own process) deepseek-v3-layer's
 * ~90 GiB is DL_ENOMEM with both figures named. */
START_TEST(memory_first)
{
#ifdef __SANITIZE_ADDRESS__
    /* AddressSanitizer reserves terabytes of address space for its shadow
     * memory: under an address-space limit its own mmap fails and the
     * process ends ("Failed to mmap"). The uninstrumented build runs this. */
    return;
#endif
    int64_t need = 0, avail = 0;
    ck_assert_int_eq(dl_api_golden_memory("deepseek-v3-layer", 0, &need, &avail, err, sizeof err), 0);
    ck_assert_int_gt(need, (int64_t)80 << 30);
    struct rlimit rl = {(rlim_t)8 << 30, (rlim_t)8 << 30};
    ck_assert_int_eq(setrlimit(RLIMIT_AS, &rl), 0);
    ck_assert_int_eq(dl_api_golden_memory("tiny", 0, &need, &avail, err, sizeof err), 0);
    ck_assert(avail > 0 && avail <= (int64_t)8 << 30);
    dl_api_golden_t *g = NULL;
    ck_assert_int_eq(dl_api_golden_generate_ex("deepseek-v3-layer", 0, 0, 0, 0, NULL, NULL, &g, err,
                                               sizeof err), DL_ENOMEM);
    ck_assert_ptr_null(g);
    ck_assert_ptr_nonnull(strstr(err, "deepseek-v3-layer"));
    ck_assert_ptr_nonnull(strstr(err, "MiB available"));
    /* what fits is generated */
    ck_assert_int_eq(dl_api_golden_generate_ex("tiny", 1, 9, 0, 0, NULL, NULL, &g, err, sizeof err), 0);
    dl_api_golden_free(g);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("api", "tables", tables, 0),
        DL_TEST("api", "golden", golden_handles, 0),
        DL_TEST_LOOP("api", "verdicts", both_directions, 0, 3, 120),
        DL_TEST("api", "refusals", refusals, 0),
        DL_TEST("api", "storage", storage, 0),
        DL_TEST("api", "files", files, 120),
        DL_TEST("api", "config", config_text, 0),
        DL_TEST("api", "untrusted", untrusted, 60),
        DL_TEST("api", "memory", memory_first, 0),
    };
    return dl_test_main(tests, (int)(sizeof tests / sizeof tests[0]));
}
