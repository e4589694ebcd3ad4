/* The tolerance model of the conformance runner: compute profiles, the
 * per-element bound, and the comparison engine that turns a candidate stage
 * and its exact values into figures and a verdict. doc/tolerances.md derives
 * every constant here. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "check/check_priv.h"
#include <cblas.h>
#undef I /* <complex.h>, via cblas.h */

#define U32 0x1p-24

/* Tensor-core paths (tf32, bf16, fp16 inputs) accumulate in fp32 but align
 * and normalise by truncation (Fasi, Higham, Mikaitis, Pranesh 2021), so one
 * step errs by up to an ulp: u_acc = 2^-23 there, 2^-24 for plain fp32 FMA. */
static const dl_check_profile_t profiles[] = {
    {"fp32", 24, 8, 0x1p-24, 2.0, 8.0, 32.0, 0, 0, 0,
     "fp32 inputs as stored, fp32 round-to-nearest accumulation"},
    {"tf32", 11, 8, 0x1p-23, 2.0, 8.0, 32.0, 0, 0, 0,
     "GEMM operands rounded to tf32 (10-bit mantissa), fp32 accumulation"},
    {"bf16", 8, 8, 0x1p-23, 2.0, 8.0, 32.0, 0, 0, 0,
     "GEMM operands on the bf16 grid, fp32 accumulation"},
    {"fp16", 11, 5, 0x1p-23, 2.0, 8.0, 32.0, 0, 0, 0,
     "GEMM operands on the fp16 grid, fp32 accumulation"},
    {"bf16-acc", 8, 8, 0x1p-23, 2.0, 8.0, 32.0, 1, 0, 0,
     "as bf16, but short sums (combine, un-permute, gradient terms) add stored bf16 parts"},
    {"fp16-acc", 11, 5, 0x1p-23, 2.0, 8.0, 32.0, 1, 0, 0,
     "as fp16, but short sums (combine, un-permute, gradient terms) add stored fp16 parts"},
    {"bf16-elem", 8, 8, 0x1p-23, 2.0, 8.0, 32.0, 1, 4.0, 12.0,
     "as bf16-acc, and SwiGLU/score intermediates rounded to bf16 (framework elementwise ops)"},
    {"fp16-elem", 11, 5, 0x1p-23, 2.0, 8.0, 32.0, 1, 4.0, 12.0,
     "as fp16-acc, and SwiGLU/score intermediates rounded to fp16 (framework elementwise ops)"},
};
#define NPROF ((int)(sizeof profiles / sizeof profiles[0]))

const dl_check_profile_t *dl__ck_prof(const dl__ck_t *ck, dl_value_t s)
{
    return (int)s >= 0 && s < DL_VALUE_COUNT && ck->opt.stage_profile[s] ? ck->opt.stage_profile[s]
                                                                         : ck->prof;
}

/* Each stage value's part of the layer (router, experts, combine), from
 * the part column of its DL_VALUE_MAP row (FW and BW rows, in dl_value_t
 * order): no list here to leave a new value out of. */
#define PART_IN(part)
#define PART_AUX(part)
#define PART_FW(part) DL__CK_PART_##part,
#define PART_BW(part) PART_FW(part)
#define PART(g, E, nm, st, dims, cond, ck, pr, up, plain, part, ...) PART_##g(part)
static const unsigned char value_part[] = {DL_VALUE_MAP(PART)};
_Static_assert(sizeof value_part == DL_VALUE_COUNT, "one part per stage value of DL_VALUE_MAP");
static const char *const part_names[] = {
    [DL__CK_PART_ROUTER] = "router", [DL__CK_PART_EXPERTS] = "experts",
    [DL__CK_PART_COMBINE] = "combine"};

/* The stages of each part of the layer a per-stage profile names, or the
 * one value a name names. */
static dl_valueset_t part_mask(const char *name)
{
    for (int p = DL__CK_PART_NONE + 1; p <= DL__CK_PART_COMBINE; p++)
        if (!strcasecmp(name, part_names[p])) {
            dl_valueset_t m = 0;
            for (int s = 0; s < DL_VALUE_COUNT; s++)
                m |= (dl_valueset_t)(value_part[s] == p) << s;
            return m;
        }
    dl_value_t v;
    return dl_value_parse(name, &v) == 0 && v != DL_VALUE_NONE ? DL_VALUE_BIT(v) : 0;
}

