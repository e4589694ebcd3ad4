/* Capacity-factor analysis (src/capacity): the rule against integer
 * arithmetic, each drop policy against its definition on random routings
 * and by hand, the costs by hand, the 30% threshold against a scan, and the
 * case router against the committed golden files' topk_ids. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dropless.h"
#include "tap.h"

/* ------------------------------------------------------------- the rule */

/* cf = p / 64 is exactly the decimal it prints as, so ceil(cf N / E) is
 * ceil(p N / (64 E)) in integers. */
START_TEST(rule_dyadic_exact)
{
    dl_test_rng_t r = {1};
    for (int it = 0; it < 20000; it++) {
        int64_t p = 1 + (int64_t)(dl_test_next(&r) % 400), T = (int64_t)(dl_test_next(&r) % 3000);
        int64_t k = 1 + (int64_t)(dl_test_next(&r) % 8), E = 1 + (int64_t)(dl_test_next(&r) % 300);
        int64_t C, num = p * T * k, den = 64 * E;
        ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, (double)p / 64, T, k, E, &C), 0);
        ck_assert_int_eq(C, num / den + (num % den != 0));
        ck_assert_int_eq(dl_capacity(DL_CAPACITY_MEGATRON, (double)p / 64, T, k, E, &C), 0);
        ck_assert_int_eq(C, (int64_t)ceil((double)(T * k) / (double)E * ((double)p / 64)));
    }
}
END_TEST

/* Decimal capacity factors are taken as written: 1.1 * 50 is 55 exactly
 * (the binary64 1.1 is a little above 11/10); Megatron's binary64
 * evaluation rounds 50 * 1.1 up to 55.000000000000007 and takes 56. */
START_TEST(rule_decimal)
{
    struct {
        double cf;
        int64_t N, E, gshard, megatron;
    } v[] = {{1.1, 50, 1, 55, 56}, {1.1, 10, 1, 11, 11}, {1.3, 70, 13, 7, 8},
             {0.9, 50, 3, 15, 16}, {1.05, 20, 3, 7, 8},  {1.25, 4096 * 2, 8, 1280, 1280},
             {1.0, 1, 3, 1, 1},    {0.1, 30, 1, 3, 3},   {1e-30, 5, 7, 1, 1}};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        int64_t C;
        ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, v[i].cf, v[i].N, 1, v[i].E, &C), 0);
        ck_assert_int_eq(C, v[i].gshard);
        ck_assert_int_eq(dl_capacity(DL_CAPACITY_MEGATRON, v[i].cf, v[i].N, 1, v[i].E, &C), 0);
        ck_assert_int_eq(C, v[i].megatron);
    }
}
END_TEST

START_TEST(rule_errors)
{
    int64_t C = 7;
    const double bad[] = {0.0, -1.0, NAN, INFINITY, DL_CAPACITY_CF_MAX * 2};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, bad[i], 4, 2, 2, &C), DL_EINVAL);
    ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, 1, -1, 2, 2, &C), DL_EINVAL);
    ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, 1, 4, 0, 2, &C), DL_EINVAL);
    ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, 1, 4, 2, 0, &C), DL_EINVAL);
    ck_assert_int_eq(dl_capacity((dl_capacity_rule_t)9, 1, 4, 2, 2, &C), DL_EINVAL);
    ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, 1, 4, 2, 2, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, 1, INT32_MAX, 2, 2, &C), DL_EOVERFLOW);
    ck_assert_int_eq(C, 7);
    ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, 1, 0, 2, 2, &C), 0);
    ck_assert_int_eq(C, 0);
    ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, DL_CAPACITY_CF_MAX, INT32_MAX / 8, 8, 1, &C), 0);
    ck_assert_int_eq(C, (int64_t)65536 * (INT32_MAX / 8 * 8));
}
END_TEST

