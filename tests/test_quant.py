"""dropless.quant against ml_dtypes, an independent implementation of the
OCP formats: every code decoded, every value, midpoint and neighbour
encoded, and two recipes' quantization (DeepSeek-V3's 1x128 tiles, OCP
MXFP4) against numpy reference quantizers written from the recipes' text.
Run by tests/test_quant.sh (pytest)."""

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
from dropless import quant  # noqa: E402

FMTS = [("e4m3", "float8_e4m3fn", 256), ("e5m2", "float8_e5m2", 256),
        ("e2m1", "float4_e2m1fn", 16), ("ue8m0", "float8_e8m0fnu", 256)]


def ml_values(name, n):
    t = getattr(ml_dtypes, name)
    return np.arange(n, dtype=np.uint8).view(t).astype(np.float64)


@pytest.mark.parametrize("fmt,ml,n", FMTS)
def test_decode_every_code(fmt, ml, n):
    want = ml_values(ml, n)
    got = quant.decode(np.arange(n, dtype=np.uint8), fmt)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok], want[ok]) and np.array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


def boundary_inputs(fmt, ml, n):
    """Every finite value, every midpoint, their float32 neighbours, both signs."""
    v = np.unique(np.abs(ml_values(ml, n)[np.isfinite(ml_values(ml, n))]))
    mids = (v[:-1] + v[1:]) / 2
    with np.errstate(over="ignore"):  # UE8M0's 2^127 * 3 is beyond float32: an infinity, dropped below
        pts = np.concatenate([v, mids, [v[-1] * 1.0625, v[-1] * 1.2, v[-1] * 3]]).astype(np.float32)
    near = np.concatenate([pts, np.nextafter(pts, np.float32(0)), np.nextafter(pts, np.float32(np.inf))])
    rng = np.random.default_rng(25)
    rand = (rng.standard_normal(20000) * np.exp2(rng.integers(-12, 12, 20000))).astype(np.float32)
    x = np.concatenate([near, rand])
    return np.concatenate([x, -x]) if fmt != "ue8m0" else x[(x > 2.0 ** -127) & (x < 2.0 ** 127)]


@pytest.mark.parametrize("fmt,ml,n", FMTS)
def test_encode_matches_ml_dtypes(fmt, ml, n):
    x = boundary_inputs(fmt, ml, n)
    # ml_dtypes rounds to nearest even; E4M3 overflows to NaN, E5M2 to
    # infinity (no saturation), E2M1 saturates
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(getattr(ml_dtypes, ml)).astype(np.float64)
    got = quant.decode(quant.encode(x, fmt, saturate=(fmt == "e2m1")), fmt)
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not bad.any(), "first: %r -> %r, ml_dtypes %r" % (x[bad][0], got[bad][0], want[bad][0])


def test_saturation_and_nan():
    assert quant.decode(quant.encode([1e9, -1e9, 464.0, 465.0], "e4m3"), "e4m3").tolist() == \
        [448.0, -448.0, 448.0, 448.0]
    assert np.isnan(quant.decode(quant.encode([465.0, np.nan], "e4m3", saturate=False), "e4m3")).all()
    assert quant.encode([np.nan], "e4m3")[0] == 0x7f


def blocks_1xk(x, k):
    rows, cols = x.shape
    return x.reshape(rows, cols // k, k)


def test_deepseek_v3_act_vs_numpy():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 512)) * np.exp2(rng.integers(-4, 4, (16, 1)))).astype(np.float32)
    x[0, :128] = 0
    q, s = quant.quantize(x, "deepseek-v3-act")
    amax = np.abs(blocks_1xk(x, 128)).max(axis=2)
    sf = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)  # fp32 division
    y = np.clip(blocks_1xk(x, 128).astype(np.float64) / sf[..., None].astype(np.float64), -448, 448)
    want_q = y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(x.shape)
    assert np.array_equal(s.reshape(sf.shape), sf)
    assert np.array_equal(q.reshape(x.shape), want_q)
    assert quant.check(x, q, s, "deepseek-v3-act")["conformant"]


def test_mxfp4_vs_numpy():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((8, 256)) * 3).astype(np.float32)
    q, s = quant.quantize(x, "mxfp4")
    amax = np.abs(blocks_1xk(x, 32)).max(axis=2)
    e = np.frexp(amax)[1] - 1 - 2  # floor(log2 amax) - emax(E2M1)
    y = np.clip(blocks_1xk(x, 32).astype(np.float64) / np.exp2(e)[..., None], -6, 6)
    codes = y.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(-1) & 0xF
    assert np.array_equal(s.reshape(e.shape), (e + 127).astype(np.uint8))
    assert np.array_equal(q, (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8))


