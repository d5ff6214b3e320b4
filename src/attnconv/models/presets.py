"""Named model configurations with their training recipes, and their constructor arguments.

``MODELS`` names the architectures; ``preset_arguments`` gives every constructor argument of a
preset's model (``attnconv.models.create_model`` builds it, ``attnconv.models.checkpoint`` saves
them).

Every preset of the paper ([the mathematics, §4][4-the-image-transformer]), ``quick`` (a small model
for a CPU demo), the Fashion-MNIST scale-downs (``*-fashion``, see the comment above ``PRESETS``)
and five of them on fashion-mnist-anywhere (``*-anywhere``, see ``ANYWHERE_OF``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from attnconv.data.statistics import (
    DIGITS_MEAN,
    DIGITS_STD,
    FASHION_MNIST_ANYWHERE_MEAN,
    FASHION_MNIST_ANYWHERE_STD,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
)
from attnconv.errors import UserError, warn_deprecated
from attnconv.models.transformed import BASES, TransformedNetwork

SCHEDULES = ("cosine", "step")

_FASHION_IMAGES: dict[str, Any] = {
    "in_channels": 1,
    "image_size": (28, 28),
    "mean": FASHION_MNIST_MEAN,
    "std": FASHION_MNIST_STD,
}


@dataclass(frozen=True)
class Preset:
    """A named architecture (``model`` is a key of ``MODELS``) with its constructor arguments, the
    dataset it is sized for, and how its training differs from the paper's recipe.

    ``recipe``: ``attnconv.train.TrainConfig`` field → value, the preset's departures from the
    config's defaults (the paper's recipe: SGD with momentum 0.9, lr 0.1, weight decay 1e-4, batch
    100, 300 epochs, cosine decay after a 5% linear warm-up); checked when a config is resolved
    (``attnconv.train.resolve_config``). ``requires_init``: the run fine-tunes a given checkpoint
    (after pruning its degenerate heads, for a pruned preset) instead of starting from scratch;
    ``init_presets`` names the presets whose checkpoints it fine-tunes (by default those of the same
    architecture and arguments but the heads). ``dataset``: an ``attnconv.data.DATASETS`` name.
    """

    name: str
    description: str
    model: str
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)
    dataset: str = "cifar10"
    requires_init: bool = False
    init_presets: tuple[str, ...] = ()


def Recipe(**fields: Any) -> dict[str, Any]:
    """Deprecated: a preset's recipe is now a plain mapping of ``TrainConfig`` field → value
    (``Preset(..., recipe={"lr": 0.01})``); this returns ``fields`` as that mapping."""
    warn_deprecated(
        "attnconv.models.Recipe",
        "attnconv.models.Recipe is deprecated: give Preset a mapping of TrainConfig field → "
        "value (recipe={'lr': 0.01}); dataset and requires_init are Preset fields",
    )
    moved = sorted({"dataset", "requires_init"} & set(fields))
    if moved:
        raise TypeError(f"{', '.join(moved)}: now arguments of Preset, not of its recipe")
    return dict(fields)


MODELS: dict[str, type[nn.Module]] = {**BASES, "transformed": TransformedNetwork}

_GENERALIZED = {"positional": "gaussian_full"}

# Choices the paper leaves open:
# * learned presets: max_size=32 (offsets ±31, token grids up to 32×32, i.e. 64×64 images with
#   the 2×2 stem). The relative tables then hold 63·400 values per layer and the totals match
#   Table 1 (12.26M vs 12.3M, 29.58M vs 29.5M); max_size=16, the smallest covering CIFAR's 16×16
#   grid, gives 12.18M.
# * quick: the 8×8 digits with stem 1 (64 tokens, room for 9 heads to spread around the query),
#   hidden 64, 2 layers, head_dim 16. BERT's N(0, 0.02²) initialisation starves so narrow a model
#   (chance accuracy after 5 epochs); 1/√fan_in trains it to ~90% in 20 epochs, a few minutes on
#   2 CPU cores. No hidden dropout (attention dropout kept); batch 32 for enough steps per epoch.

# * the Fashion-MNIST presets (``*-fashion``): the paper's models scaled down the same way for
#   a 2-core CPU. The 2×2 stem of the paper turns 28×28 images into a 14×14 token grid (CIFAR:
#   16×16), so the attention sees a grid of about the paper's size; width and depth shrink instead
#   (hidden 64, 4 layers, feed-forward 128, 9 heads that attend over the raw hidden states as in
#   the paper), the learned tables cover exactly the 14×14 grid. Their Linear layers start from
#   ``fan_in`` normal weights (``weight_init="fan_in"``; the learned tables and head keys keep the
#   paper code's start, ``positional_init="original"``), not the paper code's PyTorch defaults
#   (``weight_init="original"``, docs/theory.md §4): in a 10-epoch budget that start lifted
#   quadratic-fashion from 81.6% to 88.85% with the same seed and recipe (docs/reproducing.md).
#   They train with the paper's recipe (SGD with momentum 0.9, batch
#   100, 5% warm-up + cosine, random crops and flips, decay exempting only the Gaussian geometry)
#   at lr 0.03 and without dropout (in 300-step trials lr 0.03 beat 0.1, 0.75 against 0.72
#   validation accuracy, and dropout only slowed learning). The paper's lr 0.1 moves the Gaussian
#   centres faster but does not hold over a longer run at this width: in a 14-epoch run (seed 0)
#   six of layer 0's nine heads gathered on one offset, then heads flew off to 6-9 tokens, and
#   training accuracy fell from 69.9% to 65.5% in epoch 5 (docs/reproducing.md). The content
#   model is the paper's code's ``w·r + q·k/√d`` with 16-wide queries and keys per head (the
#   paper: 400; its per-image ``heads·N²`` scores make it ~1.5× slower per image than the
#   position-only models in float32 on Zen 3).
#   The CNN baseline (``resnet-fashion-small``) is a CIFAR ResNet-18 narrowed to widths 9..72 so
#   that its size matches the attention models' (223k against 233k-242k parameters; the paper:
#   11.2M against 12.1M); ``resnet-fashion`` (widths 16..128, 701k) is a wider second row. Both
#   take the paper's ResNet recipe (lr 0.1, step decay after 1/3, 1/2 and 5/6 of the run).
#   The plain ViT trains as ViTs are trained, with AdamW (lr 1e-3, weight decay 0.05, none on
#   norms, biases and the position embedding): under the attention models' SGD its position
#   embedding, which starts N(0, 0.02²) beside patch embeddings ~50x larger, stayed where it
#   started (std 0.020 -> 0.025 in two epochs, measured) and the model read its patches as a bag
#   (62% validation accuracy after two epochs).
#   Every model trains FASHION_EPOCHS = 50 epochs, so that attention and convolution are compared
#   at one budget, as the paper trained every model of its Table 1 for the same 300 epochs (the
#   equal-budget table, docs/reproducing.md): 50 is where the CNNs and the ViT reached their
#   plateau. The attention models first shipped from shorter runs, what fitted two hours on
#   2 Zen 3 cores (FASHION_SHORT_EPOCHS, the table's other column, where the CNNs are trained
#   again at the same lengths).
FASHION_EPOCHS = 50
FASHION_SHORT_EPOCHS: dict[str, int] = {
    "quadratic-fashion": 26,
    "learned-fashion": 22,
    "learned-content-fashion": 22,
}
"""The first shipped budgets of the Fashion attention models (epochs): the short column of the
equal-budget table, where each CNN is trained again for the same number of epochs."""
FASHION_RESNET_EPOCHS = FASHION_EPOCHS
_FASHION_TRANSFORMER: dict[str, Any] = {
    **_FASHION_IMAGES,
    "stem": 2,
    "hidden": 64,
    "depth": 4,
    "heads": 9,
    "mlp_dim": 128,
    "max_size": 14,
    "dropout": 0.0,
    "attention_dropout": 0.0,
}
_FASHION_RECIPE: dict[str, Any] = {"lr": 0.03, "epochs": FASHION_EPOCHS}
_FASHION_START: dict[str, Any] = {"weight_init": "fan_in"}
_FASHION_LEARNED_START: dict[str, Any] = {"weight_init": "fan_in", "positional_init": "original"}
_FASHION_VIT_RECIPE: dict[str, Any] = {
    "optimizer": "adamw",
    "lr": 1e-3,
    "weight_decay": 0.05,
    "decay_exempt": "norms-biases-positional",
}
_FASHION_RESNET_RECIPE: dict[str, Any] = {
    "epochs": FASHION_RESNET_EPOCHS,
    "schedule": "step",
    "warmup_fraction": 0.0,
    "milestones": (17, 25, 42),
}

_FASHION_SMALL_WIDTHS = (9, 18, 36, 72)
TCNN_FASHION_LAYERS = tuple(
    f"stages.{stage}.{block}.conv{conv}" for stage in (2, 3) for block in (0, 1) for conv in (1, 2)
)
"""The convolutions ``tcnn-fashion-small`` transforms: every 3×3 one of the last two stages (what
``attnconv.transform``'s default, ``layers="late"``, selects in ``resnet-fashion-small``)."""
TCNN_FASHION_SPREAD = 3.0
"""The smallest spread that keeps ``resnet-fashion-small``'s validation accuracy within 0.1 point
with the late 3×3 convolutions transformed (``attnconv transform`` measured it:
[From a CNN to attention][from-a-cnn-to-attention])."""
TCNN_FULL_FASHION_LAYERS = (
    "conv1",
    *(f"stages.{stage}.{block}.conv{conv}" for stage in range(4) for block in (0, 1)
      for conv in (1, 2)),
)  # fmt: skip
"""The convolutions ``tcnn-full-fashion-small`` transforms: every 3×3 one (``layers="spatial"``)."""
TCNN_FULL_FASHION_SPREAD = 3.5
"""The smallest spread that keeps ``resnet-fashion-small``'s validation accuracy within 0.1 point
with every 3×3 convolution transformed (``attnconv transform --layers spatial``)."""
TCNN_FIRST_FORM: dict[str, Any] = {
    "gate": "clamp", "opening": 0.0, "qk_init": "default", "content_weight_decay": True
}
"""The content start of the ``tcnn-*`` presets: their shipped weights' (``attnconv.convert``'s
``FIRST_FORM``: gates shut, queries and keys that never learn). A checkpoint ``attnconv
transform`` wrote keeps its own start when a preset fine-tunes it."""
_TCNN_RECIPE: dict[str, Any] = {
    "lr": 0.01, "epochs": 20, "warmup_fraction": 0.05, "attention_lr_scale": 10.0
}

def _tcnn_preset(
    name: str,
    description: str,
    layers: tuple[str, ...],
    spread: float,
    content: bool | tuple[str, ...],
) -> Preset:
    """A preset of ``resnet-fashion-small`` transformed at ``layers`` (docs/transform.md),
    fine-tuned from a checkpoint of its own preset (``attnconv transform`` writes one)."""
    return Preset(
        name,
        description,
        "transformed",
        {
            "base": "resnet18",
            "base_arguments": {**_FASHION_IMAGES, "widths": _FASHION_SMALL_WIDTHS},
            "layers": layers,
            "spread": spread,
            "content": content,
            **TCNN_FIRST_FORM,
        },
        dict(_TCNN_RECIPE),
        dataset="fashion-mnist",
        requires_init=True,
        init_presets=(name,),
    )


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            "quadratic",
            "isotropic Gaussian attention, 9 heads (paper: 93.8% CIFAR-10, 12.1M params)",
            "image_transformer",
            {"positional": "gaussian"},
        ),
        Preset(
            "quadratic-generalized",
            "generalized (non-isotropic) Gaussian attention, 9 heads",
            "image_transformer",
            dict(_GENERALIZED),
        ),
        Preset(
            "quadratic-generalized-pruned",
            "quadratic-generalized with degenerate heads pruned, fine-tuned from a checkpoint",
            "image_transformer",
            dict(_GENERALIZED),
            {"lr": 0.01, "epochs": 100},
            requires_init=True,
        ),
        Preset(
            "many-heads",
            "isotropic Gaussian attention, 16 heads",
            "image_transformer",
            {"positional": "gaussian", "heads": 16},
        ),
        Preset(
            "learned",
            "learned relative positional attention, position only (paper: 91.8%, 12.3M params)",
            "image_transformer",
            {"positional": "learned", "max_size": 32},
        ),
        Preset(
            "learned-content",
            "learned relative positions + content, w·r + q·k/√d (paper: 87.1%, 29.5M params)",
            "image_transformer",
            {"positional": "learned", "max_size": 32, "content": True},
        ),
        Preset(
            "resnet18",
            "CIFAR ResNet-18, 3×3 stride-1 stem (paper: 93.8%, 11.2M params)",
            "resnet18",
            {},
            {"schedule": "step", "warmup_fraction": 0.0, "milestones": (80, 150, 250)},
        ),
        Preset(
            "quick",
            "small isotropic Gaussian model on the embedded 8×8 digits; minutes on a CPU",
            "image_transformer",
            {
                "in_channels": 1,
                "image_size": (8, 8),
                "mean": DIGITS_MEAN,
                "std": DIGITS_STD,
                "stem": 1,
                "hidden": 64,
                "depth": 2,
                "heads": 9,
                "head_dim": 16,
                "mlp_dim": 128,
                "positional": "gaussian",
                "dropout": 0.0,
                "weight_init": "fan_in",
            },
            {"batch_size": 32, "epochs": 20},
            dataset="digits",
        ),
        Preset(
            "quadratic-fashion",
            "isotropic Gaussian attention, 9 heads, scaled down for Fashion-MNIST on a CPU",
            "image_transformer",
            {**_FASHION_TRANSFORMER, **_FASHION_START, "positional": "gaussian"},
            dict(_FASHION_RECIPE),
            dataset="fashion-mnist",
        ),
        Preset(
            "learned-fashion",
            "learned relative positional attention, position only, for Fashion-MNIST on a CPU",
            "image_transformer",
            {**_FASHION_TRANSFORMER, **_FASHION_LEARNED_START, "positional": "learned"},
            dict(_FASHION_RECIPE),
            dataset="fashion-mnist",
        ),
        Preset(
            "learned-content-fashion",
            "learned relative positions + content (w·r + q·k/√d), for Fashion-MNIST on a CPU",
            "image_transformer",
            {
                **_FASHION_TRANSFORMER,
                **_FASHION_LEARNED_START,
                "positional": "learned",
                "content": True,
                "head_dim": 16,
            },
            dict(_FASHION_RECIPE),
            dataset="fashion-mnist",
        ),
        Preset(
            "resnet-fashion",
            "narrow CIFAR ResNet-18 (widths 16..128, 701k parameters): a wider CNN baseline for "
            "Fashion-MNIST on a CPU",
            "resnet18",
            {**_FASHION_IMAGES, "widths": (16, 32, 64, 128)},
            dict(_FASHION_RESNET_RECIPE),
            dataset="fashion-mnist",
        ),
        Preset(
            "resnet-fashion-small",
            "CIFAR ResNet-18 narrowed to the attention models' size (widths 9..72, 223k "
            "parameters): the size-matched CNN baseline for Fashion-MNIST on a CPU",
            "resnet18",
            {**_FASHION_IMAGES, "widths": _FASHION_SMALL_WIDTHS},
            dict(_FASHION_RESNET_RECIPE),
            dataset="fashion-mnist",
        ),
        # T-CNN (docs/transform.md): resnet-fashion-small with the 3×3 convolutions of its two
        # last stages (7×7 and 4×4 grids) recast as attention by attnconv.transform, fine-tuned
        # from the trained CNN (`attnconv transform`, then --init), and its control: the CNN
        # trained on with the same recipe, so a gain is not just more training.
        _tcnn_preset(
            "tcnn-fashion-small",
            "resnet-fashion-small with its late 3×3 convolutions recast as attention (Gaussian "
            "heads on the taps + gated content: T-CNN), fine-tuned from the trained CNN",
            TCNN_FASHION_LAYERS,
            TCNN_FASHION_SPREAD,
            content=True,
        ),
        _tcnn_preset(
            "tcnn-full-fashion-small",
            "resnet-fashion-small with every 3×3 convolution recast as attention (Gaussian heads "
            "everywhere, gated content in the late stages): an attention network started as the "
            "CNN, fine-tuned",
            TCNN_FULL_FASHION_LAYERS,
            TCNN_FULL_FASHION_SPREAD,
            content=TCNN_FASHION_LAYERS,
        ),
        Preset(
            "resnet-fashion-small-continued",
            "resnet-fashion-small trained on with tcnn-fashion-small's recipe: the control of "
            "the transform",
            "resnet18",
            {**_FASHION_IMAGES, "widths": _FASHION_SMALL_WIDTHS},
            dict(_TCNN_RECIPE),
            dataset="fashion-mnist",
            requires_init=True,
            init_presets=("resnet-fashion-small", "resnet-fashion-small-continued"),
        ),
        # vit-fashion: a plain ViT (models/vit.py) at the Fashion transformers' width, depth, heads
        # and feed-forward, with 2×2 patches (the same 14×14 grid), learned absolute position
        # embeddings, content-only attention with 16-wide heads (as learned-content-fashion's
        # queries and keys), trained with AdamW (above).
        Preset(
            "vit-fashion",
            "plain ViT: 2×2 patches, learned absolute positions, content attention, Fashion-MNIST",
            "vision_transformer",
            {
                **_FASHION_IMAGES,
                **{
                    key: _FASHION_TRANSFORMER[key]
                    for key in (
                        "hidden",
                        "depth",
                        "heads",
                        "mlp_dim",
                        "dropout",
                        "attention_dropout",
                    )
                },
                "patch_size": 2,
                "head_dim": 16,
            },
            {**_FASHION_VIT_RECIPE, "epochs": FASHION_EPOCHS},
            dataset="fashion-mnist",
        ),
    )
}


