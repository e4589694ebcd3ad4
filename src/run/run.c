/* The plugin executor: runs a backend's stages on golden inputs, each call
 * in a forked child with poisoned shared output buffers and a time limit,
 * twice, and turns whatever happened into diagnostics. Nothing the plugin
 * does may crash or hang the caller, so the plugin is only ever loaded in
 * children. */
#include "config.h"
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#include <dlpack/dlpack.h>
#include "dropless/backend.h"
#include "stages/stages_priv.h"
#include "dropless/check.h"
#include "dropless/run.h"

/* The backend enums mirror the library's, so a config converts by value. */
_Static_assert((int)DL_BACKEND_FP32 == (int)DL_F32 && (int)DL_BACKEND_BF16 == (int)DL_BF16 &&
                   (int)DL_BACKEND_FP16 == (int)DL_F16,
               "backend dtype enum out of sync");
_Static_assert((int)DL_BACKEND_SWIGLU == (int)DL_FFN_SWIGLU &&
                   (int)DL_BACKEND_PLAIN == (int)DL_FFN_PLAIN,
               "backend ffn enum out of sync");
_Static_assert((int)DL_BACKEND_SOFTMAX == (int)DL_SCORE_SOFTMAX &&
                   (int)DL_BACKEND_SIGMOID == (int)DL_SCORE_SIGMOID,
               "backend score enum out of sync");
_Static_assert((int)DL_BACKEND_GROUP_MAX == (int)DL_GROUP_MAX &&
                   (int)DL_BACKEND_GROUP_TOP2_SUM == (int)DL_GROUP_TOP2_SUM &&
                   (int)DL_BACKEND_GROUP_TOPK_SUM == (int)DL_GROUP_TOPK_SUM,
               "backend group-score enum out of sync");

static const char *const stage_names[DL_STAGE_COUNT] = {
    "router", "dispatch", "permute", "expert_forward", "combine",
    "combine_backward", "expert_backward", "router_backward", "input_backward"};

static const char *const status_names[] = {
    "ok", "not-implemented", "skipped", "crashed", "timeout", "error-return",
    "unwritten", "nondeterministic", "abi-mismatch", "load-failed"};

const char *dl_run_stage_name(dl_run_stage_t s)
{
    return (unsigned)s < DL_STAGE_COUNT ? stage_names[s] : NULL;
}

const char *dl_run_status_name(dl_run_status_t s)
{
    return (unsigned)s < sizeof status_names / sizeof *status_names ? status_names[s] : NULL;
}

