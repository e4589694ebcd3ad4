/* Mutants: one stage of a golden computed wrongly (or legitimately
 * otherwise), everything downstream replayed by the oracle's stage
 * functions (replay.c). The picks (row, element, slot, boundary, experts)
 * come from the format's PRNG (dl_golden_rng_u64) with the options' seed,
 * so a mutant is reproducible. The table of mutations is DL_MUTATION_MAP
 * (dropless/mutate.h). */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "golden/mutate_priv.h"

enum { KIND_VALUE, KIND_GEMM, KIND_EXPERT, KIND_OUT, KIND_DISPATCH };

#define ROW(E, n, kind, expect, what) {#n, KIND_##kind, expect, what},
static const struct {
    const char *name;
    int kind, expect;
    const char *what;
} mutations[] = {DL_MUTATION_MAP(ROW)};
#undef ROW
#define MODE(E, n, what) #n,
static const char *const modes[] = {DL_MUTATE_MODE_MAP(MODE)};
#undef MODE

const char *dl_mutation_name(dl_mutation_t m)
{
    return (unsigned)m < DL_MUTATION_COUNT ? mutations[m].name : NULL;
}

int dl_mutation_parse(const char *s, dl_mutation_t *m)
{
    for (int i = 0; s && i < DL_MUTATION_COUNT; i++)
        if (!strcmp(s, mutations[i].name))
            return *m = (dl_mutation_t)i, 0;
    return DL_EINVAL;
}

int dl_mutation_expect_pass(dl_mutation_t m)
{
    return (unsigned)m < DL_MUTATION_COUNT ? mutations[m].expect : 0;
}

const char *dl_mutation_what(dl_mutation_t m)
{
    return (unsigned)m < DL_MUTATION_COUNT ? mutations[m].what : NULL;
}

const char *dl_mutate_mode_name(dl_mutate_mode_t m)
{
    return (unsigned)m < DL_MUTATE_MODE_COUNT ? modes[m] : NULL;
}

int dl_mutate_mode_parse(const char *s, dl_mutate_mode_t *m)
{
    for (int i = 0; s && i < DL_MUTATE_MODE_COUNT; i++)
        if (!strcmp(s, modes[i]))
            return *m = (dl_mutate_mode_t)i, 0;
    return DL_EINVAL;
}

/* A comma list of names, each parsed by parse, into a mask. */
static int name_list(const char *key, const char *v, int (*parse)(const char *, int *), dl_valueset_t *mask,
                     char *err, size_t n)
{
    char buf[1024], *save = NULL;
    if (strlen(v) >= sizeof buf)
        return dl__golden_msg(err, n, "%s: list too long", key), DL_EINVAL;
    strcpy(buf, v);
    *mask = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int x;
        if (parse(t, &x))
            return dl__golden_msg(err, n, "%s: unknown name '%s'", key, t), DL_EINVAL;
        *mask |= DL__BIT(x);
    }
    return *mask ? 0 : (dl__golden_msg(err, n, "%s: no name given", key), DL_EINVAL);
}

static int p_mutation(const char *s, int *x)
{
    dl_mutation_t m;
    return dl_mutation_parse(s, &m) ? -1 : (*x = (int)m, 0);
}

static int p_stage(const char *s, int *x)
{
    dl_value_t v;
    return dl_value_parse(s, &v) ? -1 : (*x = (int)v, 0);
}

static int p_mode(const char *s, int *x)
{
    dl_mutate_mode_t m;
    return dl_mutate_mode_parse(s, &m) ? -1 : (*x = (int)m, 0);
}

