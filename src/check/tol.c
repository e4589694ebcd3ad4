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
static const double *mag_block(dl__ck_t *ck, int slot, const float *src, const float *dsrc,
                               int64_t n, int sq)
{
    double *d = dl__ck_scratch(ck, slot, n);
    if (!d)
        return NULL;
    ck->scr_src[slot] = NULL;
    if (!dsrc && !sq) {
        DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
        for (int64_t i = 0; i < n; i++)
            d[i] = fabs((double)src[i]););
    } else if (!dsrc) {
        DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
        for (int64_t i = 0; i < n; i++)
            d[i] = up32((double)src[i] * (double)src[i]););
    } else {
        DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
        for (int64_t i = 0; i < n; i++)
            d[i] = fabs(up32(sq ? (double)dsrc[i] * (double)dsrc[i] : (double)dsrc[i])););
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

/* Rows [off[E], rows) of a grouped provider's out: the identity tail of
 * zero experts (a copy of its input row, no product), M 0; out is scratch,
 * so left alone they would hold an earlier call's values. */
static int tail_zero(const dl__mprov_t *mp, int64_t rows, double *out)
{
    if (rows > mp->off[mp->E])
        memset(out + mp->off[mp->E] * mp->N, 0,
               (size_t)((rows - mp->off[mp->E]) * mp->N) * sizeof *out);
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
        return tail_zero(mp, rows, out);
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

/* ------------------------------------ M as a bound in binary32 (fused) */

/* The two kinds of binary32 magnitudes (magf_block), on [i0, i1):
 * straight-line loops the compiler vectorises (an OpenMP region's own
 * body does not: its shared operands go through a struct). */
DL__CK_VEC static void magf_abs(int64_t i0, int64_t i1, const float *restrict s, float *restrict d)
{
    for (int64_t i = i0; i < i1; i++)
        d[i] = fabsf(s[i]);
}

DL__CK_VEC static void magf_sq(int64_t i0, int64_t i1, const float *restrict s, float *restrict d)
{
    for (int64_t i = i0; i < i1; i++)
        d[i] = dl__ck_up32f((double)s[i] * (double)s[i]);
}

/* An operand's magnitudes as binary32 into float scratch slot: |x| of
 * floats or their squares rounded up (sq), the operands mag_block gives
 * dgemm (each is a float value there); a delta (>= 0 or NaN, binary32
 * already) is its own magnitude (no copy) and its square is rounded up
 * as a float's; in parallel over chunks. */
static const float *magf_block(dl__ck_t *ck, int slot, const float *src, const float *dsrc,
                               int64_t n, int sq)
{
    if (dsrc && !sq)
        return dsrc;
    src = dsrc ? dsrc : src;
    float *d = (float *)dl__ck_scratch(ck, slot, n / 2 + 1);
    if (!d)
        return NULL;
    ck->scr_src[slot] = NULL;
    const int64_t nc = (n + DL__CK_VCHUNK - 1) / DL__CK_VCHUNK;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t c = 0; c < nc; c++) {
        const int64_t i0 = c * DL__CK_VCHUNK, i1 = i0 + DL__CK_VCHUNK < n ? i0 + DL__CK_VCHUNK : n;
        if (!sq)
            magf_abs(i0, i1, src, d);
        else
            magf_sq(i0, i1, src, d);
    });
    return d;
}

/* magf_block of a whole stable operand (a weight: never a delta), kept
 * while the slot's tag names it (mag_whole's binary32 twin), + off. (More
 * slots, one per weight and kind, converted less but cost more fresh
 * pages than the conversions they saved: measured, fusedck.) */
static const float *magf_whole(dl__ck_t *ck, int slot, const float *base, int64_t whole,
                               int64_t off, int sq)
{
    if (!(ck->scr_src[slot] == base && ck->scr_sq[slot] == sq && ck->scr_len[slot] == whole)) {
        if (!magf_block(ck, slot, base, NULL, whole, sq))
            return NULL;
        ck->scr_src[slot] = base;
        ck->scr_sq[slot] = sq;
        ck->scr_len[slot] = whole;
    }
    return (const float *)ck->scr[slot] + off;
}

/* out = C f + a on [i0, i1) (mf_block's bound); 0 where a C is not a
 * finite float. */
DL__CK_VEC static int inflate(int64_t i0, int64_t i1, const float *restrict C, double f, double a,
                              double *restrict out)
{
    int ok = 1;
    for (int64_t i = i0; i < i1; i++) {
        ok &= C[i] <= 0x1.fffffep127f;
        out[i] = (double)C[i] * f + a;
    }
    return ok;
}

/* m_block's grouped case in binary32 for rows [r0, r1) of one group, out
 * an upper bound of the exact M; 1 (out not valid) where the binary32
 * sum overflowed (an element not finite: binary64 then) or K is too long.
 * Each rounding of a nonnegative product or sum, gradual underflow
 * included, gives z (1 + e) + h, |e| <= u = 2^-24, |h| <= 2^-150; a
 * product passes at most K + nterms of them (any order and blocking), so
 * C >= exact (1 - u)^(K+2) - (K+2) 2^-150 and exact <= C (1 + 2 (K + 4) u)
 * + (K + 4) 2^-148 while (K + 4) u <= 1/2 (the margins cover the binary64
 * evaluation). */
