#!/usr/bin/env python3
"""The reference layer (python/dropless/gpu/reference_layer) on PyTorch's CPU backend,
judged by the runner: CONFORMANT under the strict bf16 profile (fp32
weight gradients) and under fp32, chained and as a fused-out candidate; a
defective variant (one slot dropped) NOT CONFORMANT; its dispatch and tie
rule against torch's stable sort; its Triton kernels under Triton's CPU
interpreter (and compiled ahead of time for sm_90); raw outputs converted
into candidates; the pipeline checks, the timing and gpu_report.py on the
CPU. Speaks TAP; run through tests/test_reference_layer.sh.
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

try:
    import numpy as np
    import torch
    import dropless
    dropless.library_path()
except Exception as e:  # no torch, numpy or library: the wrapper said which
    print("1..1")
    print("ok 1 # SKIP torch, numpy or the package dropless unavailable (%s)" % e)
    sys.exit(0)

top_srcdir = os.path.abspath(os.environ.get("top_srcdir", os.path.join(os.path.dirname(__file__), "..")))
top_builddir = os.path.abspath(os.environ.get("top_builddir", top_srcdir))
sys.path.insert(0, top_srcdir)
DROPLESS = os.path.join(top_builddir, "dropless")
TMP = tempfile.mkdtemp(prefix="dl-reflayer-")
GOLD = os.path.join(TMP, "golden")
CPU = torch.device("cpu")
ENV = dict(os.environ, PYTHONPATH=top_srcdir + os.pathsep + os.path.join(top_srcdir, "python")
           + os.pathsep + os.environ.get("PYTHONPATH", ""))
results = []


def check(desc, fn, skip=None):
    if skip:
        results.append(("skip", desc, skip))
        return
    t0 = time.time()
    try:
        info = fn()
        results.append(("ok", desc, "%.1f s%s" % (time.time() - t0, "; " + info if info else "")))
    except Exception as e:  # reported and counted
        results.append(("fail", desc, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))


def have(mod):
    try:
        __import__(mod)
        return True
    except Exception:
        return False


CASES = ("mixtral-small", "mixtral-small-bf16", "deepseek-v3-small-bf16", "deepseek-v3-small",
         "empty-experts-bf16", "plain-ffn-bf16", "ties-bf16", "odd-shapes-bf16", "no-tokens-bf16",
         "zipf-bf16")
REPLAY = {"mixtral-small-bf16-hot": "inputs = one-hot", "mixtral-small-bf16-r2": "seed = 2",
          "mixtral-small-bf16-empty": "inputs = empty-experts"}


def make_goldens():
    os.makedirs(GOLD)
    subprocess.run([DROPLESS, "gen", "-q", "-d", GOLD] + list(CASES), check=True)
    for name, line in REPLAY.items():
        cf = os.path.join(TMP, name + ".case")
        with open(cf, "w") as fh:
            fh.write("base = mixtral-small\nname = %s\ndtype = bf16\n%s\n" % (name, line))
        subprocess.run([DROPLESS, "gen", "-q", "-d", GOLD, "--config", cf], check=True)


def golden(case):
    return os.path.join(GOLD, case + ".h5")


def verdict(case, cand):
    """(exit status of dropless check, its JSON report)."""
    rj = cand + ".json"
    r = subprocess.run([DROPLESS, "check", "--force", "--json", rj, golden(case), cand],
                       capture_output=True, text=True)
    assert r.returncode in (0, 1), "%s: exit %d: %s" % (cand, r.returncode, r.stderr[-400:])
    rep = json.load(open(rj))
    return r.returncode, (rep[0] if isinstance(rep, list) else rep)


def worst(rep):
    """The largest numerics error in units of the PASS bound."""
    e = [c.get("err_pass") or 0 for c in rep["checks"] if c["check"] == "numerics"]
    return max(e) if e else 0


def run_ref(outdir, files, *extra, env=None):
    r = subprocess.run([sys.executable, "-m", "dropless.gpu.reference_layer", "-o", outdir,
                        "--device", "cpu"] + list(extra) + files, capture_output=True, text=True,
                       cwd=top_srcdir, env=env or ENV, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return sorted(glob.glob(os.path.join(outdir, "*.h5")))


def conformant_all(outdir, files, expect_profiles, *extra, env=None):
    figs = []
    cands = run_ref(outdir, files, *extra, env=env)
    assert len(cands) == 2 * len(files), cands
    for c in cands:
        case = os.path.basename(c).split("--")[0]
        rc, rep = verdict(case, c)
        assert rc == 0, "%s: NOT CONFORMANT: %s" % (c, [(x["stage"], x["check"], x["message"])
                                                         for x in rep["checks"] if x["verdict"] == "FAIL"])
        dt = dropless.load(golden(case)).config["dtype"]
        assert rep["profile"] == expect_profiles[dt], (c, rep["profile"])
        figs.append("%s %s %.2g%s" % (case, "fused" if "fused" in c else "chained", worst(rep),
                                      " (%d WARN)" % rep["counts"]["WARN"] if rep["counts"].get("WARN") else ""))
    return figs


def t_conformant():
    out = os.path.join(TMP, "torchpath")
    files = [golden(c) for c in CASES]
    figs = conformant_all(out, files, {"fp32": "fp32", "bf16": "bf16"})
    return "max numerics err/PASS per candidate: " + ", ".join(figs)


def t_defect():
    out = os.path.join(TMP, "defect")
    cands = run_ref(out, [golden("mixtral-small-bf16"), golden("deepseek-v3-small")],
                    "--defect", "drop_slot", "--no-repeat")
    for c in cands:
        case = os.path.basename(c).split("--")[0]
        rc, rep = verdict(case, c)
        assert rc == 1, "%s: a dropped slot judged CONFORMANT" % c
        bad = {(x["stage"], x["check"]) for x in rep["checks"] if x["verdict"] == "FAIL"}
        assert ("out", "numerics") in bad, bad
        if "fused" not in c:  # the dispatch is complete: the runner names the slot
            zd = [x for x in rep["checks"] if x["check"] == "zero_drops"][0]
            assert zd["verdict"] == "FAIL" and "dropped" in zd["message"], zd["message"]


def t_dispatch_and_ties():
    from dropless.gpu.reference_layer.layer import dispatch, select
    g = torch.Generator().manual_seed(3)
    for T, k, E in ((37, 2, 8), (16, 8, 32), (1, 2, 4), (0, 2, 4)):
        # experts E-2 and E-1 stay empty
        ids = torch.stack([torch.randperm(E - 2, generator=g)[:k] for _ in range(T)]) if T else \
            torch.zeros((0, k), dtype=torch.int64)
        perm, inv, sizes, offs = dispatch(ids, E)
        flat = ids.reshape(-1)
        assert torch.equal(perm, torch.argsort(flat, stable=True))
        assert torch.equal(inv[perm], torch.arange(flat.numel()))
        assert torch.equal(sizes, torch.bincount(flat, minlength=E))
        assert offs[-1] == flat.numel() and offs[0] == 0
    cfg = dict(has_bias=0, n_group=1, topk_group=1, top_k=2, experts=6, group_score="max")
    s = torch.tensor([[0.5, 0.2, 0.5, 0.5, 0.1, 0.2], [0.0, -0.0, 0.0, 0.0, 0.0, 0.0]])
    assert select(s, None, cfg).tolist() == [[0, 2], [0, 1]]  # exact ties: the lower index
    cfg.update(n_group=3, topk_group=1, group_score="top2_sum", top_k=2)
    s = torch.tensor([[0.1, 0.3, 0.2, 0.2, 0.0, 0.4]])  # group sums 0.4, 0.4, 0.4: group 0
    assert select(s, None, cfg).tolist() == [[1, 0]]


def t_triton_interpreter():
    out = os.path.join(TMP, "triton")
    env = dict(ENV, TRITON_INTERPRET="1")
    files = [golden(c) for c in ("mixtral-small-bf16", "deepseek-v3-small", "odd-shapes-bf16",
                                 "empty-experts-bf16")]
    figs = conformant_all(out, files, {"fp32": "fp32", "bf16": "bf16"}, "--gemm", "triton",
                          "--no-repeat", env=env)
    return ", ".join(figs)


def t_fp8_interpreter():
    # the FP8/MXFP4 grouped-GEMM candidates (reference_layer/fp8.py) on two
    # lowp goldens under Triton's interpreter: every correct candidate
    # CONFORMANT under its declared profile, the bf16-accumulator defect NOT
    # CONFORMANT under fp32 (the run exits 0 only when all are as expected)
    out = os.path.join(TMP, "fp8")
    os.makedirs(out, exist_ok=True)
    files = []
    for fam in ("lowp-fp8-deepseek-v3-ue8m0", "lowp-mxfp4-gpt-oss"):
        files.append(os.path.join(out, fam + ".h5"))
        subprocess.run([DROPLESS, "lowp", fam, "-o", files[-1]], check=True)
    env = dict(ENV, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "dropless.gpu.reference_layer.fp8"] + files +
                       ["-o", out, "--device", "cpu"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in open(os.path.join(out, "fp8.jsonl"))]
    decl = [x for x in rows if x["declared"]]
    assert len(decl) == 6 and all(x["as_expected"] for x in decl), decl
    assert {x["candidate"] for x in decl} >= {"triton-fp8-block[bf16-acc]", "triton-mxfp4-dequant",
                                              "torch._scaled_mm[promote]"}, decl
    return "%d declared verdicts as expected" % len(decl)


def t_masked_interpreter():
    # the masked-layout FFN (reference_layer/masked.py) on three routings of
    # one shape and a poisoned twin, one MaskedFFN for all (as the CUDA graph
    # is replayed on the device): every candidate CONFORMANT; the defect
    # that writes padding rows NOT CONFORMANT on layout_y from the poisoned
    # twin (on a zero twin it is caught only when the replayed buffers hold
    # stale rows of an earlier routing: not asserted, reported)
    out = os.path.join(TMP, "masked")
    os.makedirs(out, exist_ok=True)
    files = []
    for name, extra in (("base", []), ("poison", ["--layout-poison"]), ("hot", ["--config", os.path.join(
            top_srcdir, "doc/conformance/cases/replay/mixtral-small-bf16-hot.case")])):
        files.append(os.path.join(out, name + ".h5"))
        args = [DROPLESS, "gen", "-q", "-o", files[-1], "--layout", "masked:32"] + extra
        subprocess.run(args + ([] if "--config" in extra else ["mixtral-small-bf16"]), check=True)
    env = dict(ENV, TRITON_INTERPRET="1")
    mod = [sys.executable, "-m", "dropless.gpu.reference_layer.masked"]
    for extra in ([], ["--defect", "write-padding"]):
        r = subprocess.run(mod + files + ["-o", out, "--device", "cpu"] + extra, capture_output=True,
                           text=True, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    verdicts = []
    for b in ("base", "poison", "hot"):
        for suffix, want in (("--masked", 0), ("--masked-write-padding", 1 if b == "poison" else None)):
            r = subprocess.run([DROPLESS, "check", os.path.join(out, b + ".h5"),
                                os.path.join(out, b + suffix + ".h5")], capture_output=True, text=True)
            assert r.returncode in (0, 1) and want in (None, r.returncode), (b, suffix, r.stdout[-2000:])
            assert r.returncode == 0 or "padding written" in r.stdout, r.stdout[-2000:]
            verdicts.append(r.returncode)
    return "%d CONFORMANT, %d NOT CONFORMANT as expected" % (verdicts.count(0), verdicts.count(1))


def t_dense():
    out = os.path.join(TMP, "dense")
    files = [golden(c) for c in ("mixtral-small-bf16", "deepseek-v3-small", "odd-shapes-bf16",
                                 "empty-experts-bf16", "no-tokens-bf16")]
    return ", ".join(conformant_all(out, files, {"fp32": "fp32", "bf16": "bf16"}, "--gemm", "dense",
                                    "--no-repeat"))


def t_triton_sm90():
    import triton
    from triton.backends.compiler import GPUTarget
    from dropless.gpu.reference_layer import gemm
    tgt = GPUTarget("cuda", 90, 64)
    for dt, prec, bl in (("*bf16", "tf32", gemm._blocks(torch.bfloat16)),
                         ("*fp16", "tf32", gemm._blocks(torch.float16)),
                         ("*fp32", "ieee", gemm._blocks(torch.float32))):
        common = {"PREC": prec, "UPCAST": False}
        ints = lambda names: {n: "i32" for n in names}
        sig = dict({"a_ptr": dt, "b_ptr": dt, "c_ptr": dt, "te_ptr": "*i64", "tr0_ptr": "*i64",
                    "tr1_ptr": "*i64", "s_be": "i64"},
                   **ints(("N", "K", "s_am", "s_ak", "s_bk", "s_bn", "s_cm", "s_cn")))
        sig.update({n: "constexpr" for n in ("BM", "BN", "BK", "PREC", "UPCAST")})
        src = triton.compiler.ASTSource(fn=gemm._rows_kernel, signature=sig, constexprs=dict(
            common, BM=bl["BM"], BN=bl["BN"], BK=bl["BK"]))
        triton.compile(src, target=tgt, options={"num_warps": bl["warps"]})
        sig = dict({"a_ptr": dt, "b_ptr": dt, "c_ptr": "*fp32", "offs_ptr": "*i64", "s_ce": "i64"},
                   **ints(("KA", "N", "n_ka", "n_n", "s_am", "s_ak", "s_bm", "s_bn", "s_ck", "s_cn")))
        sig.update({n: "constexpr" for n in ("ACC", "BM", "BKA", "BN", "PREC", "UPCAST", "GROUP")})
        wb = gemm._wgrad_blocks(torch.float32 if dt == "*fp32" else torch.bfloat16)
        src = triton.compiler.ASTSource(fn=gemm._wgrad_kernel, signature=sig, constexprs=dict(
            common, ACC=True, BM=wb["BM"], BKA=wb["BKA"], BN=wb["BN"], GROUP=8))
        triton.compile(src, target=tgt, options={"num_warps": wb["warps"],
                                                 "num_stages": wb["stages"]})
        fused_sm90(triton, tgt, dt)


def fused_sm90(triton, tgt, dt):
    """The memory-bound kernels of fused.py (CUDA only: the CPU runs their
    PyTorch definitions), compiled for sm_90 with the element type dt."""
    from dropless.gpu.reference_layer import fused
    i32 = lambda names: {n: "i32" for n in names}
    kernels = (
        (fused._swiglu_kernel, dict({"hg_ptr": dt, "hu_ptr": dt, "o_ptr": dt},
                                    **i32(("F", "s_g", "s_u", "s_o"))), {}),
        (fused._swiglu_bw_kernel, dict({"hg_ptr": dt, "hu_ptr": dt, "dh_ptr": dt, "o_ptr": dt},
                                       **i32(("F", "s_g", "s_u", "s_d", "s_o"))), {}),
        (fused._gather_sum_kernel, dict({"src_ptr": dt, "idx_ptr": "*i64", "w_ptr": "*fp32",
                                         "o_ptr": "*fp32"}, **i32(("N", "s_src", "s_o"))),
         {"K": 2, "HAS_W": True}),
        (fused._weighted_rows_kernel, dict({"d_ptr": dt, "w_ptr": "*fp32", "perm_ptr": "*i64",
                                            "o_ptr": dt}, **i32(("N", "s_d", "s_o"))), {"K": 2}),
        (fused._row_dots_kernel, dict({"y_ptr": dt, "idx_ptr": "*i64", "d_ptr": dt,
                                       "o_ptr": "*fp32"}, **i32(("N", "s_y", "s_d"))), {"K": 2}),
    )
    for fn, sig, cx in kernels:
        cx = dict(cx, BLOCK=1024)
        sig = dict(sig, **{n: "constexpr" for n in cx})
        triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=cx),
                       target=tgt, options={"num_warps": 4})


def t_no_library():
    # where libdropless does not load (the GPU machine): goldens read and
    # candidates written with h5py (python/dropless/gpu/adapters/h5io.py), still CONFORMANT
    out = os.path.join(TMP, "nolib")
    env = dict(ENV, DROPLESS_LIB=os.path.join(TMP, "no-such-lib.so"))
    # the fallback is explicit: without it the run stops, saying why
    r = subprocess.run([sys.executable, "-m", "dropless.gpu.reference_layer", "-o", out, "--no-repeat",
                        "--device", "cpu", golden("deepseek-v3-small-bf16")], capture_output=True,
                       text=True, cwd=top_srcdir, env=env, timeout=300)
    assert r.returncode != 0 and "DROPLESS_H5PY_FALLBACK=1" in r.stdout + r.stderr, r
    env["DROPLESS_H5PY_FALLBACK"] = "1"
    cands = run_ref(out, [golden("deepseek-v3-small-bf16")], "--no-repeat", env=env)
    assert len(cands) == 2, cands
    for c in cands:
        rc, rep = verdict("deepseek-v3-small-bf16", c)
        assert rc == 0 and rep["profile"] == "bf16", rep["counts"]


def t_pipeline():
    out = os.path.join(TMP, "pipe")
    files = [golden(c) for c in ("mixtral-small-bf16", "deepseek-v3-small")] + \
        [golden(c) for c in REPLAY]
    for be in ("reference-moe", "torch-moe"):
        js = os.path.join(out, be + ".json")
        r = subprocess.run([sys.executable, "-m", "dropless.gpu.pipeline_checks",
                            be, "--out", js, "--cand", os.path.join(out, "cand"), "--device", "cpu"]
                           + files, capture_output=True, text=True, env=ENV, timeout=600)
        assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
        res = json.load(open(js))
        assert len(res["cases"]) == len(files)
        assert all(c["host_syncs"].startswith("skipped") for c in res["cases"])
        if be == "reference-moe":
            assert res["summary"]["deterministic_all"], res["summary"]
            gs = res["graph"]
            assert len(gs) == 1 and len(gs[0]["replays"]) == 4, gs
            sizes = [tuple(rp["group_sizes"]) for rp in gs[0]["replays"]]
            assert len(set(sizes)) == 4 and any(0 in s for s in sizes), sizes  # routing varies
            for rp in gs[0]["replays"]:
                assert rp["equals_eager"], rp
                rc, rep = verdict(rp["case"][:-3], os.path.join(out, "cand", rp["candidate"]))
                assert rc == 0, rp
    from dropless.gpu.pipeline_checks import kind_of
    assert kind_of("sizes = [int(n) for n in sizes_t.cpu()]") == ".cpu()"
    assert kind_of("sizes_t = torch.bincount(flat, minlength=E)").startswith("bincount")


def t_sync_counter():
    # count_syncs' hook, where and kinds on the CPU: torch.cuda's sync debug
    # mode stood in for by a fake that warns (or raises) as CUDA's does
    import warnings
    from dropless.gpu import pipeline_checks as pc
    mode = {"m": "default"}
    saved = torch.cuda.synchronize, torch.cuda.set_sync_debug_mode
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.set_sync_debug_mode = lambda m: mode.update(m=m)

    # what a synchronising torch call does under each mode, as library code
    # (the counter places a sync at the innermost frame outside the libraries)
    lib = {"mode": mode, "warnings": warnings}
    exec(compile("def sync_op():\n"
                 "    if mode['m'] == 'warn':\n"
                 "        warnings.warn('called a synchronizing CUDA operation')\n"
                 "    elif mode['m'] == 'error':\n"
                 "        raise RuntimeError('called a synchronizing CUDA operation')\n",
                 "/fake/site-packages/torch/cuda_op.py", "exec"), lib)
    sync_op = lib["sync_op"]

    def layer():
        sync_op()
        for _ in range(2):  # two more, from one line
            sync_op()
    try:
        r = pc.count_syncs(layer)
    finally:
        torch.cuda.synchronize, torch.cuda.set_sync_debug_mode = saved
    assert r["count"] == 3, r
    assert sorted(w["times"] for w in r["where"]) == [1, 2], r
    assert all("test_reference_layer.py" in w["where"] and " layer: " in w["where"]
               for w in r["where"]), r
    assert r["error_mode"].startswith("RuntimeError: called a synchronizing"), r
    assert "test_reference_layer.py" in r["error_mode"], r
    assert mode["m"] == "default"


def t_gpu_report():
    out = os.path.join(TMP, "report")
    files = [golden("mixtral-small-bf16"), golden("plain-ffn-bf16")]
    r = subprocess.run([sys.executable, os.path.join(top_srcdir, "tools", "gpu_report.py"), "--quick",
                        "--out", out, "--pack", "--replay"] + [golden(c) for c in REPLAY]
                       + ["--"] + files, capture_output=True, text=True, env=ENV, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    names = sorted(os.listdir(out))
    assert len(names) <= 8 and "pipeline.json" in names and "candidates.tar.xz.00" in names, names
    rep = json.load(open(os.path.join(out, "pipeline.json")))
    for k in ("reference-moe", "torch-moe", "jax-moe", "timing"):
        assert k in rep and "error" not in rep[k], (k, str(rep.get(k))[:500])
    for shape in ("mixtral", "deepseek-v3"):
        t = rep["timing"]["shapes"][shape]
        assert t["typical"]["median_ms"] > 0 and t["reference_eager"]["median_ms"] > 0, t
    import tarfile
    with tarfile.open(os.path.join(out, "candidates.tar.xz.00"), "r:xz") as t:
        got = t.getnames()
    assert "pipeline.json" in got and sum(n.endswith(".h5") for n in got) >= 4 + 4, got
    r = subprocess.run([sys.executable, "-m", "dropless.gpu.pipeline_report",
                        os.path.join(out, "pipeline.json")], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0 and "| reference-moe | skipped" in r.stdout, r.stdout + r.stderr
    assert "| mixtral | 64 |" in r.stdout, r.stdout
    assert "1 compile(s) for 4 routings" in r.stdout or not have("jax"), r.stdout


check("golden fixtures (dropless gen, replay case files)", make_goldens)
check("dispatch (histogram, offsets, counting sort) equals torch's stable argsort; ties to the "
      "lower index", t_dispatch_and_ties)
check("reference layer on the CPU: chained and fused-out candidates CONFORMANT (bf16 strict, fp32)",
      t_conformant)
check("defective reference layer (a slot dropped): NOT CONFORMANT, the slot named", t_defect)
tri = None if have("triton") else "Triton not installed"
check("Triton kernels under the CPU interpreter: CONFORMANT", t_triton_interpreter, tri)
check("FP8/MXFP4 grouped-GEMM candidates under the interpreter: correct CONFORMANT, the "
      "bf16-accumulator defect NOT CONFORMANT", t_fp8_interpreter,
      tri)
check("masked-layout FFN under the interpreter (the CUDA graph's step): CONFORMANT on three "
      "routings and the poisoned twin; writing padding NOT CONFORMANT", t_masked_interpreter, tri)
check("the dense fallback (padded buffers, torch.bmm in fp32): CONFORMANT", t_dense)
sm90 = tri
if not tri:
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        import triton.backends.nvidia  # noqa: F401
    except Exception as e:
        sm90 = "Triton has no NVIDIA backend here (%s)" % e
check("Triton kernels compile for sm_90 ahead of time", t_triton_sm90, sm90)
check("without libdropless (h5py reads and writes): CONFORMANT candidates", t_no_library)
check("pipeline checks on the CPU: deterministic, replays on new routing CONFORMANT", t_pipeline)
check("host-sync counter: every synchronising call counted and placed, the first raised in error "
      "mode (a fake sync debug mode)", t_sync_counter)
check("gpu_report.py --quick end to end (reference, pipeline, timing; packed, <= 8 files)",
      t_gpu_report)

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
