/* `mpirun -np R dropless gen CASE`: the distributed generator (doc/ep.md),
 * the schedule's per-rank placement (dropless/schedule.h). Rank r owns
 * experts [r*E/R, (r+1)*E/R) and, as a source, tokens [floor(r*T/R),
 * floor((r+1)*T/R)). The schedule's TOKENS producers run at the sources on
 * their tokens, its EXPERTS producers at the expert ranks on their sorted
 * rows; before anything leaves the sources, their routing is shared and
 * the layout (dl_ep_layout of the gathered topk_ids) says which rows go
 * where: MPI_Alltoallv sends one copy of each token's row to each rank
 * holding one of its experts (the DISPATCH producer, x_sorted), and a
 * sorted-row value computed in one space and read in the other goes by
 * its slots (y_sorted back for the combine; d_y_sorted out and d_x_sorted
 * back in the backward pass). Every value is exact and rounded once, so
 * which process computes a row cannot change its bits. Rank 0 gathers the
 * values by the table, runs what needs every token at once (the ALL
 * producers: the sort, the router weight's gradient) and writes the file
 * with dl_golden_write: the bytes of `dropless gen`. Only this file knows
 * MPI; built without it, running under mpirun with more than one process
 * is refused rather than have R processes write one file. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "dropless.h"
#include "cli.h"

int dl_cli_mpi_size(void)
{
    /* Open MPI's launcher, then the PMI ones (MPICH, Slurm) */
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *s = getenv(vars[i]);
        if (s && atoi(s) > 1)
            return atoi(s);
    }
    return 1;
}

#ifndef DL_HAVE_MPI

int dl_cli_gen_mpi_begin(int *rank)
{
    *rank = 0;
    fprintf(stderr, "dropless gen: running as one of %d MPI processes, but this dropless was "
                    "built without MPI (configure --with-mpi; Debian: libopenmpi-dev): refusing, "
                    "rather than have every process write the same file\n", dl_cli_mpi_size());
    return DL_EXIT_USAGE;
}

int dl_cli_gen_mpi(const dl_case_t *c, const char *path, const char *slice_dir,
                   const dl_golden_gen_opts_t *go, char *written, size_t n)
{
    (void)c, (void)path, (void)slice_dir, (void)go, (void)written, (void)n;
    return DL_EXIT_USAGE;
}

void dl_cli_gen_mpi_end(void) {}

int dl_cli_gen_mpi_agree(int status)
{
    return status;
}

#else
#include <mpi.h>

int dl_cli_gen_mpi_begin(int *rank)
{
    int provided;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dropless gen: MPI_Init failed\n");
        return DL_EXIT_FAIL;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    return 0;
}

void dl_cli_gen_mpi_end(void)
{
    MPI_Finalize();
}

/* The early validation (gen.c checks every case and reserves every output
 * before the first): the worst status of all ranks, on every rank. */
int dl_cli_gen_mpi_agree(int status)
{
    int worst = status;
    MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}


/* One rank's state, in two spaces of the schedule's arrays: "src" holds
 * this rank's tokens as a source (Ts of them; its sorted-row arrays are
 * the returned slots, Ts*k rows, inv mapping slot -> row), "exp" its
 * experts' sorted rows (Mr of them, groups loff) and weight slabs (per). */
typedef struct {
    MPI_Comm comm;
    int me, R, planned;
    const dl_case_t *c;
    int64_t T, d, f, E, k, per, tb, te, Ts, n_in, Mr;
    dl_golden_inputs_t in;       /* x, router weight, bias, d_out (all tokens) */
    float *w[3];                 /* this rank's experts' w_gate, w_up, w_down */
    dl_ep_layout_t L;            /* the whole layout */
    int32_t *ids;                /* [T, k] all tokens' routing (gathered) */
    float *wts;
    dl_moe_forward_t sf, ef;     /* the values, by space */
    dl_moe_backward_t sb, eb;
    int32_t *inv;                /* src: [Ts*k] slot -> row of the returned buffer */
    int64_t *loff;               /* exp: [per+1] local group offsets */
    int32_t *slot;               /* exp: [n_in*k] sorted row of each received slot, -1 */
    int *tc, *td, *trc, *trd;    /* token rows: send/recv counts and displacements */
    int *sc, *sd, *src_, *srd;   /* slot rows expert -> source: send, and as a source receive */
    dl_tier_stats_t stats;
    double t[5];                 /* DROPLESS_MPI_STATS: ends of draw, route, forward, backward */
} run_t;

