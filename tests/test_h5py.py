#!/usr/bin/python3
"""Golden files as a Python user sees them: h5py reads what `dropless gen`
writes, the h5py example of doc/format.md runs as printed, and the inputs
re-derived in pure Python from the PRNG text of doc/format.md match every
bit. Speaks TAP."""
import contextlib
import io
import math
import os
import re
import subprocess
import sys
import tempfile
from fractions import Fraction

try:
    import h5py
    import numpy as np
except ImportError:
    print("1..1")
    print("ok 1 # SKIP h5py not available")
    sys.exit(0)

top_builddir = os.environ.get("top_builddir", ".")
top_srcdir = os.environ.get("top_srcdir", ".")
DL = os.path.join(top_builddir, "dropless")
CASES = ["tiny", "mixtral-small-bf16", "zipf", "deepseek-v3-small-fp16", "ties-grouped-bf16",
         "ties", "empty-experts-fp16", "one-hot", "plain-ffn-fp16", "odd-shapes",
         "qwen2-moe-like-bf16", "deepseek-v3-shared"]

results = []


def check(desc, fn):
    try:
        fn()
        results.append((True, desc, ""))
    except Exception as e:  # a failed check, reported and counted
        results.append((False, desc, "%s: %s" % (type(e).__name__, e)))


# ---------------------------------------------------------------- the PRNG
M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def key(seed, s):
    return mix((seed + s * GAMMA) & M64)


def normal(k, i):
    s = sum(mix((k + (12 * i + j + 1) * GAMMA) & M64) >> 32 for j in range(12))
    return s * 2.0 ** -32 - 6.0


def ln(x):
    m, k = math.frexp(x)
    if m < float.fromhex("0x1.6a09e667f3bcdp-1"):
        m, k = m * 2.0, k - 1
    s = (m - 1.0) / (m + 1.0)
    s2, term, acc = s * s, s, 0.0
    for i in range(20):
        acc = acc + term / float(2 * i + 1)
        term = term * s2
    return float(k) * float.fromhex("0x1.62e42fefa39efp-1") + 2.0 * acc


GRID = {"fp32": (24, -125), "bf16": (8, -125), "fp16": (11, -13)}  # precision, frexp emin


def rn(v, t):
    """v rounded to nearest, ties to even, onto grid t (exact, via Fraction)."""
    if v == 0.0:
        return 0.0
    p, emin = GRID[t]
    q = max(math.frexp(v)[1], emin) - p
    return float(round(Fraction(v) / Fraction(2) ** q) * Fraction(2) ** q)


