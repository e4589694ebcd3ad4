#!/usr/bin/env python3
"""Expert-parallel MoE forward over R processes, one per GPU (or CPU
processes with gloo), on a golden file's inputs: DeepEP's contract with
torch.distributed.all_to_all_single in place of DeepEP's kernels.

    python3 -m dropless.gpu.ep_dispatch GOLDEN.h5 --ranks R -o DIR [--device cuda|cpu]

Rank r holds the weights of experts [r E/R, (r+1) E/R) and the tokens
[floor(r T/R), floor((r+1) T/R)) (the even split of doc/format.md's
`/ep/ranks_R`). Each rank:
  1. computes its dispatch layout on the device (python/dropless/gpu/adapters/ep_layout:
     is_token_in_rank, tokens per rank and per expert, its send buffer in
     the canonical order);
  2. exchanges the counts (rows per destination and pairs per local expert)
     in one all_to_all_single and reads them to the host (.tolist()): the
     split sizes all_to_all_single takes are Python lists, so this one
     device-to-host round trip is inherent (DeepEP too reads the received
     counts to the host); it is timed and reported;
  3. sends its token rows (one copy per destination rank, not per slot),
     their token ids, local expert ids (-1 for slots of other ranks) and
     weights with all_to_all_single;
  4. runs its experts on the received (row, slot) pairs with
     torch._grouped_mm (a per-expert torch.mm loop where rows are not
     16-byte aligned), weights and sums each row's slots in fp32;
  5. sends the partial sums back (fp32) and adds each token's parts from
     every destination in fp32, rounded once to the case's dtype.
Every rank writes its rank-view layout candidate (`/ep/ranks_R` with
attribute `rank`, from the exchanged data); the parent then writes the whole
candidate: `/ep/ranks_R` in the whole form assembled from the ranks, and
x_sorted, h_gate, h_up, h_act, y_sorted, group_sizes and out in the golden's
sorted order, for `dropless check GOLDEN CANDIDATE`. Forward only.

NCCL on CUDA (NVLink multicast kept off: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1), gloo on the
CPU. A world of one works (one GPU). Steps that fail are recorded in the
summary JSON (DIR/CASE--ep_dispatch_R.json) with their error, never hidden.
"""

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import traceback

import numpy as np

from .adapters import ep_layout

try:
    import torch
    import torch.distributed as dist
except ImportError:
    torch = None

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
TDT = {}
if torch is not None:
    TDT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PAIR_STAGES = ("x_sorted", "h_gate", "h_up", "h_act", "y_sorted")


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(dev, fn, collective=True):
    """(result, seconds) of fn() between device synchronisations; for a
    collective, after a barrier, so that the time is the exchange's and not
    the wait for the slowest rank to arrive."""
    _sync(dev)
    if collective:
        dist.barrier()
    t0 = time.perf_counter()
    r = fn()
    _sync(dev)
    return r, time.perf_counter() - t0


def a2a(out_shape, x, send, recv):
    """all_to_all_single of x's rows: send[i] rows to rank i, recv[i] from i."""
    out = x.new_empty((sum(recv),) + tuple(out_shape))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send)
    return out


