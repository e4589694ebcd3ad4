#!/usr/bin/python3
"""`dropless capacity` against an independent hand computation: the
routing read from golden files with h5py, the capacity rules, the three
drop policies, padding, FLOPs, memory and the 30% threshold recomputed here
in plain Python (exact rationals for the capacity), compared number for
number with the command's JSON. Then the routing choices, T sweeps, E = 1,
T = 0, every bad input (one line, exit 2, nothing written), real PNG and
SVG plots of the documented size, and the capacity-factor example backend
dropping exactly the assignments the command predicts. Speaks TAP."""
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from fractions import Fraction

top_builddir = os.environ.get("top_builddir", ".")
top_srcdir = os.environ.get("top_srcdir", ".")
DL = os.path.join(top_builddir, "dropless")
VEC = os.path.join(top_srcdir, "vectors")
BACKENDS = os.path.join(top_builddir, "tests", "backends", ".libs")
CFS = ["0.25", "0.5", "1", "1.1", "1.25", "1.5", "2", "4", "1000"]
POLICIES = ["position", "probs", "slot"]
CASES = ["tiny", "mixtral-small", "zipf", "deepseek-v3-small-bf16", "empty-experts",
         "odd-shapes", "one-hot", "plain-ffn-fp16", "no-tokens", "single-token", "ties"]

results = []


def check(desc, fn):
    try:
        fn()
        results.append((True, desc, ""))
    except Exception as e:  # a failed check, reported and counted
        results.append((False, desc, "%s: %s" % (type(e).__name__, e)))


