"""The MoE layer of my_moe.py written in PyTorch, backward by autograd: the
forward pass runs in float64 and every value the layer stores is rounded
to its storage type on the way forward, and its gradient on the way back
(the Store function below), as the layer's bf16/fp16 kernels would store
them. The "kernel under test" of examples/test_my_kernel.py."""

import torch

F64 = torch.float64
STORE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Store(torch.autograd.Function):
    """Identity that rounds the value to dtype forward and its gradient to
    dtype backward; grads[name] keeps the stored gradient."""

    @staticmethod
    def forward(ctx, t, dtype, name, grads):
        ctx.dtype, ctx.name, ctx.grads = dtype, name, grads
        return t.to(dtype).to(F64)

    @staticmethod
    def backward(ctx, g):
        g = g.to(ctx.dtype)
        if ctx.name:
            ctx.grads[ctx.name] = g
        return g.to(F64), None, None, None


def _route(cfg, scores, bias):
    T, E = scores.shape
    key = scores.detach()
    if cfg["has_bias"]:
        key = (key + bias).to(torch.float32).to(F64)
    ng = cfg["n_group"]
    if ng > 1:
        G = E // ng
        terms = {"max": 1, "top2_sum": 2}.get(cfg["group_score"], cfg["top_k"] // cfg["topk_group"])
        top = key.reshape(T, ng, G).sort(-1, descending=True).values[..., :min(max(terms, 1), G)]
        gscore = top.sum(-1).to(torch.float32)
        keep = torch.argsort(-gscore, dim=-1, stable=True)[:, :cfg["topk_group"]]
        mask = torch.zeros(T, ng, dtype=torch.bool).scatter_(1, keep, True)
        key = torch.where(mask.repeat_interleave(G, dim=1), key, torch.tensor(float("-inf"), dtype=F64))
    return torch.argsort(-key, dim=-1, stable=True)[:, :cfg["top_k"]]


def moe_layer(g):
    """Every stage value and gradient of golden g's layer, as tensors in
    their storage types."""
    cfg, act = g.config, STORE[g.config["dtype"]]
    T, E, k = cfg["tokens"], cfg["experts"], cfg["top_k"]
    inp = {n: t.to(F64) for n, t in g.inputs.as_storage("torch").items()}  # exact widening
    leaves = {n: inp[n].requires_grad_() for n in ("x", "router_weight", "w_gate", "w_up", "w_down",
                                                    "shared_w_gate", "shared_w_up", "shared_w_down",
                                                    "shared_gate_weight", "router_bias")
              if n in inp}
    grads, fw = {}, {}

    def store(name, t, dtype):
        t = Store.apply(t, dtype, "d_" + name, grads)
        fw[name] = t
        return t

    logits = inp["x"] @ inp["router_weight"]
    if "router_bias" in inp:  # gpt-oss: a bias on the logits
        logits = logits + inp["router_bias"]
    logits = store("router_logits", logits, torch.float32)
    fn = cfg["score_function"]
    scores = store("router_scores", torch.softmax(logits, -1) if fn == "softmax"
                   else torch.sqrt(torch.nn.functional.softplus(logits)) if fn == "sqrtsoftplus"
                   else logits if fn == "softmax_topk" else torch.sigmoid(logits), torch.float32)
    if cfg.get("hash_vocab"):  # DeepSeek-V4's hash layers: the table chooses
        ids = inp["hash_table"].long()[inp["token_ids"].long()].reshape(T, k)
    else:
        ids = _route(cfg, scores, inp.get("expert_bias"))
    picked = scores.gather(1, ids)
    if fn == "softmax_topk":  # top-k on the logits, then softmax over the selected
        picked = torch.softmax(picked, -1)
    w = cfg["scaling"] * picked / (picked.sum(-1, keepdim=True) if cfg["renormalize"] else 1.0)
    win = cfg.get("weight_on_input")  # Llama-4: the score scales the expert's input
    if win:
        w_in, w = w, torch.ones_like(w.detach()).requires_grad_()  # the combine's weights
    w = store("topk_weights", w, torch.float32)
    perm = torch.argsort(ids.reshape(-1), stable=True)
    # zero experts (ids >= E, LongCat-Flash) sort after the real ones: the identity tail
    sizes = torch.bincount(ids.reshape(-1), minlength=E)[:E]
    off = [0] + torch.cumsum(sizes, 0).tolist()
    xs = inp["x"][perm // k]
    xs = store("x_sorted", xs * w_in.reshape(-1)[perm][:, None] if win else xs, act)

    def grouped(a, wts, tail=None):  # the identity tail's rows: `tail`'s, else 0
        rest = tail[off[E]:] if tail is not None else a.new_zeros(a.shape[0] - off[E], wts.shape[2])
        return torch.cat([a[off[e]:off[e + 1]] @ wts[e] for e in range(E)] + [rest], 0)

    h = xs
    if cfg["ffn_kind"] == "swiglu":
        hg = store("h_gate", grouped(xs, inp["w_gate"]), act)
        hu = store("h_up", grouped(xs, inp["w_up"]), act)
        h = store("h_act", torch.nn.functional.silu(hg) * hu, act)
    y = store("y_sorted", grouped(h, inp["w_down"], tail=xs), act)  # a zero expert: its input
    inv = torch.argsort(perm, stable=True)
    out = torch.einsum("tkd,tk->td", y[inv].reshape(T, k, cfg["hidden"]), w)
    if cfg.get("shared_experts"):  # always-on experts, added (scaled by their gate)
        sg = store("shared_h_gate", inp["x"] @ inp["shared_w_gate"], act)
        su = store("shared_h_up", inp["x"] @ inp["shared_w_up"], act)
        sa = store("shared_h_act", torch.nn.functional.silu(sg) * su, act)
        sy = store("shared_y", sa @ inp["shared_w_down"], act)
        if cfg.get("shared_gate"):
            logit = store("shared_gate_logit", inp["x"] @ inp["shared_gate_weight"], torch.float32)
            sy = store("shared_gate", torch.sigmoid(logit), torch.float32)[:, None] * sy
        out = out + sy
    out = store("out", out, act)
    out.backward(inp["d_out"])
    res = {n: t.detach().to(act if g.dtype_of(n) != "fp32" else torch.float32)
           for n, t in fw.items()}
    res.update({n: t for n, t in grads.items() if n != "d_out" and n in g.stages()})
    res["d_topk_weights"] = grads["d_topk_weights"]
    for n, t in leaves.items():
        res["d_" + n] = t.grad.to(act if n == "x" else torch.float32)
    res.update(topk_ids=ids.to(torch.int32), sort_perm=perm.to(torch.int32),
               inv_perm=inv.to(torch.int32), group_sizes=sizes,
               group_offsets=torch.tensor(off, dtype=torch.int64))
    return res
