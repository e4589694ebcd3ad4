#!/bin/sh
# Golden bytes must not depend on the architecture or the BLAS library:
# regenerates every committed vector (`dropless gen --all`) under
#   - every x86 OpenBLAS kernel this CPU can run (OPENBLAS_CORETYPE),
#   - the reference BLAS (netlib) and BLIS in place of OpenBLAS (LD_PRELOAD),
#   - aarch64: dropless cross-built against Debian's arm64 OpenBLAS, HDF5
#     and MPFR, run under qemu-user on several emulated CPUs and OpenBLAS
#     kernels (NEON and SVE),
# and compares each file's SHA-256 with vectors/SHA256SUMS (the layer
# recipes' small cases with vectors/KERNEL_SHA256SUMS, the `dropless lowp`
# goldens with tests/lowp_SHA256SUMS).
#
# The host's packages are left alone: the arm64 and the alternative BLAS
# libraries are fetched with `apt-get download` (a private apt state for
# arm64: no `dpkg --add-architecture`) and unpacked with `dpkg -x` into a
# sysroot under WORKDIR. Installing libhdf5-dev:arm64 would remove the
# amd64 one. What must be installed on the host, if missing, are the cross
# compiler and qemu-user (gcc-aarch64-linux-gnu, qemu-user: added, nothing
# replaced; as root the script installs them, else that part SKIPs).
#
# The one assumption this rests on: the exact-sum certificate in
# src/stages/gemm.c trusts the BLAS's dgemm to add in genuine binary64
# (every addition or fused multiply-add rounded once, to nearest, with
# binary64's unit roundoff). Products of floats are exact in binary64, so
# then any order, blocking or thread split stays within the certificate's
# error bound; a BLAS that accumulated in less (fp32, a GPU BLAS in TF32)
# could change golden bits, and this script is how one finds out.
#
# Usage: tools/repro_cross.sh [WORKDIR]   (from a configured tree; needs the
# network for apt-get download; `make check-cross` runs it). WORKDIR
# (default ${TMPDIR:-/tmp}/dl_cross) keeps the downloads between runs.
# REPRO_CROSS_PARTS (default "x86 blas aarch64") picks the parts to run.
# Exit status: 0 every configuration identical (or SKIPped, saying why),
# 1 a difference or a failure.
set -u
cd "$(dirname "$0")/.."
top=$(pwd)
work=${1:-${TMPDIR:-/tmp}/dl_cross}
mkdir -p "$work" || exit 1
work=$(cd "$work" && pwd)
status=0
say() { echo "repro-cross: $*"; }

# same NAME DL [ENV...]: regenerates the vectors with DL (a command line,
# word-split) under ENV and compares them with the manifest
same() {
    name=$1 dl=$2
    shift 2
    out="$work/out/$name"
    rm -rf "$out" && mkdir -p "$out"
    # OpenBLAS settings of the caller's environment would pick the kernel
    # shellcheck disable=SC2086
    if ! env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$@" $dl gen --all -q -d "$out" >"$out.log" 2>&1; then
        say "$name: gen FAILED"; sed 's/^/    /' "$out.log" | head -5; status=1; return
    fi
    bad=$(cd "$out" && sha256sum -c "$top/vectors/SHA256SUMS" 2>/dev/null | grep -v ': OK$')
    if [ -n "$bad" ]; then
        say "$name: vectors DIFFER from vectors/SHA256SUMS:"; echo "$bad" | sed 's/^/    /'; status=1
    else
        say "$name: all $(grep -c . "$top/vectors/SHA256SUMS") vectors identical"
    fi
    lowp_same "$name" "$dl" "$@" # last: it reuses name, out and bad
}

