"""``attnconv eval CHECKPOINT|RUN_DIR|--pretrained NAME``: accuracy and loss of a trained model on a
dataset split."""

from __future__ import annotations

import argparse

from attnconv.cli.options import (
    CheckpointSource,
    DataFolder,
    Device,
    dataset_name,
    int_in,
    shipped_model,
)
from attnconv.errors import UserError
from attnconv.hardware import PRECISIONS

PRETRAINED = shipped_model()
DATASET = dataset_name()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        nargs="?",
        type=CheckpointSource(),
        help="a checkpoint written by `attnconv train`, or a run folder (its checkpoints/best.pt, "
        "the epoch chosen on validation)",
    )
    parser.add_argument(
        "--pretrained",
        metavar="NAME",
        type=PRETRAINED,
        help="a model shipped with attnconv "
        "instead of a checkpoint (its dataset must be installed)",
    )
    parser.add_argument(
        "--dataset",
        type=DATASET,
        help="the dataset (default: the one it was trained on); its images must have the size "
        "the model was built for",
    )
    parser.add_argument("--data-dir", type=DataFolder(), help="where datasets live")
    parser.add_argument(
        "--split",
        choices=("test", "val"),
        default="test",
        help="val: the validation images carved exactly as during training",
    )
    parser.add_argument("--batch-size", type=int_in(1, 10**6), default=500,
                        help="images per forward")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="auto (the default for a checkpoint): bfloat16 autocast where the device computes "
        "in bfloat16 natively, else float32; fp32 (the default for --pretrained: the stated "
        "accuracies are float32's); bf16 (warns where slow)",
    )
    parser.add_argument("--device", type=Device(), default="auto",
                        help="auto (CUDA if available), cpu, cuda or cuda:N")


def run(args: argparse.Namespace) -> int:
    from attnconv.data import BatchLoader, load_splits
    from attnconv.data.corruptions import nonstandard_test_set
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
    # the test split needs no validation images carved out of the training set (a data folder
    # with few training images is no reason to refuse)
    val_size = config.get("val_size") if args.split == "val" else 0
    data = load_splits(dataset, args.data_dir, val_size, seed=config.get("seed", 0))
    check_data_fits(arguments, data, name, same_size=True)
    images = data.test if args.split == "test" else data.val
    if len(images) == 0:
        raise UserError(f"the {args.split} split of {dataset} holds no images")
    unlike = nonstandard_test_set(dataset, images) if args.split == "test" else None
    loader = BatchLoader(images, args.batch_size, device=device, train=False, flip=False)
    loss_sum, correct, seen = evaluation_sums(model, loader, precision)
    label = f" [{unlike}]" if unlike else ""
    print(
        f"{name} on {dataset} {args.split}{label} ({int(seen)} images, {precision}): accuracy "
        f"{correct / seen:.4f} ({int(correct)}/{int(seen)}), loss {loss_sum / seen:.4f}"
    )
    if unlike:
        print(f"note: {unlike}: this accuracy is not comparable to results stated on it")
    if pretrained and precision != "fp32":
        print(
            f"note: run in {precision}, so it may differ from the stated fp32 figure by rounding "
            f"alone; --precision fp32 compares like with like"
        )
    return 0
