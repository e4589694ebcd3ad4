#!/bin/sh
# dropless check and dropless run: every exit code, the verdicts the
# bundled example backends must get, the reports. Speaks TAP.
NAME=cli_check
. "${top_srcdir:-.}/tests/cli_lib.sh"
V="$top_srcdir/vectors"
B="$top_builddir/tests/backends/.libs"
PY=""
for p in /usr/bin/python3; do
    if "$p" -c 'import json, xml.etree.ElementTree' 2>/dev/null; then PY=$p; break; fi
done

# --- dropless check
check "a golden file is a conformant candidate of itself (exit 0)" \
    'run 0 check "$V/mixtral-small.h5" "$V/mixtral-small.h5" && grep -q "^CONFORMANT" "$T/out"'
check "a golden with no tokens (T = 0) is a conformant candidate of itself" \
    'run 0 check "$V/no-tokens.h5" "$V/no-tokens.h5" && grep -q "^CONFORMANT" "$T/out" && grep -q "empty experts" "$T/out"'
check "check --stages limits the stages checked" \
    'run 0 check --stages h_gate,out --all "$V/tiny.h5" "$V/tiny.h5" && grep -q "^h_gate " "$T/out" && grep -q "^d_x .*SKIP" "$T/out"'
check "check: wrong number of arguments is a usage error (exit 2)" 'run 2 check "$V/tiny.h5"'
check "check: an unknown option is a usage error" 'run 2 check --bogus "$V/tiny.h5" "$V/tiny.h5" && one_line_err'
check "check: an unknown profile is a usage error naming the profiles" \
    'run 2 check --profile fp8 "$V/tiny.h5" "$V/tiny.h5" && one_line_err && grep -q tf32 "$T/err"'
check "check --profile per part: an unknown part is a usage error" \
    'run 2 check --profile routr=fp32 "$V/tiny.h5" "$V/tiny.h5" && one_line_err && grep -q "router, experts" "$T/err"'
check "check --profile per part: an unknown profile in an item is a usage error" \
    'run 2 check --profile router=fp8 "$V/tiny.h5" "$V/tiny.h5" && one_line_err'
check "check --profile per part: the golden conforms, the report says per-stage" \
    'run 0 check --profile router=fp32,experts=bf16-acc "$V/tiny.h5" "$V/tiny.h5" && grep -q "profile fp32+per-stage" "$T/out"'
check "check: an unknown stage is a usage error" \
    'run 2 check --stages nonsense "$V/tiny.h5" "$V/tiny.h5" && one_line_err'
check "check: a missing candidate is exit 2 with one line naming it" \
    'run 2 check "$V/tiny.h5" "$T/nope.h5" && one_line_err && grep -q "nope.h5" "$T/err"'
check "check: a non-HDF5 candidate is exit 2 with one line" \
    'echo garbage >"$T/junk.h5" && run 2 check "$V/tiny.h5" "$T/junk.h5" && one_line_err && grep -q junk.h5 "$T/err"'
check "check: a candidate of another case (shapes differ) is exit 2" \
    'run 2 check "$V/tiny.h5" "$V/mixtral-small.h5" && one_line_err'
check "check: a truncated golden is exit 2 with one line" \
    'head -c 3000 "$V/tiny.h5" >"$T/trunc.h5" && run 2 check "$T/trunc.h5" "$V/tiny.h5" && one_line_err'
check "check --help exits 0" 'run 0 check --help && grep -q profile "$T/out"'

# --- dropless run with the bundled backends (the runner's negative controls)
DS="$V/deepseek-v3-small.h5"
EE="$V/empty-experts.h5"
check "plain fp32 backend: conformant" 'run 0 run --backend "$B/plain.so" "$DS" && grep -q "^CONFORMANT" "$T/out"'
check "block-padded backend: conformant" 'run 0 run --backend "$B/padded.so" "$DS"'
check "capacity-factor backend: not conformant, with the exact drop count" \
    'run 1 run --backend "$B/capacity.so" "$EE" && grep -q "28 (token, slot) pairs dropped" "$T/out"'
check "tf32 backend: conformant under its declared tf32 profile" 'run 0 run --backend "$B/tf32.so" "$V/tiny.h5"'
check "tf32 backend: not conformant under the fp32 profile" \
    'run 1 run --profile fp32 --backend "$B/tf32.so" "$V/tiny.h5" && grep -q "FAIL" "$T/out"'