static int mf_block(dl__ck_t *ck, const dl__mprov_t *mp, int64_t r0, int64_t r1,
                    const dl__ck_mop_t *x, double *out)
{
    const int64_t R = r1 - r0, N = mp->N, e = group_of(mp->off, mp->E, r0);
    const int sq = x && x->sq;
    int64_t Kt = 0;
    for (int t = 0; t < mp->nterms; t++)
        Kt += mp->terms[t].K;
    if (Kt >= (1 << 22))
        return 1;
    float *C = (float *)dl__ck_scratch(ck, DL__CK_SCR_FC, R * N / 2 + 1);
    if (!C)
        return DL_ENOMEM;
    for (int t = 0; t < mp->nterms; t++) {
        const dl_gemm_term_t *tm = &mp->terms[t];
        const int64_t K = tm->K;
        const float *B = magf_whole(ck, DL__CK_SCR_FB + t, tm->rhs, mp->E * K * N, e * K * N, sq);
        const float *A = magf_block(ck, DL__CK_SCR_FA, tm->lhs + r0 * K,
                                    x ? x->delta + r0 * K : NULL, R * K, sq);
        if (!A || !B)
            return DL_ENOMEM;
        if (K > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans,
                        tm->layout == DL_RHS_KN ? CblasNoTrans : CblasTrans, (int)R, (int)N,
                        (int)K, 1.0f, A, (int)K, B, tm->layout == DL_RHS_KN ? (int)N : (int)K,
                        t ? 1.0f : 0.0f, C, (int)N);
        else if (!t)
            memset(C, 0, (size_t)(R * N) * sizeof *C);
    }
    const double f = 1.0 + 2.0 * (double)(Kt + 4) * 0x1p-24, a = (double)(Kt + 4) * 0x1p-148;
    int ok = 1; /* (an integer reduction: the elements are independent) */
    const int64_t n = R * N, nc = (n + DL__CK_VCHUNK - 1) / DL__CK_VCHUNK;
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static) reduction(& : ok),
    for (int64_t c = 0; c < nc; c++) {
        const int64_t i0 = c * DL__CK_VCHUNK, i1 = i0 + DL__CK_VCHUNK < n ? i0 + DL__CK_VCHUNK : n;
        ok &= inflate(i0, i1, C, f, a, out);
    });
    return ok ? 0 : 1;
}

int dl__ck_f64_bounds;

int dl__ck_m_up(dl__ck_t *ck, const dl__mprov_t *mp, int64_t rows, const dl__ck_mop_t *x,
                double *out)
{
    if (mp->kind != DL__M_GROUPED || dl__ck_f64_bounds)
        return dl__ck_m_bulk(ck, mp, rows, x, out);
    for (int64_t e = 0; e < mp->E; e++) {
        const int64_t r0 = mp->off[e], r1 = mp->off[e + 1];
        double *o = out + r0 * mp->N;
        int rc = r1 > r0 ? mf_block(ck, mp, r0, r1, x, o) : 0;
        if (rc == 1) /* binary32 overflowed (or K too long): binary64 */
            rc = m_block(ck, mp, r0, r1, x, o);
        if (rc)
            return rc;
    }
    return tail_zero(mp, rows, out);
}

/* ------------------------------------------------------ the comparison */

/* How the comparison obtains M (check_priv.h): -1 reads DROPLESS_CHECK_M
 * at each comparison ("exact": the reference path). */
int dl__ck_m_mode = -1;
dl__ck_m_stats_t dl__ck_m_stats;

static int m_mode(void)
{
    if (dl__ck_m_mode >= 0)
        return dl__ck_m_mode;
    const char *e = getenv("DROPLESS_CHECK_M");
    return e && !strcmp(e, "exact") ? DL__CK_M_EXACT : DL__CK_M_PRUNED;
}

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

/* M of an element that differs (tolerances.md, "M of a compared
 * element"): exactly (dl__ck_m_elem, the array, |g|: MB_EXACT), or first
 * a bracket around dl__ck_m_elem's value: from the block's row and column
 * 2-norms (MB_NORMS: [0, Cauchy-Schwarz]) or from its bulk M in binary32
 * (MB_BULK: an sgemm of magnitudes, within (K + 4) 2^-23 of it, which
 * puts each bound within a factor 1 -+ rel of the bound at that M). */
enum { MB_EXACT, MB_NORMS, MB_BULK };
typedef struct {
    int kind, nt;
    int64_t r0, C;
    const float *Ms;             /* MB_BULK: [r1 - r0, C] */
    const double *na[2], *nb[2]; /* MB_NORMS: per term, [r1 - r0] and [C] */
    double fhi;                  /* MB_NORMS: hi = (sum na nb) fhi; MB_BULK: bh = b (1 + rel) fhi */
    double rel, tiny;            /* MB_BULK: below tiny (or not finite) the exact M */
} mbr_t;

/* MB_NORMS: the element's bracket [lo, hi]. */
static inline void m_bracket(const mbr_t *b, int64_t r, int64_t j, double *lo, double *hi)
{
    const int64_t i = r - b->r0;
    double s = b->na[0][i] * b->nb[0][j];
    if (b->nt > 1)
        s += b->na[1][i] * b->nb[1][j];
    *lo = 0.0;
    *hi = s * b->fhi;
}

/* The row's fixed parts while a pass over it runs; L: lower ends of the
 * maxima of the ratios to the PASS, WARN and statistical bounds. */
typedef struct {
    const dl__ck_t *ck;
    const dl__cmp_t *cmp;
    const mbr_t *br;
    dl__ck_bc_t bcp, bcw; /* the row's PASS and WARN coefficients */
    int prec, emin, nt;   /* nt: the tiers judged (3 with the statistical one) */
    int shared;           /* bounds_at: PASS and WARN share the rounding part */
    int64_t r;
    double L[3];
} rowctx_t;