class Rank:
    """One rank's state: its tokens, experts and the golden arrays it needs."""

    def __init__(self, g, rank, R, dev):
        self.g, self.rank, self.R, self.dev = g, rank, R, dev
        T, self.d, self.E, self.k = g.dims["T"], g.dims["d"], g.dims["E"], g.dims["k"]
        self.El = self.E // R
        b = ep_layout.token_bounds(T, R)
        self.t0, self.t1 = b[rank], b[rank + 1]
        self.dt = TDT[g.config["dtype"]]
        lo, hi = rank * self.El, (rank + 1) * self.El
        A = lambda name, sl: torch.from_numpy(np.ascontiguousarray(g.array(name)[sl])).to(dev)
        self.ids = A("topk_ids", slice(self.t0, self.t1))
        self.w = A("topk_weights", slice(self.t0, self.t1)).float()
        self.x = A("x", slice(self.t0, self.t1)).to(self.dt)
        self.swiglu = g.config["ffn_kind"] == "swiglu"
        names = ("w_gate", "w_up", "w_down") if self.swiglu else ("w_down",)
        self.W = {n: A(n, slice(lo, hi)).to(self.dt) for n in names}

    def layout(self):
        """The device-side layout of this rank's tokens and its send buffer."""
        rank_of, in_rank, per_rank, per_expert = ep_layout.local_layout(self.ids, self.E, self.R)
        tokens = torch.arange(self.t0, self.t1, device=self.dev)
        offs, s_tok, s_idx, s_w = ep_layout.receive_rows(self.ids, self.w, rank_of, in_rank, tokens,
                                                         self.E, self.R)
        return {"in_rank": in_rank, "per_rank": per_rank, "per_expert": per_expert,
                "send_offsets": offs, "send_token": s_tok, "send_idx": s_idx, "send_w": s_w}

    def counts(self, lay):
        """One exchange of [rows, pairs per local expert] per destination and
        the host read of the split sizes: (send list, recv list, [R, El]
        received pair counts on the host)."""
        msg = torch.cat([lay["per_rank"].view(self.R, 1),
                         lay["per_expert"].view(self.R, self.El)], 1).contiguous()
        got = torch.empty_like(msg)
        dist.all_to_all_single(got, msg)
        send = lay["per_rank"].tolist()
        got_h = got.tolist()
        return send, [r[0] for r in got_h], [r[1:] for r in got_h]

    def experts(self, rx, ridx, sizes):
        """Every received (row, slot) pair through its local expert, in
        expert order (stable in row, slot): (pair rows [M], pair slots [M],
        {stage: [M, .]})."""
        from .adapters.torch_adapter import GMM
        N, k = ridx.shape
        key = torch.where(ridx >= 0, ridx.long(), torch.full_like(ridx, self.El, dtype=torch.long))
        order = torch.argsort(key.reshape(-1), stable=True)
        M = sum(sizes)
        pair = order[:M]
        row, slot = torch.div(pair, k, rounding_mode="floor"), pair % k
        offs = torch.tensor(np.cumsum(sizes, dtype=np.int64), dtype=torch.int32, device=self.dev)
        gm = GMM(self.dt, self.d, self.g.dims["f"], self.dev)
        v = {"x_sorted": rx[row]}
        if M == 0:  # nothing received: no kernel call on empty operands
            f = self.g.dims["f"]
            z = lambda n: rx.new_zeros((0, n))
            v.update({"h_gate": z(f), "h_up": z(f), "h_act": z(f)} if self.swiglu else {})
            v["y_sorted"] = z(self.d)
        elif self.swiglu:
            v["h_gate"] = gm(v["x_sorted"], self.W["w_gate"], sizes, offs)
            v["h_up"] = gm(v["x_sorted"], self.W["w_up"], sizes, offs)
            v["h_act"] = torch.nn.functional.silu(v["h_gate"]) * v["h_up"]
            v["y_sorted"] = gm(v["h_act"], self.W["w_down"], sizes, offs)
        else:
            v["y_sorted"] = gm(v["x_sorted"], self.W["w_down"], sizes, offs)
        return row, slot, v, gm.kernel

    def combine_rows(self, N, row, slot, y, rw):
        """[N, d] fp32: each received row's weighted slots, summed in slot
        order (each (row, slot) is written once, so no atomics)."""
        part = torch.zeros((N, self.k, self.d), dtype=torch.float32, device=self.dev)
        if row.numel():
            part[row, slot] = y.float() * rw[row, slot].unsqueeze(1)
        return part.sum(1)

    def combine_tokens(self, back, lay):
        """[T_r, d] in the case dtype: each token's parts from every
        destination, summed in destination order in fp32, rounded once."""
        n = self.t1 - self.t0
        part = torch.zeros((n, self.R, self.d), dtype=torch.float32, device=self.dev)
        dest = torch.repeat_interleave(torch.arange(self.R, device=self.dev), lay["per_rank"])
        if back.shape[0]:
            part[lay["send_token"].long() - self.t0, dest] = back
        return part.sum(1).to(self.dt)


