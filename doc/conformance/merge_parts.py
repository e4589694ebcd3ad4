#!/usr/bin/env python3
"""Merges stage-isolated candidates written one file per kernel call
(CASE--BACKEND:PART--MODE.h5, as the adapters at commit 21cf368 wrote them
in the H200 run of this report) into one candidate per backend with the
isolated_groups attribute, as the adapters write them now. Values are
copied bit for bit; each part becomes one group. The runner checks each
group on golden upstream either way (dl_check_run_isolated), so verdicts
and figures are the same.

    python3 doc/conformance/merge_parts.py GOLDEN_DIR PARTS_DIR OUT_DIR
"""
import glob
import json
import os
import shutil
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tools.adapters import common  # noqa: E402


def main(golden_dir, parts_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    bundles = defaultdict(list)
    for p in sorted(glob.glob(os.path.join(parts_dir, "*.h5"))):
        attrs, data, dt = common.read_candidate(p)
        if ":" not in attrs["backend"]:  # chained: as it is
            shutil.copy(p, os.path.join(out_dir, os.path.basename(p)))
            continue
        base = attrs["backend"].split(":")[0]
        bundles[(attrs["case"], base, attrs["mode"])].append((attrs, data))
    order = list(common.SPEC)
    for (case, base, mode), parts in sorted(bundles.items()):
        g = common.read_golden(os.path.join(golden_dir, case + ".h5"))
        a0 = parts[0][0]
        c = common.Candidate(g, base, a0["backend_version"], a0["device"], a0["compute_mode"], mode)
        c.notes = json.loads(a0["notes"])
        c.notes["repeat_differs"] = sorted({k for a, _ in parts
                                            for k in json.loads(a["notes"]).get("repeat_differs", [])})
        c.notes["merged_from_parts"] = sorted(a["backend"] for a, _ in parts)
        groups = []
        for _, data in parts:
            groups.append(sorted(data, key=order.index))
            c.data.update(data)
        c.isolated_groups = sorted(groups, key=lambda grp: order.index(grp[0]))
        common.write_candidate(os.path.join(out_dir, common.candidate_name(case, base, mode)), c,
                               force=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
