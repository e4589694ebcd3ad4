/* plain.c: the reference template for a dropless backend plugin.
 *
 * A straightforward fp32 CPU implementation of every stage: each dot product
 * accumulated in one float in natural order, each stored value rounded once
 * to the case's storage type. Expected verdict: PASS under the fp32 profile
 * (its errors are those of ordinary fp32 accumulation).
 *
 * To write your own backend, copy this file:
 *   1. include <dropless/backend.h> (it needs only DLPack);
 *   2. write one function per stage you implement, with the signature
 *      int stage(const dl_backend_config_t *c, const dl_backend_<stage>_args_t *a)
 *      reading the input tensors of *a and writing EVERY element of its
 *      output tensors, returning 0 (anything else is an error);
 *   3. fill a static dl_backend_t with DL_BACKEND_ABI_VERSION, a name, a
 *      version, your compute mode, and the stage functions (NULL for the
 *      stages you do not implement);
 *   4. export `const dl_backend_t *dropless_backend(void)` returning it;
 *   5. build a shared object: cc -shared -fPIC -o mybackend.so mybackend.c
 *      and run `dropless run --backend ./mybackend.so GOLDEN.h5`.
 * Each call runs in a fresh process: do not keep state between stages.
 * A GPU backend copies the (CPU) inputs to the device, runs its kernels and
 * copies the outputs back into the given CPU tensors.
 */
#include <dropless/backend.h>
#include "kernels.h"

/* The stages. Each is fed the golden values of its inputs, so a stage is
 * judged on its own. Tensors are compact row-major CPU arrays; bf16/fp16
 * values travel as float32 values on the bf16/fp16 grid, so outputs are
 * rounded to the case's type (ex_act) and stored as floats. */

static int router(const dl_backend_config_t *c, const dl_backend_router_args_t *a)
{
    return ex_router(c, NULL, a);
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
    return ex_expert_forward(c, NULL, a);
}

static int combine(const dl_backend_config_t *c, const dl_backend_combine_args_t *a)
{
    return ex_combine(c, NULL, a);
}

static int combine_backward(const dl_backend_config_t *c,
                            const dl_backend_combine_backward_args_t *a)
{
    return ex_combine_backward(c, NULL, a);
}

static int expert_backward(const dl_backend_config_t *c,
                           const dl_backend_expert_backward_args_t *a)
{
    /* 1: empty experts get their (zero) weight gradients written too */
    return ex_expert_backward(c, NULL, a, 1);
}

static int router_backward(const dl_backend_config_t *c,
                           const dl_backend_router_backward_args_t *a)
{
    return ex_router_backward(c, NULL, a);
}

static int input_backward(const dl_backend_config_t *c, const dl_backend_input_backward_args_t *a)
{
    return ex_input_backward(c, NULL, a);
}

static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION,
    .name = "plain-fp32",
    .version = "1.0",
    .compute_mode = "fp32",
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

/* The one exported symbol (DL_BACKEND_SYMBOL). The declaration keeps
 * -Wmissing-prototypes quiet; a plugin needs no header of its own. */
const dl_backend_t *dropless_backend(void);
const dl_backend_t *dropless_backend(void)
{
    return &backend;
}
