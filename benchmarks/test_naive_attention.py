"""The benchmarks' naive dense attention computes the same function as the layer."""

import pytest
import torch

from attnconv import MultiHeadSelfAttention2d
from naive_attention import naive_attention_forward, use_naive_attention

CONFIGS = [
    {"positional": "gaussian"},
    {"positional": "gaussian", "head_dim": 5},
    {"positional": "gaussian_full"},
    {"positional": "learned", "max_size": 8},
    {"positional": "learned", "content": True, "content_positional": True, "max_size": 8,
     "head_dim": 6},
    {"positional": None, "content": True, "head_dim": 4},
]


@pytest.mark.parametrize("kwargs", CONFIGS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_naive_forward_matches_layer(kwargs: dict) -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(12, 3, **kwargs).eval()
    with torch.no_grad():  # non-trivial geometry: centres off the grid, anisotropic spreads
        if kwargs["positional"] in ("gaussian", "gaussian_full"):
            layer.position.centers.copy_(torch.tensor([[0.0, 0.0], [1.5, -2.0], [-1.0, 3.0]]))
    x = torch.randn(2, 5, 7, 12)
    y_layer, p_layer = layer(x, return_attention=True)
    y_naive, p_naive = naive_attention_forward(layer, x, return_attention=True)
    assert p_naive.shape == (2, 3, 35, 35)
    torch.testing.assert_close(p_naive, p_layer, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(y_naive, y_layer, atol=1e-5, rtol=1e-5)


def test_use_naive_attention_replaces_every_layer() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        MultiHeadSelfAttention2d(8, 2, positional="gaussian"),
        MultiHeadSelfAttention2d(8, 2, positional="gaussian_full"),
    ).eval()
    x = torch.randn(3, 4, 4, 8)
    expected = model(x)
    assert use_naive_attention(model) == 2
    # The replaced forward is the naive one, called through the module with its keywords.
    x_mid, probs = model[0](x, return_attention=True)
    assert probs.shape == (3, 2, 16, 16)
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x_mid, naive_attention_forward(model[0], x), atol=0, rtol=0)
