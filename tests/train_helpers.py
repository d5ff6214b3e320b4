"""Overrides that make a training run take a second: a one-block, 16-wide model, no TensorBoard or
progress bar, float32 on the CPU (runs compared with float32 arithmetic, whatever "auto" picks)."""

TINY = [
    "model.hidden=16",
    "model.depth=1",
    "model.heads=2",
    "model.head_dim=8",
    "model.mlp_dim=32",
    "batch_size=64",
]
QUIET = ["tensorboard=false", "progress=false", "device=cpu", "precision=fp32"]


def command_config(command: str):
    """The ``TrainConfig`` that the command line parses one ``attnconv train`` command into, as
    ``attnconv train`` resolves it."""
    import shlex

    from attnconv.cli import build_parser
    from attnconv.cli.train import flag_settings
    from attnconv.train.config import resolve_config

    words = shlex.split(command)
    assert words[:2] == ["attnconv", "train"], command
    args = build_parser("train").parse_args(words[1:])
    return resolve_config(args.preset, args.dataset, args.overrides, **flag_settings(args))


def without_bookkeeping(config):
    """``config`` with the settings that do not change what a run computes at their defaults."""
    import dataclasses

    from attnconv.train.config import BOOKKEEPING_KEYS, TrainConfig

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    return dataclasses.replace(config, **{key: defaults[key] for key in BOOKKEEPING_KEYS})
