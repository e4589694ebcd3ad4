"""The reference layer on golden files: candidate files for `dropless check`.

    python3 -m dropless.gpu.reference_layer GOLDEN.h5... -o DIR [--device cuda] [--summary F]

Per golden file, two candidates (backend names):
  reference-moe             chained: every stage (27) of one forward + backward
  reference-moe[fused_out]  only what a fused layer hands over: out, d_x and
                            the weight gradients (d_w_gate, d_w_up, d_w_down,
                            d_router_weight); the runner propagates the
                            bounds of the absent stages
Each runs twice on the same inputs; notes["repeat_differs"] lists the stages
whose bits changed (none for a deterministic layer).

Declared profiles: `bf16` / `fp16` for bf16 / fp16 cases (bf16 operands,
fp32 accumulation, every short sum in fp32 and rounded once: the strict
profile, not -acc), `fp32` for fp32 cases.

Golden files are read and candidates written through the package `dropless`
(the C library) where it loads, else with h5py alone (python/dropless/gpu/adapters/h5io.py,
common.emit), as the adapters do.
"""

import os
import sys
import time
import traceback

import numpy as np
import torch

from .golden_io import open_golden  # noqa: F401 (re-exported)
from .layer import ReferenceMoE

TDT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BACKEND = "reference-moe"
FUSED = "reference-moe[fused_out]"
from ..adapters.common import FUSED_STAGES, append_summary  # noqa: E402 (one list for every backend)
INT32 = ("topk_ids", "sort_perm", "inv_perm")
INT64 = ("group_sizes", "group_offsets")


def to_np(name, t):
    t = t.detach()
    if t.is_floating_point():
        return t.to(torch.float32).cpu().numpy()
    return t.cpu().numpy().astype(np.int32 if name in INT32 else np.int64)


def golden_tensors(g, dev):
    """The golden's inputs as device tensors: (x, d_out, params dict)."""
    dt = TDT[g.config["dtype"]]
    A = lambda n, d=dt: torch.from_numpy(np.ascontiguousarray(g.array(n))).to(dev).to(d)
    p = {"w_r": A("router_weight", torch.float32), "w_down": A("w_down"),
         "bias": A("expert_bias", torch.float32) if g.config["has_bias"] else None}
    if g.config["ffn_kind"] == "swiglu":
        p["w_gate"], p["w_up"] = A("w_gate"), A("w_up")
    return A("x"), A("d_out"), p


def make_layer(g, dev, gemm="auto", defect=None):
    """(layer, x leaf, d_out) for golden g on device dev."""
    x, d_out, p = golden_tensors(g, dev)
    layer = ReferenceMoE(g.config, p["w_r"], p["bias"], p["w_down"], p.get("w_gate"),
                         p.get("w_up"), gemm=gemm, defect=defect)
    return layer, x.requires_grad_(), d_out


def step(layer, x, d_out):
    """One forward + backward from zeroed gradients (what a graph captures)."""
    layer.zero_grad()
    x.grad = None
    out = layer(x)
    out.backward(d_out)
    return out


def stage_tensors(layer, x):
    """Every stage of the last step, as tensors (golden names)."""
    r = dict(layer.taps)
    r.update(layer.weight_grads())
    r["d_router_weight"] = layer.w_r.grad
    r["d_x"] = x.grad
    if not layer.swiglu:
        for n in ("h_gate", "h_up", "h_act", "d_h_act", "d_h_gate", "d_h_up", "d_w_gate", "d_w_up"):
            r.pop(n, None)
    return r


def run_layer(g, dev, gemm="auto", defect=None):
    """One forward + backward on golden g: ({stage: numpy}, layer)."""
    layer, x, d_out = make_layer(g, dev, gemm, defect)
    layer.taps = {}
    step(layer, x, d_out)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return {n: to_np(n, t) for n, t in stage_tensors(layer, x).items()}, layer


