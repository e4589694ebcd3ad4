/* Deterministic inputs for golden cases. Everything here is specified in
 * doc/format.md ("Input generation") so that any language with 64-bit
 * integers and IEEE binary64 arithmetic reproduces the inputs bit for bit:
 * splitmix64 streams, Irwin-Hall normals (no log/cos: libm differs between
 * platforms), one binary64 product, one rounding onto the storage grid. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "golden/golden_priv.h"

#define GAMMA UINT64_C(0x9e3779b97f4a7c15)

enum {
    S_X = 1, S_ROUTER = 2, S_BIAS = 3, S_GATE = 4, S_UP = 5, S_DOWN = 6, S_DOUT = 7,
    S_OFFSET = 8,
    /* the shared experts' weights (doc/format.md) */
    S_SHARED_GATE = 32, S_SHARED_UP = 33, S_SHARED_DOWN = 34, S_SHARED_SG = 35,
    S_ROUTER_BIAS = 20, /* the bias on the router logits */
    S_TOKEN_IDS = 40, S_HASH_TABLE = 41, /* hash routing's token ids and table */
    /* the expert biases */
    S_B_GATE = 9, S_B_UP = 10, S_B_DOWN = 11
};

static inline uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static inline uint64_t stream_key(uint64_t seed, uint64_t stream)
{
    return mix(seed + stream * GAMMA);
}

uint64_t dl_golden_rng_u64(uint64_t seed, uint64_t stream, uint64_t n)
{
    return mix(stream_key(seed, stream) + (n + 1) * GAMMA);
}

static inline double normal_k(uint64_t key, uint64_t i)
{
    uint64_t s = 0, base = key + 12 * i * GAMMA;
    for (uint64_t j = 1; j <= 12; j++)
        s += mix(base + j * GAMMA) >> 32;
    /* s < 12 * 2^32 < 2^36: the scaling and the subtraction are exact */
    return (double)s * 0x1p-32 - 6.0;
}

double dl_golden_rng_normal(uint64_t seed, uint64_t stream, uint64_t i)
{
    return normal_k(stream_key(seed, stream), i);
}

double dl_golden_ln(double x)
{
    if (!(x > 0) || isinf(x))
        return x == 0 ? -INFINITY : (x > 0 ? x : NAN);
    int k;
    double m = frexp(x, &k); /* exact: x = m 2^k, m in [0.5, 1) */
    if (m < 0x1.6a09e667f3bcdp-1) { /* m < sqrt(1/2): m in [sqrt(1/2), sqrt(2)) */
        m *= 2.0;
        k -= 1;
    }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s, term = s, sum = 0.0;
    for (int i = 0; i < 20; i++) {
        sum += term / (double)(2 * i + 1);
        term *= s2;
    }
    return (double)k * 0x1.62e42fefa39efp-1 + 2.0 * sum;
}

/* v[i] = RN_t(normal(base + i) * sigma) for i in [0, n): element base + i
 * of the tensor, so that a tensor can be drawn a piece at a time. */
static void fill_at(float *v, int64_t base, int64_t n, uint64_t seed, uint64_t stream,
                    double sigma, dl_dtype_t t)
{
    uint64_t key = stream_key(seed, stream);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 65536)
#endif
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)dl_round(normal_k(key, (uint64_t)(base + i)) * sigma, t);
}

static void fill(float *v, int64_t n, uint64_t seed, uint64_t stream, double sigma,
                 dl_dtype_t t)
{
    fill_at(v, 0, n, seed, stream, sigma, t);
}

void dl_golden_inputs_free(dl_golden_inputs_t *in)
{
    if (!in)
        return;
    free(in->x);
    free(in->router_weight);
    free(in->expert_bias);
    free(in->w_gate);
    free(in->w_up);
    free(in->w_down);
    free(in->d_out);
    free(in->shared_w_gate);
    free(in->shared_w_up);
    free(in->shared_w_down);
    free(in->shared_gate_weight);
    free(in->router_bias);
    free(in->b_gate);
    free(in->b_up);
    free(in->b_down);
    free(in->token_ids);
    free(in->hash_table);
    memset(in, 0, sizeof *in);
}

dl_moe_inputs_t dl_golden_inputs_view(const dl_golden_inputs_t *in)
{
    dl_moe_inputs_t v = {in->x, in->router_weight, in->expert_bias, in->w_gate,
                         in->w_up, in->w_down, in->d_out, in->shared_w_gate, in->shared_w_up,
                         in->shared_w_down, in->shared_gate_weight, in->router_bias,
                         in->b_gate, in->b_up, in->b_down, in->token_ids, in->hash_table};
    return v;
}

