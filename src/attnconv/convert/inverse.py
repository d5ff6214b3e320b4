r"""The other direction: the convolution a position-only attention layer computes.

A position-only layer's logits depend on the offset $\delta = k - q$ only, so away from the image
border its probabilities are a fixed kernel $K^h(\delta)$ (the softmax over all offsets) and the
layer is the convolution $\sum_h M_h K^h$ with $M_h = W^h_\text{out} W^h_\text{val}$ ``(Dout, Din)``
($W_\text{val} = I$ when the heads read the raw input). Near the border the softmax renormalises
over the pixels inside the
image: where a head loses kernel mass $m^h_q$ past the border its probabilities are
$K^h / (1 - m^h_q)$ instead of $K^h$. [`border_mass`][] returns ``m``; pixels where it is zero for
every head are where the layer equals the convolution exactly.

Offsets cover ``−(H−1)..(H−1)`` by ``−(W−1)..(W−1)``: every offset an ``H×W`` image has. Kernels
are centred: offset ``(0, 0)`` sits at index ``(kh // 2, kw // 2)``, so
``F.conv2d(x, kernel, padding=(kh // 2, kw // 2))`` applies them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnconv.attention import MultiHeadSelfAttention2d
from attnconv.convert.theorem import AttentionConv


def offset_probabilities(layer: MultiHeadSelfAttention2d, height: int, width: int) -> Tensor:
    """Each head's attention over offsets ``(heads, 2H−1, 2W−1)``, as for an interior query.

    The softmax runs over all offsets of an ``H×W`` image, with the layer's rules: separable
    scores (``gaussian``, ``learned``, hard) normalise the row and the column term separately,
    probabilities below ``sqrt(tiny)`` are exactly zero, hard heads split ties equally.
    """
    _check_layer(layer, height, width)
    return layer.position.offset_probs(height, width)


def head_mixing(layer: MultiHeadSelfAttention2d) -> Tensor:
    """``M_h = W^h_out W^h_val``, ``(heads, Dout, Din)``: how head ``h`` maps input to output channels."""
    _check_type(layer)
    heads, head_dim = layer.heads, layer.head_dim
    out = layer.out.weight.view(layer.out_dim, heads, head_dim).transpose(0, 1)
    if layer.value is None:
        return out
    return out @ layer.value.weight.view(heads, head_dim, layer.dim)


def effective_bias(layer: MultiHeadSelfAttention2d) -> Tensor:
    """``(Dout,)``: the output bias plus each head's value bias through its output block."""
    _check_type(layer)
    bias = (
        layer.out.bias if layer.out.bias is not None else layer.out.weight.new_zeros(layer.out_dim)
    )
    if layer.value is None or layer.value.bias is None:
        return bias
    out = layer.out.weight.view(layer.out_dim, layer.heads, layer.head_dim)
    return bias + torch.einsum("ohd,hd->o", out, layer.value.bias.view(layer.heads, -1))


