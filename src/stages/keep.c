/* Pages kept for the layer's next arrays. A fresh array's pages are what
 * its first write pays for: the kernel finds, charges and clears each 4 KiB
 * page, and on these VMs the host backs it (free page reporting hands freed
 * pages back): 0.55 s per GB here, at 1 or 2 threads alike, a sixth of the
 * backward of a layer whose weight gradients are 2-3 GB. A training loop
 * frees a pass's arrays and allocates the same sizes again, so
 * dl__moe_arrays_free keeps its large arrays here and the next allocation
 * of the same byte count takes one back, zero-filled (calloc's contract)
 * unless its producer writes every element anyway (the weight gradients'
 * slabs: dl_gemm_ragged_k writes an empty expert's zeros itself), on pages
 * already there. Bounded: at most KEEP_SLOTS arrays and a quarter
 * of the machine's memory; an allocation that finds no array of its size
 * releases everything kept first. That bounds what is kept by what one
 * pass held live, not the process's peak: arrays kept while other memory
 * is live add to it (bench_check's kernel case, whose golden stays live
 * while it generates again and checks: 1210 MiB kept, 975 MiB with
 * DROPLESS_KEEP=0; doc/performance.md). DROPLESS_KEEP=0 turns it off
 * (every array fresh).
 * Nothing here changes a value: an array is zero before its pass, as from
 * calloc, or written whole by it (tests/test_moe.c frees kept arrays full
 * of NaN bits and checks a second pass's bits). */
#include "config.h"
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "stages/stages_priv.h"

enum { KEEP_SLOTS = 64 };
#define KEEP_MIN ((size_t)1 << 20) /* smaller arrays: malloc's own free lists */
#define ZERO_CHUNK ((size_t)1 << 20)

static struct {
    pthread_mutex_t mu;
    void *p[KEEP_SLOTS];
    size_t n[KEEP_SLOTS];
    size_t bytes, cap; /* cap 0: not yet read; 1: keeping off */
} keep = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, 0, 0};

static size_t keep_cap(void)
{
    if (keep.cap == 0) {
        const char *e = getenv("DROPLESS_KEEP");
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        keep.cap = (e && !strcmp(e, "0")) || pages <= 0 || psz <= 0
                       ? 1 : (size_t)pages * (size_t)psz / 4;
    }
    return keep.cap;
}

/* Everything kept, back to the system (keep.mu held). */
static void release_all(void)
{
    for (int i = 0; i < KEEP_SLOTS; i++) {
        free(keep.p[i]);
        keep.p[i] = NULL, keep.n[i] = 0;
    }
    keep.bytes = 0;
}

/* A kept array with room for n bytes and not 1/64 more (the same
 * request's block), or NULL (then nothing is kept). */
static void *take(size_t n)
{
    void *p = NULL;
    pthread_mutex_lock(&keep.mu);
    for (int i = 0; i < KEEP_SLOTS && !p; i++)
        if (keep.p[i] && keep.n[i] >= n && keep.n[i] - n <= keep.n[i] / 64) {
            p = keep.p[i];
            /* the block's own size, as dl__keep_free counted it (not n) */
            keep.bytes -= keep.n[i];
            keep.p[i] = NULL, keep.n[i] = 0;
        }
    if (!p)
        release_all();
    pthread_mutex_unlock(&keep.mu);
    return p;
}

void *dl__keep_alloc(size_t n, int zero)
{
    void *p = n >= KEEP_MIN && keep_cap() > 1 ? take(n) : NULL;
    if (!p)
        return calloc(n, 1);
    if (!zero)
        return p;
    /* zero-filled as calloc's, both threads on the warm pages */
    const int64_t chunks = (int64_t)((n + ZERO_CHUNK - 1) / ZERO_CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 8)
    for (int64_t c = 0; c < chunks; c++) {
        size_t o = (size_t)c * ZERO_CHUNK;
        memset((char *)p + o, 0, n - o < ZERO_CHUNK ? n - o : ZERO_CHUNK);
    }
    return p;
}

void dl__keep_free(void *p)
{
    if (!p)
        return;
    /* the block's own size (glibc: what malloc gave it, however allocated) */
    const size_t n = malloc_usable_size(p);
    if (n < KEEP_MIN || keep_cap() <= 1) {
        free(p);
        return;
    }
    pthread_mutex_lock(&keep.mu);
    int slot = -1;
    for (int i = 0; i < KEEP_SLOTS && slot < 0; i++)
        if (!keep.p[i])
            slot = i;
    if (slot >= 0 && keep.bytes + n <= keep.cap) {
        keep.p[slot] = p, keep.n[slot] = n, keep.bytes += n;
        p = NULL;
    }
    pthread_mutex_unlock(&keep.mu);
    free(p);
}
