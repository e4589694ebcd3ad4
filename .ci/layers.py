#!/usr/bin/python3
"""Fails on any #include that points up a layer, on a private header that
includes the umbrella dropless.h, on an include cycle, and on a file cycle:
source files that use one another's functions (a.c calls or names a
function b.c defines, and b.c, maybe through others, one of a.c's), which
the includes cannot show when both use their layer's private header. A
layer's shared helpers belong in a leaf that calls nothing of its layer.

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
    "moe.h": "stages", "lowp.h": "core", "quant.h": "stages", "quantcheck.h": "check", "qgolden.h": "golden", "values.h": "stages", "schedule.h": "stages", "features.h": "core", "ep.h": "stages", "golden.h": "golden", "mutate.h": "golden", "check.h": "check",
    "run.h": "run", "backend.h": "run", "capacity.h": "capacity", "api.h": "api",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# a function defined at file scope, not static: its name on the first line
DEFINE = re.compile(r'^(?!static\b|typedef\b|extern\b|#)[A-Za-z_][\w \t\*]*?\b(dl_\w+)\s*\([^;]*$')
IDENT = re.compile(r'\bdl_\w+\b')
COMMENT = re.compile(r'/\*.*?\*/|//[^\n]*', re.S)


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
    bad += file_cycles(root, sorted(f for f in files if f.endswith(".c")))
    bad += doc_table(root, files)
    for b in bad:
        print("layers: " + b)
    if not bad:
        print("layers: %d files, no include points up a layer, no include cycle, no file cycle"
              % len(graph))
    return 1 if bad else 0


DOC = os.path.join("doc", "architecture.md")
DOC_ROW = re.compile(r'^\|\s*(\w+)\s*\|\s*`src/(\w+)/`\s*\|(.*)$')


def doc_table(root, files):
    """doc/architecture.md's layer table against the tree: every source
    file and private header of src/LAYER/ is named in LAYER's row (as
    `name.c`), and every file a row names exists."""
    path = os.path.join(root, DOC)
    if not os.path.isfile(path):
        return []
    rows = {}
    with open(path, errors="replace") as fh:
        for line in fh:
            m = DOC_ROW.match(line)
            if m:
                rows[m.group(2)] = {n for pre, n in re.findall(r'`(\w+/)?(\w+\.[ch])`', m.group(3))
                                    if pre != "dropless/"}
    out = []
    for f in sorted(files):
        parts = f.split(os.sep)
        if parts[0] != "src" or len(parts) != 3:
            continue
        if parts[1] not in rows:
            out.append("%s: layer %s has no row in %s's layer table" % (f, parts[1], DOC))
            rows[parts[1]] = None
        elif rows[parts[1]] is not None and parts[2] not in rows[parts[1]]:
            out.append("%s: not named in %s's layer table (row %s)" % (f, DOC, parts[1]))
    for layer, names in sorted(rows.items()):
        for n in sorted(n for n in names or () if n.endswith(".c")):
            if not os.path.isfile(os.path.join(root, "src", layer, n)):
                out.append("%s names src/%s/%s, which does not exist" % (DOC, layer, n))
    return out


def file_cycles(root, sources):
    """Findings for the cycles of "uses a function defined in" between
    source files (strongly connected components of more than one file)."""
    defined, text = {}, {}
    for f in sources:
        with open(os.path.join(root, f), errors="replace") as fh:
            text[f] = COMMENT.sub(" ", fh.read())
        for line in text[f].splitlines():
            m = DEFINE.match(line)
            if m:
                defined.setdefault(m.group(1), f)
    uses = {f: sorted({defined[n] for n in IDENT.findall(text[f])
                       if n in defined and defined[n] != f}) for f in sources}
    index, low, on, stack, comps, count = {}, {}, set(), [], [], [0]

    def strong(v):  # Tarjan's algorithm
        index[v] = low[v] = count[0]
        count[0] += 1
        stack.append(v)
        on.add(v)
        for w in uses[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(tuple(sorted(comp)))

    for v in sources:
        if v not in index:
            strong(v)
    found, out = set(comps), []
    for c in sorted(found):
        edges = ["%s uses %s" % (a, b) for a in c for b in uses[a] if b in c]
        out.append("file cycle: " + " <-> ".join(c) + " (" + "; ".join(edges) + ")")
    return out


if __name__ == "__main__":
    sys.exit(main())