static void row_ctx(const dl__ck_t *ck, const dl__cmp_t *cmp, int64_t r, const mbr_t *br,
                    const double L[3], rowctx_t *x)
{
    const int64_t K = cmp->row_K ? cmp->row_K[r] : cmp->K;
    *x = (rowctx_t){.ck = ck, .cmp = cmp, .br = br, .r = r, .prec = dl_dtype_precision(cmp->t),
                    .emin = emin_of(cmp->t), .nt = cmp->prop[2] ? 3 : 2,
                    .L = {L[0], L[1], L[2]}};
    dl__ck_bound_coef(ck, cmp, K, 0, &x->bcp);
    dl__ck_bound_coef(ck, cmp, K, 1, &x->bcw);
    const dl__ck_bc_t *p = &x->bcp, *w = &x->bcw;
    x->shared = !p->stat && !w->stat && p->nu == w->nu && p->f2 == w->f2 && p->eta == w->eta &&
                p->kt == w->kt;
}

static inline double m_exact(const rowctx_t *x, int64_t idx, int64_t j, double g)
{
    const dl__mprov_t *mp = x->cmp->mp;
    if (!mp)
        return fabs(g);
    return mp->kind == DL__M_ARRAY ? mp->arr[idx] : dl__ck_m_elem(mp, x->r, j);
}

/* The element's PASS, WARN and statistical bounds at M (the last: own
 * worst case + lambda sigma; 0 where the tier does not judge). Each is a
 * non-decreasing function of M, rounding included. The reference path's
 * (dl__ck_bound_at per tier). */
static inline void bounds_ref(const rowctx_t *x, int64_t idx, double g, double M, double b[3])
{
    const dl__cmp_t *cmp = x->cmp;
    b[0] = dl__ck_bound_at(&x->bcp, g, M) + (cmp->prop[0] ? cmp->prop[0][idx] : 0.0);
    const double own_w = dl__ck_bound_at(&x->bcw, g, M);
    b[1] = own_w + (cmp->prop[1] ? cmp->prop[1][idx] : 0.0);
    b[2] = cmp->prop[2] ? own_w + x->ck->lambda * cmp->prop[2][idx] : 0.0;
}

/* The same bounds for the brackets, with dl__ck_bound_at's operations in
 * its order (bitwise bounds_ref's) where the PASS and WARN coefficients
 * share their rounding part and take no statistical term (x->shared: so
 * every comparison's, row_ctx checks it): that part once. */
static inline void bounds_at(const rowctx_t *x, int64_t idx, double g, double M, double b[3])
{
    if (!x->shared) {
        bounds_ref(x, idx, g, M, b);
        return;
    }
    const dl__cmp_t *cmp = x->cmp;
    const double r0 = x->bcp.nu * fabs(g) * x->bcp.f2 + x->bcp.eta + x->bcp.kt;
    const double own_w = M != 0.0 ? r0 + x->bcw.kap * M : r0;
    b[0] = (M != 0.0 ? r0 + x->bcp.kap * M : r0) + (cmp->prop[0] ? cmp->prop[0][idx] : 0.0);
    b[1] = own_w + (cmp->prop[1] ? cmp->prop[1][idx] : 0.0);
    b[2] = cmp->prop[2] ? own_w + x->ck->lambda * cmp->prop[2][idx] : 0.0;
}

static inline void ulp_abs(const rowctx_t *x, double err, double g, rowstat_t *s)
{
    const double ug = ulp_at(g, x->prec, x->emin);
    if (may_exceed(err, ug, s->ulp)) {
        const double ul = err / ug;
        if (ul > s->ulp)
            s->ulp = ul;
    }
    if (err > s->abs)
        s->abs = err;
}

static inline void judge_nonfinite(int64_t idx, double c, double g, rowstat_t *s, int *bad)
{
    s->nonfinite++;
    *bad = 1;
    if (s->err_pass != INFINITY) { /* the first one stays the worst */
        s->err_pass = s->err_warn = INFINITY;
        s->worst = idx;
        s->wc = c;
        s->we = g;
    }
}

/* A finite element at its M into the row's figures s (bad: over the WARN
 * or statistical bound). The divisions only where the ratio may reach 1
 * or the row's largest so far (most elements sit far below both). */
static inline void judge_exact(const rowctx_t *x, int64_t idx, double c, double g, double err,
                               double M, rowstat_t *s, int *bad)
{
    double b[3];
    bounds_ref(x, idx, g, M, b);
    if (x->nt > 2 && may_exceed(err, b[2], fmin(1.0, s->err_stat))) {
        const double es = err / b[2];
        if (es > 1.0) {
            s->over_stat++;
            *bad = 1;
        }
        if (es > s->err_stat)
            s->err_stat = es;
    }
    if (may_exceed(err, b[0], fmin(1.0, s->err_pass))) {
        const double ep = err / b[0];
        if (ep > 1.0)
            s->over_pass++;
        if (ep > s->err_pass) {
            s->err_pass = ep;
            s->worst = idx;
            s->wc = c;
            s->we = g;
        }
    }
    if (may_exceed(err, b[1], fmin(1.0, s->err_warn))) {
        const double ew = err / b[1];
        if (ew > 1.0) {
            s->over_warn++;
            *bad = 1;
        }
        if (ew > s->err_warn)
            s->err_warn = ew;
    }
    ulp_abs(x, err, g, s);
}

