"""Fixed per-channel normalisation, stored in the model so checkpoints are self-contained.

Every model takes float images on the ``[0, 1]`` scale and normalises them here. Images on another
scale (0–255 floats, or images a caller normalised already) are accepted by the arithmetic but
shift every activation, silently: the shipped ``quadratic-fashion`` model fell from 92% to 75%
on 3000 Fashion-MNIST test images given as 0–255 floats. So in eval mode a model checks the range
of what it receives and warns, once per model (``ImageRangeWarning``). Training mode is not
checked: reading an image batch's minimum and maximum back to the host would hold up every
training step on a GPU, and attnconv's own training loop scales its images itself.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class ImageRangeWarning(UserWarning):
    """A model in eval mode received float images outside ``[0, 1]``."""


class Normalize(nn.Module):
    """``(x - mean) / std`` per channel with fixed (non-trainable) buffers.

    Input: float images ``(B, C, H, W)`` on the ``[0, 1]`` scale. Output: same shape.
    ``mean`` and ``std`` are saved in the ``state_dict``.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], in_channels: int) -> None:
        super().__init__()
        if len(tuple(mean)) != in_channels:
            raise ValueError(
                f"mean/std need one value per input channel: in_channels={in_channels}, "
                f"got mean={tuple(mean)} (pass mean=... and std=... with the channel count)"
            )
        mean_t = torch.as_tensor(tuple(mean), dtype=torch.float32)
        std_t = torch.as_tensor(tuple(std), dtype=torch.float32)
        if mean_t.ndim != 1 or mean_t.shape != std_t.shape or len(mean_t) == 0:
            raise ValueError(
                f"mean and std must be equal-length sequences of per-channel values, "
                f"got mean={tuple(mean)} and std={tuple(std)}"
            )
        if not all(float(value) > 0 for value in std):  # plain floats: also on the meta device
            raise ValueError(f"std must be positive per channel, got {tuple(std)}")
        self.register_buffer("mean", mean_t.view(-1, 1, 1))
        self.register_buffer("std", std_t.view(-1, 1, 1))
        self.range_warned = False  # ImageRangeWarning given: no more checks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and not self.range_warned and _has_values(x) and x.numel() > 0:
            low, high = (float(value) for value in torch.aminmax(x.detach()))
            if low < 0 or high > 1:
                self.range_warned = True
                warnings.warn(
                    f"the model received float images with values in [{low:.4g}, {high:.4g}]; it "
                    f"expects them in [0, 1] and normalises them itself (divide 0-255 images by "
                    f"255, and leave out any normalisation of your own). Warned once per model.",
                    ImageRangeWarning,
                    stacklevel=_caller_stacklevel(),
                )
        return (x - self.mean) / self.std


# Frames in these folders are the model's own: a warning names the first line outside them.
_MODEL_FOLDERS = (str(Path(torch.nn.modules.__file__).parent), str(Path(__file__).parent))


def _caller_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel`` (counted from ``Normalize.forward``) of the first frame
    outside ``torch.nn`` and ``attnconv.models``: the line that called the model."""
    level, frame = 2, sys._getframe(2)  # 0: this function, 1: forward, 2: what called forward
    while frame is not None and frame.f_code.co_filename.startswith(_MODEL_FOLDERS):
        level, frame = level + 1, frame.f_back
    return level


def _has_values(x: torch.Tensor) -> bool:
    """Whether ``x``'s values can be read: not a meta tensor, not inside a trace or compilation
    (where a data-dependent check would be frozen into the graph or break it)."""
    return x.device.type != "meta" and not (
        torch.jit.is_tracing()
        or torch.jit.is_scripting()
        or torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
    )


def check_images(x: torch.Tensor, in_channels: int, model_name: str) -> None:
    """Raise a ValueError unless ``x`` is a float batch ``(B, in_channels, H, W)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{model_name} expects a torch.Tensor of images, got {type(x).__name__}")
    if x.ndim != 4 or x.shape[1] != in_channels:
        raise ValueError(
            f"{model_name} expects images of shape (B, {in_channels}, H, W), got {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"{model_name} expects float images in [0, 1], got dtype {x.dtype} "
            f"(convert uint8 images with images.float() / 255)"
        )


def space_to_depth(x: torch.Tensor, factor: int) -> torch.Tensor:
    """The paper's invertible pooling: images ``(B, C, H, W)`` → ``(B, C·factor², H/factor,
    W/factor)`` (``F.pixel_unshuffle``, which returns an empty batch unchanged; here an empty
    batch gets the empty output of the right shape, still in the autograd graph)."""
    batch, channels, height, width = x.shape
    if batch == 0:
        return x.reshape(0, channels * factor**2, height // factor, width // factor)
    return F.pixel_unshuffle(x, factor)
