"""conv_to_attention (Theorem 1): exact against PyTorch's own convolutions, forward and backward."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnconv import MultiHeadSelfAttention2d, conv_to_attention
from attnconv.convert import AttentionConv
from attnconv.convert.theorem import SUPPORTED_PADDING_MODES, KernelToOutWeight

F64, F32 = torch.float64, torch.float32
TOL = {F64: 1e-12, F32: 1e-5}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a − b| / max |b|``; the plain difference when ``b`` is all zeros."""
    scale, diff = b.abs().max().item(), (a - b).abs().max().item()
    return diff / scale if scale > 0 else diff


def run_conv(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():  # PyTorch's note on its even-kernel padding="same" copy
        warnings.filterwarnings("ignore", message="Using padding='same'")
        return conv(x)


def assert_same_function(conv: nn.Module, module: nn.Module, x: torch.Tensor, seed: int = 0):
    """Forward and the gradients w.r.t. input, kernel and bias agree within the dtype's tolerance."""
    tol = TOL[x.dtype]
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ref, out = run_conv(conv, x1), module(x2)
    assert out.shape == ref.shape and out.is_contiguous()
    assert rel(out.detach(), ref.detach()) <= tol
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
    (ref * g).sum().backward()
    (out * g).sum().backward()
    assert rel(x2.grad, x1.grad) <= tol
    assert module.weight.grad.shape == conv.weight.shape
    assert rel(module.weight.grad, conv.weight.grad) <= tol
    if conv.bias is not None:
        assert rel(module.bias.grad, conv.bias.grad) <= tol


# Every configuration the issue names, each a (conv class, kwargs, input spatial shape).
CONFIGS = [
    (nn.Conv2d, {"kernel_size": 3, "padding": 1}, (8, 9)),
    (nn.Conv2d, {"kernel_size": 1, "bias": False}, (5, 4)),
    (nn.Conv2d, {"kernel_size": 2}, (6, 7)),  # even, no padding
    (nn.Conv2d, {"kernel_size": 4, "padding": "same"}, (7, 6)),  # even "same": asymmetric pad
    (nn.Conv2d, {"kernel_size": (2, 5), "stride": (2, 1), "padding": (1, 2)}, (9, 8)),
    (nn.Conv2d, {"kernel_size": (1, 3), "padding": "valid"}, (4, 6)),
    (nn.Conv2d, {"kernel_size": 5, "stride": 2, "padding": 4}, (7, 8)),  # pad > kernel radius
    (nn.Conv2d, {"kernel_size": 3, "dilation": 2, "padding": 2}, (8, 8)),
    (nn.Conv2d, {"kernel_size": (4, 2), "dilation": (3, 2), "padding": "same"}, (9, 7)),
    (nn.Conv2d, {"kernel_size": 3, "stride": 3, "dilation": 2, "padding": 1}, (10, 11)),
    (nn.Conv2d, {"kernel_size": 3, "padding": 1, "padding_mode": "circular"}, (6, 7)),
    (nn.Conv2d, {"kernel_size": 4, "padding": "same", "padding_mode": "circular"}, (6, 5)),
    (
        nn.Conv2d,
        {"kernel_size": 3, "stride": 2, "padding": (2, 1), "padding_mode": "circular"},
        (5, 6),
    ),
    (nn.Conv2d, {"kernel_size": 3, "padding": 1, "groups": 2}, (6, 6)),
    (nn.Conv2d, {"kernel_size": 3, "padding": 1, "groups": 4, "bias": False}, (6, 5)),  # depthwise
    (nn.Conv2d, {"kernel_size": 5, "stride": 2, "padding": 2, "groups": 4, "out": 8}, (9, 9)),
    (nn.Conv1d, {"kernel_size": 3, "padding": 1}, (11,)),
    (nn.Conv1d, {"kernel_size": 4, "padding": "same", "dilation": 3}, (13,)),
    (nn.Conv1d, {"kernel_size": 5, "stride": 2, "groups": 2, "bias": False}, (14,)),
    (nn.Conv1d, {"kernel_size": 2, "padding": 3, "padding_mode": "circular", "groups": 4}, (9,)),
    (nn.Conv2d, {"kernel_size": 3, "padding": 2, "padding_mode": "reflect"}, (5, 6)),
    (nn.Conv2d, {"kernel_size": (3, 4), "padding": "same", "padding_mode": "replicate"}, (4, 6)),
    (nn.Conv1d, {"kernel_size": 3, "stride": 2, "padding": 2, "padding_mode": "reflect"}, (7,)),
]


def make_conv(cls, spec, dtype, seed=0, in_channels=4):
    spec = dict(spec)
    out_channels = spec.pop("out", 6 if spec.get("groups", 1) in (1, 2) else in_channels)
    torch.manual_seed(seed)
    return cls(in_channels, out_channels, **spec).to(dtype)


def make_input(cls, size, dtype, seed=1, in_channels=4, batch=2):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, in_channels, *size, generator=generator, dtype=dtype)


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize(("cls", "spec", "size"), CONFIGS, ids=[str(c[1]) for c in CONFIGS])
def test_hard_attention_is_the_convolution(cls, spec, size, dtype):
    conv = make_conv(cls, spec, dtype)
    module = conv_to_attention(conv)
    assert isinstance(module, AttentionConv)
    assert module.heads == math.prod(conv.kernel_size)
    assert_same_function(conv, module, make_input(cls, size, dtype))


