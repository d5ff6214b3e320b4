"""The precision a training run or an evaluation resolves to, recorded where it ran, with the
hardware query replaced (a CPU without native bfloat16, and one with it)."""

import io
import json
import sys
from pathlib import Path

import pytest
import torch

from attnconv import cli, hardware
from attnconv.models.checkpoint import load_checkpoint
from attnconv.train.config import resolve_config
from attnconv.train.loop import autocast, train

TINY = [
    "epochs=1",
    "model.hidden=16",
    "model.depth=1",
    "model.heads=2",
    "model.head_dim=8",
    "model.mlp_dim=32",
    "batch_size=128",
    "tensorboard=false",
    "progress=false",
    "device=cpu",
]
ZEN3 = {"avx2": True, "avx512_f": False, "avx512_bf16": False, "amx_bf16": False}
ZEN5 = {"avx2": True, "avx512_f": True, "avx512_bf16": True, "amx_bf16": False}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(tmp_path: Path, monkeypatch, features: dict, *overrides: str) -> tuple[dict, dict, str]:
    """``(config.json, summary.json, the precision in last.pt's config)`` of a tiny run."""
    monkeypatch.setattr(hardware, "cpu_features", lambda: dict(features))
    run_dir = tmp_path / "run"
    train(resolve_config("quick", overrides=[*TINY, *overrides]), run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    saved = load_checkpoint(run_dir / "checkpoints" / "last.pt")["config"]["precision"]
    return config, summary, saved


@pytest.mark.parametrize(("features", "expected"), [(ZEN3, "fp32"), (ZEN5, "bf16")])
def test_auto_run_records_the_precision_it_ran_in(
    tmp_path, monkeypatch, capsys, features, expected
) -> None:
    config, summary, saved = run(tmp_path, monkeypatch, features)
    assert config["precision"] == summary["precision"] == saved == expected
    output = capsys.readouterr()
    assert f"precision {expected} (auto)" in output.out
    assert "slow" not in output.err


def test_auto_on_a_cpu_without_bf16_trains_exactly_like_fp32(tmp_path, monkeypatch) -> None:
    run(tmp_path / "auto", monkeypatch, ZEN3)
    run(tmp_path / "fp32", monkeypatch, ZEN3, "precision=fp32")
    auto = load_checkpoint(tmp_path / "auto" / "run" / "checkpoints" / "last.pt")["model"]
    fp32 = load_checkpoint(tmp_path / "fp32" / "run" / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(auto[key], fp32[key]) for key in fp32)


def test_explicit_bf16_on_a_cpu_without_it_warns_once(tmp_path, monkeypatch, capsys) -> None:
    config, summary, _ = run(tmp_path, monkeypatch, ZEN3, "precision=bf16")
    assert config["precision"] == summary["precision"] == "bf16"
    err = capsys.readouterr().err
    assert err.count("will be slow") == 1, err


@pytest.mark.parametrize(("features", "expected"), [(ZEN3, "fp32"), (ZEN5, "bf16")])
def test_eval_resolves_auto_and_says_which(
    tmp_path, monkeypatch, capsys, features, expected
) -> None:
    run(tmp_path, monkeypatch, ZEN3, "precision=fp32")
    monkeypatch.setattr(hardware, "cpu_features", lambda: dict(features))
    best = tmp_path / "run" / "checkpoints" / "best.pt"
    capsys.readouterr()
    assert cli.main(["eval", str(best), "--device", "cpu"]) == 0
    assert f"images, {expected}): accuracy" in capsys.readouterr().out


def test_autocast_refuses_an_unresolved_precision() -> None:
    with pytest.raises(ValueError, match="resolved precision, fp32 or bf16, got 'auto'"):
        autocast("auto", torch.device("cpu"))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [False, True])
def test_progress_bar_only_on_a_terminal(tmp_path, monkeypatch, capsys, terminal) -> None:
    """In a log file (captured stderr is not a terminal) each epoch is one line, no redraws."""
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    overrides = [*TINY, "epochs=2", "progress=true", "precision=fp32"]
    train(resolve_config("quick", overrides=overrides), tmp_path / "run")
    out = capsys.readouterr().out
    assert [line.split("  ")[0] for line in out.splitlines() if line.startswith("epoch ")] == [
        "epoch 1/2",
        "epoch 2/2",
    ]
    # 1294 training images // 128 = 10 steps an epoch: the bar redraws at least once per epoch.
    redraws = stderr.getvalue().count("\r")
    assert redraws >= 2 if terminal else redraws == 0


@pytest.mark.needs_fashion_mnist
def test_eval_of_a_shipped_model_runs_in_fp32_the_precision_of_its_stated_figure(
    monkeypatch, capsys
) -> None:
    """Where auto would pick bfloat16, --pretrained still runs in float32 unless asked, and says
    that the stated figure is float32's; asked for auto, it says what it ran in."""
    from attnconv.models.pretrained import pretrained_info
    from attnconv.train import loop

    accuracy = pretrained_info("quadratic-fashion").test_accuracy
    stated = f"{accuracy:.4f}"
    precisions = []

    def counted(model, loader, precision):  # the evaluation itself is the loop's, tested there
        precisions.append(precision)
        return [2300.0, accuracy * 10000, 10000.0]

    monkeypatch.setattr(loop, "evaluation_sums", counted)
    monkeypatch.setattr(hardware, "cpu_features", lambda: dict(ZEN5))
    name = f"quadratic-fashion (shipped; stated test accuracy {stated}, measured in fp32)"
    assert cli.main(["eval", "--pretrained", "quadratic-fashion", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"{name} on fashion-mnist test (10000 images, fp32): accuracy {stated}" in out
    assert "note" not in out
    argv = ["eval", "--pretrained", "quadratic-fashion", "--device", "cpu", "--precision", "auto"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"(10000 images, bf16): accuracy {stated}" in out
    assert "note: run in bf16, so it may differ from the stated fp32 figure" in out
    assert precisions == ["fp32", "bf16"]
