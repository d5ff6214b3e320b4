"""convert_model on whole networks, its summary, and the ``attnconv convert`` command."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnconv import cli, conv_to_attention, convert_model
from attnconv.convert import (
    AttentionConv,
    ConversionError,
    check,
    conversion_summary,
    format_summary,
    layers_left,
)
from attnconv.models.resnet import resnet18


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


class SmallCNN(nn.Module):
    """Strided, dilated, grouped, depthwise and pointwise 2-D convs, then a Conv1d over pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.body = nn.Sequential(
            nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, dilation=2, padding=2),
            nn.Conv2d(16, 16, 3, padding=1, groups=4),
            nn.GELU(),
            nn.Conv2d(16, 16, 5, padding="same", groups=16),
            nn.Conv2d(16, 8, 1),
        )
        self.sequence = nn.Conv1d(8, 8, 4, stride=2, padding=1, padding_mode="circular")
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.body(F.relu(self.bn(self.stem(x))))
        x = self.sequence(x.flatten(2))
        return self.head(x.mean(dim=2))


def small_cnn(dtype: torch.dtype) -> SmallCNN:
    torch.manual_seed(0)
    model = SmallCNN().to(dtype)
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


NAMES = ["stem", "body.0", "body.2", "body.3", "body.5", "body.6", "sequence"]


def test_small_cnn_converts_exactly_and_leaves_the_original_untouched():
    model = small_cnn(torch.float32).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    converted = convert_model(model)
    x = torch.rand(3, 3, 12, 10)
    with torch.no_grad():
        assert rel(converted(x), model(x)) <= 1e-5
    # The original keeps its convolutions and its values; the copy has none left.
    assert [n for n, m in model.named_modules() if isinstance(m, nn.Conv1d | nn.Conv2d)] == NAMES
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert not any(isinstance(m, nn.Conv1d | nn.Conv2d) for m in converted.modules())
    assert [n for n, m in converted.named_modules() if isinstance(m, AttentionConv)] == NAMES
    # Everything else is an untouched copy: same types and values, separate storage.
    assert type(converted.bn) is nn.BatchNorm2d and type(converted.head) is nn.Linear
    assert torch.equal(converted.bn.running_var, model.bn.running_var)
    assert converted.head.weight.data_ptr() != model.head.weight.data_ptr()
    assert not converted.training


def test_small_cnn_in_training_mode_has_the_same_gradients():
    model = small_cnn(torch.float64).train()
    converted = convert_model(model)
    assert converted.training and converted.stem.training
    x = torch.rand(4, 3, 9, 8, dtype=torch.float64)
    model(x).square().sum().backward()
    converted(x).square().sum().backward()
    for name in NAMES:
        original, attention = model.get_submodule(name), converted.get_submodule(name)
        assert rel(attention.weight.grad, original.weight.grad) <= 1e-12
    assert rel(converted.bn.weight.grad, model.bn.weight.grad) <= 1e-12
    assert rel(converted.head.weight.grad, model.head.weight.grad) <= 1e-12


def test_summary_lists_every_replacement():
    model = small_cnn(torch.float32)
    converted = convert_model(model)
    rows = conversion_summary(converted)
    assert [r.name for r in rows] == NAMES
    assert [r.heads for r in rows] == [9, 9, 9, 9, 25, 1, 4]
    assert [r.kernel_size for r in rows][-3:] == [(5, 5), (1, 1), (4,)]
    assert [r.conv for r in rows] == ["Conv2d"] * 6 + ["Conv1d"]
    assert [r.groups for r in rows] == [1, 1, 1, 4, 16, 1, 1]
    assert rows[1].stride == (2, 2) and rows[2].dilation == (2, 2)
    for row in rows:
        conv = model.get_submodule(row.name)
        assert row.params_before == sum(p.numel() for p in conv.parameters())
        assert row.params_after == row.params_before + 3 * row.heads  # centres (2) + spread (1)
    table = format_summary(rows).splitlines()
    assert len(table) == len(NAMES) + 2
    assert table[2].split()[:3] == ["body.0", "Conv2d", "3×3"]
    total = sum(r.params_before for r in rows)
    assert table[-1].split()[-2:] == [f"{total:,}", f"{total + 3 * 66:,}"]


