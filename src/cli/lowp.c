/* dropless lowp: golden files of the block-scaled grouped GEMM families
 * (dropless/qgolden.h, doc/lowprecision.md). */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dropless.h"
#include "cli.h"

static int lowp_usage(FILE *f, int rc)
{
    fprintf(f, "usage: dropless lowp FAMILY -o PATH [--seed N] [--force]\n"
               "       dropless lowp --list\n"
               "writes the golden file of a low-precision GEMM family (doc/lowprecision.md)\n");
    return rc;
}

int dl_cli_lowp(int argc, char **argv)
{
    const char *family = NULL, *out = NULL;
    uint64_t seed = 25;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0) {
            for (int f = 0; dl_qgolden_family(f); f++)
                printf("%s\n", dl_qgolden_family(f));
            return 0;
        } else if (strcmp(argv[i], "--help") == 0) {
            return lowp_usage(stdout, 0);
        } else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            char *end;
            errno = 0;
            seed = strtoull(argv[++i], &end, 10);
            if (errno || *end || !*argv[i] || argv[i][0] == '-') {
                fprintf(stderr, "dropless lowp: --seed %s: not a non-negative integer\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--force") == 0) {
            force = 1;
        } else if (argv[i][0] != '-' && !family) {
            family = argv[i];
        } else {
            fprintf(stderr, "dropless lowp: unknown or incomplete option %s\n", argv[i]);
            return lowp_usage(stderr, 2);
        }
    }
    if (!family || !out)
        return lowp_usage(stderr, 2);
    char err[512] = "";
    int rc = dl_qgolden_write(family, out, seed, force, err, sizeof err);
    if (rc) {
        fprintf(stderr, "dropless lowp: %s\n", err[0] ? err : dl_strerror(rc));
        return rc == DL_ENOTFOUND || rc == DL_EEXIST || rc == DL_EINVAL ? 2 : 1;
    }
    return 0;
}