@pytest.mark.parametrize(
    ("cls", "spec", "size"), CONFIGS[::3], ids=[str(c[1]) for c in CONFIGS[::3]]
)
def test_attention_layer_paths_give_the_convolution(cls, spec, size):
    """The layer's own forwards (hard separable and dense reference) agree with the conv too."""
    conv = make_conv(cls, spec, F64)
    module = conv_to_attention(conv)
    x = make_input(cls, size, F64)
    module.attention.impl = "dense"  # the module then runs the layer's dense N×N path
    assert_same_function(conv, module, x)
    # The layer's separable path, driven by hand: pad as the conv does, take the query pixels.
    module.attention.impl = "auto"
    x2 = x.unsqueeze(2) if cls is nn.Conv1d else x
    (top, bottom), (left, right) = module._pads
    mode = module._pad_mode
    padded = F.pad(x2, (left, right, top, bottom), mode=mode)
    y = module.attention(padded.permute(0, 2, 3, 1))
    (a, b), (sh, sw) = module._anchor, module._stride
    ref = run_conv(conv, x)
    ref2 = ref.unsqueeze(2) if cls is nn.Conv1d else ref
    y = y[:, a::sh, b::sw][:, : ref2.shape[2], : ref2.shape[3]].permute(0, 3, 1, 2)
    assert rel(y, ref2) <= 1e-12


@st.composite
def conv_configs(draw):
    one_d = draw(st.booleans())
    kh = 1 if one_d else draw(st.integers(1, 4))
    kw = draw(st.integers(1, 5))
    sh, sw = (1 if one_d else draw(st.integers(1, 3))), draw(st.integers(1, 3))
    dh, dw = (1 if one_d else draw(st.integers(1, 3))), draw(st.integers(1, 3))
    in_channels = draw(st.sampled_from([1, 2, 4]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4) if in_channels % g == 0]))
    out_channels = groups * draw(st.integers(1, 2))
    mode = draw(st.sampled_from(list(SUPPORTED_PADDING_MODES)))
    choices = ["ints", "valid"] + (["same"] if (sh, sw) == (1, 1) else [])
    kind = draw(st.sampled_from(choices))
    ph, pw = (0 if one_d else draw(st.integers(0, 3))), draw(st.integers(0, 3))
    padding = {"ints": (pw,) if one_d else (ph, pw), "valid": "valid", "same": "same"}[kind]
    # Input at least as large as the dilated kernel needs (and as the circular padding wraps).
    need_h = max(dh * (kh - 1) + 1, ph + 1 if kind == "ints" else 1, dh * (kh - 1))
    need_w = max(dw * (kw - 1) + 1, pw + 1 if kind == "ints" else 1, dw * (kw - 1))
    height = 1 if one_d else need_h + draw(st.integers(0, 3))
    width = need_w + draw(st.integers(0, 3))
    kwargs = {
        "kernel_size": (kw,) if one_d else (kh, kw),
        "stride": (sw,) if one_d else (sh, sw),
        "dilation": (dw,) if one_d else (dh, dw),
        "padding": padding,
        "groups": groups,
        "bias": draw(st.booleans()),
        "padding_mode": mode,
    }
    size = (width,) if one_d else (height, width)
    return (nn.Conv1d if one_d else nn.Conv2d), in_channels, out_channels, kwargs, size


