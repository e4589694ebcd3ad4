#!/bin/sh
# The layer recipes' catalogue cases (doc/lowprecision.md, "The layer
# recipes"): each small case regenerates byte for byte at 1 and 2 OpenMP
# threads, expert by expert (--stream) and under mpirun -np 2 (the other
# placements of the one schedule), and matches its digest in
# vectors/KERNEL_SHA256SUMS; its /config
# names the recipe; the same case without the recipe (lowp = none) gives
# other bytes (the recipe is not ignored); a bad lowp value or shapes the
# recipe cannot take are usage errors naming the file. Speaks TAP.
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
DL="$top_builddir/dropless"
V="$top_srcdir/vectors"
M="$V/KERNEL_SHA256SUMS"
T=$(mktemp -d "${TMPDIR:-/tmp}/dl_lowp_layer.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
nok() { n=$((n + 1)); echo "not ok $n - $*"; fails=$((fails + 1)); }

want_hdf5=$(sed -n 's/^HDF5 version: *//p' "$V/README.md")
have_hdf5=$("$DL" version --verbose | sed -n 's/^HDF5 //p')
skip=
[ "$want_hdf5" = "$have_hdf5" ] || skip=" # SKIP bytes pinned for HDF5 $want_hdf5, this build has HDF5 $have_hdf5"

for name in deepseek-v3-fp8-small gpt-oss-mxfp4-small nvfp4-small; do
    want=$(sed -n "s/^\([0-9a-f]\{64\}\)  *$name\.h5\$/\1/p" "$M")
    for threads in 1 2; do
        OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads "$DL" gen -q -o "$T/$name.$threads.h5" "$name" 2>"$T/err" ||
            { nok "gen $name (threads: $threads)"; sed 's/^/# /' "$T/err"; continue; }
        got=$(sha256sum "$T/$name.$threads.h5" | cut -d' ' -f1)
        if [ -n "$skip" ]; then
            ok "$name.h5 (threads: $threads)$skip"
        elif [ -n "$want" ] && [ "$want" = "$got" ]; then
            ok "$name.h5 (threads: $threads) matches KERNEL_SHA256SUMS"
        else
            nok "$name.h5 (threads: $threads): sha256 $got, manifest ${want:-none}"
        fi
    done
    if cmp -s "$T/$name.1.h5" "$T/$name.2.h5"; then ok "$name.h5 identical at 1 and 2 threads"; else nok "$name.h5 differs between 1 and 2 threads"; fi
    # the other placements of the schedule: one expert at a time, and two MPI ranks
    if "$DL" gen -q --stream -o "$T/$name.s.h5" "$name" 2>"$T/err" && cmp -s "$T/$name.s.h5" "$T/$name.1.h5"; then
        ok "$name.h5 identical generated expert by expert (--stream)"
    else
        nok "$name.h5 differs generated expert by expert (--stream)"; sed 's/^/# /' "$T/err"
    fi
    if ! grep -q '^#define DL_HAVE_MPI 1' "$top_builddir/config.h" 2>/dev/null || ! command -v mpirun >/dev/null 2>&1; then
        ok "$name.h5 under mpirun -np 2 # SKIP no MPI build or no mpirun"
    elif OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
            ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
            mpirun --oversubscribe -np 2 "$DL" gen -q -o "$T/$name.m.h5" "$name" >"$T/err" 2>&1 &&
            cmp -s "$T/$name.m.h5" "$T/$name.1.h5"; then
        ok "$name.h5 identical under mpirun -np 2"
    else
        nok "$name.h5 differs under mpirun -np 2"; sed 's/^/# /' "$T/err" | tail -3
    fi
    recipe=${name%-small}
    if "$DL" info "$T/$name.1.h5" 2>/dev/null | grep -q "^ *lowp = $recipe\$"; then
        ok "$name.h5: /config/lowp = $recipe"
    else
        nok "$name.h5: /config/lowp is not $recipe"
    fi
    printf 'base = %s\nname = %s\nlowp = none\n' "$name" "$name" >"$T/plain.case"
    if "$DL" gen -q -o "$T/plain.h5" --config "$T/plain.case" 2>"$T/err" && ! cmp -s "$T/plain.h5" "$T/$name.1.h5" &&
        "$DL" info "$T/plain.h5" >"$T/info" 2>&1 && grep -q "dtype = bf16" "$T/info" && ! grep -q "^ *lowp = " "$T/info"; then
        ok "$name without its recipe: other bytes, no /config/lowp"
    else
        nok "$name without its recipe: same bytes, or gen failed"; sed 's/^/# /' "$T/err"
    fi
    rm -f "$T/$name".*.h5 "$T/plain.h5"
done

# usage errors: exit 2, one line naming the file
bad() { # bad LABEL CASE-LINES...
    label=$1
    shift
    printf '%s\n' "$@" >"$T/bad.case"
    "$DL" gen -q -o "$T/bad.h5" --config "$T/bad.case" 2>"$T/err"
    rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "bad.case" "$T/err" && [ ! -e "$T/bad.h5" ]; then
        ok "$label: exit 2, one line naming the file"
    else
        nok "$label: exit $rc"; sed 's/^/# /' "$T/err"
    fi
}
bad "lowp = fp7" "base = nvfp4-small" "lowp = fp7"
bad "nvfp4 with an odd hidden size" "base = nvfp4-small" "hidden = 321"
echo "1..$n"
[ "$fails" -eq 0 ]
