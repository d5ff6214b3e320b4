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
    # the per-epoch checkpoint drew the centres' trajectories, then went: best.pt and last.pt stay
    assert sorted(p.name for p in (out / "run" / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
    assert load_checkpoint(out / "run" / "checkpoints" / "last.pt")["epoch"] == 1

    # 3. Figures, named at the end of the output.
    names = {p.name for p in (out / "figures").iterdir()}
    for stem in ("contours", "maps", "distance", "trajectories", "accuracy"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= names
        assert (out / "figures" / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out / "figures") in printed.out + printed.err
    assert f"test accuracy {summary['test_acc']:.1%}" in printed.out + printed.err
    # steps 3 and 4 say what they are doing as they go, in order
    lines = (printed.out + printed.err).splitlines()
    parts = [
        "3/4  Figures",
        "     attention of the best epoch (1): contours, maps, distances; Gaussian centres over "
        "the 1 epochs",
        "     validation accuracy over the epochs",
        "     removed the 1 per-epoch checkpoints the centres were read from",
        "4/4  The shipped 'quadratic-fashion' model",
        f"     attention figures ({out / 'figures' / SHIPPED})",
        "     grid score per layer ",
    ]
    found = [next(i for i, line in enumerate(lines) if line.startswith(part)) for part in parts]
    assert found == sorted(found)

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
    else:  # float32, as the stated figure: only another CPU's rounding may flip an image
        assert abs(shipped["test_acc"] - info.test_accuracy) < 0.005
        assert f"(stated {info.test_accuracy:.2%}; both float32)" in shipped["accuracy_line"]
        part = "     test accuracy on the 10000 Fashion-MNIST test images, in float32"
        assert lines.index(part) > found[-1]
    assert shipped["accuracy_line"] in printed.out + printed.err


def test_a_bad_epoch_count_fails_before_any_work_and_leaves_no_folder(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out), "--epochs", "-1"]) == 2
    printed = capsys.readouterr()
    assert printed.err == (
        "attnconv demo: error: argument --epochs: expected an integer in [1, 10000], got '-1' "
        "(see attnconv demo --help)\n"
    )
    assert printed.out == "" and not out.exists()


def test_demo_refuses_to_overwrite(tmp_path, capsys) -> None:
    (tmp_path / "run").mkdir()
    assert cli.main(["demo", "--out", str(tmp_path), "--epochs", "1"]) == 2
    assert "already holds a demo" in capsys.readouterr().err
