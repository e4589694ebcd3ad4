#!/bin/sh
# The package installs and works on its own (issue 28, item 1): a wheel of
# python/ is built (taking this build's library: DROPLESS_BUILD_DIR, the
# documented override for out-of-tree builds, on the build step only),
# installed into a new venv, and, with no dropless variable set and from
# outside the source tree, the package finds its own library, headers and
# FFI handler, `pytest examples/` passes and the dropless.jax example is
# conformant. The new venv takes numpy, ml_dtypes, pytest and JAX from the
# project's venv (a .pth line after its own site-packages, offline: nothing
# is downloaded); pip installs the wheel with --no-index. A SKIP without
# that venv. `make check-python-sdist` builds the library from an sdist's
# sources instead (configure and compile: about a minute).
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
builddir=${top_builddir:-$srcdir}
venv=${DROPLESS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dropless/adapters-venv}
py=$venv/bin/python3
echo "1..5"
if ! "$py" -c 'import pytest, numpy, ml_dtypes, setuptools, wheel' >/dev/null 2>&1; then
    for i in 1 2 3 4 5; do echo "ok $i # SKIP no $venv with pytest, numpy, ml_dtypes, setuptools and wheel (tools/setup_python.sh)"; done
    exit 0
fi
if ldd "$builddir/.libs/libdropless.so" 2>/dev/null | grep -q libasan; then
    for i in 1 2 3 4 5; do echo "ok $i # SKIP the library is built with AddressSanitizer"; done
    exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dl-install-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
# a copy: pip builds in the tree it is given, and srcdir may be read-only
mkdir -p "$tmp/src" && cp -R "$srcdir/python" "$tmp/src/python" && cp -R "$srcdir/examples" "$tmp/examples" &&
    rm -rf "$tmp/src/python/build" "$tmp/src/python"/*.egg-info
t0=$(date +%s)
if DROPLESS_BUILD_DIR=$(cd "$builddir" && pwd) "$py" -m pip wheel -q --no-deps --no-build-isolation \
       --disable-pip-version-check "$tmp/src/python" -w "$tmp/wheels" >"$tmp/log" 2>&1; then
    echo "ok 1 - a wheel of python/ builds ($(ls "$tmp/wheels"))"
else
    echo "not ok 1 - a wheel of python/ builds"; sed 's/^/# /' "$tmp/log" | tail -20
    for i in 2 3 4 5; do echo "not ok $i - # no wheel"; done
    exit 0
fi
# the new venv: its own site-packages first, the project venv's after (deps)
"$py" -m venv "$tmp/venv" >"$tmp/log" 2>&1 &&
site=$("$tmp/venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') &&
"$py" -c 'import os, sys; print("\n".join(p for p in sys.path if p and os.path.isdir(p) and not p.startswith(sys.base_prefix)))' >"$site/zz_dropless_deps.pth" &&
"$tmp/venv/bin/python3" -m pip install -q --no-index --no-deps --ignore-installed --disable-pip-version-check "$tmp/wheels"/*.whl \
    >>"$tmp/log" 2>&1
rc=$?
echo "# built and installed in $(($(date +%s) - t0)) s"
clean="env -u DROPLESS_LIB -u DROPLESS_INCLUDE -u DROPLESS_JAX_FFI -u DROPLESS_JAX_CACHE -u DROPLESS_CLI -u PYTHONPATH -u top_builddir -u top_srcdir PYTHONDONTWRITEBYTECODE=1 XDG_CACHE_HOME=$tmp/cache"
if [ $rc -eq 0 ]; then
    echo "ok 2 - the wheel installs into a new venv (--no-index)"
else
    echo "not ok 2 - the wheel installs into a new venv (--no-index)"; sed 's/^/# /' "$tmp/log" | tail -20
fi
cd "$tmp" || exit 1
if $clean "$tmp/venv/bin/python3" - "$tmp/venv" >"$tmp/log" 2>&1 <<'PYEOF'
import os, sys
import dropless
venv = os.path.realpath(sys.argv[1])
inside = lambda p: os.path.realpath(p).startswith(venv + os.sep)
assert inside(dropless.__file__), dropless.__file__
assert inside(dropless.library_path()), dropless.library_path()
inc = os.path.join(os.path.dirname(dropless.__file__), "_native", "include", "dropless.h")
assert os.path.isfile(inc), inc
with dropless.generate("tiny") as g:
    assert dropless.check(g, {"out": g.forward["out"]}).conformant
try:
    import jax  # noqa: F401
except ImportError:
    print("no jax")
else:
    import dropless.jax
    assert inside(dropless.jax.handler_path()), dropless.jax.handler_path()
print(dropless.library_path())
PYEOF
then
    echo "ok 3 - the installed package uses its own library, headers and FFI handler ($(tail -1 "$tmp/log"))"
else
    echo "not ok 3 - the installed package uses its own library, headers and FFI handler"; sed 's/^/# /' "$tmp/log" | tail -20
fi
# five cases (each dtype, plain and SwiGLU, softmax and sigmoid, T = 0):
# the install is under test here; tests/test_python.sh runs every case
if $clean "$tmp/venv/bin/python3" -m pytest -q -p no:cacheprovider --rootdir="$tmp/examples" \
       --dropless-cases=tiny,mixtral-small-bf16,deepseek-v3-small-fp16,plain-ffn-bf16,no-tokens \
       "$tmp/examples" >"$tmp/log" 2>&1; then
    echo "ok 4 - pytest examples/ passes in the new venv ($(tail -1 "$tmp/log" | tr -d '='))"
else
    echo "not ok 4 - pytest examples/ passes in the new venv"; sed 's/^/# /' "$tmp/log" | tail -20
fi
if ! "$tmp/venv/bin/python3" -c 'import jax' >/dev/null 2>&1; then
    echo "ok 5 # SKIP no JAX in $venv"
elif $clean "$tmp/venv/bin/python3" "$tmp/examples/jax_moe_ffi.py" >"$tmp/log" 2>&1; then
    echo "ok 5 - the dropless.jax example is conformant in the new venv"
else
    echo "not ok 5 - the dropless.jax example is conformant in the new venv"; sed 's/^/# /' "$tmp/log" | tail -20
fi
