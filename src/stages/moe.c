/* The whole layer, forward and backward: the placement of the schedule
 * (schedule.c) on the whole layer at once. Each stage is an exact function
 * of the stored values before it, rounded once; this file only validates,
 * owns the memory and places the producers. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "stages/stages_priv.h"
#include "stages/quant_priv.h"

static const char *const ffn_names[] = {"swiglu", "plain", "swiglu-clamp", "geglu-tanh",
                                        "relu2"};
#define NFFN ((int)(sizeof ffn_names / sizeof ffn_names[0]))

const char *dl_ffn_name(dl_ffn_t k)
{
    return (int)k >= 0 && (int)k < NFFN ? ffn_names[k] : NULL;
}

int dl_ffn_parse(const char *s, dl_ffn_t *k)
{
    for (int i = 0; s && i < NFFN; i++)
        if (!strcmp(s, ffn_names[i])) {
            *k = (dl_ffn_t)i;
            return 0;
        }
    return DL_ENOTFOUND;
}

/* The shared experts' configuration: none (all 0), or S >= 1 experts of
 * width f_s >= 1 whose [T, S*f_s] and [d, S*f_s] arrays fit int64 bytes. */
static int shared_validate(const dl_moe_config_t *c)
{
    if (c->shared_experts == 0)
        return c->shared_ffn == 0 && c->shared_gate == 0 ? 0 : DL_EINVAL;
    if (c->shared_experts < 0 || c->shared_ffn < 1 || (c->shared_gate != 0 && c->shared_gate != 1))
        return DL_EINVAL;
    int64_t F, a;
    if (dl_mul_size(c->shared_experts, c->shared_ffn, &F) ||
        dl_mul_size(F, c->tokens > c->hidden ? c->tokens : c->hidden, &a) ||
        dl_mul_size(a, 8, &a))
        return DL_EOVERFLOW;
    return 0;
}

int dl_moe_config_validate(const dl_moe_config_t *c)
{
    if (!c || c->tokens < 0 || c->hidden < 1 || c->ffn < 1)
        return DL_EINVAL;
    if (c->dtype != DL_F32 && c->dtype != DL_BF16 && c->dtype != DL_F16)
        return DL_EINVAL;
    if (!DL_FFN_HIDDEN(c->ffn_kind) && c->ffn_kind != DL_FFN_PLAIN)
        return DL_EINVAL;
    if (c->ffn_kind == DL_FFN_PLAIN && c->ffn != c->hidden)
        return DL_EINVAL;
    if (c->ffn_kind == DL_FFN_SWIGLU_CLAMP ? !(isfinite(c->act_alpha) && c->act_limit >= 0 &&
                                               isfinite(c->act_limit))
                                           : c->act_alpha != 0 || c->act_limit != 0)
        return DL_EINVAL;
    if (c->router_dtype != DL_F32 && c->router_dtype != DL_BF16 && c->router_dtype != DL_F16)
        return DL_EINVAL;
    if (c->ffn_bias && (c->ffn_bias != 1 || !DL_FFN_GATED(c->ffn_kind)))
        return DL_EINVAL;
    /* the shared experts follow the case's activation (a hidden layer; no
     * biases of their own); a layer recipe quantizes no bias */
    if ((c->shared_experts > 0 && !DL_FFN_HIDDEN(c->ffn_kind)) ||
        (c->lowp && (c->ffn_bias || c->ffn_kind == DL_FFN_RELU2)))
        return DL_EINVAL;
    int rc = dl_route_config_validate(&c->route);
    if (rc || (rc = dl__lowp_config_check(c)))
        return rc;
    if (c->route.top_k > DL__MAX_TOPK)
        return DL_EINVAL;
    const int64_t T = c->tokens, d = c->hidden, f = c->ffn, E = c->route.experts,
                  k = c->route.top_k;
    int64_t M, a, b;
    /* every tensor's element count, and its byte count, must fit int64 */
    if (dl_mul_size(T, k, &M) || M > INT32_MAX)
        return DL_EOVERFLOW;
    if (dl_mul_size(M, d > f ? d : f, &a) || dl_mul_size(a, 8, &a))
        return DL_EOVERFLOW;
    if (dl_mul_size(E, d, &b) || dl_mul_size(b, f, &b) || dl_mul_size(b, 8, &b))
        return DL_EOVERFLOW;
    if (dl_mul_size(T, d > E ? d : E, &a) || dl_mul_size(a, 8, &a))
        return DL_EOVERFLOW;
    if (dl_mul_size(d, E, &a) || dl_mul_size(a, 8, &a))
        return DL_EOVERFLOW;
    return shared_validate(c);
}

