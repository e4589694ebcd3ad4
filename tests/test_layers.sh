#!/bin/sh
# The layer rule of .ci/layers.py, both ways: the tree passes, and planted
# violations (an include up a layer, a private header with the umbrella
# header, an include cycle, a file cycle) are each found, and a known file
# cycle that is gone must leave the allow-list; doc/architecture.md's layer
# table is checked against the tree both ways. Speaks TAP.
NAME=layers
. "${top_srcdir:-.}/tests/cli_lib.sh"
L="$top_srcdir/.ci/layers.py"
if [ ! -x /usr/bin/python3 ]; then
    echo "ok 1 # SKIP /usr/bin/python3 not installed"; echo "1..1"; exit 0
fi
# a copy of the tree's sources to plant violations in
plant() {
    rm -rf "$T/t" && mkdir -p "$T/t" && cp -R "$top_srcdir/src" "$top_srcdir/include" "$top_srcdir/doc" "$T/t/"
}
check "the tree: no include points up a layer, no cycle" '"$L" "$top_srcdir" >"$T/o" && grep -q "no include cycle, no file cycle" "$T/o"'
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
check "a file cycle (two stage files calling each other) is found, naming both" \
    'plant && printf "int dl__planted_a(void);\nint dl__planted_a(void)\n{\n    return dl_swiglu(0, 0, 0, 0, 0);\n}\n" >>"$T/t/src/stages/dispatch.c" &&
     printf "int dl__planted_b(void);\nint dl__planted_b(void)\n{\n    return dl_permute(0, 0, 0, 0, 0, 0);\n}\n" >>"$T/t/src/stages/activation.c" &&
     ! "$L" "$T/t" >"$T/o" && grep -q "file cycle: src/stages/activation.c <-> src/stages/dispatch.c" "$T/o"'
check "a function named in a comment makes no file cycle" \
    'plant && printf "/* dl_swiglu */\n" >>"$T/t/src/stages/dispatch.c" &&
     printf "int dl__planted_b(void);\nint dl__planted_b(void)\n{\n    return dl_permute(0, 0, 0, 0, 0, 0);\n}\n" >>"$T/t/src/stages/activation.c" &&
     "$L" "$T/t" >"$T/o"'
# the runner's second chained level is a nested run: the stage walk reaches
# it through the run's hook, never by name (no allow-list of cycles is left)
check "the stage walk calling the entry point is a file cycle, found" \
    'plant && printf "int dl__planted_c(void);\nint dl__planted_c(void)\n{\n    return dl_check_run(0, 0, 0, 0);\n}\n" >>"$T/t/src/check/stage.c" &&
     ! "$L" "$T/t" >"$T/o" && grep -q "file cycle: .*src/check/check.c .*src/check/stage.c" "$T/o"'
check "a source file missing from doc/architecture.md's layer table is found" \
    'plant && : >"$T/t/src/stages/planted.c" && ! "$L" "$T/t" >"$T/o" && grep -q "src/stages/planted.c: not named in doc/architecture.md" "$T/o"'
check "a file the layer table names that is not in the tree is found" \
    'plant && rm "$T/t/src/golden/slice.c" && ! "$L" "$T/t" >"$T/o" && grep -q "names src/golden/slice.c, which does not exist" "$T/o"'
echo "1..$n"
[ "$fails" -eq 0 ]