START_TEST(names)
{
    for (int i = 0; i < 2; i++) {
        dl_capacity_rule_t r;
        ck_assert_int_eq(dl_capacity_rule_parse(dl_capacity_rule_name((dl_capacity_rule_t)i), &r), 0);
        ck_assert_int_eq(r, i);
    }
    for (int i = 0; i < 3; i++) {
        dl_drop_policy_t p;
        ck_assert_int_eq(dl_drop_policy_parse(dl_drop_policy_name((dl_drop_policy_t)i), &p), 0);
        ck_assert_int_eq(p, i);
    }
    dl_drop_policy_t p;
    ck_assert_int_eq(dl_drop_policy_parse("lowest", &p), DL_EINVAL);
    ck_assert_ptr_null(dl_drop_policy_name((dl_drop_policy_t)3));
    ck_assert_ptr_null(dl_capacity_rule_name((dl_capacity_rule_t)2));
}
END_TEST

/* ------------------------------------------------------------- dropping */

/* T = 5, k = 2, E = 3, C = 2. Expert 0 is chosen by tokens 0, 1, 2, 4 (as
 * slots 0, 1, 0, 1), expert 1 by 0, 3, 4 (slots 1, 0, 0), expert 2 by
 * 1, 2, 3 (slots 0, 1, 1).
 *   position: expert 0 keeps tokens 0, 1; expert 1 keeps 0, 3; expert 2 1, 2.
 *   slot: expert 0's slot-0 choices (tokens 0, 2) first; expert 1: 3, 4;
 *         expert 2: token 1 (slot 0), then token 2 (slot 1, before 3).
 *   probs: expert 0 keeps its two best (0.9 at t2, 0.85 at t4); expert 1
 *          its best (0.95 at t3), then of the tie 0.5 at t0 and t4 the
 *          earlier, t0; expert 2: 0.7 (t3) and 0.6 (t1). */
START_TEST(keep_by_hand)
{
    const int32_t ids[10] = {0, 1, 2, 0, 0, 2, 1, 2, 1, 0};
    const float prob[10] = {0.8f, 0.5f, 0.6f, 0.1f, 0.9f, 0.2f, 0.95f, 0.7f, 0.5f, 0.85f};
    const uint8_t want[3][10] = {
        {1, 1, 1, 1, 0, 1, 1, 0, 0, 0}, /* position */
        {0, 1, 1, 0, 1, 0, 1, 1, 0, 1}, /* probs */
        {1, 0, 1, 0, 1, 1, 1, 0, 1, 0}, /* slot */
    };
    for (int p = 0; p < 3; p++) {
        uint8_t keep[10];
        ck_assert_int_eq(dl_capacity_keep(ids, prob, 5, 2, 3, 2, (dl_drop_policy_t)p, keep), 0);
        ck_assert_mem_eq(keep, want[p], 10);
    }
    uint8_t keep[10];
    ck_assert_int_eq(dl_capacity_keep(ids, NULL, 5, 2, 3, 2, DL_DROP_PROBS, keep), DL_EINVAL);
    ck_assert_int_eq(dl_capacity_keep(ids, NULL, 5, 2, 3, -1, DL_DROP_SLOT, keep), DL_EINVAL);
    ck_assert_int_eq(dl_capacity_keep(ids, NULL, 5, 2, 3, 2, (dl_drop_policy_t)3, keep), DL_EINVAL);
    ck_assert_int_eq(dl_capacity_keep(ids, NULL, 5, 2, 2, 2, DL_DROP_POSITION, keep), DL_ERANGE);
    float nan_prob[10];
    memcpy(nan_prob, prob, sizeof prob);
    nan_prob[3] = NAN;
    ck_assert_int_eq(dl_capacity_keep(ids, nan_prob, 5, 2, 3, 2, DL_DROP_PROBS, keep), DL_ENONFINITE);
}
END_TEST

/* Random routing: T tokens, k distinct experts of E each. */
static void random_routing(dl_test_rng_t *r, int64_t T, int64_t k, int64_t E, int32_t *ids, float *prob)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t e;
            int dup;
            do { /* skewed: low experts more popular */
                double u = dl_test_unif(r);
                e = (int32_t)((double)E * u * u);
                dup = 0;
                for (int64_t i = 0; i < j; i++)
                    dup |= ids[t * k + i] == e;
            } while (dup);
            ids[t * k + j] = e;
            prob[t * k + j] = (float)(dl_test_next(r) % 16) / 16.0f; /* many ties */
        }
}

