"""moe_forward and moe_backward: the exact oracle as XLA FFI targets on the
host, with the layer's custom VJP. The arrays crossing are those of the one
table (dropless.layout()), in its order; the handler (ffi.c) checks them
again and calls dl_moe_forward / dl_moe_backward."""

import ctypes
import functools
import threading
from collections import namedtuple
from collections.abc import Mapping

import numpy as np
import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from .. import _lib
from ..golden import Golden, cases, layout
from . import _build

FORWARD, BACKWARD = "dropless_moe_forward", "dropless_moe_backward"
_ACT = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}
# the configuration's dimensions and where an array shows them
_DIMS = (("tokens", "x", 0), ("hidden", "x", 1), ("experts", "router_weight", 1), ("ffn", "w_down", 1))
_lock = threading.Lock()
_handler = None


def register():
    """Builds (or finds) the FFI handler and registers the targets
    dropless_moe_forward and dropless_moe_backward on the CPU platform,
    once; returns the handler's path. moe_forward calls it."""
    global _handler
    with _lock:
        if _handler is None:
            h = _build.load()
            for name, fn in ((FORWARD, h.dl_jax_moe_forward), (BACKWARD, h.dl_jax_moe_backward)):
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn), platform="cpu")
            _handler = h
    return _handler.dropless_path


# A configuration as the handler gets it: the library's canonical text;
# x64 says whether int64 stages stay int64 (JAX without x64 has none).
_Spec = namedtuple("_Spec", "text x64")


@functools.lru_cache(maxsize=256)
def _canon(text, where):
    """The library's parse of a configuration text: (canonical text, dict)."""
    L = _lib.lib()
    f = L.dl_api_config_parse
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                  ctypes.c_char_p, ctypes.c_size_t]
    canon, err = ctypes.create_string_buffer(2048), ctypes.create_string_buffer(_lib.ERRLEN)
    rc = f(text.encode(), None, canon, len(canon), err, _lib.ERRLEN)
    if rc:
        _lib.fail(rc, "%s: %s" % (where, err.value.decode("utf-8", "replace")))
    out = canon.value.decode()
    return out, dict(ln.split(" = ", 1) for ln in out.splitlines())


def _cfg(spec):
    return _canon(spec.text, "config")[1]


def _sizes(spec):
    c = _cfg(spec)
    T, E, k = int(c["tokens"]), int(c["experts"]), int(c["top_k"])
    S = int(c.get("shared_experts", 0)) * int(c.get("shared_ffn", 0))  # the shared experts' width
    return {"T": T, "d": int(c["hidden"]), "f": int(c["ffn"]), "E": E, "k": k, "M": T * k, "P": E + 1,
            "S": S, "V": int(c.get("hash_vocab", 0)),
            "R": E + int(c.get("zero_experts", 0))}  # R: the router's width E + Z


_GATED = ("swiglu", "swiglu-clamp", "geglu-tanh")  # dl_cond_applies' GATE: a gated FFN
_HIDDEN = _GATED + ("relu2",)  # its SWIGLU: a hidden layer (h_up, h_act)


def _applies(row, c):
    shared = int(c.get("shared_experts", 0)) > 0
    return (row["cond"] == "always" or (row["cond"] == "bias" and c["has_bias"] == "1") or
            (row["cond"] == "swiglu" and c["ffn_kind"] in _HIDDEN) or
            (row["cond"] == "gate" and c["ffn_kind"] in _GATED) or
            (row["cond"] == "shared" and shared) or
            (row["cond"] == "shared_gate" and shared and str(c.get("shared_gate", 0)) == "1") or
            (row["cond"] == "router_bias" and str(c.get("router_bias", 0)) == "1") or
            (row["cond"] == "ffn_bias" and str(c.get("ffn_bias", 0)) == "1") or
            (row["cond"] == "hash" and int(c.get("hash_vocab", 0)) > 0))


@functools.lru_cache(maxsize=1)
def _table():
    return tuple(layout()["arrays"])


def _rows(spec, group, backward=False):
    """The table's rows of group that apply: inputs (d_out only for the
    backward), or stage values."""
    c = _cfg(spec)
    out = []
    for r in _table():
        if r["group"] != group or not _applies(r, c):
            continue
        if group == "inputs" and r["name"] == "d_out" and not backward:
            continue
        if group != "inputs" and r["value"] is None:
            continue  # tie_margin: no stage value
        out.append(r)
    return out


def _shape(row, spec):
    s = _sizes(spec)
    return tuple(s[ch] for ch in row["dims"])


def _dtype(row, spec):
    if row["store"] == "act":
        return jnp.dtype(_ACT[_cfg(spec)["dtype"]])
    if row["store"] == "i64":
        return jnp.dtype(jnp.int64 if spec.x64 else jnp.int32)
    if row["store"] == "rt":  # the router weight: its own storage type (router_dtype)
        return jnp.dtype(_ACT[_cfg(spec).get("router_dtype", "fp32")])
    return jnp.dtype({"f32": jnp.float32, "i32": jnp.int32}[row["store"]])


