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
    for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < N; n++)
            o->t[n * K + k] = w[k * N + n];
    *nk = o->t;
    return 0;
}

/* Expert e of the window (its rows [r0, r0 + n)). */
static int lowp_expert(const dl_stage_view_t *v, const dl_lowp_layer_row_t *row, int kind,
                       const dl__lowp_pair_t *p, int np, int64_t e, int64_t K, int64_t N,
                       float *out)
{
    const int64_t r0 = v->off[e], n = v->off[e + 1] - r0, offs[2] = {0, n};
    qop_t a[DL__QPAIRS_MAX], b[DL__QPAIRS_MAX];
    memset(a, 0, sizeof a), memset(b, 0, sizeof b);
    dl_qmat_t am[DL__QPAIRS_MAX], bm[DL__QPAIRS_MAX];
    int rc = 0;
    for (int i = 0; i < np && !rc; i++) {
        const float *nk = NULL;
        rc = qop_make(&a[i], kind == DL__LOWP_FWD_H ? row->h : row->x, p[i].a + r0 * K, n, K);
        if (!rc && !(rc = weight_nk(&b[i], p[i].w + e * K * N, p[i].lay, K, N, &nk)))
            rc = qop_make(&b[i], row->w, nk, N, K);
        am[i] = a[i].m, bm[i] = b[i].m;
    }
    if (!rc)
        rc = dl__gemm_block_scaled_pairs(am, bm, np, 1, offs, v->c.dtype, out + r0 * N, v->stats);
    for (int i = 0; i < np; i++)
        qop_free(&a[i]), qop_free(&b[i]);
    return rc;
}

int dl__lowp_gemm(const dl_stage_view_t *v, int kind, const dl__lowp_pair_t *p, int np, int64_t K,
                  int64_t N, float *out)
{
    const dl_lowp_layer_row_t *row = dl_lowp_layer(v->c.lowp);
    if (!row || np < 1 || np > DL__QPAIRS_MAX || !v->off)
        return DL_EINVAL;
    int rc = 0;
    for (int64_t e = 0; e < v->ne && !rc; e++)
        if (v->off[e + 1] > v->off[e])
            rc = lowp_expert(v, row, kind, p, np, e, K, N, out);
    return rc;
}
