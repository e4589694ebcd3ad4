"""The layer recipes' goldens (catalogue cases deepseek-v3-fp8-small,
gpt-oss-mxfp4-small, nvfp4-small): every quantized expert GEMM checked
output by output against its definition, independently of the exactness
engine: the operand rows quantized by dropless.quant (tested against
ml_dtypes in test_quant.py) expert by expert, the weights taken [N, K],
the exact sum of the dequantized products in fractions, rounded once to
bf16. The unquantized sum is checked to differ somewhere, so a golden that
ignored its recipe fails. Run by tests/test_quant.sh (pytest)."""

import fractions
import os
import subprocess

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
h5py = pytest.importorskip("h5py")
from dropless import quant  # noqa: E402

# case: (x recipe or None, weight recipe, h recipe or None, dgrad quantized)
RECIPES = {
    "deepseek-v3-fp8-small": ("deepseek-v3-act", "deepseek-v3-weight", "deepseek-v3-act", True),
    "gpt-oss-mxfp4-small": (None, "mxfp4", None, False),
    "nvfp4-small": ("nvfp4", "nvfp4", "nvfp4", False),
}


def rn_bf16(exact):
    """RN_bf16 of a Fraction: the nearest of the bf16 codes around it, ties to even."""
    c = int(np.array([float(exact)], dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)[0])
    cands = [(c + d) & 0xFFFF for d in (-1, 0, 1)]
    vals = np.array(cands, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    return min(zip(vals, cands), key=lambda vc: (abs(fractions.Fraction(float(vc[0])) - exact), vc[1] & 1))[0]


def deq(x, recipe):
    """x [rows, K] quantized and dequantized (exact float64); None: x itself."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if recipe is None:
        return x.astype(np.float64)
    q, s = quant.quantize(x, recipe)
    g = quant.nvfp4_global(x) if recipe == "nvfp4" else None
    return quant.dequantize(q, s, recipe, x.shape, global_scale=g)


def check_gemm(a, w_nk, off, ra, rw, out, rng, n_out=24):
    """out[m, n] = RN_bf16(sum_k Q(a_e)[m, k] Q(W_e)[n, k]) for n_out random
    outputs; returns how many differ from the unquantized exact sum."""
    differ = 0
    nonempty = [e for e in range(len(off) - 1) if off[e + 1] > off[e]]
    for _ in range(n_out):
        e = int(rng.choice(nonempty))
        da = deq(a[off[e]:off[e + 1]], ra)
        db = deq(w_nk[e], rw)
        m, n = int(rng.integers(0, off[e + 1] - off[e])), int(rng.integers(0, db.shape[0]))
        exact = sum(fractions.Fraction(float(p)) * fractions.Fraction(float(q)) for p, q in zip(da[m], db[n]))
        assert out[off[e] + m, n] == rn_bf16(exact), (e, m, n)
        plain = sum(fractions.Fraction(float(p)) * fractions.Fraction(float(q))
                    for p, q in zip(a[off[e] + m].astype(np.float64), w_nk[e][n].astype(np.float64)))
        differ += rn_bf16(plain) != out[off[e] + m, n]
    return differ


@pytest.mark.parametrize("case", sorted(RECIPES))
def test_layer_recipe_golden(case, tmp_path):
    ra, rw, rh, dgrad = RECIPES[case]
    exe = os.path.join(os.environ.get("top_builddir", "."), "dropless")
    path = str(tmp_path / "g.h5")
    subprocess.run([exe, "gen", "-q", "-o", path, case], check=True)
    with h5py.File(path, "r") as f:
        assert f["config"].attrs["lowp"].decode() == case[: -len("-small")]
        fw, bw, inp = f["forward"], f["backward"], f["inputs"]
        off = fw["group_offsets"][()]
        wg, wd = inp["w_gate"][()], inp["w_down"][()]
        rng = np.random.default_rng(len(case))
        differ = check_gemm(fw["x_sorted"][()], wg.transpose(0, 2, 1), off, ra, rw, fw["h_gate"][()], rng)
        differ += check_gemm(fw["h_act"][()], wd.transpose(0, 2, 1), off, rh, rw, fw["y_sorted"][()], rng)
        if dgrad:  # d_h_act = Q(d_y) Q(W_down)^T, W_down[e] already [f, d] = [N, K]
            differ += check_gemm(bw["d_y_sorted"][()], wd, off, ra, rw, bw["d_h_act"][()], rng)
        assert differ > 0, "every output equals the unquantized GEMM's"


def expert_bytes(a, off, r):
    """(codes, scales) of each expert's rows of a under rule r (None: no rows)."""
    return [quant.quantize(np.ascontiguousarray(a[off[e]:off[e + 1]]), r) if off[e + 1] > off[e] else None
            for e in range(len(off) - 1)]


def test_check_layer_names_the_rule(tmp_path):
    """quant.check_layer both ways: the recipe's own per-expert bytes are
    CONFORMANT; truncating elements (toward zero) on DeepSeek-V3's
    requantized SwiGLU output is named; NVFP4 with one tensor-wide global
    scale instead of the per-expert one is not conformant; a value the
    recipe leaves unquantized is refused."""
    exe = os.path.join(os.environ.get("top_builddir", "."), "dropless")
    paths = {}
    for case in ("deepseek-v3-fp8-small", "nvfp4-small", "gpt-oss-mxfp4-small"):
        paths[case] = str(tmp_path / (case + ".h5"))
        subprocess.run([exe, "gen", "-q", "--no-backward", "-o", paths[case], case], check=True)
    with h5py.File(paths["deepseek-v3-fp8-small"], "r") as f:
        h, off = f["forward/h_act"][()], f["forward/group_offsets"][()]
    g = paths["deepseek-v3-fp8-small"]
    assert quant.check_layer(g, "h_act", expert_bytes(h, off, "deepseek-v3-act"))["conformant"]
    bad = quant.check_layer(g, "h_act", expert_bytes(h, off, quant.rule("deepseek-v3-act", rounding="toward-zero")))
    assert not bad["conformant"]
    assert bad["experts"][bad["first"]]["variant"] == "toward-zero"
    with h5py.File(paths["nvfp4-small"], "r") as f:
        x, off = f["forward/x_sorted"][()], f["forward/group_offsets"][()]
    g = paths["nvfp4-small"]
    assert quant.check_layer(g, "x_sorted", expert_bytes(x, off, "nvfp4"))["conformant"]
    tensor_wide = {"elem": "e2m1", "scale": "e4m3", "block": (1, 16), "global_scale": quant.nvfp4_global(x)}
    assert not quant.check_layer(g, "x_sorted", expert_bytes(x, off, tensor_wide))["conformant"]
    with pytest.raises(ValueError):
        quant.check_layer(paths["gpt-oss-mxfp4-small"], "x_sorted", [])
