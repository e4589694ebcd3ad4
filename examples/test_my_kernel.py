"""Validates the numpy MoE layer of my_moe.py (and, where PyTorch is
installed, the same layer in torch) over the small catalogue, forward and
backward: `pytest examples/` (cases: --dropless-cases=small|kernel|NAMES)."""
import pytest
import dropless
from dropless.testing import assert_conformant
from my_moe import moe_backward, moe_forward


def known_issues(g, request):  # `dropless check` itself exits 2 on T = 0 goldens today
    if g.config["tokens"] == 0:
        request.applymarker(pytest.mark.xfail(raises=dropless.Error, strict=True,
                                              reason="dl_check_run: DL_EINVAL for T = 0"))


def test_numpy_layer(dropless_golden, request):
    g = dropless_golden
    known_issues(g, request)
    fwd = moe_forward(g.config, **g.inputs)
    assert_conformant(g, {**fwd, **moe_backward(g.config, g.inputs, fwd)})


def test_torch_layer(dropless_golden, request):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from my_moe_torch import moe_layer
    known_issues(dropless_golden, request)
    assert_conformant(dropless_golden, moe_layer(dropless_golden))
