#!/usr/bin/python3
"""The runner's power and its false alarms, measured (doc/power.md).

    power.py legit [--seeds N] [--cases A,B] [--kernel-cases A,B --kernel-seeds N] [--jobs N]
        the legitimate-implementations matrix (legit.py) in two modes
        (staged: every stage; fused: out and d_x): every run must be
        CONFORMANT; prints each false FAIL and the counts; exit 1 if any.
        --jobs N: N worker processes (one case x seed each, OMP_NUM_THREADS=1).
    power.py kill [--seeds N] [--cases A,B]
        the kill rate of every mutation x stage x mode (dropless.mutate)
        and the detection floor of each handed-over stage per mode.
    power.py doc [--seeds ...] [--write doc/power.md]
        both; --write replaces the tables between the markers of the doc.

Everything is deterministic (seeded cases, the format's PRNG for the
mutants' picks, bit-exact checks): the same runner gives the same tables.
Cases are generated in memory (dropless.generate), nothing is written but
the doc.
"""
import argparse
import datetime
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("top_srcdir", os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(SRC, "python"))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
if "DROPLESS_LIB" not in os.environ:
    os.environ["DROPLESS_LIB"] = os.path.join(os.environ.get("top_builddir", SRC), ".libs",
                                              "libdropless.so")
import numpy as np  # noqa: E402
import dropless  # noqa: E402
import legit  # noqa: E402
import kernels  # noqa: E402  (tests/zoo, on the path through legit)

# the small catalogue: every vectors-tier case but no-tokens (T = 0: no row
# to mutate or compute) and plain-ffn (the kernels are SwiGLU layers)
SMALL = ["tiny", "ties", "ties-grouped", "empty-experts", "one-hot", "single-token", "odd-shapes",
         "zipf", "mixtral-small", "deepseek-v3-small", "grouped-max", "qwen2-moe-like",
         "deepseek-v3-shared"]
DTYPES = ["", "-bf16"]
# the kernel tier: the two catalogue kernel cases whose golden and candidate
# fit in about 3 GiB (kernel-sizes-bf16: 1.3 GiB resident; kernel-t33-bf16:
# 256 experts, 2.6 GiB with the staged candidate checked from a file, 3.9
# GiB in memory; kernel-t4096-bf16 takes 6.9 GiB and 4 minutes a check)
KERNEL = ["kernel-sizes-bf16", "kernel-t33-bf16"]
# a staged candidate above this many float elements is checked from a
# temporary file (kernels.write), not from memory: the library's copy of an
# in-memory candidate would double its weight gradients
VIA_FILE = 50_000_000
MODES = ["staged", "fused", "out"]
MUTATIONS = ["gain", "sign", "zero_row", "off_by_one", "drop_slot", "swap_experts", "bf16_acc",
             "tf32", "ulp_weights", "reorder"]
FUSED = ("out", "d_x")
# d = f = 512 (case files here): where bf16 accumulation and undeclared TF32
# must be caught through out (issue 24); the GEMM mutations at the forward GEMMs
WIDE = ["wide512", "wide512-bf16"]
WIDE_MUTATIONS = ["off_by_one", "drop_slot", "swap_experts", "bf16_acc", "tf32", "ulp_weights"]
WIDE_STAGES = ["h_gate", "out"]


F32 = np.float32


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def goldens(cases, seeds, seed_major=False):
    """(name, seed, golden) for each case and seed 1..seeds; seed_major:
    every case of seed 1 first (a cut-short run then covers every case)."""
    pairs = [(n, s) for s in range(1, seeds + 1) for n in cases] if seed_major else \
        [(n, s) for n in cases for s in range(1, seeds + 1)]
    for name, s in pairs:
        g = dropless.generate(name, seed=s)
        yield os.path.basename(name).replace(".case", ""), s, g
        g.close()


def verdict(rep):
    return "FAIL" if not rep.conformant else "PASS"


# ------------------------------------------------------------------ legit

