#!/usr/bin/env python3
"""The GPU adapters (python/dropless/gpu/adapters) on the CPU: the shared pieces (fp32
probe, profiles, stage-isolated groups, candidate files through the package
`dropless`), and the JAX (and, where installed, PyTorch) adapters end to end
on small golden cases, every candidate checked for layout, attributes,
closeness to the golden and, through `dropless check`, verdicts. Speaks
TAP; run through tests/test_adapters.sh (which points the package at this
build's library).
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

# Closeness relative to the largest |golden| element of a stage, a plumbing
# check only (the verdicts are the runner's): a correct backend's stages on
# these small cases stay well inside; a wrong expert, order or scaling is
# off by O(1).
RTOL = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 3e-2}
RTOL_DEFAULT_FP32 = 1e-4  # JAX's DEFAULT precision: on a CPU like HIGHEST

try:
    import numpy as np
    import h5py
    import dropless
    dropless.library_path()
except Exception as e:  # ImportError, or dropless.Error: no library
    print("1..1")
    print("ok 1 # SKIP numpy, h5py or the package dropless unavailable (%s)" % e)
    sys.exit(0)

top_srcdir = os.environ.get("top_srcdir", os.path.join(os.path.dirname(__file__), ".."))
top_builddir = os.environ.get("top_builddir", top_srcdir)
sys.path.insert(0, os.path.abspath(top_srcdir))

from dropless.gpu.adapters import common  # noqa: E402

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
DROPLESS = os.path.join(top_builddir, "dropless")
CASES = ("mixtral-small", "mixtral-small-bf16", "deepseek-v3-small-fp16", "plain-ffn",
         "empty-experts-bf16")
GOLDEN = {}


def make_goldens():
    d = os.path.join(TMP, "golden")
    os.makedirs(d)
    for name in CASES:
        with dropless.generate(name) as g:
            GOLDEN[name] = g.save(os.path.join(d, name + ".h5"))


check("golden fixtures (dropless.generate, saved)", make_goldens)

# ------------------------------------------------------------ shared parts


def t_probe():
    # the probe's verdict, both ways: an exact fp32 GEMM, one on tf32
    # operands, one on bf16 operands, one far off
    def gemm(bits, f=np.rint, noise=0.0):
        def run(a, b, sizes):
            A, B = common._keep_bits(a, bits, f), common._keep_bits(b, bits, f)
            c = np.concatenate([A[:128] @ B[0], A[128:] @ B[1]], 0)
            return (c * (1 + noise)).astype(np.float32)
        return run
    assert common.probe_fp32(gemm(24))["mode"] == "fp32"
    assert common.probe_fp32(gemm(11))["mode"] == "tf32"
    assert common.probe_fp32(gemm(11, np.trunc))["closest"] == "tf32-rz"
    assert common.probe_fp32(gemm(8))["mode"] == "bf16"
    assert common.probe_fp32(gemm(24, noise=1e-3))["mode"] == "unknown"
    assert common.profile_for("bf16") == "bf16-acc" and common.profile_for("fp32") == "fp32"
    assert common.profile_for("bf16", elementwise=True) == "bf16-elem"
    assert common.profile_for("fp32", elementwise=True) == "fp32"  # fp32 ops round once each
    assert common.profile_for("fp32", {"mode": "tf32"}) == "tf32"
    assert common.profile_for("fp32", {"mode": "unknown"}) == "fp32"  # the strictest


def t_groups():
    with dropless.load(GOLDEN["mixtral-small"]) as g:
        iso = {n: None for n in ("h_gate", "h_up", "h_act", "y_sorted", "d_h_act", "d_w_down",
                                 "d_h_gate", "d_h_up", "d_x_sorted", "d_w_gate", "d_w_up")}
        groups = common.isolated_groups(g, iso)
        assert sorted(n for grp in groups for n in grp) == sorted(iso)
        # no group holds a stage together with one upstream of it
        up = {"h_act": {"h_gate", "h_up"}, "y_sorted": {"h_act", "h_gate", "h_up"},
              "d_h_gate": {"h_gate", "h_up", "d_h_act"},
              "d_x_sorted": {"d_h_gate", "d_h_up", "h_gate", "h_up", "d_h_act"},
              "d_w_gate": {"d_h_gate", "h_gate", "h_up", "d_h_act"}}
        for grp in groups:
            for n in grp:
                assert not (up.get(n, set()) & set(grp)), (grp, n)
        try:
            common.isolated_groups(g, {"out": None})
            raise AssertionError("a chained stage landed in an isolated group")
        except KeyError:
            pass


def t_emit():
    out = os.path.join(TMP, "emit")
    os.makedirs(out)
    with dropless.load(GOLDEN["mixtral-small-bf16"]) as g:
        res = common.Result("test", {"h_gate": g.forward["h_gate"], "h_up": g.forward["h_up"]},
                            {"kernel": "none"}, "bf16")
        path, s = common.emit(g, out, res, "isolated", "v1", "a CPU", 0.0, log=lambda s: None,
                              groups=common.isolated_groups(g, res.outputs))
        assert s["errors"] == {"h_gate": 0.0, "h_up": 0.0} and s["isolated_groups"] == "h_gate,h_up"
        with h5py.File(path) as f:
            a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
            assert a["backend"] == "test" and a["backend_version"] == "v1" and a["device"] == "a CPU"
            assert a["compute_mode"] == "bf16" and a["isolated_groups"] == "h_gate,h_up"
            assert sorted(f["forward"]) == ["h_gate", "h_up"]
        r = dropless.check(g, path)
        assert r.conformant and r.backend == "test" and r.profile == "bf16"


def t_h5io():
    # the stand-in for a machine where the library cannot load: its reader
    # agrees with the package's, and its files are the package's to the runner
    from dropless.gpu.adapters import h5io
    out = os.path.join(TMP, "h5io")
    os.makedirs(out)
    path = GOLDEN["mixtral-small-bf16"]
    with dropless.load(path) as g, h5io.Golden(path) as h:
        assert (h.case, h.seed, dict(h.config)) == (g.case, g.seed, dict(g.config))
        assert all(h.dims[k] == g.dims[k] for k in h.dims), (h.dims, g.dims)
        for n in g.stages():
            assert h.shape(n) == g.shape(n) and h.dtype_of(n) == g.dtype_of(n), n
            assert h.array(n).tobytes() == g.array(n).tobytes(), n
        for names, iso in ((("out", "d_x", "topk_ids", "x_sorted"), None),
                           (("h_gate", "h_up", "d_w_down"), [["h_gate", "h_up"], ["d_w_down"]])):
            files = []
            for gg in (g, h):
                p = os.path.join(out, "%s-%d.h5" % (type(gg).__name__, len(names)))
                h5io.write_candidate(p, {n: g.array(n) for n in names}, gg, backend="t",
                                     compute_mode="bf16-acc", isolated=iso, backend_version="v",
                                     device="d", force=True)
                files.append(p)
            with h5py.File(files[0]) as a, h5py.File(files[1]) as b:
                for k in ("backend", "backend_version", "device", "compute_mode", "isolated_groups",
                          "case", "format", "format_version", "seed"):
                    assert (k in a.attrs) == (k in b.attrs), k
                    assert k not in a.attrs or a.attrs[k] == b.attrs[k], k
                for n in names:
                    d = ("backward/" if n.startswith("d_") else "forward/") + n
                    assert a[d].attrs["dtype"] == b[d].attrs["dtype"], n
                    assert a[d][()].tobytes() == b[d][()].astype(a[d].dtype).tobytes(), n
            reps = [dropless.check(g, p) for p in files]
            verdicts = [[(c.stage, c.check, c.verdict, c.err_pass) for c in r.checks] for r in reps]
            assert reps[0].conformant and verdicts[0] == verdicts[1], verdicts
        bad = g.array("out") + np.float32(1e-4)  # off the bf16 grid
        try:
            h5io.write_candidate(os.path.join(out, "bad.h5"), {"out": bad}, h, force=True)
        except ValueError:
            pass
        else:
            raise AssertionError("a value off the bf16 grid was written")


check("fp32 probe: fp32, tf32 (nearest and toward zero), bf16 and off-grid GEMMs told apart", t_probe)
check("h5io: the h5py reader and writer agree with the package's", t_h5io)
check("stage-isolated groups: every stage in one, none holding its own upstream", t_groups)
check("emit: a candidate file with its attributes, read back by the runner", t_emit)


def t_refuse_variants():
    # a routing the backends do not express is refused by name before any
    # backend runs (nothing written); the cases they express are not
    from dropless.gpu.adapters import common as cm
    want = {"softmax-topk": "score_function = softmax_topk",
            "deepseek-v4-like-bf16": "score_function = sqrtsoftplus"}
    out = os.path.join(TMP, "refused")
    os.makedirs(out, exist_ok=True)
    for case, why in want.items():
        path = os.path.join(top_srcdir, "vectors", case + ".h5")
        try:
            cm.run_modes(path, out, ("m",), {"m": lambda g, d: 1 / 0}, None, "cpu", lambda s: None)
        except cm.Unsupported as e:
            assert why in str(e) and case in str(e), str(e)
        else:
            raise AssertionError("%s: not refused" % case)
        with h5py.File(path) as f:  # the h5py reader's /config names the bias too
            cfg = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["config"].attrs.items()}
        assert cm.unsupported(cfg) and why.split(" = ")[1] in cm.unsupported(cfg)
    assert os.listdir(out) == []
    # the command line says so and goes on (exit 0: a refusal, not an error)
    r = subprocess.run([sys.executable, "-m", "dropless.gpu.adapters.jax_adapter", "-o", out,
                        os.path.join(top_srcdir, "vectors", "softmax-topk.h5")],
                       capture_output=True, text=True)
    if have("jax"):
        assert r.returncode == 0 and "skipped:" in r.stderr and "softmax_topk" in r.stderr, r
        assert os.listdir(out) == []
    cfg = {"score_function": "softmax_topk", "router_bias": 0}
    assert "softmax_topk" in cm.unsupported(cfg)
    assert "router_bias" in cm.unsupported({"score_function": "softmax", "router_bias": 1})
    assert cm.unsupported({"score_function": "sigmoid", "has_router_bias": 0}) is None


check("the adapters refuse, by name, routing they cannot express (sqrtsoftplus, softmax_topk, "
      "a router-logit bias)", t_refuse_variants)


def t_refuse_ffn_variants():
    # the FFN variants the adapters' layers cannot express are refused by
    # name before any backend runs (a backend that would run fails the test)
    def never(g, device):
        raise AssertionError("a backend ran on " + g.case)
    for case, word in (("gpt-oss-like-bf16", "swiglu_clamp"), ("geglu-tanh", "geglu_tanh"),
                       ("nemotron-like", "relu2")):
        path = os.path.join(top_srcdir, "vectors", case + ".h5")
        try:
            common.run_modes(path, TMP, ["isolated"], {"isolated": never},
                             lambda g: ("0", "cpu"), "cpu", log=lambda s: None)
        except common.Unsupported as e:
            assert word in str(e).replace("-", "_") and case in str(e), str(e)
        else:
            raise AssertionError("%s: not refused" % case)
    assert "ffn_bias" in common.unsupported({"ffn_kind": "swiglu", "ffn_bias": "1"})
    assert common.unsupported({"ffn_kind": "swiglu"}) is None  # and a supported one runs


check("the FFN variants the adapters cannot express are refused by name", t_refuse_ffn_variants)

# ---------------------------------------------------------------- adapters

PROFILES = {"fp32", "tf32", "bf16", "fp16", "bf16-acc", "fp16-acc", "bf16-elem", "fp16-elem"}


def verify_candidate(path, g, rtol):
    with h5py.File(path) as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        names = [n for grp in ("forward", "backward") if grp in f for n in f[grp]]
    assert attrs["compute_mode"] in PROFILES, attrs["compute_mode"]
    assert attrs["case"] == g.case and attrs["backend"] and attrs["backend_version"]
    assert names, "empty candidate"
    if "isolated_groups" in attrs:  # every dataset in exactly one group
        groups = [grp.split(",") for grp in attrs["isolated_groups"].split(";")]
        assert sorted(n for grp in groups for n in grp) == sorted(names), attrs["isolated_groups"]
    rep = dropless.check(g, path)  # loads it as `dropless check` does
    assert rep.backend == attrs["backend"] and rep.profile == attrs["compute_mode"]
    data = {}
    with h5py.File(path) as f:
        for n in names:
            data[n] = f[("forward/" if n in g.forward else "backward/") + n][()]
    for n, rel in common.compare(g, data).items():
        if isinstance(rel, float):
            assert np.all(np.isfinite(data[n])), n
            assert rel <= rtol, "%s: %s relative error %.3g > %.3g" % (path, n, rel, rtol)
        elif n == "topk_ids":
            assert np.array_equal(np.sort(data[n], 1), np.sort(g.array(n), 1)), "experts differ"
        elif n in ("group_sizes", "group_offsets"):
            assert rel == 0, n
        elif n in ("sort_perm", "inv_perm"):
            assert sorted(data[n].tolist()) == list(range(g.dims["M"])), n
    return attrs, names, rep


def run_adapter(module, name, expect_backends):
    out = os.path.join(TMP, name)
    os.makedirs(out, exist_ok=True)
    for case, path in GOLDEN.items():
        with dropless.load(path) as g:
            written, errors = module.run(path, out, device="cpu", log=lambda s: None, repeat=False)
            assert not errors, errors[0]["traceback"]
            names = {s["backend"] for _, s in written}
            for b in expect_backends(g):
                assert b in names, "%s: no %s candidate (%s)" % (case, b, sorted(names))
            for p, s in written:
                rtol = RTOL[g.config["dtype"]]
                if g.config["dtype"] == "fp32" and "default" in s["backend"]:
                    rtol = RTOL_DEFAULT_FP32
                attrs, got, rep = verify_candidate(p, g, rtol)
                if s["mode"] == "chained":
                    assert "isolated_groups" not in attrs
                    assert set(got) == set(g.stages()), sorted(set(g.stages()) ^ set(got))
                if s["mode"] == "fused":  # out and the input/weight gradients, judged alone
                    assert "isolated_groups" not in attrs and s["backend"].endswith("[fused]")
                    assert set(got) == set(common.FUSED_STAGES) & set(g.stages()), got
                    assert rep.conformant, "%s: %s" % (p, rep.table())


def t_jax():
    from dropless.gpu.adapters import jax_adapter
    run_adapter(jax_adapter, "jax", lambda g: ["jax-ragged_dot[default]", "jax-ragged_dot[highest]",
                                               "jax-moe[default]", "jax-moe[highest]",
                                               "jax-moe[default][fused]", "jax-moe[highest][fused]"])


def t_torch():
    from dropless.gpu.adapters import torch_adapter
    run_adapter(torch_adapter, "torch",
                lambda g: [b + f for b in ["torch-moe" if g.dims["d"] % 8 == 0 else "torch-moe[mm_loop]"]
                           for f in ("", "[fused]")])


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
        assert rep["backend"] and rep["profile"] in PROFILES and rep["backend_version"]
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
        assert len([n for n in t.getnames() if n.endswith(".h5")]) == len(lines)


def t_report_table():
    from dropless.gpu.adapters import report
    files = sorted(glob.glob(os.path.join(TMP, "jax", "*.h5")))
    reps = []
    for p in files:
        with dropless.load(GOLDEN[os.path.basename(p).split("--")[0]]) as g:
            reps.append(json.loads(dropless.check(g, p).to_json()))
    table = report.table(report.aggregate(reps))
    assert table.count("\n") > 10 and "| jax-moe[highest] | fp32 |" in table, table[:500]


jax_skip = None if have("jax") else "JAX not installed (tools/setup_python.sh installs it)"
check("JAX adapter on the CPU: every mode and precision, layout, values and verdicts", t_jax,
      jax_skip)
check("PyTorch adapter on the CPU: every mode, layout, values and verdicts", t_torch,
      None if have("torch") else "PyTorch not installed (the GPU report runs it on the H200)")
check("dropless check reads every JAX candidate; fp32 ragged_dot GEMMs at HIGHEST pass",
      t_runner_reads, jax_skip)
check("report.py tables the JAX candidates' reports in the runner's stage order", t_report_table,
      jax_skip)
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
