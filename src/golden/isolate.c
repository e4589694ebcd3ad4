/* Loading files nobody vouches for. HDF5 1.10.8 can crash, or loop for
 * ever, on damaged metadata (tests/fuzz/corpus keeps the known cases), and
 * no check of ours can come first: only HDF5 can parse HDF5. So an
 * unsealed file is parsed once in a child process, which may die; a
 * sealed one whose seal verifies is what dropless wrote, and skips it. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "golden/golden_priv.h"

/* The child's exit status for a loader error rc: rc's code rides along. */
#define EXIT_ERR_BASE 64

static void child(int fd, const char *path, const dl_moe_config_t *expect, unsigned timeout_s)
{
    /* whatever the C library prints if HDF5 corrupts the heap stays out of
     * the caller's one line */
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0)
        dup2(devnull, STDERR_FILENO);
#ifdef _OPENMP
    /* libgomp's thread pool does not survive fork(): stay on one thread */
    omp_set_num_threads(1);
#endif
    signal(SIGALRM, SIG_DFL);
    alarm(timeout_s);
    dl_golden_file_t g;
    char e[512] = "";
    int rc = dl__golden_load(path, expect, expect == NULL, 0, &g, e, sizeof e);
    if (rc == 0)
        _exit(0);
    if (write(fd, e, strlen(e)) < 0)
        _exit(1);
    _exit(rc < 0 && rc > DL_ERRNO_MIN ? EXIT_ERR_BASE - rc : 1);
}

/* Reads what the child says (a message, at most n - 1 bytes) until it
 * closes the pipe. */
static void read_all(int fd, char *buf, size_t n)
{
    size_t len = 0;
    ssize_t got;
    while (len < n - 1) {
        got = read(fd, buf + len, n - 1 - len);
        if (got > 0)
            len += (size_t)got;
        else if (got == 0 || errno != EINTR)
            break;
    }
    buf[len] = '\0';
}

/* Loads path in a child: 0 if it loads, else the loader's error, or
 * DL_EFORMAT if the child did not live to give one. */
static int probe(const char *path, const dl_moe_config_t *expect, unsigned timeout_s, char *err,
                 size_t errlen)
{
    int fds[2];
    if (pipe(fds) != 0) {
        dl__golden_msg(err, errlen, "%s: cannot create a pipe: %s", path, strerror(errno));
        return DL_EIO;
    }
    fflush(NULL); /* or the child's copy of the buffers could be written twice */
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        dl__golden_msg(err, errlen, "%s: cannot fork: %s", path, strerror(errno));
        return DL_EIO;
    }
    if (pid == 0) {
        close(fds[0]);
        child(fds[1], path, expect, timeout_s);
    }
    close(fds[1]);
    char msg[512];
    read_all(fds[0], msg, sizeof msg);
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            dl__golden_msg(err, errlen, "%s: lost the process parsing it: %s", path, strerror(errno));
            return DL_EIO;
        }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        if (sig == SIGALRM)
            dl__golden_msg(err, errlen, "%s: the HDF5 library hung parsing the file (gave up "
                           "after %u s; damaged HDF5 metadata?)", path, timeout_s);
        else
            dl__golden_msg(err, errlen, "%s: the HDF5 library crashed parsing the file (%s; "
                           "damaged HDF5 metadata?)", path, strsignal(sig));
        return DL_EFORMAT;
    }
    int code = WEXITSTATUS(status);
    if (code == 0)
        return 0;
    if (code > EXIT_ERR_BASE && code < EXIT_ERR_BASE - DL_ERRNO_MIN && msg[0]) {
        /* the loader's own message names the file; make sure of it */
        if (strstr(msg, path))
            dl__golden_msg(err, errlen, "%s", msg);
        else
            dl__golden_msg(err, errlen, "%s: %s", path, msg);
        return EXIT_ERR_BASE - code;
    }
    /* e.g. a sanitizer's report, which exits with its own status */
    dl__golden_msg(err, errlen, "%s: the HDF5 library failed parsing the file (the loader "
                   "exited with status %d; damaged HDF5 metadata?)", path, code);
    return DL_EFORMAT;
}

int dl_golden_load_isolated(const char *path, const dl_moe_config_t *expect, unsigned timeout_s,
                            dl_golden_file_t *g, char *err, size_t errlen)
{
    if (!path || !g)
        return DL_EINVAL;
    memset(g, 0, sizeof *g);
    int sealed = 0, rc = dl__golden_check_seal(path, expect == NULL, &sealed, err, errlen);
    if (rc < 0)
        return rc;
    /* only a seal that verifies vouches for the bytes: a stale one is untrusted */
    if (sealed != 1 && (rc = probe(path, expect, timeout_s, err, errlen)) != 0)
        return rc;
    return dl__golden_load(path, expect, expect == NULL, sealed == 1, g, err, errlen);
}
