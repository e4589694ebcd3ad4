/* loadcrash.c: a plugin that crashes while it is being loaded (in a
 * constructor, as a broken static initialiser or a driver library might).
 * The runner loads plugins in a child only, so this is a failed run, not a
 * crashed runner. Expected verdict: FAIL (load-failed) for every stage.
 */
#include <signal.h>
#include <dropless/backend.h>

__attribute__((constructor)) static void explode(void)
{
    raise(SIGSEGV);
}

static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION,
    .name = "crash-on-load",
    .version = "1.0",
    .compute_mode = "fp32",
};

const dl_backend_t *dropless_backend(void);
const dl_backend_t *dropless_backend(void)
{
    return &backend;
}
