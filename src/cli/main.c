#include "config.h"
#include <stdio.h>
#include <string.h>
#include "dropless.h"
#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dropless <command> [options]\n"
            "commands:\n"
            "  version            print the version\n"
            "  help               this text\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return DL_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("dropless %s\n", DL_VERSION_STRING);
        return DL_EXIT_OK;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return DL_EXIT_OK;
    }
    fprintf(stderr, "dropless: unknown command '%s' (try 'dropless help')\n", cmd);
    return DL_EXIT_USAGE;
}
