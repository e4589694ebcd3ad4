/* run_priv.h: the plugin executor's internals (src/run/): the tensors of
 * an ABI stage, the control block shared with a child, the child runner.
 * Not installed. */
#ifndef DL_RUN_PRIV_H
#define DL_RUN_PRIV_H

#include <sys/types.h>
#include "stages/stages_priv.h"
#include "dropless/backend.h"
#include "dropless/run.h"

typedef enum { K_F32, K_I32, K_I64 } kind_t;

#define MAX_IN 10
#define MAX_OUT 7

/* One tensor of a stage. Absent tensors (no bias, plain FFN) reach the
 * plugin as NULL pointers. Outputs say where the candidate array goes. */
typedef struct {
    const char *name;
    kind_t kind;
    int present;
    int ndim;
    int64_t shape[3];
    const void *src; /* input: the golden array */
    void **dst;      /* output: the candidate slot */
} tens_t;

typedef struct {
    int nin, nout;
    tens_t in[MAX_IN], out[MAX_OUT];
} stage_io_t;

static inline size_t dl__run_kind_size(kind_t k)
{
    return k == K_I64 ? 8 : 4;
}

static inline int64_t dl__run_count(const tens_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* ABI (abi.c): the tensors of stage s, inputs and outputs each in the field
 * order of the stage's args struct in backend.h, taken from the golden
 * inputs and values (gb may be NULL) with outputs into r's structs. */
void dl__run_stage_io(dl_run_stage_t s, const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                      const dl_moe_forward_t *gf, const dl_moe_backward_t *gb,
                      dl_run_result_t *r, stage_io_t *io);
int dl__run_stage_is_backward(dl_run_stage_t s);
/* 1 if the plugin's table has stage s. */
int dl__run_stage_present(const dl_backend_t *b, dl_run_stage_t s);
/* Calls stage s of the plugin with I[] and O[] in args-struct order. */
int dl__run_call_stage(const dl_backend_t *b, dl_run_stage_t s, const dl_backend_config_t *cfg,
                       DLTensor *const *I, DLTensor *const *O);

/* The sandbox (sandbox.c). */
/* Shared between the executor and one child: what the child got to. */
enum { PHASE_START = 0, PHASE_LOADED, PHASE_CALLING, PHASE_RETURNED };
enum { CHILD_LOAD_FAILED = 101, CHILD_ABI = 102, CHILD_NOMEM = 103 };

typedef struct {
    volatile int phase;
    volatile int rc;           /* the stage function's return value */
    volatile double seconds;   /* wall time of the call */
    char msg[256];             /* why the child gave up, if it did */
    int64_t abi_version;
    unsigned implemented;
    char name[128], version[128], compute_mode[64];
} ctrl_t;


#define ALIGN 256

static inline size_t dl__run_round_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

typedef struct {
    const char *path;
    dl_backend_config_t cfg;
    pid_t parent;
} job_t;


typedef enum { CH_OK, CH_CRASHED, CH_TIMEOUT, CH_LOAD_FAILED, CH_ABI, CH_NOMEM } child_out_t;

/* Forks a child for stage (or, stage < 0, a load probe), waits at most
 * limit seconds, and classifies the outcome; *why gets a message. 0, or
 * DL_EPLUGIN when no child could be started. */
int dl__run_child(const job_t *job, ctrl_t *ctl, int stage, const stage_io_t *io,
                  unsigned char *shared, const size_t *out_off, double limit,
                  child_out_t *res, char *why, size_t whylen);

#endif