def forward(st, iters):
    """One rank's expert-parallel forward: (host arrays, timings, notes)."""
    dev = st.dev
    tm = {}
    lay, tm["layout_s"] = _timed(dev, st.layout, collective=False)
    (send, recv, pairs), tm["counts_roundtrip_s"] = _timed(dev, lambda: st.counts(lay))
    k = st.k
    xs = st.x[lay["send_token"].long() - st.t0]

    def dispatch():
        return (a2a((st.d,), xs, send, recv),
                a2a((), lay["send_token"].long(), send, recv),
                a2a((k,), lay["send_idx"].long(), send, recv),
                a2a((k,), lay["send_w"], send, recv))
    (rx, rtok, ridx, rw), tm["dispatch_s"] = _timed(dev, dispatch)
    # the rows alone, repeated: the exchange time that scales with d
    reps = []
    for _ in range(iters):
        reps.append(_timed(dev, lambda: a2a((st.d,), xs, send, recv))[1])
    tm["dispatch_rows_s"] = sorted(reps)
    sizes = [int(sum(c[e] for c in pairs)) for e in range(st.El)]
    (row, slot, v, kernel), tm["experts_s"] = _timed(dev, lambda: st.experts(rx, ridx, sizes),
                                                      collective=False)
    contrib = st.combine_rows(rx.shape[0], row, slot, v["y_sorted"], rw)
    back, tm["combine_exchange_s"] = _timed(dev, lambda: a2a((st.d,), contrib, recv, send))
    out = st.combine_tokens(back, lay)
    _sync(dev)
    h = lambda t: t.detach().cpu()
    res = {"rank_view": {
        "num_tokens_per_rank": h(lay["per_rank"]), "num_tokens_per_expert": h(lay["per_expert"]),
        "is_token_in_rank": h(lay["in_rank"]), "recv_counts": torch.tensor(recv),
        "recv_token": h(rtok), "recv_topk_idx": h(ridx), "recv_topk_weights": h(rw)},
        "out": h(out).float().numpy(),
        # global flat index t k + j of each pair: where the parent puts it
        "pair_flat": (h(rtok)[h(row)].long() * k + h(slot)).numpy(),
        "pairs": {n: h(x).float().numpy() for n, x in v.items()},
        "group_sizes": np.asarray(sizes, dtype=np.int64)}
    notes = {"kernel": kernel, "send_rows": send, "recv_rows": recv, "pairs": sum(sizes),
             "row_bytes": st.d * st.x.element_size()}
    return res, tm, notes


def one_file(path, rank, R, dev, args, tmp, i):
    """One golden file on this rank: forward, its rank-view candidate, and
    the arrays the parent assembles (tmp/rankR-I.npz). Returns its info."""
    info = {"rank": rank}
    g, how = ep_layout.load_golden(path)
    with g:
        st = Rank(g, rank, R, dev)
        res, tm, notes = forward(st, args.iters)
        info.update(timings=tm, notes=notes, golden_read_by=how)
        view = ep_layout.to_host(res["rank_view"], ep_layout.VIEW)
        name = ep_layout.file_name(g.case, "torch-ep_dispatch[R=%d]" % R, "rank%d" % rank)
        ep_layout.write_candidate(os.path.join(args.outdir, name), g, [(R, view, rank)],
                                  backend="torch-ep_dispatch[R=%d]" % R,
                                  backend_version="torch %s" % torch.__version__,
                                  device=ep_layout.device_name(dev))
        info["file"] = name
    np.savez(os.path.join(tmp, "rank%d-%d.npz" % (rank, i)), out=res["out"],
             pair_flat=res["pair_flat"], group_sizes=res["group_sizes"],
             **{"pair_" + n: a for n, a in res["pairs"].items()},
             **{"view_" + n: a for n, a in view.items()})
    return info


