/* nodw.c: a backend that never writes the weight gradients of experts that
 * received no tokens (a common bug: the kernel is launched over non-empty
 * groups only, so the zero gradient of an idle expert is never stored).
 * The runner's poisoning catches it. Expected verdict: FAIL (unwritten).
 */
#include <dropless/backend.h>
#include "kernels.h"

static int expert_backward(const dl_backend_config_t *c,
                           const dl_backend_expert_backward_args_t *a)
{
    return ex_expert_backward(c, NULL, a, 0); /* 0: skip the empty experts' dW */
}

static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION,
    .name = "no-empty-expert-dw",
    .version = "1.0",
    .compute_mode = "fp32",
    .expert_forward = ex_plain_expert_forward,
    .expert_backward = expert_backward,
};

const dl_backend_t *dropless_backend(void);
const dl_backend_t *dropless_backend(void)
{
    return &backend;
}
