#!/bin/sh
# TAP wrapper for tests/test_reference_layer.py, with the first Python that
# has torch, numpy, h5py and ml_dtypes (tests/py_lib.sh). Without torch
# (CI: its wheels weigh gigabytes) the one line is a SKIP saying so.
. "${top_srcdir:-$(dirname "$0")/..}/tests/py_lib.sh"
py=$(py_with "torch, numpy, h5py, ml_dtypes") ||
    skip_all "no Python with PyTorch (and numpy, h5py, ml_dtypes): set DROPLESS_VENV or DROPLESS_PYTHON to one (the GPU report runs the layer on the H200)"
exec "$py" "$srcdir/tests/test_reference_layer.py"
