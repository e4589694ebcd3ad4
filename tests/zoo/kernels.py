"""The kernel zoo: numpy implementations of the MoE layer the way real
kernels compute it (fp32 BLAS order, bf16 storage of intermediates,
capacity-factor drops, ...), each writing a candidate file for
`dropless check`. They are test vehicles, not references: the oracle is the
C library; these only have to be what a framework would plausibly do.

Layouts (doc/format.md): x [T,d], router_weight [d,E], w_gate/w_up [E,d,f],
w_down [E,f,d], sorted rows grouped by expert (golden sort_perm order).
Routing ids come from the golden (group-limited selection with a bias is
not what these kernels test); everything else is recomputed.
"""
import numpy as np
import h5py

F32 = np.float32


def bf16(a):
    """Round float32 values to the nearest bf16 (ties to even), as float32."""
    a = np.ascontiguousarray(a, dtype=F32)
    u = a.view(np.uint32)
    # in uint32: only NaNs (u >= 0xFFFF8000) wrap, and they are restored below
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    out = r.view(F32)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = a[nan]
    return out


def tf32(a):
    """Round float32 values to tf32 (10 explicit significand bits), ties to even."""
    a = np.ascontiguousarray(a, dtype=F32)
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000).astype(np.uint32)
    return r.view(F32).copy()


def mm_bf16_acc(a, b):
    """A GEMM whose accumulator is bf16: each product (exact in fp32 for
    bf16 operands) is added to the running sum, rounded to bf16 every step,
    in sequential order (a defective kernel: the declared bf16 profile
    accumulates in fp32)."""
    a = np.asarray(a, F32)
    b = np.asarray(b, F32)
    acc = np.zeros((a.shape[0], b.shape[1]), F32)
    for i in range(a.shape[1]):
        acc = bf16(acc + a[:, i:i + 1] * b[i:i + 1, :])
    return acc


def load(path):
    """The golden's config, inputs and the stages the kernels take from it."""
    g = h5py.File(path, "r")
    c = dict(g["config"].attrs)
    for key, v in list(c.items()):
        if isinstance(v, bytes):
            c[key] = v.decode()
    z = {k: g["inputs/" + k][...] for k in g["inputs"]}
    z["topk_ids"] = g["forward/topk_ids"][...]
    z["golden"] = g
    return c, z


def swiglu(h_g, h_u):
    return (h_g / (1.0 + np.exp(-h_g, dtype=F32))) * h_u


def swiglu_bf16(h_g, h_u):
    """SwiGLU with every intermediate rounded to bf16 (JAX's bf16 jax.nn.silu
    then the product): exp, 1 + e, the quotient, g * sigmoid, * up."""
    e = bf16(np.exp(-h_g, dtype=F32))
    s = bf16(F32(1.0) / bf16(F32(1.0) + e))
    return bf16(bf16(h_g * s) * h_u)


