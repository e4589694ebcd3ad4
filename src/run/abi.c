/* The plugin ABI's stages (dropless/backend.h) in the library's terms: their
 * names, the tensors each takes and produces (by the names of DL_VALUE_MAP,
 * so shapes and types come from the one table), and the call through the
 * plugin's table. */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include <dlpack/dlpack.h>
#include "run/run_priv.h"
/* The backend enums mirror the library's, so a config converts by value. */
_Static_assert((int)DL_BACKEND_FP32 == (int)DL_F32 && (int)DL_BACKEND_BF16 == (int)DL_BF16 &&
                   (int)DL_BACKEND_FP16 == (int)DL_F16,
               "backend dtype enum out of sync");
_Static_assert((int)DL_BACKEND_SWIGLU == (int)DL_FFN_SWIGLU &&
                   (int)DL_BACKEND_PLAIN == (int)DL_FFN_PLAIN,
               "backend ffn enum out of sync");
_Static_assert((int)DL_BACKEND_SOFTMAX == (int)DL_SCORE_SOFTMAX &&
                   (int)DL_BACKEND_SIGMOID == (int)DL_SCORE_SIGMOID &&
                   (int)DL_BACKEND_SQRTSOFTPLUS == (int)DL_SCORE_SQRTSOFTPLUS &&
                   (int)DL_BACKEND_SOFTMAX_TOPK == (int)DL_SCORE_SOFTMAX_TOPK,
               "backend score enum out of sync");
_Static_assert((int)DL_BACKEND_GROUP_MAX == (int)DL_GROUP_MAX &&
                   (int)DL_BACKEND_GROUP_TOP2_SUM == (int)DL_GROUP_TOP2_SUM &&
                   (int)DL_BACKEND_GROUP_TOPK_SUM == (int)DL_GROUP_TOPK_SUM,
               "backend group-score enum out of sync");

static const char *const stage_names[DL_STAGE_COUNT] = {
    "router", "dispatch", "permute", "expert_forward", "combine",
    "combine_backward", "expert_backward", "router_backward", "input_backward"};

static const char *const status_names[] = {
    "ok", "not-implemented", "skipped", "crashed", "timeout", "error-return",
    "unwritten", "nondeterministic", "abi-mismatch", "load-failed"};

const char *dl_run_stage_name(dl_run_stage_t s)
{
    return (unsigned)s < DL_STAGE_COUNT ? stage_names[s] : NULL;
}

const char *dl_run_status_name(dl_run_status_t s)
{
    return (unsigned)s < sizeof status_names / sizeof *status_names ? status_names[s] : NULL;
}

int dl_run_status_is_failure(dl_run_status_t s)
{
    switch (s) {
    case DL_RUN_CRASHED:
    case DL_RUN_TIMEOUT:
    case DL_RUN_ERROR_RETURN:
    case DL_RUN_UNWRITTEN:
    case DL_RUN_ABI_MISMATCH:
    case DL_RUN_LOAD_FAILED:
        return 1;
    default:
        return 0;
    }
}


/* ------------------------------------------------------------ stage I/O */

