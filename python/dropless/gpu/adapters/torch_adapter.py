"""PyTorch adapter: runs PyTorch's grouped GEMM and a typical PyTorch MoE
layer on a golden file's inputs and writes candidate files.

Backends (one candidate file each):
  torch-grouped_mm   stage-isolated: every stage fed the golden values of its
                     inputs; grouped GEMMs through torch.nn.functional.grouped_mm
                     (or torch._grouped_mm), the backward through autograd.
  torch-grouped_mm[allow_tf32]  the same with TF32 allowed, fp32 cases only
                     (mode isolated_tf32): a negative control for the fp32 profile.
  torch-grouped_mm[wgrad_fp32]  weight gradients only, written in fp32 from
                     bf16/fp16 operands (mode wgrad_fp32): the golden's
                     main-grad convention.
  torch-moe          chained: a MoE layer as people write it (fp32 router GEMM,
                     softmax/sigmoid, torch.topk, argsort, gather, grouped GEMMs,
                     SwiGLU, index_add_ combine), forward then autograd backward.
  torch-moe[fused]   the same layer, written as a fused kernel would expose it
                     (mode fused): out, d_x and the weight gradients only.

Where the grouped GEMM cannot take the shapes (rows not 16-byte aligned), a
per-expert torch.mm loop stands in and the backend name says so
("torch-mm_loop" / "torch-moe[mm_loop]").

Usage: python3 -m dropless.gpu.adapters.torch_adapter GOLDEN... -o DIR [--device cuda]
"""

import sys

import numpy as np

from . import common

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the module stays importable; available() says why
    torch = None


def available():
    if torch is None:
        return False, "PyTorch is not installed"
    return True, ""


TDT = {}
if torch is not None:
    TDT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def grouped_mm_fn():
    """(function, name) of the grouped GEMM this torch has, or (None, None)."""
    f = getattr(F, "grouped_mm", None)
    if f is not None:
        return f, "torch.nn.functional.grouped_mm"
    f = getattr(torch, "_grouped_mm", None)
    if f is not None:
        return f, "torch._grouped_mm"
    return None, None


def precision_flags():
    """What this torch says about reduced-precision matrix products."""
    m = torch.backends.cuda.matmul
    fl = {"torch": torch.__version__}
    for name in ("allow_tf32", "allow_bf16_reduced_precision_reduction",
                 "allow_fp16_reduced_precision_reduction", "fp32_precision"):
        try:
            fl["cuda.matmul." + name] = getattr(m, name)
        except Exception as e:  # some are gone or renamed in some versions
            fl["cuda.matmul." + name] = "n/a (%s)" % type(e).__name__
    try:
        fl["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except Exception:
        pass
    fl["cudnn.allow_tf32"] = torch.backends.cudnn.allow_tf32
    return fl


def device_name(dev):
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform
    return "cpu (%s)" % (platform.processor() or platform.machine())


def to_np(t):
    """A tensor as a float32 (or integer) numpy array; bf16/fp16 -> float32
    is exact."""
    t = t.detach()
    if t.is_floating_point():
        t = t.to(torch.float32)
    return t.cpu().numpy()


class GMM:
    """The grouped GEMM y[rows of group e] = a[rows of e] @ w[e] as this torch
    can run it for these shapes: grouped_mm when the rows are 16-byte
    aligned, else a per-expert torch.mm loop (autograd works on both)."""

    def __init__(self, dtype, d, f, dev):
        self.fn, self.fn_name = grouped_mm_fn()
        esz = torch.tensor([], dtype=dtype).element_size()
        self.aligned = all((n * esz) % 16 == 0 for n in (d, f))
        self.use_gmm = self.fn is not None and self.aligned
        if self.use_gmm:
            if dtype == torch.bfloat16 and dev.type == "cuda" and \
                    torch.cuda.get_device_capability(dev)[0] in (9, 10):
                path = "CUTLASS bf16 grouped GEMM (sm90/sm100 fast path)"
            else:
                path = "per-group torch.mm inside grouped_mm (its fallback for %s)" % (
                    str(dtype).replace("torch.", ""))
            self.kernel = "%s: %s" % (self.fn_name, path)
            self.tag = "grouped_mm"
        else:
            why = "no grouped_mm in this torch" if self.fn is None else \
                "rows not 16-byte aligned (d=%d, f=%d)" % (d, f)
            self.kernel = "per-expert torch.mm loop (%s)" % why
            self.tag = "mm_loop"

    def __call__(self, a, w, sizes_list, offs):
        if self.use_gmm:
            return self.fn(a, w, offs=offs)
        parts, s = [], 0
        for e, n in enumerate(sizes_list):
            parts.append(a[s:s + n] @ w[e])
            s += n
        if not parts:
            return a.new_zeros((0, w.shape[2]))
        return torch.cat(parts, 0)


def probe_fp32(dev):
    """Which arithmetic an fp32 grouped GEMM really uses here
    (common.probe_fp32), and the kernel that ran."""
    gm = GMM(torch.float32, 256, 128, dev)

    def gemm(a, b, sizes):
        offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device=dev)
        return gm(torch.from_numpy(a).to(dev), torch.from_numpy(b).to(dev), sizes, offs).double().cpu().numpy()
    return dict(common.probe_fp32(gemm), kernel=gm.kernel)


