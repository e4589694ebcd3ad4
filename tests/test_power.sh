#!/bin/sh
# The runner's power, the make check slice: tests/test_power.py (mutants in
# both directions, the legitimate implementations) in a Python that has
# numpy, through this build's library. Speaks TAP.
. "${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}/tests/py_lib.sh"
PY=$(py_with numpy) || skip_all "no Python with numpy"
exec "$PY" "$srcdir/tests/test_power.py"
