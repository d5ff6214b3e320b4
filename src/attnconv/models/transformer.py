"""The paper's image transformer: BERT over pixels, with 2-D attention from ``attnconv.attention``.

images (B, C, H, W) in [0, 1]
  -> normalise (fixed mean/std buffers)
  -> space-to-depth by ``stem`` ("invertible pooling"): (B, h, w, C·stem²), h = H/stem, w = W/stem
  -> Linear to ``hidden``
  -> ``depth`` post-LayerNorm BERT blocks (MHSA -> Linear -> dropout -> +res -> LayerNorm ->
     Linear -> GELU -> Linear -> dropout -> +res -> LayerNorm)
  -> mean over the h·w tokens -> Linear to classes
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnconv.attention import POSITIONAL_SCORES, MultiHeadSelfAttention2d, PositionalScore
from attnconv.data.statistics import CIFAR10_MEAN, CIFAR10_STD
from attnconv.models.body import TransformerBody, check_positive_ints
from attnconv.models.decay import exempt_names

LAYER_NORM_EPS = 1e-12
POSITIONAL = (*POSITIONAL_SCORES, None)
WEIGHT_INITS: tuple[str, ...] = ("original", "bert", "fan_in")
r"""How an [`ImageTransformer`][] starts
([the mathematics, §4, "Initialisation"][initialisation]):

* ``"original"``: as the paper's code ran (its image model never applies BERT's initialisation):
  PyTorch's defaults, every ``Linear`` weight and bias $\mathcal U(\pm 1/\sqrt{\text{fan\_in}})$,
  learned tables $\mathcal N(0, 1)$, their head keys $\mathcal U(\pm 1/\sqrt{\text{fan\_in}})$ per
  axis;
* ``"bert"``: BERT's, every ``Linear`` weight $\mathcal N(0, 0.02^2)$ with zero biases, learned
  tables $\mathcal N(0, 0.02^2)$;
