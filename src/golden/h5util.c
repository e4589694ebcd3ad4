/* HDF5 helpers shared by the reader and the writer (a leaf: calls nothing
 * else of the library). */
#include "config.h"
#include <stdio.h>
#include <string.h>
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

int dl__h5_group_members(int64_t loc, const char *name, int64_t *grp, uint64_t *n)
{
    *grp = -1;
    *n = 0;
    htri_t ex = H5Lexists(loc, name, H5P_DEFAULT);
    if (ex <= 0)
        return ex < 0 ? -1 : 0;
    hid_t top = H5Gopen2(loc, name, H5P_DEFAULT);
    H5G_info_t info;
    if (top < 0 || H5Gget_info(top, &info) < 0) {
        if (top >= 0)
            H5Gclose(top);
        return -2;
    }
    *grp = top;
    *n = info.nlinks;
    return 1;
}

int dl__h5_member_name(int64_t grp, uint64_t i, char *buf, size_t n)
{
    ssize_t len = H5Lget_name_by_idx(grp, ".", H5_INDEX_NAME, H5_ITER_INC, (hsize_t)i, buf, n,
                                     H5P_DEFAULT);
    return len < 0 || (size_t)len >= n ? -1 : 0;
}

/* A scalar attribute: fixed-length string (as the other groups') or int64. */
int dl__golden_attr_put(hid_t obj, const char *name, const char *s, int64_t v)
{
    hid_t sp = H5Screate(H5S_SCALAR), t = -1, a = -1;
    int ok = sp >= 0;
    if (ok && s) {
        ok = (t = H5Tcopy(H5T_C_S1)) >= 0 && H5Tset_size(t, strlen(s) ? strlen(s) : 1) >= 0 &&
             H5Tset_strpad(t, H5T_STR_NULLPAD) >= 0 && H5Tset_cset(t, H5T_CSET_ASCII) >= 0;
        ok = ok && (a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
             H5Awrite(a, t, s) >= 0;
    } else if (ok) {
        ok = (a = H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
             H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0;
    }
    if (a >= 0 && H5Aclose(a) < 0)
        ok = 0;
    if (t >= 0 && H5Tclose(t) < 0)
        ok = 0;
    if (sp >= 0 && H5Sclose(sp) < 0)
        ok = 0;
    return ok ? 0 : DL_EIO;
}
