"""transformers' LongcatFlashMoE as a conformance client of the catalogue's
longcat-like cases (route.zero_experts, doc/format.md "Zero experts").

LongCat-Flash's router (LongcatFlashTopkRouter) scores E + Z columns, the
E real experts and Z zero experts: a softmax over all of them in fp32, the
top-k chosen on the scores plus e_score_correction_bias (the bias for the
selection only), the weights the chosen scores times routed_scaling_factor
(no renormalisation). LongcatFlashExperts runs an id >= E as nn.Identity:
the token's input, times its weight, is added into the output. Its
gate_up_proj has E + Z rows (the zero experts' are never read: zeroed
here, their gradient exactly 0) and down_proj E.

The block is built from its config alone (no weights from any hub), the
golden's inputs are copied into it (the router kept in fp32: the golden's
router weight and bias are fp32), it runs forward and backward (CPU or GPU)
and what it exposes becomes two candidates: `chained` (the router's
logits, the ids and weights it hands the experts, out, d_x, the gradients
of the logits, the weights, the router weight and the real experts'
weights) and `fused` (out and d_x only). The negative control
`identity-dropped` (the zero experts' weights set to 0 on their way into
the experts: every identity slot dropped) must be NOT CONFORMANT.

The functions are clients.py's hooks (Client.hooks: build, load_inputs,
run_block) of the rows longcat-flash and its negative control; run.py
drives them (`make check-clients`, or `run.py --clients 'longcat-flash*'`).
"""

import numpy as np


class NotExpressible(Exception):
    """The case cannot be put into LongcatFlashMoE; str(e) says why."""


def configure(cfg, error=NotExpressible):
    """LongcatFlashConfig keyword arguments for a case config, or `error`."""
    why = []
    Z = int(cfg.get("zero_experts", 0) or 0)
    if Z < 1:
        why.append("the block's router has zero (identity) experts (zero_experts >= 1; "
                   "zero_expert_num 0 would make it a plain softmax block)")
    if cfg["score_function"] != "softmax" or int(cfg["renormalize"]):
        why.append("the block's weights are softmax scores over all experts, not renormalised")
    if not int(cfg["has_bias"]):
        why.append("the block always adds e_score_correction_bias (has_bias 1)")
    if int(cfg["n_group"]) > 1:
        why.append("the block has no group-limited routing")
    if cfg["ffn_kind"] != "swiglu" or int(cfg.get("shared_experts", 0) or 0):
        why.append("the block's experts are SwiGLU, without shared experts")
    if why:
        raise error("; ".join(why))
    return dict(hidden_size=int(cfg["hidden"]), expert_ffn_hidden_size=int(cfg["ffn"]),
                n_routed_experts=int(cfg["experts"]), zero_expert_num=Z,
                moe_topk=int(cfg["top_k"]), routed_scaling_factor=float(cfg["scaling"]),
                hidden_act="silu", num_layers=1, num_attention_heads=1, vocab_size=32)


def dtype(golden, torch):
    return {"fp32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[golden.config["dtype"]]


def build(client, cfg, torch):
    from transformers import LongcatFlashConfig
    from transformers.models.longcat_flash.modeling_longcat_flash import LongcatFlashMoE
    # the row's configure (clients.py's: its NotExpressible), else this module's
    kwargs = getattr(client, "configure", configure)(cfg)
    block = LongcatFlashMoE(LongcatFlashConfig(**kwargs)).eval()
    block.defect = getattr(client, "defect", None)
    return block


def load_inputs(client, block, golden, torch):
    """The golden's weights into the block, the block to the case's dtype,
    the router back in fp32 (its weight and bias the golden's exactly)."""
    a = lambda n: torch.from_numpy(np.asarray(golden.array(n), dtype=np.float32))
    E = golden.dims["E"]
    ex = block.experts
    with torch.no_grad():
        gu = torch.cat([a("w_gate"), a("w_up")], -1).transpose(1, 2)  # [E, 2f, d]: gate rows first
        ex.gate_up_proj.zero_()  # the zero experts' rows: never read
        ex.gate_up_proj[:E].copy_(gu)
        ex.down_proj.copy_(a("w_down").transpose(1, 2))  # [E, d, f]
        block.router.classifier.weight.copy_(a("router_weight").t())  # [E + Z, d]
        block.router.e_score_correction_bias.copy_(a("expert_bias"))
    block.to(dtype(golden, torch))
    block.router.float()


def run_block(client, block, golden, torch, device="cpu"):
    """Forward and backward on the golden's x and d_out: {stage: array}."""
    dt, E, f = dtype(golden, torch), golden.dims["E"], golden.dims["f"]
    seen = {}

    def grab_router(m, args, out):
        out[0].retain_grad()
        seen["logits"] = out[0]

    def grab_routing(m, args):  # experts(hidden_states, top_k_index, top_k_weights)
        h, ids, w = args
        w.retain_grad()
        seen["ids"], seen["weights"] = ids, w
        if block.defect == "identity-dropped":  # every zero expert's slot weighted 0
            return h, ids, w * (ids < E).to(w.dtype)
        return None

    block.router.register_forward_hook(grab_router)
    block.experts.register_forward_pre_hook(grab_routing)
    def arr(name):  # a golden array as a tensor on the block's device
        a = np.asarray(golden.array(name), dtype=np.float32)
        return torch.from_numpy(a).to(device=device, dtype=dt)

    x = arr("x").reshape(1, -1, golden.dims["d"]).requires_grad_()
    out = block(x)
    out.backward(arr("d_out").reshape(out.shape))
    ex = block.experts
    gu = ex.gate_up_proj.grad[:E].transpose(1, 2)  # [E, d, 2f]; the zero experts' rows unused
    res = {"router_logits": seen["logits"], "topk_ids": seen["ids"].to(torch.int32),
           "topk_weights": seen["weights"], "out": out.reshape(-1, golden.dims["d"]),
           "d_x": x.grad.reshape(-1, golden.dims["d"]), "d_router_logits": seen["logits"].grad,
           "d_topk_weights": seen["weights"].grad,
           "d_router_weight": block.router.classifier.weight.grad.t(),
           "d_w_gate": gu[..., :f], "d_w_up": gu[..., f:],
           "d_w_down": ex.down_proj.grad.transpose(1, 2)}
    return {k: v.detach().cpu().numpy() if v.dtype == torch.int32
            else v.detach().cpu().float().numpy() for k, v in res.items()}
