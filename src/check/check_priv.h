/* Private to the conformance runner (src/check/); not installed. */
#ifndef DL_CHECK_PRIV_H
#define DL_CHECK_PRIV_H
#include <math.h>
#include "stages/stages_priv.h"
#include "util/util_priv.h"
#include "dropless/check.h"

/* The statistical tier's false-alarm probability per case unless the
 * options say otherwise (tolerances.md). */
#define DL__FALSE_ALARM_DEFAULT 1e-6

/* dl__mkind_t and dl__mprov_t, how M is obtained: stages_priv.h (each
 * stage's checking side sets them up). */

/* One comparison of a float stage against its exact values. */
typedef struct {
    dl_value_t stage;
    const char *check;         /* result name, "numerics" by default */
    dl_dtype_t t;              /* storage type of the stage */
    int64_t rows, cols;
    const float *cand, *exact; /* [rows, cols] */
    const uint8_t *row_skip;   /* rows not compared (missing from the candidate's dispatch) */
    const int64_t *row_K;      /* per-row contraction length, or NULL for K */
    int64_t K;
    int kappa_in;              /* GEMM operands off the profile's input grid */
    int elem;                  /* elementwise transcendental stage */
    int short_sum;             /* a short sum of separately computed parts */
    int prod_store;            /* a dot whose products may be stored in the case's type */
    const dl__mprov_t *mp;     /* NULL: M = |g| */
    uint8_t *row_fail;         /* out, may be NULL: rows with an element over the WARN bound */
    int64_t *row_over;         /* out, may be NULL: per row, the elements over the PASS bound */
    const double *prop[3];     /* NULL or [rows, cols]: the PASS [0] and WARN [1] error the
                                * stages the candidate lacks propagate into this one (prop.c) */
    int info;                  /* figures only (drift): verdict INFO */
    /* prop[2]: the statistical tier's scale sigma of the propagated error
     * (DL__TIER_STAT); the element's statistical bound is its own WARN
     * bound plus lambda sigma (tolerances.md, "The statistical tier") */
} dl__cmp_t;

/* The bound tiers of one element: PASS, WARN (worst case), and the
 * statistical one (delta[DL__TIER_STAT] holds scales sigma, not bounds). */
#define DL__TIER_PASS 0
#define DL__TIER_WARN 1
#define DL__TIER_STAT 2
#define DL__TIERS 3

/* The runner's record of one stage value s, ck->st[s]: its arrays, the
 * storage it is judged at, the bounds on its hidden error, and the
 * driver's flags (stage.c, desc.c, prop.c). eff is the value downstream
 * stages are recomputed on: the candidate's own (put in the oracle's row
 * layout and slot order) where it provides a finite one, else the exact
 * stage value; *_golden says it is bitwise the golden's, which lets the
 * runner reuse golden values instead of recomputing. */
typedef struct {
    const void *cand;  /* the candidate's: canonical slot order, its row layout (NULL: absent) */
    const void *gold;  /* the golden's (NULL: absent) */
    const void *exact; /* the exact value on the effective upstream */
    const void *eff;
    int exact_golden, eff_golden, eff_is_cand;
    int64_t numel;
    /* stored coarser than the case's type (bit s of ck->coarse): the
     * candidate's declared or inferred type */
    dl_dtype_t store;
    /* absent and upstream of a provided stage: per element, the PASS [0]
     * and WARN [1] bound on the error of the candidate's hidden value, and
     * the statistical tier's scale [2] (NULL: none); binary32, each
     * rounded up from its binary64 value (dl__ck_up32f) */
    float *delta[DL__TIERS];
    int need;       /* its value is needed: the candidate's, or upstream of one */
    int track;      /* absent and upstream of a provided stage: its error is bounded */
    int recomputed; /* exact was recomputed, not the golden's */
    int exact_owned; /* exact is an array of the stage walk's (dl__ck_take) */
    int prop_used;  /* a provided stage's bound carries propagated error */
    /* the statistical tier: a hidden value whose error is coherent across
     * its elements (GEMM operands rounded to the profile's input grid, and
     * what such a value feeds) propagates linearly, never by root sum of
     * squares */
    int coherent;
    /* reuse.c: the units (elements, rows, experts) of exact recomputed on
     * a changed upstream, the rest the golden's; -1: recomputed whole */
    int64_t reused;
} dl__ck_stage_t;

