/* Two-level chained verdicts (issue 24 item 3). A chained candidate's
 * stage is judged on the candidate's own stored upstream, which is the
 * tightest test; but a kernel may consume its upstream unrounded (fp32
 * registers) while storing it rounded (bf16), and then its stage is off
 * its own stored upstream by the upstream's rounding, a FAIL although the
 * same values handed over alone (a fused candidate) conform. So a stage
 * that FAILs on its own upstream is judged once more as the only stage the
 * candidate gives, on the exact inputs with the error every absent
 * upstream stage propagates (tolerances.md); within that bound it is a
 * WARN, not a FAIL. Handing over more stages thus never turns a stage that
 * conforms alone into a FAIL. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"

/* 1 when some upstream stage of s is the candidate's stored value (even
 * bitwise the golden's: the kernel may have consumed it unrounded): only
 * then does the second level differ from the first. */
static int chained(const dl__ck_t *ck, dl_value_t s)
{
    const dl_valueset_t up = dl__ck_upstream(ck, s);
    for (int u = 0; u < DL_VALUE_COUNT; u++)
        if (((up >> u) & 1) && ck->st[u].eff_is_cand)
            return 1;
    return 0;
}

/* The candidate holding stage s alone, as given (its layout, its storage). */
static dl_check_candidate_t alone(const dl__ck_t *ck, dl_value_t s)
{
    dl_check_candidate_t c;
    memset(&c, 0, sizeof c);
    c.backend = ck->cand->backend;
    c.backend_version = ck->cand->backend_version;
    c.compute_mode = ck->cand->compute_mode;
    void **slot = dl__value_slot(&c.fwd, &c.bwd, s);
    if (slot)
        *slot = (void *)dl_value_array(&ck->cand->fwd, &ck->cand->bwd, s);
    c.coarse = ck->coarse & DL_VALUE_BIT(s);
    c.store[s] = ck->st[s].store;
    return c;
}

int dl__ck_chained_second(dl__ck_t *ck, dl_value_t s, dl_check_result_t *r)
{
    /* the candidate's rows must be in the oracle's order. Its ids may
     * differ from the golden's, or list a token's experts in another slot
     * order (ties in its own router values broken otherwise, while the
     * kernel used the golden's ids): the stage alone is judged on the
     * golden's routing, so rows that follow other ids FAIL there too and
     * nothing is excused by them */
    if (r->verdict != DL_VERDICT_FAIL || ck->opt.exact_upstream || !ck->st[s].gold ||
        !chained(ck, s) ||
        !ck->st[DL_VALUE_TOPK_IDS].eff || ck->row_map || r->n_nonfinite)
        return 0;
    dl_check_candidate_t c = alone(ck, s);
    dl_check_golden_t g = {ck->c, ck->in, ck->gf, ck->gb, NULL};
    dl_check_options_t o = ck->opt;
    o.profile = ck->prof;
    o.require = 0;
    o.diagnose_drops = 0;
    o.progress = NULL; /* the outer run's bar goes on; this nested one is a detail of a stage */
    dl_check_report_t sub;
    /* a nested run without the second level: the candidate holds s alone,
     * so no upstream of it is the candidate's and the level would not apply */
    int rc = dl__ck_run(&g, &c, &o, NULL, &sub);
    const dl_check_result_t *x = NULL;
    for (size_t i = 0; !rc && i < sub.n; i++)
        if (sub.results[i].stage == s && !strcmp(sub.results[i].check, "numerics"))
            x = &sub.results[i];
    /* (this cannot tell an elementwise stage that consumed unrounded
     * inputs from one that rounds its intermediates: both err by about
     * the upstream's rounding; JAX's bf16 SwiGLU under the bf16 profile is
     * a WARN here, its own profile bf16-elem PASSes it) */
    if (!rc && x && x->verdict <= DL_VERDICT_WARN && x->verdict >= DL_VERDICT_PASS) {
        char own[64];
        snprintf(own, sizeof own, "FAIL at %.3g x PASS", r->err_pass);
        *r = *x;
        r->verdict = DL_VERDICT_WARN;
        dl__ck_msg(r, "consistent with the exact values, not with its own stored upstream "
                      "(on it %s): did it consume unrounded inputs? Judged alone: %.3g x its "
                      "PASS bound with the error absent upstream stages propagate",
                   own, x->err_pass);
        rc = 1;
    }
    dl_check_report_free(&sub);
    return rc;
}
