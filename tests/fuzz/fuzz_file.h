/* Shared by the fuzz harnesses: the input bytes as a file, since every
 * target reads a path. */
#ifndef DL_FUZZ_FILE_H
#define DL_FUZZ_FILE_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Writes data to /tmp/dl_fuzz_<kind>_<pid><ext> (the same name every run:
 * the target opens it afresh each time) and returns that name. */
static inline const char *dl_fuzz_file(const char *kind, const char *ext, const uint8_t *data,
                                       size_t size)
{
    static char path[96];
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/dl_fuzz_%s_%ld%s", kind, (long)getpid(), ext);
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    if (fclose(f) != 0)
        abort();
    return path;
}
#endif