/* Whatever the policy, expert e keeps min(n_e, C); which ones follows the
 * policy's definition. */
START_TEST(keep_properties)
{
    dl_test_rng_t r = {7};
    for (int it = 0; it < 300; it++) {
        int64_t E = 1 + (int64_t)(dl_test_next(&r) % 12), k = 1 + (int64_t)(dl_test_next(&r) % (E < 4 ? E : 4));
        int64_t T = (int64_t)(dl_test_next(&r) % 60), C = (int64_t)(dl_test_next(&r) % 20);
        int32_t *ids = malloc((size_t)(T * k + 1) * 4);
        float *prob = malloc((size_t)(T * k + 1) * 4);
        uint8_t *keep = malloc((size_t)(T * k + 1));
        random_routing(&r, T, k, E, ids, prob);
        for (int p = 0; p < 3; p++) {
            ck_assert_int_eq(dl_capacity_keep(ids, prob, T, k, E, C, (dl_drop_policy_t)p, keep), 0);
            for (int32_t e = 0; e < E; e++) {
                int64_t n = 0, kept = 0;
                for (int64_t f = 0; f < T * k; f++)
                    if (ids[f] == e) {
                        /* a dropped assignment needs C kept ones of e ahead of it */
                        int64_t ahead = 0;
                        for (int64_t g = 0; g < T * k; g++) {
                            if (ids[g] != e || g == f || !keep[g])
                                continue;
                            int before = p == DL_DROP_POSITION ? g < f
                                         : p == DL_DROP_SLOT ? (g % k < f % k || (g % k == f % k && g < f))
                                                             : (prob[g] > prob[f] || (prob[g] == prob[f] && g < f));
                            ahead += before;
                        }
                        if (!keep[f])
                            ck_assert_int_eq(ahead, C);
                        else
                            ck_assert_int_lt(ahead, C);
                        n++, kept += keep[f];
                    }
                ck_assert_int_eq(kept, n < C ? n : C);
            }
        }
        free(ids), free(prob), free(keep);
    }
}
END_TEST

/* --------------------------------------------------------------- costs */

static dl_moe_config_t shape(int64_t T, int64_t d, int64_t f, int64_t E, int64_t k, dl_dtype_t t)
{
    dl_moe_config_t c = {.tokens = T, .hidden = d, .ffn = f, .ffn_kind = DL_FFN_SWIGLU, .dtype = t};
    c.route = (dl_route_config_t){.experts = E, .top_k = k, .score_fn = DL_SCORE_SOFTMAX,
                                  .n_group = 1, .topk_group = 1, .renormalize = 1, .scaling = 1.0};
    return c;
}

/* The hand example above with d = 4, f = 3 (bf16): per row 6*4*3 = 72
 * FLOPs forward, 144 backward, (2*4 + 3*3) * 2 = 34 bytes. */
