"""Two classifiers on the same test images: McNemar's exact test.

Two models scored on the same images are paired: what decides whether one is ahead is not the
two accuracies but the images on which exactly one of them is right. With ``b`` images only the
first gets right and ``c`` only the second, McNemar's test asks whether ``b`` and ``c`` could be
two draws of a fair coin's ``b + c`` flips: under "neither is better" ``b ~ Binomial(b + c, ½)``,
and the exact two-sided p-value is ``min(1, 2 · P(X ≤ min(b, c)))`` (no normal approximation, so
it holds for a handful of discordant images as for thousands). A 0.3-point gap on 10,000 test
images is 30 images net; whether that is noise depends on how many images the two disagree on,
which this test counts and the accuracies do not.

``mcnemar`` takes the per-image correctness (or predictions and labels) of two models;
``compare_checkpoints`` scores two checkpoints, run folders or shipped models on their
dataset's test split and returns the comparison. ``attnconv reproduce`` uses it to set every
attention model against the size-matched CNN of the same seed and budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnconv.errors import UserError

if TYPE_CHECKING:
    from torch import nn

    from attnconv.data.splits import ImageSet


def exact_binomial_p(successes: int, trials: int) -> float:
    """Two-sided p-value of ``successes`` out of ``trials`` fair coin flips:
    ``min(1, 2 · P(X ≤ min(k, n − k)))`` for ``X ~ Binomial(n, ½)``, computed in exact integer
    arithmetic (1.0 for no trials)."""
    if isinstance(successes, bool) or isinstance(trials, bool):
        raise ValueError("successes and trials must be ints, not bools")
    if not (0 <= successes <= trials):
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    low = min(successes, trials - successes)
    term, tail = 1, 0  # C(n, i), Σ_{j ≤ i} C(n, j)
    for i in range(low + 1):
        tail += term
        term = term * (trials - i) // (i + 1)
    return float(min(Fraction(1), Fraction(2 * tail, 2**trials)))


@dataclass(frozen=True)
class PairedComparison:
    """Model A against model B on the same ``images`` test images.

    ``both_right``, ``only_a`` (A right, B wrong), ``only_b`` and ``both_wrong`` count images;
    ``same_predictions`` the images on which the two predicted the same class (``None`` when only
    correctness was given); ``p_value`` McNemar's exact two-sided test on ``only_a`` against
    ``only_b``; ``name_a``/``name_b`` what was compared.
    """

    both_right: int
    only_a: int
    only_b: int
    both_wrong: int
    p_value: float
    same_predictions: int | None = None
    name_a: str = "A"
    name_b: str = "B"

    @property
    def images(self) -> int:
        return self.both_right + self.only_a + self.only_b + self.both_wrong

    @property
    def accuracy_a(self) -> float:
        """A's accuracy, a fraction."""
        return (self.both_right + self.only_a) / self.images

    @property
    def accuracy_b(self) -> float:
        return (self.both_right + self.only_b) / self.images

    @property
    def difference(self) -> float:
        """A's accuracy minus B's, a fraction (positive: A ahead)."""
        return (self.only_a - self.only_b) / self.images

    def summary(self) -> str:
        """One line: both accuracies, the gap in points, the discordant images and the p-value."""
        same = (
            ""
            if self.same_predictions is None
            else f", same prediction on {100 * self.same_predictions / self.images:.1f}%"
        )
        return (
            f"{self.name_a} {100 * self.accuracy_a:.2f}% vs {self.name_b} "
            f"{100 * self.accuracy_b:.2f}% on {self.images} images: {100 * self.difference:+.2f} "
            f"points; {self.only_a} right only for {self.name_a}, {self.only_b} only for "
            f"{self.name_b}: McNemar exact p = {self.p_value:.3g}{same}"
        )


def _flat(values: Tensor, name: str) -> Tensor:
    values = torch.as_tensor(values)
    if values.dim() != 1:
        raise ValueError(f"{name} must be one value per image, shape (N,), got {tuple(values.shape)}")
    return values


