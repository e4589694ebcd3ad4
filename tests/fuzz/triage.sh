#!/bin/sh
# Replays fuzz inputs through the harness one by one and classifies each
# failure by its top stack frame: "ours" (a frame in src/ or tests/fuzz/
# above any HDF5 frame), "hdf5" (the fault is inside libhdf5), or "ok".
# Usage: tests/fuzz/triage.sh HARNESS FILE...
h=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=1}
LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan.supp}
export ASAN_OPTIONS LSAN_OPTIONS
for f in "$@"; do
    log=$("$h" -runs=1 -timeout=10 -rss_limit_mb=1500 "$f" 2>&1)
    if ! printf '%s\n' "$log" | grep -q -E '^==[0-9]+==ERROR|ERROR: libFuzzer|runtime error'; then
        echo "ok    $f"
        continue
    fi
    what=$(printf '%s\n' "$log" | grep -m1 -E 'ERROR|runtime error' | sed 's/^==[0-9]*==//' | cut -c1-90)
    # the first frame outside the sanitizer/fuzzer runtime
    top=$(printf '%s\n' "$log" | grep -E '^ +#[0-9]+ ' |
          grep -v -E '__asan|__sanitizer|fuzzer::|__interceptor|libc\.so|sysdeps|in (malloc|calloc|realloc|free|memcpy|memmove|memset|strlen|strdup|strcmp|strncpy|strcpy|abort|raise|gsignal|__pthread_kill_implementation|__pthread_kill_internal) ' |
          head -1)
    case $top in
    *libhdf5*) kind=hdf5 ;;
    *src/*|*tests/fuzz/*) kind=ours ;;
    *) kind=other ;;
    esac
    fn=$(printf '%s\n' "$top" | sed -E 's/.* in ([^ ]+) .*/\1/; s/.*\((.*)\).*/\1/' | cut -c1-60)
    echo "$kind  $f  [$what] at $fn"
done
