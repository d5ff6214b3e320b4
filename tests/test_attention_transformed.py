"""TransformedConv2d: exact against a dense float64 reference (an explicit softmax over every key
of the zero-extended input), forward and gradients; starts as the convolution blurred by the
spread; gates start shut and learn."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnconv.attention.transformed import TransformedConv2d
from attnconv.convert import conv_to_attention

F64 = torch.float64


def reference(layer: TransformedConv2d, x: torch.Tensor, margin: int = 40) -> torch.Tensor:
    """The layer's function written out: pad ``x`` as the convolution pads it and then by
    ``margin`` zeros, an explicit softmax of every head over every key pixel, the content
    attention of each head's map, the gated mixture, the per-group projection."""
    batch, channels, height, width = x.shape
    grid = F.pad(layer._pad(x), (margin,) * 4)
    out_h, out_w = layer.output_size(height, width)
    rows = torch.arange(out_h) * layer.stride[0] + layer.anchor[0] + margin
    cols = torch.arange(out_w) * layer.stride[1] + layer.anchor[1] + margin
    queries = torch.cartesian_prod(rows, cols).to(F64)
    keys = torch.cartesian_prod(torch.arange(grid.shape[2]), torch.arange(grid.shape[3])).to(F64)
    offsets = keys[None] - queries[:, None]  # (N_out, N_keys, 2)
    centers, spread = layer.position.centers, layer.position.spread
    distance = ((offsets[None] - centers[:, None, None, :]) ** 2).sum(-1)
    probs = torch.softmax(-0.5 * spread[:, None, None] ** 2 * distance, dim=-1)
    attended = torch.einsum("hqk,bck->bchq", probs, grid.flatten(2))
    if layer.gate is not None:
        if layer.gate_kind == "sigmoid":
            gates = 1 / (1 + torch.exp(-layer.gate))
        else:
            gates = layer.gate + (layer.gate.clamp(0, 1) - layer.gate).detach()
        content = layer.content_probs(x)[:, layer.content_map()]  # (B, heads, N_out, N)
        content = torch.einsum("bhqk,bck->bchq", content, x.flatten(2))
        attended = attended + gates[None, None, :, None] * (content - attended)
    taps = layer.weight.reshape(layer.out_channels, -1, layer.heads)
    groups = layer.groups
    cin, cout = channels // groups, layer.out_channels // groups
    y = torch.cat(
        [
            torch.einsum("och,bchq->boq", taps[g * cout : (g + 1) * cout],
                         attended[:, g * cin : (g + 1) * cin])
            for g in range(groups)
        ],
        dim=1,
    )  # fmt: skip
    if layer.bias is not None:
        y = y + layer.bias[None, :, None]
    return y.view(batch, -1, out_h, out_w)


# (in, out, kernel, stride, padding, dilation, groups, padding_mode, spread, content heads)
CONFIGS = [
    (6, 8, 3, 1, 1, 1, 1, "zeros", 3.0, 1),
    (6, 8, 3, 2, 1, 1, 2, "zeros", 1.0, 9),
    (4, 4, 3, 1, 2, 2, 4, "reflect", 2.0, 2),
    (3, 5, (3, 5), (2, 1), (1, 2), 1, 1, "circular", 0.7, 3),
    (4, 6, 1, 2, 0, 1, 1, "zeros", 4.0, 1),
    (4, 6, 2, 1, "same", 1, 1, "zeros", 1.5, 4),
    (4, 6, 3, 1, 0, 1, 1, "replicate", 0.5, 1),
]


def make(config, seed: int = 0, **start) -> tuple[nn.Conv2d, TransformedConv2d]:
    cin, cout, kernel, stride, padding, dilation, groups, mode, spread, maps = config
    torch.manual_seed(seed)
    conv = nn.Conv2d(cin, cout, kernel, stride, padding, dilation, groups, padding_mode=mode)
    conv = conv.double()
    layer = TransformedConv2d.from_conv(
        conv, spread=spread, content=True, content_heads=maps, **start
    )
    return conv, layer


