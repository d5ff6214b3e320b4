"""One training epoch of paper-size models on synthetic CIFAR-shaped data, eager and compiled.

For each preset (default: the paper's ``learned`` and ``quadratic`` models), one epoch of SGD
steps (forward, cross-entropy, backward, momentum update, as ``attnconv train`` runs them) over
``--images`` random 3×32×32 images with random labels, generated once on the device so that no
data loading is timed: 50,000 images in batches of 100 by default, CIFAR-10's epoch. Each preset
runs twice, eagerly and under ``torch.compile``, in ``--precision`` (bf16 autocast by default).

Per row: the first ``--warmup`` steps (where compilation happens), the whole epoch's seconds (what
a user waits, compilation included), the steady rate in images/s over the steps after the warm-up,
that rate as TFLOP/s (training FLOPs per image counted by ``torch.utils.flop_counter``) and as a
share of the GEMM ceiling of the same precision measured in this run, the compiled/eager ratio of
steady rates, and the epoch's last loss (it must be finite: a diverging or NaN step fails the run).

    python benchmarks/epoch.py                                   # on the GPU: 2 presets x 2 modes
    python benchmarks/epoch.py --device cpu --presets quick --images 40 --batch-size 20   # rehearsal
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnconv.hardware import PRECISIONS, machine_description, resolve_precision
from attnconv.models import PRESETS
from attnconv.train.loop import autocast
from data import synchronize
from train import DTYPES, fresh_model, gemm_flops_per_second, training_flops_per_image


def one_epoch(preset: str, compiled: bool, images: int, batch_size: int, warmup: int,
              precision: str, device: torch.device) -> dict[str, float]:
    """Train a fresh ``preset`` for one epoch of ``images`` synthetic images.

    Returns ``warmup_s`` (seconds of the first ``warmup`` steps), ``epoch_s`` (seconds of every
    step), ``steady_images_per_s`` (images/s after the warm-up) and ``last_loss``.
    """
    model = fresh_model(preset).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    forward = torch.compile(model) if compiled else model
    generator = torch.Generator(device=device).manual_seed(0)
    pixels = torch.rand(images, model.in_channels, *model.image_size, generator=generator,
                        device=device)  # (images, C, H, W) in [0, 1)
    labels = torch.randint(0, model.num_classes, (images,), generator=generator, device=device)
    steps = images // batch_size
    if steps <= warmup:
        raise ValueError(f"--images {images} at --batch-size {batch_size} gives {steps} steps; "
                         f"more than --warmup {warmup} are needed to time a steady rate")

    def step(index: int) -> torch.Tensor:
        batch = slice(index * batch_size, (index + 1) * batch_size)
        with autocast(precision, device):
            loss = F.cross_entropy(forward(pixels[batch]), labels[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    synchronize(device)
    started = time.perf_counter()
    for index in range(warmup):
        step(index)
    synchronize(device)
    warmed = time.perf_counter()
    for index in range(warmup, steps):
        loss = step(index)
    synchronize(device)
    finished = time.perf_counter()
    last_loss = float(loss)
    if not math.isfinite(last_loss):
        raise RuntimeError(f"{preset} ({'compiled' if compiled else 'eager'}): the epoch's last "
                           f"loss is {last_loss}")
    return {"warmup_s": warmed - started, "epoch_s": finished - started,
            "steady_images_per_s": (steps - warmup) * batch_size / (finished - warmed),
            "last_loss": last_loss}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["learned", "quadratic"],
                        choices=sorted(PRESETS), metavar="PRESET")
    parser.add_argument("--images", type=int, default=50_000, help="images in the epoch")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=3,
                        help="first steps timed apart (compilation happens in them)")
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16")
    parser.add_argument("--modes", nargs="+", choices=("eager", "compiled"),
                        default=["eager", "compiled"])
    parser.add_argument("--gemm-size", type=int, default=8192,
                        help="side of the square matrix product that measures the ceiling")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    for name in ("images", "batch_size", "warmup", "gemm_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    device = torch.device(args.device)
    precision = resolve_precision(args.precision, device)

    print(machine_description(device))
    ceiling = gemm_flops_per_second(args.gemm_size, DTYPES[precision], device)
    print(f"one epoch of {args.images:,} synthetic {precision} images, batch {args.batch_size}; "
          f"{precision} GEMM ceiling {ceiling / 1e12:.1f} TFLOP/s ({args.gemm_size}^3)")
    header = (f"{'preset':<12}{'mode':<10}{'warm-up s':>10}{'epoch s':>9}{'img/s':>10}"
              f"{'TFLOP/s':>9}{'% ceiling':>10}{'vs eager':>9}{'last loss':>10}")
    print(header + "\n" + "-" * len(header), flush=True)
    for preset in args.presets:
        flops, _ = training_flops_per_image(preset, device, args.batch_size, precision)
        eager_rate = None
        for mode in args.modes:
            result = one_epoch(preset, mode == "compiled", args.images, args.batch_size,
                               args.warmup, precision, device)
            rate = result["steady_images_per_s"]
            if mode == "eager":
                eager_rate = rate
            versus = f"{rate / eager_rate:>8.2f}x" if eager_rate else f"{'':>9}"
            print(f"{preset:<12}{mode:<10}{result['warmup_s']:>10.1f}{result['epoch_s']:>9.1f}"
                  f"{rate:>10.0f}{rate * flops / 1e12:>9.2f}{rate * flops / ceiling:>9.0%} "
                  f"{versus}{result['last_loss']:>10.3f}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