def check_staged(g, st, impl):
    """The staged check of st: from memory, or for a large candidate from a
    temporary candidate file (st is emptied first, so only the library holds
    the candidate while it is checked)."""
    dt = g.config["dtype"]
    if sum(v.size for v in st.values()) < VIA_FILE:
        return dropless.check(g, st, compute_mode=dt, backend=impl)
    group = {r["name"]: r["group"] for r in dropless.layout()["arrays"]}
    fd, path = tempfile.mkstemp(prefix="dl_power.", suffix=".h5")
    os.close(fd)
    try:
        kernels.write(path, {group[n] + "/" + n: v for n, v in st.items()}, impl, dt)
        st.clear()
        return dropless.check(g, path)
    finally:
        os.remove(path)


def legit_unit(name, seed, deadline=None):
    """One case x seed of the legit matrix, every implementation x mode (a
    worker's unit of work): (counts, fails, peak) with counts[(impl, mode)]
    = [runs, false FAILs], fails the (impl, mode, case, seed, message) of
    each false FAIL and peak the process's peak resident KiB; None when
    time.time() > deadline at the start."""
    if deadline is not None and time.time() > deadline:
        return None
    counts, fails = {}, []
    g = dropless.generate(name, seed=seed)
    try:
        # the inputs copied once for every implementation, but not on the
        # kernel tier's large cases: there the copy would stay resident
        # beside each staged candidate (kernel-t33-bf16: 0.8 GiB more)
        c = g.config
        big = 3 * int(c["experts"]) * int(c["hidden"]) * int(c["ffn"]) > VIA_FILE // 4
        cz = None if big else legit.inputs(g)
        for impl, *_ in legit.IMPLS:
            st = legit.run(impl, g, seed, cz)
            if st is None:
                continue
            for mode in ("fused", "staged"):
                if mode == "fused":
                    rep = dropless.check(g, {k: st[k] for k in FUSED}, compute_mode=g.config["dtype"],
                                         backend=impl)
                else:
                    rep = check_staged(g, st, impl)
                c = counts.setdefault((impl, mode), [0, 0])
                c[0] += 1
                if not rep.conformant:
                    c[1] += 1
                    fails.append((impl, mode, name, seed, "; ".join(
                        "%s %s %s" % (f.get("stage"), f.get("check"), (f.get("message") or "")[:90])
                        for f in rep.failures[:3])))
            del st
    finally:
        g.close()
    return counts, fails, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def worker_pool(jobs):
    """A pool of `jobs` fresh processes (spawned: no libgomp state crosses a
    fork), each with one OpenMP and BLAS thread (set before they load the
    library); None for jobs <= 1 (everything in this process)."""
    if jobs <= 1:
        return None
    import concurrent.futures
    import multiprocessing
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    return concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))


def legit_matrix(cases, seeds, out=sys.stdout, deadline=None, pool=None):
    """Every implementation x case x seed x mode, seed-major (a cut-short
    run covers every case); in pool's workers when given. Returns (counts,
    fails, done): counts[(impl, mode)] = [runs, false FAILs], done[case] =
    how many seeds were measured (no seed is started after time.time() >
    deadline)."""
    units = [(n, s) for s in range(1, seeds + 1) for n in cases]
    if pool is None:
        results = (legit_unit(n, s, deadline) for n, s in units)
    else:
        results = pool.map(legit_unit, [n for n, _ in units], [s for _, s in units],
                           [deadline] * len(units))
    counts, fails, done = {}, [], {}
    for (name, seed), res in zip(units, results):
        if res is None:
            log("legit: the time budget is spent before %s seed %d" % (name, seed))
            continue
        for key, (n, f) in res[0].items():
            c = counts.setdefault(key, [0, 0])
            c[0] += n
            c[1] += f
        PEAK[0] = max(PEAK[0], res[2])
        for impl, mode, case, sd, msg in res[1]:
            fails.append((impl, mode, case, sd, msg))
            print("false FAIL: %s %s %s seed %d: %s" % (impl, mode, case, sd, msg), file=out, flush=True)
        done[name] = done.get(name, 0) + 1
        log("legit %s seed %d done: %d runs, %d false FAIL so far" % (
            name, seed, sum(n for n, _ in counts.values()), len(fails)))
    return counts, fails, done