check "backend leaving empty-expert dW unwritten: not conformant" \
    'run 1 run --backend "$B/nodw.so" "$EE" && grep -q "empty_experts  FAIL" "$T/out" && grep -q unwritten "$T/out"'
check "crashing backend: not conformant, the runner survives and names the signal" \
    'run 1 run --backend "$B/crash.so" "$DS" && grep -q "Segmentation fault" "$T/out"'
check "thread-order-dependent combine: a WARN, still conformant" \
    'run 0 run --backend "$B/nondet.so" "$DS" && grep -q "determinism .*WARN" "$T/out"'
check "wrong ABI version: not conformant, reported" \
    'run 1 run --backend "$B/badabi.so" "$V/tiny.h5" && grep -qi "abi" "$T/out"'
check "hanging backend: killed at the time limit" \
    'run 1 run --time-limit 1 --forward-only --backend "$B/hang.so" "$V/tiny.h5" && grep -q timeout "$T/out"'
check "several backends in one run: exit 1 if any fails" \
    'run 1 run --backend "$B/plain.so" --backend "$B/capacity.so" "$EE" && [ "$(grep -c "^dropless check" "$T/out")" -eq 2 ]'
check "run: no backend is a usage error" 'run 2 run "$V/tiny.h5"'
check "run: a missing plugin file is exit 2 with one line" \
    'run 2 run --backend "$T/none.so" "$V/tiny.h5" && one_line_err'
check "run: a bad --time-limit is a usage error" \
    'run 2 run --time-limit -3 --backend "$B/plain.so" "$V/tiny.h5" && one_line_err'

# --- candidate files written by run, checked by check
check "run --out writes a candidate that check accepts" \
    'run 0 run --backend "$B/plain.so" --out "$T/cand.h5" "$DS" && run 0 check "$DS" "$T/cand.h5"'
check "run --out never overwrites without --force" \
    'run 2 run --backend "$B/plain.so" --out "$T/cand.h5" "$DS" && one_line_err && run 0 run --force --backend "$B/plain.so" --out "$T/cand.h5" "$DS"'
check "a capacity backend's candidate fails check with the drops" \
    'run 1 run --backend "$B/capacity.so" --out "$T/cap.h5" "$EE"; run 1 check "$EE" "$T/cap.h5" && grep -q "dropped" "$T/out"'

# --- the one table of arrays (the Python side reads it from the library)
# its rows, counted in the source: DL_VALUE_MAP's X( lines, and the extra
# value's row in a build configured with --enable-extra-value
rows=$(grep -c '^ *X([A-Z]*, [A-Z_]*, [a-z_]*, ' "$top_srcdir/include/dropless/values.h")
if grep -q '^#define DL_EXTRA_VALUE 1' "$top_builddir/include/dropless/features.h" 2>/dev/null; then
    rows=$((rows + 1))
fi
check "info --layout --json lists every array of the format (python/tests checks it equals dropless.layout())" \
    'run 0 info --layout --json && [ "$(grep -c "\"group\": " "$T/out")" -eq "$rows" ] && grep -q "\"name\": \"d_router_weight\", \"path\": \"/backward/d_router_weight\"" "$T/out"'
check "info --layout lists every array of the format, d_router_weight included" \
    'run 0 info --layout && [ "$(grep -c -E "^(inputs|forward|backward) " "$T/out")" -eq "$rows" ] && grep -q "^backward  d_router_weight  f32   dR " "$T/out"'
check "info --layout: an unexpected argument is a usage error" 'run 2 info --layout extra && one_line_err'

# --- nothing checked is not conformance (issue 11, item 7)
H5PY=""
[ -n "$PY" ] && "$PY" -c 'import h5py, numpy' 2>/dev/null && H5PY=$PY
check "check --stages '' is a usage error, never a pass" \
    'run 2 check --stages "" "$V/tiny.h5" "$V/tiny.h5" && one_line_err && grep -q "empty list" "$T/err"'
check "check --stages with only separators is a usage error" \
    'run 2 check --stages " , " "$V/tiny.h5" "$V/tiny.h5" && one_line_err'
