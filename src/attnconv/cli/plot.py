"""``attnconv plot CHECKPOINT|--pretrained NAME --out DIR``: every attention figure of a model,
PNG and PDF."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", nargs="?", help="a checkpoint file, or a run folder (its last.pt)"
    )
    parser.add_argument(
        "--pretrained",
        metavar="NAME",
        help="a model shipped with attnconv instead of a checkpoint (offline; content models "
        "use the shipped test images)",
    )
    parser.add_argument("--out", required=True, help="folder for the figures")
    parser.add_argument(
        "--query",
        type=int,
        nargs=2,
        metavar=("ROW", "COL"),
        help="query token (default: the centre of the token grid)",
    )
    parser.add_argument(
        "--window",
        type=int,
        help="zoom the maps to this many tokens around the query (default: all)",
    )
    parser.add_argument(
        "--images",
        type=int,
        default=16,
        help="models with content scores: average over this many test images (default: 16)",
    )
    parser.add_argument(
        "--image-index",
        type=int,
        default=0,
        help="models with content scores: the test image of the single-image figures (default: 0)",
    )
    parser.add_argument("--data-dir", help="dataset folder (default: attnconv's data folder)")


def run(args: argparse.Namespace) -> int:
    from attnconv.errors import UserError
    from attnconv.models.pretrained import checkpoint_or_pretrained
    from attnconv.viz.figures import plot_checkpoint, plot_pretrained

    if args.images < 1:
        raise UserError(f"--images must be at least 1, got {args.images}")
    if args.image_index < 0:
        raise UserError(f"--image-index must be >= 0, got {args.image_index}")
    if args.window is not None and args.window < 0:
        raise UserError(f"--window must be a non-negative number of tokens, got {args.window}")
    options = {
        "query": None if args.query is None else tuple(args.query),
        "window": args.window,
        "num_images": args.images,
        "image_index": args.image_index,
    }
    if checkpoint_or_pretrained(args.checkpoint, args.pretrained) == "pretrained":
        result = plot_pretrained(args.pretrained, args.out, **options)
    else:
        result = plot_checkpoint(args.checkpoint, args.out, data_dir=args.data_dir, **options)
    print(result.table)
    print(f"wrote {len(result.files)} files to {args.out}:")
    for path in result.files:
        print(f"  {path}")
    for reason in result.not_drawn:
        print(f"not drawn: {reason}")
    return 0
