"""Where the reference layer's time goes, against the typical layer and the
H200's physical limits: per-kernel CUDA time of one forward + backward step
of each layer (torch.profiler, averaged over --steps profiled steps after a
warm-up), the reference layer's kernels bucketed by stage (its
record_function ranges), and a sweep of the weight-gradient Triton kernel's
tile configurations on the layer's own shapes.

    python3 -m dropless.gpu.reference_layer.profile --out profile.json [--shapes mixtral,deepseek-v3]

Figures: ms per step; a stage's FLOPs and the bytes it must move at least
(operands read once, results written once), and from them the time the
stage would take at the H200's peaks (ROOF below): the roofline bound is
the larger of FLOPs/peak and bytes/bandwidth.
"""

import argparse
import statistics
import sys
import traceback

import torch

from . import timing

# H200 SXM peaks (NVIDIA's datasheet): dense bf16 tensor-core FLOP/s, FP32
# (CUDA cores) FLOP/s, FP64 FLOP/s, HBM3e bandwidth in bytes/s.
ROOF = {"bf16": 989e12, "fp32": 67e12, "fp64": 34e12, "hbm": 4.8e12}


def stage_model(s):
    """FLOPs and minimum bytes per stage of one step (bf16 operands)."""
    T, d, f, E, k = s["T"], s["d"], s["f"], s["E"], s["k"]
    M, b2, b4 = T * k, 2, 4
    g = {}
    g["router"] = (2 * T * d * E, T * d * b2 + d * E * b4, "fp64")
    g["gate_up"] = (2 * M * d * 2 * f, M * d * b2 + E * d * 2 * f * b2 + M * 2 * f * b2, "bf16")
    g["down"] = (2 * M * f * d, M * f * b2 + E * f * d * b2 + M * d * b2, "bf16")
    g["d_h_act"] = g["down"]
    g["d_x_sorted"] = g["gate_up"]
    # the fp32 weight gradients written once (after zero_grad the kernel
    # stores; accumulating into main_grad would read them once more)
    g["wgrad_down"] = (2 * M * f * d, M * f * b2 + M * d * b2 + E * f * d * b4, "bf16")
    g["wgrad_gate_up"] = (2 * M * d * 2 * f, M * d * b2 + M * 2 * f * b2 + E * d * 2 * f * b4,
                          "bf16")
    out = {}
    for n, (fl, by, kind) in g.items():
        t = max(fl / ROOF[kind], by / ROOF["hbm"])
        out[n] = {"gflop": round(fl / 1e9, 2), "mbytes": round(by / 1e6, 1), "peak": kind,
                  "roofline_ms": round(t * 1e3, 4)}
    return out


def profiled(fn, steps, warmup):
    """{kernel name: ms per step}, {range name: ms per step} of fn()."""
    from torch.profiler import profile, ProfilerActivity
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    kern, ranges = {}, {}
    for ev in prof.key_averages():
        dev_us = getattr(ev, "device_time_total", None)
        if dev_us is None:
            dev_us = getattr(ev, "cuda_time_total", 0)
        if not dev_us:
            continue
        if ev.key.startswith("ref:"):
            ranges[ev.key] = round(dev_us / 1e3 / steps, 4)
        elif getattr(ev, "device_type", None) is not None and "CUDA" in str(ev.device_type):
            kern[ev.key[:120]] = round(dev_us / 1e3 / steps, 4)
    top = dict(sorted(kern.items(), key=lambda kv: -kv[1])[:25])
    return top, ranges, round(sum(kern.values()), 4)


