"""convert_model never returns a silently different network: each way a layer could be converted
wrong is either converted exactly or left in place and listed with its reason (and refused by
``strict=True``); the copy keeps what the original shares, its hooks and its pickling."""

from __future__ import annotations

import io
import types

import pytest
import torch
import torch.nn.functional as F
import torch.nn.utils.prune
from torch import nn

from attnconv.analysis.third_party import import_timm
from attnconv.convert import (
    AttentionConv,
    ConversionError,
    conversion_summary,
    convert_model,
    dynamic_same_padding,
    layers_left,
    probe_error,
    scaled_standardized_weight,
    standardized_weight,
)

F64 = torch.float64


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max()
    return ((a - b).abs().max() / scale).item() if scale > 0 else (a - b).abs().max().item()


def forward_and_gradients(net: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``net(x)``, and the gradients of ``sum(net(x)·u)`` (fixed random ``u``) with respect to
    ``x`` and every parameter, by state-dict key."""
    x = x.clone().requires_grad_(True)
    out = net(x)
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(5))
    params = {k: v for k, v in net.state_dict(keep_vars=True).items() if v.requires_grad}
    grads = torch.autograd.grad((out * upstream).sum(), [x, *params.values()], allow_unused=True)
    result = {"output": out.detach(), "input": grads[0]}
    for key, param, grad in zip(params, params.values(), grads[1:], strict=True):
        result[key] = torch.zeros_like(param) if grad is None else grad
    return result


def assert_same_function(original: nn.Module, converted: nn.Module, x, tol: float) -> None:
    reference, value = forward_and_gradients(original, x), forward_and_gradients(converted, x)
    assert set(value) == set(reference)
    for key in reference:
        assert rel(value[key], reference[key]) <= tol, key


def sgd_step(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``net(x)`` after one SGD step (lr 0.5) on ``mean(net(x)²)``."""
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    net(x).pow(2).mean().backward()
    optimizer.step()
    with torch.no_grad():
        return net(x)


# ------------------------------------------------------------------ 1. NFNet's scaled WS conv


@pytest.fixture(scope="module")
def timm():
    return import_timm()


@pytest.mark.parametrize("name", ["nf_resnet26", "nf_regnet_b0"])
def test_nfnet_converts_exactly_with_the_scaled_rule(timm, name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=5).to(F64).eval()
    scaled = timm.layers.ScaledStdConv2d
    x = torch.randn(2, 3, 32, 32, dtype=F64)
    converted = convert_model(model, rules={scaled: scaled_standardized_weight}, probe=x,
                              probe_gradients=True)  # fmt: skip
    assert layers_left(converted) == []
    assert not any(isinstance(m, nn.Conv2d) for m in converted.modules())
    assert converted.conversion_probe_error <= 1e-10
    assert converted.conversion_probe_gradient_error <= 1e-10
    assert_same_function(model, converted, x, 1e-9)
    assert list(converted.state_dict()) == list(model.state_dict())  # gain included


def test_scaled_std_conv2d_same_converts_exactly(timm):
    torch.manual_seed(1)
    layers = timm.layers
    model = nn.Sequential(
        layers.ScaledStdConv2dSame(3, 8, 3, stride=2, gamma=1.7, eps=1e-5),  # dynamic "SAME"
        nn.GELU(),
        layers.ScaledStdConv2dSame(8, 8, 5, groups=8, bias=False),  # static: padding 2
        layers.ScaledStdConv2d(8, 4, 1, gain_init=0.5),
    ).to(F64)
    assert model[0].same_pad and not model[2].same_pad
    with torch.no_grad():
        for conv in (model[0], model[2], model[3]):
            conv.gain.uniform_(0.5, 1.5)
    rules = {layers.ScaledStdConv2dSame: scaled_standardized_weight,
             layers.ScaledStdConv2d: scaled_standardized_weight}  # fmt: skip
    converted = convert_model(model, rules=rules)
    assert [r.name for r in conversion_summary(converted)] == ["0", "2", "3"]
    for size in ((13, 11), (16, 16)):
        assert_same_function(model, converted, torch.randn(2, 3, *size, dtype=F64), 1e-10)
    # The gain trains as one parameter of the converted layer.
    trained = converted.state_dict(keep_vars=True)
    assert trained["0.gain"].shape == (8, 1, 1, 1) and trained["0.gain"].requires_grad


def test_the_plain_standardised_rule_is_refused_on_a_scaled_layer(timm):
    model = nn.Sequential(nn.Conv2d(3, 4, 1), timm.layers.ScaledStdConv2d(4, 4, 3))
    with pytest.raises(ConversionError, match=r"^1 \(ScaledStdConv2d\): the rule's module .*gain"):
        convert_model(model, rules={timm.layers.ScaledStdConv2d: standardized_weight()})
    with pytest.raises(ValueError, match=r"Conv2d has no gain parameter, scale and eps"):
        scaled_standardized_weight(nn.Conv2d(2, 2, 3), None)


def test_bit_std_conv_and_tf_same_padding_stay_exact(timm):
    torch.manual_seed(2)
    layers = timm.layers
    model = nn.Sequential(
        layers.StdConv2d(3, 8, 3, eps=1e-8),
        layers.Conv2dSame(8, 8, 3, stride=2),
        layers.StdConv2dSame(8, 8, 3, stride=2),  # dynamic "SAME" and standardisation
        layers.StdConv2d(8, 4, 1, bias=True),
    ).to(F64)
    rules = {layers.StdConv2d: standardized_weight(), layers.Conv2dSame: dynamic_same_padding,
             layers.StdConv2dSame: standardized_weight()}  # fmt: skip
    converted = convert_model(model, rules=rules)
    assert layers_left(converted) == []
    for size in ((13, 11), (16, 16)):
        assert_same_function(model, converted, torch.randn(2, 3, *size, dtype=F64), 1e-10)
    # An eps that is not the layer's is refused, not used.
    with pytest.raises(ValueError, match=r"StdConv2d has eps=1e-08, the rule's eps is 1e-06"):
        convert_model(model, rules={layers.StdConv2d: standardized_weight(eps=1e-6)})


# ------------------------------------------------------------------ 2.–4. calls, forwards, hooks


class CallOverride(nn.Conv2d):
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x) * 2


