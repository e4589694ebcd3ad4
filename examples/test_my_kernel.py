"""Validates the numpy MoE layer of my_moe.py (and, where PyTorch is
installed, the same layer in torch) over the small catalogue, forward and
backward: `pytest examples/` (cases: --dropless-cases=small|kernel|NAMES)."""
import pytest
from dropless.testing import assert_conformant
from my_moe import moe_backward, moe_forward


# my_moe implements the SwiGLU and plain FFNs: the catalogue's FFN variants
# (gpt-oss's swiglu-clamp with biases, geglu-tanh) are other layers
@pytest.mark.dropless_cases("swiglu,plain")
def test_numpy_layer(dropless_golden):
    g = dropless_golden
    fwd = moe_forward(g.config, **g.inputs)
    assert_conformant(g, {**fwd, **moe_backward(g.config, g.inputs, fwd)})


@pytest.mark.dropless_cases("swiglu,plain")
def test_torch_layer(dropless_golden):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from my_moe_torch import moe_layer
    assert_conformant(dropless_golden, moe_layer(dropless_golden))