#define ALLOC(p, n) ((p) = calloc((n) > 0 ? (size_t)(n) : 1, sizeof *(p)))

static void fail_all(const run_t *x, const char *what, int rc)
{
    fprintf(stderr, "dropless gen: rank %d: case %s: %s: %s\n", x->me, x->c->name, what,
            dl_strerror(rc));
    MPI_Abort(x->comm, DL_EXIT_FAIL);
}

#define TRY(what, expr)                    \
    do {                                   \
        int rc_ = (expr);                  \
        if (rc_)                           \
            fail_all(x, (what), rc_);      \
    } while (0)

/* rows of cols floats (or int32) between all ranks */
static void a2a(run_t *x, const void *s, const int *sc, const int *sd, void *r, const int *rc,
                const int *rd, int64_t cols, MPI_Datatype base)
{
    MPI_Datatype row;
    MPI_Type_contiguous((int)cols, base, &row);
    MPI_Type_commit(&row);
    MPI_Alltoallv(s, sc, sd, row, r, rc, rd, row, x->comm);
    MPI_Type_free(&row);
}

/* rows of every rank, in rank order, into r on rank 0 */
static void gather(run_t *x, const void *s, int64_t rows, int64_t cols, MPI_Datatype base, void *r)
{
    int n = (int)rows, *cnt = NULL, *dis = NULL;
    if (x->me == 0 && (!ALLOC(cnt, x->R) || !ALLOC(dis, x->R)))
        fail_all(x, "gathering", DL_ENOMEM);
    MPI_Gather(&n, 1, MPI_INT, cnt, 1, MPI_INT, 0, x->comm);
    for (int i = 1; x->me == 0 && i < x->R; i++)
        dis[i] = dis[i - 1] + cnt[i - 1];
    MPI_Datatype row;
    MPI_Type_contiguous(cols > 0 ? (int)cols : 1, base, &row);
    MPI_Type_commit(&row);
    MPI_Gatherv(s, cols > 0 ? n : 0, row, r, cnt, dis, row, 0, x->comm);
    MPI_Type_free(&row);
    free(cnt);
    free(dis);
}

static int on_rank(const run_t *x, int64_t t, int64_t j, int64_t r)
{
    return x->ids[t * x->k + j] / x->per == r;
}

/* Everyone's ids and weights (the sources routed their tokens), then the
 * layout. */
static void share_routing(run_t *x)
{
    int *cnt = NULL, *dis = NULL;
    if (!ALLOC(x->ids, x->T * x->k) || !ALLOC(x->wts, x->T * x->k) || !ALLOC(cnt, x->R) ||
        !ALLOC(dis, x->R))
        fail_all(x, "routing", DL_ENOMEM);
    for (int s = 0; s < x->R; s++) {
        int64_t b, e;
        dl_ep_source_range(x->T, x->R, s, &b, &e);
        cnt[s] = (int)((e - b) * x->k);
        dis[s] = (int)(b * x->k);
    }
    MPI_Allgatherv(x->sf.topk_ids, cnt[x->me], MPI_INT32_T, x->ids, cnt, dis, MPI_INT32_T, x->comm);
    MPI_Allgatherv(x->sf.topk_weights, cnt[x->me], MPI_FLOAT, x->wts, cnt, dis, MPI_FLOAT, x->comm);
    free(cnt);
    free(dis);
    TRY("layout", dl_ep_layout(x->ids, x->wts, x->T, x->k, x->E, x->R, &x->L));
}

/* The exchange plans: token rows (the layout's send_counts and
 * displacements) and slot rows (send_expert_counts summed over a rank's
 * experts); this rank's received rows and where their slots sort. */
