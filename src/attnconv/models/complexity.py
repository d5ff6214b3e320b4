"""Model size and cost: parameter counts and forward multiply-adds per image."""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from attnconv.models.modes import evaluating


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (buffers such as the normalisation constants excluded)."""
    return sum(param.numel() for param in model.parameters())


def count_macs(model: nn.Module, image_size: tuple[int, int] | None = None) -> int:
    """Multiply-adds of one forward pass on one image, as this implementation executes it.

    Counts the matrix products and convolutions that run (``FlopCounterMode`` FLOPs / 2) in eval
    mode for a batch of one image ``(1, model.in_channels, H, W)``, ``(H, W) = image_size`` or
    ``model.image_size``. Elementwise work (softmax, norms, activations) is not counted. For
    position-only attention the count is that of the fast path: $h N (H + W) d$ for the separable
    scores (isotropic Gaussian, learned), $h N^2 d$ for ``gaussian_full`` ($h$ heads of width $d$,
    $N = HW$ tokens). With content scores: $h N^2 d$ for the logits and as many for the weighted
    sum, the logits' product ``H + W`` wider where content × position is folded into it
    (``attention/content.py``).

    The forward runs on the meta device: for the call, the parameters and buffers are swapped
    for tensors of the same shapes that hold no data (the model is not copied or changed), so no
    arithmetic is done and a 10-GMAC model is counted in well under a second.
    """
    height, width = model.image_size if image_size is None else image_size
    tensors = itertools.chain(
        model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False)
    )
    shapes = {name: torch.empty_like(tensor, device="meta") for name, tensor in tensors}
    images = torch.empty(1, model.in_channels, height, width, device="meta")
    with (
        evaluating(model),
        torch.no_grad(),
        FlopCounterMode(display=False) as counter,
    ):
        functional_call(model, shapes, (images,))
    return counter.get_total_flops() // 2
