"""evaluating(): eval mode inside the block, every submodule's own flag back afterwards."""

import pytest
import torch
from torch import nn

from attnconv.models.modes import evaluating


def net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4))


def flags(model: nn.Module) -> list[bool]:
    return [module.training for module in model.modules()]


def test_eval_inside_and_mixed_modes_restored():
    model = net()
    model[2].eval()  # a frozen batch norm inside a training model
    with evaluating(model) as inside:
        assert inside is model and flags(model) == [False] * 4
        x = torch.ones(8, 4)
        assert torch.equal(model(x), model(x))  # no dropout
    assert flags(model) == [True, True, True, False]


def test_restored_after_an_exception_and_from_eval():
    model = net()
    with pytest.raises(RuntimeError), evaluating(model):
        raise RuntimeError("inside")
    assert flags(model) == [True] * 4
    model.eval()
    with evaluating(model):
        pass
    assert flags(model) == [False] * 4


def test_batch_norm_statistics_untouched():
    model = net()
    before = model[2].running_mean.clone()
    with evaluating(model):
        model(torch.randn(8, 4))
    assert torch.equal(model[2].running_mean, before)