/* The verdicts met in p[0..n) as bits (1 << verdict), t a constant
 * (always inlined): an OR over the elements, so the loop vectorises. */
DL__ALWAYS_INLINE unsigned verdicts_t(const float *p, int64_t n, dl_dtype_t t)
{
    unsigned m = 0;
#pragma omp simd reduction(| : m)
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &p[i], 4);
        m |= 1u << dl__float_verdict(b, t);
    }
    return m;
}

DL__VEC_CLONES
static unsigned verdicts(const float *p, int64_t n, dl_dtype_t t)
{
    return t == DL_F32 ? verdicts_t(p, n, DL_F32)
         : t == DL_BF16 ? verdicts_t(p, n, DL_BF16) : verdicts_t(p, n, DL_F16);
}

static int check_tensor(const float *p, int64_t n, dl_dtype_t t)
{
    enum { CHUNK = 1 << 16 };
    if (!p && n > 0)
        return DL_EINVAL;
    unsigned m = 0;
#pragma omp parallel for schedule(static) reduction(| : m)
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++)
        m |= verdicts(p + c * CHUNK, n - c * CHUNK < CHUNK ? n - c * CHUNK : CHUNK, t);
    return m & 4 ? DL_ENONFINITE : m & 2 ? DL_EGRID : 0;
}

int dl_moe_inputs_validate(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                           int need_backward)
{
    int rc = dl_moe_config_validate(c);
    if (rc)
        return rc;
    if (!in)
        return DL_EINVAL;
    const int64_t T = c->tokens, d = c->hidden, f = c->ffn, E = c->route.experts;
    const int64_t W = DL_ROUTE_WIDTH(&c->route); /* the router's width, E + Z */
    const dl_dtype_t t = c->dtype;
    const int gated = DL_FFN_GATED(c->ffn_kind), hidden = DL_FFN_HIDDEN(c->ffn_kind);
    if ((rc = check_tensor(in->x, T * d, t)) || (rc = check_tensor(in->router_weight, d * W, c->router_dtype)))
        return rc;
    if (c->route.has_bias && (rc = check_tensor(in->expert_bias, W, DL_F32)))
        return rc;
    if (c->route.hash_vocab > 0 && (!in->token_ids || !in->hash_table))
        return DL_EINVAL; /* hash routing: dl_route_hash checks their values */
    if (c->route.has_router_bias && (rc = check_tensor(in->router_bias, W, DL_F32)))
        return rc;
    if ((gated && (rc = check_tensor(in->w_gate, E * d * f, t))) ||
        (hidden && (rc = check_tensor(in->w_up, E * d * f, t))))
        return rc;
    if ((rc = check_tensor(in->w_down, E * f * d, t)))
        return rc;
    if (c->ffn_bias && ((rc = check_tensor(in->b_gate, E * f, t)) ||
                        (rc = check_tensor(in->b_up, E * f, t)) ||
                        (rc = check_tensor(in->b_down, E * d, t))))
        return rc;
    if (need_backward && (rc = check_tensor(in->d_out, T * d, t)))
        return rc;
    const int64_t F = c->shared_experts * c->shared_ffn; /* bounded by the validation */
    if (F > 0 && ((DL_FFN_GATED(c->ffn_kind) && (rc = check_tensor(in->shared_w_gate, d * F, t))) ||
                  (rc = check_tensor(in->shared_w_up, d * F, t)) ||
                  (rc = check_tensor(in->shared_w_down, F * d, t))))
        return rc;
    if (F > 0 && c->shared_gate && (rc = check_tensor(in->shared_gate_weight, d, t)))
        return rc;
    return 0;
}

void dl_moe_forward_free(dl_moe_forward_t *f)
{
    if (!f)
        return;
    dl__moe_arrays_free(f, NULL);
    memset(f, 0, sizeof *f);
}

/* The whole placement: one window, the whole layer, on the caller's
 * arrays; the producers that write a row of `want` run. */
typedef struct {
    dl_stage_view_t v;
    dl_rowset_t want;
} whole_t;

