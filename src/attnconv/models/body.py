"""The transformer body that ``ImageTransformer`` and ``VisionTransformer`` share, on a token grid.

images (B, C, H, W) in [0, 1]
  -> normalise (fixed mean/std buffers)
  -> space-to-depth by ``stem``: (B, h, w, C·stem²), h = H/stem, w = W/stem
  -> Linear to ``hidden``: tokens (B, h, w, hidden)          (``tokens``: a model may add to them)
  -> ``blocks``, each (B, h, w, hidden) -> (B, h, w, hidden)
  -> mean over the h·w tokens: (B, hidden)                    (``pooled``: a model may norm first)
  -> ``classifier``: Linear to classes

A model configures it: it builds its ``blocks`` (each with an ``attention`` layer and
``forward(x, return_attention)``) and its ``classifier``, and says how errors name its stem.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from attnconv.attention import MultiHeadSelfAttention2d
from attnconv.models.normalize import Normalize, check_images, space_to_depth


def check_positive_ints(**values: object) -> None:
    """ValueError naming the first of ``values`` (name=value, in order) that is not an int >= 1."""
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


class TransformerBody(nn.Module):
    """Normalisation, stem, token embedding, block stack and classifier head of a transformer on a
    token grid (module docstring). ``__init__`` makes the first two; the model then adds
    ``blocks`` (an ``nn.ModuleList``) and ``classifier`` (``Linear(hidden, num_classes)``).

    Args:
        num_classes, in_channels, image_size, mean, std: as the models take them.
        stem: input pixels per token side (the space-to-depth width, a ViT's patch size; the
            figures and the explorer read ``stem``).
        hidden: token width.
    """

    # How errors name the stem: (the stem's name, what needs H and W to be multiples of it).
    STEM_WORDS = ("stem width", "the space-to-depth stem")
    blocks: nn.ModuleList
    classifier: nn.Linear

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        image_size: tuple[int, int],
        mean: Sequence[float],
        std: Sequence[float],
        stem: int,
        hidden: int,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.stem = stem
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.normalize = Normalize(mean, std, in_channels)
        self.embed = nn.Linear(in_channels * stem * stem, hidden)

    def token_grid(self, height: int, width: int) -> tuple[int, int]:
        """The token grid ``(h, w) = (H / stem, W / stem)`` for an ``H×W`` image; ValueError
        unless ``stem`` divides both."""
        name, needs = self.STEM_WORDS
        if height < 1 or width < 1 or height % self.stem or width % self.stem:
            raise ValueError(
                f"image size {height}x{width} is not divisible by the {name} {self.stem}: "
                f"{needs} needs H and W to be positive multiples of {self.stem}"
            )
        return height // self.stem, width // self.stem

    def attention_layers(self) -> list[MultiHeadSelfAttention2d]:
        """The attention layers, one per block, first to last."""
        return [block.attention for block in self.blocks]

    def heads_per_layer(self) -> list[int]:
        """Current number of heads of each layer (changes when heads are pruned)."""
        return [layer.heads for layer in self.attention_layers()]

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)`` -> tokens ``(B, h, w, hidden)``: normalised, space-to-depth by
        ``stem``, embedded."""
        return self.embed(space_to_depth(self.normalize(images), self.stem).permute(0, 2, 3, 1))

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``(B, h, w, hidden)`` -> ``(B, hidden)``, what the classifier reads: their
        mean."""
        return x.mean(dim=(1, 2))

    def forward(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """``x``: float images ``(B, in_channels, H, W)`` in ``[0, 1]``.

        Returns logits ``(B, num_classes)``; with ``return_attention`` also a list over layers
        of attention probabilities ``(B, heads, h·w, h·w)`` on the token grid (row-major tokens,
        rows are queries).
        """
        check_images(x, self.in_channels, type(self).__name__)
        self.token_grid(x.shape[2], x.shape[3])
        x = self.tokens(x)
        attentions = []
        for block in self.blocks:
            if return_attention:
                x, probs = block(x, return_attention=True)
                attentions.append(probs)
            else:
                x = block(x)
        logits = self.classifier(self.pooled(x))
        return (logits, attentions) if return_attention else logits

    def init_linears(self, std: float | None) -> None:
        r"""Every ``Linear`` weight drawn from $\mathcal N(0, \text{std}^2)$ (``None``:
        $\mathcal N(0, 1/\text{fan\_in})$, each layer its own), every bias zero."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=module.in_features**-0.5 if std is None else std)
                nn.init.zeros_(module.bias)
