"""A plain Vision Transformer (Dosovitskiy et al., ICLR 2021) on attnconv's token grid.

images (B, C, H, W) in [0, 1]
  -> normalise (fixed mean/std buffers)
  -> patches of ``patch_size × patch_size`` pixels, flattened and projected to ``hidden``
     (the ViT patch embedding: a strided ``patch_size`` convolution): (B, h, w, hidden)
  -> + learned absolute position embedding, one vector per patch ``(h, w, hidden)``
  -> ``depth`` pre-LayerNorm blocks (x + MHSA(LN(x)), then x + MLP(LN(x)), MLP = Linear -> GELU
     -> Linear), the attention content-only: ``softmax(qᵀk/√d)``, no positional score
  -> LayerNorm -> mean over the h·w patches -> Linear to classes

Departures from the ViT paper, so that the model sits beside the paper's attention models: no
class token (the head reads the mean of the patches, as ``ImageTransformer`` does and as later
"plain" ViT baselines do), which keeps every layer's attention on exactly the ``h × w`` patch
grid that attnconv's measures, figures and explorer read; heads may be narrower than
``hidden / heads`` (``head_dim``), since 9 heads do not divide a width of 64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attnconv.attention import MultiHeadSelfAttention2d
from attnconv.data.statistics import CIFAR10_MEAN, CIFAR10_STD
from attnconv.models.body import TransformerBody, check_positive_ints
from attnconv.models.decay import exempt_names

LAYER_NORM_EPS = 1e-6
POSITION_INIT_STD = 0.02


class PositionEmbedding(nn.Module):
    """Learned absolute position embedding: ``weight (h, w, hidden)``, one vector per patch.

    ``forward(x)`` adds it to tokens ``x (B, h', w', hidden)``; on another grid than the one it was
    built for the table is resized bicubically first (as ViT does to fine-tune at a new
    resolution).
    """

    def __init__(self, grid: tuple[int, int], hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(grid[0], grid[1], hidden))
        nn.init.trunc_normal_(self.weight, std=POSITION_INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = tuple(x.shape[1:3])
        table = self.weight
        if grid != tuple(table.shape[:2]):
            # (h, w, hidden) -> (1, hidden, h, w) -> resized -> (h', w', hidden)
            resized = F.interpolate(
                table.permute(2, 0, 1)[None], size=grid, mode="bicubic", align_corners=False
            )
            table = resized[0].permute(1, 2, 0)
        return x + table.to(x.dtype)


class ViTBlock(nn.Module):
    """One pre-LayerNorm transformer block on a token grid ``(B, h, w, hidden)``."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        head_dim: int,
        mlp_dim: int,
        dropout: float,
        attention_dropout: float,
    ) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)
        self.attention = MultiHeadSelfAttention2d(
            hidden,
            heads,
            head_dim=head_dim,
            positional=None,
            content=True,
            dropout=attention_dropout,
        )
        self.mlp_norm = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)
        self.mlp_in = nn.Linear(hidden, mlp_dim)
        self.mlp_out = nn.Linear(mlp_dim, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``(B, h, w, hidden)``; with ``return_attention`` also the probabilities
        ``(B, heads, h·w, h·w)``."""
        attended = self.attention(self.attention_norm(x), return_attention=return_attention)
        if return_attention:
            attended, probs = attended
        x = x + self.dropout(attended)
        x = x + self.dropout(self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x)))))
        return (x, probs) if return_attention else x


class VisionTransformer(TransformerBody):
    """Plain ViT classifier (module docstring), on the shared
    ``attnconv.models.body.TransformerBody`` (its ``stem`` is ``patch_size``).

    Args:
        num_classes: number of output logits.
        in_channels: image channels ``C``.
        image_size: the input ``(H, W)`` the position embedding is built for; other sizes (also
            multiples of ``patch_size``) resize it bicubically.
        mean, std: per-channel normalisation on the ``[0, 1]`` scale.
        patch_size: pixels per patch side; ``H`` and ``W`` must be multiples of it.
        hidden: token width.
        depth: number of blocks.
        heads: heads per layer.
        head_dim: query/key/value width of each head.
        mlp_dim: feed-forward width.
        dropout: dropout after the attention and after the feed-forward.
        attention_dropout: dropout on the attention probabilities.
        init_std: standard deviation of the normal initialisation of every Linear weight (biases
            start at zero); ``None`` uses ``1/√fan_in`` per layer. The position embedding starts
            ``N(0, 0.02²)`` truncated at ±2 (ViT's).
    """

    STEM_WORDS = ("patch size", "the patch embedding")

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        image_size: tuple[int, int] = (32, 32),
        mean: Sequence[float] = CIFAR10_MEAN,
        std: Sequence[float] = CIFAR10_STD,
        patch_size: int = 2,
        hidden: int = 64,
        depth: int = 4,
        heads: int = 9,
        head_dim: int = 16,
        mlp_dim: int = 128,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        init_std: float | None = None,
    ) -> None:
        check_positive_ints(
            num_classes=num_classes, in_channels=in_channels, patch_size=patch_size,
            hidden=hidden, depth=depth, heads=heads, head_dim=head_dim, mlp_dim=mlp_dim,
        )  # fmt: skip
        if init_std is not None and not init_std > 0:
            raise ValueError(f"init_std must be positive or None, got {init_std!r}")
        super().__init__(num_classes, in_channels, image_size, mean, std, patch_size, hidden)
        self.patch_size = patch_size
        self.position = PositionEmbedding(self.token_grid(*self.image_size), hidden)
        self.blocks = nn.ModuleList(
            ViTBlock(hidden, heads, head_dim, mlp_dim, dropout, attention_dropout)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)
        self.classifier = nn.Linear(hidden, num_classes)
        self.init_linears(init_std)

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)`` -> patch tokens ``(B, h, w, hidden)`` with their positions."""
        return self.position(super().tokens(images))

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """Patch tokens ``(B, h, w, hidden)`` -> their mean after the final LayerNorm
        ``(B, hidden)``."""
        return self.norm(x).mean(dim=(1, 2))

    def no_weight_decay_parameters(self, rule: str = "original") -> set[str]:
        """Names of parameters trained without weight decay under ``rule`` (``models/decay.py``):
        none under ``"original"`` (as the paper's code, which exempts only Gaussian geometry);
        the position embedding, LayerNorm scales/shifts and biases under
        ``"norms-biases-positional"``."""
        positional = {id(param) for param in self.position.parameters()}
        return exempt_names(self, rule, positional, geometry=set())