int dl_mutate_opts_set(dl_mutate_opts_t *o, const char *key, const char *v, char *err, size_t n)
{
    dl_valueset_t mask;
    if (!o || !key || !v)
        return DL_EINVAL;
    if (!strcmp(key, "mutations") || !strcmp(key, "stages") || !strcmp(key, "modes")) {
        int rc = name_list(key, v, key[0] == 'm' ? (key[1] == 'u' ? p_mutation : p_mode) : p_stage,
                           &mask, err, n);
        if (!rc && key[1] == 'u')
            o->mutations = (uint64_t)mask;
        else if (!rc && key[0] == 's')
            o->stages = mask;
        else if (!rc)
            o->modes = (unsigned)mask;
        return rc;
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    int bad = !*v || *end || *v == '-' || errno;
    if (!strcmp(key, "gain_p") && !bad && x >= 1 && x <= 30)
        return o->gain_p = (int)x, 0;
    if (!strcmp(key, "seed") && !bad)
        return o->seed = x, 0;
    if (!strcmp(key, "force") && !bad && x <= 1)
        return o->force = (int)x, 0;
    if (strcmp(key, "gain_p") && strcmp(key, "seed") && strcmp(key, "force"))
        return dl__golden_msg(err, n, "unknown mutate option '%s' (known: mutations, stages, modes, "
                                      "gain_p, seed, force)", key), DL_EINVAL;
    return dl__golden_msg(err, n, "%s: '%s' is not %s", key, v,
                          key[0] == 'g' ? "an integer in [1, 30]"
                          : key[0] == 's' ? "an unsigned 64-bit integer" : "0 or 1"), DL_EINVAL;
}

static int is_gemm(int s, int *expert, int *ragged)
{
    static const int list[] = {DL_VALUE_ROUTER_LOGITS, DL_VALUE_H_GATE, DL_VALUE_H_UP,
                               DL_VALUE_Y_SORTED, DL_VALUE_D_H_ACT, DL_VALUE_D_X_SORTED,
                               DL_VALUE_D_W_DOWN, DL_VALUE_D_W_GATE, DL_VALUE_D_W_UP,
                               DL_VALUE_D_ROUTER_WEIGHT};
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
        if (list[i] == s) {
            *expert = s != DL_VALUE_ROUTER_LOGITS && s != DL_VALUE_D_ROUTER_WEIGHT;
            *ragged = s >= DL_VALUE_D_W_DOWN && s != DL_VALUE_D_H_GATE && s != DL_VALUE_D_H_UP &&
                      s != DL_VALUE_D_X_SORTED;
            return 1;
        }
    return 0;
}

int dl_mutation_applies(dl_mutation_t m, int s, const dl_moe_config_t *c)
{
    if ((unsigned)m >= DL_MUTATION_COUNT || s < 0 || s >= DL_VALUE_COUNT ||
        !dl_value_numel(c, (dl_value_t)s))
        return 0;
    int expert = 0, ragged = 0, gemm = is_gemm(s, &expert, &ragged);
    dl_store_t st = dl_value_store((dl_value_t)s);
    switch (mutations[m].kind) {
    case KIND_VALUE: return st == DL_STORE_ACT || st == DL_STORE_F32;
    case KIND_GEMM: /* TF32 products where fp32 is declared: the fp32 cases */
        return gemm && (m != DL_MUTATION_TF32 || c->dtype == DL_F32);
    case KIND_EXPERT:
        return gemm && expert && c->route.experts > 1 && !(m == DL_MUTATION_ULP_WEIGHTS && ragged);
    case KIND_OUT: return s == DL_VALUE_OUT;
    default: return s == DL_VALUE_SORT_PERM;
    }
}

/* The n-th draw of this mutant's stream, below `below` (> 0). */
static int64_t draw(const dl_mutate_opts_t *o, dl_mutation_t m, int s, uint64_t n, int64_t below)
{
    /* values past 63 (the sets are 128 bits) draw from streams of their own,
     * so the first 64 keep the streams they always had */
    uint64_t stream = UINT64_C(0x6d75740000) +
                      (s < 64 ? (uint64_t)m * 64u + (uint64_t)s : UINT64_C(0x10000) + (uint64_t)m * 128u + (uint64_t)s);
    return (int64_t)(dl_golden_rng_u64(o->seed, stream, n) % (uint64_t)below);
}

/* The experts with rows, into list (E entries); their count. */
static int64_t nonempty(const int64_t *off, int64_t E, int64_t *list)
{
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++)
        if (off[e + 1] > off[e])
            list[n++] = e;
    return n;
}

