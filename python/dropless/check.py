"""The conformance check from Python: candidates from arrays of any
framework, reports, candidate files. Every judgement is the C library's
(dl_check_run through dropless/api.h); this module converts and passes."""

import ctypes
import json
import os
from collections.abc import Mapping

from . import _arrays, _lib
from .golden import Golden, Record, _fspath


def _name(key):
    # "forward/out" and "/backward/d_x" (dataset paths) name stages too
    return str(key).strip("/").split("/")[-1]


class _Candidate:
    """A candidate handle (owned; freed on close)."""

    def __init__(self, golden, outputs, backend, compute_mode, **attrs):
        self.h = ctypes.c_void_p()
        gh = golden._handle()
        if isinstance(outputs, (str, bytes, os.PathLike)):
            _lib.call("dl_api_candidate_load", gh, _fspath(outputs), ctypes.byref(self.h))
            return
        if not isinstance(outputs, Mapping):
            raise TypeError("outputs must map stage names to arrays, or be a candidate file's path")
        _lib.call("dl_api_candidate_new", gh, backend.encode() if backend else None,
                  compute_mode.encode() if compute_mode else None, ctypes.byref(self.h))
        try:
            for k, v in attrs.items():
                if v is not None:
                    _lib.call("dl_api_candidate_set_attr", self.h, k.encode(), str(v).encode())
            for key, x in outputs.items():
                name = _name(key)
                code, a = _arrays.prepare(name, x)
                dims = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
                _lib.call("dl_api_candidate_set", self.h, name.encode(),
                          a.ctypes.data_as(ctypes.c_void_p), code, a.ndim, dims)
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.h:
            _lib.lib().dl_api_candidate_free(self.h)
            self.h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def isolation_spec(isolated):
    """The library's isolation spec for check()'s isolated argument: None
    (the candidate file's groups, else chained), False (chained), True
    (every stage computed alone from golden inputs), a spec string
    "h_gate,h_up;h_act", or groups as lists of names."""
    if isolated is None:
        return None
    if isolated is True:
        return "*"
    if isolated is False:
        return ""
    if isinstance(isolated, str):
        return isolated
    return ";".join(",".join(_name(n) for n in grp) for grp in isolated)


def _options(profile, isolated, strict_storage, options):
    lines = []
    if profile is not None:
        lines.append("profile=%s" % profile)
    spec = isolation_spec(isolated)
    if spec is not None:
        lines.append("isolated=%s" % spec)
    if strict_storage:
        lines.append("strict_storage=1")
    for k, v in options.items():  # passed through: the library knows the keys
        if isinstance(v, bool):
            v = int(v)
        elif isinstance(v, (list, tuple)):
            v = ",".join(str(x) for x in v)
        lines.append("%s=%s" % (k, v))
    for ln in lines:
        if "\n" in ln:
            raise _lib.error("DL_EINVAL", "check option %r holds a newline" % ln)
    return "\n".join(lines).encode()


def check(golden, outputs, profile=None, isolated=None, strict_storage=False, backend="python",
          compute_mode=None, backend_version=None, **options):
    """Checks a kernel's outputs against golden and returns a Report.

    outputs maps stage names ("out", "d_x", "router_logits", ...) to arrays
    (numpy; torch CPU or CUDA; JAX; CuPy; anything with __dlpack__ or
    __array__) in fp32, bf16, fp16 or fp64, integers for the integer
    stages; or it is the path of a candidate file (backend, compute_mode and
    backend_version then come from the file). profile names the
    compute profile (default: compute_mode, else fp32); isolated: see
    isolation_spec; strict_storage: a float stage off its storage grid FAILs
    instead of being judged numerically. Further keyword options go to the
    library unchanged (dropless/api.h: stages, diagnose_drops, max_listed,
    recompute_all). A nonconforming kernel is a Report, not an exception;
    bad input (unknown stage, wrong shape or dtype) raises Error."""
    if not isinstance(golden, Golden):
        raise TypeError("golden must be a dropless.Golden (dropless.generate or dropless.load)")
    opts = _options(profile, isolated, strict_storage, options)
    with _Candidate(golden, outputs, backend, compute_mode, backend_version=backend_version) as cand:
        r = ctypes.c_void_p()
        _lib.call("dl_api_check", golden._handle(), cand.h, opts, ctypes.byref(r))
    try:
        L = _lib.lib()
        texts = {(f, a): _lib.text(L.dl_api_report_text(r, f.encode(), a))
                 for f, a in (("table", 0), ("table", 1), ("json", 0), ("junit", 0))}
    finally:
        _lib.lib().dl_api_report_free(r)
    if any(t is None for t in texts.values()):
        raise _lib.error("DL_ENOMEM", "cannot render the report")
    return Report(texts, {n: golden.shape(n) for n in golden.stages()})


