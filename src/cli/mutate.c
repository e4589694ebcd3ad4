/* dropless mutate GOLDEN -o DIR: mutated candidates of a golden file, for
 * measuring what the runner catches (dl_mutate_write, doc/power.md). */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dropless.h"
#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dropless mutate GOLDEN.h5 -o DIR [--force] [--mutations LIST] [--stages LIST]\n"
            "                       [--modes LIST] [--gain-p P] [--seed S]\n"
            "  writes one candidate per mutation x stage x mode into DIR (MUTATION.STAGE.MODE.h5,\n"
            "  attributes mutation, mutation_stage, mutation_mode, mutation_detail, expect) and\n"
            "  DIR/manifest.tsv; an existing DIR is replaced only with --force\n"
            "  mutations:");
    for (int m = 0; m < DL_MUTATION_COUNT; m++)
        fprintf(f, " %s", dl_mutation_name((dl_mutation_t)m));
    fprintf(f, "\n  modes:");
    for (int m = 0; m < DL_MUTATE_MODE_COUNT; m++)
        fprintf(f, " %s", dl_mutate_mode_name((dl_mutate_mode_t)m));
    fprintf(f, "\n  --gain-p P: the gain is 1 + 2^-P (default: the case type's precision - 4)\n"
               "  --seed S: picks the row, element, slot, boundary and experts (default 0)\n");
}

static int parse_args(int argc, char **argv, dl_mutate_opts_t *o, const char **golden,
                      const char **dir)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char err[512] = "";
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        }
        if (!strcmp(a, "--force")) {
            o->force = 1;
            continue;
        }
        if (a[0] != '-') {
            if (*golden) {
                fprintf(stderr, "dropless mutate: one golden file only ('%s' and '%s')\n", *golden, a);
                return DL_EXIT_USAGE;
            }
            *golden = a;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "dropless mutate: %s needs a value\n", a);
            return DL_EXIT_USAGE;
        }
        char *v = argv[++i];
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            *dir = v;
            continue;
        }
        /* --gain-p is option gain_p, --seed seed, and so on */
        char key[32];
        snprintf(key, sizeof key, "%s", a + (a[1] == '-' ? 2 : 1));
        for (char *p = key; *p; p++)
            *p = *p == '-' ? '_' : *p;
        if (dl_mutate_opts_set(o, key, v, err, sizeof err)) {
            fprintf(stderr, "dropless mutate: %s\n", err);
            return DL_EXIT_USAGE;
        }
    }
    if (!*golden || !*dir) {
        fprintf(stderr, "dropless mutate: %s\n", !*golden ? "no golden file given" : "no -o DIR given");
        return DL_EXIT_USAGE;
    }
    return 0;
}

int dl_cli_mutate(int argc, char **argv)
{
    dl_mutate_opts_t o = {0};
    const char *golden = NULL, *dir = NULL;
    int rc = parse_args(argc, argv, &o, &golden, &dir);
    if (rc)
        return rc < 0 ? DL_EXIT_OK : rc;
    char err[1024] = "";
    dl_golden_file_t g;
    if ((rc = dl_golden_load_isolated(golden, NULL, dl_cli_preflight_seconds(), &g, err, sizeof err))) {
        fprintf(stderr, "dropless mutate: %s\n", err);
        return DL_EXIT_USAGE;
    }
    if (!g.has_inputs || !g.has_forward) {
        fprintf(stderr, "dropless mutate: %s: not a golden file (no /inputs or /forward)\n", golden);
        dl_golden_free(&g);
        return DL_EXIT_USAGE;
    }
    int n = 0;
    rc = dl_mutate_write(&g, dir, &o, &n, NULL, err, sizeof err);
    dl_golden_free(&g);
    if (rc) {
        fprintf(stderr, "dropless mutate: %s\n", *err ? err : dl_strerror(rc));
        return rc == DL_EEXIST || rc == DL_EINVAL ? DL_EXIT_USAGE : DL_EXIT_FAIL;
    }
    printf("%d mutated candidates in %s (manifest.tsv lists them)\n", n, dir);
    return DL_EXIT_OK;
}