int dl_run_status_is_failure(dl_run_status_t s)
{
    switch (s) {
    case DL_RUN_CRASHED:
    case DL_RUN_TIMEOUT:
    case DL_RUN_ERROR_RETURN:
    case DL_RUN_UNWRITTEN:
    case DL_RUN_ABI_MISMATCH:
    case DL_RUN_LOAD_FAILED:
        return 1;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------ stage I/O */

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
    const void *src;   /* input: the golden array */
    float **f32_dst;   /* output: the candidate slot, by kind */
    int32_t **i32_dst;
    int64_t **i64_dst;
} tens_t;

typedef struct {
    int nin, nout;
    tens_t in[MAX_IN], out[MAX_OUT];
} stage_io_t;

static size_t kind_size(kind_t k)
{
    return k == K_I64 ? 8 : 4;
}

static int64_t tens_count(const tens_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

static void add_in(stage_io_t *io, const char *name, kind_t k, int present, const void *src,
                   int ndim, int64_t a, int64_t b, int64_t c)
{
    tens_t *t = &io->in[io->nin++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->kind = k;
    t->present = present;
    t->src = src;
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
}

static tens_t *add_out(stage_io_t *io, const char *name, kind_t k, int present, int ndim,
                       int64_t a, int64_t b, int64_t c)
{
    tens_t *t = &io->out[io->nout++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->kind = k;
    t->present = present;
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
    return t;
}

#define OUT_F32(io, name, pres, slot, nd, a, b, c) (add_out(io, name, K_F32, pres, nd, a, b, c)->f32_dst = (slot))
#define OUT_I32(io, name, pres, slot, nd, a, b, c) (add_out(io, name, K_I32, pres, nd, a, b, c)->i32_dst = (slot))
#define OUT_I64(io, name, pres, slot, nd, a, b, c) (add_out(io, name, K_I64, pres, nd, a, b, c)->i64_dst = (slot))

/* The tensors of stage s, inputs and outputs each in the field order of
 * the stage's args struct in backend.h (call_stage relies on it). */
static void stage_io(dl_run_stage_t s, const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                     const dl_moe_forward_t *gf, const dl_moe_backward_t *gb,
                     dl_run_result_t *r, stage_io_t *io)
{
    const int64_t T = c->tokens, d = c->hidden, f = c->ffn, E = c->route.experts,
                  k = c->route.top_k, M = T * k;
    const int sw = c->ffn_kind == DL_FFN_SWIGLU, bias = c->route.has_bias != 0;
    dl_moe_forward_t *cf = &r->fwd;
    dl_moe_backward_t *cb = &r->bwd;
    static const dl_moe_backward_t none; /* stands in for a missing golden backward */
    if (!gb)
        gb = &none;
    memset(io, 0, sizeof *io);
    switch (s) {
    case DL_STAGE_ROUTER:
        add_in(io, "x", K_F32, 1, in->x, 2, T, d, 0);
        add_in(io, "router_weight", K_F32, 1, in->router_weight, 2, d, E, 0);
        add_in(io, "expert_bias", K_F32, bias, in->expert_bias, 1, E, 0, 0);
        OUT_F32(io, "router_logits", 1, &cf->router_logits, 2, T, E, 0);
        OUT_F32(io, "router_scores", 1, &cf->router_scores, 2, T, E, 0);
        OUT_I32(io, "topk_ids", 1, &cf->topk_ids, 2, T, k, 0);
        OUT_F32(io, "topk_weights", 1, &cf->topk_weights, 2, T, k, 0);
        break;
    case DL_STAGE_DISPATCH:
        add_in(io, "topk_ids", K_I32, 1, gf->topk_ids, 2, T, k, 0);
        OUT_I32(io, "sort_perm", 1, &cf->sort_perm, 1, M, 0, 0);
        OUT_I64(io, "group_sizes", 1, &cf->group_sizes, 1, E, 0, 0);
        OUT_I64(io, "group_offsets", 1, &cf->group_offsets, 1, E + 1, 0, 0);
        break;
    case DL_STAGE_PERMUTE:
        add_in(io, "x", K_F32, 1, in->x, 2, T, d, 0);
        add_in(io, "sort_perm", K_I32, 1, gf->sort_perm, 1, M, 0, 0);
        OUT_F32(io, "x_sorted", 1, &cf->x_sorted, 2, M, d, 0);
        break;
    case DL_STAGE_EXPERT_FORWARD:
        add_in(io, "x_sorted", K_F32, 1, gf->x_sorted, 2, M, d, 0);
        add_in(io, "group_sizes", K_I64, 1, gf->group_sizes, 1, E, 0, 0);
        add_in(io, "group_offsets", K_I64, 1, gf->group_offsets, 1, E + 1, 0, 0);
        add_in(io, "w_gate", K_F32, sw, in->w_gate, 3, E, d, f);
        add_in(io, "w_up", K_F32, sw, in->w_up, 3, E, d, f);
        add_in(io, "w_down", K_F32, 1, in->w_down, 3, E, f, d);
        OUT_F32(io, "h_gate", sw, &cf->h_gate, 2, M, f, 0);
        OUT_F32(io, "h_up", sw, &cf->h_up, 2, M, f, 0);
        OUT_F32(io, "h_act", sw, &cf->h_act, 2, M, f, 0);
        OUT_F32(io, "y_sorted", 1, &cf->y_sorted, 2, M, d, 0);
        break;
    case DL_STAGE_COMBINE:
        add_in(io, "y_sorted", K_F32, 1, gf->y_sorted, 2, M, d, 0);
        add_in(io, "topk_weights", K_F32, 1, gf->topk_weights, 2, T, k, 0);
        add_in(io, "topk_ids", K_I32, 1, gf->topk_ids, 2, T, k, 0);
        add_in(io, "sort_perm", K_I32, 1, gf->sort_perm, 1, M, 0, 0);
        OUT_F32(io, "out", 1, &cf->out, 2, T, d, 0);
        break;
    case DL_STAGE_COMBINE_BACKWARD:
        add_in(io, "d_out", K_F32, 1, in->d_out, 2, T, d, 0);
        add_in(io, "y_sorted", K_F32, 1, gf->y_sorted, 2, M, d, 0);
        add_in(io, "topk_weights", K_F32, 1, gf->topk_weights, 2, T, k, 0);
        add_in(io, "topk_ids", K_I32, 1, gf->topk_ids, 2, T, k, 0);
        add_in(io, "sort_perm", K_I32, 1, gf->sort_perm, 1, M, 0, 0);
        OUT_F32(io, "d_topk_weights", 1, &cb->d_topk_weights, 2, T, k, 0);
        OUT_F32(io, "d_y_sorted", 1, &cb->d_y_sorted, 2, M, d, 0);
        break;
    case DL_STAGE_EXPERT_BACKWARD:
        add_in(io, "d_y_sorted", K_F32, 1, gb->d_y_sorted, 2, M, d, 0);
        add_in(io, "x_sorted", K_F32, 1, gf->x_sorted, 2, M, d, 0);
        add_in(io, "h_gate", K_F32, sw, gf->h_gate, 2, M, f, 0);
        add_in(io, "h_up", K_F32, sw, gf->h_up, 2, M, f, 0);
        add_in(io, "h_act", K_F32, sw, gf->h_act, 2, M, f, 0);
        add_in(io, "group_sizes", K_I64, 1, gf->group_sizes, 1, E, 0, 0);
        add_in(io, "group_offsets", K_I64, 1, gf->group_offsets, 1, E + 1, 0, 0);
        add_in(io, "w_gate", K_F32, sw, in->w_gate, 3, E, d, f);
        add_in(io, "w_up", K_F32, sw, in->w_up, 3, E, d, f);
        add_in(io, "w_down", K_F32, 1, in->w_down, 3, E, f, d);
        OUT_F32(io, "d_h_act", sw, &cb->d_h_act, 2, M, f, 0);
        OUT_F32(io, "d_w_down", 1, &cb->d_w_down, 3, E, f, d);
        OUT_F32(io, "d_h_gate", sw, &cb->d_h_gate, 2, M, f, 0);
        OUT_F32(io, "d_h_up", sw, &cb->d_h_up, 2, M, f, 0);
        OUT_F32(io, "d_x_sorted", 1, &cb->d_x_sorted, 2, M, d, 0);
        OUT_F32(io, "d_w_gate", sw, &cb->d_w_gate, 3, E, d, f);
        OUT_F32(io, "d_w_up", sw, &cb->d_w_up, 3, E, d, f);
        break;
    case DL_STAGE_ROUTER_BACKWARD:
        add_in(io, "d_topk_weights", K_F32, 1, gb->d_topk_weights, 2, T, k, 0);
        add_in(io, "router_logits", K_F32, 1, gf->router_logits, 2, T, E, 0);
        add_in(io, "router_scores", K_F32, 1, gf->router_scores, 2, T, E, 0);
        add_in(io, "topk_ids", K_I32, 1, gf->topk_ids, 2, T, k, 0);
        add_in(io, "x", K_F32, 1, in->x, 2, T, d, 0);
        add_in(io, "router_weight", K_F32, 1, in->router_weight, 2, d, E, 0);
        OUT_F32(io, "d_router_scores", 1, &cb->d_router_scores, 2, T, E, 0);
        OUT_F32(io, "d_router_logits", 1, &cb->d_router_logits, 2, T, E, 0);
        OUT_F32(io, "d_router_weight", 1, &cb->d_router_weight, 2, d, E, 0);
        break;
    case DL_STAGE_INPUT_BACKWARD:
        add_in(io, "d_x_sorted", K_F32, 1, gb->d_x_sorted, 2, M, d, 0);
        add_in(io, "sort_perm", K_I32, 1, gf->sort_perm, 1, M, 0, 0);
        add_in(io, "topk_ids", K_I32, 1, gf->topk_ids, 2, T, k, 0);
        add_in(io, "d_router_logits", K_F32, 1, gb->d_router_logits, 2, T, E, 0);
        add_in(io, "router_weight", K_F32, 1, in->router_weight, 2, d, E, 0);
        OUT_F32(io, "d_x", 1, &cb->d_x, 2, T, d, 0);
        break;
    default:
        break;
    }
}

static int stage_is_backward(dl_run_stage_t s)
{
    return s >= DL_STAGE_COMBINE_BACKWARD;
}

/* --------------------------------------------------------- the children */

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

static size_t round_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

/* Bounded copy of a string the plugin owns, which may be NULL. */
static void copy_str(char *dst, size_t cap, const char *src)
{
    if (!src)
        src = "";
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = 0;
}

static int stage_present(const dl_backend_t *b, dl_run_stage_t s)
{
    switch (s) {
    case DL_STAGE_ROUTER: return b->router != NULL;
    case DL_STAGE_DISPATCH: return b->dispatch != NULL;
    case DL_STAGE_PERMUTE: return b->permute != NULL;
    case DL_STAGE_EXPERT_FORWARD: return b->expert_forward != NULL;
    case DL_STAGE_COMBINE: return b->combine != NULL;
    case DL_STAGE_COMBINE_BACKWARD: return b->combine_backward != NULL;
    case DL_STAGE_EXPERT_BACKWARD: return b->expert_backward != NULL;
    case DL_STAGE_ROUTER_BACKWARD: return b->router_backward != NULL;
    case DL_STAGE_INPUT_BACKWARD: return b->input_backward != NULL;
    default: return 0;
    }
}

static int call_stage(const dl_backend_t *b, dl_run_stage_t s, const dl_backend_config_t *cfg,
                      DLTensor *const *I, DLTensor *const *O)
{
    switch (s) {
    case DL_STAGE_ROUTER: {
        dl_backend_router_args_t a = {I[0], I[1], I[2], O[0], O[1], O[2], O[3]};
        return b->router(cfg, &a);
    }
    case DL_STAGE_DISPATCH: {
        dl_backend_dispatch_args_t a = {I[0], O[0], O[1], O[2]};
        return b->dispatch(cfg, &a);
    }
    case DL_STAGE_PERMUTE: {
        dl_backend_permute_args_t a = {I[0], I[1], O[0]};
        return b->permute(cfg, &a);
    }
    case DL_STAGE_EXPERT_FORWARD: {
        dl_backend_expert_forward_args_t a = {I[0], I[1], I[2], I[3], I[4], I[5],
                                              O[0], O[1], O[2], O[3]};
        return b->expert_forward(cfg, &a);
    }
    case DL_STAGE_COMBINE: {
        dl_backend_combine_args_t a = {I[0], I[1], I[2], I[3], O[0]};
        return b->combine(cfg, &a);
    }
    case DL_STAGE_COMBINE_BACKWARD: {
        dl_backend_combine_backward_args_t a = {I[0], I[1], I[2], I[3], I[4], O[0], O[1]};
        return b->combine_backward(cfg, &a);
    }
    case DL_STAGE_EXPERT_BACKWARD: {
        dl_backend_expert_backward_args_t a = {I[0], I[1], I[2], I[3], I[4], I[5], I[6],
                                               I[7], I[8], I[9], O[0], O[1], O[2], O[3],
                                               O[4], O[5], O[6]};
        return b->expert_backward(cfg, &a);
    }
    case DL_STAGE_ROUTER_BACKWARD: {
        dl_backend_router_backward_args_t a = {I[0], I[1], I[2], I[3], I[4], I[5],
                                               O[0], O[1], O[2]};
        return b->router_backward(cfg, &a);
    }
    case DL_STAGE_INPUT_BACKWARD: {
        dl_backend_input_backward_args_t a = {I[0], I[1], I[2], I[3], I[4], O[0]};
        return b->input_backward(cfg, &a);
    }
    default:
        return -1;
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Read-only input ranges, for naming the input a plugin wrote into. */
static struct {
    const char *name;
    uintptr_t lo, hi;
} g_ro[MAX_IN];
static int g_nro;
static ctrl_t *g_ctrl;

static void child_segv(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < g_nro; i++) {
        if (a >= g_ro[i].lo && a < g_ro[i].hi) {
            /* async-signal-safe: plain stores only */
            static const char pre[] = "wrote into read-only input tensor ";
            size_t n = 0;
            for (const char *p = pre; *p && n < sizeof g_ctrl->msg - 1; p++)
                g_ctrl->msg[n++] = *p;
            for (const char *p = g_ro[i].name; *p && n < sizeof g_ctrl->msg - 1; p++)
                g_ctrl->msg[n++] = *p;
            g_ctrl->msg[n] = 0;
            break;
        }
    }
    /* SA_RESETHAND restored the default action, and the signal is blocked
     * until the handler returns: then the child dies of it, as the
     * executor reports (a raise() by the plugin would otherwise resume). */
    raise(sig);
}

static void child_msg(ctrl_t *ctl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctl->msg, sizeof ctl->msg, fmt, ap);
    va_end(ap);
}

static void child_exit(int code)
{
    fflush(NULL);
    _exit(code);
}

/* Loads the plugin and checks its table; on failure exits the child. */
static const dl_backend_t *child_load(const char *path, ctrl_t *ctl)
{
    /* a name without a slash would go through dlopen's library search path:
     * the plugin is the file named, relative to the working directory */
    char rel[4096];
    if (!strchr(path, '/')) {
        if ((size_t)snprintf(rel, sizeof rel, "./%s", path) >= sizeof rel) {
            child_msg(ctl, "the plugin path is too long");
            child_exit(CHILD_LOAD_FAILED);
        }
        path = rel;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        child_msg(ctl, "dlopen: %s", e ? e : "unknown error");
        child_exit(CHILD_LOAD_FAILED);
    }
    dlerror();
    void *sym = dlsym(h, DL_BACKEND_SYMBOL);
    if (!sym) {
        child_msg(ctl, "the plugin exports no symbol %s", DL_BACKEND_SYMBOL);
        child_exit(CHILD_LOAD_FAILED);
    }
    dl_backend_entry_t entry;
    memcpy(&entry, &sym, sizeof entry); /* POSIX: dlsym results convert to function pointers */
    const dl_backend_t *b = entry();
    if (!b) {
        child_msg(ctl, "%s() returned NULL", DL_BACKEND_SYMBOL);
        child_exit(CHILD_ABI);
    }
    ctl->abi_version = b->abi_version;
    if (b->abi_version != DL_BACKEND_ABI_VERSION) {
        child_msg(ctl, "plugin ABI version %lu, runner ABI version %d",
                  (unsigned long)b->abi_version, DL_BACKEND_ABI_VERSION);
        child_exit(CHILD_ABI);
    }
    copy_str(ctl->name, sizeof ctl->name, b->name);
    copy_str(ctl->version, sizeof ctl->version, b->version);
    copy_str(ctl->compute_mode, sizeof ctl->compute_mode, b->compute_mode);
    unsigned mask = 0;
    for (int s = 0; s < DL_STAGE_COUNT; s++)
        if (stage_present(b, (dl_run_stage_t)s))
            mask |= 1u << s;
    ctl->implemented = mask;
    ctl->phase = PHASE_LOADED;
    return b;
}

typedef struct {
    const char *path;
    dl_backend_config_t cfg;
    pid_t parent;
} job_t;

/* The child: load, build tensors (inputs copied to aligned read-only
 * pages, outputs in the shared buffer), call, report. Never returns. */
static void child_main(const job_t *job, ctrl_t *ctl, int stage, const stage_io_t *io,
                       unsigned char *shared, const size_t *out_off)
{
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    if (getppid() != job->parent)
        _exit(CHILD_LOAD_FAILED); /* the executor is already gone */
    sigset_t none; /* the caller's blocked signals are not the plugin's */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
#ifdef _OPENMP
    /* GNU libgomp cannot start threads in a fork of a process whose thread
     * pool is running: a parallel region would hang. One thread is safe. */
    omp_set_num_threads(1);
#endif
    const dl_backend_t *b = child_load(job->path, ctl);
    if (stage < 0)
        child_exit(0);

    DLTensor tin[MAX_IN], tout[MAX_OUT];
    DLTensor *I[MAX_IN] = {0}, *O[MAX_OUT] = {0};
    int64_t shapes[MAX_IN + MAX_OUT][3];
    g_ctrl = ctl;
    g_nro = 0;
    for (int i = 0; i < io->nin; i++) {
        const tens_t *t = &io->in[i];
        if (!t->present)
            continue;
        size_t bytes = (size_t)tens_count(t) * kind_size(t->kind);
        size_t len = round_up(bytes ? bytes : 1, (size_t)sysconf(_SC_PAGESIZE));
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            child_msg(ctl, "out of memory copying input %s", t->name);
            child_exit(CHILD_NOMEM);
        }
        if (bytes)
            memcpy(p, t->src, bytes);
        mprotect(p, len, PROT_READ);
        g_ro[g_nro].name = t->name;
        g_ro[g_nro].lo = (uintptr_t)p;
        g_ro[g_nro].hi = (uintptr_t)p + len;
        g_nro++;
        memcpy(shapes[i], t->shape, sizeof shapes[i]);
        tin[i] = (DLTensor){p, {kDLCPU, 0}, t->ndim,
                            {(uint8_t)(t->kind == K_F32 ? kDLFloat : kDLInt),
                             (uint8_t)(8 * kind_size(t->kind)), 1},
                            shapes[i], NULL, 0};
        I[i] = &tin[i];
    }
    for (int o = 0; o < io->nout; o++) {
        const tens_t *t = &io->out[o];
        if (!t->present)
            continue;
        memcpy(shapes[MAX_IN + o], t->shape, sizeof shapes[0]);
        tout[o] = (DLTensor){shared + out_off[o], {kDLCPU, 0}, t->ndim,
                             {(uint8_t)(t->kind == K_F32 ? kDLFloat : kDLInt),
                              (uint8_t)(8 * kind_size(t->kind)), 1},
                             shapes[MAX_IN + o], NULL, 0};
        O[o] = &tout[o];
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = child_segv;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);

    ctl->phase = PHASE_CALLING;
    double t0 = now_s();
    int rc = call_stage(b, (dl_run_stage_t)stage, &job->cfg, I, O);
    ctl->seconds = now_s() - t0;
    ctl->rc = rc;
    ctl->phase = PHASE_RETURNED;
    child_exit(0);
}

typedef enum { CH_OK, CH_CRASHED, CH_TIMEOUT, CH_LOAD_FAILED, CH_ABI, CH_NOMEM } child_out_t;

/* Forks a child for stage (or, stage < 0, a load probe), waits at most
 * limit seconds, and classifies the outcome; *why gets a message. */
static int run_child(const job_t *job, ctrl_t *ctl, int stage, const stage_io_t *io,
                     unsigned char *shared, const size_t *out_off, double limit,
                     child_out_t *res, char *why, size_t whylen)
{
    memset(ctl, 0, sizeof *ctl);
    ctl->abi_version = -1;
    fflush(NULL); /* or the child's exit would write the caller's buffered output again */
    pid_t pid = fork();
    if (pid < 0)
        return DL_EPLUGIN;
    if (pid == 0)
        child_main(job, ctl, stage, io, shared, out_off);

    double t0 = now_s();
    long nap_ns = 20000;
    int st = 0, timed_out = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR) {
            /* SIGCHLD ignored by the caller: the child reaps itself */
            st = ctl->phase == PHASE_RETURNED || (stage < 0 && ctl->phase == PHASE_LOADED) ? 0 : -1;
            break;
        }
        if (now_s() - t0 > limit) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            timed_out = 1;
            break;
        }
        struct timespec ts = {0, nap_ns};
        nanosleep(&ts, NULL);
        if (nap_ns < 5000000)
            nap_ns *= 2;
    }

    why[0] = 0;
    if (timed_out) {
        *res = CH_TIMEOUT;
        snprintf(why, whylen, "killed after the time limit of %.3g s%s", limit,
                 ctl->phase < PHASE_CALLING ? " (before the stage was called)" : "");
        return 0;
    }
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
        (stage < 0 ? ctl->phase >= PHASE_LOADED : ctl->phase == PHASE_RETURNED)) {
        *res = CH_OK;
        return 0;
    }
    if (st != -1 && WIFEXITED(st) && ctl->phase == PHASE_START &&
        (WEXITSTATUS(st) == CHILD_LOAD_FAILED || WEXITSTATUS(st) == CHILD_ABI)) {
        *res = WEXITSTATUS(st) == CHILD_ABI ? CH_ABI : CH_LOAD_FAILED;
        snprintf(why, whylen, "%s", ctl->msg);
        return 0;
    }
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == CHILD_NOMEM && ctl->phase == PHASE_LOADED) {
        *res = CH_NOMEM;
        return 0;
    }
    const char *where = ctl->phase == PHASE_START ? "while loading the plugin"
                        : ctl->phase == PHASE_CALLING ? "during the call"
                                                      : "outside the call";
    *res = ctl->phase == PHASE_START ? CH_LOAD_FAILED : CH_CRASHED;
    if (st == -1)
        snprintf(why, whylen, "the child vanished %s", where);
    else if (WIFSIGNALED(st))
        snprintf(why, whylen, "killed by signal %d (%s) %s%s%.100s", WTERMSIG(st),
                 strsignal(WTERMSIG(st)), where, ctl->msg[0] ? ": " : "", ctl->msg);
    else
        snprintf(why, whylen, "the process exited with status %d %s", WEXITSTATUS(st), where);
    return 0;
}