def test_resnet18_converts_within_float32_tolerance():
    model = resnet18(num_classes=10).eval()
    converted = convert_model(model)
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        assert rel(converted(x), model(x)) <= 1e-5
    rows = conversion_summary(converted)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(rows) == len(convs) == 20  # stem, 16 block convs, 3 projection shortcuts
    assert sum(r.params_before for r in rows) == sum(c.weight.numel() for c in convs)
    assert [r.heads for r in rows].count(1) == 3  # the 1×1 shortcuts


def test_convert_model_edge_cases():
    conv = nn.Conv2d(2, 3, 3)
    converted = convert_model(conv, spread=7.5)
    assert isinstance(converted, AttentionConv) and converted.spread == 7.5
    assert conversion_summary(converted)[0].name == "(model)"
    assert all(m.spread == 7.5 for m in convert_model(small_cnn(torch.float32), spread=7.5).modules()
               if isinstance(m, AttentionConv))  # fmt: skip
    untouched = nn.Sequential(nn.Linear(2, 2))
    assert conversion_summary(convert_model(untouched)) == []
    with pytest.raises(TypeError, match=r"expected an nn\.Module, got Tensor"):
        convert_model(torch.zeros(2))
    reflect = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect")).double()
    x = torch.randn(2, 2, 5, 6, dtype=torch.float64)
    converted = convert_model(reflect)
    assert isinstance(converted[0], AttentionConv)
    with torch.no_grad():
        assert rel(converted(x), reflect(x)) <= 1e-12


def sgd_outputs(net: nn.Module, x: torch.Tensor, steps: int) -> torch.Tensor:
    """``net(x)`` after ``steps`` SGD steps (lr 0.1) on the loss ``mean(net(x)²)``."""
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        net(x).pow(2).mean().backward()
        optimizer.step()
    with torch.no_grad():
        return net(x)


def test_a_convolution_used_twice_stays_one_module_and_trains_like_the_original():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 3, 3, padding=1)
    net = nn.Sequential(conv, nn.Tanh(), conv)
    converted = convert_model(net)
    assert isinstance(converted[0], AttentionConv) and converted[2] is converted[0]
    trained = [p for p in converted.parameters() if p.requires_grad]  # geometry is frozen
    assert [p.shape for p in trained] == [conv.weight.shape, conv.bias.shape]
    assert [r.name for r in conversion_summary(converted)] == ["0"]
    x = torch.randn(2, 3, 6, 7)
    with torch.no_grad():
        assert rel(converted(x), net(x)) <= 1e-6
    trained = sgd_outputs(converted, x, steps=3)
    reference = sgd_outputs(net, x, steps=3)
    assert (trained - reference).abs().max().item() <= 1e-5
    assert (reference - net[0](x)).abs().max().item() > 1e-2  # the steps did change the weights


def test_convolutions_sharing_a_weight_are_left_in_place_with_the_reason():
    first, second = nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)
    second.weight = first.weight
    net = nn.Sequential(first, nn.Tanh(), second, nn.Conv2d(3, 2, 1))
    converted = convert_model(net)
    assert converted[0].weight is converted[2].weight  # still one parameter
    assert isinstance(converted[3], AttentionConv)
    untie = "(converting it alone would untie them)"
    assert [(r.name, r.reason) for r in layers_left(converted)] == [
        ("0", f"its weight is also a parameter of 2 {untie}"),
        ("2", f"its weight is also a parameter of 0 {untie}"),
    ]
    with pytest.raises(ConversionError, match=r"0 \(Conv2d\): its weight is also a parameter of 2"):
        convert_model(net, strict=True)


# ---------------------------------------------------------------- command line


def table_rows(text: str) -> list[list[str]]:
    """Data rows of the --check table split on runs of 2+ spaces (padding holds single spaces)."""
    lines = text.strip().splitlines()
    return [re.split(r"\s{2,}", line.strip()) for line in lines[1:-1]]


