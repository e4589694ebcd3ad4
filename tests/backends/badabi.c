/* badabi.c: a backend built against a different version of the ABI. The
 * runner reads its table in a child, sees the version and runs nothing.
 * Expected verdict: FAIL (abi-mismatch) for every stage.
 */
#include <dropless/backend.h>
#include "kernels.h"

static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION + 1,
    .name = "bad-abi",
    .version = "1.0",
    .compute_mode = "fp32",
    .combine = ex_plain_combine,
};

const dl_backend_t *dropless_backend(void);
const dl_backend_t *dropless_backend(void)
{
    return &backend;
}