/* ------------------------------------------------------------- executor */

static void diag_set(dl_run_diag_t *g, dl_run_status_t st, const char *fmt, ...)
{
    g->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->message, sizeof g->message, fmt, ap);
    va_end(ap);
}

/* Appends to a diagnostic's message, keeping it one bounded line. */
static void diag_append(dl_run_diag_t *g, const char *fmt, ...)
{
    size_t n = strlen(g->message);
    if (n + 1 >= sizeof g->message)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->message + n, sizeof g->message - n, fmt, ap);
    va_end(ap);
}

static void poison(unsigned char *p, const tens_t *t)
{
    int64_t n = tens_count(t);
    if (t->kind == K_F32) {
        uint32_t v = DL_BACKEND_POISON_F32_BITS;
        for (int64_t i = 0; i < n; i++)
            memcpy(p + 4 * i, &v, 4);
    } else if (t->kind == K_I32) {
        int32_t v = INT32_MIN;
        for (int64_t i = 0; i < n; i++)
            memcpy(p + 4 * i, &v, 4);
    } else {
        int64_t v = INT64_MIN;
        for (int64_t i = 0; i < n; i++)
            memcpy(p + 8 * i, &v, 8);
    }
}

static int64_t count_poison(const unsigned char *p, const tens_t *t)
{
    int64_t n = tens_count(t), left = 0;
    if (t->kind == K_F32) {
        for (int64_t i = 0; i < n; i++) {
            uint32_t v;
            memcpy(&v, p + 4 * i, 4);
            left += v == DL_BACKEND_POISON_F32_BITS;
        }
    } else if (t->kind == K_I32) {
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, p + 4 * i, 4);
            left += v == INT32_MIN;
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            left += v == INT64_MIN;
        }
    }
    return left;
}

