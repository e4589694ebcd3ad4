#!/bin/sh
# The dropless command's gen, cases, info, version and help: exit codes,
# one-line errors, no clobbering, no partial files. Speaks TAP.
NAME=cli_gen
. "${top_srcdir:-.}/tests/cli_lib.sh"

check "version prints the version" 'run 0 version && grep -q "^dropless [0-9]" "$T/out"'
check "version --verbose names HDF5 and the format" \
    'run 0 version --verbose && grep -q "^HDF5 " "$T/out" && grep -q "dropless-golden 1" "$T/out"'
check "help lists gen, cases, info" \
    'run 0 help && grep -q "^  gen " "$T/out" && grep -q "^  cases " "$T/out" && grep -q "^  info " "$T/out"'
check "no command: usage, exit 2" 'run 2'
check "unknown command: exit 2, one line" 'run 2 frobnicate && one_line_err'
check "help gen shows the options" 'run 0 help gen && grep -q -- "--force" "$T/out"'
check "help of an unknown command: exit 2" 'run 2 help frobnicate'
check "cases: one line per case, layer cases on demand" \
    'run 0 cases && [ "$(wc -l <"$T/out")" -ge 39 ] && grep -q "^mixtral-layer .*on demand" "$T/out" &&
     grep -q "^deepseek-v3-layer .*E=256 .*k=8 .*g8/4:top2_sum" "$T/out" &&
     "$DL" cases --names | grep -qx "ties-bf16"'
check "cases --names matches cases" \
    'run 0 cases --names && [ "$(wc -l <"$T/out")" -eq "$("$DL" cases | wc -l)" ]'
check "cases with a bad argument: exit 2" 'run 2 cases --bogus'

check "gen tiny writes DIR/tiny.h5, quiet stderr" \
    'run 0 gen tiny -d "$T" && [ -s "$T/tiny.h5" ] && grep -q "^wrote $T/tiny.h5" "$T/out" && [ ! -s "$T/err" ]'
check "gen refuses to overwrite: exit 2, one line, file kept" \
    'cp "$T/tiny.h5" "$T/keep.h5" && run 2 gen tiny -d "$T" --seed 9 && one_line_err &&
     grep -q -- "--force" "$T/err" && cmp -s "$T/tiny.h5" "$T/keep.h5"'
check "gen --force overwrites" \
    'run 0 gen tiny -d "$T" --seed 9 --force && ! cmp -s "$T/tiny.h5" "$T/keep.h5"'
check "gen is byte-reproducible" \
    'run 0 gen tiny -o "$T/a.h5" && run 0 gen tiny -o "$T/b.h5" && cmp "$T/a.h5" "$T/b.h5"'
check "gen is thread-count invariant" \
    'OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$DL" gen zipf -q -o "$T/z1.h5" &&
     OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=3 "$DL" gen zipf -q -o "$T/z3.h5" && cmp "$T/z1.h5" "$T/z3.h5"'
check "gen unknown case: exit 2, one line" 'run 2 gen no-such-case -d "$T" && one_line_err'
check "gen without a case: exit 2" 'run 2 gen -d "$T"'
check "gen with an unknown option: exit 2, one line" 'run 2 gen --bogus tiny && one_line_err'
check "gen --dtype fp8: exit 2" 'run 2 gen tiny --dtype fp8 -d "$T"'
check "gen --seed -1: exit 2" 'run 2 gen tiny --seed -1 -d "$T"'
check "gen --dtype bf16 renames the case" \
    'run 0 gen tiny --dtype bf16 -d "$T" && [ -s "$T/tiny-bf16.h5" ] &&
     "$DL" info "$T/tiny-bf16.h5" | grep -q "dtype = bf16"'
check "gen -o with two cases: exit 2" 'run 2 gen tiny ties -o "$T/x.h5" && [ ! -e "$T/x.h5" ]'
# a directory that is not there is a bad argument, refused before any work
# (exit 2, as check's report paths; issue 29)
check "gen into a missing directory: exit 2, nothing left" \
    'mkdir "$T/d" && run 2 gen tiny -d "$T/d/missing" && one_line_err && [ -z "$(ls -A "$T/d")" ]'
check "gen where the directory is a file: exit 2" \
    ': >"$T/afile" && run 2 gen tiny -d "$T/afile" && one_line_err'
check "gen --no-backward: /backward absent" \
    'run 0 gen tiny --no-backward -o "$T/nb.h5" && "$DL" info "$T/nb.h5" | grep -q "^  /backward: absent"'
check "gen no-tokens: zero-row datasets" \
    'run 0 gen no-tokens -d "$T" && "$DL" info "$T/no-tokens.h5" | grep -q "^    x  *float32  *\[0,8\]"'
check "gen --all writes every small case" \
    'mkdir "$T/all" && run 0 gen --all -q -d "$T/all" && [ ! -s "$T/out" ] &&
     [ "$(ls "$T/all" | wc -l)" -eq "$("$DL" cases | grep -vc "on demand")" ]'

cat >"$T/good.case" <<'EOF'
# a custom case
base = deepseek-v3-small
tokens = 5
dtype = fp16
seed = 77
name = my-deepseek
EOF
check "gen --config: a case file" \
    'run 0 gen --config "$T/good.case" -d "$T" && "$DL" info "$T/my-deepseek.h5" >"$T/info" &&
     grep -q "tokens = 5" "$T/info" && grep -q "dtype = fp16" "$T/info" && grep -q "seed 77" "$T/info"'
