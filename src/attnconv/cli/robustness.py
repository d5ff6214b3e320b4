"""``attnconv robustness CHECKPOINT|RUN_DIR ... [--pretrained NAME ...|all]``: accuracy of
Fashion-MNIST models on the clean test set and on each corrupted one
(``attnconv.data.corruptions``), in float32, as a table on stdout and a CSV file."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from attnconv.errors import UserError

if TYPE_CHECKING:
    import torch
    from torch import nn

DATASET = "fashion-mnist"
TEST_SIZE = 10000  # images in the Fashion-MNIST test set


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoints",
        nargs="*",
        metavar="CHECKPOINT|RUN_DIR",
        help="checkpoints written by `attnconv train` on fashion-mnist, or run folders (their "
        "checkpoints/best.pt)",
    )
    parser.add_argument(
        "--pretrained",
        nargs="+",
        metavar="NAME",
        default=[],
        help="models shipped with attnconv; all: every shipped Fashion-MNIST model",
    )
    parser.add_argument(
        "--corruptions",
        nargs="+",
        metavar="NAME",
        help="the corrupted sets to measure besides the clean one (default: all: shift-4 shift-8 "
        "noise-low noise-high blur contrast occlusion)",
    )
    parser.add_argument(
        "--images",
        type=int,
        metavar="N",
        default=TEST_SIZE,
        help=f"the first N test images of each set (default: all {TEST_SIZE})",
    )
    parser.add_argument(
        "--out",
        default="robustness.csv",
        help="the CSV file: one row per model, accuracies in [0, 1] (default: robustness.csv)",
    )
    parser.add_argument("--data-dir", help="where datasets live")
    parser.add_argument("--batch-size", type=int, default=500, help="images per forward")
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu or cuda")


def _corruptions(names: list[str] | None) -> list[str]:
    """The corrupted sets asked for, in the order given, each once (default: all)."""
    from attnconv.data.corruptions import CORRUPTIONS

    known = CORRUPTIONS[1:]
    if names is None:
        return list(known)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UserError(
            f"unknown corruption {unknown[0]!r} for --corruptions; expected some of "
            f"{', '.join(known)} (the clean set is always measured)"
        )
    return list(dict.fromkeys(names))


def _pretrained_names(names: list[str]) -> list[str]:
    """``names`` with ``all`` replaced by every shipped Fashion-MNIST model, each once."""
    from attnconv.models.pretrained import pretrained_models

    shipped = [name for name, info in pretrained_models().items() if info.dataset == DATASET]
    expanded = [name for word in names for name in (shipped if word == "all" else [word])]
    return list(dict.fromkeys(expanded))


def _load_models(args: argparse.Namespace, device: torch.device) -> dict[str, nn.Module]:
    """The models to measure, by the name the table gives them (the pretrained name, or the
    checkpoint path as given), on ``device``; UserError for one not trained on Fashion-MNIST."""
    from attnconv.models.checkpoint import load_model
    from attnconv.models.pretrained import load_pretrained, pretrained_info
    from attnconv.runs import checkpoint_file

    models = {}
    for name in _pretrained_names(args.pretrained):
        info = pretrained_info(name)
        if info.dataset != DATASET:
            raise UserError(
                f"pretrained model {name!r} was trained on {info.dataset}; the corrupted test "
                f"sets are {DATASET}'s"
            )
        models[name] = load_pretrained(name).to(device)
    for given in args.checkpoints:
        path = checkpoint_file(given)
        model, checkpoint = load_model(path, map_location=device)
        if checkpoint["dataset"] != DATASET:
            raise UserError(
                f"{path} was trained on {checkpoint['dataset']}; the corrupted test sets are "
                f"{DATASET}'s: give a model trained on {DATASET}"
            )
        models[given] = model
    return models


def measure(
    models: dict[str, nn.Module],
    corruptions: list[str],
    images: int,
    data_dir: str | None,
    batch_size: int,
    device: torch.device,
) -> dict[str, dict[str, float]]:
    """Accuracy in [0, 1] of each model (float32) on the first ``images`` images of the clean
    test set and of each corruption: ``{model: {set: accuracy}}``, ``clean`` first. One progress
    line per (set, model) on stderr."""
    from attnconv.data import BatchLoader, ImageSet
    from attnconv.data.corruptions import corrupted_test_set
    from attnconv.train.loop import evaluation_sums

    accuracy: dict[str, dict[str, float]] = {name: {} for name in models}
    sets = ["clean", *corruptions]
    for number, corruption in enumerate(sets, start=1):
        full = corrupted_test_set(corruption, data_dir)
        subset = ImageSet(full.images[:images], full.labels[:images])
        loader = BatchLoader(subset, batch_size, device=device, train=False, flip=False)
        for name, model in models.items():
            _, correct, seen = evaluation_sums(model, loader, "fp32")
            accuracy[name][corruption] = correct / seen
            print(
                f"[set {number}/{len(sets)}] {name} on {corruption}: {correct / seen:.2%} "
                f"({int(correct)}/{int(seen)})",
                file=sys.stderr,
                flush=True,
            )
    return accuracy


def summary(row: dict[str, float]) -> tuple[float, float]:
    """(mean accuracy over the corrupted sets of ``row``, that mean minus the clean accuracy)."""
    corrupted = [value for name, value in row.items() if name != "clean"]
    mean = sum(corrupted) / len(corrupted)
    return mean, mean - row["clean"]


def format_table(accuracy: dict[str, dict[str, float]]) -> str:
    """A Markdown table: one row per model, accuracies in % (two decimals), the mean over the
    corrupted sets and its difference to clean in percentage points."""
    sets = list(next(iter(accuracy.values())))
    header = ["model", *sets, "mean over corruptions", "mean − clean"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in accuracy.items():
        mean, drop = summary(row)
        cells = [f"{100 * row[s]:.2f}" for s in sets] + [f"{100 * mean:.2f}", f"{100 * drop:+.2f}"]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(accuracy: dict[str, dict[str, float]], images: int, path: Path) -> None:
    """``path``: columns model, images, each set's accuracy in [0, 1], mean_corrupted and
    mean_minus_clean (6 decimals)."""
    sets = list(next(iter(accuracy.values())))
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["model", "images", *sets, "mean_corrupted", "mean_minus_clean"])
        for name, row in accuracy.items():
            values = [row[s] for s in sets] + list(summary(row))
            writer.writerow([name, images, *(f"{value:.6f}" for value in values)])


def run(args: argparse.Namespace) -> int:
    from attnconv.train.distributed import select_device

    if not args.checkpoints and not args.pretrained:
        raise UserError(
            "give one or more CHECKPOINTs or run folders, or --pretrained NAME ... / all"
        )
    if not 1 <= args.images <= TEST_SIZE:
        raise UserError(f"--images must be between 1 and {TEST_SIZE}, got {args.images}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    corruptions = _corruptions(args.corruptions)
    out = Path(args.out)
    if not out.parent.is_dir():  # said now, not after an hour of measuring
        raise UserError(f"--out {out}: the folder {out.parent} does not exist")
    device = select_device(args.device)
    models = _load_models(args, device)
    accuracy = measure(models, corruptions, args.images, args.data_dir, args.batch_size, device)
    print(f"Fashion-MNIST test accuracy (%), first {args.images} images, float32 on {device}:")
    print(format_table(accuracy))
    write_csv(accuracy, args.images, out)
    print(f"wrote {out}")
    return 0
