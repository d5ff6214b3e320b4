"""``attnconv heads CHECKPOINT|RUN_DIR|--pretrained NAME``: every Gaussian head's centre, spread
and condition number; for a transformed network (T-CNN), every head's start tap, centre, distance
moved, spread and content gate, and each transformed layer's means. For a model with content
attention (transformed layers, ``learned-content-*``, the ViT), on its dataset's test images: each
layer's content-map entropy ÷ log N per head, gates, query/key norms against the start and the
uniform-content ablation (``attnconv.analysis.content``)."""

from __future__ import annotations

import argparse
import math
import textwrap
from typing import Any

from attnconv.cli.options import (
    CheckpointSource,
    DataFolder,
    float_in,
    int_in,
    positive,
    shipped_model,
)
from attnconv.errors import UserError
from attnconv.models.heads import MAX_CONDITION, MIN_SPREAD

WIDTH = 100  # characters a line of explanation is wrapped at


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        nargs="?",
        type=CheckpointSource(),
        help="a checkpoint written by `attnconv train` or `attnconv transform`, or a run folder "
        "(its checkpoints/best.pt, the epoch chosen on validation)",
    )
    parser.add_argument(
        "--pretrained", metavar="NAME", help="a model shipped with attnconv",
        type=shipped_model(),
    )
    parser.add_argument(
        "--min-spread",
        type=positive(1e6),
        help=f"degenerate below this inverse std, 1/tokens (default: {MIN_SPREAD}; not for "
        "transformed networks)",
    )
    parser.add_argument(
        "--max-condition",
        type=float_in(1, 1e15),
        help=f"degenerate above this covariance condition number (default: {MAX_CONDITION:g}; "
        "not for transformed networks)",
    )
    parser.add_argument(
        "--images",
        type=int_in(0, 10**6),
        metavar="N",
        help="models with content attention: measure it on the first N test images of the "
        "model's dataset (default: all of them; 0: leave it out)",
    )
    parser.add_argument(
        "--data-dir", type=DataFolder(),
        help="dataset folder for those test images (default: attnconv's)",
    )


def run(args: argparse.Namespace) -> int:
    from attnconv.analysis.content import content_layers, labelled_test_images
    from attnconv.models.checkpoint import checkpoint_name, load_model
    from attnconv.models.heads import head_table
    from attnconv.models.pretrained import (
        checkpoint_or_pretrained,
        load_pretrained,
        pretrained_info,
    )
    from attnconv.models.transformed import TransformedNetwork
    from attnconv.runs import checkpoint_file

    if checkpoint_or_pretrained(args.checkpoint, args.pretrained) == "pretrained":
        model = load_pretrained(args.pretrained)
        source = f"{args.pretrained} (shipped weights)"
        dataset, checkpoint = pretrained_info(args.pretrained).dataset, None
    else:
        path = checkpoint_file(args.checkpoint)
        model, checkpoint = load_model(path)
        source = f"{path}: preset {checkpoint_name(checkpoint)}"
        dataset = checkpoint["dataset"]
    measure = _content_to_measure(model, args)
    if measure:  # read before anything is printed: a dataset that does not fit stops here
        try:
            test = labelled_test_images(dataset, model.image_size, args.images, args.data_dir)
        except UserError as err:
            raise UserError(f"{err} (--images 0 leaves the content diagnostics out)") from err
    if isinstance(model, TransformedNetwork):
        given = [
            flag
            for flag, value in (("--min-spread", args.min_spread), ("--max-condition",
                                                                    args.max_condition))
            if value is not None
        ]
        if given:
            raise UserError(
                f"{' and '.join(given)}: for Gaussian attention models; a transformed network's "
                f"heads are isotropic and never pruned, leave {'it' if len(given) == 1 else 'them'}"
                f" out"
            )
        print(source)
        print(transformed_text(model))
        if measure:
            print(content_text(model, dataset, test, args.pretrained, checkpoint))
        return 0
    if content_layers(model) and not any(layer.has_centers for layer in model.attention_layers()):
        # content attention without Gaussian heads (learned-content, the ViT): no geometry
        if not measure:
            raise UserError(
                "--images 0: this model has no Gaussian heads, and its content attention is "
                "measured on test images; give N > 0 or leave --images out"
            )
        given = [f for f, v in (("--min-spread", args.min_spread),
                                ("--max-condition", args.max_condition)) if v is not None]  # fmt: skip
        if given:
            raise UserError(
                f"{' and '.join(given)}: for Gaussian attention models; this model has no "
                f"Gaussian heads, leave {'it' if len(given) == 1 else 'them'} out"
            )
        print(source)
        print(content_text(model, dataset, test, args.pretrained, checkpoint))
        return 0
    min_spread = MIN_SPREAD if args.min_spread is None else args.min_spread
    max_condition = MAX_CONDITION if args.max_condition is None else args.max_condition
    if not 0 < min_spread < math.inf:  # NaN, 0 or below: no head could ever be flagged
        raise UserError(f"--min-spread must be a positive finite number, got {min_spread}")
    if not 1 <= max_condition < math.inf:  # condition numbers are >= 1
        raise UserError(f"--max-condition must be a finite number >= 1, got {max_condition}")
    rows = head_table(model, min_spread, max_condition)
    grid = any("moved" in row for row in rows)  # started on the kernel taps
    print(source)
    print(
        f"{'layer':>5} {'head':>4} {'center_row':>10} {'center_col':>10} {'spread':>9} "
        f"{'condition':>10}  degenerate" + ("  moved_from_tap" if grid else "")
    )
    for row in rows:
        moved = f" {row['moved']:>.3f}" if "moved" in row else ""
        print(
            f"{row['layer']:>5} {row['head']:>4} {row['center_row']:>10.3f} "
            f"{row['center_col']:>10.3f} {row['spread']:>9.4f} {row['condition_number']:>10.3g}"
            f"  {'yes' if row['degenerate'] else 'no'}{moved}"
        )
    if grid:
        by_layer: dict[int, list[float]] = {}
        for row in rows:
            if "moved" in row:
                by_layer.setdefault(row["layer"], []).append(row["moved"])
        means = ", ".join(
            f"layer {layer} {sum(values) / len(values):.3f}" for layer, values in by_layer.items()
        )
        print(f"started on the kernel taps (positional_init=grid): mean distance moved, tokens: "
              f"{means}")
    degenerate = sum(row["degenerate"] for row in rows)
    print(
        f"{degenerate} of {len(rows)} heads degenerate (spread < {min_spread:g} or "
        f"condition number > {max_condition:g})"
    )
    if measure:
        print(content_text(model, dataset, test, args.pretrained, checkpoint))
    return 0


