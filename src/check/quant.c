/* Checks of quantized bytes and scales against a declared rule, and of a
 * block-scaled GEMM's output under an accumulation profile
 * (dropless/quantcheck.h, doc/lowprecision.md). Every exact value is a
 * call to the stages (dl_quantize, dl_gemm_block_scaled); what this file
 * adds is the comparison, the naming of the rule a candidate follows, and
 * the tolerance of each profile. */
#include "config.h"
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check/check_priv.h"
#include "dropless/quantcheck.h"

static const struct { const char *name, *what; } VARIANTS[] = {
#define DL__QV_ROW(E, name, what) {name, what},
    DL_QVARIANT_MAP(DL__QV_ROW)
#undef DL__QV_ROW
};
static const struct { const char *name, *what; } DEFECTS[] = {
#define DL__QD_ROW(E, name, what) {name, what},
    DL_QDEFECT_MAP(DL__QD_ROW)
#undef DL__QD_ROW
};

const char *dl_qvariant_name(int v) { return v >= 0 && v < DL_QV_N ? VARIANTS[v].name : NULL; }
const char *dl_qvariant_what(int v) { return v >= 0 && v < DL_QV_N ? VARIANTS[v].what : NULL; }
const char *dl_qdefect_name(int d) { return d >= 0 && d < DL_QD_N ? DEFECTS[d].name : NULL; }
const char *dl_qdefect_what(int d) { return d >= 0 && d < DL_QD_N ? DEFECTS[d].what : NULL; }

/* The declared rule d changed into variant v; 0 if v does not apply or
 * changes nothing. Power-of-two scale variants apply to fp32 and UE8M0
 * scale storage (a power of two is an fp32 value too), never to E4M3. */
static int variant_rule(const dl_qrule_t *d, int v, dl_qrule_t *o)
{
    *o = *d;
    int pow2 = d->scale != DL_QSCALE_E4M3;
    switch ((dl_qvariant_t)v) {
    case DL_QV_DIV32:
        o->flags |= DL_QF_DIV32;
        if (dl_quant_rule_check(o, -1))
            return 0;
        break;
    case DL_QV_TIES_AWAY: o->eround = DL_QR_AWAY; break;
    case DL_QV_TIES_ZERO: o->eround = DL_QR_TIEZERO; break;
    case DL_QV_TOWARD_ZERO: o->eround = DL_QR_ZERO; break;
    case DL_QV_RECIP: o->flags |= DL_QF_RECIP; break;
    case DL_QV_MULAMAX:
        o->flags |= DL_QF_MULAMAX;
        if (dl_quant_rule_check(o, -1))
            return 0;
        break;
    case DL_QV_NOSAT:
        if (d->elem == DL_Q_E2M1)
            return 0;
        o->flags |= DL_QF_NOSAT;
        break;
    case DL_QV_POW2_AFTER:
        o->flags |= DL_QF_POW2_AFTER;
        o->srule = DL_QS_CEIL;
        break;
    case DL_QV_UE8M0_FLOOR: o->srule = DL_QS_FLOOR; break;
    case DL_QV_UE8M0_CEIL: o->srule = DL_QS_CEIL; break;
    case DL_QV_OCP_MX: o->srule = DL_QS_MX; break;
    case DL_QV_LOG2_FLOAT: o->srule = DL_QS_LOG2; break;
    case DL_QV_LOG2_PLUS1: o->srule = DL_QS_LOG2P1; break;
    default: return 0;
    }
    if (v >= DL_QV_POW2_AFTER && !pow2)
        return 0;
    return o->eround != d->eround || o->flags != d->flags || o->srule != d->srule;
}

typedef struct {
    int64_t ed, sd, fe[2], fb[2];
    unsigned cc, wc;
    double cs, ws;
    int nan_elems;
} diff_t;

static int differ(double c, double w) { return c != w && !(isnan(c) && isnan(w)); }

