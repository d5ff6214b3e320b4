"""The peers ``benchmarks/attention.py`` times the layer against compute the layer's function."""

import re

import pytest
import torch

import attention
from attention import FLEX_VALUE_CHUNK, flex_forward, sdpa_bias_forward, shared_dense_forward
from attnconv import MultiHeadSelfAttention2d


def gaussian_layer(dim: int = 6) -> MultiHeadSelfAttention2d:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(dim, 3, positional="gaussian").double()
    with torch.no_grad():  # centres off the grid and distinct spreads
        layer.position.centers.copy_(torch.tensor([[0.4, -1.3], [-2.0, 0.7], [1.1, 1.9]]))
        layer.position.spread.copy_(torch.tensor([0.6, 1.0, 1.7]))
    return layer


@pytest.mark.parametrize("peer", [shared_dense_forward, sdpa_bias_forward])
def test_the_dense_peers_match_the_layer_forward_and_backward(peer) -> None:
    layer = gaussian_layer()
    x = torch.randn(3, 5, 7, 6, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 5, 7, 6, dtype=torch.float64)
    parameters = [x, *layer.parameters()]
    expected = layer(x)
    expected_grads = torch.autograd.grad(expected, parameters, grad)
    got = peer(layer, x)
    got_grads = torch.autograd.grad(got, parameters, grad)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    for got_grad, expected_grad in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(got_grad, expected_grad, rtol=1e-9, atol=1e-10)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("dim", [6, FLEX_VALUE_CHUNK + 2])  # one value chunk; two of 65 channels
def test_flex_attention_form_matches_the_layer(dim: int) -> None:
    layer = gaussian_layer(dim).float()
    x = torch.randn(2, 5, 7, dim)
    with torch.no_grad():
        torch.testing.assert_close(
            flex_forward(layer, 7, compile=False)(x), layer(x), rtol=1e-4, atol=1e-5
        )


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_benchmark_prints_every_route_the_pick_and_the_peers_per_mode(
    monkeypatch, capsys
) -> None:
    monkeypatch.setattr(attention, "reuse_freed_memory", lambda: True)  # not in the tests
    # FlexAttention unfused (compiling it takes a minute here; the test above checks its function)
    monkeypatch.setattr(attention, "flex_forward",
                        lambda layer, width: flex_forward(layer, width, compile=False))
    threads = torch.get_num_threads()
    try:
        attention.main(["--sections", "peers", "--sizes", "fashion", "--batch", "2",
                        "--repeats", "1", "--threads", "1", "--precision", "bf16"])
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CPU ") and "1 threads" in lines[0]
    rows = {line.split("  ")[0]: line for line in lines if re.search(r"\d+\.\d\d \(", line)}
    assert {"route: shared", "route: separable"} <= set(rows)
    assert any(name.startswith("route: per head, chunks of ") for name in rows)
    for name in ["layer, as it picks", *attention.PEERS[:3], attention.FLOOR]:
        assert len(re.findall(r"\d+\.\d\d \(\d+\.\d\dx\)", rows[name])) == 4, name
    assert rows["layer, as it picks"].count("(1.00x)") == 4
    assert len(re.findall(r"\d+\.\d\d \(", rows["flex (compiled)"])) == 1  # no-grad fp32 only
    [picked] = [line for line in lines if line.startswith("picked: ")]
    assert all(f"{mode} {precision}: " in picked for mode, precision in attention.MODES)
    targets = [line for line in lines if "(target " in line]
    # per mode: picked route / fastest, best peer / layer; and the floor in fwd+bwd fp32
    assert len(targets) == 2 * len(attention.MODES) + 1