static void plan(run_t *x)
{
    const int R = x->R, me = x->me;
    const dl_ep_layout_t *L = &x->L;
    if (!ALLOC(x->tc, R) || !ALLOC(x->td, R) || !ALLOC(x->trc, R) || !ALLOC(x->trd, R) ||
        !ALLOC(x->sc, R) || !ALLOC(x->sd, R) || !ALLOC(x->src_, R) || !ALLOC(x->srd, R))
        fail_all(x, "planning", DL_ENOMEM);
    for (int r = 0; r < R; r++) {
        x->tc[r] = (int)L->send_counts[me * R + r];
        x->td[r] = (int)L->send_displs[me * R + r];
        x->trc[r] = (int)L->send_counts[r * R + me];
        x->trd[r] = (int)L->recv_displs[me * R + r];
        for (int64_t e = 0; e < x->per; e++) {
            x->sc[r] += (int)L->send_expert_counts[r * x->E + me * x->per + e];
            x->src_[r] += (int)L->send_expert_counts[me * x->E + r * x->per + e];
        }
        x->sd[r] = r ? x->sd[r - 1] + x->sc[r - 1] : 0;
        x->srd[r] = r ? x->srd[r - 1] + x->src_[r - 1] : 0;
    }
    x->n_in = L->num_tokens_per_rank[me];
    if (!ALLOC(x->loff, x->per + 1) || !ALLOC(x->slot, x->n_in * x->k) || !ALLOC(x->inv, x->Ts * x->k))
        fail_all(x, "planning", DL_ENOMEM);
    for (int64_t e = 0; e < x->per; e++)
        x->loff[e + 1] = x->loff[e] + L->num_tokens_per_expert[me * x->per + e];
    x->Mr = x->loff[x->per];
    /* received rows ascend in token id, so each expert's rows do too: the
     * single process's sorted order within the expert */
    int64_t *cur = malloc((size_t)x->per * sizeof *cur);
    if (!cur)
        fail_all(x, "planning", DL_ENOMEM);
    memcpy(cur, x->loff, (size_t)x->per * sizeof *cur);
    const int32_t *idx = L->recv_topk_idx + L->recv_offsets[me] * x->k;
    for (int64_t q = 0; q < x->n_in * x->k; q++)
        x->slot[q] = idx[q] >= 0 ? (int32_t)cur[idx[q]]++ : -1;
    free(cur);
    /* as a source: the rows coming back, by rank, then token, then slot */
    int64_t p = 0;
    for (int r = 0; r < R; r++)
        for (int64_t t = x->tb; t < x->te; t++)
            for (int64_t j = 0; L->is_token_in_rank[t * R + r] && j < x->k; j++)
                if (on_rank(x, t, j, r))
                    x->inv[(t - x->tb) * x->k + j] = (int32_t)p++;
}

/* Token rows of a [T, d] array of this source to their ranks; received
 * rows (n_in of them) put at their slots' sorted rows of out [Mr, d]. */
static void dispatch_rows(run_t *x, const float *a, float *out)
{
    float *sb, *rb;
    int64_t nsend = 0;
    for (int r = 0; r < x->R; r++)
        nsend += x->tc[r];
    if (!ALLOC(sb, nsend * x->d) || !ALLOC(rb, x->n_in * x->d))
        fail_all(x, "dispatch", DL_ENOMEM);
    int64_t q = 0;
    for (int r = 0; r < x->R; r++)
        for (int64_t t = x->tb; t < x->te; t++)
            if (x->L.is_token_in_rank[t * x->R + r])
                memcpy(sb + q++ * x->d, a + t * x->d, (size_t)x->d * sizeof(float));
    a2a(x, sb, x->tc, x->td, rb, x->trc, x->trd, x->d, MPI_FLOAT);
    for (int64_t i = 0; i < x->n_in; i++)
        for (int64_t j = 0; j < x->k; j++)
            if (x->slot[i * x->k + j] >= 0)
                memcpy(out + x->slot[i * x->k + j] * x->d, rb + i * x->d,
                       (size_t)x->d * sizeof(float));
    free(sb);
    free(rb);
}

/* Slot rows of cols floats between the experts' sorted rows (ex [Mr, cols])
 * and the sources' returned buffers (ret [Ts*k, cols]): back = expert ->
 * source. */