def write_candidate(path, outputs, golden, backend="python", compute_mode=None, isolated=None,
                    force=False, backend_version=None, device=None):
    """Writes outputs (as for check) as a candidate file for `dropless
    check` (doc/format.md): temporary name then rename, an existing path
    kept unless force, every float stage on its storage grid (else Error).
    isolated: the stage-isolation groups (see isolation_spec; True: every
    stage its own group). backend_version and device are root attributes
    (reports show the backend_version)."""
    spec = isolation_spec(isolated) or ""
    with _Candidate(golden, outputs, backend, compute_mode, backend_version=backend_version,
                    device=device) as cand:
        _lib.call("dl_api_candidate_save", cand.h, _fspath(path), spec.encode(), int(bool(force)))
    return path


class Report:
    """The runner's report. conformant, verdict, case, backend, profile,
    counts, checks (one Record per stage x check: stage, check, verdict,
    n_checked, err_pass, worst, message, ...), dropped ((token, slot)
    pairs); table(), to_json(), to_junit(); str(report) is the CLI's table."""

    def __init__(self, texts, shapes):
        self._texts = texts
        self._shapes = shapes
        d = json.loads(texts[("json", 0)])
        self.data = d
        self.case, self.backend, self.profile = d["case"], d["backend"], d["profile"]
        self.verdict, self.conformant = d["verdict"], bool(d["conformant"])
        self.counts = Record(d["counts"])
        self.checks = [Record(c) for c in d["checks"]]
        self.dropped = [tuple(p) for p in d["dropped"]["pairs"]]
        self.n_dropped = d["dropped"]["count"]

    def table(self, all=False):
        """The CLI's table (all: SKIP lines too)."""
        return self._texts[("table", int(bool(all)))]

    def to_json(self):
        return self._texts[("json", 0)]

    def to_junit(self):
        return self._texts[("junit", 0)]

    def __str__(self):
        return self.table()

    def __repr__(self):
        return "<dropless.Report %s %s: %s>" % (self.case, self.backend, self.verdict)

    def __bool__(self):
        return self.conformant

    @property
    def failures(self):
        return [c for c in self.checks if c.verdict == "FAIL"]

    def locate(self, row):
        """'out[3, 1]' for a row's worst element, or None."""
        w = row.get("worst")
        shape = self._shapes.get(row["stage"])
        if not w or shape is None or w.get("index", -1) < 0:
            return None
        idx, rest = [], w["index"]
        for n in reversed(shape):
            idx.append(rest % n if n else 0)
            rest = rest // n if n else 0
        return "%s[%s]" % (row["stage"], ", ".join(str(i) for i in reversed(idx)))

    def explain(self):
        """The failing rows and their worst elements, one line each."""
        lines = ["%s: case %s, backend %s, profile %s: %d FAIL, %d WARN, %d PASS" % (
            "conformant" if self.conformant else "NOT conformant", self.case, self.backend,
            self.profile, self.counts.get("FAIL", 0), self.counts.get("WARN", 0),
            self.counts.get("PASS", 0))]
        for c in self.failures:
            ln = "  %s %s FAIL: %s" % (c.stage, c.check, c.message)
            where = self.locate(c)
            if where:
                w = c.worst
                if w.get("candidate") is None:  # a check without values (zero_drops, routing)
                    ln += "; at %s" % where
                else:
                    ln += "; worst %s = %r, exact %r" % (where, w["candidate"], w["exact"])
                if c.check == "numerics" and c.get("err_pass") is not None:
                    ln += " (%.3g x the PASS bound" % c.err_pass
                    if c.get("err_stat") is not None:
                        ln += ", %.3g x the statistical bound" % c.err_stat
                    ln += ")"
            lines.append(ln)
        if self.n_dropped:
            lines.append("  dropped (token, slot) pairs: %d: %s%s" % (
                self.n_dropped, ", ".join("(%d, %d)" % p for p in self.dropped[:8]),
                ", ..." if self.n_dropped > 8 else ""))
        return "\n".join(lines)
