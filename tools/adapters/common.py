"""Golden-file reading and candidate-file writing for the GPU adapters.

Needs numpy and h5py only: the frameworks (PyTorch, JAX) are imported by the
adapters themselves, so this module, and the tests of it, run anywhere.

The layout is the format's one table (layout.json, the output of `dropless
info --layout --json`; doc/format.md): a candidate holds any subset of the
/forward and /backward datasets, each float dataset an IEEE float32
container whose values lie on the grid of its storage type, named by a
`dtype` attribute.
"""

import json
import os
import tempfile

import numpy as np

ADAPTERS_VERSION = "0.1.0"

# The format's arrays, read from `dropless info --layout --json` (the C
# library's one table, DL_VALUE_MAP), saved beside this module as
# layout.json; tests/test_cli_check.sh fails when the two differ. As tuples
# (group, name, elem, act, dims, cond): elem 'f' float / 'i32' / 'i64'; act 1
# = the case's dtype, 0 = fp32; dims symbols T d f E k M (=T*k) P (=E+1);
# cond 'always', 'bias' (has_bias only), 'swiglu' (ffn_kind swiglu only).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "layout.json")) as _fh:
    _LAYOUT_JSON = json.load(_fh)
FORMAT = _LAYOUT_JSON["format"]
FORMAT_VERSION = _LAYOUT_JSON["format_version"]
LAYOUT = [(r["group"], r["name"], "f" if r["store"] in ("act", "f32") else r["store"],
           1 if r["store"] == "act" else 0, r["dims"], r["cond"])
          for r in _LAYOUT_JSON["arrays"]]
# The stage values in the runner's order (dl_value_t).
STAGE_VALUES = [r["name"] for r in sorted((r for r in _LAYOUT_JSON["arrays"]
                                           if r["value"] is not None), key=lambda r: r["value"])]
SPEC = {g + "/" + n: (g, n, e, a, dims, c) for g, n, e, a, dims, c in LAYOUT}