class Layer:
    """One forward and backward pass. rnd rounds a stored intermediate
    (identity for fp32, bf16 for a bf16 autograd-style kernel) in the
    stages stored in the case's type; fp32 stages stay fp32."""

    def __init__(self, c, z, rnd=lambda a: a.astype(F32), keep=None, rw=None, ri=None,
                 ri_router=True, acc=None):
        self.c, self.z, self.rnd = c, z, rnd
        self.acc = acc  # the expert GEMMs' own product (mm_bf16_acc), else BLAS
        self.ri = ri or (lambda a: a)  # GEMM operands (tf32 rounds them)
        self.ri_router = ri_router      # the router's GEMMs too
        self.act = swiglu
        # weight gradients: fp32 (the golden's type) unless the kernel stores
        # them like its weights (bf16 autograd)
        self.rw = rw or (lambda a: a.astype(F32))
        T, k = z["topk_ids"].shape
        self.T, self.k, self.E = T, k, int(c["experts"])
        ids = z["topk_ids"].astype(np.int64)
        flat = ids.reshape(-1)
        # the stable sort by expert: the oracle's dispatch order
        self.perm = np.argsort(flat, kind="stable")
        self.inv = np.empty_like(self.perm)
        self.inv[self.perm] = np.arange(len(self.perm))
        self.sizes = np.bincount(flat, minlength=self.E)
        self.off = np.concatenate([[0], np.cumsum(self.sizes)])
        # keep[t, j] = 0: the kernel dropped that assignment (capacity)
        self.keep = np.ones((T, k), bool) if keep is None else keep

    def mm(self, a, b):
        if self.acc is not None:
            return self.acc(self.ri(a), self.ri(b))
        return (self.ri(a) @ self.ri(b)).astype(F32)

    def forward(self):
        c, z, r = self.c, self.z, self.rnd
        x = z["x"]
        self.logits = self.mm(x, z["router_weight"]) if self.ri_router else (x @ z["router_weight"]).astype(F32)
        L = self.logits
        if c["score_function"] == "softmax":
            e = np.exp(L - L.max(axis=1, keepdims=True), dtype=F32)
            self.scores = (e / e.sum(axis=1, keepdims=True)).astype(F32)
        else:
            self.scores = (1.0 / (1.0 + np.exp(-L, dtype=F32))).astype(F32)
        sel = np.take_along_axis(self.scores, z["topk_ids"].astype(np.int64), axis=1)
        self.S = sel.sum(axis=1, keepdims=True, dtype=F32) if c["renormalize"] else None
        w = sel / self.S if c["renormalize"] else sel
        self.w = (w * F32(c["scaling"])).astype(F32)
        tok = self.perm // self.k
        self.xs = x[tok]
        hg = np.empty((len(tok), int(c["ffn"])), F32)
        hu = np.empty_like(hg)
        y = np.empty((len(tok), x.shape[1]), F32)
        for e in range(self.E):
            a, b = self.off[e], self.off[e + 1]
            hg[a:b] = r(self.mm(self.xs[a:b], z["w_gate"][e]))
            hu[a:b] = r(self.mm(self.xs[a:b], z["w_up"][e]))
        self.hg, self.hu = hg, hu
        self.ha = r(self.act(hg, hu))
        for e in range(self.E):
            a, b = self.off[e], self.off[e + 1]
            y[a:b] = r(self.mm(self.ha[a:b], z["w_down"][e]))
        self.y = y
        yt = y[self.inv].reshape(self.T, self.k, -1)       # per (token, slot)
        m = (self.w * self.keep)[:, :, None]
        self.shared_forward()
        self.out = r(self.combine((m * yt).astype(F32)) + self.shared_out() if self.S_ else
                     self.combine((m * yt).astype(F32)))
        return self.out

    def combine(self, rows):
        """rows [T, k, d] summed over the slots in fp32 (the combine, and
        d_x's un-permute); AtomicsCombine sums them in another order."""
        return rows.sum(axis=1, dtype=F32)

    def shared_forward(self):
        """The shared experts (doc/format.md, "Shared experts"): one dense
        SwiGLU of width S every token passes through, its output scaled by
        sigmoid(x . shared_gate_weight) with the gate; nothing without them."""
        c, z, r = self.c, self.z, self.rnd
        self.S_ = int(c.get("shared_experts", 0)) * int(c.get("shared_ffn", 0))
        if not self.S_:
            return
        x = z["x"]
        self.shg = r(self.mm(x, z["shared_w_gate"]))
        self.shu = r(self.mm(x, z["shared_w_up"]))
        self.sha = r(swiglu(self.shg, self.shu))
        self.shy = r(self.mm(self.sha, z["shared_w_down"]))
        self.gated = int(c.get("shared_gate", 0)) == 1
        if self.gated:
            self.sgl = self.mm(x, z["shared_gate_weight"].reshape(-1, 1))[:, 0]
            self.sg = (1.0 / (1.0 + np.exp(-self.sgl, dtype=F32))).astype(F32)

    def shared_out(self):
        return (self.sg[:, None] * self.shy).astype(F32) if self.gated else self.shy

    def shared_backward(self):
        """The shared experts' gradients; returns their part of d_x."""
        z, r, dout = self.z, self.rnd, self.z["d_out"]
        x = z["x"]
        if self.gated:
            self.dsg = (dout * self.shy).sum(axis=1, dtype=F32)
            self.dsgl = (self.dsg * self.sg * (1 - self.sg)).astype(F32)
            self.dsgw = self.mm(x.T, self.dsgl.reshape(-1, 1))[:, 0]
            self.dsy = r(self.sg[:, None] * dout)
        else:
            self.dsy = r(dout)
        self.dsha = r(self.mm(self.dsy, z["shared_w_down"].T))
        sig = (1.0 / (1.0 + np.exp(-self.shg, dtype=F32))).astype(F32)
        self.dshg = r(self.dsha * self.shu * sig * (1 + self.shg * (1 - sig)))
        self.dshu = r(self.dsha * self.shg * sig)
        self.dswd = self.rw(self.mm(self.sha.T, self.dsy))
        self.dswg = self.rw(self.mm(x.T, self.dshg))
        self.dswu = self.rw(self.mm(x.T, self.dshu))
        dx = self.mm(self.dshg, z["shared_w_gate"].T) + self.mm(self.dshu, z["shared_w_up"].T)
        if self.gated:
            dx = dx + self.dsgl[:, None] * z["shared_gate_weight"][None, :]
        return dx.astype(F32)

    def backward(self):
        c, z, r = self.c, self.z, self.rnd
        T, k = self.T, self.k
        dout = z["d_out"]
        yt = self.y[self.inv].reshape(T, k, -1)
        dw = (dout[:, None, :] * yt).sum(axis=2, dtype=F32) * self.keep
        self.d_topk_weights = dw  # an fp32 value in every case
        dy_t = (self.w * self.keep)[:, :, None] * dout[:, None, :]
        dy = r(dy_t.reshape(T * k, -1)[self.perm])
        sig = (1.0 / (1.0 + np.exp(-self.hg, dtype=F32))).astype(F32)
        dha = np.empty_like(self.hg)
        for e in range(self.E):
            a, b = self.off[e], self.off[e + 1]
            dha[a:b] = r(self.mm(dy[a:b], z["w_down"][e].T))
        dhg = r(dha * self.hu * sig * (1 + self.hg * (1 - sig)))
        dhu = r(dha * self.hg * sig)
        dxs = np.empty_like(self.xs)
        # every expert's block is written below (an empty one by a product
        # over zero rows, exactly 0): no zero fill first, a pass over
        # E*d*f floats less
        self.d_w_gate = np.empty_like(z["w_gate"])
        self.d_w_up = np.empty_like(z["w_up"])
        self.d_w_down = np.empty_like(z["w_down"])
        for e in range(self.E):
            a, b = self.off[e], self.off[e + 1]
            dxs[a:b] = r(self.mm(dhg[a:b], z["w_gate"][e].T) + self.mm(dhu[a:b], z["w_up"][e].T))
            self.d_w_gate[e] = self.rw(self.mm(self.xs[a:b].T, dhg[a:b]))
            self.d_w_up[e] = self.rw(self.mm(self.xs[a:b].T, dhu[a:b]))
            self.d_w_down[e] = self.rw(self.mm(self.ha[a:b].T, dy[a:b]))
        self.dy, self.dha, self.dhg, self.dhu, self.dxs = dy, dha, dhg, dhu, dxs
        # router: d_scores of the selection, then the score VJP
        ids = z["topk_ids"].astype(np.int64)
        sel = np.take_along_axis(self.scores, ids, axis=1)
        a_ = F32(c["scaling"])
        if c["renormalize"]:
            P = (dw * sel).sum(axis=1, keepdims=True, dtype=F32)
            dsel = a_ * (dw / self.S - P / (self.S * self.S))
        else:
            dsel = a_ * dw
        ds = np.zeros_like(self.scores)
        np.put_along_axis(ds, ids, dsel.astype(F32), axis=1)
        s = self.scores
        if c["score_function"] == "softmax":
            dl = s * (ds - (s * ds).sum(axis=1, keepdims=True, dtype=F32))
        else:
            dl = ds * s * (1 - s)
        self.d_router_scores, self.d_router_logits = ds.astype(F32), dl.astype(F32)
        self.d_router_weight = self.mm(z["x"].T, dl)
        dxt = self.combine(dxs[self.inv].reshape(T, k, -1))
        dxt = dxt + self.mm(dl, z["router_weight"].T)
        self.d_x = r(dxt + self.shared_backward() if self.S_ else dxt)
        return self.d_x

    def stages(self):
        """Every value, by dataset path."""
        T, k = self.T, self.k
        st = {
            "forward/router_logits": self.logits, "forward/router_scores": self.scores,
            "forward/topk_ids": self.z["topk_ids"], "forward/topk_weights": self.w,
            "forward/sort_perm": self.perm.astype(np.int32),
            "forward/inv_perm": self.inv.astype(np.int32),
            "forward/group_sizes": self.sizes.astype(np.int64),
            "forward/group_offsets": self.off.astype(np.int64),
            "forward/x_sorted": self.xs, "forward/h_gate": self.hg, "forward/h_up": self.hu,
            "forward/h_act": self.ha, "forward/y_sorted": self.y, "forward/out": self.out,
        }
        if self.S_:
            st.update({"forward/shared_h_gate": self.shg, "forward/shared_h_up": self.shu,
                       "forward/shared_h_act": self.sha, "forward/shared_y": self.shy})
            if self.gated:
                st.update({"forward/shared_gate_logit": self.sgl, "forward/shared_gate": self.sg})
        if hasattr(self, "d_x") and self.S_:
            st.update({"backward/d_shared_y": self.dsy, "backward/d_shared_h_act": self.dsha,
                       "backward/d_shared_w_down": self.dswd, "backward/d_shared_h_gate": self.dshg,
                       "backward/d_shared_h_up": self.dshu, "backward/d_shared_w_gate": self.dswg,
                       "backward/d_shared_w_up": self.dswu})
            if self.gated:
                st.update({"backward/d_shared_gate": self.dsg, "backward/d_shared_gate_logit": self.dsgl,
                           "backward/d_shared_gate_weight": self.dsgw})
        if hasattr(self, "d_x"):
            st.update({
                "backward/d_topk_weights": self.d_topk_weights, "backward/d_y_sorted": self.dy,
                "backward/d_h_act": self.dha, "backward/d_w_down": self.d_w_down,
                "backward/d_h_gate": self.dhg, "backward/d_h_up": self.dhu,
                "backward/d_x_sorted": self.dxs, "backward/d_w_gate": self.d_w_gate,
                "backward/d_w_up": self.d_w_up, "backward/d_router_scores": self.d_router_scores,
                "backward/d_router_logits": self.d_router_logits,
                "backward/d_router_weight": self.d_router_weight, "backward/d_x": self.d_x,
            })
        return st


