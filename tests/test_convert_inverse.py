"""attention_to_conv: a position-only attention layer as a convolution, and the round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnconv import MultiHeadSelfAttention2d, attention_to_conv, conv_to_attention
from attnconv.convert import border_mass, effective_bias, head_mixing, offset_probabilities

F64 = torch.float64


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def random_layer(
    positional: str,
    seed: int,
    head_dim: int = 2,
    spreads: tuple[float, ...] = (1.2, 0.8, 1.6),
    **kwargs,
) -> MultiHeadSelfAttention2d:
    """A double layer with a value projection, value and output biases, random geometry
    (isotropic Gaussians get the inverse std ``spreads``)."""
    torch.manual_seed(seed)
    layer = MultiHeadSelfAttention2d(
        3, 3, head_dim=head_dim, positional=positional, out_dim=4, **kwargs
    ).double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(torch.randn(p.shape, dtype=F64) * (2.0 if name == "position.centers" else 0.5))
        if positional == "gaussian":
            layer.position.spread.copy_(torch.tensor(spreads, dtype=F64))
    return layer


def layer_channels_first(layer: MultiHeadSelfAttention2d, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return layer(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def per_head_convs(layer, x, height, width) -> torch.Tensor:
    """``(heads, B, Dout, H, W)``: each head's convolution with its kernel ``M_h ⊗ K_h``."""
    probs = offset_probabilities(layer, height, width)
    mixing = head_mixing(layer)
    return torch.stack(
        [
            F.conv2d(x, mixing[h][:, :, None, None] * probs[h], padding=(height - 1, width - 1))
            for h in range(layer.heads)
        ]
    )


@pytest.mark.parametrize(
    ("positional", "kwargs"),
    [
        ("gaussian", {}),
        ("gaussian_full", {}),
        ("learned", {"max_size": 7}),
        ("gaussian", {"head_dim": 3}),  # no value projection: heads read the raw input
    ],
)
def test_layer_is_its_convolution_renormalised_at_the_border(positional, kwargs):
    """layer(x) = b + Σ_h conv_h(x) / (1 − m_h) at every pixel, with m = border_mass."""
    head_dim = kwargs.pop("head_dim", 2)
    layer = random_layer(positional, seed=3, head_dim=head_dim, **kwargs)
    assert (layer.value is None) == (head_dim == 3)
    height, width = 6, 7
    x = torch.randn(2, 3, height, width, dtype=F64)
    mass = border_mass(layer, height, width)  # (heads, H, W)
    assert mass.shape == (3, height, width) and bool((mass > 0).all() and (mass < 1).all())
    expected = (per_head_convs(layer, x, height, width) / (1 - mass[:, None, None])).sum(0)
    expected = expected + effective_bias(layer)[:, None, None]
    # Dividing by 1 − m (down to ~1e-3 here) amplifies float64 rounding: 1e-10, not 1e-12.
    assert rel(layer_channels_first(layer, x), expected) <= 1e-10


def test_interior_pixels_are_exactly_the_convolution():
    """Large spreads: probabilities past ~26.6/s pixels are exactly zero, so the kernel has finite
    support; where it fits inside the image the layer is the convolution exactly, elsewhere not."""
    layer = random_layer("gaussian", seed=4, spreads=(6.0, 8.0, 10.0))
    with torch.no_grad():
        layer.position.centers.copy_(
            torch.tensor([[0.0, 0.0], [1.3, -0.7], [-1.0, 2.0]], dtype=F64)
        )
    height, width = 16, 15
    kernel = attention_to_conv(layer, height, width)
    assert kernel.shape == (4, 3, 2 * height - 1, 2 * width - 1)
    x = torch.randn(2, 3, height, width, dtype=F64)
    as_conv = F.conv2d(x, kernel, effective_bias(layer), padding=(height - 1, width - 1))
    out = layer_channels_first(layer, x)
    interior = (border_mass(layer, height, width) == 0).all(dim=0)
    assert 0 < int(interior.sum()) < height * width
    assert rel(out[:, :, interior], as_conv[:, :, interior]) <= 1e-13
    assert rel(out[:, :, ~interior], as_conv[:, :, ~interior]) > 1e-6
    # The cropped kernel is the centred window holding all the non-zero taps.
    cropped = attention_to_conv(layer, height, width, crop=True)
    kh, kw = cropped.shape[-2:]
    assert kh % 2 == 1 and kw % 2 == 1 and kh < 2 * height - 1 and kw < 2 * width - 1
    r, c = kh // 2, kw // 2
    window = kernel[:, :, height - 1 - r : height + r, width - 1 - c : width + c]
    assert torch.equal(cropped, window)
    outside = kernel.detach().clone()
    outside[:, :, height - 1 - r : height + r, width - 1 - c : width + c] = 0.0
    assert outside.abs().max() == 0  # nothing outside the window
    edges = (window[:, :, [0, -1]].abs().sum(), window[:, :, :, [0, -1]].abs().sum())
    assert max(edges) > 0  # and the window is no larger than needed
    assert rel(F.conv2d(x, cropped, effective_bias(layer), padding=(r, c))[:, :, interior],
               out[:, :, interior]) <= 1e-13  # fmt: skip


