"""Attention rollout and the class token's attention: what ViT users look at beside the per-head
maps.

**Attention rollout** (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020)
follows attention through all the layers. Each layer's attention ``A_l`` (``T × T``, rows are
queries) is averaged over its heads and the residual connection added as an identity, with equal
weights, and each row renormalised to sum to one:

    Â_l = rownorm(0.5 · mean_h A_l,h + 0.5 · I)

(the rows of ``0.5·A + 0.5·I`` already sum to one; the renormalisation only removes rounding).
The rollout is the product through the layers, the first layer on the right:

    R = Â_L · Â_(L−1) ⋯ Â_1

Row ``i`` of ``R`` says how much of token ``i`` after the last layer comes from each input token
``j``, with attention as the only mixing; its rows sum to one. The class token's row over the
patches is the rollout map ViT users draw; a model without a class token (attnconv's) is read
from a query patch instead.

Layers with fewer prefix tokens than the last (ConViT adds its class token after its GPSA
layers) are padded: a token that does not exist yet passes through them unchanged (identity row
and column), so it enters the product where the model adds it.

**The class token's view**: per layer and head, the class token's row of the attention over the
patches (its attention to the other prefix tokens and to itself is left out, not renormalised:
the maps show where on the image the class token looks, and how much).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

# The weight of the attention against the residual's identity (Abnar & Zuidema's 0.5 / 0.5).
ATTENTION_WEIGHT = 0.5


def attention_rollout(
    probs: Sequence[Tensor], prefix_tokens: Sequence[int] | None = None
) -> Tensor:
    """The attention rollout (module docstring) of one model's layers.

    Args:
        probs: per layer ``(B, heads, T_l, T_l)``, rows are queries summing to one;
            ``T_l = prefix_tokens[l] + N`` (``N`` patches, after the prefix tokens).
        prefix_tokens: per layer the tokens before the patches (default: none in any layer).

    Returns:
        ``(B, T, T)`` float64 with ``T = max(prefix_tokens) + N``, rows sum to one; layers with
        fewer prefix tokens are padded with identity rows and columns for the missing ones
        (placed first, as the model places them).
    """
    if not probs:
        raise ValueError("attention_rollout needs at least one layer")
    prefix = [0] * len(probs) if prefix_tokens is None else list(prefix_tokens)
    if len(prefix) != len(probs):
        raise ValueError(f"{len(probs)} layers but {len(prefix)} prefix token counts")
    patches = {p.shape[-1] - k for p, k in zip(probs, prefix, strict=True)}
    if len(patches) != 1:
        raise ValueError(f"the layers hold different numbers of patches: {sorted(patches)}")
    most = max(prefix)
    tokens = most + patches.pop()
    batch = probs[0].shape[0]
    eye = torch.eye(tokens, dtype=torch.float64)
    rollout = eye.expand(batch, tokens, tokens).clone()
    for layer, count in zip(probs, prefix, strict=True):
        mixed = eye.expand(batch, tokens, tokens).clone()
        start = most - count  # the tokens this layer lacks come first: identity there
        mixed[:, start:, start:] = layer.double().mean(dim=1)
        step = ATTENTION_WEIGHT * mixed + (1 - ATTENTION_WEIGHT) * eye
        step = step / step.sum(dim=-1, keepdim=True)
        rollout = step @ rollout
    return rollout


def class_token_attention(probs: Sequence[Tensor], prefix_tokens: Sequence[int]) -> list:
    """Per layer, what the class token (token 0) attends to among the patches: ``(B, heads, N)``,
    its row of the probabilities at the patch columns (not renormalised); None for a layer
    without prefix tokens (no class token there yet)."""
    return [
        None if count == 0 else p[:, :, 0, count:].float()
        for p, count in zip(probs, prefix_tokens, strict=True)
    ]


@dataclass
class TokenViews:
    """Attention rollout and the class token's view of a model over ``B`` images.

    Attributes:
        rollout: ``(T, T)``, the mean over the images of each image's ``attention_rollout``.
        rollout_images: the ``(T, T)`` rollout of each of the first images kept.
        class_attention: per layer ``(heads, N)``, the mean over the images of
            ``class_token_attention`` (None for a layer without the class token); None for a
            model without a class token.
        class_attention_images: for each image kept, its per-layer ``(heads, N)`` (or None).
        prefix: the tokens before the ``N`` patches in the rollout (``T − N``).
        count: the images averaged.
    """

    rollout: Tensor
    rollout_images: list[Tensor]
    class_attention: list[Tensor | None] | None
    class_attention_images: list[list[Tensor | None]]
    prefix: int
    count: int


class TokenViewSums:
    """Sums ``TokenViews`` over batches of images (``add``), keeping the first ``keep`` images'
    own; ``result()`` the means."""

    def __init__(self, keep: int = 1) -> None:
        self.keep = keep
        self.count = 0
        self.prefix = 0
        self.rollout: Tensor | None = None
        self.rollout_images: list[Tensor] = []
        self.classes: list[Tensor | None] | None = None
        self.class_images: list[list[Tensor | None]] = []

    def add(self, probs: Sequence[Tensor], prefix_tokens: Sequence[int], class_token: bool) -> None:
        """One batch: per layer ``(B, heads, T_l, T_l)``, its prefix tokens, and whether the first
        of them is a class token."""
        rollout = attention_rollout(probs, prefix_tokens)
        self.prefix = max(prefix_tokens)
        self.rollout = rollout.sum(dim=0) + (0 if self.rollout is None else self.rollout)
        classes = class_token_attention(probs, prefix_tokens) if class_token else None
        if classes is not None:
            sums = [None if c is None else c.double().sum(dim=0) for c in classes]
            if self.classes is not None:
                sums = [s if s is None else s + t for s, t in zip(sums, self.classes, strict=True)]
            self.classes = sums
        for image in range(min(self.keep - len(self.rollout_images), rollout.shape[0])):
            self.rollout_images.append(rollout[image].float())
            if classes is not None:
                self.class_images.append([None if c is None else c[image] for c in classes])
        self.count += rollout.shape[0]

    def result(self) -> TokenViews:
        if self.rollout is None:
            raise ValueError("no images were added")
        classes = None
        if self.classes is not None:
            classes = [None if s is None else (s / self.count).float() for s in self.classes]
        return TokenViews(
            (self.rollout / self.count).float(),
            self.rollout_images,
            classes,
            self.class_images,
            self.prefix,
            self.count,
        )


@torch.no_grad()
def own_model_views(
    model: nn.Module, image_size: tuple[int, int], images: Tensor | None, keep: int = 1
) -> TokenViews:
    """``TokenViews`` of one of attnconv's attention models for inputs of ``image_size`` (no class
    token: rollout only). ``images``: float ``(B, C, H, W)`` in ``[0, 1]`` for a model with content
    scores, each image's
    rollout from its own attention (``forward(x, return_attention=True)``), ``CHUNK`` images per
    forward; None for a position-only model, whose attention is the same for every image."""
    from attnconv.models.modes import evaluating
    from attnconv.viz.maps import CHUNK, compute_attention

    sums = TokenViewSums(keep)
    if images is None:
        maps = compute_attention(model, image_size)
        sums.add([p[None] for p in maps.probs], [0] * len(maps.probs), class_token=False)
        return sums.result()
    device = next(model.parameters()).device
    with evaluating(model):
        for start in range(0, images.shape[0], CHUNK):
            _, probs = model(images[start : start + CHUNK].to(device), return_attention=True)
            sums.add([p.cpu() for p in probs], [0] * len(probs), class_token=False)
    return sums.result()
