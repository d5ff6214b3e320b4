"""``attnconv analyze MODEL --out DIR``: attention distance (patches and pixels), grid score, maps,
contours, heads.csv and an explorer page of any vision transformer (``attnconv.analysis``).

MODEL is ``timm:NAME`` or ``torchvision:NAME`` (with ``--pretrained``: the library's own weights,
from its cache or downloaded; ``--weights FILE``; or ``--random``), a preset name (its random
initialisation), a checkpoint file or run folder; or ``--pretrained NAME``, a shipped model. A
transformed network (T-CNN, e.g. what ``attnconv transform`` writes) gets the measures of its
transformed layers: attention distance, tap score, content gates, distance moved from the taps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnconv.cli.options import (
    DataFolder,
    InputFile,
    Name,
    OutputFolder,
    add_overwrite,
    int_in,
)
from attnconv.errors import UserError

LIBRARIES = ("timm:", "torchvision:")
NUM_IMAGES = 16
EXPLORE_IMAGES = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        type=Name("a model: timm:NAME, torchvision:NAME, a preset, a checkpoint or run folder"),
        help="timm:NAME or torchvision:NAME (with --pretrained, --weights or --random), a preset "
        "name (its random initialisation), a checkpoint file or a run folder",
    )
    parser.add_argument(
        "--pretrained",
        nargs="?",
        const=True,
        metavar="NAME",
        type=Name("a shipped model, or timm:NAME or torchvision:NAME"),
        help="NAME: a model shipped with attnconv; after timm:NAME or torchvision:NAME (no NAME "
        "here): that library's own pretrained weights, read from its cache (the Hugging Face hub "
        "cache, TORCH_HOME) or downloaded into it where the network allows",
    )
    parser.add_argument("--out", required=True, type=OutputFolder(),
                        help="folder for the tables and figures")
    add_overwrite(parser, "an analysis")
    parser.add_argument(
        "--weights",
        metavar="FILE",
        type=InputFile("a weights file"),
        help="timm/torchvision: a local .safetensors or torch state-dict file (nothing is "
        "downloaded)",
    )
    parser.add_argument(
        "--random",
        action="store_true",
        help="timm/torchvision: keep the random initialisation (the architecture alone)",
    )
    parser.add_argument(
        "--image-size",
        type=int_in(1, 4096),
        metavar="N",
        help="timm/torchvision: build the model for NxN inputs (default: its own input size)",
    )
    parser.add_argument(
        "--images",
        metavar="DIR|DATASET",
        type=Name("a folder of images or a dataset name"),
        help="a folder of image files or a dataset name (its test split), scaled to the model's "
        "input (default: the test images shipped with attnconv; for a checkpoint its dataset)",
    )
    parser.add_argument(
        "--num-images",
        type=int_in(1, 10**5),
        default=NUM_IMAGES,
        help=f"images to average over (default: {NUM_IMAGES})",
    )
    parser.add_argument(
        "--explore-images",
        type=int_in(0, 10**3),
        default=EXPLORE_IMAGES,
        help=f"images on the explorer page written to OUT/explorer (default: {EXPLORE_IMAGES}; "
        "0: no page)",
    )
    parser.add_argument(
        "--query",
        type=int_in(0, 65535),
        nargs=2,
        metavar=("ROW", "COL"),
        help="query patch of the maps and contours (default: the centre of the grid); for a "
        "transformed network an image pixel, each layer's query the output pixel nearest it",
    )
    parser.add_argument(
        "--window",
        type=int_in(0, 65535),
        metavar="W",
        help="zoom the maps to the patches within W rows and columns of the query (a "
        "(2W+1)x(2W+1) square, clipped at the border; default: all)",
    )
    parser.add_argument("--data-dir", type=DataFolder(),
                        help="dataset folder (default: attnconv's data folder)")


def say(message: str) -> None:
    """A line on stdout as each stage starts (building, recording, drawing, the explorer page),
    before the summary: a large model takes minutes."""
    print(f"analyze: {message}", flush=True)


def _third_party(args: argparse.Namespace):
    from attnconv.analysis.analyze import analyze_third_party
    from attnconv.analysis.third_party import build_third_party

    pretrained = args.pretrained is True
    if (args.weights is not None) + args.random + pretrained != 1:
        raise UserError(
            f"{args.model}: give --pretrained, --weights FILE or --random (one of them)"
        )
    if args.data_dir is not None and args.images is None:
        raise UserError("--data-dir is for --images DATASET; the shipped test images need none")
    if pretrained:
        weights = "its library's pretrained weights (from the cache, else downloaded)"
    else:
        weights = "random weights" if args.random else f"the weights of {args.weights}"
    say(f"building {args.model} with {weights}")
    loaded = build_third_party(args.model, args.weights, args.image_size, pretrained)
    return analyze_third_party(
        loaded,
        args.out,
        args.images,
        args.num_images,
        args.explore_images,
        args.data_dir,
        args.query,
        args.window,
        progress=say,
    )


def _attnconv(args: argparse.Namespace):
    from attnconv.analysis.analyze import analyze_attnconv, analyze_transformed
    from attnconv.analysis.content import content_layers, pretrained_start, run_start
    from attnconv.models import PRESETS, create_model
    from attnconv.models.checkpoint import load_model
    from attnconv.models.pretrained import load_pretrained, pretrained_info
    from attnconv.models.transformed import TransformedNetwork
    from attnconv.viz.figures import checkpoint_path

    for option, given in (
        ("--weights", args.weights is not None),
        ("--random", args.random),
        ("--image-size", args.image_size is not None),
    ):
        if given:
            raise UserError(f"{option} is for timm:NAME and torchvision:NAME models")
    details: dict = {}
    checkpoint = None
    if args.pretrained is not None:
        info = pretrained_info(args.pretrained)
        say(f"loading the shipped model {args.pretrained}")
        model = load_pretrained(args.pretrained)
        name, dataset = f"{info.name} (shipped)", info.dataset
        details = {"description": info.description, "test_accuracy": info.test_accuracy}
    elif args.model in PRESETS:
        preset = PRESETS[args.model]
        say(f"building preset {args.model} (random initialisation)")
        model = create_model(args.model).eval()
        name, dataset = f"{args.model} (random initialisation)", preset.dataset
        details = {"description": preset.description}
    elif Path(args.model).exists():
        path = checkpoint_path(args.model)
        say(f"loading the checkpoint {path}")
        model, checkpoint = load_model(path)
        name = f"{checkpoint['preset']}, epoch {checkpoint.get('epoch', '?')}"
        dataset = checkpoint["dataset"]
    else:
        raise UserError(
            f"MODEL {args.model!r} is not timm:NAME, torchvision:NAME, a preset "
            f"({', '.join(PRESETS)}), or an existing checkpoint or run folder"
        )
    if isinstance(model, TransformedNetwork):
        if args.window is not None:
            raise UserError(
                "--window zooms the maps, which a transformed network does not get: leave it out"
            )
        analyze, extra = analyze_transformed, {}
    elif not hasattr(model, "attention_layers"):
        raise UserError(f"{name} is a {type(model).__name__}, which has no attention")
    else:
        analyze, extra = analyze_attnconv, {"window": args.window}
    if content_layers(model):  # its query and key norms against the run's start (a preset: none)
        if args.pretrained is not None:
            extra["start"] = pretrained_start(args.pretrained)
        elif checkpoint is not None:
            extra["start"] = run_start(checkpoint)
    return analyze(
        model,
        name,
        args.out,
        dataset,
        args.images,
        args.num_images,
        args.explore_images,
        args.data_dir,
        args.query,
        **extra,
        **details,
        progress=say,
    )


def run(args: argparse.Namespace) -> int:
    from attnconv.cli.options import claim_output

    named = isinstance(args.pretrained, str)
    if args.model is None and named and args.pretrained.startswith(LIBRARIES):
        args.model, args.pretrained = args.pretrained, True  # --pretrained timm:NAME
    library = args.model is not None and args.model.startswith(LIBRARIES)
    if args.pretrained is True and not library:
        raise UserError(
            "--pretrained without a NAME is for timm:NAME and torchvision:NAME models; a shipped "
            "model is --pretrained NAME"
        )
    if (args.model is None) == (args.pretrained is None) and not library:
        raise UserError("give MODEL or --pretrained NAME (one of them)")
    if library and isinstance(args.pretrained, str):
        raise UserError("give MODEL or --pretrained NAME (one of them)")
    claim_output(args.out, args.overwrite)
    if args.query is not None:
        args.query = tuple(args.query)
    analysis = _third_party(args) if library else _attnconv(args)
    print(analysis.summary)
    return 0