/* One value mutation (gain, sign, zero_row) of stage s in place. */
static int mut_value(dl_mutation_t m, int s, const dl_moe_config_t *c, const dl_mutate_opts_t *o,
                     float *v, char *detail, size_t dn)
{
    int64_t dims[3], n = dl_value_numel(c, (dl_value_t)s);
    int rank = dl_value_shape(c, (dl_value_t)s, dims);
    int64_t w = rank > 0 ? dims[rank - 1] : 1, rows = w ? n / w : 0, live = 0, r = -1;
    dl_dtype_t t = dl_value_dtype(c, (dl_value_t)s);
    if (m == DL_MUTATION_GAIN) {
        int p = o->gain_p > 0 ? o->gain_p : dl_dtype_precision(c->dtype) - 4;
        double gain = 1.0 + ldexp(1.0, -p);
        for (int64_t i = 0; i < n; i++)
            v[i] = (float)dl_round((double)v[i] * gain, t);
        snprintf(detail, dn, "gain 1 + 2^-%d", p);
        return 0;
    }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < w; j++)
            if (v[i * w + j] != 0.0f) {
                live++;
                break;
            }
    if (!live)
        return DL_ENOTFOUND;
    for (int64_t i = 0, pick = draw(o, m, s, 0, live); i < rows && r < 0; i++)
        for (int64_t j = 0; j < w; j++)
            if (v[i * w + j] != 0.0f) {
                if (pick-- == 0)
                    r = i;
                break;
            }
    if (m == DL_MUTATION_ZERO_ROW) {
        memset(v + r * w, 0, sizeof(float) * (size_t)w);
        snprintf(detail, dn, "row %lld zeroed", (long long)r);
        return 0;
    }
    int64_t big = r * w;
    for (int64_t j = 1; j < w; j++)
        if (fabsf(v[r * w + j]) > fabsf(v[big]))
            big = r * w + j;
    v[big] = -v[big];
    snprintf(detail, dn, "element %lld (row %lld) negated", (long long)big, (long long)r);
    return 0;
}

/* x one ulp of type t further from zero. */
static float ulp_out(float x, dl_dtype_t t)
{
    if (t == DL_BF16) {
        uint16_t b = dl_bf16_from_float(x);
        return dl_bf16_to_float((uint16_t)(b + 1));
    }
    if (t == DL_F16) {
        uint16_t h = dl_f16_from_float(x);
        return dl_f16_to_float((uint16_t)(h + 1));
    }
    return nextafterf(x, signbit(x) ? -INFINITY : INFINITY);
}

/* A copy of every term's weights (E blocks of K*N), to edit. */
static int copy_rhs(dl__mut_gemm_t *g, float **keep)
{
    for (int t = 0; t < g->nterms; t++) {
        size_t n = (size_t)(g->E * g->terms[t].K * g->N);
        if (!(keep[t] = malloc(sizeof(float) * (n ? n : 1))))
            return DL_ENOMEM;
        memcpy(keep[t], g->terms[t].rhs, sizeof(float) * n);
        g->terms[t].rhs = keep[t];
    }
    return 0;
}

static void swap_blocks(float *a, int64_t bs, int64_t e1, int64_t e2)
{
    for (int64_t i = 0; i < bs; i++) {
        float x = a[e1 * bs + i];
        a[e1 * bs + i] = a[e2 * bs + i], a[e2 * bs + i] = x;
    }
}

/* Rounds n floats (a copy of p, kept in *keep) to tf32. */
static const float *tf32_copy(const float *p, size_t n, float **keep)
{
    if (!(*keep = malloc(sizeof(float) * (n ? n : 1))))
        return NULL;
    for (size_t i = 0; i < n; i++)
        (*keep)[i] = dl__sim_tf32(p[i]);
    return *keep;
}

typedef struct {
    const dl_moe_config_t *c;
    const dl_mutate_opts_t *o;
    dl_mutation_t m;
    int s;
    float *keep[4];
    int64_t *off, *list;
} gemm_ctx_t;

