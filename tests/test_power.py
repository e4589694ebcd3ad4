#!/usr/bin/python3
"""The runner's power, a slice for make check (the whole matrix is make
check-power, tests/zoo/power/power.py). Both directions:

- mutants (dropless.mutate, built in memory) of mixtral-small,
  mixtral-small-bf16 and deepseek-v3-small: every defect whose error is far above rounding must
  be NOT CONFORMANT where the candidate hands over the mutated stage or a
  stage its error reaches undiminished (a sign, a zeroed row, an
  off-by-one boundary, a dropped slot, swapped experts; bf16 accumulation
  and TF32 products handed over staged); a dropped slot is named exactly;
  rows reordered within an expert must be CONFORMANT. The other mutants'
  verdicts (gains, ulps, the fused modes' survivors) are printed as TAP
  comments: they are measurements (doc/power.md), not requirements yet.
- a correct kernel handed over as out alone proves zero drops on the
  small catalogue (PASS; WARN with the floor printed on the two bf16 cases
  whose weakest slot is below it: BELOW_FLOOR).
- the six legitimate implementations (tests/zoo/power/legit.py) on four
  cases x one or two seeds, staged and fused: CONFORMANT. The false FAILs the
  runner gives today (issue 24 items 3 and 4, the verdicts work) are TAP
  TODO: when they conform, the TODO passes and the entry in KNOWN must go.
Speaks TAP."""
import os
import sys

top_srcdir = os.environ.get("top_srcdir", ".")
top_builddir = os.environ.get("top_builddir", ".")
sys.path.insert(0, os.path.join(top_srcdir, "python"))
sys.path.insert(0, os.path.join(top_srcdir, "tests", "zoo", "power"))
sys.dont_write_bytecode = True
os.environ.setdefault("DROPLESS_LIB", os.path.join(top_builddir, ".libs", "libdropless.so"))
try:
    import numpy  # noqa: F401
    import dropless
    import legit
    from power import SMALL, capacity_run, flag_of, legit_matrix, must_fail, worker_pool
except ImportError as e:
    print("1..1")
    print("ok 1 # SKIP %s" % e)
    sys.exit(0)

# legitimate implementations the runner FAILs today, by (implementation,
# mode, dtype): issue 24 item 3 (a stage computed from its unrounded
# upstream) and item 4 (bf16 values in an unlabelled fp32 container)
KNOWN = {}


class Tap:
    def __init__(self):
        self.n = self.fails = 0

    def ok(self, cond, desc, todo=None):
        self.n += 1
        print("%s %d - %s%s" % ("ok" if cond else "not ok", self.n, desc, " # TODO " + todo if todo else ""))
        if not cond and not todo:
            self.fails += 1


def mutants(tap, g, seed):
    dt = g.config["dtype"]
    killed = total = 0
    wrong, survivors, hidden = [], [], []
    for m in legit_mutations():
        for s in g.stages():
            for mode in ("staged", "fused", "out"):
                r = dropless.mutant_check(g, m, s, mode, seed=seed)
                if r is None:
                    continue
                rep, detail = r
                total += 1
                killed += not rep["conformant"]
                if m == "reorder":
                    tap.ok(rep["conformant"], "%s: rows reordered within the experts conform (%s)" % (g.case, mode))
                elif must_fail(m, s, mode, dt):
                    if rep["conformant"] and flag_of(rep, s):
                        hidden.append("%s %s %s" % (m, s, mode))
                    elif rep["conformant"]:
                        wrong.append("%s %s %s (%s)" % (m, s, mode, detail))
                elif rep["conformant"]:
                    survivors.append("%s %s %s" % (m, s, mode))
                if m == "drop_slot":
                    t, j = (int(x) for x in detail.split("(")[1].split(")")[0].split(","))
                    tap.ok(rep["dropped"]["pairs"] == [[t, j]],
                           "%s: the dropped slot (%d, %d) is named, %s" % (g.case, t, j, mode))
    tap.ok(not wrong, "%s: every strong defect NOT CONFORMANT where it is visible, or WARNed by the "
           "second chained level (%d mutants; %s; %d WARN only: %s)" % (
               g.case, total, "missed: " + "; ".join(wrong[:6]) if wrong else "none missed",
               len(hidden), ", ".join(hidden[:6]) or "none"))
    print("# %s: %d of %d mutants NOT CONFORMANT; %d weak survivors: %s" % (
        g.case, killed, total, len(survivors), ", ".join(survivors[:12]) + (" ..." if len(survivors) > 12 else "")))