def derive_inputs(f):
    """The inputs of doc/format.md, 'Input generation', from the file's seed and config."""
    a = f["config"].attrs
    seed = int(f.attrs["seed"])
    T, d, ff, E = (int(a[n]) for n in ("tokens", "hidden", "ffn", "experts"))
    act = a["dtype"].decode()
    name = f.attrs["case"].decode()
    kind = next((k for k in ("zipf", "ties", "empty-experts", "one-hot") if name.startswith(k)),
                "random")
    K, ng = int(a["top_k"]), int(a["n_group"])
    sd, sf = 1.0 / math.sqrt(d), 1.0 / math.sqrt(ff)
    kx, kr, kb, kd, kw, ko = (key(seed, s) for s in (1, 2, 3, 6, 7, 8))
    x = [[rn(8.0 + normal(kx, t * d) * 0.0625, act) if c == 0 else rn(normal(kx, t * d + c), act)
          for c in range(d)] for t in range(T)]
    b = [-1.2 * ln(float(e + 1)) if kind == "zipf" else 0.5 * normal(ko, e) for e in range(E)]
    if kind == "empty-experts":
        b[0] = b[E // 2] = b[E - 1] = -40.0
    if kind == "one-hot":
        b[E // 2] = 40.0
    rw = [[rn((b[e] + normal(kr, e) * sd) * 0.125, "fp32") if c == 0 else
           rn(normal(kr, c * E + e) * sd, "fp32") for e in range(E)] for c in range(d)]
    bias = [rn(normal(kb, e) * 0.0625, "fp32") for e in range(E)] if int(a["has_bias"]) else None
    if kind == "ties":
        def copy(src, dst):
            for c in range(d):
                rw[c][dst] = rw[c][src]
            if bias:
                bias[dst] = bias[src]
        for e in range(1, min(K, E - 1) + 1):
            copy(0, e)
        for e in range(K + 2, min(2 * K + 1, E - 1) + 1):
            copy(e - 1, e)
            r = 1 if d > 1 else 0
            v = np.float32(rw[r][e])
            for _ in range(64):
                v = np.nextafter(v, np.float32(np.inf))
            rw[r][e] = float(v)
        if ng >= 2:
            for e in range(E // ng):
                copy(e, E // ng + e)
        if T >= 1:
            x[0] = [0.0] * d
    out = {"x": x, "router_weight": rw,
           "w_down": [rn(normal(kd, i) * sf, act) for i in range(E * ff * d)],
           "d_out": [rn(normal(kw, i), act) for i in range(T * d)]}
    if bias:
        out["expert_bias"] = bias
    S = int(a["shared_experts"]) * int(a["shared_ffn"]) if "shared_experts" in a else 0
    if S:  # the shared experts' weights: streams 32-35
        k1, k2, k3, k4 = (key(seed, s) for s in (32, 33, 34, 35))
        out["shared_w_gate"] = [rn(normal(k1, i) * sd, act) for i in range(d * S)]
        out["shared_w_up"] = [rn(normal(k2, i) * sd, act) for i in range(d * S)]
        out["shared_w_down"] = [rn(normal(k3, i) * (1.0 / math.sqrt(S)), act) for i in range(S * d)]
        if int(a["shared_gate"]):
            out["shared_gate_weight"] = [rn(normal(k4, i) * sd, act) for i in range(d)]
    return out


def same_bits(got, want, what):
    g = np.asarray(got, dtype=np.float32).ravel()
    w = np.asarray(want, dtype=np.float64).ravel().astype(np.float32)  # exact: values are floats
    assert g.shape == w.shape, "%s: %d values, want %d" % (what, g.size, w.size)
    bad = np.nonzero(g.view(np.uint32) != w.view(np.uint32))[0]
    assert bad.size == 0, "%s: %d of %d differ, first [%d]: %r vs %r" % (
        what, bad.size, g.size, bad[0], g[bad[0]], w[bad[0]])


# ------------------------------------------------------------------ checks
tmp = tempfile.mkdtemp(prefix="dl_h5py.")
paths = {c: os.path.join(tmp, c + ".h5") for c in CASES}


def gen():
    subprocess.run([DL, "gen", "-q", "-d", tmp] + CASES, check=True)


check("dropless gen writes the test cases", gen)

doc = open(os.path.join(top_srcdir, "doc", "format.md")).read()
m = re.search(r"<!-- example: h5py[^>]*-->\s*```python\n(.*?)```", doc, re.S)
snippet = m.group(1) if m else ""


def doc_example_is_short():
    assert snippet, "no h5py example in doc/format.md"
    assert len(snippet.strip().splitlines()) <= 15, "the example has more than 15 lines"


check("doc/format.md has an h5py example of at most 15 lines", doc_example_is_short)

for case in CASES:
    def run_example(case=case):
        env = {"path": paths[case]}
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(snippet, "doc/format.md example", "exec"), env)
        assert printed.getvalue().startswith(case + " "), "the example printed %r" % printed.getvalue()
        gold = env["gold"]
        act = h5py.File(paths[case], "r")["config"].attrs["dtype"].decode()
        p = GRID[act][0]
        # the exact combine is within half an ulp of act of its rounding;
        # float64 summation adds far less than another half ulp
        ulp = np.exp2(np.floor(np.log2(np.maximum(np.abs(gold.astype(np.float64)), 2.0 ** -14))) - p + 1)
        assert (np.abs(env["out"] - gold) <= ulp).all(), "combine off by more than an ulp"

    check("%s: the doc's h5py example runs and recomputes out" % case, run_example)

    def types_and_grids(case=case):
        with h5py.File(paths[case], "r") as f:
            assert f.attrs["format"] == b"dropless-golden" and int(f.attrs["format_version"]) == 1
            act = f["config"].attrs["dtype"].decode()
            for grp in ("inputs", "forward", "backward"):
                for name, ds in f[grp].items():
                    dt = ds.attrs["dtype"].decode()
                    if ds.dtype.kind == "f":
                        assert ds.dtype == np.dtype("<f4"), "%s/%s is %s" % (grp, name, ds.dtype)
                        assert dt in ("fp32", act), "%s/%s: dtype %s" % (grp, name, dt)
                        v = ds[()].view(np.uint32)
                        if dt == "bf16":
                            assert (v & 0xFFFF == 0).all(), "%s/%s off the bf16 grid" % (grp, name)
                        if dt == "fp16":
                            h = ds[()].astype(np.float16).astype(np.float32)
                            assert (h.view(np.uint32) == v).all(), "%s/%s off the fp16 grid" % (grp, name)
                    else:
                        want = {"topk_ids": "<i4", "sort_perm": "<i4", "inv_perm": "<i4",
                                "group_sizes": "<i8", "group_offsets": "<i8"}[name]
                        assert ds.dtype == np.dtype(want) and dt == {"<i4": "int32", "<i8": "int64"}[want]

    check("%s: float32 containers on their grids, int32/int64 indices" % case, types_and_grids)

    def inputs_from_spec(case=case):
        with h5py.File(paths[case], "r") as f:
            want = derive_inputs(f)
            for name, vals in want.items():
                same_bits(f["inputs"][name][()], vals, name)

    check("%s: inputs re-derived in Python from the spec, bit for bit" % case, inputs_from_spec)


def seal_matches():
    import hashlib
    data = open(paths["tiny"], "rb").read()
    head = data[:512].rstrip(b"\0").decode()
    digest = re.search(r"^sha256 ([0-9a-f]{64})$", head, re.M).group(1)
    assert hashlib.sha256(data[512:]).hexdigest() == digest


check("the seal is hashlib.sha256 of the bytes after the user block", seal_matches)

print("1..%d" % len(results))
for i, (ok, desc, why) in enumerate(results, 1):
    print("%s %d - %s" % ("ok" if ok else "not ok", i, desc))
    if why:
        print("# " + why.replace("\n", "\n# "))
subprocess.run(["rm", "-rf", tmp])
sys.exit(0 if all(r[0] for r in results) else 1)
