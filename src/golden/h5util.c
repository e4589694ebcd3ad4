/* HDF5 helpers shared by the reader and the writer (a leaf: calls nothing
 * else of the library). */
#include "config.h"
#include <stdio.h>
#include <hdf5.h>
#include "golden/golden_priv.h"

void dl__h5_quiet_on(dl__h5_quiet_t *q)
{
    H5E_auto2_t fn = NULL;
    q->data = NULL;
    H5Eget_auto2(H5E_DEFAULT, &fn, &q->data);
    q->fn = (void (*)(void))fn;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

void dl__h5_quiet_off(const dl__h5_quiet_t *q)
{
    H5Eset_auto2(H5E_DEFAULT, (H5E_auto2_t)q->fn, q->data);
}

const char *dl_golden_hdf5_version(void)
{
    static char buf[32];
    unsigned maj = 0, min = 0, rel = 0;
    if (H5get_libversion(&maj, &min, &rel) < 0)
        return "unknown";
    snprintf(buf, sizeof buf, "%u.%u.%u", maj, min, rel);
    return buf;
}

void dl_golden_hdf5_quiet(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}
