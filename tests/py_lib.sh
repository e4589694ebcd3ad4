# Sourced by the TAP wrappers of Python tests (test_adapters.sh,
# test_ep_dispatch.sh, test_reference_layer.sh): the tree's package on the
# path, pointed at this build's library; a SKIP on an AddressSanitizer
# build; and py_with MODULES (tests/py_with.sh).
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

. "$srcdir/tests/py_with.sh"

# One TAP SKIP line for the whole script, then exit.
skip_all() {
    echo "1..1"
    echo "ok 1 # SKIP $1"
    exit 0
}
