"""What the GPU adapters share: golden files read and candidate files
written through the package `dropless` (python/: the C library's loader,
writer and layout; the adapters keep no table of their own; h5io stands in
where the library cannot load, e.g. on a GPU machine), the one
backend signature, the fp32 probe, the compute profile, the stage-isolated
groups, and the command line.

A backend is a function  backend(golden, device) -> Result : it runs one
framework's kernels on a dropless.Golden and returns the stage values it
computed (framework arrays as they are: the package copies torch, JAX or
CuPy arrays to the host exactly), keyed by stage name. Raising Skip says
the backend does not apply to this case.
"""

import collections
import json
import os
import time
import traceback

import numpy as np

import dropless

from . import h5io

ADAPTERS_VERSION = "0.2.0"

Result = collections.namedtuple("Result", "name outputs notes compute_mode")
Result.__doc__ = """name: the backend's name in reports; outputs: {stage: array};
notes: free-form facts (kernel, flags, probe) for the summary; compute_mode:
the profile the backend declares (profile_for)."""


class Skip(Exception):
    """A backend that does not apply to this case (not an error)."""


class Unsupported(ValueError):
    """A case whose layer the adapters' backends cannot express: refused by
    name before any backend runs, so no candidate of another layer is written."""


# the routing the backends implement: softmax or sigmoid over all E logits,
# no bias on the logits (torch_adapter.py, jax_adapter.py)
EXPRESSED_SCORES = ("softmax", "sigmoid")


def unsupported(cfg):
    """The name of the first variant of case config cfg that the backends do
    not express (None when they express the whole layer): their layers
    route by softmax or sigmoid over the plain router GEMM into SwiGLU or
    plain FFN experts without biases, so sqrtsoftplus, softmax_topk, a
    router-logit bias, Llama-4's weight on the expert input, hash routing, gpt-oss's clamped SwiGLU, GeGLU-tanh, relu2 and the
    expert biases are refused by name rather than computed as another layer."""
    if cfg.get("score_function", "softmax") not in EXPRESSED_SCORES:
        return "score_function = %s" % cfg.get("score_function")
    if int(cfg.get("router_bias", 0) or cfg.get("has_router_bias", 0) or 0):  # library, h5py
        return "router_bias = 1 (a bias on the router logits)"
    if int(cfg.get("hash_vocab", 0) or 0):
        return "hash_vocab = %s (hash routing: the experts from a token-id table)" % cfg["hash_vocab"]
    if int(cfg.get("weight_on_input", 0) or 0):
        return "weight_on_input = 1 (Llama-4: the score scales the expert's input)"
    if int(cfg.get("zero_experts", 0) or 0):
        return "zero_experts = %s (LongCat-Flash's identity experts)" % cfg["zero_experts"]
    kind = cfg.get("ffn_kind", "swiglu")
    if kind not in ("swiglu", "plain"):
        return "ffn_kind = %s (their FFN is swiglu or plain)" % kind
    if str(cfg.get("ffn_bias", 0)) == "1":
        return "ffn_bias = 1 (the expert projections' biases)"
    return None


def refuse_unsupported(g, where):
    """Raises Unsupported naming the variant of golden g the backends lack."""
    why = unsupported(g.config)
    if why:
        raise Unsupported("%s: %s: %s is not expressed by the GPU adapters (softmax or "
                          "sigmoid routing over the plain router GEMM, SwiGLU or plain "
                          "experts without biases)" % (where, g.case, why))