def drops_matrix(cases, seeds, impl="fp32-blocked"):
    """A correct kernel handed over as out alone: its zero_drops verdict per
    case (issue 24 item 3: PASS, or a WARN whose printed floor says why);
    rows[case] = [runs, PASS, WARN, other, smallest weakest-slot margin]."""
    rows = {}
    for name, seed, g in goldens(cases, seeds):
        st = legit.run(impl, g, seed)
        if st is None:
            continue
        rep = dropless.check(g, {"out": st["out"]}, compute_mode=g.config["dtype"], backend=impl)
        zd = next(c for c in rep.checks if c["check"] == "zero_drops")
        r = rows.setdefault(name, [0, 0, 0, 0, float("inf")])
        r[0] += 1
        r[{"PASS": 1, "WARN": 2}.get(zd["verdict"], 3)] += 1
        margin = 1.0 / zd["err_pass"] if zd.get("err_pass") else float("inf")
        r[4] = min(r[4], margin)
        log("drops %s seed %d: %s (weakest slot at %.3g x the floor)" % (name, seed, zd["verdict"], margin))
    lines = ["| case | runs | zero_drops PASS | WARN (below the floor) | other | weakest slot / floor (min) |",
             "|---|---|---|---|---|---|"]
    for name, (n, p, w, o, m) in rows.items():
        lines.append("| %s | %d | %d | %d | %d | %.3g |" % (name, n, p, w, o, m))
    return "\n".join(lines)


def capacity_run(g, cf=1.0):
    """(report, dropped pairs) of a capacity-factor-cf kernel handed over as
    out alone (the case's storage; pairs with a nonzero weight), or None
    where the zoo's Layer does not apply."""
    c, z = legit.inputs(g)
    if c["ffn_kind"] != "swiglu" or int(c["tokens"]) == 0 or c["dtype"] not in ("fp32", "bf16"):
        return None
    keep = kernels.capacity_keep(z, int(c["experts"]), cf)
    L = kernels.Layer(c, z, rnd=kernels.bf16 if c["dtype"] == "bf16" else (lambda a: a.astype(F32)),
                      keep=keep)
    L.forward()
    rep = dropless.check(g, {"out": L.out}, compute_mode=c["dtype"], backend="capacity-%g" % cf)
    return rep, {(int(t), int(j)) for t, j in zip(*np.nonzero(~keep & (L.w != 0)))}


