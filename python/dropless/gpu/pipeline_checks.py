#!/usr/bin/env python3
"""Pipeline checks of a MoE layer beside the numerics: host syncs, CUDA graph
capture with replays on new routing, determinism; for JAX, compilations
across routings. One JSON file per backend.

    python3 -m dropless.gpu.pipeline_checks torch-moe|reference-moe --out F.json [--cand DIR] GOLDEN...
    python3 -m dropless.gpu.pipeline_checks jax-moe --out F.json GOLDEN...

Per golden file (torch backends):
  host_syncs     the layer's forward + backward under
                 torch.cuda.set_sync_debug_mode("warn"): how many
                 synchronising calls, and where (file:line, the source line,
                 its kind: .item(), .cpu(), nonzero, bincount, grouped_mm's
                 fallback, a size read); then once under "error": the first
                 one raised, or none. Inputs are on the device before and
                 results are read after: only the layer is counted.
  deterministic  two runs on the same inputs, the stages whose bits differ.
Per set of golden files with the same shapes and configuration (different
seeds and input kinds: other routing, empty experts, one expert taking most
tokens):
  graph          forward + backward captured in one torch.cuda.CUDAGraph on
                 the first file's inputs, then for every file of the set its
                 inputs copied into the captured buffers, one replay, and the
                 stages written as a candidate (backend NAME[graph], mode
                 replay) for `dropless check` against that file's golden;
                 whether each replay equals an eager run bit for bit. Or why
                 it cannot be captured (the exception and where).
jax-moe: the chained layer of python/dropless/gpu/adapters/jax_adapter.py under jit, called
on every file of a set: compilations (traces of the layer, and the jitted
function's cache size) across routings; and twice on the set's first file:
the stages whose bits differ.

Every GPU-only step fails soft: its exception lands in the JSON and the
other steps still run. Without CUDA (--device cpu: the tests) host syncs and
graph capture are "skipped: no CUDA device", and the replays run eagerly on
the same captured-buffer code path (so their candidates are still checked).
"""

import argparse
import json
import os
import sys
import time
import traceback
import warnings


# places in tracebacks are shown relative to the checkout (python/dropless/gpu/x.py: 4 up)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SHAPE_KEYS = ("dtype", "tokens", "hidden", "ffn", "experts", "top_k", "score_function", "n_group",
              "topk_group", "group_score", "renormalize", "scaling", "has_bias", "ffn_kind")


def err(e):
    return {"error": "%s: %s" % (type(e).__name__, str(e)[:800]),
            "where": where(traceback.extract_tb(e.__traceback__)),
            "traceback": traceback.format_exc()[-3000:]}


def where(frames):
    """The innermost frame outside torch/triton/the standard library."""
    for fr in reversed(list(frames)):
        p = fr.filename
        if "site-packages" in p or "/lib/python" in p or "<frozen" in p or p == __file__:
            continue
        return "%s:%d %s: %s" % (os.path.relpath(p, ROOT) if p.startswith(ROOT) else p,
                                 fr.lineno, fr.name, (fr.line or "").strip())
    return "?"


def kind_of(line):
    for pat, kind in ((".item(", ".item()"), (".cpu(", ".cpu()"), (".tolist(", ".tolist()"),
                      ("nonzero", "nonzero"), ("bincount", "bincount (max().item() for its size)"),
                      ("gm(", "grouped_mm fallback (offs.cpu())"),
                      ("offs=", "grouped_mm fallback (offs.cpu())"),
                      ("grouped_mm", "grouped_mm fallback (offs.cpu())"),
                      ("synchronize", "synchronize"), ("int(", "size read")):
        if pat in line:
            return kind
    return "other"