# The presets of fashion-mnist-anywhere (``*-anywhere``; attnconv.data.anywhere: the garments
# at 16..24 px anywhere on a 32×32 canvas): each is a Fashion preset at the same width, depth,
# heads, start and recipe, on the 32×32 images (so the paper's 16×16 token grid, which the
# learned tables cover exactly) and their statistics, so that a difference between the datasets is
# the data's.
ANYWHERE_OF: dict[str, str] = {
    "quadratic-fashion": "quadratic-anywhere",
    "learned-fashion": "learned-anywhere",
    "learned-content-fashion": "learned-content-anywhere",
    "vit-fashion": "vit-anywhere",
    "resnet-fashion-small": "resnet-anywhere-small",
}
_ANYWHERE_SIZE = 32


def _anywhere(fashion: Preset) -> Preset:
    """``fashion`` on fashion-mnist-anywhere (see ``ANYWHERE_OF``)."""
    kwargs = {
        **fashion.model_kwargs,
        "image_size": (_ANYWHERE_SIZE, _ANYWHERE_SIZE),
        "mean": FASHION_MNIST_ANYWHERE_MEAN,
        "std": FASHION_MNIST_ANYWHERE_STD,
    }
    if "max_size" in kwargs:
        kwargs["max_size"] = _ANYWHERE_SIZE // kwargs["stem"]
    return Preset(
        ANYWHERE_OF[fashion.name],
        f"{fashion.name} on fashion-mnist-anywhere (garments at 16..24 px anywhere on 32×32)",
        fashion.model,
        kwargs,
        dict(fashion.recipe),
        dataset="fashion-mnist-anywhere",
    )