def group_terms(cfg):
    """The keys a group score adds up: the rule of dl_route_group_terms
    (1 for max, 2 for top2_sum, top_k / topk_group for topk_sum; at least 1,
    at most the group size E / n_group)."""
    if cfg["n_group"] <= 1:
        return 1
    nb = {"max": 1, "top2_sum": 2}.get(cfg["group_score"], cfg["top_k"] // cfg["topk_group"])
    return min(max(nb, 1), cfg["experts"] // cfg["n_group"])


CONFIG_INT = ("tokens", "hidden", "ffn", "experts", "top_k", "n_group", "topk_group",
              "renormalize", "has_bias")
CONFIG_STR = ("score_function", "group_score", "ffn_kind", "dtype")
DTYPES = ("fp32", "bf16", "fp16")


def _str(v):
    return v.decode() if isinstance(v, bytes) else str(v)


# ------------------------------------------------------------------ grids

def bf16_round(a):
    """float32 array -> nearest bf16 values (ties to even), as float32.
    NaN stays NaN; values past the largest bf16 become +-inf."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    lsb = (u >> 16) & 1
    r = ((u + 0x7FFF + lsb) >> 16) << 16
    out = (r & 0xFFFFFFFF).astype(np.uint32).view(np.float32).copy()
    nan = np.isnan(a)
    out[nan] = np.nan
    return out


def fp16_round(a):
    """float32 array -> nearest fp16 values (ties to even, subnormals), as
    float32. numpy's float32 -> float16 conversion rounds correctly."""
    with np.errstate(over="ignore"):
        return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)


_GRID = {"bf16": (8, -133, 3.3895313892515355e38), "fp16": (11, -24, 65504.0)}


def _round_f64(a, dtype):
    """float64 -> nearest value of dtype (ties to even), once, as float32."""
    bits, qmin, big = _GRID[dtype]
    a = np.asarray(a, dtype=np.float64)
    m, e = np.frexp(a)
    q = np.maximum(e - bits, qmin)
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.ldexp(np.rint(np.ldexp(a, -q)), q)
        r = np.where(np.isfinite(a) & (np.abs(r) > big), np.copysign(np.inf, a), r)
    return np.where(np.isfinite(a), r, a).astype(np.float32)


def round_to(a, dtype):
    """Rounds a float32 or float64 array once (nearest, ties to even) to
    dtype's values; returns float32."""
    a = np.asarray(a)
    if dtype == "fp32":
        return a.astype(np.float32)
    if dtype not in _GRID:
        raise ValueError("unknown dtype %r" % dtype)
    if a.dtype == np.float64:
        return _round_f64(a, dtype)
    a = a.astype(np.float32)
    return bf16_round(a) if dtype == "bf16" else fp16_round(a)


def on_grid(a, dtype):
    """True if every finite element of the float32 array a is a value of
    dtype (NaN/Inf pass here; the runner judges them)."""
    a = np.asarray(a, dtype=np.float32)
    if dtype == "fp32":
        return True
    fin = np.isfinite(a)
    return bool(np.array_equal(round_to(a[fin], dtype), a[fin]))


# What an fp32 GEMM really computes: its result on full-precision fp32
# operands is compared with float64 products of the operands rounded to
# each of these grids (significand bits; np.rint = nearest-even, np.trunc =
# toward zero, as tensor cores read fp32 registers holding unconverted
# fp32 values as tf32).
PROBE_GRIDS = (("fp32", 24, np.rint), ("tf32", 11, np.rint), ("tf32-rz", 11, np.trunc),
               ("bf16", 8, np.rint))


def probe_verdict(rel_err):
    """{'mode': profile, 'closest': grid, 'rel_err_vs': rel_err}: the
    profile of the closest grid; fp32 only when fp32 is closest and the
    error is at fp32 level."""
    closest = min(rel_err, key=rel_err.get)
    mode = {"tf32-rz": "tf32"}.get(closest, closest)
    if mode == "fp32" and rel_err["fp32"] > 1e-5:
        mode = "unknown"
    return {"mode": mode, "closest": closest, "rel_err_vs": rel_err}


# ------------------------------------------------------------------ golden

class Golden:
    """A golden file in memory: root attributes, /config, every dataset.
    g["forward/h_gate"] is the float32 (or integer) numpy array."""

    def __init__(self, path):
        import h5py
        self.path = path
        with h5py.File(path, "r") as f:
            self.attrs = {k: f.attrs[k] for k in f.attrs}
            fmt = _str(self.attrs.get("format", ""))
            if fmt != FORMAT:
                raise ValueError("%s: not a dropless golden file (format = %r)" % (path, fmt))
            ver = int(self.attrs.get("format_version", -1))
            if ver != FORMAT_VERSION:
                raise ValueError("%s: format_version %d, these adapters read %d"
                                 % (path, ver, FORMAT_VERSION))
            c = f["config"].attrs
            self.config = {}
            for k in CONFIG_INT:
                self.config[k] = int(c[k])
            for k in CONFIG_STR:
                self.config[k] = _str(c[k])
            self.config["scaling"] = float(c["scaling"])
            self.data = {}
            self.dtype_attr = {}
            for key, (g, n, elem, act, dims, cond) in SPEC.items():
                if key in f:
                    ds = f[key]
                    self.data[key] = ds[()]
                    self.dtype_attr[key] = _str(ds.attrs.get("dtype", ""))
        self.case = _str(self.attrs.get("case", os.path.basename(path)))
        self.seed = int(self.attrs.get("seed", 0))
        c = self.config
        self.dtype = c["dtype"]
        if self.dtype not in DTYPES:
            raise ValueError("%s: unknown dtype %r" % (path, self.dtype))
        self.T, self.d, self.f = c["tokens"], c["hidden"], c["ffn"]
        self.E, self.k = c["experts"], c["top_k"]
        self.M = self.T * self.k
        self.swiglu = c["ffn_kind"] == "swiglu"
        self.has_bias = bool(c["has_bias"])
        for key in self.data:
            want = self.shape(key)
            if tuple(self.data[key].shape) != want:
                raise ValueError("%s: %s has shape %s, /config says %s"
                                 % (path, key, self.data[key].shape, want))

    def __getitem__(self, key):
        return self.data[key]

    def has(self, key):
        return key in self.data

    def applies(self, key):
        cond = SPEC[key][5]
        return (cond == "always" or (cond == "bias" and self.has_bias)
                or (cond == "swiglu" and self.swiglu))

    def shape(self, key):
        dims = SPEC[key][4]
        sym = {"T": self.T, "d": self.d, "f": self.f, "E": self.E, "k": self.k,
               "M": self.M, "P": self.E + 1}
        return tuple(sym[s] for s in dims)

    def stage_dtype(self, key):
        g, n, elem, act, dims, cond = SPEC[key]
        if elem == "i32":
            return "int32"
        if elem == "i64":
            return "int64"
        return self.dtype if act else "fp32"

    def describe(self):
        c = self.config
        route = c["score_function"]
        if c["has_bias"]:
            route += "+bias"
        if c["n_group"] > 1:
            route += " g%d/%d:%s" % (c["n_group"], c["topk_group"], c["group_score"])
        return "T=%d d=%d f=%d E=%d k=%d %s %s %s" % (self.T, self.d, self.f, self.E, self.k,
                                                      route, c["ffn_kind"], self.dtype)


def read_golden(path):
    return Golden(path)


# --------------------------------------------------------------- candidate

class Skip(Exception):
    """A backend that does not apply to this case (not an error)."""


class Candidate:
    """What one backend produced for one golden case."""

    def __init__(self, golden, backend, backend_version, device, compute_mode, mode):
        self.golden = golden
        self.backend = backend
        self.backend_version = backend_version
        self.device = device
        self.compute_mode = compute_mode
        self.mode = mode            # "isolated" or "chained"
        self.data = {}
        self.notes = {}             # free-form, stored as JSON in attribute "notes"
        self.isolated_groups = None  # [[key, ...], ...] for stage-isolated candidates

    def groups_attr(self):
        """The isolated_groups attribute: names within a group joined by ',',
        groups by ';'."""
        return ";".join(",".join(k.split("/")[1] for k in grp) for grp in self.isolated_groups)

    def put(self, key, arr):
        self.data[key] = arr


# Stage-isolated results: each group below was computed by one kernel call
# fed golden inputs. The runner judges a chained candidate's stage on the
# candidate's own upstream stages (and, where it lacks one, on that stage's
# exact value on ITS upstream, recursively), which is wrong for these: h_act
# from the golden h_gate would be judged on the candidate's h_gate. So an
# isolated candidate names its groups in the root attribute
# isolated_groups (doc/conformance.md, "Stage-isolated candidates"), and the
# runner checks each group on golden upstream. No group holds a stage
# upstream of another of its stages.
ISOLATED_PARTS = (
    ("gate_up", ("forward/h_gate", "forward/h_up")),
    ("act", ("forward/h_act",)),
    ("down", ("forward/y_sorted",)),
    ("down_bwd", ("backward/d_h_act", "backward/d_w_down")),
    ("act_bwd", ("backward/d_h_gate", "backward/d_h_up")),
    ("gate_up_bwd", ("backward/d_x_sorted", "backward/d_w_gate", "backward/d_w_up")),
)
# plain FFN: y = x_sorted W_down alone
ISOLATED_PARTS_PLAIN = (
    ("down", ("forward/y_sorted",)),
    ("down_bwd", ("backward/d_x_sorted", "backward/d_w_down")),
)


def split_isolated(g, res):
    """[(group, {key: array})] of stage-isolated results, one per kernel
    call; every key of res lands in exactly one group."""
    parts = ISOLATED_PARTS if g.swiglu else ISOLATED_PARTS_PLAIN
    out, used = [], set()
    for name, keys in parts:
        sub = {k: res[k] for k in keys if k in res}
        used |= set(sub)
        if sub:
            out.append((name, sub))
    left = sorted(set(res) - used)
    if left:
        raise KeyError("stage-isolated results outside every part: %s" % left)
    return out


def _check_key(golden, key):
    if key not in SPEC:
        raise KeyError("%s is not a dataset of format v%d" % (key, FORMAT_VERSION))
    if SPEC[key][0] == "inputs":
        raise KeyError("%s is an input: a candidate holds stages only" % key)
    if not golden.applies(key):
        raise KeyError("%s does not exist for this case (%s)" % (key, golden.describe()))


def prepare_dataset(golden, key, arr):
    """Checks and converts one candidate array: (array, dtype attribute).
    Float stages must arrive as float32 (the adapters convert framework
    tensors to float32 exactly) on the grid of their storage type."""
    _check_key(golden, key)
    a = np.asarray(arr)
    want = golden.shape(key)
    if tuple(a.shape) != want:
        raise ValueError("%s: shape %s, the case needs %s" % (key, a.shape, want))
    sdt = golden.stage_dtype(key)
    if sdt in ("int32", "int64"):
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError("%s: %s array for an integer stage" % (key, a.dtype))
        nt = np.int32 if sdt == "int32" else np.int64
        info = np.iinfo(nt)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise ValueError("%s: values out of %s range" % (key, sdt))
        return a.astype(nt), sdt
    if a.dtype != np.float32:
        raise ValueError("%s: %s array; convert the framework tensor to float32 exactly"
                         % (key, a.dtype))
    if not on_grid(a, sdt):
        raise ValueError("%s: values not on the %s grid" % (key, sdt))
    return np.ascontiguousarray(a), sdt


def write_candidate(path, cand, force=False):
    """Writes cand to path in the golden layout: root attributes (format,
    format_version, case, seed, generator, backend, backend_version, device,
    compute_mode, mode, notes), /config copied from the golden, and every
    dataset cand holds. Written to a temporary name, then renamed; an
    existing path is kept unless force."""
    import h5py
    g = cand.golden
    if os.path.exists(path) and not force:
        raise FileExistsError("%s exists (use force)" % path)
    prepared = {}
    order = list(SPEC)
    for key in sorted(cand.data, key=lambda k: order.index(k) if k in SPEC else -1):
        prepared[key] = prepare_dataset(g, key, cand.data[key])
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".cand-", suffix=".h5", dir=d)
    os.close(fd)
    try:
        with h5py.File(tmp, "w", track_order=True) as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = np.int64(FORMAT_VERSION)
            f.attrs["generator"] = "dropless adapters %s" % ADAPTERS_VERSION
            f.attrs["case"] = g.case
            f.attrs["seed"] = np.uint64(g.seed)
            f.attrs["backend"] = cand.backend
            f.attrs["backend_version"] = cand.backend_version
            f.attrs["device"] = cand.device
            f.attrs["compute_mode"] = cand.compute_mode
            f.attrs["mode"] = cand.mode
            f.attrs["notes"] = json.dumps(cand.notes, sort_keys=True, default=str)
            if cand.isolated_groups:
                missing = set(cand.data) - {k for grp in cand.isolated_groups for k in grp}
                if missing or any(k not in cand.data for grp in cand.isolated_groups for k in grp):
                    raise ValueError("isolated_groups must cover exactly the datasets written")
                f.attrs["isolated_groups"] = cand.groups_attr()
            cfg = f.create_group("config")
            for k in CONFIG_INT:
                cfg.attrs[k] = np.int64(g.config[k])
            for k in CONFIG_STR:
                cfg.attrs[k] = g.config[k]
            cfg.attrs["scaling"] = np.float64(g.config["scaling"])
            for key, (a, sdt) in prepared.items():
                ds = f.create_dataset(key, data=a)
                ds.attrs["dtype"] = sdt
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_candidate(path):
    """(root attributes, {key: array}, {key: dtype attribute}) of a candidate
    (isolated_groups, if any, among the attributes)."""
    import h5py
    with h5py.File(path, "r") as f:
        attrs = {k: (_str(v) if isinstance(v, (bytes, str)) else v) for k, v in f.attrs.items()}
        data, dt = {}, {}
        for key in SPEC:
            if key in f:
                data[key] = f[key][()]
                dt[key] = _str(f[key].attrs.get("dtype", ""))
    return attrs, data, dt