/* The certain outcomes of a ratio err / b(M) for M in [lo, hi], with bl =
 * b(lo) >= ... and bh = b(hi): the computed ratio at M lies between those
 * at hi and lo (division and every bound are monotone), and each test
 * keeps a relative margin of 2^-40 over its own rounding. */
static inline int surely_within(double err, double bl)
{
    return err <= bl * (1.0 - 0x1p-40); /* err / b(M) <= err / bl < 1 */
}
static inline int surely_over(double err, double bh)
{
    return err >= bh * (1.0 + 0x1p-40); /* err / b(M) >= err / bh > 1 */
}
static inline int surely_below(double err, double bl, double L)
{
    return L >= 0x1p-900 && err < bl * L * (1.0 - 0x1p-40); /* err / b(M) < L */
}

/* The element's bounds at the ends of its bracket: bl no larger than
 * every bound at an M the bracket holds, bh (where hi_too) no smaller;
 * 1 where M must be taken exactly instead (MB_BULK: a tiny or not finite
 * bulk M). */
static inline int bracket_bounds(const rowctx_t *x, int64_t idx, int64_t j, double g, int hi_too,
                                 double bl[3], double bh[3])
{
    const mbr_t *br = x->br;
    if (br->kind == MB_BULK) {
        const double m = br->Ms[(x->r - br->r0) * br->C + j];
        if (!(m >= br->tiny && m <= 0x1p100))
            return 1;
        bounds_at(x, idx, g, m, bh);
        for (int t = 0; t < x->nt; t++) {
            bl[t] = bh[t] * (1.0 - br->rel);
            bh[t] *= (1.0 + br->rel) * br->fhi;
        }
        return 0;
    }
    double lo, hi;
    m_bracket(br, x->r, j, &lo, &hi);
    bounds_at(x, idx, g, lo, bl);
    if (hi_too)
        bounds_at(x, idx, g, hi, bh);
    return 0;
}

/* A finite element with bracket bounds bl (and bh where have_bh) into s
 * where they decide every figure it can change: each maximum (its ratio
 * surely below the lower end L: it can be neither the largest nor tie
 * with it) and each tier's count (its ratio surely over 1 or surely not;
 * the norms' bounds at hi only where those at lo leave it open). 1:
 * undecided. */
static inline int judge_bracket(const rowctx_t *x, int64_t idx, int64_t j, double g, double err,
                                const double bl[3], double bh[3], int have_bh, rowstat_t *s,
                                int *bad)
{
    int over[3] = {0, 0, 0};
    for (int t = 0; t < x->nt; t++) {
        if (!surely_below(err, bl[t], x->L[t]))
            return 1;
        if (surely_within(err, bl[t]))
            continue;
        if (!have_bh) {
            double lo, hi;
            m_bracket(x->br, x->r, j, &lo, &hi);
            bounds_at(x, idx, g, hi, bh);
            have_bh = 1;
        }
        if (!(over[t] = surely_over(err, bh[t])))
            return 1;
    }
    s->over_pass += over[0];
    s->over_warn += over[1];
    s->over_stat += over[2];
    *bad |= over[1] | over[2];
    ulp_abs(x, err, g, s);
    return 0;
}

/* Raises the lower ends L by an element's ratios at its bounds bh (at
 * most its ratios at its M). */
static inline void raise_lower(double L[3], int nt, double err, const double bh[3])
{
    for (int t = 0; t < nt; t++)
        if (may_exceed(err, bh[t], L[t]) && err / bh[t] > L[t])
            L[t] = err / bh[t];
}

/* Element j of the row that differs from its exact value or is not
 * finite into s. A bracketed element its bracket leaves open waits in
 * the row's list (1; MB_BULK: its ratios raised the row's lower ends
 * first) unless final: then its exact M (*ne counts them). */
static inline int compare_elem(rowctx_t *x, int64_t j, int final, rowstat_t *s, int *bad,
                               int64_t *ne)
{
    const dl__cmp_t *cmp = x->cmp;
    const int64_t idx = x->r * cmp->cols + j;
    const double c = cmp->cand[idx], g = cmp->exact[idx];
    if (!isfinite(c)) {
        judge_nonfinite(idx, c, g, s, bad);
        return 0;
    }
    const double err = fabs(c - g);
    if (err == 0.0)
        return 0;
    if (x->br->kind == MB_EXACT) {
        judge_exact(x, idx, c, g, err, m_exact(x, idx, j, g), s, bad);
        return 0;
    }
    double lo, hi, bl[3], bh[3];
    if (x->br->kind == MB_NORMS && (m_bracket(x->br, x->r, j, &lo, &hi), hi == 0.0)) {
        /* M = 0 ([0, 0] holds nothing else), but judged in index order
         * with the row's waiting elements: an earlier one that ties with
         * it must stay the worst, as on the reference path */
        if (!final)
            return 1;
        judge_exact(x, idx, c, g, err, 0.0, s, bad);
        return 0;
    }
    const int bulk = x->br->kind == MB_BULK;
    if (!bracket_bounds(x, idx, j, g, 0, bl, bh)) {
        if (bulk && !final)
            raise_lower(x->L, x->nt, err, bh);
        if (!judge_bracket(x, idx, j, g, err, bl, bh, bulk, s, bad))
            return 0;
    }
    if (!final)
        return 1;
    judge_exact(x, idx, c, g, err, m_exact(x, idx, j, g), s, bad);
    ++*ne;
    return 0;
}

/* The elements of columns [j0, j0 + n) of row r that are not bitwise their
 * exact value (or not finite), in order, into list; their count. */
