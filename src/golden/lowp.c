/* Golden files of the block-scaled grouped GEMM (dropless/qgolden.h): the
 * inputs from the golden PRNG, quantized by dl_quantize, the output from
 * dl_gemm_block_scaled, written with the golden format's byte-stable HDF5
 * settings (no times, fixed library-version bounds, contiguous layout). */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hdf5.h>
#include "golden/golden_priv.h"
#include "dropless/qgolden.h"

#define QG_E 4
static const int64_t QG_OFFSETS[QG_E + 1] = {0, 20, 20, 45, 64};

enum { SIGNED, SAME_SIGN };
static const struct {
    const char *name, *ra, *rb;
    int64_t N, K;
    int same_sign;
} FAMILIES[] = {
#define DL__QG_ROW(nm, a, b, n, k, in) {nm, a, b, n, k, in},
    DL_QGOLDEN_MAP(DL__QG_ROW)
#undef DL__QG_ROW
};
#define NFAM ((int)(sizeof FAMILIES / sizeof *FAMILIES))

const char *dl_qgolden_family(int i) { return i >= 0 && i < NFAM ? FAMILIES[i].name : NULL; }

typedef struct {
    dl_qrule_t ra, rb;
    int64_t QG_N, QG_K; /* the family's shape */
    int a_quant, same_sign;
    float *x, *w, *out;
    uint8_t *aq, *as, *bq, *bs;
    int64_t aqb, asb, bqb, bsb; /* bytes: a's, and one expert's of b */
} qg_t;

static void qg_free(qg_t *g)
{
    free(g->x), free(g->w), free(g->out), free(g->aq), free(g->as), free(g->bq), free(g->bs);
}

/* bf16 inputs: normals, a spread of magnitudes over rows (activations) and
 * output channels (weights), an outlier every 97 elements. */
static void qg_inputs(qg_t *g, uint64_t seed, int64_t M)
{
    int64_t QG_N = g->QG_N, QG_K = g->QG_K;
    for (int64_t i = 0; i < M * QG_K; i++) {
        double v = dl_golden_rng_normal(seed, 1, (uint64_t)i) * (double)(1 << (i / QG_K % 4));
        v = g->same_sign ? fabs(v) : v;
        g->x[i] = (float)dl_round(i % 97 == 5 ? 24.0 * v : v, DL_BF16);
    }
    for (int64_t i = 0; i < QG_E * QG_N * QG_K; i++) {
        double v = dl_golden_rng_normal(seed, 2, (uint64_t)i) * 0.02 * (1.0 + (double)(i / QG_K % 7));
        v = g->same_sign ? fabs(v) : v;
        g->w[i] = (float)dl_round(v, DL_BF16);
    }
}

/* Quantizes the inputs and computes the output. */
static int qg_compute(qg_t *g, int64_t M)
{
    int64_t QG_N = g->QG_N, QG_K = g->QG_K;
    int rc = 0;
    if (g->a_quant) {
        if (g->ra.scale == DL_QSCALE_E4M3)
            g->ra.global = dl_nvfp4_global(g->x, M * QG_K);
        g->aqb = dl_quant_qbytes(&g->ra, M, QG_K), g->asb = dl_quant_sbytes(&g->ra, M, QG_K);
        g->aq = calloc((size_t)g->aqb, 1), g->as = calloc((size_t)g->asb, 1);
        if (!g->aq || !g->as)
            return DL_ENOMEM;
        rc = dl_quantize(&g->ra, g->x, M, QG_K, g->aq, g->as);
    }
    if (g->rb.scale == DL_QSCALE_E4M3)
        g->rb.global = dl_nvfp4_global(g->w, QG_E * QG_N * QG_K);
    g->bqb = dl_quant_qbytes(&g->rb, QG_N, QG_K), g->bsb = dl_quant_sbytes(&g->rb, QG_N, QG_K);
    g->bq = calloc((size_t)(QG_E * g->bqb), 1), g->bs = calloc((size_t)(QG_E * g->bsb), 1);
    if (!g->bq || !g->bs)
        return DL_ENOMEM;
    for (int64_t e = 0; e < QG_E && !rc; e++)
        rc = dl_quantize(&g->rb, g->w + e * QG_N * QG_K, QG_N, QG_K, g->bq + e * g->bqb,
                         g->bs + e * g->bsb);
    if (rc)
        return rc;
    dl_qmat_t a = {g->a_quant ? &g->ra : NULL, M, QG_K, g->aq, g->a_quant ? (void *)g->as : (void *)g->x};
    dl_qmat_t b = {&g->rb, QG_N, QG_K, g->bq, g->bs};
    return dl_gemm_block_scaled(&a, &b, QG_E, QG_OFFSETS, DL_BF16, g->out, NULL);
}