def sweep_wgrad(s, dev, reps=5):
    """ms of _wgrad_kernel per tile configuration, on both weight-gradient
    GEMMs of the shape, uniform random routing."""
    import triton
    from . import gemm as G
    T, d, f, E, k = s["T"], s["d"], s["f"], s["E"], s["k"]
    M = T * k
    gen = torch.Generator(device=dev).manual_seed(1)
    ids = torch.randint(0, E, (M,), generator=gen, device=dev)
    sizes = torch.bincount(ids, minlength=E)
    offs = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), torch.cumsum(sizes, 0)])
    shapes = {"wgrad_down": (f, d), "wgrad_gate_up": (d, 2 * f)}
    configs = [(128, 128, 32, 4, 4, 8), (128, 128, 32, 4, 4, 1), (128, 128, 32, 4, 4, 16),
               (128, 256, 32, 8, 3, 8), (256, 128, 32, 8, 3, 8), (128, 128, 64, 8, 3, 8)]
    res = {}
    for name, (KA, N) in shapes.items():
        a = torch.randn(M, KA, device=dev, generator=gen).to(torch.bfloat16)
        b = torch.randn(M, N, device=dev, generator=gen).to(torch.bfloat16)
        out = torch.zeros(E, KA, N, device=dev, dtype=torch.float32)
        rows = {}
        ref = None
        for (bka, bn, bm, w, stg, grp) in configs:
            key = "BKA%d_BN%d_BM%d_w%d_s%d_g%d" % (bka, bn, bm, w, stg, grp)
            try:
                n_ka, n_n = triton.cdiv(KA, bka), triton.cdiv(N, bn)

                def go():
                    G._wgrad_kernel[(E * n_ka * n_n,)](
                        a, b, out, offs, KA, N, n_ka, n_n, a.stride(0), a.stride(1),
                        b.stride(0), b.stride(1), out.stride(0), out.stride(1), out.stride(2),
                        ACC=False, BM=bm, BKA=bka, BN=bn, PREC="tf32", UPCAST=False,
                        GROUP=grp, num_warps=w, num_stages=stg)
                go()
                torch.cuda.synchronize()
                if ref is None:
                    ref = out.clone()
                    rel = 0.0
                else:
                    rel = float(((out - ref).abs().max() / ref.abs().max()).item())
                rows[key] = {"ms": round(statistics.median(timing.timer(dev, go, reps, 1)), 4),
                             "max_rel_vs_first": rel}
            except Exception as e:
                rows[key] = {"error": "%s: %s" % (type(e).__name__, str(e)[:300])}
        # speed references: the bf16-out ragged-K grouped_mm, and one dense fp32-out GEMM
        # of the same FLOPs (a lower bound a per-expert loop could not beat)
        gm = G.grouped_mm_fn()
        try:
            o32 = offs[1:].to(torch.int32)
            rows["ref_grouped_mm_bf16_out"] = {"ms": round(statistics.median(timing.timer(
                dev, lambda: gm(a.t(), b, offs=o32), reps, 1)), 4)}
        except Exception as e:
            rows["ref_grouped_mm_bf16_out"] = {"error": str(e)[:300]}
        try:
            rows["ref_dense_mm_bf16"] = {"ms": round(statistics.median(timing.timer(
                dev, lambda: a.t() @ b, reps, 1)), 4), "note": "one [KA,M]x[M,N] GEMM, bf16 out"}
        except Exception as e:
            rows["ref_dense_mm_bf16"] = {"error": str(e)[:300]}
        res[name] = rows
        a = b = out = ref = None  # the next shape's operands need the memory
        torch.cuda.empty_cache()
    return res


def _profile_reference(cfg, inp, steps, warmup):
    """The reference layer's profile; the layer is freed on return."""
    from .layer import ReferenceMoE
    from .run import step
    layer = ReferenceMoE(cfg, inp["wr"].detach(), inp["bias"], inp["wd"].detach(),
                         inp["wg"].detach(), inp["wu"].detach())
    for n in ("wg", "wu", "wd"):
        inp[n] = None
    x = inp["x"].detach().clone().requires_grad_()
    try:
        k, r, tot = profiled(lambda: step(layer, x, inp["d_out"]), steps, warmup)
        return {"kernel_ms_total": tot, "top_kernels": k, "stages": r,
                "gemm": layer.gemm.describe()}
    except Exception as e:
        return {"error": "%s: %s" % (type(e).__name__, str(e)[:400]),
                "traceback": traceback.format_exc()[-1500:]}


def profile_shape(name, s, dev, steps, warmup, sweep=True):
    from dropless.gpu.adapters import torch_adapter as ta
    dt = torch.bfloat16
    cfg = timing.cfg_of(s)
    res = {"model": stage_model(s)}
    inp = timing.inputs(s, dev, dt)
    for n in ("x", "wr", "wg", "wu", "wd"):
        inp[n].requires_grad_()
    gm = ta.GMM(dt, s["d"], s["f"], dev)

    def typ():
        for n in ("x", "wr", "wg", "wu", "wd"):
            inp[n].grad = None
        ta.typical_layer(inp, cfg, s["T"], s["d"], s["k"], s["E"], gm, dt, dev)
    try:
        k, _, tot = profiled(typ, steps, warmup)
        res["typical"] = {"kernel_ms_total": tot, "top_kernels": k}
    except Exception as e:
        res["typical"] = {"error": "%s: %s" % (type(e).__name__, str(e)[:400])}
    for n in ("x", "wr", "wg", "wu", "wd"):
        inp[n].grad = None
    torch.cuda.empty_cache()
    res["reference"] = _profile_reference(cfg, inp, steps, warmup)
    inp = None  # the sweep needs the memory (DeepSeek-V3's fp32 weight gradients: 45 GB)
    torch.cuda.empty_cache()
    try:
        if sweep:
            res["wgrad_sweep"] = sweep_wgrad(s, dev)
    except Exception as e:
        res["wgrad_sweep"] = {"error": "%s: %s" % (type(e).__name__, str(e)[:400])}
    torch.cuda.empty_cache()
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(timing.SHAPES))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-sweep", action="store_true", help="skip the wgrad tile sweep")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile: needs CUDA", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "roof": ROOF,
           "shapes": {}}
    for name in a.shapes.split(","):
        try:
            res["shapes"][name] = profile_shape(name, timing.SHAPES[name], dev, a.steps, a.warmup,
                                                   not a.no_sweep)
        except Exception as e:
            res["shapes"][name] = {"error": "%s: %s" % (type(e).__name__, str(e)[:400]),
                                   "traceback": traceback.format_exc()[-1500:]}
        print(name, "done", flush=True)
    timing.write_json(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
