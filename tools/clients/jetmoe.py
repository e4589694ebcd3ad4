"""transformers' JetMoeMoE as a conformance client: the hooks of the
`jetmoe` row of clients.CLIENTS (Client.hooks).

JetMoE routes by the top-k router logits and a softmax over those k (the
catalogue's softmax_topk, without a router-logit bias), and its experts
are one module pair, input_linear [E, 2f, d] (gate rows, then up rows:
[w_gateᵀ; w_upᵀ]) and output_linear [E, d, f] (w_downᵀ), run over the
(token, slot) pairs sorted by expert. It has no experts module taking (x,
ids, weights), so clients.py's generic run_block cannot read the routing:
the router (JetMoeTopKGating) returns (index_sorted_experts, batch_index,
batch_gates, expert_size, logits), the weights in the sorted order, from
which run_block here puts topk_ids and topk_weights back in token order
(and d_topk_weights from batch_gates' gradient). The block adds a bias
[d] to its output that no catalogue stage has: zeroed (as a shared expert
the case lacks is), the block is the case's layer.
"""

import clients as C


def configure(cfg):
    """JetMoeConfig keyword arguments for a case config, or C.NotExpressible."""
    C.softmax_topk_plain(cfg)
    return dict(hidden_size=cfg["hidden"], intermediate_size=cfg["ffn"],
                num_local_experts=cfg["experts"], num_experts_per_tok=cfg["top_k"],
                activation_function="silu", num_hidden_layers=1, num_attention_heads=1,
                num_key_value_heads=1, kv_channels=8, vocab_size=32)


def build(client, cfg, torch):
    from transformers import JetMoeConfig
    from transformers.models.jetmoe.modeling_jetmoe import JetMoeMoE
    return JetMoeMoE(JetMoeConfig(**client.configure(cfg))).eval()


def load_inputs(client, block, golden, torch):
    """The golden's weights into the block, then the block to the case's
    dtype (the router too: JetMoE casts its softmax's output to its input's
    dtype, so an fp32 router would make the whole block fp32; the router
    weight is rounded on the way in, as the [router-in-dtype] rows'), the
    output bias zeroed."""
    a = lambda n: torch.from_numpy(golden.array(n)).float()
    with torch.no_grad():
        block.input_linear.weight.copy_(torch.cat([a("w_gate"), a("w_up")], -1).transpose(1, 2))
        block.output_linear.weight.copy_(a("w_down").transpose(1, 2))
        block.router.layer.weight.copy_(a("router_weight").t())
        block.bias.zero_()
    block.to(C.TORCH_DTYPES(torch)[golden.config["dtype"]])


def run_block(client, block, golden, torch, device="cpu"):
    """Forward and backward on the golden's x and d_out: {stage: tensor or array}."""
    dt = C.TORCH_DTYPES(torch)[golden.config["dtype"]]
    T, d, f, k = golden.dims["T"], golden.dims["d"], golden.dims["f"], golden.config["top_k"]
    seen = {}

    def grab(m, args, out):
        order, _, gates, sizes, logits = out
        gates.retain_grad()
        logits.retain_grad()
        seen.update(order=order, gates=gates, sizes=sizes, logits=logits)

    block.router.register_forward_hook(grab)
    x = torch.from_numpy(golden.array("x")).to(device=device, dtype=dt)
    x = x.reshape(1, T, d).requires_grad_()
    out = block(x).reshape(T, d)
    out.backward(torch.from_numpy(golden.array("d_out")).to(device=device, dtype=dt))
    # the routing's bookkeeping on the CPU (the block's tensors may be on a GPU)
    order, gates, grad = seen["order"].cpu(), seen["gates"].detach().cpu(), seen["gates"].grad.cpu()
    experts = torch.repeat_interleave(torch.arange(len(seen["sizes"])),
                                      torch.tensor(seen["sizes"]))
    ids = torch.empty(T * k, dtype=torch.int32)
    ids[order] = experts.to(torch.int32)
    w, dw = torch.empty(T * k, dtype=gates.dtype), torch.empty(T * k, dtype=gates.dtype)
    w[order], dw[order] = gates, grad
    gu, dn = block.input_linear.weight.grad, block.output_linear.weight.grad
    res = {"router_logits": seen["logits"], "topk_ids": ids.reshape(T, k),
           "topk_weights": w.reshape(T, k), "out": out, "d_x": x.grad.reshape(T, d),
           "d_topk_weights": dw.reshape(T, k), "d_router_logits": seen["logits"].grad,
           "d_router_weight": block.router.layer.weight.grad.t(),
           "d_w_gate": gu[:, :f].transpose(1, 2), "d_w_up": gu[:, f:].transpose(1, 2),
           "d_w_down": dn.transpose(1, 2)}
    return {k_: C._np(v, torch) for k_, v in res.items()}