START_TEST(analyze_by_hand)
{
    const int32_t ids[10] = {0, 1, 2, 0, 0, 2, 1, 2, 1, 0};
    const float prob[10] = {0.8f, 0.5f, 0.6f, 0.1f, 0.9f, 0.2f, 0.95f, 0.7f, 0.5f, 0.85f};
    dl_moe_config_t c = shape(5, 4, 3, 3, 2, DL_BF16);
    dl_capacity_row_t row;
    /* cf 0.6: C = ceil(0.6 * 10 / 3) = 2, so expert 0 (4 assignments) drops
     * 2 and expert 1 and 2 (3 each) drop 1: 4 dropped, 6 kept, 0 padded */
    ck_assert_int_eq(dl_capacity_analyze(&c, ids, prob, DL_CAPACITY_GSHARD, 0.6, DL_DROP_POSITION, &row), 0);
    ck_assert_int_eq(row.capacity, 2);
    ck_assert_int_eq(row.dropped, 4);
    ck_assert_int_eq(row.assignments, 10);
    ck_assert_double_eq_tol(row.dropped_pct, 40.0, 1e-12);
    ck_assert_int_eq(row.tokens_all_dropped, 1); /* token 4: (4, 0) and (4, 1) */
    const int32_t at[4] = {4, 7, 8, 9};
    ck_assert_mem_eq(row.dropped_at, at, sizeof at);
    ck_assert_double_eq_tol(row.dropped_mass_pct, 100.0 * (0.9 + 0.7 + 0.5 + 0.85) / 6.1, 1e-4);
    ck_assert_int_eq(row.cost.rows, 6);
    ck_assert_int_eq(row.cost.padded_rows, 0);
    dl_capacity_row_free(&row);
    /* cf 2: C = 7, nothing drops, 21 rows of which 11 padding */
    ck_assert_int_eq(dl_capacity_analyze(&c, ids, prob, DL_CAPACITY_GSHARD, 2.0, DL_DROP_PROBS, &row), 0);
    ck_assert_int_eq(row.capacity, 7);
    ck_assert_int_eq(row.dropped, 0);
    ck_assert_ptr_null(row.dropped_at);
    ck_assert_int_eq(row.cost.rows, 21);
    ck_assert_int_eq(row.cost.padded_rows, 11);
    ck_assert_int_eq(row.cost.flops_fwd, 21 * 72);
    ck_assert_int_eq(row.cost.flops_bwd, 21 * 144);
    ck_assert_int_eq(row.cost.waste_flops_fwd, 11 * 72);
    ck_assert_int_eq(row.cost.waste_flops_bwd, 11 * 144);
    ck_assert_int_eq(row.cost.extra_bytes, 11 * 34);
    ck_assert_double_eq_tol(row.cost.waste, 11.0 / 21.0, 1e-15);
    dl_capacity_row_free(&row);
    /* probs: expert 0 drops t0 (0.8) and t1 (0.1), expert 1 t4's slot 0,
     * expert 2 t2's slot 1: every token keeps a slot */
    ck_assert_int_eq(dl_capacity_analyze(&c, ids, prob, DL_CAPACITY_GSHARD, 0.6, DL_DROP_PROBS, &row), 0);
    ck_assert_int_eq(row.dropped, 4);
    ck_assert_int_eq(row.tokens_all_dropped, 0);
    dl_capacity_row_free(&row);
    ck_assert_int_eq(dl_capacity_analyze(&c, ids, prob, DL_CAPACITY_GSHARD, NAN, DL_DROP_PROBS, &row), DL_EINVAL);
    dl_capacity_row_free(&row);
}
END_TEST

/* T = 0: nothing to drop, C = 0, no rows. E = 1: the one expert takes
 * C = ceil(cf T k) and drops the rest, in order. */
START_TEST(analyze_edges)
{
    dl_moe_config_t c = shape(0, 8, 8, 4, 2, DL_F32);
    dl_capacity_row_t row;
    int32_t none[1] = {0};
    ck_assert_int_eq(dl_capacity_analyze(&c, none, NULL, DL_CAPACITY_GSHARD, 1.25, DL_DROP_POSITION, &row), 0);
    ck_assert_int_eq(row.capacity, 0);
    ck_assert_int_eq(row.dropped, 0);
    ck_assert_int_eq(row.cost.rows, 0);
    ck_assert_double_eq(row.cost.waste, 0.0);
    ck_assert_double_eq(row.dropped_pct, 0.0);
    dl_capacity_row_free(&row);

    c = shape(10, 8, 8, 1, 1, DL_F32);
    int32_t ids[10] = {0};
    ck_assert_int_eq(dl_capacity_analyze(&c, ids, NULL, DL_CAPACITY_GSHARD, 0.75, DL_DROP_SLOT, &row), 0);
    ck_assert_int_eq(row.capacity, 8); /* ceil(7.5) */
    ck_assert_int_eq(row.dropped, 2);
    ck_assert_int_eq(row.tokens_all_dropped, 2);
    ck_assert_int_eq(row.dropped_at[0], 8);
    ck_assert_int_eq(row.dropped_at[1], 9);
    ck_assert_int_eq(row.cost.padded_rows, 0);
    dl_capacity_row_free(&row);
    ck_assert_int_eq(dl_capacity_analyze(&c, ids, NULL, DL_CAPACITY_GSHARD, 1.05, DL_DROP_SLOT, &row), 0);
    ck_assert_int_eq(row.capacity, 11); /* ceil(10.5) */
    ck_assert_int_eq(row.dropped, 0);
    ck_assert_int_eq(row.cost.padded_rows, 1);
    dl_capacity_row_free(&row);
}
END_TEST

