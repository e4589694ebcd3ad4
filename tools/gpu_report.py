#!/usr/bin/env python3
"""Runs every GPU adapter (PyTorch, JAX) over every golden file given and
writes the candidate files, for `dropless check` to judge afterwards.

    python3 tools/gpu_report.py --out DIR GOLDEN.h5|DIR ...

On the GPU machine: each framework runs in its own process (JAX and PyTorch
do not share a GPU's memory well), one after the other. Writes into DIR:
  env.json        machine, driver, Python and framework versions, devices
  summary.jsonl   one line per candidate (backend, mode, compute mode, max
                  errors against the golden) or per failure
  log.txt         everything the adapters printed
  candidates/     the candidate files, CASE--BACKEND--MODE.h5
and with --pack, candidates.tar.xz split into parts of at most --part-mib
MiB (candidates.tar.xz.00, .01, ...), so that few files carry them back;
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
    files = []
    for a in args:
        if os.path.isdir(a):
            files += sorted(glob.glob(os.path.join(a, "*.h5")))
        else:
            files.append(a)
    return files


def pack(cand_dir, out_dir, part_mib):
    """candidates.tar.xz of cand_dir, split into parts of part_mib MiB."""
    path = os.path.join(out_dir, "candidates.tar.xz")
    with lzma.open(path, "wb", preset=6) as xz:
        with tarfile.open(fileobj=xz, mode="w") as tar:
            for f in sorted(os.listdir(cand_dir)):
                tar.add(os.path.join(cand_dir, f), arcname=f)
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("golden", nargs="+", help="golden files or directories of them")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-report"))
    ap.add_argument("--adapters", default=",".join(ADAPTERS))
    ap.add_argument("--device", default=None, help="passed to the adapters (default: the GPU)")
    ap.add_argument("--timeout", type=int, default=420, help="seconds per adapter process")
    ap.add_argument("--pack", action="store_true", help="pack the candidates into .tar.xz parts")
    ap.add_argument("--part-mib", type=int, default=15)
    a = ap.parse_args(argv)

    files = goldens(a.golden)
    if not files:
        print("gpu_report: no golden files", file=sys.stderr)
        return 2
    cand = os.path.join(a.out, "candidates")
    os.makedirs(cand, exist_ok=True)
    summary = os.path.join(a.out, "summary.jsonl")
    logpath = os.path.join(a.out, "log.txt")
    t0 = time.time()
    info = env_info()
    with open(os.path.join(a.out, "env.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print(json.dumps(info, indent=1), flush=True)
    rc = 0
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(logpath, "a") as log:
        for ad in a.adapters.split(","):
            cmd = [sys.executable, "-m", "tools.adapters.%s_adapter" % ad, "-o", cand,
                   "--summary", summary] + (["--device", a.device] if a.device else []) + files
            t1 = time.time()
            print("== %s adapter on %d files" % (ad, len(files)), flush=True)
            log.write("== %s\n" % " ".join(cmd))
            log.flush()
            p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            killer = threading.Timer(a.timeout, p.kill)  # a hung framework must not eat the lease
            killer.start()
            for line in p.stdout:
                sys.stdout.write(line)
                log.write(line)
            p.wait()
            killer.cancel()
            code = p.returncode if p.returncode >= 0 else "killed (timeout %d s)" % a.timeout
            msg = "== %s adapter: exit %s, %.1f s" % (ad, code, time.time() - t1)
            print(msg, flush=True)
            log.write(msg + "\n")
            if code != 0:
                rc = 1
    n = len(os.listdir(cand))
    print("gpu_report: %d candidate files in %s, %.1f s" % (n, cand, time.time() - t0))
    if a.pack:
        size, parts = pack(cand, a.out, a.part_mib)
        print("gpu_report: packed %.1f MiB into %s" % (size / 2**20,
                                                      " ".join(os.path.basename(p) for p in parts)))
        import shutil
        shutil.rmtree(cand)
    return rc


if __name__ == "__main__":
    sys.exit(main())
