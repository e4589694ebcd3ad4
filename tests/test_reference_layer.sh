#!/bin/sh
# TAP wrapper for tests/test_reference_layer.py: runs it with the first
# Python that has torch, numpy, h5py and ml_dtypes ($DROPLESS_PYTHON, then
# $DROPLESS_VENV's, then the adapters' venv), with the package dropless of
# this tree pointed at this build's library. Without torch (CI: its wheels
# weigh gigabytes) the one line is a SKIP saying so.
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
builddir=${top_builddir:-$srcdir}
venv=${DROPLESS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dropless/adapters-venv}
PYTHONPATH="$srcdir/python:$srcdir${PYTHONPATH:+:$PYTHONPATH}"
DROPLESS_LIB="$builddir/.libs/libdropless.so"
export PYTHONPATH DROPLESS_LIB
if ldd "$DROPLESS_LIB" 2>/dev/null | grep -q libasan; then
    echo "1..1"
    echo "ok 1 # SKIP the library is built with AddressSanitizer, which Python cannot load through ctypes without preloading its runtime"
    exit 0
fi
for py in "$DROPLESS_PYTHON" "$venv/bin/python3"; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import torch, numpy, h5py, ml_dtypes' >/dev/null 2>&1; then
        exec "$py" "$srcdir/tests/test_reference_layer.py"
    fi
done
echo "1..1"
echo "ok 1 # SKIP no Python with PyTorch (and numpy, h5py, ml_dtypes): set DROPLESS_VENV or DROPLESS_PYTHON to one (the GPU report runs the layer on the H200)"