check "check --stages: a typo names the nearest stage" \
    'run 2 check --stages h_gates "$V/tiny.h5" "$V/tiny.h5" && one_line_err && grep -q "did you mean h_gate?" "$T/err"'
check "check --require: provided stages conform (exit 0)" \
    'run 0 check --require out,d_x "$V/tiny.h5" "$V/tiny.h5"'
check "check --require: an unknown stage is a usage error" \
    'run 2 check --require d_xx "$V/tiny.h5" "$V/tiny.h5" && one_line_err'
check "check --require: a required stage left out by --stages FAILs (exit 1)" \
    'run 1 check --stages out --require d_x "$V/tiny.h5" "$V/tiny.h5" && grep -q "^d_x  *required  *FAIL" "$T/out"'
check "check: a forward-only golden cannot meet --require d_x (exit 1)" \
    'run 0 run --forward-only --backend "$B/plain.so" --out "$T/fo.h5" "$V/tiny.h5" &&
     run 1 check --require d_x "$V/tiny.h5" "$T/fo.h5" && grep -q "required" "$T/out"'
check "run --require: a forward-only run FAILs a required backward stage" \
    'run 1 run --forward-only --require d_x --backend "$B/plain.so" "$V/tiny.h5" && grep -q "^d_x  *required  *FAIL" "$T/out"'
if [ -n "$H5PY" ]; then
    "$H5PY" - "$V/tiny.h5" "$T" <<'PYEOF'
import sys, h5py
g = h5py.File(sys.argv[1], "r")
d = sys.argv[2]
with h5py.File(d + "/empty.h5", "w") as f:
    f.attrs["backend"] = "empty"
with h5py.File(d + "/typo.h5", "w") as f:
    f.create_dataset("forward/h_gates", data=g["forward/h_gate"][...])
    f.create_dataset("out", data=g["forward/out"][...])
with h5py.File(d + "/extra.h5", "w") as f:
    f.create_dataset("forward/out", data=g["forward/out"][...])
    f.create_dataset("forward/outt", data=g["forward/out"][...])
with h5py.File(d + "/inputs_only.h5", "w") as f:
    f.create_dataset("inputs/x", data=g["inputs/x"][...])
PYEOF
    check "check: an empty candidate is exit 2, nothing to check" \
        'run 2 check "$V/tiny.h5" "$T/empty.h5" && one_line_err && grep -q "nothing to check" "$T/err"'
    check "check: a candidate holding only inputs is exit 2" \
        'run 2 check "$V/tiny.h5" "$T/inputs_only.h5" && one_line_err && grep -q "nothing to check" "$T/err"'
    check "check: misnamed or misplaced datasets are exit 2, each with the nearest known name" \
        'run 2 check "$V/tiny.h5" "$T/typo.h5" && one_line_err &&
         grep -q "/forward/h_gates (did you mean /forward/h_gate?)" "$T/err" && grep -q "/out (did you mean /forward/out?)" "$T/err"'
    check "check: an unknown dataset beside real ones is a NOTE, the rest is judged" \
        'run 0 check "$V/tiny.h5" "$T/extra.h5" && grep -q "NOTE: 1 dataset ignored.*/forward/outt (did you mean /forward/out?)" "$T/out" && grep -q "^CONFORMANT" "$T/out"'
    check "check --json: an unknown dataset NOTE is in the JSON report" \
        'run 0 check --json "$T/extra.json" "$V/tiny.h5" "$T/extra.h5" && grep -q "forward/outt" "$T/extra.json" && grep -q "\"checked\":true" "$T/extra.json"'
    check "check: a stage the case lacks (h_gate of a plain FFN) is named as such" \
        '"$H5PY" -c "import h5py,sys; g=h5py.File(sys.argv[1]); f=h5py.File(sys.argv[2],\"w\"); f[\"forward/h_gate\"]=g[\"forward/y_sorted\"][...]" "$V/plain-ffn.h5" "$T/pl.h5" &&
         run 2 check "$V/plain-ffn.h5" "$T/pl.h5" && grep -q "not a value of this case" "$T/err"'
    # --- candidates need no seal (item 4): an edited copy of a golden is judged
    cp "$V/tiny.h5" "$T/ed_same.h5" && cp "$V/tiny.h5" "$T/ed_bad.h5" &&
    "$H5PY" -c "
