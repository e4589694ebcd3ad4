#!/bin/sh
# The extra-value configuration of CI (doc/architecture.md, "Adding a stage
# value"): a clean copy of the sources (`make distdir`, so the main build is
# left alone) configured with --enable-extra-value, which adds the synthetic
# value y_half through the tables alone, built, and its `make check` run:
# the mpirun and Python/JAX tests included. Its golden files carry one more
# dataset, so the copy's vectors (and the one kernel-tier digest make check
# compares, kernel-sizes-bf16) are regenerated first, the way the checklist's
# last step does for a real value; the tests then hold that build to them.
# Usage: tools/check_extra_value.sh [WORKDIR]   (from a configured tree)
set -u
cd "$(dirname "$0")/.."
. tools/clean_copy.sh
clean_copy "extra value" extra "${1:-}"
start=$(date +%s)
cd "$work/src" || exit 1
fail() {
    echo "extra value: $1" >&2
    [ -f "$2" ] && tail -30 "$2" >&2
    exit 1
}
./configure -q --enable-extra-value >"$work/configure.log" 2>&1 || fail "configure failed" "$work/configure.log"
grep -q '^#define DL_EXTRA_VALUE 1' include/dropless/features.h || fail "features.h does not say DL_EXTRA_VALUE 1" ""
make -s -j"$(nproc)" >"$work/build.log" 2>&1 || fail "build failed" "$work/build.log"
./dropless info --layout | grep -q -E '^forward +y_half ' || fail "the layout has no y_half" ""
# the vectors of this build: every committed case, and the kernel digest
names=$(sed -n 's/^[0-9a-f]\{64\}  *\*\{0,1\}\(.*\)\.h5$/\1/p' vectors/SHA256SUMS)
# shellcheck disable=SC2086
./dropless gen -q --force -d vectors $names >"$work/gen.log" 2>&1 || fail "regenerating the vectors failed" "$work/gen.log"
(cd vectors && sha256sum $(for n in $names; do echo "$n.h5"; done) >SHA256SUMS)
./dropless gen -q --force -o "$work/kernel-sizes-bf16.h5" kernel-sizes-bf16 >>"$work/gen.log" 2>&1 ||
    fail "generating kernel-sizes-bf16 failed" "$work/gen.log"
sum=$(sha256sum "$work/kernel-sizes-bf16.h5" | cut -d' ' -f1)
rm -f "$work/kernel-sizes-bf16.h5"
sed -i "s/^[0-9a-f]\{64\}  kernel-sizes-bf16\.h5\$/$sum  kernel-sizes-bf16.h5/" vectors/KERNEL_SHA256SUMS
# and the layer recipes' small cases pinned beside it (tests/test_lowp_layer.sh)
for n in $(sed -n 's/^[0-9a-f]\{64\}  \(.*-small\)\.h5$/\1/p' vectors/KERNEL_SHA256SUMS); do
    ./dropless gen -q --force -o "$work/$n.h5" "$n" >>"$work/gen.log" 2>&1 || fail "generating $n failed" "$work/gen.log"
    sum=$(sha256sum "$work/$n.h5" | cut -d' ' -f1)
    rm -f "$work/$n.h5"
    sed -i "s/^[0-9a-f]\{64\}  $n\.h5\$/$sum  $n.h5/" vectors/KERNEL_SHA256SUMS
done
make -s -j"$(nproc)" check >"$work/check.log" 2>&1
status=$?
check_failures "$status" "$work/check.log"
grep -E '^(ok|not ok) .*extra build' tests/test_extra_value.sh.log 2>/dev/null
echo "extra value: make check with --enable-extra-value: exit $status in $(( $(date +%s) - start )) s"
exit $status
