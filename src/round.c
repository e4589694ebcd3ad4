/* Storage types and round-to-nearest-even onto their grids. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "internal.h"

typedef struct {
    int p;    /* significand bits, implicit bit included */
    int emin; /* exponent of the smallest normal */
    int emax; /* exponent of the largest finite */
} dl__fmt_t;

static const dl__fmt_t fmts[] = {
    [DL_F32] = {24, -126, 127},
    [DL_BF16] = {8, -126, 127},
    [DL_F16] = {11, -14, 15},
    [DL_F64] = {53, -1022, 1023},
};

const char *dl_dtype_name(dl_dtype_t t)
{
    switch (t) {
    case DL_F32: return "fp32";
    case DL_BF16: return "bf16";
    case DL_F16: return "fp16";
    case DL_F64: return "fp64";
    }
    return NULL;
}

int dl_dtype_parse(const char *name, dl_dtype_t *t)
{
    static const struct { const char *s; dl_dtype_t t; } names[] = {
        {"fp32", DL_F32}, {"float32", DL_F32}, {"f32", DL_F32},
        {"bf16", DL_BF16}, {"bfloat16", DL_BF16},
        {"fp16", DL_F16}, {"float16", DL_F16}, {"f16", DL_F16},
        {"fp64", DL_F64}, {"float64", DL_F64}, {"f64", DL_F64},
    };
    if (!name)
        return DL_EDTYPE;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].s) == 0) {
            *t = names[i].t;
            return 0;
        }
    return DL_EDTYPE;
}

int dl_dtype_precision(dl_dtype_t t) { return fmts[t].p; }

double dl_dtype_unit_roundoff(dl_dtype_t t) { return ldexp(1.0, -fmts[t].p); }

double dl_round_parts(int negative, uint64_t hi, int exp, int sticky, dl_dtype_t t)
{
    const dl__fmt_t *f = &fmts[t];
    double r;
    if (hi == 0) {
        r = 0.0;
    } else {
        int top = exp + 63;
        int q = top - f->p + 1; /* exponent of one unit in the last place */
        if (q < f->emin - f->p + 1)
            q = f->emin - f->p + 1;
        int s = q - exp; /* >= 11 since p <= 53 */
        uint64_t m;
        if (s > 64) {
            m = 0; /* below half an ulp */
        } else if (s == 64) {
            /* hi*2^exp is in [2^(q-1), 2^q): at least half an ulp */
            m = (hi > (UINT64_C(1) << 63) || sticky) ? 1 : 0;
        } else {
            uint64_t rem = hi & ((UINT64_C(1) << s) - 1);
            uint64_t half = UINT64_C(1) << (s - 1);
            m = hi >> s;
            if (rem > half || (rem == half && (sticky || (m & 1))))
                m++;
        }
        r = ldexp((double)m, q); /* exact: m <= 2^p and q >= emin - p + 1 */
        if (r >= ldexp(1.0, f->emax + 1))
            r = INFINITY;
    }
    return negative ? -r : r;
}

double dl_round(double x, dl_dtype_t t)
{
    if (t == DL_F64 || x == 0.0 || !isfinite(x))
        return x;
    int e;
    double fr = frexp(fabs(x), &e); /* in [0.5, 1), at most 53 bits */
    uint64_t hi = (uint64_t)ldexp(fr, 64);
    return dl_round_parts(signbit(x) != 0, hi, e - 64, 0, t);
}

/* Validation runs over every input element, so grid membership is decided
 * on the float's bits rather than by rounding. */
int dl_on_grid(double x, dl_dtype_t t)
{
    if (isnan(x) || t == DL_F64)
        return 1;
    float f = (float)x;
    if ((double)f != x)
        return 0;
    if (t == DL_F32 || isinf(f))
        return 1;
    uint32_t b;
    memcpy(&b, &f, 4);
    if (t == DL_BF16) /* same exponent range as fp32: 16 fewer significand bits */
        return (b & 0xffffu) == 0;
    uint32_t a = b & 0x7fffffffu;
    if (a == 0)
        return 1;
    if (a > 0x477fe000u) /* beyond 65504, the largest fp16 */
        return 0;
    int e = (int)(a >> 23) - 127;
    if (e >= -14) /* fp16 normal: 10 fraction bits */
        return (a & 0x1fffu) == 0;
    if (e < -24) /* below the smallest fp16 subnormal 2^-24 */
        return 0;
    return (a & ((UINT32_C(1) << (-1 - e)) - 1)) == 0; /* a multiple of 2^-24 */
}

int dl__certify(double y, double err, dl_dtype_t t, double *out)
{
    if (!isfinite(y) || !isfinite(err))
        return 0;
    /* widen by one double ulp each way so the computed ends enclose the exact ones */
    double lo = nextafter(y - err, -INFINITY);
    double hi = nextafter(y + err, INFINITY);
    double rlo = dl_round(lo, t), rhi = dl_round(hi, t);
    if (rlo != rhi || signbit(rlo) != signbit(rhi))
        return 0;
    *out = rlo;
    return 1;
}

uint16_t dl_bf16_from_float(float x)
{
    float r = (float)dl_round(x, DL_BF16);
    uint32_t b;
    memcpy(&b, &r, 4);
    if (isnan(x))
        b |= 0x00400000u; /* keep it a quiet NaN after truncation */
    return (uint16_t)(b >> 16);
}

float dl_bf16_to_float(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    float r;
    memcpy(&r, &b, 4);
    return r;
}

uint16_t dl_f16_from_float(float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (isnan(x))
        return 0x7e00;
    double r = fabs(dl_round(x, DL_F16));
    if (isinf(r))
        return sign | 0x7c00;
    if (r == 0.0)
        return sign;
    int e;
    double fr = frexp(r, &e); /* r = fr * 2^e, fr in [0.5,1) */
    int exp = e - 1;           /* r = 1.xxx * 2^exp */
    if (exp < -14) /* subnormal: r = m * 2^-24 */
        return sign | (uint16_t)ldexp(r, 24);
    uint16_t mant = (uint16_t)(ldexp(fr, 11) - 1024.0);
    return sign | (uint16_t)((exp + 15) << 10) | mant;
}

float dl_f16_to_float(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double r;
    if (exp == 0x1f)
        r = mant ? NAN : INFINITY;
    else if (exp == 0)
        r = ldexp(mant, -24);
    else
        r = ldexp(1024 + mant, exp - 25);
    return (float)(sign ? -r : r);
}
