/* dropless/check.h: the conformance runner's core. Given a golden case (the
 * oracle's every stage) and a candidate (the same structs, any array NULL =
 * stage not provided), checks the candidate stage by stage: token accounting
 * (zero drops), tie-aware routing, stage-local numerics within derived
 * tolerances, hygiene; and writes a human table, JSON or JUnit XML.
 * Part of the public API; include <dropless.h>. doc/conformance.md describes
 * every check and the JSON schema, doc/tolerances.md the tolerance model. */
#ifndef DROPLESS_CHECK_H
#define DROPLESS_CHECK_H
#include <stdio.h>
#include "core.h"
#include "moe.h"
#include "values.h"
#include "ep.h"
#include "layout.h"
#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- verdicts */

/* Ordered by severity. INFO carries figures only (end-to-end drift) and
 * never affects conformance; SKIP: the candidate does not provide the stage
 * (or the golden lacks what the check needs). */
typedef enum {
    DL_VERDICT_SKIP = 0,
    DL_VERDICT_INFO = 1,
    DL_VERDICT_PASS = 2,
    DL_VERDICT_WARN = 3,
    DL_VERDICT_FAIL = 4
} dl_verdict_t;

/* "PASS", "WARN", "FAIL", "SKIP", "INFO"; NULL for an unknown value. */
DL_EXTERN const char *dl_verdict_name(dl_verdict_t v);

/* -------------------------------------------------------------- profiles */

/* A compute profile: how the candidate declares it computes. The per-element
 * bound on |c - exact| (doc/tolerances.md derives it) is
 *   2 u_out |g| + kappa(K) u_acc M + kappa_in u_in M   (+ underflow slack)
 * with g the correctly rounded value, M = (|A||B|)_ij, K the contraction
 * length, kappa = c_pass sqrt(K) for PASS and K for WARN; u_in = 2^-in_bits
 * applies to each GEMM operand whose storage grid is not inside the
 * profile's input grid (kappa_in counts those operands, 0..2).
 * Elementwise transcendental stages (scores, SwiGLU) use elem_pass/elem_warn
 * units of u_f32 = 2^-24 in place of kappa(K) u_acc. */
typedef struct {
    const char *name;     /* "fp32", "tf32", "bf16", "fp16", "bf16-acc", "fp16-acc",
                           * "bf16-elem", "fp16-elem" */
    int in_bits;          /* significand bits of the GEMM input grid; 24 = fp32 */
    int in_exp_bits;      /* exponent bits of that grid (8 or 5) */
    double u_acc;         /* unit roundoff of each accumulation step */
    double c_pass;        /* PASS: kappa(K) = c_pass * sqrt(K) */
    double elem_pass, elem_warn; /* elementwise stages, in units of 2^-24 */
    int sums_in_storage;  /* short sums of separately rounded parts (combine,
                           * un-permute, the two terms of d_x_sorted) accumulate
                           * in the stage's storage type: u_acc = max(u_acc, u_out) there */
    double elem_s_pass, elem_s_warn; /* > 0: elementwise stages stored in bf16/fp16 compute
                           * their intermediates in that type (JAX's bf16 SwiGLU): these
                           * many units of the storage type's u_out replace elem_pass/
                           * elem_warn there (fp32-stored stages keep theirs) */
    const char *summary;  /* one line for reports and --help */
} dl_check_profile_t;

/* The built-in profiles, in a fixed order; i outside [0, count) gives NULL. */
DL_EXTERN int dl_check_profile_count(void);
DL_EXTERN const dl_check_profile_t *dl_check_profile_at(int i);
/* The profile named name (case-insensitive; "float32" and "fp32-rn" are
 * accepted for fp32), or NULL. */
DL_EXTERN const dl_check_profile_t *dl_check_profile_find(const char *name);

/* Parses a profile spec: one profile name for the whole layer ("bf16"), or
 * per part, comma-separated PART=NAME items ("router=fp32,experts=bf16-acc"),
 * PART one of router (logits, scores, weights and their gradients),
 * experts (the expert GEMMs, SwiGLU and their gradients), combine (out,
 * d_topk_weights, d_y_sorted, d_x), a stage name, or default (the rest).
 * Later items override earlier ones. *whole gets the default profile (NULL
 * if none is named), per_stage[DL_VALUE_COUNT] each stage's (NULL: the
 * default). Returns 0 or DL_EINVAL (an unknown part or profile, an empty
 * item). */
DL_EXTERN int dl_check_parse_profiles(const char *spec, const dl_check_profile_t **whole,
                                      const dl_check_profile_t **per_stage);