@pytest.fixture(params=["kernel", "separable"])
def route(request, monkeypatch):
    """Both exact routes of the positional part (``TransformedConv2d._separable_pays`` picks one
    by the layer's and batch's sizes; the small layers here would always take the kernel's)."""
    monkeypatch.setattr(
        TransformedConv2d, "_separable_pays", lambda self, taps, pixels: request.param == "separable"
    )
    return request.param


@pytest.mark.parametrize("config", CONFIGS)
def test_exact_against_dense_reference_forward_and_gradients(config, route):
    conv, layer = make(config)
    with torch.no_grad():  # away from the start: moved heads, open, shut and clamped gates
        layer.gate.uniform_(-0.5, 1.3)
        layer.position.centers.add_(0.7 * torch.randn_like(layer.position.centers))
        layer.position.spread.mul_(0.5 + torch.rand_like(layer.position.spread))
    x = torch.randn(2, conv.in_channels, 9, 8, dtype=F64, requires_grad=True)
    out, ref = layer(x), reference(layer, x)
    assert out.shape == ref.shape
    assert (out - ref).abs().max() <= 1e-12 * ref.abs().max()
    weights = torch.randn_like(ref)
    params = [x, *layer.parameters()]
    grads = torch.autograd.grad((out * weights).sum(), params)
    expected = torch.autograd.grad((ref * weights).sum(), params)
    for got, want in zip(grads, expected, strict=True):  # the key bias's is zero: + 1e-14
        assert (got - want).abs().max() <= 1e-10 * want.abs().max() + 1e-14


