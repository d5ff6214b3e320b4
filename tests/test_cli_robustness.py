"""``attnconv robustness``: its table and CSV hold the accuracies an independent loop measures, and
a wrong argument or model is one line."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest
import torch

from attnconv.cli import main
from attnconv.data.corruptions import CORRUPTIONS, corrupt, ink_kept
from attnconv.data.datasets import load_splits
from attnconv.data.fashion_mnist import load_fashion_mnist
from attnconv.models.pretrained import load_pretrained, pretrained_models
from viz_helpers import save_checkpoint, small_model

pytestmark = pytest.mark.usefixtures("one_thread")

FASHION = {"image_size": (28, 28), "stem": 2, "mean": (0.29,), "std": (0.35,)}
ANYWHERE = {"image_size": (32, 32), "mean": (0.1,), "std": (0.25,)}


def tiny_fashion_model(seed: int, **overrides):
    """A small quadratic-attention model for 28×28 images (14×14 tokens; ``overrides`` change the
    config), weights moved by ``seed``, and the config that rebuilds it."""
    model, config = small_model("quadratic", **{**FASHION, **overrides})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model, config


def accuracies_by_hand(model, images: np.ndarray, labels: np.ndarray, names) -> dict[str, float]:
    """Each set's accuracy: the corruption of the first images, one float forward."""
    result = {}
    for name in names:
        pixels = torch.from_numpy(corrupt(images, name)).float().unsqueeze(1) / 255
        with torch.no_grad():
            predicted = model.eval()(pixels).argmax(dim=1).numpy()
        result[name] = float((predicted == labels).mean())
    return result


