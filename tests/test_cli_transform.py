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
    for spread, value in measured.items():  # each the positional part's own accuracy
        torch.manual_seed(0)
        positional = transform_checkpoint(source, spread=spread, content=False)
        assert value == pytest.approx(accuracy(positional), abs=1e-9)
    chosen = record["spread"]
    assert measured[chosen] >= baseline - 0.5
    assert all(value < baseline - 0.5 for spread, value in measured.items() if spread < chosen)
    assert sorted(measured) == [s for s in sorted(measured) if s <= chosen]  # stopped there
    written = load_checkpoint(out / "transformed.pt")
    assert written["architecture"] == "transformed" and written["arguments"]["spread"] == chosen
    assert written["preset"] == "resnet-fashion-small-transformed"  # no preset has these layers
    assert f"with spread {chosen:g}" in capsys.readouterr().out
    # then the opening: the largest that keeps the accuracy within --opening-tolerance, each
    # candidate the network with mimetic queries and keys calibrated on 500 validation images
    openings = {float(o): a for o, a in record["opening_accuracy"].items()}
    images = data.val.images[:500].float() / 255.0
    for opening, value in openings.items():
        torch.manual_seed(0)
        candidate = transform_checkpoint(
            source, spread=chosen, opening=opening, gate="clamp", qk_init="mimetic",
            content_weight_decay=False, images=images,
        )  # fmt: skip
        assert value == pytest.approx(accuracy(candidate), abs=1e-9)
    opening, blurred = written["arguments"]["opening"], measured[chosen]
    assert record["positional_accuracy"] == blurred  # the content's cost is on top of the blur's
    assert record["opening"] == opening and openings[opening] >= blurred - 0.5
    assert all(value < blurred - 0.5 for o, value in openings.items() if o > opening)
    assert sorted(openings, reverse=True) == [o for o in sorted(openings, reverse=True)
                                              if o >= opening]  # fmt: skip
    assert {key: written["arguments"][key] for key in ("gate", "qk_init", "content_weight_decay")} \
        == {"gate": "clamp", "qk_init": "mimetic", "content_weight_decay": False}


def test_the_first_form_is_a_choice_of_options_and_skips_the_opening_search(cnn_run, tmp_path):
    from attnconv.convert import FIRST_FORM

    out = tmp_path / "t"
    argv = ["transform", str(cnn_run), "--out", str(out), "--spread", "3", "--gate", "clamp",
            "--opening", "0", "--qk-init", "default", "--qk-weight-decay"]  # fmt: skip
    assert main(argv) == 0
    record = json.loads((out / "transform.json").read_text())
    assert "opening_accuracy" not in record and "validation_accuracy" not in record
    written = load_checkpoint(out / "transformed.pt")
    assert {key: written["arguments"][key] for key in FIRST_FORM} == FIRST_FORM
    torch.manual_seed(0)
    expected = transform_checkpoint(load_checkpoint(cnn_run / "checkpoints" / "best.pt"),
                                    spread=3.0, **FIRST_FORM)  # fmt: skip
    assert all(torch.equal(written["model"][k], v) for k, v in expected["model"].items())


def test_the_parser_names_the_library_s_gates_starts_and_default_content_start():
    """The command's choices are written out so that its parser imports no torch: they must be
    the library's."""
    from attnconv.attention.transformed import GATES, QK_INITS
    from attnconv.cli import transform as command
    from attnconv.convert import CONTENT_START, FIRST_FORM
    from attnconv.models.presets import TCNN_FIRST_FORM  # the shipped tcnn-* weights' start

    assert command.GATES == GATES and command.QK_INITS == QK_INITS
    assert {k: CONTENT_START[k] for k in command.CONTENT_START} == command.CONTENT_START

    assert TCNN_FIRST_FORM == FIRST_FORM


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


