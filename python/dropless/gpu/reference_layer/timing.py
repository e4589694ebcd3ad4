"""Forward + backward time of the reference layer against the typical PyTorch
MoE layer of the adapters (python/dropless/gpu/adapters/torch_adapter.typical_layer), in
one run, on random inputs drawn on the device (no golden file), bf16.

    python3 -m dropless.gpu.reference_layer.timing --out timing.json [--quick] [--iters 20]

Shapes: Mixtral-8x7B (d 4096, f 14336, E 8, top-2, softmax) and DeepSeek-V3
(d 7168, f 2048, E 256, top-8, sigmoid + bias, 8 groups keep 4 by top2_sum,
scaling 2.5), T = 4096 tokens; --quick (and any run without CUDA): small
shapes (a smoke test of the code path, not a measurement). Per layer: the median (and every
figure) of --iters timed steps after --warmup untimed ones, by CUDA events
around each step (wall clock on the CPU); the reference layer both eagerly
and as a replay of one captured CUDA graph. A failure (out of memory, a
kernel that does not compile) is recorded and the rest still runs.
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch

SHAPES = {
    "mixtral": dict(T=4096, d=4096, f=14336, E=8, k=2, score_function="softmax", n_group=1,
                    topk_group=1, group_score="max", renormalize=1, scaling=1.0, has_bias=0),
    "deepseek-v3": dict(T=4096, d=7168, f=2048, E=256, k=8, score_function="sigmoid", n_group=8,
                        topk_group=4, group_score="top2_sum", renormalize=1, scaling=2.5,
                        has_bias=1),
}
QUICK = {
    "mixtral": dict(SHAPES["mixtral"], T=64, d=64, f=128),
    "deepseek-v3": dict(SHAPES["deepseek-v3"], T=64, d=64, f=32, E=32),
}


def cfg_of(s):
    c = {k: s[k] for k in ("score_function", "n_group", "topk_group", "group_score", "renormalize",
                           "scaling", "has_bias")}
    c.update(experts=s["E"], top_k=s["k"], ffn_kind="swiglu", dtype="bf16", tokens=s["T"],
             hidden=s["d"], ffn=s["f"])
    return c


def inputs(s, dev, dt, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    T, d, f, E = s["T"], s["d"], s["f"], s["E"]
    r = lambda *shape, scale=1.0, dtype=dt: (torch.randn(*shape, generator=g, device=dev) * scale).to(dtype)
    return {"x": r(T, d), "wr": r(d, E, scale=d ** -0.5, dtype=torch.float32),
            "bias": r(E, scale=0.0625, dtype=torch.float32) if s["has_bias"] else None,
            "wg": r(E, d, f, scale=d ** -0.5), "wu": r(E, d, f, scale=d ** -0.5),
            "wd": r(E, f, d, scale=f ** -0.5), "d_out": r(T, d)}


def timer(dev, fn, iters, warmup):
    """Per-step times in ms of fn() (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    out = []
    if dev.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def fig(times):
    return {"median_ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4),
            "max_ms": round(max(times), 4), "n": len(times), "ms": [round(t, 4) for t in times]}


def soft(res, key, fn):
    try:
        res[key] = fn()
    except Exception as e:  # OOM, a compile failure: recorded, the rest runs
        res[key] = {"error": "%s: %s" % (type(e).__name__, str(e)[:600]),
                    "traceback": traceback.format_exc()[-2000:]}
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def time_shape(name, s, dev, iters, warmup):
    from dropless.gpu.adapters import torch_adapter as ta
    from dropless.gpu.reference_layer.layer import ReferenceMoE
    dt = torch.bfloat16
    cfg = cfg_of(s)
    res = {"shape": {k: s[k] for k in "TdfEk"}, "config": cfg}
    inp = inputs(s, dev, dt)
    for n in ("x", "wr", "wg", "wu", "wd"):
        inp[n].requires_grad_()
    gm = ta.GMM(dt, s["d"], s["f"], dev)
    res["typical_kernel"] = gm.kernel

    def typ():
        for n in ("x", "wr", "wg", "wu", "wd"):
            inp[n].grad = None
        ta.typical_layer(inp, cfg, s["T"], s["d"], s["k"], s["E"], gm, dt, dev)
    soft(res, "typical", lambda: fig(timer(dev, typ, iters, warmup)))
    for n in ("x", "wr", "wg", "wu", "wd"):
        inp[n].grad = None
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    st = {}

    def build():
        st["layer"] = ReferenceMoE(cfg, inp["wr"].detach(), inp["bias"], inp["wd"].detach(),
                                   inp["wg"].detach(), inp["wu"].detach())
        for n in ("wg", "wu", "wd"):  # the layer holds its own copies
            inp[n] = None
        st["x"] = inp["x"].detach().clone().requires_grad_()
        return st["layer"].gemm.describe()
    soft(res, "reference_kernel", build)
    if "layer" not in st:
        return res
    from dropless.gpu.reference_layer.run import step
    ref = lambda: step(st["layer"], st["x"], inp["d_out"])
    soft(res, "reference_eager", lambda: fig(timer(dev, ref, iters, warmup)))
    if dev.type == "cuda":
        def graphed():
            s_ = torch.cuda.Stream()
            s_.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s_):
                for _ in range(2):
                    ref()
            torch.cuda.current_stream().wait_stream(s_)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                ref()
            return fig(timer(dev, graph.replay, iters, warmup))
        soft(res, "reference_graph", graphed)
        res["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    res["reference_kernel_after"] = st["layer"].gemm.describe()  # a fallback shows here
    t = res.get("typical", {}).get("median_ms")
    for k in ("reference_eager", "reference_graph"):
        m = res.get(k, {}).get("median_ms") if isinstance(res.get(k), dict) else None
        if t and m:
            res["speedup_%s_vs_typical" % k.split("_")[1]] = round(t / m, 3)
    flops = 2 * s["T"] * s["k"] * s["d"] * s["f"] * 3 * 3  # 3 GEMMs forward, 6 backward
    res["expert_gemm_tflop"] = round(flops / 1e12, 3)
    return res


def write_json(path, obj):
    """obj as JSON into path, through a temporary name."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1, default=str)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="small shapes (CPU smoke test)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    a = ap.parse_args(argv)
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type != "cuda":  # T = 4096 layers on a CPU would take hours and say nothing
        a.quick = True
    iters = a.iters or (3 if a.quick else 20)
    warmup = a.warmup or (1 if a.quick else 3)
    table = QUICK if a.quick else SHAPES
    res = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "torch": torch.__version__, "iters": iters, "warmup": warmup, "quick": a.quick,
           "dtype": "bf16", "shapes": {}}
    for name in a.shapes.split(","):
        t0 = time.time()
        r = {}
        soft(r, "r", lambda: time_shape(name, table[name], dev, iters, warmup))
        res["shapes"][name] = dict(r["r"], seconds=round(time.time() - t0, 1))
        print(name, json.dumps({k: v for k, v in res["shapes"][name].items()
                                if k.startswith("speedup") or k in ("seconds",)}), flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    write_json(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
