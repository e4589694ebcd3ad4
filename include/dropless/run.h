/* dropless/run.h: the plugin executor behind `dropless run --backend`.
 * Loads a backend plugin (the ABI is dropless/backend.h), runs each stage
 * it implements on the golden inputs of that stage, in a forked child with
 * a time limit, twice, with poisoned outputs, and returns the outputs as a
 * candidate forward/backward pair plus per-stage execution diagnostics.
 * Part of the public API; include <dropless.h>. */
#ifndef DROPLESS_RUN_H
#define DROPLESS_RUN_H
#include "core.h"
#include "moe.h"
#include "values.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The stages of the plugin ABI, in execution order. */
typedef enum {
    DL_STAGE_ROUTER = 0,
    DL_STAGE_DISPATCH,
    DL_STAGE_PERMUTE,
    DL_STAGE_EXPERT_FORWARD,
    DL_STAGE_COMBINE,
    DL_STAGE_COMBINE_BACKWARD,
    DL_STAGE_EXPERT_BACKWARD,
    DL_STAGE_ROUTER_BACKWARD,
    DL_STAGE_INPUT_BACKWARD,
    DL_STAGE_COUNT
} dl_run_stage_t;

/* What happened when a stage was executed. */
typedef enum {
    DL_RUN_OK = 0,            /* ran twice, every element written, same bits */
    DL_RUN_NOT_IMPLEMENTED,   /* NULL in the backend's table */
    DL_RUN_SKIPPED,           /* not run: no golden backward, or the plugin never loaded */
    DL_RUN_CRASHED,           /* the child died of a signal or exited on its own */
    DL_RUN_TIMEOUT,           /* killed at the time limit */
    DL_RUN_ERROR_RETURN,      /* the stage function returned nonzero */
    DL_RUN_UNWRITTEN,         /* poison left in some output element */
    DL_RUN_NONDETERMINISTIC,  /* the two runs differ in some bit */
    DL_RUN_ABI_MISMATCH,      /* wrong abi_version or malformed table */
    DL_RUN_LOAD_FAILED        /* dlopen/dlsym failed, or the load crashed */
} dl_run_status_t;

/* Per-stage outcome. The status is the most severe finding. Failures
 * (crashed, timeout, error-return, abi-mismatch, load-failed) leave that
 * stage's candidate arrays NULL; unwritten and nondeterministic stages keep
 * the first run's arrays (poison included) so the checker can report the
 * elements themselves. */
typedef struct {
    dl_run_stage_t stage;
    dl_run_status_t status;
    char message[256];  /* one line, for the report; "" when there is nothing to say */
    double seconds;     /* wall time of the first call of the stage function */
    int64_t unwritten;  /* output elements left poisoned (first run, all outputs) */
    int64_t differing;  /* output elements whose bits differ between the runs */
} dl_run_diag_t;

typedef struct {
    double time_limit_s;  /* per call; <= 0 means DL_RUN_DEFAULT_TIME_LIMIT_S */
    int forward_only;     /* 1: skip the backward stages */
} dl_run_options_t;

#define DL_RUN_DEFAULT_TIME_LIMIT_S 60.0

/* What the plugin says about itself (empty strings if it never loaded). */
typedef struct {
    char name[128], version[128], compute_mode[64];
    int64_t abi_version;   /* as found in the table; -1 if none was read */
    unsigned implemented;  /* bit s set: stage s has a function */
} dl_run_backend_info_t;

typedef struct {
    dl_run_backend_info_t backend;
    int loaded;                        /* 1: the table loaded and passed the ABI check */
    dl_run_diag_t load;                /* the load itself (stage field unused) */
    dl_run_diag_t stage[DL_STAGE_COUNT];
    /* The candidate: arrays malloc'ed by the executor, NULL for outputs the
     * backend did not provide (stage not implemented, skipped or failed).
     * tie_margin and inv_perm are never provided (they are not outputs of
     * the ABI); stats stay zero. Free with dl_run_result_free. */
    dl_moe_forward_t fwd;
    dl_moe_backward_t bwd;
} dl_run_result_t;

/* Runs the plugin at `path` on the case described by c and in, feeding each
 * stage the golden inputs from gf (golden forward) and gb (golden backward;
 * may be NULL: the backward stages are then skipped). opt may be NULL for the
 * defaults. The executor never crashes or hangs on account of the plugin:
 * every plugin failure is a diagnostic in *r. A stage whose golden inputs
 * are missing (a NULL array in gf, gb or in) is skipped, with a message.
 * Returns 0 when *r is filled (also when the plugin failed), DL_EINVAL or
 * DL_EOVERFLOW for a bad configuration or NULL arguments, DL_ENOMEM, or
 * DL_EPLUGIN when no child process could be started. Free *r with
 * dl_run_result_free, also after an error. */
DL_EXTERN int dl_run_backend(const char *path, const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                             const dl_moe_forward_t *gf, const dl_moe_backward_t *gb,
                             const dl_run_options_t *opt, dl_run_result_t *r);

/* 1 when the backend ABI can express configuration c (a SwiGLU or plain
 * FFN without expert biases), else 0 with the reason in why (n bytes; why
 * may be NULL): dl_run_backend refuses the others with DL_EINVAL. */
DL_EXTERN int dl_run_expressible(const dl_moe_config_t *c, char *why, size_t n);

DL_EXTERN void dl_run_result_free(dl_run_result_t *r);

/* "router", "dispatch", ... (the ABI's field names); NULL if out of range. */
DL_EXTERN const char *dl_run_stage_name(dl_run_stage_t s);
/* "ok", "not-implemented", "skipped", "crashed", "timeout", "error-return",
 * "unwritten", "nondeterministic", "abi-mismatch", "load-failed"; NULL if
 * out of range. */
DL_EXTERN const char *dl_run_status_name(dl_run_status_t s);
/* 1 for the statuses that fail a run (crashed, timeout, error-return,
 * unwritten, abi-mismatch, load-failed), else 0; nondeterministic is a
 * warning. */
DL_EXTERN int dl_run_status_is_failure(dl_run_status_t s);

/* The values stage s produces, a set (DL_VALUE_BIT(v)) for
 * dl_check_run_isolated; 0 if s is out of range. */
DL_EXTERN dl_valueset_t dl_run_stage_values(dl_run_stage_t s);

#ifdef __cplusplus
}
#endif
#endif
