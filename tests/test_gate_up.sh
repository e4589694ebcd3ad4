#!/bin/sh
# Interleaved gate/up storage in candidate files (doc/format.md,
# "Interleaved gate/up"), both ways, on gpt-oss-full (gate in the even
# columns of one [.., 2f] dataset, as gpt-oss's gate_up_proj): the golden's
# own pairs interleaved are CONFORMANT with every half checked; the halves
# swapped or concatenated FAIL on them; a pair given twice or of a wrong
# shape is set aside (FAIL shape), never guessed. Speaks TAP.
NAME=gate_up
. "${top_srcdir:-.}/tests/cli_lib.sh"
PY=$(py_with "h5py, numpy") || PY=
G="$top_srcdir/vectors/gpt-oss-full.h5"
cand() { "$PY" "$top_srcdir/tests/gate_up/candidate.py" "$G" "$T/$1.h5" "$1"; }
if [ -z "$PY" ]; then
    skip "interleaved candidates" "no Python with h5py and numpy"
else
    check "the pairs interleaved are CONFORMANT, each half checked" \
        'cand interleaved && run 0 check "$G" "$T/interleaved.h5" && grep -q "^CONFORMANT" "$T/out" &&
         for s in h_gate h_up d_h_gate d_h_up d_w_gate d_w_up; do
             grep -q "^$s  *numerics  *PASS" "$T/out" || exit 1; done'
    check "the weight gradients' halves swapped FAIL on both, the rest PASS" \
        'cand swapped && run 1 check "$G" "$T/swapped.h5" &&
         grep -q "^d_w_gate  *numerics  *FAIL" "$T/out" && grep -q "^d_w_up  *numerics  *FAIL" "$T/out" &&
         grep -q "^h_gate  *numerics  *PASS" "$T/out"'
    check "gate and up concatenated under the interleaved name FAIL" \
        'cand concat && run 1 check "$G" "$T/concat.h5" && grep -q "^h_up  *numerics  *FAIL" "$T/out"'
    check "a pair given both ways is set aside, named" \
        'cand twice && run 1 check "$G" "$T/twice.h5" &&
         grep -q "^d_w_gate  *shape  *FAIL.*given twice: as d_w_gate and interleaved as d_w_gate_up" "$T/out" &&
         grep -q "^d_w_up  *shape  *FAIL" "$T/out"'
    check "an interleaved dataset of a wrong shape is set aside, its shape named" \
        'cand odd && run 1 check "$G" "$T/odd.h5" && grep -q "^d_w_up  *shape  *FAIL.*shape" "$T/out" &&
         grep -q "^h_gate  *numerics  *PASS" "$T/out"'
fi
echo "1..$n"
[ "$fails" -eq 0 ]
