"""`attnconv train`: typed flags straight into the config, --init read once, resume from the
checkpoint's config alone."""

import importlib
import json

import pytest
import torch

from attnconv.cli import main
from attnconv.models import checkpoint as checkpoint_module
from attnconv.models.checkpoint import load_checkpoint
from attnconv.train import loop
from train_helpers import QUIET, TINY

pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.fixture
def captured(monkeypatch):
    calls = []
    monkeypatch.setattr(loop, "train", lambda *args, **kwargs: calls.append((args, kwargs)))
    return calls


def test_typed_flags_become_typed_values(captured, tmp_path):
    argv = ["train", "--preset", "quick", "--epochs", "3", "--compile", "--device", "cpu",
            "--precision", "bf16", "--out", str(tmp_path / "run"), "lr=0.05"]
    assert main(argv) == 0
    ((args, kwargs),) = captured
    config = args[0]
    assert (config.epochs, config.compile, config.device, config.precision, config.lr) == (
        3, True, "cpu", "bf16", 0.05)
    assert config.dataset == "digits" and kwargs["init_checkpoint"] is None
    assert kwargs["epoch_figure"].__name__ == "attention_figure"


def test_a_flag_and_an_override_of_the_same_key_are_refused(captured, capsys):
    assert main(["train", "--preset", "quick", "--epochs", "3", "epochs=4"]) == 2
    assert "epochs is given twice" in capsys.readouterr().err and not captured


def test_epochs_must_be_an_integer(capsys):
    assert main(["train", "--preset", "quick", "--epochs", "3.5"]) == 2
    err = capsys.readouterr().err
    assert "argument --epochs: expected an integer in [1, 1000000], got '3.5'" in err
    assert err.count("\n") == 1


def test_init_checkpoint_is_loaded_once(captured, monkeypatch, tmp_path):
    loaded = []
    fake = {"preset": "quadratic-generalized", "dataset": "fashion-mnist"}
    # `attnconv train` imports viz.figures, whose modules bind load_checkpoint when first
    # imported: import them before the patch, so that it does not outlive this test
    importlib.import_module("attnconv.viz.figures")
    monkeypatch.setattr(checkpoint_module, "load_checkpoint", lambda path: loaded.append(path) or fake)
    init = tmp_path / "g.pt"
    init.write_bytes(b"")  # an existing file: what --init reads is load_checkpoint's (patched)
    argv = ["train", "--preset", "quadratic-generalized-pruned", "--init", str(init),
            "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    ((args, kwargs),) = captured
    assert loaded == [str(init)] and kwargs["init_checkpoint"] is fake
    assert (args[0].dataset, args[0].init) == ("fashion-mnist", str(init))  # its dataset


def test_resume_uses_the_checkpoint_config_not_an_edited_config_json(tmp_path, capsys):
    """config.json is the copy for people to read: editing it changes nothing (a note says so and
    it is rewritten); the run continues with the config saved in last.pt."""
    run_dir = tmp_path / "run"
    assert main(["train", "--preset", "quick", "--epochs", "1", "--out", str(run_dir), *TINY, *QUIET]) == 0
    (run_dir / "summary.json").unlink()  # as if killed before the test of the best checkpoint
    original = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**original, "epochs": 9, "lr": 5.0}))
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert "config.json differs from the config saved in" in err and "(epochs, lr)" in err
    assert json.loads((run_dir / "config.json").read_text()) == original
    assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 1  # not 9
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["epoch"] == 1


