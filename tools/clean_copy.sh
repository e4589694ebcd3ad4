# Sourced by the CI scripts that build and test a clean copy of the sources
# (tools/check_sanitizers.sh, tools/check_extra_value.sh), from the root of
# a configured tree.
# clean_copy LABEL TAG [WORKDIR]: sets $work to WORKDIR (emptied first) or to
# a temporary directory removed at exit, and copies the sources there by
# `make distdir` into $work/src, so the main build is left alone; on failure
# prints "LABEL: make distdir failed" and exits 1.
clean_copy() {
    if [ -n "${3:-}" ]; then
        work=$3
        rm -rf "$work" && mkdir -p "$work" || exit 1
    else
        work=$(mktemp -d "${TMPDIR:-/tmp}/dl_$2.XXXXXX") || exit 1
        trap 'rm -rf "$work"' EXIT
    fi
    make -s distdir distdir="$work/src" >/dev/null || { echo "$1: make distdir failed" >&2; exit 1; }
}

# check_failures STATUS CHECKLOG: after the copy's `make check` (run in
# $work/src) exited with STATUS, prints the summary counts and, on failure,
# the failing tests and the lines around each failure in their logs.
check_failures() {
    grep -E '^# (TOTAL|PASS|SKIP|XFAIL|FAIL|XPASS|ERROR):' "$2"
    [ "$1" -eq 0 ] && return 0
    grep -E '^(FAIL|ERROR):' "$2"
    for l in $(grep -l -E '^(not ok|FAIL|ERROR)' tests/*.log 2>/dev/null); do
        echo "--- $l"
        grep -E -B2 -A12 '^(not ok|FAIL|ERROR)' "$l" | head -60
    done
}
