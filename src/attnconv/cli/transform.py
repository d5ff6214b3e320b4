"""``attnconv transform CHECKPOINT|RUN_DIR|--pretrained NAME --out RUN``: recast a trained CNN's
convolutions as attention that keeps learning (T-CNN, docs/transform.md).

Writes ``RUN/transformed.pt``, a checkpoint of the transformed network (architecture
``"transformed"``) that ``train --init``, ``eval``, ``heads``, ``plot``, ``explore`` and
``analyze`` take, and ``RUN/transform.json`` (what was transformed, the spread and how it was
chosen). Without ``--spread`` the spread is the smallest of ``SPREAD_CANDIDATES`` whose transformed
network (positional part only) keeps the validation accuracy within ``--tolerance`` points of the
CNN's; without ``--opening`` the content gates' opening is then the largest of
``OPENING_CANDIDATES`` that keeps it within ``--opening-tolerance`` points of that positional
network's (an open content path changes the network's function: docs/transform.md).
"""

from __future__ import annotations

import argparse
import sys

from attnconv.cli.options import (
    CheckpointSource,
    DataFolder,
    Name,
    OutputFolder,
    add_overwrite,
    float_in,
    int_in,
    positive,
    seed,
    shipped_model,
)
from attnconv.errors import UserError

RESULT = ("transformed.pt", "transform.json")  # what --out holds once transform has written it
MAX_SPREAD = 1000.0  # 1/pixels: far past exact (the error falls like exp(-s²/2)); s² stays finite
MAX_QK_DIM = 1024  # query/key width of a content map: ConViT's are 48-64
MAX_CONTENT_HEADS = 1024
CALIBRATION_IMAGES = 500  # validation images that calibrate mimetic queries and keys
# attnconv.attention.transformed's GATES and QK_INITS and attnconv.convert.CONTENT_START, written
# out so the parser imports no torch (tests/test_cli_transform.py checks they agree)
GATES = ("clamp", "sigmoid")
QK_INITS = ("default", "mimetic")
CONTENT_START = {"gate": "clamp", "qk_init": "mimetic", "content_weight_decay": False}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", nargs="?", type=CheckpointSource(),
                        help="a checkpoint or run folder of a CNN")
    parser.add_argument(
        "--pretrained", metavar="NAME", help="a CNN shipped with attnconv",
        type=shipped_model(),
    )
    parser.add_argument("--out", required=True, type=OutputFolder(),
                        help="the folder to write transformed.pt and transform.json into")
    add_overwrite(parser, "a transformed network")
    parser.add_argument(
        "--layers", nargs="+", metavar="PATTERN", type=Name("a layer pattern"),
        help="module-name patterns of the convolutions to transform (e.g. 'stages.3.*'), 'late' "
        "(the default: the spatial convolutions of the two smallest grids, the late stages) or "
        "'spatial' (every convolution larger than 1x1)",
    )
    parser.add_argument(
        "--spread", type=positive(MAX_SPREAD),
        help="the heads' inverse standard deviation (1/pixels), in (0, 1000]; default: the "
        "smallest that keeps the validation accuracy within --tolerance points of the CNN's",
    )
    parser.add_argument("--tolerance", type=float_in(0, 100), default=0.1,
                        help="accuracy points the spread search may lose, in [0, 100] (default "
                        "0.1)")
    content = parser.add_mutually_exclusive_group()
    content.add_argument("--no-content", action="store_true",
                         help="Gaussian heads only, without the gated content attention")
    content.add_argument(
        "--content-layers", nargs="+", metavar="PATTERN", type=Name("a layer pattern"),
        help="give content attention only to these of the transformed layers (patterns, or "
        "'late'); default: all of them",
    )
    parser.add_argument("--content-heads", type=int_in(1, MAX_CONTENT_HEADS), default=1,
                        help="content attention maps per layer, from 1 (one shared by the heads) "
                        "to the number of heads (ConViT's, one per head)")
    parser.add_argument("--qk-dim", type=int_in(1, MAX_QK_DIM),
                        help=f"query/key width of each content map, in [1, {MAX_QK_DIM}]")
    parser.add_argument("--gate", choices=GATES,
                        help=f"the content gates: clamp (a share clamped to [0, 1]) or sigmoid "
                        f"(ConViT's); default {CONTENT_START['gate']}")
    parser.add_argument(
        "--opening", type=float_in(0, 1, high_open=True),
        help="the share of attention the content gates start with, in [0, 1) (0: shut, the "
        "start is exactly the blurred CNN, and queries and keys get no gradient until a gate "
        "opens); default: the largest that keeps the validation accuracy within "
        "--opening-tolerance points of the transformed network's without content",
    )
    parser.add_argument("--opening-tolerance", type=float_in(0, 100), default=0.5,
                        help="accuracy points the opening search may lose, in [0, 100] "
                        "(default 0.5)")
    parser.add_argument("--qk-init", choices=QK_INITS,
                        help="queries and keys start as torch's nn.Linear (default) or mimetic "
                        "(W_q W_k^T near a multiple of the identity: a pixel attends to pixels "
                        f"like it, calibrated on {CALIBRATION_IMAGES} validation images); "
                        f"default {CONTENT_START['qk_init']}")
    parser.add_argument(
        "--qk-weight-decay", action=argparse.BooleanOptionalAction,
        help="whether fine-tuning decays the query and key weights (default: "
        f"{'yes' if CONTENT_START['content_weight_decay'] else 'no'}; decay pulls them to 0 "
        "faster than a weak task gradient moves them)",
    )
    parser.add_argument("--seed", type=seed(), default=0,
                        help="draws the query and key weights, in [0, 2**63)")
    parser.add_argument("--data-dir", type=DataFolder(),
                        help="where datasets live (for the spread search)")
    parser.add_argument("--batch-size", type=int_in(1, 10**6), default=500,
                        help="images per forward")


