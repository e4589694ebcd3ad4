"""The conformance check from Python: candidates from arrays of any
framework, reports, candidate files. Every judgement is the C library's
(dl_check_run through dropless/api.h); this module converts and passes."""

import ctypes
import json
import os
from collections.abc import Mapping

from . import _args, _arrays, _lib
from .golden import Golden, Record, _fspath


def _stage_paths():
    """{accepted key: stage name}: each stage value's name and its dataset
    path with and without the leading '/' ("out", "forward/out",
    "/forward/out"); nothing else names a stage."""
    from .golden import layout
    out = {}
    for r in layout()["arrays"]:
        if r["value"] is not None:
            for key in (r["name"], r["path"], r["path"].lstrip("/")):
                out[key] = r["name"]
    return out


def _name(key, known=None):
    """The stage a candidate key names: exactly a stage name or its dataset
    path; anything else (another group's path, a NUL, a stray '/') raises
    Error naming the key."""
    if not isinstance(key, str):
        raise _lib.error("DL_EINVAL", "candidate key %r is not a str" % (key,))
    known = known if known is not None else _stage_paths()
    if key in known:
        return known[key]
    base = key.strip("/").split("/")[-1].split("\0")[0]
    path = [k for k in known if k.startswith("/") and known[k] == base]
    hint = (" (did you mean %r, or its dataset path %s?)" % (base, path[0]) if path else "")
    raise _lib.error("DL_ENOTFOUND", "candidate key %r is not a stage value%s" % (key, hint))


# Interleaved gate/up storage (gpt-oss's gate_up_proj: gate in the even
# columns, up in the odd; doc/format.md, "Interleaved gate/up"): a candidate
# key naming the pair, as a file's dataset does, and its two stages.
GATE_UP = {"h_gate_up": ("h_gate", "h_up"), "d_h_gate_up": ("d_h_gate", "d_h_up"),
           "d_w_gate_up": ("d_w_gate", "d_w_up")}


def _split_gate_up(key, x):
    """[(key, array)]: an interleaved pair's two halves (x[..., 0::2] and
    x[..., 1::2], contiguous, in x's own array type and dtype), else x."""
    base = key.strip("/").split("/")[-1] if isinstance(key, str) else None
    if base not in GATE_UP:
        return [(key, x)]
    if len(getattr(x, "shape", ())) < 2 or x.shape[-1] % 2:
        raise _lib.error("DL_EINVAL", "candidate key %r: an interleaved gate/up array needs an "
                         "even last extent (2f), got shape %s"
                         % (key, tuple(getattr(x, "shape", ()))))
    halves = []
    for h in (0, 1):
        a = x[..., h::2]
        a = a.contiguous() if hasattr(a, "contiguous") else a.copy()  # C order
        halves.append((GATE_UP[base][h], a))
    return halves


def _stages(outputs):
    """[(stage name, array)] for a candidate mapping; two keys naming one
    stage ('out' and 'forward/out', or 'd_w_gate' and the interleaved
    'd_w_gate_up') raise Error naming both."""
    known = _stage_paths()
    seen = {}
    out = []
    for key, x in ((k, a) for kk, xx in outputs.items() for k, a in _split_gate_up(kk, xx)):
        name = _name(key, known)
        if name in seen:
            raise _lib.error("DL_EINVAL", "candidate keys %r and %r both name stage %s"
                             % (seen[name], key, name))
        seen[name] = key
        out.append((name, x))
    return out


class _Candidate:
    """A candidate handle (owned; freed on close)."""

    def __init__(self, golden, outputs, backend, compute_mode, timeout=None, **attrs):
        self.h = ctypes.c_void_p()
        gh = golden._handle()
        if isinstance(outputs, (str, bytes, os.PathLike)):
            # an untrusted file: parsed in a child process first (golden.load)
            _lib.call("dl_api_candidate_open", gh, _fspath(outputs), _args.timeout(timeout),
                      ctypes.byref(self.h))
            return
        if not isinstance(outputs, Mapping):
            raise TypeError("outputs must map stage names to arrays, or be a candidate file's path")
        stages = _stages(outputs)
        _lib.call("dl_api_candidate_new", gh, _args.text(backend, "backend") if backend else None,
                  _args.text(compute_mode, "compute_mode") if compute_mode else None,
                  ctypes.byref(self.h))
        try:
            for k, v in attrs.items():
                if v is not None:
                    _lib.call("dl_api_candidate_set_attr", self.h, k.encode(), _args.text(str(v), k))
            for name, x in stages:
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
    known = _stage_paths()
    return ";".join(",".join(_name(n, known) for n in grp) for grp in isolated)


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
    return _args.text("\n".join(lines), "check options")


