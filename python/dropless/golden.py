"""Golden cases: the catalogue, generation in memory, golden files."""

import ctypes
import json
import os
from collections.abc import Mapping

import numpy as np

from . import _arrays, _lib

_NP = {_arrays.F32: np.float32, _arrays.I32: np.int32, _arrays.I64: np.int64}


class Record(dict):
    """A dict whose keys are also attributes (catalogue entries, report rows)."""

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None


def cases(large=True):
    """The built-in catalogue: a list of Records (name, description, seed,
    large, tier: "vectors" | "kernel" | "layer", data_bytes, memory_bytes:
    what generate() takes, config, dims with T d f E k M P). large=False
    leaves out the cases generated on demand (tiers kernel and layer)."""
    out = [Record(c, config=Record(c["config"]), dims=Record(c["dims"]))
           for c in json.loads(_lib.text(_lib.lib().dl_api_cases_json()))]
    return [c for c in out if large or not c.large]


def layout():
    """The one table of the layer's arrays, as `dropless info --layout
    --json` prints it: {"format", "format_version", "arrays": [...]}."""
    return json.loads(_lib.text(_lib.lib().dl_api_layout_json()))


def stage_names():
    """Every stage value the runner checks, in its order (dl_value_t)."""
    rows = [r for r in layout()["arrays"] if r["value"] is not None]
    return [r["name"] for r in sorted(rows, key=lambda r: r["value"])]


def _fspath(p):
    return os.fsencode(os.fspath(p))


def generate(case, seed=None, backward=True):
    """Generates a golden case in memory: case is a catalogue name
    ("mixtral-small-bf16") or the path of a case file. seed replaces the
    case's seed. Returns a Golden; raises Error."""
    h = ctypes.c_void_p()
    spec = _fspath(case) if isinstance(case, os.PathLike) else str(case).encode()
    _lib.call("dl_api_golden_generate", spec, int(seed is not None), int(seed or 0),
              int(not backward), ctypes.byref(h))
    return Golden(h)


def load(path):
    """Loads a golden file (seal, types, shapes and grids verified)."""
    h = ctypes.c_void_p()
    _lib.call("dl_api_golden_load", _fspath(path), ctypes.byref(h))
    return Golden(h)


class Arrays(Mapping):
    """The arrays of one group (inputs, forward or backward) of a golden:
    name -> numpy array (a copy: float32 holding the exact fp32/bf16/fp16
    values, or int32/int64). as_storage("ml_dtypes" | "torch") gives them
    in their storage types instead."""

    def __init__(self, golden, group):
        self._g = golden
        self._names = [a["name"] for a in golden._info["arrays"]
                       if a["group"] == group and a["present"]]

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(name)
        return self._g.array(name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def as_storage(self, kind="ml_dtypes", device=None):
        """{name: array in its storage type}: kind "ml_dtypes" (bf16 as
        ml_dtypes.bfloat16, fp16 as numpy float16) or "torch" (tensors of
        the storage dtype, on device)."""
        return {n: _arrays.as_storage(self[n], self._g.dtype_of(n), kind, device) for n in self._names}


class Golden:
    """A golden case: configuration, inputs and every stage value of the
    oracle, held by the C library. Use as a context manager or call
    close(); using it afterwards raises Error."""

    def __init__(self, handle):
        self._h = handle
        self._info = json.loads(_lib.text(_lib.lib().dl_api_golden_info_json(handle)))
        self._rows = {a["name"]: a for a in self._info["arrays"]}
        self.case = self._info["case"]
        self.seed = self._info["seed"]
        self.config = Record(self._info["config"])
        self.dims = Record(self._info["dims"])
        self.has_backward = self._info["has_backward"]

    # -- lifetime
    def close(self):
        if self._h:
            _lib.lib().dl_api_golden_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _handle(self):
        if not self._h:
            raise _lib.error("DL_EINVAL", "golden %s is closed" % self.case)
        return self._h

    def __repr__(self):
        c = self.config
        return "<dropless.Golden %s: T=%d d=%d f=%d E=%d k=%d %s%s>" % (
            self.case, c["tokens"], c["hidden"], c["ffn"], c["experts"], c["top_k"], c["dtype"],
            "" if self._h else ", closed")

    # -- arrays
    @property
    def inputs(self):
        return Arrays(self, "inputs")

    @property
    def forward(self):
        return Arrays(self, "forward")

    @property
    def backward(self):
        return Arrays(self, "backward")

    def array(self, name):
        """The golden's array called name, as a new numpy array."""
        h = self._handle()
        data, elem, rank = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
        dims = (ctypes.c_int64 * 3)()
        _lib.call("dl_api_golden_array", h, str(name).encode(), ctypes.byref(data),
                  ctypes.byref(elem), ctypes.byref(rank), dims)
        shape = tuple(dims[i] for i in range(rank.value))
        dt = np.dtype(_NP[elem.value])
        n = int(np.prod(shape, dtype=np.int64))
        if not n:
            return np.zeros(shape, dtype=dt)
        buf = (ctypes.c_char * (n * dt.itemsize)).from_address(data.value)
        return np.frombuffer(buf, dtype=dt).reshape(shape).copy()

    def shape(self, name):
        """The shape the layout gives array name for this case."""
        return tuple(self._rows[name]["shape"])

    def dtype_of(self, name):
        """The storage type of array name: fp32, bf16, fp16, int32, int64."""
        return self._rows[name]["dtype"]

    def stages(self):
        """The stage values this layer has (what a candidate may hold)."""
        return [n for n in stage_names() if self._rows[n]["applies"]]

    def save(self, path, force=False):
        """Writes the golden file (byte-reproducible, sealed; an existing
        path is kept unless force)."""
        _lib.call("dl_api_golden_save", self._handle(), _fspath(path), int(bool(force)))
        return path
