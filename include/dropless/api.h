/* dropless/api.h: a small handle-based API for language bindings (the
 * Python package `dropless` binds it through ctypes). Everything crosses
 * as opaque handles, C strings, flat arrays and scalars, so a binding needs
 * no copy of any struct of the other sections: golden cases are generated
 * or loaded into a handle, arrays are read and set by dataset name, the
 * check takes its options as a string, and reports come back as the text
 * of the table, JSON or JUnit writers of check.h.
 *
 * Conventions. Functions that can fail return 0 or a negative DL_E* code
 * and write a one-line message into err (errlen bytes; err may be NULL).
 * Handles are owned by the caller and freed by their *_free function (NULL
 * is accepted); a handle of the wrong kind (a candidate passed as a golden)
 * is refused with DL_EINVAL, not dereferenced further. Texts returned as
 * char * are malloc'ed: free them with dl_api_free_text. Part of the
 * public API; include <dropless.h>. doc/python.md describes the binding. */
#ifndef DROPLESS_API_H
#define DROPLESS_API_H
#include <stddef.h>
#include <stdint.h>
#include "core.h"
#include "moe.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Version of this section's calling conventions; a binding refuses a
 * library whose number it does not know. */
#define DL_API_VERSION 1
DL_EXTERN int dl_api_version(void);

typedef struct dl_api_golden dl_api_golden_t;
typedef struct dl_api_candidate dl_api_candidate_t;
typedef struct dl_api_report dl_api_report_t;

/* Element types of arrays crossing the binding. BF16 and F16 are the raw
 * 16-bit patterns (uint16_t); F32 is float, F64 double. */
typedef enum {
    DL_API_F32 = 0,
    DL_API_F64 = 1,
    DL_API_BF16 = 2,
    DL_API_F16 = 3,
    DL_API_I32 = 4,
    DL_API_I64 = 5
} dl_api_elem_t;

/* Frees a text returned by this section (NULL is accepted). */
DL_EXTERN void dl_api_free_text(char *s);

/* ---------------------------------------------------------- static tables */

/* The catalogue as JSON: an array of {"name", "description", "seed",
 * "large", "tier" ("vectors", "kernel", "layer"), "data_bytes",
 * "memory_bytes" (dl_case_memory_bytes in memory: what generating it into
 * a handle takes), "config": {key: value as in case files}, "dims": {"T",
 * "d", "f", "E", "k", "M", "P"}}. NULL when out of memory. */
DL_EXTERN char *dl_api_cases_json(void);
/* The one table of the layer's arrays (DL_VALUE_MAP) as the JSON that
 * `dropless info --layout --json` prints. NULL when out of memory. */
DL_EXTERN char *dl_api_layout_json(void);

/* ----------------------------------------------------------- configurations */

/* Parses a layer configuration from text in the case-file syntax
 * (doc/format.md, "Case files": "key = value" lines, '#' comments, a
 * "base" case first), with the case-file parser's rules and messages
 * ("config:3: unknown key 'topk'"); keys that are no part of the layer
 * (name, seed, inputs, zipf_s) are accepted and ignored. out (a struct of
 * moe.h, for C callers such as dropless.jax's FFI handler) may be NULL:
 * bindings validate only and read canon. canon (canon_len bytes, may be
 * NULL) receives the whole configuration as '\n'-separated lines, every
 * key given (dl_golden_config_string). Errors: DL_EINVAL (NULL text, an invalid
 * configuration), DL_EFORMAT (syntax), DL_EOVERFLOW (text over 4096
 * bytes, or canon too small), DL_EIO. */
DL_EXTERN int dl_api_config_parse(const char *text, dl_moe_config_t *out, char *canon,
                                  size_t canon_len, char *err, size_t errlen);

/* ---------------------------------------------------------------- goldens */

/* Generates a golden case in memory: spec is a catalogue name, else the
 * path of a case file (doc/format.md). With has_seed the case's seed is
 * replaced by seed. no_backward skips the backward pass. Errors:
 * DL_ENOTFOUND (neither a catalogue name nor a readable file), those of
 * dl_case_parse_file and dl_golden_generate; a failed backward pass is an
 * error here (the golden would be incomplete). */
DL_EXTERN int dl_api_golden_generate(const char *spec, int has_seed, uint64_t seed, int no_backward,
                                     dl_api_golden_t **out, char *err, size_t errlen);
/* As dl_api_golden_generate, and: unless ignore_memory, the case's memory
 * estimate (dl_case_memory_bytes, in memory) is compared with the memory
 * this process may still use (MemAvailable, or RLIMIT_AS if lower) before
 * anything is allocated, and a case that does not fit is DL_ENOMEM with
 * both figures named; progress (may be NULL) is called with ctx as
 * generation goes (dl_golden_gen_opts_t.progress). */
DL_EXTERN int dl_api_golden_generate_ex(const char *spec, int has_seed, uint64_t seed,
                                        int no_backward, int ignore_memory,
                                        void (*progress)(void *ctx, const char *phase, double done),
                                        void *ctx,
                                        dl_api_golden_t **out, char *err, size_t errlen);
