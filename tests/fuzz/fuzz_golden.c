/* libFuzzer harness for dl_golden_load, the strict golden loader: the input
 * bytes become a file that is loaded as a golden file. Goldens are trusted
 * only when their seal verifies; an unsealed one is parsed like any other
 * untrusted input (issue 17). Built only by `make fuzz`; doc/fuzzing.md. */
#include "config.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dropless.h>
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = dl_fuzz_file("golden", ".h5", data, size);
    dl_golden_file_t g;
    char err[512];
    err[0] = '\0';
    int rc = dl_golden_load(path, &g, err, sizeof err);
    /* the contract: an error is one line naming the file; a loaded golden
     * is complete where it has a group and its configuration validates */
    if (rc < 0) {
        if (!strstr(err, path) || strchr(err, '\n'))
            abort();
    } else {
        if (dl_moe_config_validate(&g.config) != 0 || !g.case_name[0])
            abort();
        for (int i = 0; i < dl_golden_dataset_count(); i++) {
            const dl_golden_dataset_t *ds = dl_golden_dataset(i);
            int has = ds->group == DL_GOLDEN_INPUTS ? g.has_inputs
                      : ds->group == DL_GOLDEN_FORWARD ? g.has_forward : g.has_backward;
            if (has && dl_golden_dataset_applies(ds, &g.config) && !*dl_golden_slot(&g, ds))
                abort();
        }
        if (g.bad_datasets)
            abort(); /* a golden file sets nothing aside: it fails */
        dl_golden_free(&g);
    }
    unlink(path);
    return 0;
}
