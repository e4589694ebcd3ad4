"""The expert-parallel layout groups /ep/ranks_R: `dropless gen --ep-ranks`
on catalogue cases against an independent computation here (numpy, from
the spec's text in doc/format.md, not from the C code), and `dropless
check` on candidates holding them: a correct dispatch PASSes, a reordered
one WARNs, each defect (a wrong-rank send, a dropped slot, a double send,
a wrong count, a flipped weight bit, a misshapen dataset) FAILs with the
(t, j, rank) named, in the whole form and a rank's view. Run by
tests/test_ep.sh with a Python that has h5py. Speaks TAP."""
import json
import os
import shutil
import tempfile

import h5py
import numpy as np

from taplib import check, dl, finish  # noqa: E402 (tests/, beside this script)

top_builddir = os.environ.get("top_builddir", ".")
DL = os.path.join(top_builddir, "dropless")
CASES = ["tiny", "mixtral-small", "deepseek-v3-small", "zipf", "ties-grouped", "one-hot",
         "empty-experts", "single-token", "odd-shapes", "no-tokens", "plain-ffn-bf16"]



def reference(ids, w, E, R):
    """The layout as doc/format.md words it, computed the direct way."""
    T, k = ids.shape
    per = E // R
    src = [(s * T // R, (s + 1) * T // R) for s in range(R)]
    rank_of = ids // per
    in_rank = np.zeros((T, R), np.uint8)
    for t in range(T):
        for j in range(k):
            in_rank[t, rank_of[t, j]] = 1
    send = np.zeros((R, R), np.int64)
    sec = np.zeros((R, E), np.int64)
    for s, (b, e) in enumerate(src):
        send[s] = in_rank[b:e].sum(axis=0)
        for t in range(b, e):
            for j in range(k):
                sec[s, ids[t, j]] += 1
    out = {"num_tokens_per_rank": in_rank.sum(axis=0).astype(np.int64),
           "num_tokens_per_expert": np.bincount(ids.ravel(), minlength=E).astype(np.int64),
           "is_token_in_rank": in_rank, "send_counts": send, "send_expert_counts": sec,
           "send_displs": np.concatenate([np.zeros((R, 1), np.int64),
                                         np.cumsum(send, axis=1)[:, :-1]], axis=1),
           "recv_displs": np.concatenate([np.zeros((R, 1), np.int64),
                                         np.cumsum(send.T, axis=1)[:, :-1]], axis=1)}
    out["recv_offsets"] = np.concatenate([[0], np.cumsum(out["num_tokens_per_rank"])]).astype(np.int64)
    tok, idx, wt = [], [], []
    for r in range(R):
        for s, (b, e) in enumerate(src):
            for t in range(b, e):
                if not in_rank[t, r]:
                    continue
                tok.append(t)
                idx.append([ids[t, j] - r * per if rank_of[t, j] == r else -1 for j in range(k)])
                wt.append([w[t, j] if rank_of[t, j] == r else np.float32(0) for j in range(k)])
    out["recv_token"] = np.array(tok, np.int32)
    out["recv_topk_idx"] = np.array(idx, np.int32).reshape(-1, k)
    out["recv_topk_weights"] = np.array(wt, np.float32).reshape(-1, k)
    return out


def divisors(E):
    return [R for R in (1, 2, 3, 4, 8) if E % R == 0]


def experts_of_cases():
    out = {}
    for line in dl("cases").stdout.splitlines():
        parts = line.split()
        for p in parts:
            if p.startswith("E="):
                out[parts[0]] = int(p[2:])
    return out


EXPERTS = experts_of_cases()
tmp = tempfile.mkdtemp(prefix="dl_ep.")
try:
    # ------------------------------------------------ goldens vs the reference
    def golden_case(name):
        def run():
            path = os.path.join(tmp, name + ".h5")
            E = EXPERTS[name]
            rs = divisors(E)
            dl("gen", name, "-q", "-f", "-o", path, "--ep-ranks", ",".join(map(str, rs)))
            with h5py.File(path, "r") as f:
                ids = f["forward/topk_ids"][()]
                w = f["forward/topk_weights"][()]
                assert sorted(f["ep"].keys()) == sorted("ranks_%d" % R for R in rs), list(f["ep"])
                for R in rs:
                    g = f["ep/ranks_%d" % R]
                    assert g.attrs["ranks"] == R and g.attrs["experts_per_rank"] == E // R
                    ref = reference(ids, w, E, R)
                    assert sorted(g.keys()) == sorted(ref.keys()), sorted(g.keys())
                    for k, v in ref.items():
                        got = g[k][()]
                        assert got.dtype == v.dtype, (R, k, got.dtype, v.dtype)
                        assert got.shape == v.shape, (R, k, got.shape, v.shape)
                        assert got.tobytes() == v.tobytes(), (R, k, got, v)
                    assert g["is_token_in_rank"].attrs["dtype"] == b"bool"
            dl("info", path)  # the strict loader re-derives and accepts it
        return run

    for c in CASES:
        check("/ep/ranks_R of %s equal the independent computation" % c, golden_case(c))

    G = os.path.join(tmp, "g.h5")
    dl("gen", "mixtral-small", "-q", "-o", G, "--ep-ranks", "1,2,4,8")

    def same_values_without_ep():
        a, b = os.path.join(tmp, "a.h5"), os.path.join(tmp, "b.h5")
        dl("gen", "zipf", "-q", "-o", a)
        dl("gen", "zipf", "-q", "-o", b, "--ep-ranks", "2")
        names = []
        with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
            x.visit(names.append)
            for n in names:
                if isinstance(x[n], h5py.Dataset):
                    assert x[n][()].tobytes() == y[n][()].tobytes(), n
            assert "ep" not in x and "ep/ranks_2" in y
    check("a file with /ep keeps every other dataset's bytes; none without --ep-ranks",
          same_values_without_ep)

    def stream_same():
        a, b = os.path.join(tmp, "s1.h5"), os.path.join(tmp, "s2.h5")
        dl("gen", "deepseek-v3-small", "-q", "-o", a, "--ep-ranks", "2,4,8")
        dl("gen", "deepseek-v3-small", "-q", "-o", b, "--ep-ranks", "8,2,4", "--stream")
        assert open(a, "rb").read() == open(b, "rb").read()
    check("streamed generation with --ep-ranks writes the same bytes (any option order)",
          stream_same)

    def slice_has_ep():
        p = os.path.join(tmp, "slice.h5")
        dl("gen", "deepseek-v3-small", "-q", "-o", p, "--ep-ranks", "4", "--experts", "8:16")
        with h5py.File(p, "r") as f, h5py.File(os.path.join(tmp, "s1.h5"), "r") as w:
            for k in w["ep/ranks_4"]:
                assert f["ep/ranks_4"][k][()].tobytes() == w["ep/ranks_4"][k][()].tobytes(), k
    check("an expert slice (--experts) holds the whole layout", slice_has_ep)

    def sealed():
        p = os.path.join(tmp, "edited.h5")
        shutil.copy(G, p)
        dl("info", p)
        with h5py.File(p, "r+") as f:
            a = f["ep/ranks_2/send_counts"][()]
            a[0, 0] += 1
            f["ep/ranks_2/send_counts"][...] = a
        r = dl("info", p, want=2)
        assert "seal" in r.stderr, r.stderr
        # as a candidate (a candidate needs no seal) the edit is a finding
        r = dl("check", G, p, "--json", "-", want=1)
        bad = [x for x in json.loads(r.stdout)["checks"] if x["verdict"] == "FAIL"]
        assert [x["check"] for x in bad] == ["ep_counts"], bad
        assert "send_counts[0,0]" in bad[0]["message"], bad
    check("the seal covers /ep: an edited layout fails the golden's load, FAILs as a candidate",
          sealed)

    def refuse():
        p = dl("gen", "tiny", "-o", os.path.join(tmp, "x.h5"), "--ep-ranks", "3", want=2)
        assert "does not divide" in p.stderr and p.stderr.count("\n") == 1, p.stderr
        assert not os.path.exists(os.path.join(tmp, "x.h5"))
        for bad in ("0", "2,,4", "x", "2,", "-1"):
            p = dl("gen", "tiny", "-o", os.path.join(tmp, "x.h5"), "--ep-ranks", bad, want=2)
            assert "--ep-ranks" in p.stderr, p.stderr
    check("--ep-ranks refuses R not dividing E and malformed lists (exit 2, one line)", refuse)

    # ------------------------------------------------------------ candidates
    def candidate(name, edit, view=None):
        """A candidate holding only /ep (copied from G), edited by edit(group)."""
        p = os.path.join(tmp, name + ".h5")
        with h5py.File(G, "r") as g, h5py.File(p, "w") as c:
            for k, v in g.attrs.items():
                c.attrs[k] = v
            g.copy("config", c)
            c.create_group("ep")
            for R in (2, 4):
                src = g["ep/ranks_%d" % R]
                if view is None:
                    src.parent.copy(src, c["ep"], name="ranks_%d" % R)
                    continue
                grp = c["ep"].create_group("ranks_%d" % R)
                v = view % R
                grp.attrs["rank"] = np.int64(v)
                T = g["config"].attrs["tokens"]
                b, e = v * T // R, (v + 1) * T // R
                off = src["recv_offsets"][()]
                grp["num_tokens_per_rank"] = src["send_counts"][v]
                grp["num_tokens_per_expert"] = src["send_expert_counts"][v]
                grp["is_token_in_rank"] = src["is_token_in_rank"][b:e]
                grp["recv_counts"] = src["send_counts"][:, v]
                for k in ("recv_token", "recv_topk_idx", "recv_topk_weights"):
                    grp[k] = src[k][off[v]:off[v + 1]]
            if edit:
                edit(c["ep/ranks_4"], g["ep/ranks_4"])
        return p

    def verdicts(path, want):
        p = dl("check", G, path, "--json", "-", want=want)
        rep = json.loads(p.stdout)
        rows = [r for r in rep["checks"] if r["check"].startswith("ep_")]
        assert rows, p.stdout
        return rows, p

    def expect(name, edit, want_check, want_verdict, needle, view=None):
        def run():
            path = candidate(name, edit, view)
            rows, p = verdicts(path, 1 if want_verdict == "FAIL" else 0)
            hit = [r for r in rows if r["check"] == want_check and r["verdict"] == want_verdict]
            assert hit, json.dumps(rows, indent=1)
            assert needle in hit[0]["message"], hit[0]["message"]
            others = [r for r in rows if r["verdict"] not in ("PASS", want_verdict)]
            assert not others, others
        return run

    def rewrite(grp, name, arr):
        del grp[name]
        grp[name] = arr

    def wrong_rank(c, g):
        # token of rank 0's first row re-labelled onto rank 1's block: its copy moves
        off = g["recv_offsets"][()]
        tok = g["recv_token"][()]
        in_rank = g["is_token_in_rank"][()]
        t = next(int(x) for x in tok[off[0]:off[1]] if not in_rank[x, 1])
        i = int(np.where(tok[off[0]:off[1]] == t)[0][0])
        # move row i of rank 0 to the start of rank 1
        order = list(range(off[0], off[0] + i)) + list(range(off[0] + i + 1, off[1])) + \
            [off[0] + i] + list(range(off[1], len(tok)))
        for k in ("recv_token", "recv_topk_idx", "recv_topk_weights"):
            rewrite(c, k, g[k][()][order])
        ro = off.copy()
        ro[1] -= 1
        rewrite(c, "recv_offsets", ro)
        del c["num_tokens_per_rank"], c["recv_displs"], c["send_counts"], c["send_displs"]

    def drop_slot(c, g):
        idx = g["recv_topk_idx"][()]
        i, j = [int(v) for v in np.argwhere(idx >= 0)[3]]
        idx[i, j] = -1
        rewrite(c, "recv_topk_idx", idx)
        del c["recv_topk_weights"]

    def double_send(c, g):
        off = g["recv_offsets"][()]
        order = list(range(0, off[1])) + [off[1] - 1] + list(range(off[1], off[-1]))
        for k in ("recv_token", "recv_topk_idx", "recv_topk_weights"):
            rewrite(c, k, g[k][()][order])
        ro = off.copy()
        ro[1:] += 1
        rewrite(c, "recv_offsets", ro)
        del c["num_tokens_per_rank"], c["recv_displs"], c["send_counts"], c["send_displs"]

    def reorder(c, g):
        off = g["recv_offsets"][()]
        order = list(range(off[-1]))
        order[off[0]], order[off[0] + 1] = order[off[0] + 1], order[off[0]]
        for k in ("recv_token", "recv_topk_idx", "recv_topk_weights"):
            rewrite(c, k, g[k][()][order])

    def count(c, g):
        s = g["send_counts"][()]
        s[1, 2] += 1
        rewrite(c, "send_counts", s)

    def in_rank(c, g):
        m = g["is_token_in_rank"][()]
        m[0, :] = 1 - m[0, :]
        rewrite(c, "is_token_in_rank", m)

    def weight_bit(c, g):
        w = g["recv_topk_weights"][()]
        i, j = [int(v) for v in np.argwhere(g["recv_topk_idx"][()] >= 0)[0]]
        w.view(np.uint32)[i, j] ^= 1
        rewrite(c, "recv_topk_weights", w)

    def nonzero_weight(c, g):
        w = g["recv_topk_weights"][()]
        i, j = [int(v) for v in np.argwhere(g["recv_topk_idx"][()] < 0)[0]]
        w[i, j] = np.float32(0.5)
        rewrite(c, "recv_topk_weights", w)

    def misshapen(c, g):
        rewrite(c, "send_expert_counts", g["send_expert_counts"][()][:, :3])

    def weights_f64(c, g):
        rewrite(c, "recv_topk_weights", g["recv_topk_weights"][()].astype(np.float64))

    check("a correct whole-form candidate (only /ep) PASSes every ep check",
          expect("ok", None, "ep_dispatch", "PASS", "a bijection"))
    check("a correct rank view PASSes",
          expect("okview", None, "ep_dispatch", "PASS", "rank 1", view=1))
    check("a reordered receive WARNs (order differs from canonical), exit 0",
          expect("reorder", reorder, "ep_dispatch", "WARN", "differs from canonical"))
    check("a token sent to a wrong rank FAILs, (t, j, rank) named",
          expect("wrongrank", wrong_rank, "ep_dispatch", "FAIL", "wrong rank: ("))
    check("a dropped slot FAILs, (t, j, rank) named",
          expect("drop", drop_slot, "ep_dispatch", "FAIL", "dropped: ("))
    check("a double send FAILs (duplicate copies: DeepEP sends one per rank)",
          expect("dup", double_send, "ep_dispatch", "FAIL", "duplicate copies: DeepEP sends one per rank: ("))
    check("a wrong send count FAILs, the element named",
          expect("count", count, "ep_counts", "FAIL", "send_counts[1,2]"))
    check("a wrong is_token_in_rank FAILs",
          expect("inrank", in_rank, "ep_in_rank", "FAIL", "token 0 rank"))
    check("a flipped weight bit FAILs (bit-exact)",
          expect("wbit", weight_bit, "ep_weights", "FAIL", "weight 0x"))
    check("a nonzero weight in a foreign slot FAILs",
          expect("wfor", nonzero_weight, "ep_weights", "FAIL", "expected 0x00000000"))
    check("a misshapen dataset FAILs (ep_shape, set aside)",
          expect("shape", misshapen, "ep_shape", "FAIL", "send_expert_counts"))
    check("float64 weights are set aside (weights are copied bit for bit)",
          expect("f64", weights_f64, "ep_shape", "FAIL", "float32"))

    def view_edit(fn):
        def edit(c, g):
            fn(c)
        return edit

    def view_drop(c):
        idx = c["recv_topk_idx"][()]
        i, j = [int(v) for v in np.argwhere(idx >= 0)[0]]
        idx[i, j] = -1
        rewrite(c, "recv_topk_idx", idx)

    def view_dup(c):
        for k in ("recv_token", "recv_topk_idx", "recv_topk_weights"):
            a = c[k][()]
            rewrite(c, k, np.concatenate([a, a[:1]]))

    def view_count(c):
        a = c["recv_counts"][()]
        a[0] += 1
        rewrite(c, "recv_counts", a)

    check("a rank view with a dropped slot FAILs",
          expect("vdrop", view_edit(view_drop), "ep_dispatch", "FAIL", "rank 2)", view=2))
    check("a rank view with a double send FAILs",
          expect("vdup", view_edit(view_dup), "ep_dispatch", "FAIL", "duplicate", view=2))
    check("a rank view with a wrong recv_counts FAILs",
          expect("vcount", view_edit(view_count), "ep_counts", "FAIL", "recv_counts[0]", view=2))

    def no_tokens(c, g):
        del c["recv_token"]

    def skip_without_tokens():
        rows, p = verdicts(candidate("notok", no_tokens), 0)
        hit = [r for r in rows if r["check"] == "ep_dispatch" and "ranks_4" in r["message"]]
        assert hit and hit[0]["verdict"] == "SKIP", hit
        assert "without recv_token" in hit[0]["message"], hit
    check("received slots without recv_token: ep_dispatch SKIPs, saying why", skip_without_tokens)

    def reports():
        path = candidate("rep", drop_slot)
        x = os.path.join(tmp, "r.xml")
        p = dl("check", G, path, "--junit", x, want=1)
        assert "ep_dispatch" in p.stdout and "FAIL" in p.stdout, p.stdout
        xml = open(x).read()
        assert "ep_dispatch" in xml and "<failure" in xml, xml[:2000]
    check("ep checks appear in the table and the JUnit report", reports)
finally:
    shutil.rmtree(tmp, ignore_errors=True)

finish()