def test_check_names_pow2_after_quantize():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    amax = np.abs(blocks_1xk(x, 128)).max(axis=2)
    sf = (amax / np.float32(448)).astype(np.float32)
    # the bug: quantize with the fp32 scale, then round the scale up to 2^k
    y = np.clip(blocks_1xk(x, 128).astype(np.float64) / sf[..., None], -448, 448)
    q = y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(-1)
    bits = sf.view(np.uint32)
    codes = ((bits >> 23) + ((bits & 0x7FFFFF) != 0)).astype(np.uint8)
    s = np.stack([quant.pack_ue8m0(codes.reshape(4, 2)[i]) for i in range(4)])
    v = quant.check(x, q, s, "deepseek-v3-act-ue8m0")
    assert not v["conformant"] and v["variant"] == "pow2-after-quantize", v["verdict"]


def test_packing_round_trip():
    c = np.arange(16, dtype=np.uint8)
    assert np.array_equal(quant.unpack_fp4(quant.pack_fp4(c), 16), c)
    assert quant.pack_fp4([1, 2])[0] == 0x21
    w = quant.pack_ue8m0([1, 2, 3, 4, 5])
    assert w.view(np.uint32)[0] == 0x04030201 and w.view(np.uint32)[1] == 0x7F7F7F05
    assert np.array_equal(quant.unpack_ue8m0(w, 5), [1, 2, 3, 4, 5])
    assert quant.to_ml_dtypes(quant.encode([1.5], "e4m3"), "e4m3").astype(float)[0] == 1.5


def test_lowp_golden_out_is_exact(tmp_path):
    """The lowp-fp8-deepseek-v3 golden: its a_q follows the declared rule
    (dropless.quant.check), and out is the exact sum of the dequantized
    products rounded once to bf16 (fractions, independent of the engine)."""
    import fractions
    import os
    import subprocess
    h5py = pytest.importorskip("h5py")
    exe = os.path.join(os.environ.get("top_builddir", "."), "dropless")
    path = str(tmp_path / "g.h5")
    subprocess.run([exe, "lowp", "lowp-fp8-deepseek-v3", "-o", path], check=True)
    with h5py.File(path, "r") as f:
        g = f["lowp"]
        x, w, off, out = g["x"][()], g["w"][()], g["offsets"][()], g["out"][()]
        a_q, a_s, b_q, b_s = g["a_q"][()], g["a_s"][()], g["b_q"][()], g["b_s"][()]
    assert quant.check(x, a_q, a_s, "deepseek-v3-act")["conformant"]
    E, N, K = w.shape
    bq = b_q.reshape(E, N, K)
    bs = b_s.view(np.float32).reshape(E, N // 128, K // 128)
    da = quant.decode(a_q, "e4m3").reshape(x.shape) * np.repeat(a_s.view(np.float32).reshape(x.shape[0], -1), 128, axis=1)
    rng = np.random.default_rng(0)
    for _ in range(40):
        e = int(rng.choice([i for i in range(E) if off[i + 1] > off[i]]))
        m, n = int(rng.integers(off[e], off[e + 1])), int(rng.integers(0, N))
        db = quant.decode(bq[e, n], "e4m3") * np.repeat(bs[e, n // 128], 128)
        exact = sum(fractions.Fraction(float(p)) * fractions.Fraction(float(q)) for p, q in zip(da[m], db))
        # RN_bf16(exact) by comparing exact distances to the bf16 codes around it
        c = int(np.array([float(exact)], dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)[0])
        cands = [(c + d) & 0xFFFF for d in (-1, 0, 1)]
        vals = np.array(cands, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
        best = min(zip(vals, cands), key=lambda vc: (abs(fractions.Fraction(float(vc[0])) - exact), vc[1] & 1))
        want = best[0]
        assert out[m, n] == want, (m, n, out[m, n], want)


@pytest.mark.parametrize("family", ["lowp-fp8-deepseek-v3", "lowp-mxfp4-gpt-oss"])
def test_check_gemm_both_directions(family, tmp_path):
    """quant.check_gemm on a `dropless lowp` golden: its own out passes
    under every profile; one output moved by 2% fails under exact and fp32
    and is located; a NaN fails; a wrong shape is refused."""
    import os
    import subprocess
    h5py = pytest.importorskip("h5py")
    exe = os.path.join(os.environ.get("top_builddir", "."), "dropless")
    path = str(tmp_path / "g.h5")
    subprocess.run([exe, "lowp", family, "-o", path], check=True)
    with h5py.File(path, "r") as f:
        out = f["lowp"]["out"][()]
    for prof in ("exact", "fp32", "hopper"):
        v = quant.check_gemm(path, out, prof)
        assert v["conformant"] and v["checked"] == out.size and v["first"] is None, (prof, v)
    i, j = 7, 11
    bad = out.copy()
    bad[i, j] = bad[i, j] * 1.02 + 1e-3
    for prof in ("exact", "fp32"):
        v = quant.check_gemm(path, bad, prof)
        assert not v["conformant"] and v["failed"] == 1 and v["first"] == (i, j), (prof, v)
    bad[i, j] = np.nan
    assert not quant.check_gemm(path, bad, "hopper")["conformant"]
    with pytest.raises(ValueError):
        quant.check_gemm(path, out[:, :-1], "exact")
    with pytest.raises(ValueError):
        quant.check_gemm(path, out, "tf32")
