"""Golden files read and candidate files written with h5py alone: the
explicit stand-in for the package's C library where it cannot load (a GPU
machine without a dropless build: libdropless needs HDF5, OpenBLAS and MPFR
shared libraries the GPU image may not have). load() and write_candidate()
use the package whenever its library loads; only otherwise, and only when
asked (DROPLESS_H5PY_FALLBACK=1, which tools/gpu_report.py sets, or
load(path, fallback=True)), these readers and writers, which follow the golden file's own structure (a stage is written
into the group the golden holds it in, labelled with the golden's type for
it, as the package does) and doc/format.md's candidate rules (float32
containers with a `dtype` attribute), so `dropless check` reads their
files as it reads the package's.
"""

import os

import numpy as np

import dropless
from dropless.check import isolation_spec


def _dec(v):
    if isinstance(v, bytes):
        return v.decode()
    return v.item() if hasattr(v, "item") else v


class Golden:
    """What the adapters use of a dropless.Golden, read with h5py."""

    def __init__(self, path):
        import h5py
        self._f = h5py.File(path, "r")
        self.case = _dec(self._f.attrs["case"])
        self.seed = int(self._f.attrs["seed"])
        self.config = {k: _dec(v) for k, v in self._f["config"].attrs.items()}
        c = self.config
        self.dims = {"T": c["tokens"], "d": c["hidden"], "f": c["ffn"], "E": c["experts"],
                     "k": c["top_k"], "M": c["tokens"] * c["top_k"]}
        self.has_backward = "backward" in self._f

    def _ds(self, name):
        for grp in ("inputs", "forward", "backward"):
            if grp in self._f and name in self._f[grp]:
                return self._f[grp][name]
        raise KeyError("golden %s has no dataset %s" % (self.case, name))

    def group_of(self, name):
        return self._ds(name).parent.name.strip("/")

    def array(self, name):
        return self._ds(name)[()]

    def shape(self, name):
        return tuple(self._ds(name).shape)

    def dtype_of(self, name):
        return _dec(self._ds(name).attrs["dtype"])

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def library_error():
    """None where the package's library loads, else why not."""
    try:
        dropless.library_path()
        return None
    except Exception as e:  # dropless.Error (no library) or OSError (a missing dependency)
        return "%s: %s" % (type(e).__name__, e)


FALLBACK_ENV = "DROPLESS_H5PY_FALLBACK"


def load(path, fallback=None):
    """(golden, how): dropless.load where the library loads; else, when
    fallback (default: DROPLESS_H5PY_FALLBACK=1), Golden read with h5py;
    else dropless.Error saying why the library did not load."""
    why = library_error()
    if why is None:
        return dropless.load(path), "dropless.load"
    if fallback is None:
        fallback = os.environ.get(FALLBACK_ENV) == "1"
    if not fallback:
        raise dropless.Error("%s: the package's library does not load (%s); set %s=1 to read it "
                             "with h5py instead" % (path, why, FALLBACK_ENV))
    return Golden(path), "h5py (package library unavailable: %s)" % why


def _put_attr(obj, k, v):
    if isinstance(v, str):
        obj.attrs[k] = np.bytes_(v.encode())
    elif isinstance(v, float):
        obj.attrs[k] = np.float64(v)
    else:
        obj.attrs[k] = np.int64(v)


def _storage(name, x, g):
    """(array to store, dtype attribute), as the package writes them: floats
    in float32 containers labelled with the golden's type for the stage
    (bf16/fp16 values exact in float32), a value off that grid refused;
    integers as they are."""
    a = np.asarray(dropless.to_numpy(x))
    label = g.dtype_of(name)
    if a.dtype.kind in "iub":
        return a, label
    f = a.astype(np.float32)
    if not np.array_equal(f.astype(np.float64), a.astype(np.float64), equal_nan=True):
        raise ValueError("%s: values that are not float32 values" % name)
    if label in ("bf16", "fp16"):
        import ml_dtypes
        grid = ml_dtypes.bfloat16 if label == "bf16" else np.float16
        if not np.array_equal(f.astype(grid).astype(np.float32), f, equal_nan=True):
            raise ValueError("%s: values off the %s grid" % (name, label))
    return f, label


def write_plain(path, g, outputs, attrs, isolated=None):
    """A candidate file without the package (temporary name, then rename):
    root attributes, /config, every stage in the golden's group for it."""
    import h5py
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with h5py.File(tmp, "w") as f:
            for k, v in (("format", "dropless-golden"), ("format_version", 1), ("case", g.case)):
                _put_attr(f, k, v)
            f.attrs["seed"] = np.uint64(g.seed)
            for k, v in attrs.items():
                if v is not None:
                    _put_attr(f, k, str(v))
            spec = isolation_spec(isolated) or ""
            if spec:
                _put_attr(f, "isolated_groups", spec)
            cfg = f.create_group("config")
            for k, v in g.config.items():
                _put_attr(cfg, k, v)
            for name, x in outputs.items():
                a, label = _storage(name, x, g)
                ds = f.require_group(g.group_of(name)).create_dataset(name, data=a)
                _put_attr(ds, "dtype", label)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_candidate(path, outputs, g, backend="python", compute_mode=None, isolated=None,
                    force=False, backend_version=None, device=None):
    """dropless.write_candidate where g is the package's golden, else
    write_plain (which always replaces: the adapters pass force)."""
    if isinstance(g, Golden):
        return write_plain(path, g, outputs, {"backend": backend, "backend_version": backend_version,
                                              "compute_mode": compute_mode, "device": device},
                           isolated)
    return dropless.write_candidate(path, outputs, g, backend=backend, compute_mode=compute_mode,
                                    isolated=isolated, force=force, backend_version=backend_version,
                                    device=device)