/* The memory estimate for generating spec (a catalogue name or a case
 * file) in memory, and the memory available (-1: unknown), in bytes. */
DL_EXTERN int dl_api_golden_memory(const char *spec, int no_backward, int64_t *need, int64_t *avail,
                                   char *err, size_t errlen);
/* Loads a golden file (seal, types, shapes and grids verified); it must
 * have /inputs and /forward (else DL_EFORMAT). The file is untrusted: unless
 * its seal verifies it is first parsed in a child process
 * (dl_golden_load_isolated) with a limit of timeout_s seconds (0: none), so
 * a file that crashes or hangs HDF5 is DL_EFORMAT with a message naming the
 * file, never a crash of the caller. */
DL_EXTERN int dl_api_golden_open(const char *path, unsigned timeout_s, dl_api_golden_t **out,
                                 char *err, size_t errlen);
/* dl_api_golden_open with DL_API_PREFLIGHT_SECONDS. */
#define DL_API_PREFLIGHT_SECONDS 120
DL_EXTERN int dl_api_golden_load(const char *path, dl_api_golden_t **out, char *err, size_t errlen);
/* Writes the golden to path (dl_golden_write: byte-reproducible, sealed,
 * temporary name then rename, an existing path kept unless force). */
DL_EXTERN int dl_api_golden_save(const dl_api_golden_t *g, const char *path, int force, char *err,
                                 size_t errlen);
DL_EXTERN void dl_api_golden_free(dl_api_golden_t *g);
/* The golden's description as JSON: {"case", "seed", "generator",
 * "has_backward", "config": {...}, "dims": {...}, "arrays": [{"name",
 * "group", "store", "dtype", "shape", "present"}]} in the table's order;
 * "dtype" is the storage type ("fp32", "bf16", "fp16", "int32", "int64").
 * NULL for an invalid handle or when out of memory. */
DL_EXTERN char *dl_api_golden_info_json(const dl_api_golden_t *g);
/* The golden's array called name ("x", "router_logits", "d_x", ...):
 * *data points into the handle (valid until dl_api_golden_free; do not
 * write), *elem is DL_API_F32 (every float array: fp32, bf16 and fp16
 * values held exactly in float), DL_API_I32 or DL_API_I64; the shape goes
 * to dims[0..*rank-1]. Errors: DL_EINVAL (bad handle or arguments),
 * DL_ENOTFOUND (no such array, or absent: a SwiGLU array of a plain layer,
 * the backward pass of a forward-only golden). */
DL_EXTERN int dl_api_golden_array(const dl_api_golden_t *g, const char *name, const void **data,
                                  int *elem, int *rank, int64_t dims[3], char *err, size_t errlen);

/* ------------------------------------------------------------- candidates */

/* A new, empty candidate for golden g's configuration (g may be freed
 * afterwards). backend and compute_mode (the profile the backend declares)
 * may be NULL. */
DL_EXTERN int dl_api_candidate_new(const dl_api_golden_t *g, const char *backend,
                                   const char *compute_mode, dl_api_candidate_t **out, char *err,
                                   size_t errlen);
/* Sets a descriptive root attribute of the candidate: name is "backend",
 * "backend_version", "compute_mode" (a profile name, else DL_EINVAL) or
 * "device"; value NULL or "" clears it. They go into reports (backend,
 * backend_version, the default profile) and candidate files. Errors:
 * DL_EINVAL (unknown name), DL_EOVERFLOW (value too long for the field). */
DL_EXTERN int dl_api_candidate_set_attr(dl_api_candidate_t *c, const char *name, const char *value,
                                        char *err, size_t errlen);
/* Copies one stage value into the candidate: data holds the product of
 * dims[0..rank-1] elements of type elem, contiguous in row-major order.
 * Refused, with a message naming the stage: an unknown name or an input
 * (DL_ENOTFOUND), a stage this configuration does not have (DL_ENOTFOUND),
 * a shape other than the stage's (DL_ESHAPE, both shapes named), a float
 * element type for an integer stage or the reverse (DL_EDTYPE), an integer
 * outside int32 for an int32 stage (DL_ERANGE), F64 values that are not
 * float32 values (DL_EGRID: the runner holds stage values in float; no
 * silent rounding). NaN and infinities are kept: they are the check's
 * findings. Values off the stage's storage grid (fp32 values for a bf16
 * stage) are kept and judged numerically, unless the check runs with
 * strict_storage. Setting a stage twice replaces it. */
DL_EXTERN int dl_api_candidate_set(dl_api_candidate_t *c, const char *name, const void *data,
                                   int elem, int rank, const int64_t *dims, char *err, size_t errlen);
/* Loads a candidate file against g's configuration
 * (dl_golden_load_candidate, after the same child-process preflight as
 * dl_api_golden_open, limited to timeout_s seconds, 0: none); its backend,
 * compute_mode and isolated_groups attributes come along, and datasets the
 * loader set aside FAIL as "shape", as in `dropless check`. */
