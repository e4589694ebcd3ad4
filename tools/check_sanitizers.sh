#!/bin/sh
# The sanitizer configuration of CI: builds a clean copy of the sources
# (`make distdir`, so the main build is left alone) with
# -fsanitize=address,undefined and runs its `make check`.
# Usage: tools/check_sanitizers.sh [WORKDIR]   (from a configured tree)
# WORKDIR (default: a temporary directory, removed afterwards) keeps the
# build for a second look.
set -u
cd "$(dirname "$0")/.."
. tools/clean_copy.sh
clean_copy "sanitizers" asan "${1:-}"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
start=$(date +%s)
cd "$work/src" || exit 1
if ! ./configure -q CFLAGS="-g -O1 $SAN" LDFLAGS="$SAN" >"$work/configure.log" 2>&1; then
    echo "sanitizers: configure failed" >&2
    cat "$work/configure.log" >&2
    exit 1
fi
if ! make -s -j"$(nproc)" >"$work/build.log" 2>&1; then
    echo "sanitizers: build failed" >&2
    tail -30 "$work/build.log" >&2
    exit 1
fi
# HDF5 1.10.8 leaks on some of its own error paths (tests/fuzz/lsan.supp);
# everything else, ours included, is reported. halt_on_error: the first
# report fails the test that triggered it.
LSAN_OPTIONS="suppressions=$(pwd)/tests/fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export LSAN_OPTIONS UBSAN_OPTIONS
make -s -j"$(nproc)" check >"$work/check.log" 2>&1
status=$?
check_failures "$status" "$work/check.log"
echo "sanitizers: make check under ASan+UBSan: exit $status in $(( $(date +%s) - start )) s"
exit $status