int dl_check_parse_profiles(const char *spec, const dl_check_profile_t **whole,
                            const dl_check_profile_t **per_stage)
{
    if (!spec || !whole || !per_stage)
        return DL_EINVAL;
    *whole = NULL;
    for (int s = 0; s < DL_VALUE_COUNT; s++)
        per_stage[s] = NULL;
    if (!strchr(spec, '=')) /* one profile for the whole layer */
        return (*whole = dl_check_profile_find(spec)) ? 0 : DL_EINVAL;
    const char *p = spec;
    while (*p) {
        char item[96], *eq;
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item)
            return DL_EINVAL;
        memcpy(item, p, len);
        item[len] = '\0';
        p += len + (p[len] == ',');
        if (!(eq = strchr(item, '=')))
            return DL_EINVAL;
        *eq = '\0';
        const dl_check_profile_t *pr = dl_check_profile_find(eq + 1);
        if (!pr)
            return DL_EINVAL;
        if (!strcasecmp(item, "default")) {
            *whole = pr;
            continue;
        }
        const dl_valueset_t m = part_mask(item);
        if (!m)
            return DL_EINVAL;
        for (int s = 0; s < DL_VALUE_COUNT; s++)
            if ((m >> s) & 1)
                per_stage[s] = pr;
    }
    return 0;
}

int dl_check_profile_count(void)
{
    return NPROF;
}

const dl_check_profile_t *dl_check_profile_at(int i)
{
    return i >= 0 && i < NPROF ? &profiles[i] : NULL;
}

const dl_check_profile_t *dl_check_profile_find(const char *name)
{
    if (!name)
        return NULL;
    if (!strcasecmp(name, "float32") || !strcasecmp(name, "fp32-rn") || !strcasecmp(name, "f32"))
        return &profiles[0];
    if (!strcasecmp(name, "bfloat16"))
        return &profiles[2];
    if (!strcasecmp(name, "float16") || !strcasecmp(name, "half"))
        return &profiles[3];
    for (int i = 0; i < NPROF; i++)
        if (!strcasecmp(name, profiles[i].name))
            return &profiles[i];
    return NULL;
}

static int exp_bits(dl_dtype_t t)
{
    return t == DL_F16 ? 5 : t == DL_F64 ? 11 : 8;
}

static int emin_of(dl_dtype_t t)
{
    return t == DL_F16 ? -14 : t == DL_F64 ? -1022 : -126;
}

int dl__ck_on_input_grid(const dl_check_profile_t *p, dl_dtype_t t)
{
    return dl_dtype_precision(t) <= p->in_bits && exp_bits(t) <= p->in_exp_bits;
}

/* 2^n as a double, by its bits where it is normal (no libm call: the
 * tolerances take one or two per element). */
static double pow2(int n)
{
    if (n < -1022 || n > 1023)
        return ldexp(1.0, n);
    union {
        uint64_t u;
        double d;
    } x = {.u = (uint64_t)(n + 1023) << 52};
    return x.d;
}

/* The ulp of g at precision p, minimum exponent emin (dl__ck_ulp with
 * the type's constants hoisted: the comparison takes one per element). */
static inline double ulp_at(double g, int p, int emin)
{
    if (!isfinite(g))
        return NAN;
    /* |g| in [2^(e-1), 2^e): e from g's binary64 exponent field (a
     * subnormal binary64 lies below every emin here but f64's: frexp) */
    union {
        double d;
        uint64_t u;
    } x = {.d = g};
    const int be = (int)((x.u >> 52) & 0x7ff);
    int e;
    if (be)
        e = be - 1022;
    else
        frexp(g, &e);
    if (g == 0.0 || e - 1 < emin)
        return pow2(emin - p + 1);
    return pow2(e - p);
}

double dl__ck_ulp(double g, dl_dtype_t t)
{
    return ulp_at(g, dl_dtype_precision(t), emin_of(t));
}

/* Spacing of the subnormals: the absolute error one rounding may make there. */
static double eta(dl_dtype_t t)
{
    return pow2(emin_of(t) - dl_dtype_precision(t) + 1);
}