@pytest.mark.parametrize("config", CONFIGS)
def test_starts_as_the_convolution_blurred_by_the_spread(config):
    """With shut gates the layer is the convolution whose kernel is each tap's weights spread by a
    normalised discrete Gaussian (conv2d over the zero-extended input, computed here by hand)."""
    conv, layer = make(config)
    x = torch.randn(2, conv.in_channels, 9, 8, dtype=F64)
    spread = float(layer.position.spread[0].detach())
    radius = 30  # e^{-½ s² r²} below 1e-40 at the smallest spread, 0.5
    taps = torch.arange(-radius, radius + 1, dtype=F64)
    bump = torch.exp(-0.5 * spread**2 * taps**2)
    bump = bump / bump.sum()  # the discrete Gaussian over every integer offset
    kh, kw = conv.kernel_size
    dh, dw = conv.dilation
    size = (dh * (kh - 1) + 2 * radius + 1, dw * (kw - 1) + 2 * radius + 1)
    blurred = torch.zeros(conv.out_channels, conv.in_channels // conv.groups, *size, dtype=F64)
    for i in range(kh):
        for j in range(kw):
            tap = conv.weight[:, :, i, j, None, None] * bump[:, None] * bump[None, :]
            blurred[:, :, i * dh : i * dh + 2 * radius + 1, j * dw : j * dw + 2 * radius + 1] += tap
    padded = F.pad(layer._pad(x), (radius, radius, radius, radius))
    expected = F.conv2d(padded, blurred.detach(), conv.bias, conv.stride, groups=conv.groups)
    with torch.no_grad():
        got = layer(x)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-12 * expected.abs().max()


@pytest.mark.parametrize("config", [c for c in CONFIGS if c[7] == "zeros"])
def test_a_large_spread_is_the_convolution_itself(config):
    conv, layer = make(config)
    with torch.no_grad():
        layer.position.spread.fill_(12.0)  # neighbours weigh e^-72 of the tap
    x = torch.randn(2, conv.in_channels, 9, 8, dtype=F64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using padding='same'")
        expected = conv(x)
    out = layer(x)
    assert (out - expected).abs().max() <= 1e-12 * expected.abs().max()
    weights = torch.randn_like(out)
    (g_layer,) = torch.autograd.grad((out * weights).sum(), layer.weight)
    (g_conv,) = torch.autograd.grad((expected * weights).sum(), conv.weight)
    assert (g_layer - g_conv).abs().max() <= 1e-12 * g_conv.abs().max()


def test_padded_grid_convention_agrees_inside_the_image():
    """Away from the border the zero-extended convention and convert's finite-spread
    AttentionConv (softmax over the padded image only) weigh the same keys; at the border they
    differ by the mass the Gaussian puts beyond the padding."""
    conv = nn.Conv2d(3, 4, 3, padding=1).double()
    layer = TransformedConv2d.from_conv(conv, spread=2.0, content=False)
    x = torch.randn(1, 3, 12, 12, dtype=F64)
    with torch.no_grad():
        ours, theirs = layer(x), conv_to_attention(conv, spread=2.0)(x)
    interior = (slice(None), slice(None), slice(4, 8), slice(4, 8))
    assert (ours[interior] - theirs[interior]).abs().max() <= 1e-12
    assert (ours - theirs).abs().max() > 1e-6  # the border is where the conventions part


def test_gates_start_shut_and_get_gradients():
    conv = nn.Conv2d(6, 6, 3, padding=1)
    layer = TransformedConv2d.from_conv(conv, spread=3.0)
    assert torch.equal(layer.gate, torch.zeros(9))
    x = torch.randn(2, 6, 7, 7)
    layer(x).square().sum().backward()
    for name in ("gate", "weight"):
        assert getattr(layer, name).grad.abs().sum() > 0, name
    assert layer.position.centers.grad.abs().sum() > 0
    assert layer.position.spread.grad.abs().sum() > 0
    # the queries and keys learn only once a gate opens (their product is weighted by it)
    assert layer.query.weight.grad.abs().sum() == 0
    with torch.no_grad():
        layer.gate.fill_(0.3)
    layer.zero_grad()
    layer(x).square().sum().backward()
    assert layer.query.weight.grad.abs().sum() > 0 and layer.key.weight.grad.abs().sum() > 0


def test_a_gate_pushed_below_zero_acts_shut_and_can_open_again():
    layer = TransformedConv2d(4, 4, 3, padding=((1, 1), (1, 1)), spread=3.0)
    with torch.no_grad():
        layer.gate.fill_(-0.2)
    assert torch.equal(layer.content_gates(), torch.zeros(9))
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        shut = layer(x)
        layer.gate.zero_()
        assert torch.equal(layer(x), shut)
        layer.gate.fill_(-0.2)
    layer(x).sum().backward()
    assert layer.gate.grad.abs().sum() > 0  # straight through the clamp


def test_no_grad_with_shut_gates_skips_the_content():
    layer = TransformedConv2d(4, 4, 3, padding=((1, 1), (1, 1)), spread=3.0)
    calls = []
    layer.query.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        layer(torch.randn(1, 4, 5, 5))
    assert calls == []
    layer(torch.randn(1, 4, 5, 5))
    assert calls == [1]


def test_bad_arguments_and_inputs_say_what_was_expected():
    with pytest.raises(ValueError, match="padding must be"):
        TransformedConv2d(3, 3, 3, padding=1)
    with pytest.raises(ValueError, match="spread must be a positive"):
        TransformedConv2d(3, 3, 3, spread=-1.0)
    with pytest.raises(ValueError, match="content_heads must be"):
        TransformedConv2d(3, 3, 3, content_heads=10)
    with pytest.raises(ValueError, match="divisible by groups"):
        TransformedConv2d(3, 4, 3, groups=2)
    with pytest.raises(TypeError, match=r"nn\.Conv2d"):
        TransformedConv2d.from_conv(nn.Conv1d(3, 3, 3))
    layer = TransformedConv2d(3, 4, 3)
    with pytest.raises(ValueError, match=r"expected input of shape \(B, 3, H, W\)"):
        layer(torch.randn(1, 2, 5, 5))
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        layer(torch.randn(1, 3, 2, 5))


def test_float32_stays_within_rounding_of_float64():
    _, layer = make(CONFIGS[0])
    with torch.no_grad():
        layer.gate.fill_(0.4)
    x = torch.randn(3, 6, 7, 7, dtype=F64)
    want = layer(x)
    got = layer.float()(x.float())
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()


def test_heads_sit_on_the_dilated_taps():
    layer = TransformedConv2d(2, 2, (3, 2), dilation=(2, 3))
    expected = [(r, c) for r in (-2, 0, 2) for c in (0, 3)]
    assert layer.position.centers.tolist() == [list(map(float, t)) for t in expected]
    assert math.isclose(float(layer.position.spread[0].detach()), 4.0)


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[1], CONFIGS[5]])
def test_attention_maps_are_the_reference_weights_on_the_image(config):
    """attention(x) gives, for each head and output pixel, the weight of each input pixel: the
    dense reference's attention restricted to the image (zero padding), so that applying it to
    the input and projecting gives the layer's output."""
    _, layer = make(config)
    with torch.no_grad():
        layer.gate.uniform_(0.0, 0.8)
        layer.position.centers.add_(0.5 * torch.randn_like(layer.position.centers))
    x = torch.randn(2, layer.in_channels, 9, 8, dtype=F64)
    maps = layer.attention(x)  # (B, heads, N_out, N)
    out_h, out_w = layer.output_size(9, 8)
    assert maps.shape == (2, layer.heads, out_h * out_w, 72)
    attended = torch.einsum("bhqk,bck->bchq", maps, x.flatten(2))
    taps = layer.weight.reshape(layer.out_channels, -1, layer.heads)
    groups, cin = layer.groups, layer.in_channels // layer.groups
    cout = layer.out_channels // groups
    y = torch.cat([torch.einsum("och,bchq->boq", taps[g * cout : (g + 1) * cout],
                                attended[:, g * cin : (g + 1) * cin]) for g in range(groups)], 1)
    y = y + layer.bias[None, :, None]
    with torch.no_grad():
        assert (y.view(2, -1, out_h, out_w) - layer(x)).abs().max() <= 1e-12
    assert (maps >= 0).all() and (maps.sum(-1) <= 1 + 1e-12).all()
    geometry = layer.head_geometry()
    assert torch.equal(geometry["gates"], layer.gate.clamp(0, 1))


