"""``attnconv train``: train a preset, resume a run, or fine-tune a pruned checkpoint.

    attnconv train --preset quadratic --dataset cifar10 [--epochs N] [--out RUN_DIR] [key=value ...]
    attnconv train --preset learned-fashion --recipe shipped [key=value ...]
    attnconv train --resume RUN_DIR [--epochs N]
    attnconv train --preset quadratic-generalized-pruned --init RUN_DIR/checkpoints/best.pt
    torchrun --nproc_per_node 4 -m attnconv train --preset quadratic ...
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from attnconv.cli.options import (
    DataFolder,
    Device,
    InitSource,
    KeyValue,
    OutputFolder,
    RunFolder,
    dataset_name,
    int_in,
    preset_name,
)
from attnconv.hardware import PRECISIONS
from attnconv.runs import CHECKPOINTS, RunDir
from attnconv.train.loop import LOG_INTERVAL

RECIPES = ("preset", "shipped")
# The typed flags: the TrainConfig field each one sets.
FLAG_FIELDS: tuple[str, ...] = ("data_dir", "epochs", "precision", "device", "init")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", type=KeyValue(),
        help="override any config value (lr=0.05, grad_clip=1, checkpoint_every=5, ...) or a "
        "model argument (model.hidden=128, model.dropout=0); an unknown key lists the valid ones",
    )
    parser.add_argument("--preset", type=preset_name(),
                        help="the model and recipe (see `attnconv models`)")
    parser.add_argument(
        "--recipe", choices=RECIPES, default="preset",
        help="preset (the default): the preset's recipe; shipped: the recipe the preset's "
        "shipped weights were trained with, as their index entry records it (its settings, and "
        "its re-plans: a run stopped and resumed to a new length is trained the same way, and "
        "the same command with the same --out continues it if interrupted); flags and "
        "key=value overrides replace the recorded settings of the same keys",
    )
    parser.add_argument("--dataset", type=dataset_name(),
                        help="cifar10, cifar100, fashion-mnist, digits or "
                        "fashion-mnist-anywhere (default: the preset's, or with --init the "
                        "checkpoint's)")
    parser.add_argument("--data-dir", type=DataFolder(), help="where datasets live (default $ATTNCONV_DATA or "
                        "~/.cache/attnconv); not for digits, which ship with scikit-learn")
    parser.add_argument("--out", type=OutputFolder(),
                        help="the run folder (default runs/PRESET-DATASET-TIME; one that holds "
                        "a run is refused: continue it with --resume)")
    parser.add_argument(
        "--epochs", type=int_in(1, 10**6), metavar="N",
        help="training length (default: the preset's); with --resume, the run's new length in "
        "all, to train it on (a run of 6 epochs given --epochs 10 trains 4 more): the updates "
        "made keep their rates and the schedule of the rest is that of an N-epoch run (cosine: "
        "warm-up and decay re-planned over N epochs, so the rate rises to that plan's value and "
        "decays to zero at epoch N; step: the milestones stay at their epochs)",
    )
    parser.add_argument("--precision", choices=PRECISIONS, help="auto (the default): bfloat16 "
                        "autocast where the device computes in bfloat16 natively (CUDA Ampere+, "
                        "CPUs with AMX or AVX512-BF16), else float32; fp32; bf16 (warns where "
                        "slow)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument(
        "--log-interval", type=int_in(0, 10**9), metavar="N", default=LOG_INTERVAL,
        help="where stderr is not a terminal (nohup, tee, a log file, a notebook), print a line "
        "every N optimizer steps, the first after at most 5 s of training: loss, learning rate, "
        "images per second and the time left; 0: only the line per epoch; also with --resume "
        f"(default: {LOG_INTERVAL})",
    )
    parser.add_argument(
        "--threads", type=int_in(1, 4096), metavar="N",
        help="threads torch computes with (default: as many as the cores other work leaves "
        "idle by the load average at the start, at most one per core; OMP_NUM_THREADS if set); "
        "the start line says which and why; also with --resume: give the run's N again to "
        "continue it bit for bit (the count changes float rounding)",
    )
    parser.add_argument("--device", type=Device(),
                        help="auto (CUDA if available), cpu, cuda or cuda:N")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        type=RunFolder("a run folder to resume", f"{CHECKPOINTS}/last.pt"),
                        help="continue the run in RUN_DIR exactly "
                        "where its last checkpoint left it, with the config saved in that "
                        "checkpoint; with --epochs N, train it on to epoch N")
    parser.add_argument(
        "--init", metavar="CHECKPOINT", type=InitSource(),
        help="fine-tune this checkpoint, or pretrained:NAME for a shipped model, with a preset "
        "that fine-tunes (quadratic-generalized-pruned prunes its degenerate heads first; "
        "tcnn-fashion-small transforms a resnet-fashion-small as its preset says, or takes "
        "what `attnconv transform` wrote)",
    )


def flag_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The typed flags that were given, as ``TrainConfig`` field → value."""
    settings = {name: getattr(args, name) for name in FLAG_FIELDS if getattr(args, name) is not None}
    if args.compile:
        settings["compile"] = True
    return settings