def doubled(self: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    return self._conv_forward(x, self.weight * 2, self.bias)


def test_call_overrides_and_instance_forwards_are_left():
    torch.manual_seed(3)
    patched = nn.Conv2d(2, 2, 3, padding=1)
    patched.forward = types.MethodType(doubled, patched)
    conv_forward = nn.Conv2d(2, 2, 3, padding=1)
    conv_forward._conv_forward = lambda x, w, b: F.conv2d(x, 2 * w, b, 1, 1)
    model = nn.Sequential(CallOverride(2, 2, 3, padding=1), patched, conv_forward,
                          nn.Conv2d(2, 2, 1)).to(F64)  # fmt: skip
    converted = convert_model(model)
    assert [(r.name, r.reason) for r in layers_left(converted)] == [
        ("0", "CallOverride overrides __call__ of nn.Module: its call is not the convolution's"),
        ("1", "forward set on the instance: not the convolution Theorem 1 covers"),
        ("2", "_conv_forward set on the instance: not the convolution Theorem 1 covers"),
    ]
    assert isinstance(converted[3], AttentionConv)
    assert_same_function(model, converted, torch.randn(2, 2, 6, 5, dtype=F64), 1e-12)
    # A rule reproduces forward, not these: still left.
    assert [r.name for r in layers_left(model, rules={nn.Conv2d: dynamic_same_padding})][:3] == [
        "0", "1", "2"]  # fmt: skip
    with pytest.raises(ConversionError, match=r"1 \(Conv2d\): forward set on the instance"):
        convert_model(model, strict=True)


def zero_grad(param: torch.Tensor) -> None:
    param.grad.zero_()


def test_backward_hooks_and_tensor_hooks_are_left_and_kept():
    torch.manual_seed(4)
    model = nn.Sequential(*(nn.Conv2d(2, 2, 3, padding=1) for _ in range(5))).to(F64)
    model[0].register_full_backward_hook(lambda m, gi, go: (gi[0] * 3,))
    model[1].register_full_backward_pre_hook(lambda m, go: (go[0] * 0.5,))
    model[2].weight.register_hook(torch.zeros_like)
    model[3].bias.register_post_accumulate_grad_hook(zero_grad)
    converted = convert_model(model)
    assert [(r.name, r.reason) for r in layers_left(converted)] == [
        ("0", "backward hooks registered on the layer (they change its gradients)"),
        ("1", "backward hooks registered on the layer (they change its gradients)"),
        ("2", "hooks registered on its weight (they change its gradients)"),
        ("3", "hooks registered on its bias (they change its gradients)"),
    ]
    assert isinstance(converted[4], AttentionConv)
    x = torch.randn(2, 2, 6, 5, dtype=F64)
    assert_same_function(model, converted, x, 1e-12)
    # The copy keeps the tensor hooks: the zeroed gradients stay zero, as in the original.
    model(x.clone().requires_grad_()).sum().backward()
    converted(x.clone().requires_grad_()).sum().backward()
    assert converted[2].weight.grad.abs().max() == 0 and converted[3].bias.grad.abs().max() == 0
    assert rel(converted[4].weight.grad, model[4].weight.grad) <= 1e-12


def test_probe_gradients_catches_a_rule_that_changes_only_the_gradients():
    def frozen(conv, spread):
        module = AttentionConv(conv, spread)
        module.weight.register_hook(lambda g: g * 0)
        return module

    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Tanh(), nn.Conv2d(3, 2, 1)).to(F64)
    x = torch.randn(2, 2, 6, 6, dtype=F64)
    converted = convert_model(model, rules={nn.Conv2d: frozen}, probe=x)  # forward only: exact
    assert converted.conversion_probe_error <= 1e-12
    assert not hasattr(converted, "conversion_probe_gradient_error")
    with pytest.raises(ConversionError, match=r"gradients .* relative error 1 > 1e-10"):
        convert_model(model, rules={nn.Conv2d: frozen}, probe=x, probe_gradients=True)
    exact = convert_model(model, probe=x, probe_gradients=True)
    assert exact.conversion_probe_gradient_error <= 1e-12
    assert all(p.grad is None for p in model.parameters())  # the probe leaves no gradients


