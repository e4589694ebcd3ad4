"""JAX adapter: runs jax.lax.ragged_dot (forward) and its VJP (backward) on
a golden file's inputs and writes candidate files.

Backends (one candidate file each), each at two precisions, P = default
(precision=None, XLA's DEFAULT, which on GPUs lets fp32 products take
reduced-precision tensor-core paths) and P = highest (precision=HIGHEST on
every matrix product):
  jax-ragged_dot[P]  stage-isolated: every stage fed the golden values of its
                     inputs; forward ragged_dot, backward jax.vjp, under jit
  jax-moe[P]         chained: a whole MoE layer as JAX users write it
                     (MaxText-like: fp32 router, lax.top_k, argsort, take,
                     ragged_dot, SwiGLU, un-permute and combine in fp32),
                     under jax.jit, backward by jax.vjp

Usage: python3 -m tools.adapters.jax_adapter GOLDEN... -o DIR [--device cpu]
"""

import os
import sys

import numpy as np

from . import common

# Frameworks sharing a GPU: do not let XLA take 75% of it up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

try:
    import jax
    import jax.numpy as jnp
    from jax import lax
except ImportError:
    jax = None


def available():
    if jax is None:
        return False, "JAX is not installed"
    if not hasattr(jax.lax, "ragged_dot"):
        return False, "this JAX (%s) has no jax.lax.ragged_dot" % jax.__version__
    return True, ""


PRECISIONS = ("default", "highest")
MODES = ("isolated", "chained")


def _prec(p):
    return None if p == "default" else lax.Precision.HIGHEST


def _jdt(dtype):
    return {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}[dtype]


def to_np(a):
    """A JAX array as float32 (exact for bf16/fp16) or integer numpy array."""
    a = np.asarray(jax.device_get(a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating)
                                  else a))
    return a


def device_info(platform):
    dev = jax.devices(platform)[0] if platform else jax.devices()[0]
    kind = getattr(dev, "device_kind", dev.platform)
    return dev, "%s (%s)" % (kind, dev.platform)


