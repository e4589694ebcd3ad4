#!/bin/sh
# Regressions of the adversarial audit of issue 17, one group per numbered
# item: crafted paths, files, plugins, full disks and closed outputs must
# end in one line on stderr and the documented exit status, never a crash,
# a clobbered file or a half-written one. Speaks TAP.
NAME=cli_hardening
. "${top_srcdir:-.}/tests/cli_lib.sh"
V="$top_srcdir/vectors"
B="$top_builddir/tests/backends/.libs"
C="$top_srcdir/tests/fuzz/corpus"
G="$V/tiny.h5"
DROPLESS_PREFLIGHT_SECONDS=10
export DROPLESS_PREFLIGHT_SECONDS
# a file-size limit makes writes fail as on a full disk (EFBIG), without
# root or a small file system; the shell ignores SIGXFSZ so the write fails
full_disk() { (trap '' XFSZ; ulimit -f "$1"; shift; "$DL" "$@"); }
no_tmp() { [ -z "$(ls -A "$1" | grep '\.tmp-')" ] || { ls -la "$1"; return 1; }; }

"$DL" gen -q tiny --seed 9 -o "$T/seed9.h5"

# 1. reports never replace what is there without --force, never a non-file
check "1: --json onto an input of the command: exit 2, the golden kept" \
    'cp "$G" "$T/v.h5" && run 2 check "$T/v.h5" "$G" --json "$T/v.h5" --force && one_line_err &&
     grep -q "is an input" "$T/err" && cmp -s "$G" "$T/v.h5"'
check "1: --json onto an existing file: exit 2, file kept, nothing checked" \
    'echo keep >"$T/r.json" && run 2 check "$G" "$G" --json "$T/r.json" && one_line_err &&
     grep -q -- "--force" "$T/err" && [ "$(cat "$T/r.json")" = keep ] && [ ! -s "$T/out" ]'
check "1: --junit onto an existing file: exit 2, file kept" \
    'echo keep >"$T/r.xml" && run 2 run --backend "$B/plain.so" --junit "$T/r.xml" "$G" &&
     one_line_err && [ "$(cat "$T/r.xml")" = keep ]'
check "1: --json --force replaces a regular file" \
    'run 0 check "$G" "$G" --json "$T/r.json" --force && grep -q "^{\"format\":\"dropless-check\"" "$T/r.json"'
check "1: --force never replaces a FIFO, a symlink, a directory or a device" \
    'mkfifo "$T/fifo" && ln -s "$T/r.json" "$T/link" && mkdir "$T/dir" &&
     for p in "$T/fifo" "$T/link" "$T/dir" /dev/null; do
         run 2 check "$G" "$G" --force --json "$p" && one_line_err && grep -q "not replaced" "$T/err" || exit 1
     done && [ -p "$T/fifo" ] && [ -L "$T/link" ] && [ -d "$T/dir" ] && [ -c /dev/null ]'
check "1: --json - writes the JSON to stdout, no table" \
    'run 0 check "$G" "$G" --json - && head -c 30 "$T/out" | grep -q "^{\"format\":\"dropless-check\"" &&
     ! grep -q "^CONFORMANT" "$T/out"'
check "1: --json and --junit on one path: exit 2" \
    'run 2 check "$G" "$G" --json - --junit - && one_line_err'
check "1: an unwritable report path is refused before the check runs" \
    'run 2 check "$G" "$G" --json "$T/no/such/dir/r.json" && one_line_err && [ ! -s "$T/out" ]'
check "1: a report that cannot be written (full disk) keeps exit 1, not 2" \
    'full_disk 1 check "$G" "$T/seed9.h5" --json "$T/big.json" >/dev/null 2>"$T/err"; [ $? -eq 1 ] &&
     one_line_err && grep -q "big.json" "$T/err" && [ ! -e "$T/big.json" ] && no_tmp "$T"'
check "1: a conformant check whose report cannot be written: exit 1" \
    'full_disk 1 check "$G" "$G" --junit "$T/big.xml" >/dev/null 2>"$T/err"; [ $? -eq 1 ] &&
     one_line_err && [ ! -e "$T/big.xml" ] && no_tmp "$T"'

