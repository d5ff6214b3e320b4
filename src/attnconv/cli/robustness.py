"""``attnconv robustness CHECKPOINT|RUN_DIR ... [--pretrained NAME ...|all]``: accuracy of
Fashion-MNIST and fashion-mnist-anywhere models on their clean test set and on each corrupted one
(``attnconv.data.corruptions``), in float32, as one table per dataset on stdout and a CSV file."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from attnconv.cli.options import (
    CheckpointSource,
    DataFolder,
    Device,
    OutputFile,
    Registry,
    add_overwrite,
    int_in,
    shipped_model,
)
from attnconv.errors import UserError

if TYPE_CHECKING:
    import torch
    from torch import nn

TEST_SIZE = 10000  # images in each dataset's test set


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoints",
        nargs="*",
        metavar="CHECKPOINT|RUN_DIR",
        type=CheckpointSource(),
        help="checkpoints written by `attnconv train` on fashion-mnist or fashion-mnist-anywhere, "
        "or run folders (their checkpoints/best.pt)",
    )
    parser.add_argument(
        "--pretrained",
        nargs="+",
        metavar="NAME",
        default=[],
        type=shipped_model(("all",)),
        help="models shipped with attnconv; all: every shipped fashion-mnist and "
        "fashion-mnist-anywhere model",
    )
    parser.add_argument(
        "--corruptions",
        nargs="+",
        metavar="NAME",
        type=Registry(
            "corruption", "attnconv.data.corruptions:CORRUPTIONS",
            message="unknown corruption {value} for --corruptions; expected some of {names}",
        ),
        help="the corrupted sets to measure besides the clean one (default: all: shift-4 shift-8 "
        "shift-4-in-frame shift-8-in-frame noise-low noise-high blur contrast occlusion)",
    )
    parser.add_argument(
        "--images",
        type=int_in(1, TEST_SIZE),
        metavar="N",
        default=TEST_SIZE,
        help=f"the first N test images of each set (default: all {TEST_SIZE})",
    )
    parser.add_argument(
        "--out",
        default="robustness.csv",
        type=OutputFile("a CSV file to write"),
        help="the CSV file: one row per model, its dataset, accuracies in [0, 1] (default: "
        "robustness.csv)",
    )
    add_overwrite(parser, "a CSV file")
    parser.add_argument("--data-dir", type=DataFolder(), help="where datasets live")
    parser.add_argument("--batch-size", type=int_in(1, 10**6), default=500,
                        help="images per forward")
    parser.add_argument("--device", type=Device(), default="auto",
                        help="auto (CUDA if available), cpu, cuda or cuda:N")


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
    """``names`` with ``all`` replaced by every shipped model of a dataset with corrupted test
    sets (``ROBUSTNESS_DATASETS``), each once."""
    from attnconv.data.corruptions import ROBUSTNESS_DATASETS
    from attnconv.models.pretrained import pretrained_models

    shipped = [
        name for name, info in pretrained_models().items() if info.dataset in ROBUSTNESS_DATASETS
    ]
    expanded = [name for word in names for name in (shipped if word == "all" else [word])]
    return list(dict.fromkeys(expanded))


def _check_dataset(what: str, dataset: str) -> None:
    from attnconv.data.corruptions import ROBUSTNESS_DATASETS

    if dataset not in ROBUSTNESS_DATASETS:
        raise UserError(
            f"{what} was trained on {dataset}; corrupted test sets exist for "
            f"{' and '.join(ROBUSTNESS_DATASETS)}: give a model trained on one of them"
        )


def _load_models(
    args: argparse.Namespace, device: torch.device
) -> dict[str, tuple[nn.Module, str]]:
    """The models to measure and the dataset each was trained on, by the name the table gives
    them (the pretrained name, or the checkpoint path as given), on ``device``; UserError for one
    trained on a dataset without corrupted test sets."""
    from attnconv.models.checkpoint import load_model
    from attnconv.models.pretrained import load_pretrained, pretrained_info
    from attnconv.runs import checkpoint_file

    models = {}
    for name in _pretrained_names(args.pretrained):
        info = pretrained_info(name)
        _check_dataset(f"pretrained model {name!r}", info.dataset)
        models[name] = (load_pretrained(name).to(device), info.dataset)
    for given in args.checkpoints:
        path = checkpoint_file(given)
        model, checkpoint = load_model(path, map_location=device)
        _check_dataset(str(path), checkpoint["dataset"])
        models[given] = (model, checkpoint["dataset"])
    return models


def measure(
    models: dict[str, tuple[nn.Module, str]],
    corruptions: list[str],
    images: int,
    data_dir: str | None,
    batch_size: int,
    device: torch.device,
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Accuracy in [0, 1] of each model (float32; ``{name: (model, dataset)}``) on the first
    ``images`` images of its dataset's clean test set and of each corruption, ``{model: {set:
    accuracy}}`` with ``clean`` first; and, per dataset, the share of ink each shift keeps in the
    frame on those images (``ink_kept``), ``{dataset: {set: fraction}}``. One progress line per
    (set, model) on stderr."""
    from attnconv.data import BatchLoader, ImageSet
    from attnconv.data.corruptions import (
        IN_FRAME_SHIFT_PIXELS,
        SHIFT_PIXELS,
        clean_test_set,
        corrupt_test_set,
        ink_kept,
    )
    from attnconv.train.loop import evaluation_sums

    accuracy: dict[str, dict[str, float]] = {name: {} for name in models}
    ink: dict[str, dict[str, float]] = {}
    datasets = list(dict.fromkeys(dataset for _, dataset in models.values()))
    sets = ["clean", *corruptions]
    total = len(sets) * len(datasets)
    number = 0
    for dataset in datasets:
        ink[dataset] = {}
        clean = clean_test_set(dataset, data_dir)  # read once, corrupted set by set
        clean_images = clean.images[:images, 0].numpy()
        for corruption in sets:
            number += 1
            full = corrupt_test_set(clean, corruption, dataset)
            subset = ImageSet(full.images[:images], full.labels[:images])
            if corruption in SHIFT_PIXELS or corruption in IN_FRAME_SHIFT_PIXELS:
                ink[dataset][corruption] = ink_kept(clean_images, subset.images[:, 0].numpy())
            loader = BatchLoader(subset, batch_size, device=device, train=False, flip=False)
            for name, (model, trained_on) in models.items():
                if trained_on != dataset:
                    continue
                _, correct, seen = evaluation_sums(model, loader, "fp32")
                accuracy[name][corruption] = correct / seen
                print(
                    f"[set {number}/{total}] {name} on {corruption}: {correct / seen:.2%} "
                    f"({int(correct)}/{int(seen)})",
                    file=sys.stderr,
                    flush=True,
                )
    return accuracy, ink


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


