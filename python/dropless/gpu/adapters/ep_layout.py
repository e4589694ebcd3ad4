"""Expert-parallel dispatch layout with PyTorch on the device: DeepEP's
get_dispatch_layout outputs and the all-to-all counts, displacements and
receive order of the `/ep/ranks_R` golden group (doc/format.md), computed the
way DeepEP's tests/test_intranode.py builds its reference: tensor operations
on the device (one-hot, bincount, cumsum, scatter), no host loop over
tokens. Writes, per golden file, one candidate holding `/ep/ranks_R` in the
whole form for every R in --ranks that divides E, and one "rank view"
candidate per rank r (`/ep/ranks_R` with attribute `rank` = r for every R > r:
what rank r's process holds), for `dropless check GOLDEN CANDIDATE`.

Usage: python3 -m dropless.gpu.adapters.ep_layout GOLDEN... -o DIR [--device cuda]
           [--ranks 2,4,8,32] [--summary FILE]
"""

import json
import os
import sys
import time
import traceback

import numpy as np

try:
    import torch
except ImportError:  # importable without torch; main() says why
    torch = None

RANKS = (2, 4, 8, 32)
BACKEND = "torch-ep_layout"
# /ep/ranks_R's datasets: name -> (numpy type, dtype attribute), whole form
# and rank view (EP_SPEC.md, doc/format.md); booleans are stored as uint8.
WHOLE = {
    "num_tokens_per_rank": (np.int64, "int64"), "num_tokens_per_expert": (np.int64, "int64"),
    "is_token_in_rank": (np.uint8, "bool"), "send_counts": (np.int64, "int64"),
    "send_displs": (np.int64, "int64"), "recv_displs": (np.int64, "int64"),
    "send_expert_counts": (np.int64, "int64"), "recv_offsets": (np.int64, "int64"),
    "recv_token": (np.int32, "int32"), "recv_topk_idx": (np.int32, "int32"),
    "recv_topk_weights": (np.float32, "fp32"),
}
VIEW = {n: WHOLE[n] for n in ("num_tokens_per_rank", "num_tokens_per_expert", "is_token_in_rank",
                              "recv_token", "recv_topk_idx", "recv_topk_weights")}
VIEW["recv_counts"] = (np.int64, "int64")