def _no_shared(cfg, where):
    """The FFI handler takes no shared-expert weights yet (doc/python.md)."""
    if int(cfg.get("shared_experts", 0) or 0) > 0:
        raise _lib.error("DL_EINVAL", "%s: shared experts (shared_experts = %s) are not supported "
                         "by dropless.jax yet" % (where, cfg["shared_experts"]))
    return cfg


def _config_dict(config, where):
    if isinstance(config, Golden):
        return _no_shared(dict(config.config), where)
    if isinstance(config, str):
        for c in cases():
            if c.name == config:
                return _no_shared(dict(c.config), where)
        raise _lib.error("DL_ENOTFOUND", "%s: config '%s' is not a catalogue case (see "
                         "dropless.cases())" % (where, config))
    if isinstance(config, Mapping):
        return _no_shared(dict(config), where)
    raise TypeError("%s: config must be a dropless.Golden, a catalogue name or a mapping of "
                    "case-file keys, not %s" % (where, type(config).__name__))


def _text(cfg, arrays):
    """Case-file text: the config's keys, and those it leaves out taken from
    the arrays (dimensions, has_bias, ffn_kind, dtype)."""
    cfg = dict(cfg)
    for key, name, axis in _DIMS:
        a = arrays.get(name)
        if key not in cfg and a is not None and len(np.shape(a)) > axis:
            cfg[key] = np.shape(a)[axis]
    cfg.setdefault("has_bias", int(arrays.get("expert_bias") is not None))
    if arrays.get("router_bias") is not None:  # only then: older texts stay as they were
        cfg.setdefault("router_bias", 1)
    cfg.setdefault("ffn_kind", "swiglu" if arrays.get("w_gate") is not None else "plain")
    if arrays.get("b_gate") is not None:
        cfg.setdefault("ffn_bias", 1)
    if arrays.get("hash_table") is not None and len(np.shape(arrays["hash_table"])) == 2:
        cfg.setdefault("hash_vocab", np.shape(arrays["hash_table"])[0])  # its V rows
    if arrays.get("x") is not None:
        cfg.setdefault("dtype", str(jnp.dtype(_dtype_of(arrays["x"]))))
    keys = sorted(cfg, key=lambda k: k != "base")  # the parser wants base first
    return "\n".join("%s = %s" % (k, int(v) if isinstance(v, bool) else v) for k, v in
                     ((k, cfg[k]) for k in keys))


def _dtype_of(a):
    return a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype


def _shape_text(shape):
    return "[%s]" % ", ".join(str(n) for n in shape)


def _prepare(where, config, arrays, backward):
    """(spec, operands): the configuration checked by the library, every
    array checked against it (shape and storage type, as the handler will),
    the operands in the table's order."""
    text, _ = _canon(_text(_config_dict(config, where), arrays), where)
    spec = _Spec(text, bool(jax.config.jax_enable_x64))
    c = _cfg(spec)
    rows = _rows(spec, "inputs", backward)
    wanted = {r["name"] for r in rows}
    for name, a in arrays.items():
        if a is not None and name not in wanted:
            raise _lib.error("DL_EINVAL", "%s: %s given, but the configuration has none "
                             "(has_bias = %s, ffn_kind = %s, hash_vocab = %s)" % (
                                 where, name, c["has_bias"], c["ffn_kind"],
                                 c.get("hash_vocab", 0)))
    operands = []
    for r in rows:
        a = arrays.get(r["name"])
        if a is None:
            raise _lib.error("DL_EINVAL", "%s: the configuration needs %s" % (where, r["name"]))
        need, dt = _shape(r, spec), jnp.dtype(_dtype_of(a))
        if tuple(np.shape(a)) != need:
            raise _lib.error("DL_ESHAPE", "%s: %s: shape %s, the configuration needs %s" % (
                where, r["name"], _shape_text(np.shape(a)), _shape_text(need)))
        if dt != _dtype(r, spec):
            raise _lib.error("DL_EDTYPE", "%s: %s: %s array, the configuration stores it as %s" % (
                where, r["name"], dt, _dtype(r, spec)))
        operands.append(jnp.asarray(a))
    return spec, tuple(operands)


def _call(target, spec, group, operands):
    rows = _rows(spec, group)
    shapes = [jax.ShapeDtypeStruct(_shape(r, spec), _dtype(r, spec)) for r in rows]
    outs = jax.ffi.ffi_call(target, shapes, vmap_method="sequential")(*operands, config=spec.text)
    return {r["name"]: o for r, o in zip(rows, outs)}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _layer(spec, *operands):
    return _call(FORWARD, spec, "forward", operands)


