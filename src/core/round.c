/* Storage types and round-to-nearest-even onto their grids. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "core/core_priv.h"

typedef struct {
    int p;           /* significand bits, implicit bit included */
    int emin;        /* exponent of the smallest normal */
    int emax;        /* exponent of the largest finite */
    double overflow; /* 2^(emax+1): anything rounded to it or beyond is infinite */
} dl__fmt_t;

static const dl__fmt_t fmts[] = {
    [DL_F32] = {24, -126, 127, 0x1p128},
    [DL_BF16] = {8, -126, 127, 0x1p128},
    [DL_F16] = {11, -14, 15, 0x1p16},
    [DL_F64] = {53, -1022, 1023, INFINITY},
};

/* 2^q for a normal exponent, built from its bits (ldexp is a library call
 * on the hottest path: every rounding goes through here). */
static inline double pow2(int q)
{
    uint64_t b = (uint64_t)(q + 1023) << 52;
    double r;
    memcpy(&r, &b, 8);
    return r;
}

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
        /* exact: m <= 2^p and q >= emin - p + 1; m * 2^q is then normal or exactly 0 */
        r = q >= -1022 && q <= 1023 ? (double)m * pow2(q) : ldexp((double)m, q);
        if (r >= f->overflow)
            r = INFINITY;
    }
    return negative ? -r : r;
}

/* RN-even to p significant bits by integer arithmetic on the bits of a
 * positive double whose result is a normal number of the target (drop =
 * 53 - p low bits). A carry into the exponent is the right answer. */
static inline double round_bits(double a, int drop)
{
    uint64_t b;
    memcpy(&b, &a, 8);
    uint64_t lsb = (b >> drop) & 1;
    b += (UINT64_C(1) << (drop - 1)) - 1 + lsb;
    b &= ~((UINT64_C(1) << drop) - 1);
    memcpy(&a, &b, 8);
    return a;
}

/* dl_round's body, inlined where round.c itself rounds (dl__certify: a
 * call of the exported dl_round goes through the PLT) */
static inline double round_to(double x, dl_dtype_t t)
{
    if (t == DL_F64 || x == 0.0 || !isfinite(x))
        return x;
    /* fast paths: IEEE conversion to float is this rounding (FLT_EVAL_METHOD
     * is 0); bf16 and fp16 normals by the bits; the rest in general below */
    if (t == DL_F32)
        return (double)(float)x;
    const dl__fmt_t *f = &fmts[t];
    double a = fabs(x);
    if (a >= pow2(f->emin) && a < f->overflow) {
        double r = round_bits(a, 53 - f->p);
        if (r >= f->overflow)
            r = INFINITY;
        return x < 0 ? -r : r;
    }
    uint64_t b;
    memcpy(&b, &x, 8);
    int e = (int)((b >> 52) & 0x7ff);
    uint64_t m = b & ((UINT64_C(1) << 52) - 1);
    int shift;
    if (e) { /* normal: the implicit bit to bit 63 */
        m |= UINT64_C(1) << 52;
        shift = 11;
    } else { /* subnormal double: normalise */
        shift = __builtin_clzll(m);
        e = 1;
    }
    return dl_round_parts((int)(b >> 63), m << shift, e - 1075 - shift, 0, t);
}

double dl_round(double x, dl_dtype_t t) { return round_to(x, t); }

/* out[i] = w g[i] rounded once to t (the product of a double holding a
 * float and a float is exact), for arrays: a lane whose |w g| is a normal
 * number of t rounds by the bits as round_to does (F32 by the IEEE
 * conversion), branch-free, so the loop vectorises; a block with another
 * lane (zero, subnormal, overflow, non-finite) sends those through
 * round_to itself. */
DL__VEC_CLONES
void dl__round_scaled(const float *g, double w, int64_t n, dl_dtype_t t, float *out)
{
    if (t == DL_F32 || t == DL_F64) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++)
            out[i] = (float)(w * (double)g[i]);
        return;
    }
    const dl__fmt_t *f = &fmts[t];
    const double lo = pow2(f->emin), hi = f->overflow;
    const int drop = 53 - f->p;
    enum { B = 256 };
    for (int64_t i0 = 0; i0 < n; i0 += B) {
        const int64_t nb = n - i0 < B ? n - i0 : B;
        int odd = 0;
#pragma omp simd reduction(| : odd)
        for (int64_t b = 0; b < nb; b++) {
            const double x = w * (double)g[i0 + b], a = fabs(x);
            uint64_t u;
            memcpy(&u, &a, 8);
            u += (UINT64_C(1) << (drop - 1)) - 1 + ((u >> drop) & 1);
            u &= ~((UINT64_C(1) << drop) - 1);
            double r;
            memcpy(&r, &u, 8);
            r = r >= hi ? INFINITY : r;
            odd |= !(a >= lo && a < hi);
            out[i0 + b] = (float)(x < 0 ? -r : r);
        }
        for (int64_t b = 0; odd && b < nb; b++) {
            const double x = w * (double)g[i0 + b], a = fabs(x);
            if (!(a >= lo && a < hi))
                out[i0 + b] = (float)round_to(x, t);
        }
    }
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

/* The largest double below v, for finite v (nextafter is a library call). */
static inline double next_down(double v)
{
    if (v == 0.0)
        return -0x1p-1074;
    if (isinf(v))
        return v;
    uint64_t b;
    memcpy(&b, &v, 8);
    b += v > 0 ? (uint64_t)-1 : 1;
    memcpy(&v, &b, 8);
    return v;
}

int dl__certify(double y, double err, dl_dtype_t t, double *out)
{
    if (!isfinite(y) || !isfinite(err))
        return 0;
    /* widen by one double ulp each way so the computed ends enclose the exact ones */
    double lo = next_down(y - err);
    double hi = -next_down(-(y + err));
    double rlo = round_to(lo, t), rhi = round_to(hi, t);
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