static float *alloc_f(int64_t n)
{
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(float))
        return NULL;
    return malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
}

/* Hash routing's inputs: token ids uniform in [0, V) (stream 40) and V
 * table rows of k distinct experts, each the first k of a Fisher-Yates
 * shuffle of the E experts (stream 41, E draws per row). */
static int hash_inputs(const dl_case_t *c, dl_golden_inputs_t *in)
{
    const dl_moe_config_t *k = &c->config;
    const int64_t T = k->tokens, V = k->route.hash_vocab, K = k->route.top_k,
                  E = k->route.experts;
    in->token_ids = malloc((size_t)(T > 0 ? T : 1) * sizeof *in->token_ids);
    in->hash_table = malloc((size_t)(V * K) * sizeof *in->hash_table);
    int32_t *perm = malloc((size_t)E * sizeof *perm);
    if (!in->token_ids || !in->hash_table || !perm) {
        free(perm);
        return DL_ENOMEM;
    }
    for (int64_t t = 0; t < T; t++)
        in->token_ids[t] = (int32_t)(dl_golden_rng_u64(c->seed, S_TOKEN_IDS, (uint64_t)t) %
                                     (uint64_t)V);
    for (int64_t r = 0; r < V; r++) {
        for (int64_t e = 0; e < E; e++)
            perm[e] = (int32_t)e;
        for (int64_t j = 0; j < K; j++) {
            const uint64_t u = dl_golden_rng_u64(c->seed, S_HASH_TABLE, (uint64_t)(r * E + j));
            const int64_t p = j + (int64_t)(u % (uint64_t)(E - j));
            const int32_t tmp = perm[j];
            perm[j] = perm[p], perm[p] = tmp;
            in->hash_table[r * K + j] = perm[j];
        }
    }
    free(perm);
    return 0;
}

/* Per-expert logit offsets b_e (doc/format.md). */
static void offsets(const dl_case_t *c, double *b)
{
    int64_t E = DL_ROUTE_WIDTH(&c->config.route); /* zero experts: drawn as the others */
    for (int64_t e = 0; e < E; e++)
        b[e] = c->inputs == DL_INPUTS_ZIPF
                   ? -c->zipf_s * dl_golden_ln((double)(e + 1))
                   : 0.5 * dl_golden_rng_normal(c->seed, S_OFFSET, (uint64_t)e);
    if (c->inputs == DL_INPUTS_EMPTY) {
        b[0] = -40.0;
        b[E / 2] = -40.0;
        b[E - 1] = -40.0;
    }
    if (c->inputs == DL_INPUTS_ONE_HOT)
        b[E / 2] = 40.0;
    if (c->inputs == DL_INPUTS_SIZES)
        for (int64_t e = 0; e < E; e++)
            b[e] = 0.0;
}

/* Copies router column (and bias of) expert src to dst. */
static void copy_expert(float *w, float *bias, int64_t d, int64_t E, int64_t src, int64_t dst)
{
    for (int64_t r = 0; r < d; r++)
        w[r * E + dst] = w[r * E + src];
    if (bias)
        bias[dst] = bias[src];
}

/* Ties (doc/format.md): experts [0, k] become exact copies of expert 0 (a
 * tie across the k boundary whenever they lead), experts [k+1, 2k+1] near
 * copies of expert k+1 (each 64 ulps above the previous in one weight),
 * then group 1 a copy of group 0 (tied group scores), and token 0 is all
 * zeros (every logit exactly 0). */
static void make_ties(const dl_case_t *c, dl_golden_inputs_t *in)
{
    const dl_moe_config_t *k = &c->config;
    int64_t d = k->hidden, E = DL_ROUTE_WIDTH(&k->route), K = k->route.top_k;
    int64_t rnear = d > 1 ? 1 : 0;
    for (int64_t e = 1; e <= K && e < E; e++)
        copy_expert(in->router_weight, in->expert_bias, d, E, 0, e);
    for (int64_t e = K + 2; e <= 2 * K + 1 && e < E; e++) {
        copy_expert(in->router_weight, in->expert_bias, d, E, e - 1, e);
        for (int u = 0; u < 64; u++)
            in->router_weight[rnear * E + e] = nextafterf(in->router_weight[rnear * E + e], INFINITY);
    }
    int64_t gsize = E / k->route.n_group;
    if (k->route.n_group >= 2)
        for (int64_t e = 0; e < gsize; e++)
            copy_expert(in->router_weight, in->expert_bias, d, E, e, gsize + e);
    if (k->tokens >= 1)
        memset(in->x, 0, (size_t)d * sizeof(float));
}

