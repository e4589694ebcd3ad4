/* golden_priv.h: internals of the golden-file layer (src/golden/): HDF5
 * helpers, the seal, enum names; not installed. */
#ifndef DL_GOLDEN_PRIV_H
#define DL_GOLDEN_PRIV_H

#include "stages/stages_priv.h"
#include "util/util_priv.h"
#include "dropless/golden.h"

#define DL__GOLDEN_OWNER_MALLOC 0 /* every array malloc'ed */
#define DL__GOLDEN_OWNER_MOE 1    /* forward/backward from dl_moe_forward/backward */
const char *dl__golden_score_name(int v);
const char *dl__golden_group_name(int v);
const char *dl__golden_ffn_name(int v);
const char *dl__golden_inputs_name(int v);
int dl__golden_score_parse(const char *s);
int dl__golden_group_parse(const char *s);
int dl__golden_ffn_parse(const char *s);
int dl__golden_inputs_parse(const char *s);
#ifdef __GNUC__
__attribute__((format(printf, 3, 4)))
#endif
void dl__golden_msg(char *err, size_t errlen, const char *fmt, ...);
/* Checks what the golden format needs of a configuration beyond
 * dl_moe_config_validate; 0 or DL_EINVAL with a reason in why. */
int dl__golden_config_check(const dl_moe_config_t *c, char *why, size_t whylen);
/* Inputs a piece at a time (inputs.c), for the streaming generator: every
 * input but the expert weights (those stay NULL), and expert e of one
 * expert weight (d*f floats, the same values as dl_case_inputs draws). */
#define DL__W_GATE 0
#define DL__W_UP 1
#define DL__W_DOWN 2
int dl__case_inputs_small(const dl_case_t *c, dl_golden_inputs_t *in);
void dl__case_expert_weight(const dl_case_t *c, int which, int64_t e, float *buf);
/* inputs = sizes: every expert's planted group size into q[E]; DL_EINVAL
 * when the configuration cannot hold the plan (doc/format.md). */
int dl__case_planted_sizes(const dl_moe_config_t *k, int64_t *q);
/* Writing a file whose datasets are produced piece by piece (write.c for
 * stream.c). shape() gives a dataset's extents in this file (a slice
 * shrinks E and M) and its element count, or -1 to leave it out;
 * produce() writes its rows, in order, through dl__golden_sink_put (0 or
 * an error code with the message in the writer's err). expert_end > 0
 * marks a slice: root attributes expert_begin and expert_end. */
typedef struct dl__golden_sink dl__golden_sink_t;
typedef struct {
    void *ctx;
    int64_t (*shape)(void *ctx, const dl_golden_dataset_t *ds, int64_t dims[3]);
    int (*produce)(void *ctx, const dl_golden_dataset_t *ds, dl__golden_sink_t *sink);
    int64_t expert_begin, expert_end;
} dl__golden_source_t;
int dl__golden_sink_put(dl__golden_sink_t *s, int64_t row0, int64_t nrows, const void *data);
/* dl_golden_write with the datasets from src; hdr gives the root
 * attributes, /config and the has_* flags (its arrays are not used). */
int dl__golden_write_source(const char *path, const dl_golden_file_t *hdr,
                            const dl__golden_source_t *src, int force,
                            dl_golden_progress_fn progress, void *pctx, char *err, size_t errlen);
/* 1 if s is a valid case name: 1 to DL_GOLDEN_NAME_MAX of [A-Za-z0-9._-]. */
int dl__golden_name_ok(const char *s);
/* The loaders (read.c): strict for golden files, else against expect;
 * seal_checked: the caller has just verified the file's seal. */
int dl__golden_load(const char *path, const dl_moe_config_t *expect, int strict, int seal_checked,
                    dl_golden_file_t *g, char *err, size_t errlen);
/* Silences HDF5's automatic error-stack printing, restoring it after. */
typedef struct { void (*fn)(void); void *data; } dl__h5_quiet_t;
void dl__h5_quiet_on(dl__h5_quiet_t *q);
void dl__h5_quiet_off(const dl__h5_quiet_t *q);
/* The group loc/name and its member count: 1 (*grp open, close it), 0
 * absent, -1 not looked up, -2 not a group. The i-th member's name in
 * name order into buf: 0, or -1 (unreadable, longer than n - 1). */
int dl__h5_group_members(int64_t loc, const char *name, int64_t *grp, uint64_t *n);
int dl__h5_member_name(int64_t grp, uint64_t i, char *buf, size_t n);
/* The seal (seal.c): a user block of this size holding the
 * SHA-256 of the rest of the file. */
