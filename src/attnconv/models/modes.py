"""Running a model in eval mode for a while, whatever mode it was in."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode (no dropout, batch norm on its running statistics) for the
    ``with`` block, then give every submodule back its own training flag, also after an exception.

    Restoring each submodule's flag, not ``model.train(previous)``, keeps a part that was frozen in
    eval mode inside a training model frozen.
    """
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training