/* reuse.c: the compact upstream of the last partial recomputation, kept
 * for the next stage when it reads the same arrays in the same units. */
typedef struct {
    int stage, shape, elem;
    int64_t nchg, units;
    uint8_t *chg; /* the changed units' mask it was gathered by */
    dl_valueset_t floats;
    const void *on[DL_VALUE_COUNT]; /* the effective arrays gathered */
    float *arr[DL_VALUE_COUNT];     /* their changed units, compact (in buf) */
#define DL__CK_REUSE_BUFS (DL_VALUE_COUNT + 4)
    float *buf[DL__CK_REUSE_BUFS];  /* reuse.c's buffers, the run's memory */
    int64_t cap[DL__CK_REUSE_BUFS];
} dl__ck_reuse_t;

typedef struct dl__ck dl__ck_t;
#define DL__CK_POOL 32 /* arrays a run keeps for reuse (dl__ck_give) */
/* The runner's scratch arrays (doubles), reused by every stage of a run
 * (no fresh pages per call): a block of an operand's magnitudes (A), a
 * whole operand's (the rhs of a grouped provider's terms, B and B2; the
 * ragged one's a and b, RA and RB: tagged by scr_src, tol.c), a bulk M, a
 * propagation's product, an absent stage's propagated error. */
enum {
    DL__CK_SCR_A, DL__CK_SCR_B, DL__CK_SCR_B2, DL__CK_SCR_RA, DL__CK_SCR_RB, DL__CK_SCR_M,
    DL__CK_SCR_TMP, DL__CK_SCR_P,
    /* binary32 magnitudes for dl__ck_m_up (float arrays in these slots) */
    DL__CK_SCR_FA, DL__CK_SCR_FB, DL__CK_SCR_FB2, DL__CK_SCR_FC,
    DL__CK_SCRATCH
};
/* The second chained level (chain.c: dl__ck_chained_second), which the
 * stage walk calls on a FAIL where it is set: 1 when it turned r into a
 * WARN, 0 when r stays, or an error. */
typedef int (*dl__ck_second_t)(dl__ck_t *ck, dl_value_t s, dl_check_result_t *r);

/* Working state of one dl_check_run: the case, the options, the report,
 * the run's figures, and one record per stage value (st). */
struct dl__ck {
    const dl_moe_config_t *c;
    const dl_moe_inputs_t *in;
    const dl_moe_forward_t *gf;
    const dl_moe_backward_t *gb; /* NULL when the golden has no backward */
    const dl_check_candidate_t *cand;
    const dl_check_profile_t *prof;
    dl_check_options_t opt;
    dl_check_report_t *rep;
    size_t rep_cap;
    size_t drop_cap;

    int64_t T, d, f, E, k, M;
    int swiglu;
    dl_dtype_t act;

    void **owned;
    size_t n_owned, cap_owned;
    size_t *owned_bytes; /* each owned array's size (dl__ck_release keeps some) */
    /* stages stored coarser than the case's type: the candidate's
     * declaration (dtype attribute, a 2-byte type) or inferred from the
     * values (every one on the bf16 or fp16 grid; inferred bit); the type
     * in st[s].store */
    dl_valueset_t coarse, inferred;
    int have_bwd;                      /* golden backward and d_out present */

