/* Low-precision formats: exact encode (one rounding, any mode) and decode
 * of FP8 E4M3 / E5M2, FP4 E2M1 and the UE8M0 scale, FP4 nibble packing and
 * DeepGEMM's packed UE8M0 words. The arithmetic is integer arithmetic on a
 * power-of-two scaling of the input, which is exact in binary64. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "core/core_priv.h"
#include "dropless/lowp.h"

enum { KIND_FN, KIND_IEEE, KIND_FIN, KIND_POW2 };
#define KIND_OF(k) KIND_##k

typedef struct {
    const char *name;
    int bits, p, emin, emax;
    double max;
    int kind;
} qfmt_t;

static const qfmt_t F[] = {
#define DL__QF_ROW(E, nm, b, pp, mn, mx, mv, k) {nm, b, pp, mn, mx, mv, KIND_OF(k)},
    DL_QFMT_MAP(DL__QF_ROW)
#undef DL__QF_ROW
};

/* 2^k for |k| <= 1022, from its bits (ldexp is a library call). */
static inline double pow2i(int k)
{
    uint64_t b = (uint64_t)(k + 1023) << 52;
    double r;
    memcpy(&r, &b, 8);
    return r;
}

static int valid(dl_qfmt_t f) { return (unsigned)f < DL_Q_NFMT; }

const char *dl_qfmt_name(dl_qfmt_t f) { return valid(f) ? F[f].name : NULL; }

int dl_qfmt_parse(const char *name, dl_qfmt_t *f)
{
    for (int i = 0; name && i < DL_Q_NFMT; i++)
        if (strcmp(name, F[i].name) == 0) {
            *f = (dl_qfmt_t)i;
            return 0;
        }
    return DL_EDTYPE;
}

void dl__qfmt_params(dl_qfmt_t f, int *p, int *emin)
{
    *p = valid(f) ? F[f].p : 0;
    *emin = valid(f) ? F[f].emin : 0;
}

double dl_qfmt_max(dl_qfmt_t f) { return valid(f) ? F[f].max : NAN; }
int dl_qfmt_emax(dl_qfmt_t f) { return valid(f) ? F[f].emax : 0; }
int dl_qfmt_bits(dl_qfmt_t f) { return valid(f) ? F[f].bits : 0; }

/* The code of the finite value n * 2^qe (n < 2^p after the carry) of
 * format q, sign bit sbit. */
static unsigned pack_code(const qfmt_t *q, unsigned sbit, uint64_t n, int qe)
{
    uint64_t one = UINT64_C(1) << (q->p - 1);
    if (n == 2 * one) {
        n = one;
        qe++;
    }
    if (n < one) /* subnormal (qe is then emin - p + 1) or zero */
        return sbit | (unsigned)n;
    int biased = qe + q->p - 1 - q->emin + 1;
    return sbit | (unsigned)biased << (q->p - 1) | (unsigned)(n - one);
}

/* The code of +-max (E4M3's top mantissa pattern is NaN, so max is not
 * always all ones). */
static unsigned max_code(const qfmt_t *q, unsigned sbit)
{
    int qe = q->emax - q->p + 1;
    return pack_code(q, sbit, (uint64_t)ldexp(q->max, -qe), qe);
}

static unsigned nan_code(const qfmt_t *q, unsigned sbit)
{
    return q->kind == KIND_FN ? sbit | 0x7f : sbit | 0x7e;
}

/* The code of an overflowed magnitude (beyond max after rounding). */
static unsigned over_code(const qfmt_t *q, unsigned sbit, int saturate)
{
    if (saturate || q->kind == KIND_FIN)
        return max_code(q, sbit);
    return q->kind == KIND_IEEE ? sbit | 0x7c : nan_code(q, sbit);
}

/* n plus the rounding increment for the fraction fr in [0, 1) of the
 * scaled magnitude (exact), under mode r for a value of sign neg. */
static uint64_t round_int(uint64_t n, double fr, dl_qround_t r, int neg)
{
    switch (r) {
    case DL_QR_RNE: return n + (fr > 0.5 || (fr == 0.5 && (n & 1)));
    case DL_QR_AWAY: return n + (fr >= 0.5);
    case DL_QR_ZERO: return n;
    case DL_QR_UP: return n + (fr > 0.0 && !neg);
    case DL_QR_DOWN: return n + (fr > 0.0 && neg);
    case DL_QR_TIEZERO: return n + (fr > 0.5);
    }
    return n;
}

static unsigned ue8m0_encode(double x, dl_qround_t r, int saturate)
{
    if (isnan(x))
        return 0xff;
    if (!(x > 0.0))
        return 0;
    if (isinf(x))
        return saturate ? 0xfe : 0xff;
    int e;
    double fr = frexp(x, &e); /* x = fr 2^e, fr in [0.5, 1): floor(log2 x) = e - 1 */
    int c = e - 1, exact = fr == 0.5;
    if (!exact) {
        if (r == DL_QR_UP)
            c++;
        else if (r == DL_QR_RNE || r == DL_QR_AWAY || r == DL_QR_TIEZERO) {
            /* the midpoint of 2^c and 2^(c+1) is 1.5 2^c; a tie goes up
             * under RNE too: with one significand bit, 1.1b rounds to the
             * even significand 10b (as IEEE rounding and ml_dtypes do) */
            double m = 2.0 * fr;
            if (m > 1.5 || (m == 1.5 && r != DL_QR_TIEZERO))
                c++;
        }
    }
    if (c < -127)
        return 0;
    if (c > 127)
        return saturate ? 0xfe : 0xff;
    return (unsigned)(c + 127);
}