static int put(hid_t grp, hid_t dcpl, const char *name, hid_t type, int rank, const hsize_t *dims,
               const void *data)
{
    hid_t sp = H5Screate_simple(rank, dims, NULL), d = -1;
    int bad = sp < 0;
    if (!bad)
        bad = (d = H5Dcreate2(grp, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT)) < 0 ||
              H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0;
    if (d >= 0)
        bad |= H5Dclose(d) < 0;
    if (sp >= 0)
        bad |= H5Sclose(sp) < 0;
    return bad;
}

static int put_attr(hid_t obj, const char *name, const char *s, double v)
{
    hid_t t = s ? H5Tcopy(H5T_C_S1) : H5Tcopy(H5T_NATIVE_DOUBLE), sp = H5Screate(H5S_SCALAR), a = -1;
    int bad = t < 0 || sp < 0 || (s && H5Tset_size(t, strlen(s) + 1) < 0);
    if (!bad)
        bad = (a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
              H5Awrite(a, t, s ? (const void *)s : (const void *)&v) < 0;
    if (a >= 0)
        bad |= H5Aclose(a) < 0;
    if (sp >= 0)
        bad |= H5Sclose(sp) < 0;
    if (t >= 0)
        bad |= H5Tclose(t) < 0;
    return bad;
}

/* The datasets and attributes of /lowp. */
static int qg_put_all(hid_t grp, hid_t dcpl, const qg_t *g, int f, int64_t M, uint64_t seed)
{
    hsize_t QG_N = (hsize_t)g->QG_N, QG_K = (hsize_t)g->QG_K;
    hsize_t dx[2] = {(hsize_t)M, QG_K}, dw[3] = {QG_E, QG_N, QG_K}, de[1] = {QG_E + 1},
            dout[2] = {(hsize_t)M, QG_N}, dab[1] = {(hsize_t)g->aqb}, das[1] = {(hsize_t)g->asb},
            dbb[1] = {(hsize_t)(QG_E * g->bqb)}, dbs[1] = {(hsize_t)(QG_E * g->bsb)};
    int bad = put(grp, dcpl, "x", H5T_NATIVE_FLOAT, 2, dx, g->x) ||
              put(grp, dcpl, "w", H5T_NATIVE_FLOAT, 3, dw, g->w) ||
              put(grp, dcpl, "offsets", H5T_NATIVE_INT64, 1, de, QG_OFFSETS) ||
              put(grp, dcpl, "b_q", H5T_NATIVE_UINT8, 1, dbb, g->bq) ||
              put(grp, dcpl, "b_s", H5T_NATIVE_UINT8, 1, dbs, g->bs) ||
              put(grp, dcpl, "out", H5T_NATIVE_FLOAT, 2, dout, g->out);
    if (!bad && g->a_quant)
        bad = put(grp, dcpl, "a_q", H5T_NATIVE_UINT8, 1, dab, g->aq) ||
              put(grp, dcpl, "a_s", H5T_NATIVE_UINT8, 1, das, g->as);
    return bad || put_attr(grp, "family", FAMILIES[f].name, 0) ||
           put_attr(grp, "a_recipe", FAMILIES[f].ra ? FAMILIES[f].ra : "bf16", 0) ||
           put_attr(grp, "b_recipe", FAMILIES[f].rb, 0) || put_attr(grp, "out_dtype", "bf16", 0) ||
           put_attr(grp, "seed", NULL, (double)seed) || put_attr(grp, "a_global", NULL, g->ra.global) ||
           put_attr(grp, "b_global", NULL, g->rb.global) ||
           put_attr(grp, "inputs", FAMILIES[f].same_sign ? "same-sign" : "signed", 0) ||
           put_attr(grp, "format", "dropless-lowp 1", 0);
}

static int qg_h5(const char *tmp, const qg_t *g, int f, int64_t M, uint64_t seed)
{
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS),
          gcpl = H5Pcreate(H5P_GROUP_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE), file = -1, grp = -1;
    int bad = fcpl < 0 || fapl < 0 || gcpl < 0 || dcpl < 0 || H5Pset_obj_track_times(fcpl, 0) < 0 ||
              H5Pset_libver_bounds(fapl, H5F_LIBVER_EARLIEST, H5F_LIBVER_V18) < 0 ||
              H5Pset_obj_track_times(gcpl, 0) < 0 || H5Pset_obj_track_times(dcpl, 0) < 0 ||
              H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0;
    if (!bad)
        bad = (file = H5Fcreate(tmp, H5F_ACC_TRUNC, fcpl, fapl)) < 0 ||
              (grp = H5Gcreate2(file, "lowp", H5P_DEFAULT, gcpl, H5P_DEFAULT)) < 0 ||
              qg_put_all(grp, dcpl, g, f, M, seed);
    if (grp >= 0)
        bad |= H5Gclose(grp) < 0;
    if (file >= 0)
        bad |= H5Fclose(file) < 0;
    hid_t pl[4] = {fcpl, fapl, gcpl, dcpl};
    for (int i = 0; i < 4; i++)
        if (pl[i] >= 0)
            H5Pclose(pl[i]);
    return bad ? DL_EIO : 0;
}

