"""dropless.check: every dtype and array type accepted, refusals as
Errors (never a crash), options, both directions of the verdict."""
import ml_dtypes
import numpy as np
import pytest

import dropless
from conftest import perturbed, stage_values

BF16 = ml_dtypes.bfloat16


def ok(g, outputs, **kw):
    r = dropless.check(g, outputs, **kw)
    assert r.conformant, r.explain()
    return r


def test_both_directions(goldens):
    for name in ("mixtral-small", "deepseek-v3-small-bf16", "plain-ffn-fp16", "ties"):
        g = goldens(name)
        r = ok(g, stage_values(g))
        assert r.counts["FAIL"] == 0 and r.counts["PASS"] > 20
        for stage in ("router_logits", "y_sorted", "d_w_down", "d_x"):
            bad = stage_values(g)
            bad[stage] = perturbed(bad[stage], by=0.5)
            r = dropless.check(g, bad)
            assert not r.conformant and any(c.stage == stage for c in r.failures), (name, stage)
        ids = stage_values(g, ["topk_ids"])
        ids["topk_ids"] = (ids["topk_ids"] + 1) % g.dims["E"]
        assert not dropless.check(g, ids).conformant


@pytest.mark.parametrize("make", [
    lambda a, st: a,                                  # float32 holding bf16 values
    lambda a, st: a.astype(BF16) if st == "bf16" else a,  # ml_dtypes bfloat16
    lambda a, st: a.astype(np.float64),               # float64 holding bf16 values
    lambda a, st: np.asfortranarray(a),               # not C-contiguous
    lambda a, st: a.astype(">f4"),                    # big-endian
    lambda a, st: a.tolist(),                         # nested lists (float64)
], ids=["f32", "bf16", "f64", "fortran", "bigendian", "list"])
def test_float_dtypes_bf16_case(goldens, make):
    g = goldens("mixtral-small-bf16")
    ok(g, {n: make(a, g.dtype_of(n)) for n, a in stage_values(g, ["h_gate", "y_sorted", "out", "d_x",
                                                                   "router_scores"]).items()})


def test_fp16_stage_as_float16(goldens):
    g = goldens("mixtral-small-fp16")
    ok(g, {n: a.astype(np.float16) for n, a in stage_values(g, ["h_act", "out", "d_x"]).items()})


@pytest.mark.parametrize("dt", [np.int32, np.int64, np.int16, np.uint8, np.uint64, np.uint32])
def test_integer_dtypes(goldens, dt):
    g = goldens("mixtral-small")
    ok(g, {n: a.astype(dt) for n, a in stage_values(g, ["topk_ids", "sort_perm", "inv_perm",
                                                          "group_sizes", "group_offsets"]).items()})


class DLPackOnly:
    """An array known only through the DLPack protocol."""
    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class ArrayOnly:
    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


def test_protocol_objects(goldens):
    g = goldens("deepseek-v3-small")
    vals = stage_values(g, ["out", "d_x", "topk_ids"])
    ok(g, {n: DLPackOnly(a) for n, a in vals.items()})
    ok(g, {n: ArrayOnly(a) for n, a in vals.items()})


def test_jax_arrays(goldens):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    for case, dt in (("mixtral-small", jnp.float32), ("mixtral-small-bf16", jnp.bfloat16),
                     ("mixtral-small-fp16", jnp.float16)):
        g = goldens(case)
        vals = stage_values(g, ["h_gate", "out", "d_x", "topk_ids", "group_sizes"])
        outs = {n: jnp.asarray(a, dtype=dt) if a.dtype == np.float32 and g.dtype_of(n) != "fp32"
                else jnp.asarray(a) for n, a in vals.items()}
        assert outs["out"].dtype == dt
        ok(g, outs)


def test_torch_tensors(goldens):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    g = goldens("mixtral-small-bf16")
    st = {n: torch.from_numpy(np.array(a)) for n, a in stage_values(g, ["h_gate", "out", "d_x",
                                                                        "topk_ids"]).items()}
    for n in ("h_gate", "out", "d_x"):
        st[n] = st[n].to(torch.bfloat16).requires_grad_()
    ok(g, st)
    ok(g, {n: t.to(torch.float64) if t.is_floating_point() else t for n, t in st.items()})
    if torch.cuda.is_available():
        ok(g, {n: t.cuda() for n, t in st.items()})


def test_cupy_arrays(goldens):
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    g = goldens("mixtral-small")
    ok(g, {n: cp.asarray(a) for n, a in stage_values(g, ["out", "d_x"]).items()})


def test_wrong_shape_names_stage_and_shapes(goldens):
    g = goldens("mixtral-small")
    with pytest.raises(dropless.Error) as e:
        dropless.check(g, {"out": g.forward["out"][:, :-1]})
    assert e.value.name == "DL_ESHAPE"
    assert "out" in str(e.value) and "[32, 15]" in str(e.value) and "[32, 16]" in str(e.value)
    with pytest.raises(dropless.Error):
        dropless.check(g, {"out": g.forward["out"].reshape(-1)})
    with pytest.raises(dropless.Error):
        dropless.check(g, {"out": np.float32(1.0)})


