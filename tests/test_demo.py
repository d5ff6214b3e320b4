"""`attnconv demo`, shortened to one epoch: its numbers are the run's, its files exist."""

import json

import torch

from attnconv import cli
from attnconv.convert.check import BATTERY
from attnconv.demo import SHIPPED
from attnconv.hardware import resolve_precision
from attnconv.models.checkpoint import load_checkpoint
from attnconv.models.pretrained import pretrained_info


def test_short_demo_writes_its_results(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out), "--epochs", "1", "--no-progress"]) == 0
    printed = capsys.readouterr()
    demo = json.loads((out / "demo.json").read_text())

    # 1. Theorem 1: every battery configuration in float64 and float32, all within tolerance.
    assert demo["theorem1_checked"] == 2 * len(BATTERY) == demo["theorem1_passed"]
    assert demo["theorem1_max_rel_error"]["float64"] < 1e-12
    assert demo["theorem1_max_rel_error"]["float32"] < 1e-5
    table = (out / "theorem1.txt").read_text().splitlines()
    assert len(table) == 1 + 2 * len(BATTERY)

    # 2. The run: the quick preset on digits, one epoch, test accuracy from its summary.
    summary = json.loads((out / "run" / "summary.json").read_text())
    config = json.loads((out / "run" / "config.json").read_text())
    assert (config["preset"], config["dataset"], config["epochs"]) == ("quick", "digits", 1)
    assert demo["test_acc"] == summary["test_acc"] and demo["epochs"] == 1
    assert 0.0 <= demo["test_acc"] <= 1.0
    expected = resolve_precision("auto", torch.device("cpu"))
    assert demo["precision"] == summary["precision"] == config["precision"] == expected
    epoch_checkpoint = load_checkpoint(out / "run" / "checkpoints" / "epoch_0001.pt")
    last = load_checkpoint(out / "run" / "checkpoints" / "last.pt")
    for name, tensor in last["model"].items():
        assert torch.equal(epoch_checkpoint["model"][name], tensor)

    # 3. Figures, named at the end of the output.
    names = {p.name for p in (out / "figures").iterdir()}
    for stem in ("contours", "maps", "distance", "trajectories", "accuracy"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= names
        assert (out / "figures" / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out / "figures") in printed.out + printed.err
    assert f"test accuracy {summary['test_acc']:.1%}" in printed.out + printed.err

    # 4. The shipped Fashion-MNIST model: its figures, grid scores and (data installed here in
    # CI) its test accuracy, which must be the one its weights' index states.
    shipped = demo["shipped"]
    info = pretrained_info(SHIPPED)
    assert shipped["stated_test_acc"] == info.test_accuracy
    assert len(shipped["grid_score"]) == info.arguments["depth"]
    assert all(0.0 <= g <= 1.0 for g in shipped["grid_score"])
    shipped_names = {p.name for p in (out / "figures" / SHIPPED).iterdir()}
    assert {"contours.png", "maps.png", "distance.png", "heads.csv"} <= shipped_names
    if shipped["test_acc"] is None:
        assert "apt-get install dataset-fashion-mnist" in shipped["accuracy_line"]
    else:
        assert abs(shipped["test_acc"] - info.test_accuracy) < 0.005
    assert shipped["accuracy_line"] in printed.out + printed.err


def test_demo_refuses_to_overwrite(tmp_path, capsys) -> None:
    (tmp_path / "run").mkdir()
    assert cli.main(["demo", "--out", str(tmp_path), "--epochs", "1"]) == 2
    assert "already holds a demo" in capsys.readouterr().err
