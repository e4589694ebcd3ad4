/* The sandbox: each plugin call runs in a forked child, with its inputs on
 * read-only pages and its outputs in a shared buffer, under a time limit;
 * whatever the child does (crash, hang, exit, write into an input) is
 * classified here, and the caller survives it. */
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
#include "run/run_priv.h"

/* Bounded copy of a string the plugin owns, which may be NULL. */
static void copy_str(char *dst, size_t cap, const char *src)
{
    if (!src)
        src = "";
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = 0;
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
        if (dl__run_stage_present(b, (dl_run_stage_t)s))
            mask |= 1u << s;
    ctl->implemented = mask;
    ctl->phase = PHASE_LOADED;
    return b;
}

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
        size_t bytes = (size_t)dl__run_count(t) * dl__run_kind_size(t->kind);
        size_t len = dl__run_round_up(bytes ? bytes : 1, (size_t)sysconf(_SC_PAGESIZE));
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
                             (uint8_t)(8 * dl__run_kind_size(t->kind)), 1},
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
                              (uint8_t)(8 * dl__run_kind_size(t->kind)), 1},
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
    int rc = dl__run_call_stage(b, (dl_run_stage_t)stage, &job->cfg, I, O);
    ctl->seconds = now_s() - t0;
    ctl->rc = rc;
    ctl->phase = PHASE_RETURNED;
    child_exit(0);
}


int dl__run_child(const job_t *job, ctrl_t *ctl, int stage, const stage_io_t *io,
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