static inline int diff_list(const dl__cmp_t *cmp, int64_t r, int64_t j0, int64_t n,
                            int32_t *list)
{
    const float *cr = cmp->cand + r * cmp->cols + j0, *gr = cmp->exact + r * cmp->cols + j0;
    int nl = 0;
    for (int64_t j = 0; j < n; j++) {
        const float c = cr[j];
        list[nl] = (int32_t)j;
        nl += !(c == gr[j]) || isinf(c);
    }
    return nl;
}
enum { CHUNK = 256 };

#define DL__CK_CLONES DL__CK_VEC /* check_priv.h */

/* The bounds of n elements at M mlo and mhi (bitwise bounds_at's where
 * the row's coefficients are shared), straight-line: the compiler
 * vectorises it (the clones compute the same IEEE operations). */
DL__CK_CLONES static void dense_bounds(const rowctx_t *x, int n, const float *restrict cr,
                                       const float *restrict gr, const double *restrict mlo,
                                       const double *restrict mhi, const double *restrict p0,
                                       const double *restrict p1, const double *restrict p2,
                                       int st, double *restrict err, double (*restrict bl)[CHUNK],
                                       double (*restrict bh)[CHUNK])
{
    const double nu = x->bcp.nu, f2 = x->bcp.f2, eta = x->bcp.eta, kt = x->bcp.kt,
                 kp = x->bcp.kap, kw = x->bcw.kap, lam = st ? x->ck->lambda : 0.0;
    for (int j = 0; j < n; j++) {
        const double g = gr[j], ml = mlo[j], mh = mhi[j];
        err[j] = fabs((double)cr[j] - g);
        const double r0 = nu * fabs(g) * f2 + eta + kt;
        /* both sides computed, then selected: no control flow */
        const double wl0 = r0 + kw * ml, wh0 = r0 + kw * mh, pl = r0 + kp * ml,
                     ph = r0 + kp * mh;
        const double wl = ml != 0.0 ? wl0 : r0, wh = mh != 0.0 ? wh0 : r0;
        bl[0][j] = (ml != 0.0 ? pl : r0) + p0[j];
        bh[0][j] = (mh != 0.0 ? ph : r0) + p0[j];
        bl[1][j] = wl + p1[j];
        bh[1][j] = wh + p1[j];
        bl[2][j] = wl + lam * p2[j];
        bh[2][j] = wh + lam * p2[j];
    }
}

/* The dense path of a chunk (columns [j0, j0 + n) of the row, most of
 * which differ; a bracket, not the exact M): every element's bracket
 * bounds at once (dense_bounds; bitwise bracket_bounds'), the row's lower
 * ends raised by the chunk's (valid for every element: a lower end of the
 * maximum over the row), then each element the bracket decides into s;
 * the others (undecided, non-finite, or a bulk M out of range) into rest,
 * in order, for compare_elem; their count. */
static int dense_chunk(rowctx_t *x, int64_t j0, int n, rowstat_t *s, int *bad, int32_t *rest)
{
    static const double zero[CHUNK];
    const dl__cmp_t *cmp = x->cmp;
    const mbr_t *br = x->br;
    const int64_t base = x->r * cmp->cols + j0, i = x->r - br->r0;
    const float *cr = cmp->cand + base, *gr = cmp->exact + base;
    const int bulk = br->kind == MB_BULK, st = x->nt > 2;
    double err[CHUNK], bl[3][CHUNK], bh[3][CHUNK], mlo[CHUNK], mhi[CHUNK];
    unsigned char ok[CHUNK];
    for (int j = 0; j < n; j++) {
        if (bulk) {
            mlo[j] = mhi[j] = br->Ms[i * br->C + j0 + j];
            ok[j] = mlo[j] >= br->tiny && mlo[j] <= 0x1p100;
        } else {
            double m = br->na[0][i] * br->nb[0][j0 + j];
            if (br->nt > 1)
                m += br->na[1][i] * br->nb[1][j0 + j];
            mlo[j] = 0.0;
            mhi[j] = m * br->fhi;
            ok[j] = mhi[j] != 0.0;
        }
    }
    dense_bounds(x, n, cr, gr, mlo, mhi, cmp->prop[0] ? cmp->prop[0] + base : zero,
                 cmp->prop[1] ? cmp->prop[1] + base : zero,
                 cmp->prop[2] ? cmp->prop[2] + base : zero, st, err, bl, bh);
    if (bulk)
        for (int t = 0; t < x->nt; t++)
            for (int j = 0; j < n; j++) {
                const double b = bl[t][j];
                bl[t][j] = b * (1.0 - br->rel);
                bh[t][j] = b * ((1.0 + br->rel) * br->fhi);
            }
    for (int j = 0; j < n; j++) {
        ok[j] &= isfinite(cr[j]) && err[j] != 0.0;
        if (ok[j])
            raise_lower(x->L, x->nt, err[j], (const double[3]){bh[0][j], bh[1][j], bh[2][j]});
    }
    int nr = 0;
    for (int j = 0; j < n; j++) {
        if (!ok[j]) {
            rest[nr] = (int32_t)(j0 + j);
            nr += !(err[j] == 0.0 && isfinite(cr[j])) || isinf(cr[j]);
            continue;
        }
        int und = 0, over[3] = {0, 0, 0};
        for (int t = 0; t < x->nt; t++) {
            const int w = surely_within(err[j], bl[t][j]);
            over[t] = !w && surely_over(err[j], bh[t][j]);
            und |= !surely_below(err[j], bl[t][j], x->L[t]) || (!w && !over[t]);
        }
        if (und) {
            rest[nr++] = (int32_t)(j0 + j);
            continue;
        }
        s->over_pass += over[0];
        s->over_warn += over[1];
        s->over_stat += over[2];
        *bad |= over[1] | over[2];
        ulp_abs(x, err[j], gr[j], s);
    }
    return nr;
}

