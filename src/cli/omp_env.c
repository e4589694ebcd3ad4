/* The OpenMP wait policy of the dropless command. libgomp's default lets a
 * thread that finished its share spin for a while before it sleeps; on a
 * machine with more runnable threads than cores that spinning takes the
 * core from the thread still working, and every one of the runner's many
 * short parallel regions pays for it (measured in doc/performance.md: a
 * check 4-7x slower at 2 threads under load). libgomp reads the policy
 * once, when it is loaded, so the command sets OMP_WAIT_POLICY=passive and
 * executes itself again, before anything else. A policy already in the
 * environment (any value: OMP_WAIT_POLICY=active restores the spinning) is
 * left alone; if the executable cannot be run again (/proc absent, an
 * emulator) the command goes on as it is. Numerics do not depend on it. */
#include "config.h"
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#include "dropless.h"
#include "cli.h"

void dl_cli_omp_wait_policy(char **argv)
{
    if (getenv("OMP_WAIT_POLICY"))
        return;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || setenv("OMP_WAIT_POLICY", "passive", 1) != 0)
        return;
    self[n] = '\0';
    execv(self, argv);
    /* not run again: this process goes on, its policy already read */
}
