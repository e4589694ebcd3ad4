#!/usr/bin/env python3
"""A MaxText-style JAX MoE layer (router GEMM, top-k, argsort dispatch,
jax.lax.ragged_dot SwiGLU experts, weighted combine) checked against the
exact oracle inside jit, forward and jax.grad.

    python examples/jax_moe_ffi.py [--case mixtral-small-bf16] [--device cpu|gpu]
                                   [--profile PROFILE] [--defect renormalize]

The layer under test runs on --device; the oracle (dropless.jax.moe_forward,
an XLA FFI target of the CPU platform) runs in its own jit on the host. The
same jitted programs that compute the layer's stages and gradients hand them
to dropless.jax.check, the runner's verdict in a host callback, whose report
is printed. Exit status 0 when forward and backward are conformant and the
oracle's values are the golden's bits, 1 otherwise.

This layer is the kernel under test, not part of dropless: dropless only
judges what it returns.
"""

import argparse
import sys

import numpy as np
import jax
import jax.numpy as jnp

import dropless
from dropless import jax as djax

ACT = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}
HI = jax.lax.Precision.HIGHEST  # fp32 matmuls in fp32 (GPUs default to TF32)
F32 = jnp.float32


def route(cfg, x, router_weight, expert_bias, defect=None):
    """Router logits and scores in fp32, group-limited top-k on the scores
    (+ the selection-only bias), the weights of the chosen experts."""
    logits = jnp.dot(x.astype(F32), router_weight, precision=HI)
    scores = (jax.nn.softmax(logits, axis=-1) if cfg["score_function"] == "softmax"
              else jax.nn.sigmoid(logits))
    key = scores + expert_bias if cfg["has_bias"] else scores
    T, E = key.shape
    ng, kg, k = cfg["n_group"], cfg["topk_group"], cfg["top_k"]
    if ng > 1 and kg < ng:
        G = E // ng
        terms = {"max": 1, "top2_sum": 2}.get(cfg["group_score"], max(k // kg, 1))
        gscore = jax.lax.top_k(key.reshape(T, ng, G), min(terms, G))[0].sum(-1)
        keep = jax.lax.top_k(gscore, kg)[1]
        mask = jnp.zeros((T, ng), bool).at[jnp.arange(T)[:, None], keep].set(True)
        key = jnp.where(jnp.repeat(mask, G, axis=1), key, -jnp.inf)
    ids = jax.lax.top_k(key, k)[1]
    picked = jnp.take_along_axis(scores, ids, axis=1)
    if cfg["renormalize"] and defect != "renormalize":
        picked = picked / picked.sum(-1, keepdims=True)
    return logits, scores, ids.astype(jnp.int32), cfg["scaling"] * picked


def moe_layer(cfg, x, router_weight, w_down, w_gate=None, w_up=None, expert_bias=None, defect=None):
    """Every stage value the layer stores, as dropless names them. defect
    "renormalize" forgets to renormalise the top-k weights (a bug the check
    must catch)."""
    act = ACT[cfg["dtype"]]
    T, k, E = x.shape[0], cfg["top_k"], router_weight.shape[1]
    logits, scores, ids, weights = route(cfg, x, router_weight, expert_bias, defect)
    flat = ids.reshape(-1)
    perm = jnp.argsort(flat, stable=True).astype(jnp.int32)  # sorted row -> t*k + j
    inv = jnp.argsort(perm, stable=True).astype(jnp.int32)
    sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
    offsets = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(sizes).astype(jnp.int32)])
    xs = x[perm // k]

    def gemm(a, w):
        return jax.lax.ragged_dot(a, w, sizes, precision=HI, preferred_element_type=F32).astype(act)
    st = {"router_logits": logits, "router_scores": scores, "topk_ids": ids,
          "topk_weights": weights, "sort_perm": perm, "inv_perm": inv, "group_sizes": sizes,
          "group_offsets": offsets, "x_sorted": xs}
    if cfg["ffn_kind"] == "swiglu":
        hg, hu = gemm(xs, w_gate), gemm(xs, w_up)
        ha = (jax.nn.silu(hg.astype(F32)) * hu.astype(F32)).astype(act)
        st.update(h_gate=hg, h_up=hu, h_act=ha)
        ys = gemm(ha, w_down)
    else:
        ys = gemm(xs, w_down)
    y = ys[inv].reshape(T, k, ys.shape[-1]).astype(F32)
    st.update(y_sorted=ys, out=jnp.sum(y * weights[..., None], axis=1).astype(act))
    return st


def bits(a):
    a = np.asarray(a)
    return a.astype(np.int64) if a.dtype.kind in "iu" else a.astype(np.float32).view(np.uint32)


def same_bits(got, ref):
    return {n: bool(np.array_equal(bits(got[n]), bits(ref[n]))) for n in got}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="mixtral-small-bf16", help="a catalogue case")
    ap.add_argument("--device", default="cpu", help="where the layer under test runs: cpu, gpu")
    ap.add_argument("--profile", help="the runner's profile (default: the case's dtype: fp32, "
                    "bf16 or fp16: GEMMs on inputs of that type, accumulated in fp32)")
    ap.add_argument("--defect", choices=["renormalize"], help="break the layer on purpose: "
                    "the check must then say NOT conformant")
    args = ap.parse_args(argv)
    g = dropless.generate(args.case)
    cfg = dict(g.config)
    profile = args.profile or cfg["dtype"]
    dev, host = jax.devices(args.device)[0], jax.devices("cpu")[0]
    inputs = g.inputs.as_storage("ml_dtypes")
    d_out = inputs.pop("d_out")
    params = [n for n in ("x", "router_weight", "w_gate", "w_up", "w_down") if n in inputs]
    on_dev = jax.device_put(inputs, dev)
    on_host = jax.device_put(inputs, host)
    print("case %s on %s (%s); oracle on %s; profile %s; handler %s" % (
        g.case, dev, dev.platform, host, profile, djax.register()))

    @jax.jit
    def forward_checked(ins):  # on dev: the layer, and the runner's verdict on it
        st = moe_layer(cfg, **ins, defect=args.defect)
        return st, djax.check(g, st, profile=profile, backend="jax_moe_ffi")

    def loss(layer, ins, p):
        out = layer(**dict(ins, **p))["out"]
        return jnp.sum(out.astype(F32) * jnp.asarray(d_out, F32))

    @jax.jit
    def backward_checked(ins):  # on dev: jax.grad of the layer, and the verdict
        gr = jax.grad(lambda p: loss(lambda **a: moe_layer(cfg, **a, defect=args.defect), ins, p))(
            {n: ins[n] for n in params})
        return gr, djax.check(g, {"d_" + n: v for n, v in gr.items()}, profile=profile,
                              backend="jax_moe_ffi")

    def ffi_layer(x, router_weight, w_down, w_gate=None, w_up=None, expert_bias=None):
        return djax.moe_forward(x, router_weight, w_gate, w_up, w_down, expert_bias, config=g)

    @jax.jit
    def oracle(ins):  # on the host: the FFI oracle, forward and its custom VJP
        gr = jax.grad(lambda p: loss(ffi_layer, ins, p))({n: ins[n] for n in params})
        return ffi_layer(**ins), gr

    stages, fwd_summary = forward_checked(on_dev)
    fwd_summary = np.asarray(fwd_summary)  # waits for the program, its callback included
    fwd_report = djax.last_report()
    grads, bwd_summary = backward_checked(on_dev)
    bwd_summary = np.asarray(bwd_summary)
    bwd_report = djax.last_report()
    o_st, o_gr = oracle(on_host)

    exact_fwd = same_bits(o_st, {n: g.forward[n] for n in o_st})
    exact_bwd = same_bits({"d_x": o_gr["x"]}, {"d_x": g.backward["d_x"]})
    print("\n== forward: the layer on %s, judged inside its jit ==" % dev.platform)
    print(fwd_report.table())
    print("summary [conformant, PASS, WARN, FAIL] from inside jit:", [int(v) for v in fwd_summary])
    print("\n== backward: jax.grad of <out, d_out> on %s, judged inside its jit ==" % dev.platform)
    print(bwd_report.table())
    print("summary [conformant, PASS, WARN, FAIL] from inside jit:", [int(v) for v in bwd_summary])
    print("\n== the layer against the FFI oracle (max |layer - oracle|) ==")
    for n in ("router_logits", "topk_weights", "h_act", "out"):
        if n in stages:
            diff = np.abs(np.asarray(stages[n], np.float64) - np.asarray(o_st[n], np.float64))
            print("  %-14s %.3g" % (n, diff.max() if diff.size else 0.0))
    for n in params:
        diff = np.abs(np.asarray(grads[n], np.float64) - np.asarray(o_gr[n], np.float64))
        print("  d_%-12s %.3g" % (n, diff.max() if diff.size else 0.0))
    ok_oracle = all(exact_fwd.values()) and all(exact_bwd.values())
    print("oracle (FFI, under jit) bit-identical to the golden: forward %s, grad d_x %s" % (
        all(exact_fwd.values()), all(exact_bwd.values())))
    verdict = fwd_report.conformant and bwd_report.conformant and ok_oracle
    print("\n%s: forward %s, backward %s" % ("conformant" if verdict else "NOT conformant",
                                            fwd_report.verdict, bwd_report.verdict))
    if not verdict:
        print(fwd_report.explain())
        print(bwd_report.explain())
    g.close()
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