/* Compares row r into *out, M by br, the block's lower ends L. The
 * figures live in locals while the row runs; each chunk's differing
 * elements are judged in order (an equal finite element adds nothing to
 * any figure); those a bracket leaves open wait in a list, in order, and
 * are judged again when it is full and at the row's end, against the
 * lower ends then (the exact M where still open): only they can change
 * a maximum, so the first-index tie-breaking stays. */
static void compare_row(const dl__ck_t *ck, const dl__cmp_t *cmp, int64_t r, const mbr_t *br,
                        const double L[3], rowstat_t *out, int64_t *ne)
{
    const int64_t C = cmp->cols;
    rowstat_t s;
    row_stat_init(&s);
    s.checked = C;
    rowctx_t x;
    row_ctx(ck, cmp, r, br, L, &x);
    int bad = 0, nw = 0;
    int32_t list[CHUNK], wait[2 * CHUNK];
    for (int64_t j0 = 0; j0 < C; j0 += CHUNK) {
        const int n = C - j0 < CHUNK ? (int)(C - j0) : CHUNK;
        int nl = diff_list(cmp, r, j0, n, list);
        if (br->kind != MB_EXACT && x.shared && 2 * nl > n) /* the dense path first */
            nl = dense_chunk(&x, j0, n, &s, &bad, list);
        else
            for (int i = 0; i < nl; i++)
                list[i] += (int32_t)j0;
        for (int i = 0; i < nl; i++)
            if (compare_elem(&x, list[i], 0, &s, &bad, ne))
                wait[nw++] = list[i];
        if (nw >= CHUNK || j0 + CHUNK >= C) {
            for (int i = 0; i < nw; i++)
                compare_elem(&x, wait[i], 1, &s, &bad, ne);
            nw = 0;
        }
    }
    if (cmp->row_fail)
        cmp->row_fail[r] = (uint8_t)bad;
    if (cmp->row_over)
        cmp->row_over[r] = s.over_pass;
    *out = s;
}

/* The first pass over row r with brackets br: into L (from its value
 * on entry) the largest ratio at each element's upper M (at most its
 * ratio at its M: a lower end of the maxima). With est set, the return
 * value bounds the elements the second pass will judge exactly from above
 * (an element counts where the running lower ends do not decide it: the
 * final ends are at least those). */
static int64_t row_lower(const dl__ck_t *ck, const dl__cmp_t *cmp, int64_t r, const mbr_t *br,
                         int est_on, double L[3])
{
    rowctx_t x;
    row_ctx(ck, cmp, r, br, L, &x);
    int64_t est = 0;
    int32_t list[CHUNK];
    for (int64_t j0 = 0; j0 < cmp->cols; j0 += CHUNK) {
        const int64_t n = cmp->cols - j0 < CHUNK ? cmp->cols - j0 : CHUNK;
        const int nl = diff_list(cmp, r, j0, n, list);
        for (int i = 0; i < nl; i++) {
            const int64_t j = j0 + list[i], idx = r * cmp->cols + j;
            const double c = cmp->cand[idx], g = cmp->exact[idx], err = fabs(c - g);
            if (!isfinite(c)) {
                x.L[0] = x.L[1] = INFINITY; /* the nonfinite one is the worst */
                continue;
            }
            double bl[3], bh[3];
            if (bracket_bounds(&x, idx, j, g, 1, bl, bh))
                continue; /* exact in the second pass (MB_BULK only: no estimate) */
            if (est_on && bl[0] != bh[0]) {
                int und = 0;
                for (int t = 0; t < x.nt; t++)
                    und |= !surely_below(err, bl[t], x.L[t]) ||
                           (!surely_within(err, bl[t]) && !surely_over(err, bh[t]));
                est += und;
            }
            for (int t = 0; t < x.nt; t++)
                if (may_exceed(err, bh[t], x.L[t]) && err / bh[t] > x.L[t])
                    x.L[t] = err / bh[t];
        }
    }
    memcpy(L, x.L, sizeof x.L);
    return est;
}

/* The lower ends of rows [r0, r1) into L (merged over the rows: a
 * maximum, the same for any thread count); the elements the second pass
 * may judge exactly, at most. */
static int64_t block_lower(const dl__ck_t *ck, const dl__cmp_t *cmp, int64_t r0, int64_t r1,
                           const mbr_t *br, int est_on, double L[3], rowstat_t *st)
{
    int64_t est = 0;
    DL__PAR_FOR((r1 - r0) * cmp->cols > DL__PAR_MIN, schedule(dynamic, 16),
    for (int64_t r = r0; r < r1; r++) {
        double Lr[3] = {L[0], L[1], L[2]};
        int64_t e = 0;
        if (!(cmp->row_skip && cmp->row_skip[r]))
            e = row_lower(ck, cmp, r, br, est_on, Lr);
        st[r - r0].err_pass = Lr[0];
        st[r - r0].err_warn = Lr[1];
        st[r - r0].err_stat = Lr[2];
        st[r - r0].checked = e;
    });
    for (int64_t r = r0; r < r1; r++) {
        const rowstat_t *s = &st[r - r0];
        L[0] = fmax(L[0], s->err_pass);
        L[1] = fmax(L[1], s->err_warn);
        L[2] = fmax(L[2], s->err_stat);
        est += s->checked;
    }
    return est;
}