DL_EXTERN int dl_api_candidate_open(const dl_api_golden_t *g, const char *path, unsigned timeout_s,
                                    dl_api_candidate_t **out, char *err, size_t errlen);
/* dl_api_candidate_open with DL_API_PREFLIGHT_SECONDS. */
DL_EXTERN int dl_api_candidate_load(const dl_api_golden_t *g, const char *path,
                                    dl_api_candidate_t **out, char *err, size_t errlen);
/* Writes the candidate file (dl_golden_write_candidate) with the golden's
 * case name and seed; isolated is a stage-isolation spec
 * (dl_check_parse_groups; NULL or "": chained), and each of its groups
 * must name stages the candidate holds. A float stage with values off its
 * storage grid is refused (DL_EGRID): the file stores every stage on its
 * grid. Nothing is written on error. */
DL_EXTERN int dl_api_candidate_save(const dl_api_candidate_t *c, const char *path,
                                    const char *isolated, int force, char *err, size_t errlen);
DL_EXTERN void dl_api_candidate_free(dl_api_candidate_t *c);

/* --------------------------------------------------------------- mutants */

/* Writes the mutated candidates of golden g into directory dir
 * (dl_mutate_write, dropless/mutate.h). options is NULL or "key=value"
 * lines (dl_mutate_opts_set: mutations, stages, modes, gain_p, seed,
 * force). *manifest (may be NULL) gets manifest.tsv's text (free with
 * dl_api_free_text). Errors: those of dl_mutate_write, DL_EINVAL for a bad
 * option. Nothing is left at dir on error. */
DL_EXTERN int dl_api_mutate(const dl_api_golden_t *g, const char *dir, const char *options,
                            char **manifest, char *err, size_t errlen);
/* One mutant in memory as a candidate handle (dl_mutant_build and
 * dl_mutant_view): mutation at stage, handed over in mode ("staged",
 * "fused", "out"); detail (may be NULL) says what was picked. Errors:
 * DL_EINVAL (unknown names, bad options), DL_ENOTFOUND (the mutation does
 * not apply to the stage, or the mode's stages are the golden's: an
 * equivalent mutant), those of dl_mutant_build. Free with
 * dl_api_candidate_free. */
DL_EXTERN int dl_api_mutant(const dl_api_golden_t *g, const char *mutation, const char *stage,
                            const char *mode, const char *options, dl_api_candidate_t **out,
                            char *detail, size_t detail_len, char *err, size_t errlen);

/* ------------------------------------------------------------------ check */

/* Checks candidate c against golden g (the same configuration, else
 * DL_ESHAPE). options is NULL or lines "key=value" separated by '\n':
 *   profile=NAME        the compute profile (default: the candidate's
 *                       compute_mode, else fp32)
 *   isolated=SPEC       stage-isolated groups ("h_gate,h_up;h_act"), each
 *                       naming provided stages only, every provided stage
 *                       in one group; "*": every provided stage its own
 *                       group; empty: chained. Default: the groups of a
 *                       loaded candidate file, else chained.
 *   stages=a,b,...      check only these stages (the others count as absent)
 *   strict_storage=0|1  a float stage off its storage grid FAILs (as a
 *                       candidate file's dataset does) instead of being
 *                       judged numerically
 *   diagnose_drops=0|1, max_listed=N, recompute_all=0|1
 *                       dl_check_options_t
 * An unknown key or a malformed value is DL_EINVAL naming it. A
 * nonconforming candidate is not an error. Errors otherwise as
 * dl_check_run. */
DL_EXTERN int dl_api_check(const dl_api_golden_t *g, const dl_api_candidate_t *c, const char *options,
                           dl_api_report_t **out, char *err, size_t errlen);
/* As dl_api_check, and progress (may be NULL) is called with ctx as the
 * check goes (dl_check_options_t.progress): a stage's name and the share
 * of the case's elements judged before it, non-decreasing in [0, 1], last
 * ("done", 1). The call happens on the calling thread. */
DL_EXTERN int dl_api_check_ex(const dl_api_golden_t *g, const dl_api_candidate_t *c,
                              const char *options,
                              void (*progress)(void *ctx, const char *stage, double done),
                              void *ctx, dl_api_report_t **out, char *err, size_t errlen);
/* The report as text: format "table", "json" or "junit"
 * (dl_report_format_parse); all lists SKIP lines in the table. NULL for an
 * unknown format, a bad handle, or when out of memory. */
DL_EXTERN char *dl_api_report_text(const dl_api_report_t *r, const char *format, int all);
/* 1 conformant, 0 not, DL_EINVAL for a bad handle. */
DL_EXTERN int dl_api_report_conformant(const dl_api_report_t *r);
DL_EXTERN void dl_api_report_free(dl_api_report_t *r);

#ifdef __cplusplus
}
#endif
#endif
