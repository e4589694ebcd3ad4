#!/bin/sh
# TAP wrapper for tests/test_quant.py (dropless.quant against ml_dtypes),
# and tests/test_lowp_layer.py (the layer recipes' goldens), with the first Python that has numpy, ml_dtypes and pytest (tests/py_lib.sh).
. "${top_srcdir:-$(dirname "$0")/..}/tests/py_lib.sh"
py=$(py_with "numpy, ml_dtypes, pytest") ||
    skip_all "no Python with numpy, ml_dtypes and pytest: set DROPLESS_VENV or DROPLESS_PYTHON to one"
out=$("$py" -m pytest -q -p no:cacheprovider "$srcdir/tests/test_quant.py" "$srcdir/tests/test_lowp_layer.py" 2>&1)
rc=$?
echo "1..1"
echo "$out" | sed 's/^/# /'
if [ $rc -eq 0 ]; then
    echo "ok 1 - dropless.quant against ml_dtypes ($(echo "$out" | tail -1))"
else
    echo "not ok 1 - dropless.quant against ml_dtypes"
fi