/* Element and scale differences of cand from want over x's blocks. */
static void compare(const dl_qmat_t *want, const dl_qmat_t *cand, const float *x, diff_t *d)
{
    const dl_qrule_t *r = want->rule;
    int64_t rows = want->rows, cols = want->cols;
    memset(d, 0, sizeof *d);
    d->fe[0] = d->fe[1] = d->fb[0] = d->fb[1] = -1;
    for (int64_t bi = 0; bi * r->br < rows; bi++)
        for (int64_t bj = 0; bj * r->bc < cols; bj++) {
            int zero = 1;
            for (int64_t i = bi * r->br; i < rows && i < (bi + 1) * r->br; i++)
                for (int64_t j = bj * r->bc; j < cols && j < (bj + 1) * r->bc; j++) {
                    unsigned c = dl_quant_code(cand, i, j), w = dl_quant_code(want, i, j);
                    zero &= x[i * cols + j] == 0.0f;
                    if (c == w)
                        continue;
                    d->nan_elems |= isnan(dl_qdecode(c, r->elem)) && !isnan(dl_qdecode(w, r->elem));
                    if (d->ed++ == 0) {
                        d->fe[0] = i, d->fe[1] = j, d->cc = c, d->wc = w;
                    }
                }
            double cs = dl_quant_scale(cand, bi, bj), ws = dl_quant_scale(want, bi, bj);
            if (zero ? isnan(cs) : differ(cs, ws))
                if (d->sd++ == 0) {
                    d->fb[0] = bi, d->fb[1] = bj, d->cs = cs, d->ws = ws;
                }
        }
}

/* x quantized under rule r into fresh buffers *q and *s (the caller frees
 * both, also on an error); 0 or the quantizer's error. */
static int requant(const dl_qrule_t *r, const float *x, int64_t rows, int64_t cols, uint8_t **q,
                   uint8_t **s)
{
    int64_t qb = dl_quant_qbytes(r, rows, cols), sb = dl_quant_sbytes(r, rows, cols);
    *q = calloc((size_t)(qb ? qb : 1), 1);
    *s = calloc((size_t)(sb ? sb : 1), 1);
    return *q && *s ? dl_quantize(r, x, rows, cols, *q, *s) : DL_ENOMEM;
}

/* Counts the differences of cand from x quantized under rule r. */
static int diff_under(const dl_qrule_t *r, const float *x, int64_t rows, int64_t cols,
                      const dl_qmat_t *cand, diff_t *d)
{
    uint8_t *q, *s;
    int rc = requant(r, x, rows, cols, &q, &s);
    if (!rc) {
        dl_qmat_t w = {r, rows, cols, q, s}, c = *cand;
        c.rule = r;
        compare(&w, &c, x, d);
    }
    free(q);
    free(s);
    return rc;
}

/* A defect of the layout that explains the differences d (or -1). */
static int find_defect(const dl_qrule_t *r, const float *x, int64_t rows, int64_t cols,
                       const dl_qmat_t *cand, const diff_t *d)
{
    int64_t qb = dl_quant_qbytes(r, rows, cols), sb = dl_quant_sbytes(r, rows, cols);
    uint8_t *q, *s;
    int found = -1;
    if (requant(r, x, rows, cols, &q, &s))
        goto done;
    if (r->elem == DL_Q_E2M1 && d->ed) { /* swapped nibbles: swap them back */
        uint8_t *sw = malloc((size_t)(qb ? qb : 1));
        if (sw) {
            for (int64_t i = 0; i < qb; i++)
                sw[i] = (uint8_t)(cand->q[i] << 4 | cand->q[i] >> 4);
            found = memcmp(sw, q, (size_t)qb) == 0 ? DL_QD_NIBBLES : -1;
            free(sw);
        }
    }
    int64_t ncb = (cols + r->bc - 1) / r->bc, nrb = (rows + r->br - 1) / r->br;
    dl_qmat_t w = {r, rows, cols, q, s}, c = *cand;
    c.rule = r;
    if (found < 0 && d->sd && ncb > 1) { /* every scale one block along K away */
        int64_t same[2] = {0, 0}, n = 0;
        for (int64_t bi = 0; bi < nrb; bi++)
            for (int64_t bj = 1; bj + 1 < ncb; bj++, n++) {
                double cs = dl_quant_scale(&c, bi, bj);
                same[0] += !differ(cs, dl_quant_scale(&w, bi, bj - 1));
                same[1] += !differ(cs, dl_quant_scale(&w, bi, bj + 1));
            }
        if (n && (same[0] == n || same[1] == n))
            found = DL_QD_SHIFTED;
    }
    if (found < 0 && d->sd && (r->flags & DL_QF_PACKED)) { /* bytes: candidate superset */
        int leak = 1;
        for (int64_t i = 0; i < sb; i++) {
            uint8_t cb = ((const uint8_t *)cand->s)[i];
            leak &= (cb & s[i]) == s[i];
        }
        found = leak ? DL_QD_LEAKED : -1;
    }
    if (found < 0 && d->nan_elems)
        found = DL_QD_NAN;
done:
    free(q);
    free(s);
    return found;
}

