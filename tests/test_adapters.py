#!/usr/bin/env python3
"""The GPU adapters (tools/adapters) on the CPU: golden reading, candidate
writing, the float64 reference model, and the JAX (and, where installed,
PyTorch) adapters end to end on small golden files, with every candidate
checked for layout, attributes, shapes, storage grids and closeness to the
golden. Speaks TAP; run through tests/test_adapters.sh.

Golden files come from `$top_builddir/dropless gen` when that exists, else
from the float64 reference model (tools/adapters/refmodel.py: golden-shaped,
not exact, enough for plumbing).
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

# Tolerances, relative to the largest |golden| element of a stage: stage
# errors of a correct backend on these small cases (K <= 32) stay well
# inside them; a wrong stage (wrong expert, wrong order, missing scaling)
# is off by O(1).
RTOL = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 3e-2}
# JAX at default precision on a CPU computes fp32 like HIGHEST; on a GPU it
# would not, which is what the GPU report is for.
RTOL_DEFAULT_FP32 = 1e-4

try:
    import numpy as np
    import h5py
except ImportError as e:
    print("1..1")
    print("ok 1 # SKIP numpy/h5py not available (%s)" % e)
    sys.exit(0)

top_srcdir = os.environ.get("top_srcdir", os.path.join(os.path.dirname(__file__), ".."))
top_builddir = os.environ.get("top_builddir", top_srcdir)
sys.path.insert(0, os.path.abspath(top_srcdir))

from tools.adapters import common, refmodel  # noqa: E402

results = []


def check(desc, fn, skip=None):
    if skip:
        results.append(("skip", desc, skip))
        return
    t0 = time.time()
    try:
        fn()
        results.append(("ok", desc, "%.1f s" % (time.time() - t0)))
    except Exception as e:  # reported and counted
        results.append(("fail", desc, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))


def have(mod):
    try:
        __import__(mod)
        return True
    except Exception:
        return False


TMP = tempfile.mkdtemp(prefix="dl-adapters-")

# --------------------------------------------------------------- fixtures

CASES = {  # name: refmodel arguments that mirror the catalogue case
    "mixtral-small": dict(T=32, d=16, f=16, E=8, k=2, score="softmax", seed=10),
    "mixtral-small-bf16": dict(T=32, d=16, f=16, E=8, k=2, score="softmax", dtype="bf16", seed=10),
    "deepseek-v3-small-fp16": dict(T=16, d=8, f=8, E=32, k=8, score="sigmoid", n_group=8,
                                   topk_group=4, group_score="top2_sum", scaling=2.5,
                                   has_bias=1, dtype="fp16", seed=11),
    "plain-ffn": dict(T=24, d=24, f=24, E=6, k=2, score="softmax", ffn_kind="plain", seed=13),
    "empty-experts-bf16": None,  # catalogue only: needs the generator's input pattern
}

DROPLESS = os.path.join(top_builddir, "dropless")


def dropless_has(cmd):
    if not os.access(DROPLESS, os.X_OK):
        return False
    r = subprocess.run([DROPLESS, "help"], capture_output=True, text=True)
    return any(line.split()[:1] == [cmd] for line in (r.stdout + r.stderr).splitlines())


GEN = dropless_has("gen")
GOLDEN = {}


def make_goldens():
    d = os.path.join(TMP, "golden")
    os.makedirs(d)
    for name, args in CASES.items():
        path = os.path.join(d, name + ".h5")
        if GEN:
            subprocess.run([DROPLESS, "gen", "-q", "-d", d, name], check=True)
        elif args is None:
            continue
        else:
            refmodel.make_golden(path, case=name, **args)
        GOLDEN[name] = path


check("golden fixtures (%s)" % ("dropless gen" if GEN else "float64 reference model"),
      make_goldens)

# ------------------------------------------------------------------ grids


def t_bf16():
    f32 = lambda *v: np.array(v, dtype=np.float32)
    # ties to even at the 8-bit significand, carry into the exponent, NaN, inf
    got = common.bf16_round(f32(1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 2 - 2**-9,
                                np.inf, -0.0))
    want = f32(1.0, 1 + 2**-6, 1 + 2**-7, 2.0, np.inf, -0.0)
    assert np.array_equal(got, want), got
    assert np.isnan(common.bf16_round(f32(np.nan)))[0]
    assert common.bf16_round(f32(3.4e38))[0] == np.inf
    if have("ml_dtypes"):
        import ml_dtypes
        x = np.random.default_rng(1).standard_normal(100000).astype(np.float32) * 1e3
        ref = x.astype(ml_dtypes.bfloat16).astype(np.float32)
        assert np.array_equal(common.bf16_round(x), ref)


def t_round_f64_once():
    # 1 + 2^-8 + 2^-30: rounding to float32 first lands on the bf16 tie
    # 1 + 2^-8 and then on 1.0; rounding once goes up to 1 + 2^-7.
    x = np.array([1 + 2**-8 + 2**-30, 1 + 2**-11 + 2**-40, 65519.99, 2**-25 * 1.5])
    got = common.round_to(x, "bf16")
    assert got[0] == np.float32(1 + 2**-7), got
    got = common.round_to(x, "fp16")
    assert got[1] == np.float32(1 + 2**-10) and got[2] == 65504.0 and got[3] == 2**-24, got
    assert common.on_grid(got, "fp16") and not common.on_grid(np.float32([1 + 2**-12]), "fp16")


check("bf16 rounding: ties to even, carries, specials (and ml_dtypes where present)", t_bf16)
check("round_to rounds float64 once to bf16/fp16", t_round_f64_once)

# ------------------------------------------------------- reference model


def t_refmodel_exact():
    # The float64 model reproduces the oracle's stages bit for bit on these
    # cases: evidence that the adapters' reading of each stage is the oracle's.
    for name, path in GOLDEN.items():
        g = common.read_golden(path)
        ins = {k.split("/")[1]: v for k, v in g.data.items() if k.startswith("inputs/")}
        fw, bw = refmodel.compute(g.config, ins)
        for grp, vals in (("forward", fw), ("backward", bw)):
            for n, a in vals.items():
                if n == "tie_margin":
                    continue
                ref = g[grp + "/" + n]
                assert np.array_equal(np.asarray(a), ref), "%s %s/%s" % (name, grp, n)


check("float64 reference model equals the oracle on the generated cases", t_refmodel_exact,
      skip=None if GEN else "needs `dropless gen` (the fixtures are the model's own)")

# ------------------------------------------------------ candidate writing


def t_candidate_rules():
    g = common.read_golden(GOLDEN["mixtral-small-bf16"])
    c = common.Candidate(g, "test", "0", "cpu", "bf16", "isolated")
    ok = g["forward/h_gate"]
    c.put("forward/h_gate", ok)
    path = common.write_candidate(os.path.join(TMP, "c.h5"), c)
    try:
        common.write_candidate(path, c)
        raise AssertionError("an existing file was overwritten without force")
    except FileExistsError:
        pass
    bad = [("inputs/x", g["inputs/x"], KeyError),                      # an input
           ("forward/h_gate", ok[:-1], ValueError),                    # shape
           ("forward/h_gate", ok + np.float32(2**-12), ValueError),   # off the bf16 grid
           ("forward/h_gate", ok.astype(np.float64), ValueError),      # not float32
           ("forward/topk_ids", g["forward/topk_ids"].astype(np.float32), ValueError),
           ("forward/nonsense", ok, KeyError)]
    for key, arr, exc in bad:
        c2 = common.Candidate(g, "test", "0", "cpu", "bf16", "isolated")
        c2.put(key, arr)
        try:
            common.write_candidate(os.path.join(TMP, "bad.h5"), c2, force=True)
            raise AssertionError("accepted %s" % key)
        except exc:
            pass
    assert not os.path.exists(os.path.join(TMP, "bad.h5"))
    attrs, data, dt = common.read_candidate(path)
    assert attrs["backend"] == "test" and attrs["compute_mode"] == "bf16"
    assert attrs["format"] == common.FORMAT and int(attrs["format_version"]) == 1
    assert list(data) == ["forward/h_gate"] and dt["forward/h_gate"] == "bf16"
    with h5py.File(path) as f:
        assert f["forward/h_gate"].dtype == np.dtype("<f4")
        assert f["config"].attrs["dtype"] == "bf16"


def t_split():
    g = common.read_golden(GOLDEN["mixtral-small"])
    iso = {k: g[k] for k in ("forward/h_gate", "forward/h_up", "forward/h_act",
                             "forward/y_sorted", "backward/d_h_act", "backward/d_w_down",
                             "backward/d_h_gate", "backward/d_h_up", "backward/d_x_sorted",
                             "backward/d_w_gate", "backward/d_w_up")}
    parts = common.split_isolated(g, iso)
    assert sorted(k for _, sub in parts for k in sub) == sorted(iso)
    # no part holds a stage together with one upstream of it
    up = {"forward/h_act": {"forward/h_gate", "forward/h_up"},
          "forward/y_sorted": {"forward/h_act", "forward/h_gate", "forward/h_up"},
          "backward/d_h_gate": {"forward/h_gate", "forward/h_up", "backward/d_h_act"},
          "backward/d_x_sorted": {"backward/d_h_gate", "backward/d_h_up", "forward/h_gate",
                                  "forward/h_up", "backward/d_h_act"},
          "backward/d_w_gate": {"backward/d_h_gate", "forward/h_gate", "forward/h_up",
                                "backward/d_h_act"}}
    for name, sub in parts:
        for k in sub:
            assert not (up.get(k, set()) & set(sub)), (name, k)


check("candidate writer: layout, attributes, refuses inputs/shapes/off-grid/float64/names",
      t_candidate_rules)
check("stage-isolated results split so that no part holds a stage's upstream", t_split)

# ---------------------------------------------------------------- adapters

PROFILES = {"fp32", "tf32", "bf16", "fp16", "bf16-acc", "fp16-acc"}


def verify_candidate(path, g, rtol):
    attrs, data, dt = common.read_candidate(path)
    assert attrs["compute_mode"] in PROFILES, attrs["compute_mode"]
    assert attrs["case"] == g.case and attrs["backend"] and attrs["backend_version"]
    assert attrs["mode"] in ("isolated", "chained", "isolated_tf32", "wgrad_fp32")
    json.loads(attrs["notes"])
    assert data, "empty candidate"
    if attrs["mode"] == "chained":
        assert "isolated_groups" not in attrs
    else:  # every dataset in exactly one group, no group holding its own upstream
        groups = [grp.split(",") for grp in attrs["isolated_groups"].split(";")]
        names = [n for grp in groups for n in grp]
        assert sorted(names) == sorted(k.split("/")[1] for k in data), attrs["isolated_groups"]
    errs = common.compare(g, data)
    for key, a in data.items():
        assert common.SPEC[key][0] != "inputs" and g.applies(key), key
        assert a.shape == g.shape(key), (key, a.shape)
        assert dt[key] == g.stage_dtype(key), (key, dt[key])
        if common.SPEC[key][2] == "f":
            assert a.dtype == np.float32 and common.on_grid(a, dt[key]), key
            assert np.all(np.isfinite(a)), key
            assert errs[key][1] <= rtol, "%s: %s relative error %.3g > %.3g" % (
                path, key, errs[key][1], rtol)
        elif key == "forward/topk_ids":
            assert np.array_equal(np.sort(a, 1), np.sort(g[key], 1)), "selected experts differ"
        elif key in ("forward/group_sizes", "forward/group_offsets"):
            assert np.array_equal(a, g[key]), key
        elif key in ("forward/sort_perm", "forward/inv_perm"):
            assert sorted(a.tolist()) == list(range(g.M)), key
    return attrs, data


def run_adapter(module, name, expect_backends):
    out = os.path.join(TMP, name)
    os.makedirs(out, exist_ok=True)
    for case, path in GOLDEN.items():
        g = common.read_golden(path)
        written, errors = module.run(path, out, device="cpu", log=lambda s: None, repeat=False)
        assert not errors, errors[0]["traceback"]
        names = {s["backend"].split(":")[0] for _, s in written}
        for b in expect_backends(g):
            assert b in names, "%s: no %s candidate (%s)" % (case, b, sorted(names))
        for p, s in written:
            rtol = RTOL[g.dtype]
            if g.dtype == "fp32" and "default" in s["backend"]:
                rtol = RTOL_DEFAULT_FP32
            attrs, data = verify_candidate(p, g, rtol)
            if s["mode"] == "chained":
                want = {k for k in common.SPEC if common.SPEC[k][0] != "inputs" and g.applies(k)}
                assert set(data) == want - {"forward/tie_margin"}, sorted(want - set(data))


def t_jax():
    from tools.adapters import jax_adapter
    run_adapter(jax_adapter, "jax", lambda g: ["jax-ragged_dot[default]", "jax-ragged_dot[highest]",
                                               "jax-moe[default]", "jax-moe[highest]"])


def t_torch():
    from tools.adapters import torch_adapter
    run_adapter(torch_adapter, "torch",
                lambda g: ["torch-moe" if g.d % 8 == 0 else "torch-moe[mm_loop]"])


GEMM_STAGES = {"h_gate", "h_up", "y_sorted", "d_h_act", "d_w_down", "d_x_sorted", "d_w_gate",
               "d_w_up"}


def t_runner_reads():
    # `dropless check` loads every candidate (exit 0 or 1, never 2: unreadable),
    # and the fp32 grouped GEMMs of ragged_dot at HIGHEST, each judged on
    # golden upstream through isolated_groups, pass the fp32 profile.
    files = sorted(glob.glob(os.path.join(TMP, "jax", "*.h5")))
    assert files
    gemm_checked = 0
    for p in files:
        case = os.path.basename(p).split("--")[0]
        rj = os.path.join(TMP, "r.json")
        r = subprocess.run([DROPLESS, "check", "--force", "--json", rj, GOLDEN[case], p],
                           capture_output=True, text=True)
        assert r.returncode in (0, 1), "%s: exit %d: %s" % (p, r.returncode, r.stderr[-500:])
        rep = json.load(open(rj))
        rep = rep[0] if isinstance(rep, list) else rep
        assert rep["backend"] and rep["profile"] in PROFILES
        if "ragged_dot_highest" in p and not case.endswith(("-bf16", "-fp16")):
            for c in rep["checks"]:
                if c["stage"] in GEMM_STAGES and c["check"] == "numerics":
                    assert c["verdict"] == "PASS", "%s: %s %s: %s" % (
                        p, c["stage"], c["verdict"], c["message"])
                    gemm_checked += 1
    assert gemm_checked >= 8, gemm_checked


def t_gpu_report():
    out = os.path.join(TMP, "report")
    r = subprocess.run([sys.executable, os.path.join(top_srcdir, "tools", "gpu_report.py"),
                        "--out", out, "--adapters", "jax", "--device", "cpu", "--pack",
                        GOLDEN["plain-ffn"]], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for f in ("env.json", "summary.jsonl", "log.txt", "candidates.tar.xz.00"):
        assert os.path.exists(os.path.join(out, f)), f
    lines = [json.loads(x) for x in open(os.path.join(out, "summary.jsonl"))]
    assert len(lines) >= 4 and all("error" not in x for x in lines), lines
    import tarfile
    with tarfile.open(os.path.join(out, "candidates.tar.xz.00"), "r:xz") as t:
        assert len(t.getnames()) == len(lines)


jax_skip = None if have("jax") else "JAX not installed (tools/setup_python.sh installs it)"
check("JAX adapter on the CPU: every mode and precision, layout and values", t_jax, jax_skip)
check("PyTorch adapter on the CPU: every mode, layout and values", t_torch,
      None if have("torch") else "PyTorch not installed (the GPU report runs it on the H200)")
check("dropless check reads every JAX candidate; fp32 ragged_dot GEMMs at HIGHEST pass",
      t_runner_reads,
      jax_skip or (None if dropless_has("check") else "no `dropless check` in this build"))
check("gpu_report.py end to end (JAX on the CPU, packed)", t_gpu_report, jax_skip)

print("1..%d" % len(results))
for i, (st, desc, info) in enumerate(results, 1):
    if st == "ok":
        print("ok %d - %s (%s)" % (i, desc, info))
    elif st == "skip":
        print("ok %d - %s # SKIP %s" % (i, desc, info))
    else:
        print("not ok %d - %s" % (i, desc))
        for line in info.rstrip().splitlines():
            print("# " + line)
import shutil  # noqa: E402
shutil.rmtree(TMP, ignore_errors=True)
sys.exit(0)
