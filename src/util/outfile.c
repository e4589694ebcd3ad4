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
#include <limits.h>
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

/* ------------------------------------ the command's files, by identity */

/* A command registers its inputs and reserves its outputs before the work
 * (dl__out_input, dl__out_reserve). Files are told apart by identity,
 * st_dev and st_ino, so that ./x, d/../x, a hard link and a symbolic link
 * are one file; an output that does not exist yet by its resolved path.
 * An output that does not exist is reserved by creating it, empty, with
 * O_EXCL: a second writer is refused at once, and the finished file
 * replaces the placeholder by rename(). */
#define NFILES 512
typedef struct {
    atomic_int placeholder; /* the name holds our empty placeholder */
    int input;
    pid_t pid;
    dev_t dev;
    ino_t ino;
    char *path, *resolved; /* as given; the resolved path (outputs) */
} file_t;
static file_t files[NFILES];
static atomic_int nfiles;

static void remove_placeholders(void)
{
    pid_t me = getpid();
    for (int i = 0; i < atomic_load(&nfiles); i++) {
        file_t *f = &files[i];
        struct stat st;
        if (f->pid != me || !atomic_exchange(&f->placeholder, 0))
            continue;
        /* only if the name still holds our empty file */
        if (lstat(f->path, &st) == 0 && st.st_dev == f->dev && st.st_ino == f->ino &&
            st.st_size == 0)
            unlink(f->path);
    }
}

static void on_signal(int sig)
{
    pid_t me = getpid();
    for (int i = 0; i < NSLOTS; i++)
        if (atomic_load(&slots[i].used) && slots[i].pid == me)
            unlink(slots[i].tmp);
    remove_placeholders();
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

/* ------------------------------------------------------------ identities */

static void block_signals(sigset_t *old)
{
    sigset_t block;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++)
        sigaddset(&block, cleanup_signals[i]);
    sigprocmask(SIG_BLOCK, &block, old);
}

/* The absolute path path would have: its folder resolved (realpath), then
 * its last component; NULL if the folder does not resolve. malloc'ed. */
static char *resolve(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    char *real = dir ? realpath(dir, NULL) : NULL;
    free(dir);
    if (!real)
        return NULL;
    size_t n = strlen(real) + strlen(base) + 2;
    char *out = malloc(n);
    if (out)
        snprintf(out, n, "%s%s%s", real, strcmp(real, "/") ? "/" : "", base);
    free(real);
    return out;
}

/* The registered file path names (an input or a reserved output), or NULL;
 * resolved is path's resolved path, for outputs that do not exist yet. */
static const file_t *find_file(const char *path, const char *resolved)
{
    struct stat st;
    int exists = stat(path, &st) == 0;
    pid_t me = getpid();
    for (int i = 0; i < atomic_load(&nfiles); i++) {
        const file_t *f = &files[i];
        if (f->pid != me)
            continue;
        if (exists ? st.st_dev == f->dev && st.st_ino == f->ino
                   : resolved && f->resolved && !strcmp(resolved, f->resolved))
            return f;
    }
    return NULL;
}

static int add_file(const char *path, const struct stat *st, int input, int placeholder,
                    char *resolved)
{
    int i = atomic_load(&nfiles);
    char *copy = strdup(path);
    if (i == NFILES || !copy) {
        free(copy);
        free(resolved);
        return i == NFILES ? DL_EINVAL : DL_ENOMEM;
    }
    file_t *f = &files[i];
    f->input = input;
    f->pid = getpid();
    f->dev = st->st_dev;
    f->ino = st->st_ino;
    f->path = copy;
    f->resolved = resolved;
    atomic_store(&f->placeholder, placeholder);
    atomic_store(&nfiles, i + 1); /* the signal handler sees it complete */
    return 0;
}

int dl__out_input(const char *path)
{
    struct stat st;
    if (!path || stat(path, &st) != 0 || find_file(path, NULL))
        return 0; /* a missing input is its reader's error to report */
    return add_file(path, &st, 1, 0, NULL);
}

/* An output must not be an input of the command, nor another of its
 * outputs: 0, or DL_EEXIST with a message. */
static int not_registered(const char *path, const char *resolved, char *err, size_t errlen)
{
    const file_t *f = find_file(path, resolved);
    if (!f)
        return 0;
    if (f->input)
        msg(err, errlen, "%s: is an input of this command (%s): not replaced, not even with --force",
            path, f->path);
    else
        msg(err, errlen, "%s: names the same file as %s, another output of this command", path,
            f->path);
    return DL_EEXIST;
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

/* The reserved output path names, or NULL. */
static file_t *reserved(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return NULL;
    file_t *f = (file_t *)find_file(path, NULL);
    return f && !f->input && f->dev == st.st_dev && f->ino == st.st_ino ? f : NULL;
}

int dl__out_check(const char *path, int force, char *err, size_t errlen)
{
    if (!path || !*path) {
        msg(err, errlen, "the output path is empty");
        return DL_EINVAL;
    }
    if (reserved(path))
        return 0;
    int rc = not_registered(path, NULL, err, errlen);
    return rc ? rc : may_replace(path, force, err, errlen);
}

/* The folder of path can be created in: 0 or DL_EIO with a message. */
static int dir_writable(const char *path, char *err, size_t errlen)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    int ok = dir && access(dir, W_OK | X_OK) == 0, e = errno;
    free(dir);
    if (ok)
        return 0;
    msg(err, errlen, "%s: cannot create a file there: %s", path, strerror(e));
    return DL_EIO;
}

