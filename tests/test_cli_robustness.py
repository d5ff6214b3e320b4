"""``attnconv robustness``: its table and CSV hold the accuracies an independent loop measures, and
a wrong argument or model is one line."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest
import torch

from attnconv.cli import main
from attnconv.data.corruptions import CORRUPTIONS, corrupt
from attnconv.data.fashion_mnist import load_fashion_mnist
from attnconv.models.pretrained import load_pretrained, pretrained_models
from viz_helpers import save_checkpoint, small_model

pytestmark = pytest.mark.usefixtures("one_thread")

FASHION = {"image_size": (28, 28), "stem": 2, "mean": (0.29,), "std": (0.35,)}


def tiny_fashion_model(seed: int):
    """A small quadratic-attention model for 28×28 images (14×14 tokens), weights moved by
    ``seed``, and the config that rebuilds it."""
    model, config = small_model("quadratic", **FASHION)
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
    n = 60
    out = tmp_path / "table.csv"
    status = main(
        [
            "robustness", str(checkpoint), str(run), "--pretrained", "resnet-fashion-small",
            "--images", str(n), "--batch-size", "25", "--out", str(out),
        ]
    )  # fmt: skip
    assert status == 0
    captured = capsys.readouterr()

    _, test, _ = load_fashion_mnist(tmp_path, download=False)
    images, labels = test.images[:n, 0].numpy(), test.labels[:n].numpy()
    models = {
        "resnet-fashion-small": load_pretrained("resnet-fashion-small"),
        str(checkpoint): first,
        str(run): second,
    }
    expected = {
        name: accuracies_by_hand(m, images, labels, CORRUPTIONS) for name, m in models.items()
    }
    # the random models differ from each other and from the trained one
    assert len({tuple(row.values()) for row in expected.values()}) == 3

    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["model"] for row in rows] == list(models)
    table = [line for line in captured.out.splitlines() if line.startswith("| `")]
    assert len(table) == 3
    for row, line in zip(rows, table, strict=True):
        truth = expected[row["model"]]
        mean = sum(truth[name] for name in CORRUPTIONS[1:]) / (len(CORRUPTIONS) - 1)
        assert row == {
            "model": row["model"],
            "images": str(n),
            **{name: f"{truth[name]:.6f}" for name in CORRUPTIONS},
            "mean_corrupted": f"{mean:.6f}",
            "mean_minus_clean": f"{mean - truth['clean']:.6f}",
        }
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells == [
            f"`{row['model']}`",
            *(f"{100 * truth[name]:.2f}" for name in CORRUPTIONS),
            f"{100 * mean:.2f}",
            f"{100 * (mean - truth['clean']):+.2f}",
        ]
    header = next(line for line in captured.out.splitlines() if line.startswith("| model"))
    assert header.split(" | ")[1:9] == list(CORRUPTIONS)
    assert f"first {n} images, float32 on cpu" in captured.out
    # one progress line per set and model, as it goes
    progress = re.findall(r"^\[set (\d)/8\] (\S+) on (\S+): ", captured.err, flags=re.MULTILINE)
    assert progress == [
        (str(k), name, corruption)
        for k, corruption in enumerate(CORRUPTIONS, start=1)
        for name in models
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
    assert header == "model,images,clean,occlusion,shift-4,mean_corrupted,mean_minus_clean"
    assert "[set 3/3] resnet-fashion-small on shift-4" in capsys.readouterr().err


def test_all_means_every_shipped_fashion_mnist_model_once():
    from attnconv.cli.robustness import _pretrained_names

    shipped = [
        name for name, info in pretrained_models().items() if info.dataset == "fashion-mnist"
    ]
    assert {"quadratic-fashion", "resnet-fashion", "vit-fashion"} <= set(shipped)
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
        (["DIGITS"], "was trained on digits; the corrupted test sets are fashion-mnist's"),
        (["FASHION", "--images", "0"], "--images must be between 1 and 10000, got 0"),
        (["FASHION", "--images", "10001"], "--images must be between 1 and 10000, got 10001"),
        (["FASHION", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (
            ["FASHION", "--corruptions", "blur", "clean"],
            "unknown corruption 'clean' for --corruptions; expected some of shift-4, shift-8, "
            "noise-low, noise-high, blur, contrast, occlusion (the clean set is always measured)",
        ),
        (["missing.pt"], "checkpoint missing.pt does not exist"),
        (["FASHION", "--out", "nowhere/r.csv"], "--out nowhere/r.csv: the folder nowhere does not"),
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
