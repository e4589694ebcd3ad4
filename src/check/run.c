/* One run of the conformance runner (dl__ck_run): the case and the
 * candidate set up in the runner's working state, the storage each stage
 * is judged at, the profiles, then the stages walked (stage.c), the
 * expert-parallel and kernel layouts, the required stages. The entry point
 * dl_check_run (check.c) runs it with the second chained level
 * (chain.c), which judges a stage by a nested run of its own; the
 * dependency is one-directional: check.c -> chain.c -> run.c -> stage.c. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check/check_priv.h"

void dl_check_options_default(dl_check_options_t *o)
{
    memset(o, 0, sizeof *o);
    o->diagnose_drops = 1;
    o->max_listed = 8;
    o->false_alarm = DL__FALSE_ALARM_DEFAULT;
}

/* ------------------------------------------------------------ the run */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int golden_forward_complete(const dl_moe_config_t *c, const dl_moe_forward_t *f)
{
    for (int s = 0; s <= DL_VALUE_OUT; s++)
        if (dl_value_numel(c, (dl_value_t)s) > 0 && !dl_value_array(f, NULL, (dl_value_t)s))
            return 0;
    return 1;
}

/* A stage stored coarser than the case's type (bf16 weight gradients, as
 * autograd gives for bf16 weights): judged at its own precision with a
 * NOTE, or a FAIL under strict_storage. */
static int storage_note(dl__ck_t *ck, dl_value_t s)
{
    dl_check_result_t *x = dl__ck_result(ck, s, "storage");
    if (!x)
        return DL_ENOMEM;
    const char *have = dl_dtype_name(ck->st[s].store);
    const char *want = dl_dtype_name(dl_value_dtype(ck->c, s));
    x->verdict = ck->opt.strict_storage ? DL_VERDICT_FAIL : DL_VERDICT_INFO;
    dl__ck_msg(x, "%sstored as %s%s, coarser than the case's %s%s",
               ck->opt.strict_storage ? "" : "NOTE: ", have ? have : "?",
               (ck->inferred >> s) & 1 ? " (inferred: every value on its grid, in an fp32 container)"
                                       : "",
               want ? want : "?",
               ck->opt.strict_storage ? " (--strict-storage)" : ": judged at its own precision");
    return 0;
}

/* The grid an fp32-typed stage's values all lie on, if coarser: bf16, else
 * fp16, else fp32 (nothing inferred). At least 8 nonzero finite values are
 * needed: a few values on a grid by chance are no evidence (a random fp32
 * value lies on the bf16 grid with probability 2^-16). */
static dl_dtype_t inferred_grid(const float *v, int64_t n)
{
    int64_t nz = 0;
    int bf = 1, hf = 1;
    for (int64_t i = 0; i < n && (bf || hf); i++) {
        if (!isfinite(v[i]) || v[i] == 0.0f)
            continue;
        nz++;
        bf &= dl_on_grid(v[i], DL_BF16);
        hf &= dl_on_grid(v[i], DL_F16);
    }
    return nz < 8 ? DL_F32 : bf ? DL_BF16 : hf ? DL_F16 : DL_F32;
}

static int all_on_grid(const float *v, int64_t n, dl_dtype_t t)
{
    for (int64_t i = 0; i < n; i++)
        if (isfinite(v[i]) && !dl_on_grid(v[i], t))
            return 0;
    return 1;
}

/* The storage each provided stage is judged at: declared, or inferred from
 * its values where the case stores it in fp32 (issue 24 item 4). */
static void storage_of(dl__ck_t *ck, dl_value_t s)
{
    if ((ck->cand->coarse >> s) & 1) {
        ck->coarse |= DL_VALUE_BIT(s);
        ck->st[s].store = ck->cand->store[s];
        return;
    }
    if (dl_value_store(s) > DL_STORE_F32 || dl_value_dtype(ck->c, s) != DL_F32)
        return;
    /* the golden's own values on that grid (weights of exactly 1 with
     * top-1, an exact stage) say nothing about the candidate's storage */
    const dl_dtype_t g = ck->st[s].gold ? inferred_grid(ck->st[s].cand, ck->st[s].numel) : DL_F32;
    if (g != DL_F32 && !all_on_grid(ck->st[s].gold, ck->st[s].numel, g)) {
        ck->coarse |= DL_VALUE_BIT(s);
        ck->inferred |= DL_VALUE_BIT(s);
        ck->st[s].store = g;
    }
}

/* The profiles the stages are judged under: the options', else the
 * candidate's compute_mode (one name or per part), else fp32; 1 when per
 * stage. */