static void slot_rows(run_t *x, float *ex, float *ret, int64_t cols, int back)
{
    float *buf;
    if (!ALLOC(buf, x->Mr * cols))
        fail_all(x, "exchanging rows", DL_ENOMEM);
    int64_t q = 0;
    const size_t row = (size_t)cols * sizeof(float);
    for (int64_t s = 0; back && s < x->n_in * x->k; s++)
        if (x->slot[s] >= 0)
            memcpy(buf + q++ * cols, ex + x->slot[s] * cols, row);
    if (back)
        a2a(x, buf, x->sc, x->sd, ret, x->src_, x->srd, cols, MPI_FLOAT);
    else
        a2a(x, ret, x->src_, x->srd, buf, x->sc, x->sd, cols, MPI_FLOAT);
    for (int64_t s = 0; !back && s < x->n_in * x->k; s++)
        if (x->slot[s] >= 0)
            memcpy(ex + x->slot[s] * cols, buf + q++ * cols, row);
    free(buf);
}

/* ------------------------------------------- the schedule's placement */

/* A sorted-row array of rank 2 ("M?"), an expert array ("E??" slabs,
 * "E?" the expert biases and their gradients): this rank's experts'. */
static int rows_array(const dl_layout_row_t *r)
{
    return r->dims[0] == 'M' && r->dims[1];
}

static int slab(const dl_layout_row_t *r)
{
    return r->dims[0] == 'E' && r->dims[1];
}

/* This rank's experts' rows of the expert biases (ffn_bias; else NULL). */
static void own_biases(const run_t *x, dl_moe_inputs_t *in)
{
    const int64_t e0 = x->me * x->per;
    in->b_gate = in->b_gate ? in->b_gate + e0 * x->f : NULL;
    in->b_up = in->b_up ? in->b_up + e0 * x->f : NULL;
    in->b_down = in->b_down ? in->b_down + e0 * x->d : NULL;
}

static void **at(run_t *x, int r, int exp)
{
    return dl_layout_slot(dl_layout_row(r), NULL, exp ? &x->ef : &x->sf, exp ? &x->eb : &x->sb);
}

/* Row r's length in a space: tokens, returned slots or sorted rows, experts. */
static int64_t first_dim(const run_t *x, const dl_layout_row_t *row, int exp)
{
    return row->dims[0] == 'T' ? x->Ts : row->dims[0] == 'E' ? x->per
           : row->dims[0] == 'M' ? (exp ? x->Mr : x->Ts * x->k) : -1;
}

/* Row r's array in a space, allocated (zeroed) when not there. */
static void *have(run_t *x, int r, int exp)
{
    void **p = at(x, r, exp);
    const dl_layout_row_t *row = dl_layout_row(r);
    int64_t n = dl_layout_numel_rows(row, &x->c->config, first_dim(x, row, exp));
    if (!*p && !(*p = calloc(n > 0 ? (size_t)n : 1, row->store == DL_STORE_I64 ? 8 : 4)))
        fail_all(x, "allocating", DL_ENOMEM);
    return *p;
}

/* Row r's sorted rows in space exp, moved from the other space when they
 * were computed there (every rank takes the same steps: the exchange is
 * collective). */
static void need(run_t *x, int r, int exp)
{
    const dl_layout_row_t *row = dl_layout_row(r);
    if (!rows_array(row) || *at(x, r, exp) || !*at(x, r, !exp))
        return;
    const int64_t cols = dl_layout_numel_rows(row, &x->c->config, 1);
    if (exp)
        slot_rows(x, have(x, r, 1), *at(x, r, 0), cols, 0);
    else
        slot_rows(x, *at(x, r, 1), have(x, r, 0), cols, 1);
}

/* Where each producer runs: TOKENS at the sources on their tokens, EXPERTS
 * at the expert ranks on their rows; DISPATCH is the exchange of token rows;
 * ALL waits for rank 0 (assemble). Before anything leaves the sources, the
 * routing is shared and the exchanges planned. */