static int64_t count_differing(const unsigned char *a, const unsigned char *b, const tens_t *t)
{
    int64_t n = tens_count(t), diff = 0;
    size_t w = kind_size(t->kind);
    for (int64_t i = 0; i < n; i++)
        diff += memcmp(a + (size_t)i * w, b + (size_t)i * w, w) != 0;
    return diff;
}

/* Frees and clears the candidate slot of an output. */
static void dst_slot_free(tens_t *t)
{
    if (t->kind == K_F32) {
        free(*t->f32_dst);
        *t->f32_dst = NULL;
    } else if (t->kind == K_I32) {
        free(*t->i32_dst);
        *t->i32_dst = NULL;
    } else {
        free(*t->i64_dst);
        *t->i64_dst = NULL;
    }
}

static void *dst_get(const tens_t *t)
{
    return t->kind == K_F32 ? (void *)*t->f32_dst
           : t->kind == K_I32 ? (void *)*t->i32_dst
                              : (void *)*t->i64_dst;
}

static int dst_alloc(tens_t *t, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        return DL_ENOMEM;
    if (t->kind == K_F32)
        *t->f32_dst = p;
    else if (t->kind == K_I32)
        *t->i32_dst = p;
    else
        *t->i64_dst = p;
    return 0;
}

static dl_run_status_t child_status(child_out_t o)
{
    switch (o) {
    case CH_TIMEOUT: return DL_RUN_TIMEOUT;
    case CH_ABI: return DL_RUN_ABI_MISMATCH;
    case CH_LOAD_FAILED: return DL_RUN_LOAD_FAILED;
    default: return DL_RUN_CRASHED;
    }
}

