#!/bin/sh
# Makes a Python virtual environment with numpy, h5py, JAX (CPU), PyTorch,
# matplotlib and pytest,
# and installs the package `dropless` (python/) into it, for the adapters'
# and the package's tests (tests/test_adapters.sh and tests/test_python.sh
# find it at the default path).
# Usage: tools/setup_python.sh [DIR]   (default ~/.cache/dropless/adapters-venv)
# About 1 minute and 650 MB, plus PyTorch's 4 GB once; reruns are quick. Fails softly: exit 1 with a
# message, and the test then skips what needs JAX.
set -u
dir=${1:-${DROPLESS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dropless/adapters-venv}}
py=${PYTHON:-python3}
if [ ! -x "$dir/bin/python3" ]; then
    mkdir -p "$(dirname "$dir")"
    if ! "$py" -m venv "$dir" 2>/dev/null; then
        # Debian's python3 needs python3-venv for ensurepip
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null 2>&1
        fi
        rm -rf "$dir"
        "$py" -m venv "$dir" || { echo "setup_python: cannot make a venv with $py" >&2; exit 1; }
    fi
fi
"$dir/bin/python3" -m pip install -q --disable-pip-version-check numpy h5py 'jax[cpu]' pytest setuptools wheel matplotlib ||
    { echo "setup_python: pip install failed" >&2; exit 1; }
# PyTorch for dropless.gpu's CPU tests (the reference layer, the EP tools,
# the torch adapter): PyPI's Linux x86_64 wheel, which brings CUDA's runtime
# wheels along (about 4 GB, a few minutes once; PyPI has no CPU-only build);
# the tests run it on the CPU. DROPLESS_NO_TORCH=1 skips it (those tests
# then SKIP, saying so); a failure here is not fatal.
if [ "${DROPLESS_NO_TORCH:-0}" != 1 ] && ! "$dir/bin/python3" -c 'import torch' >/dev/null 2>&1; then
    "$dir/bin/python3" -m pip install -q --disable-pip-version-check torch ||
        echo "setup_python: pip install torch failed; dropless.gpu's PyTorch tests will SKIP" >&2
fi
# the package, with libdropless and the JAX FFI handler built into it from
# this tree (python/setup.py: `make libdropless.la` where the tree is
# configured, else configure and compile in the build; doc/python.md)
"$dir/bin/python3" -m pip install -q --disable-pip-version-check "$(dirname "$0")/../python" ||
    { echo "setup_python: pip install ./python failed" >&2; exit 1; }
"$dir/bin/python3" -c 'import jax, h5py, numpy, pytest, dropless; print("setup_python: %s: jax %s, h5py %s, numpy %s, pytest %s, dropless %s" % (__import__("sys").executable, jax.__version__, h5py.__version__, numpy.__version__, pytest.__version__, dropless.__version__))'
