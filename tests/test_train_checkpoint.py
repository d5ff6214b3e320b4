"""train/checkpoint.py: the RNG states a training checkpoint carries, and the moved name's alias."""

import warnings

import pytest
import torch

from attnconv import errors
from attnconv.models import checkpoint
from attnconv.train import checkpoint as training_state
from attnconv.train.checkpoint import rng_state, set_rng_state


def test_rng_state_round_trip() -> None:
    torch.manual_seed(123)
    state = rng_state()
    first = torch.rand(5)
    torch.rand(100)
    set_rng_state(state)
    assert torch.equal(torch.rand(5), first)
    assert state["torch"].dtype == torch.uint8 and state["cuda"] == []


def test_a_gpu_runs_state_restores_its_cpu_stream_on_a_machine_without_cuda(monkeypatch) -> None:
    """A run trained on a GPU and resumed on a CPU: the CPU stream continues exactly, and the
    CUDA states it cannot restore are named in a warning rather than failing the resume."""
    torch.manual_seed(7)
    state = {**rng_state(), "cuda": [torch.zeros(16, dtype=torch.uint8)] * 2}
    first = torch.rand(5)
    torch.rand(100)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(
        UserWarning, match=r"2 CUDA device\(s\) and this machine has 0: the states of devices 0..1"
    ):
        set_rng_state(state)
    assert torch.equal(torch.rand(5), first)


def test_the_old_load_model_name_warns_once_and_is_the_new_one(monkeypatch) -> None:
    monkeypatch.setattr(errors, "_warned", set())
    with pytest.warns(DeprecationWarning, match="moved to attnconv.models.checkpoint.load_model"):
        from attnconv.train.checkpoint import load_model
    assert load_model is checkpoint.load_model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert training_state.load_model is checkpoint.load_model
    with pytest.raises(AttributeError, match="has no attribute 'save_checkpoint'"):
        training_state.save_checkpoint  # noqa: B018
