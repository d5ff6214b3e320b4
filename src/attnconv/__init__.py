"""attnconv: self-attention layers that learn (and provably can express) convolutions.

Implements Cordonnier, Loukas & Jaggi, *On the Relationship between Self-Attention and
Convolutional Layers* (ICLR 2020): attention layers with every positional encoding of the paper,
Theorem 1 as exact conversion code, the paper's models and training recipe, and its figures.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Imported on first use, so that importing attnconv (the command line's --help, --version) does not
# import torch.
_EXPORTS = {
    "PRESETS": "attnconv.models",
    "MultiHeadSelfAttention2d": "attnconv.attention",
    "attention_to_conv": "attnconv.convert",
    "conv_to_attention": "attnconv.convert",
    "convert_model": "attnconv.convert",
    "create_model": "attnconv.models",
    "transform": "attnconv.convert",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attnconv' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
