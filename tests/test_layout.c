/* The kernel layout stage dl_layout_compute / dl_layout_fill: one worked
 * example per layout by hand (sizes 3, 0, 5: an empty expert, a partial
 * block, a group of exactly one block), the expert-parallel variant, the
 * poisoned fill, the spec parser and the refusals. The catalogue against
 * an independent reference is tests/test_layouts.py. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "dropless.h"

/* T = 8, k = 1, E = 3: group sizes 3, 0, 5; sort_perm reverses the tokens */
static const int64_t sizes[3] = {3, 0, 5};
static const int32_t perm[8] = {7, 6, 5, 4, 3, 2, 1, 0};

START_TEST(masked_and_batched)
{
    for (int kind = DL_LAYOUT_MASKED; kind <= DL_LAYOUT_BATCHED; kind += 3) {
        dl_layout_t L;
        ck_assert_int_eq(dl_layout_compute(kind, 5, sizes, perm, 8, 1, 3, 0, 3, &L), 0);
        const int32_t *cnt = kind == DL_LAYOUT_MASKED ? L.masked_m : L.expert_num_tokens;
        ck_assert(cnt[0] == 3 && cnt[1] == 0 && cnt[2] == 5);
        const int32_t src[15] = {0, 1, 2, -1, -1, -1, -1, -1, -1, -1, 3, 4, 5, 6, 7};
        ck_assert_int_eq(L.n_x, 15);
        ck_assert(!memcmp(L.x_src, src, sizeof src) && !memcmp(L.y_src, src, sizeof src));
        ck_assert_int_eq(L.expected_m, kind == DL_LAYOUT_MASKED ? 3 : 0); /* ceil(8/3) */
        dl_layout_free(&L);
    }
    dl_layout_t L;
    ck_assert_int_eq(dl_layout_compute(DL_LAYOUT_MASKED, 4, sizes, perm, 8, 1, 3, 0, 3, &L),
                     DL_ERANGE); /* 5 rows do not fit MAX_M = 4 */
    ck_assert_ptr_null(L.masked_m);
    ck_assert_int_eq(dl_layout_compute(DL_LAYOUT_MASKED, 4, sizes, perm, 8, 1, 3, 0, 2, &L), 0);
    ck_assert_int_eq(L.n_rows, 8); /* experts 0, 1 only: they fit */
    dl_layout_free(&L);
}
END_TEST

START_TEST(contiguous)
{
    dl_layout_t L;
    ck_assert_int_eq(dl_layout_compute(DL_LAYOUT_CONTIGUOUS, 4, sizes, perm, 8, 1, 3, 0, 3, &L), 0);
    const int64_t off[4] = {0, 4, 4, 12};
    const int32_t mi[12] = {0, 0, 0, -1, 2, 2, 2, 2, 2, -1, -1, -1};
    const int32_t src[12] = {0, 1, 2, -1, 3, 4, 5, 6, 7, -1, -1, -1};
    ck_assert(!memcmp(L.group_offsets, off, sizeof off) && !memcmp(L.m_indices, mi, sizeof mi));
    ck_assert(!memcmp(L.x_src, src, sizeof src));
    dl_layout_free(&L);
    /* the variant of experts [2, 3): local id 0 */
    ck_assert_int_eq(dl_layout_compute(DL_LAYOUT_CONTIGUOUS, 5, sizes, perm, 8, 1, 3, 2, 3, &L), 0);
    ck_assert(L.n_rows == 5 && L.m_indices[4] == 0 && L.x_src[0] == 3);
    dl_layout_free(&L);
}
END_TEST

START_TEST(vllm_block)
{
    dl_layout_t L;
    ck_assert_int_eq(dl_layout_compute(DL_LAYOUT_VLLM_BLOCK, 4, sizes, perm, 8, 1, 3, 0, 3, &L), 0);
    /* capacity numel + E (B - 1) = 8 + 9, blocks ceil(17 / 4) = 5 */
    ck_assert(L.n_rows == 17 && L.n_blocks == 5 && L.n_x == 9 && L.n_y == 9);
    const int32_t sti[17] = {7, 6, 5, 8, 4, 3, 2, 1, 0, 8, 8, 8, 8, 8, 8, 8, 8};
    const int32_t eid[5] = {0, 2, 2, -1, -1};
    ck_assert(!memcmp(L.sorted_token_ids, sti, sizeof sti) && !memcmp(L.expert_ids, eid, sizeof eid));
    ck_assert_int_eq(L.num_tokens_post_padded[0], 12);
    ck_assert(L.y_src[7] == 0 && L.y_src[0] == 7 && L.y_src[8] == DL_LAYOUT_PAD);
    ck_assert(L.x_src[3] == 3 && L.x_src[8] == DL_LAYOUT_PAD);
    dl_layout_free(&L);
    /* rank 1 of 3 owns expert 1 (empty): every block -1, every row another rank's */
    ck_assert_int_eq(dl_layout_compute(DL_LAYOUT_VLLM_BLOCK, 4, sizes, perm, 8, 1, 3, 1, 2, &L), 0);
    for (int b = 0; b < 5; b++)
        ck_assert_int_eq(L.expert_ids[b], -1);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(L.y_src[i], DL_LAYOUT_NONLOCAL);
    ck_assert_int_eq(L.num_tokens_post_padded[0], 12); /* every expert's blocks stay */
    dl_layout_free(&L);
}
END_TEST

