/* The exact accumulator: a long fixed-point number in carry-save limbs. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "core/core_priv.h"

#define PENDING_MAX (UINT32_C(1) << 29)

void dl_acc_clear(dl_acc_t *acc)
{
    memset(acc->limb, 0, sizeof acc->limb);
    acc->lo = DL_ACC_LIMBS;
    acc->hi = -1;
    acc->pending = 0;
    acc->pos_inf = acc->neg_inf = acc->nan = 0;
}

void dl__acc_normalize(dl_acc_t *acc)
{
    if (acc->hi < acc->lo) {
        acc->pending = 0;
        return;
    }
    int top = acc->hi;
    for (int i = acc->lo; i < DL_ACC_LIMBS - 1; i++) {
        int64_t low = (int64_t)((uint64_t)acc->limb[i] & 0xffffffffu);
        int64_t carry = (acc->limb[i] - low) / (INT64_C(1) << 32);
        acc->limb[i] = low;
        acc->limb[i + 1] += carry;
        if (carry != 0 && i + 1 > top)
            top = i + 1;
        if (i >= top)
            break;
    }
    acc->hi = top;
    acc->pending = 0;
}

/* Splits a double into an integer significand and the exponent of its last bit. */
static inline uint64_t split(double x, int *lsb_exp)
{
    uint64_t b;
    memcpy(&b, &x, 8);
    int e = (int)((b >> 52) & 0x7ff);
    uint64_t m = b & ((UINT64_C(1) << 52) - 1);
    if (e == 0) {
        *lsb_exp = -1074;
    } else {
        m |= UINT64_C(1) << 52;
        *lsb_exp = e - 1075;
    }
    return m;
}

/* acc += sign * v * 2^(pos + LSB) for v < 2^64, pos >= 0. */
static inline void add_at(dl_acc_t *acc, int negative, uint64_t v, int pos)
{
    int idx = pos >> 5;
    dl__u128 w = (dl__u128)v << (pos & 31);
    int64_t c0 = (int64_t)(uint32_t)w, c1 = (int64_t)(uint32_t)(w >> 32),
            c2 = (int64_t)(uint32_t)(w >> 64);
    if (negative) {
        acc->limb[idx] -= c0;
        acc->limb[idx + 1] -= c1;
        acc->limb[idx + 2] -= c2;
    } else {
        acc->limb[idx] += c0;
        acc->limb[idx + 1] += c1;
        acc->limb[idx + 2] += c2;
    }
    if (idx < acc->lo)
        acc->lo = idx;
    if (idx + 2 > acc->hi)
        acc->hi = idx + 2;
}

static inline void note_nonfinite(dl_acc_t *acc, double x)
{
    if (isnan(x))
        acc->nan = 1;
    else if (x > 0)
        acc->pos_inf = 1;
    else
        acc->neg_inf = 1;
}

void dl_acc_add(dl_acc_t *acc, double x)
{
    if (DL__UNLIKELY(!isfinite(x))) {
        note_nonfinite(acc, x);
        return;
    }
    if (x == 0.0)
        return;
    if (DL__UNLIKELY(++acc->pending >= PENDING_MAX))
        dl__acc_normalize(acc);
    int e;
    uint64_t m = split(x, &e);
    add_at(acc, x < 0, m, e - DL_ACC_LSB_EXP);
}

void dl_acc_add_prod(dl_acc_t *acc, double a, double b)
{
    if (DL__UNLIKELY(!isfinite(a) || !isfinite(b))) {
        double p = a * b; /* IEEE gives the right special value, incl. inf*0 = NaN */
        if (!isfinite(p))
            note_nonfinite(acc, p);
        return;
    }
    if (a == 0.0 || b == 0.0)
        return;
    acc->pending += 2;
    if (DL__UNLIKELY(acc->pending >= PENDING_MAX))
        dl__acc_normalize(acc);
    int ea, eb;
    uint64_t ma = split(a, &ea), mb = split(b, &eb);
    dl__u128 p = (dl__u128)ma * mb;
    int pos = ea + eb - DL_ACC_LSB_EXP;
    int neg = (a < 0) != (b < 0);
    add_at(acc, neg, (uint64_t)p, pos);
    uint64_t ph = (uint64_t)(p >> 64);
    if (ph)
        add_at(acc, neg, ph, pos + 64);
}

void dl_acc_add_acc(dl_acc_t *acc, const dl_acc_t *other)
{
    acc->nan |= other->nan;
    acc->pos_inf |= other->pos_inf;
    acc->neg_inf |= other->neg_inf;
    if (other->hi < other->lo)
        return;
    dl_acc_t o = *other;
    dl__acc_normalize(&o);
    if (acc->pending + 1 >= PENDING_MAX)
        dl__acc_normalize(acc);
    acc->pending++;
    for (int i = o.lo; i <= o.hi; i++)
        acc->limb[i] += o.limb[i];
    if (o.lo < acc->lo)
        acc->lo = o.lo;
    if (o.hi > acc->hi)
        acc->hi = o.hi;
}

