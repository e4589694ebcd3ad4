#!/bin/sh
# The kernel layouts, their converters and the layout zoo (tests/test_layouts.py)
# in a Python that has h5py and numpy: the project's venv (DROPLESS_VENV,
# tools/setup_python.sh), else the system's; SKIP, saying why, with neither.
top_srcdir=${top_srcdir:-.}
export top_srcdir
venv=${DROPLESS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dropless/adapters-venv}
for py in "$venv/bin/python3" /usr/bin/python3; do
    if [ -x "$py" ] && "$py" -c 'import h5py, numpy' 2>/dev/null; then
        exec "$py" "$top_srcdir/tests/test_layouts.py"
    fi
done
echo "1..1"
echo "ok 1 # SKIP no Python with h5py and numpy (looked in $venv and /usr/bin/python3)"