    /* slot canonicalisation: candidate flat index t*k+j <-> canonical */
    int32_t *to_canon, *from_canon; /* NULL: identity */
    /* the candidate's sorted rows: oracle row q lives in candidate row
     * row_map[q] (-1: the assignment is missing there); NULL: identity */
    int32_t *row_map;
    uint8_t *row_missing;            /* [M] oracle rows the candidate lacks; NULL: none */
    int64_t n_row_missing;
    const float *tie_margin;         /* exact margins on the effective scores */
    int32_t *exact_ids;              /* exact top-k on the effective scores */
    float *exact_weights;
    int ids_cand_valid;
    int64_t n_diag_rows, n_unexplained; /* out rows diagnosed, rows no drop explains */
    int64_t n_unnamed; /* slots of the drop sets found that are below the floor */
    const double *prop_out[DL__TIERS]; /* the propagated error of out (NULL: none) */
    double lambda; /* the statistical tier's multiplier for the case's false-alarm rate */
    int64_t n_stat;                  /* elements the statistical tier judges */
    dl__ck_stage_t st[DL_VALUE_COUNT]; /* the driver's record of each stage */
    dl__ck_second_t second;            /* NULL: no second chained level (a nested run) */
    double *scr[DL__CK_SCRATCH]; /* scratch (tol.c: dl__ck_scratch), freed by the run */
    int64_t scr_n[DL__CK_SCRATCH];
    const float *scr_src[DL__CK_SCRATCH]; /* the operand a slot holds whole (NULL: none) */
    int scr_sq[DL__CK_SCRATCH];
    int64_t scr_len[DL__CK_SCRATCH];
    dl__spare_t spare; /* a two-output exact function's other output (vctx.c) */
    dl__memo_t memo;   /* logistic values of the gates (vctx.c) */
    dl_valueset_t up[DL_VALUE_COUNT]; /* dl__ck_upstream of each value, once have_up */
    int have_up;
    /* arrays of the run (dl__ck_alloc'd) that no later stage reads, for
     * dl__ck_take to hand out again: reused pages instead of fresh ones */
    void *pool[DL__CK_POOL];
    size_t pool_bytes[DL__CK_POOL];
    int n_pool;
    dl__ck_reuse_t reuse; /* reuse.c */
};

/* result.c */
void *dl__ck_alloc(dl__ck_t *ck, int64_t n, size_t size);
/* An array of n elements of size bytes owned by ck: one dl__ck_give
 * handed back where one is large enough (zeroed when zero is set, else
 * its contents undefined), else a fresh zeroed dl__ck_alloc; NULL on no
 * memory. */
void *dl__ck_take(dl__ck_t *ck, int64_t n, size_t size, int zero);
/* Hands back array p (dl__ck_alloc'd, bytes long) that nothing reads any
 * more, for dl__ck_take; a full pool keeps it until the run ends. */
void dl__ck_give(dl__ck_t *ck, void *p, size_t bytes);
/* Frees the run's arrays (owned and scratch), or keeps a few small ones
 * for the next run's dl__ck_alloc (a run's own memory, not its report). */