void dl__ck_bound_coef(const dl__ck_t *ck, const dl__cmp_t *cmp, int64_t K, int warn,
                       dl__ck_bc_t *bc)
{
    const dl_check_profile_t *p = dl__ck_prof(ck, cmp->stage);
    const double uo = dl_dtype_unit_roundoff(cmp->t);
    /* the candidate's own final rounding and the golden's (g = RN(exact)):
     * |c - g| <= |c - x| + |x - g| with each <= u_out |x|, |x| <= |g|(1+2u) */
    /* (the statistical tier's scale of a hidden value's error has one
     * rounding: the hidden value against the exact one, no golden between) */
    /* (a stage stored coarser than the case's type, bf16 in an fp32
     * container: the golden's rounding is the case type's, u_g < u_out) */
    const double ug = fmin(uo, dl_dtype_unit_roundoff(dl__ck_case_type(ck, cmp->stage)));
    bc->nu = warn == DL__TIER_STAT ? 0.0 : uo + ug;
    bc->f2 = 1.0 + 2.0 * uo;
    bc->eta = eta(cmp->t);
    bc->kt = (double)(K + 2) * 0x1p-150;
    bc->stat = warn == DL__TIER_STAT;
    bc->uo = uo;
    bc->t = cmp->t;
    double ua = p->u_acc;
    if (cmp->short_sum && p->sums_in_storage && uo > ua)
        ua = uo;
    const double uin = cmp->kappa_in > 0 ? pow2(-p->in_bits) : 0.0;
    const double ein = cmp->kappa_in * uin * (1.0 + uin);
    /* WARN: the deterministic gamma_K; PASS: c sqrt(K) u. For K < c^2 the
     * probabilistic figure exceeds the worst case: WARN never sits below PASS */
    const double Ku = (double)K * ua;
    double kap_w = Ku < 0.5 ? Ku / (1.0 - Ku) : INFINITY;
    kap_w = ein + kap_w + ein * kap_w;
    const double kap_p = ein + p->c_pass * sqrt((double)K) * ua;
    double kap = warn ? fmax(kap_w, kap_p) : kap_p;
    /* the statistical tier's scale of a hidden value's error: Higham and
     * Mary's sqrt(K) u M for the accumulation (bounded mean-independent
     * steps); input rounding is coherent across the elements, so it stays
     * the worst case (and the value propagates linearly, prop.c) */
    if (warn == DL__TIER_STAT && cmp->kappa_in == 0)
        kap = sqrt((double)K) * ua;
    /* the statistical tier's one rounding: Hoeffding's bound b of this
     * element's rounding error, half an ulp at the magnitude of the value
     * rounded, which is at most |g|(1 + 2u) + kap_w M (its worst-case
     * accumulation): between u|g|/2 and u|g| where M is not much above
     * |g|, so sigma is no wider than the rounding can be (tolerances.md) */
    bc->kw = kap_w; /* dl__ck_bound_at adds it per element */
    /* a profile whose short sums add stored parts (-acc) also lets a dot's
     * products be stored in the case's type before the fp32 sum (autograd's
     * VJP of a broadcast multiply): one rounding of each product, at most
     * u_act sum |a_i b_i| = u_act M in all, whatever K */
    if (cmp->prod_store && p->sums_in_storage)
        kap += dl_dtype_unit_roundoff(ck->act);
    if (cmp->elem && p->elem_s_pass > 0 && uo > U32) /* intermediates in the storage type */
        kap += (warn ? fmax(p->elem_s_warn, p->elem_s_pass) : p->elem_s_pass) * uo;
    else if (cmp->elem)
        kap += (warn ? fmax(p->elem_warn, p->elem_pass) : p->elem_pass) * U32;
    bc->kap = kap;
}

double dl__ck_bound(const dl__ck_t *ck, const dl__cmp_t *cmp, double g, double M, int64_t K,
                    int warn)
{
    dl__ck_bc_t bc;
    dl__ck_bound_coef(ck, cmp, K, warn, &bc);
    return dl__ck_bound_at(&bc, g, M);
}

/* ---------------------------------------------------------- M providers */

static const float *rhs_of(const dl_gemm_term_t *tm, int64_t N, int64_t e)
{
    return tm->rhs + e * tm->K * N;
}

