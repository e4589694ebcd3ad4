#!/usr/bin/env python3
"""Runs, in one invocation on the GPU machine, every GPU adapter (PyTorch,
JAX) over every golden file given, the reference layer (python/dropless/gpu/reference_layer)
on them, the pipeline checks (python/dropless/gpu/pipeline_checks.py: host syncs, CUDA graph
capture with replays on new routing, determinism, JAX compile counts) and
the timing of the reference layer against the typical one, and writes the
candidate files, for `dropless check` to judge afterwards.

    python3 tools/gpu_report.py --out DIR [--replay R.h5|DIR ...] [--pack] GOLDEN.h5|DIR ...

Each step runs in its own process (JAX and PyTorch do not share a GPU's
memory well; a crash or a hung kernel costs one step), killed after its
timeout, and all of them within --budget seconds (steps later in the order
get what is left; a step with less than 20 s left is skipped and the log
says so). Order: reference layer, pipeline checks (reference, torch-moe,
jax-moe), timing, then the adapters (torch, jax). --replay files (the same
shapes as some golden file, other routing: doc/conformance/cases/replay)
feed only the pipeline checks. --quick (CPU smoke test): the CPU, the
timing's small shapes, no adapters unless --adapters names them.
Writes into DIR:
  env.json        machine, driver, Python and framework versions, devices
  summary.jsonl   one line per candidate (backend, mode, compute mode, max
                  errors against the golden) or per failure
  log.txt         everything the steps printed, with each step's exit and time
  pipeline.json   {"reference-moe": ..., "torch-moe": ..., "jax-moe": ...,
                  "timing": ..., "steps": [...]}: the pipeline checks'
                  and the timing's JSON, and each step's exit and seconds
  candidates/     the candidate files, CASE--BACKEND--MODE.h5
and with --pack, candidates.tar.xz (the candidates and the four small
files) split into parts of at most --part-mib MiB (candidates.tar.xz.00,
.01, ...), so that few files carry them back (at most 8 files in all: the
outside copies of summary.jsonl, env.json and log.txt go first if need be);
reassemble with `cat candidates.tar.xz.* | tar -xJ`.
"""

import argparse
import glob
import json
import lzma
import os
import platform
import subprocess
import sys
import tarfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ADAPTERS = ("torch", "jax")
MAX_FILES = 8  # what the device machine hands back


