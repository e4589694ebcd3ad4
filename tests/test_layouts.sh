#!/bin/sh
# TAP wrapper for tests/test_layouts.py (the kernel layouts, their
# converters and the layout zoo), with the first Python that has numpy and
# h5py (tests/py_lib.sh); SKIP, saying why, without one.
. "${top_srcdir:-$(dirname "$0")/..}/tests/py_lib.sh"
py=$(py_with "numpy, h5py") || skip_all "no Python with numpy and h5py"
top_srcdir=$srcdir top_builddir=$builddir exec "$py" "$srcdir/tests/test_layouts.py"
