# Sourced by the TAP wrappers of Python tests (test_adapters.sh,
# test_ep_dispatch.sh, test_reference_layer.sh): the tree's package on the
# path, pointed at this build's library; a SKIP on an AddressSanitizer
# build; and py_with MODULES, which prints the first Python that imports
# them: $DROPLESS_PYTHON, then $DROPLESS_VENV's (default the adapters'
# venv, tools/setup_python.sh), then /usr/bin/python3 (never the first
# python3 on PATH, which may lack numpy).
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

py_with() {
    for cand in "$DROPLESS_PYTHON" "$venv/bin/python3" /usr/bin/python3; do
        [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 || continue
        if "$cand" -c "import $1" >/dev/null 2>&1; then
            echo "$cand"
            return 0
        fi
    done
    return 1
}

# One TAP SKIP line for the whole script, then exit.
skip_all() {
    echo "1..1"
    echo "ok 1 # SKIP $1"
    exit 0
}