/* Compares rows [r0, r1), M by br; *ne the exact M taken after a bracket. */
static void compare_rows(dl__ck_t *ck, dl__cmp_t *cmp, int64_t r0, int64_t r1, const mbr_t *br,
                         const double L[3], rowstat_t *st, int64_t *ne)
{
    const int64_t C = cmp->cols;
    int64_t n = 0;
    DL__PAR_FOR((r1 - r0) * C > DL__PAR_MIN, schedule(dynamic, 16),
    for (int64_t r = r0; r < r1; r++) {
        if (cmp->row_skip && cmp->row_skip[r]) {
            row_stat_init(&st[r - r0]);
            continue;
        }
        int64_t e = 0;
        compare_row(ck, cmp, r, br, L, &st[r - r0], &e);
        if (e) {
            _Pragma("omp atomic")
            n += e;
        }
    });
    *ne = n;
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

/* 2-norms in binary64 (squares of floats are exact; sums in order): of
 * the n rows of a [n, K] array, and of the N columns of rows [0, m) of a
 * [m, ld] one. */
static void row_norms(const float *a, int64_t K, int64_t n, double *out)
{
    DL__PAR_FOR(n * K > DL__PAR_MIN, schedule(static),
    for (int64_t r = 0; r < n; r++) {
        const float *p = a + r * K;
        double s = 0.0;
        for (int64_t i = 0; i < K; i++)
            s += (double)p[i] * (double)p[i];
        out[r] = sqrt(s);
    });
}

static void col_norms(const float *a, int64_t ld, int64_t m, int64_t N, double *out)
{
    enum { CB = 64 };
    DL__PAR_FOR(m * N > DL__PAR_MIN, schedule(static),
    for (int64_t j0 = 0; j0 < N; j0 += CB) {
        const int64_t j1 = j0 + CB < N ? j0 + CB : N;
        double s[CB] = {0};
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = j0; j < j1; j++)
                s[j - j0] += (double)a[i * ld + j] * (double)a[i * ld + j];
        for (int64_t j = j0; j < j1; j++)
            out[j] = sqrt(s[j - j0]);
    });
}

/* The inflation of a bracket around dl__ck_m_elem's sum of Kt products
 * (tolerances.md: 16 (Kt + 4) units of 2^-53 cover every rounding of the
 * norms, the dgemm and m_elem's sum; the mutant, a negative control for
 * the tests, halves the upper end). */
static double m_slack(int64_t Kt)
{
    return (double)(Kt + 4) * 0x1p-49;
}

/* The row and column norms of block [r0, r1) (one group, grouped; one
 * expert, ragged) in scratch, into br (MB_NORMS). */
static int m_norms(dl__ck_t *ck, const dl__mprov_t *mp, int64_t r0, int64_t r1, int mode,
                   mbr_t *br)
{
    const int64_t R = r1 - r0, N = mp->N;
    const int nt = mp->kind == DL__M_GROUPED ? mp->nterms : 1;
    double *w = dl__ck_scratch(ck, DL__CK_SCR_M, nt * (R + N));
    if (!w)
        return DL_ENOMEM;
    int64_t Kt = 0;
    br->kind = MB_NORMS;
    br->nt = nt;
    for (int t = 0; t < nt; t++) {
        double *na = w + t * (R + N), *nb = na + R;
        if (mp->kind == DL__M_GROUPED) {
            const dl_gemm_term_t *tm = &mp->terms[t];
            const float *B = rhs_of(tm, N, group_of(mp->off, mp->E, r0));
            row_norms(tm->lhs + r0 * tm->K, tm->K, R, na);
            if (tm->layout == DL_RHS_KN)
                col_norms(B, N, tm->K, N, nb);
            else
                row_norms(B, tm->K, N, nb);
            Kt += tm->K;
        } else {
            const int64_t e = r0 / mp->I, m0 = mp->off[e];
            Kt = mp->off[e + 1] - m0;
            col_norms(mp->a + m0 * mp->I, mp->I, Kt, mp->I, na);
            col_norms(mp->b + m0 * N, N, Kt, N, nb);
        }
        br->na[t] = na;
        br->nb[t] = nb;
    }
    br->fhi = (1.0 + m_slack(Kt)) * (mode == DL__CK_M_MUTANT ? 0.5 : 1.0);
    return 0;
}

/* The contraction length of block [r0, ...)'s M (every term's). */
static int64_t m_len(const dl__mprov_t *mp, int64_t r0)
{
    if (mp->kind == DL__M_RAGGED)
        return mp->off[r0 / mp->I + 1] - mp->off[r0 / mp->I];
    int64_t Kt = 0;
    for (int t = 0; t < mp->nterms; t++)
        Kt += mp->terms[t].K;
    return Kt;
}

/* |x| of n floats into d (binary32: the bulk bracket's sgemm operands). */
static void abs32(const float *x, int64_t n, float *d)
{
    DL__PAR_FOR(n > DL__PAR_MIN, schedule(static),
    for (int64_t i = 0; i < n; i++)
        d[i] = fabsf(x[i]););
}

/* M of block [r0, r1) in binary32 into out [r1 - r0, N]: the sgemm of
 * the magnitudes (|A| and |B| in scratch slot A), for the bulk bracket. */
