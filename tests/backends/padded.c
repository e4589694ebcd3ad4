/* padded.c: a block-padded backend, the layout of vLLM's moe_align_block_size.
 *
 * Each expert's rows are padded up to a multiple of BLOCK = 128 rows, so
 * that a GEMM kernel only ever sees whole tiles; the padding rows hold
 * garbage and are computed like any other row, but never reach an output:
 * dispatch compacts the padded id list, the expert stages scatter only real
 * rows back, and the weight gradients mask padding rows out. The per-row
 * arithmetic is plain.c's, so the outputs are bit-identical to plain.c's.
 * Expected verdict: PASS. Stages not written here are plain.c's.
 */
#include <dropless/backend.h>
#include "kernels.h"

#define BLOCK 128
#define GARBAGE 3.0f /* what padding rows hold; any value must do */

/* Padded offsets: poff[e] = start of expert e's padded rows, poff[E] = total. */
static int64_t *pad_offsets(const int64_t *off, int64_t E)
{
    int64_t *poff = malloc((size_t)(E + 1) * sizeof *poff);
    if (!poff)
        return NULL;
    poff[0] = 0;
    for (int64_t e = 0; e < E; e++)
        poff[e + 1] = poff[e] + (off[e + 1] - off[e] + BLOCK - 1) / BLOCK * BLOCK;
    return poff;
}

/* A padded copy of rows [off[e], off[e+1]) of src (width w) per expert. */
static float *pad_rows(const float *src, int64_t w, const int64_t *off, const int64_t *poff,
                       int64_t E)
{
    float *p = malloc((size_t)(poff[E] * w > 0 ? poff[E] * w : 1) * sizeof *p);
    if (!p)
        return NULL;
    for (int64_t i = 0; i < poff[E] * w; i++)
        p[i] = GARBAGE;
    for (int64_t e = 0; e < E; e++)
        if (src)
            memcpy(p + poff[e] * w, src + off[e] * w, (size_t)((off[e + 1] - off[e]) * w) * sizeof *p);
    return p;
}

/* The real rows of a padded buffer back into dst. */
static void unpad_rows(const float *p, int64_t w, const int64_t *off, const int64_t *poff,
                       int64_t E, float *dst)
{
    for (int64_t e = 0; e < E; e++)
        memcpy(dst + off[e] * w, p + poff[e] * w, (size_t)((off[e + 1] - off[e]) * w) * sizeof *p);
}

/* moe_align_block_size: the sorted ids padded per expert with the sentinel
 * M, then compacted into the ABI's unpadded sort_perm. */
static int dispatch(const dl_backend_config_t *c, const dl_backend_dispatch_args_t *a)
{
    const int64_t E = c->experts, M = c->tokens * c->top_k;
    const int32_t *ids = EX_I32(a->topk_ids);
    int64_t *size = EX_I64(a->group_sizes), *off = EX_I64(a->group_offsets);
    for (int64_t e = 0; e < E; e++)
        size[e] = 0;
    for (int64_t f = 0; f < M; f++) {
        if (ids[f] < 0 || ids[f] >= E)
            return 1;
        size[ids[f]]++;
    }
    off[0] = 0;
    for (int64_t e = 0; e < E; e++)
        off[e + 1] = off[e] + size[e];
    int64_t *poff = pad_offsets(off, E), *next = malloc((size_t)E * sizeof *next);
    int32_t *padded = poff ? malloc((size_t)(poff[E] > 0 ? poff[E] : 1) * sizeof *padded) : NULL;
    if (!poff || !next || !padded) {
        free(poff), free(next), free(padded);
        return 1;
    }
    for (int64_t i = 0; i < poff[E]; i++)
        padded[i] = (int32_t)M; /* the sentinel */
    memcpy(next, poff, (size_t)E * sizeof *next);
    for (int64_t f = 0; f < M; f++)
        padded[next[ids[f]]++] = (int32_t)f;
    int32_t *perm = EX_I32(a->sort_perm);
    int64_t p = 0;
    for (int64_t i = 0; i < poff[E]; i++)
        if (padded[i] != M)
            perm[p++] = padded[i];
    free(poff), free(next), free(padded);
    return p == M ? 0 : 1;
}

