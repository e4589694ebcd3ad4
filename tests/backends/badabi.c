/* badabi.c: a backend built against a different version of the ABI. The
 * runner reads its table in a child, sees the version and runs nothing.
 * Expected verdict: FAIL (abi-mismatch) for every stage.
 */
#include <dropless/backend.h>
#include "kernels.h"

static int combine(const dl_backend_config_t *c, const dl_backend_combine_args_t *a)
{
    return ex_combine(c, NULL, a);
}

static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION + 1,
    .name = "bad-abi",
    .version = "1.0",
    .compute_mode = "fp32",
    .combine = combine,
};

const dl_backend_t *dropless_backend(void);
const dl_backend_t *dropless_backend(void)
{
    return &backend;
}
