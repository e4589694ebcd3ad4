"""Summarises `dropless check --json` reports of many candidates as Markdown
tables: one row per backend x dtype x stage, the worst verdict and the
largest error in units of the PASS bound over all cases, and the case where
it occurred.

    python3 -m dropless.gpu.adapters.report REPORT.json... > table.md
"""

import json
import sys
from collections import defaultdict

ORDER = {"PASS": 0, "WARN": 1, "FAIL": 2}


def stage_order():
    """The runner's stage order (the library's one table, through the
    package), with the whole-case checks (token accounting) after the
    forward pass, as the runner reports them."""
    import dropless
    stages = dropless.stage_names()
    stages.insert(stages.index("out") + 1, "case")
    return stages


def dtype_of(case):
    return "bf16" if case.endswith("-bf16") else "fp16" if case.endswith("-fp16") else "fp32"


def load(paths):
    reports = []
    for p in paths:
        with open(p) as fh:
            r = json.load(fh)
        reports += r if isinstance(r, list) else [r]
    return reports


def aggregate(reports):
    """{(backend, dtype, profile): {(stage, check): [verdict, err_pass, case, n_cases]}}"""
    rows = defaultdict(dict)
    for r in reports:
        key = (r["backend"], dtype_of(r["case"]), r["profile"])
        for c in r["checks"]:
            if c["verdict"] not in ORDER:
                continue
            sk = (c["stage"], c["check"])
            e = c.get("err_pass")
            cur = rows[key].get(sk)
            if cur is None:
                rows[key][sk] = [c["verdict"], e, r["case"], 1]
                continue
            cur[3] += 1
            worse = ORDER[c["verdict"]] > ORDER[cur[0]] or (
                ORDER[c["verdict"]] == ORDER[cur[0]] and (e or 0) > (cur[1] or 0))
            if worse:
                cur[0], cur[1], cur[2] = c["verdict"], e, r["case"]
    return rows


def fmt_err(e):
    if e is None:
        return "-"
    return "%.3g" % e


def table(rows, only_bad=False):
    stages = stage_order()
    out = ["| backend | dtype | profile | stage | check | verdict | max err / PASS bound | worst case | cases |",
           "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(rows):
        items = sorted(rows[key].items(),
                       key=lambda kv: (stages.index(kv[0][0]) if kv[0][0] in stages else 99, kv[0][1]))
        for (stage, check), (v, e, case, n) in items:
            if only_bad and v == "PASS":
                continue
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %d |"
                       % (key[0], key[1], key[2], stage, check, v, fmt_err(e), case, n))
    return "\n".join(out)


def verdicts(reports):
    """One line per report: case, backend, profile, verdict, FAIL/WARN stages."""
    out = ["| case | backend | profile | verdict | PASS | WARN | FAIL | stages not PASS |",
           "|---|---|---|---|---|---|---|---|"]
    for r in sorted(reports, key=lambda r: (r["backend"], r["case"], r["profile"])):
        bad = ["%s %s" % (c["stage"], c["verdict"]) for c in r["checks"]
               if c["verdict"] in ("WARN", "FAIL")]
        cnt = r["counts"]
        out.append("| %s | %s | %s | %s | %d | %d | %d | %s |"
                   % (r["case"], r["backend"], r["profile"], r["verdict"], cnt.get("PASS", 0),
                      cnt.get("WARN", 0), cnt.get("FAIL", 0), ", ".join(bad) or "-"))
    return "\n".join(out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    only_bad = "--only-bad" in argv
    per_report = "--per-report" in argv
    paths = [a for a in argv if not a.startswith("--")]
    reports = load(paths)
    if per_report:
        print(verdicts(reports))
    else:
        print(table(aggregate(reports), only_bad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
