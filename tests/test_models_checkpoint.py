"""Checkpoint files: atomic writes, safe loading, clear errors, model rebuilding, RNG state."""

import os
import pickle
import re
from pathlib import Path

import pytest
import torch

from attnconv.models import create_model
from attnconv.models.checkpoint import (
    FORMAT,
    load_checkpoint,
    load_model,
    rng_state,
    save_checkpoint,
    set_rng_state,
)

TINY = {"hidden": 8, "depth": 2, "heads": 2, "head_dim": 4, "mlp_dim": 16}


def tiny_checkpoint(**extra) -> dict:
    torch.manual_seed(0)
    model_config = {"num_classes": 10, **TINY}
    model = create_model("quick", **model_config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.rand(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    return {"preset": "quick", "dataset": "digits", "model_config": model_config,
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "rng": [rng_state()], "epoch": 1, "step": 20, "config": {"lr": 0.1},
            "metrics": [{"epoch": 1, "val_acc": 0.5}], **extra}


def test_round_trip_with_weights_only(tmp_path) -> None:
    checkpoint = tiny_checkpoint()
    path = tmp_path / "ckpt" / "last.pt"
    save_checkpoint(checkpoint, path)
    raw = torch.load(path, weights_only=True)  # no code runs on load
    assert raw["format"] == FORMAT and raw["version"] == 1
    loaded = load_checkpoint(path)
    for name, tensor in checkpoint["model"].items():
        assert torch.equal(loaded["model"][name], tensor)
    momentum = checkpoint["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(loaded["optimizer"]["state"][0]["momentum_buffer"], momentum)
    assert loaded["metrics"] == checkpoint["metrics"] and loaded["step"] == 20
    assert sorted(os.listdir(path.parent)) == ["last.pt"]  # no temporary file left behind


def test_load_model_rebuilds_the_architecture(tmp_path) -> None:
    checkpoint = tiny_checkpoint()
    save_checkpoint(checkpoint, tmp_path / "a.pt")
    model, loaded = load_model(tmp_path / "a.pt")
    assert not model.training and loaded["preset"] == "quick"
    reference = create_model("quick", num_classes=10, **TINY)
    reference.load_state_dict(checkpoint["model"])
    x = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(model(x), reference.eval()(x), rtol=0, atol=0)


def test_pruned_model_config_rebuilds_pruned_shapes(tmp_path) -> None:
    model = create_model("quick", num_classes=10, **TINY)
    model.attention_layers()[0].prune_heads([1])
    config = {"num_classes": 10, **TINY, "heads": model.heads_per_layer()}
    save_checkpoint({"preset": "quick", "dataset": "digits", "model_config": config,
                     "model": model.state_dict()}, tmp_path / "p.pt")
    rebuilt, _ = load_model(tmp_path / "p.pt")
    assert rebuilt.heads_per_layer() == [1, 2]


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
        save_checkpoint({"preset": "quick", "model": Unpicklable()}, good)
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
    with pytest.raises(ValueError, match="format version 99"):
        load_checkpoint(tmp_path / "future.pt")
    torch.save({"format": FORMAT, "version": 1, "preset": "quick"}, tmp_path / "partial.pt")
    with pytest.raises(ValueError, match=re.escape("partial.pt lacks dataset, model_config, model")):
        load_checkpoint(tmp_path / "partial.pt")


class Payload:
    """An arbitrary class: unpickling it would run code, so weights_only loading refuses it."""


def test_pickled_objects_are_refused(tmp_path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "version": 1, "payload": Payload()}, path)
    with pytest.raises(ValueError, match=re.escape("evil.pt holds Python objects other than tensors")) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "weights_only" not in message and "\x1b" not in message and "\n" not in message


def test_rng_state_round_trip() -> None:
    torch.manual_seed(123)
    state = rng_state()
    first = torch.rand(5)
    torch.rand(100)
    set_rng_state(state)
    assert torch.equal(torch.rand(5), first)
    assert state["torch"].dtype == torch.uint8 and state["cuda"] == []


FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint-v1"


def test_version_1_checkpoint_still_gives_its_logits() -> None:
    model, checkpoint = load_model(FIXTURE / "quick-digits.pt")
    expected = torch.load(FIXTURE / "quick-digits-logits.pt", weights_only=True)
    assert checkpoint["version"] == 1 and checkpoint["step"] == 22
    with torch.no_grad():
        torch.testing.assert_close(model(expected["images"]), expected["logits"], rtol=0, atol=0)
