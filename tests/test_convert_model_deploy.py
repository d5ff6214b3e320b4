"""Converted networks deploy like the originals: TorchScript (script, trace), torch.export, ONNX,
torch.compile without graph breaks, autocast; and state_dicts load both ways."""

from __future__ import annotations

import warnings

import onnxruntime as ort
import pytest
import torch
from torch import nn

from attnconv import convert_model
from attnconv.convert import AttentionConv, standardized_weight

F64, F32 = torch.float64, torch.float32


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def image_net() -> nn.Sequential:
    """Dense, strided grouped, depthwise reflect-padded, dilated and 1×1 convolutions, BatchNorm."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2, bias=False),
        nn.Conv2d(8, 8, 5, padding=2, groups=8, padding_mode="reflect"),
        nn.GELU(),
        nn.Conv2d(8, 8, 3, padding=2, dilation=2),
        nn.Conv2d(8, 4, 1),
    )
    with torch.no_grad():
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
    return net.eval()


def text_net() -> nn.Sequential:
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv1d(4, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv1d(8, 8, 5, stride=2, padding=2, groups=8),
        nn.Conv1d(8, 6, 2, padding=1, dilation=3, padding_mode="circular"),
    ).eval()


NETS = [(image_net, (2, 3, 11, 10)), (text_net, (2, 4, 23))]
IDS = ["image", "text"]


def inputs(shape: tuple[int, ...], seed: int = 2) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("build", "shape"), NETS, ids=IDS)
def test_script_and_trace(build, shape):
    model = build()
    converted = convert_model(model)
    scripted = torch.jit.script(converted)
    x = inputs(shape)
    other = inputs((shape[0], *(n + 3 for n in shape[1:2]), *(n + 3 for n in shape[2:])), seed=3)
    other = other[
        :, : shape[1]
    ]  # same channels, larger image: the scripted module is not shape-bound
    with torch.no_grad():
        for probe in (x, other):
            assert rel(scripted(probe), model(probe)) <= 1e-5
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no TracerWarning, nor any other
            warnings.filterwarnings(
                "ignore", r"`torch\.jit\.trace(_method)?` is deprecated", DeprecationWarning
            )
            traced = torch.jit.trace(converted, x)
        assert rel(traced(x), model(x)) <= 1e-5
    # Scripting does not touch the eager model: it still holds its attention layers.
    assert all(isinstance(converted[i], AttentionConv) for i in (0, 3, 4) if i < len(converted))
    assert set(model.state_dict()) <= set(scripted.state_dict())  # no Python hooks in script


@pytest.mark.parametrize(("build", "shape"), NETS, ids=IDS)
def test_torch_export(build, shape):
    model = build()
    converted = convert_model(model)
    x = inputs(shape)
    exported = torch.export.export(converted, (x,))
    with torch.no_grad():
        assert rel(exported.module()(x), model(x)) <= 1e-5


def test_onnx_export_runs_in_onnxruntime(tmp_path):
    model = image_net()
    converted = convert_model(model)
    x = inputs((2, 3, 11, 10))
    path = tmp_path / "converted.onnx"
    torch.onnx.export(converted, (x,), str(path), dynamo=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        assert rel(torch.from_numpy(out), model(x)) <= 1e-5


@pytest.mark.parametrize(("build", "shape"), NETS, ids=IDS)
def test_compile_fullgraph_has_no_graph_breaks(build, shape):
    model = build()
    converted = convert_model(model)
    x = inputs(shape)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(converted)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(converted, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert rel(compiled(x), model(x)) <= 1e-5
    # Gradients through the compiled graph are the original convolution's too.
    xg = x.clone().requires_grad_(True)
    compiled(xg).square().sum().backward()
    model(x).square().sum().backward()
    assert rel(converted[0].weight.grad, model[0].weight.grad) <= 1e-5


@pytest.mark.parametrize(("build", "shape"), NETS, ids=IDS)
def test_autocast_runs_like_the_original(build, shape):
    model = build()
    converted = convert_model(model)
    x = inputs(shape)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        reference, value = model(x), converted(x)
    assert value.dtype == reference.dtype == torch.bfloat16
    assert rel(value, reference) <= 2e-2  # a few bfloat16 roundings of the layers' outputs
    # One layer: the same bfloat16-rounded inputs, float32 sums, one rounding of the output.
    conv = model[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        layer_ref, layer_out = conv(x), converted[0](x)
    assert layer_out.dtype == torch.bfloat16
    assert rel(layer_out, layer_ref) <= 2**-7
    with pytest.raises(TypeError, match=r"expected input dtype torch\.float32"):
        converted[0](x.double())  # outside autocast a dtype mismatch is still an error


def test_state_dict_loads_both_ways():
    model = image_net()
    converted = convert_model(model)
    assert list(converted.state_dict()) == list(model.state_dict())
    x = inputs((2, 3, 9, 9))
    # Train the converted network one step, then load its weights into a fresh original.
    optimizer = torch.optim.SGD(converted.parameters(), lr=0.1)
    converted.train()
    converted(x).square().mean().backward()
    optimizer.step()
    converted.eval()
    fresh = image_net()
    for p in fresh.parameters():
        p.data.normal_()
    fresh.load_state_dict(converted.state_dict())
    with torch.no_grad():
        assert rel(fresh(x), converted(x)) <= 1e-5
        assert rel(converted(x), model(x)) > 1e-3  # the step changed the function
    # And back: the original's checkpoint into the converted network, strictly.
    converted.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert rel(converted(x), model(x)) <= 1e-5
    # The attention layer reads the loaded kernel: it is the same parameter.
    layer = converted[3]
    assert torch.equal(layer.weight, model[3].weight)
    assert layer.attention.out.parametrizations.weight.original is layer.weight
    assert layer.attention.out.bias is layer.bias  # None for a bias-free conv, shared otherwise
    assert converted[0].attention.out.bias is converted[0].bias is not None
    # A checkpoint with the wrong shapes is refused as for the original.
    bad = dict(model.state_dict())
    bad["0.weight"] = torch.zeros(8, 3, 5, 5)
    with pytest.raises(RuntimeError, match=r"size mismatch for 0\.weight"):
        converted.load_state_dict(bad)


def test_standardized_rule_state_dict_and_export():
    class StdConv(nn.Conv2d):
        def forward(self, x):
            w = self.weight
            mean = w.mean(dim=(1, 2, 3), keepdim=True)
            var = w.var(dim=(1, 2, 3), unbiased=False, keepdim=True)
            return self._conv_forward(x, (w - mean) / torch.sqrt(var + 1e-5), self.bias)

    torch.manual_seed(0)
    model = nn.Sequential(StdConv(3, 4, 3, padding=1), nn.ReLU(), StdConv(4, 4, 3, groups=2))
    converted = convert_model(model, rules={StdConv: standardized_weight(1e-5)})
    assert list(converted.state_dict()) == list(model.state_dict())
    x = inputs((1, 3, 8, 8))
    exported = torch.export.export(converted, (x,)).module()
    scripted = torch.jit.script(converted)
    with torch.no_grad():
        for net in (converted, exported, scripted):
            assert rel(net(x), model(x)) <= 1e-5


def test_changed_centres_fall_back_to_the_attention_layer():
    """The shift route assumes the construction's centres; in eager mode any change is noticed
    and the layer's own forward runs (a different function, but the attention layer's)."""
    conv = nn.Conv2d(2, 3, 3, padding=1).double()
    module = convert_model(conv)
    x = torch.randn(1, 2, 6, 6, dtype=F64)
    with torch.no_grad():
        centers = module.attention.position.centers
        centers[4] = torch.tensor([1.0, 1.0], dtype=F64)  # centre tap → (1, 1)
        moved = module(x)
        module.attention.impl = "dense"
        assert torch.allclose(moved, module(x), rtol=0, atol=1e-12)
        assert rel(moved, conv(x)) > 1e-2
