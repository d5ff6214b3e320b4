"""``attnconv heads CHECKPOINT|RUN_DIR|--pretrained NAME``: every Gaussian head's centre, spread
and condition number; for a transformed network (T-CNN), every head's start tap, centre, distance
moved, spread and content gate, and each transformed layer's means."""

from __future__ import annotations

import argparse
import math
import textwrap
from typing import Any

from attnconv.errors import UserError
from attnconv.models.heads import MAX_CONDITION, MIN_SPREAD

WIDTH = 100  # characters a line of explanation is wrapped at


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        nargs="?",
        help="a checkpoint written by `attnconv train` or `attnconv transform`, or a run folder "
        "(its checkpoints/best.pt, the epoch chosen on validation)",
    )
    parser.add_argument("--pretrained", metavar="NAME", help="a model shipped with attnconv")
    parser.add_argument(
        "--min-spread",
        type=float,
        help=f"degenerate below this inverse std, 1/tokens (default: {MIN_SPREAD}; not for "
        "transformed networks)",
    )
    parser.add_argument(
        "--max-condition",
        type=float,
        help=f"degenerate above this covariance condition number (default: {MAX_CONDITION:g}; "
        "not for transformed networks)",
    )


def run(args: argparse.Namespace) -> int:
    from attnconv.models.checkpoint import load_model
    from attnconv.models.heads import head_table
    from attnconv.models.pretrained import checkpoint_or_pretrained, load_pretrained
    from attnconv.models.transformed import TransformedNetwork
    from attnconv.runs import checkpoint_file

    if checkpoint_or_pretrained(args.checkpoint, args.pretrained) == "pretrained":
        model = load_pretrained(args.pretrained)
        source = f"{args.pretrained} (shipped weights)"
    else:
        path = checkpoint_file(args.checkpoint)
        model, checkpoint = load_model(path)
        source = f"{path}: preset {checkpoint['preset']}, epoch {checkpoint.get('epoch', '?')}"
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
    return 0


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
