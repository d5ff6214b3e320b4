"""Evaluation: a model's loss and accuracy on a loader (in the run's precision), and what a finished
run reports: its best epoch (chosen on validation), that checkpoint's test accuracy and the machine
it trained on, in ``summary.json``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnconv.data import BatchLoader, ImageSet
from attnconv.models import count_macs, count_parameters
from attnconv.models.checkpoint import build_model, load_checkpoint
from attnconv.models.modes import evaluating
from attnconv.runs import RunFolderError
from attnconv.train.config import TrainConfig, training_command


def autocast(precision: str, device: torch.device) -> AbstractContextManager:
    """``torch.autocast`` to bfloat16 for ``precision="bf16"`` (CPU or GPU); nothing for ``fp32``.

    ``precision`` is a resolved one (``attnconv.hardware.resolve_precision`` turns ``auto`` into
    ``fp32`` or ``bf16``); ValueError for anything else.
    """
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision == "fp32":
        return nullcontext()
    raise ValueError(f"autocast takes a resolved precision, fp32 or bf16, got {precision!r}")


@torch.no_grad()
def evaluation_sums(model: nn.Module, loader: BatchLoader, precision: str = "fp32") -> list[float]:
    """``[summed cross-entropy, correct predictions, images]`` of ``model`` over ``loader``.

    The model is run in eval mode (and put back in its previous mode).
    """
    totals = torch.zeros(3, dtype=torch.float64, device=loader.device)
    with evaluating(model):
        for images, labels in loader.epoch(0):
            with autocast(precision, loader.device):
                logits = model(images)
            totals += torch.stack(
                [
                    F.cross_entropy(logits.float(), labels, reduction="sum").double(),
                    (logits.argmax(dim=1) == labels).sum().double(),
                    torch.tensor(float(labels.shape[0]), dtype=torch.float64, device=loader.device),
                ]
            )
    return totals.tolist()


def best_record(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first epoch record with the highest validation accuracy (what ``best.pt`` holds)."""
    return max(records, key=lambda r: r["val_acc"], default=None)


def best_checkpoint(path: Path, best: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint at ``path`` (a run's ``best.pt``), loaded; RunFolderError unless it holds the
    epoch and step of ``best``, the record the run's metrics name as the best."""
    checkpoint = load_checkpoint(path)
    if (checkpoint["epoch"], checkpoint["step"]) != (best["epoch"], best["step"]):
        raise RunFolderError(
            f"{path} holds epoch {checkpoint['epoch']} (step {checkpoint['step']}), "
            f"but the run's metrics name epoch {best['epoch']} (step {best['step']}) as "
            f"the best; the folder was changed by hand or by an older attnconv: test a "
            f"checkpoint with attnconv eval instead"
        )
    return checkpoint


def test_best(
    best_path: Path, records: list[dict[str, Any]], test: ImageSet, config: TrainConfig,
    device: torch.device,
) -> tuple[dict[str, Any], float, float]:
    """``(best record, test loss, test accuracy)`` of a finished run: the ``best_record`` of its
    epoch ``records``, and the model of its checkpoint (``best_path``, checked to be that epoch's
    by ``best_checkpoint``) measured on the ``test`` images in the run's precision."""
    best = best_record(records)
    model = build_model(best_checkpoint(best_path, best), best_path).to(device)
    loader = BatchLoader(test, config.batch_size, device=device, train=False, flip=False)
    loss_sum, correct, seen = evaluation_sums(model, loader, config.precision)
    return best, loss_sum / seen, correct / seen


def machines_of(records: list[dict[str, Any]]) -> str:
    """The machine a run trained on, from its epoch records (``machine``, as
    ``attnconv.hardware.machine_description`` names it): that line where every epoch ran on one,
    else each machine with its epochs in order, ``"epochs 1–13: M1; epochs 14–22: M2"`` (a run
    moved between machines by ``--resume``). Epochs recorded before attnconv kept the machine
    per epoch count as ``not recorded``."""
    spans: list[list[Any]] = []  # [machine, first epoch, last epoch]
    for record in records:
        machine = record.get("machine") or "not recorded"
        if spans and spans[-1][0] == machine:
            spans[-1][2] = record["epoch"]
        else:
            spans.append([machine, record["epoch"], record["epoch"]])
    if len({machine for machine, _, _ in spans}) <= 1:
        return spans[0][0] if spans else "not recorded"
    return "; ".join(
        f"{f'epoch {first}' if first == last else f'epochs {first}–{last}'}: {machine}"
        for machine, first, last in spans
    )


def run_summary(
    config: TrainConfig,
    model: nn.Module,
    records: list[dict[str, Any]],
    steps_per_epoch: int,
    replans: list[list[int]],
    best_path: Path,
    tested: tuple[dict[str, Any], float, float],
    test_set: ImageSet,
) -> dict[str, Any]:
    """What ``summary.json`` holds of a finished run: ``model``'s size; ``tested`` (``test_best``:
    the best of ``records``, its epoch records, and the test loss and accuracy of that epoch's
    checkpoint, ``best_path``); the training time and speed, the machine and the command that
    repeats the run (with its ``replans``); ``test_set`` (what ``"test_set"`` says) where the
    images tested are not the dataset's recorded test split, so its accuracy is not comparable to
    those stated on it (``attnconv.data.corruptions.nonstandard_test_set``)."""
    from attnconv.data.corruptions import nonstandard_test_set

    best, test_loss, test_acc = tested
    train_time = sum(r["epoch_time_s"] for r in records)
    unlike = nonstandard_test_set(config.dataset, test_set)
    return {**({"test_set": unlike} if unlike else {}),
        "preset": config.preset,
        "dataset": config.dataset,
        "parameters": count_parameters(model),
        "macs_per_image": count_macs(model),
        "epochs": config.epochs,
        "precision": config.precision,
        "best_val_acc": best["val_acc"],
        "best_epoch": best["epoch"],
        "test_acc": test_acc,
        "test_loss": test_loss,
        "train_time_s": train_time,
        "images_per_s": config.epochs * steps_per_epoch * config.batch_size / train_time,
        "best_checkpoint": str(best_path),
        "replans": replans,
        "machine": machines_of(records),
        "command": training_command(config, replans),
    }


def format_summary(summary: dict[str, Any], run_root: Path) -> str:
    """The line a finished run ends with, from its ``run_summary``."""
    return (
        f"best validation accuracy {summary['best_val_acc']:.4f} at epoch "
        f"{summary['best_epoch']}; test accuracy of that checkpoint {summary['test_acc']:.4f} "
        f"(loss {summary['test_loss']:.4f}); {summary['train_time_s']:.1f}s of training, "
        f"{summary['images_per_s']:.0f} img/s; run folder {run_root}"
    ) + (f"\nnote: the test accuracy is on data that is {summary['test_set']}"
         if "test_set" in summary else "")