@pytest.mark.parametrize("stage,value", [
    ("out", lambda a: a.astype(bool)),
    ("out", lambda a: a.astype(np.complex64)),
    ("out", lambda a: a.astype(np.int32)),             # integers for a float stage
    ("topk_ids", lambda a: a.astype(np.float32)),      # floats for an integer stage
    ("out", lambda a: a.astype(object)),
    ("out", lambda a: "not an array"),
    ("out", lambda a: a.astype(np.float64) + 0.1),     # float64 values that are not float32 values
    ("topk_ids", lambda a: a.astype(np.int64) + 2 ** 40),  # outside int32
    ("out", lambda a: None),
], ids=["bool", "complex", "int-for-float", "float-for-int", "object", "str", "f64-off-f32",
        "int32-range", "None"])
def test_wrong_dtype(goldens, stage, value):
    g = goldens("mixtral-small")
    with pytest.raises(dropless.Error) as e:
        dropless.check(g, {stage: value(g.forward[stage])})
    assert stage in str(e.value) and e.value.code < 0


def test_nan_is_a_finding(goldens):
    g = goldens("mixtral-small-bf16")
    out = g.forward["out"]
    out[2, 3] = np.nan
    r = dropless.check(g, {"out": out})
    assert not r.conformant
    row = [c for c in r.failures if c.stage == "out"][0]
    assert row.n_nonfinite == 1


def test_unknown_and_input_names(goldens):
    g = goldens("plain-ffn")
    for name, code in (("outt", "DL_ENOTFOUND"), ("x", "DL_ENOTFOUND"), ("tie_margin", "DL_ENOTFOUND"),
                       ("h_gate", "DL_ENOTFOUND")):  # h_gate: a plain layer has none
        with pytest.raises(dropless.Error) as e:
            dropless.check(g, {name: np.zeros(3, np.float32)})
        assert e.value.name == code and name in str(e.value)
    ok(g, {"forward/out": g.forward["out"], "/backward/d_x": g.backward["d_x"]})  # dataset paths


def test_options(goldens):
    g = goldens("mixtral-small")
    vals = stage_values(g)
    assert dropless.check(g, vals, profile="tf32").profile == "tf32"
    for bad in (dict(profile="fp33"), dict(no_such_option=1), dict(max_listed=-1),
                dict(stages="nonsense"), dict(isolated="h_gate;nope"), dict(profile="a\nb")):
        with pytest.raises(dropless.Error) as e:
            dropless.check(g, vals, **bad)
        assert e.value.name == "DL_EINVAL"
    bad = dict(vals, out=perturbed(vals["out"]))
    assert dropless.check(g, bad, stages=["router_logits", "h_gate"]).conformant
    assert not dropless.check(g, bad, diagnose_drops=False, max_listed=2).conformant
    with pytest.raises(TypeError):
        dropless.check("mixtral-small", vals)
    with pytest.raises(TypeError):
        dropless.check(g, [1, 2, 3])


def test_isolated(goldens):
    g = goldens("mixtral-small")
    iso = stage_values(g, ["h_gate", "h_up", "h_act", "y_sorted"])
    ok(g, iso, isolated=True)
    ok(g, iso, isolated=[["h_gate", "h_up"], ["h_act"], ["y_sorted"]])
    ok(g, iso, isolated="h_gate,h_up;h_act;y_sorted")
    # a group must name provided stages, and every provided stage is in a group
    for spec in ([["h_gate", "h_up"], ["h_act"]], "h_gate,h_up;h_act;y_sorted;out"):
        with pytest.raises(dropless.Error) as e:
            dropless.check(g, iso, isolated=spec)
        assert e.value.name == "DL_EINVAL"
    # isolated: h_act judged on the golden h_gate/h_up, not on a broken h_gate
    broken = dict(iso, h_gate=perturbed(iso["h_gate"], by=4.0))
    r = dropless.check(g, broken, isolated=True)
    assert [c.stage for c in r.failures] == ["h_gate"]


def test_strict_storage(goldens):
    g = goldens("mixtral-small-bf16")
    h = g.forward["h_gate"] * np.float32(1 + 2 ** -12)  # off the bf16 grid, inside the bound
    ok(g, {"h_gate": h})
    r = dropless.check(g, {"h_gate": h}, strict_storage=True)
    assert not r.conformant and r.failures[0].stage == "h_gate"
    ok(g, {"h_gate": g.forward["h_gate"]}, strict_storage=True)


