"""Any vision transformer under attnconv's measures: attention recorded from timm and torchvision
models (``record_attention``), attention distance in patches and pixels, grid score, maps,
contours, attention rollout and the class token's view (``attention_rollout``,
``class_token_attention``), ``heads.csv`` and the explorer (``analyze``, the ``attnconv analyze``
command); whether attnconv's own content attention is alive (``content_diagnostics``: entropy of
the content maps, the uniform-content ablation, query/key norms against the start, gates); two
models on the same test images (``compare_checkpoints``, ``mcnemar``: McNemar's exact test).

Names are loaded on first use, so importing ``attnconv.analysis`` does not import matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FAMILIES": "record",
    "Recording": "record",
    "record_attention": "record",
    "patch_attention": "measures",
    "measure_patch_attention": "measures",
    "head_rows": "measures",
    "layer_rows": "measures",
    "attention_rollout": "rollout",
    "class_token_attention": "rollout",
    "build_third_party": "third_party",
    "analyze_third_party": "analyze",
    "analyze_attnconv": "analyze",
    "content_layers": "content",
    "content_diagnostics": "content",
    "uniform_content": "content",
    "run_start": "content",
    "pretrained_start": "content",
    "PairedComparison": "paired",
    "compare_checkpoints": "paired",
    "exact_binomial_p": "paired",
    "mcnemar": "paired",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attnconv.analysis' has no attribute {name!r}")
    return getattr(importlib.import_module(f"attnconv.analysis.{_EXPORTS[name]}"), name)
