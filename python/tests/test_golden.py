"""The catalogue, goldens in memory, golden files, and their errors."""
import os
import subprocess

import numpy as np
import pytest

import dropless


def test_cases_catalogue():
    cs = dropless.cases()
    names = [c.name for c in cs]
    assert "mixtral-small" in names and "deepseek-v3-small-fp16" in names
    small = dropless.cases(large=False)
    assert all(not c.large for c in small) and len(small) < len(cs)
    assert {c.tier for c in cs} == {"vectors", "kernel", "layer"}
    assert [c.name for c in small] == [c.name for c in cs if c.tier == "vectors"]
    assert all(c.memory_bytes >= c.data_bytes > 0 for c in small if c.dims["T"])
    c = cs[names.index("deepseek-v3-small")]
    assert c.config["scaling"] == 2.5 and c.config["score_function"] == "sigmoid"
    assert c.dims["M"] == c.dims["T"] * c.dims["k"] and c.dims["P"] == c.dims["E"] + 1


def test_shared_experts_config_and_arrays(goldens):
    # the shared experts' keys exist only for the cases that have them
    by = {c.name: c for c in dropless.cases(large=False)}
    q, d, t = by["qwen2-moe-like"], by["deepseek-v3-shared-bf16"], by["tiny"]
    assert (q.config["shared_experts"], q.config["shared_ffn"], q.config["shared_gate"]) == (1, 32, 1)
    assert (d.config["shared_experts"], d.config["shared_gate"]) == (2, 0)
    assert "shared_experts" not in t.config and t.dims["S"] == 0 and q.dims["S"] == 32
    g = goldens("qwen2-moe-like-bf16")
    assert g.inputs["shared_w_gate"].shape == (g.dims["d"], 32)
    assert g.forward["shared_gate"].shape == (g.dims["T"],) and "d_shared_w_up" in g.backward
    assert g.dtype_of("shared_y") == "bf16" and g.dtype_of("shared_gate") == "fp32"
    assert "shared_gate" not in goldens("deepseek-v3-shared").forward
    assert not [n for n in goldens("mixtral-small").stages() if "shared" in n]


def test_generate_arrays(goldens):
    g = goldens("mixtral-small-bf16")
    assert g.case == "mixtral-small-bf16" and g.config["dtype"] == "bf16" and g.has_backward
    assert set(g.inputs) == {"x", "router_weight", "w_gate", "w_up", "w_down", "d_out"}
    assert "out" in g.forward and "d_x" in g.backward
    # inputs in their storage type (the router weight is fp32 in every case);
    # .fp32 the same values held exactly in float32
    x = g.inputs.fp32["x"]
    assert x.dtype == np.float32 and x.shape == (g.dims["T"], g.dims["d"])
    assert g.forward["topk_ids"].dtype == np.int32 and g.forward["group_sizes"].dtype == np.int64
    assert g.forward["out"].dtype == np.float32  # stage values: exact float32
    for st in (g.inputs, g.inputs.as_storage("ml_dtypes")):
        assert st["x"].dtype.name == "bfloat16" and st["router_weight"].dtype == np.float32
        assert np.array_equal(st["x"].astype(np.float32), x)
    assert g.dtype_of("h_gate") == "bf16" and g.dtype_of("topk_weights") == "fp32"
    # arrays are copies: writing one does not touch the golden
    x[0, 0] = 1e9
    assert g.inputs["x"][0, 0] != 1e9


def test_plain_layer_has_no_swiglu(goldens):
    g = goldens("plain-ffn")
    assert "h_gate" not in g.forward and "h_gate" not in g.stages() and "y_sorted" in g.stages()
    with pytest.raises(dropless.Error) as e:
        g.array("h_gate")
    assert e.value.name == "DL_ENOTFOUND" and "h_gate" in str(e.value)


def test_seed_and_case_file(tmp_path):
    a = dropless.generate("tiny", seed=5)
    b = dropless.generate("tiny", seed=5)
    c = dropless.generate("tiny")
    assert a.seed == 5 and np.array_equal(a.inputs["x"], b.inputs["x"])
    assert not np.array_equal(a.inputs["x"], c.inputs["x"])
    p = tmp_path / "my.case"
    p.write_text("name = my-case\ntokens = 6\nhidden = 8\nffn = 4\nexperts = 4\ntop_k = 2\n")
    g = dropless.generate(p)
    assert g.case == "my-case" and g.dims["T"] == 6 and "d_x" in g.backward
    p.write_text("name = bad\ntokens = -3\n")
    with pytest.raises(dropless.Error) as e:
        dropless.generate(str(p))
    assert str(p) in str(e.value) and e.value.code < 0


def test_unknown_case():
    with pytest.raises(dropless.Error) as e:
        dropless.generate("no-such-case")
    assert e.value.name == "DL_ENOTFOUND" and "no-such-case" in str(e.value)


def test_forward_only():
    g = dropless.generate("tiny", backward=False)
    assert not g.has_backward and len(g.backward) == 0 and "out" in g.forward


def test_save_load_same_bytes_as_cli(tmp_path, goldens, cli):
    g = goldens("deepseek-v3-small")
    p = tmp_path / "g.h5"
    g.save(p)
    with pytest.raises(dropless.Error) as e:
        g.save(p)
    assert e.value.name == "DL_EEXIST"
    subprocess.run([cli, "gen", "-q", "-d", str(tmp_path), "deepseek-v3-small"], check=True)
    assert p.read_bytes() == (tmp_path / "deepseek-v3-small.h5").read_bytes()
    h = dropless.load(p)
    for group in ("inputs", "forward", "backward"):
        for n in getattr(g, group):
            assert np.array_equal(getattr(h, group)[n], getattr(g, group)[n], equal_nan=True), n


def test_load_errors(tmp_path):
    with pytest.raises(dropless.Error) as e:
        dropless.load(tmp_path / "missing.h5")
    assert e.value.name == "DL_EIO" and "missing.h5" in str(e.value)
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not an hdf5 file" * 100)
    with pytest.raises(dropless.Error) as e:
        dropless.load(bad)
    assert e.value.name == "DL_EFORMAT" and "bad.h5" in str(e.value)


def test_closed_golden():
    g = dropless.generate("tiny")
    fw = g.forward
    with g:
        pass
    for use in (lambda: g.inputs["x"], lambda: fw["out"], lambda: g.save("/tmp/never.h5"),
                lambda: dropless.check(g, {"out": np.zeros((4, 4), np.float32)})):
        with pytest.raises(dropless.Error) as e:
            use()
        assert "closed" in str(e.value) and e.value.name == "DL_EINVAL"
    assert not os.path.exists("/tmp/never.h5")
    g.close()  # twice is harmless


def test_layout_is_the_cli_table(cli):
    out = subprocess.run([cli, "info", "--layout", "--json"], capture_output=True, text=True,
                         check=True).stdout
    import json
    assert dropless.layout() == json.loads(out)
    assert dropless.stage_names()[0] == "router_logits" and dropless.stage_names()[-1] == "d_x"


def test_torch_dtypes_on_request(goldens):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    g = goldens("mixtral-small-bf16")
    t = g.inputs.as_storage("torch")
    assert t["x"].dtype == torch.bfloat16 and t["router_weight"].dtype == torch.float32