SPREAD = "argument --spread: expected a finite number in (0, 1000]"
TOLERANCE = "argument --tolerance: expected a finite number in [0, 100]"
HEADS = "argument --content-heads: expected an integer in [1, 1024]"
QK = "argument --qk-dim: expected an integer in [1, 1024]"
BATCH = "argument --batch-size: expected an integer in [1, 1000000]"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--spread", "-1"], SPREAD),
        (["--spread", "inf"], SPREAD),  # issue 55: tracebacks, before
        (["--spread", "1e308"], SPREAD),
        (["--layers", "nowhere"], "--layers 'nowhere' matches no convolution; the convolutions"),
        (["--content-layers", "nosuch.*"], "--content-layers 'nosuch.*' matches no convolution"),
        (["--layers", "stages.3.*", "--content-layers", "stages.2.*"],
         "--content-layers selects none of the layers to transform (stages.3.0.conv1, "),
        (["--content-heads", "0"], HEADS),
        (["--content-heads", "-1"], HEADS),
        (["--content-heads", "100000"], HEADS),
        (["--content-heads", "10"], "--content-heads 10: the layers to transform have 9 heads"),
        (["--qk-dim", "0"], QK),
        (["--qk-dim", "-1"], QK),
        (["--qk-dim", str(10**9)], QK),  # a 72 GB allocation, before
        (["--batch-size", "0"], BATCH),
        (["--batch-size", "-1"], BATCH),
        (["--tolerance", "nan"], TOLERANCE),  # accepted, before (nan failed after the search)
        (["--tolerance", "-1"], TOLERANCE),
        (["--tolerance", "inf"], TOLERANCE),
        (["--tolerance", "1e308"], TOLERANCE),
        (["--opening", "1"], "argument --opening: expected a finite number in [0, 1)"),
        (["--opening", "nan"], "argument --opening: expected a finite number in [0, 1)"),
        (["--opening-tolerance", "-1"], "argument --opening-tolerance: expected a finite number"),
        (["--gate", "relu"], "argument --gate: invalid choice: 'relu'"),
        (["--qk-init", "eye"], "argument --qk-init: invalid choice: 'eye'"),
        (["--gate", "sigmoid", "--opening", "0"],
         "--opening 0: a sigmoid gate's opening must be in (0, 1), got 0"),
    ],
)
def test_bad_options_are_one_line(cnn_run, tmp_path, capsys, argv, message):
    assert main(["transform", str(cnn_run), "--out", str(tmp_path / "t"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not (tmp_path / "t").exists()


def test_an_out_that_holds_a_transform_is_refused_without_overwrite(cnn_run, tmp_path, capsys):
    """Issue 55: a second transform into the same --out silently replaced the first."""
    out = tmp_path / "t"
    assert main(["transform", str(cnn_run), "--out", str(out), "--spread", "3"]) == 0
    first = {name: (out / name).read_bytes() for name in ("transformed.pt", "transform.json")}
    capsys.readouterr()  # the opening search's lines
    assert main(["transform", str(cnn_run), "--out", str(out), "--spread", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {out} already holds a result" in err
    assert "give --overwrite" in err
    assert {name: (out / name).read_bytes() for name in first} == first
    assert json.loads((out / "transform.json").read_text())["spread"] == 3
    argv = ["transform", str(cnn_run), "--out", str(out), "--spread", "5", "--overwrite"]
    assert main(argv) == 0
    assert json.loads((out / "transform.json").read_text())["spread"] == 5


def test_a_cnn_built_for_another_image_size_than_its_dataset_is_refused(tmp_path, capsys):
    """Issue 55: a 28x28 CNN whose checkpoint says digits (8x8) went through the spread search
    at 10% on 8x8 images; eval and robustness refuse it, so does transform now."""
    from attnconv.models import create_model
    from viz_helpers import save_checkpoint

    path = save_checkpoint(
        tmp_path / "cnn.pt", create_model("resnet-fashion-small"), "resnet-fashion-small", {}
    )
    assert main(["transform", str(path), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was built for 28x28 images, but dataset 'digits' has 8x8" in err
    assert not (tmp_path / "t").exists()


def test_a_killed_transform_leaves_no_temporary_file_behind(cnn_run, tmp_path):
    """Issue 55: a transform SIGKILLed while writing left .transformed.pt.*.tmp for ever; the
    next transform into that folder removes it (a live writer's it leaves)."""
    import os
    import signal
    import subprocess
    import sys
    import traceback

    out = tmp_path / "t"
    pid = os.fork()
    if pid == 0:  # the child: killed when transformed.pt is complete under its temporary name
        try:
            real_replace = os.replace

            def replace(src, dst, *args, **kwargs):
                if os.path.basename(dst) == "transformed.pt":
                    os.kill(os.getpid(), signal.SIGKILL)
                real_replace(src, dst, *args, **kwargs)

            os.replace = replace
            main(["transform", str(cnn_run), "--out", str(out), "--spread", "3"])
        except BaseException:
            traceback.print_exc()
        os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    left = [path.name for path in out.iterdir()]
    assert len(left) == 1 and left[0].startswith(".transformed.pt.") and left[0].endswith(".tmp")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / f".transform.json.{live.pid}-abc123.tmp").write_text("{")  # a live writer's
        assert main(["transform", str(cnn_run), "--out", str(out), "--spread", "3"]) == 0
        assert sorted(path.name for path in out.iterdir()) == [
            f".transform.json.{live.pid}-abc123.tmp", "transform.json", "transformed.pt"
        ]
    finally:
        live.kill()
        live.wait()


def test_a_transformed_checkpoint_is_refused(cnn_run, tmp_path, capsys):
    assert main(["transform", str(cnn_run), "--out", str(tmp_path / "a"), "--spread", "3"]) == 0
    again = ["transform", str(tmp_path / "a" / "transformed.pt"), "--out", str(tmp_path / "b")]
    assert main(again) == 2
    assert "already holds a transformed network" in capsys.readouterr().err
