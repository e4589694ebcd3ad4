#!/bin/sh
# The output rules of doc/cli.md ("Output files") as a matrix (issue 29):
# every command x every output option x each of its inputs under every
# alias (the same name, ./, sub/.., an absolute path, a hard link, a
# symbolic link), with and without --force, is exit 2 with one line, every
# input byte-identical and nothing left in the directory; every pair of
# output options of one command on one file (the aliases again) likewise;
# each output option on a fresh name writes just that file; and every
# command whose standard output is a closed pipe says so in one line, exit
# 1. Tests as data: the tables below. Speaks TAP.
NAME=cli_matrix
. "${top_srcdir:-.}/tests/cli_lib.sh"
V="$top_srcdir/vectors"
B="$top_builddir/tests/backends/.libs"
DL_ABS=$(cd "$(dirname "$DL")" && pwd)/dropless
M="$T/m"
mkdir "$M" "$M/sub" "$T/pristine"
cp "$V/tiny.h5" "$M/G.h5"
cp "$V/tiny.h5" "$M/C.h5"
cp "$B/plain.so" "$M/pl.so"
printf 'base = tiny\n' >"$M/in.svg" # a case file; named .svg so that --plot may alias it
cp "$M/G.h5" "$M/C.h5" "$M/pl.so" "$M/in.svg" "$T/pristine/"

# command | its inputs | its output options (the command line has OPT PATH
# appended; files are named relative to $M)
COMMANDS='check|G.h5 C.h5|--json --junit|check G.h5 C.h5
run|G.h5 pl.so|--out --json --junit|run --backend ./pl.so G.h5
capacity|in.svg|--json --plot|capacity in.svg
gen|in.svg|-o|gen --config in.svg'

# in $M: runs dropless ARGS..., output in $T/out and $T/err, status in $st
dl() { (cd "$M" && "$DL_ABS" "$@") >"$T/out" 2>"$T/err"; st=$?; }
listing() { (cd "$M" && ls -A | sort | tr '\n' ' '); }
BEFORE=$(listing)
# the inputs byte-identical and the directory as it was
intact() {
    for f in G.h5 C.h5 pl.so in.svg; do cmp -s "$T/pristine/$f" "$M/$f" || { echo "$f changed"; return 1; }; done
    [ "$(listing)" = "$BEFORE" ] || { echo "left: $(listing)"; return 1; }
}
# refused CMDLINE...: exit 2, one line, nothing changed
refused() {
    dl "$@"
    [ "$st" -eq 2 ] || { echo "exit $st, want 2: dropless $*"; cat "$T/err"; return 1; }
    one_line_err && intact || { echo "dropless $*"; return 1; }
}
# the aliases of file F in $M: its name, ./F, sub/../F, its absolute path,
# a hard link, a symbolic link (the links made by make_links)
aliases() { echo "$1 ./$1 sub/../$1 $M/$1 hl-$1 sl-$1"; }
make_links() { ln "$M/$1" "$M/hl-$1" && ln -s "$1" "$M/sl-$1"; }
drop_links() { rm -f "$M/hl-$1" "$M/sl-$1"; }

# 1. an input under every alias is never an output, --force or not
while IFS='|' read -r cmd inputs opts line <&3; do
    for inp in $inputs; do
        for opt in $opts; do
            # shellcheck disable=SC2086
            check "$cmd: $opt onto its input $inp (6 aliases, with and without --force): exit 2, kept" \
                'make_links '"$inp"' && BEFORE=$(listing) && for a in $(aliases '"$inp"'); do
                     for force in "" --force; do refused '"$line"' '"$opt"' "$a" $force || exit 1; done
                 done; drop_links '"$inp"''
        done
    done
done 3<<EOF
$COMMANDS
EOF

# 2. two output options of one command on one file, under every alias
while IFS='|' read -r cmd inputs opts line <&3; do
    set -- $opts
    while [ $# -gt 1 ]; do
        a=$1
        shift
        for b in "$@"; do
            check "$cmd: $a and $b on one new file (name, ./, sub/.., absolute path): exit 2, nothing written" \
                'for alias in o.svg ./o.svg sub/../o.svg "$M/o.svg"; do
                     refused '"$line"' '"$a"' o.svg '"$b"' "$alias" || exit 1
                     refused '"$line"' '"$a"' o.svg '"$b"' "$alias" --force || exit 1
                 done'
            check "$cmd: $a and $b on one existing file (a hard link, a symbolic link), --force: exit 2, kept" \
                'echo keep >"$M/o.svg" && make_links o.svg && BEFORE=$(listing) &&
                 for alias in o.svg ./o.svg hl-o.svg sl-o.svg; do
                     refused '"$line"' '"$a"' o.svg '"$b"' "$alias" --force || exit 1
                 done && [ "$(cat "$M/o.svg")" = keep ] && drop_links o.svg && rm "$M/o.svg"'
        done
    done
done 3<<EOF
$COMMANDS
EOF

# 3. each output option on a fresh name writes that file and nothing else
# (a plot needs matplotlib)
have_mpl=0
/usr/bin/python3 -c "import matplotlib" 2>/dev/null && have_mpl=1
while IFS='|' read -r cmd inputs opts line <&3; do
    for opt in $opts; do
        if [ "$opt" = --plot ] && [ $have_mpl -eq 0 ]; then
            skip "$cmd $opt onto a fresh name" "no matplotlib for /usr/bin/python3"
            continue
        fi
        check "$cmd: $opt onto a fresh name writes it, nothing else left" \
            'dl '"$line"' '"$opt"' fresh.svg;
             [ "$st" -eq 0 ] && [ -s "$M/fresh.svg" ] && rm "$M/fresh.svg" && intact ||
             { echo "exit $st: dropless '"$line $opt"' fresh.svg"; cat "$T/err"; exit 1; }'
    done
done 3<<EOF
$COMMANDS
EOF

# 4. a closed pipe on standard output: one line, exit 1, never SIGPIPE
closed_pipe() { /usr/bin/python3 -c 'import os, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as a shell pipeline leaves it
r, w = os.pipe(); os.close(r); os.dup2(w, 1); os.execv(sys.argv[1], sys.argv[1:])' "$@"; }
PIPED='gen --config in.svg -o piped.h5
cases
cases --names
info G.h5
info --layout
info --layout --json
check G.h5 C.h5
check G.h5 C.h5 --json -
check G.h5 C.h5 --junit -
run --backend ./pl.so G.h5
capacity tiny
capacity tiny --json -
version
version --verbose
help
help gen'
while read -r line <&3; do
    check "dropless $line into a closed pipe: exit 1, one line" \
        '(cd "$M" && closed_pipe "$DL_ABS" '"$line"') 2>"$T/err"; st=$?; rm -f "$M/piped.h5";
         [ $st -eq 1 ] && one_line_err && grep -q "standard output" "$T/err" || { echo "exit $st"; exit 1; }'
done 3<<EOF
$PIPED
EOF

echo "1..$n"
[ "$fails" -eq 0 ]