/* The picks of the expert mutations, edits of the GEMM g. */
static int gemm_edit(gemm_ctx_t *x, dl__mut_gemm_t *g, int64_t *e1, int64_t *e2, char *detail,
                     size_t dn)
{
    const int64_t E = g->E;
    int64_t nl = nonempty(g->off, E, x->list);
    if (x->m == DL_MUTATION_OFF_BY_ONE) {
        int64_t nb = 0;
        for (int64_t i = 0; i < nl; i++)
            nb += x->list[i] > 0;
        if (!nb)
            return DL_ENOTFOUND;
        int64_t pick = draw(x->o, x->m, x->s, 0, nb), e = -1;
        for (int64_t i = 0; i < nl && e < 0; i++)
            if (x->list[i] > 0 && pick-- == 0)
                e = x->list[i];
        memcpy(x->off, g->off, sizeof(int64_t) * (size_t)(E + 1));
        x->off[e]++;
        snprintf(detail, dn, "row %lld computed as expert %lld's, not %lld's",
                 (long long)g->off[e], (long long)(e - 1), (long long)e);
        g->off = x->off;
        return 0;
    }
    if (nl < (x->m == DL_MUTATION_SWAP_EXPERTS ? 2 : 1))
        return DL_ENOTFOUND;
    *e1 = x->list[draw(x->o, x->m, x->s, 0, nl)];
    if (x->m == DL_MUTATION_ULP_WEIGHTS) {
        int rc = copy_rhs(g, x->keep);
        for (int t = 0; !rc && t < g->nterms; t++) {
            float *w = x->keep[t] + *e1 * g->terms[t].K * g->N;
            for (int64_t i = 0; i < g->terms[t].K * g->N; i++)
                w[i] = ulp_out(w[i], x->c->dtype);
        }
        snprintf(detail, dn, "expert %lld's weights one ulp further from zero", (long long)*e1);
        return rc;
    }
    *e2 = x->list[(draw(x->o, x->m, x->s, 0, nl) + 1 + draw(x->o, x->m, x->s, 1, nl - 1)) % nl];
    snprintf(detail, dn, "experts %lld and %lld swapped", (long long)*e1, (long long)*e2);
    if (g->ragged)
        return 0; /* the output blocks are swapped after the product */
    int rc = copy_rhs(g, x->keep);
    for (int t = 0; !rc && t < g->nterms; t++)
        swap_blocks(x->keep[t], g->terms[t].K * g->N, *e1, *e2);
    return rc;
}

/* A GEMM mutation of stage s, into dst. */
static int mut_gemm(gemm_ctx_t *x, const dl_moe_inputs_t *in, dl_golden_file_t *mu, float *dst,
                    char *detail, size_t dn)
{
    dl__mut_gemm_t g;
    int expert, rc = dl__mut_gemm_of(x->c, in, &mu->fwd, &mu->bwd, x->s, &g, &expert);
    int64_t e1 = -1, e2 = -1;
    if (rc)
        return rc;
    if (x->m == DL_MUTATION_BF16_ACC) {
        snprintf(detail, dn, "bf16 accumulator, k in order");
        return dl__sim_gemm_bf16acc(&g, dst);
    }
    if (x->m == DL_MUTATION_TF32) {
        const int64_t T = x->c->tokens;
        for (int t = 0; t < g.nterms; t++) {
            const int64_t rows = g.off ? g.off[g.E] : T;
            g.terms[t].lhs = tf32_copy(g.terms[t].lhs, (size_t)(rows * g.terms[t].K), &x->keep[2 * t]);
            g.terms[t].rhs = tf32_copy(g.terms[t].rhs, (size_t)(g.E * g.terms[t].K * g.N),
                                       &x->keep[2 * t + 1]);
            if (!g.terms[t].lhs || !g.terms[t].rhs)
                return DL_ENOMEM;
        }
        if (g.ragged) {
            const int64_t rows = g.off ? g.off[g.E] : T;
            g.a = tf32_copy(g.a, (size_t)(rows * g.ni), &x->keep[0]);
            g.b = tf32_copy(g.b, (size_t)(rows * g.nj), &x->keep[1]);
            if (!g.a || !g.b)
                return DL_ENOMEM;
        }
        snprintf(detail, dn, "operands rounded to tf32");
        return dl__mut_gemm_run(&g, dst);
    }
    if ((rc = gemm_edit(x, &g, &e1, &e2, detail, dn)) || (rc = dl__mut_gemm_run(&g, dst)))
        return rc;
    if (g.ragged && x->m == DL_MUTATION_SWAP_EXPERTS)
        swap_blocks(dst, g.ni * g.nj, e1, e2);
    return 0;
}

