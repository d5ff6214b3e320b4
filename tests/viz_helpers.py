"""Small models and on-disk checkpoints / run folders for the visualisation tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnconv.models import checkpoint as models_checkpoint
from attnconv.models import create_model
from attnconv.models.presets import preset_arguments

# Overrides that make an 8×8 one-channel model (the embedded digits) with a 1-token stem.
DIGITS = {"in_channels": 1, "image_size": (8, 8), "mean": (0.3,), "std": (0.4,), "stem": 1}
SMALL = {"hidden": 16, "depth": 2, "mlp_dim": 16}


def small_model(preset: str, **overrides: Any) -> tuple[nn.Module, dict[str, Any]]:
    """A small digits-sized model of ``preset`` and the ``model_config`` that rebuilds it."""
    config = {**DIGITS, **SMALL, "heads": 3, "head_dim": 8, "num_classes": 10, **overrides}
    if preset.startswith("learned"):
        config.setdefault("max_size", 8)
    torch.manual_seed(0)
    model = create_model(preset, **config).eval()
    with torch.no_grad():  # init makes content and learned scores ~0: make them matter
        model.embed.weight.normal_(0.0, 1.0)
        for layer in model.attention_layers():
            for linear in (layer.query, layer.key):
                if linear is not None:
                    linear.weight.normal_(0.0, 1.0)
            if layer.positional == "learned":  # likewise the learned positional scores
                for table in layer.position.parameters():
                    table.normal_(0.0, 1.0)
    return model, config


def save_checkpoint(
    path: Path,
    model: nn.Module,
    preset: str,
    model_config: dict[str, Any],
    epoch: int = 1,
    dataset: str = "digits",
) -> Path:
    """Save ``model`` (built as ``create_model(preset, **model_config)``) as a checkpoint of
    ``epoch`` with empty training state (the model is what matters here)."""
    architecture, arguments = preset_arguments(preset, **model_config)
    checkpoint = {
        "preset": preset,
        "dataset": dataset,
        "architecture": architecture,
        "arguments": arguments,
        "model": model.state_dict(),
        "optimizer": {},
        "rng": [],
        "epoch": epoch,
        "step": 10 * epoch,
        "config": {},
        "metrics": [],
    }
    models_checkpoint.save_checkpoint(checkpoint, path)
    return path


def write_run(
    run_dir: Path,
    metrics: list[dict[str, Any]],
    summary: dict[str, Any] | None,
    config: dict[str, Any],
) -> Path:
    """A RUN folder with ``config.json``, ``metrics.jsonl`` and optionally ``summary.json``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir
