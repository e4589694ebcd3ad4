"""The FFN variants' configuration keys (issue 26): ffn_kind swiglu-clamp
with act_alpha and act_limit, geglu-tanh, and router_dtype, as the
catalogue, goldens and case files give them to Python; a wrong activation
fails the check, the golden's own values pass."""
import ml_dtypes
import numpy as np
import pytest

import dropless


def test_catalogue_exposes_variant_keys():
    cs = {c.name: c for c in dropless.cases(large=False)}
    g = cs["gpt-oss-like-bf16"].config
    assert g["ffn_kind"] == "swiglu-clamp" and g["act_alpha"] == 1.702 and g["act_limit"] == 7
    assert g["router_dtype"] == "bf16" and g["dtype"] == "bf16" and g["ffn_bias"] == 1
    assert cs["geglu-tanh"].config["ffn_kind"] == "geglu-tanh"
    assert cs["geglu-tanh"].config["router_dtype"] == "fp16"
    # cases without the variants keep their keys as before
    assert "act_alpha" not in cs["mixtral-small"].config
    assert "router_dtype" not in cs["mixtral-small"].config
    assert "ffn_bias" not in cs["mixtral-small"].config


def test_biases_and_their_gradients(goldens):
    g = goldens("gpt-oss-like")
    E, d, f = g.dims["E"], g.dims["d"], g.dims["f"]
    assert g.inputs["b_gate"].shape == (E, f) and g.inputs["b_down"].shape == (E, d)
    assert g.backward["d_b_up"].shape == (E, f) and g.backward["d_b_down"].shape == (E, d)
    # d_b_down[e] is the column sum of expert e's rows of d_y_sorted
    off, dy = g.forward["group_offsets"], g.backward["d_y_sorted"].astype(np.float64)
    want = np.stack([dy[off[e]:off[e + 1]].sum(0) for e in range(E)])
    assert np.allclose(g.backward["d_b_down"], want, rtol=1e-6, atol=1e-6)
    assert "b_gate" not in goldens("mixtral-small").inputs


def test_router_weight_in_its_storage_type(goldens):
    g = goldens("gpt-oss-like")
    assert g.dtype_of("router_weight") == "bf16" and g.dtype_of("x") == "fp32"
    w = g.inputs["router_weight"]
    assert w.dtype.name == "bfloat16"
    w32 = g.inputs.fp32["router_weight"]
    assert np.array_equal(w.astype(np.float32), w32)


@pytest.mark.parametrize("name", ["gpt-oss-like-bf16", "geglu-tanh-fp16"])
def test_golden_passes_wrong_activation_fails(goldens, name):
    g = goldens(name)
    fw = g.forward
    assert dropless.check(g, {"h_act": fw["h_act"]}).conformant
    # plain SwiGLU on the variant's h_gate and h_up: a real kernel's mistake
    hg, hu = fw["h_gate"].astype(np.float64), fw["h_up"].astype(np.float64)
    grid = ml_dtypes.bfloat16 if g.config["dtype"] == "bf16" else np.float16
    wrong = (hg / (1 + np.exp(-hg)) * hu).astype(grid).astype(np.float32)  # on the case's grid
    r = dropless.check(g, {"h_act": wrong})
    assert not r.conformant and "h_act" in str(r) and "FAIL" in str(r)


def test_case_file_keys(tmp_path):
    p = tmp_path / "oai.case"
    p.write_text("base = tiny\nffn_kind = swiglu-clamp\nact_limit = 3\nrouter_dtype = fp16\n")
    g = dropless.generate(str(p).encode())
    try:
        assert g.config["act_limit"] == 3 and g.config["act_alpha"] == 1.702
        assert g.config["router_dtype"] == "fp16"
    finally:
        g.close()
    p.write_text("base = tiny\nact_limit = 3\n")
    with pytest.raises(dropless.Error):
        dropless.generate(str(p).encode())