void dl__ck_release(dl__ck_t *ck);
dl_check_result_t *dl__ck_result(dl__ck_t *ck, dl_value_t s, const char *check);
void dl__ck_msg(dl_check_result_t *r, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void dl__ck_msg_append(dl_check_result_t *r, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int dl__ck_add_drop(dl__ck_t *ck, int64_t canon_flat);
/* Turns the SKIP of every required stage the candidate lacks into a FAIL. */
int dl__ck_require(dl__ck_t *ck);
/* The worst verdict of r's results, INFO aside; SKIP when there are none. */
dl_verdict_t dl__ck_worst_verdict(const dl_check_report_t *r);

/* tol.c */
/* The profile stage s is judged under: its per-stage profile, else the
 * whole layer's. */
const dl_check_profile_t *dl__ck_prof(const dl__ck_t *ck, dl_value_t s);
double dl__ck_ulp(double g, dl_dtype_t t);
/* The PASS (warn = 0) or WARN (warn = 1) bound for one element. */
double dl__ck_bound(const dl__ck_t *ck, const dl__cmp_t *cmp, double g, double M, int64_t K,
                    int warn);
/* dl__ck_bound split: what depends only on (stage, K, tier), computed once
 * per row (dl__ck_bound_coef), and the per-element rest (dl__ck_bound_at),
 * with dl__ck_bound's operations in its order (bitwise the same bound). */
typedef struct {
    double nu, f2, eta, kt, kap;
    int stat;        /* the statistical tier: its one rounding per element */
    double uo, kw;   /* u_out and the worst-case gamma_K (kap_w) for it */
    dl_dtype_t t;
} dl__ck_bc_t;
void dl__ck_bound_coef(const dl__ck_t *ck, const dl__cmp_t *cmp, int64_t K, int warn,
                       dl__ck_bc_t *bc);
static inline double dl__ck_bound_at(const dl__ck_bc_t *bc, double g, double M)
{
    double b = bc->nu * fabs(g) * bc->f2 + bc->eta + bc->kt;
    /* the statistical tier's one rounding: Hoeffding's bound b of this
     * element's rounding error, half an ulp at the magnitude of the value
     * rounded, which is at most |g|(1 + 2u) + kap_w M (its worst-case
     * accumulation): between u|g|/2 and u|g| where M is not much above
     * |g|, so sigma is no wider than the rounding can be (tolerances.md) */
    if (bc->stat) {
        const double top = fabs(g) * bc->f2 + bc->kw * M;
        b += isfinite(top) ? fmin(bc->uo * top, 0.5 * dl__ck_ulp(top, bc->t))
                           : bc->uo * fabs(g) * bc->f2;
    }
    if (M != 0.0)
        b += bc->kap * M;
    return b;
}
/* 1 if x's storage grid lies inside the profile's GEMM input grid. */
int dl__ck_on_input_grid(const dl_check_profile_t *p, dl_dtype_t t);
int dl__ck_compare(dl__ck_t *ck, dl__cmp_t *cmp, dl_check_result_t *res);
/* M of element (row, col) of a provider (per-element path). */
double dl__ck_m_elem(const dl__mprov_t *mp, int64_t row, int64_t col);
/* M of every element, bulk path; out is [rows, cols]. x (NULL: none)
 * replaces one operand by a delta rounded up to binary32 (prop.c): the
 * lhs of the provider's one term (grouped), a (which 0) or b (which 1)
 * (ragged); sq: the delta and the other operand squared (the statistical
 * tier's root sum of squares). */
typedef struct {
    const float *delta;
    int which, sq;
} dl__ck_mop_t;
int dl__ck_m_bulk(dl__ck_t *ck, const dl__mprov_t *mp, int64_t rows, const dl__ck_mop_t *x,
                  double *out);
/* An upper bound of dl__ck_m_bulk's exact M (or propagation, x as there)
 * for the fused checks' bounds (absent_delta, prop.c): a grouped
 * provider's blocks in binary32 (sgemm, about twice dgemm's speed) where
 * the operands' range rules out overflow and underflow, inflated by
 * 1 + 2 (K + 4) 2^-24 for the roundings of a sum of K nonnegative
 * products (any order); elsewhere dl__ck_m_bulk itself. */
int dl__ck_m_up(dl__ck_t *ck, const dl__mprov_t *mp, int64_t rows, const dl__ck_mop_t *x,
                double *out);
/* Vector clones of the absent stages' straight-line loops (stage.c,
 * tol.c's binary32 magnitudes): the clones compute the same IEEE
 * operations (-ffp-contract=off), so their values are bitwise the
 * scalar ones. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define DL__CK_VEC                                                                             \
    __attribute__((target_clones("avx512f", "avx2", "default"),                                \
                   optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define DL__CK_VEC
#endif
/* Elements per call of such a loop inside a parallel loop over chunks. */
#define DL__CK_VCHUNK 4096
/* x >= 0 (or NaN) rounded up to binary32: RN's float, stepped to the
 * next one up by its bits where it fell below x (a positive float's bits
 * + 1 are the next float up; FLT_MAX + 1 is +inf; +inf and NaN stay).
 * An upper bound stays one: the deltas are stored so (tests/test_fusedck.c
 * checks it against binary64 on random and boundary values). */
static inline float dl__ck_up32f(double x)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = (float)x};
    v.u += (double)v.f < x;
    return v.f;
}
/* stage.c: one row of n elements of an absent stage's deltas of one tier
 * (bound coefficients bc): dl__ck_bound_at(bc, g, M) (m NULL: M = |g|)
 * plus the propagated error p (NULL: none) times DL__CK_PROP_SLACK, or
 * with rss their dl__ck_hypot_up, evaluated in binary64 (bitwise those
 * functions' values) and stored rounded up to binary32 (dl__ck_up32f).
 * dl__ck_delta_mutant 1 stores the float below instead (a negative
 * control for tests/test_fusedck.c). */
void dl__ck_row_deltas(const dl__ck_bc_t *bc, int64_t n, const float *g, const double *m,
                       const double *p, float *dl, int rss);
extern int dl__ck_delta_mutant;
/* 1: dl__ck_m_up and dl__ck_hypot_up take the binary64 path of before
 * (dl__ck_m_bulk, hypot): tests compare the two paths' reports. */