/* The tensors of each stage, in the field order of its args struct. */
static const struct {
    const char *in[MAX_IN + 1];
    const char *out[MAX_OUT + 1];
} abi_io[DL_STAGE_COUNT] = {
    [DL_STAGE_ROUTER] = {{"x", "router_weight", "expert_bias"},
                         {"router_logits", "router_scores", "topk_ids", "topk_weights"}},
    [DL_STAGE_DISPATCH] = {{"topk_ids"}, {"sort_perm", "group_sizes", "group_offsets"}},
    [DL_STAGE_PERMUTE] = {{"x", "sort_perm"}, {"x_sorted"}},
    [DL_STAGE_EXPERT_FORWARD] = {{"x_sorted", "group_sizes", "group_offsets", "w_gate", "w_up",
                                  "w_down"},
                                 {"h_gate", "h_up", "h_act", "y_sorted"}},
    [DL_STAGE_COMBINE] = {{"y_sorted", "topk_weights", "topk_ids", "sort_perm"}, {"out"}},
    [DL_STAGE_COMBINE_BACKWARD] = {{"d_out", "y_sorted", "topk_weights", "topk_ids",
                                    "sort_perm"},
                                   {"d_topk_weights", "d_y_sorted"}},
    [DL_STAGE_EXPERT_BACKWARD] = {{"d_y_sorted", "x_sorted", "h_gate", "h_up", "h_act",
                                   "group_sizes", "group_offsets", "w_gate", "w_up", "w_down"},
                                  {"d_h_act", "d_w_down", "d_h_gate", "d_h_up", "d_x_sorted",
                                   "d_w_gate", "d_w_up"}},
    [DL_STAGE_ROUTER_BACKWARD] = {{"d_topk_weights", "router_logits", "router_scores",
                                   "topk_ids", "x", "router_weight"},
                                  {"d_router_scores", "d_router_logits", "d_router_weight"}},
    [DL_STAGE_INPUT_BACKWARD] = {{"d_x_sorted", "sort_perm", "topk_ids", "d_router_logits",
                                  "router_weight"},
                                 {"d_x"}},
};

/* A tensor described by its layout row, for configuration c. */
static void tens_of(tens_t *t, const dl_layout_row_t *row, const dl_moe_config_t *c)
{
    memset(t, 0, sizeof *t);
    t->name = row->name;
    t->kind = row->store == DL_STORE_I32 ? K_I32 : row->store == DL_STORE_I64 ? K_I64 : K_F32;
    t->present = dl_cond_applies(row->cond, c);
    t->ndim = dl_layout_shape(row, c, t->shape);
}

void dl__run_stage_io(dl_run_stage_t s, const dl_moe_config_t *c, const dl_moe_inputs_t *in,
                      const dl_moe_forward_t *gf, const dl_moe_backward_t *gb,
                      dl_run_result_t *r, stage_io_t *io)
{
    memset(io, 0, sizeof *io);
    if ((int)s < 0 || s >= DL_STAGE_COUNT)
        return;
    for (int i = 0; abi_io[s].in[i]; i++) {
        const dl_layout_row_t *row = dl_layout_find(abi_io[s].in[i]);
        tens_t *t = &io->in[io->nin++];
        tens_of(t, row, c);
        t->src = dl_layout_data(row, in, gf, gb);
    }
    for (int o = 0; abi_io[s].out[o]; o++) {
        const dl_layout_row_t *row = dl_layout_find(abi_io[s].out[o]);
        tens_t *t = &io->out[io->nout++];
        tens_of(t, row, c);
        t->dst = dl__value_slot(&r->fwd, &r->bwd, row->value);
    }
}

dl_valueset_t dl_run_stage_values(dl_run_stage_t s)
{
    if ((int)s < 0 || s >= DL_STAGE_COUNT)
        return 0;
    dl_valueset_t m = 0;
    for (int o = 0; abi_io[s].out[o]; o++) {
        dl_value_t v;
        if (dl_value_parse(abi_io[s].out[o], &v) == 0)
            m |= DL_VALUE_BIT(v);
    }
    return m;
}

int dl__run_stage_is_backward(dl_run_stage_t s)
{
    return s >= DL_STAGE_COMBINE_BACKWARD;
}

int dl__run_stage_present(const dl_backend_t *b, dl_run_stage_t s)
{
    switch (s) {
    case DL_STAGE_ROUTER: return b->router != NULL;
    case DL_STAGE_DISPATCH: return b->dispatch != NULL;
    case DL_STAGE_PERMUTE: return b->permute != NULL;
    case DL_STAGE_EXPERT_FORWARD: return b->expert_forward != NULL;
    case DL_STAGE_COMBINE: return b->combine != NULL;
    case DL_STAGE_COMBINE_BACKWARD: return b->combine_backward != NULL;
    case DL_STAGE_EXPERT_BACKWARD: return b->expert_backward != NULL;
    case DL_STAGE_ROUTER_BACKWARD: return b->router_backward != NULL;
    case DL_STAGE_INPUT_BACKWARD: return b->input_backward != NULL;
    default: return 0;
    }
}

