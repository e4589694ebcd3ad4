#!/bin/sh
# TAP wrapper for tests/test_adapters.py: runs it with the first Python that
# has numpy, h5py and ml_dtypes, preferring one that also has JAX
# (tools/setup_python.sh makes one), with the package dropless of this tree
# pointed at this build's library. DROPLESS_PYTHON, if set, is tried first.
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
fallback=""
for py in "$DROPLESS_PYTHON" "$venv/bin/python3" python3 /usr/bin/python3; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" -c 'import numpy, h5py, ml_dtypes' >/dev/null 2>&1 || continue
    if "$py" -c 'import jax' >/dev/null 2>&1; then
        exec "$py" "$srcdir/tests/test_adapters.py"
    fi
    [ -n "$fallback" ] || fallback=$py
done
if [ -n "$fallback" ]; then
    exec "$fallback" "$srcdir/tests/test_adapters.py"
fi
echo "1..1"
echo "ok 1 # SKIP no Python with numpy, h5py and ml_dtypes (run tools/setup_python.sh)"
