"""``attnconv transform CHECKPOINT|RUN_DIR|--pretrained NAME --out RUN``: recast a trained CNN's
convolutions as attention that keeps learning (T-CNN, docs/transform.md).

Writes ``RUN/transformed.pt``, a checkpoint of the transformed network (architecture
``"transformed"``) that ``train --init``, ``eval``, ``heads``, ``plot``, ``explore`` and
``analyze`` take, and ``RUN/transform.json`` (what was transformed, the spread and how it was
chosen). Without ``--spread`` the spread is the smallest of ``SPREAD_CANDIDATES`` whose transformed
network keeps the validation accuracy within ``--tolerance`` points of the CNN's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnconv.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", nargs="?", help="a checkpoint or run folder of a CNN")
    parser.add_argument("--pretrained", metavar="NAME", help="a CNN shipped with attnconv")
    parser.add_argument("--out", required=True, help="the folder to write transformed.pt into")
    parser.add_argument(
        "--layers", nargs="+", metavar="PATTERN",
        help="module-name patterns of the convolutions to transform (e.g. 'stages.3.*'), 'late' "
        "(the default: the spatial convolutions of the two smallest grids, the late stages) or "
        "'spatial' (every convolution larger than 1x1)",
    )
    parser.add_argument(
        "--spread", type=float,
        help="the heads' inverse standard deviation (1/pixels); default: the smallest that keeps "
        "the validation accuracy within --tolerance points of the CNN's",
    )
    parser.add_argument("--tolerance", type=float, default=0.1,
                        help="accuracy points the spread search may lose (default 0.1)")
    content = parser.add_mutually_exclusive_group()
    content.add_argument("--no-content", action="store_true",
                         help="Gaussian heads only, without the gated content attention")
    content.add_argument(
        "--content-layers", nargs="+", metavar="PATTERN",
        help="give content attention only to these of the transformed layers (patterns, or "
        "'late'); default: all of them",
    )
    parser.add_argument("--content-heads", type=int, default=1,
                        help="content attention maps per layer (1: one shared by the heads; "
                        "the number of heads: ConViT's, one per head)")
    parser.add_argument("--qk-dim", type=int, help="query/key width of each content map")
    parser.add_argument("--seed", type=int, default=0, help="draws the query and key weights, in [0, 2**63)")
    parser.add_argument("--data-dir", help="where datasets live (for the spread search)")
    parser.add_argument("--batch-size", type=int, default=500, help="images per forward")


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


def run(args: argparse.Namespace) -> int:
    import torch

    from attnconv.convert import ConversionError, choose_spread, select_layers, transform_checkpoint
    from attnconv.data import BatchLoader, load_splits
    from attnconv.models.checkpoint import build_model, load_checkpoint, save_checkpoint
    from attnconv.models.pretrained import checkpoint_or_pretrained, pretrained_checkpoint
    from attnconv.runs import checkpoint_file, write_json
    from attnconv.seeds import check_seed
    from attnconv.train.loop import check_data_fits, evaluation_sums

    check_seed(args.seed, "--seed")
    if checkpoint_or_pretrained(args.checkpoint, args.pretrained) == "pretrained":
        source = pretrained_checkpoint(args.pretrained)
        config: dict = {}
    else:
        source = load_checkpoint(checkpoint_file(args.checkpoint))
        config = source.get("config", {})
    if source["architecture"] == "transformed":
        raise UserError("that checkpoint already holds a transformed network")
    if args.spread is not None and not args.spread > 0:
        raise UserError(f"--spread must be a positive number, got {args.spread}")
    layers = args.layers[0] if args.layers in (["late"], ["spatial"]) else args.layers or "late"
    content_layers = args.content_layers
    if content_layers == ["late"]:
        content_layers = "late"
    options = {
        "content": content_layers if content_layers is not None else not args.no_content,
        "qk_dim": args.qk_dim,
        "content_heads": args.content_heads,
    }

    try:  # the selection first: a bad pattern fails before any search
        select_layers(build_model(source, "the network to transform"), layers)
    except (ValueError, ConversionError) as err:
        raise UserError(f"cannot transform: {err}") from err

    def transformed(spread: float) -> dict:
        torch.manual_seed(args.seed)
        checkpoint = transform_checkpoint(source, layers, spread, **options)
        preset = _transformed_preset(source, checkpoint["arguments"]["layers"])
        return {**checkpoint, "preset": preset}

    record: dict = {"source": args.pretrained or str(args.checkpoint)}
    spread = args.spread
    if spread is None:
        data = load_splits(
            source["dataset"], args.data_dir, config.get("val_size"), seed=config.get("seed", 0)
        )
        check_data_fits(source["arguments"], data, record["source"])
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

        def spread_accuracy(candidate: float) -> float:
            result = accuracy(build_model(transformed(candidate)))
            print(f"  spread {candidate:g}: {result:.2f}%", file=sys.stderr)
            return result

        try:
            spread, measured = choose_spread(spread_accuracy, baseline, args.tolerance)
        except ValueError as err:
            raise UserError(str(err)) from err
        record |= {"validation_accuracy": baseline, "tolerance": args.tolerance,
                   "spread_accuracy": {f"{s:g}": a for s, a in measured.items()}}
    checkpoint = transformed(spread)
    out = Path(args.out)
    save_checkpoint(checkpoint, out / "transformed.pt")
    record |= {"preset": checkpoint["preset"], "spread": spread,
               **{k: v for k, v in checkpoint["arguments"].items()
                  if k not in ("base_arguments", "spread")}}
    write_json(out / "transform.json", record)
    names = checkpoint["arguments"]["layers"]
    print(f"transformed {len(names)} convolutions ({names[0]} ... {names[-1]}) with spread "
          f"{spread:g}: {out / 'transformed.pt'}")
    print(f"fine-tune it: attnconv train --preset {checkpoint['preset']} --init "
          f"{out / 'transformed.pt'}")
    return 0