int dl_qgolden_write(const char *family, const char *path, uint64_t seed, int force, char *err,
                     size_t errlen)
{
    int f = 0;
    while (f < NFAM && (!family || strcmp(family, FAMILIES[f].name)))
        f++;
    if (f == NFAM) {
        dl__golden_msg(err, errlen, "%s: no low-precision family of that name", family ? family : "(null)");
        return DL_ENOTFOUND;
    }
    int64_t M = QG_OFFSETS[QG_E];
    qg_t g = {0};
    int64_t QG_N = FAMILIES[f].N, QG_K = FAMILIES[f].K;
    g.QG_N = QG_N, g.QG_K = QG_K, g.same_sign = FAMILIES[f].same_sign;
    g.a_quant = FAMILIES[f].ra != NULL;
    if ((g.a_quant && dl_quant_recipe(FAMILIES[f].ra, &g.ra)) || dl_quant_recipe(FAMILIES[f].rb, &g.rb))
        return DL_EINTERNAL;
    g.x = malloc((size_t)(M * QG_K) * sizeof(float));
    g.w = malloc((size_t)(QG_E * QG_N * QG_K) * sizeof(float));
    g.out = malloc((size_t)(M * QG_N) * sizeof(float));
    int rc = g.x && g.w && g.out ? 0 : DL_ENOMEM;
    if (!rc) {
        qg_inputs(&g, seed, M);
        rc = qg_compute(&g, M);
    }
    dl__outfile_t o;
    if (!rc && !(rc = dl__out_begin(&o, path, force, err, errlen))) {
        dl__h5_quiet_t q;
        dl__h5_quiet_on(&q);
        rc = qg_h5(o.tmp, &g, f, M, seed);
        dl__h5_quiet_off(&q);
        if (rc) {
            dl__golden_msg(err, errlen, "%s: HDF5 error writing the low-precision golden", path);
            dl__out_abort(&o);
        } else {
            rc = dl__out_commit(&o, force, err, errlen);
        }
    } else if (rc && rc != DL_EEXIST && rc != DL_EIO && rc != DL_EINVAL) {
        dl__golden_msg(err, errlen, "%s: %s", family, dl_strerror(rc));
    }
    qg_free(&g);
    return rc;
}
