"""A folder of "shipped" models for the explorer tests: Fashion-MNIST-sized presets with random
weights (made to give visible attention) and random test images, written with the package's own
``export_pretrained`` and ``export_samples``, so the tests do not depend on the real weights."""

from __future__ import annotations

from pathlib import Path

import torch

from attnconv.models import PRESETS, create_model
from attnconv.models.pretrained import export_pretrained, export_samples

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat"] + [f"class {i}" for i in range(5)]
# name -> test accuracy written into the index
ACCURACY = {
    "quadratic-fashion": 0.8137,
    "learned-fashion": 0.7921,
    "learned-content-fashion": 0.7654,
    "resnet-fashion": 0.9012,
}
# Shipped only where a test names it: a T-CNN (the explorer's kind "probabilities").
TRANSFORMED_ACCURACY = {"tcnn-fashion-small": 0.9133}
SAMPLES = 6


def shipped_folder(folder: Path, names: tuple[str, ...] = tuple(ACCURACY)) -> Path:
    """Write ``names`` (presets of ``ACCURACY`` or ``TRANSFORMED_ACCURACY``) and ``SAMPLES``
    random test images into ``folder``."""
    generator = torch.Generator().manual_seed(11)
    for name in names:
        torch.manual_seed(len(name))
        model = create_model(name).eval()
        if hasattr(model, "attention_layers"):
            with torch.no_grad():  # the initialisation makes content and learned scores ~0
                for layer in model.attention_layers():
                    for linear in (layer.query, layer.key):
                        if linear is not None:
                            linear.weight.normal_(0.0, 0.2, generator=generator)
                    if layer.positional == "learned":
                        layer.position.row_embedding.normal_(0.0, 1.0, generator=generator)
                        layer.position.col_embedding.normal_(0.0, 1.0, generator=generator)
        preset = PRESETS[name]
        arguments = {**preset.model_kwargs, "num_classes": 10}
        if preset.model == "transformed":  # the classes are the base network's
            arguments = dict(preset.model_kwargs)
            arguments["base_arguments"] = {**arguments["base_arguments"], "num_classes": 10}
            with torch.no_grad():  # gates open: content attention on
                for layer in model.transformed_layers().values():
                    layer.gate.uniform_(0.2, 0.6, generator=generator)
        export_pretrained(
            model,
            name,
            description=preset.description,
            dataset="fashion-mnist",
            architecture=preset.model,
            arguments=arguments,
            test_accuracy={**ACCURACY, **TRANSFORMED_ACCURACY}[name],
            run={"command": "random weights for a test"},
            folder=folder,
        )
    images = torch.randint(0, 256, (SAMPLES, 1, 28, 28), dtype=torch.uint8, generator=generator)
    labels = torch.arange(SAMPLES) % 10
    export_samples(images, labels, CLASSES, "fashion-mnist", folder=folder)
    return folder


# A recorded model (a tiny timm ViT, ``test_analysis_rollout.tiny_vit``: 3 layers of 2 heads on
# 4x4 patches of 8x8 pixels) on RECORDED_IMAGES random images, the first RECORDED_SHOWN of them on
# the page with their average.
RECORDED_IMAGES, RECORDED_SHOWN = 3, 2


def recorded_model(class_token: bool = True, name: str = "timm:tiny-vit"):
    """``(PreparedModel, the ViT, its images (B, 3, 32, 32))``, as ``attnconv analyze`` records
    a timm ViT for its explorer page (``recorded_explorer_data`` with the rollout and class-token
    views of ``measure_patch_attention``)."""
    from attnconv.analysis.measures import measure_patch_attention
    from attnconv.viz.export import PreparedModel, recorded_explorer_data
    from test_analysis_rollout import tiny_vit

    model = tiny_vit(class_token)
    images = torch.rand(RECORDED_IMAGES, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    labels = [f"random image {i}" for i in range(RECORDED_IMAGES)]
    measured = measure_patch_attention(model, images, labels, keep=RECORDED_SHOWN)
    data, files = recorded_explorer_data(
        [maps.probs for maps in measured.per_image],
        measured.average.grid,
        measured.average.stem,
        images[:RECORDED_SHOWN],
        labels[:RECORDED_SHOWN],
        measured.average.probs,
        images,
        {"weights": "random"},
        measured.views,
    )
    return PreparedModel(name, data, files, "a tiny ViT with random weights"), model, images
