#!/bin/sh
# The routing variants of issue 26 through the command (doc/format.md,
# doc/tolerances.md): case files with sqrtsoftplus, softmax_topk and a
# router-logit bias parse and generate; a bad value is one line, exit 2,
# nothing written; the streaming generator writes the same bytes as the
# whole layer, expert slices are written; the golden is its own CONFORMANT
# candidate with the new values checked, and a candidate with a stage of
# the variant computed wrongly is NOT CONFORMANT at that stage; the new
# datasets exist only in the goldens of cases that use the variant.
# (mpirun byte-identity: tests/test_ep_mpi.sh.) Speaks TAP.
NAME=route_variants
. "${top_srcdir:-.}/tests/cli_lib.sh"
V="$top_srcdir/vectors"

cat >"$T/gptoss.case" <<'EOF'
name = gptoss-mini
tokens = 12
hidden = 8
ffn = 4
experts = 8
top_k = 2
score_function = softmax_topk
renormalize = 0
router_bias = 1
seed = 7
EOF
check "a case file with softmax_topk and router_bias = 1 generates a golden with router_bias and d_router_bias" \
    'run 0 gen --config "$T/gptoss.case" -q -o "$T/g.h5" && run 0 info "$T/g.h5" &&
     grep -q "^ *router_bias  *float32  *\[8\]" "$T/out" && grep -q "^ *d_router_bias  *float32  *\[8\]" "$T/out" &&
     grep -q "router_bias = 1" "$T/out"'
check "... and it is its own CONFORMANT candidate, d_router_bias checked" \
    'run 0 check "$T/g.h5" "$T/g.h5" && grep -q "^CONFORMANT" "$T/out" &&
     grep -q "^d_router_bias .*PASS" "$T/out"'
sed 's/softmax_topk/sqrtsoftplus/; s/router_bias = 1/has_bias = 1/' "$T/gptoss.case" >"$T/v4.case"
check "a case file with sqrtsoftplus generates and checks CONFORMANT" \
    'run 0 gen --config "$T/v4.case" -q -o "$T/v4.h5" && run 0 check "$T/v4.h5" "$T/v4.h5" &&
     grep -q "^CONFORMANT" "$T/out"'
sed 's/router_bias = 1/router_bias = maybe/' "$T/gptoss.case" >"$T/bad.case"
check "router_bias = maybe: one line naming the key, exit 2, nothing written" \
    'run 2 gen --config "$T/bad.case" -q -o "$T/bad.h5" && one_line_err && grep -q "router_bias" "$T/err" &&
     [ ! -e "$T/bad.h5" ]'
sed 's/softmax_topk/softmax_bottomk/' "$T/gptoss.case" >"$T/bad2.case"
check "an unknown score function is one line listing the four, exit 2" \
    'run 2 gen --config "$T/bad2.case" -q -o "$T/bad2.h5" && one_line_err && grep -q "sqrtsoftplus" "$T/err" &&
     grep -q "softmax_topk" "$T/err" && [ ! -e "$T/bad2.h5" ]'

for c in softmax-topk deepseek-v4-like-bf16 softmax-topk-ties-fp16; do
    check "$c: gen --stream writes the committed bytes" \
        'run 0 gen $c --stream -q -o "$T/$c.s.h5" && cmp "$T/$c.s.h5" "$V/$c.h5"'
done
check "softmax-topk: gen --experts 0:8 and 8:16 write their slices" \
    'run 0 gen softmax-topk --experts 0:8 -d "$T" && run 0 gen softmax-topk --experts 8:16 -d "$T" &&
     [ -s "$T/softmax-topk.experts-0-8.h5" ] && [ -s "$T/softmax-topk.experts-8-16.h5" ]'

# a stage of the variant computed wrongly (dropless mutate: sign flips of
# one element, replayed downstream) is NOT CONFORMANT at that stage
m="$T/mut"
check "softmax-topk: a wrong router_logits, topk_weights, d_router_logits or d_router_bias FAILs there" \
    'run 0 mutate "$V/softmax-topk.h5" -o "$m" --mutations sign \
        --stages router_logits,topk_weights,d_router_scores,d_router_logits,d_router_bias --modes staged &&
     for s in router_logits topk_weights d_router_scores d_router_logits d_router_bias; do
         run 1 check "$V/softmax-topk.h5" "$m/sign.$s.staged.h5" &&
         grep -q "^NOT CONFORMANT" "$T/out" && grep -q "^$s .*FAIL" "$T/out" || exit 1
     done'
check "deepseek-v4-like: a wrong router_scores or d_router_logits FAILs there" \
    'run 0 mutate "$V/deepseek-v4-like.h5" -o "$m.v4" --mutations sign \
        --stages router_scores,d_router_logits --modes staged &&
     for s in router_scores d_router_logits; do
         run 1 check "$V/deepseek-v4-like.h5" "$m.v4/sign.$s.staged.h5" &&
         grep -q "^$s .*FAIL" "$T/out" || exit 1
     done'
check "a case without the variant has no router_bias in its golden" \
    'run 0 info "$V/mixtral-small.h5" && grep -q "^ *d_x " "$T/out" && ! grep -q "router_bias" "$T/out"'
echo "1..$n"
[ "$fails" -eq 0 ]
