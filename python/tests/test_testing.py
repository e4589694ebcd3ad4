"""assert_conformant's messages, a fused out-only kernel caught dropping a
token, and the pytest plugin (option, fixture, JUnit properties)."""
import numpy as np
import pytest

import dropless
from dropless.testing import assert_conformant
from conftest import stage_values


def fused_out(g, drop=None, dtype=np.float64):
    """A fused kernel returning only `out`: gathers the experts' outputs per
    token without storing any stage; drop=(token, slot) loses one
    assignment, as a capacity-limited kernel would."""
    c = g.config
    T, k, d = c["tokens"], c["top_k"], c["hidden"]
    fw = g.forward  # the kernel's routing and expert outputs equal the golden's here
    y = fw["y_sorted"].astype(dtype)[fw["inv_perm"]].reshape(T, k, d)
    w = fw["topk_weights"].astype(dtype)
    if drop:
        w[drop] = 0
    out = np.einsum("tkd,tk->td", y, w)
    return {"out": out.astype(np.float32) if c["dtype"] == "fp32" else
            out.astype({"bf16": __import__("ml_dtypes").bfloat16, "fp16": np.float16}[c["dtype"]])}


@pytest.mark.parametrize("case", ["mixtral-small", "deepseek-v3-small-bf16", "grouped-max-fp16"])
def test_fused_out_only_dropping_a_token(goldens, case):
    g = goldens(case)
    assert_conformant(g, fused_out(g))
    with pytest.raises(AssertionError) as e:
        assert_conformant(g, fused_out(g, drop=(3, 1)))
    msg = str(e.value)
    assert "NOT conformant" in msg and "zero_drops" in msg and "(3, 1)" in msg
    assert "worst out[3, " in msg  # the located worst element


def test_fused_out_only_fp32_arithmetic(goldens):
    # fp32 accumulation of the combine: within the stage's own bound today
    g = goldens("mixtral-small")
    assert_conformant(g, fused_out(g, dtype=np.float32))


def test_assert_message_locates_worst(goldens):
    g = goldens("mixtral-small")
    vals = stage_values(g)
    vals["d_w_up"] = vals["d_w_up"].copy()
    vals["d_w_up"][5, 2, 7] += 3.0
    with pytest.raises(AssertionError) as e:
        assert_conformant(g, vals)
    assert "d_w_up numerics FAIL" in str(e.value) and "worst d_w_up[5, 2, 7]" in str(e.value)
    r = assert_conformant(g, stage_values(g))
    assert r.conformant


def test_plugin(pytester):
    pytester.makepyfile(test_k="""
        import numpy as np
        from dropless.testing import assert_conformant

        def test_out(dropless_golden):
            assert_conformant(dropless_golden, {"out": dropless_golden.forward["out"]})

        def test_broken(dropless_golden):
            out = dropless_golden.forward["out"]
            out[0, 0] += 10
            assert_conformant(dropless_golden, {"out": out})
    """)
    from importlib.metadata import entry_points
    eps = entry_points()
    eps = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    # from a checkout the plugin is not installed: name it
    args = [] if any(e.name == "dropless" for e in eps) else ["-p", "dropless.pytest_plugin"]
    res = pytester.runpytest_inprocess(*args, "--dropless-cases=tiny,mixtral-small-bf16",
                                       "--junitxml=out.xml", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2, failed=2)
    xml = (pytester.path / "out.xml").read_text()
    assert 'name="dropless.verdict" value="PASS"' in xml and 'value="FAIL"' in xml
    assert 'name="dropless.case" value="mixtral-small-bf16"' in xml
    assert "test_out[tiny]" in xml
    kernel = pytester.runpytest_inprocess(*args, "--dropless-cases=kernel", "--collect-only", "-q",
                                          "-p", "no:cacheprovider")
    names = "\n".join(kernel.outlines)
    kernel_tier = [c.name for c in dropless.cases() if c.tier == "kernel"]
    assert kernel_tier and all("test_out[%s]" % n in names for n in kernel_tier)
    assert "test_out[mixtral-small]" not in names