static int expert_forward(const dl_backend_config_t *c, const dl_backend_expert_forward_args_t *a)
{
    const int64_t d = c->hidden, f = c->ffn, E = c->experts;
    const int64_t *off = EX_I64(a->group_offsets);
    const int sw = c->ffn_kind == DL_BACKEND_SWIGLU;
    int64_t *poff = pad_offsets(off, E);
    if (!poff)
        return 1;
    float *xp = pad_rows(EX_F32(a->x_sorted), d, off, poff, E);
    float *yp = pad_rows(NULL, d, off, poff, E);
    float *hg = sw ? pad_rows(NULL, f, off, poff, E) : NULL;
    float *hu = sw ? pad_rows(NULL, f, off, poff, E) : NULL;
    float *ha = sw ? pad_rows(NULL, f, off, poff, E) : NULL;
    int rc = 1;
    if (xp && yp && (!sw || (hg && hu && ha))) {
        for (int64_t e = 0; e < E; e++) /* whole tiles, padding included */
            for (int64_t r = poff[e]; r < poff[e + 1]; r += BLOCK)
                ex_ffn_rows(c, NULL, a, xp, e, r, r + BLOCK, hg, hu, ha, yp);
        unpad_rows(yp, d, off, poff, E, EX_F32(a->y_sorted));
        if (sw) {
            unpad_rows(hg, f, off, poff, E, EX_F32(a->h_gate));
            unpad_rows(hu, f, off, poff, E, EX_F32(a->h_up));
            unpad_rows(ha, f, off, poff, E, EX_F32(a->h_act));
        }
        rc = 0;
    }
    free(poff), free(xp), free(yp), free(hg), free(hu), free(ha);
    return rc;
}

/* Weight gradient over padded rows, the padding rows masked out. */
static void masked_weight_grad(const float *ap, int64_t I, const float *bp, int64_t J,
                               const int64_t *off, const int64_t *poff, int64_t E, float *out)
{
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; i < I; i++)
            for (int64_t j = 0; j < J; j++) {
                float acc = 0;
                for (int64_t r = poff[e]; r < poff[e + 1]; r++) {
                    if (r - poff[e] >= off[e + 1] - off[e])
                        continue; /* padding row: the mask */
                    acc += ap[r * I + i] * bp[r * J + j];
                }
                out[(e * I + i) * J + j] = acc;
            }
}

static int expert_backward(const dl_backend_config_t *c,
                           const dl_backend_expert_backward_args_t *a)
{
    const int64_t d = c->hidden, f = c->ffn, E = c->experts;
    const int64_t *off = EX_I64(a->group_offsets);
    const int sw = c->ffn_kind == DL_BACKEND_SWIGLU;
    int64_t *poff = pad_offsets(off, E);
    if (!poff)
        return 1;
    float *dyp = pad_rows(EX_F32(a->d_y_sorted), d, off, poff, E);
    float *xp = pad_rows(EX_F32(a->x_sorted), d, off, poff, E);
    float *dxp = pad_rows(NULL, d, off, poff, E);
    float *hg = sw ? pad_rows(EX_F32(a->h_gate), f, off, poff, E) : NULL;
    float *hu = sw ? pad_rows(EX_F32(a->h_up), f, off, poff, E) : NULL;
    float *ha = sw ? pad_rows(EX_F32(a->h_act), f, off, poff, E) : NULL;
    float *dha = sw ? pad_rows(NULL, f, off, poff, E) : NULL;
    float *dhg = sw ? pad_rows(NULL, f, off, poff, E) : NULL;
    float *dhu = sw ? pad_rows(NULL, f, off, poff, E) : NULL;
    int rc = 1;
    if (dyp && xp && dxp && (!sw || (hg && hu && ha && dha && dhg && dhu))) {
        for (int64_t e = 0; e < E; e++)
            for (int64_t r = poff[e]; r < poff[e + 1]; r += BLOCK)
                ex_expert_backward_rows(c, NULL, a, dyp, hg, hu, e, r, r + BLOCK, dha, dhg, dhu,
                                        dxp);
        unpad_rows(dxp, d, off, poff, E, EX_F32(a->d_x_sorted));
        if (sw) {
            unpad_rows(dha, f, off, poff, E, EX_F32(a->d_h_act));
            unpad_rows(dhg, f, off, poff, E, EX_F32(a->d_h_gate));
            unpad_rows(dhu, f, off, poff, E, EX_F32(a->d_h_up));
            masked_weight_grad(ha, f, dyp, d, off, poff, E, EX_F32(a->d_w_down));
            masked_weight_grad(xp, d, dhg, f, off, poff, E, EX_F32(a->d_w_gate));
            masked_weight_grad(xp, d, dhu, f, off, poff, E, EX_F32(a->d_w_up));
        } else {
            masked_weight_grad(xp, d, dyp, d, off, poff, E, EX_F32(a->d_w_down));
        }
        rc = 0;
    }
    free(poff), free(dyp), free(xp), free(dxp), free(hg), free(hu), free(ha);
    free(dha), free(dhg), free(dhu);
    return rc;
}

static int permute(const dl_backend_config_t *c, const dl_backend_permute_args_t *a)
{
    return ex_permute(c, a);
}
static const dl_backend_t backend = {
    .abi_version = DL_BACKEND_ABI_VERSION,
    .name = "block-padded-128",
    .version = "1.0",
    .compute_mode = "fp32",
    .router = ex_plain_router,
    .dispatch = dispatch,
    .permute = permute,
    .expert_forward = expert_forward,
    .combine = ex_plain_combine,
    .combine_backward = ex_plain_combine_backward,
    .expert_backward = expert_backward,
    .router_backward = ex_plain_router_backward,
    .input_backward = ex_plain_input_backward,
};

const dl_backend_t *dropless_backend(void);
const dl_backend_t *dropless_backend(void)
{
    return &backend;
}
