"""A BERT layer's dense map folded into the attention's output projection, against the two maps.

``ImageTransformer``'s blocks apply ``attention_dense`` right after the attention's output
projection; ``MultiHeadSelfAttention2d(x, then=dense)`` folds the two into one map where the batch
has enough pixels (``attnconv.attention.layer.fold_pays``, docs/layers.md). This times one training
step (forward, cross-entropy, backward, SGD with momentum) of each preset folded and with the fold
turned off (``content_layer.two_maps``: ``fold_pays`` patched to refuse), alternating in one
process, best of ``--rounds``; the ratio is the two maps' time over the folded one's (> 1: folding
is faster). On a CPU the times are this process's CPU time, as in ``content_layer.py``.

    python benchmarks/fold.py --threads 1
    python benchmarks/fold.py --presets quadratic --batch 20 --rounds 3   # the paper's size
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnconv.models import create_model
from content_layer import add_timing_arguments, alternate, timing_device, two_maps

PRESETS = ("quadratic-fashion", "learned-fashion", "learned-content-fashion")


def training_step(
    preset: str, batch: int, folds: bool, device: torch.device
) -> tuple[nn.Module, Callable[[], None]]:
    """A fresh ``preset`` and one SGD step of it on a fixed random batch, folding or not."""
    torch.manual_seed(0)
    model = create_model(preset).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(batch, model.in_channels, *model.image_size, generator=generator)
    images = images.to(device)
    labels = torch.randint(0, model.num_classes, (batch,), generator=generator).to(device)

    def step() -> None:
        with contextlib.nullcontext() if folds else two_maps():
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return model, step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    add_timing_arguments(parser, rounds=6)
    args = parser.parse_args(argv)
    device = timing_device(args)
    print(f"one training step, batch {args.batch}; best of {args.rounds} alternating rounds")
    header = f"{'preset':<26}{'folded':>12}{'two maps':>12}{'two maps / folded':>20}"
    print(header + "\n" + "-" * len(header))
    for preset in args.presets:
        steps = {folds: training_step(preset, args.batch, folds, device)[1]
                 for folds in (True, False)}
        best = alternate(steps, args.rounds, device)
        print(f"{preset:<26}{best[True] * 1e3:>10.1f}ms{best[False] * 1e3:>10.1f}ms"
              f"{best[False] / best[True]:>19.2f}x", flush=True)


if __name__ == "__main__":
    main()