@pytest.mark.needs_fashion_mnist
def test_table_and_csv_hold_the_accuracies_of_an_independent_loop(tmp_path, capsys):
    first, config = tiny_fashion_model(1)
    checkpoint = save_checkpoint(
        tmp_path / "first.pt", first, "quadratic", config, dataset="fashion-mnist"
    )
    second, _ = tiny_fashion_model(2)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    save_checkpoint(
        run / "checkpoints" / "best.pt", second, "quadratic", config, dataset="fashion-mnist"
    )
    placed_model, placed_config = tiny_fashion_model(3, **ANYWHERE)
    placed_checkpoint = save_checkpoint(
        tmp_path / "anywhere.pt", placed_model, "quadratic", placed_config,
        dataset="fashion-mnist-anywhere",
    )  # fmt: skip
    n = 60
    out = tmp_path / "table.csv"
    status = main(
        [
            "robustness", str(checkpoint), str(placed_checkpoint), str(run),
            "--pretrained", "resnet-fashion-small", "--images", str(n), "--batch-size", "25",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert status == 0
    captured = capsys.readouterr()

    _, test, _ = load_fashion_mnist(tmp_path, download=False)
    images, labels = test.images[:n, 0].numpy(), test.labels[:n].numpy()
    placed = load_splits("fashion-mnist-anywhere", tmp_path, download=False).test
    placed_images = placed.images[:n, 0].numpy()
    assert placed.labels[:n].tolist() == labels.tolist()
    # pretrained first, then the checkpoints in the order given
    models = {
        "resnet-fashion-small": (load_pretrained("resnet-fashion-small"), images),
        str(checkpoint): (first, images),
        str(placed_checkpoint): (placed_model, placed_images),
        str(run): (second, images),
    }
    expected = {
        name: accuracies_by_hand(model, pixels, labels, CORRUPTIONS)
        for name, (model, pixels) in models.items()
    }
    # the random models differ from each other and from the trained one
    assert len({tuple(row.values()) for row in expected.values()}) == 4
    datasets = {name: "fashion-mnist" for name in models} | {
        str(placed_checkpoint): "fashion-mnist-anywhere"
    }

    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["model"] for row in rows] == list(models)
    # a table per dataset, each with its heading
    lines = captured.out.splitlines()
    fashion_at = lines.index(f"fashion-mnist test accuracy (%), first {n} images, float32 on cpu:")
    anywhere_at = lines.index(
        f"fashion-mnist-anywhere test accuracy (%), first {n} images, float32 on cpu:"
    )
    assert fashion_at < anywhere_at
    table = {
        "fashion-mnist": [line for line in lines[fashion_at:anywhere_at] if line.startswith("| `")],
        "fashion-mnist-anywhere": [line for line in lines[anywhere_at:] if line.startswith("| `")],
    }
    assert [len(lines) for lines in table.values()] == [3, 1]
    for row in rows:
        truth = expected[row["model"]]
        mean = sum(truth[name] for name in CORRUPTIONS[1:]) / (len(CORRUPTIONS) - 1)
        assert row == {
            "model": row["model"],
            "dataset": datasets[row["model"]],
            "images": str(n),
            **{name: f"{truth[name]:.6f}" for name in CORRUPTIONS},
            "mean_corrupted": f"{mean:.6f}",
            "mean_minus_clean": f"{mean - truth['clean']:.6f}",
        }
        line = next(
            line for line in table[row["dataset"]] if line.startswith(f"| `{row['model']}`")
        )
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells == [
            f"`{row['model']}`",
            *(f"{100 * truth[name]:.2f}" for name in CORRUPTIONS),
            f"{100 * mean:.2f}",
            f"{100 * (mean - truth['clean']):+.2f}",
        ]
    header = next(line for line in lines if line.startswith("| model"))
    assert header.split(" | ")[1 : 1 + len(CORRUPTIONS)] == list(CORRUPTIONS)
    # under each table, the share of ink each shift keeps in the frame on those images
    for at, pixels in ((fashion_at, images), (anywhere_at, placed_images)):
        shares = ", ".join(
            f"{name} {100 * ink_kept(pixels, corrupt(pixels, name)):.2f}%"
            for name in ("shift-4", "shift-8", "shift-4-in-frame", "shift-8-in-frame")
        )
        ink_line = f"ink the shifted images keep in the frame (mean over images): {shares}"
        assert ink_line in lines[at:]
    assert lines.index(ink_line) > anywhere_at
    # one progress line per set and model, as it goes: Fashion-MNIST's sets, then the placed ones
    progress = re.findall(r"^\[set (\d+)/(\d+)\] (\S+) on (\S+): ", captured.err, re.MULTILINE)
    sets = len(CORRUPTIONS)
    assert progress == [
        (str(k), str(2 * sets), name, corruption)
        for k, corruption in enumerate(CORRUPTIONS, start=1)
        for name in models
        if datasets[name] == "fashion-mnist"
    ] + [
        (str(sets + k), str(2 * sets), str(placed_checkpoint), corruption)
        for k, corruption in enumerate(CORRUPTIONS, start=1)
    ]


@pytest.mark.needs_fashion_mnist
def test_chosen_corruptions_only_in_the_order_given(tmp_path, capsys):
    out = tmp_path / "r.csv"
    assert main(
        [
            "robustness", "--pretrained", "resnet-fashion-small", "--images", "30",
            "--corruptions", "occlusion", "shift-4", "occlusion", "--out", str(out),
        ]
    ) == 0  # fmt: skip
    header = out.read_text().splitlines()[0]
    assert header == (
        "model,dataset,images,clean,occlusion,shift-4,mean_corrupted,mean_minus_clean"
    )
    captured = capsys.readouterr()
    assert "[set 3/3] resnet-fashion-small on shift-4" in captured.err
    assert "in the frame (mean over images): shift-4 " in captured.out  # the one shift asked


def test_all_means_every_shipped_model_of_both_datasets_once():
    from attnconv.cli.robustness import _pretrained_names

    datasets = ("fashion-mnist", "fashion-mnist-anywhere")
    shipped = [name for name, info in pretrained_models().items() if info.dataset in datasets]
    assert {"quadratic-fashion", "vit-fashion", "learned-content-anywhere"} <= set(shipped)
    assert _pretrained_names(["all"]) == shipped
    names = _pretrained_names(["vit-fashion", "all", "vit-fashion"])
    assert names == ["vit-fashion", *(name for name in shipped if name != "vit-fashion")]


def test_help_lists_every_corruption(capsys):
    with pytest.raises(SystemExit):
        main(["robustness", "--help"])
    assert " ".join(CORRUPTIONS[1:]) in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "give one or more CHECKPOINTs or run folders, or --pretrained NAME ... / all"),
        (["--pretrained", "nope"], "no pretrained weights for 'nope'; shipped: quadratic-fashion"),
        (
            ["DIGITS"],
            "DIGITS was trained on digits; corrupted test sets exist for fashion-mnist and "
            "fashion-mnist-anywhere: give a model trained on one of them",
        ),
        (["FASHION", "--images", "0"], "--images: expected an integer in [1, 10000], got '0'"),
        (
            ["FASHION", "--images", "10001"],
            "--images: expected an integer in [1, 10000], got '10001'",
        ),
        (["FASHION", "--batch-size", "0"], "--batch-size: expected an integer in [1, 1000000]"),
        (
            ["FASHION", "--corruptions", "blur", "clean"],
            "unknown corruption 'clean' for --corruptions; expected some of shift-4, shift-8, "
            "shift-4-in-frame, shift-8-in-frame, noise-low, noise-high, blur, contrast, occlusion "
            "(the clean set is always measured)",
        ),
        (["missing.pt"], "a checkpoint file or run folder: it does not exist, got 'missing.pt'"),
        (
            ["FASHION", "--out", "nowhere/r.csv"],
            "--out: expected a CSV file to write: its folder nowhere does not exist",
        ),
    ],
)
def test_a_wrong_argument_or_model_is_one_line(tmp_path, monkeypatch, capsys, arguments, message):
    monkeypatch.chdir(tmp_path)
    model, config = small_model("quadratic")
    save_checkpoint(tmp_path / "DIGITS", model, "quadratic", config, dataset="digits")
    model, config = tiny_fashion_model(1)
    save_checkpoint(tmp_path / "FASHION", model, "quadratic", config, dataset="fashion-mnist")
    assert main(["robustness", *arguments]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "robustness.csv").exists()


