/* libFuzzer harness for dl_golden_load_candidate: the input bytes become a
 * candidate file, loaded against the configuration of the catalogue case
 * "tiny" (vectors/tiny.h5 is the matching golden). Built only by
 * `make fuzz` (clang, -fsanitize=fuzzer,address); doc/fuzzing.md. */
#include "config.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dropless.h>
#include "fuzz_file.h"

static dl_moe_config_t expect;

static void init(void)
{
    dl_case_t c;
    if (dl_case_find("tiny", &c) != 0)
        abort();
    expect = c.config;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready++)
        init();
    const char *path = dl_fuzz_file("candidate", ".h5", data, size);
    dl_golden_file_t g;
    char err[512];
    err[0] = '\0';
    int rc = dl_golden_load_candidate(path, &expect, &g, err, sizeof err);
    /* the contract: an error is one line naming the file; success owns g */
    if (rc < 0) {
        if (!strstr(err, path) || strchr(err, '\n'))
            abort();
    } else {
        /* a dataset set aside has no array, a reason, and exists in the table */
        for (int i = 0; i < DL_GOLDEN_DATASET_MAX; i++) {
            const dl_golden_dataset_t *ds = dl_golden_dataset(i);
            int bad = DL_ROWSET_HAS(g.bad_datasets, i);
            if (bad && (!ds || *dl_golden_slot(&g, ds) || !g.bad_reason[i][0] ||
                        strchr(g.bad_reason[i], '\n')))
                abort();
            if (!bad && g.bad_reason[i][0])
                abort();
        }
        dl_golden_free(&g);
    }
    unlink(path);
    return 0;
}
