/* The expert-parallel layout stage dl_ep_layout and its views: a worked
 * example by hand, the invariants on random routings (every (t, j) placed
 * once on its expert's rank, counts and prefixes consistent, the view the
 * whole layout's slices), weights copied bit for bit (-0, NaN payloads,
 * subnormals), and the refusals. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "dropless.h"

START_TEST(worked_example)
{
    /* T = 4, k = 2, E = 4, R = 2: the routing of the catalogue's tiny */
    const int32_t ids[8] = {1, 0, 2, 1, 1, 0, 1, 2};
    const float w[8] = {0.5f, 0.25f, 1, 2, 3, 4, 5, 6};
    dl_ep_layout_t L;
    ck_assert_int_eq(dl_ep_layout(ids, w, 4, 2, 4, 2, &L), 0);
    const int64_t ntr[2] = {4, 2}, sc[4] = {2, 1, 2, 1}, sd[4] = {0, 2, 0, 2},
                  rd[4] = {0, 2, 0, 1}, off[3] = {0, 4, 6};
    const uint8_t in[8] = {1, 0, 1, 1, 1, 0, 1, 1};
    const int32_t tok[6] = {0, 1, 2, 3, 1, 3}, idx[12] = {1, 0, -1, 1, 1, 0, 1, -1, 0, -1, -1, 0};
    ck_assert(!memcmp(L.num_tokens_per_rank, ntr, sizeof ntr));
    ck_assert(!memcmp(L.send_counts, sc, sizeof sc));
    ck_assert(!memcmp(L.send_displs, sd, sizeof sd));
    ck_assert(!memcmp(L.recv_displs, rd, sizeof rd));
    ck_assert(!memcmp(L.recv_offsets, off, sizeof off));
    ck_assert(!memcmp(L.is_token_in_rank, in, sizeof in));
    ck_assert_int_eq(L.n_recv, 6);
    ck_assert(!memcmp(L.recv_token, tok, sizeof tok));
    ck_assert(!memcmp(L.recv_topk_idx, idx, sizeof idx));
    ck_assert(L.recv_topk_weights[2] == 0 && L.recv_topk_weights[3] == 2 && L.recv_topk_weights[8] == 1 &&
              L.recv_topk_weights[11] == 6 && L.recv_topk_weights[10] == 0);
    ck_assert_ptr_null(L.recv_counts);
    dl_ep_layout_free(&L);
}
END_TEST

/* Every invariant the spec states, on one random routing. */
static void invariants(const int32_t *ids, const float *w, int64_t T, int64_t k, int64_t E, int64_t R)
{
    dl_ep_layout_t L, V;
    ck_assert_int_eq(dl_ep_layout(ids, w, T, k, E, R, &L), 0);
    const int64_t per = E / R;
    int64_t *seen = calloc((size_t)(T * k) + 1, sizeof *seen);
    for (int64_t r = 0; r < R; r++) {
        int64_t prev = -1;
        for (int64_t i = L.recv_offsets[r]; i < L.recv_offsets[r + 1]; i++) {
            int64_t t = L.recv_token[i];
            ck_assert(t > prev); /* canonical: ascending, one copy per rank */
            prev = t;
            ck_assert(L.is_token_in_rank[t * R + r]);
            for (int64_t j = 0; j < k; j++) {
                int32_t x = L.recv_topk_idx[i * k + j];
                ck_assert_int_eq(x, ids[t * k + j] / per == r ? ids[t * k + j] - r * per : -1);
                if (x >= 0)
                    seen[t * k + j]++;
            }
        }
    }
    for (int64_t q = 0; q < T * k; q++)
        ck_assert_int_eq(seen[q], 1);
    int64_t tot = 0;
    for (int64_t s = 0; s < R; s++)
        for (int64_t r = 0; r < R; r++)
            tot += L.send_counts[s * R + r];
    ck_assert_int_eq(tot, L.n_recv);
    for (int64_t r = 0; r < R; r++) {
        ck_assert_int_eq(dl_ep_layout_view(&L, r, &V), 0);
        int64_t b, e, n = 0;
        dl_ep_source_range(T, R, r, &b, &e);
        ck_assert_int_eq(V.n_tokens, e - b);
        for (int64_t s = 0; s < R; s++)
            n += V.recv_counts[s];
        ck_assert_int_eq(n, V.n_recv);
        ck_assert(!memcmp(V.recv_token, L.recv_token + L.recv_offsets[r], (size_t)V.n_recv * 4));
        ck_assert(!memcmp(V.is_token_in_rank, L.is_token_in_rank + b * R, (size_t)((e - b) * R)));
        dl_ep_layout_free(&V);
    }
    free(seen);
    dl_ep_layout_free(&L);
}