unsigned dl_qencode(double x, dl_qfmt_t f, dl_qround_t r, int saturate, int *nan_lost)
{
    if (!valid(f))
        return 0;
    const qfmt_t *q = &F[f];
    if (q->kind == KIND_POW2)
        return ue8m0_encode(x, r, saturate);
    int neg = signbit(x) != 0;
    unsigned sbit = neg ? 1u << (q->bits - 1) : 0;
    if (isnan(x)) {
        if (q->kind == KIND_FIN) {
            if (nan_lost)
                *nan_lost = 1;
            return 0;
        }
        return nan_code(q, sbit);
    }
    double a = fabs(x);
    if (a == 0.0)
        return sbit;
    if (isinf(a))
        return over_code(q, sbit, saturate);
    if (a >= 2.0 * q->max * 2.0) /* beyond any rounding back to max */
        return r == DL_QR_ZERO || (r == DL_QR_UP && neg) || (r == DL_QR_DOWN && !neg)
                   ? max_code(q, sbit)
                   : over_code(q, sbit, saturate);
    uint64_t bits;
    memcpy(&bits, &a, 8);
    if (r == DL_QR_RNE && a >= pow2i(q->emin) && a <= q->max) /* the common case */
        return sbit | dl__qencode_normal(a, q->p, q->emin);
    int e = (int)(bits >> 52) - 1023; /* floor(log2 a); a double subnormal counts as below emin */
    int qe = (e > q->emin ? e : q->emin) - (q->p - 1); /* exponent of one ulp */
    double m = a * pow2i(-qe); /* exact: a power-of-two scaling, m < 2^(p+1) */
    uint64_t fl = (uint64_t)m;
    uint64_t n = round_int(fl, m - (double)fl, r, neg);
    if ((double)n * pow2i(qe) > q->max) /* toward zero never overflows */
        return r == DL_QR_ZERO || (r == DL_QR_UP && neg) || (r == DL_QR_DOWN && !neg)
                   ? max_code(q, sbit)
                   : over_code(q, sbit, saturate);
    return pack_code(q, sbit, n, qe);
}

double dl_qdecode(unsigned code, dl_qfmt_t f)
{
    if (!valid(f))
        return NAN;
    const qfmt_t *q = &F[f];
    if (q->kind == KIND_POW2) {
        code &= 0xff;
        return code == 0xff ? NAN : ldexp(1.0, (int)code - 127);
    }
    code &= (1u << q->bits) - 1;
    int neg = (code >> (q->bits - 1)) & 1;
    unsigned ebits = q->bits - q->p; /* exponent field width */
    unsigned biased = (code >> (q->p - 1)) & ((1u << ebits) - 1);
    unsigned mant = code & ((1u << (q->p - 1)) - 1);
    double v;
    if (q->kind == KIND_FN && biased == (1u << ebits) - 1 && mant == (1u << (q->p - 1)) - 1)
        v = NAN;
    else if (q->kind == KIND_IEEE && biased == (1u << ebits) - 1)
        v = mant ? NAN : INFINITY;
    else if (biased == 0)
        v = ldexp((double)mant, q->emin - q->p + 1);
    else
        v = ldexp((double)((1u << (q->p - 1)) + mant), (int)biased - 1 + q->emin - q->p + 1);
    return neg ? -v : v;
}

double dl_qround(double x, dl_qfmt_t f)
{
    return dl_qdecode(dl_qencode(x, f, DL_QR_RNE, 1, NULL), f);
}

size_t dl_qencode_array(const double *x, size_t n, dl_qfmt_t f, dl_qround_t r, int saturate,
                        uint8_t *codes)
{
    size_t lost = 0;
    for (size_t i = 0; i < n; i++) {
        int l = 0;
        codes[i] = (uint8_t)dl_qencode(x[i], f, r, saturate, &l);
        lost += (size_t)l;
    }
    return lost;
}

void dl_qdecode_array(const uint8_t *codes, size_t n, dl_qfmt_t f, double *x)
{
    for (size_t i = 0; i < n; i++)
        x[i] = dl_qdecode(codes[i], f);
}

void dl_fp4_pack(const uint8_t *codes, size_t n, uint8_t *dst)
{
    for (size_t i = 0; i < n; i += 2)
        dst[i / 2] = (uint8_t)((codes[i] & 0xf) | (i + 1 < n ? (codes[i + 1] & 0xf) << 4 : 0));
}

void dl_fp4_unpack(const uint8_t *src, size_t n, uint8_t *codes)
{
    for (size_t i = 0; i < n; i++)
        codes[i] = (uint8_t)((src[i / 2] >> (4 * (i & 1))) & 0xf);
}

void dl_ue8m0_pack(const uint8_t *codes, size_t n, uint32_t *dst)
{
    for (size_t g = 0; g < (n + 3) / 4; g++) {
        uint32_t w = 0;
        for (size_t i = 0; i < 4; i++)
            w |= (uint32_t)(4 * g + i < n ? codes[4 * g + i] : 127) << (8 * i);
        dst[g] = w;
    }
}

void dl_ue8m0_unpack(const uint32_t *src, size_t n, uint8_t *codes)
{
    for (size_t i = 0; i < n; i++)
        codes[i] = (uint8_t)(src[i / 4] >> (8 * (i % 4)));
}
