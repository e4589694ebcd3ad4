#!/bin/sh
# dropless mutate on the model variants (ffn_bias, swiglu-clamp, the router
# bias, softmax over the top-k, sqrtsoftplus, GeGLU, relu2): the replay
# downstream of a mutation runs the schedule's own producers where
# src/golden/replay.c wires no stage function itself, so every variant's
# stages are replayed as the layer computes them. Speaks TAP.
NAME=mutate_variants
. "${top_srcdir:-.}/tests/cli_lib.sh"
V="$top_srcdir/vectors"
CASES="gpt-oss-like softmax-topk deepseek-v4-like swiglu-clamp-tight geglu-tanh nemotron-like"

echo "1..3"
# a gain of 1 + 2^-30 changes no fp32 value: every replayed mutant must be
# the golden bit for bit, which fails if a variant's stage is replayed by
# other arithmetic (or not at all: mutate used to stop on ffn_bias)
check "the replay downstream of an unchanged stage is the golden, bit for bit (6 variant cases)" \
    'for c in $CASES; do run 0 mutate "$V/$c.h5" -o "$T/e$c" --mutations gain --gain-p 30 && grep -q "^0 mutated" "$T/out" && [ "$(cut -f5 "$T/e$c/manifest.tsv" | grep -vc "^equivalent$")" -eq 1 ] && [ "$(wc -l <"$T/e$c/manifest.tsv")" -gt 40 ] || return 1; done'
# a zeroed row of x_sorted, staged: the biased GEMMs, the clamp and the
# biases' gradients downstream are replayed on it, so x_sorted is the one
# FAIL; a stale d_b_gate or h_gate would FAIL too
check "gpt-oss-like-bf16: a zeroed x_sorted row, staged, FAILs x_sorted alone" \
    'run 0 mutate "$V/gpt-oss-like-bf16.h5" -o "$T/g" --mutations zero_row,reorder --stages x_sorted,sort_perm --modes staged && run 1 check "$V/gpt-oss-like-bf16.h5" "$T/g/zero_row.x_sorted.staged.h5" && [ "$(grep -c " FAIL " "$T/out")" -eq 1 ] && grep -q "^x_sorted .* FAIL " "$T/out"'
check "gpt-oss-like-bf16: rows reordered within the experts, replayed, are CONFORMANT" \
    'run 0 check "$V/gpt-oss-like-bf16.h5" "$T/g/reorder.sort_perm.staged.h5" && grep -q "^CONFORMANT" "$T/out"'
exit $((fails > 0))