/* Runs one implemented stage twice and fills its diagnostic and outputs. */
static int exec_stage(const job_t *job, ctrl_t *ctl, dl_run_stage_t s, stage_io_t *io,
                      double limit, dl_run_diag_t *g)
{
    size_t off[MAX_OUT], total = 0;
    for (int o = 0; o < io->nout; o++) {
        off[o] = total;
        if (io->out[o].present)
            total += round_up((size_t)tens_count(&io->out[o]) * kind_size(io->out[o].kind), ALIGN);
    }
    size_t len = total ? total : ALIGN;
    unsigned char *shared = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED)
        return DL_ENOMEM;
    int rc = 0;
    char why[256];
    for (int run = 0; run < 2; run++) {
        for (int o = 0; o < io->nout; o++)
            if (io->out[o].present)
                poison(shared + off[o], &io->out[o]);
        child_out_t res;
        if ((rc = run_child(job, ctl, (int)s, io, shared, off, limit, &res, why, sizeof why)))
            goto done;
        if (res == CH_NOMEM) {
            rc = DL_ENOMEM;
            goto done;
        }
        const char *which = run ? " (second run)" : "";
        if (res != CH_OK || ctl->rc != 0) {
            if (res != CH_OK)
                diag_set(g, child_status(res), "%s%s", why, which);
            else
                diag_set(g, DL_RUN_ERROR_RETURN, "the stage returned %d%s", ctl->rc, which);
            for (int o = 0; o < io->nout; o++)
                if (io->out[o].present)
                    dst_slot_free(&io->out[o]);
            goto done;
        }
        if (run == 0) {
            g->seconds = ctl->seconds;
            for (int o = 0; o < io->nout; o++) {
                tens_t *t = &io->out[o];
                if (!t->present)
                    continue;
                size_t bytes = (size_t)tens_count(t) * kind_size(t->kind);
                if ((rc = dst_alloc(t, bytes)))
                    goto done;
                memcpy(dst_get(t), shared + off[o], bytes);
                int64_t left = count_poison(shared + off[o], t);
                if (left) {
                    g->unwritten += left;
                    if (g->status != DL_RUN_UNWRITTEN)
                        diag_set(g, DL_RUN_UNWRITTEN, "unwritten:");
                    diag_append(g, " %s %lld of %lld;", t->name, (long long)left,
                                (long long)tens_count(t));
                }
            }
        } else {
            int first = 1;
            for (int o = 0; o < io->nout; o++) {
                tens_t *t = &io->out[o];
                if (!t->present)
                    continue;
                int64_t diff = count_differing(dst_get(t), shared + off[o], t);
                if (!diff)
                    continue;
                g->differing += diff;
                if (g->status == DL_RUN_OK)
                    g->status = DL_RUN_NONDETERMINISTIC;
                diag_append(g, "%s%s %lld of %lld;", first ? " repeat run differs:" : "",
                            t->name, (long long)diff, (long long)tens_count(t));
                first = 0;
            }
        }
    }