extern int dl__ck_f64_bounds;
/* sqrt(a^2 + b^2) rounded up (an upper bound, not hypot's nearest); a, b
 * >= 0 (inline: the absent stages' statistical tier takes one per
 * element). */
static inline double dl__ck_hypot_up(double a, double b)
{
    /* a^2, b^2, their sum and the root each err by at most u = 2^-53
     * relative where nothing under- or overflows (both in [2^-450, 2^450]
     * or zero), so the computed root is >= exact (1 - u)^3 and the factor
     * 1 + 2^-50 > (1 - u)^-3 (1 + u) makes it an upper bound; outside
     * that range the float after hypot's (which errs by less than an ulp) */
    const double h = a > b ? a : b, l = a > b ? b : a;
    if (l == 0.0)
        return h;
    if (dl__ck_f64_bounds)
        return hypot(a, b);
    if (!(h <= 0x1p450 && l >= 0x1p-450)) /* hypot errs by less than an ulp */
        return nextafter(hypot(a, b), INFINITY);
    return sqrt(a * a + b * b) * (1.0 + 0x1p-50);
}
/* How the comparison obtains M of the elements that differ (tol.c;
 * tolerances.md, "M of a compared element"): DL__CK_M_PRUNED brackets M
 * and takes dl__ck_m_elem only where a bracket leaves a figure open;
 * DL__CK_M_EXACT, the reference, takes it for every element that differs
 * (DROPLESS_CHECK_M=exact in the environment does too); DL__CK_M_MUTANT
 * prunes with an upper end too small (a negative control for the tests).
 * dl__ck_m_mode -1 (the default): from the environment. The figures of
 * the first two are bitwise the same. */
enum { DL__CK_M_PRUNED, DL__CK_M_EXACT, DL__CK_M_MUTANT };
extern int dl__ck_m_mode;
/* What the comparisons took since these were last zeroed: blocks by path
 * (0 per element, 1 norms' brackets, 2 bulk brackets; only the last two
 * counted), elements differing in bracketed blocks, and the exact M
 * those took. */
typedef struct {
    int64_t blocks[3], diff, exact;
} dl__ck_m_stats_t;
extern dl__ck_m_stats_t dl__ck_m_stats;
/* Scratch slot's array of at least n doubles, owned by ck (contents not
 * kept between calls), or NULL on no memory. */
double *dl__ck_scratch(dl__ck_t *ck, int slot, int64_t n);

/* route.c */
int dl__ck_route_ids(dl__ck_t *ck);
/* select.c: what route.c and ties.c share. Token t's selection key for
 * expert e (score + bias, as the selection rounds it). */
double dl__ck_key(const dl__ck_t *ck, const float *s, int64_t e);
/* 1 when the k ids of a and b are the same set. */
int dl__ck_same_set(const int32_t *a, const int32_t *b, int64_t k);
/* Scratch of the plausibility tests: tol[E] holds the token's per-expert
 * tolerances (dl__ck_key_tolv) before dl__ck_plausible / dl__ck_may_flip. */
typedef struct {
    double *tol;
    float *srow, *wt;
    int32_t *ids;
    uint8_t *in;
} dl__ck_sel_t;
int dl__ck_sel_init(dl__ck_t *ck, dl__ck_sel_t *w);
/* The WARN bound of score element (t, e) given the effective logits. */
double dl__ck_score_bound(const dl__ck_t *ck, const float *logits, const float *scores, int64_t t,
                          int64_t e, int warn);
/* The WARN tolerance on token t's key of each expert, tol[E]: the score
 * bound there, the key's rounding with a bias, and, when the candidate gives
 * neither logits nor scores, the error its hidden router GEMM may carry at
 * that expert, through the score function. */
void dl__ck_key_tolv(const dl__ck_t *ck, int64_t t, double *tol);
/* 1 when the exact rule picks the set c on token t's scores with each
 * expert moved by at most its own tolerance (w->tol): a plausible tie. */
int dl__ck_plausible(const dl__ck_t *ck, int64_t t, const int32_t *c, dl__ck_sel_t *w);
/* 1 when some such move makes the exact selection x of token t differ (or
 * its tie is exact). */
int dl__ck_may_flip(const dl__ck_t *ck, int64_t t, const int32_t *x, dl__ck_sel_t *w);
/* dl__ck_may_flip of every token's exact selection (its tolerances computed
 * here), into flip[T]; 0 or DL_ENOMEM. */
