#!/bin/sh
# LongCat-Flash's zero (identity) experts (route.zero_experts, doc/format.md)
# through the command: a case file with zero_experts generates a golden
# whose router arrays are E + Z wide, CONFORMANT to itself; zero experts
# with groups, or a negative count, are one line, exit 2, nothing written;
# the streaming generator refuses them (the identity tail is no expert's
# window); dropless mutate replays the identity tail (an unchanged stage's
# replay is the golden bit for bit), a wrong stage FAILs there and only
# there, a dropped slot is NOT CONFORMANT with the pair named, and rows
# reordered within the experts (the tail kept) are CONFORMANT. Speaks TAP.
NAME=zero_experts
. "${top_srcdir:-.}/tests/cli_lib.sh"
V="$top_srcdir/vectors"

cat >"$T/z.case" <<'EOT'
name = zero-mini
tokens = 12
hidden = 8
ffn = 4
experts = 4
zero_experts = 2
top_k = 3
renormalize = 0
scaling = 6
has_bias = 1
seed = 60
EOT
check "a case file with zero_experts = 2 generates router arrays [.,6] over 4 experts' weights, CONFORMANT to itself" \
    'run 0 gen --config "$T/z.case" -q -o "$T/z.h5" && run 0 info "$T/z.h5" &&
     grep -q "^ *router_logits  *float32  *\[12,6\]" "$T/out" && grep -q "^ *router_weight  *float32  *\[8,6\]" "$T/out" &&
     grep -q "^ *w_down  *float32  *\[4,4,8\]" "$T/out" && grep -q "^ *group_sizes  *int64  *\[4\]" "$T/out" &&
     run 0 check "$T/z.h5" "$T/z.h5" && grep -q "^CONFORMANT" "$T/out" && grep -q "^y_sorted .*identity .*PASS" "$T/out"'
printf 'n_group = 2\n' >>"$T/z.case"
check "zero_experts with n_group = 2: one line naming zero_experts, exit 2, nothing written" \
    'run 2 gen --config "$T/z.case" -q -o "$T/bad.h5" && one_line_err && grep -q "zero_experts" "$T/err" &&
     [ ! -e "$T/bad.h5" ]'
sed 's/zero_experts = 2/zero_experts = -1/; /n_group/d' "$T/z.case" >"$T/bad2.case"
check "zero_experts = -1: one line naming the key, exit 2" \
    'run 2 gen --config "$T/bad2.case" -q -o "$T/bad2.h5" && one_line_err && grep -q "zero_experts" "$T/err"'
check "gen --stream refuses zero experts: one line, exit 2, nothing written" \
    'run 2 gen longcat-like --stream -q -o "$T/s.h5" && one_line_err && grep -q "zero_experts" "$T/err" &&
     [ ! -e "$T/s.h5" ]'
check "a gain of 1 + 2^-30 replayed downstream is the golden bit for bit (longcat-like)" \
    'run 0 mutate "$V/longcat-like.h5" -o "$T/e" --mutations gain --gain-p 30 && grep -q "^0 mutated" "$T/out" &&
     [ "$(cut -f5 "$T/e/manifest.tsv" | grep -vc "^equivalent$")" -eq 1 ]'
S=router_scores,topk_weights,x_sorted,y_sorted,out,d_y_sorted,d_x_sorted,d_router_scores,d_x
check "longcat-like-bf16: a wrong $S FAILs there and only there" 'fails_alone "$V/longcat-like-bf16.h5" $S'
check "longcat-like: a dropped slot, fused, is NOT CONFORMANT with the pair named; reordered rows CONFORMANT" \
    'run 0 mutate "$V/longcat-like.h5" -o "$T/d" --mutations drop_slot,reorder --modes fused,staged &&
     run 1 check "$V/longcat-like.h5" "$T/d/drop_slot.out.fused.h5" && grep -q "pairs dropped: (" "$T/out" &&
     run 0 check "$V/longcat-like.h5" "$T/d/reorder.sort_perm.staged.h5" && grep -q "^CONFORMANT" "$T/out"'
check "a case without zero experts has router arrays E wide and no zero_experts attribute" \
    'run 0 info "$V/mixtral-small.h5" && grep -q "^ *router_logits  *float32  *\[32,8\]" "$T/out" &&
     ! grep -q "zero_experts" "$T/out"'
echo "1..$n"
[ "$fails" -eq 0 ]
