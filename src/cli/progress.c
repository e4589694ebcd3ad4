/* The progress bar of `gen` and `check`: on stderr, redrawn in place, only
 * after a delay so that short runs print nothing. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "dropless.h"
#include "cli.h"

/* The bar appears once a run has taken this long (seconds). */
#define PROGRESS_AFTER_S 2.0

/* DROPLESS_PROGRESS_AFTER_S overrides the delay (tests set 0, so that the
 * bar they look for does not depend on how fast the machine is). */
static double progress_after_s(void)
{
    const char *s = getenv("DROPLESS_PROGRESS_AFTER_S");
    char *end;
    double v = s && *s ? strtod(s, &end) : -1.0;
    return s && *s && !*end && v >= 0.0 && v < 86400.0 ? v : PROGRESS_AFTER_S;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void eta_str(double secs, char *buf, size_t n)
{
    if (!(secs >= 0) || secs > 1e6)
        snprintf(buf, n, "--:--");
    else if (secs >= 3600)
        snprintf(buf, n, "%dh%02dm", (int)(secs / 3600), (int)(secs / 60) % 60);
    else
        snprintf(buf, n, "%dm%02ds", (int)(secs / 60), (int)secs % 60);
}

/* n with a k/M/G suffix, 3 significant digits. */
static void count_str(double n, char *buf, size_t len)
{
    static const char sfx[] = " kMGT";
    int i = 0;
    while (n >= 999.5 && i < 4)
        n /= 1000.0, i++;
    snprintf(buf, len, i ? "%.3g%c" : "%.0f", n, sfx[i]);
}

void dl_cli_progress_init(dl_cli_progress_t *p, const char *name)
{
    p->total = 0.0;
    p->name = name;
    p->shown = 0;
    p->last_pct = -1;
    p->phase = NULL;
    p->t0 = now_s();
    p->after = progress_after_s();
}

/* A bar with the phase, the share done and the time left, redrawn when the
 * percentage or the phase changes (phases are compared by pointer: the
 * callers pass static names). */
void dl_cli_progress_cb(void *ctx, const char *phase, double done)
{
    dl_cli_progress_t *p = ctx;
    double el = now_s() - p->t0;
    int pct = (int)(done * 100.0);
    if (el < p->after || (p->phase == phase && pct == p->last_pct))
        return;
    p->phase = phase;
    p->last_pct = pct;
    int bar = pct / 5;
    char eta[32];
    eta_str(done > 0.005 ? el / done * (1.0 - done) : -1.0, eta, sizeof eta);
    fprintf(stderr, "\r%s: %-16.16s [%.*s%*s] %3d%% ETA %-8s", p->name, phase, bar,
            "####################", 20 - bar, "", pct, eta);
    if (p->total > 0) { /* check: elements judged of the case's, and their rate */
        char dn[16], tot[16], rate[16];
        count_str(done * p->total, dn, sizeof dn);
        count_str(p->total, tot, sizeof tot);
        count_str(el > 0 ? done * p->total / el : 0.0, rate, sizeof rate);
        fprintf(stderr, " %s/%s elements, %s/s   ", dn, tot, rate);
    }
    fflush(stderr);
    p->shown = 1;
}

void dl_cli_progress_end(dl_cli_progress_t *p)
{
    if (p->shown)
        fprintf(stderr, "\n");
    p->shown = 0;
}