# 2. a damaged unsealed golden is parsed in a child, like a candidate
# an unsealed golden whose vlen-string attribute sends HDF5 into an endless
# loop (deterministic, unlike the crashes): given up on, not hung on
HG=$(ls "$C"/hang-golden-*.h5 | head -1)
to=
command -v timeout >/dev/null 2>&1 && to="timeout -s KILL 120"
for cmd in "info" "check @ $G" "run --backend $B/plain.so @"; do
    check "2: ${cmd%% *} with a golden that hangs HDF5: exit 2 after the time limit, one line" \
        'set -- $(echo "'"$cmd"'" | sed "s|@|$HG|"); [ "$1" = info ] && set -- info "$HG";
         DROPLESS_PREFLIGHT_SECONDS=2 $to "$DL" "$@" >"$T/out" 2>"$T/err"; [ $? -eq 2 ] &&
         one_line_err && grep -q "hung" "$T/err" && grep -q -F "$HG" "$T/err"'
done
# (whether a crasher crashes depends on the heap layout: all of them, each way)
check "2: info on goldens that crash HDF5: exit 2, one line naming each" \
    'for f in "$C"/crash-*.h5; do run 2 info "$f" && one_line_err && grep -q -F "$f" "$T/err" || exit 1; done'
check "2: check with goldens that crash HDF5: exit 2, one line naming each" \
    'for f in "$C"/crash-*.h5; do run 2 check "$f" "$G" && one_line_err && grep -q -F "$f" "$T/err" || exit 1; done'
check "2: run with goldens that crash HDF5: exit 2, one line naming each" \
    'for f in "$C"/crash-*.h5; do
         run 2 run --backend "$B/plain.so" "$f" && one_line_err && grep -q -F "$f" "$T/err" || exit 1
     done'
check "2: an unsealed valid golden still loads (through the child)" \
    'cp "$G" "$T/unsealed.h5" && dd if=/dev/zero of="$T/unsealed.h5" bs=512 count=1 conv=notrunc 2>/dev/null &&
     run 0 info "$T/unsealed.h5" && grep -q "seal: unsealed" "$T/out" && run 0 check "$T/unsealed.h5" "$G"'

# 3. empty output paths: a message, never stack garbage
check "3: gen -o \"\": exit 2, one readable line" \
    'run 2 gen tiny -o "" && one_line_err && grep -q "output" "$T/err" && ! LC_ALL=C grep -q "[^ -~]" "$T/err"'
check "3: run --out \"\": exit 2, one line saying why" \
    'run 2 run --backend "$B/plain.so" --out "" "$G" && one_line_err && grep -q -- "--out needs" "$T/err"'
check "3: --json \"\": exit 2, one line" 'run 2 check "$G" "$G" --json "" && one_line_err'

# 4. an empty directory is not the root directory
check "4: gen -d \"\": exit 2, nothing written to /" \
    'had=0; [ -e /tiny.h5 ] && had=1; run 2 gen tiny -d "" && one_line_err && { [ $had -eq 1 ] || [ ! -e /tiny.h5 ]; }'

# 5. output that never reached stdout is a failure
if [ -w /dev/full ]; then
    for cmd in "check $G $G" "check --json - $G $G" "info $G" "cases" "version" "gen -d $T/full --force tiny"; do
        mkdir -p "$T/full"
        # shellcheck disable=SC2086
        check "5: dropless $cmd >/dev/full: exit 1, one line" \
            '"$DL" '"$cmd"' >/dev/full 2>"$T/err"; [ $? -eq 1 ] && one_line_err && grep -q "standard output" "$T/err"'
    done
else
    n=$((n + 1)); echo "ok $n # SKIP /dev/full not writable"
fi

# 6. HDF5's own error printing never reaches stderr
check "6: a corpus file that upsets HDF5's shutdown, as golden: one line" \
    'run 2 check "$C/oom-H5C_protect-059ecea1.h5" "$G" && one_line_err'
check "6: gen --force onto a full disk: exit 1, one line, the old file kept, no temporary" \
    'mkdir "$T/d6" && cp "$T/seed9.h5" "$T/d6/tiny.h5" && full_disk 8 gen -q --force tiny -d "$T/d6" 2>"$T/err";
     [ $? -eq 1 ] && one_line_err && cmp -s "$T/seed9.h5" "$T/d6/tiny.h5" && no_tmp "$T/d6"'
