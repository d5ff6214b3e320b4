"""convert_model on convolution subclasses: converted through a rule that reproduces their forward,
or left in place with the reason; strict mode and the probe self-check."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnconv.convert import (
    AttentionConv,
    ConversionError,
    conversion_summary,
    convert_model,
    dynamic_same_padding,
    format_summary,
    layers_left,
    probe_error,
    standardized_weight,
)

F64, F32 = torch.float64, torch.float32
TOL = {F64: 1e-10, F32: 1e-5}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


class StdConv2d(nn.Conv2d):
    """Weight standardisation in forward, as BiT/NFNet-style networks do (via batch_norm)."""

    def __init__(self, *args, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1), None, None, training=True,
            momentum=0.0, eps=self.eps,
        ).reshape_as(self.weight)  # fmt: skip
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2dSame(nn.Conv2d):
    """TensorFlow "SAME" padding computed for each input size in forward (EfficientNet ports)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for n, k, s, d in zip(
            x.shape[-2:], self.kernel_size, self.stride, self.dilation, strict=True
        ):
            total = max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
            pads.append((total // 2, total - total // 2))
        (top, bottom), (left, right) = pads
        x = F.pad(x, (left, right, top, bottom))
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class ReflectPadConv2d(nn.Conv2d):
    """Reflect padding done by hand in forward rather than through padding_mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (1, 1, 1, 1), mode="reflect"))


class BlockNet(nn.Module):
    """Weight-standardised stem and body, "SAME"-padded strided and depthwise layers, a plain
    reflect-padded conv, a subclass with a hand-made reflect pad, and a Conv1d head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = StdConv2d(3, 8, 3, padding=1)
        self.down = Conv2dSame(8, 16, 3, stride=2)
        self.depthwise = Conv2dSame(16, 16, 5, stride=2, groups=16, bias=False)
        self.body = StdConv2d(16, 16, 3, padding=1, groups=2, bias=False)
        self.reflect = nn.Conv2d(16, 16, 3, padding=1, padding_mode="reflect")
        self.handmade = ReflectPadConv2d(16, 8, 3)
        self.head = nn.Conv1d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.stem(x))
        x = F.gelu(self.depthwise(self.down(x)))
        x = self.handmade(F.relu(self.reflect(self.body(x))))
        return self.head(x.flatten(2)).mean(dim=2)


RULES = {StdConv2d: standardized_weight(eps=1e-6), Conv2dSame: dynamic_same_padding}


def block_net(dtype: torch.dtype) -> BlockNet:
    torch.manual_seed(0)
    return BlockNet().to(dtype)


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("size", [(13, 11), (16, 16)])  # odd sizes: "SAME" pads asymmetrically
def test_rules_reproduce_the_subclasses_forward_and_gradients(dtype, size):
    model = block_net(dtype)
    converted = convert_model(model, rules=RULES)
    x = torch.randn(2, 3, *size, dtype=dtype)
    ref, out = model(x), converted(x)
    assert rel(out.detach(), ref.detach()) <= TOL[dtype]
    ref.square().sum().backward()
    out.square().sum().backward()
    for name in ("stem", "down", "depthwise", "body", "reflect", "head"):
        converted_layer, layer = converted.get_submodule(name), model.get_submodule(name)
        assert isinstance(converted_layer, AttentionConv)
        assert rel(converted_layer.weight.grad, layer.weight.grad) <= TOL[dtype]
    # The hand-made reflect pad has no rule: left in place, so the network is still exact.
    assert type(converted.handmade) is ReflectPadConv2d
    assert [r.name for r in layers_left(converted)] == ["handmade"]


def test_subclasses_without_rules_are_left_in_place_with_reasons():
    model = block_net(F64)
    converted = convert_model(model)
    left = layers_left(converted)
    assert [(r.name, r.kind) for r in left] == [
        ("stem", "StdConv2d"), ("down", "Conv2dSame"), ("depthwise", "Conv2dSame"),
        ("body", "StdConv2d"), ("handmade", "ReflectPadConv2d"),
    ]  # fmt: skip
    assert left[0].reason.startswith("StdConv2d overrides forward of nn.Conv2d")
    assert "rules={StdConv2d: rule}" in left[0].reason
    assert [r.name for r in conversion_summary(converted)] == ["reflect", "head"]
    x = torch.randn(2, 3, 13, 11, dtype=F64)
    with torch.no_grad():
        assert rel(converted(x), model(x)) <= 1e-12  # left layers keep the network exact
    assert layers_left(model) == left  # the original: what convert_model would leave
    assert layers_left(model, rules=RULES) == left[-1:]
    text = format_summary(conversion_summary(converted), left, error=3e-13).splitlines()
    assert text[-7] == "left in place (5 layers):"
    assert text[-6].startswith("  stem  StdConv2d: StdConv2d overrides forward")
    assert text[-1] == "probe: largest relative error 3e-13"


def test_hooks_parametrizations_and_lazy_layers_are_left():
    torch.manual_seed(0)
    hooked = nn.Conv2d(2, 2, 3, padding=1)
    hooked.register_forward_hook(lambda m, i, o: o * 2)
    parametrized = nn.utils.parametrizations.weight_norm(nn.Conv2d(2, 2, 3, padding=1))
    model = nn.Sequential(hooked, parametrized, nn.LazyConv2d(2, 1), nn.Conv2d(2, 2, 1))
    converted = convert_model(model)
    reasons = {r.name: r.reason for r in layers_left(converted)}
    assert reasons == {
        "0": "forward hooks registered on the layer (they could change its function)",
        "1": "parametrized weight (torch.nn.utils.parametrize): recomputed in each forward",
        "2": "uninitialized lazy parameters (run one forward first)",
    }
    assert isinstance(converted[3], AttentionConv)
    # A rule does not override these: the hook would still be dropped.
    assert [r.name for r in layers_left(model, rules={nn.Conv2d: dynamic_same_padding})] == [
        "0",
        "1",
        "2",
    ]


def test_strict_raises_naming_every_layer_left():
    with pytest.raises(ConversionError) as info:
        convert_model(block_net(F32), strict=True)
    message = str(info.value)
    for name in ("stem (StdConv2d)", "down (Conv2dSame)", "handmade (ReflectPadConv2d)"):
        assert name in message
    with pytest.raises(ConversionError, match=r"handmade \(ReflectPadConv2d\)") as info:
        convert_model(block_net(F32), rules=RULES, strict=True)
    assert "stem" not in str(info.value)


def test_probe_reports_the_error_and_refuses_a_wrong_rule():
    model = block_net(F64)
    x = torch.randn(1, 3, 9, 10, dtype=F64)
    converted = convert_model(model, rules=RULES, probe=x)
    with torch.no_grad():
        assert converted.conversion_probe_error == pytest.approx(rel(converted(x), model(x)))
    assert converted.conversion_probe_error <= 1e-10

    # A rule that drops the standardisation is a different function: the probe catches it.
    def plain(conv, spread):
        return AttentionConv(conv, spread)

    with pytest.raises(ConversionError, match=r"relative error (\S+) > 1e-10") as info:
        convert_model(model, rules={**RULES, StdConv2d: plain}, probe=x)
    assert float(info.value.args[0].split("relative error ")[1].split()[0]) > 0.1
    assert "layers left: handmade" in str(info.value)
    # The probe runs in eval mode and restores training flags (BatchNorm statistics untouched).
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    before = net[1].running_mean.clone()
    error = probe_error(net, convert_model(net), torch.randn(2, 3, 6, 6))
    assert error <= 1e-5 and net.training and net[1].training
    assert torch.equal(net[1].running_mean, before)


def test_rule_and_dynamic_same_errors():
    with pytest.raises(TypeError, match="rules maps classes to callables"):
        convert_model(nn.Conv2d(2, 2, 3), rules={"Conv2d": dynamic_same_padding})
    with pytest.raises(
        ValueError, match=r"dynamic_same=True .* padding to be 0, got padding=\(1, 1\)"
    ):
        convert_model(nn.Conv2d(2, 2, 3, padding=1), rules={nn.Conv2d: dynamic_same_padding})
    with pytest.raises(ValueError, match="eps must be a non-negative number"):
        standardized_weight(-1.0)(nn.Conv2d(2, 2, 3), None)
