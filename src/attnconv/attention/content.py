"""Attention with content scores: all logits of a head from one batched matrix product.

The logits of a content layer (docs/theory.md §1) are, for query pixel ``q = (q1, q2)`` and key
pixel ``k = (k1, k2)``,

    A[b, h, q, k] = Q[b, h, q] · K[b, h, k]  +  row[b, h, q, k1] + col[b, h, q, k2]  +  bias[h, q, k]

with ``Q`` the queries already divided by ``√d``. The row and column terms are the per-image
separable ones, the content × position score ``q · r_δ / √d`` (plus the positional score with it).
They are **folded** into the content product: each query is extended by its row and column
logits, each key by the indicators (one-hot) of its row and column,

    Q'[q] = [Q[q], row[q, :], col[q, :]],    K'[k] = [K[k], e_{k1}, e_{k2}],    Q' K'ᵀ = Q Kᵀ + row + col,

so no ``(B, heads, N, N)`` content × position tensor is built, and its gradient arrives through
``Q'`` (``dA · [e_{k1}, e_{k2}]``). A term shared by the batch (the positional score of a layer
without content × position) is instead added as one ``(heads, N, N)`` bias, its gradient summed
over the batch: at the Fashion-MNIST size (14×14 tokens, 9 heads of 16, batch 100) on a 2-core
AMD Zen 3 that trained the layer 1.3× faster than ``scaled_dot_product_attention`` with the bias
as mask (the path this replaced), folding it only 1.05× (a product 16 + 28 wide costs more than an
add from cache).

Then ``torch.softmax`` (one pass; a hand-written max-subtract / exp / sum / divide took twice as
long there, in float32 and bfloat16), dropout, the weighted sum, and a custom backward with the
products the gradients need (none for the indicators). Attention dropout is the usual independent
mask per image, head and entry, drawn by ``F.dropout`` on a tensor of the probabilities' shape as
the layer's dense path draws it (the same random numbers give the same mask). The products run in
the dtype that is fast on the device (``attnconv.hardware.compute_dtype``): bfloat16 where it is
native, float32 where bfloat16 would be emulated.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnconv.hardware import compute_dtype


def key_indicators(height: int, width: int, *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``(N, H + W)``: for each key pixel ``(k1, k2)`` (row-major), ones at ``k1`` and ``H + k2``."""
    rows = torch.arange(height, device=device).repeat_interleave(width)  # k1 of each pixel
    cols = torch.arange(width, device=device).repeat(height)  # k2 of each pixel
    return torch.cat([F.one_hot(rows, height), F.one_hot(cols, width)], dim=-1).to(dtype)


def per_query(row: Tensor, col: Tensor) -> tuple[Tensor, Tensor]:
    """Separable logits by query pixel: ``row (heads, H, H)`` and ``col (heads, W, W)`` over
    (query row, key row) and (query col, key col) → ``(heads, N, H)`` and ``(heads, N, W)`` with
    ``out[h, (q1, q2), k1] = row[h, q1, k1]`` and ``out[h, (q1, q2), k2] = col[h, q2, k2]``."""
    heads, height, _ = row.shape
    width = col.shape[-1]
    rows = row[:, :, None, :].expand(heads, height, width, height)
    cols = col[:, None, :, :].expand(heads, height, width, width)
    return rows.reshape(heads, -1, height), cols.reshape(heads, -1, width)


