"""A reference dropless MoE layer in PyTorch: what the founding paper's
sections 8 and 11-13 ask of a layer, written plainly.

- Routing on the device: fp32 router GEMM, softmax or sigmoid, selection
  (optionally through a selection-only bias and group-limited, DeepSeek-V3
  style) by torch.topk on an integer key that orders by score and breaks
  exact ties to the lower index (the golden's rule), so the choice is exact
  and deterministic.
- Dispatch on the device without a sort kernel or a host round-trip: a
  histogram (scatter_add of ones), its prefix sum (the group offsets), and
  a stable counting sort (the rank of each assignment among those of its
  expert, a cumulative sum of a one-hot matrix): every shape is static
  (M = T * k), no `.item()`, `.cpu()`, `nonzero` or size read.
- Grouped GEMMs over the flat array with device offsets (gemm.py); gate and
  up projections as one GEMM against [W_gate | W_up] (so the data gradient
  d_x_sorted is one GEMM with a 2f contraction, rounded once).
- SwiGLU and its derivative evaluated in fp32, rounded once.
- Combine without atomics: y gathered back to [T, k, d] through inv_perm and
  summed over the k slots in fixed order in fp32, rounded once; the
  backward un-permutes d_x_sorted the same way.
- A custom autograd.Function (the custom VJP): the backward un-permutes and
  sums through the ragged layout and writes the expert weight gradients in
  fp32 into `main_grad` buffers (Megatron's main-grad convention), since
  autograd would cast a gradient to the bf16 parameter's dtype.

`ReferenceMoE.taps`, when a dict, receives every stage value and every
intermediate gradient by the golden format's names (for candidate files).
"""

import torch
from torch.profiler import record_function

from . import fused
from .gemm import GroupedGemm

MASK = torch.iinfo(torch.int64).min


def _rf(name):
    """A profiler range per stage (dropless/gpu/reference_layer/profile.py buckets
    the kernels by it); host-side only, nothing on the device."""
    return record_function("ref:" + name)


def _order_key(v, n):
    """An int64 key per element of v [..., n] (fp32): larger for a larger
    value, and for equal values larger for the lower index; topk on it
    picks exactly what a stable descending sort would, on any device."""
    v = v + 0.0  # -0.0 -> +0.0: equal values must tie
    b = v.view(torch.int32).to(torch.int64)
    mono = torch.where(b >= 0, b, b ^ 0x7FFFFFFF)  # monotone in the float's order
    idx = torch.arange(n, device=v.device, dtype=torch.int64)
    return mono * (1 << 32) + (n - 1 - idx)


def select(scores, bias, cfg):
    """topk_ids [T, k] (int64), best first, ties to the lower index."""
    T, E = scores.shape
    key = scores + bias if cfg["has_bias"] else scores
    ng, kg = cfg["n_group"], cfg["topk_group"]
    ok = _order_key(key, E)
    if ng > 1 and kg < ng:
        G = E // ng
        nb = group_terms(cfg)
        top = key.view(T, ng, G).topk(nb, dim=-1).values  # descending
        # the exact sum rounded once, as the golden's (binary64 holds it)
        gs = top.double().sum(-1).float() if nb > 1 else top[..., 0]
        gidx = _order_key(gs, ng).topk(kg, dim=-1).indices
        keep = torch.zeros((T, ng), dtype=torch.bool, device=scores.device).scatter_(1, gidx, True)
        keep = keep.unsqueeze(-1).expand(T, ng, G).reshape(T, E)
        ok = ok.masked_fill(~keep, MASK)
    return ok.topk(cfg["top_k"], dim=-1).indices


def group_terms(cfg):
    if cfg["n_group"] <= 1:
        return 1
    nb = {"max": 1, "top2_sum": 2}.get(cfg["group_score"], cfg["top_k"] // cfg["topk_group"])
    return min(max(nb, 1), cfg["experts"] // cfg["n_group"])


def dispatch(ids, E):
    """sort_perm, inv_perm (int64 [M]), group sizes (int64 [E]) and offsets
    (int64 [E+1]) of the flat assignments, stable, on the device."""
    flat = ids.reshape(-1)
    M = flat.numel()
    dev = flat.device
    sizes = torch.zeros(E, dtype=torch.int64, device=dev).scatter_add_(
        0, flat, torch.ones_like(flat))
    offs = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), torch.cumsum(sizes, 0)])
    # The keys expert * M + position are distinct, so every sort of them
    # gives the one stable order by expert: deterministic whatever the sort
    # kernel, with static shapes, and far cheaper than a counting sort's
    # [M, E] prefix sum (12.6 ms at M = 32768, E = 256 on an H200).
    pos = torch.arange(M, device=dev, dtype=torch.int64)
    perm = torch.sort(flat * M + pos).indices
    inv = torch.empty_like(flat).scatter_(0, perm, pos)
    return perm, inv, sizes, offs