# ------------------------------------------------------------------ 5.–6. references, storage


class HeldTwice(nn.Module):
    """Its convolution is also in a plain list, and forward calls it there."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.ops = [self.conv]
        self.call = self.conv.forward
        self.other = nn.Conv2d(2, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.other(self.ops[0](x) + self.call(x))


def test_a_convolution_held_outside_the_module_tree_is_left():
    torch.manual_seed(6)
    model = HeldTwice().to(F64)
    converted = convert_model(model)
    assert [(r.name, r.reason) for r in layers_left(converted)] == [
        ("conv", "also held outside the module tree, as (model).call, (model).ops[0] (forward "
                 "may call it there, where it would not be replaced)"),
    ]  # fmt: skip
    assert isinstance(converted.other, AttentionConv)
    assert converted.ops[0] is converted.conv
    x = torch.randn(2, 2, 5, 5, dtype=F64)
    assert_same_function(model, converted, x, 1e-12)
    assert rel(sgd_step(converted, x), sgd_step(model, x)) <= 1e-12
    with pytest.raises(ConversionError, match=r"conv \(Conv2d\): also held outside"):
        convert_model(model, strict=True)


class StorageShared(nn.Module):
    """Two convolutions and two linear layers whose weights are distinct parameters on one
    storage (built in float64: ``.to(dtype)`` would untie them)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = (nn.Conv2d(2, 2, 3, padding=1, dtype=F64) for _ in range(2))
        self.b.weight = nn.Parameter(self.a.weight.data)
        self.fc1, self.fc2 = nn.Linear(2, 2, dtype=F64), nn.Linear(2, 2, dtype=F64)
        self.fc2.weight = nn.Parameter(self.fc1.weight.data)
        self.c = nn.Conv2d(2, 2, 1, dtype=F64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))
        return self.fc2(torch.tanh(self.fc1(x.mean(dim=(2, 3)))))


def test_parameters_sharing_one_storage_stay_shared():
    torch.manual_seed(7)
    model = StorageShared()
    converted = convert_model(model)
    untie = "(converting it alone would untie them)"
    assert [(r.name, r.reason) for r in layers_left(converted)] == [
        ("a", f"its weight shares its storage with b.weight {untie}"),
        ("b", f"its weight shares its storage with a.weight {untie}"),
    ]
    assert isinstance(converted.c, AttentionConv)
    for first, second in ((converted.a, converted.b), (converted.fc1, converted.fc2)):
        assert first.weight.data_ptr() == second.weight.data_ptr()
    assert converted.a.weight.data_ptr() != model.a.weight.data_ptr()  # a copy, still
    x = torch.randn(2, 2, 5, 5, dtype=F64)
    reference = sgd_step(model, x)
    assert rel(sgd_step(converted, x), reference) <= 1e-12