/* ------------------------------------------------------ planted routing */

/* The planted group sizes of inputs = sizes (doc/format.md): slots
 * s = j*T + t (choice j of token t, j = 0 best) are handed out in order, in
 * runs, to experts 0..7 (these sizes), then the hot expert E-1 (up to T:
 * every token), then experts 8..E-2 in runs as equal as possible. A run of
 * at most T consecutive slots never holds one token twice, which is why
 * every run must be at most T long. */
static const int64_t planted_sizes[] = {0, 1, 63, 64, 65, 127, 128, 129};
#define NPLANTED ((int64_t)(sizeof planted_sizes / sizeof planted_sizes[0]))

/* The run length of every expert into q[E]; 0 or DL_EINVAL when the
 * configuration cannot hold the plan. */
int dl__case_planted_sizes(const dl_moe_config_t *k, int64_t *q)
{
    int64_t T = k->tokens, E = k->route.experts, slots = T * k->route.top_k, used = 0;
    if (E < 2 || k->hidden < E + 1 || k->route.n_group != 1 || k->route.zero_experts > 0)
        return DL_EINVAL;
    int64_t nq = E - 1 < NPLANTED ? E - 1 : NPLANTED;
    for (int64_t e = 0; e < E; e++)
        q[e] = 0;
    for (int64_t e = 0; e < nq; e++) {
        q[e] = planted_sizes[e] < slots - used ? planted_sizes[e] : slots - used;
        used += q[e];
    }
    q[E - 1] = T < slots - used ? T : slots - used;
    used += q[E - 1];
    int64_t nf = E - 1 - nq, rest = slots - used;
    if (rest > 0 && nf < 1)
        return DL_EINVAL;
    for (int64_t i = 0; i < nf; i++)
        q[nq + i] = rest / nf + (i < rest % nf);
    for (int64_t e = 0; e < E; e++)
        if (q[e] > T)
            return DL_EINVAL;
    return 0;
}

/* Features 1..E of each token name its experts: x[t, 1 + e] = 2 (k - j) when
 * e is its choice j, else 0; router rows 1..E are the identity, rows beyond
 * E are drawn 16 times smaller, row 0 carries no offsets. The planted
 * logits are 2k, 2(k-1), ..., 2 against noise of about 0.07. */
static int plant(const dl_case_t *c, dl_golden_inputs_t *in)
{
    const dl_moe_config_t *k = &c->config;
    int64_t T = k->tokens, d = k->hidden, E = k->route.experts, K = k->route.top_k;
    int64_t *q = malloc((size_t)E * sizeof *q);
    if (!q)
        return DL_ENOMEM;
    int rc = dl__case_planted_sizes(k, q);
    if (rc) {
        free(q);
        return rc;
    }
    double sd = 1.0 / sqrt((double)d);
    if (d > E + 1)
        fill_at(in->router_weight + (E + 1) * E, (E + 1) * E, (d - E - 1) * E, c->seed, S_ROUTER,
                sd * 0.0625, DL_F32);
    for (int64_t r = 1; r <= E; r++)
        for (int64_t e = 0; e < E; e++)
            in->router_weight[r * E + e] = r - 1 == e ? 1.0f : 0.0f;
    for (int64_t t = 0; t < T; t++)
        memset(in->x + t * d + 1, 0, (size_t)E * sizeof(float));
    int64_t s = 0;
    /* the order of the runs: experts 0..nq-1, then E-1, then nq..E-2 */
    int64_t nq = E - 1 < NPLANTED ? E - 1 : NPLANTED;
    for (int64_t n = 0; n < E; n++) {
        int64_t e = n < nq ? n : n == nq ? E - 1 : n - 1;
        for (int64_t r = 0; r < q[e]; r++, s++) {
            int64_t j = s / T, t = s % T;
            in->x[t * d + 1 + e] = (float)(2 * (K - j));
        }
    }
    free(q);
    return 0;
}

/* ------------------------------------------------------------- drawing */

static double sigma_of(int64_t n) { return 1.0 / sqrt((double)n); }

