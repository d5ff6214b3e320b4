"""Theorem 1 as code: convolutions as multi-head self-attention, and back.

* :func:`conv_to_attention` turns an ``nn.Conv1d``/``nn.Conv2d`` into an :class:`AttentionConv`
  that computes the same function through ``MultiHeadSelfAttention2d``.
* :func:`convert_model` does it for every convolution of a network; :func:`conversion_summary`
  lists what was replaced.
* :func:`attention_to_conv` reads the effective convolution kernel out of a position-only layer;
  :func:`border_mass` says where the layer differs from it.
"""

from attnconv.convert.inverse import (
    attention_to_conv,
    border_mass,
    effective_bias,
    head_mixing,
    offset_probabilities,
)
from attnconv.convert.model import Replacement, conversion_summary, convert_model, format_summary
from attnconv.convert.theorem import SUPPORTED_PADDING_MODES, AttentionConv, conv_to_attention

__all__ = [
    "SUPPORTED_PADDING_MODES",
    "AttentionConv",
    "Replacement",
    "attention_to_conv",
    "border_mass",
    "conv_to_attention",
    "conversion_summary",
    "convert_model",
    "effective_bias",
    "format_summary",
    "head_mixing",
    "offset_probabilities",
]
