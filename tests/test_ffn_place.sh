#!/bin/sh
# The FFN variants (gpt-oss's clamped SwiGLU with the expert biases,
# GeGLU-tanh, the bf16/fp16 router weight) in every placement of the
# schedule: the streaming generator, expert slices and `mpirun dropless gen`
# write the bytes of the in-memory generator; a slice's expert biases and
# their gradients are the full file's rows of its experts. Speaks TAP.
NAME=ffn_place
. "${top_srcdir:-.}/tests/cli_lib.sh"
cases="gpt-oss-like gpt-oss-like-bf16 gpt-oss-like-fp16 swiglu-clamp-tight-fp16 geglu-tanh-bf16 nemotron-like-bf16"
for c in $cases; do
    "$DL" gen -q -o "$T/$c.h5" "$c"
    check "$c: gen --stream writes the in-memory bytes" \
        'run 0 gen "$c" --stream -q -o "$T/$c.s.h5" && cmp "$T/$c.h5" "$T/$c.s.h5"'
done
# A slice holds its experts' rows of the expert biases and their gradients
PY=$(py_with "h5py, numpy") || PY=
rows() { # FULL SLICE A B: each per-expert dataset of the slice = rows A..B-1 of the file
    "$PY" - "$@" <<'PYEOF'
import sys, h5py, numpy as np
full, part, a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
names = ["inputs/b_gate", "inputs/b_up", "inputs/b_down", "backward/d_b_down",
         "backward/d_b_gate", "backward/d_b_up", "backward/d_w_gate"]
bad = [n for n in names if not np.array_equal(full[n][()][a:b], part[n][()])]
sys.exit("differ: %s" % bad if bad else 0)
PYEOF
}
if [ -n "$PY" ]; then
    check "gpt-oss-like: --experts 2:6 holds rows 2..5 of the biases and their gradients" \
        'run 0 gen gpt-oss-like --experts 2:6 -q -d "$T" &&
         rows "$T/gpt-oss-like.h5" "$T/gpt-oss-like.experts-2-6.h5" 2 6'
    check "the row comparison notices another expert range (negative control)" \
        '! rows "$T/gpt-oss-like.h5" "$T/gpt-oss-like.experts-2-6.h5" 3 7 2>/dev/null'
else
    skip "the slice's rows" "no Python with h5py and numpy"
fi
check "an ffn_bias case needs a gated FFN: a plain one is refused in one line (exit 2)" \
    'printf "tokens = 4\nhidden = 8\nexperts = 4\ntop_k = 2\nffn_kind = plain\nffn_bias = 1\n" >"$T/pb.case" &&
     run 2 gen --config "$T/pb.case" -o "$T/pb.h5" && one_line_err && grep -q "ffn_bias" "$T/err" &&
     [ ! -e "$T/pb.h5" ]'
check "shared experts without a hidden layer (plain): refused in one line, named (exit 2)" \
    'printf "tokens = 4\nhidden = 8\nffn = 8\nexperts = 4\ntop_k = 2\nffn_kind = plain\nshared_experts = 1\nshared_ffn = 4\n" >"$T/sg.case" &&
     run 2 gen --config "$T/sg.case" -o "$T/sg.h5" && one_line_err && grep -q "plain" "$T/err" &&
     [ ! -e "$T/sg.h5" ]'
check "shared experts follow the case's activation: geglu-tanh's are generated, gated" \
    'printf "tokens = 4\nhidden = 8\nexperts = 4\ntop_k = 2\nffn_kind = geglu-tanh\nshared_experts = 1\nshared_ffn = 4\n" >"$T/sg2.case" &&
     run 0 gen --config "$T/sg2.case" -o "$T/sg2.h5" && run 0 info "$T/sg2.h5" &&
     grep -q "shared_w_gate" "$T/out" && run 0 check "$T/sg2.h5" "$T/sg2.h5"'
check "dropless run: the backend ABI's missing FFN variant is named, exit 2" \
    'run 2 run --backend "$top_builddir/tests/backends/.libs/plain.so" "$T/gpt-oss-like.h5" &&
     one_line_err && grep -q "no swiglu-clamp" "$T/err"'
if grep -q '^#define DL_HAVE_MPI 1' "$top_builddir/config.h" 2>/dev/null && command -v mpirun >/dev/null 2>&1; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMP_NUM_THREADS OPENBLAS_NUM_THREADS
    mpi() {
        np=$1
        shift
        ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
            mpirun --oversubscribe -np "$np" "$DL" "$@" >"$T/out" 2>"$T/err"
    }
    for c in gpt-oss-like gpt-oss-like-fp16 geglu-tanh-bf16 nemotron-like-bf16; do
        for np in 2 4; do
            check "mpirun -np $np gen $c is byte-identical to gen" \
                'mpi $np gen $c -q -o "$T/$c.$np.h5" && cmp "$T/$c.h5" "$T/$c.$np.h5"'
        done
    done
    check "mpirun -np 2 gen --slices gpt-oss-like-bf16: each slice = gen --experts" \
        'mkdir "$T/sl" && mpi 2 gen gpt-oss-like-bf16 --slices -q -d "$T/sl" &&
         for ab in 0:4 4:8; do
             "$DL" gen gpt-oss-like-bf16 --experts $ab -q -f -d "$T" &&
             cmp "$T/gpt-oss-like-bf16.experts-${ab%:*}-${ab#*:}.h5" \
                 "$T/sl/gpt-oss-like-bf16.experts-${ab%:*}-${ab#*:}.h5" || exit 1
         done'
else
    skip "mpirun generation of the FFN variants" "no MPI build or no mpirun"
fi
echo "1..$n"
[ "$fails" -eq 0 ]