check "6: run --out onto a full disk: exit 1, one line, no temporary" \
    'mkdir "$T/d6b" && full_disk 8 run --backend "$B/plain.so" --out "$T/d6b/c.h5" "$G" >/dev/null 2>"$T/err";
     [ $? -eq 1 ] && one_line_err && [ ! -e "$T/d6b/c.h5" ] && no_tmp "$T/d6b"'

# 7. a plugin path without a slash is a file, not a library search
check "7: --backend plain.so (no slash) loads ./plain.so" \
    'G_ABS=$(cd "$(dirname "$G")" && pwd)/tiny.h5 && DL_ABS=$(cd "$(dirname "$DL")" && pwd)/dropless &&
     (cd "$B" && "$DL_ABS" run --backend plain.so "$G_ABS") >"$T/out" 2>"$T/err" && grep -q "^CONFORMANT" "$T/out"'
check "7: a plugin named like a system library is the file here, not the library" \
    'mkdir "$T/p7" && cp "$B/plain.so" "$T/p7/libm.so.6" && G_ABS=$(cd "$(dirname "$G")" && pwd)/tiny.h5 &&
     DL_ABS=$(cd "$(dirname "$DL")" && pwd)/dropless &&
     (cd "$T/p7" && "$DL_ABS" run --backend libm.so.6 "$G_ABS") >"$T/out" 2>"$T/err" && grep -q "^CONFORMANT" "$T/out"'
check "7: --backend libc.so.6 (no slash, no such file here): exit 2" \
    'run 2 run --backend libc.so.6 "$G" && one_line_err && grep -q "libc.so.6" "$T/err"'

# 8. the candidate loader's error always names the file
check "8: every corpus crasher as candidate: the one line names the file" \
    'for f in "$C"/crash-*.h5 "$C"/oom-*.h5; do
         "$DL" check "$G" "$f" >/dev/null 2>"$T/err"; [ $? -eq 2 ] && one_line_err && grep -q -F "$f" "$T/err" || exit 1
     done'

# 9. an interrupted gen leaves nothing; a killed one nothing that loads
check "9: info says unsealed for a file without a seal, incomplete for a killed writer" \
    'cp "$G" "$T/inc.h5" && printf "dropless-golden user block 1\nincomplete: being written, not sealed yet\n" |
     dd of="$T/inc.h5" conv=notrunc 2>/dev/null && run 2 info "$T/inc.h5" && one_line_err && grep -q incomplete "$T/err"'

# 10. small lies
check "10: --seed 2^64: exit 2, too large" \
    'run 2 gen tiny --seed 18446744073709551616 -d "$T" && one_line_err && grep -q "too large" "$T/err"'
check "10: bytes appended to a sealed file: says appended, not truncated" \
    'cat "$G" "$G" >"$T/app.h5" && run 2 info "$T/app.h5" && one_line_err && grep -q "appended" "$T/err" &&
     ! grep -q truncated "$T/err"'
check "10: a directory is a directory, not a non-HDF5 file" \
    'run 2 info "$T" && one_line_err && grep -q "is a directory" "$T/err" &&
     run 2 check "$G" "$T" && grep -q "is a directory" "$T/err" &&
     run 2 gen --config "$T" && one_line_err && grep -q "is a directory" "$T/err"'
printf 'hidden = 8\nexperts = 4\ntop_k = 2\n' >"$T/nolines.case"
check "10: a whole-file case-file error has no line number 0" \
    'run 2 gen --config "$T/nolines.case" -d "$T" && one_line_err && ! grep -q ":0:" "$T/err" &&
     grep -q "nolines.case: missing key .tokens." "$T/err"'
printf 'base = tiny\nname = renamed\n' >"$T/renamed.case"
check "10: a candidate of another case or seed is flagged (provenance WARN)" \
    'run 0 gen --config "$T/renamed.case" -o "$T/renamed.h5" && run 0 check "$G" "$T/renamed.h5" &&
     grep -q "provenance .*WARN.*case is .renamed." "$T/out" &&
     run 1 check "$G" "$T/seed9.h5" && grep -q "provenance .*seed is 9" "$T/out"'

echo "1..$n"
[ "$fails" -eq 0 ]