def profile(dtype):
    return dtype  # bf16 / fp16 / fp32: the strict profiles


def notes_of(layer, g, seconds):
    dt = g.config["dtype"]
    return {"kernel": layer.gemm.describe(),
            "router": "x.float() @ W_r, %s, topk on an exact (score, lower index) key"
            % g.config["score_function"],
            "dispatch": "scatter_add histogram, cumsum offsets, counting sort (cumsum of one-hot)",
            "combine": "index_select by inv_perm, fixed-order slot sum in fp32, one rounding to %s" % dt,
            "activation": "silu(h_gate) * h_up in fp32, one rounding to %s" % dt,
            "weight_grads": "fp32 main_grad (%s)" % layer.gemm.wgrad_impl,
            "torch": torch.__version__, "seconds": round(seconds, 3)}


def device_name(dev):
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform
    return "cpu (%s)" % (platform.processor() or platform.machine())


def write(g, outdir, backend, outputs, notes, mode, dev, seconds, log=print):
    """A candidate file (python/dropless/gpu/adapters/common.emit: through the package, or
    h5py where its library does not load). Returns (path, summary)."""
    from dropless.gpu.adapters import common
    res = common.Result(backend, outputs, notes, profile(g.config["dtype"]))
    return common.emit(g, outdir, res, mode, "torch %s" % torch.__version__, device_name(dev),
                       seconds, log)


def run_file(path, outdir, dev, gemm="auto", repeat=True, log=print, defect=None):
    """Both candidates of one golden file: ([(path, summary)], [errors])."""
    written, errors = [], []
    with open_golden(path) as g:
        try:
            t0 = time.time()
            outputs, layer = run_layer(g, dev, gemm, defect)
            seconds = time.time() - t0
            notes = notes_of(layer, g, seconds)
            if repeat:
                again, _ = run_layer(g, dev, gemm, defect)
                notes["repeat_differs"] = sorted(n for n in outputs
                                                 if outputs[n].tobytes() != again[n].tobytes())
            name = BACKEND + ("[%s]" % defect if defect else "")
            written.append(write(g, outdir, name, outputs, notes, "chained", dev, seconds, log))
            fused = {n: outputs[n] for n in FUSED_STAGES if n in outputs}
            fname = FUSED + ("[%s]" % defect if defect else "")
            written.append(write(g, outdir, fname, fused, dict(notes), "fused", dev, seconds, log))
        except Exception as e:  # one failing case must not stop the others
            log("%-26s %-30s ERROR %s: %s" % (g.case, BACKEND, type(e).__name__, e))
            errors.append({"case": g.case, "backend": BACKEND, "error": "%s: %s" % (type(e).__name__, e),
                           "traceback": traceback.format_exc()})
    return written, errors


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("golden", nargs="+")
    ap.add_argument("-o", "--outdir", default=".")
    ap.add_argument("--device", default=None)
    ap.add_argument("--gemm", choices=("auto", "torch", "triton", "dense"), default="auto")
    ap.add_argument("--summary")
    ap.add_argument("--no-repeat", action="store_true")
    ap.add_argument("--defect", choices=("drop_slot",), help="a defective variant (tests)")
    a = ap.parse_args(argv)
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    os.makedirs(a.outdir, exist_ok=True)
    rc = 0
    for p in a.golden:
        try:
            written, errors = run_file(p, a.outdir, dev, a.gemm, not a.no_repeat, defect=a.defect)
        except Exception as e:  # an unreadable file must not stop the others
            print("%s: %s: %s" % (p, type(e).__name__, e), file=sys.stderr)
            written, errors = [], [{"case": os.path.basename(p), "backend": BACKEND,
                                    "error": "%s: %s" % (type(e).__name__, e)}]
        rc = 1 if errors else rc
        append_summary(a.summary, written, errors)
    return rc


if __name__ == "__main__":
    sys.exit(main())
