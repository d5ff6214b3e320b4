"""Multi-head self-attention over 2-D pixel grids with the paper's positional scores."""

from attnconv.attention.layer import IMPLEMENTATIONS, MultiHeadSelfAttention2d
from attnconv.attention.positional import (
    POSITIONAL_SCORES,
    GaussianFullScore,
    GaussianScore,
    LearnedScore,
    PositionalScore,
)

__all__ = [
    "IMPLEMENTATIONS",
    "POSITIONAL_SCORES",
    "GaussianFullScore",
    "GaussianScore",
    "LearnedScore",
    "MultiHeadSelfAttention2d",
    "PositionalScore",
]