def files(tap):
    """dropless.mutate writes what `dropless mutate` writes; bad input is a
    dropless.Error and leaves nothing (or the old directory) behind."""
    import tempfile
    import shutil
    tmp = tempfile.mkdtemp(prefix="dl_power.")
    d = os.path.join(tmp, "m")
    try:
        with dropless.generate("mixtral-small", seed=1) as g:
            rows = dropless.mutate(g, d, mutations=["drop_slot", "reorder"], modes="staged,out")
            made = sorted(r.file for r in rows if r.file)
            tap.ok(made == sorted(f for f in os.listdir(d) if f.endswith(".h5")) and made,
                   "dropless.mutate: every manifest row's file exists (%s)" % ", ".join(made))
            tap.ok([r.expect for r in rows if r.mutation == "reorder" and r.file] == ["pass"],
                   "dropless.mutate: the reordering is marked expect = pass")
            for kw, code in (({}, "DL_EEXIST"), ({"mutations": "gain,bogus", "force": True}, "DL_EINVAL"),
                             ({"gain_p": 0, "force": True}, "DL_EINVAL")):
                try:
                    dropless.mutate(g, d, **kw)
                    got = None
                except dropless.Error as e:
                    got = e.name
                left = sorted(f for f in os.listdir(d) if f.endswith(".h5"))
                tap.ok(got == code and left == made and not [f for f in os.listdir(tmp) if ".tmp-" in f],
                       "dropless.mutate(%s): %s, the directory untouched" % (kw, code))
    finally:
        shutil.rmtree(tmp)


def legit_mutations():
    return ["gain", "sign", "zero_row", "off_by_one", "drop_slot", "swap_experts", "bf16_acc", "tf32",
            "ulp_weights", "reorder"]


def legits(tap, g, seed):
    dt = g.config["dtype"]
    for impl, *_ in legit.IMPLS:
        st = legit.run(impl, g, seed)
        if st is None:
            continue
        for mode in ("staged", "fused"):
            outs = st if mode == "staged" else {k: st[k] for k in ("out", "d_x")}
            rep = dropless.check(g, outs, compute_mode=dt, backend=impl)
            why = "; ".join("%s %s" % (f.stage, f.check) for f in rep.failures[:3])
            tap.ok(rep.conformant, "legitimate %s %s on %s seed %d: CONFORMANT%s" % (
                impl, mode, g.case, seed, " (FAIL: %s)" % why if why else ""), KNOWN.get((impl, mode, dt)))


# the small catalogue's cases whose weakest slot lies below the detection
# floor of a bf16 out (measured, seed 1: doc/power.md): a WARN that must
# print the floor; every other case's out-only proof must PASS
BELOW_FLOOR = {"deepseek-v3-small-bf16", "grouped-max-bf16", "qwen2-moe-like-bf16", "deepseek-v3-shared-bf16"}
# cases with a zero token (x = 0: every slot contributes exactly 0 to out):
# a zero contribution proves nothing, so zero_drops WARNs and counts them
# (issue 24: ties-grouped seed 1 token 0 was once "proven present")
ZERO_SLOTS = {"ties", "ties-bf16", "ties-grouped", "ties-grouped-bf16"}


def out_only_drops(tap):
    """A correct out-only kernel (fp32 blocked GEMMs, the case's storage)
    proves zero drops from out on the small catalogue (issue 24 item 3):
    PASS, or a WARN that names the floor where the weakest slot is below it;
    and dropping that weakest slot is never a PASS."""
    bad, warned = [], []
    for name in [c + d for c in SMALL for d in ("", "-bf16")]:
        with dropless.generate(name, seed=1) as g:
            st = legit.run("fp32-blocked", g, 1)
            rep = dropless.check(g, {"out": st["out"]}, compute_mode=g.config["dtype"])
            zd = next(c for c in rep.checks if c["check"] == "zero_drops")
            msg = zd.get("message") or ""
            if name in BELOW_FLOOR | ZERO_SLOTS:
                ok = zd["verdict"] == "WARN" and "the smallest contribution seen for certain is" in msg
                ok &= (name in ZERO_SLOTS) == ("contribute exactly 0" in msg)
                warned.append(name)
            else:
                ok = zd["verdict"] == "PASS" and "proven present in out" in msg
            if not ok or not rep.conformant:
                bad.append("%s: %s %s" % (name, zd["verdict"], msg[:120]))
    tap.ok(not bad, "a correct out-only kernel proves zero drops on the small catalogue (WARN with "
           "the floor only on %s)%s" % (", ".join(warned), ": " + "; ".join(bad) if bad else ""))