/* drop_slot: one (t, j) out of the combine and of its backward. */
static int mut_drop(const dl_moe_config_t *c, const dl_moe_inputs_t *in, dl_golden_file_t *mu,
                    const dl_mutate_opts_t *o, dl_valueset_t *dirty, char *detail, size_t dn)
{
    const int64_t T = c->tokens, k = c->route.top_k, M = T * k, d = c->hidden;
    dl_moe_forward_t *f = &mu->fwd;
    int64_t live = 0, slot = -1;
    for (int64_t i = 0; i < M; i++)
        live += f->topk_weights[i] != 0.0f;
    if (!live)
        return DL_ENOTFOUND;
    for (int64_t i = 0, pick = draw(o, DL_MUTATION_DROP_SLOT, DL_VALUE_OUT, 0, live); slot < 0; i++)
        if (f->topk_weights[i] != 0.0f && pick-- == 0)
            slot = i;
    float *w = malloc(sizeof(float) * (size_t)M);
    if (!w)
        return DL_ENOMEM;
    memcpy(w, f->topk_weights, sizeof(float) * (size_t)M);
    w[slot] = 0.0f;
    /* the shared experts' term stays in every row: only the slot is gone */
    const int sh = c->shared_experts > 0;
    int rc = dl_combine_shared(f->y_sorted, w, f->inv_perm, sh ? f->shared_y : NULL,
                               sh && c->shared_gate ? f->shared_gate : NULL, T, k, d, c->dtype, f->out);
    *dirty = DL__BIT(DL_VALUE_OUT);
    if (!rc && mu->has_backward) {
        rc = dl_combine_backward(in->d_out, f->y_sorted, w, f->inv_perm, T, k, d, c->dtype, NULL,
                                 mu->bwd.d_y_sorted);
        mu->bwd.d_topk_weights[slot] = 0.0f;
        *dirty |= DL__BIT(DL_VALUE_D_TOPK_WEIGHTS) | DL__BIT(DL_VALUE_D_Y_SORTED);
    }
    free(w);
    snprintf(detail, dn, "slot (%lld, %lld) dropped", (long long)(slot / k), (long long)(slot % k));
    return rc;
}

/* reorder: every expert's rows reversed, the permutations to match. */
static int mut_reorder(const dl_moe_config_t *c, dl_golden_file_t *mu, char *detail, size_t dn)
{
    const int64_t M = c->tokens * c->route.top_k, E = c->route.experts;
    dl_moe_forward_t *f = &mu->fwd;
    int64_t *q = malloc(sizeof(int64_t) * (size_t)(M ? M : 1)), moved = 0;
    float *tmp = NULL;
    if (!q)
        return DL_ENOMEM;
    for (int64_t e = 0; e < E; e++)
        for (int64_t p = f->group_offsets[e]; p < f->group_offsets[e + 1]; p++) {
            q[p] = f->group_offsets[e] + f->group_offsets[e + 1] - 1 - p;
            moved += q[p] != p;
        }
    for (int64_t p = f->group_offsets[E]; p < M; p++) /* zero experts' tail: in place */
        q[p] = p;
    int rc = moved ? 0 : DL_ENOTFOUND;
    for (int s = 0; !rc && s < DL_VALUE_COUNT; s++) {
        int64_t dims[3];
        float *v = dl__mut_array(f, &mu->bwd, s);
        if (!v || dl_value_dims((dl_value_t)s)[0] != 'M' || dl_value_shape(c, (dl_value_t)s, dims) < 1)
            continue;
        int64_t w = dl_value_shape(c, (dl_value_t)s, dims) == 2 ? dims[1] : 1;
        size_t row = (w == 1 ? 4 : sizeof(float) * (size_t)w);
        if (!(tmp = realloc(tmp, row * (size_t)M))) {
            rc = DL_ENOMEM;
            break;
        }
        for (int64_t p = 0; p < M; p++)
            memcpy((char *)tmp + row * (size_t)p, (char *)v + row * (size_t)q[p], row);
        memcpy(v, tmp, row * (size_t)M);
    }
    for (int64_t p = 0; !rc && p < M; p++)
        f->inv_perm[f->sort_perm[p]] = (int32_t)p;
    free(tmp), free(q);
    snprintf(detail, dn, "rows reversed within each of the experts (%lld rows moved)",
             (long long)moved);
    return rc;
}

/* A deep copy of g's forward and backward stages (not its inputs). */
static int copy_stages(const dl_golden_file_t *g, dl_golden_file_t *out)
{
    *out = *g;
    memset(&out->in, 0, sizeof out->in);
    memset(&out->fwd, 0, sizeof out->fwd);
    memset(&out->bwd, 0, sizeof out->bwd);
    out->has_inputs = 0, out->n_ep = 0, out->owner_ = DL__GOLDEN_OWNER_MALLOC;
    memset(out->ep, 0, sizeof out->ep);
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        if (ds->group == DL_GOLDEN_INPUTS || !dl_golden_dataset_applies(ds, &g->config))
            continue;
        void **src = dl_golden_slot((dl_golden_file_t *)g, ds), **dst = dl_golden_slot(out, ds);
        int64_t dims[3], n = dl_golden_dataset_shape(ds, &g->config, dims);
        size_t bytes = (size_t)(n > 0 ? n : 1) * (ds->elem == DL_GOLDEN_INT64 ? 8 : 4);
        if (!*src)
            continue;
        if (!(*dst = malloc(bytes)))
            return DL_ENOMEM;
        memcpy(*dst, *src, bytes);
    }
    return 0;
}