def token_bounds(T, R):
    """[R+1] first token of each source rank: floor(s T / R) (the even split)."""
    return [s * T // R for s in range(R + 1)]


def source_rank(T, R, device):
    """[T] int64: the source rank of each token (bucket of the even split)."""
    hi = torch.tensor(token_bounds(T, R)[1:], dtype=torch.int64, device=device)
    return torch.searchsorted(hi, torch.arange(T, device=device), right=True)


def exclusive(x, dim):
    return torch.cumsum(x, dim) - x


def local_layout(ids, E, R):
    """DeepEP's get_dispatch_layout on one rank's tokens: ids [n, k] global
    expert ids -> (rank_of [n, k], in_rank [n, R] bool, num_tokens_per_rank
    [R], num_tokens_per_expert [E]), all on ids' device."""
    n, k = ids.shape
    rank_of = torch.div(ids.long(), E // R, rounding_mode="floor")
    onehot = torch.nn.functional.one_hot(rank_of, R) if n else \
        torch.zeros((0, k, R), dtype=torch.int64, device=ids.device)
    in_rank = onehot.amax(dim=1).bool() if k else torch.zeros((n, R), dtype=torch.bool,
                                                             device=ids.device)
    per_rank = in_rank.long().sum(0)
    per_expert = torch.bincount(ids.reshape(-1).long(), minlength=E)
    return rank_of, in_rank, per_rank, per_expert


def receive_rows(ids, weights, rank_of, in_rank, tokens, E, R):
    """The rows every destination receives from these tokens, flattened in
    the canonical order (destination, then token ascending: the sources are
    contiguous token ranges, so by source then token): returns (recv_offsets
    [R+1], recv_token [N], recv_topk_idx [N, k] local ids or -1,
    recv_topk_weights [N, k]). One host read: N, to size the arrays."""
    n, k = ids.shape
    dev = ids.device
    per_rank = in_rank.long().sum(0)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), torch.cumsum(per_rank, 0)])
    N = int(offsets[-1])
    # row of (token i, destination r): offsets[r] + rows of r before token i;
    # pairs not sent go to a spill row N, cut off below
    pos = offsets[:-1].unsqueeze(0) + exclusive(in_rank.long(), 0)
    pos = torch.where(in_rank, pos, torch.full_like(pos, N)).reshape(-1)
    here = rank_of.unsqueeze(1) == torch.arange(R, device=dev).view(1, R, 1)  # [n, R, k]
    lo = (torch.arange(R, device=dev) * (E // R)).view(1, R, 1)
    idx = torch.where(here, ids.long().unsqueeze(1) - lo, torch.full_like(here, -1, dtype=torch.long))
    wts = torch.where(here, weights.unsqueeze(1), torch.zeros((), dtype=weights.dtype, device=dev))
    tok = tokens.long().view(n, 1).expand(n, R).reshape(-1)
    r_token = torch.zeros(N + 1, dtype=torch.int64, device=dev).scatter_(0, pos, tok)[:N]
    r_idx = torch.zeros((N + 1, k), dtype=torch.int64, device=dev).index_copy_(
        0, pos, idx.reshape(n * R, k))[:N]
    r_w = torch.zeros((N + 1, k), dtype=weights.dtype, device=dev).index_copy_(
        0, pos, wts.reshape(n * R, k))[:N]
    return offsets, r_token.int(), r_idx.int(), r_w


def layout(topk_ids, topk_weights, E, R):
    """The whole `/ep/ranks_R` group of all T tokens, as device tensors."""
    if E % R:
        raise ValueError("R = %d does not divide E = %d" % (R, E))
    T, k = topk_ids.shape
    dev = topk_ids.device
    rank_of, in_rank, per_rank, per_expert = local_layout(topk_ids, E, R)
    src = source_rank(T, R, dev)
    send = torch.zeros((R, R), dtype=torch.int64, device=dev).index_add_(0, src, in_rank.long())
    sec = torch.bincount((src.unsqueeze(1) * E + topk_ids.long()).reshape(-1),
                         minlength=R * E).view(R, E)
    offsets, r_token, r_idx, r_w = receive_rows(topk_ids, topk_weights.float(), rank_of, in_rank,
                                                torch.arange(T, device=dev), E, R)
    return {"num_tokens_per_rank": per_rank, "num_tokens_per_expert": per_expert,
            "is_token_in_rank": in_rank, "send_counts": send, "send_displs": exclusive(send, 1),
            "recv_displs": exclusive(send, 0).t(), "send_expert_counts": sec,
            "recv_offsets": offsets, "recv_token": r_token, "recv_topk_idx": r_idx,
            "recv_topk_weights": r_w}


def rank_view(whole, r, T, R):
    """What rank r's process holds, cut from a whole layout (host arrays)."""
    b = token_bounds(T, R)
    o = whole["recv_offsets"]
    rows = slice(int(o[r]), int(o[r + 1]))
    return {"num_tokens_per_rank": whole["send_counts"][r],
            "num_tokens_per_expert": whole["send_expert_counts"][r],
            "is_token_in_rank": whole["is_token_in_rank"][b[r]:b[r + 1]],
            "recv_counts": whole["send_counts"][:, r],
            "recv_token": whole["recv_token"][rows], "recv_topk_idx": whole["recv_topk_idx"][rows],
            "recv_topk_weights": whole["recv_topk_weights"][rows]}


def to_host(arrays, table):
    """Device tensors -> numpy arrays of the group's storage types."""
    out = {}
    for n, x in arrays.items():
        if torch is not None and isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
        out[n] = np.ascontiguousarray(np.asarray(x).astype(table[n][0]))
    return out


# ------------------------------------------------------------- golden files

def load_golden(path):
    """(golden, how it was read): the package's loader, or h5io's where the
    package's library cannot load."""
    from . import h5io
    return h5io.load(path)


def write_candidate(path, g, groups, outputs=None, **attrs):
    """Writes a candidate: outputs (stage -> array) and root attributes
    through the package (h5io's writer where it cannot load), then the /ep
    groups with h5py: groups = [(R, arrays, rank or None)]. Temporary name,
    then rename."""
    import h5py
    from . import h5io
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        h5io.write_candidate(tmp, outputs or {}, g, force=True, **attrs)
        with h5py.File(tmp, "r+") as f:
            ep = f.require_group("ep")
            for R, arrays, rank in groups:
                grp = ep.create_group("ranks_%d" % R)
                grp.attrs["ranks"] = np.int64(R)
                grp.attrs["experts_per_rank"] = np.int64(g.dims["E"] // R)
                if rank is not None:
                    grp.attrs["rank"] = np.int64(rank)
                table = VIEW if rank is not None else WHOLE
                for n, a in arrays.items():
                    ds = grp.create_dataset(n, data=a)
                    ds.attrs["dtype"] = np.bytes_(table[n][1].encode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def device_name(dev):
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform
    return "cpu (%s)" % (platform.processor() or platform.machine())


def file_name(case, backend, mode):
    s = "%s--%s--%s" % (case, backend, mode)
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in s) + ".h5"


def run(golden_path, outdir, ranks=RANKS, device=None, log=print):
    """Whole and rank-view layout candidates of one golden file: returns a
    list of summary dicts (one per file written, or one error)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    g, how = load_golden(golden_path)
    with g:
        E, T = g.dims["E"], g.dims["T"]
        Rs = [R for R in ranks if E % R == 0]
        ids = torch.from_numpy(np.ascontiguousarray(g.array("topk_ids"))).to(dev)
        w = torch.from_numpy(np.ascontiguousarray(g.array("topk_weights"))).to(dev)
        whole, secs = {}, {}
        if Rs:  # the first call pays for kernel loading and allocator warm-up
            layout(ids, w, E, Rs[0])
        for R in Rs:
            t0 = time.time()
            lay = layout(ids, w, E, R)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            secs[R] = time.time() - t0
            whole[R] = to_host(lay, WHOLE)
        attrs = {"backend": BACKEND, "backend_version": "torch %s" % torch.__version__,
                 "device": device_name(dev)}
        base = {"case": g.case, "backend": BACKEND, "device": attrs["device"], "golden_read_by": how,
                "ranks": Rs, "seconds": {str(R): round(s, 6) for R, s in secs.items()}}
        out = []
        p = write_candidate(os.path.join(outdir, file_name(g.case, BACKEND, "whole")), g,
                            [(R, whole[R], None) for R in Rs], **attrs)
        out.append(dict(base, mode="whole", file=os.path.basename(p)))
        for r in range(max(Rs, default=0)):
            groups = [(R, to_host(rank_view(whole[R], r, T, R), VIEW), r) for R in Rs if r < R]
            p = write_candidate(os.path.join(outdir, file_name(g.case, BACKEND, "rank%d" % r)), g,
                                groups, **attrs)
            out.append(dict(base, mode="rank%d" % r, file=os.path.basename(p),
                            ranks=[R for R in Rs if r < R]))
        log("%-26s %-18s R = %s, %d files, layout %s s" % (
            g.case, BACKEND, ",".join(map(str, Rs)) or "none (no R divides E)", len(out),
            " ".join("%.2g" % s for s in secs.values())))
    return out


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("golden", nargs="+")
    ap.add_argument("-o", "--outdir", default=".")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: the GPU if any)")
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)),
                    help="R values; those not dividing E are skipped")
    ap.add_argument("--summary", help="append one JSON line per file (or error) to this file")
    a = ap.parse_args(argv)
    if torch is None:
        print("ep_layout: PyTorch is not installed", file=sys.stderr)
        return 2
    ranks = [int(x) for x in a.ranks.split(",") if x]
    if any(R < 1 for R in ranks):
        print("ep_layout: --ranks: every R must be >= 1", file=sys.stderr)
        return 2
    os.makedirs(a.outdir, exist_ok=True)
    rc, lines = 0, []
    for p in a.golden:
        try:
            lines += run(p, a.outdir, ranks, a.device)
        except Exception as e:  # one bad file must not stop the others
            traceback.print_exc()
            lines.append({"golden": p, "error": "%s: %s" % (type(e).__name__, e),
                          "traceback": traceback.format_exc()})
            rc = 1
    if a.summary:
        with open(a.summary, "a") as fh:
            for s in lines:
                fh.write(json.dumps(s) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