# The profile a case's storage type implies when neither profile nor
# compute_mode is given (doc/python.md): GEMM operands on the storage grid,
# fp32 accumulation (the profile named as the dtype).
CASE_PROFILES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def default_profile(golden):
    """The profile check() uses for golden when none is named: the case's
    own (CASE_PROFILES by its dtype; fp32 for a type not listed)."""
    return CASE_PROFILES.get(golden.config.get("dtype"), "fp32")


def check(golden, outputs, profile=None, isolated=None, strict_storage=False, backend="python",
          compute_mode=None, backend_version=None, timeout=None, progress=None, **options):
    """Checks a kernel's outputs against golden and returns a Report.

    outputs maps stage names ("out", "d_x", "router_logits", ...) to arrays
    (numpy; torch CPU or CUDA; JAX; CuPy; anything with __dlpack__ or
    __array__) in fp32, bf16, fp16 or fp64, integers for the integer
    stages; or it is the path of a candidate file (backend, compute_mode and
    backend_version then come from the file). profile names the
    compute profile (default: compute_mode, else the case's own,
    default_profile(golden): fp32, bf16 or fp16 by the case's dtype;
    a candidate file without profile: its compute_mode, else fp32, as
    `dropless check`); timeout: the limit on parsing a candidate file in a
    child process first (see load); isolated: see
    isolation_spec; strict_storage: a float stage off its storage grid FAILs
    instead of being judged numerically. Further keyword options go to the
    library unchanged (dropless/api.h: stages, diagnose_drops, max_listed,
    recompute_all). progress, if given, is called on this thread as
    progress(stage, done) as each stage value is judged: its name and the
    share of the case's elements judged before it, non-decreasing in
    [0, 1], last ("done", 1.0) (dropless.progress_bar() draws a bar); the
    verdicts do not depend on it. An exception it raises ends the calls;
    the check runs to its end and the exception is raised instead of a
    Report. A nonconforming kernel is a Report, not an exception;
    bad input (unknown stage, wrong shape or dtype) raises Error."""
    if not isinstance(golden, Golden):
        raise TypeError("golden must be a dropless.Golden (dropless.generate or dropless.load)")
    if profile is None and compute_mode is None and isinstance(outputs, Mapping):
        profile = default_profile(golden)
    cb = _lib.Progress(progress, "progress(stage, done)")
    opts = _options(profile, isolated, strict_storage, options)
    with _Candidate(golden, outputs, backend, compute_mode, timeout,
                    backend_version=backend_version) as cand:
        r = ctypes.c_void_p()
        _lib.call("dl_api_check_ex", golden._handle(), cand.h, opts, cb.c, None, ctypes.byref(r))
    try:
        cb.reraise()
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

    def plot(self, path=None, title=None):
        """A picture of the report: each numerics row's error in units of
        its PASS bound (err_pass, log scale; 1 is the PASS bound), coloured
        by verdict, the element's expert named where the stage is indexed
        by expert first (weights and their gradients: [E, ...]). Needs
        matplotlib (pip install 'dropless[plot]'; ImportError saying so
        otherwise). Writes a PNG to path when given (temporary name, then
        rename) and returns the matplotlib Figure."""
        try:
            import matplotlib
            if path is not None:
                matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError("Report.plot needs matplotlib (pip install matplotlib): %s" % e) from e
        rows = [c for c in self.checks if c.get("err_pass") is not None]
        colours = {"PASS": "tab:green", "WARN": "tab:orange", "FAIL": "tab:red"}
        fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows) + 2), 4))
        floor = 1e-3  # an exact stage (err_pass 0) still gets a visible bar
        ax.bar(range(len(rows)), [max(c.err_pass, floor) for c in rows],
               color=[colours.get(c.verdict, "tab:gray") for c in rows])
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="PASS bound")
        ax.set_yscale("log")
        ax.set_xticks(range(len(rows)))
        labels = []
        for c in rows:
            where = self.locate(c)
            shape = self._shapes.get(c.stage) or ()
            expert = (" (expert %s)" % where.split("[")[1].split(",")[0]
                      if where and len(shape) == 3 else "")
            labels.append(c.stage + expert)
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("worst error / PASS bound")
        ax.set_title(title or "%s, %s, profile %s: %s" % (self.case, self.backend, self.profile,
                                                          self.verdict))
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        if path is not None:
            from ._args import path as _p
            dest = os.fsdecode(_p(path))
            tmp = "%s.tmp-%d.png" % (dest, os.getpid())
            try:
                fig.savefig(tmp, format="png", dpi=100)
                os.replace(tmp, dest)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return fig

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
