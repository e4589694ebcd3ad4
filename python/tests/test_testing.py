"""assert_conformant's messages, a fused out-only kernel caught dropping a
token, and the pytest plugin (option, fixture, JUnit properties)."""
import numpy as np
import pytest

import dropless
from dropless.testing import assert_conformant
from conftest import plugin_args, stage_values


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
    args = plugin_args()
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


def test_case_selection():
    from dropless.pytest_plugin import case_names
    small = case_names("small")
    bf16_swiglu = case_names("small:bf16,swiglu")
    assert bf16_swiglu and all(n in small and n.endswith("-bf16") and "plain" not in n
                               for n in bf16_swiglu)
    assert set(case_names("small:plain")) == {"plain-ffn", "plain-ffn-bf16", "plain-ffn-fp16"}
    # two words of one kind: either; of two kinds: both
    assert set(case_names("small:bf16,fp16,plain")) == {"plain-ffn-bf16", "plain-ffn-fp16"}
    assert "deepseek-v3-small" in case_names("small:sigmoid")
    assert "mixtral-small" not in case_names("small:sigmoid")
    assert case_names("tiny,mixtral-small-bf16:bf16") == ["mixtral-small-bf16"]
    with pytest.raises(pytest.UsageError, match="unknown filter bf61"):
        case_names("small:bf61")


def test_markers_and_dtype_fixture(pytester):
    pytester.makepyfile(test_k="""
        import pytest

        @pytest.mark.dropless_cases("swiglu")
        def test_swiglu(dropless_golden):
            assert dropless_golden.config["ffn_kind"] == "swiglu"

        @pytest.mark.dropless_cases("plain,fp16")
        def test_plain(dropless_golden):
            assert dropless_golden.case == "plain-ffn-fp16"

        def test_dtypes(dropless_golden_dtype):
            g = dropless_golden_dtype
            x = g.inputs["x"]
            assert str(x.dtype) == {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[g.config["dtype"]]
            assert str(g.inputs.fp32["x"].dtype) == "float32"
    """)
    r = pytester.runpytest_inprocess(*plugin_args(), "--dropless-cases=tiny,plain-ffn,plain-ffn-fp16",
                                     "-v", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=5)
    out = r.stdout.str()
    assert "test_swiglu[tiny]" in out and "test_plain[plain-ffn-fp16]" in out
    assert "test_dtypes[bf16]" in out and "test_dtypes[fp16]" in out
