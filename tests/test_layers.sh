#!/bin/sh
# The layer rule of .ci/layers.py, both ways: the tree passes, and planted
# violations (an include up a layer, a private header with the umbrella
# header, an include cycle) are each found. Speaks TAP.
NAME=layers
. "${top_srcdir:-.}/tests/cli_lib.sh"
L="$top_srcdir/.ci/layers.py"
if [ ! -x /usr/bin/python3 ]; then
    echo "ok 1 # SKIP /usr/bin/python3 not installed"; echo "1..1"; exit 0
fi
# a copy of the tree's sources to plant violations in
plant() {
    rm -rf "$T/t" && mkdir -p "$T/t" && cp -R "$top_srcdir/src" "$top_srcdir/include" "$T/t/"
}
check "the tree: no include points up a layer, no cycle" '"$L" "$top_srcdir" >"$T/o" && grep -q "no include cycle" "$T/o"'
check "a stage file including the runner's header is found" \
    'plant && echo "#include \"check/check_priv.h\"" >>"$T/t/src/stages/route.c" &&
     ! "$L" "$T/t" >"$T/o" && grep -q "src/stages/route.c:.*layer stages includes src/check/check_priv.h" "$T/o"'
check "the core including a public section of the stages is found" \
    'plant && echo "#include \"dropless/moe.h\"" >>"$T/t/src/core/acc.c" &&
     ! "$L" "$T/t" >"$T/o" && grep -q "layer core includes include/dropless/moe.h" "$T/o"'
check "a private header including dropless.h is found" \
    'plant && echo "#include \"dropless.h\"" >>"$T/t/src/golden/golden_priv.h" &&
     ! "$L" "$T/t" >"$T/o" && grep -q "private header includes the umbrella" "$T/o"'
check "an include cycle is found" \
    'plant && echo "#include \"stages/values.c\"" >>"$T/t/src/stages/stages_priv.h" &&
     ! "$L" "$T/t" >"$T/o" && grep -q "include cycle" "$T/o"'
echo "1..$n"
[ "$fails" -eq 0 ]
