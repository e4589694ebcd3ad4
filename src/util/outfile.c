/* Output files, for every layer that writes one (golden files, candidate
 * files, reports). The promise is the developers' guide's: nothing
 * half-written under the final name, nothing replaced without force, never
 * anything but a regular file replaced even then. So a file is written
 * under a temporary name beside its destination and published by link()
 * (which refuses an existing name atomically) or, with force, by rename().
 * While a temporary exists, SIGINT, SIGTERM and SIGHUP remove it before the
 * process dies of them (SIGKILL cannot be caught: doc/cli.md says what a
 * killed writer leaves). */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/util_priv.h"

#ifdef __GNUC__
__attribute__((format(printf, 3, 4)))
#endif
static void msg(char *err, size_t n, const char *fmt, ...)
{
    if (!err || !n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------- temporaries removed on a signal */

#define NSLOTS 16
static struct {
    atomic_int used;
    pid_t pid; /* a forked child must not remove its parent's temporaries */
    char *tmp;
} slots[NSLOTS];
static const int cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP};

static void on_signal(int sig)
{
    pid_t me = getpid();
    for (int i = 0; i < NSLOTS; i++)
        if (atomic_load(&slots[i].used) && slots[i].pid == me)
            unlink(slots[i].tmp);
    /* SA_RESETHAND restored the default action; the raised signal is
     * delivered when the handler returns, and the process dies of it. */
    raise(sig);
}

/* Looked at each time a temporary is created: the program may have
 * changed its mind about the signals since. */
static void install_handlers(void)
{
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++) {
        struct sigaction old, sa;
        /* a program that handles the signal itself keeps its handler */
        if (sigaction(cleanup_signals[i], NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
            old.sa_handler != SIG_DFL)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_RESETHAND;
        sigemptyset(&sa.sa_mask);
        sigaction(cleanup_signals[i], &sa, NULL);
    }
}

static int register_tmp(char *tmp)
{
    install_handlers();
    for (int i = 0; i < NSLOTS; i++) {
        if (atomic_load(&slots[i].used))
            continue;
        slots[i].pid = getpid();
        slots[i].tmp = tmp;
        int expect = 0;
        if (atomic_compare_exchange_strong(&slots[i].used, &expect, 1))
            return i;
    }
    return -1; /* more than NSLOTS at once: this one is not cleaned up on a signal */
}

static void unregister_tmp(int slot)
{
    if (slot >= 0)
        atomic_store(&slots[slot].used, 0);
}

/* --------------------------------------------------------------- the rules */

/* 0 if path may be (re)placed; DL_EEXIST or DL_EIO with a message. */
static int may_replace(const char *path, int force, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        msg(err, errlen, "%s: %s", path, strerror(errno));
        return DL_EIO;
    }
    if (!S_ISREG(st.st_mode)) {
        const char *what = S_ISDIR(st.st_mode)    ? "a directory"
                           : S_ISLNK(st.st_mode)  ? "a symbolic link"
                           : S_ISFIFO(st.st_mode) ? "a FIFO"
                           : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                        : "not a regular file";
        msg(err, errlen, "%s: exists and is %s: not replaced, not even with --force", path, what);
        return DL_EEXIST;
    }
    if (!force) {
        msg(err, errlen, "%s: exists (use --force to overwrite)", path);
        return DL_EEXIST;
    }
    return 0;
}

int dl__out_check(const char *path, int force, char *err, size_t errlen)
{
    if (!path || !*path) {
        msg(err, errlen, "the output path is empty");
        return DL_EINVAL;
    }
    return may_replace(path, force, err, errlen);
}

int dl__out_begin(dl__outfile_t *o, const char *path, int force, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->slot = -1;
    int rc = dl__out_check(path, force, err, errlen);
    if (rc)
        return rc;
    size_t len = strlen(path);
    o->tmp = malloc(len + 16);
    if (!o->tmp) {
        msg(err, errlen, "%s: out of memory", path);
        return DL_ENOMEM;
    }
    snprintf(o->tmp, len + 16, "%s.tmp-XXXXXX", path);
    /* signals are held while the name exists but is not yet registered */
    sigset_t block, old;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++)
        sigaddset(&block, cleanup_signals[i]);
    sigprocmask(SIG_BLOCK, &block, &old);
    o->fd = mkstemp(o->tmp);
    int e = errno;
    if (o->fd >= 0)
        o->slot = register_tmp(o->tmp);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (o->fd < 0) {
        msg(err, errlen, "%s: cannot create a file there: %s", path, strerror(e));
        free(o->tmp);
        o->tmp = NULL;
        return DL_EIO;
    }
    mode_t um = umask(0);
    umask(um);
    if (fchmod(o->fd, 0666 & ~um) != 0) { /* mkstemp makes it 0600 */
        msg(err, errlen, "%s: %s", o->tmp, strerror(errno));
        dl__out_abort(o);
        return DL_EIO;
    }
    o->path = path;
    return 0;
}

void dl__out_abort(dl__outfile_t *o)
{
    if (!o->tmp)
        return;
    if (o->fd >= 0)
        close(o->fd);
    unlink(o->tmp);
    unregister_tmp(o->slot);
    free(o->tmp);
    o->tmp = NULL;
    o->fd = -1;
    o->slot = -1;
}

/* Moves the complete temporary to its name: link() where it can (it
 * refuses an existing name atomically), rename() with force or on a file
 * system without hard links, after the rules are checked again. */
static int publish(const dl__outfile_t *o, int force, char *err, size_t errlen)
{
    if (!force && link(o->tmp, o->path) == 0)
        return 0;
    if (!force && errno == EEXIST) {
        if (may_replace(o->path, 0, err, errlen) == 0) /* gone again since */
            msg(err, errlen, "%s: exists (use --force to overwrite)", o->path);
        return DL_EEXIST;
    }
    int rc = may_replace(o->path, force, err, errlen);
    if (rc)
        return rc;
    if (rename(o->tmp, o->path) != 0) {
        msg(err, errlen, "%s: cannot rename into place: %s", o->path, strerror(errno));
        return DL_EIO;
    }
    return 0;
}

int dl__out_commit(dl__outfile_t *o, int force, char *err, size_t errlen)
{
    if (!o->tmp)
        return DL_EINVAL;
    int rc = 0;
    /* the data reaches the disk before the name does */
    if (fsync(o->fd) != 0 || close(o->fd) != 0) {
        msg(err, errlen, "%s: cannot write: %s", o->path, strerror(errno));
        rc = DL_EIO;
    }
    o->fd = -1;
    if (!rc)
        rc = publish(o, force, err, errlen);
    unlink(o->tmp); /* after link() or a failure; a no-op after rename() */
    unregister_tmp(o->slot);
    free(o->tmp);
    o->tmp = NULL;
    o->slot = -1;
    return rc;
}