static int64_t group_of(const int64_t *off, int64_t E, int64_t row)
{
    int64_t lo = 0, hi = E; /* off[lo] <= row < off[hi] */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (off[mid] <= row)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

double dl__ck_m_elem(const dl__mprov_t *mp, int64_t row, int64_t col)
{
    double m = 0.0;
    switch (mp->kind) {
    case DL__M_ARRAY: /* N is the stage's column count here */
        return mp->arr[row * mp->N + col];
    case DL__M_GROUPED: {
        int64_t e = group_of(mp->off, mp->E, row);
        for (int t = 0; t < mp->nterms; t++) {
            const dl_gemm_term_t *tm = &mp->terms[t];
            const float *a = tm->lhs + row * tm->K;
            const float *w = rhs_of(tm, mp->N, e);
            if (tm->layout == DL_RHS_KN)
                for (int64_t i = 0; i < tm->K; i++)
                    m += fabs((double)a[i] * (double)w[i * mp->N + col]);
            else
                for (int64_t i = 0; i < tm->K; i++)
                    m += fabs((double)a[i] * (double)w[col * tm->K + i]);
        }
        return m;
    }
    case DL__M_RAGGED: {
        int64_t e = row / mp->I, i = row % mp->I;
        for (int64_t r = mp->off[e]; r < mp->off[e + 1]; r++)
            m += fabs((double)mp->a[r * mp->I + i] * (double)mp->b[r * mp->N + col]);
        return m;
    }
    default:
        return 0.0;
    }
}

double *dl__ck_scratch(dl__ck_t *ck, int slot, int64_t n)
{
    if (n < 1)
        n = 1;
    if (ck->scr_n[slot] < n) {
        free(ck->scr[slot]);
        ck->scr_n[slot] = 0;
        if (!(ck->scr[slot] = malloc((size_t)n * sizeof *ck->scr[slot])))
            return NULL;
        ck->scr_n[slot] = n;
    }
    return ck->scr[slot];
}

/* x rounded up to binary32 (a bound stays a bound), widened again: the
 * next float up by its bits where rounding went down (x >= 0 here: +0 and
 * positive floats step by +1; NaN compares false and stays). */
static inline double up32(double x)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = (float)x};
    if ((double)v.f < x)
        v.u += v.f >= 0.0f ? 1u : (uint32_t)-1;
    return (double)v.f;
}

/* One operand block's magnitudes in binary64, into scratch slot: |x| of
 * floats, their squares rounded up to binary32 (sq: the statistical tier's
 * root sum of squares), or a delta (double) rounded up to binary32, or its
 * square so rounded; one loop per kind (the first vectorises). */
static const double *mag_block(dl__ck_t *ck, int slot, const float *src, const double *dsrc,
                               int64_t n, int sq)
{
    double *d = dl__ck_scratch(ck, slot, n);
    if (!d)
        return NULL;
    ck->scr_src[slot] = NULL;
    if (!dsrc && !sq) {
#pragma omp parallel for schedule(static) if (n > DL__PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = fabs((double)src[i]);
    } else if (!dsrc) {
#pragma omp parallel for schedule(static) if (n > DL__PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = up32((double)src[i] * (double)src[i]);
    } else {
#pragma omp parallel for schedule(static) if (n > DL__PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = fabs(up32(sq ? dsrc[i] * dsrc[i] : dsrc[i]));
    }
    return d;
}

/* The magnitudes of a whole stable operand array (a weight, a stage's
 * value: never a delta) in scratch slot, kept while the slot's tag names
 * it: M and each tier's propagation multiply the same operand again, so
 * it is converted once per stage instead of once per call; + off. */
static const double *mag_whole(dl__ck_t *ck, int slot, const float *base, int64_t whole,
                               int64_t off, int sq)
{
    if (ck->scr_src[slot] == base && ck->scr_sq[slot] == sq && ck->scr_len[slot] == whole)
        return ck->scr[slot] + off;
    ck->scr_src[slot] = NULL;
    const double *d = mag_block(ck, slot, base, NULL, whole, sq);
    if (!d)
        return NULL;
    ck->scr_src[slot] = base;
    ck->scr_sq[slot] = sq;
    ck->scr_len[slot] = whole;
    return d + off;
}

/* M for rows [r0, r1) of a block that lies inside one group (grouped) or
 * one expert (ragged: rows e*I .. e*I+I-1), into out [(r1-r0), N]; x, where
 * set, replaces one operand by a delta (prop.c). */