# lowp_same NAME DL [ENV...]: the same for the low-precision goldens: the
# layer recipes' small cases (pinned in vectors/KERNEL_SHA256SUMS) and the
# `dropless lowp` families (tests/lowp_SHA256SUMS)
LOWP_CASES="deepseek-v3-fp8-small gpt-oss-mxfp4-small nvfp4-small"
lowp_same() {
    name=$1 dl=$2
    shift 2
    out="$work/out/$name-lowp"
    rm -rf "$out" && mkdir -p "$out"
    for c in $LOWP_CASES; do
        # shellcheck disable=SC2086
        env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$@" $dl gen -q -o "$out/$c.h5" "$c" >>"$out.log" 2>&1 ||
            { say "$name: gen $c FAILED"; status=1; return; }
    done
    for f in $(./dropless lowp --list); do
        # shellcheck disable=SC2086
        env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$@" $dl lowp "$f" -o "$out/$f.h5" >>"$out.log" 2>&1 ||
            { say "$name: lowp $f FAILED"; status=1; return; }
    done
    bad=$(cd "$out" && { grep -E "  ($(echo $LOWP_CASES | tr ' ' '|'))\.h5\$" "$top/vectors/KERNEL_SHA256SUMS";
                         cat "$top/tests/lowp_SHA256SUMS"; } | sha256sum -c - 2>/dev/null | grep -v ': OK$')
    if [ -n "$bad" ]; then
        say "$name: low-precision goldens DIFFER:"; echo "$bad" | sed 's/^/    /'; status=1
    else
        say "$name: all $(ls "$out" | grep -c '\.h5$') low-precision goldens identical"
    fi
}

# preloaded NAME LIB: the same with LIB's cblas_dgemm in place of
# OpenBLAS's, after checking that the dynamic linker really binds it there
preloaded() {
    if [ ! -f "$2" ]; then
        say "$1: FAILED ($2 is not in the unpacked package)"; status=1; return
    fi
    if ! LD_PRELOAD="$2" LD_DEBUG=bindings ./dropless gen -q --force tiny -o "$work/bind.h5" 2>&1 |
         grep -q "to $2 .*symbol \`cblas_dgemm'"; then
        say "$1: FAILED (cblas_dgemm is not bound to $2)"; status=1; return
    fi
    same "$1" ./dropless LD_PRELOAD="$2"
}

[ -x ./dropless ] || { say "build dropless first (./configure && make)"; exit 1; }
want_hdf5=$(sed -n 's/^HDF5 version: *//p' vectors/README.md)
have_hdf5=$(./dropless version --verbose | sed -n 's/^HDF5 //p')
if [ "$want_hdf5" != "$have_hdf5" ]; then
    say "SKIP: bytes are pinned for HDF5 $want_hdf5, this build has $have_hdf5"; exit 0
fi

parts=${REPRO_CROSS_PARTS:-x86 blas aarch64}
part() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }

# ------------------------------------------------------- x86 OpenBLAS kernels
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }
kernels="Prescott"
has ssse3 && kernels="$kernels Core2"
has sse4_2 && kernels="$kernels Nehalem"
has avx && kernels="$kernels Sandybridge"
has avx2 && kernels="$kernels Haswell Zen"
has avx512f && kernels="$kernels SkylakeX"
has avx512_bf16 && kernels="$kernels Cooperlake"
part x86 || kernels=
for k in $kernels; do
    core=$(env -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE=$k OPENBLAS_VERBOSE=2 ./dropless version 2>&1 |
           sed -n 's/^Core: //p')
    same "x86-openblas-$k${core:+ (runs $core)}" ./dropless OPENBLAS_CORETYPE=$k
done

# -------------------------------------------- reference BLAS and BLIS, x86
debs="$work/debs-amd64" alt="$work/alt-amd64"
mkdir -p "$debs" "$alt"
if ! part blas; then
    :