def test_report_formats(goldens):
    g = goldens("tiny")
    r = ok(g, stage_values(g))
    assert str(r) == r.table() and r.table().startswith("dropless check: case tiny")
    assert "SKIP" not in r.table() or True
    import json
    assert json.loads(r.to_json())["case"] == "tiny"
    assert r.to_junit().startswith("<?xml") and "<testsuite" in r.to_junit()
    assert bool(r) and repr(r).startswith("<dropless.Report tiny")
    only = dropless.check(g, {"out": g.forward["out"]})
    assert "skipped (not provided)" in only.table() and "SKIP" in only.table(all=True)


def test_to_numpy(goldens):
    g = goldens("mixtral-small-bf16")
    a = g.forward["out"].astype(BF16)
    assert dropless.to_numpy(a).dtype == a.dtype and dropless.to_numpy(DLPackOnly(g.forward["out"])).dtype == np.float32
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    b = dropless.to_numpy(jnp.asarray(a))
    assert b.dtype.name == "bfloat16" and np.array_equal(b.astype(np.float32), g.forward["out"])


def test_report_plot(goldens, tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot", reason="matplotlib is not installed")
    g = goldens("mixtral-small")
    vals = stage_values(g)
    vals["d_w_up"] = vals["d_w_up"].copy()
    vals["d_w_up"][5, 2, 7] += 3.0
    r = dropless.check(g, vals)
    fig = r.plot(tmp_path / "r.png")
    png = (tmp_path / "r.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert "d_w_up (expert 5)" in labels  # the failing element's expert
    bars = {lab: p for lab, p in zip(labels, fig.axes[0].patches)}
    assert bars["d_w_up (expert 5)"].get_height() > 1  # over the PASS bound
    plt.close(fig)


def record_progress():
    """A progress callable and the list of its (stage, done) calls."""
    calls = []
    return calls, lambda stage, done: calls.append((stage, done))


def assert_progress_run(calls):
    """One non-decreasing run in [0, 1], stage values named, one final ("done", 1.0)."""
    stages = set(dropless.stage_names())
    done = [d for _, d in calls]
    assert len(calls) >= 3 and done == sorted(done), calls
    assert 0.0 <= done[0] and calls[-1] == ("done", 1.0), calls
    assert [s for s, _ in calls].count("done") == 1, calls
    assert all(isinstance(s, str) and s for s, _ in calls)
    assert all(s in stages for s, _ in calls[:-1]), calls


@pytest.mark.parametrize("isolated", [None, True], ids=["chained", "isolated"])
def test_check_progress_both_directions(goldens, isolated):
    # the callback is called as the check goes, monotonically, and the
    # verdicts do not depend on it: the golden's own values pass with it,
    # a defective candidate still fails with it
    g = goldens("mixtral-small")
    good = stage_values(g, ["h_gate", "h_up", "h_act", "y_sorted", "out", "d_x"])
    calls, cb = record_progress()
    r = dropless.check(g, good, isolated=isolated, progress=cb)
    assert r.conformant, r.explain()
    assert_progress_run(calls)
    names = {c.stage for c in r.checks}
    assert {"h_gate", "out", "d_x"} <= {s for s, _ in calls} and "out" in names
    bad = dict(good, out=perturbed(good["out"], by=0.5))
    calls, cb = record_progress()
    r2 = dropless.check(g, bad, isolated=isolated, progress=cb)
    assert not r2.conformant and any(c.stage == "out" for c in r2.failures)
    assert_progress_run(calls)
    plain = dropless.check(g, bad, isolated=isolated)
    assert [(c.stage, c.check, c.verdict) for c in plain.checks] == \
        [(c.stage, c.check, c.verdict) for c in r2.checks]


@pytest.mark.parametrize("exc", [ValueError, KeyboardInterrupt])
def test_check_progress_exception(goldens, exc):
    # an exception in the callback cannot cross the C frames: it ends the
    # calls and check() raises it (no Report, no "Exception ignored" noise),
    # and the library is fine afterwards
    g = goldens("mixtral-small")
    vals = stage_values(g, ["h_gate", "y_sorted", "out"])
    seen = []

    def boom(stage, done):
        seen.append(stage)
        if len(seen) == 2:
            raise exc("stop at %s" % stage)
    with pytest.raises(exc, match="stop at"):
        dropless.check(g, vals, progress=boom)
    assert len(seen) == 2  # not called again after raising
    calls, cb = record_progress()
    assert dropless.check(g, vals, progress=cb).conformant
    assert_progress_run(calls)
    with pytest.raises(TypeError, match="progress"):
        dropless.check(g, vals, progress=3)


def test_check_progress_bar(goldens):
    import io
    g = goldens("mixtral-small")
    buf = io.StringIO()
    assert dropless.check(g, stage_values(g, ["out"]), progress=dropless.progress_bar(buf))
    assert buf.getvalue().endswith("100% done      \n")


def test_generate_progress_exception():
    seen = []

    def boom(phase, done):
        seen.append(phase)
        raise RuntimeError("no more")
    with pytest.raises(RuntimeError, match="no more"):
        dropless.generate("tiny", progress=boom)
    assert len(seen) == 1
