#!/bin/sh
# TAP wrapper for tests/test_ep.py (the expert-parallel layout and the gloo
# dispatch, python/dropless/gpu/adapters/ep_layout.py and python/dropless/gpu/ep_dispatch.py), with the
# first Python that has numpy, h5py and PyTorch (tests/py_lib.sh). PyTorch
# is not in CI (its wheels weigh gigabytes): without it the one line is a
# SKIP saying so.
. "${top_srcdir:-$(dirname "$0")/..}/tests/py_lib.sh"
py=$(py_with "numpy, h5py, ml_dtypes, torch") ||
    skip_all "no Python with numpy, h5py and PyTorch (PyTorch is not in CI; DROPLESS_VENV or DROPLESS_PYTHON names one that has it)"
exec "$py" "$srcdir/tests/test_ep.py"
