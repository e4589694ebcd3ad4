/* The dropless command: a table of subcommands, each a thin layer over the
 * library. To add one, write `int dl_cli_NAME(int argc, char **argv)`
 * (argv[0] is the subcommand's name) and add a row to `commands`. */
#include "config.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DL_LEAK_CHECK 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define DL_LEAK_CHECK 1
#endif
#ifdef DL_LEAK_CHECK
#include <sanitizer/lsan_interface.h>
#endif
#include "dropless.h"
#include "cli.h"


static int cmd_version(int argc, char **argv);
static int cmd_help(int argc, char **argv);

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command_t;

static const command_t commands[] = {
    {"gen", dl_cli_gen, "write golden files (HDF5) for catalogue cases or a case file"},
    {"cases", dl_cli_cases, "list the case catalogue, one line per case"},
    {"info", dl_cli_info, "validate a golden file and print what it holds"},
    {"check", dl_cli_check, "check a backend's candidate file against a golden file"},
    {"run", dl_cli_run, "run backend plugins on a golden case and check them"},
    {"lowp", dl_cli_lowp, "write a low-precision (FP8/FP4) block-scaled GEMM golden file"},
    {"capacity", dl_cli_capacity, "what capacity-factor routing drops and pads, against dropless"},
    {"mutate", dl_cli_mutate, "write mutated candidates of a golden file (the runner's power)"},
    {"version", cmd_version, "print the version (--verbose: libraries and format too)"},
    {"help", cmd_help, "this text; 'dropless help COMMAND' for a command's options"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: dropless <command> [options]\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "exit status: 0 success, 1 failure (I/O, computation, not conformant), "
               "2 usage error or unreadable input\n");
}

static const command_t *find(const char *name)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

static int cmd_version(int argc, char **argv)
{
    int verbose = argc == 2 && (strcmp(argv[1], "--verbose") == 0 || strcmp(argv[1], "-v") == 0);
    if (argc > 1 && !verbose) {
        fprintf(stderr, "dropless version: unexpected argument '%s' (only --verbose)\n", argv[1]);
        return DL_EXIT_USAGE;
    }
    printf("dropless %s\n", DL_VERSION_STRING);
    if (verbose) {
        printf("golden format %s %d\n", DL_GOLDEN_FORMAT, DL_GOLDEN_FORMAT_VERSION);
        printf("HDF5 %s\n", dl_golden_hdf5_version());
    }
    return DL_EXIT_OK;
}

static int cmd_help(int argc, char **argv)
{
    if (argc > 2) {
        fprintf(stderr, "dropless help: one command at most, %d given\n", argc - 1);
        return DL_EXIT_USAGE;
    }
    if (argc > 1) {
        const command_t *c = find(argv[1]);
        if (!c || c->run == cmd_help) {
            fprintf(stderr, "dropless: unknown command '%s' (try 'dropless help')\n", argv[1]);
            return DL_EXIT_USAGE;
        }
        char *sub[] = {argv[1], "--help", NULL};
        return c->run(2, sub);
    }
    usage(stdout);
    return DL_EXIT_OK;
}

/* Every byte the command printed must have reached stdout: a full disk or
 * a closed pipe is a failure, not a success. The process then leaves with
 * _exit: HDF5 1.10.8's exit handler can crash, or print its error stack,
 * when a write failed (a full disk) or a damaged file was read, and every
 * file of ours is closed by now. */
static int finish(const char *cmd, int status)
{
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "dropless %s: cannot write to standard output: %s\n", cmd,
                errno ? strerror(errno) : "I/O error");
        if (status == DL_EXIT_OK)
            status = DL_EXIT_FAIL;
    }
    fflush(stderr);
    dl_golden_output_release(); /* the reservations no file replaced */
#ifdef DL_LEAK_CHECK
    __lsan_do_leak_check(); /* _exit skips LeakSanitizer's exit-time check */
#endif
    _exit(status);
}

int main(int argc, char **argv)
{
    dl_cli_omp_wait_policy(argv);
    if (argc < 2) {
        fprintf(stderr, "dropless: no command given (try 'dropless help')\n");
        return DL_EXIT_USAGE;
    }
    /* a closed pipe is a write error that finish() reports, not a silent
     * death by SIGPIPE */
    signal(SIGPIPE, SIG_IGN);
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0)
        cmd = "version";
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0)
        cmd = "help";
    const command_t *c = find(cmd);
    if (!c) {
        fprintf(stderr, "dropless: unknown command '%s' (try 'dropless help')\n", cmd);
        return DL_EXIT_USAGE;
    }
    dl_golden_hdf5_quiet();
    return finish(cmd, c->run(argc - 1, argv + 1));
}
