"""The content path that ``attention/content.py`` replaced: the benchmarks' ``SDPA + bias`` peer.

Until then ``MultiHeadSelfAttention2d`` computed content scores with PyTorch's
``scaled_dot_product_attention``: queries and keys per head, every other score as one additive
``attn_mask`` (the positional logits ``(heads, N, N)`` plus, with content × position, the
``(B, heads, N, N)`` logits ``q · r_δ / √d``). The mask is passed 4-D, so that the fused kernel
runs where PyTorch has one for it: on a CPU only without gradients (a mask that needs a gradient
sends SDPA to its unfused ``math`` kernel, as a 3-D mask does in every mode). Layers with return of
the probabilities or without keys take the explicit ``(B, heads, N, N)`` softmax. It computes the
same function as the layer and is used only by the benchmarks (``content_layer.py``, ``train.py``).

    from sdpa_content import use_sdpa_content
    use_sdpa_content(model)   # every content layer of `model` now takes the old path
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from attnconv import MultiHeadSelfAttention2d


def sdpa_forward_content(
    layer: MultiHeadSelfAttention2d,
    x: Tensor,
    return_attention: bool = False,
    projection: tuple[Tensor, Tensor | None] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``layer._forward_content`` as it was: ``x (B, H, W, dim)`` → output ``(B, H, W, out)``
    and, with ``return_attention`` (or without keys), the probabilities ``(B, heads, N, N)``.
    ``projection``: the output map's ``(weight, bias)`` (default: the layer's own)."""
    batch, height, width, _ = x.shape
    n = height * width
    q, k, bias = layer._content_logits(x)  # the dense reference's queries, keys and mask
    v = layer._values(x).flatten(2, 3)  # (B, heads|1, N, d)
    v = v.expand(batch, layer.heads, n, v.shape[-1])  # (B, heads, N, d)
    dropout = layer.dropout if layer._dropout_active else 0.0
    if return_attention or k is None:
        probs = layer._content_probs(q, k, bias)
        y = (F.dropout(probs, dropout, True) if dropout else probs) @ v
    else:
        probs = None
        # A shared (heads, N, N) mask as (1, heads, N, N): PyTorch's fused CPU kernel takes only
        # 2-D or 4-D masks (a 3-D one sends it to the unfused ``math`` kernel).
        mask = None if bias is None else bias.view(-1, layer.heads, n, n)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    y = y.view(batch, layer.heads, height, width, -1)  # (B, heads, H, W, d)
    if projection is None:
        projection = (layer.out.weight, layer.out.bias)
    return layer._project_out(y, projection), probs


def use_sdpa_content(model: nn.Module) -> int:
    """Make every content layer (``not position_only``) of ``model`` take the old path.

    Replaces each such layer's ``_forward_content`` on the instance (parameters untouched).
    Returns the number of layers changed.
    """
    layers = [
        m
        for m in model.modules()
        if isinstance(m, MultiHeadSelfAttention2d) and not m.position_only
    ]
    for layer in layers:
        layer._forward_content = partial(sdpa_forward_content, layer)
    return len(layers)
