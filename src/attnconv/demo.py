"""``attnconv demo``: the paper's story on embedded data, in a few minutes on a CPU.

1. Theorem 1: every convolution of ``attnconv.convert.check``'s battery (1-D and 2-D, strides,
   dilations, groups, paddings) is rebuilt as multi-head self-attention and compared with the
   convolution, forward and backward, in float64 and float32.
2. Training: the ``quick`` preset (a small isotropic-Gaussian attention model) for ``EPOCHS``
   epochs on the 8×8 digits that ship with scikit-learn, with a checkpoint every epoch; the best
   epoch on validation is tested on the held-out test images.
3. Figures: attention mass contours, attention maps and distances, the Gaussian centres moving
   over the epochs (drawn from the per-epoch checkpoints, which are then removed: 0.7 MB each),
   and the validation-accuracy curve.
4. Real photographs: the figures of ``SHIPPED``, the Gaussian model trained on Fashion-MNIST
   whose weights ship with the package, with its grid score per layer; its test accuracy is
   measured again in float32, the precision of the stated figure, when Fashion-MNIST is
   installed (else one line says how to get it).

Steps 3 and 4 print a line as each of their parts starts, and on a terminal a progress bar while
the test images are evaluated (training: a bar on a terminal, elsewhere a line every
``attnconv.train.loop.LOG_INTERVAL`` steps). Everything lands in one folder: ``theorem1.txt``, ``run/`` (a run folder:
config, metrics, ``best.pt`` and ``last.pt``, TensorBoard), ``figures/`` and ``demo.json`` (the
numbers printed at the end). Training runs in the precision ``auto`` picks for the machine
(``attnconv.hardware``); ``demo.json`` says which.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from attnconv.errors import UserError

if TYPE_CHECKING:
    from attnconv.data import ImageSet

PRESET = "quick"
SHIPPED = "quadratic-fashion"
# Three times the preset's 20 epochs: about 50 s of CPU time in all (one thread), and a higher
# test accuracy (94.4% in bfloat16 on an AMD EPYC; 96–97% in earlier runs) than 20 epochs' 92%.
EPOCHS = 60


def run_demo(out_dir: str | Path, epochs: int = EPOCHS, progress: bool = True) -> dict[str, Any]:
    """Run the four steps into ``out_dir`` (must not hold a demo yet); returns ``demo.json``'s dict.

    ``epochs``: training length (the cosine schedule spans it). The steps run on one intra-op
    thread (torch's count is restored after): the demo's models are too small for their
    operations to be shared between threads, and a second one mostly waits. Measured on 2 cores
    of an AMD EPYC shared with other jobs, two threads took 3.5x the CPU time and 3.4x the wall
    time of one to train the quick model, 1.6x and 1.7x to evaluate the shipped one; the whole
    demo on one thread: 78 s of CPU time (training 49 s, the shipped model's 10000 test images
    20 s).
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_demo(Path(out_dir), epochs, progress)
    finally:
        torch.set_num_threads(threads)


def _run_demo(out: Path, epochs: int, progress: bool) -> dict[str, Any]:
    """``run_demo`` on the threads it was given."""
    from attnconv.convert.check import format_battery, run_battery
    from attnconv.runs import RunDir, write_json, write_text_atomic
    from attnconv.train.config import resolve_config
    from attnconv.train.loop import train
    from attnconv.viz.figures import attention_figure, plot_checkpoint
    from attnconv.viz.report import load_run, report_figure
    from attnconv.viz.style import save_figure

    if (out / "demo.json").exists() or (out / "run").exists():
        raise UserError(f"{out} already holds a demo; give another --out or delete it")
    # checked before anything runs or is written (a bad --epochs leaves no folder behind)
    config = resolve_config(PRESET, "digits", epochs=epochs, checkpoint_every=1, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    tqdm.write("1/4  Theorem 1: convolutions rebuilt as multi-head self-attention")
    results = run_battery()
    write_text_atomic(out / "theorem1.txt", format_battery(results) + "\n")
    passed = sum(r.passed for r in results)
    worst = {
        str(dtype).removeprefix("torch."): max(
            max(r.rel_error, r.grad_rel_error) for r in results if r.dtype == dtype
        )
        for dtype in sorted({r.dtype for r in results}, key=str)
    }
    tqdm.write(
        f"     {passed}/{len(results)} configurations equal their convolution (largest relative "
        f"error, forward or backward: "
        + ", ".join(f"{name} {error:.1e}" for name, error in worst.items())
        + f"); table in {out / 'theorem1.txt'}"
    )

    tqdm.write(f"2/4  Training the {PRESET!r} preset on the embedded digits")
    summary = train(config, out / "run", epoch_figure=attention_figure)

    tqdm.write("3/4  Figures")
    run = RunDir(out / "run")
    _part(
        f"attention of the best epoch ({summary['best_epoch']}): contours, maps, distances; "
        f"Gaussian centres over the {len(run.epoch_checkpoints())} epochs"
    )
    result = plot_checkpoint(run.best, out / "figures")
    _part("validation accuracy over the epochs")
    files = [
        *result.files,
        *save_figure(report_figure([load_run(run.root)]), out / "figures", "accuracy"),
    ]
    figures = sorted(str(f) for f in files if f.suffix == ".png")
    removed = run.epoch_checkpoints()
    size = sum(path.stat().st_size for path in removed)
    for path in removed:
        path.unlink()
    _part(
        f"removed the {len(removed)} per-epoch checkpoints the centres were read from "
        f"({size / 1e6:.0f} MB); {run.checkpoints} keeps best.pt and last.pt"
    )

    tqdm.write(f"4/4  The shipped {SHIPPED!r} model, trained on Fashion-MNIST photographs")
    shipped = shipped_model_step(out / "figures" / SHIPPED, progress)
    figures += sorted(str(f) for f in shipped.pop("files") if f.suffix == ".png")

    demo = {
        "theorem1_passed": passed,
        "theorem1_checked": len(results),
        "theorem1_max_rel_error": worst,
        "test_acc": summary["test_acc"],
        "best_val_acc": summary["best_val_acc"],
        "best_epoch": summary["best_epoch"],
        "epochs": config.epochs,
        "precision": summary["precision"],
        "figures": figures,
        "shipped": shipped,
        "run_dir": str(out / "run"),
        "time_s": time.perf_counter() - started,
    }
    write_json(out / "demo.json", demo)
    tqdm.write(
        f"\nDemo finished in {demo['time_s']:.0f}s.\n"
        f"  Theorem 1: {passed}/{len(results)} convolutions reproduced exactly by attention.\n"
        f"  {PRESET} on digits: test accuracy {summary['test_acc']:.1%} (best validation "
        f"{summary['best_val_acc']:.1%} at epoch {summary['best_epoch']}/{config.epochs}).\n"
        f"  {SHIPPED} (shipped): {shipped['accuracy_line']}\n"
        f"  Figures ({len(figures)} PNG, with PDFs) in {out / 'figures'}; run folder "
        f"{out / 'run'} (tensorboard --logdir {out / 'run' / 'tensorboard'})."
    )
    return demo


def _part(message: str) -> None:
    """One line as a part of a step starts."""
    tqdm.write(f"     {message}")


def shipped_model_step(out_dir: Path, progress: bool = True) -> dict[str, Any]:
    """Figures and grid scores of the shipped ``SHIPPED`` model, and its test accuracy in float32
    (the precision of the accuracy its index states) if Fashion-MNIST is on this machine (never
    downloaded here: the demo stays offline). ``progress``: a bar while the images are evaluated.

    Returns ``files`` (the figures), ``stated_test_acc`` (from the weights' index),
    ``test_acc`` (measured, or None), ``grid_score`` (per layer) and ``accuracy_line``.
    """
    from attnconv.data import load_splits
    from attnconv.models.pretrained import pretrained_info
    from attnconv.viz.figures import plot_pretrained
    from attnconv.viz.grid import layer_grid_scores

    info = pretrained_info(SHIPPED)
    _part(f"attention figures ({out_dir})")
    result = plot_pretrained(SHIPPED, out_dir)
    grid = [score.score for score in layer_grid_scores(result.maps)]
    _part("grid score per layer " + " / ".join(f"{g:.2f}" for g in grid))
    try:
        test = load_splits(info.dataset, download=False).test
    except FileNotFoundError:
        test = None
    measured = None
    if test is None:
        line = (
            f"stated test accuracy {info.test_accuracy:.2%}; to measure it here install "
            f"Fashion-MNIST (Debian: apt-get install dataset-fashion-mnist) and run "
            f"attnconv eval --pretrained {SHIPPED}"
        )
    else:
        _part(f"test accuracy on the {len(test)} Fashion-MNIST test images, in float32")
        correct, seen = _shipped_test_counts(test, progress)
        measured = correct / seen
        line = (
            f"test accuracy {measured:.2%} on the {int(seen)} Fashion-MNIST test images "
            f"(stated {info.test_accuracy:.2%}; both float32)"
        )
    line += "; grid score per layer " + " / ".join(f"{g:.2f}" for g in grid)
    return {
        "files": result.files,
        "stated_test_acc": info.test_accuracy,
        "test_acc": measured,
        "grid_score": grid,
        "accuracy_line": line,
    }


def _shipped_test_counts(test: ImageSet, progress: bool, chunk: int = 1000) -> tuple[float, float]:
    """``(correct, images)`` of the shipped model on ``test`` in float32, ``chunk`` images at a
    time so that a bar can follow (``progress`` and stderr a terminal: a bar redrawn in place
    would leave its every frame in a log file)."""
    from attnconv.data import BatchLoader, ImageSet
    from attnconv.models.pretrained import load_pretrained
    from attnconv.train.loop import evaluation_sums

    model = load_pretrained(SHIPPED)
    correct = seen = 0.0
    live = progress and sys.stderr.isatty()
    with tqdm(total=len(test), unit="img", disable=not live, leave=False, file=sys.stderr) as bar:
        for start in range(0, len(test), chunk):
            part = ImageSet(test.images[start : start + chunk], test.labels[start : start + chunk])
            loader = BatchLoader(part, 500, device="cpu", train=False, flip=False)
            _, part_correct, part_seen = evaluation_sums(model, loader, "fp32")
            correct, seen = correct + part_correct, seen + part_seen
            bar.update(int(part_seen))
    return correct, seen
