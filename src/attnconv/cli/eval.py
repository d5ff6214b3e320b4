"""``attnconv eval CHECKPOINT|RUN_DIR|--pretrained NAME``: accuracy and loss of a trained model on a
dataset split."""

from __future__ import annotations

import argparse

from attnconv.errors import UserError
from attnconv.hardware import PRECISIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        nargs="?",
        help="a checkpoint written by `attnconv train`, or a run folder (its checkpoints/best.pt, "
        "the epoch chosen on validation)",
    )
    parser.add_argument(
        "--pretrained",
        metavar="NAME",
        help="a model shipped with attnconv "
        "instead of a checkpoint (its dataset must be installed)",
    )
    parser.add_argument(
        "--dataset",
        help="the dataset (default: the one it was trained on); its images must have the size "
        "the model was built for",
    )
    parser.add_argument("--data-dir", help="where datasets live")
    parser.add_argument(
        "--split",
        choices=("test", "val"),
        default="test",
        help="val: the validation images carved exactly as during training",
    )
    parser.add_argument("--batch-size", type=int, default=500, help="images per forward")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="auto (the default for a checkpoint): bfloat16 autocast where the device computes "
        "in bfloat16 natively, else float32; fp32 (the default for --pretrained: the stated "
        "accuracies are float32's); bf16 (warns where slow)",
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu or cuda")


def run(args: argparse.Namespace) -> int:
    from attnconv.data import BatchLoader, load_splits
    from attnconv.hardware import resolve_precision
    from attnconv.models.checkpoint import load_model
    from attnconv.models.pretrained import (
        checkpoint_or_pretrained,
        load_pretrained,
        pretrained_info,
    )
    from attnconv.runs import checkpoint_file
    from attnconv.train.distributed import select_device
    from attnconv.train.loop import check_data_fits, evaluation_sums

    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    device = select_device(args.device)
    pretrained = checkpoint_or_pretrained(args.checkpoint, args.pretrained) == "pretrained"
    precision = resolve_precision(args.precision or ("fp32" if pretrained else "auto"), device)
    if pretrained:
        info = pretrained_info(args.pretrained)
        model = load_pretrained(args.pretrained).to(device)
        arguments, config = info.arguments, {}
        trained_on = info.dataset
        name = (
            f"{args.pretrained} (shipped; stated test accuracy {info.test_accuracy:.4f}, "
            f"measured in fp32)"
        )
    else:
        path = checkpoint_file(args.checkpoint)
        model, checkpoint = load_model(path, map_location=device)
        arguments, config = checkpoint["arguments"], checkpoint.get("config", {})
        trained_on = checkpoint["dataset"]
        name = f"{path} ({checkpoint['preset']}, epoch {checkpoint.get('epoch', '?')})"
    dataset = args.dataset or trained_on
    data = load_splits(dataset, args.data_dir, config.get("val_size"), seed=config.get("seed", 0))
    check_data_fits(arguments, data, name, same_size=True)
    images = data.test if args.split == "test" else data.val
    loader = BatchLoader(images, args.batch_size, device=device, train=False, flip=False)
    loss_sum, correct, seen = evaluation_sums(model, loader, precision)
    print(
        f"{name} on {dataset} {args.split} ({int(seen)} images, {precision}): accuracy "
        f"{correct / seen:.4f} ({int(correct)}/{int(seen)}), loss {loss_sum / seen:.4f}"
    )
    if pretrained and precision != "fp32":
        print(
            f"note: run in {precision}, so it may differ from the stated fp32 figure by rounding "
            f"alone; --precision fp32 compares like with like"
        )
    return 0