* ``"fan_in"``: every ``Linear`` weight $\mathcal N(0, 1/\text{fan\_in})$ with zero biases, learned
  tables as ``"bert"`` (attnconv's earlier choice for its small presets).

``ImageTransformer(positional_init=…)`` draws the learned tables another way than ``weight_init``
implies ([`POSITIONAL_INITS`][]): ``weight_init="fan_in", positional_init="original"`` starts the
Linear layers at $\mathcal N(0, 1/\text{fan\_in})$ and the tables and head keys as the paper's code
did.

Gaussian centres and spreads start as the paper says under all three; LayerNorms at scale 1,
shift 0."""
POSITIONAL_INITS: tuple[str, ...] = ("original", "bert", "grid")
r"""How the positional scores start: the learned tables and head keys ``"original"``
($\mathcal N(0, 1)$ tables, keys $\mathcal U(\pm 1/\sqrt{\text{fan\_in}})$) or ``"bert"``
($\mathcal N(0, 0.02^2)$); the Gaussian heads at the paper's random centres under both, or
``"grid"``: on the taps of a $K \times K$ kernel, $K^2$ = ``heads``, as Theorem 1 builds a
convolution (``attnconv.attention.positional.grid_centers``); see
[`MultiHeadSelfAttention2d`][]."""
_POSITIONAL_INIT = {"original": "original", "bert": "bert", "fan_in": "bert"}


def upgrade_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    r"""Constructor arguments saved by an earlier attnconv, in today's terms: ``init_std`` (a
    float: BERT's normal initialisation, ``None``: $\mathcal N(0, 1/\text{fan\_in})$) becomes
    ``weight_init``.
    Only the start of training depended on it; saved weights load the same."""
    arguments = dict(arguments)
    if "init_std" in arguments:
        arguments["weight_init"] = "fan_in" if arguments.pop("init_std") is None else "bert"
    return arguments


class TransformerBlock(nn.Module):
    """One post-LayerNorm BERT layer on a token grid ``(B, h, w, hidden) -> (B, h, w, hidden)``."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        head_dim: int,
        mlp_dim: int,
        positional: str | None,
        content: bool,
        content_positional: bool,
        max_size: int,
        dropout: float,
        attention_dropout: float,
        position_term: bool,
        positional_init: str,
    ) -> None:
        super().__init__()
        self.attention = MultiHeadSelfAttention2d(
            hidden,
            heads,
            head_dim=head_dim,
            positional=positional,
            content=content,
            content_positional=content_positional,
            dropout=attention_dropout,
            max_size=max_size,
            position_term=position_term,
            positional_init=positional_init,
        )
        self.attention_dense = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)
        self.mlp_in = nn.Linear(hidden, mlp_dim)
        self.mlp_out = nn.Linear(mlp_dim, hidden)
        self.mlp_norm = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``(B, h, w, hidden)``; with ``return_attention`` also the probabilities
        ``(B, heads, h·w, h·w)``."""
        # The dense map is folded into the attention's output projection where that is cheaper
        # (two linear maps in a row are one).
        if return_attention:
            attended, probs = self.attention(x, return_attention=True, then=self.attention_dense)
        else:
            attended = self.attention(x, then=self.attention_dense)
        x = self.attention_norm(x + self.dropout(attended))
        x = self.mlp_norm(x + self.dropout(self.mlp_out(F.gelu(self.mlp_in(x)))))
        return (x, probs) if return_attention else x


class ImageTransformer(TransformerBody):
    r"""Transformer classifier over pixels (Cordonnier et al., 2020, §4), on the shared
    ``attnconv.models.body.TransformerBody``.

    Args:
        num_classes: number of output logits.
        in_channels: image channels ``C``.
        image_size: the default input ``(H, W)``: checked against ``stem`` and ``max_size`` at
            construction and used by complexity counts; other sizes are accepted at call time.
        mean, std: per-channel normalisation on the ``[0, 1]`` scale (one value per channel).
        stem: space-to-depth width; ``2`` is the paper's 2×2 invertible pooling, ``1`` keeps one
            token per pixel. ``H`` and ``W`` must be divisible by it.
        hidden: token width.
        depth: number of blocks.
        heads: heads per layer, an int or one int per layer (pruned models).
        head_dim: per-head width; ``None`` means ``hidden`` (no value projection, as in the paper).
        mlp_dim: feed-forward width.
        positional, content, content_positional, position_term, max_size: the attention's
            scores, see [`MultiHeadSelfAttention2d`][]; ``max_size`` bounds the token
            grid for ``"learned"``.
        dropout: dropout after the attention dense and after the feed-forward.
        attention_dropout: dropout on the attention probabilities.
        weight_init: how the weights start, one of [`WEIGHT_INITS`][]: ``"original"`` (the paper's
            code: PyTorch's defaults, learned tables $\mathcal N(0, 1)$), ``"bert"``
            ($\mathcal N(0, 0.02^2)$) or ``"fan_in"`` ($\mathcal N(0, 1/\text{fan\_in})$).
        positional_init: how the positional scores start, one of [`POSITIONAL_INITS`][]; ``None``
            (default) follows ``weight_init`` (``"original"`` for ``"original"``, ``"bert"`` for the
            other two), which only the learned encoding's tables and keys depend on. ``"grid"``
            (Gaussian encodings only) starts every layer's heads on the taps of a $K \times K$
            kernel ($K^2$ = ``heads``), Theorem 1's construction as a start.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        image_size: tuple[int, int] = (32, 32),
        mean: Sequence[float] = CIFAR10_MEAN,
        std: Sequence[float] = CIFAR10_STD,
        stem: int = 2,
        hidden: int = 400,
        depth: int = 6,
        heads: int | Sequence[int] = 9,
        head_dim: int | None = None,
        mlp_dim: int = 512,
        positional: str | None = "gaussian",
        content: bool = False,
        content_positional: bool = False,
        max_size: int = 32,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        weight_init: str = "original",
        position_term: bool = True,
        positional_init: str | None = None,
    ) -> None:
        check_positive_ints(
            num_classes=num_classes, in_channels=in_channels, stem=stem, hidden=hidden,
            depth=depth, mlp_dim=mlp_dim, max_size=max_size,
        )  # fmt: skip
        if weight_init not in WEIGHT_INITS:
            raise ValueError(f"weight_init must be one of {WEIGHT_INITS}, got {weight_init!r}")
        if positional_init is not None and positional_init not in POSITIONAL_INITS:
            raise ValueError(
                f"positional_init must be one of {POSITIONAL_INITS} or None (follow weight_init), "
                f"got {positional_init!r}"
            )
        if positional not in POSITIONAL:
            raise ValueError(f"positional must be one of {POSITIONAL}, got {positional!r}")
        if positional_init == "grid" and positional not in ("gaussian", "gaussian_full"):
            raise ValueError(
                f'positional_init="grid" places Gaussian heads on kernel taps; it needs '
                f"positional='gaussian' or 'gaussian_full', got {positional!r}"
            )
        heads_per_layer = [heads] * depth if isinstance(heads, int) else list(heads)
        if len(heads_per_layer) != depth or not all(
            isinstance(h, int) and h >= 1 for h in heads_per_layer
        ):
            raise ValueError(
                f"heads must be a positive int or a list of {depth} positive ints (one per "
                f"layer), got {heads!r}"
            )
        super().__init__(num_classes, in_channels, image_size, mean, std, stem, hidden)
        self.positional = positional
        self.max_size = max_size
        self.blocks = nn.ModuleList(
            TransformerBlock(
                hidden,
                layer_heads,
                hidden if head_dim is None else head_dim,
                mlp_dim,
                positional,
                content,
                content_positional,
                max_size,
                dropout,
                attention_dropout,
                position_term,
                _POSITIONAL_INIT[weight_init] if positional_init is None else positional_init,
            )
            for layer_heads in heads_per_layer
        )
        self.token_grid(*self.image_size)  # the attention layers say which grids they cover
        self.classifier = nn.Linear(hidden, num_classes)
        self.weight_init = weight_init
        # every Linear as weight_init says ("original": left at PyTorch's defaults); the
        # positional scores were drawn by the attention layers (positional_init)
        if weight_init != "original":
            self.init_linears(0.02 if weight_init == "bert" else None)

    def token_grid(self, height: int, width: int) -> tuple[int, int]:
        """The token grid ``(h, w) = (H / stem, W / stem)`` for an ``H×W`` image; ValueError if
        ``stem`` does not divide both or (learned encoding) the grid exceeds ``max_size``."""
        h, w = super().token_grid(height, width)
        if not all(layer.covers(h, w) for layer in self.attention_layers()):
            raise ValueError(
                f"image size {height}x{width} gives a {h}x{w} token grid, larger than the "
                f"learned encoding's max_size={self.max_size}; build the model with "
                f"max_size >= {max(h, w)}"
            )
        return h, w

    def no_weight_decay_parameters(self, rule: str = "original") -> set[str]:
        """Names of parameters trained without weight decay under ``rule`` (``models/decay.py``):
        ``"original"``, the Gaussian centres and spreads only; ``"norms-biases-positional"``,
        every positional parameter, LayerNorm scales/shifts and biases."""
        scores = [module for module in self.modules() if isinstance(module, PositionalScore)]
        positional = {id(param) for score in scores for param in score.parameters()}
        geometry = {
            id(param)
            for score in scores
            if score.has_centers
            for param in (score.centers, score.spread)
        }
        return exempt_names(self, rule, positional, geometry)