def named_matrix(cases, seeds, cf=1.0):
    """A dropping kernel handed over as out alone: Switch-style capacity
    factor cf (tests/zoo/kernels.py capacity_keep, the case's storage). Per
    case: runs, NOT CONFORMANT, pairs dropped (with a nonzero weight),
    named among them, named but not dropped, and the report's own count
    (issue 24 item 2: every dropped pair named, all of them in JSON)."""
    rows = {}
    for name, seed, g in goldens(cases, seeds):
        r_ = capacity_run(g, cf)
        if r_ is None:
            continue
        rep, dropped = r_
        named = set(rep.dropped)
        r = rows.setdefault(name, [0, 0, 0, 0, 0, 0])
        for i, v in enumerate((1, not rep.conformant, len(dropped), len(named & dropped),
                               len(named - dropped), rep.n_dropped)):
            r[i] += v
        log("named %s seed %d: %d of %d dropped pairs named, %d wrongly, %s" % (
            name, seed, len(named & dropped), len(dropped), len(named - dropped), rep.verdict))
    lines = ["| case | runs | NOT CONFORMANT | pairs dropped | named | named, not dropped | report's count |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append("| %s | %s |" % (name, " | ".join("%d" % v for v in r)))
    return "\n".join(lines)


def legit_table(counts, cases_desc):
    lines = ["| implementation | mode | runs | CONFORMANT | false FAIL |", "|---|---|---|---|---|"]
    for (impl, mode), (n, f) in sorted(counts.items(), key=lambda kv: ([r[0] for r in legit.IMPLS].index(kv[0][0]), kv[0][1])):
        lines.append("| %s | %s | %d | %d | %d |" % (impl, mode, n, n - f, f))
    tot = sum(n for n, _ in counts.values())
    ff = sum(f for _, f in counts.values())
    lines.append("")
    lines.append("%d runs on %s: **%d false FAIL**." % (tot, cases_desc, ff))
    return "\n".join(lines)


# ------------------------------------------------------------------- kill

def kill_rates(cases, seeds, mutations=MUTATIONS, stages=None):
    """kills[(mutation, stage, mode, dtype)] = [mutants, NOT CONFORMANT]."""
    kills = {}
    for name, seed, g in goldens(cases, seeds):
        dt = g.config["dtype"]
        for m in mutations:
            for s in stages or g.stages():
                for mode in MODES:
                    r = dropless.mutant_check(g, m, s, mode, seed=seed)
                    if r is None:
                        continue
                    k = kills.setdefault((m, s, mode, dt), [0, 0])
                    k[0] += 1
                    k[1] += not r[0]["conformant"]
    return kills


def floors(cases, seeds, p_max):
    """The detection floor of each handed-over stage per mode and dtype: the
    smallest 2^-p for which a gain 1 + 2^-p at that stage is NOT
    CONFORMANT in every trial, and so is every larger gain. Found by
    bisection over p in [1, p_max] (the kill rate falls as p grows; a p at
    which no mutant differs from the golden counts as missed);
    {(stage, mode, dtype): (p or None, p == p_max)}, float stages only."""
    gold = [dropless.generate(n, seed=s) for n in cases for s in range(1, seeds + 1)]
    out, by_dt = {}, {}
    for g in gold:
        by_dt.setdefault(g.config["dtype"], []).append(g)

    def all_caught(gs, st, mode, p):
        rs = [dropless.mutant_check(g, "gain", st, mode, gain_p=p, seed=g.seed) for g in gs]
        rs = [r for r in rs if r is not None]
        return bool(rs) and all(not r[0]["conformant"] for r in rs), bool(rs)

    for dt, gs in sorted(by_dt.items()):
        for mode in MODES:
            stages = gs[0].stages() if mode == "staged" else (FUSED if mode == "fused" else ("out",))
            for st in stages:
                ok, exists = all_caught(gs, st, mode, 1)
                if not exists:
                    continue  # not a float stage: no gain applies
                lo, hi = (1, p_max[dt] + 1) if ok else (0, 1)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if all_caught(gs, st, mode, mid)[0]:
                        lo = mid
                    else:
                        hi = mid
                out[(st, mode, dt)] = (lo or None, lo == p_max[dt])
    for g in gold:
        g.close()
    return out


STRONG = {"sign", "zero_row", "off_by_one", "drop_slot", "swap_experts"}
FORWARD = {"x_sorted", "h_gate", "h_up", "h_act", "y_sorted", "out"}


def must_fail(m, stage, mode, dtype):
    """Whether a correct runner cannot miss this mutant: staged, every
    strong defect and the undeclared arithmetic; fused and out-only, the
    strong defects of the forward stages (their error reaches out
    undiminished, unless the slot it touches is below the floor)."""
    if mode == "staged":
        return m in STRONG or m == "bf16_acc" or (m == "tf32" and dtype == "fp32")
    return m in STRONG and stage in FORWARD


def flag_of(rep, stage):
    """Why a CONFORMANT report still flags stage, or None: a WARN of the
    second chained level (issue 24 item 3: off its own stored upstream,
    within the bound from the exact inputs), or the NOTE that its storage
    was inferred coarser than the case's (item 4). A staged mutant whose
    defect is one stage's arithmetic can hide there on a small case: bf16
    accumulation at small K is the size of the upstream's rounding, which a
    kernel that consumed its upstream unrounded also shows, and a bf16
    accumulator's fp32 output lies on the bf16 grid, as a correct result
    stored in bf16 does (doc/power.md)."""
    mine = [c for c in rep["checks"] if c.get("stage") == stage]
    if any(c.get("verdict") == "WARN" and "not with its own stored upstream" in (c.get("message") or "")
           for c in mine):
        return "second level WARN"
    if any(c.get("check") == "storage" and "inferred" in (c.get("message") or "") for c in mine):
        return "storage inferred"
    return None


def survivors(cases, seeds):
    """The mutants a correct runner must catch that stay CONFORMANT, by
    (mutation, stage, mode, dtype): [mutants, survivors, flagged, silent,
    {flag: count}, cases]."""
    out = {}
    for name, seed, g in goldens(cases, seeds):
        dt = g.config["dtype"]
        for m in MUTATIONS:
            for s in g.stages():
                for mode in MODES:
                    if not must_fail(m, s, mode, dt):
                        continue
                    r = dropless.mutant_check(g, m, s, mode, seed=seed)
                    if r is None:
                        continue
                    row = out.setdefault((m, s, mode, dt), [0, 0, 0, 0, {}, set()])
                    row[0] += 1
                    if not r[0]["conformant"]:
                        continue
                    why = flag_of(r[0], s)
                    row[1] += 1
                    row[2 if why else 3] += 1
                    zd = [c for c in r[0]["checks"] if c["check"] == "zero_drops"]
                    if not why and zd and zd[0]["verdict"] == "WARN":
                        why_s = "silent, out's floor WARNed"  # some slot of out is below its floor
                    else:
                        why_s = why or "silent"
                    row[4][why_s] = row[4].get(why_s, 0) + 1
                    row[5].add(name)
    return out


def survivors_table(sv):
    lines = ["| mutation | stage | mode | dtype | mutants | CONFORMANT | flagged | silent | how | cases |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    order = dropless.stage_names()
    for (m, s, mode, dt), (n, c, f, q, how, cs) in sorted(
            sv.items(), key=lambda kv: (MUTATIONS.index(kv[0][0]), order.index(kv[0][1]), kv[0][2], kv[0][3])):
        if c:
            lines.append("| %s | %s | %s | %s | %d | %d | %d | %d | %s | %s |" % (
                m, s, mode, dt, n, c, f, q, ", ".join("%s %d" % kv for kv in sorted(how.items())),
                ", ".join(sorted(cs))))
    tot = [sum(v[i] for v in sv.values()) for i in range(4)]
    lines.append("")
    lines.append("%d must-fail mutants: %d CONFORMANT (%d flagged, %d silent)." % tuple(tot))
    return "\n".join(lines)


def pct(k):
    n, c = k
    return "%d/%d" % (c, n) if n else "-"


def kill_table(kills):
    dts = sorted({k[3] for k in kills}, key=lambda t: t != "fp32")
    head = "| mutation | stage | " + " | ".join("%s %s" % (m, d) for d in dts for m in MODES) + " |"
    lines = [head, "|---|---|" + "---|" * (len(dts) * len(MODES))]
    stage_order = dropless.stage_names()
    keys = sorted({(k[0], k[1]) for k in kills}, key=lambda x: (MUTATIONS.index(x[0]), stage_order.index(x[1])))
    for m, s in keys:
        cells = [pct(kills.get((m, s, mode, d), [0, 0])) for d in dts for mode in MODES]
        lines.append("| %s | %s | %s |" % (m, s, " | ".join(cells)))
    # per mutation x mode totals
    lines.append("")
    lines.append("| mutation | " + " | ".join("%s %s" % (m, d) for d in dts for m in MODES) + " |")
    lines.append("|---|" + "---|" * (len(dts) * len(MODES)))
    for m in MUTATIONS:
        cells = []
        for d in dts:
            for mode in MODES:
                n = sum(v[0] for k, v in kills.items() if k[0] == m and k[2] == mode and k[3] == d)
                c = sum(v[1] for k, v in kills.items() if k[0] == m and k[2] == mode and k[3] == d)
                cells.append("%d/%d (%.0f%%)" % (c, n, 100.0 * c / n) if n else "-")
        lines.append("| %s | %s |" % (m, " | ".join(cells)))
    return "\n".join(lines)


def floor_table(fl):
    dts = sorted({k[2] for k in fl}, key=lambda t: t != "fp32")
    lines = ["| stage | " + " | ".join("%s %s" % (m, d) for d in dts for m in MODES) + " |",
             "|---|" + "---|" * (len(dts) * len(MODES))]
    for st in dropless.stage_names():
        if not any(k[0] == st for k in fl):
            continue
        cells = []
        for d in dts:
            u = 24 if d == "fp32" else 8  # significand bits: u = 2^-bits
            for mode in MODES:
                if (st, mode, d) not in fl:
                    cells.append("")
                    continue
                p, capped = fl[(st, mode, d)]
                cells.append("> 2^-1" if p is None else "%s2^-%d (%s u)" % (
                    "<= " if capped else "", p, fmt_u(2.0 ** (u - p))))
        lines.append("| %s | %s |" % (st, " | ".join(cells)))
    return "\n".join(lines)


def fmt_u(x):
    return "%d" % x if x >= 1 else "%.2g" % x


# -------------------------------------------------------------------- doc

def machine(workers=False):
    """Date, host and load: what the meta lines state beside the commit (the
    peak of this process, or with workers of its largest worker)."""
    peak = max(PEAK[0] if workers else 0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return "%s UTC on %s (%s, %d CPUs, load %.1f at the end), peak %.1f GiB resident%s" % (
        datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), platform.node() or "?",
        platform.machine(), os.cpu_count() or 0, os.getloadavg()[0], peak / 2.0 ** 20,
        " per process, %d worker processes" % JOBS[0] if workers and JOBS[0] > 1 else "")


JOBS = [1]  # --jobs, for the meta lines
PEAK = [0]  # the largest worker's peak resident KiB


def runner_commit():
    try:
        return subprocess.run(["git", "-C", SRC, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def replace_block(text, tag, body):
    a, b = "<!-- %s begin -->" % tag, "<!-- %s end -->" % tag
    i, j = text.index(a), text.index(b)
    return text[:i + len(a)] + "\n" + body.strip() + "\n" + text[j:]


def write_blocks(path, blocks):
    """Replaces the blocks in the doc at path, under a lock: `legit` and
    `kill` may run at once and each writes its own blocks."""
    import fcntl
    with open(path + ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        text = open(path).read()
        for tag, body in blocks.items():
            text = replace_block(text, tag, body)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    os.remove(path + ".lock")
    log("wrote %s" % path)


def do_legit(a, cases, kcases):
    """The legit blocks: the small catalogue's (seeds > 0) and the kernel
    tier's (kernel seeds > 0), each with the runner commit."""
    blocks, bad = {}, 0
    # the small catalogue as one part, each kernel case as its own (its own
    # time budget: a cut-short kernel case says how many seeds it got)
    parts = [("power-legit", cases, a.seeds, None)] + [
        ("power-legit-kernel", [k], a.kernel_seeds, a.kernel_budget_s) for k in kcases]
    counts_by, said = {}, {}
    pool = worker_pool(a.jobs)
    for tag, cs, seeds, budget in parts:
        if not cs or seeds <= 0:
            continue
        log("legit: %s x %d seeds" % (",".join(cs), seeds))
        t0 = time.time()
        counts, fails, done = legit_matrix(cs, seeds, deadline=t0 + budget if budget else None, pool=pool)
        bad += len(fails)
        tot = counts_by.setdefault(tag, {})
        for key, (n, f) in counts.items():
            c = tot.setdefault(key, [0, 0])
            c[0] += n
            c[1] += f
        if tag == "power-legit":
            what = "%d small cases (%s; fp32 and bf16) x %d seeds" % (
                len(cs) // 2, ", ".join(a.cases.split(",")), min(done.values(), default=0))
        else:
            what = "%s x %d seeds%s" % (cs[0], done.get(cs[0], 0), "" if done.get(cs[0], 0) == seeds else
                                        " (of %d: the %d s budget ran out)" % (seeds, budget))
        said.setdefault(tag, []).append("%s (%.0f s)" % (what, time.time() - t0))
        blocks[tag] = legit_table(counts_by[tag], "; ".join(said[tag])) + "\n\n" + (
            "Measured by `tests/zoo/power/power.py legit` on runner commit `%s`, %s." % (
                runner_commit(), machine(workers=True)))
        if a.write:  # after each part: a run stopped later keeps what it measured
            write_blocks(a.write, {tag: blocks[tag]})
    if pool is not None:
        pool.shutdown()
    return blocks, bad


def do_kill(a, cases):
    """The kill blocks named in a.parts (kill, wide, floor) and their meta."""
    blocks, said = {}, {}
    if "kill" in a.parts:
        blocks["power-kill"] = kill_table(kill_rates(cases, a.kill_seeds))
        said["kill"] = "kill rates over %d seeds of %s" % (a.kill_seeds, ", ".join(cases))
    wide = [os.path.join(HERE, w + ".case") for w in a.wide_cases.split(",") if w]
    if "wide" in a.parts and wide:
        blocks["power-wide"] = kill_table(kill_rates(wide, 1, mutations=WIDE_MUTATIONS, stages=WIDE_STAGES))
        said["wide"] = "the d = f = 512 cases (%s) over 1 seed" % a.wide_cases
    if "drops" in a.parts:
        dc = cases + [c for c in a.drops_kernel_cases.split(",") if c]
        blocks["power-drops"] = drops_matrix(dc, a.kill_seeds)
        said["drops"] = "zero drops of a correct out-only kernel (fp32-blocked) over %d seeds of %s" % (
            a.kill_seeds, ", ".join(dc))
    if "survivors" in a.parts:
        blocks["power-survivors"] = survivors_table(survivors(cases, a.kill_seeds))
        said["survivors"] = "must-fail mutants over %d seeds of %s" % (a.kill_seeds, ", ".join(cases))
    if "named" in a.parts:
        nc = cases + wide + [c for c in a.drops_kernel_cases.split(",") if c]
        blocks["power-named"] = named_matrix(nc, a.kill_seeds)
        said["named"] = "a capacity-factor-1.0 kernel handed over as out alone, %d seeds of %s" % (
            a.kill_seeds, ", ".join(os.path.basename(c).replace(".case", "") for c in nc))
    if "floor" in a.parts:
        blocks["power-floor"] = floor_table(floors(cases, a.floor_seeds, {"fp32": 26, "bf16": 12}))
        said["floor"] = "floors over %d seeds of %s (%d trials per cell)" % (
            a.floor_seeds, ", ".join(cases), a.floor_seeds * len(cases) // 2)
    for tag, what in said.items():
        blocks["power-meta-" + tag] = "Measured by `tests/zoo/power/power.py kill` on runner commit `%s`, %s: %s." % (
            runner_commit(), machine(), what)
    return blocks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["legit", "kill", "doc"])
    ap.add_argument("--seeds", type=int, default=20, help="seeds of the legit matrix")
    ap.add_argument("--kill-seeds", type=int, default=3, help="seeds of the kill rates")
    ap.add_argument("--floor-seeds", type=int, default=3, help="seeds of the detection floors")
    ap.add_argument("--cases", default=",".join(SMALL), help="base cases (fp32 and -bf16 of each)")
    ap.add_argument("--kernel-cases", default=",".join(KERNEL))
    ap.add_argument("--kernel-seeds", type=int, default=20)
    ap.add_argument("--kernel-budget-s", type=float, default=None,
                    help="no new seed of a kernel case after this many seconds on it")
    ap.add_argument("--wide-cases", default=",".join(WIDE), help="case files here, for the GEMM mutations")
    ap.add_argument("--parts", default="kill,wide,drops,named,survivors,floor", help="kill: which tables")
    ap.add_argument("--drops-kernel-cases", default="kernel-sizes-bf16",
                    help="kernel-tier cases of the out-only zero-drops table")
    ap.add_argument("--write", default=None, help="the doc whose tables to replace (doc/power.md)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="worker processes for the legit matrix (one case x seed each, one thread "
                         "each); a kernel-tier worker takes up to 3.1 GiB")
    a = ap.parse_args()
    JOBS[0] = a.jobs
    cases = [c + d for c in a.cases.split(",") if c for d in DTYPES]
    kcases = [c for c in a.kernel_cases.split(",") if c]
    t0 = time.time()
    blocks, bad = {}, 0
    if a.what in ("legit", "doc"):
        b, bad = do_legit(a, cases, kcases)
        blocks.update(b)
        log("legit matrix: %d false FAIL (%.0f s)" % (bad, time.time() - t0))
    if a.what in ("kill", "doc"):
        blocks.update(do_kill(a, cases))
        log("kill rates and floors (%.0f s)" % (time.time() - t0))
    for body in blocks.values():
        print(body + "\n")
    if a.write:
        write_blocks(a.write, blocks)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
