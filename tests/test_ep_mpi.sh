#!/bin/sh
# `mpirun -np R dropless gen` (src/cli/gen_mpi.c, doc/ep.md): byte-identical
# to the single process at R = 2 and 4 on catalogue cases (SwiGLU and plain,
# fp32/bf16/fp16, softmax and grouped sigmoid routing) and on the kernel
# tier's kernel-sizes-bf16 (planted group sizes, a hot expert; its digest
# in vectors/KERNEL_SHA256SUMS), with --ep-ranks and --no-backward too;
# --slices (each rank its expert slice) byte-identical to gen --experts;
# refusals (R not dividing E, --experts, an existing output) exit 2 under
# mpirun; a build without MPI refuses to run as several processes. SKIPs,
# saying why, where mpirun is absent. Speaks TAP.
NAME=ep_mpi
. "${top_srcdir:-.}/tests/cli_lib.sh"
# Open MPI refuses root without these; one thread per rank on a small machine
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMP_NUM_THREADS OPENBLAS_NUM_THREADS
unset DROPLESS_MPI_STATS

if ! grep -q '^#define DL_HAVE_MPI 1' "$top_builddir/config.h" 2>/dev/null; then
    check "built without MPI: several processes are refused (exit 2, one line)" \
        'OMPI_COMM_WORLD_SIZE=2 run 2 gen tiny -o "$T/x.h5" && one_line_err && grep -q "without MPI" "$T/err" && [ ! -e "$T/x.h5" ]'
    skip "mpirun generation" "dropless was built without MPI (configure --with-mpi; Debian: openmpi-bin libopenmpi-dev)"
    echo "1..$n"
    [ "$fails" -eq 0 ]
    exit
fi
if ! command -v mpirun >/dev/null 2>&1; then
    skip "mpirun generation" "mpirun not found (Debian: openmpi-bin)"
    echo "1..$n"
    exit 0
fi
# Under AddressSanitizer (tools/check_sanitizers.sh) the ranks keep their
# memory-error checks but not the leak check: Open MPI leaves its own
# allocations (MCA plugins, ompi_op_base_op_select, opal_argv) at
# MPI_Finalize, in modules already unloaded, where no suppression can name
# them; the single-process generator's leaks are checked by the other tests.
mpi() {
    np=$1
    shift
    ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
        mpirun --oversubscribe -np "$np" "$DL" "$@" >"$T/out" 2>"$T/err"
}

# case, then the process counts that divide its experts
for spec in "tiny 2 4" "mixtral-small 2 4" "deepseek-v3-small 2 4" "zipf-fp16 2 4" \
            "ties-grouped-bf16 2 4" "plain-ffn-bf16 2" "single-token 2 4" "no-tokens 2" \
            "qwen2-moe-like 2 4" "deepseek-v3-shared-bf16 2 4" \
            "softmax-topk 2 4" "deepseek-v4-like-bf16 2 4" "softmax-topk-ties-fp16 2" \
            "deepseek-v4-hash 2 4" "deepseek-v4-hash-bf16 2"; do
    set -- $spec
    c=$1
    shift
    "$DL" gen "$c" -q -o "$T/$c.h5"
    for np in "$@"; do
        check "mpirun -np $np gen $c is byte-identical to gen" \
            'mpi $np gen $c -q -o "$T/$c.$np.h5" && cmp "$T/$c.h5" "$T/$c.$np.h5"'
    done
done
"$DL" gen deepseek-v3-small -q --ep-ranks 1,2,4,8 -o "$T/ep.h5"
check "mpirun -np 4 gen --ep-ranks 1,2,4,8 is byte-identical" \
    'mpi 4 gen deepseek-v3-small -q --ep-ranks 1,2,4,8 -o "$T/ep.4.h5" && cmp "$T/ep.h5" "$T/ep.4.h5"'
"$DL" gen mixtral-small-fp16 -q --no-backward -o "$T/nb.h5"
check "mpirun -np 2 gen --no-backward is byte-identical" \
    'mpi 2 gen mixtral-small-fp16 -q --no-backward -o "$T/nb.2.h5" && cmp "$T/nb.h5" "$T/nb.2.h5"'

