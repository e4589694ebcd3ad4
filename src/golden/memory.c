/* What the operating system says about memory: the figure generation
 * estimates are compared with (`dropless gen`, dropless.generate). */
#include "config.h"
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include "dropless/golden.h"

/* Bytes this process may still use: MemAvailable, or the address-space
 * limit if lower; -1 if neither is known. */
int64_t dl_memory_available(void)
{
    int64_t avail = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        long long kb;
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1)
            avail = (int64_t)kb * 1024;
    }
    if (f)
        fclose(f);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (avail < 0 || (int64_t)rl.rlim_cur < avail))
        avail = (int64_t)rl.rlim_cur;
    return avail;
}