int dl_mutant_build(const dl_golden_file_t *g, dl_mutation_t m, int s, const dl_mutate_opts_t *o,
                    dl_golden_file_t *out, char *detail, size_t dn, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const dl_moe_config_t *c = &g->config;
    dl_mutate_opts_t none = {0};
    o = o ? o : &none;
    if (!g->has_forward || !g->has_inputs)
        return dl__golden_msg(err, errlen, "mutate: the golden needs its inputs and forward"),
               DL_EINVAL;
    if (!dl_mutation_applies(m, s, c) || (dl_value_is_backward((dl_value_t)s) && !g->has_backward))
        return DL_ENOTFOUND;
    int rc = copy_stages(g, out);
    const dl_moe_inputs_t in = dl_golden_inputs_view(&g->in);
    dl_valueset_t dirty = DL__BIT(s);
    float *v = dl__mut_array(&out->fwd, &out->bwd, s);
    if (rc)
        ;
    else if (mutations[m].kind == KIND_VALUE)
        rc = mut_value(m, s, c, o, v, detail, dn);
    else if (m == DL_MUTATION_DROP_SLOT)
        rc = mut_drop(c, &in, out, o, &dirty, detail, dn);
    else if (m == DL_MUTATION_REORDER)
        return mut_reorder(c, out, detail, dn); /* exact values moved: nothing to replay */
    else {
        gemm_ctx_t x = {c, o, m, s, {NULL}, malloc(sizeof(int64_t) * (size_t)(c->route.experts + 1)),
                        malloc(sizeof(int64_t) * (size_t)(c->route.experts + 1))};
        rc = x.off && x.list ? mut_gemm(&x, &in, out, v, detail, dn) : DL_ENOMEM;
        for (int i = 0; i < 4; i++)
            free(x.keep[i]);
        free(x.off), free(x.list);
    }
    if (!rc)
        rc = dl__mut_replay(c, &in, &out->fwd, &out->bwd, dirty, dirty);
    if (rc == DL_ENONFINITE)
        rc = DL_ENOTFOUND; /* the layer cannot go on from it (a zero sum renormalised) */
    if (rc && rc != DL_ENOTFOUND)
        dl__golden_msg(err, errlen, "mutate: %s at %s: %s", mutations[m].name,
                       dl_value_name((dl_value_t)s), dl_strerror(rc));
    return rc;
}

static int same(const dl_golden_file_t *g, const dl_golden_file_t *v, int s)
{
    const void *a = dl_value_array(&g->fwd, &g->bwd, (dl_value_t)s),
               *b = dl_value_array(&v->fwd, &v->bwd, (dl_value_t)s);
    size_t n = (size_t)dl_value_numel(&g->config, (dl_value_t)s) *
               (dl_value_store((dl_value_t)s) == DL_STORE_I64 ? 8 : 4);
    return !b || (a && !memcmp(a, b, n));
}

int dl_mutant_view(const dl_golden_file_t *g, const dl_golden_file_t *mu, dl_mutate_mode_t mode,
                   dl_golden_file_t *view)
{
    *view = *mu;
    view->fwd.tie_margin = NULL;
    snprintf(view->backend, sizeof view->backend, "dropless-mutate");
    snprintf(view->compute_mode, sizeof view->compute_mode, "%s", dl_dtype_name(g->config.dtype));
    int differs = 0;
    for (int s = 0; s < DL_VALUE_COUNT; s++) {
        int keep = mode == DL_MUTATE_STAGED || s == DL_VALUE_OUT ||
                   (mode == DL_MUTATE_FUSED && s == DL_VALUE_D_X);
        if (!keep) {
            const dl_golden_dataset_t *ds = NULL;
            char path[64];
            snprintf(path, sizeof path, "/%s/%s", dl_value_is_backward((dl_value_t)s) ? "backward" : "forward",
                     dl_value_name((dl_value_t)s));
            if ((ds = dl_golden_dataset_find(path)))
                *dl_golden_slot(view, ds) = NULL;
        } else if (!same(g, view, s)) {
            differs = 1;
        }
    }
    view->has_backward = mu->has_backward && mode != DL_MUTATE_OUT;
    return differs;
}