k=kernel-sizes-bf16
want=$(sed -n "s/^\([0-9a-f]\{64\}\)  *$k\.h5\$/\1/p" "$top_srcdir/vectors/KERNEL_SHA256SUMS")
want_hdf5=$(sed -n 's/^HDF5 version: *//p' "$top_srcdir/vectors/README.md")
have_hdf5=$("$DL" version --verbose | sed -n 's/^HDF5 //p')
if [ "$want_hdf5" != "$have_hdf5" ]; then
    "$DL" gen "$k" -q -o "$T/$k.h5"
    want=$(sha256sum "$T/$k.h5" | cut -d' ' -f1)
    rm -f "$T/$k.h5"
fi
for np in 2 4; do
    check "mpirun -np $np gen $k (kernel tier) has the single process's digest" \
        'mpi $np gen $k -q -o "$T/$k.$np.h5" && [ "$(sha256sum "$T/$k.$np.h5" | cut -d" " -f1)" = "$want" ]'
    rm -f "$T/$k.$np.h5"
done

# --slices: each rank writes its expert slice, the bytes of gen --experts A:B
slices() { # CASE NP E [OPTIONS]: every rank's slice against gen --experts
    c=$1 np=$2 e=$3
    shift 3
    mkdir -p "$T/sl$np" && mpi $np gen "$c" --slices -q -d "$T/sl$np" "$@" || return 1
    per=$((e / np)) r=0
    while [ $r -lt $np ]; do
        a=$((r * per)) b=$(((r + 1) * per))
        "$DL" gen "$c" --experts $a:$b -q -f -d "$T" "$@" &&
            cmp "$T/$c.experts-$a-$b.h5" "$T/sl$np/$c.experts-$a-$b.h5" || return 1
        r=$((r + 1))
    done
    rm -rf "$T/sl$np"
}
check "mpirun -np 2 gen --slices: each slice = gen --experts (deepseek-v3-small, --ep-ranks 2)" \
    'slices deepseek-v3-small 2 32 --ep-ranks 2'
check "mpirun -np 4 gen --slices: each slice = gen --experts (mixtral-small-bf16)" \
    'slices mixtral-small-bf16 4 8'
check "mpirun -np 2 gen --slices --no-backward (plain-ffn-fp16)" \
    'slices plain-ffn-fp16 2 6 --no-backward'
check "mpirun -np 4 gen --slices: each slice = gen --experts (kernel tier: $k)" \
    'slices $k 4 64'
check "--slices without mpirun: exit 2, said" \
    'run 2 gen tiny --slices -d "$T" && grep -q "needs mpirun" "$T/err"'
check "--slices with --output under mpirun: exit 2, said" \
    '! mpi 2 gen tiny --slices -o "$T/x.h5" && grep -q "one file per rank" "$T/err"'

# negative controls: the comparison notices a changed byte; refusals
check "cmp notices one changed byte (negative control)" \
    'cp "$T/tiny.2.h5" "$T/bad.h5" && printf x | dd of="$T/bad.h5" bs=1 seek=3000 conv=notrunc 2>/dev/null && ! cmp -s "$T/tiny.h5" "$T/bad.h5"'
check "mpirun -np 2 on 3 experts: exit 2, the reason said, nothing written" \
    '! mpi 2 gen odd-shapes -o "$T/odd.h5" && grep -q "must divide the 3 experts" "$T/err" && [ ! -e "$T/odd.h5" ]'
check "mpirun with --experts: exit 2, said" \
    '! mpi 2 gen tiny --experts 0:2 -o "$T/sl.h5" && grep -q "experts is not supported under mpirun" "$T/err"'
check "mpirun onto an existing file without -f: refused, file kept" \
    'cp "$T/tiny.h5" "$T/keep.h5" && ! mpi 2 gen mixtral-small -o "$T/keep.h5" && grep -q "exists" "$T/err" && cmp "$T/tiny.h5" "$T/keep.h5"'
echo "1..$n"
[ "$fails" -eq 0 ]
