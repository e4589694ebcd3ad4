"""transformers' Llama4TextMoe as a conformance client of the catalogue's
llama4-like cases (route.weight_on_input, doc/format.md).

Llama-4 routes by a sigmoid of the top-1 router logit that scales the
expert's INPUT (routed_in = x * sigmoid(score)); the experts' outputs are
summed unweighted and a shared expert of width f is added. The block is
built from its config alone (no weights from any hub), the golden's inputs
are copied into it, it runs forward and backward on the CPU, and what it
exposes becomes two candidates: `chained` (the router's logits, the ids,
the scores, out, d_x and every weight's gradient) and `fused` (out and d_x
only). A negative control (`weight-on-output`: the weight applied to the
expert's output, the Mixtral way) must be NOT CONFORMANT.

The scores: Llama4Router keeps sigmoid(logit) of the selected experts
only, rounded to the model's dtype before the product; the chained
candidate hands over router_scores = sigmoid(logits) in that dtype for
every expert (the block's own formula), so the routed input the checker
expects, RN(x * s), is the block's own (without them, the bf16 block's
rounded score is a hidden error that x_sorted, a bitwise-checked value,
does not carry: d_w_down then FAILs at 2.9x on llama4-like-bf16).

The module's functions follow clients.py's (configure, load_inputs,
run_block); `python3 tools/clients/llama4.py --dropless PATH --vectors DIR
-o OUTDIR` runs it alone (exit 1 when a verdict is not the expected one).
"""

import argparse
import os
import subprocess
import sys
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("llama4-like", "llama4-like-bf16", "llama4-like-fp16")


class NotExpressible(Exception):
    """The case cannot be put into Llama4TextMoe; str(e) says why."""


def configure(cfg):
    """Llama4TextConfig keyword arguments for a case config, or NotExpressible."""
    why = []
    if not int(cfg.get("weight_on_input", 0) or 0):
        why.append("the block applies the score to the expert's input (weight_on_input 1)")
    if cfg["score_function"] != "sigmoid" or int(cfg["top_k"]) != 1:
        why.append("the block routes by sigmoid top-1")
    if int(cfg["has_bias"]) or int(cfg["n_group"]) > 1:
        why.append("the block has no selection bias or groups")
    S, fs = int(cfg.get("shared_experts", 0) or 0), int(cfg.get("shared_ffn", 0) or 0)
    if S != 1 or fs != int(cfg["ffn"]) or int(cfg.get("shared_gate", 0) or 0):
        why.append("the block has one ungated shared expert of width f")
    if cfg["ffn_kind"] != "swiglu":
        why.append("the block's experts are SwiGLU")
    if why:
        raise NotExpressible("; ".join(why))
    return dict(hidden_size=int(cfg["hidden"]), intermediate_size=int(cfg["ffn"]),
                intermediate_size_mlp=int(cfg["ffn"]), num_local_experts=int(cfg["experts"]),
                num_experts_per_tok=1, hidden_act="silu")


def _weight_on_output(self, h):
    """The negative control's forward: the score scales the expert's output."""
    h = h.reshape(-1, self.hidden_dim)
    sc, lg = self.router(h)
    ro = self.experts(h.repeat(sc.shape[1], 1)) * sc.transpose(0, 1).reshape(-1, 1)
    return self.shared_expert(h) + ro.reshape(sc.shape[1], -1, ro.shape[-1]).sum(0), lg


def build(cfg, torch, defect=None):
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe
    block = Llama4TextMoe(Llama4TextConfig(**configure(cfg)))
    if defect == "weight-on-output":
        block.forward = types.MethodType(_weight_on_output, block)
    return block


def load_inputs(block, golden, torch):
    """The golden's weights into the block (fp32), then the block to the case's dtype."""
    a = lambda n: torch.from_numpy(np.asarray(golden.array(n), dtype=np.float32))
    with torch.no_grad():
        block.experts.gate_up_proj.copy_(torch.cat([a("w_gate"), a("w_up")], -1))
        block.experts.down_proj.copy_(a("w_down"))
        block.router.weight.copy_(a("router_weight").t())
        for name in ("gate", "up", "down"):
            getattr(block.shared_expert, name + "_proj").weight.copy_(a("shared_w_" + name).t())
    block.to(dtype(golden, torch))


def dtype(golden, torch):
    return {"fp32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[golden.config["dtype"]]


def run_block(block, golden, torch):
    """Forward and backward on the golden's x and d_out: {stage: numpy array}."""
    dt, f = dtype(golden, torch), golden.dims["f"]
    seen = {}

    def grab(m, args, out):
        out[1].retain_grad()
        seen["scores"], seen["logits"] = out

    block.router.register_forward_hook(grab)
    x = torch.from_numpy(np.asarray(golden.array("x"), dtype=np.float32)).to(dt).requires_grad_()
    out, _ = block(x)
    out.backward(torch.from_numpy(np.asarray(golden.array("d_out"), dtype=np.float32)).to(dt))
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
    return {k: v.detach().numpy() if v.dtype == torch.int32 else v.detach().float().numpy()
            for k, v in res.items()}


def _verdict(dropless, golden, cand):
    p = subprocess.run([dropless, "check", golden, cand], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    last = [l for l in p.stdout.splitlines() if "CONFORMANT" in l]
    return last[-1] if last else p.stderr.strip()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dropless", required=True)
    ap.add_argument("--vectors", required=True)
    ap.add_argument("-o", dest="out", required=True)
    a = ap.parse_args(argv)
    import torch
    import dropless
    os.makedirs(a.out, exist_ok=True)
    bad = 0
    runs = [(m, None) for m in ("chained", "fused")] + [("fused", "weight-on-output")]
    for case in CASES:
        gpath = os.path.join(a.vectors, case + ".h5")
        for mode, defect in runs:
            g = dropless.load(gpath)
            block = build(dict(g.config), torch, defect)
            load_inputs(block, g, torch)
            res = run_block(block, g, torch)
            if mode == "fused":
                res = {k: res[k] for k in ("out", "d_x")}
            cand = os.path.join(a.out, "%s--llama4%s--%s.h5" % (case, "-" + defect if defect
                                                                else "", mode))
            prof = "fp32" if g.config["dtype"] == "fp32" else g.config["dtype"] + "-acc"
            dropless.write_candidate(cand, res, g, backend="transformers:llama4",
                                     compute_mode=prof, force=True)
            g.close()
            v = _verdict(a.dropless, gpath, cand)
            want = "NOT CONFORMANT" if defect else "CONFORMANT"
            ok = v.startswith(want)
            bad += not ok
            print("%s %-18s %-16s %-8s %s" % ("ok" if ok else "UNEXPECTED", case,
                                              defect or "llama4", mode, v))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
