"""The kernel layouts /layouts/NAME (issue 27): `dropless gen --layout` on
the catalogue against an independent computation here (plain loops over
the words of doc/format.md, not the C code nor dropless.layouts), the
converters of dropless.layouts both ways, the edge cases (an empty
expert, one expert with every token, masked_m changing across routings
of one shape, an alignment above every group, groups that are multiples
of the alignment, T = 0, a capacity too small), the poisoned twin, and
the layout zoo (tests/zoo/layout_kernels.py) through `dropless check`:
correct kernels CONFORMANT on the golden and its poisoned twin, each
defect NOT CONFORMANT with its rows named. Run by tests/test_layouts.sh
with a Python that has h5py. Speaks TAP."""
import importlib.util
import json
import math
import os
import shutil
import subprocess
import tempfile

import h5py
import numpy as np

from taplib import check, dl, finish  # noqa: E402 (tests/, beside this script)

top_builddir = os.environ.get("top_builddir", ".")
top_srcdir = os.environ.get("top_srcdir", ".")
DL = os.path.join(top_builddir, "dropless")
VECTORS = os.path.join(top_srcdir, "vectors")


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


# the converters need numpy alone: loaded without the package's library
LY = _module(os.path.join(top_srcdir, "python", "dropless", "layouts.py"), "dl_layouts")
K = _module(os.path.join(top_srcdir, "tests", "zoo", "layout_kernels.py"), "layout_kernels")
CASES = ["tiny", "ties", "ties-grouped", "empty-experts", "no-tokens", "one-hot", "single-token",
         "odd-shapes", "zipf", "mixtral-small", "deepseek-v3-small", "grouped-max", "plain-ffn",
         "mixtral-small-bf16", "ties-fp16"]
tmp = tempfile.mkdtemp(prefix="dl_layouts.")



