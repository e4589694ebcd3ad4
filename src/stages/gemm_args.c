/* Argument checks shared by the grouped GEMMs (gemm.c) and their
 * references (gemm_ref.c): a leaf, so neither calls into the other. */
#include "config.h"
#include <stdlib.h>
#include <stdint.h>
#include "stages/stages_priv.h"

int dl__gemm_check_offsets(const int64_t *offsets, int64_t E)
{
    if (!offsets || E < 1 || offsets[0] != 0)
        return DL_EINVAL;
    for (int64_t e = 0; e < E; e++)
        if (offsets[e + 1] < offsets[e])
            return DL_EINVAL;
    return 0;
}

static int add_size(int64_t a, int64_t b, int64_t *r)
{
    if (a > INT64_MAX - b)
        return DL_EOVERFLOW;
    *r = a + b;
    return 0;
}

int dl__gemm_check_grouped(const dl_gemm_term_t *terms, int nterms, int64_t N,
                           const int64_t *offsets, int64_t E, const float *out,
                           int64_t *ks_out, int64_t *io_out)
{
    if (!terms || nterms < 1 || N < 0 || E < 1 || !offsets)
        return DL_EINVAL;
    int rc = dl__gemm_check_offsets(offsets, E);
    if (rc)
        return rc;
    int64_t M = offsets[E], ks = 0, io = 0, x;
    for (int t = 0; t < nterms; t++) {
        int64_t K = terms[t].K;
        if (K < 0 || (terms[t].layout != DL_RHS_KN && terms[t].layout != DL_RHS_NK))
            return DL_EINVAL;
        if ((rc = add_size(ks, K, &ks)))
            return rc;
        if ((rc = dl_mul_size(M, K, &x)) || (rc = add_size(io, x, &io)))
            return rc;
        if ((rc = dl_mul_size(E, K, &x)) || (rc = dl_mul_size(x, N, &x)) ||
            (rc = add_size(io, x, &io)))
            return rc;
        if (K > 0 && M > 0 && N > 0 && (!terms[t].lhs || !terms[t].rhs))
            return DL_EINVAL;
    }
    if ((rc = dl_mul_size(M, N, &x)) || (rc = add_size(io, x, &io)) ||
        (rc = dl_mul_size(io, 8, &x)))
        return rc;
    if (!out && M > 0 && N > 0)
        return DL_EINVAL;
    if (ks_out)
        *ks_out = ks;
    if (io_out)
        *io_out = io * 4;
    return 0;
}

int dl__gemm_check_ragged(const float *a, int64_t I, const float *b, int64_t J,
                          const int64_t *offsets, int64_t E, const float *out,
                          int64_t *io_out)
{
    if (I < 0 || J < 0 || E < 1 || !offsets)
        return DL_EINVAL;
    int rc = dl__gemm_check_offsets(offsets, E);
    if (rc)
        return rc;
    int64_t M = offsets[E], x, y, io;
    if ((rc = dl_mul_size(M, I, &x)) || (rc = dl_mul_size(M, J, &y)) ||
        (rc = add_size(x, y, &io)))
        return rc;
    if ((rc = dl_mul_size(E, I, &x)) || (rc = dl_mul_size(x, J, &x)) ||
        (rc = add_size(io, x, &io)) || (rc = dl_mul_size(io, 8, &x)))
        return rc;
    if ((!out && x > 0) || (M > 0 && ((!a && I > 0) || (!b && J > 0))))
        return DL_EINVAL;
    if (io_out)
        *io_out = io * 4;
    return 0;
}

float *dl__ones(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int64_t i = 0; p && i < n; i++)
        p[i] = 1.0f;
    return p;
}