def _layer_fwd(spec, *primals):
    vals = tuple(p.value for p in primals)
    return _call(FORWARD, spec, "forward", vals), vals


def _layer_bwd(spec, vals, cts):
    # integer stages carry float0 cotangents (no gradient); a float stage
    # the program did not use comes as a symbolic zero
    extra = sorted(n for n, ct in cts.items() if n != "out" and not isinstance(ct, SymbolicZero)
                   and ct.dtype != jax.dtypes.float0)
    if extra:
        raise ValueError("dropless.jax.moe_forward: the oracle's backward is the layer's, for a "
                         "cotangent on 'out' alone; got cotangents on %s too" % ", ".join(extra))
    d_out = cts["out"]
    if isinstance(d_out, SymbolicZero):
        d_out = jnp.zeros(d_out.aval.shape, d_out.aval.dtype)
    names = [r["name"] for r in _rows(spec, "inputs")]
    # the backward's operands in the table's order: d_out sits before hash
    # routing's token_ids and hash_table
    given = dict(zip(names, vals), d_out=d_out)
    grads = _call(BACKWARD, spec, "backward",
                  tuple(given[r["name"]] for r in _rows(spec, "inputs", backward=True)))
    # the bias steers the selection only: no gradient (route.h); fp32 weight
    # gradients of 16-bit weights round once to the weights' type, as JAX's
    # cotangents must have the primal's dtype (moe_backward has them exact);
    # the integer inputs (token ids, hash table) take float0 cotangents
    return tuple(grads["d_" + n].astype(v.dtype) if "d_" + n in grads else _zero_ct(v)
                 for n, v in zip(names, vals))


def _zero_ct(v):
    """The zero cotangent of a primal: float0 for an integer array."""
    if jnp.issubdtype(v.dtype, jnp.integer):
        return np.zeros(v.shape, dtype=jax.dtypes.float0)
    return jnp.zeros_like(v)


_layer.defvjp(_layer_fwd, _layer_bwd, symbolic_zeros=True)


def moe_forward(x, router_weight, w_gate, w_up, w_down, expert_bias=None, router_bias=None, *,
                config, b_gate=None, b_up=None, b_down=None, token_ids=None, hash_table=None):
    """The layer's forward pass by the exact oracle, inside any JAX program
    (jit, grad): {stage name: array} of every forward stage value
    (router_logits ... out), bit-identical to `dropless gen`. Differentiable
    through 'out' (the custom VJP runs dl_moe_backward). config: a Golden, a
    catalogue name, or a mapping of case-file keys (those left out come from
    the arrays). The target runs on the CPU platform: call it under a CPU
    jit with host arrays. Raises dropless.Error for a bad configuration, a
    wrong shape or dtype; NaN inputs fail the call (an XLA runtime error
    with the library's message). router_bias: the bias on the logits
    (router_bias = 1), differentiable like the weights. b_gate, b_up,
    b_down: the expert projections' biases of an ffn_bias configuration
    (gpt-oss); their gradients come from moe_backward (d_b_gate, d_b_up,
    d_b_down) and through the custom VJP. token_ids [T] and hash_table [V, k]
    (int32): hash routing's inputs (hash_vocab = V > 0, DeepSeek-V4's first
    layers: the experts of token t are row token_ids[t] of the table); not
    differentiable (float0 cotangents)."""
    register()
    spec, ops = _prepare("moe_forward", config, {
        "x": x, "router_weight": router_weight, "expert_bias": expert_bias, "w_gate": w_gate,
        "w_up": w_up, "w_down": w_down, "router_bias": router_bias, "b_gate": b_gate,
        "b_up": b_up, "b_down": b_down, "token_ids": token_ids, "hash_table": hash_table},
        backward=False)
    return _layer(spec, *ops)


def moe_backward(x, router_weight, w_gate, w_up, w_down, d_out, expert_bias=None,
                 router_bias=None, *, config, b_gate=None, b_up=None, b_down=None,
                 token_ids=None, hash_table=None):
    """The layer's backward pass by the exact oracle at d_out: {stage name:
    array} of every backward stage value (d_topk_weights ... d_x), the
    weight gradients in fp32 as the golden stores them. b_gate, b_up,
    b_down: the expert biases of an ffn_bias configuration; token_ids and
    hash_table: hash routing's (as in moe_forward)."""
    register()
    spec, ops = _prepare("moe_backward", config, {
        "x": x, "router_weight": router_weight, "expert_bias": expert_bias, "w_gate": w_gate,
        "w_up": w_up, "w_down": w_down, "d_out": d_out, "router_bias": router_bias,
        "b_gate": b_gate, "b_up": b_up, "b_down": b_down, "token_ids": token_ids,
        "hash_table": hash_table}, backward=True)
    return _call(BACKWARD, spec, "backward", ops)