elif (cd "$debs" && apt-get download libblas3 libblis4-openmp >"$debs.log" 2>&1); then
    for d in "$debs"/*.deb; do dpkg -x "$d" "$alt"; done
    L="$alt/usr/lib/x86_64-linux-gnu"
    preloaded "x86-netlib-blas" "$L/blas/libblas.so.3"
    preloaded "x86-blis" "$L/blis-openmp/libblis.so.4"
else
    say "reference BLAS and BLIS: SKIP (apt-get download failed: $(tail -1 "$debs.log"))"
fi

# ----------------------------------------------------- aarch64 under qemu-user
part aarch64 || exit $status
if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user \
            >"$work/install.log" 2>&1 || true
    fi
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
    say "aarch64: SKIP (needs gcc-aarch64-linux-gnu and qemu-user)"
    exit $status
fi
A="$work/apt-arm64" sys="$work/sysroot-arm64"
mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$work/debs-arm64" "$sys"
: >"$A/status"
APT="-o Dir::State=$A -o Dir::State::Lists=$A/lists -o Dir::State::status=$A/status
     -o Dir::Cache=$A/cache -o APT::Architecture=arm64 -o APT::Architectures::=arm64
     -o Debug::NoLocking=1"
pkgs="libopenblas-openmp-dev libhdf5-dev libmpfr-dev libgmp-dev check"
# shellcheck disable=SC2086
if ! apt-get $APT update >"$work/apt-arm64.log" 2>&1; then
    say "aarch64: SKIP (apt-get update of the arm64 index failed)"; exit $status
fi
# every package they need, less the C library (the cross toolchain's)
# shellcheck disable=SC2086
need=$(apt-cache $APT depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances $pkgs 2>/dev/null | grep -E '^[a-z0-9]' | sed 's/:arm64$//' |
       grep -v -E '^(libc6|libc6-dev|libgcc-s1|libgcc-12-dev|gcc-12-base|libcrypt1|libcrypt-dev|linux-libc-dev|libstdc\+\+6|debconf|perl-base|dpkg|tar|coreutils)$' |
       sort -u)
(cd "$work/debs-arm64" && for p in $need; do
    ls "${p}"_*.deb >/dev/null 2>&1 || apt-get $APT download "$p:arm64" >/dev/null 2>&1 || true
done)
for d in "$work/debs-arm64"/*.deb; do dpkg -x "$d" "$sys"; done
ML=$sys/usr/lib/aarch64-linux-gnu SL=$sys/lib/aarch64-linux-gnu # bookworm's packages still use /lib
[ -e "$ML/libopenblas.so.0" ] || ln -sf openblas-openmp/libopenblas.so.0 "$ML/libopenblas.so.0"
b="$work/build-arm64"
rm -rf "$b" && mkdir -p "$b"
make -s distdir distdir="$b/src" >/dev/null || { say "aarch64: make distdir failed"; exit 1; }
if ! (cd "$b/src" &&
      PKG_CONFIG_SYSROOT_DIR="$sys" \
      PKG_CONFIG_LIBDIR="$ML/openblas-openmp/pkgconfig:$ML/pkgconfig:$sys/usr/share/pkgconfig" \
      ./configure -q --host=aarch64-linux-gnu --enable-static --disable-shared \
          CPPFLAGS="-I$sys/usr/include -I$sys/usr/include/aarch64-linux-gnu" \
          LDFLAGS="-L$ML -Wl,-rpath-link,$ML -Wl,-rpath-link,$ML/openblas-openmp -Wl,-rpath-link,$SL" \
          >"$b/configure.log" 2>&1 &&
      make -s -j"$(nproc)" dropless >"$b/build.log" 2>&1); then
    say "aarch64: cross build FAILED ($b/configure.log, $b/build.log)"
    tail -5 "$b/build.log" "$b/configure.log" 2>/dev/null | sed 's/^/    /'
    exit 1
fi
# the guest's library path, not qemu's own
run="qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=$ML:$ML/openblas-openmp:$SL"
# an emulated CPU, and the OpenBLAS kernel forced on it (none: detected);
# max has SVE (NEOVERSEV1's kernels use it)
for cfg in cortex-a53: cortex-a72: neoverse-n1: max:ARMV8 max:NEOVERSEV1 max:NEOVERSEN2 \
           max:THUNDERX2T99; do
    cpu=${cfg%%:*} k=${cfg#*:}
    core=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ${k:+OPENBLAS_CORETYPE=$k} OPENBLAS_VERBOSE=2 \
           $run -cpu "$cpu" "$b/src/dropless" version 2>&1 | sed -n 's/^Core: //p')
    if [ -n "$k" ] && [ "$(echo "$k" | tr 'A-Z' 'a-z')" != "$core" ]; then
        say "aarch64-$cpu-openblas-$k: SKIP (this OpenBLAS runs ${core:-?} instead)"
        continue
    fi
    same "aarch64-$cpu${k:+-openblas-$k} (runs ${core:-?})" "$run -cpu $cpu $b/src/dropless" \
        ${k:+OPENBLAS_CORETYPE=$k}
done
exit $status
