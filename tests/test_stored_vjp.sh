#!/bin/sh
# softmax_topk's VJP through its saved output stored in the case's type
# (doc/tolerances.md, "Products stored before the sum"), both ways, on
# gpt-oss-full-bf16: d_router_logits computed as PyTorch computes gpt-oss's
# bf16 router gradient (p rounded to bf16, the result rounded) is CONFORMANT
# under bf16-acc, the -acc allowance of one rounding per stored part, and
# FAILs under the strict bf16 profile; 32 u M more FAILs under bf16-acc. Speaks TAP.
NAME=stored_vjp
. "${top_srcdir:-.}/tests/cli_lib.sh"
PY=$(py_with "h5py, numpy, ml_dtypes") || PY=
c=gpt-oss-full-bf16
"$DL" gen -q -o "$T/$c.h5" "$c"
cand() { "$PY" "$top_srcdir/tests/stored_vjp/candidate.py" "$T/$c.h5" "$T/$c.$1.h5" "$1"; }
check "$c: the golden, its own candidate, has d_router_logits checked (PASS)" \
    'run 0 check "$T/$c.h5" "$T/$c.h5" && grep -q "^d_router_logits .*PASS" "$T/out"'
if [ -n "$PY" ]; then
    check "$c: d_router_logits from the bf16-stored softmax output is CONFORMANT under bf16-acc" \
        'cand torch && run 0 check --profile bf16-acc "$T/$c.h5" "$T/$c.torch.h5" &&
         grep -q "^CONFORMANT" "$T/out" && grep -q "^d_router_logits .*PASS" "$T/out"'
    check "$c: ... but FAILs under the strict bf16 profile (no stored part allowed: the -acc rule is what passes it)" \
        'run 1 check --profile bf16 "$T/$c.h5" "$T/$c.torch.h5" && grep -q "^d_router_logits .*FAIL" "$T/out"'
    check "$c: ... and is CONFORMANT under bf16-elem (an -acc profile too)" \
        'run 0 check --profile bf16-elem "$T/$c.h5" "$T/$c.torch.h5" &&
         grep -q "^d_router_logits .*PASS" "$T/out"'
    check "$c: d_router_logits 32 u M off FAILs under bf16-acc" \
        'cand over && run 1 check --profile bf16-acc "$T/$c.h5" "$T/$c.over.h5" &&
         grep -q "^d_router_logits .*FAIL" "$T/out"'
else
    skip "$c: candidates" "no Python with h5py, numpy and ml_dtypes"
fi
echo "1..$n"
[ "$fails" -eq 0 ]
