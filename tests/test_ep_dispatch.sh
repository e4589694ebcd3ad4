#!/bin/sh
# TAP wrapper for tests/test_ep.py (the expert-parallel layout and the gloo
# dispatch, tools/adapters/ep_layout.py and tools/ep_dispatch.py): runs it
# with the first Python that has numpy, h5py and PyTorch, with the package
# dropless of this tree pointed at this build's library. DROPLESS_PYTHON,
# then $DROPLESS_VENV/bin/python3, are tried first. PyTorch is not in CI
# (its wheels weigh gigabytes): without it the one line is a SKIP saying so.
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
builddir=${top_builddir:-$srcdir}
venv=${DROPLESS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dropless/adapters-venv}
PYTHONPATH="$srcdir/python${PYTHONPATH:+:$PYTHONPATH}"
DROPLESS_LIB="$builddir/.libs/libdropless.so"
export PYTHONPATH DROPLESS_LIB
if ldd "$DROPLESS_LIB" 2>/dev/null | grep -q libasan; then
    echo "1..1"
    echo "ok 1 # SKIP the library is built with AddressSanitizer, which Python cannot load through ctypes without preloading its runtime"
    exit 0
fi
for py in "$DROPLESS_PYTHON" "$venv/bin/python3" python3 /usr/bin/python3; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import numpy, h5py, ml_dtypes, torch' >/dev/null 2>&1; then
        exec "$py" "$srcdir/tests/test_ep.py"
    fi
done
echo "1..1"
echo "ok 1 # SKIP no Python with numpy, h5py and PyTorch (PyTorch is not in CI; DROPLESS_VENV or DROPLESS_PYTHON names one that has it)"