@settings(max_examples=60, deadline=None)
@given(conv_configs(), st.integers(0, 2**16))
def test_random_configurations_are_exact_in_float64(config, seed):
    cls, in_channels, out_channels, kwargs, size = config
    torch.manual_seed(seed)
    conv = cls(in_channels, out_channels, **kwargs).double()
    x = make_input(cls, size, F64, seed=seed, in_channels=in_channels)
    assert_same_function(conv, conv_to_attention(conv), x, seed)


def test_construction_is_one_head_per_tap_without_value_projection():
    conv = nn.Conv2d(3, 5, (2, 3), dilation=(2, 3), padding="same")
    layer = conv_to_attention(conv).attention
    assert isinstance(layer, MultiHeadSelfAttention2d)
    assert layer.heads == 6 and layer.value is None and layer.hard
    # Centres: tap (i, j) times the dilation, measured from the centre tap ((K−1)//2) · dilation.
    expected = [[i * 2 - 0, j * 3 - 3] for i in range(2) for j in range(3)]
    assert layer.position.centers.tolist() == expected
    # out.weight block of head (i, j) is W[:, :, i, j]; the bias is the conv's.
    blocks = layer.out.weight.view(5, 6, 3)
    for h, (i, j) in enumerate((i, j) for i in range(2) for j in range(3)):
        assert torch.equal(blocks[:, h], conv.weight[:, :, i, j])
    assert torch.equal(layer.out.bias, conv.bias)
    # Parameters: the kernel (conv's shape), its bias, and the geometry of the heads.
    shapes = {name: tuple(p.shape) for name, p in conv_to_attention(conv).named_parameters()}
    assert shapes == {
        "weight": (5, 3, 2, 3),
        "bias": (5,),
        "attention.position.centers": (6, 2),
        "attention.position.spread": (6,),
    }
    # The layer's output weight is parametrized by the module's own kernel and bias parameters.
    module = conv_to_attention(conv)
    assert module.attention.out.parametrizations.weight.original is module.weight
    assert module.attention.out.bias is module.bias


def test_grouped_output_weight_is_block_diagonal():
    torch.manual_seed(0)
    kernel = torch.randn(6, 2, 3, 1, dtype=F64)  # groups=2: in 4, out 6
    to_out = KernelToOutWeight(kernel.shape, groups=2)
    weight = to_out(kernel).view(6, 3, 4)  # (out, heads, in)
    assert torch.equal(weight[:3, :, 2:], torch.zeros(3, 3, 2, dtype=F64))
    assert torch.equal(weight[3:, :, :2], torch.zeros(3, 3, 2, dtype=F64))
    assert torch.equal(weight[:3, :, :2], kernel[:3, :, :, 0].permute(0, 2, 1))
    assert torch.equal(weight[3:, :, 2:], kernel[3:, :, :, 0].permute(0, 2, 1))