def _transformed_preset(source: dict, layers: list[str]) -> str:
    """The preset of transformed networks built on ``source``'s network (its architecture and
    arguments, but the normalisation constants) with these ``layers`` (``train --init`` takes the
    checkpoint with it), else ``PRESET-transformed``."""
    import json

    from attnconv.models import PRESETS
    from attnconv.models.presets import preset_arguments

    def plain(arguments: dict) -> object:
        """The arguments that shape the network: tuples and lists alike, without the input
        normalisation (a run takes its dataset's measured mean and std)."""
        shape = {k: v for k, v in arguments.items() if k not in ("mean", "std")}
        return json.loads(json.dumps(shape))

    for name, preset in PRESETS.items():
        if preset.model != "transformed":
            continue
        arguments = preset_arguments(name, source["arguments"].get("num_classes", 10))[1]
        if (
            arguments["base"] == source["architecture"]
            and plain(arguments["base_arguments"]) == plain(source["arguments"])
            and list(arguments["layers"]) == layers
        ):
            return name
    return f"{source['preset']}-transformed"


def _selected(network, patterns: str | list[str], option: str) -> list[str]:
    """The convolutions of ``network`` that ``patterns`` (``late``, ``spatial`` or module-name
    patterns, each of which must match one: ``attnconv.cli.options.matching``) select, as
    ``attnconv.convert.select_layers`` selects them; its refusals one line naming ``option``."""
    from torch import nn

    from attnconv.cli.options import matching
    from attnconv.convert import ConversionError, select_layers

    if not isinstance(patterns, str):
        convs = [name for name, module in network.named_modules() if isinstance(module, nn.Conv2d)]
        matching(patterns, convs, option, "convolution")
    try:
        return select_layers(network, patterns)
    except (ValueError, ConversionError) as err:  # no spatial convolution, one not covered
        raise UserError(f"cannot transform: {option}: {err}") from err


