"""`attnconv transform`: the spread it picks is the smallest that keeps the validation accuracy,
each accuracy it reports is the transformed network's, and what it writes loads and trains."""

from __future__ import annotations

import json

import pytest
import torch

from attnconv.cli import main
from attnconv.convert import transform_checkpoint
from attnconv.data import BatchLoader, load_splits
from attnconv.models.checkpoint import build_model, load_checkpoint
from attnconv.train.loop import evaluation_sums
from train_helpers import QUIET

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    """A small ResNet trained two epochs on the embedded digits (8×8): a CNN with an accuracy
    that blurring can lose."""
    run = tmp_path_factory.mktemp("cnn") / "run"
    argv = ["train", "--preset", "resnet-fashion-small", "--dataset", "digits", "--epochs", "3",
            "--out", str(run), "model.widths=[8,8,16,16]", "batch_size=32", *QUIET]  # fmt: skip
    assert main(argv) == 0
    return run


def test_the_spread_search_picks_the_smallest_that_keeps_the_accuracy(cnn_run, tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["transform", str(cnn_run), "--out", str(out), "--tolerance", "0.5"]) == 0
    record = json.loads((out / "transform.json").read_text())
    source = load_checkpoint(cnn_run / "checkpoints" / "best.pt")
    data = load_splits("digits", None, source["config"]["val_size"], seed=source["config"]["seed"])
    loader = BatchLoader(data.val, 500, device=torch.device("cpu"), train=False, flip=False)

    def accuracy(checkpoint) -> float:
        _, correct, seen = evaluation_sums(build_model(checkpoint), loader, "fp32")
        return 100.0 * correct / seen

    baseline = accuracy(source)
    assert record["validation_accuracy"] == pytest.approx(baseline, abs=1e-9)
    measured = {float(s): a for s, a in record["spread_accuracy"].items()}
    for spread, value in measured.items():  # each the transformed network's own accuracy
        torch.manual_seed(0)
        assert value == pytest.approx(accuracy(transform_checkpoint(source, spread=spread)),
                                      abs=1e-9)  # fmt: skip
    chosen = record["spread"]
    assert measured[chosen] >= baseline - 0.5
    assert all(value < baseline - 0.5 for spread, value in measured.items() if spread < chosen)
    assert sorted(measured) == [s for s in sorted(measured) if s <= chosen]  # stopped there
    written = load_checkpoint(out / "transformed.pt")
    assert written["architecture"] == "transformed" and written["arguments"]["spread"] == chosen
    assert written["preset"] == "resnet-fashion-small-transformed"  # no preset has these layers
    assert f"with spread {chosen:g}" in capsys.readouterr().out


def test_a_given_spread_and_layers_skip_the_search(cnn_run, tmp_path):
    out = tmp_path / "t"
    argv = ["transform", str(cnn_run), "--out", str(out), "--spread", "2.5", "--layers",
            "stages.3.*", "--no-content"]  # fmt: skip
    assert main(argv) == 0
    record = json.loads((out / "transform.json").read_text())
    assert "spread_accuracy" not in record and record["spread"] == 2.5
    assert record["layers"] == ["stages.3.0.conv1", "stages.3.0.conv2", "stages.3.0.shortcut.0",
                                "stages.3.1.conv1", "stages.3.1.conv2"]  # fmt: skip
    model = build_model(load_checkpoint(out / "transformed.pt"))
    assert all(layer.gate is None for layer in model.transformed_layers().values())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--spread", "-1"], "--spread must be a positive number"),
        (["--layers", "nowhere"], "matches no nn.Conv2d"),
    ],
)
def test_bad_options_are_one_line(cnn_run, tmp_path, capsys, argv, message):
    assert main(["transform", str(cnn_run), "--out", str(tmp_path / "t"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_transformed_checkpoint_is_refused(cnn_run, tmp_path, capsys):
    assert main(["transform", str(cnn_run), "--out", str(tmp_path / "a"), "--spread", "3"]) == 0
    again = ["transform", str(tmp_path / "a" / "transformed.pt"), "--out", str(tmp_path / "b")]
    assert main(again) == 2
    assert "already holds a transformed network" in capsys.readouterr().err