# ------------------------------------------------------------------ routing

def select(scores, bias, cfg):
    """Top-k ids [T,k] as people write it (DeepSeek-V3's reference style for
    group-limited routing); selection gets no gradient."""
    T, E = scores.shape
    k = cfg["top_k"]
    with torch.no_grad():
        key = scores + bias if cfg["has_bias"] else scores.clone()
        ng, kg = cfg["n_group"], cfg["topk_group"]
        if ng > 1:
            G = E // ng
            kk = key.view(T, ng, G)
            gs = kk.topk(common.group_terms(cfg), dim=-1).values.sum(-1)
            gidx = gs.topk(kg, dim=-1).indices
            gmask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gidx, True)
            emask = gmask.unsqueeze(-1).expand(T, ng, G).reshape(T, E)
            key = key.masked_fill(~emask, float("-inf"))
        return key.topk(k, dim=-1).indices


# ---------------------------------------------------------------- backends

def _common_setup(g, device):
    dev = torch.device(device)
    dt = TDT[g.config["dtype"]]
    A = lambda key, dtype=dt: torch.from_numpy(g.array(key)).to(dev).to(dtype)
    return dev, dt, A


def run_isolated(g, device="cuda"):
    """Stage-isolated: each stage from the golden values of its inputs."""
    dev, dt, A = _common_setup(g, device)
    sizes = [int(n) for n in g.array("group_sizes")]
    offs = torch.tensor(np.cumsum(sizes, dtype=np.int64), dtype=torch.int32, device=dev)
    gm = GMM(dt, g.dims["d"], g.dims["f"], dev)
    probe = probe_fp32(dev) if g.config["dtype"] == "fp32" else None
    res = {}
    if g.config["ffn_kind"] == "swiglu":
        xs = A("x_sorted").requires_grad_()
        wg = A("w_gate").requires_grad_()
        wu = A("w_up").requires_grad_()
        hg = gm(xs, wg, sizes, offs)
        hu = gm(xs, wu, sizes, offs)
        res["h_gate"], res["h_up"] = to_np(hg), to_np(hu)
        torch.autograd.backward([hg, hu], [A("d_h_gate"), A("d_h_up")])
        res["d_x_sorted"] = to_np(xs.grad)
        res["d_w_gate"] = to_np(wg.grad)
        res["d_w_up"] = to_np(wu.grad)

        hg0 = A("h_gate").requires_grad_()
        hu0 = A("h_up").requires_grad_()
        ha = F.silu(hg0) * hu0
        res["h_act"] = to_np(ha)
        ha.backward(A("d_h_act"))
        res["d_h_gate"], res["d_h_up"] = to_np(hg0.grad), to_np(hu0.grad)

        ha1 = A("h_act").requires_grad_()
        wd = A("w_down").requires_grad_()
        y = gm(ha1, wd, sizes, offs)
        res["y_sorted"] = to_np(y)
        y.backward(A("d_y_sorted"))
        res["d_h_act"], res["d_w_down"] = to_np(ha1.grad), to_np(wd.grad)
    else:
        xs = A("x_sorted").requires_grad_()
        wd = A("w_down").requires_grad_()
        y = gm(xs, wd, sizes, offs)
        res["y_sorted"] = to_np(y)
        y.backward(A("d_y_sorted"))
        res["d_x_sorted"], res["d_w_down"] = to_np(xs.grad), to_np(wd.grad)
    name = "torch-grouped_mm" if gm.tag == "grouped_mm" else "torch-mm_loop"
    notes = {"kernel": gm.kernel, "activation": "F.silu(h_gate) * h_up in %s" % g.config["dtype"],
             "weight_grads": "autograd, in the weights' dtype (%s)" % g.config["dtype"],
             "precision_flags": precision_flags()}
    if probe:
        notes["fp32_probe"] = probe
    return common.Result(name, res, notes, common.profile_for(g.config["dtype"], probe))


