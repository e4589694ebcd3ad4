#!/bin/sh
# Makes the clients harness's own Python virtual environment: PyTorch (CPU),
# transformers, numpy and h5py (tools/clients/run.py reads goldens through
# python/dropless, which it imports from the source tree).
# Usage: tools/clients/setup_venv.sh [DIR]
#   DIR defaults to $DROPLESS_CLIENTS_VENV, else ~/.cache/dropless/clients-venv.
# PyTorch comes from its CPU-only index (about 200 MB) where that index can
# be reached, else from PyPI (whose Linux wheel brings CUDA's runtime wheels
# along, about 4 GB once; the harness runs it on the CPU either way).
# Reruns are quick: what imports already is not installed again.
# Exit 1 with a one-line message when something cannot be installed.
set -u
dir=${1:-${DROPLESS_CLIENTS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dropless/clients-venv}}
py=${PYTHON:-/usr/bin/python3}
[ -x "$py" ] || py=python3
pip() { "$dir/bin/python3" -m pip -q --disable-pip-version-check "$@"; }
if [ ! -x "$dir/bin/python3" ]; then
    mkdir -p "$(dirname "$dir")"
    "$py" -m venv "$dir" 2>/dev/null || {
        rm -rf "$dir"
        echo "setup_venv: cannot make a venv with $py in $dir (python3-venv missing?)" >&2
        exit 1
    }
fi
if ! "$dir/bin/python3" -c 'import torch' >/dev/null 2>&1; then
    pip install --timeout 20 --retries 1 --index-url https://download.pytorch.org/whl/cpu torch 2>/dev/null ||
        pip install torch ||
        { echo "setup_venv: pip install torch failed (neither the CPU index nor PyPI)" >&2; exit 1; }
fi
if ! "$dir/bin/python3" -c 'import transformers, numpy, h5py' >/dev/null 2>&1; then
    pip install transformers numpy h5py ||
        { echo "setup_venv: pip install transformers numpy h5py failed" >&2; exit 1; }
fi
"$dir/bin/python3" -c 'import torch, transformers, numpy, h5py; print("setup_venv: %s: torch %s, transformers %s, numpy %s, h5py %s" % (__import__("sys").executable, torch.__version__, transformers.__version__, numpy.__version__, h5py.__version__))'
