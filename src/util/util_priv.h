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

/* A command's files, told apart by identity (st_dev, st_ino; an output
 * that does not exist yet by its resolved path), before any work:
 * dl__out_input registers an input, which no output of this process may
 * replace, not even with force (a missing input is skipped: its reader
 * says why). dl__out_reserve checks an output by the rules of
 * dl__out_begin, refuses an input's identity and another reserved
 * output's (DL_EEXIST), and reserves it: a name that does not exist is
 * created empty with O_EXCL (so a concurrent writer is refused at once,
 * DL_EEXIST), and dl__out_commit renames the finished file over it; an
 * existing regular file (force) is kept until then. dl__out_release
 * removes the placeholders no file replaced (a refusal or a failure after
 * the reservation); SIGINT, SIGTERM and SIGHUP remove them too. A forked
 * child never touches its parent's. One-line message in err. */
int dl__out_input(const char *path);
int dl__out_reserve(const char *path, int force, char *err, size_t errlen);
void dl__out_release(void);

/* Starts an output file: refuses an empty path (DL_EINVAL), an existing one
 * unless force (DL_EEXIST), anything but a regular file even with force
 * (DL_EEXIST), a registered input (DL_EEXIST), a directory it cannot
 * create in (DL_EIO); a path this process reserved passes. Creates the
 * temporary (PATH.tmp-XXXXXX, the last component shortened to fit
 * NAME_MAX; mode 0666 & ~umask). One-line message naming path in err.
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
