/* A layer configuration from the text of a case file, for bindings that
 * hold a configuration as text (the JAX FFI handler of python/dropless
 * gets it as a string attribute). */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "api/api_priv.h"

/* The text reaches the one case-file parser (dl_case_parse_file, which
 * reads a path) so that it is judged by the same keys, rules and messages
 * as a file, with no second parser to drift from it: through a pipe
 * reopened by its /dev/fd path (no disk), else, where a sandbox offers no
 * such path, through a temporary file. The whole text must fit the pipe's
 * buffer before anyone reads (PIPE_BUF is at least 512 bytes everywhere,
 * 4096 on Linux; a configuration takes ~300). */
#define CONFIG_TEXT_MAX 4096

/* err with the path it names replaced by "config". */
static void rename_source(char *err, size_t n, const char *path)
{
    size_t plen = strlen(path);
    if (!err || strncmp(err, path, plen) != 0)
        return;
    char tail[1024];
    snprintf(tail, sizeof tail, "%s", err + plen);
    snprintf(err, n, "config%s", tail);
}

static int write_all(int fd, const char *text, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, text, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        text += w;
        len -= (size_t)w;
    }
    return 0;
}

static int parse_path(const char *path, dl_case_t *c, char *err, size_t n)
{
    int rc = dl_case_parse_file(path, c, err, n);
    if (rc)
        rename_source(err, n, path);
    return rc;
}

/* DL_EIO when no pipe can be made or reopened here. */
static int parse_piped(const char *text, size_t len, dl_case_t *c, char *err, size_t n)
{
    int fd[2];
    if (pipe(fd) != 0)
        return DL_EIO;
    int bad = write_all(fd[1], text, len);
    close(fd[1]);
    char path[32];
    snprintf(path, sizeof path, "/dev/fd/%d", fd[0]);
    int rc = bad || access(path, R_OK) != 0 ? DL_EIO : parse_path(path, c, err, n);
    close(fd[0]);
    return rc;
}

static int parse_tempfile(const char *text, size_t len, dl_case_t *c, char *err, size_t n)
{
    const char *dir = getenv("TMPDIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/dl-config-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0)
        return dl__api_fail(err, n, DL_EIO, "config: no pipe, and no temporary file in %s: %s",
                            dir && *dir ? dir : "/tmp", strerror(errno));
    int bad = write_all(fd, text, len);
    int werr = errno;
    close(fd);
    int rc = bad ? dl__api_fail(err, n, DL_EIO, "config: cannot write %s: %s", path,
                                strerror(werr))
                 : parse_path(path, c, err, n);
    unlink(path);
    return rc;
}

int dl_api_config_parse(const char *text, dl_moe_config_t *out, char *canon, size_t canon_len,
                        char *err, size_t errlen)
{
    if (!text)
        return dl__api_fail(err, errlen, DL_EINVAL, "config: no text given");
    size_t len = strlen(text);
    if (len > CONFIG_TEXT_MAX)
        return dl__api_fail(err, errlen, DL_EOVERFLOW, "config: text of %zu bytes, at most %d",
                            len, CONFIG_TEXT_MAX);
    dl_case_t c;
    int rc = parse_piped(text, len, &c, err, errlen);
    if (rc == DL_EIO) /* the parser's own errors are DL_EFORMAT and DL_EINVAL */
        rc = parse_tempfile(text, len, &c, err, errlen);
    if (rc)
        return rc;
    if (canon && dl_golden_config_string(&c.config, "\n", canon, canon_len))
        return dl__api_fail(err, errlen, DL_EOVERFLOW, "config: canonical text longer than %zu bytes",
                            canon_len);
    if (out)
        *out = c.config;
    return 0;
}