# -------------------------------------------------------------- comparison

def compare(golden, data):
    """{key: (max_abs_err, max_rel_err_vs_max|golden|)} for every float
    stage present in data and in golden; integer stages: mismatch counts."""
    out = {}
    for key, a in data.items():
        if not golden.has(key):
            continue
        ref = golden[key]
        if SPEC[key][2] != "f":
            out[key] = (int(np.count_nonzero(np.asarray(a) != ref)), None)
            continue
        a = np.asarray(a, dtype=np.float64)
        r = ref.astype(np.float64)
        if a.size == 0:
            out[key] = (0.0, 0.0)
            continue
        err = float(np.max(np.abs(a - r)))
        scale = float(np.max(np.abs(r)))
        out[key] = (err, err / scale if scale > 0 else (0.0 if err == 0 else float("inf")))
    return out


# ------------------------------------------------------------ CLI helpers

def candidate_name(case, backend, mode=None):
    """A file name for a case x backend (x mode), in [A-Za-z0-9._-] only."""
    s = "%s--%s" % (case, backend) + ("--%s" % mode if mode else "")
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in s) + ".h5"


def emit(g, outdir, name, version, device, compute_mode, mode, res, notes, seconds,
         log=print, force=True, groups=None):
    """Writes one backend's results for golden g as a candidate file in
    outdir (groups: isolated_groups, None for a chained candidate) and logs
    a line; returns (path, summary dict)."""
    cand = Candidate(g, name, version, device, compute_mode, mode)
    cand.isolated_groups = groups
    cand.notes = dict(notes)
    cand.notes["seconds"] = round(seconds, 3)
    if "repeat_differs" in notes:
        cand.notes["repeat_differs"] = [k for k in notes["repeat_differs"] if k in res]
    for key, a in res.items():
        cand.put(key, a)
    path = os.path.join(outdir, candidate_name(g.case, name, mode))
    write_candidate(path, cand, force=force)
    cmp = compare(g, res)
    worst = max((v[1] for v in cmp.values() if v[1] is not None), default=0.0)
    nd = cand.notes.get("repeat_differs")
    log("%-26s %-30s %-8s %-9s %2d stages, max rel err vs golden %.3g%s"
        % (g.case, name, mode, compute_mode, len(res), worst,
           ", repeat differs in " + " ".join(nd) if nd else ""))
    return path, {"case": g.case, "backend": name, "mode": mode, "compute_mode": compute_mode,
                  "file": os.path.basename(path), "errors": cmp,
                  "isolated_groups": cand.groups_attr() if groups else None}


