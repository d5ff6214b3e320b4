"""``attnconv reproduce EXPERIMENT --out DIR``: the paper's experiment on a dataset
(``attnconv.reproduce``)."""

from __future__ import annotations

import argparse

from attnconv.hardware import PRECISIONS
from attnconv.reproduce import (  # a light module: its heavy imports are in functions
    EXPERIMENTS,
    RECIPES,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", choices=tuple(EXPERIMENTS), help="the dataset")
    parser.add_argument(
        "--out", help="the experiment folder (default: reproduce-EXPERIMENT, e.g. reproduce-fashion-mnist)"
    )
    parser.add_argument(
        "--presets",
        nargs="+",
        metavar="PRESET",
        help="only these models of the experiment (default: all)",
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        metavar="SEED",
        help="train every model once per seed (default: 0); the table gives mean ± standard "
        "deviation over them",
    )
    parser.add_argument(
        "--analyse-only",
        action="store_true",
        help="train nothing: the table of the finished runs in --out, of --seeds or (without "
        "them) of every seed folder each model has; unfinished and missing runs are named and "
        "left out",
    )
    parser.add_argument(
        "--recipe",
        choices=RECIPES,
        help="how new runs train: as the shipped weights were trained (default), or the presets "
        "as they stand (the paper code's start)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="training precision of new runs (default: the recipe's; auto: bfloat16 where native)",
    )
    parser.add_argument("--data-dir", help="where datasets live")
    parser.add_argument(
        "--export-weights",
        nargs="?",
        const="",
        metavar="FOLDER",
        help="write the best checkpoints as shipped weights (default folder: the package's own)",
    )


def run(args: argparse.Namespace) -> int:
    from attnconv.errors import UserError
    from attnconv.reproduce import run_experiment

    if args.analyse_only:
        given = [f"--{name}" for name in ("recipe", "precision") if getattr(args, name)]
        if given:
            raise UserError(
                f"--analyse-only trains nothing, so {' and '.join(given)} (which set how new "
                "runs train) would do nothing; leave them out"
            )

    run_experiment(
        args.experiment,
        args.out or f"reproduce-{args.experiment}",
        presets=args.presets,
        precision=args.precision,
        data_dir=args.data_dir,
        export_weights=args.export_weights,
        seeds=args.seeds,
        recipe=args.recipe or "shipped",
        analyse_only=args.analyse_only,
    )
    return 0