def worker(rank, R, args, port, tmp):
    """One process: init once, then every golden file in turn (one result
    file each, tmp/rankR-I.json). A file that fails on this rank ends its
    loop: the peers' next collective fails or times out, so every rank
    stops there and the parent reports where."""
    infos = []
    try:
        os.environ.update(NO_MULTICAST)
        cuda = args.device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if not cuda:  # R processes share the CPUs
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // R))
        backend = args.backend or ("nccl" if cuda else "gloo")
        kw = {"device_id": dev} if cuda else {}
        import datetime
        dist.init_process_group(backend, init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=R, timeout=datetime.timedelta(seconds=args.timeout),
                                **kw)
        for i, path in enumerate(args.golden):
            info = {"rank": rank, "ok": False, "backend": backend,
                    "device": ep_layout.device_name(dev)}
            try:
                info.update(one_file(path, rank, R, dev, args, tmp, i))
                info["ok"] = True
            except Exception as e:  # recorded for the summary; the parent reports it
                info["error"] = "%s: %s" % (type(e).__name__, e)
                info["traceback"] = traceback.format_exc()
            with open(os.path.join(tmp, "rank%d-%d.json" % (rank, i)), "w") as fh:
                json.dump(info, fh, default=str)
            if not info["ok"]:
                break
    except Exception as e:  # init failed: every file of this rank says so
        for i in range(len(args.golden)):
            p = os.path.join(tmp, "rank%d-%d.json" % (rank, i))
            if not os.path.exists(p):
                with open(p, "w") as fh:
                    json.dump({"rank": rank, "ok": False, "error": "%s: %s" % (type(e).__name__, e),
                               "traceback": traceback.format_exc()}, fh)
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def assemble(g, parts):
    """The whole candidate from the ranks' results: (stage outputs,
    whole /ep arrays)."""
    T, k = g.dims["T"], g.dims["k"]
    V = lambda n: [p["view_" + n] for p in parts]
    send = np.stack(V("num_tokens_per_rank")).astype(np.int64)
    nrecv = [len(a) for a in V("recv_token")]
    whole = {"num_tokens_per_rank": send.sum(0), "num_tokens_per_expert":
             np.sum(V("num_tokens_per_expert"), 0), "is_token_in_rank":
             np.concatenate(V("is_token_in_rank"), 0), "send_counts": send,
             "send_displs": np.cumsum(send, 1) - send, "recv_displs": (np.cumsum(send, 0) - send).T,
             "send_expert_counts": np.stack(V("num_tokens_per_expert")),
             "recv_offsets": np.concatenate([[0], np.cumsum(nrecv)]),
             "recv_token": np.concatenate(V("recv_token")),
             "recv_topk_idx": np.concatenate(V("recv_topk_idx")).reshape(-1, k),
             "recv_topk_weights": np.concatenate(V("recv_topk_weights")).reshape(-1, k)}
    whole = ep_layout.to_host(whole, ep_layout.WHOLE)
    # the golden's sorted order: experts ascending, stable in t k + j
    inv = np.empty(T * k, dtype=np.int64)
    inv[np.argsort(np.asarray(g.array("topk_ids")).reshape(-1), kind="stable")] = np.arange(T * k)
    outputs = {"out": np.concatenate([p["out"] for p in parts], 0).reshape(T, g.dims["d"]),
               "group_sizes": np.concatenate([p["group_sizes"] for p in parts]).astype(np.int64)}
    flat = np.concatenate([p["pair_flat"] for p in parts]).astype(np.int64)
    if len(flat) != T * k or len(np.unique(flat)) != T * k:
        raise RuntimeError("the ranks computed %d (token, slot) pairs, %d distinct, of %d"
                           % (len(flat), len(np.unique(flat)), T * k))
    for n in PAIR_STAGES:
        if "pair_" + n in parts[0]:
            rows = np.concatenate([p["pair_" + n] for p in parts], 0)
            a = np.zeros_like(rows)
            a[inv[flat]] = rows
            outputs[n] = a
    return outputs, whole


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args, tmp):
    """Runs the ranks over every file of args.golden; returns an error
    line or None."""
    import torch.multiprocessing as mp
    t0 = time.time()
    ctx = mp.spawn(worker, args=(args.ranks, args, free_port(), tmp), nprocs=args.ranks,
                   join=False)
    try:
        while not ctx.join(timeout=2):
            if time.time() - t0 > args.timeout * max(1, len(args.golden)):
                for p in ctx.processes:  # a rank stuck in a collective
                    p.kill()
                return "killed after %d s" % (time.time() - t0)
    except Exception as e:  # a rank died: its json files (if any) say why
        return "%s: %s" % (type(e).__name__, e)
    return None