def write_csv(
    accuracy: dict[str, dict[str, float]], datasets: dict[str, str], images: int, path: Path
) -> None:
    """``path``: columns model, dataset (``datasets[model]``), images, each set's accuracy in
    [0, 1], mean_corrupted and mean_minus_clean (6 decimals); written atomically (a full disk
    leaves the file as it was, never a part of it)."""
    from attnconv.runs import write_text_atomic

    sets = list(next(iter(accuracy.values())))
    handle = io.StringIO(newline="")
    writer = csv.writer(handle)
    writer.writerow(["model", "dataset", "images", *sets, "mean_corrupted", "mean_minus_clean"])
    for name, row in accuracy.items():
        values = [row[s] for s in sets] + list(summary(row))
        writer.writerow([name, datasets[name], images, *(f"{value:.6f}" for value in values)])
    write_text_atomic(path, handle.getvalue())


def run(args: argparse.Namespace) -> int:
    from attnconv.cli.options import claim_output
    from attnconv.train.distributed import select_device

    if not args.checkpoints and not args.pretrained:
        raise UserError(
            "give one or more CHECKPOINTs or run folders, or --pretrained NAME ... / all"
        )
    corruptions = _corruptions(args.corruptions)
    # said now, not after an hour of measuring
    out = claim_output(args.out, args.overwrite, option="--out", folder=False)
    device = select_device(args.device)
    models = _load_models(args, device)
    accuracy, ink = measure(
        models, corruptions, args.images, args.data_dir, args.batch_size, device
    )
    datasets = {name: dataset for name, (_, dataset) in models.items()}
    for dataset, kept in ink.items():
        print(f"{dataset} test accuracy (%), first {args.images} images, float32 on {device}:")
        print(format_table({name: accuracy[name] for name in models if datasets[name] == dataset}))
        if kept:
            shares = ", ".join(f"{name} {100 * share:.2f}%" for name, share in kept.items())
            print(f"ink the shifted images keep in the frame (mean over images): {shares}")
    write_csv(accuracy, datasets, args.images, out)
    print(f"wrote {out}")
    return 0
