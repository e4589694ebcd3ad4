/* dropless/mutate.h: mutated candidates, the oracle's test of itself
 * (issue 24 item 5, doc/power.md). From a golden file, candidates in which
 * one stage was computed wrongly (a gain, a flipped sign, a zeroed row, an
 * off-by-one group boundary, a dropped slot, two experts swapped, bf16
 * accumulation, TF32 products, one expert's weights an ulp off) or
 * legitimately differently (rows reordered within an expert), everything
 * downstream of that stage recomputed by the oracle's stage functions on
 * the mutated values, and handed over in three modes: every stage
 * (staged), out and d_x (fused), out alone. Part of the golden layer;
 * include <dropless.h>. */
#ifndef DROPLESS_MUTATE_H
#define DROPLESS_MUTATE_H
#include "golden.h"
#include "values.h"
#ifdef __cplusplus
extern "C" {
#endif

/* X(ENUM, name, kind, expect, what): kind says which stages it applies to
 * (VALUE: every float stage, GEMM: the GEMM stages, EXPERT: the expert
 * GEMMs, OUT: the combine, DISPATCH: the sorted rows); expect is 1 when a
 * runner must find the candidate conformant, 0 when it must not. */
#define DL_MUTATION_MAP(X)                                                                   \
    X(GAIN, gain, VALUE, 0, "every element times 1 + 2^-p, rounded to the stage's type")      \
    X(SIGN, sign, VALUE, 0, "the largest element of one row negated")                         \
    X(ZERO_ROW, zero_row, VALUE, 0, "one nonzero row set to zero")                            \
    X(OFF_BY_ONE, off_by_one, EXPERT, 0, "one group boundary one row late: the first row "    \
      "of an expert computed with the previous expert's weights")                             \
    X(DROP_SLOT, drop_slot, OUT, 0, "one (token, slot) pair left out of the combine and its " \
      "backward")                                                                             \
    X(SWAP_EXPERTS, swap_experts, EXPERT, 0, "two experts' weights exchanged")                \
    X(BF16_ACC, bf16_acc, GEMM, 0, "the GEMM accumulated in bf16 (a simulated kernel)")      \
    X(TF32, tf32, GEMM, 0, "the GEMM's operands rounded to TF32, declared fp32 (fp32 cases)")              \
    X(ULP_WEIGHTS, ulp_weights, EXPERT, 0, "one expert's weights one ulp (of their storage "  \
      "type) further from zero")                                                              \
    X(REORDER, reorder, DISPATCH, 1, "the rows of every expert in reverse order, sort_perm "  \
      "and inv_perm to match (a valid dispatch)")

#define DL__MUTATION_ENUM(E, n, kind, expect, what) DL_MUTATION_##E,
typedef enum {
    DL_MUTATION_MAP(DL__MUTATION_ENUM)
    DL_MUTATION_COUNT
} dl_mutation_t;
#undef DL__MUTATION_ENUM

/* How a mutated candidate is handed over. */
#define DL_MUTATE_MODE_MAP(X)                                      \
    X(STAGED, staged, "every stage of the golden")                 \
    X(FUSED, fused, "out and d_x (out alone without a backward)") \
    X(OUT, out, "out alone")

#define DL__MUTATE_MODE_ENUM(E, n, what) DL_MUTATE_##E,
typedef enum {
    DL_MUTATE_MODE_MAP(DL__MUTATE_MODE_ENUM)
    DL_MUTATE_MODE_COUNT
} dl_mutate_mode_t;
#undef DL__MUTATE_MODE_ENUM

/* The name ("gain", "staged"), NULL for an unknown value; parsing returns 0
 * or DL_EINVAL. 1 / 0: whether a correct runner finds the mutant
 * conformant. */
DL_EXTERN const char *dl_mutation_name(dl_mutation_t m);
DL_EXTERN int dl_mutation_parse(const char *s, dl_mutation_t *m);
DL_EXTERN int dl_mutation_expect_pass(dl_mutation_t m);
DL_EXTERN const char *dl_mutation_what(dl_mutation_t m);
DL_EXTERN const char *dl_mutate_mode_name(dl_mutate_mode_t m);
DL_EXTERN int dl_mutate_mode_parse(const char *s, dl_mutate_mode_t *m);

/* 1 if mutation m applies to stage s (dl_value_t) of configuration c. */
DL_EXTERN int dl_mutation_applies(dl_mutation_t m, int s, const dl_moe_config_t *c);

typedef struct {
    uint64_t mutations; /* bits 1 << dl_mutation_t; 0: all */
    dl_valueset_t stages; /* DL_VALUE_BIT(v); 0: every stage a mutation applies to */
    unsigned modes;     /* bits 1 << dl_mutate_mode_t; 0: all */
    int gain_p;         /* the gain is 1 + 2^-gain_p; 0: precision of the case's type - 4 */
    uint64_t seed;      /* picks the row, element, slot, boundary and experts */
    int force;          /* dl_mutate_write: replace an existing directory of mutants */
} dl_mutate_opts_t;

/* Sets one option of o from text, for the command line and the bindings:
 * key "mutations", "stages" or "modes" (comma lists of names), "gain_p"
 * (1 to 30), "seed" (an unsigned 64-bit integer, decimal or 0x hex) or
 * "force" (0 or 1). Errors: DL_EINVAL with a one-line message naming the
 * key and the bad value. */
DL_EXTERN int dl_mutate_opts_set(dl_mutate_opts_t *o, const char *key, const char *value, char *err,
                                 size_t errlen);

/* One mutant in memory: mutation m at stage s of golden g (loaded with
 * forward and backward). *out receives the golden's header and every
 * forward and backward stage, stage s computed by the mutation and every
 * stage downstream of it recomputed by the oracle's stage functions on the
 * mutated values (free with dl_golden_free, also after an error); detail
 * says what was picked ("row 5", "experts 2 and 5"). Errors: DL_ENOTFOUND
 * (m does not apply to s here: no such stage, not its kind, fewer than two
 * nonempty experts, ...), DL_EINVAL, DL_ENOMEM, the stage functions'. */
DL_EXTERN int dl_mutant_build(const dl_golden_file_t *g, dl_mutation_t m, int s,
                              const dl_mutate_opts_t *o, dl_golden_file_t *out, char *detail,
                              size_t detail_len, char *err, size_t errlen);

/* A candidate view of mutant mu for mode: a shallow copy (arrays borrowed
 * from mu, do not free) holding the stages of that mode; returns 0 when
 * those stages are all bitwise the golden's (an equivalent mutant: no
 * candidate), 1 otherwise. */
DL_EXTERN int dl_mutant_view(const dl_golden_file_t *g, const dl_golden_file_t *mu,
                             dl_mutate_mode_t mode, dl_golden_file_t *view);

/* Writes every mutant of o into directory dir: one candidate file
 * MUTATION.STAGE.MODE.h5 per non-equivalent (mutation, stage, mode), each
 * with root attributes mutation, mutation_stage, mutation_mode,
 * mutation_detail and expect ("pass" or "fail"), compute_mode the case's
 * type, backend "dropless-mutate"; and manifest.tsv, one line per mutant
 * (file, mutation, stage, mode, expect, detail; file "-" for an equivalent
 * one). Everything is written into a temporary directory beside dir and
 * renamed into place at the end: nothing half-written is ever at dir, an
 * existing dir is kept unless o->force (then only a directory holding
 * mutants, manifest.tsv first, is replaced). *n_files (may be NULL) gets
 * the number of candidate files; *manifest (may be NULL) a malloc'ed copy
 * of manifest.tsv. Errors: DL_EEXIST, DL_EIO, DL_EINVAL, DL_ENOMEM and
 * those of dl_mutant_build, with a one-line message naming dir. */
DL_EXTERN int dl_mutate_write(const dl_golden_file_t *g, const char *dir, const dl_mutate_opts_t *o,
                              int *n_files, char **manifest, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