void dl__case_expert_weight(const dl_case_t *c, int which, int64_t e, float *buf)
{
    const dl_moe_config_t *k = &c->config;
    int64_t n = k->hidden * k->ffn;
    int stream = which == DL__W_GATE ? S_GATE : which == DL__W_UP ? S_UP : S_DOWN;
    double sd = sigma_of(which == DL__W_DOWN ? k->ffn : k->hidden);
    fill_at(buf, e * n, n, c->seed, (uint64_t)stream, sd, k->dtype);
}

/* The shared experts' weights (their own streams, so no other input's
 * bits move): gate and up N(0, 1/d), down N(0, 1/F) for the concatenated
 * width F, the gate weight N(0, 1/d); all in the dtype, as the models
 * store them (Qwen2-MoE's shared_expert_gate is a Linear of the model's
 * dtype). Nothing without them. */
static int shared_inputs(const dl_case_t *c, dl_golden_inputs_t *in)
{
    const dl_moe_config_t *k = &c->config;
    const int64_t F = dl_value_dim(k, 'S'), d = k->hidden;
    int64_t n;
    if (F <= 0)
        return 0;
    if (dl_mul_size(F, d, &n))
        return DL_EOVERFLOW;
    const int gated = DL_FFN_GATED(k->ffn_kind); /* relu2's shared experts: no gate */
    in->shared_w_gate = gated ? alloc_f(n) : NULL;
    in->shared_w_up = alloc_f(n);
    in->shared_w_down = alloc_f(n);
    in->shared_gate_weight = k->shared_gate ? alloc_f(d) : NULL;
    if ((gated && !in->shared_w_gate) || !in->shared_w_up || !in->shared_w_down ||
        (k->shared_gate && !in->shared_gate_weight))
        return DL_ENOMEM;
    if (gated)
        fill(in->shared_w_gate, n, c->seed, S_SHARED_GATE, sigma_of(d), k->dtype);
    fill(in->shared_w_up, n, c->seed, S_SHARED_UP, sigma_of(d), k->dtype);
    fill(in->shared_w_down, n, c->seed, S_SHARED_DOWN, sigma_of(F), k->dtype);
    if (in->shared_gate_weight)
        fill(in->shared_gate_weight, d, c->seed, S_SHARED_SG, sigma_of(d), k->dtype);
    return 0;
}

/* The expert biases (ffn_bias only): N(0, 1/4), which moves the gates and
 * ups as far as a weight column does. Small ([E, f], [E, d]), so every
 * placement draws them whole with the token-side inputs. */
static int bias_inputs(const dl_case_t *c, dl_golden_inputs_t *in)
{
    const dl_moe_config_t *k = &c->config;
    if (!k->ffn_bias)
        return 0;
    const int64_t E_f = k->route.experts * k->ffn, E_d = k->route.experts * k->hidden;
    in->b_gate = alloc_f(E_f);
    in->b_up = alloc_f(E_f);
    in->b_down = alloc_f(E_d);
    if (!in->b_gate || !in->b_up || !in->b_down)
        return DL_ENOMEM;
    fill(in->b_gate, E_f, c->seed, S_B_GATE, 0.5, k->dtype);
    fill(in->b_up, E_f, c->seed, S_B_UP, 0.5, k->dtype);
    fill(in->b_down, E_d, c->seed, S_B_DOWN, 0.5, k->dtype);
    return 0;
}