def bf16_type():
    """An HDF5 2-byte bf16 float type (8 exponent, 7 significand bits)."""
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_fields(15, 7, 8, 0, 7)
    t.set_offset(0)
    t.set_precision(16)
    t.set_size(2)
    t.set_ebias(127)
    return t


def write_bf16(f, name, v):
    """Dataset name holding the bf16 values v (float32 on the bf16 grid) as
    2-byte bf16 elements: the top half of each float32."""
    raw = np.ascontiguousarray((np.ascontiguousarray(v, F32).view(np.uint32) >> 16).astype(np.uint16))
    grp = f.require_group(name.rsplit("/", 1)[0])
    t = bf16_type()
    sp = h5py.h5s.create_simple(raw.shape)
    ds = h5py.h5d.create(grp.id, name.rsplit("/", 1)[1].encode(), t, sp)
    ds.write(h5py.h5s.ALL, h5py.h5s.ALL, raw, mtype=t)


def write(path, stages, backend, mode, keep=None, attrs=None, dtypes=None, as_type=None):
    """A candidate file holding the stages named in keep (None: all);
    dtypes: dtype attributes by stage name; as_type: "float64", "float16" or
    "bf16" storage of the float stages (default float32)."""
    with h5py.File(path, "w") as f:
        f.attrs["backend"] = backend
        f.attrs["compute_mode"] = mode
        for k_, v in (attrs or {}).items():
            f.attrs[k_] = v
        for name, v in stages.items():
            stage = name.split("/")[1]
            if keep is not None and stage not in keep:
                continue
            if as_type == "bf16" and v.dtype == F32:
                write_bf16(f, name, v)
                continue
            if as_type and v.dtype == F32:
                v = v.astype(as_type)
            d = f.create_dataset(name, data=v)
            if dtypes and stage in dtypes:
                d.attrs["dtype"] = dtypes[stage]


