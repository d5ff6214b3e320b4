"""``attnconv models``: every preset with its size and cost."""

from __future__ import annotations

import argparse

from attnconv.errors import UserError

MAX_CLASSES = 2**31  # more than any dataset names; the classifier's shape stays countable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-classes", type=int, default=10, help="classifier outputs (default: 10)"
    )


def _human(count: int) -> str:
    """``12086844`` -> ``12.09M``; ``5280384`` -> ``5.28M``; ``3264925600`` -> ``3.26G``."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f}{unit}"
    return str(count)


def run(args: argparse.Namespace) -> int:
    import torch

    from attnconv.models import PRESETS, create_model
    from attnconv.models.complexity import count_macs, count_parameters

    if not 1 <= args.num_classes < MAX_CLASSES:
        raise UserError(f"--num-classes must be an integer in [1, 2**31), got {args.num_classes}")
    header = f"{'preset':<30} {'params':>8} {'MACs/image':>11}  {'input':<9} description"
    print(header)
    print("-" * len(header))
    for name, preset in PRESETS.items():
        with torch.device("meta"):  # shapes only: no weights drawn, no arithmetic in count_macs
            model = create_model(name, num_classes=args.num_classes)
        height, width = model.image_size
        size = f"{height}x{width}x{model.in_channels}"
        params = _human(count_parameters(model))
        macs = _human(count_macs(model))
        print(f"{name:<30} {params:>8} {macs:>11}  {size:<9} {preset.description}")
    print(
        "\nMACs: multiply-adds of one eval-mode forward on one image at the preset's default "
        "input, as executed (matrix products and convolutions)."
    )
    return 0
