"""dropless.jax: the exact oracle inside JAX programs.

    from dropless import jax as djax
    stages = djax.moe_forward(x, router_weight, w_gate, w_up, w_down, config=golden)
    summary = djax.check(golden, {"out": my_out})      # inside jit: the runner's verdict

moe_forward / moe_backward are XLA FFI targets on the CPU platform whose C
handler (ffi.c) calls libdropless's dl_moe_forward and dl_moe_backward;
moe_forward has the layer's custom VJP. check runs dropless.check in a host
callback. See doc/python.md, "dropless.jax". Needs JAX (jax[cpu]).
"""

try:
    import jax as _jax
    import jax.ffi as _jax_ffi  # noqa: F401  (jax >= 0.4.31)
except ImportError as _e:  # pragma: no cover - exercised where JAX is absent
    raise ImportError("dropless.jax needs JAX with jax.ffi (pip install 'jax[cpu]'): %s" % _e) from _e

from ._ffi import BACKWARD, FORWARD, moe_backward, moe_forward, register
from ._check import check, last_report
from ._build import handler_path

__all__ = ["moe_forward", "moe_backward", "check", "last_report", "register", "handler_path",
           "FORWARD", "BACKWARD"]