def adapter_main(argv, doc, available, run, modes_all):
    """The command line shared by the adapters."""
    import argparse
    import sys
    import traceback
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("golden", nargs="+", help="golden files")
    ap.add_argument("-o", "--outdir", default=".", help="where candidates go")
    ap.add_argument("--mode", choices=tuple(modes_all) + ("all",), default="all")
    ap.add_argument("--device", default=None, help="cuda, cpu, gpu (default: the accelerator)")
    ap.add_argument("--summary", help="append one JSON line per candidate to this file")
    ap.add_argument("--no-repeat", action="store_true",
                    help="run each backend once (default: twice, to see nondeterminism)")
    a = ap.parse_args(argv)
    ok, why = available()
    if not ok:
        print("adapter unavailable: %s" % why, file=sys.stderr)
        return 2
    os.makedirs(a.outdir, exist_ok=True)
    modes = tuple(modes_all) if a.mode == "all" else (a.mode,)
    rc = 0
    for p in a.golden:
        try:
            out, errors = run(p, a.outdir, modes, a.device, repeat=not a.no_repeat)
        except Exception as e:  # one bad file must not stop the others
            traceback.print_exc()
            print("%s: %s: %s" % (p, type(e).__name__, e), file=sys.stderr)
            rc = 1
            continue
        if errors:
            rc = 1
        if a.summary:
            with open(a.summary, "a") as fh:
                for path, s in out:
                    fh.write(json.dumps(s, default=str) + "\n")
                for e in errors:
                    fh.write(json.dumps(e, default=str) + "\n")
    return rc


