"""Theorem 1 as code: convolutions as multi-head self-attention, and back.

* [`conv_to_attention`][] turns an ``nn.Conv1d``/``nn.Conv2d`` into an [`AttentionConv`][]
  that computes the same function through ``MultiHeadSelfAttention2d``.
* [`convert_model`][] does it for every convolution of a network that Theorem 1 covers (rules
  such as [`standardized_weight`][] reproduce convolution subclasses with their own forward);
  [`conversion_summary`][] lists what was replaced, [`layers_left`][] what was left and why.
* [`attention_to_conv`][] reads the effective convolution kernel out of a position-only layer;
  [`border_mass`][] says where the layer differs from it.
* ``transform`` (and ``transform_checkpoint``) recasts a network's convolutions as
  attention that keeps learning (T-CNN): Gaussian heads on the taps with a finite, trainable
  spread and gated content attention; ``choose_spread`` picks the spread,
  ``choose_opening`` the gates' opening, ``calibrate_content`` scales mimetic queries and
  keys, ``untransformed_layers`` lists the convolutions left.
"""

from attnconv.convert.inverse import (
    attention_to_conv,
    border_mass,
    effective_bias,
    head_mixing,
    offset_probabilities,
)
from attnconv.convert.model import (
    PROBE_TOLERANCE,
    ConversionError,
    LeftLayer,
    Replacement,
    Rule,
    conversion_summary,
    convert_model,
    dynamic_same_padding,
    format_summary,
    layers_left,
    probe_error,
    probe_gradient_error,
    scaled_standardized_weight,
    standardized_weight,
)
from attnconv.convert.theorem import (
    SUPPORTED_PADDING_MODES,
    AttentionConv,
    ScaledStandardize,
    Standardize,
    conv_to_attention,
)
from attnconv.convert.transform import (
    CONTENT_START,
    FIRST_FORM,
    LATE,
    OPENING_CANDIDATES,
    SPATIAL,
    SPREAD_CANDIDATES,
    calibrate_content,
    choose_opening,
    choose_spread,
    select_layers,
    transform,
    transform_checkpoint,
    untransformed_layers,
)

__all__ = [
    "CONTENT_START",
    "FIRST_FORM",
    "LATE",
    "OPENING_CANDIDATES",
    "PROBE_TOLERANCE",
    "SPATIAL",
    "SPREAD_CANDIDATES",
    "SUPPORTED_PADDING_MODES",
    "AttentionConv",
    "ConversionError",
    "LeftLayer",
    "Replacement",
    "Rule",
    "ScaledStandardize",
    "Standardize",
    "attention_to_conv",
    "border_mass",
    "calibrate_content",
    "choose_opening",
    "choose_spread",
    "conv_to_attention",
    "conversion_summary",
    "convert_model",
    "dynamic_same_padding",
    "effective_bias",
    "format_summary",
    "head_mixing",
    "layers_left",
    "offset_probabilities",
    "probe_error",
    "probe_gradient_error",
    "scaled_standardized_weight",
    "select_layers",
    "standardized_weight",
    "transform",
    "transform_checkpoint",
    "untransformed_layers",
]