START_TEST(dropless_tiles)
{
    dl_moe_config_t c = shape(65, 2, 5, 4, 2, DL_F32);
    const int64_t sizes[4] = {0, 1, 64, 65};
    dl_capacity_cost_t cost;
    ck_assert_int_eq(dl_capacity_dropless(&c, sizes, 1, &cost), 0);
    ck_assert_int_eq(cost.rows, 130);
    ck_assert_int_eq(cost.padded_rows, 0);
    ck_assert_int_eq(dl_capacity_dropless(&c, sizes, 64, &cost), 0);
    ck_assert_int_eq(cost.rows, 0 + 64 + 64 + 128);
    ck_assert_int_eq(cost.padded_rows, 256 - 130);
    ck_assert_int_eq(cost.extra_bytes, 126 * (2 * 2 + 3 * 5) * 4);
    ck_assert_int_eq(dl_capacity_dropless(&c, sizes, 128, &cost), 0);
    ck_assert_int_eq(cost.rows, 3 * 128);
    c.ffn_kind = DL_FFN_PLAIN;
    c.ffn = c.hidden;
    ck_assert_int_eq(dl_capacity_dropless(&c, sizes, 128, &cost), 0);
    ck_assert_int_eq(cost.flops_fwd, 384 * 2 * 2 * 2);
    ck_assert_int_eq(cost.extra_bytes, (384 - 130) * 2 * 2 * 4);
    ck_assert_int_eq(dl_capacity_dropless(&c, sizes, 0, &cost), DL_EINVAL);
    const int64_t neg[4] = {0, -1, 64, 65};
    ck_assert_int_eq(dl_capacity_dropless(&c, neg, 64, &cost), DL_EINVAL);
}
END_TEST

/* The threshold is the first C of a scan whose padding reaches frac. */
START_TEST(threshold_scan)
{
    dl_test_rng_t r = {11};
    for (int it = 0; it < 300; it++) {
        int64_t E = 1 + (int64_t)(dl_test_next(&r) % 20), sizes[20], N = 0;
        for (int64_t e = 0; e < E; e++)
            N += sizes[e] = (int64_t)(dl_test_next(&r) % 50);
        dl_moe_config_t c = shape(N, 4, 4, E, 1, DL_F32);
        double frac = 0.05 + 0.9 * dl_test_unif(&r), cf;
        int64_t C;
        ck_assert_int_eq(dl_capacity_waste_threshold(&c, sizes, frac, &C, &cf), 0);
        if (N == 0) {
            ck_assert_int_eq(C, 0);
            continue;
        }
        int64_t want = 0;
        for (int64_t cc = 1; !want; cc++) {
            int64_t kept = 0;
            for (int64_t e = 0; e < E; e++)
                kept += sizes[e] < cc ? sizes[e] : cc;
            if ((double)(E * cc - kept) >= frac * (double)(E * cc))
                want = cc;
        }
        ck_assert_int_eq(C, want);
        ck_assert_double_eq_tol(cf, (double)(C - 1) * (double)E / (double)N, 1e-12);
        /* just above cf_above the rule gives C, at cf_above one less */
        int64_t got;
        if (C > 1) {
            ck_assert_int_eq(dl_capacity(DL_CAPACITY_GSHARD, cf * (1 + 1e-9), N, 1, E, &got), 0);
            ck_assert_int_eq(got, C);
        }
    }
    dl_moe_config_t c = shape(4, 4, 4, 2, 1, DL_F32);
    int64_t sizes[2] = {2, 2}, C;
    double cf;
    ck_assert_int_eq(dl_capacity_waste_threshold(&c, sizes, 1.0, &C, &cf), DL_EINVAL);
    ck_assert_int_eq(dl_capacity_waste_threshold(&c, sizes, 0.0, &C, &cf), DL_EINVAL);
}
END_TEST