@pytest.mark.parametrize("config", CONFIGS[:4])
def test_sigmoid_gates_and_mimetic_keys_exact_against_dense_reference(config, route):
    conv, layer = make(config, gate="sigmoid", opening=0.3, qk_init="mimetic")
    with torch.no_grad():
        layer.gate.add_(torch.randn_like(layer.gate))
    x = torch.randn(2, conv.in_channels, 9, 8, dtype=F64, requires_grad=True)
    out, ref = layer(x), reference(layer, x)
    assert (out - ref).abs().max() <= 1e-12 * ref.abs().max()
    with torch.no_grad():  # the content runs without autograd too (a sigmoid gate never shuts)
        assert (layer(x) - ref).abs().max() <= 1e-12 * ref.abs().max()
    weights = torch.randn_like(ref)
    params = [x, *layer.parameters()]
    grads = torch.autograd.grad((out * weights).sum(), params)
    expected = torch.autograd.grad((ref * weights).sum(), params)
    for got, want in zip(grads, expected, strict=True):
        assert (got - want).abs().max() <= 1e-10 * want.abs().max() + 1e-14


def _qk_gradient(layer: TransformedConv2d, x: torch.Tensor) -> float:
    """The norm of the queries' and keys' gradient after one backward on a fixed batch."""
    layer.zero_grad()
    out = layer(x)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return float(sum(p.grad.norm() for p in (*layer.query.parameters(), *layer.key.parameters())))


