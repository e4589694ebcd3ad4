#!/bin/sh
# Sets everything up on a fresh Debian machine and runs the main job:
# installs the Debian packages dropless needs (apt-get; uses sudo when not
# root), builds, then generates the default case and checks the bundled
# backends against it.
set -eu
cd "$(dirname "$0")/.."

PKGS="build-essential autoconf automake libtool pkg-config libopenblas-openmp-dev
      libhdf5-dev libmpfr-dev check libdlpack-dev python3-h5py python3-numpy
      python3-matplotlib openmpi-bin libopenmpi-dev"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "quickstart: installing Debian packages:$missing" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure -q
make -j"$(nproc)" >/dev/null

# Python for the package's pytest suites and the GPU tools' CPU tests (JAX,
# PyTorch), after the build: `pip install ./python` there takes the library
# just built; optional: without it those tests SKIP, saying so.
tools/setup_python.sh || echo "quickstart: no JAX venv; the adapter tests will SKIP" >&2

# The main job: generate the default case, then run the conformance runner
# over the bundled example backends. Three must conform (plain fp32, the
# block-padded one, tf32 under its declared profile), one conforms with a
# WARN (thread-order-dependent combine), three must not (a capacity-factor
# router that drops tokens, one that leaves empty-expert gradients
# unwritten, one that crashes), so the runner's own exit status is 1.
mkdir -p out
./dropless gen --force --case deepseek-v3-small -o out/deepseek-v3-small.h5
B=tests/backends/.libs
set +e
./dropless run --force --json out/main-job.json \
    --backend $B/plain.so --backend $B/padded.so --backend $B/tf32.so --backend $B/nondet.so \
    --backend $B/capacity.so --backend $B/nodw.so --backend $B/crash.so \
    out/deepseek-v3-small.h5 >out/main-job.txt
status=$?
set -e
cat out/main-job.txt
verdicts=$(grep -E '^(NOT )?CONFORMANT' out/main-job.txt | sed 's/:.*//' | tr '\n' '/')
want="CONFORMANT/CONFORMANT/CONFORMANT/CONFORMANT/NOT CONFORMANT/NOT CONFORMANT/NOT CONFORMANT/"
if [ "$status" -ne 1 ] || [ "$verdicts" != "$want" ]; then
    echo "quickstart: the runner did not give the expected verdicts (exit $status): $verdicts" >&2
    exit 1
fi
echo "quickstart: main job done: every bundled backend got its expected verdict (report: out/main-job.txt, out/main-job.json)"