def test_resume_takes_no_other_options_but_epochs(captured, tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "argument --resume: expected a run folder to resume: it has no checkpoints/last.pt" in (
        capsys.readouterr().err
    )
    last = tmp_path / "checkpoints" / "last.pt"
    last.parent.mkdir()
    last.touch()
    for flag in (["--precision", "fp32"], ["lr=0.5"], ["--out", "x"], ["--dataset", "digits"]):
        assert main(["train", "--resume", str(tmp_path), *flag]) == 2
        assert "takes no other options" in capsys.readouterr().err
    assert not captured
    assert main(["train", "--resume", str(tmp_path), "--epochs", "3"]) == 0
    assert main(["train", "--resume", str(tmp_path)]) == 0
    (first, second) = captured
    assert first[0][0] is None and first[1]["resume"] and first[1]["epochs"] == 3
    assert second[1]["epochs"] is None  # a plain resume keeps the saved length


def test_a_new_run_passes_epochs_in_its_config_not_as_an_extension(captured, tmp_path):
    assert main(["train", "--preset", "quick", "--epochs", "3", "--out", str(tmp_path / "r")]) == 0
    ((args, kwargs),) = captured
    assert args[0].epochs == 3 and kwargs["epochs"] is None and not kwargs["resume"]


# the tcnn-* presets' content start (their shipped weights'), as attnconv transform's options
PRESET_START = ["--gate", "clamp", "--opening", "0", "--qk-init", "default", "--qk-weight-decay"]


def test_a_tcnn_preset_transforms_a_cnn_init_as_attnconv_transform_does(captured, tmp_path):
    """`train --preset tcnn-fashion-small --init pretrained:resnet-fashion-small seed=S` starts from
    the network `attnconv transform --pretrained resnet-fashion-small --spread 3 --seed S` writes:
    the same layers, spread and query/key weights."""
    argv = ["train", "--preset", "tcnn-fashion-small", "--init", "pretrained:resnet-fashion-small",
            "--out", str(tmp_path / "run"), "seed=3"]  # fmt: skip
    assert main(argv) == 0
    ((args, kwargs),) = captured
    init = kwargs["init_checkpoint"]
    assert args[0].init == "pretrained:resnet-fashion-small" and args[0].seed == 3
    assert init["architecture"] == "transformed" and init["preset"] == "tcnn-fashion-small"
    assert main(["transform", "--pretrained", "resnet-fashion-small", "--spread", "3",
                 "--seed", "3", "--out", str(tmp_path / "t"), *PRESET_START]) == 0  # fmt: skip
    written = load_checkpoint(tmp_path / "t" / "transformed.pt")
    assert written["arguments"] == init["arguments"] and written["preset"] == init["preset"]
    assert written["model"].keys() == init["model"].keys()
    for key, value in written["model"].items():
        assert torch.equal(value, init["model"][key]), key
    assert main(["transform", "--pretrained", "resnet-fashion-small", "--spread", "3",
                 "--seed", "4", "--out", str(tmp_path / "t4"), *PRESET_START]) == 0  # fmt: skip
    other = load_checkpoint(tmp_path / "t4" / "transformed.pt")["model"]
    key = "network.stages.3.0.conv1.query.weight"
    assert not torch.equal(other[key], init["model"][key])  # the seed draws them


def test_the_shipped_recipe_by_name_trains_what_shipped_with_the_given_settings_on_top(
    captured, monkeypatch, tmp_path, capsys
):
    argv = ["train", "--preset", "learned-fashion", "--recipe", "shipped", "--out",
            str(tmp_path / "a"), "seed=2"]  # fmt: skip
    assert main(argv) == 0
    ((args, _),) = captured
    config = args[0]
    assert (config.epochs, config.precision, config.seed) == (22, "fp32", 2)
    assert config.model == {"weight_init": "fan_in", "positional_init": "original"}
    # a flag replaces the recorded setting of its key
    assert main([*argv[:-1], "--precision", "bf16", "--epochs", "3", "--out", str(tmp_path / "b")]) == 0
    assert (captured[1][0][0].precision, captured[1][0][0].epochs) == ("bf16", 3)
    # a recorded stop and resume is trained the same way
    planned = []
    monkeypatch.setattr(loop, "train_in_plans", lambda *a, **k: planned.append(a))
    content = ["train", "--preset", "learned-content-fashion", "--recipe", "shipped", "--out",
               str(tmp_path / "c")]  # fmt: skip
    assert main(content) == 0
    ((config, _, plans),) = planned
    assert (config.epochs, config.precision, plans) == (18, "bf16", [(18, 1), (22, 22)])
    assert main(["train", "--preset", "quick", "--recipe", "shipped"]) == 2
    assert "preset 'quick' has no shipped recipe" in capsys.readouterr().err


@pytest.mark.parametrize("hidden", ["99999999999999999999", "1000000000000"])
def test_a_model_override_too_large_to_build_is_one_line(tmp_path, capsys, hidden):
    """Too large for a tensor size (an overflow in torch's C++, whose message carries its stack
    frames) or for the memory: one line naming the override, exit status 2."""
    argv = ["train", "--preset", "quick", "--out", str(tmp_path / "r"), f"model.hidden={hidden}"]
    assert main([*argv, *QUIET]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(
        f"attnconv train: error: model.hidden={hidden}: the 'quick' model cannot be built on "
        f"digits with it ("
    )
