#!/bin/sh
# The kernel tier (`dropless cases --tier kernel`): every member is listed
# with its SHA-256 in vectors/KERNEL_SHA256SUMS, and the smallest member,
# kernel-sizes-bf16 (planted group sizes 0, 1, 63, ..., 129 and a hot
# expert), regenerates byte for byte at 1 and 2 threads. The other members
# (0.6-2.8 GB each) are generated and compared by `make bench`
# (bench/bench_tier). Bytes are pinned for the HDF5 version named in
# vectors/README.md; under another version only the thread runs are
# compared with each other. Speaks TAP.
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
DL="$top_builddir/dropless"
V="$top_srcdir/vectors"
M="$V/KERNEL_SHA256SUMS"
T=$(mktemp -d "${TMPDIR:-/tmp}/dl_ktier.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
nok() { n=$((n + 1)); echo "not ok $n - $*"; fails=$((fails + 1)); }

want_hdf5=$(sed -n 's/^HDF5 version: *//p' "$V/README.md")
have_hdf5=$("$DL" version --verbose | sed -n 's/^HDF5 //p')
skip=
[ "$want_hdf5" = "$have_hdf5" ] || skip=" # SKIP bytes pinned for HDF5 $want_hdf5, this build has HDF5 $have_hdf5"

names=$("$DL" cases --tier kernel --names)
count=$(echo "$names" | grep -c .)
if [ "$count" -ge 8 ]; then ok "cases --tier kernel lists $count cases"; else nok "cases --tier kernel lists $count cases (want >= 8)"; fi
listed=0
for name in $names; do
    grep -q "  $name\.h5\$" "$M" && listed=$((listed + 1))
done
if [ "$listed" -eq "$count" ] && [ "$(grep -c . "$M")" -eq "$count" ]; then
    ok "KERNEL_SHA256SUMS pins exactly the $count members"
else
    nok "KERNEL_SHA256SUMS pins $listed of $count members ($(grep -c . "$M") lines)"
fi
if "$DL" cases --tier vectors --names | grep -q '^kernel-'; then
    nok "cases --tier vectors lists a kernel case"
else
    ok "cases --tier vectors leaves the kernel tier out"
fi
if "$DL" gen --all -d "$T" -q --no-backward 2>/dev/null && ! ls "$T" | grep -q '^kernel-'; then
    ok "gen --all leaves the kernel tier out"
else
    nok "gen --all wrote a kernel case (or failed)"
fi
rm -f "$T"/*.h5
"$DL" cases --tier bogus >/dev/null 2>"$T/err"
rc=$?
if [ "$rc" -eq 2 ] && grep -q -- "--tier" "$T/err"; then ok "cases --tier bogus: exit 2, one line"; else nok "cases --tier bogus: exit $rc"; fi

name=kernel-sizes-bf16
want=$(sed -n "s/^\([0-9a-f]\{64\}\)  *$name\.h5\$/\1/p" "$M")
for threads in 1 2; do
    if OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads "$DL" gen -q -o "$T/$threads.h5" "$name" 2>"$T/err"; then
        ok "gen $name (threads: $threads)"
    else
        nok "gen $name (threads: $threads)"; sed 's/^/# /' "$T/err"
    fi
    got=$(sha256sum "$T/$threads.h5" 2>/dev/null | cut -d' ' -f1)
    if [ -n "$skip" ]; then
        ok "$name.h5 (threads: $threads)$skip"
    elif [ -n "$want" ] && [ "$want" = "$got" ]; then
        ok "$name.h5 (threads: $threads) matches KERNEL_SHA256SUMS"
    else
        nok "$name.h5 (threads: $threads): sha256 $got, manifest ${want:-none}"
    fi
done
if cmp -s "$T/1.h5" "$T/2.h5"; then ok "$name.h5 identical at 1 and 2 threads"; else nok "$name.h5 differs between 1 and 2 threads"; fi
# negative control: the comparison notices a changed byte
byte=$(od -An -tu1 -j4096 -N1 "$T/1.h5" | tr -d ' ')
cp "$T/1.h5" "$T/bad.h5" &&
    printf "\\$(printf %o $(( (byte + 1) % 256 )))" | dd of="$T/bad.h5" bs=1 seek=4096 conv=notrunc 2>/dev/null
if [ "$(sha256sum "$T/bad.h5" | cut -d' ' -f1)" != "$want" ]; then ok "a changed byte changes the digest"; else nok "a changed byte kept the digest"; fi
echo "1..$n"
[ "$fails" -eq 0 ]
