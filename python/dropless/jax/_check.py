"""check: the runner's verdict on JAX arrays, inside the jitted program that
made them. The arrays reach the host through an ordered io_callback, which
runs dropless.check (dl_check_run) on them; the program gets a summary
back, the Report goes to on_report and last_report()."""

import threading

import numpy as np
import jax
import jax.numpy as jnp
from jax.experimental import io_callback

from ..check import _Candidate, check as _run_check
from ..golden import Golden

_lock = threading.Lock()
_last = []


def last_report():
    """The Report of the latest check() that ran (None before any)."""
    with _lock:
        return _last[0] if _last else None


def _refusals(golden, names, arrays):
    """The library's own refusals of these names, shapes and dtypes, now,
    at trace time (zeros of the same shapes and types, set into a candidate
    as the callback will), rather than as a runtime error inside XLA."""
    zeros = {n: np.zeros(np.shape(a), dtype=a.dtype) for n, a in zip(names, arrays)}
    with _Candidate(golden, zeros, "dropless.jax", None):
        pass


def check(golden, outputs, *, on_report=None, backend="jax", **options):
    """The runner's verdict on outputs ({stage name: JAX array}, as for
    dropless.check), computed in a host callback when the program runs:
    works inside jit, on any device. Returns an int32 array [conformant,
    PASS, WARN, FAIL] (counts of the report's rows); the Report itself goes
    to on_report(report) when given, and is kept for last_report() (once
    the program has run: JAX dispatches asynchronously, so wait for the
    summary first).
    options are dropless.check's (profile, isolated, strict_storage,
    compute_mode, ...). An unknown stage, a wrong shape or dtype raises
    dropless.Error here, with the library's message."""
    if not isinstance(golden, Golden):
        raise TypeError("golden must be a dropless.Golden (dropless.generate or dropless.load)")
    names = list(outputs)
    arrays = [jnp.asarray(outputs[n]) for n in names]
    _refusals(golden, names, arrays)

    def host(*values):
        r = _run_check(golden, dict(zip(names, values)), backend=backend, **options)
        with _lock:
            _last[:] = [r]
        if on_report is not None:
            on_report(r)
        c = r.counts
        return np.array([int(r.conformant), c.get("PASS", 0), c.get("WARN", 0), c.get("FAIL", 0)],
                        dtype=np.int32)

    return io_callback(host, jax.ShapeDtypeStruct((4,), jnp.int32), *arrays, ordered=True)
