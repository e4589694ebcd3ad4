#!/bin/sh
# TAP wrapper for tests/test_adapters.py, with the first Python that has
# numpy, h5py and ml_dtypes, preferring one that also has JAX
# (tools/setup_python.sh makes one; tests/py_lib.sh says where it looks).
. "${top_srcdir:-$(dirname "$0")/..}/tests/py_lib.sh"
py=$(py_with "numpy, h5py, ml_dtypes, jax") || py=$(py_with "numpy, h5py, ml_dtypes") ||
    skip_all "no Python with numpy, h5py and ml_dtypes (run tools/setup_python.sh)"
exec "$py" "$srcdir/tests/test_adapters.py"
