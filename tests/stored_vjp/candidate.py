"""Candidates of a softmax_topk golden (gpt-oss-full-bf16) for
tests/test_stored_vjp.sh: the router's gradient as autograd computes it.

usage: candidate.py GOLDEN CANDIDATE MODE

Writes CANDIDATE, a copy of GOLDEN whose d_router_logits is the softmax
VJP over each token's top-k logits, d_l_j = p_j (g_j - sum_i p_i g_i)
(g = d_topk_weights), as MODE says, beside the router's logits and weights
stored in the case's type (router_scores not exposed); d_router_scores (the same values in
the schedule: absent, as transformers exposes it) and everything computed
from d_router_logits (d_router_weight, d_router_bias, d_x) are left out:
  torch  p the saved softmax output rounded to the case's type, the result
         rounded to it too (PyTorch's _softmax_backward_data(g, p) on bf16
         tensors, gpt-oss's router): correct under the -acc profiles
  over   the same, 32 u_act M above it, M = p_j (|g_j| + sum_i p_i |g_i|)
         (1 + |l_j - m| + sum_i p_i |l_i - m|) the stage's magnitude: far
         beyond the one rounding of each stored p_i (defective)
needs h5py, numpy and ml_dtypes.
"""
import shutil
import sys

import h5py
import ml_dtypes
import numpy as np

TYPES = {"bf16": (ml_dtypes.bfloat16, 2.0**-8), "fp16": (np.float16, 2.0**-11)}


def main():
    src, dst, mode = sys.argv[1:4]
    shutil.copy(src, dst)
    with h5py.File(src, "r") as g, h5py.File(dst, "r+") as f:
        act, u = TYPES[g["config"].attrs["dtype"].decode()]
        rnd = lambda a: a.astype(act).astype(np.float64)
        ids = g["/forward/topk_ids"][...]
        logits = rnd(g["/forward/router_logits"][...].astype(np.float64))
        logit = np.take_along_axis(logits, ids, 1)
        p = np.exp(logit - logit.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        ps = rnd(p)
        # the router's forward as the framework stores it: logits and
        # weights in the case's type (router_scores, the logits themselves,
        # not exposed)
        f["/forward/router_logits"][...] = logits.astype(np.float32)
        f["/forward/topk_weights"][...] = ps.astype(np.float32)
        del f["/forward/router_scores"]
        dw = g["/backward/d_topk_weights"][...].astype(np.float64)
        ds = ps * (dw - (ps * dw).sum(1, keepdims=True))
        dl = np.zeros(g["/backward/d_router_logits"].shape)
        if mode == "over":
            z = np.abs(logit - logit.max(1, keepdims=True))
            M = p * (np.abs(dw) + (p * np.abs(dw)).sum(1, keepdims=True)) * \
                (1.0 + z + (p * z).sum(1, keepdims=True))
            ds += 32 * u * M
        np.put_along_axis(dl, ids, rnd(ds), 1)
        f["/backward/d_router_logits"][...] = dl.astype(np.float32)
        for n in ("d_router_scores", "d_router_weight", "d_router_bias", "d_x"):
            if n in f["backward"]:
                del f["/backward/" + n]


if __name__ == "__main__":
    main()
