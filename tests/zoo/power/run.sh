#!/bin/sh
# make check-power: the whole legitimate-implementations matrix (20 seeds
# of the small catalogue and two kernel-tier cases, staged and fused), the
# kill rate of every mutation x stage x mode and the detection floors;
# rewrites the tables of doc/power.md. Exit 1 on any false FAIL. Extra
# arguments go to power.py (e.g. --kernel-seeds 2 for a shorter run).
. "${top_srcdir:-$(cd "$(dirname "$0")/../../.." && pwd)}/tests/py_lib.sh"
PY=$(py_with numpy) || { echo "check-power: no Python with numpy" >&2; exit 2; }
export top_srcdir="$srcdir" top_builddir="$builddir"
exec nice "$PY" "$srcdir/tests/zoo/power/power.py" doc --write "$srcdir/doc/power.md" "$@"