def test_cli_check_prints_the_battery_and_passes(capsys):
    assert cli.main(["convert", "--check"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert len(rows) == 2 * len(check.BATTERY)
    assert out.strip().splitlines()[-1] == f"{len(rows)}/{len(rows)} passed"
    for row in rows:
        dtype, rel_err, grad_err, tol, result = row[-6], *row[-4:]
        assert result == "pass"
        assert max(float(rel_err), float(grad_err)) <= float(tol)
        assert float(tol) == (1e-12 if dtype == "float64" else 1e-5)
    kernels = {row[1] for row in rows}
    assert {"2×2", "4×4", "2×5", "7×7", "4"} <= kernels  # even, non-square, Conv1d
    assert {row[5] for row in rows} >= {"2", "4"} and {row[7] for row in rows} == {"∞", "30"}
    # The first row's numbers, recomputed here: the 3×3 padding-1 conv in float64.
    conv = check.build_conv(nn.Conv2d, check.BATTERY[0][1], torch.float64, seed=0)
    x = torch.randn(2, 4, 9, 10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        diff = (conv_to_attention(conv)(x) - conv(x)).abs().max().item()
    assert float(rows[0][9]) == pytest.approx(diff, rel=0.01, abs=1e-300)
    assert rows[0][:9] == ["Conv2d", "3×3", "1×1", "1×1", "(1, 1)", "1", "9", "∞", "float64"]


def test_cli_check_exits_nonzero_on_a_failure(capsys, monkeypatch):
    monkeypatch.setattr(check, "BATTERY", check.BATTERY[:2])
    monkeypatch.setitem(check.TOLERANCE, torch.float64, 1e-18)  # below float64 rounding
    assert cli.main(["convert", "--check"]) == 1
    out = capsys.readouterr().out
    results = [row[-1] for row in table_rows(out)]
    assert "FAIL" in results and "pass" in results  # float32 rows still pass
    assert out.strip().splitlines()[-1] == f"{results.count('pass')}/4 passed"


def parse_sweep(text: str) -> tuple[list[tuple[float, float]], float]:
    lines = text.strip().splitlines()
    points = [tuple(map(float, line.split())) for line in lines[1:-1]]
    smallest = float(re.search(r": ([0-9.]+) \(±0\.001\)$", lines[-1]).group(1))
    return points, smallest


def test_cli_sweep_error_falls_with_spread_and_finds_the_smallest(capsys):
    assert cli.main(["convert", "--sweep"]) == 0
    points, smallest = parse_sweep(capsys.readouterr().out)
    spreads, errors = zip(*points, strict=True)
    assert spreads[0] == 0.5 and spreads[-1] == 12.0
    assert errors[0] > 0.5 and errors[-1] < 1e-14  # from mostly blurred to exact
    decreasing = [e for e in errors if e > 1e-14]
    assert all(a > b for a, b in itertools.pairwise(decreasing))
    # Recompute the error at the reported s, and just below it, on the same conv and input.
    conv = check.build_conv(nn.Conv2d, {"kernel_size": 3, "padding": 1}, torch.float64, seed=0)
    x = torch.randn(2, 4, 12, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        ref = conv(x)
        assert rel(conv_to_attention(conv, smallest)(x), ref) < 1e-6
        assert rel(conv_to_attention(conv, smallest - 0.002)(x), ref) >= 1e-6
        assert rel(conv_to_attention(conv, 4.0)(x), ref) == pytest.approx(errors[7], rel=1e-3)
    # exp(−s²/2) leak: 1e-6 is reached between s = 5 and 6.
    assert 5.0 < smallest < 6.0


def test_cli_sweep_threshold_and_bad_arguments(capsys):
    assert cli.main(["convert", "--sweep", "--threshold", "1e-10"]) == 0
    _, smallest = parse_sweep(capsys.readouterr().out)
    assert 6.5 < smallest < 7.5
    assert cli.main(["convert", "--sweep", "--threshold", "-1"]) == 2
    assert capsys.readouterr().err == (
        "attnconv convert: error: argument --threshold: expected a finite number in (0, 1), got "
        "'-1' (see attnconv convert --help)\n"
    )
    assert cli.main(["convert"]) == 2  # one of --check/--sweep is required
    assert "one of the arguments --check --sweep is required" in capsys.readouterr().err