/* ------------------------------------------------------------- the inputs */

/* The golden case: configuration, inputs and every stage. bwd may be NULL
 * (a forward-only golden: backward checks are then SKIP). Nothing is
 * copied; everything must outlive dl_check_run. */
typedef struct {
    const dl_moe_config_t *config;
    const dl_moe_inputs_t *inputs;
    const dl_moe_forward_t *fwd;
    const dl_moe_backward_t *bwd;
    const char *case_name; /* may be NULL */
} dl_check_golden_t;

/* The candidate: only the stages it produced (NULL arrays are SKIP). Every
 * non-NULL array must have the shape the golden's configuration gives the
 * stage (dl_value_numel); a loader that found a stage with another shape or
 * type sets its bit in bad_shape: the stage is then a FAIL (shape) and is
 * otherwise treated as absent. Ids and indices may hold any value: out-of-
 * range entries are findings, never a crash. The candidate's tie_margin and
 * stats are ignored. */
typedef struct {
    dl_moe_forward_t fwd;
    dl_moe_backward_t bwd;
    dl_valueset_t bad_shape;    /* DL_VALUE_BIT(stage) */
    const char *bad_reason[DL_VALUE_COUNT]; /* why a bad_shape stage was set aside
                                 * (actual against expected shape and type), or NULL */
    dl_valueset_t coarse;       /* stages stored coarser than the case's type for them
                                 * (bf16 weight gradients of an fp32 stage), DL_VALUE_BIT(stage) */
    dl_dtype_t store[DL_VALUE_COUNT]; /* their storage type, where the coarse bit is set */
    const char *backend;        /* may be NULL */
    const char *backend_version;
    const char *compute_mode;   /* the profile the backend declares; may be NULL */
    int n_ep;                   /* expert-parallel layouts (/ep/ranks_R), whole or a */
    const dl_ep_layout_t *ep;   /* rank's view, checked against dl_ep_layout of the
                                 * golden's routing (checks ep_*, doc/conformance.md) */
    int n_layouts;              /* kernel layouts (/layouts/NAME), checked against
                                 * dl_layout_compute of the golden's routing (checks
                                 * layout_*); their valid y rows stand for a missing
                                 * y_sorted (doc/format.md, "Kernel layouts") */
    const dl_layout_t *layouts;
} dl_check_candidate_t;

typedef struct {
    const dl_check_profile_t *profile; /* NULL: the candidate's compute_mode, else fp32 */
    const dl_check_profile_t *stage_profile[DL_VALUE_COUNT]; /* per stage (NULL: profile);
                                        * dl_check_parse_profiles fills it */
    int diagnose_drops;  /* search which (token, slot) pairs are missing from a wrong out row (default 1) */
    int64_t max_listed;  /* (token, slot) pairs and tokens named in messages (default 8) */
    int recompute_all;   /* never reuse golden values: recompute every stage on the
                          * effective upstream (a self-test of the runner against
                          * the golden; costs a generation) (default 0) */
    int exact_upstream;  /* stages the candidate lacks are exact (it was fed golden
                          * values, as stage-isolated runs are): no error propagates
                          * from them; default 0: a lacking stage is one the
                          * candidate computed internally (a fused kernel), and
                          * its error bound propagates downstream (tolerances.md) */
    int strict_storage;  /* a stage stored coarser than the case's type FAILs (check
                          * "storage"); default 0: judged at its own precision, with
                          * a NOTE (an INFO line) */
    double false_alarm;  /* the statistical tier's false-alarm probability per case: a
                          * correct candidate FAILs it with at most this probability
                          * under the model of tolerances.md (default 1e-6; 0: the
                          * default; negative: the tier is off) */
    dl_valueset_t require; /* stages (DL_VALUE_BIT(v)) the candidate must provide:
                          * one it lacks is a FAIL (check "required"), not a SKIP;
                          * values the case does not have are ignored (default 0) */
    /* Called (when not NULL) with progress_ctx as each stage value is judged:
     * its name, and the share of the case's elements judged before it, in
     * [0, 1]; once more with stage "done" and 1 at the end. Informational:
     * the verdicts do not depend on it (default NULL). */
    void (*progress)(void *ctx, const char *stage, double done);
    void *progress_ctx;
} dl_check_options_t;

/* Fills *o with the defaults. */
DL_EXTERN void dl_check_options_default(dl_check_options_t *o);

/* ---------------------------------------------------------------- results */