/* ------------------------------------------------------------ routings */

/* The case router gives every committed golden file's topk_ids, group
 * sizes and the scores of the selected experts. */
START_TEST(route_case_is_golden)
{
    const char *cases[] = {"tiny", "mixtral-small-bf16", "deepseek-v3-small", "zipf-fp16", "ties",
                           "ties-grouped-fp16", "empty-experts", "one-hot", "plain-ffn-bf16",
                           "no-tokens", "grouped-max", "odd-shapes"};
    const char *src = getenv("top_srcdir");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[4096], err[512];
        snprintf(path, sizeof path, "%s/vectors/%s.h5", src ? src : ".", cases[i]);
        dl_golden_file_t g;
        dl_case_t c;
        dl_capacity_routing_t a, b;
        ck_assert_msg(dl_golden_load(path, &g, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(dl_case_find(cases[i], &c), 0);
        ck_assert_int_eq(dl_capacity_route_case(&c, &a), 0);
        ck_assert_int_eq(dl_capacity_route_golden(&g, &b), 0);
        const int64_t M = c.config.tokens * c.config.route.top_k, E = c.config.route.experts;
        ck_assert_int_eq(a.tokens, c.config.tokens);
        ck_assert_mem_eq(a.ids, g.fwd.topk_ids, (size_t)M * 4);
        ck_assert_mem_eq(a.ids, b.ids, (size_t)M * 4);
        ck_assert_mem_eq(a.prob, b.prob, (size_t)M * 4);
        ck_assert_mem_eq(a.group_sizes, g.fwd.group_sizes, (size_t)E * 8);
        dl_capacity_routing_free(&a);
        dl_capacity_routing_free(&b);
        dl_golden_free(&g);
    }
}
END_TEST

/* Uniform and Zipf routings are the generator's: zipf_s = 0 spreads the
 * load, a large s concentrates it on the low experts. */
START_TEST(route_zipf)
{
    dl_case_t c;
    ck_assert_int_eq(dl_case_find("mixtral-layer", &c), 0);
    c.config.tokens = 2048;
    c.config.hidden = 64; /* the routing statistics need no 4096 columns */
    c.inputs = DL_INPUTS_ZIPF;
    int64_t lo[2];
    for (int z = 0; z < 2; z++) {
        c.zipf_s = z ? 2.0 : 0.0;
        dl_capacity_routing_t r;
        ck_assert_int_eq(dl_capacity_route_case(&c, &r), 0);
        int64_t N = 0, mx = 0;
        for (int e = 0; e < 8; e++)
            N += r.group_sizes[e], mx = r.group_sizes[e] > mx ? r.group_sizes[e] : mx;
        ck_assert_int_eq(N, 4096);
        lo[z] = r.group_sizes[0];
        if (!z)
            ck_assert_int_lt(mx, 4096 / 8 * 3 / 2); /* within 1.5x of the mean */
        dl_capacity_routing_free(&r);
    }
    ck_assert_int_gt(lo[1], 2 * lo[0]);
    dl_capacity_routing_t r;
    ck_assert_int_eq(dl_capacity_route_case(NULL, &r), DL_EINVAL);
    ck_assert_int_eq(dl_capacity_route_golden(NULL, &r), DL_EINVAL);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("rule", "rule_dyadic_exact", rule_dyadic_exact, 120),
        DL_TEST("rule", "rule_decimal", rule_decimal, 120),
        DL_TEST("rule", "rule_errors", rule_errors, 120),
        DL_TEST("rule", "names", names, 120),
        DL_TEST("drop", "keep_by_hand", keep_by_hand, 120),
        DL_TEST("drop", "keep_properties", keep_properties, 120),
        DL_TEST("cost", "analyze_by_hand", analyze_by_hand, 120),
        DL_TEST("cost", "analyze_edges", analyze_edges, 120),
        DL_TEST("cost", "dropless_tiles", dropless_tiles, 120),
        DL_TEST("cost", "threshold_scan", threshold_scan, 120),
        DL_TEST("routing", "route_case_is_golden", route_case_is_golden, 120),
        DL_TEST("routing", "route_zipf", route_zipf, 120),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
