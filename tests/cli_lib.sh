# Shared by the CLI test scripts (sourced): TAP bookkeeping and a runner
# for the dropless command. The script sets NAME before sourcing; this sets
# DL, a temporary directory T (removed on exit), n and fails.
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
. "$top_srcdir/tests/py_with.sh"
DL="$top_builddir/dropless"
T=$(mktemp -d "${TMPDIR:-/tmp}/dl_${NAME:-cli}.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
n=0
fails=0
# check DESCRIPTION COMMAND...: the command (a shell snippet) must succeed
check() {
    n=$((n + 1))
    desc=$1
    shift
    if (eval "$*") >"$T/check.out" 2>&1; then
        echo "ok $n - $desc"
    else
        echo "not ok $n - $desc"
        sed 's/^/# /' "$T/check.out"
        fails=$((fails + 1))
    fi
}
# run EXPECTED_STATUS ARGS...: runs dropless, output in $T/out and $T/err
run() {
    want=$1
    shift
    "$DL" "$@" >"$T/out" 2>"$T/err"
    got=$?
    if [ "$got" -ne "$want" ]; then
        echo "exit status $got, want $want: dropless $*"
        cat "$T/err" "$T/out"
        return 1
    fi
}
one_line_err() { [ "$(wc -l <"$T/err")" -eq 1 ] || { cat "$T/err"; return 1; }; }
# skip DESCRIPTION REASON: a TAP SKIP line
skip() {
    n=$((n + 1))
    echo "ok $n # SKIP $1: $2"
}
# 0 when this build's library carries AddressSanitizer (tools/check_sanitizers.sh)
sanitized() { ldd "$top_builddir/.libs/libdropless.so" 2>/dev/null | grep -q libasan; }
# fails_alone GOLDEN STAGE,...: each stage's sign mutant (dropless mutate,
# staged) FAILs at that stage and at no other
fails_alone() {
    fa_m="$T/mut.$(basename "$1" .h5)"
    run 0 mutate "$1" -o "$fa_m" --mutations sign --stages "$2" --modes staged || return 1
    for s in $(echo "$2" | tr , " "); do
        run 1 check "$1" "$fa_m/sign.$s.staged.h5" && grep -q "^$s .*FAIL" "$T/out" &&
            [ "$(grep -c " FAIL " "$T/out")" -eq 1 ] || return 1
    done
}
