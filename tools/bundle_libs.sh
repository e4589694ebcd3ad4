#!/bin/sh
# Copies this build's libdropless.so.0 and the dropless command beside it
# (.libs/dropless), the shared libraries they need that a machine without
# the build's packages lacks (OpenBLAS, HDF5, MPFR, GMP and theirs:
# everything ldd resolves but the C library, libm, libgcc_s and whatever
# matches SKIP), and a prebuilt dropless.jax FFI handler, into DIR,
# for running the Python package and examples/jax_moe_ffi.py on a machine
# that cannot build the library (a GPU machine without HDF5 or OpenBLAS
# development packages; doc/python.md, "The example"). Then, there:
#   LD_LIBRARY_PATH=DIR DROPLESS_LIB=DIR/libdropless.so.0 DROPLESS_CLI=DIR/dropless \
#   DROPLESS_JAX_FFI=DIR/libdropless_jax_ffi.so PYTHONPATH=python python3 ...
# Usage: tools/bundle_libs.sh DIR [SKIP]   (SKIP: an extended regex of
#        library paths to leave out; default: the curl/TLS/Kerberos chain,
#        present on most systems, and too big to carry along everywhere)
# DROPLESS_LIB names the library if not the build tree's. Prints the
# bundle's size; exit 1 when the library is not built.
set -eu
srcdir=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: tools/bundle_libs.sh DIR [SKIP]}
skip=${2:-'/lib(curl|nghttp2|idn2|rtmp|ssh2|psl|ssl|crypto|gssapi_krb5|ldap|lber|zstd|brotli[a-z]*|unistring|gnutls|hogweed|nettle|krb5[a-z]*|k5crypto|com_err|sasl2|p11-kit|tasn1|keyutils|ffi)[.-]'}
lib=${DROPLESS_LIB:-$srcdir/.libs/libdropless.so.0}  # the build tree's, unless named
[ -f "$lib" ] || { echo "bundle_libs: no $lib (build first)" >&2; exit 1; }
mkdir -p "$dir"
cp -L "$lib" "$dir/libdropless.so.0"
# the command too, for `dropless gen` and the CLI parity tests there
[ -x "$(dirname "$lib")/dropless" ] && cp -L "$(dirname "$lib")/dropless" "$dir/dropless"
ldd "$lib" | awk '/=> \// {print $3}' |
    grep -Ev '/(libc|libm|libgcc_s|libpthread|libdl|librt|libresolv)\.so' |
    grep -Ev "$skip" | while read -r so; do cp -L "$so" "$dir/"; done
# the FFI handler, built against this machine's jaxlib headers (any jaxlib
# of the same FFI major version calls it: the handshake says so)
venv=${DROPLESS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dropless/adapters-venv}
py=${DROPLESS_PYTHON:-$venv/bin/python3}
if "$py" -c 'import jax.ffi' 2>/dev/null; then
    h=$(PYTHONPATH="$srcdir/python" DROPLESS_LIB="$lib" DROPLESS_JAX_CACHE="$dir/.jax-ffi" \
        "$py" -c 'import dropless.jax as d; print(d.register())')
    cp "$h" "$dir/libdropless_jax_ffi.so"
    rm -rf "$dir/.jax-ffi"
else
    echo "bundle_libs: no JAX in $py: no prebuilt FFI handler (a C compiler there builds one)" >&2
fi
ls "$dir"
du -sh "$dir"