int dl__ck_may_flip_all(dl__ck_t *ck, dl__ck_sel_t *w, uint8_t *flip);
/* ties.c: without candidate topk_ids, the plausible selection nearest the
 * candidate's out for each token inside its tie margin; *ids is a copy of
 * the exact ids with those (owned by ck), or NULL when none differs. */
int dl__ck_infer_ties(dl__ck_t *ck, int32_t **ids);

/* tokens.c */
int dl__ck_canonicalise(dl__ck_t *ck);
int dl__ck_tokens(dl__ck_t *ck);
int dl__ck_diagnose_out(dl__ck_t *ck, const uint8_t *row_fail, const float *cand_out);
int dl__ck_zero_drops(dl__ck_t *ck);

/* The parts of the layer a per-part profile names, the part column of
 * DL_VALUE_MAP (values.h); DL__CK_PART_##part maps a row's column. */
#define DL__CK_PART_NONE 0
#define DL__CK_PART_ROUTER 1
#define DL__CK_PART_EXPERTS 2
#define DL__CK_PART_COMBINE 3

/* What an element of a value depends on, the reuse column of
 * DL_VALUE_MAP (values.h); DL__CK_REUSE_##reuse maps a row's column. */
#define DL__CK_REUSE_NONE 0
#define DL__CK_REUSE_ALL 1
#define DL__CK_REUSE_EACH 2
#define DL__CK_REUSE_ROW 3
#define DL__CK_REUSE_EXPERT 4

/* desc.c: one descriptor per stage value. */
#define DL__CK_COPY 1u      /* a permutation of an input: compared bitwise */
#define DL__CK_DW 2u        /* a weight gradient: empty experts' rows must be zero */
#define DL__CK_DRIFT 4u     /* an end result: drift against the golden is reported */
#define DL__CK_DROPS 8u     /* the layer's output: zero drops are proven on it */
#define DL__CK_WITH_SORT 16u /* checked with sort_perm by the token accounting */
typedef struct {
    dl_valueset_t up;       /* the stages whose stored values this one is a function of */
    dl_valueset_t up_plain; /* the same for DL_FFN_PLAIN where it differs, else 0 */
    int kind;          /* 0: the row's check column is NONE (the runner refuses) */
    /* The exact value on the effective upstream, into out (numel floats),
     * and the comparison's M provider and constants: beside the stage. */
    int (*exact)(const dl__vctx_t *v, float *out);
    int (*mag)(const dl__vctx_t *v, const float *g, int64_t numel, dl__mag_t *m);
    unsigned flags;
    /* A value checked by its own routine (routing ids, token accounting). */
    int (*check)(dl__ck_t *ck);
    /* The propagation of absent upstream error: its derivative magnitudes
     * beside the stage (prop), or through its magnitude GEMMs (prop_gemm). */
    int (*prop)(const dl__vctx_t *v, const float *g, int64_t numel, double *out);
    int prop_gemm;
    int part; /* the part column: DL__CK_PART_* */
    int reuse; /* the reuse column: DL__CK_REUSE_* */
} dl__ck_desc_t;
const dl__ck_desc_t *dl__ck_desc(dl_value_t s);
/* Why descriptor d (of a value stored as store) describes no check, or
 * NULL when it does. */
const char *dl__ck_desc_gap(const dl__ck_desc_t *d, dl_store_t store);
/* DL_EINVAL (with a FAIL result naming it) when some value has no check in
 * the table: the runner refuses to start rather than skip it silently. */
int dl__ck_table_check(dl__ck_t *ck);
/* vctx.c (a leaf): the runner's view of the layer for the stages' checking
 * sides; tier
 * DL__TIER_PASS, _WARN or _STAT for a propagation (the deltas of that
 * tier), -1 for none. */
void dl__ck_vctx(dl__ck_t *ck, int tier, dl__vctx_t *v);
/* vctx.c: the storage type of stage s in the case (the golden's). */
dl_dtype_t dl__ck_case_type(const dl__ck_t *ck, dl_value_t s);
/* Stage s's exact value on the effective upstream (its row's function). */
int dl__ck_exact(dl__ck_t *ck, dl_value_t s, float *out);
/* Sets up cmp's M provider (mp, owned by the caller) and constants for s. */
int dl__ck_mag(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp);
/* The upstream mask of s for the case's FFN kind (from ck->up once
 * dl__ck_upstream_init has filled it: the masks are looked up by value
 * name, too slow for the stage walk's every call). */
