"""The benchmarks' content peers (SDPA + bias, the previous path) compute the same function as
the layer, and content_layer.py prints its comparison."""

import re
from functools import partial

import pytest
import torch

import content_layer
from attnconv import MultiHeadSelfAttention2d
from sdpa_content import sdpa_forward_content, use_sdpa_content

FORMS = [
    {"positional": "learned", "content": True},
    {"positional": "learned", "content": True, "content_positional": True},
    {"positional": "learned", "content_positional": True},
    {"positional": "gaussian_full", "content": True},
    {"positional": None, "content": True},
]


@pytest.mark.parametrize(
    "kwargs", FORMS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items())
)
def test_old_path_matches_layer_forward_and_gradients(kwargs: dict) -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(8, 3, head_dim=4, max_size=6, **kwargs).double()
    with torch.no_grad():  # attention far from uniform
        for param in layer.parameters():
            param.mul_(4.0)
    x = torch.randn(2, 5, 6, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 5, 6, 8, dtype=torch.float64)
    results = []
    projection = (layer.out.weight, layer.out.bias)
    for forward in (layer._forward_content, partial(sdpa_forward_content, layer)):
        y, _ = forward(x, False, projection)
        grads = torch.autograd.grad((y * weight).sum(), [x, *layer.parameters()])
        _, probs = forward(x, True, projection)
        results.append((y, probs, grads))
    (y, probs, grads), (y_old, probs_old, grads_old) = results
    torch.testing.assert_close(y_old, y, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(probs_old, probs, rtol=1e-10, atol=1e-12)
    assert probs.shape == (2, 3, 30, 30)
    for got, expected in zip(grads_old, grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)


def test_use_sdpa_content_replaces_only_content_layers() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        MultiHeadSelfAttention2d(8, 2, positional="learned", content=True, max_size=4),
        MultiHeadSelfAttention2d(8, 2, positional="gaussian"),
    )
    x = torch.randn(3, 4, 4, 8)
    expected = model(x)
    assert use_sdpa_content(model) == 1
    assert model[0]._forward_content.func is sdpa_forward_content
    assert "_forward_content" not in vars(model[1])
    torch.testing.assert_close(model(x), expected, atol=1e-6, rtol=1e-5)


def test_previous_path_matches_layer_forward_and_gradients() -> None:
    torch.manual_seed(0)
    layer = content_layer.fashion_content_layer(torch.device("cpu")).double()
    x = torch.randn(2, 14, 14, 64, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 14, 14, 64, dtype=torch.float64)
    results = []
    for forward in (layer, partial(content_layer.previous_forward, layer)):
        y = forward(x)
        grads = torch.autograd.grad((y * weight).sum(), [x, *layer.parameters()])
        results.append((y, grads))
    (y, grads), (y_old, grads_old) = results
    torch.testing.assert_close(y_old, y, rtol=1e-10, atol=1e-12)
    for got, expected in zip(grads_old, grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)


def test_content_layer_benchmark_prints_every_route_mode_and_peer_as_ratios(
    monkeypatch, capsys
) -> None:
    monkeypatch.setattr(content_layer, "reuse_freed_memory", lambda: True)  # not in the tests
    threads = torch.get_num_threads()
    try:
        content_layer.main(["--sizes", "fashion", "--batch", "2", "--rounds", "1",
                            "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CPU ") and "1 threads" in lines[0]
    [header] = [line for line in lines if line.split()[:2] == ["no-grad", "fp32"]]
    assert header.split() == [word for mode in content_layer.MODES for word in mode]
    rows = {line.split("  ")[0]: line for line in lines if re.search(r"\d+\.\d\d \(", line)}
    routes = [name for name in rows if name.startswith("route: ")]
    assert "route: fused" in routes and any(name.startswith("route: folded") for name in routes)
    for name in ["layer, as it picks", "SDPA + bias", "previous"]:
        assert len(re.findall(r"\d+\.\d\d \(\d+\.\d\dx\)", rows[name])) == 4, name
    assert rows["layer, as it picks"].count("(1.00x)") == 4
    [picked] = [line for line in lines if line.startswith("picked: ")]
    assert all(f"{mode} {precision}: " in picked for mode, precision in content_layer.MODES)
    [header] = [line for line in lines if line.startswith("precision ")]
    assert header.split()[1:] == ["learned-content-fashion", "content,", "two", "maps",
                                  "vit-fashion", "vit-fashion", "/", "learned-content-fashion",
                                  "two", "maps", "/", "folded"]
    for precision in ("fp32", "bf16"):
        [line] = [line for line in lines if line.startswith(precision + " ")]
        assert len(re.findall(r"\d+\.\dms", line)) == 3 and len(re.findall(r"\d+\.\d+x", line)) == 2
    targets = [line for line in lines if "(target " in line]
    assert len(targets) == 2 * len(content_layer.MODES)