def run(*args, env=None):
    p = subprocess.run([DL, "capacity"] + list(args), capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr


def capacity_json(*args):
    rc, out, err = run(*args, "--json", "-")
    assert rc == 0, "exit %d: %s" % (rc, err)
    return json.loads(out)


# ------------------------------------------------- the hand computation

def read_routing(path):
    import h5py
    with h5py.File(path, "r") as f:
        ids = [[int(v) for v in row] for row in f["/forward/topk_ids"][()]]
        scores = f["/forward/router_scores"][()]
        cfg = f["/config"].attrs
        layer = {key: cfg[key] for key in cfg}
    prob = [[float(scores[t][e]) for e in row] for t, row in enumerate(ids)]
    return ids, prob, layer


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def hand_capacity(rule, cf, N, E):
    if N == 0:
        return 0
    if rule == "gshard":
        return math.ceil(Fraction(cf) * N / E)  # the decimal as written
    return math.ceil((N / E) * float(cf))       # Python floats, as Megatron-Core


def hand_keep(ids, prob, k, C, policy):
    T = len(ids)
    flat = [(t, j) for t in range(T) for j in range(k)]
    if policy == "position":
        order = flat
    elif policy == "slot":
        order = [(t, j) for j in range(k) for t in range(T)]
    else:
        order = sorted(flat, key=lambda tj: (-prob[tj[0]][tj[1]], tj[0] * k + tj[1]))
    load, keep = {}, {}
    for t, j in order:
        e = ids[t][j]
        keep[(t, j)] = load.get(e, 0) < C
        load[e] = load.get(e, 0) + keep[(t, j)]
    return keep


def per_row(layer):
    d, f = int(layer["hidden"]), int(layer["ffn"])
    size = 4 if text(layer["dtype"]) == "fp32" else 2
    if text(layer["ffn_kind"]) == "swiglu":
        return 6 * d * f, (2 * d + 3 * f) * size
    return 2 * d * d, 2 * d * size


def hand_cost(layer, rows, padded):
    fl, by = per_row(layer)
    return {"rows": rows, "padded_rows": padded, "flops_fwd": rows * fl,
            "flops_bwd": 2 * rows * fl, "waste_flops_fwd": padded * fl,
            "waste_flops_bwd": 2 * padded * fl, "extra_bytes": padded * by,
            "waste_pct": 100.0 * padded / rows if rows else 0.0}


def hand_rows(ids, prob, layer, rule):
    k, E = int(layer["top_k"]), int(layer["experts"])
    T, out = len(ids), []
    N = T * k
    for cf in CFS:
        for policy in POLICIES:
            C = hand_capacity(rule, cf, N, E)
            keep = hand_keep(ids, prob, k, C, policy)
            dropped = sorted(t * k + j for (t, j), kept in keep.items() if not kept)
            total = lost = 0.0
            for t in range(T):
                for j in range(k):
                    total += prob[t][j]
                    lost += 0.0 if keep[(t, j)] else prob[t][j]
            row = {"cf": float(cf), "capacity": C, "policy": policy, "assignments": N,
                   "dropped": len(dropped), "dropped_pct": 100.0 * len(dropped) / N if N else 0.0,
                   "tokens_all_dropped": sum(all(not keep[(t, j)] for j in range(k))
                                             for t in range(T)),
                   "dropped_mass_pct": 100.0 * lost / total if total > 0 else 0.0,
                   "dropped_at": [[f // k, f % k] for f in dropped]}
            row.update(hand_cost(layer, E * C, E * C - (N - len(dropped))))
            out.append(row)
    return out


def hand_series(ids, prob, layer):
    k, E = int(layer["top_k"]), int(layer["experts"])
    sizes = [0] * E
    for row in ids:
        for e in row:
            sizes[e] += 1
    N = sum(sizes)
    tiles = []
    for b in (1, 64, 128):
        rows = sum(-(-n // b) * b for n in sizes)
        tiles.append(dict(block=b, dropped=0, **hand_cost(layer, rows, rows - N)))
    mark = {"fraction": 0.3, "capacity": None, "cf_above": None}
    C = 1
    while N and mark["capacity"] is None:
        kept = sum(min(n, C) for n in sizes)
        if E * C - kept >= 0.3 * (E * C):
            mark = {"fraction": 0.3, "capacity": C, "cf_above": (C - 1) * E / N}
        C += 1
    return sizes, tiles, mark


def same(a, b, where):
    if isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None and abs(a - b) <= 1e-9 * max(1, abs(b)), \
            "%s: %r != %r" % (where, a, b)
    else:
        assert a == b, "%s: %r != %r" % (where, a, b)


def compare_golden(name, rule):
    path = os.path.join(VEC, name + ".h5")
    ids, prob, layer = read_routing(path)
    got = capacity_json(path, "--cf", ",".join(CFS), "--policy", ",".join(POLICIES),
                        "--rule", rule)
    assert got["rule"] == rule and len(got["series"]) == 1
    s = got["series"][0]
    want = hand_rows(ids, prob, layer, rule)
    assert len(s["capacity_rows"]) == len(want)
    for g, w in zip(s["capacity_rows"], want):
        for key in w:
            same(g[key], w[key], "%s cf %s %s %s" % (name, w["cf"], w["policy"], key))
    sizes, tiles, mark = hand_series(ids, prob, layer)
    same(s["group_sizes"], sizes, "group_sizes")
    for g, w in zip(s["dropless_rows"], tiles):
        for key in w:
            same(g[key], w[key], "%s dropless/%d %s" % (name, w["block"], key))
    for key in mark:
        same(s["waste_mark"][key], mark[key], "%s waste_mark %s" % (name, key))


for name in CASES:
    for rule in ("gshard", "megatron"):
        check("%s (%s rule): every count, FLOP and byte as computed by hand" % (name, rule),
              lambda n=name, r=rule: compare_golden(n, r))


# ------------------------------------------------- the command's choices

def t_case_is_golden():
    a = capacity_json("mixtral-small-bf16")
    b = capacity_json(os.path.join(VEC, "mixtral-small-bf16.h5"))
    assert a["series"] == b["series"] and a["golden"] is False and b["golden"] is True


def t_cf_large_nothing_drops():
    s = capacity_json("deepseek-v3-small", "--cf", "100")["series"][0]
    for row in s["capacity_rows"]:
        assert row["dropped"] == 0 and row["dropped_at"] == [] and row["tokens_all_dropped"] == 0
        assert row["capacity"] == 100 * 16 * 8 // 32  # exact: 100 * T * k / E
        assert row["padded_rows"] == 32 * row["capacity"] - 16 * 8


def t_sweep():
    got = capacity_json("mixtral-small", "--routing", "uniform,zipf:2", "--tokens", "0,64,512",
                        "--cf", "1,2")
    s = got["series"]
    assert [(x["routing"], x["tokens"]) for x in s] == [
        ("uniform", 0), ("uniform", 64), ("uniform", 512), ("zipf", 0), ("zipf", 64), ("zipf", 512)]
    for x in s:
        assert sum(x["group_sizes"]) == 2 * x["tokens"]
    for x in (s[0], s[3]):  # T = 0: nothing routed, nothing computed
        for row in x["capacity_rows"]:
            assert row["capacity"] == 0 and row["dropped"] == 0 and row["rows"] == 0
            assert row["dropped_pct"] == 0 and row["waste_pct"] == 0
        assert all(r["rows"] == 0 for r in x["dropless_rows"])
        assert x["waste_mark"]["capacity"] is None
    # Zipf(2) piles the load onto expert 0 and drops far more at cf = 1
    assert s[5]["group_sizes"][0] > 2 * s[2]["group_sizes"][0]
    assert s[5]["capacity_rows"][0]["dropped"] > 2 * s[2]["capacity_rows"][0]["dropped"]
    # uniform popularity keeps every load within 2x the mean
    assert max(s[2]["group_sizes"]) < 2 * 512 * 2 / 8


def t_one_expert():
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "one.case")
        with open(cfg, "w") as f:
            f.write("name = one-expert\ntokens = 10\nhidden = 4\nexperts = 1\ntop_k = 1\n")
        gold = os.path.join(d, "one-expert.h5")
        p = subprocess.run([DL, "gen", "-q", "--config", cfg, "-o", gold], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        s = capacity_json(cfg, "--cf", "0.75,1,1.05")["series"][0]
        assert [r["capacity"] for r in s["capacity_rows"][::2]] == [8, 10, 11]
        assert [r["dropped"] for r in s["capacity_rows"][::2]] == [2, 0, 0]
        assert s["capacity_rows"][0]["dropped_at"] == [[8, 0], [9, 0]]
        assert s["capacity_rows"][0]["tokens_all_dropped"] == 2
        assert s["capacity_rows"][4]["padded_rows"] == 1
        b = capacity_json(gold, "--cf", "0.75,1,1.05")["series"][0]
        assert b == s


def t_table():
    rc, out, err = run("tiny", "--drops")
    assert rc == 0 and err == "", err
    lines = out.splitlines()
    assert any(l.split()[:1] == ["dropless/128"] for l in lines), out
    assert sum(1 for l in lines if re.match(r"\s+1\s+2\s+(position|probs)\s", l)) == 2, out
    assert "padding reaches 30%" in out


def t_help():
    for args in (["capacity", "--help"], ["help", "capacity"]):
        p = subprocess.run([DL] + args, capture_output=True, text=True)
        assert p.returncode == 0 and p.stdout.startswith("usage: dropless capacity"), p.stdout
    p = subprocess.run([DL, "help"], capture_output=True, text=True)
    assert re.search(r"^  capacity ", p.stdout, re.M), p.stdout


check("dropless capacity --help, dropless help capacity, listed by dropless help", t_help)
check("a case name and its golden file give the same routing and numbers", t_case_is_golden)
check("cf large enough: nothing drops, every expert padded to C", t_cf_large_nothing_drops)
check("routing choices and T sweeps: uniform, Zipf(2), T = 0, 64, 512", t_sweep)
check("E = 1 from a case file: C = ceil(cf T), drops in token order; its golden agrees", t_one_expert)
check("the text table: a row per cf and policy, the dropless rows, the 30% line", t_table)


# --------------------------------------------------------------- bad input

def one_line_exit2(args, where=None, env=None):
    rc, out, err = run(*args, env=env)
    assert rc == 2, "exit %d for %r: %s" % (rc, args, err)
    assert err.count("\n") == 1 and err.startswith("dropless capacity: "), repr(err)
    assert out == "", out
    if where:
        assert where in err, err
    return err


def t_bad_inputs():
    with tempfile.TemporaryDirectory() as d:
        junk = os.path.join(d, "junk.h5")
        with open(junk, "w") as f:
            f.write("not HDF5\n")
        trunc = os.path.join(d, "trunc.h5")
        with open(os.path.join(VEC, "tiny.h5"), "rb") as f:
            data = f.read()
        with open(trunc, "wb") as f:
            f.write(data[: len(data) // 2])
        cases = [["tiny", "--cf", v] for v in
                 ["0", "-1", "nan", "NaN", "inf", "1e9", "abc", "", "1,,2", "1,", "2:1:0.5",
                  "1:2:0", "1:2", "0:2:0.5"]]
        cases += [["tiny", "--policy", "lowest"], ["tiny", "--policy", ""],
                  ["tiny", "--rule", "switch"], ["tiny", "--routing", "zipf:x"],
                  ["tiny", "--routing", "zipf:-1"], ["tiny", "--routing", "zipf:17"],
                  ["tiny", "--routing", "normal"], ["tiny", "--tokens", "-1"],
                  ["tiny", "--tokens", "x"], ["tiny", "--tokens", "99999999999"],
                  ["no-such-case"], [os.path.join(d, "missing.h5")], [junk], [trunc],
                  ["tiny", "--plot", os.path.join(d, "x.pdf")], ["tiny", "mixtral-small"], [],
                  ["tiny", "--bogus"], ["tiny", "--cf"],
                  [os.path.join(VEC, "tiny.h5"), "--tokens", "8"]]
        for args in cases:
            one_line_exit2(args)
        assert sorted(os.listdir(d)) == ["junk.h5", "trunc.h5"]  # nothing written
        one_line_exit2([junk], where=junk)
        one_line_exit2(["tiny", "--cf", "nan"], where="nan")
        one_line_exit2(["tiny", "--policy", "lowest"], where="lowest")


def t_no_overwrite():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        with open(out, "w") as f:
            f.write("keep me")
        one_line_exit2(["tiny", "--json", out], where="--force")
        with open(out) as f:
            assert f.read() == "keep me"
        rc, _, err = run("tiny", "--json", out, "--force", "-q")
        assert rc == 0, err
        with open(out) as f:
            assert json.load(f)["case"] == "tiny"
        sub = os.path.join(d, "dir.json")
        os.mkdir(sub)
        one_line_exit2(["tiny", "--json", sub, "--force"], where="not replaced")
        assert sorted(os.listdir(d)) == ["dir.json", "r.json"]


check("bad input (cf <= 0, NaN, inf, unknown policy, rule, routing, files): one line, exit 2, nothing written",
      t_bad_inputs)
check("--json never overwrites without --force, never replaces a directory", t_no_overwrite)


# ------------------------------------------------------------------ plots

def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", head
    return struct.unpack(">II", head[16:24])


def t_plot_png():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cap.png")
        rc, _, err = run("mixtral-small", "--routing", "uniform,zipf:1.2", "--tokens", "1024",
                         "--cf", "1:3:0.1", "--plot", out, "-q")
        assert rc == 0, err
        assert png_size(out) == (1000, 400)
        assert os.path.getsize(out) > 20000, os.path.getsize(out)  # lines and text, not blank
        assert os.listdir(d) == ["cap.png"]
        before = open(out, "rb").read()
        one_line_exit2(["tiny", "--plot", out], where="--force")
        assert open(out, "rb").read() == before


def t_plot_svg():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cap.svg")
        rc, _, err = run("deepseek-v3-small", "--routing", "case,uniform,zipf:1.2", "--cf",
                         "1,1.25,1.5,2,4", "--plot", out, "-q")
        assert rc == 0, err
        root = ET.parse(out).getroot()
        assert root.tag.endswith("svg"), root.tag
        assert (root.get("width"), root.get("height")) == ("720pt", "288pt"), root.attrib
        paths = [e for e in root.iter() if e.tag.endswith("path")]
        assert len(paths) > 50, len(paths)


def t_plot_failure():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cap.png")
        for py in ("/nonexistent/python3", "/bin/false"):
            env = dict(os.environ, DROPLESS_PYTHON=py)
            rc, _, err = run("tiny", "--plot", out, "-q", env=env)
            assert rc == 1, (rc, err)
            assert err.count("\n") == 1 and err.startswith("dropless capacity: "), repr(err)
            assert os.listdir(d) == [], os.listdir(d)


check("--plot FILE.png: a real 1000x400 PNG; never overwritten without --force", t_plot_png)
check("--plot FILE.svg: a real 720x288 pt SVG", t_plot_svg)
check("a plot that cannot be drawn: exit 1, one line, no file left", t_plot_failure)


# ------------------------------------------- the negative-control backend

def t_backend_drops(name):
    gold = os.path.join(VEC, name + ".h5")
    with tempfile.TemporaryDirectory() as d:
        rep = os.path.join(d, "r.json")
        p = subprocess.run([DL, "run", "--backend", os.path.join(BACKENDS, "capacity.so"),
                            "--json", rep, gold], capture_output=True, text=True)
        assert p.returncode == 1, p.stderr
        with open(rep) as f:
            dropped = json.load(f)["dropped"]
    s = capacity_json(gold, "--cf", "1", "--policy", "slot")["series"][0]["capacity_rows"][0]
    assert dropped["count"] == s["dropped"] > 0, (dropped["count"], s["dropped"])
    assert not dropped["truncated"] and dropped["pairs"] == s["dropped_at"]


for name in ("mixtral-small", "deepseek-v3-small", "zipf"):
    check("capacity backend on %s: the runner finds exactly the (t, j) that capacity --cf 1 "
          "--policy slot predicts" % name, lambda n=name: t_backend_drops(n))


print("1..%d" % len(results))
for i, (ok, desc, why) in enumerate(results, 1):
    print("%s %d - %s" % ("ok" if ok else "not ok", i, desc))
    if not ok:
        print("# " + why.replace("\n", "\n# "))