int dl__case_inputs_small(const dl_case_t *c, dl_golden_inputs_t *in)
{
    if (!c || !in)
        return DL_EINVAL;
    memset(in, 0, sizeof *in);
    const dl_moe_config_t *k = &c->config;
    char why[128];
    int rc = dl__golden_config_check(k, why, sizeof why);
    if (rc)
        return rc;
    int64_t T = k->tokens, d = k->hidden, E = DL_ROUTE_WIDTH(&k->route); /* the router's */
    int64_t nx, nw;
    if (dl_mul_size(T, d, &nx) || dl_mul_size(d, E, &nw))
        return DL_EOVERFLOW;
    dl_dtype_t t = k->dtype;
    double *b = malloc((size_t)E * sizeof(double));
    in->x = alloc_f(nx);
    in->router_weight = alloc_f(nw);
    in->expert_bias = k->route.has_bias ? alloc_f(E) : NULL;
    in->d_out = alloc_f(nx);
    if (!b || !in->x || !in->router_weight || (k->route.has_bias && !in->expert_bias) ||
        !in->d_out) {
        free(b);
        dl_golden_inputs_free(in);
        return DL_ENOMEM;
    }
    offsets(c, b);

    /* x: column 0 is the offset feature 8 + z/16, the rest N(0, 1) */
    fill(in->x, nx, c->seed, S_X, 1.0, t);
    uint64_t kx = stream_key(c->seed, S_X);
    for (int64_t r = 0; r < T; r++)
        in->x[r * d] = (float)dl_round(8.0 + normal_k(kx, (uint64_t)(r * d)) * 0.0625, t);

    /* router weight: N(0, 1/d); row 0 carries the offsets through the feature */
    double sd = sigma_of(d);
    const dl_dtype_t rt = k->router_dtype;
    fill(in->router_weight, nw, c->seed, S_ROUTER, sd, rt);
    uint64_t kr = stream_key(c->seed, S_ROUTER);
    for (int64_t e = 0; e < E; e++)
        in->router_weight[e] =
            (float)dl_round((b[e] + normal_k(kr, (uint64_t)e) * sd) * 0.125, rt);
    free(b);

    if (in->expert_bias)
        fill(in->expert_bias, E, c->seed, S_BIAS, 0.0625, DL_F32);
    fill(in->d_out, nx, c->seed, S_DOUT, 1.0, t);
    /* the router-logit bias: N(0, 1/2), comparable to the logits' spread */
    if (k->route.has_router_bias) {
        if (!(in->router_bias = alloc_f(E))) {
            dl_golden_inputs_free(in);
            return DL_ENOMEM;
        }
        fill(in->router_bias, E, c->seed, S_ROUTER_BIAS, 0.5, DL_F32);
    }

    if (k->route.hash_vocab > 0 && (rc = hash_inputs(c, in))) {
        dl_golden_inputs_free(in);
        return rc;
    }
    if (c->inputs == DL_INPUTS_TIES)
        make_ties(c, in);
    if ((rc = shared_inputs(c, in)) || (rc = bias_inputs(c, in)) ||
        (c->inputs == DL_INPUTS_SIZES && (rc = plant(c, in)))) {
        dl_golden_inputs_free(in);
        return rc;
    }
    for (int64_t i = 0; rt != DL_F32 && i < nw; i++) /* the planted values onto the grid */
        in->router_weight[i] = (float)dl_round(in->router_weight[i], rt);
    return 0;
}

int dl_case_inputs(const dl_case_t *c, dl_golden_inputs_t *in)
{
    int rc = dl__case_inputs_small(c, in);
    if (rc)
        return rc;
    const dl_moe_config_t *k = &c->config;
    int64_t E = k->route.experts, nffn;
    if (dl_mul_size(E, k->hidden, &nffn) || dl_mul_size(nffn, k->ffn, &nffn)) {
        dl_golden_inputs_free(in);
        return DL_EOVERFLOW;
    }
    const int gated = DL_FFN_GATED(k->ffn_kind), hidden = DL_FFN_HIDDEN(k->ffn_kind);
    in->w_gate = gated ? alloc_f(nffn) : NULL;
    in->w_up = hidden ? alloc_f(nffn) : NULL; /* relu2: the up projection alone */
    in->w_down = alloc_f(nffn);
    if ((gated && !in->w_gate) || (hidden && !in->w_up) || !in->w_down) {
        dl_golden_inputs_free(in);
        return DL_ENOMEM;
    }
    dl_dtype_t t = k->dtype;
    if (gated)
        fill(in->w_gate, nffn, c->seed, S_GATE, sigma_of(k->hidden), t);
    if (hidden)
        fill(in->w_up, nffn, c->seed, S_UP, sigma_of(k->hidden), t);
    fill(in->w_down, nffn, c->seed, S_DOWN, sigma_of(k->ffn), t);
    return 0;
}

int dl_case_inputs_tokens(const dl_case_t *c, dl_golden_inputs_t *in)
{
    return dl__case_inputs_small(c, in);
}

int dl_case_expert_weight(const dl_case_t *c, int which, int64_t e, float *buf)
{
    if (!c || !buf || which < DL__W_GATE || which > DL__W_DOWN || e < 0 ||
        e >= c->config.route.experts ||
        (which == DL__W_GATE && !DL_FFN_GATED(c->config.ffn_kind)) ||
        (which == DL__W_UP && !DL_FFN_HIDDEN(c->config.ffn_kind)))
        return DL_EINVAL;
    dl__case_expert_weight(c, which, e, buf);
    return 0;
}