static int m_block(dl__ck_t *ck, const dl__mprov_t *mp, int64_t r0, int64_t r1,
                   const dl__ck_mop_t *x, double *out)
{
    const int64_t R = r1 - r0, N = mp->N;
    const int sq = x && x->sq;
    if (R <= 0)
        return 0;
    if (mp->kind == DL__M_GROUPED) {
        int64_t e = group_of(mp->off, mp->E, r0);
        for (int t = 0; t < mp->nterms; t++) {
            const dl_gemm_term_t *tm = &mp->terms[t];
            const int64_t K = tm->K;
            const double *A = mag_block(ck, DL__CK_SCR_A, tm->lhs + r0 * K,
                                        x ? x->delta + r0 * K : NULL, R * K, sq);
            const double *B = mag_whole(ck, DL__CK_SCR_B + t, tm->rhs, mp->E * K * N, e * K * N,
                                        sq);
            if (!A || !B)
                return DL_ENOMEM;
            if (K > 0)
                cblas_dgemm(CblasRowMajor, CblasNoTrans,
                            tm->layout == DL_RHS_KN ? CblasNoTrans : CblasTrans, (int)R, (int)N,
                            (int)K, 1.0, A, (int)K, B, tm->layout == DL_RHS_KN ? (int)N : (int)K,
                            t ? 1.0 : 0.0, out, (int)N);
            else if (!t)
                memset(out, 0, (size_t)(R * N) * sizeof *out);
        }
        return 0;
    }
    if (mp->kind == DL__M_RAGGED) {
        const int64_t I = mp->I, e = r0 / I, m0 = mp->off[e], Mg = mp->off[e + 1] - m0;
        if (Mg == 0) {
            memset(out, 0, (size_t)(R * N) * sizeof *out);
            return 0;
        }
        const int64_t rows = mp->off[mp->E];
        const double *A = x && x->which == 0
                              ? mag_block(ck, DL__CK_SCR_A, NULL, x->delta + m0 * I, Mg * I, sq)
                              : mag_whole(ck, DL__CK_SCR_RA, mp->a, rows * I, m0 * I, sq);
        const double *B = x && x->which == 1
                              ? mag_block(ck, DL__CK_SCR_A, NULL, x->delta + m0 * N, Mg * N, sq)
                              : mag_whole(ck, DL__CK_SCR_RB, mp->b, rows * N, m0 * N, sq);
        if (!A || !B)
            return DL_ENOMEM;
        /* out = A[:, i0:i0+R]^T B */
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)R, (int)N, (int)Mg, 1.0,
                    A + (r0 - e * I), (int)I, B, (int)N, 0.0, out, (int)N);
        return 0;
    }
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = 0; c < N; c++)
            out[(r - r0) * N + c] = dl__ck_m_elem(mp, r, c);
    return 0;
}