def typical_layer(inp, cfg, T, d, k, E, gm, dt, dev):
    """The layer of run_chained on device tensors inp (x, wr, bias, wd, wg,
    wu, d_out; the weights and x leaves requiring grad), forward and
    backward: the stage tensors (intermediates keep their .grad). Apart from
    run_chained, python/dropless/gpu/pipeline_checks.py runs it (host syncs, graph capture,
    timing)."""
    x, wr, bias, wd, wg, wu = (inp.get(n) for n in ("x", "wr", "bias", "wd", "wg", "wu"))

    def R(t):  # keep t's gradient for the candidate
        t.retain_grad()
        return t

    logits = R(x.float() @ wr)
    scores = R(torch.softmax(logits, dim=-1) if cfg["score_function"] == "softmax"
               else torch.sigmoid(logits))
    ids = select(scores, bias, cfg)
    w = scores.gather(1, ids)
    if cfg["renormalize"]:
        w = w / w.sum(dim=-1, keepdim=True)
    if cfg["scaling"] != 1.0:
        w = w * cfg["scaling"]
    w = R(w)

    flat = ids.reshape(-1)
    perm = torch.argsort(flat, stable=True)
    sizes_t = torch.bincount(flat, minlength=E)
    offs = torch.cumsum(sizes_t, 0).to(torch.int32)
    sizes = [int(n) for n in sizes_t.cpu()]
    tok = perm // k
    xs = R(x[tok])
    v = {}
    if cfg["ffn_kind"] == "swiglu":
        hg = R(gm(xs, wg, sizes, offs))
        hu = R(gm(xs, wu, sizes, offs))
        ha = R(F.silu(hg) * hu)
        y = R(gm(ha, wd, sizes, offs))
        v.update(hg=hg, hu=hu, ha=ha)
    else:
        y = R(gm(xs, wd, sizes, offs))
    ws = w.reshape(-1)[perm]
    weighted = (y.float() * ws.unsqueeze(-1)).to(dt)
    out = torch.zeros(T, d, dtype=dt, device=dev).index_add(0, tok, weighted)
    out.backward(inp["d_out"])

    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=dev)
    v.update(logits=logits, scores=scores, ids=ids, w=w, perm=perm, inv=inv, sizes_t=sizes_t,
             sizes=sizes, xs=xs, y=y, out=out)
    return v


