"""The peers ``benchmarks/attention.py`` times the layer against compute the layer's function."""

import pytest
import torch

from attention import FLEX_VALUE_CHUNK, flex_forward, shared_dense_forward
from attnconv import MultiHeadSelfAttention2d


def gaussian_layer(dim: int = 6) -> MultiHeadSelfAttention2d:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(dim, 3, positional="gaussian").double()
    with torch.no_grad():  # centres off the grid and distinct spreads
        layer.position.centers.copy_(torch.tensor([[0.4, -1.3], [-2.0, 0.7], [1.1, 1.9]]))
        layer.position.spread.copy_(torch.tensor([0.6, 1.0, 1.7]))
    return layer


def test_shared_dense_form_matches_the_layer_forward_and_backward() -> None:
    layer = gaussian_layer()
    x = torch.randn(3, 5, 7, 6, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 5, 7, 6, dtype=torch.float64)
    expected = layer(x)
    (expected_grad,) = torch.autograd.grad(expected, x, grad)
    got = shared_dense_forward(layer, x)
    (got_grad,) = torch.autograd.grad(got, x, grad)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got_grad, expected_grad, rtol=1e-10, atol=1e-10)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("dim", [6, FLEX_VALUE_CHUNK + 2])  # one value chunk; two of 65 channels
def test_flex_attention_form_matches_the_layer(dim: int) -> None:
    layer = gaussian_layer(dim).float()
    x = torch.randn(2, 5, 7, dim)
    with torch.no_grad():
        torch.testing.assert_close(
            flex_forward(layer, 7, compile=False)(x), layer(x), rtol=1e-4, atol=1e-5
        )
