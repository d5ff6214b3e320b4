"""attnconv: self-attention layers that learn (and provably can express) convolutions.

Implements Cordonnier, Loukas & Jaggi, *On the Relationship between Self-Attention and
Convolutional Layers* (ICLR 2020): attention layers with every positional encoding of the paper,
Theorem 1 as exact conversion code, the paper's models and training recipe, and its figures.
"""

from attnconv.attention import MultiHeadSelfAttention2d
from attnconv.convert import attention_to_conv, conv_to_attention, convert_model
from attnconv.models import PRESETS, create_model

__all__ = [
    "PRESETS",
    "MultiHeadSelfAttention2d",
    "attention_to_conv",
    "conv_to_attention",
    "convert_model",
    "create_model",
]
__version__ = "0.1.0"