def _content_to_measure(model: Any, args: argparse.Namespace) -> bool:
    """Whether to measure ``model``'s content attention: it has some and ``--images`` is not 0.
    UserError for ``--images`` or ``--data-dir`` where nothing would be measured."""
    from attnconv.analysis.content import content_layers

    if args.images is not None and args.images < 0:
        raise UserError(f"--images must be >= 0 (0: no content diagnostics), got {args.images}")
    has_content = bool(content_layers(model))
    if not has_content:
        given = [f for f, v in (("--images", args.images), ("--data-dir", args.data_dir))
                 if v is not None]  # fmt: skip
        if given:
            raise UserError(
                f"{' and '.join(given)}: for models with content attention; this "
                f"{type(model).__name__} has none, leave {'it' if len(given) == 1 else 'them'} out"
            )
        return False
    if args.images == 0 and args.data_dir is not None:
        raise UserError("--data-dir is for the test images; --images 0 measures none")
    return args.images != 0


def content_text(
    model: Any,
    dataset: str,
    test: tuple[Any, Any],
    pretrained: str | None,
    checkpoint: dict | None,
) -> str:
    """The content-attention diagnostics of ``model`` on ``test`` (images and labels of
    ``dataset``'s test split) as text (``attnconv.analysis.content.format_content``), the query
    and key norms against the start of the run ``checkpoint`` comes from, or of the shipped model
    ``pretrained``."""
    import sys

    from attnconv.analysis.content import (
        content_diagnostics,
        content_layers,
        format_content,
        pretrained_start,
        run_start,
    )

    images, labels = test
    layers = len(content_layers(model))
    passes = 1 + layers + (layers > 1)  # the model, each layer's content uniform, all at once
    print(
        f"heads: measuring the content attention on {len(labels)} {dataset} test images "
        f"({passes} passes over them)",
        file=sys.stderr,
        flush=True,
    )
    start, note = run_start(checkpoint) if pretrained is None else pretrained_start(pretrained)
    diagnostics = content_diagnostics(model, images, labels, start, note)
    return format_content(diagnostics, f"{len(labels)} {dataset} test images")


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> list[str]:
    """``rows`` as right-aligned text lines under a header: ``columns`` are (key, header, format)."""
    cells = [[header for _, header, _ in columns]]
    cells += [[form.format(row[key]) for key, _, form in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return [
        " ".join(text.rjust(width) for text, width in zip(line, widths, strict=True))
        for line in cells
    ]


def transformed_text(model: Any) -> str:
    """The heads of a ``TransformedNetwork``: one line per head (start tap, centre, distance moved,
    spread as inverse std and std, content gate; pixels of the layer's input), then one per
    transformed layer (its module name, mean and largest distance moved, mean gate)."""
    from attnconv.models.heads import transformed_head_table, transformed_layer_summary

    rows = transformed_head_table(model)
    heads = _table(
        rows,
        [
            ("layer", "layer", "{:d}"),
            ("head", "head", "{:d}"),
            ("tap_row", "tap_row", "{:+d}"),
            ("tap_col", "tap_col", "{:+d}"),
            ("center_row", "center_row", "{:+.3f}"),
            ("center_col", "center_col", "{:+.3f}"),
            ("moved", "moved", "{:.3f}"),
            ("spread", "spread", "{:.3f}"),
            ("std", "std", "{:.3f}"),
            ("gate", "gate", "{:.3f}"),
        ],
    )
    layers = _table(
        transformed_layer_summary(rows),
        [
            ("layer", "layer", "{:d}"),
            ("name", "module", "{}"),
            ("heads", "heads", "{:d}"),
            ("mean_moved", "mean moved", "{:.3f}"),
            ("max_moved", "max moved", "{:.3f}"),
            ("mean_spread", "mean spread", "{:.3f}"),
            ("mean_gate", "mean gate", "{:.3f}"),
        ],
    )
    return "\n".join(
        [
            textwrap.fill(
                "Each head of each transformed layer: the kernel tap it started on, its centre "
                "now and how far it moved from the tap (offsets from the query in pixels of the "
                "layer's input), its spread (inverse std s, 1/pixels; std = 1/s, pixels) and its "
                "content gate (the share of content attention it mixes in, 0 to 1).",
                WIDTH,
            ),
            *heads,
            "Per transformed layer: distance moved from the taps, spread and content gate, means "
            "over its heads.",
            *layers,
        ]
    )