def group_terms(cfg):
    """The keys a group score adds up, the rule of dl_route_group_terms (1
    for max, 2 for top2_sum, top_k / topk_group for topk_sum; at least 1, at
    most the group size E / n_group): the frameworks' selections use it."""
    if cfg["n_group"] <= 1:
        return 1
    nb = {"max": 1, "top2_sum": 2}.get(cfg["group_score"], cfg["top_k"] // cfg["topk_group"])
    return min(max(nb, 1), cfg["experts"] // cfg["n_group"])


# ------------------------------------------------------------- fp32 probe

# What an fp32 GEMM really computes: its result on full-precision fp32
# operands is compared with float64 products of the operands rounded to
# each of these grids (significand bits; np.rint = nearest-even, np.trunc =
# toward zero, as tensor cores read fp32 registers holding unconverted
# fp32 values as tf32).
PROBE_GRIDS = (("fp32", 24, np.rint), ("tf32", 11, np.rint), ("tf32-rz", 11, np.trunc),
               ("bf16", 8, np.rint))


def _keep_bits(x, bits, f):
    m, e = np.frexp(x.astype(np.float64))
    return np.ldexp(f(np.ldexp(m, bits)), e - bits)


def probe_fp32(grouped_gemm):
    """Which arithmetic a framework's fp32 grouped GEMM uses:
    grouped_gemm(a [256,256] f32, b [2,256,128] f32, sizes [128,128]) must
    return the [256,128] result as a numpy array. Returns {'mode': profile
    (fp32, tf32, bf16 or unknown), 'closest': grid, 'rel_err_vs': {grid:
    relative error}}: fp32 only when fp32 is closest and the error is at
    fp32 level."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((2, 256, 128)).astype(np.float32)
    c = np.asarray(grouped_gemm(a, b, [128, 128]), dtype=np.float64)
    rel = {}
    for name, bits, f in PROBE_GRIDS:
        A, B = _keep_bits(a, bits, f), _keep_bits(b, bits, f)
        ref = np.concatenate([A[:128] @ B[0], A[128:] @ B[1]], 0)
        rel[name] = float(np.abs(c - ref).max() / np.abs(ref).max())
    closest = min(rel, key=rel.get)
    mode = {"tf32-rz": "tf32"}.get(closest, closest)
    if mode == "fp32" and rel["fp32"] > 1e-5:
        mode = "unknown"
    return {"mode": mode, "closest": closest, "rel_err_vs": rel}


def profile_for(dtype, probe=None, elementwise=False):
    """The profile a framework pipeline runs in: bf16/fp16 operands with fp32
    accumulation, and autograd / scatter-adds summing stored bf16/fp16 parts
    (hence -acc); -elem where, besides, its elementwise ops round their
    intermediates to the storage type (JAX: jax.nn.silu(g) * u in bf16 is
    three bf16 roundings, its VJP more; PyTorch's F.silu computes in fp32
    and rounds once); for fp32, what the probe saw (fp32 without one)."""
    if dtype in ("bf16", "fp16"):
        return dtype + ("-elem" if elementwise else "-acc")
    mode = (probe or {}).get("mode", "fp32")
    return mode if mode in ("fp32", "tf32", "bf16") else "fp32"


# --------------------------------------------------------- isolated groups

# Stage-isolated results: each group below was computed by one kernel call
# fed golden inputs, so the runner checks it on golden upstream (the
# candidate's isolated_groups, doc/conformance.md). No group holds a stage
# upstream of another of its stages.
ISOLATED_PARTS = (
    ("gate_up", ("h_gate", "h_up")),
    ("act", ("h_act",)),
    ("down", ("y_sorted",)),
    ("down_bwd", ("d_h_act", "d_w_down")),
    ("act_bwd", ("d_h_gate", "d_h_up")),
    ("gate_up_bwd", ("d_x_sorted", "d_w_gate", "d_w_up")),
)
ISOLATED_PARTS_PLAIN = (  # plain FFN: y = x_sorted W_down alone
    ("down", ("y_sorted",)),
    ("down_bwd", ("d_x_sorted", "d_w_down")),
)


def isolated_groups(g, outputs):
    """[[stage, ...], ...]: the calls that computed outputs, every stage in
    exactly one group (KeyError for a stage outside every part)."""
    parts = ISOLATED_PARTS if g.config["ffn_kind"] == "swiglu" else ISOLATED_PARTS_PLAIN
    groups = [[s for s in names if s in outputs] for _, names in parts]
    groups = [grp for grp in groups if grp]
    left = sorted(set(outputs) - {s for grp in groups for s in grp})
    if left:
        raise KeyError("stage-isolated results outside every part: %s" % left)
    return groups


# ---------------------------------------------------------- fused kernels

# What a fused MoE kernel (vLLM's fused_moe, a fused training layer) hands
# back: the layer's output and the gradients of its inputs and weights, no
# intermediate. The runner bounds each through the absent upstream stages
# (doc/tolerances.md), so these candidates test that propagation on real
# framework arithmetic.
FUSED_STAGES = ("out", "d_x", "d_w_gate", "d_w_up", "d_w_down", "d_router_weight")
CHAINED_MODES = ("chained", "fused")  # no isolated_groups: one pass of the layer


def fused(res):
    """A chained Result cut down to FUSED_STAGES, named BACKEND[fused]."""
    keep = {s: v for s, v in res.outputs.items() if s in FUSED_STAGES}
    notes = dict(res.notes, fused="the chained layer's %s only" % " ".join(keep))
    return res._replace(name=res.name + "[fused]", outputs=keep, notes=notes)


# ------------------------------------------------------------ candidates

def candidate_name(case, backend, mode=None):
    """A file name for a case x backend (x mode), in [A-Za-z0-9._-] only."""
    s = "%s--%s" % (case, backend) + ("--%s" % mode if mode else "")
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in s) + ".h5"


def compare(g, outputs):
    """{stage: largest |candidate - golden| / largest |golden|} of the float
    stages, mismatch counts of the integer ones: a figure for the log line,
    not a verdict (dropless check gives that)."""
    out = {}
    for name, x in outputs.items():
        a, ref = dropless.to_numpy(x), g.array(name)
        if ref.dtype.kind != "f":
            out[name] = int(np.count_nonzero(a != ref))
            continue
        a, r = a.astype(np.float64), ref.astype(np.float64)
        err = float(np.max(np.abs(a - r))) if a.size else 0.0
        scale = float(np.max(np.abs(r))) if a.size else 0.0
        out[name] = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
    return out


def emit(g, outdir, res, mode, version, device, seconds, log=print, groups=None):
    """Writes one backend's Result for golden g as a candidate file in outdir
    (groups: the isolated groups, None for a chained candidate), logs a line
    and returns (path, summary dict)."""
    path = os.path.join(outdir, candidate_name(g.case, res.name, mode))
    h5io.write_candidate(path, res.outputs, g, backend=res.name, compute_mode=res.compute_mode,
                         isolated=groups, backend_version=version, device=device, force=True)
    errs = compare(g, res.outputs)
    worst = max((v for v in errs.values() if isinstance(v, float)), default=0.0)
    nd = res.notes.get("repeat_differs")
    log("%-26s %-30s %-8s %-9s %2d stages, max rel err vs golden %.3g%s"
        % (g.case, res.name, mode, res.compute_mode, len(res.outputs), worst,
           ", repeat differs in " + " ".join(nd) if nd else ""))
    return path, {"case": g.case, "backend": res.name, "mode": mode,
                  "compute_mode": res.compute_mode, "backend_version": version, "device": device,
                  "file": os.path.basename(path), "errors": errs, "seconds": round(seconds, 3),
                  "notes": res.notes,
                  "isolated_groups": ";".join(",".join(grp) for grp in groups) if groups else None}


def run_modes(golden_path, outdir, modes, backends, info, device, log=print, repeat=True):
    """Runs backends[mode](g, device) -> Result for each mode on one golden
    file; a failing mode is reported and the others still run. info(g) ->
    (version, device name). With repeat, each backend runs twice and
    notes["repeat_differs"] lists the stages whose bits changed
    (nondeterminism: atomics, split-K). Every mode but those of
    CHAINED_MODES is stage-isolated. Returns ([(path, summary)], [error dicts])."""
    written, errors = [], []
    g, how = h5io.load(golden_path)
    if how != "dropless.load":
        log("%s: golden read by %s" % (golden_path, how[:160]))
    with g:
        refuse_unsupported(g, golden_path)
        for mode in modes:
            t0 = time.time()
            try:
                res = backends[mode](g, device)
                seconds = time.time() - t0
                if repeat:
                    again = backends[mode](g, device).outputs
                    res.notes["repeat_differs"] = sorted(
                        s for s in res.outputs if s in again and
                        dropless.to_numpy(res.outputs[s]).tobytes() !=
                        dropless.to_numpy(again[s]).tobytes())
                version, dname = info(g)
                groups = None if mode in CHAINED_MODES else isolated_groups(g, res.outputs)
                written.append(emit(g, outdir, res, mode, version, dname, seconds, log, groups))
            except Skip as e:
                log("%-26s %-30s %-8s skipped: %s" % (g.case, "-", mode, e))
            except Exception as e:  # one failing backend must not stop the others
                log("%-26s %-30s %-8s ERROR %s: %s" % (g.case, "-", mode, type(e).__name__, e))
                errors.append({"case": g.case, "mode": mode, "error": "%s: %s" % (type(e).__name__, e),
                               "traceback": traceback.format_exc()})
    return written, errors


def append_summary(path, written, errors):
    """One JSON line per candidate written ((path, summary) pairs) and per
    error, appended to the --summary file path (nothing when None)."""
    if not path:
        return
    with open(path, "a") as fh:
        for _, s in written:
            fh.write(json.dumps(s, default=str) + "\n")
        for e in errors:
            fh.write(json.dumps(e, default=str) + "\n")


def adapter_main(argv, doc, available, run, modes_all):
    """The command line of every adapter."""
    import argparse
    import sys
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
        except Unsupported as e:  # a layer no backend expresses: said, not an error
            print("skipped: %s" % e, file=sys.stderr)
            continue
        except Exception as e:  # one bad file must not stop the others
            traceback.print_exc()
            print("%s: %s: %s" % (p, type(e).__name__, e), file=sys.stderr)
            rc = 1
            continue
        rc = 1 if errors else rc
        append_summary(a.summary, out, errors)
    return rc
