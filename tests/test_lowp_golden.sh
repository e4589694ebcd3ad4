#!/bin/sh
# The lowp-* golden files (doc/lowprecision.md): each family written at 1
# and at 2 OpenMP threads gives the same bytes, the ones pinned in
# tests/lowp_SHA256SUMS; an existing file is kept without --force; an
# unknown family exits 2 and writes nothing.
bin=${top_builddir:-.}/dropless
sums=${top_srcdir:-$(dirname "$0")/..}/tests/lowp_SHA256SUMS
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
n=0
fams=$("$bin" lowp --list)
echo "1..$(($(echo "$fams" | wc -l) + 2))"
for f in $fams; do
    n=$((n + 1))
    if OMP_NUM_THREADS=1 "$bin" lowp "$f" -o "$tmp/$f.1.h5" &&
        OMP_NUM_THREADS=2 "$bin" lowp "$f" -o "$tmp/$f.2.h5" &&
        cmp -s "$tmp/$f.1.h5" "$tmp/$f.2.h5" &&
        [ "$(sha256sum < "$tmp/$f.1.h5" | cut -d' ' -f1)" = "$(grep " $f.h5\$" "$sums" | cut -d' ' -f1)" ]; then
        echo "ok $n - $f: same bytes at 1 and 2 threads, as pinned ($(sha256sum < "$tmp/$f.1.h5" | cut -c1-16))"
    else
        echo "not ok $n - $f: generation failed, bytes differ between 1 and 2 threads, or from tests/lowp_SHA256SUMS"
    fi
done
n=$((n + 1))
first=$(echo "$fams" | head -1)
before=$(sha256sum < "$tmp/$first.1.h5")
"$bin" lowp "$first" -o "$tmp/$first.1.h5" --seed 3 2>"$tmp/err"
rc=$?
if [ $rc -eq 2 ] && [ "$(sha256sum < "$tmp/$first.1.h5")" = "$before" ] && grep -q "$tmp/$first.1.h5" "$tmp/err"; then
    echo "ok $n - an existing file is kept without --force (exit 2, named)"
else
    echo "not ok $n - an existing file: exit $rc"
fi
n=$((n + 1))
"$bin" lowp no-such-family -o "$tmp/x.h5" 2>"$tmp/err"
rc=$?
if [ $rc -eq 2 ] && [ ! -e "$tmp/x.h5" ] && [ "$(wc -l < "$tmp/err")" -eq 1 ]; then
    echo "ok $n - an unknown family: one line, exit 2, nothing written"
else
    echo "not ok $n - an unknown family: exit $rc"
fi
