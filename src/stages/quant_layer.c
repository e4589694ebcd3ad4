/* The layer recipes (DL_LOWP_LAYER_MAP): the expert GEMMs of the one
 * schedule (schedule.c) on quantized operands. Each expert of a producer's
 * window is quantized on its own: its activation rows under the recipe's
 * activation rule (1 x 128 or 1 x 32 or 1 x 16 tiles along K are per row,
 * so quantizing x's rows before the dispatch and quantizing x_sorted's
 * rows after it give the same codes and scales, row for row), its weights
 * under the weight rule, taken [N, K] (K the contraction axis, the axis
 * the 1 x bc blocks run along); then dl_gemm_block_scaled's exact sum,
 * rounded once to the case's dtype. A global scale (NVFP4) is the
 * expert's own, over that expert's operand, so every placement (the whole
 * layer, one expert at a time, a rank's experts) gives the same bytes. */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "stages/stages_priv.h"
#include "stages/quant_priv.h"

#define DL__LOWP_ROW(id, nm, x, w, h, dg) [DL_LOWP_##id] = {nm, x, w, h, dg},
static const dl_lowp_layer_row_t layer_rows[DL_LOWP_COUNT] = {DL_LOWP_LAYER_MAP(DL__LOWP_ROW)};
#undef DL__LOWP_ROW

const dl_lowp_layer_row_t *dl_lowp_layer(int id)
{
    return id > DL_LOWP_NONE && id < DL_LOWP_COUNT ? &layer_rows[id] : NULL;
}

int dl_lowp_layer_parse(const char *s)
{
    if (s && !strcmp(s, "none"))
        return DL_LOWP_NONE;
    for (int i = 1; s && i < DL_LOWP_COUNT; i++)
        if (!strcmp(s, layer_rows[i].name))
            return i;
    return -1;
}

int dl__lowp_applies(const dl_moe_config_t *c, int kind)
{
    const dl_lowp_layer_row_t *r = dl_lowp_layer(c->lowp);
    return r && (kind != DL__LOWP_DGRAD || r->dgrad);
}

int dl__lowp_config_check(const dl_moe_config_t *c)
{
    if (c->lowp == DL_LOWP_NONE)
        return 0;
    const dl_lowp_layer_row_t *r = dl_lowp_layer(c->lowp);
    if (!r)
        return DL_EINVAL;
    const char *names[3] = {r->x, r->w, r->h};
    for (int i = 0; i < 3; i++) {
        dl_qrule_t q;
        if (!names[i])
            continue;
        if (dl_quant_recipe(names[i], &q) || dl_quant_rule_check(&q, c->hidden) ||
            dl_quant_rule_check(&q, c->ffn))
            return DL_EINVAL;
    }
    return 0;
}

/* One operand quantized: codes, scales and the matrix over them. */
typedef struct {
    dl_qrule_t rule;
    uint8_t *q, *s;
    float *t; /* a transposed weight */
    dl_qmat_t m;
} qop_t;

static void qop_free(qop_t *o)
{
    free(o->q), free(o->s), free(o->t);
}

/* Quantizes x [rows, cols] under the recipe named name (NULL: x stays as
 * it is, an unquantized operand). */
static int qop_make(qop_t *o, const char *name, const float *x, int64_t rows, int64_t cols)
{
    if (!name) {
        o->m = (dl_qmat_t){NULL, rows, cols, NULL, x};
        return 0;
    }
    if (dl_quant_recipe(name, &o->rule))
        return DL_EINTERNAL;
    if (o->rule.scale == DL_QSCALE_E4M3)
        o->rule.global = dl_nvfp4_global(x, rows * cols);
    int64_t qb = dl_quant_qbytes(&o->rule, rows, cols), sb = dl_quant_sbytes(&o->rule, rows, cols);
    o->q = malloc((size_t)(qb ? qb : 1));
    o->s = malloc((size_t)(sb ? sb : 1));
    if (!o->q || !o->s)
        return DL_ENOMEM;
    o->m = (dl_qmat_t){&o->rule, rows, cols, o->q, o->s};
    return dl_quantize(&o->rule, x, rows, cols, o->q, o->s);
}

/* Expert e's weight [N, K] from the window's weights in layout lay. */
static int weight_nk(qop_t *o, const float *w, dl_rhs_layout_t lay, int64_t K, int64_t N,
                     const float **nk)
{
    *nk = w;
    if (lay == DL_RHS_NK)
        return 0;
    if (!(o->t = malloc((size_t)(N * K) * sizeof(float))))
        return DL_ENOMEM;
    for (int64_t k0 = 0; k0 < K; k0 += 32) /* in 32 x 32 tiles: both sides stay in cache */
        for (int64_t n0 = 0; n0 < N; n0 += 32)
            for (int64_t k = k0; k < K && k < k0 + 32; k++)
                for (int64_t n = n0; n < N && n < n0 + 32; n++)
                    o->t[n * K + k] = w[k * N + n];
    *nk = o->t;
    return 0;
}