def reference(kind, p, sizes, perm, k, e0, e1):
    """The layout as doc/format.md words it, row by row."""
    E, M = len(sizes), int(sum(sizes))
    off = [0]
    for n in sizes:
        off.append(off[-1] + int(n))
    out, src = {}, []
    if kind in ("masked", "batched"):
        out["masked_m" if kind == "masked" else "expert_num_tokens"] = list(sizes[e0:e1])
        for e in range(e0, e1):
            src += [off[e] + i if i < sizes[e] else -1 for i in range(p)]
        return out, src, src
    if kind == "contiguous":
        mi, go = [], [0]
        for e in range(e0, e1):
            rows = int(math.ceil(sizes[e] / p)) * p
            for i in range(rows):
                mi.append(e - e0 if i < sizes[e] else -1)
                src.append(off[e] + i if i < sizes[e] else -1)
            go.append(go[-1] + rows)
        out.update(m_indices=mi, group_offsets=go)
        return out, src, src
    cap = M + E * (p - 1)
    sti, eids, y_src = [], [], [-1] * (M + 1)
    for e in range(E):
        local = e0 <= e < e1
        seg = [int(perm[q]) for q in range(off[e], off[e + 1])]
        for i, f in enumerate(seg):
            y_src[f] = off[e] + i if local else -2
        seg += [M] * (int(math.ceil(len(seg) / p)) * p - len(seg))
        sti += seg
        eids += [e - e0 if local else -1] * (len(seg) // p)
    npp = len(sti)
    sti += [M] * (cap - len(sti))
    eids += [-1] * (int(math.ceil(cap / p)) - len(eids))
    out.update(sorted_token_ids=sti, expert_ids=eids, num_tokens_post_padded=[npp])
    T = M // k
    return out, list(range(T)) + [-1], y_src


def rows_from(src, flat, d, poisoned, pad_value=None):
    want = np.zeros((len(src), d), np.float32)
    for i, s in enumerate(src):
        if s >= 0:
            want[i] = flat[s]
        elif s == -1 and poisoned:
            want[i] = np.nan
    return want


def name_of(spec, R=None, r=None):
    kind, p = LY.parse(spec)
    return "%s_%d" % (kind, p) + ("" if R is None else ".ranks_%d.rank_%d" % (R, r))


def same_bits(a, b):
    return a.shape == b.shape and a.astype(np.float32).tobytes() == b.astype(np.float32).tobytes()


def verify_file(path, specs, ranks, poisoned=False):
    """Every group of the file against the reference and the converters."""
    with h5py.File(path, "r") as f:
        fw, cfg = f["forward"], f["config"].attrs
        sizes, perm = fw["group_sizes"][()], fw["sort_perm"][()]
        T, k, E, d = (int(cfg[a]) for a in ("tokens", "top_k", "experts", "hidden"))
        names = set(f["layouts"].keys())
        want_names = {name_of(s) for s in specs}
        want_names |= {name_of(s, R, r) for s in specs for R in ranks for r in range(R)}
        assert names == want_names, (sorted(names), sorted(want_names))
        for s in specs:
            for R, r in [(None, None)] + [(R, r) for R in ranks for r in range(R)]:
                kind, p = LY.parse(s)
                e0, e1 = (0, E) if R is None else (r * E // R, (r + 1) * E // R)
                g = f["layouts"][name_of(s, R, r)]
                idx, x_src, y_src = reference(kind, p, sizes, perm, k, e0, e1)
                for n, v in idx.items():
                    got = g[n][()]
                    assert got.tolist() == list(v), (g.name, n, got[:20], v[:20])
                    assert g[n].attrs["dtype"].decode() == ("int64" if n == "group_offsets"
                                                            else "int32"), n
                xs = f["inputs"]["x"][()] if kind == "vllm-block" else fw["x_sorted"][()]
                assert same_bits(g["x"][()], rows_from(x_src, xs, d, poisoned)), (g.name, "x")
                assert same_bits(g["y"][()], rows_from(y_src, fw["y_sorted"][()], d, poisoned)), \
                    (g.name, "y")
                assert int(g.attrs["poisoned"]) == int(poisoned)
                assert (int(g.attrs["expert_begin"]), int(g.attrs["expert_end"])) == (e0, e1)
                if kind == "masked":
                    loc = sizes[e0:e1]
                    assert int(g.attrs["expected_m"]) == max(1, -(-int(loc.sum()) // len(loc)))
                # the converters, both ways
                lay = LY.Layout.compute(s, sizes, perm, k, expert_range=(e0, e1))
                for n, v in idx.items():
                    assert np.asarray(lay.index[n]).tolist() == list(v), ("package", n)
                fill = np.nan if poisoned else 0.0
                assert same_bits(lay.to_layout(xs, "x", fill), g["x"][()])
                assert same_bits(lay.to_layout(fw["y_sorted"][()], "y", fill), g["y"][()])
                back = lay.to_flat(g["y"][()])
                mine = np.array([q for q in y_src if q >= 0], np.int64)
                assert same_bits(back[mine], fw["y_sorted"][()][mine])
                assert same_bits(lay.to_flat(g["x"][()], "x")[[q for q in x_src if q >= 0]],
                                 xs[[q for q in x_src if q >= 0]])


def catalogue_case(case):
    with h5py.File(os.path.join(VECTORS, case + ".h5"), "r") as v:
        sizes = v["forward/group_sizes"][()]
        E = int(v["config"].attrs["experts"])
    big = int(sizes.max()) if sizes.size and sizes.max() > 0 else 1
    nz = [int(n) for n in sizes if n > 0]
    g = int(np.gcd.reduce(nz)) if nz else 1
    specs = ["masked:%d" % big, "batched:%d" % (big + 3), "contiguous:128", "contiguous:%d" % g,
             "contiguous:4", "vllm-block:1", "vllm-block:4", "vllm-block:16"]
    ranks = [R for R in (2, 4) if E % R == 0]
    path = os.path.join(tmp, case + ".h5")
    args = ["gen", case, "-q", "-o", path, "--layout", ",".join(specs[:4]), "--layout",
            ",".join(specs[4:])]
    for R in ranks[:1]:
        args += ["--ep-ranks", str(R)]
    dl(*args)
    verify_file(path, sorted(set(specs)), ranks[:1])
    # every other dataset is the committed vector's
    with h5py.File(path, "r") as f, h5py.File(os.path.join(VECTORS, case + ".h5"), "r") as v:
        for grp in ("inputs", "forward", "backward"):
            for n in v[grp]:
                assert same_bits(f[grp][n][()].astype(np.float64), v[grp][n][()].astype(np.float64)), n
    dl("info", path)  # the strict reader recomputes every layout


for case in CASES:
    check("%s: every layout, whole and per rank, equals the reference and the converters" % case,
          lambda case=case: catalogue_case(case))


def poisoned_twin():
    path = os.path.join(tmp, "ms-poison.h5")
    specs = ["masked:16", "contiguous:8", "vllm-block:4", "batched:16"]
    dl("gen", "mixtral-small", "-q", "-o", path, "--layout", ",".join(specs), "--layout-poison",
       "--ep-ranks", "2")
    verify_file(path, specs, [2], poisoned=True)
    with h5py.File(path, "r") as f:
        x = f["layouts/masked_16/x"][()]
        assert np.isnan(x).any() and x.view(np.uint32)[np.isnan(x)].tolist()[0] == 0x7fc00000
    dl("info", path)


check("--layout-poison: padding rows NaN (0x7fc00000), valid rows unchanged", poisoned_twin)


def tampered_golden():
    """A golden whose layout is not its routing's, even resealed, is refused
    by the strict reader, naming the dataset."""
    import ctypes
    lib = ctypes.CDLL(os.path.join(top_builddir, ".libs", "libdropless.so"))
    for n, edit in (("masked_m", lambda a: a + np.eye(1, a.size, 2, dtype=a.dtype)[0]),
                    ("sorted_token_ids", lambda a: np.where(a == a.max(), -1, a)),
                    ("y", lambda a: a * 2)):
        p = os.path.join(tmp, "tamper-%s.h5" % n)
        dl("gen", "mixtral-small", "-q", "-o", p, "--layout", "masked:16,vllm-block:4")
        grp = "masked_16" if n == "masked_m" else "vllm-block_4"
        with h5py.File(p, "r+") as f:
            d = f["layouts"][grp][n]
            d[...] = edit(d[()])
        err = ctypes.create_string_buffer(512)
        assert lib.dl_golden_seal(p.encode(), err, 512) == 0, err.value
        r = dl("info", p, want=2)
        assert "/layouts/%s/%s is not the layout of this file's routing" % (grp, n) in r.stderr, \
            r.stderr


check("a tampered (and resealed) layout group is refused by the strict reader", tampered_golden)


def one_call():
    """dropless.layouts.kernel_inputs: a golden (without /layouts) as a
    kernel's inputs in one call, and the kernel's output back to y_sorted."""
    p = os.path.join(tmp, "plain.h5")
    dl("gen", "mixtral-small", "-q", "-o", p)
    for spec in ("masked:16", "contiguous:8", "vllm-block:4", "batched:16"):
        k = LY.kernel_inputs(p, spec)
        lay = k["layout"]
        with h5py.File(p, "r") as f:
            ys = f["forward/y_sorted"][()]
            y = k["y_out"].copy()
            y[lay.y_src >= 0] = k["y_expected"][lay.y_src >= 0]
            assert same_bits(lay.to_flat(y), ys), spec
            assert k["w_gate"].shape[0] == lay.e1 - lay.e0
        if lay.kind == "masked":
            assert lay.shaped(k["x"]).shape == (8, 16, 16) and "expected_m" in k
    k = LY.kernel_inputs(p, "masked:16", expert_range=(4, 8), poisoned=True)
    assert np.isnan(k["y_out"]).all() and k["masked_m"].size == 4


check("kernel_inputs: one call from a golden to a kernel's inputs, to_flat back", one_call)


def edges():
    # an expert with zero tokens: empty-experts' 0, 4, 7 take no row, no block
    p = os.path.join(tmp, "ee.h5")
    dl("gen", "empty-experts", "-q", "-o", p, "--layout", "masked:32,contiguous:4,vllm-block:4")
    with h5py.File(p, "r") as f:
        go = f["layouts/contiguous_4/group_offsets"][()]
        for e in (0, 4, 7):
            assert f["layouts/masked_32/masked_m"][e] == 0 and go[e + 1] == go[e]
        assert not set(f["layouts/vllm-block_4/expert_ids"][()]) & {0, 4, 7}
    # one expert with every token (one-hot, k = 1): masked:T fits exactly, and
    # contiguous:8 and :16 divide every group: no padding row at all
    p = os.path.join(tmp, "oh.h5")
    dl("gen", "one-hot", "-q", "-o", p, "--layout", "masked:16,contiguous:8,contiguous:16")
    with h5py.File(p, "r") as f:
        mm = f["layouts/masked_16/masked_m"][()]
        assert sorted(mm.tolist()) == [0] * 7 + [16], mm
        for a in (8, 16):
            assert (f["layouts/contiguous_%d/m_indices" % a][()] >= 0).all()
    # the capacity too small for the hot expert: refused, the expert named
    r = dl("gen", "one-hot", "-q", "-o", os.path.join(tmp, "no.h5"), "--layout", "masked:15",
           want=2)
    assert "expert 4 has 16 rows, more than MAX_M = 15" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(tmp, "no.h5"))
    # alignment above every group: each non-empty group takes exactly ALIGN rows
    p = os.path.join(tmp, "al.h5")
    dl("gen", "mixtral-small", "-q", "-o", p, "--layout", "contiguous:128")
    with h5py.File(p, "r") as f:
        go, sz = f["layouts/contiguous_128/group_offsets"][()], f["forward/group_sizes"][()]
        assert (np.diff(go) == np.where(sz > 0, 128, 0)).all()
    # T = 0: every layout empty but vllm's sentinel rows
    p = os.path.join(tmp, "nt.h5")
    dl("gen", "no-tokens", "-q", "-o", p, "--layout", "masked:4,contiguous:4,vllm-block:4,batched:2")
    with h5py.File(p, "r") as f:
        assert f["layouts/vllm-block_4/num_tokens_post_padded"][0] == 0
        assert f["layouts/vllm-block_4/y"].shape == (1, 8)
        assert f["layouts/contiguous_4/m_indices"].shape == (0,)
    # malformed options: exit 2, nothing written
    for bad in ("masked", "masked:0", "wide:4", "masked:4,", "contiguous:x"):
        dl("gen", "tiny", "-q", "-o", os.path.join(tmp, "bad.h5"), "--layout", bad, want=2)
    dl("gen", "tiny", "-q", "-o", os.path.join(tmp, "bad.h5"), "--layout-poison", want=2)
    dl("gen", "tiny", "-q", "-o", os.path.join(tmp, "bad.h5"), "--stream", "--layout", "masked:8",
       want=2)
    assert not os.path.exists(os.path.join(tmp, "bad.h5"))


check("edges: empty expert, one hot expert, capacity refused, ALIGN > groups, T = 0, bad options",
      edges)


def graph_replays():
    """masked_m across routings of one CUDA graph: the same [E, MAX_M, d]
    shape for every seed, masked_m each routing's group sizes, and not all
    the same."""
    seen = []
    for seed in (1, 2, 3, 4):
        p = os.path.join(tmp, "replay%d.h5" % seed)
        dl("gen", "mixtral-small", "-q", "-o", p, "--seed", str(seed), "--layout", "masked:32")
        with h5py.File(p, "r") as f:
            g = f["layouts/masked_32"]
            assert g["x"].shape == (8 * 32, 16)
            assert (g["masked_m"][()] == f["forward/group_sizes"][()]).all()
            seen.append(tuple(g["masked_m"][()]))
    assert len(set(seen)) > 1, seen


check("masked_m varies across routings of one shape (CUDA-graph replays)", graph_replays)

# ------------------------------------------------------------- the zoo

ZOO_CASE = "mixtral-small"
B = 4


def golden(poison):
    p = os.path.join(tmp, "zoo%s.h5" % ("-poison" if poison else ""))
    if not os.path.exists(p):
        args = ["gen", ZOO_CASE, "-q", "-o", p, "--layout",
                "masked:16,contiguous:8,vllm-block:%d,batched:16" % B, "--ep-ranks", "2"]
        dl(*(args + (["--layout-poison"] if poison else [])))
    return p


def run_kernel(kernel, spec, poison, ranks=None, only=None):
    """A candidate holding the kernel's outputs in the layout (every rank's
    group for ranks = R), checked; the parsed JSON report."""
    gpath = golden(poison)
    cpath = os.path.join(tmp, "cand-%s-%s-%d-%s-%s.h5" % (kernel.__name__, spec.replace(":", ""),
                                                          poison, ranks, only))
    shutil.copy(gpath, cpath)
    with h5py.File(cpath, "r+") as f:
        fw, inp = f["forward"], f["inputs"]
        E, k = int(f["config"].attrs["experts"]), int(f["config"].attrs["top_k"])
        ids = fw["topk_ids"][()]
        w = {n: inp[n][()] for n in ("w_gate", "w_up", "w_down") if n in inp}
        keep = [name_of(spec)] if not ranks else [name_of(spec, ranks, r) for r in range(ranks)
                                                  if only is None or r == only]
        for grp in ("forward", "backward", "inputs"):
            del f[grp]
        for n in list(f["layouts"]):
            if n not in keep:
                del f["layouts"][n]
        if "ep" in f:
            del f["ep"]
        for n in keep:
            g = f["layouts"][n]
            a = {n2: g[n2][()] for n2 in g if n2 not in ("x", "y")}
            kind, p = LY.parse(spec)
            a.update(cap=p, e0=int(g.attrs["expert_begin"]), e1=int(g.attrs["expert_end"]),
                     E=E, k=k, topk_ids=ids)
            x = g["x"][()]
            out = np.full(g["y"].shape, np.nan if poison else 0.0, np.float32)
            res = kernel(a, x, w, out, B) if kind == "vllm-block" else kernel(a, x, w, out)
            if isinstance(res, tuple):
                idx, y = res
                for n2, v in idx.items():
                    del g[n2]
                    g[n2] = v
            else:
                y = res
            g["y"][...] = y
            del g["x"]  # an input: the kernel returns its outputs
    p = subprocess.run([DL, "check", "--json", "-", gpath, cpath], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise AssertionError("dropless check exit %d\n%s%s" % (p.returncode, p.stdout, p.stderr))
    rep = json.loads(p.stdout)
    assert rep["conformant"] == (p.returncode == 0)
    return rep


def fails(rep):
    return [(c["stage"], c["check"], c["message"]) for c in rep["checks"] if c["verdict"] == "FAIL"]


def conformant(kernel, spec, ranks=None):
    def t():
        for poison in (False, True):
            rep = run_kernel(kernel, spec, poison, ranks)
            assert rep["conformant"], (poison, fails(rep))
            got = {(c["stage"], c["check"]) for c in rep["checks"] if c["verdict"] == "PASS"}
            assert ("y_sorted", "numerics") in got, got  # the valid rows were judged
            assert ("case", "layout_y") in got, got
    return t


def not_conformant(kernel, spec, poison, check_name, *fragments):
    def t():
        rep = run_kernel(kernel, spec, poison)
        assert not rep["conformant"], "CONFORMANT"
        msgs = [m for (s, c, m) in fails(rep) if c == check_name]
        assert msgs, (check_name, fails(rep))
        for fr in fragments:
            assert any(fr in m for m in msgs), (fr, msgs)
    return t


check("zoo: masked, correct: CONFORMANT on the golden and its poisoned twin",
      conformant(K.masked_ok, "masked:16"))
check("zoo: batched, correct: CONFORMANT on both", conformant(K.batched_ok, "batched:16"))
check("zoo: contiguous, correct (padding zeroed): CONFORMANT on both",
      conformant(K.contiguous_ok, "contiguous:8"))
check("zoo: vllm-block, correct: CONFORMANT on both", conformant(K.vllm_ok, "vllm-block:%d" % B))
check("zoo: masked per EP rank (both ranks' groups): CONFORMANT on both",
      conformant(K.masked_ok, "masked:16", ranks=2))
check("zoo: vllm-block per EP rank (expert_ids -1 elsewhere, zero rows): CONFORMANT on both",
      conformant(K.vllm_ok, "vllm-block:%d" % B, ranks=2))
def one_rank():
    """A candidate with one rank's group: its rows judged by the runner, the
    rest said to be the golden's; a wrong row there still fails."""
    rep = run_kernel(K.masked_ok, "masked:16", False, ranks=2, only=1)
    assert rep["conformant"], fails(rep)
    info = [c["message"] for c in rep["checks"] if c["check"] == "layout_feed"]
    assert info and "covers" in info[0], rep["checks"]


def one_rank_bad():
    def bad(a, x, w, out):
        y = K.masked_ok(a, x, w, out)
        y[0] *= 1.01  # expert e0's first row, 1% off
        return y
    rep = run_kernel(bad, "masked:16", False, ranks=2, only=1)
    assert ("y_sorted", "numerics") in [(s, c) for s, c, m in fails(rep)], fails(rep)


check("zoo: one EP rank's masked group alone: judged on its rows, INFO for the rest", one_rank)
check("zoo: one EP rank's masked group, a row 1% off: y_sorted FAILs", one_rank_bad)
check("zoo: masked, writes its padding: NOT CONFORMANT, rows named",
      not_conformant(K.masked_writes_padding, "masked:16", False, "layout_y",
                     "padding written", "(expert "))
def plain_conformant(kernel, spec):
    """With zero padding a kernel that reads it is invisible: the reason for
    the twin."""
    def t():
        rep = run_kernel(kernel, spec, False)
        assert rep["conformant"], fails(rep)
    return t


check("zoo: masked, reads its padding: CONFORMANT on the golden (zero padding hides it)",
      plain_conformant(K.masked_reads_padding, "masked:16"))
check("zoo: masked, reads its padding: NaN leaks through the poisoned twin, rows named",
      not_conformant(K.masked_reads_padding, "masked:16", True, "layout_y",
                     "NaN/Inf (read padding?)", "(expert "))
check("zoo: contiguous, computes its padding rows: CONFORMANT on the golden (0 from 0)",
      plain_conformant(K.contiguous_computes_padding, "contiguous:8"))
check("zoo: contiguous, computes its padding rows: the poisoned twin's NaN there, rows named",
      not_conformant(K.contiguous_computes_padding, "contiguous:8", True, "layout_y",
                     "padding, must be zero (computed from padding?)", "of its block)"))
def reordered():
    rep = run_kernel(K.vllm_reversed_segments, "vllm-block:%d" % B, False)
    assert rep["conformant"], fails(rep)
    w = [c for c in rep["checks"] if c["check"] == "layout_index"]
    assert w and w[0]["verdict"] == "WARN" and "ascending" in w[0]["message"], w


check("zoo: vllm-block, each expert's slots in another order (atomics): CONFORMANT, WARN",
      reordered)
check("zoo: vllm-block, num_tokens_post_padded off by one: NOT CONFORMANT",
      not_conformant(K.vllm_off_by_one, "vllm-block:%d" % B, False, "layout_index",
                     "num_tokens_post_padded[0] = "))
check("zoo: vllm-block, sentinel -1 instead of numel: NOT CONFORMANT, slots named",
      not_conformant(K.vllm_wrong_sentinel, "vllm-block:%d" % B, False, "layout_index",
                     "= -1, expected 64 (the sentinel numel)", "sorted_token_ids["))
check("zoo: vllm-block, drops each expert's last partial block: NOT CONFORMANT, rows named",
      not_conformant(K.vllm_drops_last_block, "vllm-block:%d" % B, False, "layout_y",
                     "never written", "(token "))
check("zoo: vllm-block, drops the last partial block, poisoned: NaN rows named",
      not_conformant(K.vllm_drops_last_block, "vllm-block:%d" % B, True, "layout_y",
                     "NaN/Inf", "(token "))

shutil.rmtree(tmp, ignore_errors=True)
finish()