def run_chained(g, device="cuda"):
    """The whole layer, forward and backward, the way a PyTorch MoE layer is
    usually written (torchtitan-like: fp32 router, scores after the experts,
    combine with index_add_ in the activation dtype)."""
    dev, dt, A = _common_setup(g, device)
    cfg = g.config
    T, d, E, k = g.dims["T"], g.dims["d"], g.dims["E"], g.dims["k"]
    gm = GMM(dt, g.dims["d"], g.dims["f"], dev)
    probe = probe_fp32(dev) if g.config["dtype"] == "fp32" else None

    inp = {"x": A("x").requires_grad_(), "wr": A("router_weight", torch.float32).requires_grad_(),
           "bias": A("expert_bias", torch.float32) if cfg["has_bias"] else None,
           "wd": A("w_down").requires_grad_(), "d_out": A("d_out")}
    if cfg["ffn_kind"] == "swiglu":
        inp["wg"], inp["wu"] = A("w_gate").requires_grad_(), A("w_up").requires_grad_()
    v = typical_layer(inp, cfg, T, d, k, E, gm, dt, dev)
    sizes = v["sizes"]
    res = {
        "router_logits": to_np(v["logits"]), "router_scores": to_np(v["scores"]),
        "topk_ids": to_np(v["ids"]).astype(np.int32), "topk_weights": to_np(v["w"]),
        "sort_perm": to_np(v["perm"]).astype(np.int32),
        "inv_perm": to_np(v["inv"]).astype(np.int32),
        "group_sizes": to_np(v["sizes_t"]).astype(np.int64),
        "group_offsets": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        "x_sorted": to_np(v["xs"]), "y_sorted": to_np(v["y"]), "out": to_np(v["out"]),
        "d_topk_weights": to_np(v["w"].grad), "d_y_sorted": to_np(v["y"].grad),
        "d_w_down": to_np(inp["wd"].grad), "d_x_sorted": to_np(v["xs"].grad),
        "d_router_scores": to_np(v["scores"].grad),
        "d_router_logits": to_np(v["logits"].grad),
        "d_router_weight": to_np(inp["wr"].grad), "d_x": to_np(inp["x"].grad),
    }
    if "y_half" in g.stages():  # the synthetic value of configure --enable-extra-value
        res["y_half"] = to_np(v["y"] * 0.5)
    if cfg["ffn_kind"] == "swiglu":
        res.update({
            "h_gate": to_np(v["hg"]), "h_up": to_np(v["hu"]), "h_act": to_np(v["ha"]),
            "d_h_act": to_np(v["ha"].grad), "d_h_gate": to_np(v["hg"].grad),
            "d_h_up": to_np(v["hu"].grad), "d_w_gate": to_np(inp["wg"].grad),
            "d_w_up": to_np(inp["wu"].grad)})
    name = "torch-moe" if gm.tag == "grouped_mm" else "torch-moe[mm_loop]"
    notes = {"kernel": gm.kernel,
             "router": "x.float() @ W_r (fp32), %s, torch.topk" % cfg["score_function"],
             "dispatch": "torch.argsort(stable=True), torch.bincount, x[perm // k]",
             "combine": "(y.float() * w).to(%s), index_add in %s" % (g.config["dtype"], g.config["dtype"]),
             "activation": "F.silu(h_gate) * h_up in %s" % g.config["dtype"],
             "weight_grads": "autograd, in the weights' dtype (%s)" % g.config["dtype"],
             "precision_flags": precision_flags()}
    if probe:
        notes["fp32_probe"] = probe
    return common.Result(name, res, notes, common.profile_for(g.config["dtype"], probe))


MODES = ("isolated", "chained", "fused", "isolated_tf32", "wgrad_fp32")


