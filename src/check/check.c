/* The conformance runner's entry point, dl_check_run: one run (run.c) with
 * the second chained level (chain.c). The checks live in route.c
 * (routing), tokens.c (zero drops), stage.c and desc.c (stage-local
 * numerics), tol.c (tolerances); the report's bookkeeping in result.c, its
 * formats in report.c; the default options beside the run (run.c). */
#include "config.h"
#include "check/check_priv.h"

int dl_check_run(const dl_check_golden_t *g, const dl_check_candidate_t *cand,
                 const dl_check_options_t *o, dl_check_report_t *r)
{
    return dl__ck_run(g, cand, o, dl__ck_chained_second, r);
}