# ------------------------------------------------------------------ 7. other convolutions


class BlurPool(nn.Module):
    """A fixed blur computed with F.conv2d in its own forward."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.register_buffer("kernel", torch.ones(channels, 1, 3, 3) / 9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.kernel, stride=2, padding=1, groups=x.shape[1])


def test_transposed_3d_and_functional_convolutions_are_listed():
    torch.manual_seed(8)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1),
        BlurPool(4),
        nn.ConvTranspose2d(4, 2, 2, stride=2),
        nn.Unflatten(1, (1, 2)),
        nn.Conv3d(1, 1, 1),
        nn.Flatten(1, 2),
    ).to(F64)
    head = nn.ConvTranspose1d(2, 2, 3)
    expected = [
        ("2", "ConvTranspose2d", "a ConvTranspose2d: Theorem 1 covers Conv1d and Conv2d only"),
        ("4", "Conv3d", "a Conv3d: Theorem 1 covers Conv1d and Conv2d only"),
    ]
    converted = convert_model(model)
    assert [(r.name, r.kind, r.reason) for r in layers_left(converted)] == expected
    assert [r.name for r in layers_left(head)] == ["(model)"]
    x = torch.randn(2, 2, 6, 6, dtype=F64)
    functional = ("1", "BlurPool", "calls torch.conv2d in its own forward (a convolution "
                  "convert_model cannot replace)")  # fmt: skip
    assert [(r.name, r.kind, r.reason) for r in layers_left(model, probe=x)] == [
        expected[0], expected[1], functional]  # fmt: skip
    with pytest.raises(ConversionError, match=r"2 \(ConvTranspose2d\)") as info:
        convert_model(model, strict=True)
    assert "1 (BlurPool)" not in str(info.value)  # seen only through a probe
    with pytest.raises(ConversionError, match=r"1 \(BlurPool\): calls torch.conv2d"):
        convert_model(model, strict=True, probe=x)
    with pytest.raises(ConversionError, match=r"\(model\) \(ConvTranspose1d\)"):
        convert_model(head, strict=True)
    assert_same_function(model, converted, x, 1e-12)


# ------------------------------------------------------------------ 8. loud and helpful


def test_old_style_weight_norm_and_prune_are_left_not_a_deepcopy_error():
    torch.manual_seed(9)
    with pytest.warns(FutureWarning):
        normed = nn.utils.weight_norm(nn.Conv2d(2, 2, 3, padding=1))
    pruned = nn.Conv2d(2, 2, 3, padding=1)
    nn.utils.prune.l1_unstructured(pruned, "weight", amount=0.5)
    model = nn.Sequential(normed, nn.Tanh(), pruned, nn.Conv2d(2, 2, 1)).to(F64)
    converted = convert_model(model)
    hooks = "forward hooks registered on the layer (they could change its function)"
    assert [(r.name, r.reason) for r in layers_left(converted)] == [("0", hooks), ("2", hooks)]
    with pytest.raises(ConversionError, match=r"0 \(Conv2d\): forward hooks .*\n.*2 \(Conv2d\)"):
        convert_model(model, strict=True)
    assert isinstance(converted[3], AttentionConv)
    x = torch.randn(2, 2, 5, 5, dtype=F64)
    assert_same_function(model, converted, x, 1e-12)
    assert rel(sgd_step(converted, x), sgd_step(model, x)) <= 1e-12


def test_unbatched_input_runs_as_in_the_original():
    torch.manual_seed(10)
    image = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 3, stride=2)).to(F64)
    text = nn.Sequential(nn.Conv1d(3, 4, 3, padding=1), nn.Conv1d(4, 2, 2)).to(F64)
    for model, x in (
        (image, torch.randn(3, 7, 6, dtype=F64)),
        (text, torch.randn(3, 9, dtype=F64)),
    ):
        converted = convert_model(model)
        assert all(isinstance(m, AttentionConv) for m in converted)
        assert converted(x).shape == model(x).shape
        assert_same_function(model, converted, x, 1e-12)
    with pytest.raises(ValueError, match=r"expected input of shape \(B, C, H, W\) or \(C, H, W\)"):
        convert_model(image)(torch.randn(7, 6, dtype=F64))


def test_a_padding_changed_after_construction_and_process_wide_hooks_are_left():
    """Issue 55: a reflect-padded convolution whose ``.padding`` was changed after construction
    pads as built (torch keeps the pads it computed then), and a process-wide forward hook sees
    every nn.Conv2d: both were converted silently, now they are left and listed."""
    torch.manual_seed(5)
    x = torch.randn(1, 2, 9, 9, dtype=F64)
    changed = nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect").to(F64)
    changed.padding = (2, 2)
    same = nn.Conv2d(2, 2, 3, padding="same", dilation=2, padding_mode="reflect").to(F64)
    model = nn.Sequential(changed, same)
    reason = "its reflect padding was changed after construction: its forward pads [1, 1, 1, 1]"
    assert [(r.name, r.reason[: len(reason)]) for r in layers_left(model)] == [("0", reason)]
    converted = convert_model(model)
    assert converted[0] is not changed and type(converted[0]) is nn.Conv2d
    assert isinstance(converted[1], AttentionConv)
    assert_same_function(model, converted, x, 1e-12)
    with pytest.raises(ConversionError, match="reflect padding was changed"):
        convert_model(model, strict=True)

    seen = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda module, args, out: seen.append(type(module).__name__)
    )
    try:
        left = layers_left(nn.Sequential(nn.Conv2d(2, 2, 3)))
        assert [r.reason.split(" (")[0] for r in left] == [
            "process-wide module forward hooks are registered"
        ]
        with pytest.raises(ConversionError, match="process-wide module forward hooks"):
            convert_model(nn.Conv2d(2, 2, 3), strict=True)
    finally:
        handle.remove()
    assert layers_left(nn.Conv2d(2, 2, 3)) == []
    original = nn.Conv2d.forward
    nn.Conv2d.forward = lambda self, x: original(self, x) * 2  # replaced for every Conv2d
    try:
        assert "not torch's (replaced process-wide)" in layers_left(nn.Conv2d(2, 2, 3))[0].reason
    finally:
        nn.Conv2d.forward = original


def test_a_converted_model_pickles_deep_copies_and_converts_any_number_of_times():
    """Issue 55: the first torch.save stripped ``attention.out.weight`` from the class the
    original shares: a second save raised AttributeError and the forward failed."""
    import copy
    import pickle

    from attnconv.convert import attention_to_conv

    torch.manual_seed(3)
    converted = convert_model(nn.Sequential(nn.Conv2d(3, 4, 3)), spread=5.0)
    x = torch.randn(2, 3, 8, 8)
    expected = converted(x)
    for _ in range(3):
        buffer = io.BytesIO()
        torch.save(converted, buffer)
        buffer.seek(0)
        for twin in (
            torch.load(buffer, weights_only=False),
            copy.deepcopy(converted),
            pickle.loads(pickle.dumps(converted)),
            convert_model(converted),  # a converted model converts again, unchanged
        ):
            assert torch.equal(twin(x), expected)
            assert twin[0].weight is not converted[0].weight
            assert twin[0].attention.out.parametrizations.weight.original is twin[0].weight
    assert torch.equal(converted(x), expected)  # the original is untouched
    assert converted[0].attention.out.weight.shape == (4, 27)
    hard = convert_model(nn.Conv2d(3, 4, 3))
    copy.deepcopy(hard)
    assert attention_to_conv(hard.attention, 8, 8).shape[0] == 4


def test_a_converted_model_pickles_and_trains_after_loading(timm):
    torch.manual_seed(11)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, groups=1),
        timm.layers.ScaledStdConv2d(4, 4, 3, groups=2),
        nn.Conv2d(4, 2, 1),
    ).to(F64)
    converted = convert_model(
        model, rules={timm.layers.ScaledStdConv2d: scaled_standardized_weight}
    )
    buffer = io.BytesIO()
    torch.save(converted, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    x = torch.randn(2, 3, 7, 7, dtype=F64)
    assert_same_function(model, loaded, x, 1e-12)
    assert list(loaded.state_dict()) == list(model.state_dict())
    # The kernel is still the parameter the attention layer computes with.
    layer = loaded[0]
    assert layer.attention.out.parametrizations.weight.original is layer.weight
    assert layer.attention.out.bias is layer.bias
    assert rel(sgd_step(loaded, x), sgd_step(model, x)) <= 1e-12
    assert probe_error(model, loaded, x) <= 1e-12