def run_modes(golden_path, outdir, modes, backends, runner_info, log=print, repeat=True):
    """Runs backends[mode](g) for each mode; a failing mode is reported and
    the others still run. runner_info(g) -> (version, device) strings. With
    repeat, each backend runs twice and notes["repeat_differs"] lists the
    stages whose bits changed (nondeterminism: atomics, split-K...). Every
    mode but "chained" is stage-isolated: its candidate carries the
    isolated_groups attribute (split_isolated).
    Returns ([(path, summary)], [error dicts])."""
    import traceback
    import time
    g = read_golden(golden_path)
    written, errors = [], []
    for mode in modes:
        t0 = time.time()
        try:
            name, res, notes, cmode = backends[mode](g)
            seconds = time.time() - t0
            if repeat:
                # a second run on the same inputs: bitwise the same?
                res2 = backends[mode](g)[1]
                notes["repeat_differs"] = sorted(
                    k for k in res if k in res2 and
                    res[k].tobytes() != np.asarray(res2[k], dtype=res[k].dtype).tobytes())
            version, device = runner_info(g)
            groups = None
            if mode != "chained":
                groups = [sorted(sub, key=list(SPEC).index) for _, sub in split_isolated(g, res)]
            written.append(emit(g, outdir, name, version, device, cmode, mode, res, notes,
                                seconds, log, groups=groups))
        except Skip as e:
            log("%-26s %-30s %-8s skipped: %s" % (g.case, "-", mode, e))
        except Exception as e:
            tb = traceback.format_exc()
            log("%-26s %-30s %-8s ERROR %s: %s" % (g.case, "-", mode, type(e).__name__, e))
            errors.append({"case": g.case, "mode": mode, "error": "%s: %s" % (type(e).__name__, e),
                           "traceback": tb})
    return written, errors
