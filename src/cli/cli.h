/* The dropless command: one function per subcommand, each a thin layer
 * over the library. Exit codes: 0 ok/conformant, 1 not conformant, 2 usage
 * or unreadable input. */
#ifndef DL_CLI_H
#define DL_CLI_H
#define DL_EXIT_OK 0
#define DL_EXIT_FAIL 1
#define DL_EXIT_USAGE 2
#endif
