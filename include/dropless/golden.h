/* dropless/golden.h: golden files (HDF5, format "dropless-golden" v1): the
 * case catalogue, deterministic inputs, generation, write and read.
 * Part of the public API; include <dropless.h>. The file layout is
 * specified in doc/format.md; the dataset table below is that layout. */
#ifndef DROPLESS_GOLDEN_H
#define DROPLESS_GOLDEN_H
#include "core.h"
#include "moe.h"
#include "ep.h"
#include "layout.h"
#include "values.h"
#ifdef __cplusplus
extern "C" {
#endif

#define DL_GOLDEN_FORMAT "dropless-golden"
#define DL_GOLDEN_FORMAT_VERSION 1

/* Longest case name (without the terminating NUL). */
#define DL_GOLDEN_NAME_MAX 63

/* ---------------------------------------------------------- the catalogue */

/* How a case's inputs are drawn (doc/format.md, "Input generation"). */
typedef enum {
    DL_INPUTS_RANDOM = 0,   /* normals, mild per-expert logit offsets */
    DL_INPUTS_ZIPF = 1,     /* logit offsets -zipf_s * ln(e+1): heavy imbalance */
    DL_INPUTS_TIES = 2,     /* duplicated router columns/groups, zero token: exact and near ties */
    DL_INPUTS_EMPTY = 3,    /* experts 0, E/2 and E-1 never selected */
    DL_INPUTS_ONE_HOT = 4,  /* every token's top choice is expert E/2 */
    DL_INPUTS_SIZES = 5     /* planted routing: group sizes 0, 1, 63, 64, 65, 127, 128,
                             * 129, a hot expert with every token, fillers */
} dl_inputs_kind_t;

/* Which part of the catalogue a case belongs to. */
typedef enum {
    DL_TIER_VECTORS = 0, /* small, committed under vectors/ (vectors/SHA256SUMS) */
    DL_TIER_KERNEL = 1,  /* kernel-scale, on demand, pinned by vectors/KERNEL_SHA256SUMS */
    DL_TIER_LAYER = 2    /* a whole model layer, on demand, streamed */
} dl_case_tier_t;

typedef struct {
    char name[DL_GOLDEN_NAME_MAX + 1];
    const char *description;     /* static text; "" for config files */
    dl_moe_config_t config;
    uint64_t seed;
    dl_inputs_kind_t inputs;
    double zipf_s;               /* DL_INPUTS_ZIPF only */
    int large;                   /* generated on demand, not committed (tiers kernel, layer) */
    dl_case_tier_t tier;
} dl_case_t;

/* The tier's name ("vectors", "kernel", "layer"), or NULL; and the reverse
 * (0 or DL_ENOTFOUND). */
DL_EXTERN const char *dl_case_tier_name(dl_case_tier_t t);
DL_EXTERN int dl_case_tier_parse(const char *s, dl_case_tier_t *t);

/* Number of cases in the built-in catalogue (every dtype variant counted). */
DL_EXTERN int dl_case_count(void);
/* The i-th catalogue case (0 <= i < dl_case_count()), or NULL. */
DL_EXTERN const dl_case_t *dl_case_get(int i);
/* Copies the catalogue case named `name` into *c. Returns 0 or DL_ENOTFOUND. */
DL_EXTERN int dl_case_find(const char *name, dl_case_t *c);
/* Replaces c->config.dtype and the name's dtype suffix ("-bf16", "-fp16";
 * none for fp32). Returns 0 or DL_EINVAL (name too long). */
DL_EXTERN int dl_case_set_dtype(dl_case_t *c, dl_dtype_t t);

/* Reads a case from a key = value file (doc/format.md, "Case files").
 * On error returns DL_EIO (unreadable), DL_EFORMAT (syntax) or DL_EINVAL
 * (an invalid configuration) and writes a one-line message naming the file
 * and line into err (errlen bytes; err may be NULL). */
DL_EXTERN int dl_case_parse_file(const char *path, dl_case_t *c, char *err, size_t errlen);

/* Writes c as case-file lines "key = value", separated by sep (e.g. "\n";
 * NULL: " "). Returns 0, DL_EINVAL or DL_EOVERFLOW (buffer too small). */
DL_EXTERN int dl_golden_config_string(const dl_moe_config_t *c, const char *sep, char *buf, size_t n);

/* Bytes the case's file will take, roughly (data only). */
DL_EXTERN int64_t dl_case_data_bytes(const dl_case_t *c);

/* ----------------------------------------------------------- input tensors */

/* Owned input arrays (malloc'ed). Shapes as dl_moe_inputs_t. */
typedef struct {
    float *x, *router_weight, *expert_bias;
    float *w_gate, *w_up, *w_down;
    float *d_out;
    float *shared_w_gate, *shared_w_up, *shared_w_down, *shared_gate_weight; /* shared experts */
    float *router_bias; /* only with route.has_router_bias */
    float *b_gate, *b_up, *b_down; /* ffn_bias only */
} dl_golden_inputs_t;

/* A read-only view for dl_moe_forward/backward. */
DL_EXTERN dl_moe_inputs_t dl_golden_inputs_view(const dl_golden_inputs_t *in);

/* The deterministic PRNG of doc/format.md: the n-th 64-bit output of stream
 * `stream` for `seed` (splitmix64 started at key(seed, stream)). */
DL_EXTERN uint64_t dl_golden_rng_u64(uint64_t seed, uint64_t stream, uint64_t n);
/* The i-th standard normal of a stream: Irwin-Hall, sum of 12 32-bit
 * uniforms, exact in binary64, in [-6, 6). */
DL_EXTERN double dl_golden_rng_normal(uint64_t seed, uint64_t stream, uint64_t i);
/* ln(x) for x > 0 by the fixed series of doc/format.md: only +, -, *, /, so
 * bit-identical in any IEEE binary64 language. Not correctly rounded. */
DL_EXTERN double dl_golden_ln(double x);

/* Draws the case's inputs (every array of *in allocated; free with
 * dl_golden_inputs_free, also after an error). Deterministic: same bits for
 * any thread count. Errors: DL_EINVAL, DL_EOVERFLOW, DL_ENOMEM. */
DL_EXTERN int dl_case_inputs(const dl_case_t *c, dl_golden_inputs_t *in);
DL_EXTERN void dl_golden_inputs_free(dl_golden_inputs_t *in);
/* The pieces a distributed generator draws (`mpirun dropless gen`, doc/ep.md):
 * every input but the expert weights (those stay NULL; free with
 * dl_golden_inputs_free), and expert e's slab of one expert weight, which =
 * 0 w_gate, 1 w_up, 2 w_down, hidden*ffn floats into buf. The same values
 * dl_case_inputs draws. Errors as dl_case_inputs; DL_EINVAL (which, e). */
DL_EXTERN int dl_case_inputs_tokens(const dl_case_t *c, dl_golden_inputs_t *in);
DL_EXTERN int dl_case_expert_weight(const dl_case_t *c, int which, int64_t e, float *buf);

/* ------------------------------------------------------ the dataset table */

typedef enum {
    DL_GOLDEN_INPUTS = 0,
    DL_GOLDEN_FORWARD = 1,
    DL_GOLDEN_BACKWARD = 2
} dl_golden_group_t;

typedef enum {
    DL_GOLDEN_FLOAT = 0, /* H5T_IEEE_F32LE, float in memory */
    DL_GOLDEN_INT32 = 1, /* H5T_STD_I32LE */
    DL_GOLDEN_INT64 = 2  /* H5T_STD_I64LE */
} dl_golden_elem_t;

/* When a dataset exists: the conditions of DL_VALUE_MAP (dl_cond_t,
 * values.h; dl_cond_name names them), one list for the format, the
 * schedule and the runner. */
typedef dl_cond_t dl_golden_cond_t;

/* One dataset of the format. dims are symbols: 'T' tokens, 'd' hidden,
 * 'f' ffn, 'E' experts, 'k' top_k, 'M' = T*k, 'P' = E+1. */
typedef struct {
    dl_golden_group_t group;
    const char *name;       /* "x", "router_logits", ... */
    const char *path;       /* "/inputs/x", ... */
    dl_golden_elem_t elem;
    int act;                /* floats: 1 = the case's dtype, 0 = fp32, 2 = router_dtype */
    int rank;
    char dims[4];
    dl_golden_cond_t cond;
} dl_golden_dataset_t;

/* Number of datasets in format v1, and the i-th (fixed write order). */
DL_EXTERN int dl_golden_dataset_count(void);
DL_EXTERN const dl_golden_dataset_t *dl_golden_dataset(int i);
/* The dataset called `path` ("/forward/out") or NULL. */
DL_EXTERN const dl_golden_dataset_t *dl_golden_dataset_find(const char *path);
/* 1 if the dataset exists for configuration c, else 0. */
DL_EXTERN int dl_golden_dataset_applies(const dl_golden_dataset_t *ds, const dl_moe_config_t *c);
/* Fills dims[0..rank-1] for c; returns the element count, or a negative
 * DL_EOVERFLOW. */
DL_EXTERN int64_t dl_golden_dataset_shape(const dl_golden_dataset_t *ds, const dl_moe_config_t *c,
                                          int64_t dims[3]);
/* The storage type of a float dataset for c (DL_F32 for non-act ones). */
DL_EXTERN dl_dtype_t dl_golden_dataset_dtype(const dl_golden_dataset_t *ds, const dl_moe_config_t *c);

/* -------------------------------------------------------------- one file */

/* The most /ep/ranks_R groups a file holds. */
#define DL_GOLDEN_EP_MAX 16

/* The most layouts --layout asks for. */
#define DL_GOLDEN_LAYOUT_MAX 16

/* An upper bound of dl_golden_dataset_count() (bits of bad_datasets). */
#define DL_GOLDEN_DATASET_MAX DL_ROWSET_BITS

typedef struct {
    /* root attributes */
    char format[32];
    int64_t format_version;
    char generator[64];
    char case_name[DL_GOLDEN_NAME_MAX + 1];
    uint64_t seed;
    char backend[128];       /* candidate files: root attribute "backend", or "" */
    char compute_mode[64];   /* candidate files: root attribute "compute_mode", or "" */
    char backend_version[64]; /* candidate files: root attribute "backend_version", or "" */
    char device[128];        /* candidate files: root attribute "device", or "" */
    char isolated_groups[1024]; /* candidate files: root attribute "isolated_groups", or "":
                              * stage-isolated outputs, groups of dataset names computed
                              * together from golden inputs ("a,b;c;d,e"); "" = chained */
    dl_moe_config_t config;
    /* groups; a NULL array is a dataset not present */
    int has_inputs, has_forward, has_backward;
    dl_golden_inputs_t in;
    dl_moe_forward_t fwd;
    dl_moe_backward_t bwd;
    int sealed;              /* 1: the file's seal (SHA-256 in the user block) was verified;
                              * 0: no seal; -1 (candidates only): a seal that does not
                              * match or cannot be read (the file was edited after sealing) */
    int has_case, has_seed;  /* 1: the root attribute case / seed is present (candidates
                              * may leave them out; a golden file has both) */
    /* candidate files: datasets present but unusable (wrong shape or type,
     * a dtype attribute naming another type, values off the declared grid),
     * DL_ROWSET_BIT(i) for dl_golden_dataset(i); their arrays stay NULL. */
    dl_rowset_t bad_datasets;
    char bad_reason[DL_GOLDEN_DATASET_MAX][128]; /* why, per bad dataset i; "" otherwise */
    /* candidate files: float datasets stored coarser than the case's type
     * for them (bf16 weight gradients of an fp32-typed stage), DL_ROWSET_BIT(i);
     * store[i] is that storage type (the dtype attribute, or the HDF5 type
     * of a 2-byte float). Finer storage (float64, fp32 in a bf16 case) is
     * not marked: it is read and judged at the case's type. */
    dl_rowset_t coarse_datasets;
    dl_dtype_t store[DL_GOLDEN_DATASET_MAX];
    /* /ep/ranks_R groups (doc/format.md, "Expert parallelism"): n_ep of them,
     * ascending R in golden files; a candidate's may be rank views, and
     * their datasets set aside are marked in ep[i].bad. Arrays owned by g. */
    int n_ep;
    dl_ep_layout_t ep[DL_GOLDEN_EP_MAX];
    /* /layouts/NAME groups (doc/format.md, "Kernel layouts"): n_layouts of
     * them, malloc'ed array owned by g (dl_golden_free frees it). */
    int n_layouts;
    dl_layout_t *layouts;
    int owner_;              /* private: how the arrays are freed */
} dl_golden_file_t;

/* The address of dataset ds's array pointer inside g (a float **, int32_t **
 * or int64_t ** by ds->elem); g keeps owning the array. NULL when ds is not
 * a row of the format's table (dl_golden_dataset). No error codes. */
DL_EXTERN void **dl_golden_slot(dl_golden_file_t *g, const dl_golden_dataset_t *ds);

/* Frees every array of g (whoever allocated it) and zeroes g. */
DL_EXTERN void dl_golden_free(dl_golden_file_t *g);

/* ---------------------------------------------------------------- writing */

typedef void (*dl_golden_progress_fn)(void *ctx, const char *phase, double done);

typedef struct {
    int force;               /* overwrite an existing output */
    int no_backward;         /* skip the backward pass and /backward */
    dl_golden_progress_fn progress; /* may be NULL; done in [0, 1] */
    void *progress_ctx;
    int stream;              /* generate dataset by dataset, expert by expert
                              * (dl_golden_gen_stream); the same bytes */
    int64_t expert_begin, expert_end; /* expert_end > 0: only experts [begin, end)
                              * (a slice, doc/format.md); implies stream */
    int n_ep_ranks;          /* > 0: write /ep/ranks_R for each R of ep_ranks (each a
                              * divisor of E; duplicates written once, ascending) */
    int64_t ep_ranks[DL_GOLDEN_EP_MAX];
    int n_layouts;           /* > 0: write /layouts/KIND_PARAM for each (kind, param)
                              * (dl_layout_parse), and with n_ep_ranks each rank's
                              * variant; in memory only (not stream or a slice) */
    int layout_kind[DL_GOLDEN_LAYOUT_MAX];
    int64_t layout_param[DL_GOLDEN_LAYOUT_MAX];
    int layout_poison;       /* the poisoned twin: padding rows hold NaN */
} dl_golden_gen_opts_t;

/* Writes g to path: the root attributes, /config, and each group whose
 * has_* flag is set, every applicable dataset of it (all must be non-NULL).
 * Byte-reproducible. Written to a temporary name in the same directory and
 * renamed; an existing path is kept unless force (DL_EEXIST), and anything
 * but a regular file is never replaced (DL_EEXIST); on any error, and when
 * SIGINT, SIGTERM or SIGHUP ends the process while it writes, no file is
 * left behind. Until sealed the file's user block says "incomplete", so a
 * writer killed by SIGKILL leaves a temporary that no loader accepts.
 * After a write error (a full disk) HDF5 1.10.8 may keep the file open and
 * crash in its exit handler: a program should then leave with _exit. Errors: DL_EINVAL, DL_EEXIST, DL_EIO, DL_ENOMEM;
 * a one-line message goes to err. progress may be NULL. */
DL_EXTERN int dl_golden_write(const char *path, const dl_golden_file_t *g, int force,
                              dl_golden_progress_fn progress, void *progress_ctx,
                              char *err, size_t errlen);

/* Writes a candidate file (a backend's outputs, for `dropless check`): the
 * root attributes, backend and compute_mode when non-empty, /config, and
 * every non-NULL array of the groups whose has_* flag is set (inputs are not
 * needed). Same temporary-name, no-overwrite and sealing rules as
 * dl_golden_write. */
DL_EXTERN int dl_golden_write_candidate(const char *path, const dl_golden_file_t *g, int force,
                                        char *err, size_t errlen);

/* Whether dl_golden_write(path, ..., force, ...) would accept path, for
 * refusing before a long job rather than after: DL_EINVAL (empty), DL_EEXIST
 * (exists and !force, or is not a regular file: a directory, device, FIFO
 * or symbolic link is never replaced), DL_EIO, with a one-line message. */
DL_EXTERN int dl_golden_check_output(const char *path, int force, char *err, size_t errlen);

/* A command's files (doc/cli.md, "Output files"), told apart by identity
 * (st_dev and st_ino, so ./x, d/../x, hard and symbolic links are one file;
 * an output that does not exist yet by its resolved path), before the
 * work. dl_golden_output_input registers an input: no output of this
 * process replaces it, not even with force (a missing input is skipped:
 * its reader says why). dl_golden_output_reserve applies the rules of
 * dl_golden_check_output, refuses an input and another reserved output
 * (DL_EEXIST), and reserves path: a name that does not exist is created,
 * empty, with O_EXCL (a concurrent writer is refused at once), and the
 * writers of this library rename the finished file over it.
 * dl_golden_output_release removes the placeholders no file replaced (call
 * it before exiting; SIGINT, SIGTERM and SIGHUP remove them too). Errors:
 * DL_EINVAL (empty path, too many files), DL_EEXIST, DL_EIO, DL_ENOMEM,
 * with a one-line message. */
DL_EXTERN int dl_golden_output_input(const char *path);
DL_EXTERN int dl_golden_output_reserve(const char *path, int force, char *err, size_t errlen);
DL_EXTERN void dl_golden_output_release(void);

/* A plain output file (a plot, a JSON document) under the same rules:
 * open creates the temporary beside path (written through its fd, or by
 * another process through its name), commit publishes it and frees o
 * (0, DL_EEXIST, DL_EIO), abort removes it and frees o. */
typedef struct dl_golden_output dl_golden_output_t;
DL_EXTERN int dl_golden_output_open(const char *path, int force, dl_golden_output_t **o,
                                    char *err, size_t errlen);
DL_EXTERN int dl_golden_output_fd(const dl_golden_output_t *o);
DL_EXTERN const char *dl_golden_output_tmp(const dl_golden_output_t *o);
DL_EXTERN int dl_golden_output_commit(dl_golden_output_t *o, char *err, size_t errlen);
DL_EXTERN void dl_golden_output_abort(dl_golden_output_t *o);

/* What dl_golden_gen_file and dl_golden_gen_stream refuse before any work
 * but the output path: the configuration, opts->ep_ranks (each must
 * divide E) and the expert range. For a command that checks every case
 * before it writes the first. 0 or DL_EINVAL with a one-line message. */
DL_EXTERN int dl_golden_gen_check(const dl_case_t *c, const dl_golden_gen_opts_t *opts, char *err,
                                  size_t errlen);

/* Seals the file at path: writes the SHA-256 of every byte after the first
 * 512 into that 512-byte HDF5 user block (doc/format.md, "Seal").
 * dl_golden_write seals every file; this is for tools that edit a golden
 * file on purpose. The file must have been created with a 512-byte user
 * block. Errors: DL_EIO, DL_EFORMAT. */
DL_EXTERN int dl_golden_seal(const char *path, char *err, size_t errlen);

/* Fills g's root attributes (format, version, generator, case, seed) and
 * configuration for case c, as a generated file has them; nothing else of
 * g is touched. For writers that assemble a file themselves. */
DL_EXTERN void dl_golden_header(const dl_case_t *c, dl_golden_file_t *g);

/* Generates case c in memory: inputs, dl_moe_forward and (unless
 * opts->no_backward) dl_moe_backward. If the backward pass fails, g keeps
 * has_backward = 0 and the code is returned in *backward_err (may be NULL).
 * Free g with dl_golden_free, also after an error. */
DL_EXTERN int dl_golden_generate(const dl_case_t *c, const dl_golden_gen_opts_t *opts,
                                 dl_golden_file_t *g, int *backward_err, char *err, size_t errlen);

/* Adds to g (its forward routing computed) the layouts /ep/ranks_R of
 * opts->ep_ranks (ascending, duplicates once), for writers that assemble a
 * file themselves. Errors: DL_EINVAL (an R not dividing E, with a message),
 * those of dl_ep_layout. */
DL_EXTERN int dl_golden_add_ep_layouts(dl_golden_file_t *g, const dl_golden_gen_opts_t *opts,
                                       char *err, size_t errlen);

/* Writes the slice of experts [A, B) (doc/format.md, "Expert slices") from
 * arrays a distributed generator holds: g has the header, /config, the
 * has_* flags, every input but the expert weights, the whole routing
 * (router_logits .. group_offsets, tie_margin, sort_perm, inv_perm) and,
 * shaped as the slice, the expert weights and weight gradients [B-A, ., .]
 * and the sorted-row values [Ms, .] (Ms = group_offsets[B] -
 * group_offsets[A]), and its /ep layouts if any; the values a slice leaves
 * out are not read. The bytes of dl_golden_gen_stream with expert_begin =
 * A, expert_end = B. Same temporary-name and no-overwrite rules as
 * dl_golden_write. Errors: DL_EINVAL (a range that is not a proper slice,
 * an array missing), DL_EEXIST, DL_EIO, DL_ENOMEM. */
DL_EXTERN int dl_golden_write_slice(const char *path, const dl_golden_file_t *g, int64_t A,
                                    int64_t B, int force, char *err, size_t errlen);

/* dl_golden_generate then dl_golden_write. A failed backward pass does not
 * fail the call: the file is written without /backward and the code is
 * returned in *backward_err (may be NULL). An existing path is refused
 * (DL_EEXIST) before any work unless opts->force. */
DL_EXTERN int dl_golden_gen_file(const dl_case_t *c, const char *path, const dl_golden_gen_opts_t *opts,
                                 int *backward_err, char *err, size_t errlen);

/* Generates case c straight into a file at path, dataset by dataset in the
 * format's order: the expert weights are drawn, and the weight gradients
 * computed and written, one expert at a time, so memory is the token-sized
 * inputs and activations plus one expert's weights, not the file
 * (dl_case_memory_bytes). The bytes are those of dl_golden_gen_file. With
 * opts->expert_end > 0, writes the slice of experts [expert_begin,
 * expert_end): the whole routing, only those experts' weights, sorted rows
 * and weight gradients (doc/format.md, "Expert slices"), each value equal
 * to the same element of the whole file. A failed backward pass fails the
 * call. Same temporary-name and no-overwrite rules as dl_golden_write.
 * Errors: DL_EINVAL (configuration, range), DL_EEXIST, DL_EIO, DL_ENOMEM,
 * a stage's error; a one-line message goes to err. */
DL_EXTERN int dl_golden_gen_stream(const dl_case_t *c, const char *path,
                                   const dl_golden_gen_opts_t *opts, char *err, size_t errlen);

/* The peak memory, in bytes, that generating c takes with these options
 * (opts may be NULL: in memory): the file's data in memory, or with
 * opts->stream / a slice the file less its expert weights and weight
 * gradients plus one expert's; GEMM scratch included. An estimate for
 * refusing early, not a bound proven to the byte. Negative DL_EOVERFLOW
 * if it does not fit int64, DL_EINVAL. */
DL_EXTERN int64_t dl_case_memory_bytes(const dl_case_t *c, const dl_golden_gen_opts_t *opts);
/* The bytes this process may still use, to compare dl_case_memory_bytes
 * with: MemAvailable of /proc/meminfo, or the address-space limit
 * (RLIMIT_AS) if lower; -1 if neither is known. */
DL_EXTERN int64_t dl_memory_available(void);

/* The HDF5 library version in use ("1.10.8"): byte-identity of files is
 * pinned for one HDF5 version (doc/format.md). */
DL_EXTERN const char *dl_golden_hdf5_version(void);

/* ---------------------------------------------------------------- reading */

/* Loads a golden file: first the seal, if the file has one (a mismatch is
 * DL_EFORMAT before HDF5 reads a byte: HDF5 can crash on damaged
 * metadata); then root attributes, /config, and every present group,
 * each of which must be complete. Validates the format and version, every
 * dataset's HDF5 type, shape (against /config) and dtype attribute, that
 * every value lies on its storage grid, ids and permutations in range and
 * consistent, sizes nonnegative and offsets their prefix sum. Absent groups
 * are reported by has_* = 0. Errors: DL_EIO (cannot open), DL_EFORMAT,
 * DL_ESHAPE, DL_EDTYPE, DL_EGRID, DL_ERANGE, DL_ENOMEM, with a one-line
 * message naming the file and dataset in err. Free with dl_golden_free. */
DL_EXTERN int dl_golden_load(const char *path, dl_golden_file_t *g, char *err, size_t errlen);

/* Loads a candidate file (a backend's outputs): any subset of the datasets,
 * checked against `expect` (the golden's configuration). A problem confined
 * to one dataset does not fail the file: a dataset whose shape is not the
 * one expect gives it, a float dataset not stored as IEEE float32
 * little-endian, an integer dataset not of an integer type (any width up to
 * 64 bits is read) or with a value outside int32 where int32 is stored, a
 * dtype attribute that is unreadable or names another storage type, or
 * values off the grid a dtype attribute declares: the dataset's array stays
 * NULL, its bit (1 << i, i its index in the dataset table) is set in
 * g->bad_datasets and g->bad_reason[i] says why in a few words (without the
 * file or dataset name). Values are never judged: ids outside [0, E),
 * permutation entries outside [-1, M) and negative sizes are kept as
 * stored, for the conformance check to report. Root attributes backend,
 * backend_version, compute_mode and device are read if present. Errors are
 * whole-file problems only: DL_EIO (cannot open), DL_EFORMAT (not HDF5, a
 * damaged or unreadable object, a group that is not a
 * group, a malformed root attribute), DL_ESHAPE or DL_EDTYPE (a /config
 * group whose tokens, hidden, ffn, experts, top_k or dtype disagree with
 * expect), DL_ENOMEM; with a one-line message naming the file and object.
 * A seal, if present, is verified, but a candidate needs none: a seal
 * that does not match (an edited copy of a golden) or cannot be read sets
 * g->sealed = -1 and loading goes on. Candidate files are thus parsed by
 * HDF5 unprotected: HDF5 1.10.8 can crash on deliberately
 * damaged metadata (tests/fuzz/corpus holds known cases), so a caller that
 * must survive hostile files loads them in a child process. Free g with
 * dl_golden_free (not needed after an error). */
DL_EXTERN int dl_golden_load_candidate(const char *path, const dl_moe_config_t *expect,
                                       dl_golden_file_t *g, char *err, size_t errlen);

/* Loads path as dl_golden_load (expect NULL) or dl_golden_load_candidate
 * (expect the golden's configuration) would, but survives a file that
 * crashes or hangs HDF5's parser: unless the file's seal verifies (a sealed
 * file is what dropless wrote), it is first loaded in a forked child
 * process, on one OpenMP thread, with its stderr discarded and a time limit
 * of timeout_s seconds (0: none); a child killed by a signal, timed out or
 * ending without a verdict is DL_EFORMAT with a one-line message naming the
 * file. Only then is it loaded here. Same errors and ownership as the
 * loaders. Needs fork() and waitpid(): a process with threads other than
 * OpenMP's should not call it, and one that ignores SIGCHLD gets DL_EIO
 * (the child's outcome is lost). */
DL_EXTERN int dl_golden_load_isolated(const char *path, const dl_moe_config_t *expect,
                                      unsigned timeout_s, dl_golden_file_t *g, char *err,
                                      size_t errlen);

/* Turns HDF5's automatic error printing off for the rest of the process.
 * The loaders and writers silence it while they run; this is for programs
 * (not libraries): HDF5 1.10.8 otherwise prints its error stack when it
 * shuts down after some damaged files. */
DL_EXTERN void dl_golden_hdf5_quiet(void);

/* The known dataset path nearest to path (the same name in another group
 * first, else the smallest edit distance) among the forward and backward
 * values of case c (c NULL: of any case); a static string, or NULL. */
DL_EXTERN const char *dl_golden_nearest_dataset(const char *path, const dl_moe_config_t *c);

/* Lists the datasets of the file at path that are no value of case c: a
 * name the format does not have ("/forward/h_gates (did you mean
 * /forward/h_gate?)") or a value case c lacks ("(not a value of this
 * case)"), comma-separated into buf (n bytes; "..." ends a list that does
 * not fit), their number in *count (may be NULL). Walks at most 4096
 * objects. Like dl_golden_load_candidate it parses the file unprotected.
 * Returns 0, DL_EINVAL or DL_EFORMAT (not HDF5 or unreadable). */
DL_EXTERN int dl_golden_unknown_datasets(const char *path, const dl_moe_config_t *c, char *buf,
                                         size_t n, int *count);

#ifdef __cplusplus
}
#endif
#endif