def _check_resume(args: argparse.Namespace) -> Path:
    from attnconv.cli import UsageError

    run_dir = Path(args.resume)
    others = {key for key in flag_settings(args) if key != "epochs"}
    if others or args.overrides or args.dataset is not None or args.out is not None \
            or args.recipe != "preset":  # fmt: skip
        raise UsageError(
            "--resume continues a run with the config saved in its last checkpoint; it takes no "
            "other options or key=value overrides, except --epochs N to train the run on to "
            "epoch N"
        )
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist")
    last = RunDir(run_dir).last
    if not last.is_file():
        raise FileNotFoundError(f"{run_dir} has no checkpoint to resume from (no {last})")
    return run_dir


def run(args: argparse.Namespace) -> int:
    from attnconv.cli import UsageError
    from attnconv.models import PRESETS
    from attnconv.models.checkpoint import load_checkpoint
    from attnconv.models.pretrained import load_init_checkpoint
    from attnconv.train.config import recorded_config, resolve_config, shipped_recipe
    from attnconv.train.loop import NonFiniteLossError, train, train_in_plans
    from attnconv.viz.figures import attention_figure

    init = None
    plans = None  # (length, stop) of each plan of a recorded run (--recipe shipped)
    if args.resume is not None:
        run_dir = _check_resume(args)
        config = None
        if args.preset is not None:
            preset = load_checkpoint(RunDir(run_dir).last, mmap=True)["preset"]
            if args.preset != preset:
                raise UsageError(f"{run_dir} is a run of preset {preset!r}, not {args.preset!r}")
    else:
        if args.preset is None:
            raise UsageError(f"give --preset (one of {', '.join(PRESETS)}) or --resume RUN_DIR")
        dataset = args.dataset
        if args.init is not None:
            init = load_init_checkpoint(args.init)  # once: its dataset here, its weights in train
            dataset = dataset or init["dataset"]
        if args.recipe == "shipped":
            config, plans = recorded_config(
                shipped_recipe(args.preset), dataset, args.overrides, **flag_settings(args)
            )
        else:
            config = resolve_config(args.preset, dataset, args.overrides, **flag_settings(args))
        if init is not None:
            init = _transformed_if_needed(init, args.preset, config.seed)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path(args.out or Path("runs") / f"{config.preset}-{config.dataset}-{stamp}")
    try:
        if plans is not None and len(plans) > 1:  # the same command continues it part-way
            train_in_plans(config, run_dir, plans, init_checkpoint=init,
                           epoch_figure=attention_figure, log_interval=args.log_interval,
                           threads=args.threads)  # fmt: skip
        else:
            train(
                config,
                run_dir,
                resume=args.resume is not None,
                epochs=args.epochs if args.resume is not None else None,
                init_checkpoint=init,
                epoch_figure=attention_figure,
                log_interval=args.log_interval,
                threads=args.threads,
            )
    except NonFiniteLossError as err:
        print(f"attnconv train: stopped: {err}", file=sys.stderr)
        return 1
    return 0


def _transformed_if_needed(init: dict[str, Any], preset_name: str, seed: int) -> dict[str, Any]:
    """``init``, or for a preset of transformed networks (``tcnn-*``) given a checkpoint of the
    network it transforms, that checkpoint transformed as the preset's arguments say, its queries
    and keys drawn after ``torch.manual_seed(seed)`` (as ``attnconv transform --seed`` draws
    them: the same transformed network)."""
    import torch

    from attnconv.convert import transform_checkpoint
    from attnconv.models import PRESETS

    preset = PRESETS.get(preset_name)
    if preset is None or preset.model != "transformed" or init["architecture"] == "transformed":
        return init
    kwargs = preset.model_kwargs
    keys = ("spread", "qk_dim", "content_heads", "gate", "opening", "qk_init",
            "content_weight_decay")
    settings = {key: kwargs[key] for key in keys if key in kwargs}
    if "content" in kwargs:  # True, False or names
        content = kwargs["content"]
        settings["content"] = content if isinstance(content, bool) else list(content)
    torch.manual_seed(seed)
    return transform_checkpoint(init, list(kwargs["layers"]), preset=preset_name, **settings)