START_TEST(random_invariants)
{
    uint64_t s = 12345;
    for (int it = 0; it < 200; it++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        int64_t E = 8 << (s >> 60 & 3), k = 1 + (int64_t)(s >> 50 & 7), T = (int64_t)(s >> 40 & 63);
        if (k > E)
            k = E;
        int64_t R = (int64_t)1 << (s >> 30 & 3);
        int32_t *ids = malloc((size_t)(T * k + 1) * 4);
        float *w = malloc((size_t)(T * k + 1) * 4);
        for (int64_t t = 0; t < T; t++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            int64_t base = (int64_t)(s >> 33) % E;
            for (int64_t j = 0; j < k; j++) { /* distinct experts per token */
                ids[t * k + j] = (int32_t)((base + j * (E / k)) % E);
                w[t * k + j] = (float)(s >> 40 & 0xffffff) / 16777216.0f;
            }
        }
        invariants(ids, w, T, k, E, R);
        free(ids);
        free(w);
    }
}
END_TEST

START_TEST(weights_bitwise)
{
    const int32_t ids[4] = {0, 1, 2, 3};
    float w[4];
    const uint32_t bits[4] = {0x80000000u, 0x7fc01234u, 0x00000001u, 0x3f800000u};
    memcpy(w, bits, sizeof w);
    dl_ep_layout_t L;
    ck_assert_int_eq(dl_ep_layout(ids, w, 1, 4, 4, 4, &L), 0);
    for (int r = 0; r < 4; r++) {
        uint32_t got;
        memcpy(&got, &L.recv_topk_weights[r * 4 + r], 4);
        ck_assert_uint_eq(got, bits[r]);
        for (int j = 0; j < 4; j++)
            if (j != r) {
                memcpy(&got, &L.recv_topk_weights[r * 4 + j], 4);
                ck_assert_uint_eq(got, 0); /* +0, not -0 */
            }
    }
    dl_ep_layout_free(&L);
}
END_TEST

START_TEST(refusals)
{
    const int32_t ids[2] = {0, 5};
    const float w[2] = {1, 1};
    dl_ep_layout_t L, V, W;
    ck_assert_int_eq(dl_ep_layout(ids, w, 1, 2, 6, 4, &L), DL_EINVAL); /* 4 does not divide 6 */
    ck_assert_int_eq(dl_ep_layout(ids, w, 1, 2, 6, 0, &L), DL_EINVAL);
    ck_assert_int_eq(dl_ep_layout(ids, NULL, 1, 2, 6, 2, &L), DL_EINVAL);
    ck_assert_int_eq(dl_ep_layout(ids, w, 1, 2, 4, 2, &L), DL_ERANGE); /* id 5 >= E */
    ck_assert_int_eq(dl_ep_layout(ids, w, 1, 2, 6, 3, &L), 0);
    ck_assert_int_eq(dl_ep_layout_view(&L, 3, &V), DL_EINVAL);
    ck_assert_int_eq(dl_ep_layout_view(&L, -1, &V), DL_EINVAL);
    ck_assert_int_eq(dl_ep_layout_view(&L, 2, &V), 0);
    ck_assert_int_eq(dl_ep_layout_view(&V, 0, &W), DL_EINVAL); /* a view has no view */
    dl_ep_layout_free(&V);
    dl_ep_layout_free(&L);
    ck_assert_int_eq(dl_ep_dataset_find("send_counts"), DL_EP_SEND_COUNTS);
    ck_assert_int_eq(dl_ep_dataset_find("nope"), -1);
    ck_assert_ptr_null(dl_ep_dataset_name(DL_EP_DATASET_COUNT));
}
END_TEST

int main(void)
{
    const dl_test_t tests[] = {
        DL_TEST("ep", "layout", worked_example, 0),
        DL_TEST("ep", "layout", random_invariants, 60),
        DL_TEST("ep", "layout", weights_bitwise, 0),
        DL_TEST("ep", "layout", refusals, 0),
    };
    return dl_test_main(tests, sizeof tests / sizeof *tests);
}
