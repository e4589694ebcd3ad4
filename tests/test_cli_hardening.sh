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


# ---------------------------------------------------------------- issue 29
# Regressions of the second audit, one group per numbered item. Files are
# told apart by identity (doc/cli.md, "Output files"); test_cli_matrix.sh
# runs every command x output option x alias.
no_new() { [ "$(ls -A "$1" | sort | tr '\n' ' ')" = "$2" ] || { ls -la "$1"; return 1; }; }
printf 'base = tiny\n' >"$T/c29.case"

# 1. --force never replaces an input of the command
check "29.1: capacity G.h5 --json G.h5 --force: exit 2, the golden kept" \
    'cp "$G" "$T/g1.h5" && run 2 capacity "$T/g1.h5" --json "$T/g1.h5" --force && one_line_err &&
     grep -q "is an input" "$T/err" && cmp -s "$G" "$T/g1.h5"'
check "29.1: capacity CASEFILE --json CASEFILE --force: exit 2, the case file kept" \
    'cp "$T/c29.case" "$T/c1.case" && run 2 capacity "$T/c1.case" --json "$T/c1.case" --force &&
     one_line_err && cmp -s "$T/c29.case" "$T/c1.case"'
for opt in --out --json --junit; do
    check "29.1: run --backend ./pl.so $opt pl.so --force: exit 2, the plugin kept" \
        'mkdir -p "$T/p1" && cp "$B/plain.so" "$T/p1/pl.so" && G_ABS=$(cd "$(dirname "$G")" && pwd)/tiny.h5 &&
         DL_ABS=$(cd "$(dirname "$DL")" && pwd)/dropless &&
         (cd "$T/p1" && "$DL_ABS" run --backend ./pl.so "$G_ABS" '"$opt"' pl.so --force) >"$T/out" 2>"$T/err";
         [ $? -eq 2 ] && one_line_err && grep -q "is an input" "$T/err" && cmp -s "$B/plain.so" "$T/p1/pl.so"'
done
check "29.1: gen --config c.case -o c.case --force: exit 2, the case file kept" \
    'cp "$T/c29.case" "$T/c2.case" && run 2 gen --config "$T/c2.case" -o "$T/c2.case" --force && one_line_err &&
     cmp -s "$T/c29.case" "$T/c2.case"'
check "29.1: check --json onto a hard link of the golden, --force: exit 2, kept" \
    'cp "$G" "$T/g3.h5" && ln "$T/g3.h5" "$T/g3link.h5" && run 2 check "$T/g3.h5" "$G" --json "$T/g3link.h5" --force &&
     one_line_err && cmp -s "$G" "$T/g3.h5"'

# 2. an unsealed (so possibly doctored) golden is flagged; it can be refused
cp "$G" "$T/unsealed29.h5" && dd if=/dev/zero of="$T/unsealed29.h5" bs=512 count=1 conv=notrunc 2>/dev/null
check "29.2: check against an unsealed golden: a WARNING under the header, a golden_seal WARN line" \
    'run 0 check "$T/unsealed29.h5" "$G" && sed -n 2p "$T/out" | grep -q "^WARNING: the golden file is NOT sealed" &&
     grep -q "golden_seal  *WARN" "$T/out"'
check "29.2: the JSON report has the golden_seal WARN; a sealed golden's has none" \
    'run 0 check "$T/unsealed29.h5" "$G" --json - && grep -q "\"check\":\"golden_seal\",\"verdict\":\"WARN\"" "$T/out" &&
     run 0 check "$G" "$G" --json - && ! grep -q "golden_seal" "$T/out"'
check "29.2: --require-sealed-golden: an unsealed golden is exit 2 (check and run), a sealed one passes" \
    'run 2 check "$T/unsealed29.h5" "$G" --require-sealed-golden && one_line_err && grep -q "not sealed" "$T/err" &&
     run 2 run --backend "$B/plain.so" "$T/unsealed29.h5" --require-sealed-golden && one_line_err &&
     run 0 check "$G" "$G" --require-sealed-golden'
