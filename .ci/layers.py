#!/usr/bin/python3
"""Fails on any #include that points up a layer, on a private header that
includes the umbrella dropless.h, and on an include cycle.

The layers (doc/architecture.md), lowest first:
    core -> stages -> {golden, check} -> {run (over check), capacity (over
    golden), api (over golden and check)} -> cli
with util (the operating system: output files) over core, beside the
stages, for the layers that write files.
A file may include its own layer's headers and those of the layers it
builds on, never one above. The public sections of include/dropless/ belong
to the layer that implements them.

    .ci/layers.py [SRCDIR]      exit 0 clean, 1 with one line per finding
"""
import os
import re
import sys

ALLOWED = {
    "core": {"core"},
    "util": {"core", "util"},
    "stages": {"core", "stages"},
    "golden": {"core", "util", "stages", "golden"},
    "check": {"core", "util", "stages", "check"},
    "run": {"core", "util", "stages", "check", "run"},
    "capacity": {"core", "util", "stages", "golden", "capacity"},
    "api": {"core", "util", "stages", "golden", "check", "api"},
    "cli": {"core", "util", "stages", "golden", "check", "run", "capacity", "api", "cli", "umbrella"},
    "umbrella": {"core", "stages", "golden", "check", "run", "capacity", "api"},
}
# the public sections, by the layer that implements them
SECTIONS = {
    "core.h": "core", "route.h": "stages", "dispatch.h": "stages", "gemm.h": "stages",
    "moe.h": "stages", "values.h": "stages", "schedule.h": "stages", "features.h": "core", "ep.h": "stages", "golden.h": "golden", "check.h": "check",
    "run.h": "run", "backend.h": "run", "capacity.h": "capacity", "api.h": "api",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    """(layer, file key) of a source or header path relative to the root."""
    parts = path.split(os.sep)
    if parts[0] == "src" and len(parts) > 2:
        return parts[1], path
    if parts[0] == "include" and len(parts) == 3 and parts[1] == "dropless":
        return SECTIONS.get(parts[2]), path
    if path == os.path.join("include", "dropless.h"):
        return "umbrella", path
    return None, path


def resolve(root, src, inc):
    """The file an #include "inc" in src names, as the compiler finds it
    (the including file's folder, then -I include, then -I src)."""
    for base in (os.path.dirname(src), "include", "src"):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    files = []
    for top in ("src", "include"):
        for d, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.relpath(os.path.join(d, n), root) for n in names
                      if n.endswith((".c", ".h"))]
    bad, graph = [], {}
    for f in sorted(files):
        lay, _ = layer_of(f)
        graph[f] = []
        with open(os.path.join(root, f), errors="replace") as fh:
            for no, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m or m.group(1) == "config.h":
                    continue
                tgt = resolve(root, f, m.group(1))
                if tgt is None:
                    continue  # a generated or system header
                graph[f].append(tgt)
                tl, _ = layer_of(tgt)
                if f.endswith("_priv.h") and tl == "umbrella":
                    bad.append("%s:%d: a private header includes the umbrella dropless.h" % (f, no))
                elif lay and tl and tl not in ALLOWED.get(lay, {lay}):
                    bad.append("%s:%d: layer %s includes %s (layer %s)" % (f, no, lay, tgt, tl))
    # include cycles: depth-first search with colours
    colour, stack = {}, []

    def visit(n):
        colour[n] = 1
        stack.append(n)
        for m in graph.get(n, []):
            if colour.get(m) == 1:
                bad.append("include cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif not colour.get(m):
                visit(m)
        stack.pop()
        colour[n] = 2

    for n in sorted(graph):
        if not colour.get(n):
            visit(n)
    for b in bad:
        print("layers: " + b)
    if not bad:
        print("layers: %d files, no include points up a layer, no include cycle" % len(graph))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