/* Normalises a copy to sign-magnitude: limbs in [0, 2^32), returns the sign. */
static int magnitude(dl_acc_t *a)
{
    dl__acc_normalize(a);
    int top = a->hi;
    while (top >= a->lo && a->limb[top] == 0)
        top--;
    if (top < a->lo) {
        a->hi = -1;
        return 0;
    }
    a->hi = top;
    if (a->limb[top] > 0)
        return 1;
    for (int i = a->lo; i <= top; i++)
        a->limb[i] = -a->limb[i];
    dl__acc_normalize(a);
    while (a->hi >= a->lo && a->limb[a->hi] == 0)
        a->hi--;
    return -1;
}

int dl_acc_sign(const dl_acc_t *acc)
{
    if (acc->nan || (acc->pos_inf && acc->neg_inf))
        return 0;
    if (acc->pos_inf)
        return 1;
    if (acc->neg_inf)
        return -1;
    dl_acc_t a = *acc;
    return magnitude(&a);
}

double dl_acc_round(const dl_acc_t *acc, dl_dtype_t t)
{
    if (acc->nan || (acc->pos_inf && acc->neg_inf))
        return NAN;
    if (acc->pos_inf)
        return INFINITY;
    if (acc->neg_inf)
        return -INFINITY;
    dl_acc_t a = *acc;
    int sign = magnitude(&a);
    if (sign == 0)
        return 0.0;
    int j = a.hi;
    uint64_t l2 = (uint64_t)a.limb[j];
    uint64_t l1 = j - 1 >= a.lo ? (uint64_t)a.limb[j - 1] : 0;
    uint64_t l0 = j - 2 >= a.lo ? (uint64_t)a.limb[j - 2] : 0;
    dl__u128 w = ((dl__u128)l2 << 64) | ((dl__u128)l1 << 32) | l0;
    int b = 64 - __builtin_clzll(l2); /* bits in the top limb, >= 1 */
    int drop = b + 64 - 1 - 63;       /* bits of w below the 64-bit window */
    uint64_t hi = (uint64_t)(w >> drop);
    int sticky = (w & (((dl__u128)1 << drop) - 1)) != 0;
    for (int i = a.lo; !sticky && i <= j - 3; i++)
        sticky = a.limb[i] != 0;
    int exp = 32 * (j - 2) + DL_ACC_LSB_EXP + drop;
    return dl_round_parts(sign < 0, hi, exp, sticky, t);
}

double dl_dot_exact_f32(const float *a, ptrdiff_t inca, const float *b,
                        ptrdiff_t incb, size_t n, dl_dtype_t t)
{
    dl_acc_t acc;
    dl_acc_clear(&acc);
    for (size_t i = 0; i < n; i++) /* a float product is exact in binary64 */
        dl_acc_add(&acc, (double)a[(ptrdiff_t)i * inca] * (double)b[(ptrdiff_t)i * incb]);
    return dl_acc_round(&acc, t);
}

double dl_dot_exact_f64(const double *a, ptrdiff_t inca, const double *b,
                        ptrdiff_t incb, size_t n, dl_dtype_t t)
{
    dl_acc_t acc;
    dl_acc_clear(&acc);
    for (size_t i = 0; i < n; i++)
        dl_acc_add_prod(&acc, a[(ptrdiff_t)i * inca], b[(ptrdiff_t)i * incb]);
    return dl_acc_round(&acc, t);
}

/* Decides RN_t of a sum of n exact binary64 terms from its binary64 value s
 * and the binary64 sum m of their magnitudes: |s - exact| <= gamma_{n-1}
 * * sum|p|, and m underestimates sum|p| by at most the same factor, which
 * the 2^-40 inflation covers. Returns 1 and sets *r when decided. */
static int certified_sum(double s, double m, int64_t n, dl_dtype_t t, double *r)
{
    if (!isfinite(m))
        return 0;
    if (n <= 1) { /* a single term: s is exact */
        *r = dl_round(s, t);
        return 1;
    }
    double nu = (double)(n - 1) * 0x1p-53;
    return dl__certify(s, nu / (1.0 - nu) * m * (1.0 + 0x1p-40), t, r);
}

double dl__sum_exact(const double *p, int64_t n, dl_dtype_t t, int *nonfinite)
{
    double s = 0.0, m = 0.0, r;
    for (int64_t i = 0; i < n; i++) {
        s += p[i];
        m += fabs(p[i]);
    }
    if (certified_sum(s, m, n, t, &r))
        return r;
    *nonfinite |= !isfinite(m);
    dl_acc_t acc;
    dl_acc_clear(&acc);
    for (int64_t i = 0; i < n; i++)
        dl_acc_add(&acc, p[i]);
    return dl_acc_round(&acc, t);
}

double dl__dot_cert(const float *a, ptrdiff_t inca, const float *b, ptrdiff_t incb,
                    int64_t n, dl_dtype_t t, int *nonfinite)
{
    double s = 0.0, m = 0.0, r;
    for (int64_t i = 0; i < n; i++) {
        double p = (double)a[i * inca] * (double)b[i * incb]; /* exact */
        s += p;
        m += fabs(p);
    }
    if (certified_sum(s, m, n, t, &r))
        return r;
    *nonfinite |= !isfinite(m);
    return dl_dot_exact_f32(a, inca, b, incb, (size_t)n, t);
}