PY=/root/.cache/dropless/adapters-venv/bin/python
if [ -x "$PY" ] && "$PY" -c "import h5py" 2>/dev/null; then
    check "29.2: a golden doctored with h5py (+0.25 on out[0,0]): the true candidate's FAIL comes with the seal WARNING" \
        '"$PY" -c "import h5py,sys; s=h5py.File(sys.argv[1],\"r\"); d=h5py.File(sys.argv[2],\"w\")
for k,v in s.attrs.items(): d.attrs[k]=v
for k in s: s.copy(k, d)
d[\"forward/out\"][0,0] += 0.25" "$G" "$T/doctored.h5" && run 1 check "$T/doctored.h5" "$G" &&
         sed -n 2p "$T/out" | grep -q "^WARNING: the golden file is NOT sealed" &&
         run 2 check "$T/doctored.h5" "$G" --require-sealed-golden'
else
    skip "29.2: doctored golden" "no h5py in $PY"
fi

# 3. capacity parses an unsealed golden in the preflight child too
check "29.3: capacity with a golden that hangs HDF5: exit 2 after the time limit, one line" \
    'DROPLESS_PREFLIGHT_SECONDS=2 $to "$DL" capacity "$HG" >"$T/out" 2>"$T/err"; [ $? -eq 2 ] &&
     one_line_err && grep -q "hung" "$T/err"'

# 4. every case and option is checked before the first write
check "29.4: gen mixtral-small tiny --ep-ranks 8: exit 2, nothing written" \
    'mkdir "$T/d4a" && run 2 gen mixtral-small tiny --ep-ranks 8 -d "$T/d4a" && one_line_err && no_new "$T/d4a" ""'
check "29.4: gen --all --ep-ranks 2: exit 2, nothing written" \
    'mkdir "$T/d4b" && run 2 gen --all --ep-ranks 2 -d "$T/d4b" && one_line_err && no_new "$T/d4b" ""'
check "29.4: gen tiny mixtral-small where the second exists: exit 2, the first not written" \
    'mkdir "$T/d4c" && echo keep >"$T/d4c/mixtral-small.h5" && run 2 gen tiny mixtral-small -d "$T/d4c" &&
     one_line_err && no_new "$T/d4c" "mixtral-small.h5 "'
check "29.4: gen tiny --experts 2:8 (beyond E = 4) with mixtral-small: exit 2, nothing written" \
    'mkdir "$T/d4d" && run 2 gen mixtral-small tiny --experts 2:8 -d "$T/d4d" && one_line_err && no_new "$T/d4d" ""'
if [ -x "$top_builddir/.libs/dropless" ] && grep -q "define DL_HAVE_MPI 1" "$top_builddir/config.h" 2>/dev/null &&
   command -v mpirun >/dev/null 2>&1; then
    check "29.4: mpirun -np 4 gen tiny odd-shapes: exit 2, nothing written" \
        'mkdir "$T/d4e" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
         ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
         mpirun --oversubscribe -np 4 "$DL" gen tiny odd-shapes -d "$T/d4e" >"$T/out" 2>"$T/err"; [ $? -eq 2 ] &&
         grep -q "odd-shapes" "$T/err" && no_new "$T/d4e" ""'
else
    skip "29.4: mpirun gen" "no MPI build or no mpirun"
fi

# 5. outputs compared by identity, reserved atomically
G_ABS5=$(cd "$(dirname "$G")" && pwd)/tiny.h5
DL_ABS5=$(cd "$(dirname "$DL")" && pwd)/dropless
check "29.5: check --json r.json --junit ./r.json: exit 2 up front, nothing written" \
    'mkdir "$T/d5" && (cd "$T/d5" && "$DL_ABS5" check "$G_ABS5" "$G_ABS5" --json r.json --junit ./r.json) >"$T/out" 2>"$T/err";
     [ $? -eq 2 ] && one_line_err && [ ! -s "$T/out" ] && no_new "$T/d5" ""'
check "29.5: capacity --plot q.svg --json q.svg (and --force): exit 2, nothing written" \
    'mkdir "$T/d5b" && run 2 capacity tiny --plot "$T/d5b/q.svg" --json "$T/d5b/q.svg" && one_line_err &&
     run 2 capacity tiny --plot "$T/d5b/q.svg" --json "$T/d5b/x/../q.svg" --force && no_new "$T/d5b" ""'
check "29.5: a report path held by a running command: the second is exit 2 at once, the first writes it" \
    'mkdir "$T/d5c" && "$DL" run --backend "$B/hang.so" --time-limit 3 --forward-only --json "$T/d5c/same.json" "$G" \
         >/dev/null 2>&1 & pid=$!; sleep 1;
     run 2 check "$G" "$G" --json "$T/d5c/same.json" && one_line_err && grep -q exists "$T/err"; ok=$?;
     wait $pid; st=$?; [ $ok -eq 0 ] && [ $st -eq 1 ] && grep -q "dropless-check" "$T/d5c/same.json" &&
     no_new "$T/d5c" "same.json "'

# 6. case files
check "29.6: a NUL byte in a case file: exit 2 naming the line" \
    'printf "base = tiny\n\0tokens = 5\n" >"$T/nul.case" && run 2 gen --config "$T/nul.case" -d "$T" &&
     one_line_err && grep -q "nul.case:2: .*NUL" "$T/err" && [ ! -e "$T/tiny.h5" ]'
check "29.6: scaling = 1e39: exit 2 naming scaling, nothing written" \
    'printf "base = tiny\nscaling = 1e39\n" >"$T/sc.case" && run 2 gen --config "$T/sc.case" -d "$T" &&
     one_line_err && grep -q "sc.case:2: scaling" "$T/err" && [ ! -e "$T/tiny.h5" ]'

# 7. small ones
closed_pipe() { /usr/bin/python3 -c 'import os, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as a shell pipeline leaves it
r, w = os.pipe(); os.close(r); os.dup2(w, 1); os.execv(sys.argv[1], sys.argv[1:])' "$@"; }
check "29.7: dropless cases into a closed pipe: exit 1, one line (not SIGPIPE)" \
    'closed_pipe "$DL" cases 2>"$T/err"; [ $? -eq 1 ] && one_line_err && grep -q "standard output" "$T/err"'
if [ -w /dev/full ]; then
    check "29.7: info --layout >/dev/full: exit 1, one line" \
        '"$DL" info --layout >/dev/full 2>"$T/err"; [ $? -eq 1 ] && one_line_err'
else
    skip "29.7: info --layout >/dev/full" "/dev/full not writable"
fi
check "29.7: a wrong argument count is one line naming --help (check, run, no command)" \
    'run 2 check "$G" && one_line_err && grep -q -- "--help" "$T/err" &&
     run 2 run --backend "$B/plain.so" && one_line_err && grep -q -- "--help" "$T/err" &&
     run 2 && one_line_err && grep -q "help" "$T/err"'
check "29.7: version --bogus: exit 2" 'run 2 version --bogus && one_line_err'
check "29.7: gen -d NONEXISTENT: exit 2, as check's report paths" \
    'run 2 gen tiny -d "$T/nonexist" && one_line_err'
"$DL" gen -q tiny --experts 0:2 -d "$T"
check "29.7: info and check on an expert slice name it a slice" \
    'run 2 info "$T/tiny.experts-0-2.h5" && one_line_err && grep -q "expert slice" "$T/err" &&
     run 2 check "$G" "$T/tiny.experts-0-2.h5" && one_line_err && grep -q "expert slice" "$T/err"'
long=$(printf "%0245d" 0 | tr 0 a)
check "29.7: a legal 245-character -o name is written" \
    'mkdir "$T/d7" && run 0 gen -q tiny -o "$T/d7/$long" && [ -s "$T/d7/$long" ] && no_new "$T/d7" "$long "'
check "29.7: --stages tie_margin says it is no judged stage, not 'did you mean tie_margin?'" \
    'run 2 check "$G" "$G" --stages tie_margin && one_line_err && ! grep -q "did you mean" "$T/err" &&
     grep -q "not a stage" "$T/err"'

echo "1..$n"
[ "$fails" -eq 0 ]