@pytest.mark.parametrize(
    "start",
    [
        {"gate": "sigmoid", "opening": 0.25},
        {"gate": "sigmoid", "opening": 0.25, "qk_init": "mimetic"},
        {"gate": "clamp", "opening": 0.1},
        {"gate": "clamp", "opening": 0.1, "qk_init": "mimetic"},
    ],
)
def test_every_open_start_trains_queries_and_keys_from_the_first_step(start):
    _, layer = make(CONFIGS[0], **start)
    x = torch.randn(2, 6, 7, 7, dtype=F64)
    assert _qk_gradient(layer, x) > 1e-3
    expected = start["opening"]
    assert torch.allclose(layer.content_gates(), torch.full((9,), expected, dtype=F64))


def test_the_first_form_passes_no_gradient_to_queries_and_keys():
    """Clamped gates at 0 (the first form): exactly zero q/k gradient, and a gate pushed below 0
    keeps it at zero: the defect that left tcnn-fashion-small's content maps uniform."""
    _, layer = make(CONFIGS[0])
    x = torch.randn(2, 6, 7, 7, dtype=F64)
    assert _qk_gradient(layer, x) == 0.0
    with torch.no_grad():
        layer.gate.fill_(-0.05)
    assert _qk_gradient(layer, x) == 0.0
    with torch.no_grad():
        layer.gate.fill_(0.05)
    assert _qk_gradient(layer, x) > 0.0


def test_a_sigmoid_gate_is_the_logistic_of_its_parameter_and_never_shuts():
    _, layer = make(CONFIGS[0], gate="sigmoid", opening=0.2)
    assert torch.allclose(layer.gate, torch.full((9,), math.log(0.2 / 0.8), dtype=F64))
    with torch.no_grad():
        layer.gate.copy_(torch.linspace(-30, 30, 9, dtype=F64))
    gates = layer.content_gates().detach()
    assert torch.allclose(gates, 1 / (1 + torch.exp(-layer.gate.detach())))
    assert float(gates.min()) > 0.0


def test_mimetic_queries_and_keys_are_one_scaled_orthonormal_projection():
    _, layer = make(CONFIGS[0], qk_init="mimetic", opening=0.0)  # 6 -> 4-wide maps
    wq, wk = layer.query.weight, layer.key.weight
    start = wq.detach().clone()
    assert torch.equal(wq, wk) and layer.query.bias.abs().max() == 0
    # drawn when the layer is built in float32, then cast: orthonormal to float32 rounding
    assert torch.allclose(wq @ wq.T, torch.eye(layer.qk_dim, dtype=F64), atol=1e-6)
    x = torch.rand(3, 6, 7, 7, dtype=F64)
    gain = layer.calibrate_mimetic(x, logit_std=2.0)
    assert gain > 0 and torch.allclose(layer.query.weight, gain * start)
    with torch.no_grad():
        logits, probs = layer._content_logits(x), layer.content_probs(x)
    assert abs(float(logits.std(dim=-1).mean()) - 2.0) < 1e-9
    # the calibrated map prefers some pixels: far from uniform (entropy ÷ log N = 1)
    entropy = -(probs * probs.log()).sum(-1).mean() / math.log(49)
    assert float(entropy) < 0.9


def test_bad_content_starts_say_what_was_expected():
    for start, message in (
        ({"gate": "relu"}, "gate must be one of clamp, sigmoid"),
        ({"qk_init": "xavier"}, "qk_init must be one of default, mimetic"),
        ({"gate": "sigmoid", "opening": 0.0}, r"sigmoid gate's opening must be in \(0, 1\)"),
        ({"gate": "clamp", "opening": 1.5}, r"opening must be in \[0, 1\]"),
        ({"opening": float("nan")}, r"opening must be in \[0, 1\]"),
    ):
        with pytest.raises(ValueError, match=message):
            make(CONFIGS[0], **start)