static int bind(void *ctx, int i, int w, dl_stage_view_t *v)
{
    run_t *x = ctx;
    const dl_producer_t *p = dl_schedule_producer(i);
    if (w > 0)
        return DL_SCHEDULE_END;
    if (p->span != DL_SPAN_TOKENS && !x->planned) {
        share_routing(x);
        plan(x);
        x->planned = 1;
        x->t[1] = MPI_Wtime();
    }
    const int exp = p->span == DL_SPAN_EXPERTS;
    const dl_rowset_t reads = dl_schedule_reads(p, &x->c->config);
    for (int r = 0; r < dl_layout_count(); r++) {
        if (p->span == DL_SPAN_DISPATCH && DL_ROWSET_HAS(p->writes, r))
            dispatch_rows(x, x->in.x, have(x, r, 1));
        else if (p->span != DL_SPAN_ALL && p->span != DL_SPAN_DISPATCH && DL_ROWSET_HAS(reads, r))
            need(x, r, exp);
    }
    if (p->span == DL_SPAN_ALL || p->span == DL_SPAN_DISPATCH)
        return DL_SCHEDULE_SKIP;
    for (int r = 0; r < dl_layout_count(); r++)
        if (DL_ROWSET_HAS(p->writes, r) && dl_cond_applies(dl_layout_row(r)->cond, &x->c->config))
            have(x, r, exp);
    *v = (dl_stage_view_t){.c = x->c->config, .in = dl_golden_inputs_view(&x->in),
                           .f = exp ? x->ef : x->sf, .b = exp ? x->eb : x->sb, .stats = &x->stats};
    if (exp) {
        v->in.w_gate = x->w[0], v->in.w_up = x->w[1], v->in.w_down = x->w[2];
        own_biases(x, &v->in);
        v->rows = x->Mr, v->off = v->f.group_offsets = x->loff, v->ne = x->per;
    } else {
        v->c.tokens = x->Ts, v->rows = x->Ts * x->k, v->f.inv_perm = x->inv;
        v->in.x += x->tb * x->d;
        v->in.token_ids = v->in.token_ids ? v->in.token_ids + x->tb : NULL; /* hash routing */
        v->in.d_out = v->in.d_out ? v->in.d_out + x->tb * x->d : NULL;
    }
    return 0;
}

static const dl_placement_t placement = {bind, NULL};

/* Whether each row was computed here: its producer ran in the passes. */
static int computed(const run_t *x, int r, int passes, int *span)
{
    const dl_layout_row_t *row = dl_layout_row(r);
    const dl_producer_t *p = dl_schedule_producer(dl_schedule_writer(r));
    if (!p || !((passes >> p->backward) & 1) || !dl_cond_applies(p->cond, &x->c->config) ||
        !dl_cond_applies(row->cond, &x->c->config))
        return 0;
    *span = p->span;
    return 1;
}

static MPI_Datatype mpi_type(const dl_layout_row_t *row)
{
    return row->store == DL_STORE_I32 ? MPI_INT32_T : MPI_FLOAT;
}

/* Row r's whole array in g (rank 0 of the file, or every rank's slice). */
static void *whole(run_t *x, dl_golden_file_t *g, int r)
{
    const dl_golden_dataset_t *ds = dl_golden_dataset(r);
    int64_t dims[3];
    int64_t n = ds ? dl_golden_dataset_shape(ds, &g->config, dims) : -1;
    void **slot = ds ? dl_golden_slot(g, ds) : NULL;
    if (!slot || n < 0 || !(*slot = calloc(n > 0 ? (size_t)n : 1, ds->elem == DL_GOLDEN_INT64 ? 8 : 4)))
        fail_all(x, "assembling the file", DL_ENOMEM);
    return *slot;
}

/* The ALL producers of the passes on g's whole arrays (rank 0, or a slice:
 * those that need no expert's rows), their outputs allocated in g. */
static void run_all(run_t *x, dl_golden_file_t *g, int passes, dl_rowset_t skip)
{
    for (int i = 0; i < dl_schedule_count(); i++) {
        const dl_producer_t *p = dl_schedule_producer(i);
        if (p->span != DL_SPAN_ALL || !((passes >> p->backward) & 1) ||
            !dl_cond_applies(p->cond, &g->config) || (p->writes & skip))
            continue;
        for (int r = 0; r < dl_layout_count(); r++)
            if (DL_ROWSET_HAS(p->writes, r))
                whole(x, g, r);
        dl_stage_view_t v = {.c = g->config, .in = dl_golden_inputs_view(&g->in), .f = g->fwd,
                             .b = g->bwd, .rows = x->T * x->k, .off = g->fwd.group_offsets,
                             .ne = x->E, .stats = &x->stats};
        TRY(p->name, dl_schedule_run(i, &v));
    }
}