def run(args: argparse.Namespace) -> int:
    import torch

    from attnconv.attention.transformed import check_content_start
    from attnconv.cli.options import claim_output
    from attnconv.convert import choose_opening, choose_spread, transform_checkpoint
    from attnconv.data import BatchLoader, load_splits
    from attnconv.models.checkpoint import build_model, load_checkpoint, save_checkpoint
    from attnconv.models.pretrained import checkpoint_or_pretrained, pretrained_checkpoint
    from attnconv.runs import checkpoint_file, write_json
    from attnconv.train.loop import check_data_fits, evaluation_sums

    checkpoint_or_pretrained(args.checkpoint, args.pretrained)  # one of them, before any work
    out = claim_output(args.out, args.overwrite, result=RESULT)
    if args.pretrained is not None:
        source = pretrained_checkpoint(args.pretrained)
        config: dict = {}
    else:
        source = load_checkpoint(checkpoint_file(args.checkpoint))
        config = source.get("config", {})
    if source["architecture"] == "transformed":
        raise UserError("that checkpoint already holds a transformed network")
    layers = args.layers[0] if args.layers in (["late"], ["spatial"]) else args.layers or "late"
    content_layers = args.content_layers
    if content_layers == ["late"]:
        content_layers = "late"
    options = {
        "content": content_layers if content_layers is not None else not args.no_content,
        "qk_dim": args.qk_dim,
        "content_heads": args.content_heads,
        "gate": args.gate or CONTENT_START["gate"],
        "qk_init": args.qk_init or CONTENT_START["qk_init"],
        "content_weight_decay": (
            CONTENT_START["content_weight_decay"] if args.qk_weight_decay is None
            else args.qk_weight_decay
        ),
    }
    has_content = options["content"] is not False
    if args.opening is not None:
        try:
            check_content_start(options["gate"], args.opening, options["qk_init"])
        except ValueError as err:
            raise UserError(f"--opening {args.opening:g}: {err}") from err

    network = build_model(source, "the network to transform")
    # every choice that needs the network first: a bad one fails before any search
    names = _selected(network, layers, "--layers")
    if content_layers is not None:
        given = _selected(network, content_layers, "--content-layers")
        if not set(given) & set(names):
            raise UserError(
                f"--content-layers selects none of the layers to transform ({', '.join(names)}); "
                f"give --no-content for none"
            )
    convs = dict(network.named_modules())
    heads = min(convs[name].kernel_size[0] * convs[name].kernel_size[1] for name in names)
    if args.content_heads > heads and has_content:
        raise UserError(
            f"--content-heads {args.content_heads}: the layers to transform have {heads} heads "
            f"(one per kernel tap), and a content map serves one or more of them; give 1 to "
            f"{heads}"
        )

    def transformed(spread: float, opening: float | None, images=None) -> dict:
        """The transformed checkpoint; ``opening`` None: the positional part alone (the
        spread search's network: no content, so the search measures the blur only)."""
        torch.manual_seed(args.seed)
        if opening is None:
            checkpoint = transform_checkpoint(source, layers, spread, **{**options, "content": False})
        else:
            checkpoint = transform_checkpoint(
                source, layers, spread, **options, opening=opening, images=images
            )
        preset = _transformed_preset(source, checkpoint["arguments"]["layers"])
        return {**checkpoint, "preset": preset}

    record: dict = {"source": args.pretrained or str(args.checkpoint)}
    spread, opening = args.spread, args.opening
    search_opening = has_content and opening is None
    calibration = None
    if spread is None or (has_content and (opening is None or options["qk_init"] == "mimetic")):
        data = load_splits(
            source["dataset"], args.data_dir, config.get("val_size"), seed=config.get("seed", 0)
        )
        check_data_fits(source["arguments"], data, record["source"], same_size=True)
        calibration = data.val.images[:CALIBRATION_IMAGES].float() / 255.0
    if spread is None or search_opening:
        loader = BatchLoader(
            data.val, args.batch_size, device=torch.device("cpu"), train=False, flip=False
        )

        def accuracy(model: torch.nn.Module) -> float:
            _, correct, seen = evaluation_sums(model, loader, "fp32")
            return 100.0 * correct / seen

        cnn = build_model(source, record["source"])
        baseline = accuracy(cnn)
        print(f"{record['source']}: validation accuracy {baseline:.2f}% ({len(data.val)} images)",
              file=sys.stderr)
        record["validation_accuracy"] = baseline
    if spread is None:
        def spread_accuracy(candidate: float) -> float:
            result = accuracy(build_model(transformed(candidate, None)))
            print(f"  spread {candidate:g}: {result:.2f}%", file=sys.stderr)
            return result

        try:
            spread, measured = choose_spread(spread_accuracy, baseline, args.tolerance)
        except ValueError as err:
            raise UserError(str(err)) from err
        record |= {"tolerance": args.tolerance,
                   "spread_accuracy": {f"{s:g}": a for s, a in measured.items()}}
    if search_opening:
        # the content's cost on top of the blur's: against the positional part at this spread
        blurred = (measured[spread] if "spread_accuracy" in record
                   else accuracy(build_model(transformed(spread, None))))  # fmt: skip
        record["positional_accuracy"] = blurred

        def opening_accuracy(candidate: float) -> float:
            result = accuracy(build_model(transformed(spread, candidate, calibration)))
            print(f"  opening {candidate:g}: {result:.2f}%", file=sys.stderr)
            return result

        try:
            opening, measured = choose_opening(opening_accuracy, blurred, args.opening_tolerance)
        except ValueError as err:
            raise UserError(f"{err} (--opening)") from err
        record |= {"opening_tolerance": args.opening_tolerance,
                   "opening_accuracy": {f"{o:g}": a for o, a in measured.items()}}
    checkpoint = transformed(spread, opening if has_content else None, calibration)
    save_checkpoint(checkpoint, out / "transformed.pt")
    record |= {"preset": checkpoint["preset"], "spread": spread,
               **{k: v for k, v in checkpoint["arguments"].items()
                  if k not in ("base_arguments", "spread")}}
    write_json(out / "transform.json", record)
    names = checkpoint["arguments"]["layers"]
    content = (f", content gates ({options['gate']}) open at {opening:g}, {options['qk_init']} "
               f"queries and keys" if has_content else "")
    print(f"transformed {len(names)} convolutions ({names[0]} ... {names[-1]}) with spread "
          f"{spread:g}{content}: {out / 'transformed.pt'}")
    print(f"fine-tune it: attnconv train --preset {checkpoint['preset']} --init "
          f"{out / 'transformed.pt'}")
    return 0
