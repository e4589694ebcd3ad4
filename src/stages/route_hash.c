/* Hash routing (DeepSeek-V4's first layers, route.hash_vocab > 0): each
 * token's experts are a row of a token-id -> experts table stored in the
 * inputs, not a top-k of the scores; the weights are still the scores'
 * (dl_route_weights on that selection), so the scores keep their gradient
 * through the weights while the choice itself gets none. Tokens are
 * independent: OpenMP goes over them. */
#include "config.h"
#include <math.h>
#include "stages/stages_priv.h"

int dl_route_hash(const dl_route_config_t *c, const float *scores, const int32_t *table,
                  const int32_t *token_ids, int64_t T, int32_t *ids, float *weights,
                  float *margin)
{
    int rc = dl_route_config_validate(c);
    if (rc || c->hash_vocab < 1 || T < 0)
        return rc ? rc : DL_EINVAL;
    const int64_t V = c->hash_vocab, k = c->top_k, E = c->experts;
    if (T == 0)
        return 0;
    if (!scores || !table || !token_ids || !ids || !weights)
        return DL_EINVAL;
    if ((rc = dl__route_rows_ok(table, V, k, E)))
        return rc;
    for (int64_t t = 0; t < T; t++)
        if (token_ids[t] < 0 || token_ids[t] >= V)
            return DL_ERANGE;
    int err = 0;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < k; j++)
            ids[t * k + j] = table[(int64_t)token_ids[t] * k + j];
        if (margin)
            margin[t] = INFINITY; /* nothing competes with a table */
        int e = dl_route_weights(c, scores + t * E, ids + t * k, weights + t * k);
        if (e) {
#pragma omp critical(dl__route_hash_err)
            err = err ? err : e;
        }
    }
    return err;
}