int dl_qcheck(const dl_qrule_t *r, const float *x, int64_t rows, int64_t cols,
              const dl_qmat_t *cand, dl_qcheck_t *res)
{
    if (!res || !cand || !cand->q || !cand->s || !x || dl_quant_rule_check(r, cols) ||
        rows < 0 || cols < 0)
        return DL_EINVAL;
    memset(res, 0, sizeof *res);
    diff_t d;
    int rc = diff_under(r, x, rows, cols, cand, &d);
    if (rc)
        return rc;
    res->elements = rows * cols;
    res->blocks = ((rows + r->br - 1) / r->br) * ((cols + r->bc - 1) / r->bc);
    res->elem_diff = d.ed, res->scale_diff = d.sd;
    memcpy(res->first_elem, d.fe, sizeof d.fe);
    memcpy(res->first_block, d.fb, sizeof d.fb);
    res->cand_code = d.cc, res->want_code = d.wc, res->cand_scale = d.cs, res->want_scale = d.ws;
    res->variant = res->defect = -1;
    res->conformant = res->elements > 0 && d.ed == 0 && d.sd == 0;
    if (res->conformant || res->elements == 0)
        return 0;
    for (int v = 0; v < DL_QV_N && res->variant < 0; v++) {
        dl_qrule_t vr;
        diff_t dv;
        if (!variant_rule(r, v, &vr))
            continue;
        if ((rc = diff_under(&vr, x, rows, cols, cand, &dv)))
            return rc;
        if (dv.ed == 0 && dv.sd == 0)
            res->variant = v;
    }
    if (res->variant < 0)
        res->defect = find_defect(r, x, rows, cols, cand, &d);
    return 0;
}

int dl_qcheck_format(const dl_qcheck_t *res, char *buf, size_t len)
{
    if (!res || !buf)
        return DL_EINVAL;
    if (res->conformant) {
        snprintf(buf, len, "CONFORMANT: %" PRId64 " elements and %" PRId64
                 " scales bit-identical to the declared rule", res->elements, res->blocks);
        return 0;
    }
    if (res->elements == 0) {
        snprintf(buf, len, "NOT CONFORMANT: nothing checked (no elements)");
        return 0;
    }
    char why[256];
    if (res->variant >= 0)
        snprintf(why, sizeof why, "follows rule %s (%s)", VARIANTS[res->variant].name,
                 VARIANTS[res->variant].what);
    else if (res->defect >= 0)
        snprintf(why, sizeof why, "defect %s (%s)", DEFECTS[res->defect].name,
                 DEFECTS[res->defect].what);
    else
        snprintf(why, sizeof why, "follows no named rule");
    snprintf(buf, len, "NOT CONFORMANT: %s; %" PRId64 " of %" PRId64 " elements, %" PRId64
             " of %" PRId64 " scales differ from the declared rule; first element (%" PRId64
             ", %" PRId64 ") code 0x%02x, declared 0x%02x; first scale (%" PRId64 ", %" PRId64
             ") %a, declared %a", why, res->elem_diff, res->elements, res->scale_diff,
             res->blocks, res->first_elem[0], res->first_elem[1], res->cand_code, res->want_code,
             res->first_block[0], res->first_block[1], res->cand_scale, res->want_scale);
    return 0;
}

/* ------------------------------------------------------------ the GEMM check */

#define HOPPER_NC 128      /* products between promotions (DeepSeek-V3 §3.3) */
#define HOPPER_ULP 0x1p-12 /* 2 ulps of a 14-bit accumulator, relative */

static double gamma_n(double n, double u) { return n * u / (1.0 - n * u); }

/* Rows r0..r1 of m dequantized into d (doubles, exact). */
static void dequant_rows(const dl_qmat_t *m, int64_t r0, int64_t r1, double *d)
{
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j = 0; j < m->cols; j++)
            d[(i - r0) * m->cols + j] = dl_dequant(m, i, j);
}

/* The accumulation error bound of one output under profile p, from the
 * products of rows a and b (doubles) of length K; the K-block length bk. */
static double acc_bound(const double *a, const double *b, int64_t K, int64_t bk, dl_qacc_t p)
{
    double M = 0.0, hop = 0.0, s = 0.0;
    for (int64_t k = 0; k < K; k++) {
        double q = a[k] * b[k];
        if (k % HOPPER_NC == 0)
            s = 0.0;
        hop += HOPPER_ULP * fmax(fabs(s), fabs(q));
        s += q;
        M += fabs(q);
    }
    M *= 1.0 + (double)(K + 2) * 0x1p-52; /* M itself was summed in binary64 */
    double nkb = (double)((K + bk - 1) / bk);
    if (p == DL_QACC_FP32)
        return gamma_n((double)bk + 2.0 + nkb, 0x1p-24) * M;
    double nint = (double)((K + HOPPER_NC - 1) / HOPPER_NC);
    /* 2^-4: the computed partial sums stay within 128 2^-12 = 2^-5 of the exact ones */
    return hop * (1.0 + 0x1p-4) + gamma_n(nint + 2.0, 0x1p-24) * M;
}

