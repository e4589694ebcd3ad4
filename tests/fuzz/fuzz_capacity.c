/* libFuzzer harness for the capacity path (`dropless capacity GOLDEN.h5`):
 * the input bytes become a file loaded as a golden file (dl_golden_load,
 * what the command runs after its preflight child), and what loads goes
 * through the capacity analysis the command prints: the routing of the
 * file's topk_ids and router_scores, every policy under both rules at
 * capacity factors below, at and above 1, the dropless rows and the
 * 30% waste mark. Built only by `make fuzz`; doc/fuzzing.md. */
#include "config.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dropless.h>
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The contract of one row: counts within their bounds, the drops listed
 * ascending and within T*k. */
static void check_row(const dl_capacity_row_t *r, int64_t T, int64_t k)
{
    if (r->capacity < 0 || r->assignments != T * k || r->dropped < 0 ||
        r->dropped > r->assignments || r->tokens_all_dropped < 0 || r->tokens_all_dropped > T ||
        (r->dropped && !r->dropped_at) || r->cost.padded_rows < 0 || r->cost.rows < 0)
        abort();
    for (int64_t i = 0; i < r->dropped; i++)
        if (r->dropped_at[i] < 0 || r->dropped_at[i] >= T * k ||
            (i && r->dropped_at[i] <= r->dropped_at[i - 1]))
            abort();
}

static void analyse(const dl_golden_file_t *g)
{
    static const double cfs[] = {0.5, 1.0, 1.25, 4.0};
    static const dl_drop_policy_t pol[] = {DL_DROP_POSITION, DL_DROP_PROBS, DL_DROP_SLOT};
    static const dl_capacity_rule_t rules[] = {DL_CAPACITY_GSHARD, DL_CAPACITY_MEGATRON};
    static const int64_t blocks[] = {1, 64, 128};
    dl_capacity_routing_t r;
    if (dl_capacity_route_golden(g, &r) != 0)
        return; /* refused: the command says why, exit 2 */
    const int64_t T = r.tokens, k = r.top_k;
    for (size_t a = 0; a < 2; a++)
        for (size_t c = 0; c < sizeof cfs / sizeof cfs[0]; c++)
            for (size_t p = 0; p < 3; p++) {
                dl_capacity_row_t row;
                memset(&row, 0, sizeof row);
                if (dl_capacity_analyze(&g->config, r.ids, r.prob, rules[a], cfs[c], pol[p], &row) == 0)
                    check_row(&row, T, k);
                dl_capacity_row_free(&row);
            }
    for (size_t b = 0; b < 3; b++) {
        dl_capacity_cost_t cost;
        if (dl_capacity_dropless(&g->config, r.group_sizes, blocks[b], &cost) == 0 &&
            (cost.padded_rows < 0 || cost.rows < 0))
            abort();
    }
    int64_t C;
    double cf;
    (void)dl_capacity_waste_threshold(&g->config, r.group_sizes, 0.3, &C, &cf);
    dl_capacity_routing_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = dl_fuzz_file("capacity", ".h5", data, size);
    dl_golden_file_t g;
    char err[512];
    err[0] = '\0';
    int rc = dl_golden_load(path, &g, err, sizeof err);
    if (rc < 0) {
        if (!strstr(err, path) || strchr(err, '\n'))
            abort(); /* an error is one line naming the file */
    } else {
        if (g.has_forward)
            analyse(&g);
        dl_golden_free(&g);
    }
    unlink(path);
    return 0;
}
