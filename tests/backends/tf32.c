/* tf32.c: a backend whose matrix products run in TF32, as tensor cores do
 * when "allow_tf32" is on: both operands of every product are rounded to
 * 10 explicit mantissa bits, products are accumulated in fp32.
 * Expected verdict: FAIL under the fp32 profile on full-precision fp32
 * inputs (its error is ~2^-11 relative per product, 1000x fp32's), PASS
 * under the tf32 profile, which is what its compute_mode declares.
 */
#include <dropless/backend.h>
#include "kernels.h"

static const ex_opts_t tf32 = {.tf32 = 1};

static int router(const dl_backend_config_t *c, const dl_backend_router_args_t *a)
{
    return ex_router(c, &tf32, a);
}
static int dispatch(const dl_backend_config_t *c, const dl_backend_dispatch_args_t *a)
{
    return ex_dispatch(c, a);
}
static int permute(const dl_backend_config_t *c, const dl_backend_permute_args_t *a)
{
    return ex_permute(c, a);
}
static int expert_forward(const dl_backend_config_t *c, const dl_backend_expert_forward_args_t *a)
{
    return ex_expert_forward(c, &tf32, a);
}
static int combine(const dl_backend_config_t *c, const dl_backend_combine_args_t *a)
{
    return ex_combine(c, NULL, a); /* a weighted sum of k rows, not a GEMM */
}
static int combine_backward(const dl_backend_config_t *c,
                            const dl_backend_combine_backward_args_t *a)
{
    return ex_combine_backward(c, NULL, a);
}
static int expert_backward(const dl_backend_config_t *c,
                           const dl_backend_expert_backward_args_t *a)
{
    return ex_expert_backward(c, &tf32, a, 1);
}
static int router_backward(const dl_backend_config_t *c,
                           const dl_backend_router_backward_args_t *a)
{
    return ex_router_backward(c, &tf32, a);
}
static int input_backward(const dl_backend_config_t *c, const dl_backend_input_backward_args_t *a)
{
    return ex_input_backward(c, &tf32, a);
}

static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION,
    .name = "tf32",
    .version = "1.0",
    .compute_mode = "tf32",
    .router = router,
    .dispatch = dispatch,
    .permute = permute,
    .expert_forward = expert_forward,
    .combine = combine,
    .combine_backward = combine_backward,
    .expert_backward = expert_backward,
    .router_backward = router_backward,
    .input_backward = input_backward,
};

const dl_backend_t *dropless_backend(void);
const dl_backend_t *dropless_backend(void)
{
    return &backend;
}
