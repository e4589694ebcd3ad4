#!/bin/sh
# The runner on shared experts (doc/tolerances.md, "Shared experts"), both
# ways: the golden as its own candidate and a fused out/d_x-only candidate
# (exact, and rounded as PyTorch's eager blocks round) are CONFORMANT; a
# kernel that forgets the shared expert, adds it without its gate, computes
# the gate wrongly or drops a routed slot is NOT CONFORMANT, named where it
# goes wrong; the zero-drop proof from out alone subtracts the shared term.
# Speaks TAP.
NAME=shared_check
. "${top_srcdir:-.}/tests/cli_lib.sh"
PY=$(py_with "h5py, numpy") || PY=
cand() { "$PY" "$top_srcdir/tests/shared/candidate.py" "$T/$1.h5" "$T/$1.$2.h5" "$2"; }
for c in qwen2-moe-like deepseek-v3-shared nemotron-shared; do
    "$DL" gen -q -o "$T/$c.h5" "$c"
    check "$c: the golden, its own candidate, has every shared value checked (PASS)" \
        'run 0 check "$T/$c.h5" "$T/$c.h5" && grep -q "^CONFORMANT" "$T/out" &&
         grep -q "^shared_y .*PASS" "$T/out" && grep -q "^d_shared_w_down .*PASS" "$T/out"'
    if [ -z "$PY" ]; then
        skip "$c: candidates" "no Python with h5py and numpy"
        continue
    fi
    check "$c: a full copy is CONFORMANT" \
        'cand $c full && run 0 check "$T/$c.h5" "$T/$c.full.h5" && grep -q "^CONFORMANT" "$T/out"'
    check "$c: a fused out/d_x-only candidate is CONFORMANT, zero drops proven from out" \
        'cand $c fused && run 0 check --require out,d_x "$T/$c.h5" "$T/$c.fused.h5" &&
         grep -q "^out .*PASS" "$T/out" && grep -q "^case  *zero_drops  *PASS" "$T/out"'
    check "$c: out rounded as PyTorch rounds it (two fp32 roundings) is CONFORMANT" \
        'cand $c fused-torch && run 0 check "$T/$c.h5" "$T/$c.fused-torch.h5" &&
         grep -q "^CONFORMANT" "$T/out"'
    check "$c: a kernel without the shared expert FAILs on out, and no slot is called dropped" \
        'cand $c no-shared && run 1 check "$T/$c.h5" "$T/$c.no-shared.h5" &&
         grep -q "^out .*FAIL" "$T/out" && ! grep -q "pairs dropped" "$T/out"'
    check "$c: d_x without the shared path's gradient FAILs on d_x" \
        'cand $c dx-no-shared && run 1 check "$T/$c.h5" "$T/$c.dx-no-shared.h5" &&
         grep -q "^d_x .*FAIL" "$T/out" && grep -q "^out .*PASS" "$T/out"'
    check "$c: a slot dropped from out is named by the zero-drop check" \
        'cand $c drop-slot && run 1 check "$T/$c.h5" "$T/$c.drop-slot.h5" &&
         grep -q "^case  *zero_drops  *FAIL.*(3,0)" "$T/out"'
done
if [ -n "$PY" ]; then
    c=qwen2-moe-like
    check "$c: the shared term without its gate FAILs on out" \
        'cand $c ungated && run 1 check "$T/$c.h5" "$T/$c.ungated.h5" && grep -q "^out .*FAIL" "$T/out"'
    check "$c: a wrong gate stage FAILs on shared_gate" \
        'cand $c gate-sign && run 1 check "$T/$c.h5" "$T/$c.gate-sign.h5" &&
         grep -q "^shared_gate .*FAIL" "$T/out"'
