#!/bin/sh
# dropless mutate: every exit code, nothing half-written, no overwrite
# without --force (and never of a directory that holds no mutants), and
# the mutants in both directions: one that must fail does, the reordering
# that must pass does. Speaks TAP.
NAME=power_cli
. "${top_srcdir:-.}/tests/cli_lib.sh"
V="$top_srcdir/vectors"
G="$V/mixtral-small.h5"
M="--mutations drop_slot,reorder,off_by_one"
# no temporary directories of ours left beside DIR
no_tmp() { [ -z "$(ls -d "$T"/*.tmp-* "$T"/*.old-* 2>/dev/null)" ]; }

echo "1..17"
check "mutate: no arguments is a usage error (exit 2, one line)" 'run 2 mutate && one_line_err'
check "mutate: no -o is a usage error" 'run 2 mutate "$G" && one_line_err && grep -q -- "-o" "$T/err"'
check "mutate: an unknown mutation is exit 2 naming it, nothing written" \
    'run 2 mutate "$G" -o "$T/a" --mutations gain,bogus && one_line_err && grep -q bogus "$T/err" && [ ! -e "$T/a" ] && no_tmp'
check "mutate: an unknown stage or mode is exit 2" \
    'run 2 mutate "$G" -o "$T/a" --stages outt && one_line_err && run 2 mutate "$G" -o "$T/a" --modes fusd && one_line_err'
check "mutate: --gain-p outside [1, 30] and a malformed seed are exit 2" \
    'run 2 mutate "$G" -o "$T/a" --gain-p 0 && one_line_err && run 2 mutate "$G" -o "$T/a" --gain-p 31 && run 2 mutate "$G" -o "$T/a" --seed -1'
check "mutate: a missing golden is exit 2 with one line naming it, nothing written" \
    'run 2 mutate "$T/nope.h5" -o "$T/a" && one_line_err && grep -q nope.h5 "$T/err" && [ ! -e "$T/a" ]'
check "mutate: a non-HDF5 golden is exit 2 with one line" \
    'echo garbage >"$T/junk.h5" && run 2 mutate "$T/junk.h5" -o "$T/a" && one_line_err && [ ! -e "$T/a" ]'
check "mutate writes candidates and a manifest (exit 0)" \
    'run 0 mutate "$G" -o "$T/m" $M && [ -f "$T/m/manifest.tsv" ] && [ -f "$T/m/drop_slot.out.out.h5" ] && no_tmp'
check "every file of the manifest exists, and every candidate file is in the manifest" \
    'cut -f1 "$T/m/manifest.tsv" | tail -n +2 | grep -v "^-$" | sort >"$T/listed" && (cd "$T/m" && ls *.h5) | sort >"$T/have" && cmp "$T/listed" "$T/have"'
check "the reordering must pass and the manifest says so" \
    'grep -q "^reorder.sort_perm.staged.h5	reorder	sort_perm	staged	pass	" "$T/m/manifest.tsv"'
check "a dropped slot, out alone, is NOT CONFORMANT (exit 1) with the pair named" \
    'slot=$(grep "^drop_slot.out.out.h5" "$T/m/manifest.tsv" | sed "s/.*slot (\([0-9]*\), \([0-9]*\)).*/\1, \2/") && run 1 check "$G" "$T/m/drop_slot.out.out.h5" && grep -q "dropped" "$T/out" && grep -q "($(echo "$slot" | tr -d " "))" "$T/out"'
check "rows reordered within the experts are CONFORMANT (exit 0)" \
    'run 0 check "$G" "$T/m/reorder.sort_perm.staged.h5" && grep -q "^CONFORMANT" "$T/out"'
check "an existing directory is kept without --force (exit 2, one line)" \
    'cp "$T/m/manifest.tsv" "$T/before" && run 2 mutate "$G" -o "$T/m" --mutations gain && one_line_err && grep -q -- "--force" "$T/err" && cmp "$T/before" "$T/m/manifest.tsv" && no_tmp'
check "a directory that holds no mutants is never replaced, even with --force" \
    'mkdir "$T/mine" && echo keep >"$T/mine/notes" && run 2 mutate "$G" -o "$T/mine" --force && one_line_err && [ "$(cat "$T/mine/notes")" = keep ]'
check "--force replaces a directory of mutants whole" \
    'run 0 mutate "$G" -o "$T/m" --force --mutations gain --stages out --modes out && [ "$(ls "$T/m" | wc -l)" -eq 2 ] && [ -f "$T/m/gain.out.out.h5" ] && no_tmp'
# a gain of 1 + 2^-30 leaves every fp32 value as it is, but the stages
# downstream are still replayed by the stage functions: every mutant must
# then be the golden bit for bit (equivalent), so the replay is the oracle
check "the replay downstream of an unchanged stage is the golden, bit for bit (6 cases, 2 with shared experts)" \
    'for c in mixtral-small deepseek-v3-small plain-ffn zipf qwen2-moe-like deepseek-v3-shared; do run 0 mutate "$V/$c.h5" -o "$T/e$c" --mutations gain --gain-p 30 && grep -q "^0 mutated" "$T/out" && [ "$(cut -f5 "$T/e$c/manifest.tsv" | grep -vc "^equivalent$")" -eq 1 ] && [ "$(wc -l <"$T/e$c/manifest.tsv")" -gt 40 ] || return 1; done'
check "mutate --help exits 0 and names the mutations" 'run 0 mutate --help && grep -q ulp_weights "$T/out"'
exit $((fails > 0))