@pytest.mark.parametrize("spread", [1e-5, 1e-2, 0.3, 0.99, 1.0, 2.5, 40.0])
@pytest.mark.parametrize("center", [0.0, 0.37, -2.5, 7.9])
def test_the_normaliser_is_the_sum_over_every_integer_offset(spread, center):
    from attnconv.attention.transformed import axis_log_normaliser

    c = torch.tensor([center], dtype=F64, requires_grad=True)
    s = torch.tensor([spread], dtype=F64, requires_grad=True)
    radius = int(40 / spread) + 20
    n = torch.arange(-radius, radius + 1, dtype=F64)
    brute = torch.logsumexp(-0.5 * s**2 * (n - c) ** 2, dim=0)
    got = axis_log_normaliser(c, s)[0]
    assert abs(float(got - brute)) <= 1e-13 * max(1.0, abs(float(brute)))
    grads = torch.autograd.grad(got, (c, s))
    want = torch.autograd.grad(brute, (c, s))
    for g, w in zip(grads, want, strict=True):
        assert abs(float(g - w)) <= 1e-9 * max(1.0, abs(float(w)))


@pytest.mark.parametrize("spread", [1e-5, 1e-3, 0.05])
def test_a_tiny_spread_keeps_the_kernel_within_the_input_and_exact(spread, monkeypatch):
    """As training drives a spread towards zero the layer evaluates its Gaussians at no more
    offsets than reach the input (before, every offset within eps of the peak: 5.6e5 per axis at
    1e-5, and a layer slowed without limit), and each head's weights are the Gaussian over every
    integer offset, normalised exactly (a float64 sum over +-40/spread offsets by hand)."""
    import attnconv.attention.transformed as module

    evaluated = []
    logits = module.gaussian_axis_logits
    monkeypatch.setattr(
        module, "gaussian_axis_logits",
        lambda c, s, offsets: evaluated.append(offsets.numel()) or logits(c, s, offsets),
    )  # fmt: skip
    conv = nn.Conv2d(3, 2, 3, padding=1).double()
    layer = TransformedConv2d.from_conv(conv, spread=spread, content=False)
    spread = float(layer.position.spread[0])  # as float32 rounded it (the kernel scales with it)
    height, width = 6, 5
    kernel, (first_row, first_col) = layer.positional_kernel(height, width, F64)
    assert kernel.shape[2] <= 2 * (height + 2) and kernel.shape[3] <= 2 * (width + 2)
    assert evaluated and max(evaluated) <= 2 * (height + 2)
    radius = int(40 / spread) + 20
    n = torch.arange(-radius, radius + 1, dtype=F64)
    centers = layer.position.centers.detach()
    expected = torch.zeros_like(kernel)
    rows = torch.arange(first_row, first_row + kernel.shape[2], dtype=F64)
    cols = torch.arange(first_col, first_col + kernel.shape[3], dtype=F64)
    taps = conv.weight.detach().reshape(2, 3, 9)
    for h in range(9):
        axes = []
        for axis, offsets in ((0, rows), (1, cols)):
            z = torch.exp(-0.5 * spread**2 * (n - centers[h, axis]) ** 2).sum()
            axes.append(torch.exp(-0.5 * spread**2 * (offsets - centers[h, axis]) ** 2) / z)
        expected += taps[:, :, h, None, None] * axes[0][:, None] * axes[1][None, :]
    assert (kernel - expected).abs().max() <= 1e-12 * expected.abs().max()
    x = torch.randn(2, 3, height, width, dtype=F64)
    assert layer(x).shape == (2, 2, height, width)


def test_the_separable_route_is_taken_where_it_pays():
    wide = TransformedConv2d(512, 512, 3, padding=((1, 1), (1, 1)), spread=3.0, content=False)
    assert wide._separable_pays(25, 8 * 16) and not wide._separable_pays(9, 8 * 16)
    narrow = TransformedConv2d(36, 36, 3, padding=((1, 1), (1, 1)), spread=3.0, content=False)
    assert not narrow._separable_pays(25, 100 * 49)
