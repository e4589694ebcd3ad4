"""Golden cases: the catalogue, generation in memory, golden files."""

import ctypes
import json
import os
from collections.abc import Mapping

import numpy as np

from . import _args, _arrays, _lib

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
    return _args.path(p)


def _spec(case):
    """A catalogue name or a case file's path, as bytes."""
    if isinstance(case, (bytes, os.PathLike)):
        return _args.path(case, "case file")
    return _args.text(case, "case")


def memory(case, backward=True):
    """(bytes generate(case) needs, bytes available or -1 when unknown):
    the library's estimate, as `dropless gen` makes it."""
    need, avail = ctypes.c_int64(), ctypes.c_int64()
    _lib.call("dl_api_golden_memory", _spec(case), int(not backward), ctypes.byref(need),
              ctypes.byref(avail))
    return need.value, avail.value


def generate(case, seed=None, backward=True, ignore_memory=False, progress=None):
    """Generates a golden case in memory: case is a catalogue name
    ("mixtral-small-bf16") or the path of a case file. seed replaces the
    case's seed (an integer in [0, 2**64 - 1], else ValueError). The
    memory estimate is checked first, as `dropless gen` does: a case that
    does not fit raises Error (DL_ENOMEM) unless ignore_memory. progress,
    if given, is called as progress(phase, done) with done in [0, 1] while
    generating (a bar: dropless.progress_bar()); an exception it raises
    ends the calls and is raised here once generation returns (no Golden).
    Returns a Golden; raises Error."""
    h = ctypes.c_void_p()
    s = _args.seed(seed)
    cb = _lib.Progress(progress)
    _lib.call("dl_api_golden_generate_ex", _spec(case), int(s is not None), s or 0,
              int(not backward), int(bool(ignore_memory)), cb.c, None, ctypes.byref(h))
    g = Golden(h)
    if cb.error is not None:  # the callback raised: no golden, the exception instead
        g.close()
        cb.reraise()
    if progress is not None:
        progress("done", 1.0)
    return g


def progress_bar(file=None, width=30):
    """A progress callback for generate(): one line on file (default
    sys.stderr), redrawn in place, ended by a newline at done = 1."""
    import sys
    out = file if file is not None else sys.stderr

    def show(phase, done):
        n = int(round(max(0.0, min(1.0, done)) * width))
        out.write("\r[%s%s] %3d%% %-10s" % ("#" * n, "." * (width - n), int(done * 100), phase))
        if done >= 1.0:
            out.write("\n")
        out.flush()
    return show


def load(path, timeout=None):
    """Loads a golden file (seal, types, shapes and grids verified). Unless
    its seal verifies, the file is parsed first in a child process limited
    to timeout seconds (default DROPLESS_PREFLIGHT_SECONDS, else 120; 0:
    none): a file that crashes or hangs HDF5 raises Error naming the file
    instead of killing the interpreter."""
    h = ctypes.c_void_p()
    _lib.call("dl_api_golden_open", _fspath(path), _args.timeout(timeout), ctypes.byref(h))
    return Golden(h)


class Arrays(Mapping):
    """The arrays of one group (inputs, forward or backward) of a golden:
    name -> numpy array (a copy). Inputs come in their storage type
    (bf16 as ml_dtypes.bfloat16, fp16 as numpy float16, fp32 and integers
    as themselves), so a kernel fed g.inputs computes in the case's type;
    stage values (forward, backward) are float32 holding the exact
    fp32/bf16/fp16 values, or integers. .fp32 gives the same group with
    every float array as float32 (exact); as_storage("ml_dtypes" |
    "torch") in storage types."""

    def __init__(self, golden, group, storage=None):
        self._g = golden
        self._group = group
        self._storage = group == "inputs" if storage is None else storage
        self._names = [a["name"] for a in golden._info["arrays"]
                       if a["group"] == group and a["present"]]

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(name)
        a = self._g.array(name)
        return _arrays.as_storage(a, self._g.dtype_of(name), "ml_dtypes") if self._storage else a

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def __repr__(self):
        return "<dropless.Arrays %s of %s%s: %s>" % (self._group, self._g.case,
                                                    "" if self._storage else " (fp32)",
                                                    ", ".join(self._names))

    @property
    def fp32(self):
        """The group with float arrays as float32 (exact values)."""
        return Arrays(self._g, self._group, storage=False)

    def as_storage(self, kind="ml_dtypes", device=None):
        """{name: array in its storage type}: kind "ml_dtypes" (bf16 as
        ml_dtypes.bfloat16, fp16 as numpy float16) or "torch" (tensors of
        the storage dtype, on device)."""
        return {n: _arrays.as_storage(self._g.array(n), self._g.dtype_of(n), kind, device)
                for n in self._names}


class Golden:
    """A golden case: configuration, inputs and every stage value of the
    oracle, held by the C library. Use as a context manager or call
    close(); using it afterwards raises Error."""

    def __init__(self, handle):
        self._h = handle
        self._shared = False
        self._info = json.loads(_lib.text(_lib.lib().dl_api_golden_info_json(handle)))
        self._rows = {a["name"]: a for a in self._info["arrays"]}
        self.case = self._info["case"]
        self.seed = self._info["seed"]
        self.config = Record(self._info["config"])
        self.dims = Record(self._info["dims"])
        self.has_backward = self._info["has_backward"]

    # -- lifetime
    def close(self):
        """Frees the golden; a shared one (the pytest plugin's session
        goldens) stays open: the session owns it."""
        if self._h and not self._shared:
            self._free()

    def _share(self):
        """Makes close() and `with` leave this golden open (it belongs to
        a cache, which frees it with _free())."""
        self._shared = True
        return self

    def _free(self):
        if self._h:
            _lib.lib().dl_api_golden_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self._free()
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
        _lib.call("dl_api_golden_array", h, _args.text(name, "array name"), ctypes.byref(data),
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