printf 'tokens = 4\nhidden = 8\nexperts 4\n' >"$T/bad.case"
check "gen --config malformed: exit 2, one line naming file:line" \
    'run 2 gen --config "$T/bad.case" -d "$T" && one_line_err && grep -q "bad.case:3: " "$T/err"'
printf 'tokens = 4\nhidden = 8\nexperts = 4\ntop_k = 6\n' >"$T/inv.case"
check "gen --config invalid: exit 2, names the line" \
    'run 2 gen --config "$T/inv.case" -d "$T" && one_line_err && grep -q "inv.case:4: invalid" "$T/err"'
check "gen --config missing file: exit 2" 'run 2 gen --config "$T/none.case" && one_line_err'

check "info lists config and datasets" \
    'run 0 info "$T/a.h5" && grep -q "case: tiny (seed 1)" "$T/out" &&
     grep -q "seal: SHA-256 verified" "$T/out" &&
     grep -q "^    out  *float32  *\[4,4\]  *fp32 values" "$T/out" &&
     grep -q "^    topk_ids  *int32  *\[4,2\]" "$T/out" && grep -q "^    d_w_gate  *float32  *\[4,4,4\]" "$T/out"'
check "info on a non-HDF5 file: exit 2, one line" \
    'echo hello >"$T/text.h5" && run 2 info "$T/text.h5" && one_line_err && grep -q "text.h5" "$T/err"'
check "info on a missing file: exit 2, one line" 'run 2 info "$T/none.h5" && one_line_err'
check "info on a truncated file: exit 2, one line" \
    'head -c 9000 "$T/a.h5" >"$T/trunc.h5" && run 2 info "$T/trunc.h5" && one_line_err && grep -q damaged "$T/err"'
check "info without a file: exit 2" 'run 2 info'
check "the seal is the SHA-256 of the bytes after 512" \
    'want=$(head -c 512 "$T/a.h5" | tr "\0" "\n" | sed -n "s/^sha256 //p") &&
     got=$(tail -c +513 "$T/a.h5" | sha256sum | cut -d" " -f1) && [ -n "$want" ] && [ "$want" = "$got" ]'

# --stream, --experts, --tier, the memory estimate, the progress bar
check "gen --stream: the same bytes as in memory" \
    'run 0 gen mixtral-small -q -o "$T/m.h5" && run 0 gen mixtral-small --stream -q -o "$T/ms.h5" &&
     cmp "$T/m.h5" "$T/ms.h5"'
check "gen --experts 2:5 writes CASE.experts-2-5.h5 with the range" \
    'run 0 gen mixtral-small --experts 2:5 -d "$T" && [ -s "$T/mixtral-small.experts-2-5.h5" ] &&
     grep -q "^wrote $T/mixtral-small.experts-2-5.h5" "$T/out"'
for bad in 3 3:3 5:2 a:b -1:2 2: :4; do
    check "gen --experts $bad: exit 2, one line" \
        "run 2 gen mixtral-small --experts $bad -d \"\$T/x\" && one_line_err && grep -q -- --experts \"\$T/err\""
done
check "gen --experts beyond E: exit 2, one line, nothing written" \
    'mkdir "$T/ex" && run 2 gen mixtral-small --experts 6:9 -d "$T/ex" && one_line_err &&
     grep -q "expert range" "$T/err" && [ -z "$(ls -A "$T/ex")" ]'
check "gen --tier kernel is accepted by cases, bogus tiers are not" \
    'run 0 cases --tier kernel && [ "$(wc -l <"$T/out")" -ge 8 ] && run 2 gen --tier bogus -d "$T" && one_line_err'
cat >"$T/huge.case" <<'EOF'
base = tiny
name = huge
tokens = 1000000000
EOF
check "gen refuses a case that needs more memory than there is: exit 2, one line, nothing written" \
    'mkdir "$T/huge" && run 2 gen --config "$T/huge.case" -d "$T/huge" && one_line_err &&
     grep -q "needs about .* available; refusing (--ignore-memory" "$T/err" && [ -z "$(ls -A "$T/huge")" ]'
if sanitized; then # ASan reserves terabytes of address space: no ulimit -v under it
    skip "gen refuses mixtral-layer under a 2 GiB address-space limit" "AddressSanitizer build"
else
    check "gen refuses mixtral-layer under a 2 GiB address-space limit, even streamed" \
    '(ulimit -v 2097152 && "$DL" gen mixtral-layer -d "$T/huge" >"$T/out" 2>"$T/err"; echo $? >"$T/rc") ;
     [ "$(cat "$T/rc")" -eq 2 ] && one_line_err && grep -q "even streamed" "$T/err" && [ -z "$(ls -A "$T/huge")" ]'
fi
check "gen --ignore-memory is accepted" 'run 0 gen tiny --ignore-memory -q -o "$T/im.h5" && cmp "$T/im.h5" "$T/a.h5"'
if command -v script >/dev/null 2>&1; then
    check "gen on a terminal: a progress bar with an ETA; with -q none" \
        'export DROPLESS_PROGRESS_AFTER_S=0 &&
         script -qec "\"$DL\" gen kernel-sizes-bf16 -o \"$T/k.h5\"" /dev/null >"$T/tty" 2>&1 &&
         grep -q "ETA" "$T/tty" && rm -f "$T/k.h5" &&
         script -qec "\"$DL\" gen -q kernel-sizes-bf16 -o \"$T/k.h5\"" /dev/null >"$T/tty" 2>&1 &&
         ! grep -q "ETA" "$T/tty" && rm -f "$T/k.h5"'
fi

echo "1..$n"
[ "$fails" -eq 0 ]
