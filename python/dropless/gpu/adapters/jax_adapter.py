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
  jax-moe[P][fused]  the same layer as a fused kernel exposes it (mode fused):
                     out, d_x and the weight gradients only

Usage: python3 -m dropless.gpu.adapters.jax_adapter GOLDEN... -o DIR [--device cpu]
"""

import functools
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
MODES = ("isolated", "chained", "fused")


def _prec(p):
    return None if p == "default" else lax.Precision.HIGHEST


def _jdt(dtype):
    return {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}[dtype]


def _device(device):
    platform = {"cuda": "gpu"}.get(device, device)
    return jax.devices(platform)[0] if platform else jax.devices()[0]


def device_name(dev):
    return "%s (%s)" % (getattr(dev, "device_kind", dev.platform), dev.platform)


def _probe(dev, precision):
    f = jax.jit(lambda a, b, gs: lax.ragged_dot(a, b, gs, precision=_prec(precision)))
    return common.probe_fp32(lambda a, b, sizes: np.asarray(
        f(jax.device_put(a, dev), jax.device_put(b, dev), jax.device_put(np.int32(sizes), dev))))


def select(scores, bias, cfg):
    """Top-k ids [T,k] with lax.top_k (group-limited: DeepSeek-V3 style)."""
    T, E = scores.shape
    key = scores + bias if cfg["has_bias"] else scores
    ng, kg = cfg["n_group"], cfg["topk_group"]
    if ng > 1:
        G = E // ng
        gs = lax.top_k(key.reshape(T, ng, G), common.group_terms(cfg))[0].sum(-1)
        gidx = lax.top_k(gs, kg)[1]
        gmask = jnp.zeros((T, ng), bool).at[jnp.arange(T)[:, None], gidx].set(True)
        key = jnp.where(jnp.repeat(gmask, G, axis=1), key, -jnp.inf)
    return lax.top_k(key, cfg["top_k"])[1].astype(jnp.int32)


def _arrays(g, dev):
    dt = _jdt(g.config["dtype"])
    return lambda name, dtype=None: jax.device_put(jnp.asarray(g.array(name), dtype=dtype or dt), dev)


def _notes(precision, **kw):
    kw.update(kernel="jax.lax.ragged_dot, precision=%s" % ("None (DEFAULT)" if precision == "default"
                                                           else "HIGHEST"),
              jax=jax.__version__,
              default_matmul_precision=str(jax.config.jax_default_matmul_precision))
    return kw


def isolated(g, dev, precision):
    """Every GEMM stage and its VJP from the golden values of its inputs."""
    P, A = _prec(precision), _arrays(g, dev)
    gs = jax.device_put(jnp.asarray(g.array("group_sizes"), jnp.int32), dev)
    rd = lambda a, w: lax.ragged_dot(a, w, gs, precision=P)

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

    out = {}
    if g.config["ffn_kind"] == "swiglu":
        r = gate_up(A("x_sorted"), A("w_gate"), A("w_up"), A("d_h_gate"), A("d_h_up"))
        out.update(zip(("h_gate", "h_up", "d_x_sorted", "d_w_gate", "d_w_up"), r))
        out.update(zip(("h_act", "d_h_gate", "d_h_up"), act(A("h_gate"), A("h_up"), A("d_h_act"))))
        out.update(zip(("y_sorted", "d_h_act", "d_w_down"),
                       down(A("h_act"), A("w_down"), A("d_y_sorted"))))
    else:
        out.update(zip(("y_sorted", "d_x_sorted", "d_w_down"),
                       down(A("x_sorted"), A("w_down"), A("d_y_sorted"))))
    dt = g.config["dtype"]
    return out, _notes(precision, activation="jax.nn.silu(h_gate) * h_up in %s, jit" % dt,
                       weight_grads="jax.vjp of ragged_dot, in the weights' dtype (%s)" % dt)


# Traces of the chained layer (each is one compilation of its jit):
# python/dropless/gpu/pipeline_checks.py counts them across calls with different routing.
TRACES = {"n": 0}
_LAST = {}


def _key(cfg, dims):
    return tuple(sorted((k, v) for k, v in dict(cfg).items())) + tuple(dims[s] for s in "TdEk")


def last_cache_size():
    """The jit cache size of the last chained layer called (None if this JAX
    does not say)."""
    f = _LAST.get("fn")
    try:
        return f._cache_size()
    except Exception:
        return None


@functools.lru_cache(maxsize=None)
def chained_fn(key, precision):
    """The jitted forward + VJP of the chained layer for one configuration
    and shape (cached: every golden file of the same shapes reuses it, as a
    training step reuses its compiled layer)."""
    cfg = dict(key[:-4])
    T, d, E, k = key[-4:]
    P = _prec(precision)
    dt, f32 = _jdt(cfg["dtype"]), jnp.float32
    swiglu = cfg["ffn_kind"] == "swiglu"

    def layer(params, eps, bias):
        TRACES["n"] += 1  # runs only while tracing
        x = params["x"]
        logits = jnp.dot(x.astype(f32), params["router_weight"], precision=P) + eps["router_logits"]
        scores = (jax.nn.softmax(logits, axis=-1) if cfg["score_function"] == "softmax"
                  else jax.nn.sigmoid(logits)) + eps["router_scores"]
        ids = select(lax.stop_gradient(scores), bias, cfg)
        w = jnp.take_along_axis(scores, ids, axis=1)
        if cfg["renormalize"]:
            w = w / w.sum(-1, keepdims=True)
        w = w * cfg["scaling"] + eps["topk_weights"]
        perm = jnp.argsort(ids.reshape(-1), stable=True).astype(jnp.int32)
        sizes = jnp.bincount(ids.reshape(-1), length=E).astype(jnp.int32)
        rd = lambda a, wt: lax.ragged_dot(a, wt, sizes, precision=P)
        v = {"router_logits": logits, "router_scores": scores, "topk_weights": w,
             "x_sorted": jnp.take(x, perm // k, axis=0) + eps["x_sorted"]}
        h = v["x_sorted"]
        if swiglu:
            v["h_gate"] = rd(h, params["w_gate"]) + eps["h_gate"]
            v["h_up"] = rd(h, params["w_up"]) + eps["h_up"]
            h = v["h_act"] = jax.nn.silu(v["h_gate"]) * v["h_up"] + eps["h_act"]
        v["y_sorted"] = rd(h, params["w_down"]) + eps["y_sorted"]
        inv = jnp.argsort(perm, stable=True).astype(jnp.int32)
        y_tok = jnp.take(v["y_sorted"], inv, axis=0).reshape(T, k, d)
        out = jnp.einsum("tkd,tk->td", y_tok.astype(f32), w.astype(f32), precision=P).astype(dt)
        v.update(topk_ids=ids, sort_perm=perm, inv_perm=inv, group_sizes=sizes)
        return out, v

    @jax.jit
    def fwd_bwd(params, eps, dout, bias):
        out, vjp, v = jax.vjp(lambda p, e: layer(p, e, bias), params, eps, has_aux=True)
        dparams, deps = vjp(dout)
        return out, v, dparams, deps
    return fwd_bwd


def chained(g, dev, precision):
    """The whole layer, forward and jax.vjp backward, under jit."""
    cfg, A = g.config, _arrays(g, dev)
    dt, f32 = _jdt(cfg["dtype"]), jnp.float32
    swiglu = cfg["ffn_kind"] == "swiglu"
    bias = A("expert_bias", f32) if cfg["has_bias"] else None
    names = ["x", "router_weight", "w_down"] + (["w_gate", "w_up"] if swiglu else [])
    params = {n: A(n, f32 if n == "router_weight" else None) for n in names}
    stored = [n for n in ("router_logits", "router_scores", "topk_weights", "x_sorted", "h_gate",
                          "h_up", "h_act", "y_sorted") if swiglu or not n.startswith("h_")]
    # zero perturbations of the stored values: their cotangents are the stage gradients
    eps = {n: jnp.zeros(g.shape(n), f32 if g.dtype_of(n) == "fp32" else dt) for n in stored}
    eps = jax.device_put(eps, dev)

    fwd_bwd = _LAST["fn"] = chained_fn(_key(cfg, g.dims), precision)
    out, v, dp, de = fwd_bwd(params, eps, A("d_out"), bias)
    res = dict(v, out=out)
    if "y_half" in g.stages():  # the synthetic value of configure --enable-extra-value
        res["y_half"] = v["y_sorted"] * jnp.asarray(0.5, v["y_sorted"].dtype)
    res.update({"d_" + n: de[n] for n in stored if n != "x_sorted"})
    res["d_x_sorted"] = de["x_sorted"]
    res.update({"d_" + n: dp[n] for n in names})
    sizes = np.asarray(v["group_sizes"]).astype(np.int64)
    res["group_sizes"] = sizes
    res["group_offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return res, _notes(precision,
                       router="jnp.dot(x.astype(f32), W_r), %s, lax.top_k" % cfg["score_function"],
                       dispatch="jnp.argsort(stable=True), jnp.bincount, jnp.take(x, perm // k)",
                       combine="take(y, inv_perm), einsum('tkd,tk->td') in fp32, cast to %s"
                       % cfg["dtype"], jit=True)


# The last chained run per precision: the fused mode is a subset of the same
# layer, so it reuses those arrays instead of compiling the layer again
# (each jit of the whole layer costs seconds on a GPU).
_LAST_CHAINED = {}


def _chained_once(g, dev, precision, reuse):
    key = (precision, g.case, id(g), str(dev))
    if reuse and key in _LAST_CHAINED:
        outputs, notes = _LAST_CHAINED[key]
        return dict(outputs), dict(notes, reused="the arrays of this precision's chained run")
    outputs, notes = chained(g, dev, precision)
    _LAST_CHAINED.clear()
    _LAST_CHAINED[key] = (dict(outputs), dict(notes))
    return outputs, notes


def backend(mode, precision):
    """The backend (common's signature) of one mode at one precision."""
    probes = {}

    def run(g, device):
        dev = _device(device)
        probe = None
        if g.config["dtype"] == "fp32":
            if precision not in probes:
                probes[precision] = _probe(dev, precision)
            probe = probes[precision]
        if mode == "isolated":
            outputs, notes = isolated(g, dev, precision)
        else:
            outputs, notes = _chained_once(g, dev, precision, reuse=mode == "fused")
        if probe:
            notes["fp32_probe"] = probe
        name = ("jax-ragged_dot[%s]" if mode == "isolated" else "jax-moe[%s]") % precision
        # XLA evaluates the SwiGLU and its VJP op by op in the storage type
        res = common.Result(name, outputs, notes,
                            common.profile_for(g.config["dtype"], probe, elementwise=True))
        return common.fused(res) if mode == "fused" else res
    return run


def run(golden_path, outdir, modes=MODES, device=None, log=print, repeat=True,
        precisions=PRECISIONS):
    """Runs every precision x mode on one golden file: ([(path, summary)], [errors])."""
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    info = lambda g: ("jax %s" % jax.__version__, device_name(_device(device)))
    written, errors = [], []
    for prec in precisions:
        w, e = common.run_modes(golden_path, outdir, modes, {m: backend(m, prec) for m in MODES},
                                info, device, log, repeat)
        written += w
        errors += e
    return written, errors


def main(argv=None):
    return common.adapter_main(argv, __doc__, available, run, MODES)


if __name__ == "__main__":
    sys.exit(main())