def test_border_mass_of_hard_heads_marks_where_the_target_pixel_leaves_the_image():
    layer = MultiHeadSelfAttention2d(2, 3, positional="gaussian", hard=True).double()
    centers = [[1.0, 0.0], [-2.0, 3.0], [0.4, -1.2]]  # the last rounds to (0, −1)
    with torch.no_grad():
        layer.position.centers.copy_(torch.tensor(centers, dtype=F64))
    height, width = 4, 5
    mass = border_mass(layer, height, width)
    for h, (d1, d2) in enumerate([(1, 0), (-2, 3), (0, -1)]):
        for q1 in range(height):
            for q2 in range(width):
                inside = 0 <= q1 + d1 < height and 0 <= q2 + d2 < width
                assert mass[h, q1, q2].item() == (0.0 if inside else 1.0)


def test_border_mass_matches_a_numpy_gaussian():
    layer = random_layer("gaussian", seed=5, spreads=(0.9, 1.4, 0.6))
    height, width = 5, 6
    mass = border_mass(layer, height, width).detach().numpy()
    centers = layer.position.centers.detach().numpy()
    spread = layer.position.spread.detach().numpy()
    d1, d2 = np.arange(-(height - 1), height), np.arange(-(width - 1), width)
    for h in range(3):
        r = np.exp(-0.5 * spread[h] ** 2 * (d1 - centers[h, 0]) ** 2)
        c = np.exp(-0.5 * spread[h] ** 2 * (d2 - centers[h, 1]) ** 2)
        kernel = np.outer(r / r.sum(), c / c.sum())
        for q1 in range(height):
            for q2 in range(width):
                inside = kernel[
                    height - 1 - q1 : 2 * height - 1 - q1, width - 1 - q2 : 2 * width - 1 - q2
                ]
                assert abs(mass[h, q1, q2] - (1 - inside.sum())) < 1e-14


ROUND_TRIP = [
    (nn.Conv2d, {"kernel_size": 3, "padding": 1}),
    (nn.Conv2d, {"kernel_size": (2, 4), "stride": 2, "dilation": (3, 1)}),
    (nn.Conv2d, {"kernel_size": 3, "groups": 2, "padding": "same", "padding_mode": "circular"}),
    (nn.Conv2d, {"kernel_size": 5, "groups": 4, "bias": False}),  # depthwise (out 4)
    (nn.Conv1d, {"kernel_size": 4, "dilation": 2, "groups": 2}),
]


@pytest.mark.parametrize(("cls", "spec"), ROUND_TRIP, ids=[str(s) for _, s in ROUND_TRIP])
@pytest.mark.parametrize("spread", [None, 30.0], ids=["hard", "s=30"])
def test_round_trip_gives_back_the_kernel(cls, spec, spread):
    torch.manual_seed(0)
    out_channels = 4 if spec.get("groups") == 4 else 6
    conv = cls(4, out_channels, **spec).double()
    module = conv_to_attention(conv, spread)
    recovered = attention_to_conv(module)
    assert recovered.shape == conv.weight.shape
    assert rel(recovered, conv.weight.detach()) <= 1e-15


def test_converted_layer_kernel_is_the_dilated_block_diagonal_kernel():
    torch.manual_seed(1)
    conv = nn.Conv2d(4, 2, 3, dilation=2, groups=2).double()
    layer = conv_to_attention(conv).attention
    kernel = attention_to_conv(layer, 6, 6, crop=True)
    expected = torch.zeros(2, 4, 5, 5, dtype=F64)
    expected[0, :2, ::2, ::2] = conv.weight[0].detach()
    expected[1, 2:, ::2, ::2] = conv.weight[1].detach()
    assert torch.equal(kernel, expected)
    # An even kernel's query is its top-left tap: offsets 0..1, inside a centred 3×3 window.
    even = nn.Conv2d(1, 1, 2, bias=False).double()
    kernel = attention_to_conv(conv_to_attention(even).attention, 3, 3, crop=True)
    assert torch.equal(kernel[0, 0, 1:, 1:], even.weight[0, 0].detach())
    assert kernel[0, 0, 0].abs().sum() == 0 and kernel[0, 0, :, 0].abs().sum() == 0


def test_bad_input_raises_clear_errors():
    content = MultiHeadSelfAttention2d(2, 2, positional="gaussian", content=True)
    with pytest.raises(ValueError, match="position-only"):
        attention_to_conv(content, 4, 4)
    learned = MultiHeadSelfAttention2d(2, 2, positional="learned", max_size=5)
    with pytest.raises(ValueError, match="max_size=5"):
        attention_to_conv(learned, 6, 4)
    with pytest.raises(ValueError, match="needs the image size"):
        attention_to_conv(learned)
    with pytest.raises(ValueError, match="height must be a positive int"):
        attention_to_conv(learned, 0, 4)
    with pytest.raises(TypeError, match="MultiHeadSelfAttention2d, got Conv2d"):
        attention_to_conv(nn.Conv2d(2, 2, 3), 4, 4)
    with pytest.raises(ValueError, match="does not hold the tap offsets"):
        attention_to_conv(conv_to_attention(nn.Conv2d(1, 1, 5)), 2, 5)
