#!/usr/bin/env python3
"""Markdown tables of a GPU report's pipeline checks and timing
(gpu_report.py's pipeline.json), with the runner's verdicts on the replay
candidates where `dropless check --json` reports are given:

    python3 -m dropless.gpu.pipeline_report OUT/pipeline.json [REPORT.json ...] > pipeline.md

One row per backend: host syncs (largest count of a forward + backward over
the cases, and their kinds), graph capture (captured or why not; replays,
equal to eager runs, CONFORMANT among the checked), determinism, JAX
compilations across routings; then the timing per layer shape.
"""

import json
import sys


def load_reports(paths):
    """{(case, backend): conformant} of the reports given."""
    out = {}
    for p in paths:
        with open(p) as fh:
            r = json.load(fh)
        for x in (r if isinstance(r, list) else [r]):
            out[(x["case"], x["backend"])] = bool(x.get("conformant"))
    return out


def syncs(res):
    cs = [c["host_syncs"] for c in res.get("cases", []) if isinstance(c.get("host_syncs"), dict)]
    if not cs:
        skipped = [c.get("host_syncs") for c in res.get("cases", []) if c.get("host_syncs")]
        return str(skipped[0]) if skipped else "-"
    worst = max(cs, key=lambda h: h.get("count", -1))
    if "count" not in worst:
        return "error: %s" % worst.get("error", "?")[:80]
    kinds = sorted({w["kind"] for h in cs for w in h.get("where", [])})
    err = sorted({h.get("error_mode", "")[:60] for h in cs} - {"no error raised"})
    s = "%d (max over %d cases)" % (worst["count"], len(cs))
    if kinds:
        s += ": " + ", ".join(kinds)
    if not err:
        s += "; error mode: none raised"
    return s


def graph(res, reports):
    gs = res.get("graph", [])
    if not gs:
        return "-"
    parts = []
    for g in gs:
        if not g.get("captured"):
            why = g.get("reason")
            why = why.get("error", "?") if isinstance(why, dict) else str(why)
            wh = g["reason"].get("where", "") if isinstance(g.get("reason"), dict) else ""
            parts.append("not captured: %s%s" % (why.splitlines()[0][:90], " at " + wh[:90] if wh else ""))
            if not g.get("replays"):
                continue
        reps = g.get("replays", [])
        eq = sum(1 for r in reps if r.get("equals_eager"))
        checked = [reports[(r["case"][:-3], res["backend"] + "[graph]")] for r in reps
                   if (r["case"][:-3], res["backend"] + "[graph]") in reports]
        s = "%s: %d replays, %d equal to eager" % (g["capture_on"][:-3], len(reps), eq)
        if checked:
            s += ", %d/%d CONFORMANT" % (sum(checked), len(checked))
        empty = sum(1 for r in reps if r.get("group_sizes") and 0 in r["group_sizes"])
        s += " (%d with an empty expert)" % empty
        parts.append(("captured; " if g.get("captured") else "") + s)
    return "<br>".join(parts)


def determinism(res):
    cs = [c for c in res.get("cases", []) if "identical" in c.get("deterministic", {})]
    if not cs:
        return "-"
    bad = [c for c in cs if not c["deterministic"]["identical"]]
    if not bad:
        return "bit-identical (%d cases)" % len(cs)
    stages = sorted({s for c in bad for s in c["deterministic"]["differs"]})
    return "%d of %d cases differ: %s" % (len(bad), len(cs), ", ".join(stages))


def jax_row(res):
    sets = [s for s in res.get("sets", []) if "traces" in s]
    if not sets:
        return "| jax-moe | - | - | - | %s |" % res.get("skipped", res.get("error", "no result"))
    tr = ["%s %s: %d compile(s) for %d routings" % (s["files"][0][:-3], s["precision"], s["traces"],
                                                   s["calls"]) for s in sets]
    bad = sorted({n for s in sets for n in s.get("differs", [])})
    det = ("%d of %d sets differ: %s" % (sum(1 for s in sets if s.get("differs")), len(sets),
                                         ", ".join(bad)) if bad else
           "bit-identical (%d sets)" % len(sets))
    return "| jax-moe | (jit: static shapes) | - | %s | %s |" % (det, "<br>".join(tr))


def timing(t):
    out = ["| layer | T | typical torch-moe (ms) | reference eager (ms) | reference graph (ms) | "
           "speed-up eager | speed-up graph |", "|---|---|---|---|---|---|---|"]
    for name, r in t.get("shapes", {}).items():
        m = lambda k: r.get(k, {}).get("median_ms", r.get(k, {}).get("error", "-")[:40]) \
            if isinstance(r.get(k), dict) else "-"
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            name, r.get("shape", {}).get("T", "-"), m("typical"), m("reference_eager"),
            m("reference_graph"), r.get("speedup_eager_vs_typical", "-"),
            r.get("speedup_graph_vs_typical", "-")))
    return "\n".join(out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        rep = json.load(fh)
    reports = load_reports(argv[1:])
    print("| backend | host syncs per forward + backward | graph capture, replays on new routing "
          "| deterministic | compilations |")
    print("|---|---|---|---|---|")
    for be in ("torch-moe", "reference-moe"):
        if be in rep:
            r = rep[be]
            print("| %s | %s | %s | %s | - |" % (be, syncs(r), graph(r, reports), determinism(r)))
    if "jax-moe" in rep:
        print(jax_row(rep["jax-moe"]))
    if "timing" in rep:
        t = rep["timing"]
        print("\nTiming on %s (%s, %s, median of %s steps after %s warm-up):\n"
              % (t.get("device"), t.get("torch"), t.get("dtype"), t.get("iters"), t.get("warmup")))
        print(timing(t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