def count_syncs(fn):
    """Runs fn() under sync debug mode "warn": [where, kind] of each
    synchronising call, then fn() under "error": the first one, or None."""
    import torch
    events = []

    def hook(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            w = where(traceback.extract_stack()[:-1])
            events.append({"where": w, "kind": kind_of(w.split(": ", 1)[-1])})
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    first = None
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except Exception as e:
        first = "%s: %s at %s" % (type(e).__name__, str(e).splitlines()[0][:200],
                                  where(traceback.extract_tb(e.__traceback__)))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    by = {}
    for ev in events:
        key = (ev["where"], ev["kind"])
        by[key] = by.get(key, 0) + 1
    return {"count": len(events), "where": [{"where": w, "kind": k, "times": n}
                                           for (w, k), n in by.items()],
            "error_mode": first or "no error raised"}


def shape_sets(goldens, open_golden):
    """[[path, ...], ...]: files with equal shapes and configuration (all
    but seed and input kind), each set in the order given."""
    sets = {}
    for p in goldens:
        try:
            with open_golden(p) as g:
                key = tuple(g.config[k] for k in SHAPE_KEYS)
        except Exception:  # unreadable: per_case reports it
            continue
        sets.setdefault(key, []).append(p)
    return list(sets.values())


# ------------------------------------------------------------------ torch

class TorchBackend:
    """What the checks need of a torch layer: prepare(g) -> state with the
    device tensors; run(state) -> {stage: tensor} (forward + backward);
    load(state, g) copies g's inputs into state's tensors in place."""

    def __init__(self, name, dev):
        self.name, self.dev = name, dev

    # reference-moe
    def _prep_ref(self, g):
        from .reference_layer import run
        layer, x, d_out = run.make_layer(g, self.dev)
        layer.taps = {}
        return {"layer": layer, "x": x, "d_out": d_out}

    def _run_ref(self, st):
        from .reference_layer import run
        run.step(st["layer"], st["x"], st["d_out"])
        return run.stage_tensors(st["layer"], st["x"])

    def _load_ref(self, st, g):
        import torch
        from .reference_layer import run
        x, d_out, p = run.golden_tensors(g, self.dev)
        with torch.no_grad():
            st["x"].copy_(x)
            st["d_out"].copy_(d_out)
        st["layer"].load(p["w_r"], p["bias"], p["w_down"], p.get("w_gate"), p.get("w_up"))

    # torch-moe (python/dropless/gpu/adapters/torch_adapter.typical_layer)
    def _prep_typ(self, g):
        from .adapters import torch_adapter as ta
        import torch
        dev, dt, A = ta._common_setup(g, str(self.dev))
        inp = {"x": A("x"), "wr": A("router_weight", torch.float32), "wd": A("w_down"),
               "d_out": A("d_out"),
               "bias": A("expert_bias", torch.float32) if g.config["has_bias"] else None}
        if g.config["ffn_kind"] == "swiglu":
            inp["wg"], inp["wu"] = A("w_gate"), A("w_up")
        for n in ("x", "wr", "wd", "wg", "wu"):
            if n in inp:
                inp[n].requires_grad_()
        gm = ta.GMM(dt, g.dims["d"], g.dims["f"], dev)
        return {"inp": inp, "gm": gm, "dt": dt, "cfg": g.config, "dims": g.dims}

    def _run_typ(self, st):
        from .adapters import torch_adapter as ta
        inp, dm = st["inp"], st["dims"]
        for n in ("x", "wr", "wd", "wg", "wu"):
            if n in inp:
                inp[n].grad = None
        v = ta.typical_layer(inp, st["cfg"], dm["T"], dm["d"], dm["k"], dm["E"], st["gm"],
                             st["dt"], self.dev)
        r = {"out": v["out"], "d_x": inp["x"].grad, "d_w_down": inp["wd"].grad,
             "d_router_weight": inp["wr"].grad, "y_sorted": v["y"], "topk_ids": v["ids"]}
        if "wg" in inp:
            r.update(d_w_gate=inp["wg"].grad, d_w_up=inp["wu"].grad)
        return r

    def prepare(self, g):
        return self._prep_ref(g) if self.name == "reference-moe" else self._prep_typ(g)

    def run(self, st):
        return self._run_ref(st) if self.name == "reference-moe" else self._run_typ(st)

    def load(self, st, g):
        if self.name != "reference-moe":
            raise NotImplementedError("graph replay of %s" % self.name)
        self._load_ref(st, g)


def bits(stages):
    from .reference_layer.run import to_np
    return {n: to_np(n, t).tobytes() for n, t in stages.items() if t is not None}


def per_case(be, g, cuda):
    r = {"case": g.case}
    try:
        st = be.prepare(g)
        first = bits(be.run(st))
        again = bits(be.run(st))
        r["deterministic"] = {"identical": first == again,
                              "differs": sorted(n for n in first if first[n] != again.get(n))}
    except Exception as e:
        r["deterministic"] = err(e)
        return r
    if cuda:
        try:
            r["host_syncs"] = count_syncs(lambda: be.run(st))
        except Exception as e:
            r["host_syncs"] = err(e)
    else:
        r["host_syncs"] = "skipped: no CUDA device"
    return r


def graph_set(be, paths, open_golden, cand, cuda):
    """Capture on paths[0], replay on every path; candidates into cand."""
    import torch
    from .reference_layer import run
    out = {"capture_on": os.path.basename(paths[0]), "replays": []}
    with open_golden(paths[0]) as g0:
        st = be.prepare(g0)
    if cuda:
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    be.run(st)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static = be.run(st)
            out["captured"] = True
        except Exception as e:
            out["captured"] = False
            out["reason"] = err(e)
            if e.__context__ is not None:
                out["reason"]["context"] = "%s: %s" % (type(e.__context__).__name__,
                                                       str(e.__context__)[:400])
            torch.cuda.synchronize()
            return out
        replay = graph.replay
    else:
        out["captured"] = False
        out["reason"] = "skipped: no CUDA device (replays run eagerly on the same buffers)"
        static = {}

        def replay():
            static.clear()
            static.update(be.run(st))
    for p in paths:
        rec = {"case": os.path.basename(p)}
        try:
            with open_golden(p) as g:
                be.load(st, g)
                t0 = time.time()
                replay()
                if cuda:
                    torch.cuda.synchronize()
                secs = time.time() - t0
                outputs = {n: run.to_np(n, t) for n, t in static.items() if t is not None}
                rec["group_sizes"] = outputs["group_sizes"].tolist() if "group_sizes" in outputs else None
                fresh = be.prepare(g)
                eager = bits(be.run(fresh))
                rec["equals_eager"] = all(outputs[n].tobytes() == eager.get(n) for n in outputs)
                notes = {"graph": "replay %d of a CUDA graph captured on %s" % (
                    len(out["replays"]), out["capture_on"]) if cuda else "eager (no CUDA)",
                    "equals_eager": rec["equals_eager"]}
                path, summ = run.write(g, cand, be.name + "[graph]", outputs, notes, "replay",
                                       be.dev, secs, log=lambda s: None)
                rec["candidate"] = os.path.basename(path)
        except Exception as e:
            rec.update(err(e))
        out["replays"].append(rec)
    return out


def torch_checks(name, goldens, cand, device):
    import torch
    from .reference_layer import run
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    be = TorchBackend(name, dev)
    res = {"backend": name, "torch": torch.__version__, "device": run.device_name(dev),
           "cases": [], "graph": []}
    for p in goldens:
        try:
            with run.open_golden(p) as g:
                res["cases"].append(per_case(be, g, cuda))
        except Exception as e:  # an unreadable file must not stop the others
            res["cases"].append(dict(err(e), case=os.path.basename(p), deterministic={}))
    os.makedirs(cand, exist_ok=True)
    for ps in shape_sets(goldens, run.open_golden):
        if len(ps) < 2:
            continue
        if name != "reference-moe" and not cuda:
            continue
        try:
            if name == "reference-moe":
                res["graph"].append(graph_set(be, ps, run.open_golden, cand, cuda))
            elif not res["graph"]:  # whether it captures, once: a failed capture
                res["graph"].append(graph_set(be, ps[:1], run.open_golden, cand, cuda))
        except Exception as e:
            res["graph"].append(dict(err(e), capture_on=os.path.basename(ps[0])))
    res["summary"] = summarise(res)
    return res


def summarise(res):
    cs = res["cases"]
    syncs = [c["host_syncs"]["count"] for c in cs if isinstance(c.get("host_syncs"), dict)
             and "count" in c["host_syncs"]]
    det = [c["deterministic"].get("identical") for c in cs if "identical" in c["deterministic"]]
    reps = [r for gs in res["graph"] for r in gs.get("replays", [])]
    return {"cases": len(cs), "host_syncs_max": max(syncs) if syncs else None,
            "host_syncs_total": sum(syncs) if syncs else None,
            "deterministic_all": all(det) if det else None,
            "nondeterministic_cases": [c["case"] for c in cs
                                       if c["deterministic"].get("identical") is False],
            "graph_sets": len(res["graph"]),
            "graph_captured": [gs.get("captured") for gs in res["graph"]],
            "replays": len(reps), "replays_equal_eager": sum(1 for r in reps if r.get("equals_eager"))}


# -------------------------------------------------------------------- jax

def jax_checks(goldens, device):
    from .adapters import jax_adapter as ja
    from .reference_layer import golden_io as run
    res = {"backend": "jax-moe", "sets": []}
    if ja.jax is None:
        res["skipped"] = "JAX is not installed"
        return res
    res["jax"] = ja.jax.__version__
    dev = ja._device(device)
    res["device"] = ja.device_name(dev)
    sets = shape_sets(goldens, run.open_golden)
    many = [ps for ps in sets if len(ps) > 1]  # routing varies within a set
    for ps in many or sets[:1]:
        for prec in ja.PRECISIONS:
            rec = {"files": [os.path.basename(p) for p in ps], "precision": prec}
            try:
                import numpy as np
                t0 = ja.TRACES.get("n", 0)
                for i, p in enumerate(ps):
                    with run.open_golden(p) as g:
                        first, _ = ja.chained(g, dev, prec)
                        if i == 0:  # determinism: the same inputs once more
                            again, _ = ja.chained(g, dev, prec)
                            rec["differs"] = sorted(
                                n for n in first if np.asarray(first[n]).tobytes()
                                != np.asarray(again[n]).tobytes())
                fn = ja.chained_fn.cache_info() if hasattr(ja.chained_fn, "cache_info") else None
                rec["traces"] = ja.TRACES.get("n", 0) - t0
                rec["calls"] = len(ps)
                rec["jit_cache_size"] = ja.last_cache_size()
                rec["factory_cache"] = str(fn)
            except Exception as e:
                rec.update(err(e))
            res["sets"].append(rec)
    tr = [s.get("traces") for s in res["sets"] if "traces" in s]
    res["summary"] = {"sets": len(res["sets"]), "compiles_per_set_max": max(tr) if tr else None,
                      "recompiles_on_new_routing": any(t > 1 for t in tr) if tr else None,
                      "nondeterministic_stages": sorted({n for s in res["sets"]
                                                         for n in s.get("differs", [])})}
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("backend", choices=("torch-moe", "reference-moe", "jax-moe"))
    ap.add_argument("golden", nargs="+")
    ap.add_argument("--out", required=True, help="the JSON file")
    ap.add_argument("--cand", default=None, help="where replay candidates go (default: beside --out)")
    ap.add_argument("--device", default=None)
    a = ap.parse_args(argv)
    cand = a.cand or os.path.join(os.path.dirname(os.path.abspath(a.out)), "candidates")
    t0 = time.time()
    try:
        if a.backend == "jax-moe":
            res = jax_checks(a.golden, a.device)
        else:
            res = torch_checks(a.backend, a.golden, cand, a.device)
    except Exception as e:
        res = dict(err(e), backend=a.backend)
    res["seconds"] = round(time.time() - t0, 1)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(res, fh, indent=1, default=str)
    os.replace(tmp, a.out)
    print(json.dumps(res.get("summary", res.get("error")), default=str))
    return 0 if "error" not in res else 1


if __name__ == "__main__":
    sys.exit(main())