dl_valueset_t dl__ck_upstream(const dl__ck_t *ck, dl_value_t s);
void dl__ck_upstream_init(dl__ck_t *ck);
/* The storage type of stage s in this case (the candidate's own where it
 * stores the stage coarser). */
dl_dtype_t dl__ck_stage_type(const dl__ck_t *ck, dl_value_t s);

/* prop.c: the first-order error that the absent upstream of stage s
 * propagates into it, PASS (warn = 0) or WARN bound, into *out (an array
 * of numel[s] doubles, oracle layout: owned by ck when keep, else the
 * scratch slot DL__CK_SCR_P, valid until the next call), or NULL when no
 * upstream stage carries an error. cmp is the stage's comparison setup. */
int dl__ck_propagate(dl__ck_t *ck, dl_value_t s, const dl__cmp_t *cmp, int warn, int keep,
                     double **out);
/* dl__ck_propagate's sums into p (numel[s] doubles, zeroed here when an
 * upstream carries an error), without the first-order slack: the caller
 * multiplies by DL__CK_PROP_SLACK (absent_delta, in its bound loop).
 * Returns 1 if anything was propagated, 0 if nothing (p untouched), or
 * an error. */
#define DL__CK_PROP_SLACK (1.0 + 0x1p-20)
int dl__ck_propagate_into(dl__ck_t *ck, dl_value_t s, const dl__cmp_t *cmp, int warn, double *p);

/* chain.c: a stage that FAILs on the candidate's own upstream, judged as
 * the candidate's only stage (the exact inputs, absent upstream error
 * propagated): within that bound r becomes a WARN saying so (1), else r
 * stays (0); or an error. */
int dl__ck_chained_second(dl__ck_t *ck, dl_value_t s, dl_check_result_t *r);

/* reuse.c: stage s's exact value into x (numel floats) as the golden's
 * with only the units its reuse column says a changed upstream reaches
 * recomputed, by its own exact function on compact copies: 1 when done,
 * 0 when it does not apply (the caller recomputes the whole), or an error. */
int dl__ck_exact_reuse(dl__ck_t *ck, dl_value_t s, float *x);
/* 1 when the dispatch the runner uses is the golden's (the same effective
 * topk_ids, no missing row): only then do the golden's sorted-row and
 * expert values line up with the candidate's rows (reuse.c). */
int dl__ck_golden_dispatch(const dl__ck_t *ck);
/* The tests' switch (only tests set it; 0 in a run): mode FULL recomputes
 * whole as before this path existed, MUTANT reuses the first changed unit
 * (a defect the tests must catch); seen, where set, is called with each
 * recomputed exact value. */
#define DL__CK_REUSE_TEST_FULL 1
#define DL__CK_REUSE_TEST_MUTANT 2
typedef struct {
    int mode;
    void (*seen)(void *ctx, const dl__ck_t *ck, dl_value_t s, const float *exact);
    void *ctx;
} dl__ck_reuse_test_t;
extern dl__ck_reuse_test_t dl__ck_reuse_test;

/* stage.c */
int dl__ck_stages(dl__ck_t *ck);
/* The comparison of stage s against its exact values set up by its
 * descriptor (M provider mp, owned by the caller; rows and columns). */
int dl__ck_setup_cmp(dl__ck_t *ck, dl_value_t s, dl__cmp_t *cmp, dl__mprov_t *mp);
/* run.c: one run of the runner, dl_check_run's contract, with the second
 * chained level second (NULL: none). */
int dl__ck_run(const dl_check_golden_t *g, const dl_check_candidate_t *cand,
               const dl_check_options_t *o, dl__ck_second_t second, dl_check_report_t *r);
/* ep.c: the candidate's expert-parallel layouts */
int dl__ck_ep(dl__ck_t *ck);
/* layouts.c: the candidate's kernel layouts; feed (before the stages):
 * their valid y rows become the candidate's y_sorted when it has none */
int dl__ck_layouts_feed(dl__ck_t *ck);
int dl__ck_layouts(dl__ck_t *ck);

#endif
