/* Block-scaled quantization under a declared rule (dropless/quant.h): the
 * block's amax, its scale, the elements rounded once.
 *
 * Why binary64 division is exact enough. The inputs are floats (24
 * significant bits) and a scale q_s has at most 28 (an E4M3 code times an
 * fp32 global scale); a point of the element grid, or a midpoint between
 * two, has at most 5. If x / q_s is not such a point g, then x - q_s g is a
 * nonzero multiple of ulp(q_s) ulp(g), so |x/q_s - g| exceeds 2^-34 |g|,
 * far more than binary64's rounding of the quotient (2^-53 relative):
 * RN_64(x / q_s) lies on the same side of every grid point and midpoint
 * as x / q_s, and any rounding mode of the element format gives the same
 * code from it. The same argument covers amax / fmax onto fp32 and E4M3. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "stages/stages_priv.h"
#include "dropless/quant.h"

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int dl_quant_rule_check(const dl_qrule_t *r, int64_t cols)
{
    if (!r || r->br < 1 || r->bc < 1)
        return DL_EINVAL;
    if (r->elem != DL_Q_E4M3 && r->elem != DL_Q_E5M2 && r->elem != DL_Q_E2M1)
        return DL_EINVAL;
    if ((unsigned)r->scale > DL_QSCALE_E4M3 || (unsigned)r->srule > DL_QS_LOG2P1 ||
        (unsigned)r->eround > DL_QR_TIEZERO)
        return DL_EINVAL;
    if ((r->flags & DL_QF_PACKED) && r->scale != DL_QSCALE_UE8M0)
        return DL_EINVAL;
    if ((r->flags & DL_QF_MULAMAX) && (r->scale != DL_QSCALE_F32 || r->srule != DL_QS_DIV ||
                                       (r->flags & (DL_QF_RECIP | DL_QF_POW2_AFTER | DL_QF_DIV32))))
        return DL_EINVAL;
    if (r->scale == DL_QSCALE_E4M3 && (r->flags & DL_QF_DIV32)) /* 28-bit divisors */
        return DL_EINVAL;
    if (r->scale == DL_QSCALE_E4M3 && !(r->global > 0.0f && isfinite(r->global)))
        return DL_EINVAL;
    if (!(r->amax_floor >= 0.0f) || !isfinite(r->amax_floor))
        return DL_EINVAL;
    if (r->elem == DL_Q_E2M1 && cols >= 0 && cols % 2)
        return DL_EINVAL;
    return 0;
}

