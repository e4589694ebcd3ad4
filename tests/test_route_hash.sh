#!/bin/sh
# DeepSeek-V4's hash routing (route.hash_vocab, doc/format.md) through the
# command: a case file with hash_vocab generates a golden with token_ids and
# hash_table, CONFORMANT to itself; hash routing with a selection bias or an
# out-of-range hash_vocab is one line, exit 2, nothing written; the
# streaming generator and mpirun write the committed bytes; a candidate
# with one of the variant's values wrong (dropless mutate, replayed by the
# table) FAILs at that value only; other goldens carry neither dataset.
# Speaks TAP.
NAME=route_hash
. "${top_srcdir:-.}/tests/cli_lib.sh"
V="$top_srcdir/vectors"

cat >"$T/h.case" <<'EOT'
name = hash-mini
tokens = 12
hidden = 8
ffn = 4
experts = 8
top_k = 2
score_function = sigmoid
hash_vocab = 6
seed = 11
EOT
check "a case file with hash_vocab = 6 generates token_ids [12] and hash_table [6,2], CONFORMANT to itself" \
    'run 0 gen --config "$T/h.case" -q -o "$T/h.h5" && run 0 info "$T/h.h5" &&
     grep -q "^ *token_ids  *int32  *\[12\]" "$T/out" && grep -q "^ *hash_table  *int32  *\[6,2\]" "$T/out" &&
     run 0 check "$T/h.h5" "$T/h.h5" && grep -q "^CONFORMANT" "$T/out"'
printf 'has_bias = 1\n' >>"$T/h.case"
check "hash_vocab with has_bias = 1: one line naming hash routing, exit 2, nothing written" \
    'run 2 gen --config "$T/h.case" -q -o "$T/bad.h5" && one_line_err && grep -q "hash" "$T/err" &&
     [ ! -e "$T/bad.h5" ]'
sed 's/hash_vocab = 6/hash_vocab = -1/; /has_bias/d' "$T/h.case" >"$T/bad2.case"
check "hash_vocab = -1: one line naming the key, exit 2" \
    'run 2 gen --config "$T/bad2.case" -q -o "$T/bad2.h5" && one_line_err && grep -q "hash_vocab" "$T/err"'
for c in deepseek-v4-hash deepseek-v4-hash-bf16 deepseek-v4-hash-fp16; do
    check "$c: gen --stream writes the committed bytes" \
        'run 0 gen $c --stream -q -o "$T/$c.s.h5" && cmp "$T/$c.s.h5" "$V/$c.h5"'
done
S=router_scores,topk_weights,d_router_scores,d_router_logits
check "deepseek-v4-hash-bf16: a wrong $S FAILs there and only there" 'fails_alone "$V/deepseek-v4-hash-bf16.h5" $S'
check "a case without hash routing has no token_ids or hash_table" \
    'run 0 info "$V/mixtral-small.h5" && ! grep -q "token_ids\|hash_table" "$T/out"'
echo "1..$n"
[ "$fails" -eq 0 ]
