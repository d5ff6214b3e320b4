"""`attnconv reproduce`: run selection, skipping and resuming, the results table from a real run."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch

from attnconv import reproduce
from attnconv.data import load_splits
from attnconv.models import create_model
from attnconv.models.pretrained import pretrained_models
from attnconv.train.config import TrainConfig, resolve_config
from attnconv.train.loop import train
from attnconv.viz.figures import attention_figure
from attnconv.viz.grid import layer_grid_scores
from attnconv.viz.maps import compute_attention
from train_helpers import command_config, without_bookkeeping


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """A finished one-epoch run of the quick preset on the embedded digits."""
    run_dir = tmp_path_factory.mktemp("experiment") / "quick"
    config = resolve_config(
        "quick",
        "digits",
        {"epochs": 1, "checkpoint_every": 1, "tensorboard": False, "progress": False},
    )
    train(config, run_dir)
    return run_dir


def test_presets_of_an_experiment():
    assert reproduce.selected_presets("fashion-mnist", None) == (
        "quadratic-fashion",
        "learned-fashion",
        "learned-content-fashion",
        "resnet-fashion-small",
        "resnet-fashion",
        "vit-fashion",
    )
    assert reproduce.selected_presets("fashion-mnist", ["resnet-fashion"]) == ("resnet-fashion",)
    with pytest.raises(ValueError, match="quick not in experiment 'fashion-mnist'"):
        reproduce.selected_presets("fashion-mnist", ["quick"])


def test_finished_runs_are_skipped_and_interrupted_ones_resumed(tmp_path, monkeypatch, quick_run):
    calls = []
    monkeypatch.setattr("attnconv.train.loop.train", lambda *a, **k: calls.append((a, k)))
    assert reproduce.run_state(quick_run) == "finished"
    reproduce.train_run("quick", "digits", quick_run, "fp32", None)
    assert calls == []

    interrupted = tmp_path / "interrupted"
    (interrupted / "checkpoints").mkdir(parents=True)
    (interrupted / "checkpoints" / "last.pt").write_bytes(b"")
    assert reproduce.run_state(interrupted) == "interrupted"
    reproduce.train_run("quick", "digits", interrupted, "fp32", None)
    ((args, kwargs),) = calls
    assert args == (None, interrupted)  # the config saved in last.pt, the one source of truth
    assert kwargs == {"resume": True, "epoch_figure": attention_figure}

    calls.clear()
    assert reproduce.run_state(tmp_path / "new") == "new"
    reproduce.train_run("quick", "digits", tmp_path / "new", "fp32", None)
    ((args, kwargs),) = calls
    config = args[0]
    assert (config.preset, config.dataset, config.precision, config.checkpoint_every) == (
        "quick",
        "digits",
        "fp32",
        1,
    )


def test_results_row_figures_and_table_of_a_real_run(tmp_path, quick_run):
    summary = json.loads((quick_run / "summary.json").read_text())
    row = reproduce.analyse_run(quick_run, tmp_path / "figures", None)
    for key in ("test_acc", "parameters", "macs_per_image", "train_time_s", "images_per_s"):
        assert row[key] == summary[key]
    assert row["epochs"] == 1 and row["grid_kernel"] == 3
    depth = create_model("quick").heads_per_layer()
    assert len(row["grid_score"]) == len(row["grid_coverage"]) == len(depth)
    assert len(row["attention_distance"]) == len(depth)
    # The initial grid score is the one of the model as the run's seed built it.
    torch.manual_seed(0)
    initial = create_model("quick")
    expected = [s.score for s in layer_grid_scores(compute_attention(initial, (8, 8)))]
    assert row["grid_score_init"] == pytest.approx(expected)
    assert row["grid_score"] != pytest.approx(expected)  # one epoch of training moved the heads
    names = {p.name for p in (tmp_path / "figures").iterdir()}
    assert {"contours.png", "maps.png", "distance.png", "trajectories.png", "heads.csv"} <= names
    with (tmp_path / "figures" / "heads.csv").open() as handle:
        heads = list(csv.DictReader(handle))
    assert row["grid"] == (8, 8)  # one token per pixel of the 8×8 digits (the quick stem is 1)
    assert [len(layer) for layer in row["head_distances"]] == depth
    for layer, distances in enumerate(row["head_distances"]):
        assert sum(distances) / len(distances) == pytest.approx(row["attention_distance"][layer])
        listed = [float(h["attention_distance"]) for h in heads if int(h["layer"]) == layer]
        assert distances == pytest.approx(listed, abs=1e-3)

    resnet_row = {
        **row,
        "preset": "resnet-fashion",
        "grid_kernel": None,
        "grid_score": None,
        "grid_score_init": None,
        "grid_coverage": None,
        "attention_distance": None,
        "head_distances": None,
        "grid": None,
    }
    # One panel per attention model: the ResNet has none.
    (png, pdf) = reproduce.write_distance_comparison([row, resnet_row], tmp_path / "figures")
    assert png.name == "distance-by-depth.png" and pdf.stat().st_size > 0
    assert reproduce.write_distance_comparison([resnet_row], tmp_path / "none") == []
    references = reproduce.REFERENCES["fashion-mnist"]
    files = reproduce.write_results([row, resnet_row], tmp_path, "a test machine", references)
    markdown = files[0].read_text().splitlines()
    assert markdown[0].startswith("| model | epochs | test acc. (%)")
    cells = [c.strip() for c in markdown[2].strip("|").split("|")]
    assert len(cells) == len(markdown[0].strip("|").split("|"))
    assert cells[0] == "`quick`" and cells[2] == f"{100 * summary['test_acc']:.2f}"
    assert cells[8] == " / ".join(f"{g:.2f}" for g in row["grid_score"])
    covered = [round(c * 9) for c in row["grid_coverage"]]
    assert cells[10] == " / ".join(f"{c}/9" for c in covered)
    assert [c.strip() for c in markdown[3].strip("|").split("|")][8:] == ["-"] * 4
    assert markdown[-1] == "Trained on: a test machine"
    listed = [line for line in markdown if line.startswith("- ")]
    assert listed[0] == "- softmax (logistic) regression: 83–84% (the dataset's benchmark table)"
    assert len(listed) == len(references) and markdown.index(listed[0]) > 3
    with files[1].open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["preset"] == "quick" and float(rows[0]["test_acc"]) == summary["test_acc"]
    scores = [float(v) for v in rows[0]["grid_score"].split()]
    assert scores == pytest.approx(row["grid_score"], abs=1e-4)
    assert rows[1]["grid_score"] == ""


def test_shipped_weights_record_the_command_that_trained_them(tmp_path, quick_run):
    data = load_splits("digits")
    summary = json.loads((quick_run / "summary.json").read_text())
    reproduce.export_run(quick_run, data, tmp_path / "weights")
    run = pretrained_models(tmp_path / "weights")["quick"].run
    saved = json.loads((quick_run / "config.json").read_text())
    assert run["command"] == summary["command"]  # attnconv train, not the exporting command
    assert without_bookkeeping(command_config(run["command"])) == without_bookkeeping(
        TrainConfig.from_dict(saved)
    )
    assert (run["epochs"], run["best_epoch"], run["machine"]) == (
        summary["epochs"], summary["best_epoch"], summary["machine"]
    )

    # a run finished before attnconv recorded them: its command rebuilt, no machine guessed
    older = tmp_path / "older"
    shutil.copytree(quick_run, older)
    for key in ("command", "machine", "replans"):
        del summary[key]
    (older / "summary.json").write_text(json.dumps(summary))
    reproduce.export_run(older, data, tmp_path / "weights")
    run = pretrained_models(tmp_path / "weights")["quick"].run
    assert run["command"] == json.loads((quick_run / "summary.json").read_text())["command"]
    assert "machine" not in run