fi
# the bf16 twins: PyTorch's roundings in bf16 stay within the bounds; the
# missing shared expert does not
if [ -n "$PY" ] && "$PY" -c 'import ml_dtypes' 2>/dev/null; then
    for c in qwen2-moe-like-bf16 deepseek-v3-shared-bf16; do
        "$DL" gen -q -o "$T/$c.h5" "$c"
        check "$c: out rounded as PyTorch rounds it in bf16 is CONFORMANT" \
            'cand $c fused-torch && run 0 check "$T/$c.h5" "$T/$c.fused-torch.h5" &&
             grep -q "^CONFORMANT" "$T/out"'
        check "$c: a kernel without the shared expert FAILs on out" \
            'cand $c no-shared && run 1 check "$T/$c.h5" "$T/$c.no-shared.h5" && grep -q "^out .*FAIL" "$T/out"'
    done
    # the gate's gradient as autograd computes it (products stored in bf16,
    # then summed): within bf16-acc's one rounding per product; under the
    # strict bf16 profile outside the bound on its own stored upstream (the
    # dot cancels), so only the second level's WARN; 32 u M more fails
    c=qwen2-moe-like-bf16
    check "$c: d_shared_gate from bf16-rounded products is CONFORMANT under bf16-acc" \
        'cand $c gate-grad-torch && run 0 check --profile bf16-acc "$T/$c.h5" "$T/$c.gate-grad-torch.h5" &&
         grep -q "^d_shared_gate .*PASS" "$T/out"'
    check "$c: ... and only a WARN under the strict bf16 profile (an -acc allowance)" \
        'run 0 check --profile bf16 "$T/$c.h5" "$T/$c.gate-grad-torch.h5" &&
         grep -q "^d_shared_gate .*WARN.*not with its own stored upstream" "$T/out"'
    check "$c: d_topk_weights from bf16-rounded products is CONFORMANT under bf16-acc" \
        'cand $c topk-grad-torch && run 0 check --profile bf16-acc "$T/$c.h5" "$T/$c.topk-grad-torch.h5" &&
         grep -q "^d_topk_weights .*PASS" "$T/out"'
    check "$c: d_topk_weights 32 u M off FAILs under bf16-acc" \
        'cand $c topk-grad-over && run 1 check --profile bf16-acc "$T/$c.h5" "$T/$c.topk-grad-over.h5" &&
         grep -q "^d_topk_weights .*FAIL" "$T/out"'
    # d_shared_y = d_out * the gate autograd saved in bf16 (two roundings:
    # the gate's and the product's): within bf16-acc's stored operand (the
    # client's 0.992 x PASS under bf16 becomes 0.663); 32 u M more fails
    check "$c: d_shared_y from the bf16-stored gate is CONFORMANT under bf16-acc" \
        'cand $c shared-y-torch && run 0 check --profile bf16-acc "$T/$c.h5" "$T/$c.shared-y-torch.h5" &&
         grep -q "^CONFORMANT" "$T/out" && grep -q "^d_shared_y .*PASS" "$T/out"'
    check "$c: d_shared_y 32 u M off FAILs under bf16-acc" \
        'cand $c shared-y-over && run 1 check --profile bf16-acc "$T/$c.h5" "$T/$c.shared-y-over.h5" &&
         grep -q "^d_shared_y .*FAIL" "$T/out"'
    check "$c: d_shared_gate 32 u M off FAILs under bf16-acc" \
        'cand $c gate-grad-over && run 1 check --profile bf16-acc "$T/$c.h5" "$T/$c.gate-grad-over.h5" &&
         grep -q "^d_shared_gate .*FAIL" "$T/out"'
else
    skip "bf16 candidates" "no Python with h5py, numpy and ml_dtypes"
fi
check "a case without shared experts has no shared value in its golden" \
    'run 0 info "$top_srcdir/vectors/tiny.h5" && grep -q "^ *d_x " "$T/out" &&
     ! grep -qE "^ +(d_)?shared_|^ +shared_" "$T/out"'
echo "1..$n"
[ "$fails" -eq 0 ]
