"""Checkpoint files: atomic writes, safe loading, clear errors, rebuilding from full arguments, and
the version-1 files written before checkpoints stored them."""

import dataclasses
import inspect
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from attnconv import cli
from attnconv.models import MODELS, PRESETS, create_model
from attnconv.models.checkpoint import (
    FORMAT,
    CheckpointError,
    checkpoint_name,
    load_checkpoint,
    load_model,
    rebuild,
    save_checkpoint,
)
from attnconv.models.presets import preset_arguments
from attnconv.runs import RunDir
from attnconv.train.checkpoint import rng_state

TINY = {"hidden": 8, "depth": 2, "heads": 2, "head_dim": 4, "mlp_dim": 16}
FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint-v1"


def model_entries(preset: str = "quick", **overrides) -> tuple[torch.nn.Module, dict]:
    """A fresh model of ``preset`` and the entries that describe it in a checkpoint."""
    architecture, arguments = preset_arguments(preset, **overrides)
    model = MODELS[architecture](**arguments)
    return model, {"preset": preset, "dataset": "digits", "architecture": architecture,
                   "arguments": arguments, "model": model.state_dict()}


def tiny_checkpoint(**extra) -> dict:
    torch.manual_seed(0)
    model, entries = model_entries(**TINY)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.rand(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    return {**entries, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "rng": [rng_state()], "epoch": 1, "step": 20, "config": {"lr": 0.1},
            "metrics": [{"epoch": 1, "val_acc": 0.5}], **extra}


def test_round_trip_with_weights_only(tmp_path) -> None:
    checkpoint = tiny_checkpoint()
    path = tmp_path / "ckpt" / "last.pt"
    save_checkpoint(checkpoint, path)
    raw = torch.load(path, weights_only=True)  # no code runs on load
    assert raw["format"] == FORMAT and raw["version"] == 2 and "scheduler" not in raw
    loaded = load_checkpoint(path)
    for name, tensor in checkpoint["model"].items():
        assert torch.equal(loaded["model"][name], tensor)
    momentum = checkpoint["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(loaded["optimizer"]["state"][0]["momentum_buffer"], momentum)
    assert loaded["metrics"] == checkpoint["metrics"] and loaded["step"] == 20
    assert sorted(os.listdir(path.parent)) == ["last.pt"]  # no temporary file left behind


def test_the_arguments_are_every_constructor_argument(tmp_path) -> None:
    save_checkpoint(tiny_checkpoint(), tmp_path / "a.pt")
    arguments = load_checkpoint(tmp_path / "a.pt")["arguments"]
    assert list(arguments) == list(inspect.signature(MODELS["image_transformer"]).parameters)
    assert arguments["hidden"] == 8 and arguments["stem"] == 1  # an override, the preset's
    assert arguments["content"] is False and arguments["max_size"] == 32  # the defaults


def test_load_model_rebuilds_the_architecture(tmp_path) -> None:
    checkpoint = tiny_checkpoint()
    save_checkpoint(checkpoint, tmp_path / "a.pt")
    model, loaded = load_model(tmp_path / "a.pt")
    assert not model.training and loaded["architecture"] == "image_transformer"
    reference = create_model("quick", num_classes=10, **TINY)
    reference.load_state_dict(checkpoint["model"])
    x = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(model(x), reference.eval()(x), rtol=0, atol=0)


def test_editing_a_preset_does_not_change_how_a_checkpoint_loads(tmp_path, monkeypatch) -> None:
    save_checkpoint(tiny_checkpoint(), tmp_path / "a.pt")
    before, _ = load_model(tmp_path / "a.pt")
    quick = PRESETS["quick"]
    edited = dataclasses.replace(quick, model_kwargs={**quick.model_kwargs, "stem": 2, "hidden": 32})
    monkeypatch.setitem(PRESETS, "quick", edited)
    after, _ = load_model(tmp_path / "a.pt")
    x = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(after(x), before(x), rtol=0, atol=0)


def test_pruned_arguments_rebuild_pruned_shapes(tmp_path) -> None:
    model, entries = model_entries(**TINY)
    model.attention_layers()[0].prune_heads([1])
    entries["arguments"]["heads"] = model.heads_per_layer()
    save_checkpoint({**entries, "model": model.state_dict()}, tmp_path / "p.pt")
    rebuilt, _ = load_model(tmp_path / "p.pt")
    assert rebuilt.heads_per_layer() == [1, 2]


def test_rebuild_errors_name_the_source() -> None:
    _, entries = model_entries(**TINY)
    state, arguments = entries["model"], entries["arguments"]
    with pytest.raises(CheckpointError, match=r"^f\.pt holds a model of architecture 'vit'"):
        rebuild("vit", arguments, state, "f.pt")
    with pytest.raises(CheckpointError, match=r"^f\.pt: its arguments do not build"):
        rebuild("image_transformer", {**arguments, "colour": "red"}, state, "f.pt")
    with pytest.raises(CheckpointError, match=r"do not fit .*\(size mismatch for "):
        rebuild("image_transformer", {**arguments, "hidden": 16}, state, "f.pt")
    missing = {k: v for k, v in state.items() if not k.startswith("classifier.")}
    with pytest.raises(CheckpointError, match=r"\(missing: classifier\.weight, classifier\.bias; unexpected: none\)"):
        rebuild("image_transformer", arguments, missing, "f.pt")
    with pytest.raises(ValueError, match="a checkpoint needs architecture, arguments"):
        save_checkpoint({"preset": "quick", "dataset": "digits", "model": state}, "never.pt")


SMALL = {
    "image_transformer": {"hidden": 16, "depth": 1, "heads": 4, "head_dim": 4, "mlp_dim": 16},
    "resnet18": {"widths": (4, 4, 4, 4)},
    "vision_transformer": {"hidden": 16, "depth": 1, "heads": 4, "head_dim": 4, "mlp_dim": 16},
    "transformed": {"base_arguments": {"in_channels": 1, "image_size": (16, 16), "mean": (0.5,),
                                       "std": (0.25,), "widths": (4, 4, 8, 8)}},
}  # fmt: skip


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_round_trips(tmp_path, preset) -> None:
    torch.manual_seed(0)
    model, entries = model_entries(preset, **SMALL[PRESETS[preset].model])
    with torch.no_grad():  # move every parameter off its initial value
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    save_checkpoint({**entries, "model": model.state_dict()}, tmp_path / "m.pt")
    loaded, checkpoint = load_model(tmp_path / "m.pt")
    assert checkpoint["arguments"] == entries["arguments"]
    images = torch.rand(2, model.in_channels, *model.image_size)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model.eval()(images), rtol=0, atol=0)


class Unpicklable:
    """Fails half-way through ``torch.save``, like a crash in the middle of a write."""

    def __reduce__(self):
        raise pickle.PicklingError("this object cannot be saved")


def test_truncated_checkpoint_names_the_file_and_keeps_the_previous_one(tmp_path) -> None:
    good = tmp_path / "last.pt"
    save_checkpoint(tiny_checkpoint(), good)
    data = good.read_bytes()
    broken = tmp_path / "broken.pt"
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=re.escape(f"checkpoint {broken} is corrupted or truncated")):
        load_checkpoint(broken)
    # A write that dies half-way (here: an object torch cannot save) leaves the old file intact.
    with pytest.raises(pickle.PicklingError):
        save_checkpoint(tiny_checkpoint(model=Unpicklable()), good)
    assert good.read_bytes() == data
    assert load_checkpoint(good)["step"] == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.pt", "last.pt"]