import h5py, sys
with h5py.File(sys.argv[1], 'r+') as f: f.attrs['backend'] = 'edited'
with h5py.File(sys.argv[2], 'r+') as f: f['forward/out'][0, 0] = 2 * f['forward/out'][0, 0]
" "$T/ed_same.h5" "$T/ed_bad.h5"
    check "check: an edited copy of a golden (stale seal) is judged, with a NOTE (exit 0)" \
        'run 0 check "$V/tiny.h5" "$T/ed_same.h5" && grep -q "NOTE: the candidate.s seal does not match" "$T/out" && grep -q "^CONFORMANT" "$T/out"'
    check "check: an edited copy with a wrong out is judged NOT CONFORMANT (exit 1)" \
        'run 1 check "$V/tiny.h5" "$T/ed_bad.h5" && grep -q "^out  *numerics  *FAIL" "$T/out"'
    check "check: a golden with a stale seal is still refused (exit 2, damaged)" \
        'run 2 check "$T/ed_same.h5" "$V/tiny.h5" && one_line_err && grep -q "damaged" "$T/err"'
    check "check: an unsealed candidate gets a NOTE, never a refusal" \
        'run 0 check "$V/tiny.h5" "$T/extra.h5" && grep -q "NOTE: the candidate is not sealed" "$T/out"'
else
    for i in 1 2 3 4 5 6 7 8 9 10; do n=$((n + 1)); echo "ok $n # SKIP python3 with h5py not available"; done
fi

# --- reports
if [ -n "$PY" ]; then
    check "--json writes JSON that parses, with the documented top level" \
        'run 1 run --backend "$B/plain.so" --backend "$B/capacity.so" --json "$T/r.json" "$EE" &&
         "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); d=d if isinstance(d,list) else [d]; assert d[0][\"format\"]==\"dropless-check\"; assert d[1][\"verdict\"]==\"FAIL\"" "$T/r.json"'
    check "--junit: suites named by case and backend, no nan figures (item 8)" \
        'run 1 run --backend "$B/capacity.so" --backend "$B/plain.so" --junit "$T/r2.xml" "$EE" &&
         grep -q "testsuite name=\"empty-experts \[capacity" "$T/r2.xml" && grep -q "testsuite name=\"empty-experts \[plain" "$T/r2.xml" &&
         ! grep -qi "nan" "$T/r2.xml"'
    check "--junit writes JUnit XML that parses, failures included" \
        'run 1 run --backend "$B/capacity.so" --junit "$T/r.xml" "$EE" &&
         "$PY" -c "import sys,xml.etree.ElementTree as E; r=E.parse(sys.argv[1]).getroot(); f=next(r.iter(\"failure\")); assert f.get(\"message\"), f.attrib" "$T/r.xml"'
else
    n=$((n + 1)); echo "ok $n # SKIP python3 with json/xml not available"
    n=$((n + 1)); echo "ok $n # SKIP python3 with json/xml not available"
fi
if command -v script >/dev/null 2>&1; then
    # a terminal gets a progress bar naming the stage; -q and a pipe get none
    check "check on a terminal: a progress bar with the stage, an ETA, elements and their rate; with -q or piped none" \
        'export DROPLESS_PROGRESS_AFTER_S=0 &&
         script -qec "\"$DL\" check \"$V/tiny.h5\" \"$V/tiny.h5\"" /dev/null >"$T/tty" 2>&1 &&
         grep -q "ETA" "$T/tty" && grep -q "tiny: d_x" "$T/tty" && grep -q " PASS, 0 WARN, 0 FAIL" "$T/tty" &&
         grep -Eq "[0-9.]+k?/[0-9.]+k? elements, [0-9.]+[kMG]?/s" "$T/tty" &&
         script -qec "\"$DL\" check -q \"$V/tiny.h5\" \"$V/tiny.h5\"" /dev/null >"$T/tty" 2>&1 &&
         ! grep -q "ETA" "$T/tty" &&
         "$DL" check "$V/tiny.h5" "$V/tiny.h5" >"$T/out" 2>"$T/err" && ! grep -q "ETA" "$T/err"'
fi
echo "1..$n"
[ "$fails" -eq 0 ]
