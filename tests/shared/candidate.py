"""Candidates of a shared-experts golden for tests/test_shared_check.sh.

usage: candidate.py GOLDEN CANDIDATE MODE

Writes CANDIDATE, a copy of GOLDEN changed as MODE says:
  full        every value as the golden has it (a correct candidate)
  fused       out and d_x only (a fused kernel's candidate)
  fused-torch out and d_x only, out recomputed as PyTorch's eager blocks do
              it: the routed combine and the (gated) shared output each
              rounded to the case's dtype, then added and rounded again
              (correct; bf16/fp16 need ml_dtypes)
  no-shared   fused, out without the shared experts' term (a kernel that
              forgot the shared expert: defective)
  ungated     fused, the shared term added unscaled (a wrong gate)
  gate-sign   every value, shared_gate = sigmoid(-logit) (a wrong gate stage)
  drop-slot   fused, token 3's first routed slot removed from out
  dx-no-shared fused, d_x without the shared path's gradient (defective)
  gate-grad-torch  every value but d_shared_gate_logit and
              d_shared_gate_weight, d_shared_gate as PyTorch's VJP of the
              broadcast product computes it: each d_out_i * shared_y_i
              rounded to the case's dtype, then summed (correct under the
              -acc profiles; needs ml_dtypes for bf16/fp16)
  gate-grad-over   the same, 32 u_act sum_i |d_out_i shared_y_i| above it
              (far beyond one rounding per product: defective under every profile)
  topk-grad-torch, topk-grad-over  the same for the combine's weight
              gradient d_topk_weights[t, j] = <d_out[t], y_sorted[inv_perm[t k + j]]>
              (PyTorch's VJP of w * y), its downstream router gradients and
              d_x left out
  shared-y-torch, shared-y-over  d_shared_y = d_out * the gate, as
              PyTorch's VJP of Qwen2-MoE's sigmoid(gate) * shared_y
              computes it: the saved gate rounded to the case's type, the
              product rounded (correct under the -acc profiles), and 32
              u_act |d_shared_y| more (defective); shared_gate absent
"""
import shutil
import sys

import h5py
import numpy as np


def act_type(name):
    if name == "fp32":
        return np.float32
    if name == "fp16":
        return np.float16
    import ml_dtypes
    return ml_dtypes.bfloat16


def main():
    src, dst, mode = sys.argv[1:4]
    shutil.copy(src, dst)
    with h5py.File(src, "r") as g, h5py.File(dst, "r+") as f:
        fw = lambda n: g["/forward/" + n][...].astype(np.float64)
        y, sy = fw("y_sorted"), fw("shared_y")
        w, inv = fw("topk_weights"), g["/forward/inv_perm"][...]
        gate = fw("shared_gate")[:, None] if "shared_gate" in g["/forward"] else 1.0
        T, k = w.shape
        routed = np.zeros_like(sy)
        for j in range(k):
            routed += w[:, j:j + 1] * y[inv.reshape(T, k)[:, j]]
        if mode in ("gate-grad-torch", "gate-grad-over"):
            stored_dot(g, f, sy, "d_shared_gate", mode.endswith("over"),
                       ("d_shared_gate_logit", "d_shared_gate_weight"))
            return
        if mode in ("topk-grad-torch", "topk-grad-over"):
            # the slot's row of y_sorted beside its token's d_out: [T, k, d]
            ys = y[inv.reshape(T, k)]
            stored_dot(g, f, ys, "d_topk_weights", mode.endswith("over"),
                       ("d_router_scores", "d_router_logits", "d_router_weight", "d_x"),
                       d_out=g["/inputs/d_out"][...].astype(np.float64)[:, None, :])
            return
        if mode in ("shared-y-torch", "shared-y-over"):
            stored_gate(g, f, gate, mode.endswith("over"))
            return
        if mode == "gate-sign":
            logit = g["/forward/shared_gate_logit"][...].astype(np.float64)
            f["/forward/shared_gate"][...] = (1.0 / (1.0 + np.exp(logit))).astype(np.float32)
        if mode in ("full", "gate-sign"):
            return
        for grp in ("forward", "backward"):
            for n in list(f[grp].keys()):
                if (grp, n) not in (("forward", "out"), ("backward", "d_x")):
                    del f[grp][n]
        out = None
        if mode == "fused-torch":
            act = act_type(g["config"].attrs["dtype"].decode())
            out = (routed.astype(act).astype(np.float64) +
                   (gate * sy).astype(act).astype(np.float64)).astype(act)
        elif mode == "no-shared":
            out = routed
        elif mode == "ungated":
            out = routed + sy
        elif mode == "drop-slot":
            out = routed + gate * sy
            out[3] -= w[3, 0] * y[inv[3 * k]]
        if out is not None:
            f["/forward/out"][...] = np.asarray(out, np.float32)
        if mode == "dx-no-shared":
            bw = lambda n: g["/backward/" + n][...].astype(np.float64)
            inp = lambda n: g["/inputs/" + n][...].astype(np.float64)
            dx = bw("d_x") - bw("d_shared_h_up") @ inp("shared_w_up").T
            if "d_shared_h_gate" in g["/backward"]:  # a gated FFN's (relu2: none)
                dx -= bw("d_shared_h_gate") @ inp("shared_w_gate").T
            if "d_shared_gate_logit" in g["/backward"]:
                dx -= np.outer(bw("d_shared_gate_logit"), inp("shared_gate_weight"))
            f["/backward/d_x"][...] = dx.astype(np.float32)


def stored_gate(g, f, gate, over):
    """Writes backward/d_shared_y = RN_act(d_out * RN_act(shared_gate)) (the
    gate autograd saved, stored in the case's type), 32 u_act |d_shared_y|
    more when over; shared_gate absent (transformers does not expose it),
    and the values computed from d_shared_y left out."""
    act = g["config"].attrs["dtype"].decode()
    rnd = lambda a: a.astype(act_type(act)).astype(np.float64)
    dy = rnd(g["/inputs/d_out"][...].astype(np.float64) * rnd(gate))
    if over:
        dy = rnd(dy + 32 * {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}[act] * np.abs(dy))
    f["/backward/d_shared_y"][...] = dy.astype(np.float32)
    del f["/forward/shared_gate"]
    keep = ("d_shared_y", "d_shared_gate", "d_shared_gate_logit", "d_shared_gate_weight")
    for n in list(f["backward"].keys()):
        if n == "d_x" or (n.startswith("d_shared_") and n not in keep):
            del f["/backward/" + n]


def stored_dot(g, f, y, name, over, drop, d_out=None):
    """Writes backward/name = sum_i RN_act(d_out_i * y_i) (the products
    stored in the case's type, then summed), 32 u_act sum_i |d_out_i y_i|
    more when over; deletes the values computed from it (drop)."""
    act = g["config"].attrs["dtype"].decode()
    if d_out is None:
        d_out = g["/inputs/d_out"][...].astype(np.float64)
    prods = d_out * y
    dg = prods.astype(act_type(act)).astype(np.float64).sum(-1)
    if over:
        u = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}[act]
        dg += 32 * u * np.abs(prods).sum(-1)
    f["/backward/" + name][...] = dg.astype(np.float32)
    for n in drop:
        if n in f["backward"]:
            del f["/backward/" + n]


if __name__ == "__main__":
    main()