def mcnemar(
    correct_a: Tensor,
    correct_b: Tensor,
    predictions_a: Tensor | None = None,
    predictions_b: Tensor | None = None,
    name_a: str = "A",
    name_b: str = "B",
) -> PairedComparison:
    """The paired comparison of two models from their per-image correctness ``(N,)`` (bools, the
    same images in the same order); with their predicted classes ``(N,)`` also the images on
    which they agree."""
    correct_a, correct_b = _flat(correct_a, "correct_a").bool(), _flat(correct_b, "correct_b").bool()
    if correct_a.shape != correct_b.shape:
        raise ValueError(
            f"the two models must be scored on the same images, got {correct_a.numel()} and "
            f"{correct_b.numel()}"
        )
    if correct_a.numel() == 0:
        raise ValueError("no images to compare on")
    only_a = int((correct_a & ~correct_b).sum())
    only_b = int((~correct_a & correct_b).sum())
    same = None
    if predictions_a is not None and predictions_b is not None:
        predictions_a, predictions_b = _flat(predictions_a, "predictions_a"), _flat(
            predictions_b, "predictions_b"
        )
        if predictions_a.shape != correct_a.shape or predictions_b.shape != correct_a.shape:
            raise ValueError("predictions must have one entry per image, as the correctness")
        same = int((predictions_a == predictions_b).sum())
    return PairedComparison(
        both_right=int((correct_a & correct_b).sum()),
        only_a=only_a,
        only_b=only_b,
        both_wrong=int((~correct_a & ~correct_b).sum()),
        p_value=exact_binomial_p(only_a, only_a + only_b),
        same_predictions=same,
        name_a=name_a,
        name_b=name_b,
    )


@torch.no_grad()
def predicted_classes(model: nn.Module, images: ImageSet, batch_size: int = 500) -> Tensor:
    """``(N,)`` int64: the classes ``model`` predicts for ``images`` (uint8 ``(N, C, H, W)``), in
    float32 and eval mode on the model's device (the mode is put back)."""
    from attnconv.models.modes import evaluating

    device = next(model.parameters()).device
    chunks = []
    with evaluating(model):
        for start in range(0, len(images.images), batch_size):
            batch = images.images[start : start + batch_size].to(device).float() / 255.0
            chunks.append(model(batch).argmax(dim=-1).cpu())
    return torch.cat(chunks)


def _load(source: str) -> tuple[nn.Module, str, str, dict]:
    """A model from ``pretrained:NAME``, a checkpoint or a run folder (its best checkpoint):
    the model, its dataset, a name for it, and its architecture arguments."""
    from attnconv.models.checkpoint import load_model
    from attnconv.models.pretrained import load_pretrained, pretrained_info
    from attnconv.runs import checkpoint_file

    if source.startswith("pretrained:"):
        name = source.removeprefix("pretrained:")
        info = pretrained_info(name)
        return load_pretrained(name), info.dataset, name, dict(info.arguments)
    path = checkpoint_file(source)
    model, checkpoint = load_model(path)
    epoch = checkpoint.get("epoch", "?")
    return model, checkpoint["dataset"], f"{checkpoint['preset']} (epoch {epoch})", dict(
        checkpoint["arguments"]
    )


def _same_dataset(a: str, b: str, dataset_a: str, dataset_b: str) -> None:
    """UserError unless the models ``a`` and ``b`` were trained on one dataset."""
    if dataset_a != dataset_b:
        raise UserError(
            f"{a} was trained on {dataset_a} and {b} on {dataset_b}: a paired test needs the same "
            f"test images"
        )


def _test_predictions(
    loaded: tuple[nn.Module, str, str, dict], data_dir: str | None, batch_size: int,
    splits: dict[str, Any],
) -> tuple[str, Tensor, Tensor]:
    """The name of a model ``_load`` gave, its predicted classes on its dataset's test split and
    the split's labels; ``splits`` holds the splits read so far by dataset (each read once)."""
    from attnconv.data import load_splits
    from attnconv.train.loop import check_data_fits

    model, dataset, name, arguments = loaded
    if dataset not in splits:
        splits[dataset] = load_splits(dataset, data_dir, 0)
    data = splits[dataset]
    check_data_fits(arguments, data, name, same_size=True)
    return name, predicted_classes(model, data.test, batch_size), data.test.labels