static const struct {
    const char *name;
    dl_qrule_t r;
} RECIPES[] = {
#define DL__QR_ROW(E, nm, el, sc, br, bc, sr, fl) \
    {nm, {DL_Q_##el, DL_QSCALE_##sc, br, bc, DL_QS_##sr, DL_QR_RNE, fl, 0.0f, 1.0f}},
    DL_QRECIPE_MAP(DL__QR_ROW)
#undef DL__QR_ROW
};

int dl_quant_recipe(const char *name, dl_qrule_t *out)
{
    for (size_t i = 0; name && out && i < sizeof RECIPES / sizeof *RECIPES; i++)
        if (strcmp(name, RECIPES[i].name) == 0) {
            *out = RECIPES[i].r;
            return 0;
        }
    return DL_ENOTFOUND;
}

const char *dl_quant_recipe_name(int i)
{
    return i >= 0 && (size_t)i < sizeof RECIPES / sizeof *RECIPES ? RECIPES[i].name : NULL;
}

int64_t dl_quant_qbytes(const dl_qrule_t *r, int64_t rows, int64_t cols)
{
    if (dl_quant_rule_check(r, cols) || rows < 0 || cols < 0)
        return 0;
    return r->elem == DL_Q_E2M1 ? rows * cols / 2 : rows * cols;
}

int64_t dl_quant_sbytes(const dl_qrule_t *r, int64_t rows, int64_t cols)
{
    if (dl_quant_rule_check(r, cols) || rows < 0 || cols < 0)
        return 0;
    int64_t nrb = cdiv(rows, r->br), ncb = cdiv(cols, r->bc);
    if (r->flags & DL_QF_PACKED)
        return nrb * cdiv(ncb, 4) * 4;
    return nrb * ncb * (r->scale == DL_QSCALE_F32 ? 4 : 1);
}

/* The UE8M0 code of a power-of-two scale rule applied to sf (or amax). */
static unsigned pow2_code(dl_qsrule_t rule, double sf, double amax, dl_qfmt_t elem)
{
    int e;
    switch (rule) {
    case DL_QS_FLOOR: return dl_qencode(sf, DL_Q_UE8M0, DL_QR_DOWN, 1, NULL);
    case DL_QS_MX:
        frexp(amax, &e);
        e = e - 1 - dl_qfmt_emax(elem);
        return e < -127 ? 0 : e > 127 ? 254 : (unsigned)(e + 127);
    case DL_QS_LOG2:
        e = (int)ceilf(log2f((float)sf));
        return e < -127 ? 0 : e > 127 ? 254 : (unsigned)(e + 127);
    case DL_QS_LOG2P1:
        frexp(sf, &e);
        return e < -127 ? 0 : e > 127 ? 254 : (unsigned)(e + 127);
    default: return dl_qencode(sf, DL_Q_UE8M0, DL_QR_UP, 1, NULL);
    }
}

/* The scale of a block with this amax: its stored code or value (*code,
 * *val: the value the dequantization uses, global scale included) and the
 * divisor the elements are quantized with (*qs; 0: the elements are zeros). */
static void block_scale(const dl_qrule_t *r, double amax, unsigned *code, double *val,
                        double *qs, double *inv)
{
    *inv = amax > 0.0 ? dl_round(dl_qfmt_max(r->elem) / amax, DL_F32) : 0.0;
    double fmax = dl_qfmt_max(r->elem);
    double sf = dl_round(amax / fmax, DL_F32);
    if (r->scale == DL_QSCALE_E4M3) {
        double g = r->global;
        *code = amax == 0.0 ? 0x38 : dl_qencode(amax / (fmax * g), DL_Q_E4M3, DL_QR_RNE, 1, NULL);
        *val = *qs = dl_qdecode(*code, DL_Q_E4M3) * g;
        return;
    }
    if (amax == 0.0) {
        *code = 127;
        *val = *qs = 1.0;
        return;
    }
    if (r->srule == DL_QS_DIV) {
        *val = *qs = sf;
        *code = 0;
    } else {
        *code = pow2_code(r->srule, sf, amax, r->elem);
        *val = *qs = dl_qdecode(*code, DL_Q_UE8M0);
    }
    if (r->flags & DL_QF_POW2_AFTER)
        *qs = sf;
}

static void put_scale(const dl_qrule_t *r, void *s, int64_t ncb, int64_t bi, int64_t bj,
                      unsigned code, double val)
{
    if (r->scale == DL_QSCALE_F32) {
        ((float *)s)[bi * ncb + bj] = (float)val;
    } else if (r->flags & DL_QF_PACKED) {
        uint32_t *w = (uint32_t *)s + bi * cdiv(ncb, 4) + bj / 4;
        *w = (*w & ~(UINT32_C(0xff) << (8 * (bj % 4)))) | (uint32_t)code << (8 * (bj % 4));
    } else {
        ((uint8_t *)s)[bi * ncb + bj] = (uint8_t)code;
    }
}

/* The element format's constants for the quantizer's hot path. */
typedef struct {
    int p, emin, fast; /* fast: the declared element rule (RNE, x / qs exact) */
    double lo, max;    /* the smallest normal and the max */
    double sub;        /* 1 / the subnormal quantum 2^(emin - p + 1) */
    unsigned sbit;
} efmt_t;

static efmt_t efmt_of(const dl_qrule_t *r)
{
    efmt_t e;
    dl__qfmt_params(r->elem, &e.p, &e.emin);
    e.lo = ldexp(1.0, e.emin);
    e.sub = ldexp(1.0, e.p - 1 - e.emin);
    e.max = dl_qfmt_max(r->elem);
    e.sbit = 1u << (dl_qfmt_bits(r->elem) - 1);
    e.fast = r->eround == DL_QR_RNE &&
             !(r->flags & (DL_QF_RECIP | DL_QF_MULAMAX | DL_QF_DIV32));
    return e;
}

/* The element code of x quantized with divisor qs. */
static unsigned elem_code(const dl_qrule_t *r, const efmt_t *ef, float x, double qs, double inv)
{
    if (qs == 0.0)
        return dl_qencode(x < 0 ? -0.0 : 0.0, r->elem, DL_QR_RNE, 1, NULL);
    double y = (double)x / qs; /* on the same side of every grid point (see the top) */
    double a = fabs(y);
    if (ef->fast && a <= ef->max) { /* dl_qencode's first cases, inline */
        unsigned sb = signbit(y) ? ef->sbit : 0;
        if (a >= ef->lo)
            return sb | dl__qencode_normal(a, ef->p, ef->emin);
        /* subnormal or zero: the code is the nearest (even) multiple of the
         * quantum; 2^52 + m rounds m (< 2^(p-1)) to an integer, ties even */
        return sb | (unsigned)((a * ef->sub + 0x1p52) - 0x1p52);
    }
    if (r->flags & DL_QF_RECIP)
        y = dl_round((double)x * dl_round(1.0 / qs, DL_F32), DL_F32);
    else if (r->flags & DL_QF_MULAMAX)
        y = dl_round((double)x * inv, DL_F32);
    else if (r->flags & DL_QF_DIV32) /* x / qs in binary64 then fp32: see the top */
        y = dl_round(y, DL_F32);
    return dl_qencode(y, r->elem, r->eround, !(r->flags & DL_QF_NOSAT), NULL);
}

static void put_code(const dl_qrule_t *r, uint8_t *q, int64_t idx, unsigned code)
{
    if (r->elem != DL_Q_E2M1) {
        q[idx] = (uint8_t)code;
        return;
    }
    int sh = 4 * (int)(idx & 1);
    q[idx / 2] = (uint8_t)((q[idx / 2] & ~(0xf << sh)) | (code & 0xf) << sh);
}

/* One block row: every block's amax, scale, and elements. */
static void quant_block_row(const dl_qrule_t *r, const float *x, int64_t rows, int64_t cols,
                            int64_t bi, uint8_t *q, void *s)
{
    int64_t ncb = cdiv(cols, r->bc), i0 = bi * r->br, i1 = i0 + r->br < rows ? i0 + r->br : rows;
    if (r->flags & DL_QF_PACKED) /* the pad bytes of the last word: 1.0 */
        for (int64_t bj = ncb; bj < cdiv(ncb, 4) * 4; bj++)
            put_scale(r, s, ncb, bi, bj, 127, 1.0);
    for (int64_t bj = 0; bj < ncb; bj++) {
        int64_t j0 = bj * r->bc, j1 = j0 + r->bc < cols ? j0 + r->bc : cols;
        double amax = r->amax_floor;
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = j0; j < j1; j++)
                amax = fabs(x[i * cols + j]) > amax ? fabs(x[i * cols + j]) : amax;
        unsigned code;
        double val, qs, inv;
        block_scale(r, amax, &code, &val, &qs, &inv);
        efmt_t ef = efmt_of(r);
        put_scale(r, s, ncb, bi, bj, code, val);
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = j0; j < j1; j++)
                put_code(r, q, i * cols + j, elem_code(r, &ef, x[i * cols + j], qs, inv));
    }
}