def env_info():
    info = {"python": sys.version.split()[0], "platform": platform.platform(),
            "machine": platform.machine(), "time": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    try:
        info["nvidia-smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:
        info["nvidia-smi"] = "unavailable: %s" % e
    for mod, expr in (("torch", "torch.__version__ + ' cuda ' + str(torch.version.cuda) + ' "
                       "devices ' + str([torch.cuda.get_device_name(i) for i in "
                       "range(torch.cuda.device_count())])"),
                      ("jax", "jax.__version__ + ' ' + str(jax.devices())"),
                      ("h5py", "h5py.__version__"), ("numpy", "numpy.__version__")):
        try:
            r = subprocess.run([sys.executable, "-c", "import %s; print(%s)" % (mod, expr)],
                               capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
            info[mod] = r.stdout.strip() or ("unavailable: " + r.stderr.strip()[-300:])
        except Exception as e:
            info[mod] = "unavailable: %s" % e
    return info


def goldens(args):
    """Absolute paths (the steps run in the repository root)."""
    files = []
    for a in args:
        if os.path.isdir(a):
            files += sorted(glob.glob(os.path.join(a, "*.h5")))
        else:
            files.append(a)
    return [os.path.abspath(f) for f in files]


def priority(name):
    """Archive order, most wanted first: a truncated archive (parts beyond
    what comes back) still unpacks up to its last complete file."""
    for i, pat in enumerate(("reference-moe", "--torch-moe--", "--jax-moe_", "--torch-moe_fused",
                             "_fused_--")):
        if pat in name:
            return (i, name)
    return (9, name)


def pack(cand_dir, out_dir, part_mib, extra=()):
    """candidates.tar.xz of the files extra (at the archive's top level,
    first) and cand_dir (in priority() order), split into parts of part_mib
    MiB. Compressed by `xz -T0` (every core; blocks of 4 MiB so that they
    run in parallel) where the machine has it, else by Python's lzma."""
    path = os.path.join(out_dir, "candidates.tar.xz")
    tarpath = os.path.join(out_dir, "candidates.tar")
    with tarfile.open(tarpath, mode="w") as tar:
        for f in extra:
            if os.path.exists(f):
                tar.add(f, arcname=os.path.basename(f))
        for f in sorted(os.listdir(cand_dir), key=priority):
            tar.add(os.path.join(cand_dir, f), arcname=f)
    try:
        with open(path, "wb") as o:
            subprocess.run(["xz", "-T0", "-6", "--block-size=4MiB", "-c", tarpath], stdout=o,
                           check=True, timeout=600)
    except Exception:  # no xz here
        with open(tarpath, "rb") as i, lzma.open(path, "wb", preset=3) as xz:
            while True:
                chunk = i.read(1 << 24)
                if not chunk:
                    break
                xz.write(chunk)
    os.unlink(tarpath)
    size = os.path.getsize(path)
    part = part_mib << 20
    parts = []
    with open(path, "rb") as fh:
        i = 0
        while True:
            chunk = fh.read(part)
            if not chunk:
                break
            p = "%s.%02d" % (path, i)
            with open(p, "wb") as o:
                o.write(chunk)
            parts.append(p)
            i += 1
    os.unlink(path)
    return size, parts


def run_step(name, cmd, env, log, timeout):
    """Runs one step's command, its output into the log; (exit, seconds)."""
    t1 = time.time()
    print("== %s" % name, flush=True)
    log.write("== %s: %s\n" % (name, " ".join(cmd)))
    log.flush()
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    killer = threading.Timer(timeout, p.kill)  # a hung framework must not eat the lease
    killer.start()
    for line in p.stdout:
        sys.stdout.write(line)
        log.write(line)
    p.wait()
    killer.cancel()
    code = p.returncode if p.returncode >= 0 else "killed (timeout %d s)" % timeout
    secs = time.time() - t1
    msg = "== %s: exit %s, %.1f s" % (name, code, secs)
    print(msg, flush=True)
    log.write(msg + "\n")
    log.flush()
    return code, secs


def steps(a, files, replay, cand, summary, out):
    """[(name, command, timeout, JSON it writes or None)] in running order."""
    py = sys.executable
    dev = ["--device", a.device] if a.device else []
    work = os.path.join(out, "work")
    st = []
    import importlib.util
    if importlib.util.find_spec("torch") is None:  # a JAX-only machine: JAX's steps only
        print("== no PyTorch here: the reference layer, its pipeline checks and the timing "
              "are skipped", flush=True)
        a.steps = "pipeline" if "pipeline" in a.steps else ""
        torch_backends = ()
    else:
        torch_backends = ("reference-moe", "torch-moe")
    if "reference" in a.steps:
        st.append(("reference layer", [py, "-m", "dropless.gpu.reference_layer", "-o", cand, "--summary",
                                       summary] + dev + files, 150, None))
    pc = files + replay
    for be in torch_backends + ("jax-moe",):
        if "pipeline" in a.steps:
            js = os.path.join(work, "pipeline-%s.json" % be)
            st.append(("pipeline checks %s" % be, [py, "-m", "dropless.gpu.pipeline_checks", be,
                                                   "--out", js, "--cand", cand] + dev + pc, 150, js))
    if "timing" in a.steps:
        js = os.path.join(work, "timing.json")
        st.append(("timing", [py, "-m", "dropless.gpu.reference_layer.timing", "--out", js]
                   + (["--quick"] if a.quick else []) + dev, 150, js))
    for ad in [x for x in a.adapters.split(",") if x]:
        st.append(("%s adapter on %d files" % (ad, len(files)),
                   [py, "-m", "dropless.gpu.adapters.%s_adapter" % ad, "-o", cand, "--summary", summary]
                   + dev + files, a.timeout, None))
    return st


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("golden", nargs="+", help="golden files or directories of them")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-report"))
    ap.add_argument("--replay", nargs="*", default=[],
                    help="golden files (or directories) for the graph replays only")
    ap.add_argument("--adapters", default=None, help="default: torch,jax (none with --quick)")
    ap.add_argument("--steps", default="reference,pipeline,timing",
                    help="of reference,pipeline,timing (the adapters: --adapters)")
    ap.add_argument("--device", default=None, help="passed to every step (default: the GPU)")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: small timing shapes")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per adapter process")
    ap.add_argument("--budget", type=int, default=450, help="seconds for all the steps")
    ap.add_argument("--pack", action="store_true", help="pack the candidates into .tar.xz parts")
    ap.add_argument("--part-mib", type=int, default=15)
    a = ap.parse_args(argv)
    if a.adapters is None:
        a.adapters = "" if a.quick else ",".join(ADAPTERS)
    if a.quick and not a.device:
        a.device = "cpu"

    replay = goldens(a.replay)
    same = {os.path.realpath(p) for p in replay}  # a directory may hold them too
    files = [p for p in goldens(a.golden) if os.path.realpath(p) not in same]
    if not files:
        print("gpu_report: no golden files", file=sys.stderr)
        return 2
    cand = os.path.join(a.out, "candidates")
    os.makedirs(cand, exist_ok=True)
    os.makedirs(os.path.join(a.out, "work"), exist_ok=True)
    summary = os.path.join(a.out, "summary.jsonl")
    logpath = os.path.join(a.out, "log.txt")
    t0 = time.time()
    info = env_info()
    with open(os.path.join(a.out, "env.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print(json.dumps(info, indent=1), flush=True)
    rc = 0
    # DROPLESS_H5PY_FALLBACK: the GPU image may lack libdropless's shared
    # libraries; the adapters then read and write with h5py (h5io.py)
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               DROPLESS_H5PY_FALLBACK="1",
               PYTHONPATH=ROOT + os.pathsep + os.path.join(ROOT, "python") + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    report = {"steps": []}
    with open(logpath, "a") as log:
        for name, cmd, timeout, js in steps(a, files, replay, cand, summary, a.out):
            left = a.budget - (time.time() - t0)
            if left < 20:
                msg = "== %s: skipped, %.0f s of the budget left" % (name, left)
                print(msg, flush=True)
                log.write(msg + "\n")
                report["steps"].append({"step": name, "exit": "skipped (budget)"})
                rc = 1
                continue
            code, secs = run_step(name, cmd, env, log, int(min(timeout, left)))
            report["steps"].append({"step": name, "exit": code, "seconds": round(secs, 1)})
            if code != 0:
                rc = 1
            if js:
                key = "timing" if name == "timing" else name.split()[-1]
                try:
                    with open(js) as fh:
                        report[key] = json.load(fh)
                except Exception as e:  # the step died before writing it
                    report[key] = {"error": "no result: %s: %s" % (type(e).__name__, e)}
    report["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(a.out, "pipeline.json"), "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    import shutil
    shutil.rmtree(os.path.join(a.out, "work"), ignore_errors=True)
    n = len(os.listdir(cand))
    print("gpu_report: %d candidate files in %s, %.1f s" % (n, cand, time.time() - t0))
    if a.pack:
        small = [os.path.join(a.out, f) for f in ("env.json", "summary.jsonl", "log.txt",
                                                 "pipeline.json")]
        t1 = time.time()
        size, parts = pack(cand, a.out, a.part_mib, small)
        shutil.rmtree(cand)
        # at most MAX_FILES files come back: the small ones are in the archive
        # too, so drop them from outside, pipeline.json last, if need be; then
        # the archive's last parts (its least wanted candidates), saying so
        for f in small[:3]:
            if len(os.listdir(a.out)) > MAX_FILES:
                os.unlink(f)
        dropped = []
        while len(os.listdir(a.out)) > MAX_FILES and len(parts) > 1:
            os.unlink(parts[-1])
            dropped.append(os.path.basename(parts.pop()))
        if dropped:
            report["pack_dropped_parts"] = dropped[::-1]
            report["pack_note"] = (
                "more than %d files: the archive's last parts were dropped; `cat "
                "candidates.tar.xz.* | xz -dc | tar -x` unpacks every complete file before the "
                "cut, then reports the truncation (the last file it writes may be cut short: "
                "delete it)" % MAX_FILES)
            with open(os.path.join(a.out, "pipeline.json"), "w") as fh:
                json.dump(report, fh, indent=1, default=str)
            print("gpu_report: WARNING: %s" % report["pack_note"], flush=True)
        print("gpu_report: packed %.1f MiB into %s (%.1f s); %s" % (
            size / 2**20, " ".join(os.path.basename(p) for p in parts), time.time() - t1,
            " ".join(sorted(os.listdir(a.out)))))
    return rc


if __name__ == "__main__":
    sys.exit(main())
