/* The dropless command: one function per subcommand, each a thin layer
 * over the library. Exit codes: 0 ok/conformant, 1 not conformant, 2 usage
 * or unreadable input. */
#ifndef DL_CLI_H
#define DL_CLI_H
#define DL_EXIT_OK 0
#define DL_EXIT_FAIL 1
#define DL_EXIT_USAGE 2

/* The subcommands; argv[0] is the subcommand's name. */
int dl_cli_gen(int argc, char **argv);   /* gen.c */
int dl_cli_cases(int argc, char **argv); /* gen.c */
int dl_cli_info(int argc, char **argv);  /* gen.c */
int dl_cli_layout(int argc, char **argv); /* layout.c: info --layout */
int dl_cli_check(int argc, char **argv); /* check.c */
int dl_cli_run(int argc, char **argv);   /* check.c */
int dl_cli_capacity(int argc, char **argv); /* capacity.c */
int dl_cli_lowp(int argc, char **argv);     /* lowp.c */
int dl_cli_mutate(int argc, char **argv); /* mutate.c */
/* The time limit for parsing an unsealed file in a child process
 * (dl_golden_load_isolated): DROPLESS_PREFLIGHT_SECONDS, else 120 s. */
unsigned dl_cli_preflight_seconds(void); /* check.c */
/* gen_mpi.c: `mpirun -np R dropless gen`. The number of processes the
 * launcher started (1 outside one); begin (MPI_Init; this rank into *rank;
 * built without MPI: refuses, exit status 2), one call per case (every
 * rank: rank 0 writes path, or with slice_dir each rank its slice
 * slice_dir/NAME.experts-A-B.h5; the file this rank wrote, or rank 0's,
 * into written), end (MPI_Finalize). 0 or an exit status. */
int dl_cli_mpi_size(void);
int dl_cli_gen_mpi_begin(int *rank);
int dl_cli_gen_mpi(const dl_case_t *c, const char *path, const char *slice_dir,
                   const dl_golden_gen_opts_t *go, char *written, size_t n);
void dl_cli_gen_mpi_end(void);
/* The worst of every rank's status (before the first case), on every rank. */
int dl_cli_gen_mpi_agree(int status);
/* progress.c: the progress bar of gen and check on stderr (the caller
 * decides whether to show one: a terminal, no -q). init starts the clock;
 * cb is a dl_golden_progress_fn / dl_check_options_t.progress (ctx = the
 * bar; nothing is drawn in the first 2 s, DROPLESS_PROGRESS_AFTER_S); end
 * ends the line when a bar was drawn. */
typedef struct {
    const char *name;
    int shown;
    int last_pct;
    const char *phase;
    double t0;
    double after; /* seconds before the first redraw */
    double total; /* elements of the whole run (check): the bar adds the
                   * elements done and their rate; 0: none (init) */
} dl_cli_progress_t;
void dl_cli_progress_init(dl_cli_progress_t *p, const char *name);
/* Unless OMP_WAIT_POLICY is set: sets it to passive and executes the
 * command again with argv (src/cli/omp_env.c says why); returns only when
 * it does not. */
void dl_cli_omp_wait_policy(char **argv);
void dl_cli_progress_cb(void *ctx, const char *phase, double done);
void dl_cli_progress_end(dl_cli_progress_t *p);
#endif