static int resolve_profile(dl__ck_t *ck, const dl_check_candidate_t *cand)
{
    int per_stage = 0;
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        per_stage |= ck->opt.stage_profile[s] != NULL;
    ck->prof = ck->opt.profile;
    if (!ck->prof && !per_stage && cand->compute_mode && strchr(cand->compute_mode, '=')) {
        /* the candidate declares per-stage profiles ("router=fp32,experts=bf16-acc") */
        const dl_check_profile_t *whole;
        if (dl_check_parse_profiles(cand->compute_mode, &whole, ck->opt.stage_profile) == 0) {
            ck->prof = whole;
            per_stage = 1;
        }
    }
    if (!ck->prof)
        ck->prof = dl_check_profile_find(cand->compute_mode);
    if (!ck->prof)
        ck->prof = dl_check_profile_at(0);
    return per_stage;
}

int dl__ck_run(const dl_check_golden_t *g, const dl_check_candidate_t *cand,
               const dl_check_options_t *o, dl__ck_second_t second, dl_check_report_t *r)
{
    if (!r)
        return DL_EINVAL;
    memset(r, 0, sizeof *r);
    const double t0 = now();
    if (!g || !cand || !g->config || !g->inputs || !g->fwd)
        return DL_EINVAL;
    int rc = dl_moe_config_validate(g->config);
    if (rc)
        return rc;
    if (!golden_forward_complete(g->config, g->fwd))
        return DL_EINVAL;

    dl__ck_t ck;
    memset(&ck, 0, sizeof ck);
    ck.c = g->config;
    ck.in = g->inputs;
    ck.gf = g->fwd;
    ck.gb = g->bwd;
    ck.cand = cand;
    ck.second = second;
    if (o)
        ck.opt = *o;
    else
        dl_check_options_default(&ck.opt);
    if (ck.opt.max_listed < 0)
        ck.opt.max_listed = 0;
    const int per_stage = resolve_profile(&ck, cand);
    ck.rep = r;
    ck.T = g->config->tokens;
    ck.d = g->config->hidden;
    ck.f = g->config->ffn;
    ck.E = g->config->route.experts;
    ck.k = g->config->route.top_k;
    ck.M = ck.T * ck.k;
    ck.swiglu = DL_FFN_HIDDEN(g->config->ffn_kind); /* a hidden layer (h_act) */
    ck.act = g->config->dtype;
    ck.have_bwd = g->bwd && g->inputs->d_out;
    dl__ck_upstream_init(&ck);

    snprintf(r->case_name, sizeof r->case_name, "%s", g->case_name ? g->case_name : "unnamed");
    snprintf(r->backend, sizeof r->backend, "%s", cand->backend ? cand->backend : "unknown");
    snprintf(r->backend_version, sizeof r->backend_version, "%s",
             cand->backend_version ? cand->backend_version : "");
    snprintf(r->profile, sizeof r->profile, "%s%s", ck.prof->name, per_stage ? "+per-stage" : "");

    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        ck.st[s].numel = dl_value_numel(ck.c, (dl_value_t)s);
        ck.st[s].gold = ck.st[s].numel > 0 ? dl_value_array(ck.gf, ck.gb, (dl_value_t)s) : NULL;
        const void *p = dl_value_array(&cand->fwd, &cand->bwd, (dl_value_t)s);
        /* a loader that set a misshapen stage aside leaves its array NULL */
        if (cand->bad_shape & DL_VALUE_BIT(s)) {
            dl_check_result_t *x = dl__ck_result(&ck, (dl_value_t)s, "shape");
            if (!x) {
                rc = DL_ENOMEM;
                goto out;
            }
            x->verdict = DL_VERDICT_FAIL;
            if (cand->bad_reason[s] && cand->bad_reason[s][0])
                dl__ck_msg(x, "set aside: %s", cand->bad_reason[s]);
            else
                dl__ck_msg(x, "the candidate's %s has the wrong shape or type (expected %lld "
                           "elements)", dl_value_name((dl_value_t)s), (long long)ck.st[s].numel);
            continue;
        }
        if (!p || ck.st[s].numel == 0)
            continue;
        ck.st[s].cand = p;
        storage_of(&ck, (dl_value_t)s);
        if (((ck.coarse >> s) & 1) && (rc = storage_note(&ck, (dl_value_t)s)))
            goto out;
    }

    rc = dl__ck_table_check(&ck);
    if (!rc)
        rc = dl__ck_layouts_feed(&ck);
    if (!rc)
        rc = dl__ck_stages(&ck);
    if (rc || (rc = dl__ck_ep(&ck)) || (rc = dl__ck_layouts(&ck)) || (rc = dl__ck_require(&ck)))
        goto out;

    r->verdict = dl__ck_worst_verdict(r);
out:
    dl__ck_release(&ck);
    r->seconds = now() - t0;
    return rc;
}