/* Every value to rank 0 (tokens' rows by source, sorted rows and expert
 * slabs by expert rank, each in rank order: the layer's order), which then
 * runs what needs all tokens at once: the sort, the router weight's
 * gradient. */
static void assemble(run_t *x, dl_golden_file_t *g, int passes)
{
    for (int r = 0; r < dl_layout_count(); r++) {
        const dl_layout_row_t *row = dl_layout_row(r);
        int span, exp = rows_array(row) || slab(row);
        if (row->group == DL_LAYOUT_INPUTS || !computed(x, r, passes, &span) || span == DL_SPAN_ALL)
            continue;
        if (exp)
            need(x, r, 1);
        gather(x, *at(x, r, exp), first_dim(x, row, exp),
               dl_layout_numel_rows(row, &x->c->config, 1), mpi_type(row),
               x->me == 0 ? whole(x, g, r) : NULL);
    }
    if (x->me == 0)
        run_all(x, g, passes, 0);
}

/* Rank 0's file: the header, the inputs whole, the gathered values. */
static void header(const run_t *x, dl_golden_file_t *g, const dl_golden_gen_opts_t *go)
{
    memset(g, 0, sizeof *g);
    dl_golden_header(x->c, g);
    g->has_inputs = g->has_forward = 1;
    g->has_backward = !go->no_backward;
}

static int write_file(run_t *x, const char *path, const dl_golden_gen_opts_t *go)
{
    dl_golden_file_t g;
    memset(&g, 0, sizeof g);
    if (x->me == 0) {
        header(x, &g, go);
        TRY("drawing the inputs", dl_case_inputs(x->c, &g.in));
    }
    assemble(x, &g, DL_SCHEDULE_FORWARD | (go->no_backward ? 0 : DL_SCHEDULE_BACKWARD));
    int rc = 0;
    char err[512] = "";
    if (x->me == 0) {
        if (go->n_ep_ranks > 0)
            rc = dl_golden_add_ep_layouts(&g, go, err, sizeof err);
        if (!rc)
            rc = dl_golden_write(path, &g, go->force, NULL, NULL, err, sizeof err);
        if (rc)
            fprintf(stderr, "dropless gen: %s\n", err[0] ? err : dl_strerror(rc));
        dl_golden_free(&g);
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, x->comm);
    return rc;
}


/* rows of every rank, in rank order, into r on every rank */
static void allgather(run_t *x, const void *s, int64_t rows, int64_t cols, MPI_Datatype base,
                      void *r)
{
    int n = (int)rows, *cnt, *dis;
    if (!ALLOC(cnt, x->R) || !ALLOC(dis, x->R))
        fail_all(x, "gathering", DL_ENOMEM);
    MPI_Allgather(&n, 1, MPI_INT, cnt, 1, MPI_INT, x->comm);
    for (int i = 1; i < x->R; i++)
        dis[i] = dis[i - 1] + cnt[i - 1];
    MPI_Datatype row;
    MPI_Type_contiguous(cols > 0 ? (int)cols : 1, base, &row);
    MPI_Type_commit(&row);
    MPI_Allgatherv(s, cols > 0 ? n : 0, row, r, cnt, dis, row, x->comm);
    MPI_Type_free(&row);
    free(cnt);
    free(dis);
}

/* This rank's expert slice, written by itself: the whole routing (the
 * per-token values gathered, the sort run on them), its experts' weights,
 * rows and gradients as computed; nothing goes to rank 0. */
