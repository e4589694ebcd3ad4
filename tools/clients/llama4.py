"""transformers' Llama4TextMoe as a conformance client of the catalogue's
llama4-like cases (route.weight_on_input, doc/format.md): the hooks of the
`llama4` rows of clients.CLIENTS (Client.hooks), so the one harness
(tools/clients/run.py, `make check-clients`) drives it as every other row.

Llama-4 routes by a sigmoid of the top-1 router logit that scales the
expert's INPUT (routed_in = x * sigmoid(score)); the experts' outputs are
summed unweighted and a shared expert of width f is added. clients.py's
generic run_block hands the experts (x, ids, weights); these experts take
the routed input alone, hence the row's own build, load_inputs and
run_block. The negative control `llama4[defect:weight-on-output]` applies
the weight to the expert's output, the Mixtral way: NOT CONFORMANT.

The scores: Llama4Router keeps sigmoid(logit) of the selected experts
only, rounded to the model's dtype before the product; the chained
candidate hands over router_scores = sigmoid(logits) in that dtype for
every expert (the block's own formula), so the routed input the checker
expects, RN(x * s), is the block's own (without them, the bf16 block's
rounded score is a hidden error that x_sorted, a bitwise-checked value,
does not carry: d_w_down then FAILs at 2.9x on llama4-like-bf16).
"""

import types

import clients as C


def configure(cfg):
    """Llama4TextConfig keyword arguments for a case config, or C.NotExpressible."""
    why = []
    if not int(cfg.get("weight_on_input", 0) or 0):
        why.append("the block applies the score to the expert's input (weight_on_input 1)")
    if cfg["score_function"] != "sigmoid" or int(cfg["top_k"]) != 1:
        why.append("the block routes by sigmoid top-1")
    if int(cfg["has_bias"]) or int(cfg["n_group"]) > 1:
        why.append("the block has no selection bias or groups")
    S, fs, gated = C.shared_of(cfg)
    if S != 1 or fs != int(cfg["ffn"]) or gated:
        why.append("the block has one ungated shared expert of width f")
    if cfg["ffn_kind"] != "swiglu":
        why.append("the block's experts are SwiGLU")
    if why:
        raise C.NotExpressible("; ".join(why))
    return dict(hidden_size=int(cfg["hidden"]), intermediate_size=int(cfg["ffn"]),
                intermediate_size_mlp=int(cfg["ffn"]), num_local_experts=int(cfg["experts"]),
                num_experts_per_tok=1, hidden_act="silu")


def _weight_on_output(self, h):
    """The negative control's forward: the score scales the expert's output."""
    h = h.reshape(-1, self.hidden_dim)
    sc, lg = self.router(h)
    ro = self.experts(h.repeat(sc.shape[1], 1)) * sc.transpose(0, 1).reshape(-1, 1)
    return self.shared_expert(h) + ro.reshape(sc.shape[1], -1, ro.shape[-1]).sum(0), lg


def build(client, cfg, torch):
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe
    block = Llama4TextMoe(Llama4TextConfig(**client.configure(cfg)))
    if client.defect == "weight-on-output":
        block.forward = types.MethodType(_weight_on_output, block)
    return block.eval()


def load_inputs(client, block, golden, torch):
    """The golden's weights into the block (fp32), then the block to the case's dtype."""
    a = lambda n: torch.from_numpy(golden.array(n)).float()
    with torch.no_grad():
        block.experts.gate_up_proj.copy_(torch.cat([a("w_gate"), a("w_up")], -1))
        block.experts.down_proj.copy_(a("w_down"))
        block.router.weight.copy_(a("router_weight").t())
        for name in ("gate", "up", "down"):
            getattr(block.shared_expert, name + "_proj").weight.copy_(a("shared_w_" + name).t())
    block.to(C.TORCH_DTYPES(torch)[golden.config["dtype"]])


def run_block(client, block, golden, torch, device="cpu"):
    """Forward and backward on the golden's x and d_out: {stage: tensor or array}."""
    dt, f = C.TORCH_DTYPES(torch)[golden.config["dtype"]], golden.dims["f"]
    seen = {}

    def grab(m, args, out):
        out[1].retain_grad()
        seen["scores"], seen["logits"] = out

    block.router.register_forward_hook(grab)
    x = torch.from_numpy(golden.array("x")).to(device=device, dtype=dt).requires_grad_()
    out, _ = block(x)
    out.backward(torch.from_numpy(golden.array("d_out")).to(device=device, dtype=dt))
    gu, sh = block.experts.gate_up_proj.grad, block.shared_expert
    res = {"router_logits": seen["logits"],
           "router_scores": torch.sigmoid(seen["logits"].float()).to(dt),
           "topk_ids": seen["scores"].float().argmax(1, keepdim=True).to(torch.int32),
           "out": out, "d_x": x.grad, "d_router_logits": seen["logits"].grad,
           "d_router_weight": block.router.weight.grad.t(),
           "d_w_gate": gu[..., :f], "d_w_up": gu[..., f:], "d_w_down": block.experts.down_proj.grad,
           "d_shared_w_gate": sh.gate_proj.weight.grad.t(),
           "d_shared_w_up": sh.up_proj.weight.grad.t(),
           "d_shared_w_down": sh.down_proj.weight.grad.t()}
    return {k: C._np(v, torch) for k, v in res.items()}
