#include "config.h"
#include "core/core_priv.h"

const char *dl_strerror(int err)
{
    if (err == 0)
        return "success";
    switch (err) {
#define DL__ERR_MSG(name, val, msg) case val: return msg;
        DL_ERRNO_MAP(DL__ERR_MSG)
#undef DL__ERR_MSG
    default:
        return "unknown error";
    }
}

const char *dl_err_name(int err)
{
    switch (err) {
    case 0:
        return "DL_OK";
#define DL__ERR_NAME(name, val, msg) case val: return "DL_" #name;
        DL_ERRNO_MAP(DL__ERR_NAME)
#undef DL__ERR_NAME
    default:
        return "DL_UNKNOWN";
    }
}

int dl_mul_size(int64_t a, int64_t b, int64_t *r)
{
    if (a < 0 || b < 0)
        return DL_EINVAL;
    if (a != 0 && b > INT64_MAX / a)
        return DL_EOVERFLOW;
    *r = a * b;
    return 0;
}
