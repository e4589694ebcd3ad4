/* The objects of a candidate file the format does not name: a typo
 * (`/forward/h_gates`), a dataset at the wrong place (`/out`), a value the
 * case does not have (`h_gate` of a plain FFN). The loader ignores them, so
 * a candidate made only of such objects would check nothing; listing them
 * with the nearest known name lets the runner say why. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hdf5.h>
#include "golden/golden_priv.h"

/* Objects visited at most: a hostile file cannot make the walk long. */
#define MAX_VISIT 4096

typedef struct {
    const dl_moe_config_t *c;
    char *buf;
    size_t n, len;
    int count, visited;
} walk_t;

/* Levenshtein distance of two short strings (paths are < 64 characters in
 * the format; longer names only need to come out far). */
static int distance(const char *a, const char *b)
{
    enum { W = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la >= W || lb >= W)
        return W;
    int prev[W + 1], cur[W + 1];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof cur);
    }
    return prev[lb];
}

static const char *basename_of(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

const char *dl_golden_nearest_dataset(const char *path, const dl_moe_config_t *c)
{
    const char *best = NULL;
    int bd = 1 << 30;
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        if (ds->group == DL_GOLDEN_INPUTS || (c && !dl_golden_dataset_applies(ds, c)))
            continue;
        /* the right name in the wrong group is the likeliest mistake */
        int dd = strcmp(basename_of(path), ds->name) == 0 ? 0 : distance(path, ds->path);
        if (dd < bd)
            bd = dd, best = ds->path;
    }
    return best;
}

static void add(walk_t *w, const char *item)
{
    size_t m = strlen(item);
    w->count++;
    if (w->len + m + 6 >= w->n) { /* full: one ", ..." marks the rest */
        if (w->len + 6 < w->n && (w->len < 3 || strcmp(w->buf + w->len - 3, "...")))
            snprintf(w->buf + w->len, w->n - w->len, "%s...", w->len ? ", " : "");
        w->len = strlen(w->buf);
        return;
    }
    snprintf(w->buf + w->len, w->n - w->len, "%s%s", w->len ? ", " : "", item);
    w->len = strlen(w->buf);
}

static herr_t visit(hid_t obj, const char *name, const H5O_info_t *info, void *data)
{
    walk_t *w = data;
    if (++w->visited > MAX_VISIT)
        return 1;
    if (info->type != H5O_TYPE_DATASET)
        return 0;
    char path[256];
    snprintf(path, sizeof path, "/%s", name);
    (void)obj;
    for (char *ch = path; *ch; ch++) /* names from the file: keep messages one line */
        if ((unsigned char)*ch < 0x20 || *ch == 0x7f)
            *ch = '?';
    const dl_golden_dataset_t *ds = dl_golden_dataset_find(path);
    /* the layout groups: the loader's to judge */
    if (!strncmp(path, "/ep/", 4) || !strncmp(path, "/layouts/", 9))
        return 0;
    if (ds && dl_golden_dataset_applies(ds, w->c))
        return 0;
    char item[400];
    const char *near = ds ? NULL : dl_golden_nearest_dataset(path, w->c);
    if (ds)
        snprintf(item, sizeof item, "%s (not a value of this case)", path);
    else if (near)
        snprintf(item, sizeof item, "%s (did you mean %s?)", path, near);
    else
        snprintf(item, sizeof item, "%s", path);
    add(w, item);
    return 0;
}

int dl_golden_unknown_datasets(const char *path, const dl_moe_config_t *c, char *buf, size_t n,
                               int *count)
{
    if (!path || !c || !buf || n == 0)
        return DL_EINVAL;
    buf[0] = '\0';
    if (count)
        *count = 0;
    walk_t w = {c, buf, n, 0, 0, 0};
    dl__h5_quiet_t q;
    dl__h5_quiet_on(&q);
    int rc = 0;
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0)
        rc = DL_EFORMAT;
    else if (H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_INC, visit, &w, H5O_INFO_BASIC) < 0)
        rc = DL_EFORMAT;
    if (file >= 0 && H5Fclose(file) < 0 && !rc)
        rc = DL_EFORMAT;
    dl__h5_quiet_off(&q);
    if (count)
        *count = w.count;
    return rc;
}
