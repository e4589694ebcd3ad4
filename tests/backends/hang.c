/* hang.c: a backend whose combine never returns (a deadlocked kernel).
 * The runner kills it at the time limit. Expected verdict: FAIL (timeout)
 * for combine; expert_forward is fine.
 */
#define _POSIX_C_SOURCE 200809L
#include <unistd.h>
#include <dropless/backend.h>
#include "kernels.h"

static int combine(const dl_backend_config_t *c, const dl_backend_combine_args_t *a)
{
    for (;;)
        pause();
    return 0;
}
static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION,
    .name = "hang",
    .version = "1.0",
    .compute_mode = "fp32",
    .expert_forward = ex_plain_expert_forward,
    .combine = combine,
};

const dl_backend_t *dropless_backend(void);
const dl_backend_t *dropless_backend(void)
{
    return &backend;
}
