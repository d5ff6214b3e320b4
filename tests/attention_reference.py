"""A plain, independent reference for ``MultiHeadSelfAttention2d``.

Written from the formulas of docs/theory.md §1 only (it shares no code with the package): explicit pixel
coordinates, an explicit ``(B, heads, N, N)`` score tensor, ``torch.softmax``, a weighted sum.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnconv import MultiHeadSelfAttention2d


def pixel_offsets(height: int, width: int, dtype: torch.dtype) -> Tensor:
    """``(N, N, 2)``: ``out[q, k] = coords[k] − coords[q]`` with row-major pixel coordinates."""
    coords = torch.tensor([(i, j) for i in range(height) for j in range(width)], dtype=dtype)
    return coords[None, :, :] - coords[:, None, :]


def reference_scores(layer: MultiHeadSelfAttention2d, x: Tensor) -> Tensor:
    """``(B, heads, N, N)`` attention logits of ``layer`` on ``x (B, H, W, dim)``."""
    batch, height, width, _ = x.shape
    n = height * width
    heads, d = layer.heads, layer.head_dim
    delta = pixel_offsets(height, width, x.dtype)  # (N, N, 2)
    logits = torch.zeros(batch, heads, n, n, dtype=x.dtype)
    if layer.positional == "gaussian":
        diff = delta[None] - layer.position.centers[:, None, None, :]  # (heads, N, N, 2)
        logits = logits + (-0.5 * layer.position.spread[:, None, None] ** 2 * (diff**2).sum(-1))
    elif layer.positional == "gaussian_full":
        diff = delta[None] - layer.position.centers[:, None, None, :]
        precision = layer.position.spread @ layer.position.spread.transpose(1, 2)  # (heads, 2, 2)
        logits = logits + (-0.5 * torch.einsum("hqki,hij,hqkj->hqk", diff, precision, diff))
    if layer.positional == "learned":
        m = layer.max_size
        rows = layer.position.row_embedding[(delta[..., 0] + m - 1).long()]  # (N, N, d_row)
        cols = layer.position.col_embedding[(delta[..., 1] + m - 1).long()]  # (N, N, d_col)
        r = torch.cat([rows, cols], dim=-1)  # (N, N, d) = r_δ
        logits = logits + torch.einsum("qkc,hc->hqk", r, layer.position.weight)
    if layer.content or layer.content_positional:
        tokens = x.reshape(batch, n, -1)
        q = (tokens @ layer.query.weight.T + layer.query.bias).view(batch, n, heads, d)
        if layer.content:
            k = (tokens @ layer.key.weight.T + layer.key.bias).view(batch, n, heads, d)
            logits = logits + torch.einsum("bqhc,bkhc->bhqk", q, k) / math.sqrt(d)
        if layer.content_positional:
            logits = logits + torch.einsum("bqhc,qkc->bhqk", q, r) / math.sqrt(d)
    return logits


def reference_forward(layer: MultiHeadSelfAttention2d, x: Tensor) -> tuple[Tensor, Tensor]:
    """Output ``(B, H, W, out_dim)`` and probabilities ``(B, heads, N, N)`` of ``layer`` (eval)."""
    batch, height, width, dim = x.shape
    n = height * width
    probs = torch.softmax(reference_scores(layer, x), dim=-1)
    tokens = x.reshape(batch, n, dim)
    if layer.value is None:
        values = tokens[:, None].expand(batch, layer.heads, n, dim)
    else:
        values = (
            (tokens @ layer.value.weight.T + layer.value.bias)
            .view(batch, n, layer.heads, layer.head_dim)
            .transpose(1, 2)
        )
    per_head = probs @ values  # (B, heads, N, d)
    concat = per_head.transpose(1, 2).reshape(batch, n, -1)
    out = concat @ layer.out.weight.T + layer.out.bias
    return out.view(batch, height, width, -1), probs


# ---------------------------------------------------------------- comparing with it


def randomize(layer: MultiHeadSelfAttention2d, generator: torch.Generator) -> None:
    """Random parameters that give non-trivial attention (not just the near-uniform init)."""

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "position.centers":
                p.copy_(2.0 * rand(*p.shape))
            elif name == "position.spread" and p.dim() == 1:
                p.copy_(0.4 + torch.rand(p.shape, generator=generator, dtype=torch.float64))
            elif name == "position.spread":
                p.copy_(torch.eye(2, dtype=torch.float64) * 0.8 + 0.3 * rand(*p.shape))
            else:
                p.copy_(
                    rand(*p.shape) * (0.8 if "embedding" in name else 1.0 / math.sqrt(p.shape[-1]))
                )


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-300) -> float:
    """Largest absolute difference relative to the largest magnitude of ``b`` (at least ``floor``)."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(floor)).item()


def grad_floor(grads: dict[str, torch.Tensor]) -> float:
    """Scale for gradients that vanish in exact arithmetic (e.g. the key bias): 10% of the largest."""
    return 0.1 * max(g.abs().max().item() for g in grads.values())
