"""What a run trains: its model (fresh from the preset, rebuilt from the checkpoint it resumes, or
the ``--init`` checkpoint it fine-tunes), checked against the dataset, the optimizer over it and
the crop of its training images.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from attnconv.data import DataSplits
from attnconv.errors import UserError
from attnconv.hardware import resolve_precision
from attnconv.models import MODELS, PRESETS
from attnconv.models.checkpoint import build_model, rebuild
from attnconv.models.presets import preset_arguments
from attnconv.models.pretrained import load_init_checkpoint
from attnconv.train import distributed
from attnconv.train.config import TrainConfig
from attnconv.train.logger import note

# What a model is: its architecture (a MODELS key) and every constructor argument, as checkpoints
# store them.
Built = tuple[nn.Module, str, dict[str, Any]]


def resolved_precision(config: TrainConfig, device: torch.device, is_main: bool) -> TrainConfig:
    """``config`` with its precision resolved for ``device`` (``attnconv.hardware``): ``auto``
    becomes what the device runs fast, which ``config.json`` and ``summary.json`` record; a note
    on stderr (``is_main``) where an explicit ``bf16`` runs slowly there."""
    warn = note if is_main else lambda _: None
    return dataclasses.replace(
        config, precision=resolve_precision(config.precision, device, warn=warn)
    )


def data_model_config(data: DataSplits) -> dict[str, Any]:
    """The model constructor arguments a dataset fixes."""
    return {
        "num_classes": data.num_classes,
        "in_channels": data.channels,
        "image_size": tuple(data.image_size),
        "mean": tuple(data.mean),
        "std": tuple(data.std),
    }


def check_data_fits(
    arguments: dict[str, Any], data: DataSplits, source: str, same_size: bool = False
) -> None:
    """UserError if a model built with constructor ``arguments`` does not take ``data``'s images
    or classes; with ``same_size`` (measuring a trained model), also if its images are not of
    the size the model was built for (another size runs, resized positions or a smaller token
    grid, but the accuracy there is not the model's)."""
    expected = data_model_config(data)
    arguments = arguments.get("base_arguments", arguments)  # a transformed network's base
    for key in ("num_classes", "in_channels"):
        if arguments.get(key) != expected[key]:
            raise UserError(
                f"{source} has {key}={arguments.get(key)}, but dataset {data.name!r} has "
                f"{expected[key]}: use the dataset the model was trained on"
            )
    size = tuple(arguments.get("image_size", ()))
    if same_size and size != expected["image_size"]:
        built = "x".join(map(str, size))
        given = "x".join(map(str, expected["image_size"]))
        raise UserError(
            f"{source} was built for {built} images, but dataset {data.name!r} has {given}: its "
            f"accuracy there would not be the model's; use a dataset of {built} images"
        )


def dropout_seed(seed: int, rank: int) -> int:
    """The torch seed rank ``rank`` of a run seeded ``seed`` draws its dropout masks from (each
    rank its own stream; the weights start from ``seed`` itself, the same on every rank)."""
    digest = hashlib.sha256(f"dropout,{seed},{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def run_model(
    config: TrainConfig,
    data: DataSplits,
    resumed: dict[str, Any] | None,
    last: Path,
    init: dict[str, Any] | None,
    is_main: bool,
) -> Built:
    """``(model, architecture, its full constructor arguments)`` of the run ``config`` on
    ``data``: rebuilt from ``resumed`` (the checkpoint at ``last``) when it resumes, else the
    preset's, else (``config.init``) the fine-tuned checkpoint's, ``init`` if already loaded.
    ``is_main``: this rank prints what pruning did."""
    if resumed is not None:
        check_data_fits(resumed["arguments"], data, str(last))
        architecture, arguments = resumed["architecture"], dict(resumed["arguments"])
        return build_model(resumed, last), architecture, arguments
    if config.init is None:
        overrides = {**config.model, **data_model_config(data)}
        architecture, arguments = preset_arguments(config.preset, **overrides)
        try:
            return MODELS[architecture](**arguments), architecture, arguments
        except (TypeError, ValueError, RuntimeError) as err:  # RuntimeError: out of memory
            given = " ".join(f"model.{k}={v}" for k, v in config.model.items())
            reason = str(err).strip().splitlines()[0]  # torch's C++ errors add stack frames
            raise UserError(
                f"{given or 'its preset arguments'}: the {config.preset!r} model cannot be "
                f"built on {config.dataset} with {'it' if len(config.model) == 1 else 'them'} "
                f"({reason})"
            ) from err
    init = load_init_checkpoint(config.init) if init is None else init
    return init_model(config, data, init, is_main)


def init_model(config: TrainConfig, data: DataSplits, init: dict[str, Any], is_main: bool) -> Built:
    """The ``--init`` checkpoint's model, checked against the preset that fine-tunes it, with
    its degenerate heads pruned for a pruned preset (``is_main``: saying so)."""
    from attnconv.models.heads import prune_degenerate_heads

    target = PRESETS[config.preset]
    accepted = target.init_presets or tuple(
        name
        for name, p in PRESETS.items()
        if p.model == target.model
        and {k: v for k, v in p.model_kwargs.items() if k != "heads"}
        == {k: v for k, v in target.model_kwargs.items() if k != "heads"}
        and name != config.preset
    )
    if init["preset"] not in accepted:
        raise UserError(
            f"{config.init} is a checkpoint of preset {init['preset']!r}; preset "
            f"{config.preset!r} fine-tunes a model of preset {' or '.join(accepted)}"
        )
    if init["dataset"] != config.dataset:
        raise UserError(
            f"{config.init} was trained on {init['dataset']!r}, not on {config.dataset!r}"
        )
    check_data_fits(init["arguments"], data, str(config.init))
    architecture, arguments = init["architecture"], {**init["arguments"], **config.model}
    model = rebuild(architecture, arguments, init["model"], f"{config.init} with {config.model}")
    if target.init_presets:  # fine-tuned as it is
        return model, architecture, arguments
    summary = prune_degenerate_heads(model)
    if is_main:
        tqdm.write(f"{config.init}: {summary}")
    return model, architecture, {**arguments, "heads": list(summary.heads)}


def forward_model(model: nn.Module, context: distributed.Context, compile: bool) -> nn.Module:
    """What the training steps call: ``model``, in DistributedDataParallel across the ranks of a
    distributed run, compiled with ``compile`` (``torch.compile``)."""
    if context.distributed:
        devices = [context.device] if context.device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=devices)
    return torch.compile(model) if compile else model


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD or AdamW over two groups, with and without weight decay; with
    ``attention_lr_scale ≠ 1`` and a model that has ``transform_parameters()``, those
    parameters form groups of their own whose ``lr_scale`` multiplies the schedule's rate."""
    no_decay = model.no_weight_decay_parameters(config.decay_exempt)
    named = list(model.named_parameters())
    scaled: set[str] = set()
    if config.attention_lr_scale != 1 and hasattr(model, "transform_parameters"):
        scaled = set(model.transform_parameters())
    groups = []
    for names, scale in ((scaled, config.attention_lr_scale), (None, 1.0)):
        chosen = [(n, p) for n, p in named if (n in scaled) == (names is not None)]
        for decays in (True, False):
            params = [p for n, p in chosen if (n not in no_decay) == decays]
            if names is not None and not params:
                continue
            weight_decay = config.weight_decay if decays else 0.0
            groups.append({"params": params, "weight_decay": weight_decay, "lr_scale": scale})
    groups.sort(key=lambda group: group["lr_scale"] != 1.0)  # the plain groups first
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr, betas=(config.momentum, 0.999))
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)


def crop_pad(config: TrainConfig, data: DataSplits) -> int:
    """The zero padding, in pixels, of the training images' random crop: ``config.pad``, by
    default an eighth of the image side, none on a placed dataset (its images move already)."""
    if config.pad is not None:
        return config.pad
    return 0 if data.placement else math.ceil(max(data.image_size) / 8)
