# Sourced by tests/cli_lib.sh and tests/py_lib.sh: py_with MODULES prints
# the first Python that imports them ("h5py, numpy"): $DROPLESS_PYTHON,
# then $DROPLESS_VENV's (default the adapters' venv, tools/setup_python.sh),
# then /usr/bin/python3 (never the first python3 on PATH, which may lack
# numpy); status 1 when none does.
py_with() {
    for cand in "$DROPLESS_PYTHON" \
        "${DROPLESS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dropless/adapters-venv}/bin/python3" \
        /usr/bin/python3; do
        [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 || continue
        if "$cand" -c "import $1" >/dev/null 2>&1; then
            echo "$cand"
            return 0
        fi
    done
    return 1
}