int dl__run_call_stage(const dl_backend_t *b, dl_run_stage_t s, const dl_backend_config_t *cfg,
                       DLTensor *const *I, DLTensor *const *O)
{
    switch (s) {
    case DL_STAGE_ROUTER: {
        dl_backend_router_args_t a = {I[0], I[1], I[2], O[0], O[1], O[2], O[3]};
        return b->router(cfg, &a);
    }
    case DL_STAGE_DISPATCH: {
        dl_backend_dispatch_args_t a = {I[0], O[0], O[1], O[2]};
        return b->dispatch(cfg, &a);
    }
    case DL_STAGE_PERMUTE: {
        dl_backend_permute_args_t a = {I[0], I[1], O[0]};
        return b->permute(cfg, &a);
    }
    case DL_STAGE_EXPERT_FORWARD: {
        dl_backend_expert_forward_args_t a = {I[0], I[1], I[2], I[3], I[4], I[5],
                                              O[0], O[1], O[2], O[3]};
        return b->expert_forward(cfg, &a);
    }
    case DL_STAGE_COMBINE: {
        dl_backend_combine_args_t a = {I[0], I[1], I[2], I[3], O[0]};
        return b->combine(cfg, &a);
    }
    case DL_STAGE_COMBINE_BACKWARD: {
        dl_backend_combine_backward_args_t a = {I[0], I[1], I[2], I[3], I[4], O[0], O[1]};
        return b->combine_backward(cfg, &a);
    }
    case DL_STAGE_EXPERT_BACKWARD: {
        dl_backend_expert_backward_args_t a = {I[0], I[1], I[2], I[3], I[4], I[5], I[6],
                                               I[7], I[8], I[9], O[0], O[1], O[2], O[3],
                                               O[4], O[5], O[6]};
        return b->expert_backward(cfg, &a);
    }
    case DL_STAGE_ROUTER_BACKWARD: {
        dl_backend_router_backward_args_t a = {I[0], I[1], I[2], I[3], I[4], I[5],
                                               O[0], O[1], O[2]};
        return b->router_backward(cfg, &a);
    }
    case DL_STAGE_INPUT_BACKWARD: {
        dl_backend_input_backward_args_t a = {I[0], I[1], I[2], I[3], I[4], O[0]};
        return b->input_backward(cfg, &a);
    }
    default:
        return -1;
    }
}


/* ------------------------------------------------------- expressibility */

/* What a case may have that dl_backend_config_t and the stages' tensors
 * cannot say (doc/backends.md, "What the ABI expresses"): a plugin fed such
 * a case would be judged against a layer it was never told about.
 * X(test on c, what the ABI lacks). */
#define DL__ABI_GAP_MAP(X)                                                              \
    X(c->ffn_kind != DL_FFN_SWIGLU && c->ffn_kind != DL_FFN_PLAIN, "the FFN kind")      \
    X(c->ffn_bias, "expert biases (ffn_bias)")                                          \
    X(c->route.has_router_bias, "router-logit bias (router_bias)")                    \
    X(c->shared_experts > 0, "shared experts (shared_experts)")                         \
    X(c->lowp != 0, "low-precision layer recipe (lowp)")                               \
    X(c->route.zero_experts > 0, "zero (identity) experts (zero_experts)")

int dl_run_expressible(const dl_moe_config_t *c, char *why, size_t n)
{
    const char *no = !c ? "no configuration" : NULL;
#define DL__ABI_GAP(test, what)                                                         \
    if (!no && (test))                                                                  \
        no = what;
    if (c) {
        DL__ABI_GAP_MAP(DL__ABI_GAP)
    }
#undef DL__ABI_GAP
    if (no && why && n) {
        if (c && c->ffn_kind != DL_FFN_SWIGLU && c->ffn_kind != DL_FFN_PLAIN)
            snprintf(why, n, "the backend ABI has no %s (its FFN is swiglu or plain)",
                     dl_ffn_name(c->ffn_kind));
        else
            snprintf(why, n, "the backend ABI has no %s", no);
    }
    return !no;
}