/* One check of one stage. Figures that do not apply are NaN (JSON null) or
 * -1 (indices). err_pass is the largest |c - g| divided by that element's
 * PASS bound: <= 1 everywhere means PASS; err_warn likewise for the WARN
 * bound. max_ulp is in units of the last place of the stage's storage type
 * at the golden value. */
typedef struct {
    dl_value_t stage;
    char check[24];         /* "numerics", "exact", "routing", "bijection", ... */
    dl_verdict_t verdict;
    int64_t n_checked;      /* elements compared */
    int64_t n_over_pass;    /* elements over the PASS bound */
    int64_t n_over_warn;    /* elements over the WARN bound (FAILing elements) */
    int64_t n_nonfinite;    /* NaN/Inf in the candidate */
    double err_pass, err_warn, max_ulp, max_abs;
    int64_t worst_index;    /* flat element index of the largest err_pass */
    double worst_cand, worst_exact;
    int64_t K;              /* contraction length (largest, for ragged stages); 0: n/a */
    char message[512];
    /* The statistical tier (doc/tolerances.md), where the stage's bound
     * carries error propagated from absent stages: err_stat is the largest
     * |c - g| over the element's own worst-case bound plus lambda times the
     * scale sigma of the propagated error (> 1 anywhere is a FAIL, with the
     * false-alarm probability of the options), lambda that multiplier; NaN
     * where the tier does not apply. n_over_stat: the elements beyond it. */
    double err_stat, lambda;
    int64_t n_over_stat;
    char tier[16];          /* the bound that decided a numerics verdict: "worst-case"
                             * (FAIL beyond the WARN bound, or NaN/Inf), "statistical"
                             * (FAIL beyond the statistical bound), "pass" (PASS or WARN
                             * by the PASS bound); "" for other checks */
} dl_check_result_t;

/* A dropped assignment: token t lost its slot j (the candidate's own slot
 * numbering). */
typedef struct {
    int64_t token, slot;
} dl_check_drop_t;

typedef struct {
    char case_name[128], backend[128], backend_version[64], profile[32];
    dl_verdict_t verdict;       /* the worst verdict; SKIP if nothing was checked */
    size_t n;                   /* results */
    dl_check_result_t *results;
    int64_t n_dropped;          /* dropped (token, slot) pairs found, all evidence */
    dl_check_drop_t *dropped;   /* sorted by token then slot */
    double seconds;             /* wall time of dl_check_run */
} dl_check_report_t;

/* Checks candidate c against golden g under the options (NULL: defaults),
 * filling *r (free with dl_check_report_free, also after an error). A
 * nonconforming candidate is not an error: it is a report with FAILs.
 * Errors: DL_EINVAL (NULL pointers, invalid configuration, golden missing a
 * forward stage), DL_ENOMEM, or an error of the oracle's stage functions on
 * golden data (then the golden is broken). */
DL_EXTERN int dl_check_run(const dl_check_golden_t *g, const dl_check_candidate_t *c,
                           const dl_check_options_t *o, dl_check_report_t *r);
DL_EXTERN void dl_check_report_free(dl_check_report_t *r);

/* Checks a stage-isolated candidate, as `dropless run` produces: each of
 * the ngroups sets (DL_VALUE_BIT(v)) names values that one call
 * computed from the golden inputs of that call. Each group is checked on
 * golden upstream only (values of other groups never feed its exact
 * recomputation), and the findings are merged into one report; case-level
 * findings (token accounting) are kept when they are not PASS. Values in no
 * group are checked together last. Errors as dl_check_run. */
DL_EXTERN int dl_check_run_isolated(const dl_check_golden_t *g, const dl_check_candidate_t *c,
                                    const dl_check_options_t *o, const dl_valueset_t *groups, int ngroups,
                                    dl_check_report_t *r);

/* Parses a stage-isolation spec, groups of stage names separated by ';',
 * names within a group by ',' ("router_logits,router_scores;out"), into at
 * most max sets. Returns the number of groups, or DL_EINVAL (an unknown
 * name, an empty group, too many groups). */
DL_EXTERN int dl_check_parse_groups(const char *spec, dl_valueset_t *groups, int max);
/* Writes sets back as a spec into buf (n bytes). 0, DL_EINVAL or DL_EOVERFLOW. */
DL_EXTERN int dl_check_format_groups(const dl_valueset_t *groups, int ngroups, char *buf, size_t n);

/* Appends a finding made outside dl_check_run (the plugin executor's: a
 * crash or time-out is a FAIL, a nondeterministic stage a WARN, ...) and
 * updates r->verdict. stage may be DL_VALUE_NONE; message may be NULL.
 * Returns 0, DL_EINVAL or DL_ENOMEM. */