int dl_quantize(const dl_qrule_t *r, const float *x, int64_t rows, int64_t cols, uint8_t *q,
                void *s)
{
    if (dl_quant_rule_check(r, cols) || !x || !q || !s || rows < 0 || cols < 0)
        return DL_EINVAL;
    int64_t n;
    if (dl_mul_size(rows, cols, &n))
        return DL_EOVERFLOW;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return DL_ENONFINITE;
    int64_t nrb = cdiv(rows, r->br);
#pragma omp parallel for schedule(dynamic, 1) if (n > (1 << 16))
    for (int64_t bi = 0; bi < nrb; bi++)
        quant_block_row(r, x, rows, cols, bi, q, s);
    return 0;
}

double dl_quant_scale(const dl_qmat_t *m, int64_t bi, int64_t bj)
{
    const dl_qrule_t *r = m->rule;
    int64_t ncb = cdiv(m->cols, r->bc);
    if (r->scale == DL_QSCALE_F32)
        return ((const float *)m->s)[bi * ncb + bj];
    if (r->flags & DL_QF_PACKED) {
        uint32_t w = ((const uint32_t *)m->s)[bi * cdiv(ncb, 4) + bj / 4];
        return dl_qdecode((w >> (8 * (bj % 4))) & 0xff, DL_Q_UE8M0);
    }
    unsigned c = ((const uint8_t *)m->s)[bi * ncb + bj];
    if (r->scale == DL_QSCALE_UE8M0)
        return dl_qdecode(c, DL_Q_UE8M0);
    return dl_qdecode(c, DL_Q_E4M3) * (double)r->global;
}

unsigned dl_quant_code(const dl_qmat_t *m, int64_t i, int64_t j)
{
    int64_t idx = i * m->cols + j;
    if (m->rule->elem != DL_Q_E2M1)
        return m->q[idx];
    return (m->q[idx / 2] >> (4 * (idx & 1))) & 0xf;
}

double dl_dequant(const dl_qmat_t *m, int64_t i, int64_t j)
{
    if (!m->rule) /* an unquantized operand */
        return ((const float *)m->s)[i * m->cols + j];
    return dl_qdecode(dl_quant_code(m, i, j), m->rule->elem) *
           dl_quant_scale(m, i / m->rule->br, j / m->rule->bc);
}

float dl_nvfp4_global(const float *x, int64_t n)
{
    double amax = 0.0;
    for (int64_t i = 0; i < n; i++)
        amax = fabs(x[i]) > amax ? fabs(x[i]) : amax;
    return amax == 0.0 ? 1.0f : (float)dl_round(amax / (6.0 * 448.0), DL_F32);
}
