"""Legitimate implementations of the MoE layer (issue 24, Tests): numpy
kernels that compute what a correct GPU kernel may compute, each within
the arithmetic its declared profile allows, so the runner must find every
one CONFORMANT on every case and seed (a FAIL is a false alarm).

    fp32-blocked      every GEMM in fp32, K in blocks of 8 added last block first
    fp32-split-k      every GEMM split into 4 K-slices, the partial fp32 products summed
    bf16-interm       (bf16 cases) intermediates stored in bf16, fp32 accumulation
    swiglu-fused      SwiGLU evaluated in fp32 on the unrounded GEMM results (an epilogue)
    atomics-combine   the combine and d_x's un-permute summed in fp32 in a random slot order
    bf16-dw-unlabelled (bf16 cases) bf16 weight gradients in fp32 containers, no dtype label

Every kernel stores the stages of the case's type rounded to it (bf16 on a
bf16 case), as the zoo's Layer does (tests/zoo/kernels.py, read only here);
the variants override only the arithmetic they change.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.dont_write_bytecode = True
import kernels as K  # noqa: E402

F32 = np.float32


def inputs(golden):
    """The Layer's (config, inputs) from a dropless.Golden, routing ids the
    golden's (as the zoo's kernels take them)."""
    c = dict(golden.config)
    z = {n: golden.array(n) for n in ("x", "router_weight", "w_gate", "w_up", "w_down", "d_out")}
    if c["has_bias"]:
        z["expert_bias"] = golden.array("expert_bias")
    if c.get("shared_experts", 0):
        z.update({n: golden.array(n) for n in ("shared_w_gate", "shared_w_up", "shared_w_down")})
        if c.get("shared_gate", 0):
            z["shared_gate_weight"] = golden.array("shared_gate_weight")
    z["topk_ids"] = golden.array("topk_ids")
    return c, z


def blocked_mm(a, b, block=8):
    """fp32 GEMM with K in blocks, each block's product in fp32 and the
    blocks added in fp32, last first."""
    K_ = a.shape[1]
    acc = np.zeros((a.shape[0], b.shape[1]), F32)
    for k0 in reversed(range(0, K_, block)):
        acc = (acc + (a[:, k0:k0 + block].astype(F32) @ b[k0:k0 + block].astype(F32))).astype(F32)
    return acc


def split_k_mm(a, b, splits=4):
    """Split-K: the partial products of `splits` K-slices in fp32, reduced
    in fp32 (a split-K GEMM's workspace reduction)."""
    K_ = a.shape[1]
    edges = np.linspace(0, K_, splits + 1).astype(int)
    parts = [(a[:, s:e].astype(F32) @ b[s:e].astype(F32)).astype(F32) for s, e in zip(edges, edges[1:])]
    acc = parts[0]
    for p in parts[1:]:
        acc = (acc + p).astype(F32)
    return acc


class Blocked(K.Layer):
    def mm(self, a, b):
        return blocked_mm(self.ri(a), self.ri(b))


class SplitK(K.Layer):
    def mm(self, a, b):
        return split_k_mm(self.ri(a), self.ri(b))


class SwigluFused(K.Layer):
    """h_act = RN(swiglu(h_gate, h_up)) of the fp32 GEMM results, before
    they are rounded for storage (a GEMM with an activation epilogue)."""

    def forward(self):
        z = self.z
        tok = self.perm // self.k
        xs = z["x"][tok]
        hg = np.empty((len(tok), int(self.c["ffn"])), F32)
        hu = np.empty_like(hg)
        for e in range(self.E):
            a, b = self.off[e], self.off[e + 1]
            hg[a:b] = self.mm(xs[a:b], z["w_gate"][e])
            hu[a:b] = self.mm(xs[a:b], z["w_up"][e])
        self.act = lambda g_, u_: K.swiglu(hg, hu)
        return K.Layer.forward(self)


class AtomicsCombine(K.Layer):
    """out[t] and d_x[t]'s un-permuted sum accumulated in fp32 in a random
    order of the slots per token (atomicAdd's arrival order)."""

    def __init__(self, *a, order_seed=0, **kw):
        super().__init__(*a, **kw)
        rng = np.random.default_rng(order_seed)
        self.order = np.argsort(rng.random((self.T, self.k)), axis=1)

    def atomic_sum(self, rows):  # rows [T, k, d], summed in self.order
        acc = np.zeros((rows.shape[0], rows.shape[2]), F32)
        t = np.arange(rows.shape[0])
        for j in range(self.k):
            acc = (acc + rows[t, self.order[:, j]]).astype(F32)
        return acc

    def combine(self, rows):  # the Layer's combine and d_x un-permute
        return self.atomic_sum(rows)


def _make(cls, c, z, bf16, seed, **kw):
    rnd = K.bf16 if bf16 else (lambda a: a.astype(F32))
    if cls is AtomicsCombine:
        kw["order_seed"] = seed
    return cls(c, z, rnd=rnd, **kw)


# name, class, extra Layer arguments, applies(dtype)
IMPLS = [
    ("fp32-blocked", Blocked, {}, lambda t: t in ("fp32", "bf16")),
    ("fp32-split-k", SplitK, {}, lambda t: t in ("fp32", "bf16")),
    ("bf16-interm", K.Layer, {}, lambda t: t == "bf16"),
    ("swiglu-fused", SwigluFused, {}, lambda t: t in ("fp32", "bf16")),
    ("atomics-combine", AtomicsCombine, {}, lambda t: t in ("fp32", "bf16")),
    ("bf16-dw-unlabelled", K.Layer, {"rw": K.bf16}, lambda t: t == "bf16"),
]


def run(name, golden, seed=0, cz=None):
    """The stages of implementation `name` on golden (a dict stage -> array,
    what a candidate holds), or None when it does not apply to the case.
    cz: inputs(golden), when the caller runs several implementations on one
    golden (each call copies the weights otherwise; the kernels only read
    them)."""
    _, cls, kw, applies = next(r for r in IMPLS if r[0] == name)
    c, z = cz or inputs(golden)
    if not applies(c["dtype"]) or c["ffn_kind"] != "swiglu" or int(c["tokens"]) == 0:
        return None
    L = _make(cls, c, z, c["dtype"] == "bf16", seed, **kw)
    L.forward()
    L.backward()
    return {k.split("/")[1]: v for k, v in L.stages().items()}
