#!/bin/sh
# Golden bytes must not depend on the compiler or the optimisation level:
# rebuilds dropless from a clean copy of the sources with clang, and with gcc
# at -O0, regenerates every committed vector with each build and compares its
# SHA-256 with vectors/SHA256SUMS (tests/test_vectors.sh, which also varies
# the thread counts). A compiler that is absent is skipped, saying so.
# Usage: tools/repro_compilers.sh   (from a configured tree: needs `make distdir`)
set -u
cd "$(dirname "$0")/.."
top=$(pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dl_repro.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
make -s distdir distdir="$work/src" >/dev/null || { echo "repro: make distdir failed" >&2; exit 1; }
status=0
for cfg in clang gcc-O0; do
    case $cfg in
    clang) cc=clang cflags="-O2" ;;
    gcc-O0) cc=gcc cflags="-O0" ;;
    esac
    if ! command -v "$cc" >/dev/null 2>&1; then
        echo "repro: $cfg: SKIP ($cc is not installed)"
        continue
    fi
    b="$work/$cfg"
    cp -r "$work/src" "$b"
    if ! (cd "$b" && ./configure -q CC="$cc" CFLAGS="$cflags" >/dev/null && make -s -j"$(nproc)" dropless >/dev/null 2>"$b.log"); then
        echo "repro: $cfg: build FAILED"
        cat "$b.log" >&2
        status=1
        continue
    fi
    out=$(top_builddir="$b" top_srcdir="$top" sh "$top/tests/test_vectors.sh")
    nok=$(echo "$out" | grep -c '^ok')
    bad=$(echo "$out" | grep '^not ok')
    skipped=$(echo "$out" | grep -c '# SKIP')
    if [ -n "$bad" ]; then
        echo "repro: $cfg: vectors DIFFER from vectors/SHA256SUMS:"
        echo "$bad"
        status=1
    elif [ "$skipped" -gt 0 ]; then
        echo "repro: $cfg: SKIP ($(echo "$out" | grep -m1 '# SKIP' | sed 's/.*# SKIP //'))"
    else
        echo "repro: $cfg: all $nok vector checks identical to vectors/SHA256SUMS"
    fi
done
exit $status