PRESETS.update({ANYWHERE_OF[name]: _anywhere(PRESETS[name]) for name in ANYWHERE_OF})


def model_arguments(model: str) -> tuple[str, ...]:
    """Constructor arguments of a ``MODELS`` architecture (the valid override keys)."""
    return tuple(inspect.signature(MODELS[model]).parameters)


def full_arguments(architecture: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Every constructor argument of ``MODELS[architecture]``: ``arguments`` and, for those not
    given, the constructor's current defaults. This is what checkpoints and the pretrained index
    store, so that a later edit of a preset or of a default never changes how a saved model is
    rebuilt. ValueError naming unknown architectures or arguments."""
    if architecture not in MODELS:
        raise ValueError(
            f"unknown architecture {architecture!r}; valid architectures: {', '.join(MODELS)}"
        )
    signature = inspect.signature(MODELS[architecture])
    unknown = sorted(set(arguments) - set(signature.parameters))
    if unknown:
        raise ValueError(
            f"unknown argument(s) {', '.join(map(repr, unknown))} for {architecture!r}; valid: "
            f"{', '.join(signature.parameters)}"
        )
    bound = signature.bind_partial(**arguments)
    bound.apply_defaults()
    return dict(bound.arguments)


def preset_arguments(
    name: str, num_classes: int = 10, **overrides: Any
) -> tuple[str, dict[str, Any]]:
    """``(architecture, every constructor argument)`` of preset ``name`` with ``num_classes``
    outputs and ``overrides`` replacing the preset's arguments; ``create_model`` builds exactly
    ``MODELS[architecture](**arguments)``. UserError (a ValueError) listing the valid presets or override keys."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    preset = PRESETS[name]
    valid = model_arguments(preset.model)
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise UserError(
            f"unknown override(s) {', '.join(map(repr, unknown))} for preset {name!r}; valid "
            f"keys: {', '.join(valid)}"
        )
    arguments = {**preset.model_kwargs, **overrides, "num_classes": num_classes}
    if preset.model == "transformed":  # the classes are the base network's
        classes = {"num_classes": arguments.pop("num_classes")}
        arguments["base_arguments"] = {**arguments["base_arguments"], **classes}
        base = arguments["base_arguments"]
        arguments["base_arguments"] = full_arguments(arguments["base"], base)
    return preset.model, full_arguments(preset.model, arguments)


def size_note(
    preset: str, dataset: str, image_size: tuple[int, int], overrides: dict[str, Any] | None = None
) -> str | None:
    """A one-line warning when ``preset`` (with model ``overrides``) would see more than 4× the
    tokens per layer on ``dataset``'s ``image_size = (H, W)`` images than on the images it was
    sized for (attention's cost grows faster than the token count), naming the presets sized for
    ``dataset``; None otherwise."""
    parameters = inspect.signature(MODELS[PRESETS[preset].model]).parameters
    if "image_size" not in parameters or "stem" not in parameters:
        return None
    designed = {name: parameters[name].default for name in ("image_size", "stem")}
    designed.update(PRESETS[preset].model_kwargs)
    stem = {**designed, **(overrides or {})}["stem"]
    tokens = (image_size[0] // stem) * (image_size[1] // stem)
    designed_tokens = (designed["image_size"][0] // designed["stem"]) * (
        designed["image_size"][1] // designed["stem"]
    )
    ratio = tokens / designed_tokens
    if ratio <= 4:
        return None
    sized = [name for name, p in PRESETS.items() if p.dataset == dataset]
    advice = f"presets sized for {dataset}: {', '.join(sized)}; " if sized else ""
    return (
        f"note: {preset} was sized for {designed_tokens} tokens per layer; {dataset}'s "
        f"{image_size[0]}x{image_size[1]} images give it {tokens} ({ratio:.0f}x) and epochs will "
        f"be slow ({advice}or a coarser stem, model.stem=N)"
    )