def attention_to_conv(
    layer: MultiHeadSelfAttention2d | AttentionConv,
    height: int | None = None,
    width: int | None = None,
    crop: bool = False,
) -> Tensor:
    """Effective convolution kernel of a position-only attention layer on ``H×W`` images.

    Args:
        layer: a position-only ``MultiHeadSelfAttention2d`` (no content scores), or an
            [`AttentionConv`][] made by ``conv_to_attention``.
        height, width: image size ``H×W`` (required for a layer; for an ``AttentionConv`` they
            default to the smallest image holding its tap offsets).
        crop: cut the kernel to the smallest centred window outside which it is exactly zero.
    Returns:
        For a layer: ``(Dout, Din, 2H−1, 2W−1)`` (or the cropped centred window), offset ``(0, 0)``
        at the centre: ``F.conv2d(x, kernel, effective_bias(layer), padding=(kh // 2, kw // 2))``
        equals the layer (channels first) on pixels where [`border_mass`][] is zero.
        For an ``AttentionConv``: the convolution kernel (its conv's shape) read back from
        its attention layer (probabilities times output weights at each tap's offset, diagonal group
        blocks), equal to the original convolution's for hard attention.
    """
    if isinstance(layer, AttentionConv):
        return _conv_kernel(layer, height, width)
    if height is None or width is None:
        raise ValueError("attention_to_conv(layer, H, W) needs the image size H and W")
    _check_layer(layer, height, width)
    kernel = torch.einsum(
        "hoi,huv->oiuv", head_mixing(layer), offset_probabilities(layer, height, width)
    )
    if not crop:
        return kernel
    support = kernel.detach().abs().amax(dim=(0, 1)) > 0  # (2H−1, 2W−1)
    rows, cols = support.nonzero(as_tuple=True)
    if rows.numel() == 0:
        return kernel[:, :, height - 1 : height, width - 1 : width]
    r = int((rows - (height - 1)).abs().max())
    c = int((cols - (width - 1)).abs().max())
    return kernel[:, :, height - 1 - r : height + r, width - 1 - c : width + c]


def border_mass(layer: MultiHeadSelfAttention2d, height: int, width: int) -> Tensor:
    r"""Kernel mass each head loses past the image border, per query pixel: ``(heads, H, W)``.

    $m^h_q = \sum_{q + \delta \text{ outside the image}} K^h(\delta)$: 0 where the head's whole
    kernel lies inside the image (there the layer is the convolution), 1 where none of it does.
    Where $m^h_q < 1$ the layer's head $h$ is the convolution with $K^h$ divided by $1 - m^h_q$.
    """
    probs = offset_probabilities(layer, height, width)  # (heads, 2H−1, 2W−1)
    outside = torch.ones(
        1, 1, 3 * height - 2, 3 * width - 2, dtype=probs.dtype, device=probs.device
    )
    outside[:, :, height - 1 : 2 * height - 1, width - 1 : 2 * width - 1] = 0.0
    return F.conv2d(outside, probs[:, None])[0]


def _conv_kernel(module: AttentionConv, height: int | None, width: int | None) -> Tensor:
    """The kernel of a converted convolution (the conv's shape), read from its attention layer."""
    (kh, kw), (dh, dw) = module._kernel, module._dilation
    height = (kh - 1) * dh + 1 if height is None else height
    width = (kw - 1) * dw + 1 if width is None else width
    layer = module.attention
    centers = layer.position.centers.detach().round().long()  # (heads, 2) tap offsets
    if ((centers[:, 0].abs() > height - 1) | (centers[:, 1].abs() > width - 1)).any():
        raise ValueError(
            f"an image of {height}x{width} does not hold the tap offsets "
            f"{centers.tolist()}; use a larger height/width"
        )
    full = attention_to_conv(layer, height, width)  # (out, in, 2H−1, 2W−1)
    taps = full[:, :, centers[:, 0] + height - 1, centers[:, 1] + width - 1]  # (out, in, heads)
    out_channels, in_channels = full.shape[:2]
    g = module.groups
    blocks = taps.reshape(g, out_channels // g, g, in_channels // g, kh * kw)
    diagonal = blocks.diagonal(dim1=0, dim2=2).permute(3, 0, 1, 2)  # (g, out/g, in/g, heads)
    return diagonal.reshape(module.weight.shape)


def _check_type(layer: object) -> None:
    if not isinstance(layer, MultiHeadSelfAttention2d):
        raise TypeError(f"expected a MultiHeadSelfAttention2d, got {type(layer).__name__}")


def _check_layer(layer: object, height: int, width: int) -> None:
    _check_type(layer)
    if not layer.position_only:
        raise ValueError(
            "the effective convolution needs a position-only layer (no content scores); this "
            "layer's attention depends on the image"
        )
    for name, n in (("height", height), ("width", width)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    layer.position.check_size(height, width)