def content_attention(
    query: Tensor | None,
    key: Tensor | None,
    value: Tensor,
    row: Tensor | None = None,
    col: Tensor | None = None,
    bias: Tensor | None = None,
    dropout: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Softmax attention over the logits of the module docstring; returns ``(out, probs)``.

    Args:
        query: ``(B, heads, N, d)`` queries already divided by ``√d``, or ``None`` (no content
            product; then ``row`` and ``col`` are needed).
        key: ``(B, heads, N, d)``, or ``None`` exactly when ``query`` is.
        value: ``(B, heads|1, N, dv)``; one head is shared by all heads.
        row, col: ``(B|1, heads, N, H)`` and ``(B|1, heads, N, W)``, the logit each query adds for
            a key in row ``k1`` and column ``k2``; both or neither.
        bias: ``(heads, N, N)`` logits shared by the batch, added as they are.
        dropout: probability of dropping each attention weight (0 outside training).
    Returns:
        ``out (B, heads, N, dv)`` and ``probs (B, heads, N, N)``, the attention before dropout;
        both carry gradients. Both are in the compute dtype: the inputs' common dtype, or where
        autocast is on (and that is not float64) autocast's dtype for matrix products; float32
        where the device would emulate it (``attnconv.hardware.compute_dtype``).
    """
    if (query is None) != (key is None) or (row is None) != (col is None):
        raise ValueError("content_attention needs query with key and row with col")
    if query is None and row is None:
        raise ValueError("content_attention needs query and key, or row and col, or both")
    batch, _, n, _ = value.shape
    heads = (row if query is None else query).shape[1]
    device_type = value.device.type
    dtype = torch.promote_types(value.dtype, (row if query is None else query).dtype)
    # The meta device (shapes only: models/complexity.py counts multiply-adds there) has no
    # autocast.
    autocasts = device_type != "meta"
    if autocasts and torch.is_autocast_enabled(device_type) and dtype != torch.float64:
        dtype = torch.get_autocast_dtype(device_type)  # what autocast gives matrix products
    dtype = compute_dtype(dtype, value.device)
    with torch.autocast(device_type, enabled=False) if autocasts else contextlib.nullcontext():
        parts, indicators = [], None
        if query is not None:
            parts.append(query.to(dtype))
            key = key.to(dtype).contiguous()  # used in two products: one copy, not two
        if row is not None:
            height, width = row.shape[-1], col.shape[-1]
            if height * width != n:
                raise ValueError(
                    f"row and col cover {height}x{width} keys, expected {n} (N of the queries)"
                )
            parts += [
                row.to(dtype).expand(batch, heads, n, height),
                col.to(dtype).expand(batch, heads, n, width),
            ]
            indicators = key_indicators(height, width, dtype=dtype, device=value.device)
        queries = parts[0].contiguous() if len(parts) == 1 else torch.cat(parts, dim=-1)
        return _FoldedAttention.apply(
            queries,
            key,
            indicators,
            value.to(dtype).contiguous(),
            None if bias is None else bias.to(dtype),
            float(dropout),
        )


def _weighted_sum(weights: Tensor, value: Tensor) -> Tensor:
    """``weights (B, heads, N, N) @ value (B, heads|1, N, dv)`` → ``(B, heads, N, dv)``; a value
    shared by the heads takes one ``(heads·N, N) @ (N, dv)`` product per image."""
    batch, heads, n, _ = weights.shape
    if value.shape[1] == heads:
        return weights @ value
    return (weights.reshape(batch, heads * n, n) @ value[:, 0]).view(batch, heads, n, -1)


class _FoldedAttention(torch.autograd.Function):
    """``A = Q' K'ᵀ (+ bias)``, ``P = softmax(A)``, ``out = dropout(P) V``, with ``K' = [K, E]``
    (``E`` the key indicators, no gradient). Returns ``(out, P)``."""

    @staticmethod
    def forward(
        ctx: Any,
        queries: Tensor,
        key: Tensor | None,
        indicators: Tensor | None,
        value: Tensor,
        bias: Tensor | None,
        dropout: float,
    ) -> tuple[Tensor, Tensor]:
        batch, heads, n, _ = queries.shape
        if indicators is None:
            keys = key
        else:
            indicators = indicators.expand(batch, heads, n, indicators.shape[-1])
            keys = indicators if key is None else torch.cat([key, indicators], dim=-1)
        logits = queries @ keys.transpose(-1, -2)  # (B, heads, N, N)
        if bias is not None:
            logits += bias
        probs = torch.softmax(logits, dim=-1)
        del logits
        noise = None
        if dropout > 0.0:
            # The mask F.dropout draws for probs, rescaled: the same random numbers as the dense
            # path's F.dropout(probs), kept for the backward.
            noise = F.dropout(torch.ones_like(probs), dropout, training=True)
            out = _weighted_sum(probs * noise, value)
        else:
            out = _weighted_sum(probs, value)
        ctx.save_for_backward(queries, keys, value, probs, noise)
        ctx.set_materialize_grads(False)  # no zeros for unused probs (d_probs is then None)
        ctx.key_width = 0 if key is None else key.shape[-1]
        return out, probs

    @staticmethod
    def backward(ctx: Any, d_out: Tensor, d_probs: Tensor | None) -> tuple[Tensor | None, ...]:
        queries, keys, value, probs, noise = ctx.saved_tensors
        need_queries, need_key, _, need_value, need_bias, _ = ctx.needs_input_grad
        d_queries = d_key = d_value = d_bias = None
        batch, heads, n, _ = probs.shape
        if d_out is None:  # only the probabilities were used
            d_weights = d_probs
        else:
            applied = probs if noise is None else probs * noise
            if value.shape[1] == heads:
                if need_value:
                    d_value = applied.transpose(-1, -2) @ d_out  # (B, heads, N, dv)
                d_weights = d_out @ value.transpose(-1, -2)  # gradient of the applied weights
            else:  # one value head: products over (heads·N) rows per image
                d_out = d_out.reshape(batch, heads * n, -1)
                if need_value:
                    d_value = (applied.reshape(batch, heads * n, n).transpose(1, 2) @ d_out)[
                        :, None
                    ]
                d_weights = (d_out @ value[:, 0].transpose(1, 2)).view(batch, heads, n, n)
            del applied
            if noise is not None:
                d_weights *= noise
            if d_probs is not None:
                d_weights += d_probs
        # softmax's own backward, P ∘ (dP − Σ_k dP ∘ P) in one pass (the same from public
        # operations took 3× as long)
        d_logits = torch._softmax_backward_data(d_weights, probs, -1, probs.dtype)
        del d_weights
        if need_queries:
            d_queries = d_logits @ keys
        if need_key:
            d_key = d_logits.transpose(-1, -2) @ queries[..., : ctx.key_width]
        if need_bias:
            d_bias = d_logits.sum(0)
        return d_queries, d_key, None, d_value, d_bias, None
