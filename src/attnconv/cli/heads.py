"""``attnconv heads CHECKPOINT|RUN_DIR|--pretrained NAME``: every Gaussian head's centre, spread
and condition number."""

from __future__ import annotations

import argparse

from attnconv.models.heads import MAX_CONDITION, MIN_SPREAD


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        nargs="?",
        help="a checkpoint written by `attnconv train`, or a run folder (its checkpoints/best.pt, "
        "the epoch chosen on validation)",
    )
    parser.add_argument("--pretrained", metavar="NAME", help="a model shipped with attnconv")
    parser.add_argument(
        "--min-spread",
        type=float,
        default=MIN_SPREAD,
        help=f"degenerate below this inverse std, 1/tokens (default: {MIN_SPREAD})",
    )
    parser.add_argument(
        "--max-condition",
        type=float,
        default=MAX_CONDITION,
        help=f"degenerate above this covariance condition number (default: {MAX_CONDITION:g})",
    )


def run(args: argparse.Namespace) -> int:
    from attnconv.models.checkpoint import load_model
    from attnconv.models.heads import head_table
    from attnconv.models.pretrained import checkpoint_or_pretrained, load_pretrained
    from attnconv.runs import checkpoint_file

    if checkpoint_or_pretrained(args.checkpoint, args.pretrained) == "pretrained":
        model = load_pretrained(args.pretrained)
        source = f"{args.pretrained} (shipped weights)"
    else:
        path = checkpoint_file(args.checkpoint)
        model, checkpoint = load_model(path)
        source = f"{path}: preset {checkpoint['preset']}, epoch {checkpoint.get('epoch', '?')}"
    rows = head_table(model, args.min_spread, args.max_condition)
    print(source)
    print(
        f"{'layer':>5} {'head':>4} {'center_row':>10} {'center_col':>10} {'spread':>9} "
        f"{'condition':>10}  degenerate"
    )
    for row in rows:
        print(
            f"{row['layer']:>5} {row['head']:>4} {row['center_row']:>10.3f} "
            f"{row['center_col']:>10.3f} {row['spread']:>9.4f} {row['condition_number']:>10.3g}"
            f"  {'yes' if row['degenerate'] else 'no'}"
        )
    degenerate = sum(row["degenerate"] for row in rows)
    print(
        f"{degenerate} of {len(rows)} heads degenerate (spread < {args.min_spread:g} or "
        f"condition number > {args.max_condition:g})"
    )
    return 0
