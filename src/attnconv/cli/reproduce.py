"""``attnconv reproduce EXPERIMENT --out DIR``: the paper's experiment on a dataset
(``attnconv.reproduce``)."""

from __future__ import annotations

import argparse

from attnconv.cli.options import DataFolder, OutputFolder, int_in, preset_name, seed
from attnconv.hardware import PRECISIONS
from attnconv.reproduce import (  # a light module: its heavy imports are in functions
    EXPERIMENTS,
    RECIPES,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", choices=tuple(EXPERIMENTS), help="the dataset")
    parser.add_argument(
        "--out", type=OutputFolder(),
        help="the experiment folder (default: reproduce-EXPERIMENT, e.g. reproduce-fashion-mnist); "
        "run again, the same command goes on where it stopped: finished runs are kept, "
        "interrupted ones resumed",
    )
    parser.add_argument(
        "--presets",
        nargs="+",
        metavar="PRESET",
        type=preset_name(),
        help="only these models of the experiment (default: all)",
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=seed(),
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
        help="how new runs train: presets (the default): the presets as they stand, every model "
        "for the same number of epochs (the equal-budget table); shipped: as the shipped weights "
        "were trained",
    )
    parser.add_argument(
        "--epochs", type=int_in(1, 100_000), metavar="N",
        help="train every new run N epochs (default: the recipe's; the equal-budget table's "
        "short column: --epochs 26, or 22)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="training precision of new runs (default: the recipe's; auto: bfloat16 where native)",
    )
    parser.add_argument("--data-dir", type=DataFolder(), help="where datasets live")
    parser.add_argument(
        "--export-weights",
        nargs="?",
        const="",
        metavar="FOLDER",
        type=OutputFolder(),
        help="write the best checkpoints as shipped weights (default folder: the package's own)",
    )


def run(args: argparse.Namespace) -> int:
    from attnconv.errors import UserError
    from attnconv.reproduce import run_experiment
    from attnconv.runs import remove_dead_temporaries

    if args.analyse_only:
        given = [f"--{name}" for name in ("recipe", "precision", "epochs") if getattr(args, name)]
        if given:
            raise UserError(
                f"--analyse-only trains nothing, so {' and '.join(given)} (which set how new "
                "runs train) would do nothing; leave them out"
            )

    out = args.out or f"reproduce-{args.experiment}"
    # a killed earlier run's temporary files (results, figures; each run folder cleans its own)
    remove_dead_temporaries(out, depth=3)
    run_experiment(
        args.experiment,
        out,
        presets=args.presets,
        precision=args.precision,
        data_dir=args.data_dir,
        export_weights=args.export_weights,
        seeds=args.seeds,
        recipe=args.recipe or "presets",
        analyse_only=args.analyse_only,
        epochs=args.epochs,
    )
    return 0
