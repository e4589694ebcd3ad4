#!/bin/sh
# The extra value of `configure --enable-extra-value` (doc/architecture.md,
# "Adding a stage value"): y_half, added through the tables alone. In that
# build the runner checks it both ways (the golden passes as its own
# candidate with y_half named PASS; a candidate whose y_half is off by a
# few ulps fails on y_half) and the streaming generator writes the same
# bytes; in the default build the value is absent everywhere (the guard
# holds). mpirun and the Python/JAX paths run it through their own tests
# in that build (.ci/run). Speaks TAP.
NAME=extra_value
. "${top_srcdir:-.}/tests/cli_lib.sh"
if grep -q '^#define DL_EXTRA_VALUE 1' "$top_builddir/include/dropless/features.h" 2>/dev/null; then
    extra=1
else
    extra=0
fi
if [ "$extra" -eq 0 ]; then
    check "default build: no y_half in the layout, the format or the stages" \
        'run 0 info --layout && ! grep -q y_half "$T/out" && run 2 check --stages y_half "$top_srcdir/vectors/tiny.h5" "$top_srcdir/vectors/tiny.h5"'
    echo "1..$n"
    [ "$fails" -eq 0 ]
    exit
fi
check "extra build: y_half is a forward row of the layout, after y_sorted" \
    'run 0 info --layout && grep -A1 -E "^forward +y_sorted " "$T/out" | grep -q -E "^forward +y_half "'
check "extra build: the golden, its own candidate, has y_half checked (PASS)" \
    'run 0 gen -q -o "$T/tiny.h5" tiny && run 0 check --all "$T/tiny.h5" "$T/tiny.h5" && grep -q "^CONFORMANT" "$T/out" && grep -q "^y_half .*PASS" "$T/out"'
check "extra build: --stream writes the same bytes (the per-expert placement)" \
    'run 0 gen -q --stream -o "$T/s.h5" tiny && cmp "$T/tiny.h5" "$T/s.h5"'
PY=$(py_with "h5py, numpy") || PY=
if [ -n "$PY" ]; then
    check "extra build: a candidate with a wrong y_half fails on y_half" \
        'cp "$T/tiny.h5" "$T/bad.h5" && "$PY" -c "
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], \"r+\") as f:
    d = f[\"/forward/y_half\"]; a = d[...]; a.flat[0] = np.float32(a.flat[0]) * np.float32(1.001) + np.float32(1e-3); d[...] = a
" "$T/bad.h5" && run 1 check "$T/tiny.h5" "$T/bad.h5" && grep -q "^y_half .*FAIL" "$T/out"'
else
    echo "ok $((n = n + 1)) - extra build: a wrong y_half fails # SKIP no Python with h5py"
fi
echo "1..$n"
[ "$fails" -eq 0 ]