def probe_fp32(dev, precision):
    """Which arithmetic ragged_dot uses for fp32 operands at this precision:
    compared with float64 products of the operands as given, rounded to
    tf32 (11 bits) and to bf16 (8 bits)."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((2, 256, 128)).astype(np.float32)
    gs = np.array([128, 128], np.int32)
    f = jax.jit(lambda a, b, gs: lax.ragged_dot(a, b, gs, precision=_prec(precision)))
    c = np.asarray(f(jax.device_put(a, dev), jax.device_put(b, dev), jax.device_put(gs, dev)),
                   dtype=np.float64)

    def rnd(x, bits, f=np.rint):
        m, e = np.frexp(x.astype(np.float64))
        return np.ldexp(f(np.ldexp(m, bits)), e - bits)

    res = {}
    for name, bits, f in common.PROBE_GRIDS:
        A, B = rnd(a, bits, f), rnd(b, bits, f)
        ref = np.concatenate([A[:128] @ B[0], A[128:] @ B[1]], 0)
        res[name] = float(np.abs(c - ref).max() / np.abs(ref).max())
    return common.probe_verdict(res)


def compute_mode_for(dtype, probe):
    # bf16/fp16 operands, fp32 accumulation inside each ragged_dot; the VJP
    # adds the two cotangents of x_sorted and the un-permute scatter-adds in
    # the activation dtype: stored parts are summed (-acc).
    if dtype == "bf16":
        return "bf16-acc"
    if dtype == "fp16":
        return "fp16-acc"
    return (probe or {}).get("mode", "fp32")


# ---------------------------------------------------------------- routing

def select(scores, bias, cfg):
    T, E = scores.shape
    k = cfg["top_k"]
    key = scores + bias if cfg["has_bias"] else scores
    ng, kg = cfg["n_group"], cfg["topk_group"]
    if ng > 1:
        G = E // ng
        kk = key.reshape(T, ng, G)
        gs = lax.top_k(kk, common.group_terms(cfg))[0].sum(-1)
        gidx = lax.top_k(gs, kg)[1]
        gmask = jnp.zeros((T, ng), bool).at[jnp.arange(T)[:, None], gidx].set(True)
        key = jnp.where(jnp.repeat(gmask, G, axis=1), key, -jnp.inf)
    return lax.top_k(key, k)[1].astype(jnp.int32)


# ---------------------------------------------------------------- backends

def _put(g, dev):
    dt = _jdt(g.dtype)

    def A(key, dtype=None):
        return jax.device_put(jnp.asarray(g[key], dtype=dtype or dt), dev)
    return A


def run_isolated(g, dev, precision):
    P = _prec(precision)
    A = _put(g, dev)
    gs = jax.device_put(jnp.asarray(g["forward/group_sizes"], jnp.int32), dev)
    rd = lambda a, w: lax.ragged_dot(a, w, gs, precision=P)
    res = {}

    @jax.jit
    def gate_up(xs, wg, wu, dhg, dhu):
        (hg, hu), vjp = jax.vjp(lambda xs, wg, wu: (rd(xs, wg), rd(xs, wu)), xs, wg, wu)
        return (hg, hu) + vjp((dhg, dhu))

    @jax.jit
    def act(hg, hu, dha):
        ha, vjp = jax.vjp(lambda hg, hu: jax.nn.silu(hg) * hu, hg, hu)
        return (ha,) + vjp(dha)

    @jax.jit
    def down(a, wd, dy):
        y, vjp = jax.vjp(rd, a, wd)
        return (y,) + vjp(dy)

    if g.swiglu:
        hg, hu, dxs, dwg, dwu = gate_up(A("forward/x_sorted"), A("inputs/w_gate"), A("inputs/w_up"),
                                        A("backward/d_h_gate"), A("backward/d_h_up"))
        ha, dhg, dhu = act(A("forward/h_gate"), A("forward/h_up"), A("backward/d_h_act"))
        y, dha, dwd = down(A("forward/h_act"), A("inputs/w_down"), A("backward/d_y_sorted"))
        res.update({"forward/h_gate": hg, "forward/h_up": hu, "backward/d_x_sorted": dxs,
                    "backward/d_w_gate": dwg, "backward/d_w_up": dwu, "forward/h_act": ha,
                    "backward/d_h_gate": dhg, "backward/d_h_up": dhu, "forward/y_sorted": y,
                    "backward/d_h_act": dha, "backward/d_w_down": dwd})
    else:
        y, dxs, dwd = down(A("forward/x_sorted"), A("inputs/w_down"), A("backward/d_y_sorted"))
        res.update({"forward/y_sorted": y, "backward/d_x_sorted": dxs, "backward/d_w_down": dwd})
    res = {k: to_np(v) for k, v in res.items()}
    notes = {"kernel": "jax.lax.ragged_dot, precision=%s" % ("None (DEFAULT)" if P is None
                                                              else "HIGHEST"),
             "activation": "jax.nn.silu(h_gate) * h_up in %s, jit" % g.dtype,
             "weight_grads": "jax.vjp of ragged_dot, in the weights' dtype (%s)" % g.dtype,
             "jax": jax.__version__}
    return res, notes


def run_chained(g, dev, precision):
    P = _prec(precision)
    cfg = g.config
    T, d, E, k = g.T, g.d, g.E, g.k
    dt = _jdt(g.dtype)
    f32 = jnp.float32
    A = _put(g, dev)
    bias = A("inputs/expert_bias", f32) if g.has_bias else None

    def layer(params, eps):
        x, wr = params["x"], params["wr"]
        logits = jnp.dot(x.astype(f32), wr, precision=P) + eps["logits"]
        if cfg["score_function"] == "softmax":
            scores = jax.nn.softmax(logits, axis=-1)
        else:
            scores = jax.nn.sigmoid(logits)
        scores = scores + eps["scores"]
        ids = select(lax.stop_gradient(scores), bias, cfg)
        w = jnp.take_along_axis(scores, ids, axis=1)
        if cfg["renormalize"]:
            w = w / w.sum(-1, keepdims=True)
        if cfg["scaling"] != 1.0:
            w = w * cfg["scaling"]
        w = w + eps["w"]
        flat = ids.reshape(-1)
        perm = jnp.argsort(flat, stable=True).astype(jnp.int32)
        sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
        tok = perm // k
        xs = jnp.take(x, tok, axis=0) + eps["xs"]
        inter = {"logits": logits, "scores": scores, "w": w, "xs": xs}
        if g.swiglu:
            hg = lax.ragged_dot(xs, params["wg"], sizes, precision=P) + eps["hg"]
            hu = lax.ragged_dot(xs, params["wu"], sizes, precision=P) + eps["hu"]
            ha = jax.nn.silu(hg) * hu + eps["ha"]
            y = lax.ragged_dot(ha, params["wd"], sizes, precision=P) + eps["y"]
            inter.update(hg=hg, hu=hu, ha=ha)
        else:
            y = lax.ragged_dot(xs, params["wd"], sizes, precision=P) + eps["y"]
        inter["y"] = y
        inv = jnp.argsort(perm, stable=True).astype(jnp.int32)
        y_tok = jnp.take(y, inv, axis=0).reshape(T, k, d)
        out = jnp.einsum("tkd,tk->td", y_tok.astype(f32), w.astype(f32), precision=P).astype(dt)
        aux = {"ids": ids, "perm": perm, "inv": inv, "sizes": sizes, "inter": inter}
        return out, aux

    params = {"x": A("inputs/x"), "wr": A("inputs/router_weight", f32), "wd": A("inputs/w_down")}
    M, f = g.M, g.f
    eps = {"logits": jnp.zeros((T, E), f32), "scores": jnp.zeros((T, E), f32),
           "w": jnp.zeros((T, k), f32), "xs": jnp.zeros((M, d), dt), "y": jnp.zeros((M, d), dt)}
    if g.swiglu:
        params.update(wg=A("inputs/w_gate"), wu=A("inputs/w_up"))
        eps.update(hg=jnp.zeros((M, f), dt), hu=jnp.zeros((M, f), dt), ha=jnp.zeros((M, f), dt))
    eps = jax.device_put(eps, dev)

    @jax.jit
    def fwd_bwd(params, eps, dout):
        out, vjp, aux = jax.vjp(layer, params, eps, has_aux=True)
        dparams, deps = vjp(dout)
        return out, aux, dparams, deps

    out, aux, dp, de = fwd_bwd(params, eps, A("inputs/d_out"))
    it = aux["inter"]
    sizes = np.asarray(aux["sizes"]).astype(np.int64)
    res = {
        "forward/router_logits": it["logits"], "forward/router_scores": it["scores"],
        "forward/topk_ids": aux["ids"], "forward/topk_weights": it["w"],
        "forward/sort_perm": aux["perm"], "forward/inv_perm": aux["inv"],
        "forward/x_sorted": it["xs"], "forward/y_sorted": it["y"], "forward/out": out,
        "backward/d_topk_weights": de["w"], "backward/d_y_sorted": de["y"],
        "backward/d_w_down": dp["wd"], "backward/d_x_sorted": de["xs"],
        "backward/d_router_scores": de["scores"], "backward/d_router_logits": de["logits"],
        "backward/d_router_weight": dp["wr"], "backward/d_x": dp["x"],
    }
    if g.swiglu:
        res.update({"forward/h_gate": it["hg"], "forward/h_up": it["hu"], "forward/h_act": it["ha"],
                    "backward/d_h_act": de["ha"], "backward/d_h_gate": de["hg"],
                    "backward/d_h_up": de["hu"], "backward/d_w_gate": dp["wg"],
                    "backward/d_w_up": dp["wu"]})
    res = {k: to_np(v) for k, v in res.items()}
    for key in ("forward/topk_ids", "forward/sort_perm", "forward/inv_perm"):
        res[key] = res[key].astype(np.int32)
    res["forward/group_sizes"] = sizes
    res["forward/group_offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    notes = {"kernel": "jax.lax.ragged_dot, precision=%s" % ("None (DEFAULT)" if P is None
                                                              else "HIGHEST"),
             "router": "jnp.dot(x.astype(f32), W_r), %s, lax.top_k" % cfg["score_function"],
             "dispatch": "jnp.argsort(stable=True), jnp.bincount, jnp.take(x, perm // k)",
             "combine": "take(y, inv_perm), einsum('tkd,tk->td') in fp32, cast to %s" % g.dtype,
             "activation": "jax.nn.silu(h_gate) * h_up in %s" % g.dtype,
             "weight_grads": "jax.vjp, in the weights' dtype (%s)" % g.dtype,
             "jit": True, "jax": jax.__version__}
    return res, notes


def run(golden_path, outdir, modes=MODES, device=None, log=print, repeat=True,
        precisions=PRECISIONS):
    """Runs every precision x mode on one golden file: ([(path, summary)], [errors])."""
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    platform = {"cuda": "gpu"}.get(device, device)
    dev, dname = device_info(platform)
    written, errors = [], []
    probes = {}
    for prec in precisions:
        def fn(mode, prec=prec):
            def go(g):
                if g.dtype == "fp32" and prec not in probes:
                    probes[prec] = probe_fp32(dev, prec)
                probe = probes.get(prec) if g.dtype == "fp32" else None
                res, notes = (run_isolated if mode == "isolated" else run_chained)(g, dev, prec)
                if probe:
                    notes["fp32_probe"] = probe
                notes["default_matmul_precision"] = str(jax.config.jax_default_matmul_precision)
                name = ("jax-ragged_dot[%s]" if mode == "isolated" else "jax-moe[%s]") % prec
                return name, res, notes, compute_mode_for(g.dtype, probe)
            return go
        info = lambda g: ("jax %s" % jax.__version__, dname)
        w, e = common.run_modes(golden_path, outdir, modes, {m: fn(m) for m in MODES}, info, log,
                                repeat)
        written += w
        errors += e
    return written, errors


def main(argv=None):
    return common.adapter_main(argv, __doc__, available, run, MODES)


if __name__ == "__main__":
    sys.exit(main())
