/* Reading /ep/ranks_R groups. A golden's must be complete, exactly typed
 * and equal to the layout dl_ep_layout computes from its topk_ids. A
 * candidate's hold any subset, in the whole form or a rank's view (group
 * attribute rank); a dataset of the wrong shape or type is set aside (its
 * bit in bad, the reason kept) for the checker to FAIL, and the number of
 * received rows is the candidate's own (a dispatch that drops or
 * duplicates has another N than the golden's), bounded so that a hostile
 * shape cannot ask for absurd memory. */
#include "config.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hdf5.h>
#include "golden/golden_priv.h"

typedef struct {
    const char *path;
    char *err;
    size_t errlen;
    int strict;
    char where[64]; /* "/ep/ranks_4" */
} ectx_t;

#define EFAIL(code, ...) DL__GOLDEN_CTX_FAIL(x, code, __VA_ARGS__)

/* Sets dataset i aside (candidates) or fails (goldens). */
static int set_aside(ectx_t *x, dl_ep_layout_t *L, int i, const char *why)
{
    if (x->strict)
        EFAIL(DL_EFORMAT, "%s: %s", dl_ep_dataset_name(i), why);
    if (!L->bad)
        snprintf(L->bad_reason, sizeof L->bad_reason, "%s: %s", dl_ep_dataset_name(i), why);
    L->bad |= UINT32_C(1) << i;
    return 0;
}

/* The stored shape against the form's; N taken from the first recv_*
 * dataset. 1 fits, 0 set aside, < 0 error. */
static int shape_ok(ectx_t *x, dl_ep_layout_t *L, int i, hid_t sp, hsize_t *n)
{
    hsize_t have[H5S_MAX_RANK];
    int64_t want[2];
    int nd = dl_ep_dataset_shape(L, i, want);
    int hn = H5Sget_simple_extent_ndims(sp);
    if (hn < 0 || hn > H5S_MAX_RANK || H5Sget_simple_extent_dims(sp, have, NULL) < 0)
        EFAIL(DL_EFORMAT, "%s: cannot read its shape", dl_ep_dataset_name(i));
    const char *dims = dl_ep_dataset_dims(i);
    if (hn != nd)
        return set_aside(x, L, i, "wrong number of dimensions");
    if (dims[0] == 'N' && L->n_recv < 0) {
        /* one copy per (token, rank) at most is T*R rows; a candidate's
         * duplicates may go beyond: allow twice that */
        if (have[0] > (hsize_t)(2 * L->n_tokens * L->ranks + 16))
            return set_aside(x, L, i, "more rows than any dispatch of this case");
        L->n_recv = want[0] = (int64_t)have[0];
    }
    *n = 1;
    for (int d = 0; d < nd; d++) {
        if (have[d] != (hsize_t)want[d]) {
            char why[96];
            snprintf(why, sizeof why, "dimension %d is %llu, expected %lld", d,
                     (unsigned long long)have[d], (long long)want[d]);
            return set_aside(x, L, i, why);
        }
        *n *= have[d];
    }
    return 1;
}

/* The stored type: exact for goldens; any integer (read wide) or float32
 * for candidates. 1 fits, 0 set aside, < 0 error. */
static int type_ok(ectx_t *x, dl_ep_layout_t *L, int i, hid_t t)
{
    const int elem = dl_ep_dataset_elem(i);
    hid_t exact = elem == DL_EP_I64 ? H5T_STD_I64LE : elem == DL_EP_I32 ? H5T_STD_I32LE
                  : elem == DL_EP_BOOL ? H5T_STD_U8LE : H5T_IEEE_F32LE;
    htri_t eq = H5Tequal(t, exact);
    if (eq < 0)
        EFAIL(DL_EFORMAT, "%s: cannot read its type", dl_ep_dataset_name(i));
    if (eq)
        return 1;
    if (x->strict)
        return set_aside(x, L, i, "not of its exact type");
    H5T_class_t c = H5Tget_class(t);
    if (elem == DL_EP_F32 && (c != H5T_FLOAT || H5Tget_size(t) != 4))
        return set_aside(x, L, i, "weights must be stored as float32 (copied bit for bit)");
    if (elem != DL_EP_F32 && (c != H5T_INTEGER || H5Tget_size(t) > 8))
        return set_aside(x, L, i, "not an integer type");
    return 1;
}

/* Integers read as int64 and narrowed; a bool that is neither 0 nor 1 is
 * kept as 2 (a finding for the checker). */