def collect(path, i, args, tmp, spawn_error):
    """The summary of golden file i from the ranks' results, and its whole
    candidate when every rank succeeded."""
    R = args.ranks
    s = {"golden": os.path.abspath(path), "ranks": R, "device": args.device,
         "env": {k: os.environ.get(k) for k in NO_MULTICAST}, "torch": torch.__version__}
    if spawn_error:
        s["spawn_error"] = spawn_error
    infos = []
    for r in range(R):
        p = os.path.join(tmp, "rank%d-%d.json" % (r, i))
        infos.append(json.load(open(p)) if os.path.exists(p)
                     else {"rank": r, "ok": False, "error": "no result (an earlier file failed, "
                           "or the process died)"})
    s["per_rank"] = infos
    g, how = ep_layout.load_golden(path)
    with g:
        s["case"] = g.case
        if all(x["ok"] for x in infos):
            try:
                parts = [dict(np.load(os.path.join(tmp, "rank%d-%d.npz" % (r, i))))
                         for r in range(R)]
                outputs, whole = assemble(g, parts)
                name = ep_layout.file_name(g.case, "torch-ep_dispatch[R=%d]" % R, "whole")
                ep_layout.write_candidate(
                    os.path.join(args.outdir, name), g, [(R, whole, None)], outputs,
                    backend="torch-ep_dispatch[R=%d]" % R,
                    backend_version="torch %s" % torch.__version__, device=infos[0].get("device"),
                    compute_mode=profile(g))
                s["file"] = name
                s["max_rel_err_out"] = rel_err(outputs["out"], g.array("out"))
            except Exception as e:
                s["assemble_error"] = "%s: %s" % (type(e).__name__, e)
                s["traceback"] = traceback.format_exc()
    s["ok"] = all(x["ok"] for x in infos) and "file" in s
    return s


def usable(paths, R):
    """(files whose E the R ranks divide, summaries of those refused)."""
    ok, refused = [], []
    for p in paths:
        try:
            g, _ = ep_layout.load_golden(p)
            with g:
                E = g.dims["E"]
        except Exception as e:
            refused.append({"golden": p, "ranks": R, "ok": False,
                            "error": "%s: %s" % (type(e).__name__, e)})
            continue
        if E % R:
            refused.append({"golden": p, "ranks": R, "ok": False,
                            "error": "R = %d does not divide E = %d" % (R, E)})
        else:
            ok.append(p)
    return ok, refused


def profile(g):
    """The profile the run declares: bf16/fp16 cases bf16-acc/fp16-acc (fp32
    accumulation, stored-type intermediates), fp32 cases fp32 (torch leaves
    TF32 off for fp32 matrix products unless told otherwise)."""
    dt = g.config["dtype"]
    return dt + "-acc" if dt in ("bf16", "fp16") else "fp32"


def rel_err(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    s = np.abs(ref).max() if ref.size else 0.0
    return float(np.abs(a - ref).max() / s) if s > 0 else 0.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("golden", nargs="+")
    ap.add_argument("--ranks", type=int, default=None,
                    help="processes (default: the GPUs there are; 2 on the CPU)")
    ap.add_argument("-o", "--outdir", default=".")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if there is one)")
    ap.add_argument("--backend", default=None, help="process-group backend (nccl, gloo)")
    ap.add_argument("--iters", type=int, default=5, help="timed repetitions of the row exchange")
    ap.add_argument("--summary", help="append the summary JSON lines to this file")
    ap.add_argument("--timeout", type=int, default=300,
                    help="seconds per golden file (collectives time out, stuck ranks are killed)")
    a = ap.parse_args(argv)
    if torch is None:
        print("ep_dispatch: PyTorch is not installed", file=sys.stderr)
        return 2
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.ranks is None:
        a.ranks = torch.cuda.device_count() if a.device.startswith("cuda") else 2
    if a.ranks < 1 or (a.device.startswith("cuda") and a.ranks > torch.cuda.device_count()):
        print("ep_dispatch: --ranks %d: need 1..%d" % (a.ranks, torch.cuda.device_count()
                                                       if a.device.startswith("cuda") else 64),
              file=sys.stderr)
        return 2
    os.makedirs(a.outdir, exist_ok=True)
    os.environ.update(NO_MULTICAST)
    a.golden, lines = usable(a.golden, a.ranks)
    if a.golden:
        with tempfile.TemporaryDirectory(prefix="ep-dispatch-") as tmp:
            t0 = time.time()
            err = spawn(a, tmp)
            seconds = round(time.time() - t0, 3)
            for i, p in enumerate(a.golden):
                s = collect(p, i, a, tmp, err)
                s["spawn_seconds_all_files"] = seconds
                lines.append(s)
    for s in lines:
        line = dict(s, per_rank=[{k: v for k, v in x.items() if k != "traceback"}
                                 for x in s.get("per_rank", [])])
        print(json.dumps(line, default=str))
        for x in s.get("per_rank", []):
            if x.get("traceback"):
                print("rank %d: %s" % (x["rank"], x["traceback"]), file=sys.stderr)
        if a.summary:
            with open(a.summary, "a") as fh:
                fh.write(json.dumps(s, default=str) + "\n")
    return 0 if lines and all(s.get("ok") for s in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