# cases where a capacity-factor-1.0 kernel's every dropped pair is named
# (seed 1, measured: doc/power.md "Dropped pairs named"); where it is not,
# the report names the cause (tests/zoo/power/power.py kill --parts named)
NAMED = ["empty-experts-bf16", "mixtral-small-bf16", "qwen2-moe-like", "deepseek-v3-shared"]


def named(tap):
    """A dropping kernel handed over as out alone: NOT CONFORMANT, every
    dropped pair named and nothing else (issue 24 item 2)."""
    for name in NAMED:
        with dropless.generate(name, seed=1) as g:
            rep, dropped = capacity_run(g)
            got = set(rep.dropped)
            tap.ok(not rep.conformant and got == dropped and rep.n_dropped == len(dropped),
                   "capacity 1.0 on %s, out only: NOT CONFORMANT, %d of %d dropped pairs named, %d "
                   "wrongly" % (name, len(got & dropped), len(dropped), len(got - dropped)))


def named_beside_floor(tap):
    """qwen2-moe-like-bf16 seed 1, capacity 1.0: token 22 lost (22,0) (weight
    0.35, far above the floor) with slots below it; the smallest drop set
    that fits the row names its visible members, the rest is counted below
    the floor, and nothing is named that was not dropped (issue 24: none of
    the three was named, "1 wrong out rows not explained")."""
    import re
    with dropless.generate("qwen2-moe-like-bf16", seed=1) as g:
        rep, dropped = capacity_run(g)
        got = set(rep.dropped)
        zd = next(c for c in rep.checks if c["check"] == "zero_drops")
        m = re.search(r"(\d+) more slots of those rows' drop sets lie below", zd["message"] or "")
        unnamed = int(m.group(1)) if m else 0
        tap.ok(not rep.conformant and (22, 0) in got and got <= dropped and
               len(dropped - got) == unnamed and "not explained" not in zd["message"],
               "capacity 1.0 on qwen2-moe-like-bf16 seed 1: (22,0) named beside sub-floor slots; %d of "
               "%d named, %d counted below the floor, %d wrongly" % (
                   len(got & dropped), len(dropped), unnamed, len(got - dropped)))


# gross errors the second chained level once WARNed (issue 24): a gain of
# 1 + 2^-1 far beyond the stage's own stored upstream, within only the
# worst case of every absent upstream stage
GROSS = [("single-token-bf16", 2, "d_router_logits"), ("one-hot-bf16", 3, "d_x")]


def no_false_names(tap):
    """deepseek-v3-shared-bf16 seed 2, capacity 1.0: token 14 lost five of
    its eight slots; a smaller drop set with a sub-floor member also fits
    its row, and naming that set's visible members once accused (14,2),
    which was kept: a fitting set with every member visible is named
    first, and nothing is named that was not dropped."""
    with dropless.generate("deepseek-v3-shared-bf16", seed=2) as g:
        rep, dropped = capacity_run(g)
        got = set(rep.dropped)
        tap.ok(not rep.conformant and got <= dropped and {(14, j) for j in (0, 1, 3, 4, 6)} <= got,
               "capacity 1.0 on deepseek-v3-shared-bf16 seed 2: token 14's five drops named, %d of %d "
               "named, %d wrongly" % (len(got & dropped), len(dropped), len(got - dropped)))


