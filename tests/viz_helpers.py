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


# A ResNet narrowed to widths 4..16 on one-channel images: on 16×16 images its late stages, the
# ones transformed, run on 4×4 (from an 8×8 input: the stride-2 convolution) and 2×2 grids.
TRANSFORMED_BASE = {"widths": (4, 8, 8, 16), "in_channels": 1, "mean": (0.3,), "std": (0.4,)}


def transformed_checkpoint(
    image_size: tuple[int, int] = (16, 16), dataset: str = "fashion-mnist", moved: bool = True
) -> dict[str, Any]:
    """The checkpoint dict (``preset`` tcnn-fashion-small, ``epoch`` 3) of a small ResNet
    transformed with spread 3 (``attnconv.convert.transform_checkpoint``), as ``attnconv train``
    would have left it. ``moved``: head ``h`` of transformed layer ``l`` moved by
    ``(0.1·(l + 1), −0.05·h)`` pixels from its tap, its spread ``3 − 0.1·h`` and its content gate
    ``0.1·h`` (so trained-looking values that a test can predict); else as transformed (heads on
    the taps, gates shut)."""
    from attnconv.convert import transform_checkpoint
    from attnconv.models.presets import TCNN_FIRST_FORM

    torch.manual_seed(0)
    arguments = {**TRANSFORMED_BASE, "image_size": image_size}
    architecture, arguments = preset_arguments("resnet-fashion-small", **arguments)
    cnn = create_model("resnet-fashion-small", **arguments)
    base = {"preset": "resnet-fashion-small", "dataset": dataset, "architecture": architecture,
            "arguments": arguments, "model": cnn.state_dict()}  # fmt: skip
    checkpoint = transform_checkpoint(
        base, spread=3.0, preset="tcnn-fashion-small", **TCNN_FIRST_FORM
    )  # the preset's start
    if moved:
        model = models_checkpoint.build_model(checkpoint)
        with torch.no_grad():
            for index, layer in enumerate(model.transformed_layers().values()):
                heads = torch.arange(layer.heads, dtype=torch.float32)
                shift = torch.stack([torch.full_like(heads, 0.1 * (index + 1)), -0.05 * heads], 1)
                layer.position.centers.copy_(layer.tap_offsets() + shift)
                layer.position.spread.copy_(3.0 - 0.1 * heads)
                layer.gate.copy_(0.1 * heads)
        checkpoint["model"] = model.state_dict()
    return {**checkpoint, "epoch": 3, "step": 30, "config": {}, "metrics": []}
