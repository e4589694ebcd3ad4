#!/usr/bin/env python3
"""The expert-parallel tools on the CPU: python/dropless/gpu/adapters/ep_layout.py (the
DeepEP dispatch layout with PyTorch tensor operations) against an
independent numpy reference of the `/ep/ranks_R` spec written from the
spec's words (loops over tokens and slots), and python/dropless/gpu/ep_dispatch.py over 1,
2 and 4 gloo processes: every rank's received layout equals the reference,
the whole candidate's layout too, and `dropless check` finds its out and
expert stages CONFORMANT with zero drops; a candidate with a dropped slot
is NOT CONFORMANT. Speaks TAP; run by tests/test_ep_dispatch.sh, which
points the package at this build and picks a Python with PyTorch.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

try:
    import numpy as np
    import h5py
    import torch  # noqa: F401
    import dropless
    dropless.library_path()
except Exception as e:  # ImportError, or dropless.Error: no library
    print("1..1")
    print("ok 1 # SKIP numpy, h5py, PyTorch or the package dropless unavailable (%s)" % e)
    sys.exit(0)

top_srcdir = os.path.abspath(os.environ.get("top_srcdir", os.path.join(os.path.dirname(__file__), "..")))
top_builddir = os.path.abspath(os.environ.get("top_builddir", top_srcdir))
sys.path.insert(0, top_srcdir)

from dropless.gpu.adapters import ep_layout  # noqa: E402

DROPLESS = os.path.join(top_builddir, "dropless")
TMP = tempfile.mkdtemp(prefix="dl-ep-")
results = []


def check(desc, fn):
    t0 = time.time()
    try:
        fn()
        results.append(("ok", desc, "%.1f s" % (time.time() - t0)))
    except Exception as e:  # reported and counted
        results.append(("fail", desc, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))


# ------------------------------------------------- the spec, in numpy loops

def reference(ids, w, E, R):
    """`/ep/ranks_R` of EP_SPEC / doc/format.md, token by token."""
    T, k = ids.shape
    El = E // R
    first = [s * T // R for s in range(R + 1)]
    src = [max(s for s in range(R) if first[s] <= t) for t in range(T)]
    in_rank = np.zeros((T, R), np.uint8)
    for t in range(T):
        for j in range(k):
            in_rank[t, ids[t, j] // El] = 1
    send = np.zeros((R, R), np.int64)
    sec = np.zeros((R, E), np.int64)
    for t in range(T):
        for r in range(R):
            send[src[t], r] += in_rank[t, r]
        for j in range(k):
            sec[src[t], ids[t, j]] += 1
    sd = np.zeros((R, R), np.int64)
    rd = np.zeros((R, R), np.int64)
    for s in range(R):
        for r in range(1, R):
            sd[s, r] = sd[s, r - 1] + send[s, r - 1]
            rd[s, r] = rd[s, r - 1] + send[r - 1, s]
    tok, idx, wt, offs = [], [], [], [0]
    for r in range(R):
        for s in range(R):
            for t in range(first[s], first[s + 1]):
                if in_rank[t, r]:
                    tok.append(t)
                    on = [ids[t, j] // El == r for j in range(k)]
                    idx.append([ids[t, j] - r * El if on[j] else -1 for j in range(k)])
                    wt.append([w[t, j] if on[j] else 0.0 for j in range(k)])
        offs.append(len(tok))
    return {"num_tokens_per_rank": in_rank.sum(0).astype(np.int64),
            "num_tokens_per_expert": np.bincount(ids.reshape(-1), minlength=E).astype(np.int64),
            "is_token_in_rank": in_rank, "send_counts": send, "send_displs": sd,
            "recv_displs": rd, "send_expert_counts": sec, "recv_offsets": np.array(offs, np.int64),
            "recv_token": np.array(tok, np.int32).reshape(-1),
            "recv_topk_idx": np.array(idx, np.int32).reshape(-1, k),
            "recv_topk_weights": np.array(wt, np.float32).reshape(-1, k)}


def reference_view(ref, r, T, R):
    first = [s * T // R for s in range(R + 1)]
    o = ref["recv_offsets"]
    rows = slice(o[r], o[r + 1])
    return {"num_tokens_per_rank": ref["send_counts"][r],
            "num_tokens_per_expert": ref["send_expert_counts"][r],
            "is_token_in_rank": ref["is_token_in_rank"][first[r]:first[r + 1]],
            "recv_counts": ref["send_counts"][:, r], "recv_token": ref["recv_token"][rows],
            "recv_topk_idx": ref["recv_topk_idx"][rows],
            "recv_topk_weights": ref["recv_topk_weights"][rows]}


def same_group(path, R, ref, rank=None):
    """The file's /ep/ranks_R equals ref: every dataset, its storage type,
    its dtype attribute and bits (weights compared as bits)."""
    table = ep_layout.WHOLE if rank is None else ep_layout.VIEW
    with h5py.File(path, "r") as f:
        grp = f["ep/ranks_%d" % R]
        assert int(grp.attrs["ranks"]) == R and int(grp.attrs["experts_per_rank"]) * R == \
            int(f["config"].attrs["experts"]), dict(grp.attrs)
        assert (rank is None) == ("rank" not in grp.attrs), dict(grp.attrs)
        if rank is not None:
            assert int(grp.attrs["rank"]) == rank
        assert sorted(grp) == sorted(table), sorted(grp)
        for n, want in ref.items():
            got = grp[n][()]
            assert grp[n].attrs["dtype"].decode() == table[n][1], n
            assert got.dtype == np.dtype(table[n][0]), "%s: %s" % (n, got.dtype)
            want = np.asarray(want).astype(table[n][0])
            assert got.shape == want.shape, "%s: shape %s, expected %s" % (n, got.shape, want.shape)
            assert got.tobytes() == want.tobytes(), "%s/ranks_%d/%s differs" % (path, R, n)


# ------------------------------------------------------------------- cases

CASES = ("mixtral-small", "mixtral-small-bf16", "deepseek-v3-small", "one-hot", "zipf",
         "ties-grouped", "empty-experts", "no-tokens", "odd-shapes")
GOLDEN = {}


def make_goldens():
    d = os.path.join(TMP, "golden")
    os.makedirs(d)
    for name in CASES:
        with dropless.generate(name, backward=False) as g:
            GOLDEN[name] = g.save(os.path.join(d, name + ".h5"))


def golden_routing(case):
    with dropless.load(GOLDEN[case]) as g:
        return g.array("topk_ids"), g.array("topk_weights"), g.dims["E"], g.dims["T"]


def t_reference_by_hand():
    # the reference itself, on a layout worked out by hand: T=5, E=4, k=2,
    # R=2 (experts 0-1 on rank 0, 2-3 on rank 1; tokens 0-1 on source 0)
    ids = np.array([[0, 1], [2, 0], [3, 2], [1, 0], [2, 3]], np.int32)
    w = np.arange(10, dtype=np.float32).reshape(5, 2) / 10
    r = reference(ids, w, 4, 2)
    assert r["is_token_in_rank"].tolist() == [[1, 0], [1, 1], [0, 1], [1, 0], [0, 1]]
    assert r["send_counts"].tolist() == [[2, 1], [1, 2]]
    assert r["recv_displs"].tolist() == [[0, 2], [0, 1]]
    assert r["recv_offsets"].tolist() == [0, 3, 6]
    assert r["recv_token"].tolist() == [0, 1, 3, 1, 2, 4]
    assert r["recv_topk_idx"].tolist() == [[0, 1], [-1, 0], [1, 0], [0, -1], [1, 0], [0, 1]]
    assert r["send_expert_counts"].tolist() == [[2, 1, 1, 0], [1, 1, 2, 2]]
    assert r["recv_topk_weights"][1].tolist() == [0.0, np.float32(0.3)]


def layout_files():
    out = os.path.join(TMP, "layout")
    os.makedirs(out, exist_ok=True)
    for case in CASES:
        ep_layout.run(GOLDEN[case], out, ranks=(1, 2, 4, 8, 32), device="cpu", log=lambda s: None)
    return out


def t_layout_whole():
    out = layout_files()
    n = 0
    for case in CASES:
        ids, w, E, T = golden_routing(case)
        path = os.path.join(out, ep_layout.file_name(case, ep_layout.BACKEND, "whole"))
        with h5py.File(path, "r") as f:
            have = sorted(f["ep"]) if "ep" in f else []
        Rs = [R for R in (1, 2, 4, 8, 32) if E % R == 0]
        assert have == sorted("ranks_%d" % R for R in Rs), (case, have)
        for R in Rs:
            same_group(path, R, reference(ids, w, E, R))
            n += 1
    assert n >= 25, n


def t_layout_views():
    out = os.path.join(TMP, "layout")
    n = 0
    for case in ("mixtral-small", "deepseek-v3-small", "one-hot", "no-tokens"):
        ids, w, E, T = golden_routing(case)
        Rs = [R for R in (1, 2, 4, 8, 32) if E % R == 0]
        for r in range(max(Rs)):
            path = os.path.join(out, ep_layout.file_name(case, ep_layout.BACKEND, "rank%d" % r))
            for R in Rs:
                if r < R:
                    same_group(path, R, reference_view(reference(ids, w, E, R), r, T, R), rank=r)
                    n += 1
    assert n >= 40, n


def t_compare_fails():
    # the comparison catches a dropped slot, a token on the wrong rank and a
    # duplicate copy (the negative controls of the C check, here for ours)
    ids, w, E, T = golden_routing("mixtral-small")
    path = os.path.join(TMP, "layout", ep_layout.file_name("mixtral-small", ep_layout.BACKEND, "whole"))
    ref = reference(ids, w, E, 4)

    def edited(fn):
        bad = os.path.join(TMP, "bad.h5")
        shutil.copy(path, bad)
        with h5py.File(bad, "r+") as f:
            fn(f["ep/ranks_4"])
        try:
            same_group(bad, 4, ref)
        except AssertionError:
            return
        raise AssertionError("an edited layout passed")

    def drop(grp):
        a = grp["recv_topk_idx"][()]
        a[np.argwhere(a >= 0)[0][0], np.argwhere(a >= 0)[0][1]] = -1
        grp["recv_topk_idx"][...] = a

    def wrong_rank(grp):
        a = grp["is_token_in_rank"][()]
        a[0] = np.roll(a[0], 1)
        grp["is_token_in_rank"][...] = a

    def dup(grp):
        a = grp["recv_token"][()]
        a[1] = a[0]
        grp["recv_token"][...] = a
    for fn in (drop, wrong_rank, dup):
        edited(fn)


# ------------------------------------------------------------ ep_dispatch

def dispatch(cases, R):
    """ep_dispatch.py over the cases in one run of R gloo processes:
    (output directory, {case: its summary line})."""
    out = os.path.join(TMP, "dispatch")
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([top_srcdir, os.path.join(top_srcdir, "python"),
                                                       os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "dropless.gpu.ep_dispatch"] +
                       [GOLDEN[c] for c in cases] +
                       ["--ranks", str(R), "--device", "cpu", "-o", out, "--iters", "2"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, "exit %d\n%s\n%s" % (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    lines = [json.loads(x) for x in r.stdout.strip().splitlines()]
    got = {x["case"]: x for x in lines}
    assert sorted(got) == sorted(cases), sorted(got)
    for s in lines:
        assert s["ok"] and s["ranks"] == R and len(s["per_rank"]) == R, s
        assert all(i["backend"] == "gloo" for i in s["per_rank"]), s
    return out, got


def judged(case, path):
    rj = os.path.join(TMP, "r.json")
    r = subprocess.run([DROPLESS, "check", "--force", "--json", rj, GOLDEN[case], path],
                       capture_output=True, text=True)
    rep = json.load(open(rj))
    return r.returncode, (rep[0] if isinstance(rep, list) else rep), r.stdout


def verify_dispatch(R, cases, empty=None):
    """Runs the cases over R processes; every rank's layout and the whole
    candidate's equal the reference, and dropless check passes out, the
    expert stages and zero drops. empty: {case: a rank that receives no
    token there}."""
    out, lines = dispatch(cases, R)
    backend = "torch-ep_dispatch[R=%d]" % R
    for case in cases:
        ids, w, E, T = golden_routing(case)
        ref = reference(ids, w, E, R)
        for r in range(R):
            same_group(os.path.join(out, ep_layout.file_name(case, backend, "rank%d" % r)), R,
                       reference_view(ref, r, T, R), rank=r)
        if case in (empty or {}):  # the routing this case is here for
            info = lines[case]["per_rank"][empty[case]]
            assert info["notes"]["recv_rows"] == [0] * R, info
        whole = os.path.join(out, ep_layout.file_name(case, backend, "whole"))
        same_group(whole, R, ref)
        rc, rep, text = judged(case, whole)
        assert rc == 0 and rep["conformant"], text
        got = {(c["stage"], c["check"]): c["verdict"] for c in rep["checks"]}
        for sc in (("out", "numerics"), ("case", "zero_drops"), ("y_sorted", "numerics"),
                   ("x_sorted", "exact"), ("group_sizes", "exact")):
            assert got.get(sc) == "PASS", "%s: %s %s\n%s" % (whole, sc, got.get(sc), text)


def t_dispatch_1():
    verify_dispatch(1, ["mixtral-small"])


def t_dispatch_2():
    # one-hot: every token on expert 4, so rank 0 receives none
    verify_dispatch(2, ["mixtral-small", "one-hot", "mixtral-small-bf16"], {"one-hot": 0})


def t_dispatch_4():
    # zipf: experts 8-11 get no token, so rank 2 receives none
    verify_dispatch(4, ["deepseek-v3-small", "zipf"], {"zipf": 2})


def t_dispatch_drop_fails():
    # negative control: the whole candidate with one (token, slot)
    # contribution removed from out is NOT CONFORMANT
    whole = os.path.join(TMP, "dispatch", ep_layout.file_name(
        "mixtral-small", "torch-ep_dispatch[R=2]", "whole"))
    if not os.path.exists(whole):
        dispatch(["mixtral-small"], 2)
    bad = os.path.join(TMP, "dropped.h5")
    shutil.copy(whole, bad)
    with dropless.load(GOLDEN["mixtral-small"]) as g:
        ids, w, y = g.array("topk_ids"), g.array("topk_weights"), g.array("y_sorted")
        inv = g.array("inv_perm")
    with h5py.File(bad, "r+") as f:
        out = f["forward/out"][()]
        out[3] -= w[3, 1] * y[inv[3 * ids.shape[1] + 1]]
        f["forward/out"][...] = out
        del f["forward/y_sorted"], f["forward/h_act"], f["forward/h_up"], f["forward/h_gate"]
    rc, rep, text = judged("mixtral-small", bad)
    assert rc == 1 and not rep["conformant"], text
    zd = [c for c in rep["checks"] if c["check"] == "zero_drops"]
    assert zd and zd[0]["verdict"] == "FAIL" and "(3,1)" in zd[0]["message"], text


check("golden fixtures (dropless.generate, saved)", make_goldens)
check("numpy reference of the spec on a layout worked by hand", t_reference_by_hand)
check("ep_layout: whole /ep/ranks_R for R in 1,2,4,8,32 equals the numpy reference", t_layout_whole)
check("ep_layout: rank views equal the reference's, rank by rank", t_layout_views)
check("layout comparison: a dropped slot, a wrong rank, a duplicate copy are caught", t_compare_fails)
check("ep_dispatch, world of 1 (gloo): layout exact, dropless check CONFORMANT", t_dispatch_1)
check("ep_dispatch, 2 gloo processes: mixtral-small, one-hot (rank 0 receives no token), bf16",
      t_dispatch_2)
check("ep_dispatch, 4 gloo processes: deepseek-v3-small, zipf (rank 2 receives no token)",
      t_dispatch_4)
check("ep_dispatch candidate with a dropped slot is NOT CONFORMANT", t_dispatch_drop_fails)

print("1..%d" % len(results))
for i, (st, desc, info) in enumerate(results, 1):
    if st == "ok":
        print("ok %d - %s (%s)" % (i, desc, info))
    else:
        print("not ok %d - %s" % (i, desc))
        for line in info.rstrip().splitlines():
            print("# " + line)
shutil.rmtree(TMP, ignore_errors=True)