def test_the_csv_is_written_atomically(tmp_path, monkeypatch):
    """Issue 55: the CSV was written in place, so a full disk left a 0-byte or partial file; a
    failed write now leaves the file as it was and no temporary file."""
    import errno

    from attnconv.cli import robustness

    path = tmp_path / "robustness.csv"
    path.write_text("the previous table\n")
    accuracy = {"a": {"clean": 0.9, "blur": 0.8}, "b": {"clean": 0.7, "blur": 0.6}}
    datasets = {"a": "fashion-mnist", "b": "fashion-mnist"}
    real = csv.writer

    class FullDisk:
        def __init__(self, handle):
            self.writer, self.rows = real(handle), 0

        def writerow(self, row):
            self.rows += 1
            if self.rows == 3:  # the disk fills while the second model's row is written
                raise OSError(errno.ENOSPC, "No space left on device")
            self.writer.writerow(row)

    monkeypatch.setattr(robustness.csv, "writer", FullDisk)
    with pytest.raises(OSError, match="No space left"):
        robustness.write_csv(accuracy, datasets, 10, path)
    assert path.read_text() == "the previous table\n"
    monkeypatch.undo()
    robustness.write_csv(accuracy, datasets, 10, path)
    assert path.read_text().splitlines()[2] == "b,fashion-mnist,10,0.700000,0.600000,0.600000,-0.100000"
    assert [p.name for p in tmp_path.iterdir()] == ["robustness.csv"]