def test_bad_files_get_clear_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"checkpoint .*nothing\.pt does not exist"):
        load_checkpoint(tmp_path / "nothing.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=re.escape("other.pt is not an attnconv checkpoint")):
        load_checkpoint(tmp_path / "other.pt")
    torch.save({"format": FORMAT, "version": 99}, tmp_path / "future.pt")
    with pytest.raises(ValueError, match=r"format version 99; this attnconv reads versions 1 to 2"):
        load_checkpoint(tmp_path / "future.pt")
    torch.save({"format": FORMAT, "version": 2, "preset": "quick"}, tmp_path / "partial.pt")
    with pytest.raises(ValueError, match=re.escape("partial.pt lacks dataset, architecture, arguments, model")):
        load_checkpoint(tmp_path / "partial.pt")
    torch.save({"format": FORMAT, "version": 1, "preset": "quick"}, tmp_path / "partial1.pt")
    with pytest.raises(ValueError, match=re.escape("partial1.pt lacks dataset, model_config, model")):
        load_checkpoint(tmp_path / "partial1.pt")


class Payload:
    """An arbitrary class: unpickling it would run code, so weights_only loading refuses it."""


def test_pickled_objects_are_refused(tmp_path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "version": 2, "payload": Payload()}, path)
    with pytest.raises(ValueError, match=re.escape("evil.pt holds Python objects other than tensors")) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "weights_only" not in message and "\x1b" not in message and "\n" not in message


# ---------------------------------------------------------------------------- version 1


