/* crash.c: a faulty backend, to show that a plugin's failure is a
 * diagnostic and never takes the runner down.
 *   expert_backward   dies of SIGSEGV          -> crashed
 *   combine_backward  returns an error code    -> error-return
 *   permute           writes into its input x  -> crashed (inputs are read-only)
 *   expert_forward, combine                     -> ok
 */
#include <signal.h>
#include <dropless/backend.h>
#include "kernels.h"

static int permute(const dl_backend_config_t *c, const dl_backend_permute_args_t *a)
{
    EX_F32(a->x)[0] = 0; /* an in-place trick on an input: forbidden */
    return ex_permute(c, a);
}
static int combine_backward(const dl_backend_config_t *c,
                            const dl_backend_combine_backward_args_t *a)
{
    return 7;
}
static int expert_backward(const dl_backend_config_t *c,
                           const dl_backend_expert_backward_args_t *a)
{
    raise(SIGSEGV);
    return 0;
}

static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION,
    .name = "crash",
    .version = "1.0",
    .compute_mode = "fp32",
    .permute = permute,
    .expert_forward = ex_plain_expert_forward,
    .combine = ex_plain_combine,
    .combine_backward = combine_backward,
    .expert_backward = expert_backward,
};

const dl_backend_t *dropless_backend(void);
const dl_backend_t *dropless_backend(void)
{
    return &backend;
}