int dl__out_reserve(const char *path, int force, char *err, size_t errlen)
{
    if (!path || !*path) {
        msg(err, errlen, "the output path is empty");
        return DL_EINVAL;
    }
    char *res = resolve(path);
    int rc = not_registered(path, res, err, errlen);
    if (!rc)
        rc = may_replace(path, force, err, errlen);
    struct stat st;
    if (!rc && lstat(path, &st) == 0) { /* a regular file, and force */
        if (!(rc = dir_writable(path, err, errlen)))
            return add_file(path, &st, 0, 0, res);
        free(res);
        return rc;
    }
    if (rc) {
        free(res);
        return rc;
    }
    sigset_t old;
    block_signals(&old);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    int e = errno;
    if (fd >= 0 && fstat(fd, &st) != 0) {
        free(res);
        rc = DL_EIO;
    } else if (fd >= 0) {
        rc = add_file(path, &st, 0, 1, res);
    }
    if (fd >= 0 && rc) {
        unlink(path);
        rc = rc ? rc : DL_EIO;
        msg(err, errlen, "%s: cannot reserve: %s", path, rc == DL_EIO ? strerror(errno)
                                                      : "too many outputs");
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (fd >= 0) {
        install_handlers();
        close(fd);
        return rc;
    }
    free(res);
    if (e == EEXIST) { /* created meanwhile: another writer's */
        msg(err, errlen, "%s: exists (use --force to overwrite)", path);
        return DL_EEXIST;
    }
    msg(err, errlen, "%s: cannot create a file there: %s", path, strerror(e));
    return DL_EIO;
}

void dl__out_release(void)
{
    sigset_t old;
    block_signals(&old);
    remove_placeholders();
    sigprocmask(SIG_SETMASK, &old, NULL);
}

/* The temporary's name: PATH.tmp-XXXXXX, the last component shortened
 * where that would pass NAME_MAX. malloc'ed. */
static char *tmp_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0, base = strlen(path) - dirlen;
    const size_t suffix = sizeof ".tmp-XXXXXX" - 1, max = NAME_MAX - suffix;
    if (base > max)
        base = max;
    char *tmp = malloc(dirlen + base + suffix + 1);
    if (tmp)
        snprintf(tmp, dirlen + base + suffix + 1, "%.*s%.*s.tmp-XXXXXX", (int)dirlen, path,
                 (int)base, path + dirlen);
    return tmp;
}

int dl__out_begin(dl__outfile_t *o, const char *path, int force, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->slot = -1;
    int rc = dl__out_check(path, force, err, errlen);
    if (rc)
        return rc;
    o->tmp = tmp_name(path);
    if (!o->tmp) {
        msg(err, errlen, "%s: out of memory", path);
        return DL_ENOMEM;
    }
    /* signals are held while the name exists but is not yet registered */
    sigset_t old;
    block_signals(&old);
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

/* Moves the complete temporary onto our reserved placeholder by rename(),
 * with the signals held so that their handler never removes the result. */
static int publish_reserved(const dl__outfile_t *o, file_t *f, char *err, size_t errlen)
{
    sigset_t old;
    block_signals(&old);
    int was = atomic_exchange(&f->placeholder, 0);
    int rc = rename(o->tmp, o->path), e = errno;
    if (rc != 0)
        atomic_store(&f->placeholder, was);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        return 0;
    msg(err, errlen, "%s: cannot rename into place: %s", o->path, strerror(e));
    return DL_EIO;
}

/* Moves the complete temporary to its name: over our own reservation, else
 * by link() where it can (it refuses an existing name atomically), rename()
 * with force or on a file system without hard links, after the rules are
 * checked again. */
static int publish(const dl__outfile_t *o, int force, char *err, size_t errlen)
{
    file_t *f = reserved(o->path);
    if (f && (force || atomic_load(&f->placeholder)))
        return publish_reserved(o, f, err, errlen);
    if (!force && link(o->tmp, o->path) == 0)
        return 0;
    if (!force && errno == EEXIST) {
        if (may_replace(o->path, 0, err, errlen) == 0) /* gone again since */
            msg(err, errlen, "%s: exists (use --force to overwrite)", o->path);
        return DL_EEXIST;
    }
    int rc = not_registered(o->path, NULL, err, errlen);
    if (!rc)
        rc = may_replace(o->path, force, err, errlen);
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