int dl__ck_m_bulk(dl__ck_t *ck, const dl__mprov_t *mp, int64_t rows, const dl__ck_mop_t *x,
                  double *out)
{
    if (mp->kind == DL__M_GROUPED) {
        for (int64_t e = 0; e < mp->E; e++) {
            int rc = m_block(ck, mp, mp->off[e], mp->off[e + 1], x, out + mp->off[e] * mp->N);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (mp->kind == DL__M_RAGGED) {
        for (int64_t e = 0; e < mp->E; e++) {
            int rc = m_block(ck, mp, e * mp->I, (e + 1) * mp->I, x, out + e * mp->I * mp->N);
            if (rc)
                return rc;
        }
        return 0;
    }
    return m_block(ck, mp, 0, rows, x, out);
}

/* ------------------------------------------------------ the comparison */

typedef struct {
    int64_t checked, over_pass, over_warn, over_stat, nonfinite, worst;
    double err_pass, err_warn, err_stat, ulp, abs;
    double wc, we;
} rowstat_t;

static void row_stat_init(rowstat_t *s)
{
    memset(s, 0, sizeof *s);
    s->worst = -1;
}

/* 0 only when err / b <= t for certain (b * t with a relative margin far
 * above its rounding; tiny or non-finite products never filter): the
 * comparison's figures are those of dividing every element. */
static inline int may_exceed(double err, double b, double t)
{
    return t < 0x1p-900 || !(err <= b * t * (1.0 - 0x1p-40));
}

/* The row's fixed parts while compare_row runs. */
typedef struct {
    const dl__ck_t *ck;
    const dl__cmp_t *cmp;
    const double *Mr;
    dl__ck_bc_t bcp, bcw; /* the row's PASS and WARN coefficients */
    int prec, emin;
    int64_t r;
} rowctx_t;

/* Element j of the row, one that differs from its exact value or is not
 * finite, into the row's figures s (bad: over the WARN or statistical
 * bound, or not finite). */
static inline void compare_elem(const rowctx_t *x, int64_t j, rowstat_t *s, int *bad)
{
    const dl__cmp_t *cmp = x->cmp;
    const int64_t idx = x->r * cmp->cols + j;
    const double c = cmp->cand[idx], g = cmp->exact[idx];
    if (!isfinite(c)) {
        s->nonfinite++;
        *bad = 1;
        if (s->err_pass != INFINITY) { /* the first one stays the worst */
            s->err_pass = s->err_warn = INFINITY;
            s->worst = idx;
            s->wc = c;
            s->we = g;
        }
        return;
    }
    const double err = fabs(c - g);
    if (err == 0.0)
        return;
    double M;
    if (!cmp->mp)
        M = fabs(g);
    else if (cmp->mp->kind == DL__M_ARRAY)
        M = cmp->mp->arr[idx];
    else if (x->Mr)
        M = x->Mr[j];
    else
        M = dl__ck_m_elem(cmp->mp, x->r, j);
    const double bp = dl__ck_bound_at(&x->bcp, g, M) + (cmp->prop[0] ? cmp->prop[0][idx] : 0.0);
    const double own_w = dl__ck_bound_at(&x->bcw, g, M);
    const double bw = own_w + (cmp->prop[1] ? cmp->prop[1][idx] : 0.0);
    /* the divisions only where the ratio may reach 1 or the row's largest
     * so far (most elements sit far below both); the statistical tier: own
     * worst case + lambda sigma */
    const double bs = cmp->prop[2] ? own_w + x->ck->lambda * cmp->prop[2][idx] : 0.0;
    if (cmp->prop[2] && may_exceed(err, bs, fmin(1.0, s->err_stat))) {
        const double es = err / bs;
        if (es > 1.0) {
            s->over_stat++;
            *bad = 1;
        }
        if (es > s->err_stat)
            s->err_stat = es;
    }
    if (may_exceed(err, bp, fmin(1.0, s->err_pass))) {
        const double ep = err / bp;
        if (ep > 1.0)
            s->over_pass++;
        if (ep > s->err_pass) {
            s->err_pass = ep;
            s->worst = idx;
            s->wc = c;
            s->we = g;
        }
    }
    if (may_exceed(err, bw, fmin(1.0, s->err_warn))) {
        const double ew = err / bw;
        if (ew > 1.0) {
            s->over_warn++;
            *bad = 1;
        }
        if (ew > s->err_warn)
            s->err_warn = ew;
    }
    const double ug = ulp_at(g, x->prec, x->emin);
    if (may_exceed(err, ug, s->ulp)) {
        const double ul = err / ug;
        if (ul > s->ulp)
            s->ulp = ul;
    }
    if (err > s->abs)
        s->abs = err;
}

/* Compares row r (Mr: its bulk M, or NULL: per element) into *out. The
 * figures live in locals while the row runs; a first pass over each chunk
 * of columns lists the elements that are not bitwise their exact value
 * (or not finite), in order, and only those are judged (an equal finite
 * element adds nothing to any figure). */
static void compare_row(const dl__ck_t *ck, const dl__cmp_t *cmp, int64_t r, const double *Mr,
                        rowstat_t *out)
{
    const int64_t C = cmp->cols;
    rowstat_t s;
    row_stat_init(&s);
    s.checked = C;
    const int64_t K = cmp->row_K ? cmp->row_K[r] : cmp->K;
    rowctx_t x = {.ck = ck, .cmp = cmp, .Mr = Mr, .r = r, .prec = dl_dtype_precision(cmp->t),
                  .emin = emin_of(cmp->t)};
    dl__ck_bound_coef(ck, cmp, K, 0, &x.bcp);
    dl__ck_bound_coef(ck, cmp, K, 1, &x.bcw);
    int bad = 0;
    const float *cr = cmp->cand + r * C, *gr = cmp->exact + r * C;
    enum { CHUNK = 256 };
    int32_t list[CHUNK];
    for (int64_t j0 = 0; j0 < C; j0 += CHUNK) {
        const int64_t n = C - j0 < CHUNK ? C - j0 : CHUNK;
        int nl = 0;
        for (int64_t j = 0; j < n; j++) {
            const float c = cr[j0 + j];
            list[nl] = (int32_t)j;
            nl += !(c == gr[j0 + j]) || isinf(c);
        }
        for (int i = 0; i < nl; i++)
            compare_elem(&x, j0 + list[i], &s, &bad);
    }
    if (cmp->row_fail)
        cmp->row_fail[r] = (uint8_t)bad;
    if (cmp->row_over)
        cmp->row_over[r] = s.over_pass;
    *out = s;
}

/* Compares rows [r0, r1); M for the block is Mb (may be NULL: per element). */
static void compare_rows(dl__ck_t *ck, dl__cmp_t *cmp, int64_t r0, int64_t r1, const double *Mb,
                         rowstat_t *st)
{
    const int64_t C = cmp->cols;
#pragma omp parallel for schedule(dynamic, 16) if ((r1 - r0) * C > DL__PAR_MIN)
    for (int64_t r = r0; r < r1; r++) {
        if (cmp->row_skip && cmp->row_skip[r]) {
            row_stat_init(&st[r - r0]);
            continue;
        }
        compare_row(ck, cmp, r, Mb ? Mb + (r - r0) * C : NULL, &st[r - r0]);
    }
}

/* Whether element (r, j) differs from its exact value at all: only those
 * need M. */
static int64_t count_diff(const dl__cmp_t *cmp, int64_t r0, int64_t r1)
{
    int64_t n = 0;
    const int64_t C = cmp->cols;
    for (int64_t r = r0; r < r1; r++) {
        if (cmp->row_skip && cmp->row_skip[r])
            continue;
        for (int64_t j = 0; j < C; j++) {
            const float c = cmp->cand[r * C + j], g = cmp->exact[r * C + j];
            n += isfinite(c) && c != g;
        }
    }
    return n;
}

static void merge(rowstat_t *acc, const rowstat_t *s)
{
    acc->checked += s->checked;
    acc->over_pass += s->over_pass;
    acc->over_warn += s->over_warn;
    acc->over_stat += s->over_stat;
    if (s->err_stat > acc->err_stat)
        acc->err_stat = s->err_stat;
    acc->nonfinite += s->nonfinite;
    if (s->worst >= 0 && (acc->worst < 0 || s->err_pass > acc->err_pass)) {
        acc->err_pass = s->err_pass;
        acc->worst = s->worst;
        acc->wc = s->wc;
        acc->we = s->we;
    }
    if (s->err_warn > acc->err_warn)
        acc->err_warn = s->err_warn;
    if (s->ulp > acc->ulp)
        acc->ulp = s->ulp;
    if (s->abs > acc->abs)
        acc->abs = s->abs;
}

/* The comparison runs in blocks of rows: one per group (grouped GEMM), one
 * per expert (ragged), else chunks of 4096 rows. */
static int64_t n_blocks(const dl__cmp_t *cmp)
{
    const dl__mprov_t *mp = cmp->mp;
    if (mp && (mp->kind == DL__M_GROUPED || mp->kind == DL__M_RAGGED))
        return mp->E;
    return cmp->rows > 0 ? (cmp->rows + 4095) / 4096 : 0;
}

static void block_rows(const dl__cmp_t *cmp, int64_t b, int64_t *r0, int64_t *r1)
{
    const dl__mprov_t *mp = cmp->mp;
    if (mp && mp->kind == DL__M_GROUPED) {
        *r0 = mp->off[b];
        *r1 = mp->off[b + 1];
    } else if (mp && mp->kind == DL__M_RAGGED) {
        *r0 = b * mp->I;
        *r1 = (b + 1) * mp->I;
    } else {
        *r0 = b * 4096;
        *r1 = *r0 + 4096 < cmp->rows ? *r0 + 4096 : cmp->rows;
    }
}

/* Compares rows [r0, r1) into st, with M in bulk (a dgemm) when many
 * elements differ, else element by element. */
static int compare_block(dl__ck_t *ck, dl__cmp_t *cmp, int64_t r0, int64_t r1, rowstat_t *st)
{
    const dl__mprov_t *mp = cmp->mp;
    double *Mb = NULL;
    if (mp && mp->kind != DL__M_ARRAY && mp->kind != DL__M_ABS_G) {
        int64_t nd = count_diff(cmp, r0, r1);
        if (nd * 16 > (r1 - r0) * cmp->cols) {
            Mb = dl__ck_scratch(ck, DL__CK_SCR_M, (r1 - r0) * cmp->cols);
            if (!Mb)
                return DL_ENOMEM;
            int rc = m_block(ck, mp, r0, r1, NULL, Mb);
            if (rc)
                return rc;
        }
    }
    compare_rows(ck, cmp, r0, r1, Mb, st);
    return 0;
}

/* The verdict and its one-line message from the merged statistics. */
static void verdict_of(const dl__cmp_t *cmp, const rowstat_t *tot, double lambda,
                       dl_check_result_t *res)
{
    if (cmp->info) {
        res->verdict = DL_VERDICT_INFO;
        res->err_pass = res->err_warn = NAN;
        if (tot->nonfinite)
            dl__ck_msg(res, "%lld non-finite; ", (long long)tot->nonfinite);
        dl__ck_msg_append(res, "end-to-end drift against the golden: max %.3g ulp, max |c-g| %.3g",
                          tot->ulp, tot->abs);
        return;
    }
    if (tot->nonfinite || tot->over_warn || tot->over_stat)
        res->verdict = DL_VERDICT_FAIL;
    else if (tot->over_pass)
        res->verdict = DL_VERDICT_WARN;
    else
        res->verdict = DL_VERDICT_PASS;
    snprintf(res->tier, sizeof res->tier, "%s",
             tot->nonfinite || tot->over_warn ? "worst-case"
             : tot->over_stat                 ? "statistical"
                                              : "pass");
    if (tot->nonfinite)
        dl__ck_msg_append(res, "%lld NaN/Inf; ", (long long)tot->nonfinite);
    if (tot->over_warn)
        dl__ck_msg_append(res, "%lld of %lld beyond the worst-case bound; ",
                          (long long)tot->over_warn, (long long)tot->checked);
    if (tot->over_stat)
        dl__ck_msg_append(res, "%lld of %lld beyond the statistical bound (max %.3g of it: own worst "
                          "case + lambda sigma of the propagated error, lambda %.3g); ",
                          (long long)tot->over_stat, (long long)tot->checked, tot->err_stat,
                          lambda);
    if (tot->over_pass)
        dl__ck_msg_append(res, "%lld of %lld beyond the probabilistic bound; ",
                          (long long)tot->over_pass, (long long)tot->checked);
    if (res->verdict == DL_VERDICT_PASS)
        dl__ck_msg_append(res, "%lld elements within the PASS bound (max %.3g of it, %.3g ulp)",
                          (long long)tot->checked, tot->err_pass, tot->ulp);
    else
        dl__ck_msg_append(res, "worst at %lld: %.9g vs exact %.9g (%.3g x PASS bound)",
                          (long long)tot->worst, tot->wc, tot->we, tot->err_pass);
}

int dl__ck_compare(dl__ck_t *ck, dl__cmp_t *cmp, dl_check_result_t *res)
{
    const int64_t nb = n_blocks(cmp);
    rowstat_t tot;
    row_stat_init(&tot);
    int64_t maxrows = 0, r0, r1;
    for (int64_t b = 0; b < nb; b++) {
        block_rows(cmp, b, &r0, &r1);
        if (r1 - r0 > maxrows)
            maxrows = r1 - r0;
    }
    rowstat_t *st = malloc((size_t)(maxrows > 0 ? maxrows : 1) * sizeof *st);
    if (!st)
        return DL_ENOMEM;
    int rc = 0;
    for (int64_t b = 0; b < nb && !rc; b++) {
        block_rows(cmp, b, &r0, &r1);
        if (r1 <= r0 || (rc = compare_block(ck, cmp, r0, r1, st)))
            continue;
        for (int64_t r = r0; r < r1; r++)
            merge(&tot, &st[r - r0]);
    }
    free(st);
    if (rc)
        return rc;
    res->n_checked = tot.checked;
    res->n_over_pass = tot.over_pass;
    res->n_over_warn = tot.over_warn;
    res->n_nonfinite = tot.nonfinite;
    res->err_pass = tot.err_pass;
    res->err_warn = tot.err_warn;
    res->max_ulp = tot.ulp;
    res->max_abs = tot.abs;
    res->worst_index = tot.worst;
    res->worst_cand = tot.worst >= 0 ? tot.wc : NAN;
    res->worst_exact = tot.worst >= 0 ? tot.we : NAN;
    res->K = cmp->row_K ? 0 : cmp->K; /* per-row K: the longest */
    for (int64_t r = 0; cmp->row_K && r < cmp->rows; r++)
        if (cmp->row_K[r] > res->K)
            res->K = cmp->row_K[r];
    res->n_over_stat = tot.over_stat;
    res->err_stat = cmp->prop[2] ? tot.err_stat : NAN;
    res->lambda = cmp->prop[2] ? ck->lambda : NAN;
    verdict_of(cmp, &tot, ck->lambda, res);
    return 0;
}