done:
    munmap(shared, len);
    return rc;
}

static int validate(const dl_moe_config_t *c)
{
    if (c->tokens < 0 || c->hidden < 1 || c->ffn < 1 || c->route.experts < 1 ||
        c->route.top_k < 1 || c->route.top_k > c->route.experts)
        return DL_EINVAL;
    if (c->dtype != DL_F32 && c->dtype != DL_BF16 && c->dtype != DL_F16)
        return DL_EINVAL;
    if (c->ffn_kind != DL_FFN_SWIGLU && c->ffn_kind != DL_FFN_PLAIN)
        return DL_EINVAL;
    if (c->ffn_kind == DL_FFN_PLAIN && c->ffn != c->hidden)
        return DL_EINVAL;
    int64_t M, a;
    const int64_t big = c->hidden > c->ffn ? c->hidden : c->ffn;
    if (dl_mul_size(c->tokens, c->route.top_k, &M) || M > INT32_MAX ||
        dl_mul_size(M, big, &a) || dl_mul_size(a, 8, &a) ||
        dl_mul_size(c->route.experts, c->hidden, &a) || dl_mul_size(a, c->ffn, &a) ||
        dl_mul_size(a, 8, &a) || dl_mul_size(c->tokens, big > c->route.experts ? big : c->route.experts, &a) ||
        dl_mul_size(a, 8, &a))
        return DL_EOVERFLOW;
    return 0;
}

