/* nondet.c: a backend whose combine sums the k expert outputs of a token
 * in an order that changes from run to run, as a kernel whose reduction
 * order follows thread scheduling does. fp32 addition is not associative,
 * so with k >= 3 the bits differ between the runner's two calls.
 * Expected verdict: WARN (nondeterministic); the values themselves pass.
 */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <unistd.h>
#include <dropless/backend.h>
#include "kernels.h"

static int combine(const dl_backend_config_t *c, const dl_backend_combine_args_t *a)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    /* each call runs in a new process: the pid always differs */
    ex_opts_t o = {.order_salt = ((uint64_t)getpid() << 32 ^ (uint64_t)ts.tv_nsec) | 1};
    return ex_combine(c, &o, a);
}
static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION,
    .name = "nondeterministic-combine",
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
