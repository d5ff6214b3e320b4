"""Multi-head self-attention over 2-D pixel grids with the paper's positional scores."""

from attnconv.attention.layer import IMPLEMENTATIONS, POSITIONAL_SCORES, MultiHeadSelfAttention2d

__all__ = ["IMPLEMENTATIONS", "POSITIONAL_SCORES", "MultiHeadSelfAttention2d"]