void dl_run_result_free(dl_run_result_t *r)
{
    if (!r)
        return;
    dl_moe_forward_t *f = &r->fwd;
    dl_moe_backward_t *b = &r->bwd;
    void *all[] = {f->router_logits, f->router_scores, f->topk_ids, f->topk_weights,
                   f->tie_margin, f->sort_perm, f->inv_perm, f->group_sizes,
                   f->group_offsets, f->x_sorted, f->h_gate, f->h_up, f->h_act,
                   f->y_sorted, f->out, b->d_topk_weights, b->d_y_sorted, b->d_h_act,
                   b->d_w_down, b->d_h_gate, b->d_h_up, b->d_x_sorted, b->d_w_gate,
                   b->d_w_up, b->d_router_scores, b->d_router_logits,
                   b->d_router_weight, b->d_x};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
    memset(&r->fwd, 0, sizeof r->fwd);
    memset(&r->bwd, 0, sizeof r->bwd);
}

int dl_run_backend(const char *path, const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                   const dl_moe_forward_t *gf, const dl_moe_backward_t *gb,
                   const dl_run_options_t *opt, dl_run_result_t *r)
{
    if (!r)
        return DL_EINVAL;
    memset(r, 0, sizeof *r);
    r->backend.abi_version = -1;
    for (int s = 0; s < DL_STAGE_COUNT; s++) {
        r->stage[s].stage = (dl_run_stage_t)s;
        r->stage[s].status = DL_RUN_SKIPPED;
    }
    if (!path || !c || !in || !gf)
        return DL_EINVAL;
    int rc = validate(c);
    if (rc)
        return rc;
    double limit = opt && opt->time_limit_s > 0 ? opt->time_limit_s : DL_RUN_DEFAULT_TIME_LIMIT_S;
    int forward_only = opt && opt->forward_only;

    job_t job;
    memset(&job, 0, sizeof job);
    job.path = path;
    job.parent = getpid();
    job.cfg = (dl_backend_config_t){c->tokens, c->hidden, c->ffn, c->route.experts,
                                    c->route.top_k, (dl_backend_dtype_t)c->dtype,
                                    (dl_backend_ffn_t)c->ffn_kind,
                                    (dl_backend_score_fn_t)c->route.score_fn,
                                    c->route.n_group, c->route.topk_group,
                                    (dl_backend_group_score_t)c->route.group_score,
                                    c->route.renormalize != 0, c->route.has_bias != 0,
                                    c->route.scaling};

    ctrl_t *ctl = mmap(NULL, sizeof *ctl, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ctl == MAP_FAILED)
        return DL_ENOMEM;

    /* Probe: load once in a child to read the table. */
    child_out_t res;
    char why[256];
    if ((rc = run_child(&job, ctl, -1, NULL, NULL, NULL, limit, &res, why, sizeof why)))
        goto done;
    r->backend.abi_version = ctl->abi_version;
    if (res != CH_OK) {
        dl_run_status_t st = child_status(res);
        diag_set(&r->load, st, "%s", why);
        for (int s = 0; s < DL_STAGE_COUNT; s++)
            diag_set(&r->stage[s], st, "the plugin did not load: %s", why);
        goto done;
    }
    r->loaded = 1;
    r->load.status = DL_RUN_OK;
    memcpy(r->backend.name, ctl->name, sizeof r->backend.name);
    memcpy(r->backend.version, ctl->version, sizeof r->backend.version);
    memcpy(r->backend.compute_mode, ctl->compute_mode, sizeof r->backend.compute_mode);
    r->backend.implemented = ctl->implemented;

    for (int s = 0; s < DL_STAGE_COUNT; s++) {
        dl_run_diag_t *g = &r->stage[s];
        if (!(r->backend.implemented & (1u << s))) {
            diag_set(g, DL_RUN_NOT_IMPLEMENTED, "");
            continue;
        }
        if (stage_is_backward((dl_run_stage_t)s) && (forward_only || !gb)) {
            diag_set(g, DL_RUN_SKIPPED, forward_only ? "forward only" : "no golden backward");
            continue;
        }
        stage_io_t io;
        stage_io((dl_run_stage_t)s, c, in, gf, gb, r, &io);
        const char *missing = NULL;
        for (int i = 0; i < io.nin && !missing; i++)
            if (io.in[i].present && !io.in[i].src && tens_count(&io.in[i]) > 0)
                missing = io.in[i].name;
        if (missing) {
            diag_set(g, DL_RUN_SKIPPED, "the golden values lack input %s", missing);
            continue;
        }
        g->status = DL_RUN_OK;
        if ((rc = exec_stage(&job, ctl, (dl_run_stage_t)s, &io, limit, g)))
            goto done;
    }
done:
    munmap(ctl, sizeof *ctl);
    return rc;
}