static int write_slice(run_t *x, const char *path, const dl_golden_gen_opts_t *go)
{
    const int passes = DL_SCHEDULE_FORWARD | (go->no_backward ? 0 : DL_SCHEDULE_BACKWARD);
    const dl_rowset_t out = dl_schedule_needs_experts(&x->c->config);
    dl_rowset_t mine = 0; /* the arrays g owns */
    dl_golden_file_t g;
    header(x, &g, go);
    g.in = x->in;
    g.in.w_gate = x->w[0], g.in.w_up = x->w[1], g.in.w_down = x->w[2];
    g.in.b_gate = x->in.b_gate ? x->in.b_gate + x->me * x->per * x->f : NULL;
    g.in.b_up = x->in.b_up ? x->in.b_up + x->me * x->per * x->f : NULL;
    g.in.b_down = x->in.b_down ? x->in.b_down + x->me * x->per * x->d : NULL;
    for (int r = 0; r < dl_layout_count(); r++) {
        const dl_layout_row_t *row = dl_layout_row(r);
        int span;
        if (row->group == DL_LAYOUT_INPUTS || !computed(x, r, passes, &span) ||
            span == DL_SPAN_ALL || DL_ROWSET_HAS(out, r))
            continue;
        if (rows_array(row) || slab(row)) {
            need(x, r, 1);
            *dl_golden_slot(&g, dl_golden_dataset(r)) = *at(x, r, 1);
        } else {
            allgather(x, *at(x, r, 0), x->Ts, dl_layout_numel_rows(row, &x->c->config, 1),
                      mpi_type(row), whole(x, &g, r));
            mine |= DL_ROWSET_BIT(r);
        }
    }
    for (int i = 0; i < dl_schedule_count(); i++)
        if (dl_schedule_producer(i)->span == DL_SPAN_ALL && !(dl_schedule_producer(i)->writes & out))
            mine |= dl_schedule_producer(i)->writes;
    run_all(x, &g, passes, out);
    char err[512] = "";
    int rc = go->n_ep_ranks > 0 ? dl_golden_add_ep_layouts(&g, go, err, sizeof err) : 0;
    if (!rc)
        rc = dl_golden_write_slice(path, &g, x->me * x->per, (x->me + 1) * x->per, go->force, err,
                                   sizeof err);
    if (rc)
        fprintf(stderr, "dropless gen: rank %d: %s\n", x->me, err[0] ? err : dl_strerror(rc));
    for (int r = 0; r < dl_layout_count(); r++)
        if (DL_ROWSET_HAS(mine, r))
            free(*dl_golden_slot(&g, dl_golden_dataset(r)));
    for (int i = 0; i < g.n_ep; i++)
        dl_ep_layout_free(&g.ep[i]);
    int worst = rc ? 1 : 0, any;
    MPI_Allreduce(&worst, &any, 1, MPI_INT, MPI_MAX, x->comm);
    return rc ? rc : any ? DL_EIO : 0;
}

static void run_free(run_t *x)
{
    dl_golden_inputs_free(&x->in);
    dl_moe_forward_free(&x->sf);
    dl_moe_forward_free(&x->ef);
    dl_moe_backward_free(&x->sb);
    dl_moe_backward_free(&x->eb);
    dl_ep_layout_free(&x->L);
    void *p[] = {x->w[0], x->w[1], x->w[2], x->ids, x->wts, x->inv, x->loff, x->slot, x->tc,
                 x->td, x->trc, x->trd, x->sc, x->sd, x->src_, x->srd};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
}

/* What every rank can refuse alike before any exchange; rank 0 says why. */
static int refuse(const run_t *x, const char *path, int slices, const dl_golden_gen_opts_t *go)
{
    char err[512] = "";
    int rc = 0;
    const dl_moe_config_t *k = &x->c->config;
    if (dl_moe_config_validate(k))
        snprintf(err, sizeof err, "case %s: invalid configuration", x->c->name), rc = 1;
    else if (k->route.experts % x->R)
        snprintf(err, sizeof err, "case %s: mpirun -np %d: the process count must divide the %lld "
                 "experts (each rank owns E/R of them)", x->c->name, x->R,
                 (long long)k->route.experts), rc = 1;
    else if (k->route.weight_on_input) /* the exchange moves x's rows, not the scaled ones */
        snprintf(err, sizeof err, "case %s: weight_on_input (the score scales the expert's "
                 "input) is not supported under mpirun; run dropless gen without it",
                 x->c->name), rc = 1;
    else if (k->route.zero_experts > 0) /* the identity tail lives on no expert rank */
        snprintf(err, sizeof err, "case %s: zero_experts (identity experts) are not supported "
                 "under mpirun; run dropless gen without it", x->c->name), rc = 1;
    else if (go->expert_end > 0)
        snprintf(err, sizeof err, "--experts is not supported under mpirun (each rank computes "
                 "its experts; --slices writes each rank's slice)"), rc = 1;
    else if ((slices || x->me == 0) && dl_golden_check_output(path, go->force, err, sizeof err))
        rc = 1; /* with slices, every rank its own file */
    int any = rc;
    MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, x->comm);
    if (rc && (slices || x->me == 0))
        fprintf(stderr, "dropless gen: %s\n", err);
    return any ? DL_EXIT_USAGE : 0;
}

