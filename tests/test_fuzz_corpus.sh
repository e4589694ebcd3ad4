#!/bin/sh
# Every file of the fuzz corpus (tests/fuzz/corpus: seeds, inputs the fuzzer
# found interesting, and every crasher, most of them crashes inside HDF5
# 1.10.8 itself) given to `dropless check` as a candidate against the
# golden the harness loads against (vectors/tiny.h5) must end in a verdict
# or a clean refusal: exit status 1 (not conformant) or 2 (unreadable, with
# one line on stderr naming the file), never a signal or a hang. Seeds are
# subsets of the golden itself and may also conform (0). The hang-* input
# loops forever inside HDF5: `dropless check` must give up on it (its
# preflight child has a time limit), before this test's own limit,
# DL_FUZZ_CORPUS_TIMEOUT seconds (default 180), kills it. Then every file
# again as a golden file, through `dropless info` (issue 17: unsealed
# goldens are parsed in a child too): exit status 0 (a valid unsealed
# golden) or 2 with one line naming the file. Speaks TAP.
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
DL="$top_builddir/dropless"
GOLDEN="$top_srcdir/vectors/tiny.h5"
LIMIT=${DL_FUZZ_CORPUS_TIMEOUT:-180}
# the preflight child's time limit for a candidate that hangs HDF5
DROPLESS_PREFLIGHT_SECONDS=${DROPLESS_PREFLIGHT_SECONDS:-10}
export DROPLESS_PREFLIGHT_SECONDS
T=$(mktemp -d "${TMPDIR:-/tmp}/dl_fuzz_corpus.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
files=$(ls "$top_srcdir"/tests/fuzz/corpus/*.h5 2>/dev/null)
count=$(echo "$files" | wc -w)
echo "1..$((2 * count + 1))"
n=1
if [ "$count" -gt 0 ]; then
    echo "ok 1 - tests/fuzz/corpus holds $count files"
else
    echo "not ok 1 - tests/fuzz/corpus is empty"
fi
skip=
"$DL" help 2>/dev/null | grep -q '^ *check ' || skip=" # SKIP dropless check not available"
to=
command -v timeout >/dev/null 2>&1 && to="timeout -s KILL $LIMIT"
# judge KIND NAME FILE RC: the TAP line for one run
judge() {
    kind=$1 name=$2 f=$3 rc=$4
    why=
    case $rc in
    0) case $kind:$name in
       *:seed-*) ;;
       candidate:loads-*) # datasets set aside by the loader (bad_datasets) must be
                # FAIL (shape) through dl_check_candidate_t.bad_shape
                why="conforms (exit 0), but the loader set datasets aside" ;;
       *) why="accepted (exit 0): a damaged file should not be" ;;
       esac ;;
    1) [ "$kind" = candidate ] || why="exit 1 from info" ;;
    2) lines=$(wc -l <"$T/err")
       if [ "$lines" -ne 1 ]; then
           why="exit 2 with $lines lines on stderr, not one"
       elif ! grep -q -F "$f" "$T/err"; then
           why="exit 2, stderr does not name the file"
       fi ;;
    137) why="killed after ${LIMIT}s (a hang) or by SIGKILL" ;;
    *) if [ "$rc" -ge 128 ]; then why="died of signal $((rc - 128))"
       else why="exit status $rc"; fi ;;
    esac
    if [ -z "$why" ]; then
        echo "ok $n - $kind $name (exit $rc)"
    else
        echo "not ok $n - $kind $name: $why"
        sed 's/^/# /' "$T/err" | head -5
    fi
}
for kind in candidate golden; do
    for f in $files; do
        n=$((n + 1))
        name=$(basename "$f")
        if [ -n "$skip" ]; then
            echo "ok $n - $kind $name$skip"
            continue
        fi
        # shellcheck disable=SC2086
        if [ "$kind" = candidate ]; then
            $to "$DL" check "$GOLDEN" "$f" >"$T/out" 2>"$T/err" </dev/null
        else
            $to "$DL" info "$f" >"$T/out" 2>"$T/err" </dev/null
        fi
        judge "$kind" "$name" "$f" $?
    done
done