#define DL__GOLDEN_USERBLOCK 512
typedef struct {
    uint32_t h[8];
    uint64_t len;
    unsigned char buf[64];
    size_t nbuf;
} dl__sha256_t;
void dl__sha256_init(dl__sha256_t *s);
void dl__sha256_update(dl__sha256_t *s, const void *data, size_t n);
void dl__sha256_final(dl__sha256_t *s, unsigned char out[32]);
/* 0 with *sealed = 1 (seal verified) or 0 (no seal); DL_EFORMAT when the
 * seal does not match (damaged or truncated), DL_EIO, DL_ENOMEM. */
int dl__golden_verify_seal(const char *path, int *sealed, char *err, size_t errlen);
/* The seal as a loader takes it: strict (a golden) as dl__golden_verify_seal;
 * otherwise (a candidate needs no seal: an edited copy of a golden, h5py
 * 'r+', is the natural way to make one) a seal that does not match sets
 * *sealed = -1 and is no error. */
int dl__golden_check_seal(const char *path, int strict, int *sealed, char *err, size_t errlen);
/* Writes the user block of a file being written (fd, at offset 0): it says
 * "incomplete" until dl_golden_seal replaces it. 0 or DL_EIO. */
int dl__golden_mark_incomplete(int fd, char *err, size_t errlen, const char *path);
/* The expert-parallel layout groups (ep.c, ep_read.c). hid_t values are
 * passed as int64_t (HDF5 1.10's hid_t) so this header needs no hdf5.h.
 * check_ranks: DL_EINVAL unless every --ep-ranks R divides E. layouts:
 * fills g->ep (ascending R, duplicates once) from the routing. write: the
 * /ep group after the others (nothing when g->n_ep = 0). read: every
 * /ep/ranks_R into g->ep; strict (a golden) needs them complete and equal
 * to the stage's layout of g->fwd.topk_ids (read that first). */
int dl__golden_ep_check_ranks(const dl_moe_config_t *c, const dl_golden_gen_opts_t *o,
                              const char *name, char *err, size_t errlen);
int dl__golden_ep_layouts(const dl_moe_config_t *c, const int32_t *ids, const float *w,
                          const dl_golden_gen_opts_t *o, dl_golden_file_t *g);
int dl__golden_ep_write(int64_t file, int64_t gcpl, int64_t dcpl, const dl_golden_file_t *g,
                        const char *path, char *err, size_t errlen);
int dl__golden_ep_read(int64_t file, dl_golden_file_t *g, int strict, const char *path, char *err,
                       size_t errlen);
/* A group reader's failure: "PATH: WHERE: message" into x->err, return
 * code; x has path, err, errlen and where. */
#define DL__GOLDEN_CTX_FAIL(x, code, ...)                                       \
    do {                                                                        \
        char m_[240];                                                           \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                   \
        dl__golden_msg(x->err, x->errlen, "%s: %s: %s", x->path, x->where, m_); \
        return (code);                                                          \
    } while (0)
/* A scalar attribute of obj (an hid_t): the fixed-length string s, or the
 * int64 v when s is NULL. 0 or DL_EIO. */
int dl__golden_attr_put(int64_t obj, const char *name, const char *s, int64_t v);
/* The kernel layout groups (layouts.c, layouts_read.c). check: DL_EINVAL
 * (message in err) unless the options' layouts can be generated (in
 * memory; every EP rank count valid). build: g->layouts from g's forward
 * (after dl_moe_forward): each layout whole, then each rank's variant for
 * each --ep-ranks R. write: /layouts after /ep (nothing when n_layouts =
 * 0). read: every /layouts/NAME into g->layouts; strict (a golden) needs
 * them complete and equal to the stage's layout of g's forward. */
int dl__golden_layouts_check(const dl_moe_config_t *c, const dl_golden_gen_opts_t *o,
                             const char *name, char *err, size_t errlen);
int dl__golden_layouts_build(dl_golden_file_t *g, const dl_golden_gen_opts_t *o, char *err,
                             size_t errlen);
int dl__golden_layouts_write(int64_t file, int64_t gcpl, int64_t dcpl, const dl_golden_file_t *g,
                             const char *path, char *err, size_t errlen);
int dl__golden_layouts_read(int64_t file, dl_golden_file_t *g, int strict, const char *path,
                            char *err, size_t errlen);

/* A dataset's extents in the slice of n_experts experts and their n_rows
 * sorted rows (stream.c; full: the whole file), its element count, or -1
 * when a slice leaves it out (it needs every expert's rows). */
int64_t dl__golden_slice_shape(const dl_golden_dataset_t *ds, const dl_moe_config_t *c, int full,
                               int64_t n_experts, int64_t n_rows, int64_t dims[3]);

#endif
