"""Mixed precision as the engine applies it (dmls/training/precision.py)."""

import pytest
import torch
from torch import nn

from dmls.training.models import CourseCNN
from dmls.training.precision import Autocast, PrecisionProbe, convert_to_float8


def test_fp8_converts_the_linear_layers_it_can_with_the_pinned_torchao():
    """torchao is a requirement (envs/requirements.txt): fp8 runs out of the box where the GPU
    has fp8 tensor cores; on any host the layers convert."""
    model = CourseCNN((3, 32, 32), 10, (16, 32), 256, 0.0, True, "relu")
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    # The hidden layer converts; the 10-class output does not (10 is no multiple of 16).
    assert convert_to_float8(model) == 1
    kinds = [type(m).__name__ for m in model.modules() if isinstance(m, nn.Linear)]
    assert kinds == ["Float8Linear", "Linear"] and len(linears) == 2


def test_no_fp8_eligible_layer_is_an_error():
    with pytest.raises(ValueError, match="no Linear layer has both dimensions divisible by 16"):
        convert_to_float8(nn.Sequential(nn.Linear(10, 3)))


def test_the_probe_sees_what_the_first_layer_really_computed_in():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    probe = PrecisionProbe(model)
    with Autocast("cpu", torch.bfloat16, cache_enabled=True)():
        model(torch.ones(2, 4))
    model(torch.ones(2, 4))  # the hook removed itself after the first training forward
    assert probe.effective == "bf16"
    with Autocast("cpu", None, cache_enabled=True)():
        assert not torch.is_autocast_enabled("cpu")