def gross_second_level(tap):
    for name, seed, stage in GROSS:
        with dropless.generate(name, seed=seed) as g:
            rep, _ = dropless.mutant_check(g, "gain", stage, "staged", gain_p=1, seed=seed)
            msg = next(c["message"] for c in rep["checks"] if c["stage"] == stage and c["check"] == "numerics")
            tap.ok(not rep["conformant"] and "no unrounded inputs explain it" in msg,
                   "%s seed %d: %s x 1.5 staged is NOT CONFORMANT, the second level refuses it (%s)" % (
                       name, seed, stage, msg[:90]))


def bf16_acc_dw(tap):
    """Weight gradients accumulated in bf16 lie on the bf16 grid, so their
    storage is inferred as bf16 (a NOTE); the accumulation is still judged
    in fp32 (the bound allows one bf16 rounding, and the golden's own fp32
    one): NOT CONFORMANT without --strict-storage (issue 24: they were
    CONFORMANT with the NOTE), while fp32 accumulation rounded to bf16
    conforms (bf16-dw-unlabelled, legits() below and test_zoo.py)."""
    with dropless.generate("mixtral-small-bf16", seed=2) as g:
        for stage in ("d_w_gate", "d_w_up", "d_w_down", "d_router_weight"):
            rep, _ = dropless.mutant_check(g, "bf16_acc", stage, "staged", seed=2)
            mine = [c for c in rep["checks"] if c["stage"] == stage]
            inferred = any(c["check"] == "storage" and "inferred" in (c["message"] or "") for c in mine)
            tap.ok(not rep["conformant"] and inferred,
                   "mixtral-small-bf16 seed 2: %s accumulated in bf16 (storage inferred bf16) is NOT "
                   "CONFORMANT without --strict-storage" % stage)
        st = legit.run("bf16-dw-unlabelled", g, 2)
        rep = dropless.check(g, st, compute_mode="bf16")
        dw = [c for c in rep.checks if c["stage"] == "d_w_gate"]
        tap.ok(rep.conformant and any("inferred" in (c["message"] or "") for c in dw),
               "mixtral-small-bf16 seed 2: fp32-accumulated weight gradients rounded to bf16, unlabelled: "
               "CONFORMANT, storage inferred")


def jobs(tap):
    """power.py --jobs: the legit matrix in worker processes counts what the
    sequential run counts (tiny and tiny-bf16, seeds 1-2)."""
    import io
    cases = ["tiny", "tiny-bf16"]
    seq = legit_matrix(cases, 2, out=io.StringIO())
    pool = worker_pool(2)
    try:
        par = legit_matrix(cases, 2, out=io.StringIO(), pool=pool)
    finally:
        pool.shutdown()
    tap.ok(seq[0] == par[0] and seq[2] == par[2] == {"tiny": 2, "tiny-bf16": 2} and seq[0],
           "power.py --jobs 2: the legit matrix's counts equal the sequential run's (%d runs)" % sum(
               n for n, _ in seq[0].values()))


def main():
    tap = Tap()
    files(tap)
    out_only_drops(tap)
    named(tap)
    named_beside_floor(tap)
    no_false_names(tap)
    gross_second_level(tap)
    bf16_acc_dw(tap)
    jobs(tap)
    # qwen2-moe-like: shared experts with their gate (mutate once dropped
    # the shared term with a slot); in fp32: its bf16 twin's fused survivors
    # sit below the floor of a bf16 out that carries the shared term
    # (doc/power.md, the survivors table)
    for name in ("mixtral-small", "mixtral-small-bf16", "deepseek-v3-small", "qwen2-moe-like"):
        with dropless.generate(name, seed=1) as g:
            mutants(tap, g, 1)
    # ties-grouped-bf16 seed 1: the candidate's own router scores break an
    # exact tie in another slot order, which the second chained level once
    # refused to judge (swiglu-fused staged was a false FAIL)
    for name, seeds in (("mixtral-small-bf16", (1, 2)), ("deepseek-v3-small", (1, 2)),
                        ("empty-experts-bf16", (1, 2)), ("ties-grouped-bf16", (1,)),
                        ("qwen2-moe-like-bf16", (1,)), ("deepseek-v3-shared", (1,))):
        for seed in seeds:
            with dropless.generate(name, seed=seed) as g:
                legits(tap, g, seed)
    print("1..%d" % tap.n)
    return 1 if tap.fails else 0


if __name__ == "__main__":
    sys.exit(main())