/* One operand of a pair over the window, dequantized and split exactly
 * (hi + lo; lo only where any_lo). */
typedef struct {
    float *hi, *lo;
    int any_lo;
} split_t;

/* Expert e's operands of pair p: its rows of a (unless a stays as it is)
 * and its weight, quantized and split into their places in *a and *b. */
static int expert_split(const dl_stage_view_t *v, const char *ra, const char *rw,
                        const dl__lowp_pair_t *p, int64_t e, int64_t K, int64_t N, split_t *a,
                        split_t *b, int *a_lo, int *b_lo)
{
    const int64_t r0 = v->off[e], n = v->off[e + 1] - r0;
    qop_t qa, qb;
    memset(&qa, 0, sizeof qa), memset(&qb, 0, sizeof qb);
    const float *nk = NULL;
    int rc = 0;
    if (ra && !(rc = qop_make(&qa, ra, p->a + r0 * K, n, K)))
        rc = dl__qmat_split(&qa.m, a->hi + r0 * K, a->lo + r0 * K, a_lo);
    if (!rc && !(rc = weight_nk(&qb, p->w + e * K * N, p->lay, K, N, &nk)) &&
        !(rc = qop_make(&qb, rw, nk, N, K)))
        rc = dl__qmat_split(&qb.m, b->hi + e * N * K, b->lo + e * N * K, b_lo);
    qop_free(&qa), qop_free(&qb);
    return rc;
}

/* Pair p's operands over the window's experts (independent: in parallel,
 * each expert writing its own rows; the first error in expert order). */
static int pair_split(const dl_stage_view_t *v, const char *ra, const char *rw,
                      const dl__lowp_pair_t *p, int64_t K, int64_t N, split_t *a, split_t *b)
{
    int *err = calloc((size_t)v->ne + 1, sizeof(int)), a_lo = 0, b_lo = 0;
    if (!err)
        return DL_ENOMEM;
#pragma omp parallel for schedule(dynamic) reduction(| : a_lo, b_lo) if (v->ne > 1)
    for (int64_t e = 0; e < v->ne; e++)
        if (v->off[e + 1] > v->off[e])
            err[e] = expert_split(v, ra, rw, p, e, K, N, a, b, &a_lo, &b_lo);
    int rc = 0;
    for (int64_t e = 0; e < v->ne && !rc; e++)
        rc = err[e];
    free(err);
    a->any_lo = a_lo, b->any_lo = b_lo;
    return rc;
}

static int alloc_split(split_t *s, int64_t n)
{
    s->hi = calloc((size_t)(n ? n : 1), sizeof(float));
    s->lo = calloc((size_t)(n ? n : 1), sizeof(float));
    return s->hi && s->lo ? 0 : DL_ENOMEM;
}

int dl__lowp_gemm(const dl_stage_view_t *v, int kind, const dl__lowp_pair_t *p, int np, int64_t K,
                  int64_t N, float *out)
{
    const dl_lowp_layer_row_t *row = dl_lowp_layer(v->c.lowp);
    if (!row || np < 1 || np > DL__QPAIRS_MAX || !v->off)
        return DL_EINVAL;
    const char *ra = kind == DL__LOWP_FWD_H ? row->h : row->x;
    const int64_t M = v->off[v->ne];
    split_t a[DL__QPAIRS_MAX], b[DL__QPAIRS_MAX];
    memset(a, 0, sizeof a), memset(b, 0, sizeof b);
    dl_gemm_term_t t[4 * DL__QPAIRS_MAX];
    int nt = 0, rc = 0;
    for (int i = 0; i < np && !rc; i++) {
        if ((ra && (rc = alloc_split(&a[i], M * K))) || (rc = alloc_split(&b[i], v->ne * N * K)) ||
            (rc = pair_split(v, ra, row->w, &p[i], K, N, &a[i], &b[i])))
            break;
        const float *ah = ra ? a[i].hi : p[i].a;
        t[nt++] = (dl_gemm_term_t){ah, K, b[i].hi, DL_RHS_NK};
        if (b[i].any_lo)
            t[nt++] = (dl_gemm_term_t){ah, K, b[i].lo, DL_RHS_NK};
        if (a[i].any_lo)
            t[nt++] = (dl_gemm_term_t){a[i].lo, K, b[i].hi, DL_RHS_NK};
        if (a[i].any_lo && b[i].any_lo)
            t[nt++] = (dl_gemm_term_t){a[i].lo, K, b[i].lo, DL_RHS_NK};
    }
    if (!rc)
        rc = dl_gemm_grouped(t, nt, N, v->off, v->ne, v->c.dtype, out, v->stats);
    for (int i = 0; i < np; i++)
        free(a[i].hi), free(a[i].lo), free(b[i].hi), free(b[i].lo);
    return rc;
}