static int read_ints(ectx_t *x, dl_ep_layout_t *L, int i, hid_t d, hsize_t n, void **slot)
{
    const int elem = dl_ep_dataset_elem(i);
    int64_t *w = malloc(n ? (size_t)n * 8 : 8);
    if (!w)
        return DL_ENOMEM;
    if (n && H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, w) < 0) {
        free(w);
        EFAIL(DL_EFORMAT, "%s: cannot read its data", dl_ep_dataset_name(i));
    }
    if (elem == DL_EP_I64) {
        *slot = w;
        return 1;
    }
    void *out = malloc(n ? (size_t)n * (elem == DL_EP_I32 ? 4 : 1) : 4);
    if (!out) {
        free(w);
        return DL_ENOMEM;
    }
    int range = 1;
    for (hsize_t j = 0; j < n; j++) {
        if (elem == DL_EP_I32) {
            range &= w[j] >= INT32_MIN && w[j] <= INT32_MAX;
            ((int32_t *)out)[j] = (int32_t)w[j];
        } else {
            ((uint8_t *)out)[j] = w[j] == 0 ? 0 : w[j] == 1 ? 1 : 2;
        }
    }
    free(w);
    if (!range) {
        free(out);
        return set_aside(x, L, i, "a value outside int32");
    }
    *slot = out;
    return 1;
}

static int read_one(ectx_t *x, hid_t grp, dl_ep_layout_t *L, int i)
{
    const char *name = dl_ep_dataset_name(i);
    htri_t ex = H5Lexists(grp, name, H5P_DEFAULT);
    if (ex < 0)
        EFAIL(DL_EFORMAT, "cannot look up %s (damaged group)", name);
    if (ex == 0)
        return 0;
    hid_t d = H5Dopen2(grp, name, H5P_DEFAULT), t = -1, sp = -1;
    if (d < 0)
        return set_aside(x, L, i, "not a dataset");
    int rc = (t = H5Dget_type(d)) < 0 || (sp = H5Dget_space(d)) < 0 ? DL_EFORMAT : 0;
    hsize_t n = 0;
    if (rc == 0 && (rc = shape_ok(x, L, i, sp, &n)) == 1 && (rc = type_ok(x, L, i, t)) == 1) {
        void **slot = dl_ep_slot(L, i);
        if (dl_ep_dataset_elem(i) != DL_EP_F32) {
            rc = read_ints(x, L, i, d, n, slot);
        } else if (!(*slot = malloc(n ? (size_t)n * 4 : 4))) {
            rc = DL_ENOMEM;
        } else if (n && H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, *slot) < 0) {
            dl__golden_msg(x->err, x->errlen, "%s: %s: %s: cannot read its data", x->path,
                           x->where, name);
            rc = DL_EFORMAT;
        }
    }
    if (rc == DL_EFORMAT && x->err && !x->err[0])
        dl__golden_msg(x->err, x->errlen, "%s: %s: %s: damaged", x->path, x->where, name);
    if (sp >= 0)
        H5Sclose(sp);
    if (t >= 0)
        H5Tclose(t);
    H5Dclose(d);
    return rc < 0 ? rc : 0;
}

/* The group's rank attribute: -1 when absent. */
static int read_rank(ectx_t *x, hid_t grp, int64_t R, int64_t *rank)
{
    *rank = -1;
    htri_t ex = H5Aexists(grp, "rank");
    if (ex < 0)
        EFAIL(DL_EFORMAT, "cannot read its attributes");
    if (ex == 0)
        return 0;
    if (x->strict)
        EFAIL(DL_EFORMAT, "a golden file holds whole layouts, not a rank's view");
    hid_t a = H5Aopen(grp, "rank", H5P_DEFAULT), t = a >= 0 ? H5Aget_type(a) : -1;
    int ok = t >= 0 && H5Tget_class(t) == H5T_INTEGER &&
             H5Aread(a, H5T_NATIVE_INT64, rank) >= 0;
    if (t >= 0)
        H5Tclose(t);
    if (a >= 0)
        H5Aclose(a);
    if (!ok)
        EFAIL(DL_EFORMAT, "attribute 'rank' must be an integer");
    if (*rank < 0 || *rank >= R)
        EFAIL(DL_EFORMAT, "attribute 'rank' = %" PRId64 " is not in [0, %" PRId64 ")", *rank, R);
    return 0;
}

