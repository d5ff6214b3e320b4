"""The naive dense attention that the fast paths of ``MultiHeadSelfAttention2d`` are measured against.

This is how the paper's original code computes a layer: logits for every (query, key) pixel pair
of every image, ``(B, heads, N, N)`` float32 probabilities from a plain softmax (no flushing of
probabilities that underflow into subnormal numbers), one matrix product per image and head, and
plain per-entry attention dropout. It computes the same function as the layer (up to float
rounding and the subnormal flush) and is used only by the benchmarks.

    from naive_attention import use_naive_attention
    use_naive_attention(model)   # every attention layer of `model` now runs the naive forward
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnconv import MultiHeadSelfAttention2d


def _pixel_offsets(height: int, width: int, like: Tensor) -> Tensor:
    """``(N, N, 2)`` offsets ``δ = key − query`` (row, col) for every pixel pair, row-major."""
    rows, cols = torch.meshgrid(
        torch.arange(height, device=like.device, dtype=like.dtype),
        torch.arange(width, device=like.device, dtype=like.dtype),
        indexing="ij",
    )
    pixels = torch.stack([rows.flatten(), cols.flatten()], dim=-1)  # (N, 2)
    return pixels[None, :, :] - pixels[:, None, :]


def _positional_logits(layer: MultiHeadSelfAttention2d, height: int, width: int) -> Tensor:
    """Position-only logits ``(heads, N, N)`` straight from the definitions (docs/theory.md §1)."""
    if layer.positional in ("gaussian", "gaussian_full"):
        delta = _pixel_offsets(height, width, layer.position.centers)  # (N, N, 2)
        e = delta[None] - layer.position.centers[:, None, None, :]  # (heads, N, N, 2)
        if layer.positional == "gaussian":
            return -0.5 * layer.position.spread[:, None, None] ** 2 * e.square().sum(-1)
        spread = layer.position.spread
        precision = spread @ spread.transpose(-1, -2)  # (heads, 2, 2)
        return -0.5 * torch.einsum("hqki,hij,hqkj->hqk", e, precision, e)
    embedding = _relative_embeddings(layer, height, width)  # (N, N, d)
    return torch.einsum("qkd,hd->hqk", embedding, layer.position.weight)


def _relative_embeddings(layer: MultiHeadSelfAttention2d, height: int, width: int) -> Tensor:
    """``r_δ = [r_row(δ1); r_col(δ2)]`` for every pixel pair: ``(N, N, head_dim)``."""
    position = layer.position
    delta = _pixel_offsets(height, width, position.row_embedding).long() + (layer.max_size - 1)
    return torch.cat(
        [position.row_embedding[delta[..., 0]], position.col_embedding[delta[..., 1]]], dim=-1
    )


def naive_attention_forward(
    layer: MultiHeadSelfAttention2d, x: Tensor, return_attention: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    """``layer``'s function computed naively: ``x (B, H, W, dim)`` → ``(B, H, W, out_dim)``.

    With ``return_attention`` also returns the probabilities ``(B, heads, H·W, H·W)``.
    """
    if layer.hard:
        raise ValueError("naive_attention_forward has no hard (s → ∞) attention; use the layer")
    batch, height, width, _ = x.shape
    n, heads, head_dim = height * width, layer.heads, layer.head_dim
    tokens = x.reshape(batch, n, layer.dim)
    logits = torch.zeros((), device=x.device).expand(batch, heads, n, n)  # (B, heads, N, N)
    if layer.positional is not None:
        logits = _positional_logits(layer, height, width).float().expand(batch, heads, n, n)
    if layer.query is not None:
        q = layer.query(tokens).view(batch, n, heads, head_dim).transpose(1, 2)
        if layer.key is not None:
            k = layer.key(tokens).view(batch, n, heads, head_dim).transpose(1, 2)
            logits = logits + (q @ k.transpose(-1, -2)).float() / math.sqrt(head_dim)
        if layer.content_positional:
            r = _relative_embeddings(layer, height, width)  # (N, N, d)
            logits = logits + torch.einsum("bhqd,qkd->bhqk", q, r).float() / math.sqrt(head_dim)
    probs = torch.softmax(logits, dim=-1)  # (B, heads, N, N) float32, subnormals and all
    applied = F.dropout(probs, layer.dropout, layer.training)
    if layer.value is None:
        values = tokens[:, None].expand(batch, heads, n, layer.dim)
    else:
        values = layer.value(tokens).view(batch, n, heads, head_dim).transpose(1, 2)
    y = applied.to(values.dtype) @ values  # (B, heads, N, d)
    y = layer.out(y.transpose(1, 2).reshape(batch, height, width, heads * values.shape[-1]))
    return (y, probs) if return_attention else y


def use_naive_attention(model: nn.Module) -> int:
    """Make every ``MultiHeadSelfAttention2d`` in ``model`` run ``naive_attention_forward``.

    Replaces each layer's ``forward`` on the instance (parameters are untouched). Returns the
    number of layers changed.
    """
    layers = [m for m in model.modules() if isinstance(m, MultiHeadSelfAttention2d)]
    for layer in layers:
        layer.forward = partial(naive_attention_forward, layer)
    return len(layers)