int dl_cli_gen_mpi(const dl_case_t *c, const char *path, const char *slice_dir,
                   const dl_golden_gen_opts_t *go, char *written, size_t n)
{
    run_t xx, *x = &xx;
    memset(x, 0, sizeof *x);
    x->comm = MPI_COMM_WORLD;
    MPI_Comm_rank(x->comm, &x->me);
    MPI_Comm_size(x->comm, &x->R);
    x->c = c;
    const int64_t E = c->config.route.experts, per = x->R > 0 ? E / x->R : 0;
    if (slice_dir)
        snprintf(written, n, "%s/%s.experts-%lld-%lld.h5", slice_dir, c->name,
                 (long long)(x->me * per), (long long)((x->me + 1) * per));
    else
        snprintf(written, n, "%s", path);
    int rc = refuse(x, written, slice_dir != NULL, go);
    if (rc)
        return rc;
    const double t0 = MPI_Wtime();
    const dl_moe_config_t *k = &c->config;
    x->T = k->tokens, x->d = k->hidden, x->f = k->ffn, x->E = k->route.experts;
    x->k = k->route.top_k, x->per = x->E / x->R;
    static const char *const wname[3] = {"w_gate", "w_up", "w_down"};
    dl_ep_source_range(x->T, x->R, x->me, &x->tb, &x->te);
    x->Ts = x->te - x->tb;
    TRY("drawing the inputs", dl_case_inputs_tokens(c, &x->in));
    const int64_t df = x->d * x->f;
    for (int i = 0; i < 3; i++) {
        if (!dl_cond_applies(dl_layout_find(wname[i])->cond, k))
            continue; /* no w_gate without a gate, no w_up in a plain FFN */
        if (!ALLOC(x->w[i], x->per * df))
            fail_all(x, "expert weights", DL_ENOMEM);
        for (int64_t e = 0; e < x->per; e++)
            TRY("expert weights", dl_case_expert_weight(c, i, x->me * x->per + e, x->w[i] + e * df));
    }
    x->t[0] = MPI_Wtime();
    TRY("forward pass", dl_schedule_exec(k, DL_SCHEDULE_FORWARD, NULL, -1, &placement, x));
    x->t[2] = MPI_Wtime();
    if (!go->no_backward)
        TRY("backward pass", dl_schedule_exec(k, DL_SCHEDULE_BACKWARD, NULL, -1, &placement, x));
    x->t[3] = MPI_Wtime();
    rc = slice_dir ? write_slice(x, written, go) : write_file(x, path, go);
    x->t[4] = MPI_Wtime();
    if (getenv("DROPLESS_MPI_STATS")) {
        /* per-rank figures for doc/ep.md's scaling model */
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        fprintf(stderr, "dropless gen: rank %d of %d: %.3f s (draw %.3f, route %.3f, forward %.3f, "
                "backward %.3f, gather+write %.3f), max RSS %ld KiB, %lld tokens in, %lld sorted "
                "rows, %lld experts\n", x->me, x->R, x->t[4] - t0, x->t[0] - t0, x->t[1] - x->t[0],
                x->t[2] - x->t[1], x->t[3] - x->t[2], x->t[4] - x->t[3], ru.ru_maxrss,
                (long long)x->n_in, (long long)x->Mr, (long long)x->per);
    }
    run_free(x);
    return rc ? (rc == DL_EEXIST || rc == DL_EINVAL ? DL_EXIT_USAGE : DL_EXIT_FAIL) : 0;
}
#endif