static int whole_bind(void *ctx, int i, int w, dl_stage_view_t *v)
{
    const whole_t *x = ctx;
    if (w > 0)
        return DL_SCHEDULE_END;
    if (!(dl_schedule_producer(i)->writes & x->want))
        return DL_SCHEDULE_SKIP;
    *v = x->v;
    return 0;
}

static const dl_placement_t whole_placement = {whole_bind, NULL};

/* The schedule's producers of `want` from producer `from` on, on the whole
 * layer (c validated by the caller). */
static int run_whole(const dl_moe_config_t *c, const dl_moe_inputs_t *in, const dl_moe_forward_t *f,
                     const dl_moe_backward_t *b, dl_tier_stats_t *st, int passes, int from,
                     dl_rowset_t want)
{
    whole_t x = {{.c = *c, .in = *in, .f = *f, .rows = c->tokens * c->route.top_k,
                  .off = f->group_offsets, .ne = c->route.experts, .stats = st}, want};
    if (b)
        x.v.b = *b;
    return dl_schedule_exec(c, passes, &from, -1, &whole_placement, &x);
}

/* The rows of the arrays present in *f (or *b). */
static dl_rowset_t present(const dl_moe_config_t *c, dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    dl_rowset_t m = 0;
    for (int r = 0; r < dl_layout_count(); r++) {
        void **p = dl_layout_slot(dl_layout_row(r), NULL, f, b);
        if (p && *p)
            m |= DL_ROWSET_BIT(r);
    }
    return m;
}

int dl_moe_route(const dl_moe_config_t *c, const dl_moe_inputs_t *in, dl_moe_forward_t *f)
{
    int rc = dl_moe_config_validate(c);
    if (rc)
        return rc;
    if (!in || !f || !f->router_logits || !f->router_scores || !f->topk_ids || !f->topk_weights)
        return DL_EINVAL;
    /* the router, then the sort when sort_perm is there, x_sorted when it is too */
    dl_rowset_t want = present(c, f, NULL) & (DL_ROWSET_BIT(DL__ROW_X_SORTED + 1) - 1);
    if (!f->sort_perm)
        want &= ~DL_ROWSET_BIT(DL__ROW_X_SORTED);
    return run_whole(c, in, f, NULL, &f->stats, DL_SCHEDULE_FORWARD, 0, want);
}

int dl_moe_forward(const dl_moe_config_t *c, const dl_moe_inputs_t *in, dl_moe_forward_t *f)
{
    if (!f)
        return DL_EINVAL;
    memset(f, 0, sizeof *f);
    int rc = dl_moe_inputs_validate(c, in, 0);
    if (rc)
        return rc;
    if (dl__moe_arrays_alloc(c, f, NULL))
        return DL_ENOMEM;
    return run_whole(c, in, f, NULL, &f->stats, DL_SCHEDULE_FORWARD, 0, ~(dl_rowset_t)0);
}

void dl_moe_backward_free(dl_moe_backward_t *b)
{
    if (!b)
        return;
    dl__moe_arrays_free(NULL, b);
    memset(b, 0, sizeof *b);
}

int dl_moe_backward(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                    const dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    if (!b || !f)
        return DL_EINVAL;
    memset(b, 0, sizeof *b);
    int rc = dl_moe_inputs_validate(c, in, 1);
    if (rc)
        return rc;
    if (dl__moe_arrays_alloc(c, NULL, b))
        return DL_ENOMEM;
    return run_whole(c, in, f, b, &b->stats, DL_SCHEDULE_BACKWARD, 0, ~(dl_rowset_t)0);
}

int dl_moe_route_backward(const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                          const dl_moe_forward_t *f, dl_moe_backward_t *b)
{
    int rc = dl_moe_config_validate(c);
    if (rc)
        return rc;
    if (!in || !f || !b || !b->d_router_scores || !b->d_router_logits || !b->d_router_weight ||
        !b->d_x)
        return DL_EINVAL;
    const dl_rowset_t tail = DL_ROWSET_BIT(DL__ROW_D_ROUTER_SCORES) |
                             DL_ROWSET_BIT(DL__ROW_D_ROUTER_LOGITS) |
                             DL_ROWSET_BIT(DL__ROW_D_ROUTER_WEIGHT) | DL_ROWSET_BIT(DL__ROW_D_X);
    return run_whole(c, in, f, b, &b->stats, DL_SCHEDULE_BACKWARD,
                     dl_schedule_writer(DL__ROW_D_ROUTER_SCORES), tail);
}
