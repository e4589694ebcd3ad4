/* util_priv.h: helpers that meet the operating system (src/util/), for
 * the layers that write files (golden, check, capacity, cli); not the
 * exact core's or the stages', which know nothing of files. Not installed. */
#ifndef DL_UTIL_PRIV_H
#define DL_UTIL_PRIV_H

#include "core/core_priv.h"

/* One output file being written: a temporary beside `path`, removed if the
 * process dies of SIGINT, SIGTERM or SIGHUP before it is published. */
typedef struct {
    const char *path; /* the destination (borrowed) */
    char *tmp;        /* the temporary's name */
    int fd;           /* open on the temporary, for writing */
    int slot;         /* private: the signal-cleanup registration */
} dl__outfile_t;

/* Starts an output file: refuses an empty path (DL_EINVAL), an existing one
 * unless force (DL_EEXIST), anything but a regular file even with force
 * (DL_EEXIST), a directory it cannot create in (DL_EIO); creates the
 * temporary (mode 0666 & ~umask). One-line message naming path in err.
 * On success finish with dl__out_commit or dl__out_abort. */
/* The checks of dl__out_begin alone, for refusing before a long job. */
int dl__out_check(const char *path, int force, char *err, size_t errlen);
int dl__out_begin(dl__outfile_t *o, const char *path, int force, char *err, size_t errlen);
/* fsyncs and closes o->fd, then publishes the temporary under o->path by
 * link() (force: rename() over a regular file only), checking the rules of
 * dl__out_begin again. The temporary is gone afterwards, whatever the
 * outcome. 0, DL_EEXIST or DL_EIO with a message. */
int dl__out_commit(dl__outfile_t *o, int force, char *err, size_t errlen);
/* Closes and removes the temporary; nothing is published. */
void dl__out_abort(dl__outfile_t *o);

#endif
