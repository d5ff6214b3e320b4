"""Issue 39's short probe: does learned attention turn local when the garments move?

Trains the learned position-only model on Fashion-MNIST (``learned-fashion``, started as its
shipped weights were: ``model.weight_init=fan_in model.positional_init=original``) and on
fashion-mnist-anywhere (``learned-anywhere``, the same start) for the first ``--epochs`` (<= 3)
epochs of their full plans, once per seed, and prints layer 0's mean attention distance (tokens)
per epoch beside the uniform-attention distance of each token grid. The runs stop as interrupted
runs, so ``attnconv train --resume OUT/PRESET/seed-S`` trains one on to its plateau later.

    python scripts/anywhere_probe.py --out probe [--epochs 3] [--seeds 0 1]

Cost on 2 shared Zen 3 cores, float32: about 7 minutes an epoch on Fashion-MNIST (14×14 tokens) and
about 10 on fashion-mnist-anywhere (16×16), so about 100 minutes for the default 2 seeds × 3 epochs.
Writes OUT/distance.csv (one row per dataset, seed and epoch; epoch 0 is the initial model).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

from attnconv.models.checkpoint import construct, load_model
from attnconv.runs import RunDir
from attnconv.train.config import resolve_config
from attnconv.train.loop import train
from attnconv.viz.distance import layer_distances, uniform_distance
from attnconv.viz.maps import compute_attention

RUNS = {  # preset: the overrides that give both the shipped learned-fashion's start
    "learned-fashion": ["model.weight_init=fan_in", "model.positional_init=original"],
    "learned-anywhere": [],
}


def layer0_distance(model: torch.nn.Module) -> tuple[float, float]:
    """(layer 0's attention distance averaged over heads, uniform attention's), in tokens."""
    maps = compute_attention(model, tuple(model.image_size))
    return float(layer_distances(maps)[0].mean()), uniform_distance(maps.grid)


def probe(out: Path, preset: str, seed: int, epochs: int) -> list[dict[str, object]]:
    """Train (or continue) ``preset``'s run to epoch ``epochs`` and measure every epoch."""
    run = RunDir(out / preset / f"seed-{seed}")
    overrides = [*RUNS[preset], "precision=fp32", f"seed={seed}", "checkpoint_every=1"]
    if not run.last.is_file():
        train(resolve_config(preset, overrides=overrides), run.root, stop_after=epochs)
    else:
        train(None, run.root, resume=True, stop_after=epochs)
    rows = []
    for epoch in range(epochs + 1):
        path = run.epoch_checkpoint(max(epoch, 1))
        model, checkpoint = load_model(path)
        if epoch == 0:  # the run's initial weights: train seeds them with the config's seed
            torch.manual_seed(seed)
            model = construct(checkpoint["architecture"], checkpoint["arguments"], path).eval()
        distance, uniform = layer0_distance(model)
        rows.append({
            "dataset": checkpoint["dataset"], "preset": preset, "seed": seed, "epoch": epoch,
            "val_acc": checkpoint["metrics"][epoch - 1]["val_acc"] if epoch else None,
            "layer0_distance": round(distance, 3), "uniform_distance": round(uniform, 3),
        })  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("probe-anywhere"))
    parser.add_argument("--epochs", type=int, default=3, choices=(1, 2, 3))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    rows = [
        row
        for seed in args.seeds
        for preset in RUNS
        for row in probe(args.out, preset, seed, args.epochs)
    ]
    with (args.out / "distance.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(
            f"{row['dataset']:>24} seed {row['seed']} epoch {row['epoch']}: layer 0 "
            f"{row['layer0_distance']:.2f} tokens (uniform {row['uniform_distance']:.2f})",
            file=sys.stdout,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
