#!/bin/sh
# dropless run refuses, with one line naming the variant and exit 2, a
# case the plugin ABI (dropless/backend.h) cannot express: a plugin would
# be judged against a layer it was never told about. Each row of
# DL__ABI_GAP_MAP (src/run/abi.c) has a case here; the variants the ABI
# does express (softmax_topk, a bf16 router weight) still run. Speaks TAP.
NAME=run_abi
. "${top_srcdir:-.}/tests/cli_lib.sh"
V="$top_srcdir/vectors"
P="$top_builddir/tests/backends/.libs/plain.so"
one_line_err() { [ "$(wc -l <"$T/err")" -eq 1 ]; }
refused() { # GOLDEN WORDS: exit 2, one line naming the variant, nothing on stdout
    run 2 run --backend "$P" "$1" && one_line_err && grep -q "backend ABI has no $2" "$T/err" &&
        [ ! -s "$T/out" ]
}
printf 'base = tiny\nname = tiny-ffn-bias\nffn_bias = 1\n' >"$T/fb.case"
"$DL" gen -q -c "$T/fb.case" -d "$T"
"$DL" gen -q -o "$T/fp8.h5" deepseek-v3-fp8-small
check "an FFN kind other than swiglu and plain (gpt-oss's clamped SwiGLU)" \
    'refused "$V/gpt-oss-full.h5" "swiglu-clamp"'
check "relu2 (nemotron-like)" 'refused "$V/nemotron-like-bf16.h5" "relu2"'
check "expert biases on a SwiGLU case" 'refused "$T/tiny-ffn-bias.h5" "expert biases (ffn_bias)"'
check "a router-logit bias (softmax-topk)" 'refused "$V/softmax-topk.h5" "router-logit bias"'
check "gated shared experts (qwen2-moe-like)" 'refused "$V/qwen2-moe-like.h5" "shared experts"'
check "ungated shared experts (deepseek-v3-shared)" 'refused "$V/deepseek-v3-shared-fp16.h5" "shared experts"'
check "a low-precision layer recipe (deepseek-v3-fp8-small)" \
    'refused "$T/fp8.h5" "low-precision layer recipe (lowp)"'
check "zero (identity) experts (longcat-like)" \
    'refused "$V/longcat-like.h5" "zero (identity) experts (zero_experts)"'
# (plain.so computes softmax scores whatever score_fn says: judged, and FAILed,
# on its scores, never refused)
check "softmax over the top-k logits without a router bias is expressed: it runs and is judged" \
    'run 1 run --backend "$P" "$V/softmax-topk-ties.h5" && ! grep -q "ABI has no" "$T/err" &&
     grep -q "^router_logits .*PASS" "$T/out" && grep -q "^router_scores .*FAIL" "$T/out"'
check "a case the ABI expresses runs and conforms" \
    'run 0 run --backend "$P" "$V/tiny.h5" && grep -q "^CONFORMANT" "$T/out"'
echo "1..$n"
[ "$fails" -eq 0 ]
