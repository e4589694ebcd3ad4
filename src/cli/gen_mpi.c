/* `mpirun -np R dropless gen CASE`: the distributed generator (doc/ep.md).
 * Rank r owns experts [r*E/R, (r+1)*E/R) and, as a source, tokens
 * [floor(r*T/R), floor((r+1)*T/R)). Each source routes its tokens; the
 * layout (dl_ep_layout of the gathered topk_ids) says which rows go where;
 * MPI_Alltoallv sends one copy of each token's row to each rank holding
 * one of its experts; the expert ranks run the expert stages on their
 * sorted rows (the same stage calls as the single process: every value is
 * exact and rounded once, so which process computes a row cannot change
 * its bits); the rows go back for the combine and, in the backward pass,
 * the same ways again. Rank 0 gathers the values and writes the file with
 * dl_golden_write: the bytes of `dropless gen`. Only this file knows MPI;
 * built without it, running under mpirun with more than one process is
 * refused rather than have R processes write one file. */
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


/* One rank's state. "src" arrays are this rank's tokens as a source (Ts
 * of them), "exp" arrays its experts' sorted rows (Mr of them). */
typedef struct {
    MPI_Comm comm;
    int me, R;
    const dl_case_t *c;
    int64_t T, d, f, E, k, per, tb, te, Ts, n_in, Mr;
    int swiglu;
    dl_dtype_t dt;
    dl_golden_inputs_t in;       /* x, router weight, bias, d_out (all tokens) */
    float *w[3];                 /* this rank's experts' w_gate, w_up, w_down */
    dl_ep_layout_t L;            /* the whole layout */
    int32_t *ids;                /* [T, k] all tokens' routing (gathered) */
    float *wts;
    dl_moe_forward_t fs;         /* src: router values of its tokens */
    dl_moe_backward_t bs;        /* src: d_topk_weights, router gradients, d_x */
    int32_t *inv;                /* src: [Ts*k] slot -> row of the returned buffer */
    float *y_ret, *dy_ret, *dxs_ret; /* src: [Ts*k, d] returned rows */
    int64_t *loff;               /* exp: [per+1] local group offsets */
    int32_t *slot;               /* exp: [n_in*k] sorted row of each received slot, -1 */
    float *xs, *hg, *hu, *ha, *ys, *dys, *dha, *dhg, *dhu, *dxs; /* exp: [Mr, .] */
    float *dw[3];                /* exp: [per, ., .] weight gradients */
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

/* Routing of this rank's tokens (dl_moe_route on them alone: each token's
 * routing is its own), then everyone's ids and weights, then the layout. */
static void route(run_t *x)
{
    dl_moe_config_t sub = x->c->config;
    sub.tokens = x->Ts;
    dl_moe_forward_t *f = &x->fs;
    if (!ALLOC(f->router_logits, x->Ts * x->E) || !ALLOC(f->router_scores, x->Ts * x->E) ||
        !ALLOC(f->topk_ids, x->Ts * x->k) || !ALLOC(f->topk_weights, x->Ts * x->k) ||
        !ALLOC(f->tie_margin, x->Ts) || !ALLOC(x->ids, x->T * x->k) || !ALLOC(x->wts, x->T * x->k))
        fail_all(x, "routing", DL_ENOMEM);
    dl_moe_inputs_t v = dl_golden_inputs_view(&x->in);
    v.x += x->tb * x->d;
    TRY("routing", dl_moe_route(&sub, &v, f));
    int *cnt, *dis;
    if (!ALLOC(cnt, x->R) || !ALLOC(dis, x->R))
        fail_all(x, "routing", DL_ENOMEM);
    for (int s = 0; s < x->R; s++) {
        int64_t b, e;
        dl_ep_source_range(x->T, x->R, s, &b, &e);
        cnt[s] = (int)((e - b) * x->k);
        dis[s] = (int)(b * x->k);
    }
    MPI_Allgatherv(f->topk_ids, cnt[x->me], MPI_INT32_T, x->ids, cnt, dis, MPI_INT32_T, x->comm);
    MPI_Allgatherv(f->topk_weights, cnt[x->me], MPI_FLOAT, x->wts, cnt, dis, MPI_FLOAT, x->comm);
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

/* Slot rows between the experts' sorted rows (ex [Mr, d]) and the sources'
 * returned buffers (ret [Ts*k, d]): back = expert -> source. */
static void slot_rows(run_t *x, float *ex, float *ret, int back)
{
    float *buf;
    if (!ALLOC(buf, x->Mr * x->d))
        fail_all(x, "exchanging rows", DL_ENOMEM);
    int64_t q = 0;
    const size_t row = (size_t)x->d * sizeof(float);
    for (int64_t s = 0; back && s < x->n_in * x->k; s++)
        if (x->slot[s] >= 0)
            memcpy(buf + q++ * x->d, ex + x->slot[s] * x->d, row);
    if (back)
        a2a(x, buf, x->sc, x->sd, ret, x->src_, x->srd, x->d, MPI_FLOAT);
    else
        a2a(x, ret, x->src_, x->srd, buf, x->sc, x->sd, x->d, MPI_FLOAT);
    for (int64_t s = 0; !back && s < x->n_in * x->k; s++)
        if (x->slot[s] >= 0)
            memcpy(ex + x->slot[s] * x->d, buf + q++ * x->d, row);
    free(buf);
}

static void grouped(run_t *x, const dl_gemm_term_t *t, int nt, int64_t N, float **out)
{
    if (!ALLOC(*out, x->Mr * N))
        fail_all(x, "expert GEMM", DL_ENOMEM);
    TRY("expert GEMM", dl_gemm_grouped(t, nt, N, x->loff, x->per, x->dt, *out, &x->stats));
}

static void ragged(run_t *x, const float *a, int64_t I, const float *b, int64_t J, float **out)
{
    if (!ALLOC(*out, x->per * I * J))
        fail_all(x, "weight gradient", DL_ENOMEM);
    TRY("weight gradient", dl_gemm_ragged_k(a, I, b, J, x->loff, x->per, DL_F32, *out, &x->stats));
}

/* The experts' forward stages on this rank's sorted rows, then the
 * combine at the sources. */
static void forward(run_t *x)
{
    const int64_t d = x->d, ff = x->f;
    if (!ALLOC(x->xs, x->Mr * d))
        fail_all(x, "dispatch", DL_ENOMEM);
    dispatch_rows(x, x->in.x, x->xs);
    if (x->swiglu) {
        dl_gemm_term_t g = {x->xs, d, x->w[0], DL_RHS_KN}, u = {x->xs, d, x->w[1], DL_RHS_KN};
        grouped(x, &g, 1, ff, &x->hg);
        grouped(x, &u, 1, ff, &x->hu);
        if (!ALLOC(x->ha, x->Mr * ff))
            fail_all(x, "SwiGLU", DL_ENOMEM);
        TRY("SwiGLU", dl_swiglu(x->hg, x->hu, x->Mr * ff, x->dt, x->ha));
    }
    dl_gemm_term_t dn = x->swiglu ? (dl_gemm_term_t){x->ha, ff, x->w[2], DL_RHS_KN}
                                  : (dl_gemm_term_t){x->xs, d, x->w[2], DL_RHS_KN};
    grouped(x, &dn, 1, d, &x->ys);
    if (!ALLOC(x->y_ret, x->Ts * x->k * d) || !ALLOC(x->fs.out, x->Ts * d))
        fail_all(x, "combine", DL_ENOMEM);
    slot_rows(x, x->ys, x->y_ret, 1);
    TRY("combine", dl_combine(x->y_ret, x->fs.topk_weights, x->inv, x->Ts, x->k, d, x->dt,
                              x->fs.out));
}

/* The combine's gradient at the sources, the experts' backward stages,
 * the router's and the input's gradient at the sources again. */
static void backward(run_t *x)
{
    const int64_t d = x->d, ff = x->f, Ts = x->Ts, k = x->k;
    dl_moe_backward_t *b = &x->bs;
    if (!ALLOC(b->d_topk_weights, Ts * k) || !ALLOC(x->dy_ret, Ts * k * d) ||
        !ALLOC(x->dys, x->Mr * d) || !ALLOC(x->dxs_ret, Ts * k * d))
        fail_all(x, "backward", DL_ENOMEM);
    TRY("combine backward", dl_combine_backward(x->in.d_out + x->tb * d, x->y_ret,
                                                x->fs.topk_weights, x->inv, Ts, k, d, x->dt,
                                                b->d_topk_weights, x->dy_ret));
    slot_rows(x, x->dys, x->dy_ret, 0);
    if (x->swiglu) {
        dl_gemm_term_t t = {x->dys, d, x->w[2], DL_RHS_NK};
        grouped(x, &t, 1, ff, &x->dha);
        ragged(x, x->ha, ff, x->dys, d, &x->dw[2]);
        if (!ALLOC(x->dhg, x->Mr * ff) || !ALLOC(x->dhu, x->Mr * ff))
            fail_all(x, "SwiGLU backward", DL_ENOMEM);
        TRY("SwiGLU backward", dl_swiglu_backward(x->hg, x->hu, x->dha, x->Mr * ff, x->dt, x->dhg,
                                                  x->dhu));
        dl_gemm_term_t two[2] = {{x->dhg, ff, x->w[0], DL_RHS_NK}, {x->dhu, ff, x->w[1], DL_RHS_NK}};
        grouped(x, two, 2, d, &x->dxs);
        ragged(x, x->xs, d, x->dhg, ff, &x->dw[0]);
        ragged(x, x->xs, d, x->dhu, ff, &x->dw[1]);
    } else {
        dl_gemm_term_t t = {x->dys, d, x->w[2], DL_RHS_NK};
        grouped(x, &t, 1, d, &x->dxs);
        ragged(x, x->xs, d, x->dys, d, &x->dw[2]);
    }
    slot_rows(x, x->dxs, x->dxs_ret, 1);
    dl_moe_config_t sub = x->c->config;
    sub.tokens = Ts;
    dl_moe_forward_t f = x->fs;
    f.inv_perm = x->inv;
    b->d_x_sorted = x->dxs_ret;
    if (!ALLOC(b->d_router_scores, Ts * x->E) || !ALLOC(b->d_router_logits, Ts * x->E) ||
        !ALLOC(b->d_router_weight, d * x->E) || !ALLOC(b->d_x, Ts * d))
        fail_all(x, "router backward", DL_ENOMEM);
    dl_moe_inputs_t v = dl_golden_inputs_view(&x->in);
    v.x += x->tb * d;
    /* its d_router_weight sums this rank's tokens only: rank 0 sums all */
    TRY("router backward", dl_moe_route_backward(&sub, &v, &f, b));
    b->d_x_sorted = NULL;
}

/* The arrays of the whole file on rank 0 (NULL elsewhere): values of
 * table dims "T.." by source, "M.." and "E.." by expert rank. */
static void *whole(run_t *x, dl_golden_file_t *g, const char *name)
{
    if (x->me != 0)
        return NULL;
    char path[64];
    snprintf(path, sizeof path, "/%s/%s", strncmp(name, "d_", 2) ? "forward" : "backward", name);
    const dl_golden_dataset_t *ds = dl_golden_dataset_find(path);
    int64_t dims[3];
    int64_t n = ds ? dl_golden_dataset_shape(ds, &g->config, dims) : -1;
    void **slot = ds ? dl_golden_slot(g, ds) : NULL;
    if (!slot || n < 0 || !(*slot = calloc(n > 0 ? (size_t)n : 1, ds->elem == DL_GOLDEN_INT64 ? 8 : 4)))
        fail_all(x, "assembling the file", DL_ENOMEM);
    return *slot;
}

#define GATHER(arr, rows, cols, type, name) gather(x, (arr), (rows), (cols), (type), whole(x, g, (name)))

/* Every value to rank 0, which adds what needs all tokens at once: the
 * sort (dl_sort_assignments) and the router weight's gradient. */
static void assemble(run_t *x, dl_golden_file_t *g, int backward_too)
{
    const int64_t d = x->d, ff = x->f, E = x->E, k = x->k;
    GATHER(x->fs.router_logits, x->Ts, E, MPI_FLOAT, "router_logits");
    GATHER(x->fs.router_scores, x->Ts, E, MPI_FLOAT, "router_scores");
    GATHER(x->fs.topk_ids, x->Ts, k, MPI_INT32_T, "topk_ids");
    GATHER(x->fs.topk_weights, x->Ts, k, MPI_FLOAT, "topk_weights");
    GATHER(x->fs.tie_margin, x->Ts, 1, MPI_FLOAT, "tie_margin");
    GATHER(x->xs, x->Mr, d, MPI_FLOAT, "x_sorted");
    if (x->swiglu) {
        GATHER(x->hg, x->Mr, ff, MPI_FLOAT, "h_gate");
        GATHER(x->hu, x->Mr, ff, MPI_FLOAT, "h_up");
        GATHER(x->ha, x->Mr, ff, MPI_FLOAT, "h_act");
    }
    GATHER(x->ys, x->Mr, d, MPI_FLOAT, "y_sorted");
    GATHER(x->fs.out, x->Ts, d, MPI_FLOAT, "out");
    if (backward_too) {
        dl_moe_backward_t *b = &x->bs;
        GATHER(b->d_topk_weights, x->Ts, k, MPI_FLOAT, "d_topk_weights");
        GATHER(x->dys, x->Mr, d, MPI_FLOAT, "d_y_sorted");
        if (x->swiglu) {
            GATHER(x->dha, x->Mr, ff, MPI_FLOAT, "d_h_act");
            GATHER(x->dhg, x->Mr, ff, MPI_FLOAT, "d_h_gate");
            GATHER(x->dhu, x->Mr, ff, MPI_FLOAT, "d_h_up");
            GATHER(x->dw[0], x->per, d * ff, MPI_FLOAT, "d_w_gate");
            GATHER(x->dw[1], x->per, d * ff, MPI_FLOAT, "d_w_up");
        }
        GATHER(x->dw[2], x->per, d * ff, MPI_FLOAT, "d_w_down");
        GATHER(x->dxs, x->Mr, d, MPI_FLOAT, "d_x_sorted");
        GATHER(b->d_router_scores, x->Ts, E, MPI_FLOAT, "d_router_scores");
        GATHER(b->d_router_logits, x->Ts, E, MPI_FLOAT, "d_router_logits");
        GATHER(b->d_x, x->Ts, d, MPI_FLOAT, "d_x");
    }
    if (x->me != 0)
        return;
    dl_moe_forward_t *f = &g->fwd;
    TRY("sort", dl_sort_assignments(f->topk_ids, x->T, k, E, whole(x, g, "sort_perm"),
                                    whole(x, g, "inv_perm"), whole(x, g, "group_sizes"),
                                    whole(x, g, "group_offsets")));
    if (backward_too) {
        const int64_t all[2] = {0, x->T};
        TRY("router weight gradient",
            dl_gemm_ragged_k(g->in.x, d, g->bwd.d_router_logits, E, all, 1, DL_F32,
                             whole(x, g, "d_router_weight"), &x->stats));
    }
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
    assemble(x, &g, !go->no_backward);
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
static void allgather(run_t *x, const float *s, int64_t rows, int64_t cols, float *r)
{
    int n = (int)rows, *cnt, *dis;
    if (!ALLOC(cnt, x->R) || !ALLOC(dis, x->R))
        fail_all(x, "gathering", DL_ENOMEM);
    MPI_Allgather(&n, 1, MPI_INT, cnt, 1, MPI_INT, x->comm);
    for (int i = 1; i < x->R; i++)
        dis[i] = dis[i - 1] + cnt[i - 1];
    MPI_Datatype row;
    MPI_Type_contiguous(cols > 0 ? (int)cols : 1, MPI_FLOAT, &row);
    MPI_Type_commit(&row);
    MPI_Allgatherv(s, cols > 0 ? n : 0, row, r, cnt, dis, row, x->comm);
    MPI_Type_free(&row);
    free(cnt);
    free(dis);
}

/* This rank's expert slice, written by itself: the whole routing (the
 * router values gathered, the sort recomputed from everyone's ids), its
 * experts' weights, rows and gradients as computed; nothing goes to rank 0. */
static int write_slice(run_t *x, const char *path, const dl_golden_gen_opts_t *go)
{
    const int64_t T = x->T, E = x->E, M = x->T * x->k;
    dl_golden_file_t g;
    header(x, &g, go);
    g.in = x->in;
    g.in.w_gate = x->w[0], g.in.w_up = x->w[1], g.in.w_down = x->w[2];
    dl_moe_forward_t *f = &g.fwd;
    if (!ALLOC(f->router_logits, T * E) || !ALLOC(f->router_scores, T * E) ||
        !ALLOC(f->tie_margin, T) || !ALLOC(f->sort_perm, M) || !ALLOC(f->inv_perm, M) ||
        !ALLOC(f->group_sizes, E) || !ALLOC(f->group_offsets, E + 1))
        fail_all(x, "assembling the slice", DL_ENOMEM);
    allgather(x, x->fs.router_logits, x->Ts, E, f->router_logits);
    allgather(x, x->fs.router_scores, x->Ts, E, f->router_scores);
    allgather(x, x->fs.tie_margin, x->Ts, 1, f->tie_margin);
    TRY("sort", dl_sort_assignments(x->ids, T, x->k, E, f->sort_perm, f->inv_perm, f->group_sizes,
                                    f->group_offsets));
    f->topk_ids = x->ids, f->topk_weights = x->wts;
    f->x_sorted = x->xs, f->h_gate = x->hg, f->h_up = x->hu, f->h_act = x->ha, f->y_sorted = x->ys;
    dl_moe_backward_t *b = &g.bwd;
    b->d_y_sorted = x->dys, b->d_h_act = x->dha, b->d_h_gate = x->dhg, b->d_h_up = x->dhu;
    b->d_x_sorted = x->dxs, b->d_w_gate = x->dw[0], b->d_w_up = x->dw[1], b->d_w_down = x->dw[2];
    char err[512] = "";
    int rc = go->n_ep_ranks > 0 ? dl_golden_add_ep_layouts(&g, go, err, sizeof err) : 0;
    if (!rc)
        rc = dl_golden_write_slice(path, &g, x->me * x->per, (x->me + 1) * x->per, go->force, err,
                                   sizeof err);
    if (rc)
        fprintf(stderr, "dropless gen: rank %d: %s\n", x->me, err[0] ? err : dl_strerror(rc));
    void *mine[] = {f->router_logits, f->router_scores, f->tie_margin, f->sort_perm, f->inv_perm,
                    f->group_sizes, f->group_offsets};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++)
        free(mine[i]);
    for (int i = 0; i < g.n_ep; i++)
        dl_ep_layout_free(&g.ep[i]);
    int worst = rc ? 1 : 0, any;
    MPI_Allreduce(&worst, &any, 1, MPI_INT, MPI_MAX, x->comm);
    return rc ? rc : any ? DL_EIO : 0;
}

static void run_free(run_t *x)
{
    dl_golden_inputs_free(&x->in);
    dl_moe_forward_free(&x->fs);
    dl_moe_backward_free(&x->bs);
    dl_ep_layout_free(&x->L);
    void *p[] = {x->w[0], x->w[1], x->w[2], x->ids, x->wts, x->inv, x->y_ret, x->dy_ret,
                 x->dxs_ret, x->loff, x->slot, x->xs, x->hg, x->hu, x->ha, x->ys, x->dys,
                 x->dha, x->dhg, x->dhu, x->dxs, x->dw[0], x->dw[1], x->dw[2], x->tc, x->td,
                 x->trc, x->trd, x->sc, x->sd, x->src_, x->srd};
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
    x->k = k->route.top_k, x->per = x->E / x->R, x->dt = k->dtype;
    x->swiglu = k->ffn_kind == DL_FFN_SWIGLU;
    dl_ep_source_range(x->T, x->R, x->me, &x->tb, &x->te);
    x->Ts = x->te - x->tb;
    TRY("drawing the inputs", dl_case_inputs_tokens(c, &x->in));
    const int64_t df = x->d * x->f;
    for (int i = x->swiglu ? 0 : 2; i < 3; i++) {
        if (!ALLOC(x->w[i], x->per * df))
            fail_all(x, "expert weights", DL_ENOMEM);
        for (int64_t e = 0; e < x->per; e++)
            TRY("expert weights", dl_case_expert_weight(c, i, x->me * x->per + e, x->w[i] + e * df));
    }
    x->t[0] = MPI_Wtime();
    route(x);
    plan(x);
    x->t[1] = MPI_Wtime();
    forward(x);
    x->t[2] = MPI_Wtime();
    if (!go->no_backward)
        backward(x);
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