uint64_t dl_run_stage_values(dl_run_stage_t s)
{
    /* the output tensors of each stage (backend.h), by dataset name */
    static const char *const outputs[DL_STAGE_COUNT][8] = {
        [DL_STAGE_ROUTER] = {"router_logits", "router_scores", "topk_ids", "topk_weights"},
        [DL_STAGE_DISPATCH] = {"sort_perm", "group_sizes", "group_offsets"},
        [DL_STAGE_PERMUTE] = {"x_sorted"},
        [DL_STAGE_EXPERT_FORWARD] = {"h_gate", "h_up", "h_act", "y_sorted"},
        [DL_STAGE_COMBINE] = {"out"},
        [DL_STAGE_COMBINE_BACKWARD] = {"d_topk_weights", "d_y_sorted"},
        [DL_STAGE_EXPERT_BACKWARD] = {"d_h_act", "d_w_down", "d_h_gate", "d_h_up", "d_x_sorted",
                                      "d_w_gate", "d_w_up"},
        [DL_STAGE_ROUTER_BACKWARD] = {"d_router_scores", "d_router_logits", "d_router_weight"},
        [DL_STAGE_INPUT_BACKWARD] = {"d_x"},
    };
    if ((int)s < 0 || s >= DL_STAGE_COUNT)
        return 0;
    uint64_t m = 0;
    for (int i = 0; i < 8 && outputs[s][i]; i++) {
        dl_value_t v;
        if (dl_value_parse(outputs[s][i], &v) == 0)
            m |= UINT64_C(1) << v;
    }
    return m;
}