def capacity_keep(z, E, cf):
    """Switch-style capacity: each expert keeps its first C = ceil(cf T k / E)
    assignments in token order, the rest are dropped."""
    ids = z["topk_ids"].astype(np.int64)
    T, k = ids.shape
    C = int(np.ceil(cf * T * k / E))
    keep = np.ones((T, k), bool)
    count = np.zeros(E, np.int64)
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            keep[t, j] = count[e] < C
            count[e] += 1
    return keep


def isolated(path_golden, ri=None):
    """Every stage computed from the golden's own upstream values (what a
    stage-by-stage harness does, e.g. torch._grouped_mm fed each stage's
    golden inputs), in fp32: the values a candidate without the
    isolated_groups attribute holds. Returns the stages by dataset path."""
    c, z = load(path_golden)
    g = z["golden"]
    G = {k_: g["forward/" + k_][...] for k_ in g["forward"]}
    if "backward" in g:
        G.update({k_: g["backward/" + k_][...] for k_ in g["backward"]})
    ri = ri or (lambda a: a)
    mm = lambda a, b: (ri(a) @ ri(b)).astype(F32)  # noqa: E731
    off = G["group_offsets"]
    E = int(c["experts"])
    st = {}
    hg, hu, y, dha, dxs = (np.empty_like(G[n]) for n in ("h_gate", "h_up", "y_sorted", "d_h_act", "d_x_sorted"))
    dwg, dwu, dwd = (np.zeros_like(z[n]) for n in ("w_gate", "w_up", "w_down"))
    for e in range(E):
        a, b = off[e], off[e + 1]
        hg[a:b] = mm(G["x_sorted"][a:b], z["w_gate"][e])
        hu[a:b] = mm(G["x_sorted"][a:b], z["w_up"][e])
        y[a:b] = mm(G["h_act"][a:b], z["w_down"][e])
        dha[a:b] = mm(G["d_y_sorted"][a:b], z["w_down"][e].T)
        dxs[a:b] = mm(G["d_h_gate"][a:b], z["w_gate"][e].T) + mm(G["d_h_up"][a:b], z["w_up"][e].T)
        dwg[e] = mm(G["x_sorted"][a:b].T, G["d_h_gate"][a:b])
        dwu[e] = mm(G["x_sorted"][a:b].T, G["d_h_up"][a:b])
        dwd[e] = mm(G["h_act"][a:b].T, G["d_y_sorted"][a:b])
    st["forward/h_gate"], st["forward/h_up"], st["forward/y_sorted"] = hg, hu, y
    st["forward/h_act"] = swiglu(G["h_gate"], G["h_up"]).astype(F32)
    st["backward/d_h_act"], st["backward/d_x_sorted"] = dha, dxs
    st["backward/d_w_gate"], st["backward/d_w_up"], st["backward/d_w_down"] = dwg, dwu, dwd
    return st
