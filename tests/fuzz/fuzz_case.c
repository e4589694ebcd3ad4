/* libFuzzer harness for dl_case_parse_file, the key = value case-file
 * parser behind `dropless gen --config`: the input bytes become a case
 * file. Built only by `make fuzz`; doc/fuzzing.md. */
#include "config.h"
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dropless.h>
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > DL_GOLDEN_NAME_MAX)
        return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("._-", *s))
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = dl_fuzz_file("case", ".case", data, size);
    dl_case_t c;
    char err[512];
    err[0] = '\0';
    int rc = dl_case_parse_file(path, &c, err, sizeof err);
    if (rc < 0) {
        /* one line naming the file, never "FILE:0:" */
        char zero[110];
        snprintf(zero, sizeof zero, "%s:0:", path);
        if (strncmp(err, path, strlen(path)) || strchr(err, '\n') ||
            !strncmp(err, zero, strlen(zero)))
            abort();
        if (rc != DL_EFORMAT && rc != DL_EINVAL && rc != DL_EIO)
            abort();
    } else {
        /* what parses is a case the generator accepts */
        if (!name_ok(c.name) || dl_moe_config_validate(&c.config) != 0 ||
            dl_case_data_bytes(&c) < 0)
            abort();
        /* and its configuration, written back as case-file lines, parses
         * to the same configuration */
        char cfg[1024];
        if (dl_golden_config_string(&c.config, "\n", cfg, sizeof cfg) != 0)
            abort();
        char again[110];
        snprintf(again, sizeof again, "%s.again", path);
        FILE *g = fopen(again, "w");
        if (!g)
            abort();
        fprintf(g, "%s\n", cfg);
        fclose(g);
        dl_case_t d;
        if (dl_case_parse_file(again, &d, err, sizeof err) != 0)
            abort();
        const dl_moe_config_t *x = &c.config, *y = &d.config;
        if (x->tokens != y->tokens || x->hidden != y->hidden || x->ffn != y->ffn ||
            x->ffn_kind != y->ffn_kind || x->dtype != y->dtype ||
            x->route.experts != y->route.experts || x->route.top_k != y->route.top_k ||
            x->route.score_fn != y->route.score_fn || x->route.n_group != y->route.n_group ||
            x->route.topk_group != y->route.topk_group ||
            x->route.group_score != y->route.group_score ||
            (x->route.renormalize != 0) != (y->route.renormalize != 0) ||
            x->route.scaling != y->route.scaling || (x->route.has_bias != 0) != (y->route.has_bias != 0))
            abort();
        unlink(again);
    }
    unlink(path);
    return 0;
}