START_TEST(fill_and_poison)
{
    dl_layout_t L;
    float x[9 * 2], xs[8 * 2], ys[8 * 2];
    for (int i = 0; i < 16; i++)
        x[i] = (float)i, xs[i] = (float)(100 + i), ys[i] = (float)(200 + i);
    ck_assert_int_eq(dl_layout_compute(DL_LAYOUT_CONTIGUOUS, 4, sizes, perm, 8, 1, 3, 0, 3, &L), 0);
    ck_assert_int_eq(dl_layout_fill(&L, x, xs, ys, 2, 1), 0);
    ck_assert(L.poisoned && L.x[0] == 100 && L.y[2 * 4 + 1] == 207 && isnan(L.x[3 * 2]));
    uint32_t bits;
    memcpy(&bits, &L.y[3 * 2 + 1], 4);
    ck_assert_uint_eq(bits, 0x7fc00000u);
    ck_assert_int_eq(dl_layout_fill(&L, x, xs, ys, 2, 0), 0);
    ck_assert(!L.poisoned && L.x[3 * 2] == 0 && !signbit(L.x[3 * 2]));
    dl_layout_free(&L);
    /* vllm-block: x by token, another rank's rows zero even when poisoned */
    ck_assert_int_eq(dl_layout_compute(DL_LAYOUT_VLLM_BLOCK, 4, sizes, perm, 8, 1, 3, 2, 3, &L), 0);
    ck_assert_int_eq(dl_layout_fill(&L, x, xs, ys, 2, 1), 0);
    ck_assert(L.x[5 * 2] == 10 && isnan(L.x[8 * 2]) && isnan(L.y[8 * 2]));
    ck_assert(L.y[7 * 2] == 0 && L.y[3 * 2] == 208); /* flat 7: expert 0; flat 3: sorted row 4 */
    dl_layout_free(&L);
}
END_TEST

START_TEST(parse_and_refusals)
{
    int k;
    int64_t p;
    ck_assert_int_eq(dl_layout_parse("vllm-block:16", &k, &p), 0);
    ck_assert(k == DL_LAYOUT_VLLM_BLOCK && p == 16);
    const char *bad[] = {"masked", "masked:", "masked:0", "masked:-1", "masked:4x", "wide:4",
                         "masked:99999999999", "vllm-bloc:4", ":4", "masked: 4"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(dl_layout_parse(bad[i], &k, &p) == DL_EINVAL, "%s", bad[i]);
    dl_layout_t L;
    const int64_t neg[3] = {3, -1, 6}, short_[3] = {3, 0, 4};
    const int32_t out_of_range[8] = {0, 1, 2, 3, 4, 5, 6, 8};
    ck_assert_int_eq(dl_layout_compute(0, 4, NULL, perm, 8, 1, 3, 0, 3, &L), DL_EINVAL);
    ck_assert_int_eq(dl_layout_compute(9, 4, sizes, perm, 8, 1, 3, 0, 3, &L), DL_EINVAL);
    ck_assert_int_eq(dl_layout_compute(0, 0, sizes, perm, 8, 1, 3, 0, 3, &L), DL_EINVAL);
    ck_assert_int_eq(dl_layout_compute(0, 4, sizes, perm, 8, 1, 3, 2, 2, &L), DL_EINVAL);
    ck_assert_int_eq(dl_layout_compute(0, 4, sizes, perm, 8, 1, 3, 0, 4, &L), DL_EINVAL);
    ck_assert_int_eq(dl_layout_compute(0, 8, neg, perm, 8, 1, 3, 0, 3, &L), DL_ERANGE);
    ck_assert_int_eq(dl_layout_compute(0, 8, short_, perm, 8, 1, 3, 0, 3, &L), DL_ERANGE);
    ck_assert_int_eq(dl_layout_compute(0, 8, sizes, out_of_range, 8, 1, 3, 0, 3, &L), DL_ERANGE);
    ck_assert_int_eq(dl_layout_fill(&L, NULL, NULL, NULL, 2, 0), DL_EINVAL); /* L freed: no src */
    ck_assert_ptr_null(dl_layout_kind_name(DL_LAYOUT_KIND_COUNT));
    ck_assert_int_eq(dl_layout_contract(DL_LAYOUT_CONTIGUOUS), DL_LAYOUT_ZERO);
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("layout", "stage", masked_and_batched, 0),
        DL_TEST("layout", "stage", contiguous, 0),
        DL_TEST("layout", "stage", vllm_block, 0),
        DL_TEST("layout", "stage", fill_and_poison, 0),
        DL_TEST("layout", "stage", parse_and_refusals, 0),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
