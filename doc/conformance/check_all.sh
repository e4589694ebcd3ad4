#!/bin/sh
# Runs `dropless check` on every candidate of CAND_DIR against its golden
# file in GOLDEN_DIR (CASE--BACKEND--MODE.h5 -> GOLDEN_DIR/CASE.h5), under
# the profile each candidate declares, and once more under --profile fp32
# for the fp32 cases that declared tf32. Writes REPORT_DIR/{declared,fp32}/
# NAME.{txt,json}. Two checks run at a time.
# Usage: doc/conformance/check_all.sh DROPLESS GOLDEN_DIR CAND_DIR REPORT_DIR
set -eu
if [ "$1" = --one ]; then
    dl=$2 gold=$3 out=$4 c=$5
    b=$(basename "$c" .h5)
    g="$gold/${b%%--*}.h5"
    "$dl" check --force --json "$out/declared/$b.json" "$g" "$c" > "$out/declared/$b.txt" 2>&1 || true
    if grep -q '"profile": *"tf32"' "$out/declared/$b.json" 2>/dev/null; then
        "$dl" check --force --profile fp32 --json "$out/fp32/$b.json" "$g" "$c" > "$out/fp32/$b.txt" 2>&1 || true
    fi
    exit 0
fi
dl=$1 gold=$2 cand=$3 out=$4
mkdir -p "$out/declared" "$out/fp32"
ls "$cand"/*.h5 | xargs -P 2 -n 1 sh "$0" --one "$dl" "$gold" "$out"