static int read_group(ectx_t *x, hid_t top, const char *name, const dl_moe_config_t *c,
                      dl_ep_layout_t *L)
{
    long long R = 0;
    int used = 0;
    snprintf(x->where, sizeof x->where, "/ep/%.40s", name);
    if (sscanf(name, "ranks_%lld%n", &R, &used) != 1 || name[used] || R < 1 ||
        R > c->route.experts || c->route.experts % R)
        EFAIL(DL_EFORMAT, "not a group ranks_R with R dividing the %" PRId64 " experts",
              c->route.experts);
    hid_t grp = H5Gopen2(top, name, H5P_DEFAULT);
    if (grp < 0)
        EFAIL(DL_EFORMAT, "not a group");
    memset(L, 0, sizeof *L);
    L->ranks = R;
    L->experts = c->route.experts;
    L->top_k = c->route.top_k;
    L->tokens = c->tokens;
    int rc = read_rank(x, grp, R, &L->rank);
    int64_t b = 0, e = c->tokens;
    if (L->rank >= 0)
        dl_ep_source_range(c->tokens, R, L->rank, &b, &e);
    L->n_tokens = e - b;
    L->n_recv = -1;
    const int form = L->rank >= 0 ? DL_EP_VIEW : DL_EP_WHOLE;
    for (int i = 0; !rc && i < DL_EP_DATASET_COUNT; i++)
        if (dl_ep_dataset_forms(i) & form)
            rc = read_one(x, grp, L, i);
    for (int i = 0; !rc && x->strict && i < DL_EP_DATASET_COUNT; i++)
        if ((dl_ep_dataset_forms(i) & form) && !*dl_ep_slot(L, i)) {
            dl__golden_msg(x->err, x->errlen, "%s: %s/%s is missing", x->path, x->where,
                           dl_ep_dataset_name(i));
            rc = DL_EFORMAT;
        }
    if (L->n_recv < 0)
        L->n_recv = 0;
    H5Gclose(grp);
    return rc;
}

/* A golden's layouts must be the stage's own of its routing. */
static int same_as_stage(ectx_t *x, const dl_golden_file_t *g, const dl_ep_layout_t *L)
{
    dl_ep_layout_t ref;
    const dl_moe_config_t *c = &g->config;
    int rc = dl_ep_layout(g->fwd.topk_ids, g->fwd.topk_weights, c->tokens, c->route.top_k,
                          c->route.experts, L->ranks, &ref);
    if (rc)
        EFAIL(DL_EFORMAT, "the layout of /forward/topk_ids cannot be computed: %s", dl_strerror(rc));
    for (int i = 0; !rc && i < DL_EP_DATASET_COUNT; i++) {
        if (!(dl_ep_dataset_forms(i) & DL_EP_WHOLE))
            continue;
        int64_t d1[2] = {1, 1}, d2[2] = {1, 1};
        int n1 = dl_ep_dataset_shape(L, i, d1), n2 = dl_ep_dataset_shape(&ref, i, d2);
        size_t es = dl_ep_dataset_elem(i) == DL_EP_I64 ? 8 : dl_ep_dataset_elem(i) == DL_EP_BOOL ? 1 : 4;
        if (n1 != n2 || d1[0] != d2[0] || d1[1] != d2[1] ||
            memcmp(*dl_ep_slot((dl_ep_layout_t *)L, i), *dl_ep_slot(&ref, i),
                   (size_t)(d1[0] * (n1 == 2 ? d1[1] : 1)) * es)) {
            dl__golden_msg(x->err, x->errlen, "%s: %s/%s is not the layout of /forward/topk_ids",
                           x->path, x->where, dl_ep_dataset_name(i));
            rc = DL_EFORMAT;
        }
    }
    dl_ep_layout_free(&ref);
    return rc;
}

int dl__golden_ep_read(int64_t file, dl_golden_file_t *g, int strict, const char *path, char *err,
                       size_t errlen)
{
    ectx_t xx = {path, err, errlen, strict, "/ep"}, *x = &xx;
    hid_t top;
    uint64_t nl;
    int ex = dl__h5_group_members(file, "ep", &top, &nl);
    if (ex < 0)
        EFAIL(DL_EFORMAT, ex == -1 ? "cannot look it up" : "not a group");
    if (ex == 0)
        return 0;
    int rc = nl > DL_GOLDEN_EP_MAX ? DL_EFORMAT : 0;
    if (rc)
        dl__golden_msg(err, errlen, "%s: /ep: more than %d groups", path, DL_GOLDEN_EP_MAX);
    for (uint64_t i = 0; !rc && i < nl; i++) {
        char name[64];
        if (dl__h5_member_name(top, i, name, sizeof name)) {
            dl__golden_msg(err, errlen, "%s: /ep: a member with an unreadable or long name", path);
            rc = DL_EFORMAT;
            break;
        }
        rc = read_group(x, top, name, &g->config, &g->ep[g->n_ep]);
        g->n_ep++;
        if (!rc && strict && g->has_forward)
            rc = same_as_stage(x, g, &g->ep[g->n_ep - 1]);
    }
    H5Gclose(top);
    /* names sort "ranks_16" before "ranks_2": keep ascending R */
    for (int i = 1; i < g->n_ep; i++)
        for (int j = i; j > 0 && g->ep[j - 1].ranks > g->ep[j].ranks; j--) {
            dl_ep_layout_t t = g->ep[j];
            g->ep[j] = g->ep[j - 1];
            g->ep[j - 1] = t;
        }
    return rc;
}