def test_version_1_checkpoint_still_gives_its_logits() -> None:
    model, checkpoint = load_model(FIXTURE / "quick-digits.pt")
    expected = torch.load(FIXTURE / "quick-digits-logits.pt", weights_only=True)
    assert checkpoint["version"] == 1 and checkpoint["step"] == 22
    assert "model_config" not in checkpoint and "scheduler" not in checkpoint
    assert checkpoint["architecture"] == "image_transformer"
    assert checkpoint["arguments"] == preset_arguments(
        "quick", hidden=8, depth=1, heads=4, head_dim=4, mlp_dim=16, num_classes=10,
        in_channels=1, image_size=(8, 8), mean=checkpoint["arguments"]["mean"],
        std=checkpoint["arguments"]["std"])[1]
    with torch.no_grad():
        # Recorded on another CPU: float32 sums there may round differently in the last bits.
        torch.testing.assert_close(
            model(expected["images"]), expected["logits"], rtol=1e-5, atol=1e-6
        )


def test_version_1_checkpoint_resaved_is_version_2_with_the_same_model(tmp_path) -> None:
    checkpoint = load_checkpoint(FIXTURE / "quick-digits.pt")
    save_checkpoint(checkpoint, tmp_path / "v2.pt")
    raw = torch.load(tmp_path / "v2.pt", weights_only=True)
    assert raw["version"] == 2 and raw["arguments"] == checkpoint["arguments"]
    assert "model_config" not in raw and "scheduler" not in raw
    model, _ = load_model(tmp_path / "v2.pt")
    expected = torch.load(FIXTURE / "quick-digits-logits.pt", weights_only=True)
    with torch.no_grad():
        # Recorded on another CPU: float32 sums there may round differently in the last bits.
        torch.testing.assert_close(
            model(expected["images"]), expected["logits"], rtol=1e-5, atol=1e-6
        )


def test_version_1_checkpoint_of_an_unknown_preset_says_why(tmp_path) -> None:
    raw = torch.load(FIXTURE / "quick-digits.pt", weights_only=True)
    torch.save({**raw, "preset": "gone"}, tmp_path / "gone.pt")
    with pytest.raises(CheckpointError, match=r"does not build a 'gone' model .*unknown preset 'gone'"):
        load_checkpoint(tmp_path / "gone.pt")


def test_commands_accept_a_version_1_checkpoint(tmp_path, capsys) -> None:
    assert cli.main(["eval", str(FIXTURE / "quick-digits.pt"), "--split", "val"]) == 0
    assert "quick-digits.pt (quick, epoch 2) on digits val" in capsys.readouterr().out
    run = RunDir(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    shutil.copy(FIXTURE / "quick-digits.pt", run.last)
    assert cli.main(["plot", str(run.root), "--out", str(tmp_path / "figures")]) == 0
    assert (tmp_path / "figures" / "contours.png").is_file()
    assert cli.main(["heads", str(run.last)]) == 0
    assert "preset quick, epoch 2" in capsys.readouterr().out


def test_a_checkpoint_is_named_by_its_preset_and_the_epochs_it_trained(tmp_path, capsys):
    """``attnconv transform`` writes a transformed network with no epoch: it says so, where the
    commands printed "epoch ?" before."""
    from attnconv.convert import transform_checkpoint

    architecture, arguments = preset_arguments(
        "resnet-fashion-small", in_channels=1, image_size=(16, 16), widths=(4, 8, 8, 16)
    )
    cnn = {"preset": "resnet-fashion-small", "dataset": "fashion-mnist", "architecture":
           architecture, "arguments": arguments, "model": MODELS[architecture](**arguments)
           .state_dict(), "epoch": 7}  # fmt: skip
    transformed = transform_checkpoint(cnn, spread=3.0, preset="tcnn-fashion-small")
    assert checkpoint_name(cnn) == "resnet-fashion-small, epoch 7"
    assert checkpoint_name(transformed) == "tcnn-fashion-small, transformed, not fine-tuned"
    assert checkpoint_name({**transformed, "epoch": 2}) == "tcnn-fashion-small, epoch 2"
    untrained = {key: value for key, value in cnn.items() if key != "epoch"}
    assert checkpoint_name(untrained) == "resnet-fashion-small, no epoch recorded"
    path = tmp_path / "transformed.pt"
    save_checkpoint(transformed, path)
    assert cli.main(["heads", str(path), "--images", "0"]) == 0  # no content diagnostics
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"{path}: preset tcnn-fashion-small, transformed, not fine-tuned"
