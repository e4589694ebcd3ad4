/* Writing a directory of mutants (dl_mutate_write): candidate files with
 * their mutation attributes and manifest.tsv, all into a temporary
 * directory beside the destination, renamed into place at the end. */
#include "config.h"
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <hdf5.h>
#include "golden/mutate_priv.h"

typedef struct {
    const dl_golden_file_t *g;
    const dl_mutate_opts_t *o;
    const char *dir, *tmp;
    char *err;
    size_t errlen;
    char *man;
    size_t len, cap;
    int files;
} wctx_t;

static int man_add(wctx_t *w, const char *line)
{
    size_t n = strlen(line);
    if (w->len + n + 1 > w->cap) {
        size_t cap = (w->cap + n + 1) * 2;
        char *p = realloc(w->man, cap);
        if (!p)
            return DL_ENOMEM;
        w->man = p, w->cap = cap;
    }
    memcpy(w->man + w->len, line, n + 1);
    w->len += n;
    return 0;
}

/* One candidate file: the view, its attributes, the seal again. */
static int write_one(wctx_t *w, const dl_golden_file_t *view, const char *file, const char *attrs[5][2])
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", w->tmp, file);
    int rc = dl_golden_write_candidate(path, view, 0, w->err, w->errlen);
    if (rc)
        return rc;
    dl__h5_quiet_t q;
    dl__h5_quiet_on(&q);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    rc = f < 0 ? DL_EIO : 0;
    for (int i = 0; !rc && i < 5; i++)
        rc = dl__golden_attr_put(f, attrs[i][0], attrs[i][1], 0);
    if (f >= 0 && H5Fclose(f) < 0)
        rc = DL_EIO;
    dl__h5_quiet_off(&q);
    if (rc)
        return dl__golden_msg(w->err, w->errlen, "%s: HDF5 error: adding the mutation attributes",
                              path), rc;
    return dl_golden_seal(path, w->err, w->errlen);
}

/* Every mode of mutant (m, s). */
static int write_modes(wctx_t *w, dl_mutation_t m, int s, const dl_golden_file_t *mu,
                       const char *detail)
{
    for (int mode = 0; mode < DL_MUTATE_MODE_COUNT; mode++) {
        if (w->o->modes && !(w->o->modes & (1u << mode)))
            continue;
        if (mode == DL_MUTATE_FUSED && !w->g->has_backward)
            continue; /* the same candidate as out alone */
        dl_golden_file_t view;
        char file[160], line[512];
        const char *expect = dl_mutation_expect_pass(m) ? "pass" : "fail";
        int differs = dl_mutant_view(w->g, mu, (dl_mutate_mode_t)mode, &view);
        snprintf(file, sizeof file, "%s.%s.%s.h5", dl_mutation_name(m), dl_value_name((dl_value_t)s),
                 dl_mutate_mode_name((dl_mutate_mode_t)mode));
        const char *attrs[5][2] = {{"mutation", dl_mutation_name(m)},
                                   {"mutation_stage", dl_value_name((dl_value_t)s)},
                                   {"mutation_mode", dl_mutate_mode_name((dl_mutate_mode_t)mode)},
                                   {"mutation_detail", detail},
                                   {"expect", expect}};
        int rc = differs ? write_one(w, &view, file, attrs) : 0;
        if (rc)
            return rc;
        w->files += differs;
        snprintf(line, sizeof line, "%s\t%s\t%s\t%s\t%s\t%s\n", differs ? file : "-",
                 dl_mutation_name(m), dl_value_name((dl_value_t)s),
                 dl_mutate_mode_name((dl_mutate_mode_t)mode), differs ? expect : "equivalent", detail);
        if ((rc = man_add(w, line)))
            return rc;
    }
    return 0;
}

