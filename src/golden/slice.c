/* Writing an expert slice from arrays a distributed generator holds
 * (`mpirun dropless gen --slices`, doc/ep.md): the datasets of
 * doc/format.md "Expert slices", shaped by the same rule as the streaming
 * generator's slices (dl__golden_slice_shape) and written by the same
 * writer, so the bytes are those of `dropless gen --experts A:B`. */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "golden/golden_priv.h"

typedef struct {
    const dl_golden_file_t *g;
    int64_t n_experts, n_rows;
    char *err;
    size_t errlen;
} slice_t;

static int64_t slice_shape(void *vctx, const dl_golden_dataset_t *ds, int64_t dims[3])
{
    const slice_t *s = vctx;
    if (!s->g->has_backward && ds->group == DL_GOLDEN_BACKWARD)
        return -1;
    return dl__golden_slice_shape(ds, &s->g->config, 0, s->n_experts, s->n_rows, dims);
}

static int slice_produce(void *vctx, const dl_golden_dataset_t *ds, dl__golden_sink_t *sink)
{
    slice_t *s = vctx;
    int64_t dims[3];
    const void *p = *dl_golden_slot((dl_golden_file_t *)s->g, ds);
    if (slice_shape(s, ds, dims) < 0 || (!p && dims[0] > 0)) {
        dl__golden_msg(s->err, s->errlen, "case %s: %s: no data for the slice", s->g->case_name,
                       ds->path);
        return DL_EINVAL;
    }
    return dl__golden_sink_put(sink, 0, dims[0], p);
}

int dl_golden_write_slice(const char *path, const dl_golden_file_t *g, int64_t A, int64_t B,
                          int force, char *err, size_t errlen)
{
    if (!path || !g || !g->fwd.group_offsets)
        return DL_EINVAL;
    const int64_t E = g->config.route.experts;
    if (A < 0 || A >= B || B > E || (A == 0 && B == E)) {
        dl__golden_msg(err, errlen, "case %s: expert range %lld:%lld is not a slice of [0, %lld)",
                       g->case_name, (long long)A, (long long)B, (long long)E);
        return DL_EINVAL;
    }
    slice_t s = {g, B - A, g->fwd.group_offsets[B] - g->fwd.group_offsets[A], err, errlen};
    dl__golden_source_t src = {&s, slice_shape, slice_produce, A, B};
    return dl__golden_write_source(path, g, &src, force, NULL, NULL, err, errlen);
}