typedef struct {
    int64_t failed, at;
    double ratio, cand, want, tol;
} row_res_t;

/* Checks one output row m (of expert e) and fills *rr. */
static void check_row(const double *da, const double *db, int64_t K, int64_t N, int64_t bk,
                      dl_qacc_t p, dl_dtype_t t, const float *want, const float *cand,
                      row_res_t *rr)
{
    double u = dl_dtype_unit_roundoff(t);
    memset(rr, 0, sizeof *rr);
    rr->at = -1;
    for (int64_t n = 0; n < N; n++) {
        double w = want[n], c = cand[n], tol = 0.0, ratio;
        if (p != DL_QACC_EXACT) {
            double acc = acc_bound(da, db + n * K, K, bk, p);
            tol = acc * (1.0 + u) + 2.0 * u * (fabs(w) + acc) * (1.0 + 4.0 * u);
        }
        int fail;
        if (isnan(w) || isinf(w))
            fail = !(isnan(w) && isnan(c)) && w != c;
        else if (!isfinite(c))
            fail = 1;
        else if (p == DL_QACC_EXACT)
            fail = memcmp(&want[n], &cand[n], sizeof(float)) != 0;
        else
            fail = fabs(c - w) > tol;
        double d = fabs(c - w);
        ratio = fail && !(d <= tol) ? INFINITY : tol > 0 ? d / tol : 0.0;
        if (fail && isfinite(d) && tol > 0)
            ratio = d / tol;
        rr->failed += fail;
        if (rr->at < 0 || ratio > rr->ratio) {
            rr->ratio = ratio;
            rr->at = n, rr->cand = c, rr->want = w, rr->tol = tol;
        }
    }
}

int dl_qcheck_gemm(const dl_qmat_t *a, const dl_qmat_t *b, int64_t E, const int64_t *offsets,
                   dl_dtype_t out_t, dl_qacc_t p, const float *cand, dl_qgemm_check_t *res)
{
    if (!res || !cand || (unsigned)p > DL_QACC_HOPPER)
        return DL_EINVAL;
    memset(res, 0, sizeof *res);
    res->first[0] = res->first[1] = -1;
    int64_t M = a ? a->rows : 0, N = b ? b->rows : 0, K = a ? a->cols : 0;
    float *want = malloc((size_t)(M * N + 1) * sizeof(float));
    double *da = malloc((size_t)(M * K + 1) * sizeof(double));
    double *db = malloc((size_t)(N * K + 1) * sizeof(double));
    row_res_t *rr = calloc((size_t)(M ? M : 1), sizeof *rr);
    int rc = want && da && db && rr ? dl_gemm_block_scaled(a, b, E, offsets, out_t, want, NULL)
                                    : DL_ENOMEM;
    if (rc)
        goto done;
    dequant_rows(a, 0, M, da);
    int64_t bk = a->rule && a->rule->bc < b->rule->bc ? a->rule->bc : b->rule->bc;
    int64_t qb = dl_quant_qbytes(b->rule, N, K), sb = dl_quant_sbytes(b->rule, N, K);
    for (int64_t e = 0; e < E; e++) {
        if (offsets[e + 1] == offsets[e])
            continue;
        dl_qmat_t be = *b;
        be.q = b->q + e * qb;
        be.s = (const uint8_t *)b->s + e * sb;
        dequant_rows(&be, 0, N, db);
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t m = offsets[e]; m < offsets[e + 1]; m++)
            check_row(da + m * K, db, K, N, bk, p, out_t, want + m * N, cand + m * N, &rr[m]);
    }
    res->checked = M * N;
    for (int64_t m = 0; m < M; m++) { /* fixed order: the same report for any threads */
        res->failed += rr[m].failed;
        if (rr[m].at >= 0 && (res->first[0] < 0 || rr[m].ratio > res->worst_ratio)) {
            res->worst_ratio = rr[m].ratio;
            res->first[0] = m, res->first[1] = rr[m].at;
            res->cand = rr[m].cand, res->want = rr[m].want, res->tol = rr[m].tol;
        }
    }
done:
    free(want);
    free(da);
    free(db);
    free(rr);
    return rc;
}