def _paired(
    a: str, b: str, tested_a: tuple[str, Tensor, Tensor], tested_b: tuple[str, Tensor, Tensor]
) -> PairedComparison:
    """McNemar's test of ``a`` and ``b`` from their ``_test_predictions``."""
    (name_a, predicted_a, labels), (name_b, predicted_b, _) = tested_a, tested_b
    if name_a == name_b:
        name_a, name_b = a, b
    return mcnemar(
        predicted_a == labels, predicted_b == labels, predicted_a, predicted_b, name_a, name_b
    )


def compare_checkpoints(
    a: str, b: str, data_dir: str | None = None, batch_size: int = 500
) -> PairedComparison:
    """McNemar's test of two trained models on the test split of the dataset both were trained
    on (10,000 images for Fashion-MNIST), in float32 on the CPU. ``a``, ``b``: a checkpoint, a
    run folder (its ``best.pt``, the epoch chosen on validation) or ``pretrained:NAME``.
    UserError when the two were trained on different datasets."""
    loaded_a, loaded_b = _load(a), _load(b)
    _same_dataset(a, b, loaded_a[1], loaded_b[1])
    splits: dict[str, Any] = {}
    tested_a = _test_predictions(loaded_a, data_dir, batch_size, splits)
    return _paired(a, b, tested_a, _test_predictions(loaded_b, data_dir, batch_size, splits))


@dataclass(frozen=True)
class PairedRun:
    """One finished run of a table: its model, seed, epochs trained and checkpoint (or folder)."""

    preset: str
    seed: int
    epochs: int
    checkpoint: str


def against_baseline(
    runs: list[PairedRun], baseline: str, data_dir: str | None = None
) -> list[tuple[PairedRun, PairedRun, PairedComparison]]:
    """Every run of another model against ``baseline``'s run of the same seed (where there is
    one), on the test split (read once; each model predicts once, the baseline's too):
    ``(run, baseline run, comparison)`` in the order of ``runs``. Runs
    of different epochs are still compared; the table that shows them says so in the row."""
    of_baseline = {run.seed: run for run in runs if run.preset == baseline}
    compared = [(run, of_baseline[run.seed]) for run in runs
                if run.preset != baseline and run.seed in of_baseline]  # fmt: skip
    loaded = {r.checkpoint: _load(r.checkpoint) for pair in compared for r in pair}
    for run, cnn in compared:  # before any model runs
        _same_dataset(run.checkpoint, cnn.checkpoint, loaded[run.checkpoint][1],
                      loaded[cnn.checkpoint][1])  # fmt: skip
    splits: dict[str, Any] = {}
    tested = {c: _test_predictions(m, data_dir, 500, splits) for c, m in loaded.items()}
    return [(run, cnn, _paired(run.checkpoint, cnn.checkpoint, tested[run.checkpoint],
                               tested[cnn.checkpoint])) for run, cnn in compared]  # fmt: skip


def format_against_baseline(pairs: list[tuple[PairedRun, PairedRun, PairedComparison]]) -> str:
    """The pairs of ``against_baseline`` as a Markdown table, one row per run: epochs of
    both (one number when equal: the comparison is at one budget), both accuracies, the gap in
    points, the images only one of the two gets right, McNemar's exact p."""
    lines = [
        "| model | seed | epochs | test acc. (%) | baseline | baseline acc. (%) | gap (points) "
        "| right only for the model | right only for the baseline | McNemar p |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run, cnn, result in pairs:
        epochs = str(run.epochs) if run.epochs == cnn.epochs else (
            f"{run.epochs} (baseline: {cnn.epochs}: not one budget)"
        )
        lines.append(
            f"| `{run.preset}` | {run.seed} | {epochs} | {100 * result.accuracy_a:.2f} | "
            f"`{cnn.preset}` | {100 * result.accuracy_b:.2f} | {100 * result.difference:+.2f} | "
            f"{result.only_a} | {result.only_b} | {result.p_value:.3g} |"
        )
    return "\n".join(lines) + "\n"
