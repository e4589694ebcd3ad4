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
import os
import shutil
import sys
from collections import defaultdict

import h5py

import dropless  # the package (python/; doc/python.md)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from dropless.gpu.adapters import common  # noqa: E402


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def read_part(path):
    """(root attributes, {stage: array}) of one part file."""
    with h5py.File(path, "r") as f:
        attrs = {k: _text(v) for k, v in f.attrs.items() if isinstance(v, (bytes, str))}
        data = {n: f[grp][n][()] for grp in ("forward", "backward") if grp in f for n in f[grp]}
    return attrs, data


def main(golden_dir, parts_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    bundles = defaultdict(list)
    for p in sorted(glob.glob(os.path.join(parts_dir, "*.h5"))):
        attrs, data = read_part(p)
        if ":" not in attrs["backend"]:  # chained: as it is
            shutil.copy(p, os.path.join(out_dir, os.path.basename(p)))
            continue
        bundles[(attrs["case"], attrs["backend"].split(":")[0], attrs["mode"])].append((attrs, data))
    order = dropless.stage_names()
    for (case, base, mode), parts in sorted(bundles.items()):
        a0, outputs, groups = parts[0][0], {}, []
        for _, data in parts:
            groups.append(sorted(data, key=order.index))
            outputs.update(data)
        groups.sort(key=lambda grp: order.index(grp[0]))
        with dropless.load(os.path.join(golden_dir, case + ".h5")) as g:
            dropless.write_candidate(os.path.join(out_dir, common.candidate_name(case, base, mode)),
                                     outputs, g, backend=base, compute_mode=a0["compute_mode"],
                                     isolated=groups, backend_version=a0.get("backend_version"),
                                     device=a0.get("device"), force=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