static int m_block_s(dl__ck_t *ck, const dl__mprov_t *mp, int64_t r0, int64_t r1, float *out)
{
    const int64_t R = r1 - r0, N = mp->N;
    if (mp->kind == DL__M_RAGGED) {
        const int64_t I = mp->I, e = r0 / I, m0 = mp->off[e], Mg = mp->off[e + 1] - m0;
        float *A = (float *)dl__ck_scratch(ck, DL__CK_SCR_A, (Mg * (I + N) + 1) / 2);
        if (!A)
            return DL_ENOMEM;
        ck->scr_src[DL__CK_SCR_A] = NULL;
        if (Mg == 0) {
            memset(out, 0, (size_t)(R * N) * sizeof *out);
            return 0;
        }
        abs32(mp->a + m0 * I, Mg * I, A);
        abs32(mp->b + m0 * N, Mg * N, A + Mg * I);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)R, (int)N, (int)Mg, 1.0f,
                    A, (int)I, A + Mg * I, (int)N, 0.0f, out, (int)N);
        return 0;
    }
    const int64_t e = group_of(mp->off, mp->E, r0);
    for (int t = 0; t < mp->nterms; t++) {
        const dl_gemm_term_t *tm = &mp->terms[t];
        const int64_t K = tm->K;
        float *A = (float *)dl__ck_scratch(ck, DL__CK_SCR_A, (K * (R + N) + 1) / 2);
        if (!A)
            return DL_ENOMEM;
        ck->scr_src[DL__CK_SCR_A] = NULL;
        if (K == 0) {
            if (!t)
                memset(out, 0, (size_t)(R * N) * sizeof *out);
            continue;
        }
        abs32(tm->lhs + r0 * K, R * K, A);
        abs32(rhs_of(tm, N, e), K * N, A + R * K);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tm->layout == DL_RHS_KN ? CblasNoTrans : CblasTrans,
                    (int)R, (int)N, (int)K, 1.0f, A, (int)K, A + R * K,
                    tm->layout == DL_RHS_KN ? (int)N : (int)K, t ? 1.0f : 0.0f, out, (int)N);
    }
    return 0;
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

/* How block [r0, r1) gets M: exactly per element where few elements
 * differ (or the reference path), else brackets from the norms, and
 * where those leave too many elements undecided, from a bulk dgemm; L
 * (the merged maxima of the blocks before, on entry) becomes the block's
 * lower ends. The norms are skipped for fp32 storage (its rounding term
 * is too small beside kappa M for a bracket from M = 0 to decide much)
 * and once a block of the comparison fell back (*bulk). */
static int block_m(dl__ck_t *ck, dl__cmp_t *cmp, int64_t r0, int64_t r1, int mode, int *bulk,
                   mbr_t *br, double L[3], rowstat_t *st)
{
    const dl__mprov_t *mp = cmp->mp;
    const int64_t R = r1 - r0, C = cmp->cols;
    *br = (mbr_t){.kind = MB_EXACT, .r0 = r0, .C = C};
    if (mode == DL__CK_M_EXACT || !mp || (mp->kind != DL__M_GROUPED && mp->kind != DL__M_RAGGED))
        return 0;
    const int64_t nd = count_diff(cmp, r0, r1);
    if (nd <= R + C) /* the norms would cost more than M of each */
        return 0;
#pragma omp atomic
    dl__ck_m_stats.diff += nd;
    int rc;
    if (!*bulk && cmp->t != DL_F32) {
        if ((rc = m_norms(ck, mp, r0, r1, mode, br)))
            return rc;
        if (block_lower(ck, cmp, r0, r1, br, 1, L, st) * 16 <= R * C) {
#pragma omp atomic
            dl__ck_m_stats.blocks[MB_NORMS]++;
            return 0;
        }
        *bulk = 1;
    }
    float *Ms = (float *)dl__ck_scratch(ck, DL__CK_SCR_M, (R * C + 1) / 2);
    if (!Ms)
        return DL_ENOMEM;
    if ((rc = m_block_s(ck, mp, r0, r1, Ms)))
        return rc;
    const int64_t Kt = m_len(mp, r0);
    *br = (mbr_t){.kind = MB_BULK, .r0 = r0, .C = C, .Ms = Ms,
                  .rel = (double)(Kt + 4) * 0x1p-22 + 0x1p-45, .tiny = (double)(Kt + 1) * 0x1p-100,
                  .fhi = mode == DL__CK_M_MUTANT ? 0.5 : 1.0};
#pragma omp atomic
    dl__ck_m_stats.blocks[MB_BULK]++;
    return 0;
}

/* Compares rows [r0, r1) into st (tot: the blocks before, merged). */
static int compare_block(dl__ck_t *ck, dl__cmp_t *cmp, int64_t r0, int64_t r1, int mode,
                         int *bulk, const rowstat_t *tot, rowstat_t *st)
{
    mbr_t br;
    double L[3] = {tot->err_pass, tot->err_warn, tot->err_stat};
    int rc = block_m(ck, cmp, r0, r1, mode, bulk, &br, L, st);
    if (rc)
        return rc;
    int64_t ne = 0;
    compare_rows(ck, cmp, r0, r1, &br, L, st, &ne);
    if (br.kind != MB_EXACT) {
#pragma omp atomic
        dl__ck_m_stats.exact += ne;
    }
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
    const int mode = m_mode();
    int bulk = 0; /* a block fell back: the rest go to the bulk M directly */
    for (int64_t b = 0; b < nb && !rc; b++) {
        block_rows(cmp, b, &r0, &r1);
        if (r1 <= r0 || (rc = compare_block(ck, cmp, r0, r1, mode, &bulk, &tot, st)))
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
