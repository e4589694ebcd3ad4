/* A layer configuration from the text of a case file, for bindings that
 * hold a configuration as text (the JAX FFI handler of python/dropless
 * gets it as a string attribute). */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "api/api_priv.h"

/* The text goes through a pipe so that the one case-file parser
 * (dl_case_parse_file, which reads a path) judges it: the same keys, rules
 * and messages as a file, no second parser to drift from it. The whole
 * text must fit the pipe's buffer before anyone reads (PIPE_BUF is at
 * least 512 bytes everywhere, 4096 on Linux; a configuration takes ~300). */
#define CONFIG_TEXT_MAX 4096

/* err with the pipe's path replaced by "config". */
static void rename_source(char *err, size_t n, const char *path)
{
    size_t plen = strlen(path);
    if (!err || strncmp(err, path, plen) != 0)
        return;
    char tail[1024];
    snprintf(tail, sizeof tail, "%s", err + plen);
    snprintf(err, n, "config%s", tail);
}

static int parse_piped(const char *text, size_t len, dl_case_t *c, char *err, size_t n)
{
    int fd[2];
    if (pipe(fd) != 0)
        return dl__api_fail(err, n, DL_EIO, "config: cannot make a pipe: %s", strerror(errno));
    ssize_t w = write(fd[1], text, len);
    int werr = errno;
    close(fd[1]);
    if (w < 0 || (size_t)w != len) {
        close(fd[0]);
        return dl__api_fail(err, n, DL_EIO, "config: cannot write the pipe: %s",
                            w < 0 ? strerror(werr) : "short write");
    }
    char path[32];
    snprintf(path, sizeof path, "/dev/fd/%d", fd[0]);
    int rc = dl_case_parse_file(path, c, err, n);
    close(fd[0]);
    if (rc)
        rename_source(err, n, path);
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
    if (rc)
        return rc;
    if (canon && dl_golden_config_string(&c.config, "\n", canon, canon_len))
        return dl__api_fail(err, errlen, DL_EOVERFLOW, "config: canonical text longer than %zu bytes",
                            canon_len);
    if (out)
        *out = c.config;
    return 0;
}