class _MoE(torch.autograd.Function):
    """out = MoE(x); backward returns d_x and d_router_weight, and adds the
    expert weight gradients (fp32) into layer.main_grad."""

    @staticmethod
    def forward(ctx, x, w_r, w_in, w_down, layer):
        st = layer._forward(x, w_r, w_in, w_down)
        ctx.layer, ctx.st = layer, st
        return st["out"]

    @staticmethod
    def backward(ctx, d_out):
        d_x, d_wr = ctx.layer._backward(ctx.st, d_out)
        ctx.st = None
        return d_x, d_wr, None, None, None


class ReferenceMoE:
    """The layer's parameters and its forward/backward. cfg: the golden
    format's /config (dict: experts, top_k, score_function, n_group,
    topk_group, group_score, renormalize, scaling, has_bias, ffn_kind);
    w_gate/w_up may be None for ffn_kind plain. Tensors are taken as given
    (device and dtype of x); w_in is [W_gate | W_up] along the last axis."""

    def __init__(self, cfg, w_r, bias, w_down, w_gate=None, w_up=None, gemm="auto", defect=None):
        self.cfg = dict(cfg)
        self.swiglu = cfg["ffn_kind"] == "swiglu"
        self.dtype, self.device = w_down.dtype, w_down.device
        self.E, self.k = cfg["experts"], cfg["top_k"]
        self.f = w_down.shape[1]
        self.d = w_down.shape[2]
        self.w_r = w_r.detach().clone().requires_grad_()
        self.bias = bias.detach().clone() if bias is not None else None
        self.w_down = w_down.detach().clone().requires_grad_()
        self.w_in = (torch.cat([w_gate, w_up], 2).contiguous().requires_grad_()
                     if self.swiglu else None)
        self.main_grad = {"w_down": torch.zeros(self.w_down.shape, dtype=torch.float32,
                                                device=self.device)}
        if self.swiglu:
            self.main_grad["w_in"] = torch.zeros(self.w_in.shape, dtype=torch.float32,
                                                 device=self.device)
        dims = (self.d, self.f, 2 * self.f) if self.swiglu else (self.d,)
        self.gemm = GroupedGemm(self.dtype, dims, self.device, gemm)
        self.taps = None
        self.defect = defect  # tests only: "drop_slot" loses token 0's last slot

    def load(self, w_r, bias, w_down, w_gate=None, w_up=None):
        """New parameter values, in place (a captured graph keeps its
        pointers)."""
        with torch.no_grad():
            self.w_r.copy_(w_r)
            if self.bias is not None:
                self.bias.copy_(bias)
            self.w_down.copy_(w_down)
            if self.swiglu:
                self.w_in[..., :self.f].copy_(w_gate)
                self.w_in[..., self.f:].copy_(w_up)

    _grad_fresh = False  # main_grad is to be overwritten by the next backward

    def zero_grad(self):
        """Zero the gradients, lazily: the next backward's weight-gradient
        kernels store into main_grad instead of adding (every element is
        written, an empty expert's as 0), so the fp32 buffers are neither
        filled nor read (45 GB each way for DeepSeek-V3's experts)."""
        self._grad_fresh = True
        self.w_r.grad = None

    def __call__(self, x):
        return _MoE.apply(x, self.w_r, self.w_in, self.w_down, self)

    def _tap(self, **kw):
        if self.taps is not None:
            self.taps.update(kw)

    # ----------------------------------------------------------- forward

    def _forward(self, x, w_r, w_in, w_down):
        cfg, dt, E, k = self.cfg, self.dtype, self.E, self.k
        T = x.shape[0]
        # Routing in binary64, rounded once to fp32: the products of fp32
        # (and bf16/fp16) values are exact in binary64 and d of them sum with
        # a relative error near 2^-53 * d, so the logits, scores and weights
        # are the correctly rounded values (the golden's) unless one lies
        # within that error of a rounding midpoint; near-tie routing
        # decisions are then the golden's too. The cost: one [T, d] x [d, E]
        # GEMM in fp64.
        with _rf("router"):
            logits64 = x.double() @ w_r.double()
            logits = logits64.float()
            l64 = logits.double()
            scores = (torch.softmax(l64, -1) if cfg["score_function"] == "softmax"
                      else torch.sigmoid(l64)).float()
            ids = select(scores, self.bias, cfg)
            w_raw = scores.gather(1, ids)
            S = w_raw.sum(-1, keepdim=True) if cfg["renormalize"] else None
            w64 = w_raw.double() * cfg["scaling"]
            if cfg["renormalize"]:
                w64 = w64 / w_raw.double().sum(-1, keepdim=True)
            w = w64.float()
        self.gemm.cap = T  # each token at most once per expert
        with _rf("dispatch"):
            perm, inv, sizes, offs = dispatch(ids, E)
            offs32 = offs[1:].to(torch.int32)
            xs = x.index_select(0, perm // k)
        st = dict(x=x, scores=scores, ids=ids, w_raw=w_raw, S=S, w=w, perm=perm, inv=inv,
                  offs=offs, offs32=offs32, xs=xs)
        if self.swiglu:
            with _rf("gate_up"):
                h = self.gemm.rows(xs, w_in, offs32, offs)
            hg, hu = h[:, :self.f], h[:, self.f:]
            with _rf("swiglu"):
                ha = fused.swiglu(hg, hu, dt)
            with _rf("down"):
                y = self.gemm.rows(ha, w_down, offs32, offs)
            st.update(hg=hg, hu=hu, ha=ha)
            self._tap(h_gate=hg, h_up=hu, h_act=ha)
        else:
            y = self.gemm.rows(xs, w_down, offs32, offs)
        with _rf("combine"):
            wc = w
            if self.defect == "drop_slot" and T > 0:
                wc = w.clone()
                wc[0, k - 1] = 0.0
            out = fused.gather_sum(y, inv.view(T, k), wc).to(dt)
        st.update(y=y, out=out)
        self._tap(router_logits=logits, router_scores=scores, topk_ids=ids, topk_weights=w,
                  sort_perm=perm, inv_perm=inv, group_sizes=sizes, group_offsets=offs,
                  x_sorted=xs, y_sorted=y, out=out)
        return st

    # ---------------------------------------------------------- backward

    def _backward(self, st, d_out):
        cfg, dt, k = self.cfg, self.dtype, self.k
        T = d_out.shape[0]
        acc = not self._grad_fresh  # after zero_grad() the kernels store, not add
        self._grad_fresh = False
        with _rf("combine_backward"):
            d_w = fused.row_dots(st["y"], st["inv"].view(T, k), d_out)
            d_y = fused.weighted_rows(d_out, st["w"], st["perm"], k, dt)
        offs, offs32, xs = st["offs"], st["offs32"], st["xs"]
        g = self.gemm
        if self.swiglu:
            with _rf("d_h_act"):
                d_ha = g.rows(d_y, self.w_down.detach().transpose(1, 2), offs32, offs)
            with _rf("wgrad_down"):
                g.wgrad(st["ha"], d_y, offs32, offs, self.main_grad["w_down"], acc)
            with _rf("swiglu_backward"):
                d_h = fused.swiglu_backward(st["hg"], st["hu"], d_ha, dt)
                d_hg, d_hu = d_h[:, :self.f], d_h[:, self.f:]
            with _rf("d_x_sorted"):
                d_xs = g.rows(d_h, self.w_in.detach().transpose(1, 2), offs32, offs)
            with _rf("wgrad_gate_up"):
                g.wgrad(xs, d_h, offs32, offs, self.main_grad["w_in"], acc)
            self._tap(d_h_act=d_ha, d_h_gate=d_hg, d_h_up=d_hu)
        else:
            d_xs = g.rows(d_y, self.w_down.detach().transpose(1, 2), offs32, offs)
            g.wgrad(xs, d_y, offs32, offs, self.main_grad["w_down"], acc)
        with _rf("unpermute_router_backward"):
            d_x_exp = fused.gather_sum(d_xs, st["inv"].view(T, k))
            # router: through scaling, renormalisation, gather, softmax/sigmoid
            c = cfg["scaling"]
            gw = d_w * c if c != 1.0 else d_w
            if cfg["renormalize"]:
                S = st["S"]
                d_raw = (gw - (gw * st["w_raw"]).sum(-1, keepdim=True) / S) / S
            else:
                d_raw = gw
            s = st["scores"]
            d_scores = torch.zeros_like(s).scatter_(1, st["ids"], d_raw)
            if cfg["score_function"] == "softmax":
                d_logits = s * (d_scores - (s * d_scores).sum(-1, keepdim=True))
            else:
                d_logits = d_scores * s * (1.0 - s)
            x = st["x"]
            d_wr = x.float().t() @ d_logits
            d_x = (d_x_exp + d_logits @ self.w_r.detach().t()).to(dt)
        self._tap(d_topk_weights=d_w, d_y_sorted=d_y, d_x_sorted=d_xs, d_router_scores=d_scores,
                  d_router_logits=d_logits)
        return d_x, d_wr

    # ------------------------------------------------------ gradients out

    def weight_grads(self):
        """{d_w_gate, d_w_up, d_w_down}: fp32 views of main_grad."""
        if self._grad_fresh:  # zeroed and no backward since
            for t in self.main_grad.values():
                t.zero_()
            self._grad_fresh = False
        r = {"d_w_down": self.main_grad["w_down"]}
        if self.swiglu:
            mg = self.main_grad["w_in"]
            r["d_w_gate"], r["d_w_up"] = mg[..., :self.f], mg[..., self.f:]
        return r
