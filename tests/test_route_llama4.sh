#!/bin/sh
# Llama-4's routing weight on the expert input (route.weight_on_input,
# doc/format.md) through the command: a case file with weight_on_input = 1
# generates a golden that says so and is its own CONFORMANT candidate; a
# configuration the variant cannot have is one line, exit 2, nothing
# written; the streaming generator writes the committed bytes; mpirun
# refuses the variant; a candidate with one stage computed wrongly
# (dropless mutate, replayed downstream by the producers) FAILs at that
# stage and nowhere else (the values downstream, recomputed on the
# candidate's upstream, PASS); cases without it carry no attribute. Speaks TAP.
NAME=route_llama4
. "${top_srcdir:-.}/tests/cli_lib.sh"
V="$top_srcdir/vectors"

cat >"$T/l4.case" <<'EOT'
name = l4-mini
tokens = 10
hidden = 8
ffn = 4
experts = 4
top_k = 1
score_function = sigmoid
renormalize = 0
weight_on_input = 1
seed = 9
EOT
check "a case file with weight_on_input = 1 generates a golden that says so, CONFORMANT to itself" \
    'run 0 gen --config "$T/l4.case" -q -o "$T/g.h5" && run 0 info "$T/g.h5" &&
     grep -q "weight_on_input = 1" "$T/out" && run 0 check "$T/g.h5" "$T/g.h5" &&
     grep -q "^CONFORMANT" "$T/out"'
sed 's/renormalize = 0/renormalize = 1/' "$T/l4.case" >"$T/bad.case"
check "weight_on_input with renormalize = 1: one line naming the key, exit 2, nothing written" \
    'run 2 gen --config "$T/bad.case" -q -o "$T/bad.h5" && one_line_err &&
     grep -q "weight_on_input" "$T/err" && [ ! -e "$T/bad.h5" ]'
for c in llama4-like llama4-like-bf16 llama4-like-fp16; do
    check "$c: gen --stream writes the committed bytes" \
        'run 0 gen $c --stream -q -o "$T/$c.s.h5" && cmp "$T/$c.s.h5" "$V/$c.h5"'
done
S=router_scores,x_sorted,topk_weights,d_x_sorted,d_router_scores,d_router_logits,d_x
check "llama4-like-bf16: a wrong $S FAILs there and only there" 'fails_alone "$V/llama4-like-bf16.h5" $S'
# (under AddressSanitizer without the leak check, as tests/test_ep_mpi.sh
# says why: Open MPI leaves its own allocations at MPI_Finalize)
if grep -q '^#define DL_HAVE_MPI 1' "$top_builddir/config.h" 2>/dev/null && command -v mpirun >/dev/null 2>&1; then
    check "mpirun -np 2 gen llama4-like: refused (exit 2, the variant named), nothing written" \
        'OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
         ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
         mpirun --oversubscribe -np 2 "$DL" gen llama4-like -o "$T/m.h5" >"$T/out" 2>"$T/err";
         [ $? -eq 2 ] && grep -q "weight_on_input" "$T/err" && [ ! -e "$T/m.h5" ]'
else
    skip "mpirun refusal" "no MPI build or no mpirun"
fi
check "a case without the variant has no weight_on_input attribute" \
    'run 0 info "$V/mixtral-small.h5" && ! grep -q "weight_on_input" "$T/out"'
echo "1..$n"
[ "$fails" -eq 0 ]