static int write_all(wctx_t *w)
{
    int rc = man_add(w, "file\tmutation\tstage\tmode\texpect\tdetail\n");
    for (int m = 0; !rc && m < DL_MUTATION_COUNT; m++) {
        if (w->o->mutations && !(w->o->mutations & DL__BIT(m)))
            continue;
        for (int s = 0; !rc && s < DL_VALUE_COUNT; s++) {
            if (w->o->stages && !(w->o->stages & DL__BIT(s)))
                continue;
            dl_golden_file_t mu;
            char detail[200] = "";
            rc = dl_mutant_build(w->g, (dl_mutation_t)m, s, w->o, &mu, detail, sizeof detail,
                                 w->err, w->errlen);
            if (!rc)
                rc = write_modes(w, (dl_mutation_t)m, s, &mu, detail);
            dl_golden_free(&mu);
            if (rc == DL_ENOTFOUND)
                rc = 0; /* does not apply here */
        }
    }
    if (rc)
        return rc;
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.tsv", w->tmp);
    FILE *f = fopen(path, "w");
    if (!f || fputs(w->man, f) < 0 || fclose(f) != 0) {
        if (f)
            fclose(f);
        return dl__golden_msg(w->err, w->errlen, "%s: cannot write manifest.tsv: %s", w->dir,
                              strerror(errno)), DL_EIO;
    }
    return 0;
}

/* Removes a directory of mutants: its regular files, then itself. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4096];
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* Whether dir may be written: absent, or (force) a directory of mutants. */
static int check_dest(const char *dir, int force, char *err, size_t errlen)
{
    struct stat st;
    char man[4096];
    if (!*dir)
        return dl__golden_msg(err, errlen, "mutate: empty output directory name"), DL_EINVAL;
    if (lstat(dir, &st) != 0)
        return errno == ENOENT ? 0
                               : (dl__golden_msg(err, errlen, "%s: %s", dir, strerror(errno)), DL_EIO);
    if (!force)
        return dl__golden_msg(err, errlen, "%s: exists (use --force to replace it)", dir), DL_EEXIST;
    snprintf(man, sizeof man, "%s/manifest.tsv", dir);
    if (!S_ISDIR(st.st_mode) || access(man, F_OK) != 0)
        return dl__golden_msg(err, errlen, "%s: exists and is not a directory of mutants "
                                           "(no manifest.tsv): not replaced", dir), DL_EEXIST;
    return 0;
}

int dl_mutate_write(const dl_golden_file_t *g, const char *dir, const dl_mutate_opts_t *o,
                    int *n_files, char **manifest, char *err, size_t errlen)
{
    dl_mutate_opts_t none = {0};
    o = o ? o : &none;
    if (!g || !dir)
        return DL_EINVAL;
    int rc = check_dest(dir, o->force, err, errlen);
    if (rc)
        return rc;
    char tmp[4096], old[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", dir);
    if (strlen(dir) > 4000 || !mkdtemp(tmp))
        return dl__golden_msg(err, errlen, "%s: cannot create a temporary directory beside it: %s",
                              dir, strerror(errno)), DL_EIO;
    wctx_t w = {g, o, dir, tmp, err, errlen, NULL, 0, 0, 0};
    rc = write_all(&w);
    snprintf(old, sizeof old, "%s.old-XXXXXX", dir);
    if (!rc && (rc = check_dest(dir, o->force, err, errlen)) == 0) {
        int exists = access(dir, F_OK) == 0;
        if (exists && !mkdtemp(old))
            rc = DL_EIO;
        else if (exists && rename(dir, old) != 0)
            rc = DL_EIO;
        else if (rename(tmp, dir) != 0)
            rc = DL_EIO;
        if (rc)
            dl__golden_msg(err, errlen, "%s: cannot rename the mutants into place: %s", dir,
                           strerror(errno));
        else if (exists)
            remove_dir(old);
    }
    if (rc)
        remove_dir(tmp);
    if (!rc && n_files)
        *n_files = w.files;
    if (!rc && manifest)
        *manifest = w.man, w.man = NULL;
    free(w.man);
    return rc;
}
