#!/bin/sh
# TAP wrapper for the Python package's pytest suites (python/tests) and the
# example (examples/): runs pytest in the project's venv (tools/setup_python.sh
# makes it; DROPLESS_PYTHON, if set, is tried first) against this build's
# library, and turns pytest's JUnit XML into one TAP line per test (pytest
# SKIPs stay SKIPs and xfails are TAP TODOs (XFAIL), with their reasons). Without a Python that has
# pytest, numpy and ml_dtypes, the one line is a SKIP saying so.
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
builddir=${top_builddir:-$srcdir}
venv=${DROPLESS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dropless/adapters-venv}
py=""
for cand in "$DROPLESS_PYTHON" "$venv/bin/python3"; do
    [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 || continue
    "$cand" -c 'import pytest, numpy, ml_dtypes' >/dev/null 2>&1 && { py=$cand; break; }
done
if [ -z "$py" ]; then
    echo "1..1"
    echo "ok 1 # SKIP no Python with pytest, numpy and ml_dtypes (run tools/setup_python.sh to make $venv)"
    exit 0
fi
lib="$builddir/.libs/libdropless.so"
if ldd "$lib" 2>/dev/null | grep -q libasan; then
    echo "1..1"
    echo "ok 1 # SKIP the library is built with AddressSanitizer, which Python cannot load through ctypes without preloading its runtime"
    exit 0
fi
if [ ! -f "$lib" ]; then
    echo "1..1"
    echo "not ok 1 - the package's tests: no $lib (build first)"
    exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dl-pytest-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
# The tree's package comes first on the path, so an older `pip install
# ./python` in the venv cannot hide a change; its plugin is named unless the
# venv's installed entry point already loads it (looked up on pytest's own
# path: a `pip install ./python` leaves python/dropless.egg-info, whose entry
# point the tree's path then brings along).
if PYTHONPATH="$srcdir/python${PYTHONPATH:+:$PYTHONPATH}" "$py" -c 'import importlib.metadata as m, sys; e = m.entry_points(); e = e.select(group="pytest11") if hasattr(e, "select") else e.get("pytest11", []); sys.exit(0 if any(x.name == "dropless" for x in e) else 1)'; then
    plugin=""
else
    plugin="-p dropless.pytest_plugin"
fi
cd "$tmp" || exit 1
# dropless.jax compiles its FFI handler into a cache: a fresh one per run,
# so the run tests the build from this tree's sources (doc/python.md)
PYTHONPATH="$srcdir/python${PYTHONPATH:+:$PYTHONPATH}" DROPLESS_LIB="$lib" \
DROPLESS_CLI="$builddir/dropless" top_builddir="$builddir" \
DROPLESS_JAX_CACHE="${DROPLESS_JAX_CACHE:-$tmp/jax-ffi}" \
    "$py" -m pytest -q -p no:cacheprovider $plugin --junitxml="$tmp/junit.xml" -o junit_family=xunit1 \
    --rootdir="$tmp" "$srcdir/python/tests" "$srcdir/examples" >"$tmp/log" 2>&1
rc=$?
"$py" - "$tmp/junit.xml" "$tmp/log" "$rc" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET
path, log, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    cases = list(ET.parse(path).getroot().iter("testcase"))
except (OSError, ET.ParseError) as e:
    cases = []
n = 0
lines = []
for c in cases:
    n += 1
    name = "%s::%s" % (c.get("classname", ""), c.get("name", ""))
    bad = c.find("failure") if c.find("failure") is not None else c.find("error")
    skip = c.find("skipped")
    if bad is not None:
        lines.append("not ok %d - %s" % (n, name))
        lines += ["# " + ln for ln in (bad.get("message", "") + "\n" + (bad.text or "")).splitlines()[-40:]]
    elif skip is not None and skip.get("type") == "pytest.xfail":  # an expected failure
        lines.append("not ok %d - %s # TODO %s" % (n, name, " ".join((skip.get("message") or "").split())))
    elif skip is not None:
        why = " ".join((skip.get("message") or skip.get("type") or "skipped").split())
        lines.append("ok %d - %s # SKIP %s" % (n, name, why))
    else:
        lines.append("ok %d - %s" % (n, name))
if rc not in (0, 1) or not cases:  # pytest itself failed: collection, usage, no tests
    n += 1
    lines.append("not ok %d - pytest exited %d" % (n, rc))
    lines += ["# " + ln for ln in open(log, errors="replace").read().splitlines()[-40:]]
print("1..%d" % n)
print("\n".join(lines))
tail = [ln for ln in open(log, errors="replace").read().splitlines() if ln.strip()]
if tail:
    print("# pytest: " + tail[-1].strip("= "))
PYEOF