def run_wgrad_fp32(g, device="cuda"):
    """Weight gradients written in fp32 from bf16/fp16 operands, the
    'main grad' convention of the golden file (Megatron's gradient
    accumulation fusion): grouped_mm with out_dtype=float32 where this torch
    takes it, else grouped_mm on operands upcast to fp32 (exact products,
    fp32 accumulation). Stage-isolated, golden operands."""
    if g.config["dtype"] == "fp32":
        raise common.Skip("fp32 weights already get fp32 gradients")
    dev, dt, A = _common_setup(g, device)
    sizes = [int(n) for n in g.array("group_sizes")]
    offs = torch.tensor(np.cumsum(sizes, dtype=np.int64), dtype=torch.int32, device=dev)
    gm = GMM(dt, g.dims["d"], g.dims["f"], dev)
    how = {}

    def wgrad(a, b):  # [E, a.cols, b.cols]: per expert a_e^T b_e in fp32
        if gm.use_gmm:
            try:
                r = gm.fn(a.t(), b, offs=offs, out_dtype=torch.float32)
                how["path"] = "%s(a.T, b, offs, out_dtype=float32)" % gm.fn_name
                return r
            except Exception as e:  # not every version takes a wider output
                how["out_dtype_float32"] = "refused: %s: %s" % (type(e).__name__, str(e)[:200])
            how["path"] = "%s on operands upcast to float32" % gm.fn_name
            return gm.fn(a.float().t(), b.float(), offs=offs)
        how["path"] = "per-expert torch.mm loop on operands upcast to float32"
        out, s = [], 0
        for n in sizes:
            out.append(a[s:s + n].float().t() @ b[s:s + n].float())
            s += n
        return torch.stack(out)

    res = {}
    if g.config["ffn_kind"] == "swiglu":
        res["d_w_down"] = to_np(wgrad(A("h_act"), A("d_y_sorted")))
        xs = A("x_sorted")
        res["d_w_gate"] = to_np(wgrad(xs, A("d_h_gate")))
        res["d_w_up"] = to_np(wgrad(xs, A("d_h_up")))
    else:
        res["d_w_down"] = to_np(wgrad(A("x_sorted"), A("d_y_sorted")))
    notes = {"kernel": how.get("path"), "precision_flags": precision_flags()}
    notes.update({k: v for k, v in how.items() if k != "path"})
    name = "torch-grouped_mm" if gm.tag == "grouped_mm" else "torch-mm_loop"
    return common.Result(name + "[wgrad_fp32]", res, notes, g.config["dtype"])


def run_isolated_tf32(g, device="cuda"):
    """run_isolated with TF32 allowed for fp32 matrix products (a negative
    control for the fp32 profile: it should fail fp32 and pass tf32)."""
    if g.config["dtype"] != "fp32":
        raise common.Skip("TF32 applies to fp32 cases only")
    m = torch.backends.cuda.matmul
    old = m.allow_tf32
    m.allow_tf32 = True
    try:
        r = run_isolated(g, device)
    finally:
        m.allow_tf32 = old
    r.notes["tf32"] = "torch.backends.cuda.matmul.allow_tf32 = True for this run"
    return r._replace(name=r.name + "[allow_tf32]")


BACKENDS = {"isolated": run_isolated, "chained": run_chained,
            "fused": lambda g, device="cuda": common.fused(run_chained(g, device)),
            "isolated_tf32": run_isolated_tf32, "wgrad_fp32": run_wgrad_fp32}


def _synchronised(fn):
    def go(g, device):
        r = fn(g, device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return r
    return go


def run(golden_path, outdir, modes=MODES, device=None, log=print, repeat=True):
    """Runs the chosen modes on one golden file: ([(path, summary)], [errors])."""
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    info = lambda g: ("torch %s" % torch.__version__, device_name(torch.device(device)))
    return common.run_modes(golden_path, outdir, modes,
                            {m: _synchronised(f) for m, f in BACKENDS.items()}, info, device, log,
                            repeat)


def main(argv=None):
    return common.adapter_main(argv, __doc__, available, run, MODES)


if __name__ == "__main__":
    sys.exit(main())