def test_kernel_is_a_trainable_copy_and_an_sgd_step_matches_the_conv():
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2).double()
    module = conv_to_attention(conv)
    assert module.weight.data_ptr() != conv.weight.data_ptr()
    x = make_input(nn.Conv2d, (7, 8), F64)
    for net in (conv, module):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
        net(x).square().mean().backward()
        optimizer.step()
    assert rel(module.weight.detach(), conv.weight.detach()) <= 1e-12
    assert rel(module.bias.detach(), conv.bias.detach()) <= 1e-12
    assert rel(module(x).detach(), conv(x).detach()) <= 1e-12
    # The attention layer reads the updated kernel: its out.weight is a view of it.
    assert torch.equal(
        module.attention.out.weight.view(6, 9, 4)[:3, 4, :2], module.weight[:3, :, 1, 1]
    )


def test_frozen_conv_parameters_stay_frozen():
    conv = nn.Conv2d(2, 2, 3)
    conv.weight.requires_grad_(False)
    module = conv_to_attention(conv)
    assert not module.weight.requires_grad and module.bias.requires_grad


def dense_gaussian_reference(conv, module, x, spread):
    """Independent numpy attention: softmax of −½ s²‖δ − Δ_h‖² over the padded image's pixels."""
    xp = x.unsqueeze(2) if module.one_d else x
    (top, bottom), (left, right) = module._pads
    mode = "circular" if conv.padding_mode == "circular" else "constant"
    xp = F.pad(xp, (left, right, top, bottom), mode=mode).numpy()
    batch, cin, hp, wp = xp.shape
    kh, kw = module._kernel
    grid = np.stack(np.meshgrid(np.arange(hp), np.arange(wp), indexing="ij"), -1).reshape(-1, 2)
    delta = grid[None, :, :] - grid[:, None, :]  # (N, N, 2): key − query
    pixels = xp.reshape(batch, cin, -1)
    weight = conv.weight.detach().numpy().reshape(conv.out_channels, -1, kh, kw)
    g = conv.groups
    y = np.zeros((batch, conv.out_channels, hp * wp))
    for i, j in ((i, j) for i in range(kh) for j in range(kw)):
        centre = np.array([i * module._dilation[0], j * module._dilation[1]]) - module._anchor
        logits = -0.5 * spread**2 * ((delta - centre) ** 2).sum(-1)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attended = pixels @ probs.T  # (B, Cin, N): Σ_k P[q, k] x_k
        for group in range(g):
            o = slice(group * conv.out_channels // g, (group + 1) * conv.out_channels // g)
            c = slice(group * cin // g, (group + 1) * cin // g)
            y[:, o] += np.einsum("oc,bcn->bon", weight[o, :, i, j], attended[:, c])
    if conv.bias is not None:
        y += conv.bias.detach().numpy()[None, :, None]
    y = y.reshape(batch, -1, hp, wp)[:, :, module._anchor[0] :: module._stride[0],
                                     module._anchor[1] :: module._stride[1]]  # fmt: skip
    out_h, out_w = module.output_size(*((1, x.shape[2]) if module.one_d else x.shape[2:]))
    y = torch.from_numpy(y[:, :, :out_h, :out_w].copy())
    return y[:, :, 0] if module.one_d else y


@pytest.mark.parametrize("spread", [0.7, 2.0, 5.0])
@pytest.mark.parametrize(
    ("cls", "spec", "size"), [CONFIGS[0], CONFIGS[9], CONFIGS[11], CONFIGS[15], CONFIGS[17]]
)
def test_finite_spread_is_gaussian_attention(cls, spec, size, spread):
    conv = make_conv(cls, spec, F64)
    module = conv_to_attention(conv, spread=spread)
    assert not module.attention.hard
    assert module.attention.position.spread.tolist() == [spread] * module.heads
    x = make_input(cls, size, F64)
    with torch.no_grad():
        assert rel(module(x), dense_gaussian_reference(conv, module, x, spread)) <= 1e-12


def test_finite_spread_converges_to_the_convolution():
    conv = make_conv(nn.Conv2d, {"kernel_size": 3, "stride": 2, "padding": 1, "groups": 2}, F64)
    x = make_input(nn.Conv2d, (9, 9), F64)
    with torch.no_grad():
        ref = conv(x)
        errors = [rel(conv_to_attention(conv, s)(x), ref) for s in (1.0, 2.0, 4.0, 6.0, 8.0)]
    assert all(a > b for a, b in itertools.pairwise(errors))
    # The leaked mass falls like exp(−s²/2): a few neighbours at distance 1 per tap.
    assert 1e-9 < errors[3] < 100 * math.exp(-18) and errors[4] < 1e-12
    # Past s = sqrt(−2 log sqrt(tiny)) the neighbours are flushed: exact, forward and backward.
    assert_same_function(conv, conv_to_attention(conv, 30.0), x)
    conv32 = make_conv(nn.Conv2d, {"kernel_size": 3, "stride": 2, "padding": 1, "groups": 2}, F32)
    assert_same_function(conv32, conv_to_attention(conv32, 10.0), x.float())


def test_bad_input_raises_clear_errors():
    unknown = nn.Conv2d(2, 2, 3, padding=1)
    unknown.padding_mode = "mirror"  # not a mode PyTorch knows either
    with pytest.raises(ValueError, match="'mirror' is not supported; supported: zeros, circular, "
                       "reflect, replicate"):  # fmt: skip
        conv_to_attention(unknown)
    with pytest.raises(TypeError, match=r"nn\.Conv1d or nn\.Conv2d, got Conv3d"):
        conv_to_attention(nn.Conv3d(2, 2, 3))
    with pytest.raises(TypeError, match="got ConvTranspose2d"):
        conv_to_attention(nn.ConvTranspose2d(2, 2, 3))
    with pytest.raises(ValueError, match="lazy"):
        conv_to_attention(nn.LazyConv2d(2, 3))
    for spread in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="positive finite"):
            conv_to_attention(nn.Conv2d(2, 2, 3), spread=spread)
    with pytest.raises(TypeError, match="spread must be a float"):
        conv_to_attention(nn.Conv2d(2, 2, 3), spread="5")

    module = conv_to_attention(nn.Conv2d(2, 3, 3, dilation=2))
    with pytest.raises(ValueError, match=r"\(C, H, W\) with C=2, got shape \(1, 3, 8, 8\)"):
        module(torch.randn(1, 3, 8, 8))
    with pytest.raises(
        ValueError, match=r"\(B, C, H, W\) or \(C, H, W\) with C=2, got shape \(3, 8, 8\)"
    ):
        module(torch.randn(3, 8, 8))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        module(torch.randn(8, 8))
    with pytest.raises(TypeError, match=r"dtype torch\.float32"):
        module(torch.randn(1, 2, 8, 8, dtype=F64))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        module(np.zeros((1, 2, 8, 8)))
    # The dilated kernel spans 5 pixels; the convolution refuses a 4-pixel input too.
    with pytest.raises(RuntimeError):
        nn.Conv2d(2, 3, 3, dilation=2)(torch.randn(1, 2, 4, 8))
    with pytest.raises(
        ValueError, match=r"height 4 \(padded 4\) is smaller than the dilated kernel 5"
    ):
        module(torch.randn(1, 2, 4, 8))
    reflect = conv_to_attention(nn.Conv2d(2, 2, 3, padding=2, padding_mode="reflect"))
    with pytest.raises(ValueError, match="reflect padding of 2 needs an input height larger"):
        reflect(torch.randn(1, 2, 2, 5))
    circular = conv_to_attention(nn.Conv1d(2, 2, 3, padding=3, padding_mode="circular"))
    with pytest.raises(ValueError, match="circular padding of 3 needs an input width of at least"):
        circular(torch.randn(1, 2, 2))