DL_EXTERN int dl_check_report_add(dl_check_report_t *r, dl_value_t stage, const char *check,
                                  dl_verdict_t verdict, const char *message);

/* 1 if some check of the report judged something (a PASS, WARN or FAIL),
 * else 0: only SKIP and INFO lines, nothing was checked. */
DL_EXTERN int dl_check_checked(const dl_check_report_t *r);

/* 1 if the report has no FAIL and checked something (WARN, SKIP and INFO
 * conform; nothing checked is never conformance), else 0. */
DL_EXTERN int dl_check_conformant(const dl_check_report_t *r);

/* Exit status of the command: 0 conformant, 1 not conformant, 2 usage or
 * unreadable input (the caller's to return when no report could be made),
 * or nothing checked. */
#define DL_CHECK_EXIT_CONFORMANT 0
#define DL_CHECK_EXIT_NONCONFORMANT 1
#define DL_CHECK_EXIT_USAGE 2
/* Over n reports: DL_CHECK_EXIT_NONCONFORMANT if one has a FAIL, else
 * DL_CHECK_EXIT_USAGE if one checked nothing (dl_check_checked), else
 * DL_CHECK_EXIT_CONFORMANT. */
DL_EXTERN int dl_check_exit_status(const dl_check_report_t *const *r, size_t n);

/* ---------------------------------------------------------------- reports */

typedef enum {
    DL_REPORT_TABLE = 0, /* human: one line per stage x check */
    DL_REPORT_JSON = 1,  /* one object per report (an array when n > 1) */
    DL_REPORT_JUNIT = 2  /* one <testsuite> per report, one <testcase> per stage x check */
} dl_report_format_t;

#define DL_REPORT_COLOUR 1u  /* ANSI colours in the table */
#define DL_REPORT_ALL 2u     /* the table lists SKIP lines too */

/* Parses "table", "json", "junit" (also "text", "xml"). 0 or DL_EINVAL. */
DL_EXTERN int dl_report_format_parse(const char *name, dl_report_format_t *fmt);

/* Writes n reports to f in the format. Returns 0, DL_EINVAL or DL_EIO. */
DL_EXTERN int dl_check_write(FILE *f, dl_report_format_t fmt, const dl_check_report_t *const *r,
                             size_t n, unsigned flags);
/* The same to a file: dl_report_open, then dl_report_commit. An existing
 * path is kept (DL_EEXIST) unless flags has DL_REPORT_FORCE; "-" writes to
 * stdout. Returns 0, DL_EINVAL, DL_EEXIST, DL_ENOMEM or DL_EIO. */
DL_EXTERN int dl_check_save(const char *path, dl_report_format_t fmt,
                            const dl_check_report_t *const *r, size_t n, unsigned flags);

#define DL_REPORT_FORCE 4u   /* replace an existing report file (a regular file only) */

/* A report file reserved before the work that fills it, so that a path
 * that cannot be written is found before a long check, not after. */
typedef struct dl_report_out dl_report_out_t;

/* Reserves path ("-": stdout) for a report: refuses an empty path
 * (DL_EINVAL), an existing one unless flags has DL_REPORT_FORCE
 * (DL_EEXIST), anything but a regular file even then (a directory, device,
 * FIFO or symbolic link: DL_EEXIST), a directory it cannot create a file in
 * (DL_EIO); creates a temporary file beside path. One-line message naming
 * path in err (errlen bytes, may be NULL). On success *out is owned by the
 * caller until dl_report_commit or dl_report_discard. SIGINT, SIGTERM and
 * SIGHUP remove the temporary. */
DL_EXTERN int dl_report_open(const char *path, unsigned flags, dl_report_out_t **out,
                             char *err, size_t errlen);
/* Writes the n reports into o's temporary and moves it to its path (see
 * dl_report_open; the rules are checked again), then frees o whatever
 * happens. flags as for dl_check_write. Returns 0, DL_EINVAL, DL_EEXIST or
 * DL_EIO (e.g. a full disk) with a one-line message; no partial report is
 * ever left under the path. */
DL_EXTERN int dl_report_commit(dl_report_out_t *o, dl_report_format_t fmt,
                               const dl_check_report_t *const *r, size_t n, unsigned flags,
                               char *err, size_t errlen);
/* Removes o's temporary and frees o (NULL: nothing). */
DL_EXTERN void dl_report_discard(dl_report_out_t *o);

#ifdef __cplusplus
}
#endif
#endif
