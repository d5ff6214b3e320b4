"""``attnconv plot CHECKPOINT|--pretrained NAME --out DIR``: every attention figure of a model,
PNG and PDF; for a transformed network (T-CNN) its heads' contours from a query with their start
taps, content gates, attention distance by depth and centre trajectories."""

from __future__ import annotations

import argparse

from attnconv.cli.options import (
    CheckpointSource,
    DataFolder,
    OutputFolder,
    add_overwrite,
    int_in,
    shipped_model,
)

DEFAULT_IMAGES = 16  # test images a checkpoint's content model is averaged over


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", nargs="?", type=CheckpointSource(),
        help="a checkpoint file, or a run folder (its last.pt)",
    )
    parser.add_argument(
        "--pretrained",
        metavar="NAME",
        type=shipped_model(),
        help="a model shipped with attnconv instead of a checkpoint (offline; content models "
        "use the shipped test images)",
    )
    parser.add_argument("--out", required=True, type=OutputFolder(), help="folder for the figures")
    add_overwrite(parser, "figures")
    parser.add_argument(
        "--query",
        type=int_in(0, 65535),
        nargs=2,
        metavar=("ROW", "COL"),
        help="query token (default: the centre of the token grid); for a transformed network "
        "an image pixel, each layer's query the output pixel nearest it",
    )
    parser.add_argument(
        "--window",
        type=int_in(0, 65535),
        metavar="W",
        help="zoom the maps to the tokens within W rows and columns of the query (a "
        "(2W+1)x(2W+1) square, clipped at the border; default: all)",
    )
    parser.add_argument(
        "--images",
        type=int_in(1, 10**6),
        help=f"models with content scores and transformed networks: average over this many test images (default: {DEFAULT_IMAGES}; "
        "with --pretrained the 8 shipped with the weights, and more are read from --data-dir or "
        "an installed copy of the dataset)",
    )
    parser.add_argument(
        "--image-index",
        type=int_in(0, 10**6),
        default=0,
        help="models with content scores: the test image of the single-image figures (default: 0)",
    )
    parser.add_argument(
        "--scale",
        choices=("map", "shared"),
        default="map",
        help="colour scale of the maps: each map from 0 to its own maximum (default), or one "
        "scale shared by all maps; either reaches at least 4/N (N tokens) so that near-uniform "
        "maps stay dark",
    )
    parser.add_argument("--data-dir", type=DataFolder(),
                        help="dataset folder (default: attnconv's data folder)")


def run(args: argparse.Namespace) -> int:
    from attnconv.cli.options import claim_output
    from attnconv.models.pretrained import checkpoint_or_pretrained
    from attnconv.viz.figures import plot_checkpoint, plot_pretrained

    checkpoint_or_pretrained(args.checkpoint, args.pretrained)
    claim_output(args.out, args.overwrite)
    options = {
        "query": None if args.query is None else tuple(args.query),
        "window": args.window,
        "image_index": args.image_index,
        "data_dir": args.data_dir,
        "scale": args.scale,
    }
    if checkpoint_or_pretrained(args.checkpoint, args.pretrained) == "pretrained":
        result = plot_pretrained(args.pretrained, args.out, num_images=args.images, **options)
    else:
        images = DEFAULT_IMAGES if args.images is None else args.images
        result = plot_checkpoint(args.checkpoint, args.out, num_images=images, **options)
    print(result.table)
    if result.image_source is not None:
        print(f"content model: averaged over {result.image_source}")
    print(f"wrote {len(result.files)} files to {args.out}:")
    for path in result.files:
        print(f"  {path}")
    for reason in result.not_drawn:
        print(f"not drawn: {reason}")
    return 0
