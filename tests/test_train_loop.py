"""The training loop end to end on the embedded digits with tiny models: exactness against an
independent SGD loop, reproducibility, SIGKILL + resume, two-process DDP, divergence, pruning
fine-tune, `attnconv eval`, and one-line errors for bad input."""

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnconv import cli
from attnconv.data import BatchLoader, load_splits
from attnconv.errors import UserError
from attnconv.hardware import machine_description
from attnconv.models import ImageTransformer, create_model
from attnconv.models.checkpoint import load_checkpoint, load_model, save_checkpoint
from attnconv.models.presets import preset_arguments
from attnconv.runs import RunDir
from attnconv.train import loop
from attnconv.train.config import TrainConfig, resolve_config
from attnconv.train.loop import NonFiniteLossError, train
from train_helpers import QUIET, TINY, command_config, without_bookkeeping

pytestmark = pytest.mark.usefixtures("one_thread")

NO_DROPOUT = ["model.dropout=0", "model.attention_dropout=0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_cli(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnconv", *argv],
        env=ENV,
        timeout=timeout,
        capture_output=True,
        text=True,
    )


def weights(run_dir: Path, name: str = "last.pt") -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / name)["model"]


def assert_same_weights(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if atol == 0.0:
            assert torch.equal(a[key], b[key]), key
        else:
            torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0, msg=key)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 2-epoch run of a tiny `quick` model (shared by the read-only tests)."""
    run_dir = tmp_path_factory.mktemp("runs") / "quick"
    train(resolve_config("quick", overrides=["epochs=2", *TINY, *QUIET]), run_dir)
    return run_dir


# ---------------------------------------------------------------------------- the loop itself


def warmup_cosine_rate(peak: float, step: int, steps: int) -> float:
    """The rate of update ``step`` of ``steps``, written out: 5% linear warm-up to ``peak``
    (the first update already positive), then cosine decay to 0."""
    warmup = math.ceil(0.05 * steps)
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))


def test_one_epoch_equals_an_independent_sgd_loop(tmp_path) -> None:
    """Plain SGD (momentum 0, no weight decay, no dropout) with the closed-form cosine rate."""
    overrides = [
        *TINY,
        *NO_DROPOUT,
        *QUIET,
        "epochs=1",
        "momentum=0",
        "weight_decay=0",
        "batch_size=100",
        "lr=0.05",
    ]
    train(resolve_config("quick", overrides=overrides), tmp_path / "run")

    data = load_splits("digits")
    torch.manual_seed(0)  # the loop seeds the initial weights with config.seed
    model = create_model(
        "quick",
        **loop.data_model_config(data),
        **resolve_config("quick", overrides=TINY + NO_DROPOUT).model,
    )
    loader = BatchLoader(data.train, 100, device="cpu", train=True, flip=False, pad=1, seed=0)
    steps = len(loader)
    for step, (images, labels) in enumerate(loader.epoch(0)):
        lr = warmup_cosine_rate(0.05, step, steps)
        model.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        with torch.no_grad():
            for param in model.parameters():
                param -= lr * param.grad
    assert steps == len(data.train) // 100
    assert_same_weights(weights(tmp_path / "run"), model.state_dict(), atol=1e-6)


def test_one_epoch_of_adamw_equals_an_independent_adamw_loop(tmp_path) -> None:
    """AdamW written out: β = (momentum, 0.999), ε = 1e-8, bias-corrected moments, weight decay
    decoupled (``p ← p·(1 − lr·wd)``) on every parameter but the rule's exempt ones."""
    lr, decay, beta1, beta2 = 2e-3, 0.05, 0.8, 0.999
    overrides = [
        *TINY,
        *NO_DROPOUT,
        *QUIET,
        "epochs=1",
        "optimizer=adamw",
        f"momentum={beta1}",
        f"weight_decay={decay}",
        "decay_exempt=norms-biases-positional",
        "batch_size=100",
        f"lr={lr}",
    ]
    train(resolve_config("quick", overrides=overrides), tmp_path / "run")

    data = load_splits("digits")
    torch.manual_seed(0)
    model = create_model(
        "quick",
        **loop.data_model_config(data),
        **resolve_config("quick", overrides=TINY + NO_DROPOUT).model,
    )
    exempt = model.no_weight_decay_parameters("norms-biases-positional")
    assert exempt and len(exempt) < len(list(model.parameters()))
    named = dict(model.named_parameters())
    first = {name: torch.zeros_like(p) for name, p in named.items()}
    second = {name: torch.zeros_like(p) for name, p in named.items()}
    loader = BatchLoader(data.train, 100, device="cpu", train=True, flip=False, pad=1, seed=0)
    for step, (images, labels) in enumerate(loader.epoch(0)):
        rate = warmup_cosine_rate(lr, step, len(loader))
        model.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        t = step + 1
        with torch.no_grad():
            for name, param in named.items():
                if name not in exempt:
                    param *= 1 - rate * decay
                first[name] = beta1 * first[name] + (1 - beta1) * param.grad
                second[name] = beta2 * second[name] + (1 - beta2) * param.grad**2
                corrected = second[name] / (1 - beta2**t)
                param -= rate * (first[name] / (1 - beta1**t)) / (corrected.sqrt() + 1e-8)
    assert_same_weights(weights(tmp_path / "run"), model.state_dict(), atol=2e-5)
    checkpoint = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    decayed, undecayed = checkpoint["optimizer"]["param_groups"]
    assert (decayed["weight_decay"], undecayed["weight_decay"]) == (decay, 0.0)
    assert tuple(decayed["betas"]) == (beta1, beta2)


def test_run_folder_contents_and_recipe(finished_run: Path) -> None:
    config = json.loads((finished_run / "config.json").read_text())
    assert config["preset"] == "quick" and config["dataset"] == "digits"
    assert config["model"] == {"hidden": 16, "depth": 1, "heads": 2, "head_dim": 8, "mlp_dim": 32}
    records = [
        json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["epoch"] for r in records] == [1, 2] and [r["step"] for r in records] == [20, 40]
    schedule = loop.build_schedule("cosine", 0.1, 2, 20, 0.05)  # 1294 images // 64 = 20 steps
    assert [r["lr"] for r in records] == [schedule(19), schedule(39)]
    for r in records:
        assert 0 <= r["train_acc"] <= 1 and 0 <= r["val_acc"] <= 1 and r["images_per_s"] > 0

    summary = json.loads((finished_run / "summary.json").read_text())
    best = max(records, key=lambda r: r["val_acc"])
    assert (summary["best_epoch"], summary["best_val_acc"]) == (best["epoch"], best["val_acc"])
    assert summary["parameters"] == sum(
        p.numel() for p in load_model(finished_run / "checkpoints" / "best.pt")[0].parameters()
    )
    assert summary["test_acc"] == pytest.approx(
        independent_test_accuracy(finished_run / "checkpoints" / "best.pt"), abs=1e-12
    )
    # how the run was made: the command that repeats it, the machine, no change of length
    saved = TrainConfig.from_dict(config)
    assert without_bookkeeping(command_config(summary["command"])) == without_bookkeeping(saved)
    assert summary["command"] == (
        "attnconv train --preset quick epochs=2 batch_size=64 precision=fp32 model.hidden=16 "
        "model.depth=1 model.heads=2 model.head_dim=8 model.mlp_dim=32"
    )
    assert summary["machine"] == machine_description("cpu") and summary["replans"] == []
    assert [r["machine"] for r in records] == [machine_description("cpu")] * 2

    checkpoint = load_checkpoint(finished_run / "checkpoints" / "last.pt")
    assert checkpoint["epoch"] == 2 and checkpoint["step"] == 40
    overrides = {**config["model"], **loop.data_model_config(load_splits("digits"))}
    assert (checkpoint["architecture"], checkpoint["arguments"]) == preset_arguments(
        "quick", **overrides
    )
    assert "scheduler" not in checkpoint  # the schedule is a function of the config and step
    assert checkpoint["epoch_progress"] is None and checkpoint["metrics"] == records
    decay, no_decay = checkpoint["optimizer"]["param_groups"]
    model, _ = load_model(finished_run / "checkpoints" / "last.pt")
    assert (decay["weight_decay"], no_decay["weight_decay"], decay["momentum"]) == (1e-4, 0.0, 0.9)
    assert config["decay_exempt"] == "original"
    exempt = model.no_weight_decay_parameters("original")
    assert len(no_decay["params"]) == len(exempt)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    # The paper's code: only the Gaussian centres and spreads escape decay.
    assert {n.rsplit(".", 1)[-1] for n in exempt} == {"centers", "spread"}


def independent_test_accuracy(path: Path) -> float:
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["architecture"] == "image_transformer"
    model = ImageTransformer(**checkpoint["arguments"])
    model.load_state_dict(checkpoint["model"])
    test = load_splits("digits").test
    with torch.no_grad():
        predictions = model.eval()(test.images.float() / 255).argmax(dim=1)
    return (predictions == test.labels).double().mean().item()


def test_two_runs_give_identical_weights(tmp_path, finished_run: Path) -> None:
    train(resolve_config("quick", overrides=["epochs=2", *TINY, *QUIET]), tmp_path / "again")
    assert_same_weights(weights(tmp_path / "again"), weights(finished_run))
    other_seed = resolve_config("quick", overrides=["epochs=1", "seed=1", *TINY, *QUIET])
    train(other_seed, tmp_path / "seed1")
    first = weights(tmp_path / "seed1")
    assert not torch.equal(first["classifier.weight"], weights(finished_run)["classifier.weight"])


def test_extending_a_finished_run_replans_the_cosine_schedule(
    tmp_path, finished_run: Path, monkeypatch, capsys
) -> None:
    """`train --resume RUN --epochs 4` on a finished 2-epoch run of 20 steps an epoch: its 40
    updates keep their rates; updates 40..79 use the 4-epoch plan's (warm-up ⌈0.05·80⌉ = 4 steps,
    then ½·0.1·(1 + cos(π(s − 4)/76))), each rate read as SGD used it."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    rates: list[float] = []
    sgd_step = torch.optim.SGD.step

    def recording_step(self, *args, **kwargs):
        rates.extend({group["lr"] for group in self.param_groups})  # one rate for every group
        return sgd_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.SGD, "step", recording_step)
    with pytest.raises(UserError, match=r"the run has trained 2 epoch\(s\); --epochs sets its new"):
        train(None, run_dir, resume=True, epochs=2)
    capsys.readouterr()
    summary = train(None, run_dir, resume=True, epochs=4)

    expected = [0.05 * (1 + math.cos(math.pi * (s - 4) / 76)) for s in range(40, 80)]
    assert rates == pytest.approx(expected, rel=1e-12, abs=0)
    first = [json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert rates[0] == pytest.approx(0.0541, abs=1e-4) and first[-1]["lr"] < 1e-3  # back up
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[:2] == first  # the epochs trained are not rewritten
    assert [(r["epoch"], r["step"], r["lr"]) for r in records[2:]] == [
        (3, 60, expected[19]),
        (4, 80, expected[39]),
    ]
    assert json.loads((run_dir / "config.json").read_text())["epochs"] == 4
    assert summary["epochs"] == 4 and summary == json.loads((run_dir / "summary.json").read_text())
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert (last["epoch"], last["step"], last["config"]["epochs"]) == (4, 80, 4)
    assert last["replans"] == summary["replans"] == [[2, 2]]  # from 2 epochs, after epoch 2
    first_command, resume = summary["command"].split(" --out RUN && ")
    assert resume == "attnconv train --resume RUN --epochs 4"
    assert without_bookkeeping(command_config(first_command)) == without_bookkeeping(
        TrainConfig.from_dict(json.loads((finished_run / "config.json").read_text()))
    )
    out = capsys.readouterr()
    assert (
        "the run's length goes from 2 to 4 epochs: the cosine schedule is re-planned over 4 "
        f"epochs; the updates made keep their rates, the next one's is {expected[0]:.3g}"
    ) in out.out + out.err

    rates.clear()  # a plain resume of the extended run keeps its new length: nothing to train
    assert train(None, run_dir, resume=True)["epochs"] == 4 and rates == []


def test_sigkill_mid_epoch_then_resume_is_exact(tmp_path) -> None:
    args = [
        "--preset",
        "quick",
        "--epochs",
        "2",
        "model.hidden=32",
        "model.heads=4",
        "model.head_dim=8",
        "model.depth=2",
        "batch_size=64",
        "checkpoint_steps=3",
        *QUIET,
    ]
    reference = run_cli("train", "--out", str(tmp_path / "whole"), *args)
    assert reference.returncode == 0, reference.stderr

    killed = tmp_path / "killed"
    last = killed / "checkpoints" / "last.pt"
    process = subprocess.Popen(
        [sys.executable, "-m", "attnconv", "train", "--out", str(killed), *args],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while not last.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    interrupted = load_checkpoint(last)
    assert interrupted["epoch_progress"] is not None, "killed at an epoch boundary"
    assert interrupted["step"] % 20 != 0 and interrupted["step"] < 40

    resumed = run_cli("train", "--resume", str(killed))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming at epoch 1, step {interrupted['step']}" in resumed.stdout + resumed.stderr
    assert_same_weights(weights(killed), weights(tmp_path / "whole"))
    a, b = load_checkpoint(last), load_checkpoint(tmp_path / "whole" / "checkpoints" / "last.pt")
    for state_a, state_b in zip(
        a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True
    ):
        assert torch.equal(state_a["momentum_buffer"], state_b["momentum_buffer"])
    for record_a, record_b in zip(a["metrics"], b["metrics"], strict=True):
        for key in ("train_loss", "train_acc", "val_loss", "val_acc", "lr", "step"):
            assert record_a[key] == record_b[key], key


def test_a_one_process_torchrun_launch_trains_under_ddp_and_matches_a_plain_run(tmp_path) -> None:
    """torchrun with one process joins a process group of one (NCCL on a GPU, gloo here) and wraps
    the model in DDP, so a one-GPU launch smoke-tests the distributed path; its all-reduce over
    one rank leaves the gradients, hence the weights, those of a plain run."""
    args = ["--preset", "quick", "--epochs", "1", *TINY, *NO_DROPOUT, *QUIET]
    plain = run_cli("train", "--out", str(tmp_path / "plain"), *args)
    assert plain.returncode == 0, plain.stderr
    assert "DDP" not in plain.stdout + plain.stderr
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
         "-m", "attnconv", "train", "--out", str(tmp_path / "launched"), *args],
        env=ENV, capture_output=True, text=True, timeout=300,
    )
    assert launched.returncode == 0, launched.stderr
    assert "device cpu x1 (DDP, gloo)" in launched.stdout + launched.stderr
    assert_same_weights(weights(tmp_path / "launched"), weights(tmp_path / "plain"), atol=1e-6)


def test_two_gloo_processes_match_one_process(tmp_path) -> None:
    args = ["--preset", "quick", "--epochs", "1", *TINY, *NO_DROPOUT, *QUIET]
    single = run_cli("train", "--out", str(tmp_path / "one"), *args)
    assert single.returncode == 0, single.stderr
    ddp = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "attnconv",
            "train",
            "--out",
            str(tmp_path / "two"),
            *args,
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ddp.returncode == 0, ddp.stderr
    assert "device cpu x2" in ddp.stdout + ddp.stderr
    assert_same_weights(weights(tmp_path / "two"), weights(tmp_path / "one"), atol=1e-5)
    one = load_checkpoint(tmp_path / "one" / "checkpoints" / "last.pt")["metrics"][0]
    two = load_checkpoint(tmp_path / "two" / "checkpoints" / "last.pt")["metrics"][0]
    for key in ("train_loss", "train_acc", "val_loss", "val_acc"):
        assert two[key] == pytest.approx(one[key], abs=1e-5), key
    # only rank 0 wrote the run folder
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == [
        "best.pt",
        "last.pt",
    ]


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch) -> None:
    real = F.cross_entropy
    calls = {"train": 0}

    def diverging(logits, labels, *args, **kwargs):
        loss = real(logits, labels, *args, **kwargs)
        if kwargs.get("reduction", "mean") == "mean":
            calls["train"] += 1
            if calls["train"] >= 26:  # epoch 2, step 6
                return loss * float("nan")
        return loss

    monkeypatch.setattr(loop.F, "cross_entropy", diverging)
    config = resolve_config("quick", overrides=["epochs=3", "checkpoint_steps=4", *TINY, *QUIET])
    with pytest.raises(
        NonFiniteLossError, match="training diverged at epoch 2, step 28: the training loss is nan"
    ) as info:
        train(config, tmp_path / "run")
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    assert str(last) in str(info.value)
    checkpoint = load_checkpoint(last)
    assert checkpoint["step"] == 24 and checkpoint["epoch"] == 1  # saved at step 24, NaN at 26
    assert all(torch.isfinite(t).all() for t in checkpoint["model"].values())
    assert not (tmp_path / "run" / "summary.json").exists()


def test_prune_then_fine_tune(tmp_path) -> None:
    source = tmp_path / "generalized"
    train(
        resolve_config(
            "quadratic-generalized",
            "digits",
            [
                "epochs=1",
                "model.hidden=16",
                "model.depth=2",
                "model.heads=3",
                "model.mlp_dim=32",
                "batch_size=64",
                *QUIET,
            ],
        ),
        source,
    )
    checkpoint = load_checkpoint(source / "checkpoints" / "best.pt")
    model = checkpoint["model"]
    first, second = "blocks.0.attention.position.", "blocks.1.attention.position."
    model[first + "centers"] = torch.tensor([[3.0, 3.0], [0.0, 0.0], [-3.0, -3.0]])
    model[first + "spread"][1] = 0.01 * torch.eye(2)  # inverse std 0.01: degenerate
    model[second + "spread"] = torch.eye(2).repeat(3, 1, 1)
    save_checkpoint(checkpoint, tmp_path / "degenerate.pt")

    out = tmp_path / "pruned"
    code = cli.main(
        [
            "train",
            "--preset",
            "quadratic-generalized-pruned",
            "--init",
            str(tmp_path / "degenerate.pt"),
            "--out",
            str(out),
            "--epochs",
            "1",
            *QUIET,
        ]
    )
    assert code == 0
    pruned, saved = load_model(out / "checkpoints" / "last.pt")
    assert saved["arguments"]["heads"] == [2, 3] and pruned.heads_per_layer() == [2, 3]
    assert saved["preset"] == "quadratic-generalized-pruned" and saved["dataset"] == "digits"
    centers = pruned.attention_layers()[0].position.centers.detach()
    torch.testing.assert_close(centers, torch.tensor([[3.0, 3.0], [-3.0, -3.0]]), atol=0.2, rtol=0)
    assert json.loads((out / "config.json").read_text())["lr"] == 0.01


def test_a_version_1_run_resumes_and_its_copies_are_rewritten_as_version_2(tmp_path) -> None:
    fixture = Path(__file__).parent / "fixtures" / "checkpoint-v1" / "quick-digits.pt"
    run = RunDir(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    run.last.write_bytes(fixture.read_bytes())  # a finished 2-epoch run whose best.pt was lost
    old = load_checkpoint(run.last)
    config = TrainConfig.from_dict({**old["config"], "progress": False})
    summary = train(config, run.root, resume=True)
    best = torch.load(run.best, weights_only=True)
    assert best["version"] == 2 and (best["epoch"], best["step"]) == (2, 22)
    assert best["arguments"] == old["arguments"] and best["architecture"] == "image_transformer"
    for name, tensor in old["model"].items():
        assert torch.equal(best["model"][name], tensor)
    assert summary["best_epoch"] == 2 and summary["parameters"] == 782
    assert summary["test_acc"] == pytest.approx(0.17270194986072424, abs=1e-12)  # as at 6689da8


# ---------------------------------------------------------------------------- commands


def test_eval_prints_the_accuracy_of_the_checkpoint(finished_run: Path, capsys) -> None:
    best = finished_run / "checkpoints" / "best.pt"
    assert cli.main(["eval", str(best), "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    accuracy = independent_test_accuracy(best)
    count = len(load_splits("digits").test)
    assert f"accuracy {accuracy:.4f} ({round(accuracy * count)}/{count})" in out
    summary = json.loads((finished_run / "summary.json").read_text())
    assert f"loss {summary['test_loss']:.4f}" in out
    # a run folder: its best.pt, the checkpoint the summary's test accuracy is of
    assert cli.main(["eval", str(finished_run), "--precision", "fp32"]) == 0
    assert capsys.readouterr().out == out


def test_eval_of_a_transformed_checkpoint_is_its_accuracy(tmp_path, capsys) -> None:
    """`attnconv eval` of a T-CNN checkpoint (gates open: content attention on) prints the
    accuracy and loss of the network rebuilt by hand from the checkpoint's arguments."""
    from attnconv.models.transformed import TransformedNetwork
    from viz_helpers import transformed_checkpoint

    path = tmp_path / "tcnn.pt"
    save_checkpoint(transformed_checkpoint(image_size=(8, 8), dataset="digits"), path)
    assert cli.main(["eval", str(path), "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["architecture"] == "transformed"
    model = TransformedNetwork(**checkpoint["arguments"])
    model.load_state_dict(checkpoint["model"])
    assert all(layer.gate.max() > 0 for layer in model.transformed_layers().values())
    test = load_splits("digits").test
    with torch.no_grad():
        logits = model.eval()(test.images.float() / 255)
    correct = int((logits.argmax(dim=1) == test.labels).sum())
    count = len(test)
    assert f"accuracy {correct / count:.4f} ({correct}/{count})" in out
    assert f"loss {F.cross_entropy(logits, test.labels).item():.4f}" in out
    assert f"{path} (tcnn-fashion-small, epoch 3) on digits test" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--preset", "nope"], "unknown preset 'nope'; valid presets: quadratic"),
        (["train", "--preset", "quick", "--dataset", "mnist"], "unknown dataset 'mnist'; valid"),
        (["train", "--preset", "quick", "lr=-1"], "lr must be > 0, got -1.0"),
        (["train", "--preset", "quick", "--epochs", "-2"], "--epochs: expected an integer in [1, "),
        (["train", "--preset", "quick", "epochs=-2"], "epochs must be >= 1, got -2"),
        (["train", "--preset", "quick", "epochs=two"], "epochs: expected int, got 'two'"),
        (["train", "--preset", "quick", "colour=red"], "unknown config key 'colour'; valid keys:"),
        (["train"], "give --preset (one of quadratic"),
        (["eval", "missing.pt"], "checkpoint file or run folder: it does not exist, got 'missing"),
    ],
)
def test_bad_input_is_one_line(argv: list, message: str, capsys) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_bad_runs_and_checkpoints(finished_run: Path, tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    cases = [
        (["train", "--resume", str(tmp_path / "empty")], "it has no checkpoints/last.pt"),
        (["train", "--resume", str(tmp_path / "nowhere")], "does not exist"),
        (
            ["train", "--resume", str(finished_run), "--preset", "quadratic"],
            f"{finished_run} is a run of preset 'quick', not 'quadratic'",
        ),
        (["train", "--resume", str(finished_run), "lr=0.5"], "takes no other options"),
        (["train", "--preset", "quick", "--out", str(finished_run)], "already holds a run"),
        (
            [
                "train",
                "--preset",
                "quadratic-generalized-pruned",
                "--init",
                str(finished_run / "checkpoints" / "best.pt"),
            ],
            "is a checkpoint of preset 'quick'; preset 'quadratic-generalized-pruned' fine-tunes a "
            "model of preset quadratic-generalized",
        ),
    ]
    for argv, message in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_tensorboard_scalars_and_attention_figure(tmp_path) -> None:
    import matplotlib.pyplot as plt
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    calls = []

    def figure(model, image_size):  # the per-epoch figure callback: eval mode, the token grid
        calls.append((model.training, image_size))
        fig, axes = plt.subplots(figsize=(1, 1))
        axes.plot([0, 1])
        return fig

    run_dir = tmp_path / "run"
    config = resolve_config("quick", overrides=["epochs=2", *TINY, "progress=false"])
    train(config, run_dir, epoch_figure=figure)
    assert calls == [(False, (8, 8))] * 2
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0}).Reload()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for tag, key in [
        ("loss/train", "train_loss"),
        ("loss/val", "val_loss"),
        ("accuracy/train", "train_acc"),
        ("accuracy/val", "val_acc"),
    ]:
        logged = events.Scalars(tag)
        assert [e.step for e in logged] == [1, 2]
        assert [e.value for e in logged] == pytest.approx([r[key] for r in records], rel=1e-6)
    schedule = loop.build_schedule("cosine", 0.1, 2, 20, 0.05)
    lr = events.Scalars("lr")
    assert [e.step for e in lr] == list(range(10, 41, 10))
    assert [e.value for e in lr] == pytest.approx([schedule(s - 1) for s in range(10, 41, 10)])
    figures = events.Images("attention")
    assert [e.step for e in figures] == [1, 2] and figures[0].encoded_image_string[:4] == b"\x89PNG"


def test_eval_of_the_validation_split_reproduces_the_selection(finished_run: Path, capsys) -> None:
    assert (
        cli.main(
            [
                "eval",
                str(finished_run / "checkpoints" / "best.pt"),
                "--split",
                "val",
                "--precision",
                "fp32",
            ]
        )
        == 0
    )
    summary = json.loads((finished_run / "summary.json").read_text())
    count = len(load_splits("digits").val)
    assert (
        f"val ({count} images, fp32): accuracy {summary['best_val_acc']:.4f}"
        in capsys.readouterr().out
    )


def test_bf16_autocast_changes_the_numbers_slightly(finished_run: Path) -> None:
    model, _ = load_model(finished_run / "checkpoints" / "best.pt")
    loader = BatchLoader(load_splits("digits").test, 100, device="cpu", train=False, flip=False)
    fp32 = loop.evaluation_sums(model, loader, "fp32")
    bf16 = loop.evaluation_sums(model, loader, "bf16")
    assert bf16[2] == fp32[2]
    assert bf16[0] != fp32[0] and bf16[0] == pytest.approx(fp32[0], rel=2e-2)
    with loop.autocast("bf16", torch.device("cpu")):
        assert model(torch.rand(2, 1, 8, 8)).dtype == torch.bfloat16


def test_epoch_stepping_keeps_the_weights_still_through_epoch_0(tmp_path) -> None:
    """The original code's stepping (schedule_stepping=epoch): epoch 0 runs at rate 0, so its
    weights are the initial ones, and each epoch's recorded rate is the rule's for its start."""
    overrides = [*TINY, *QUIET, "epochs=3", "warmup_fraction=0.4", "checkpoint_every=1",
                 "schedule_stepping=epoch"]  # fmt: skip
    train(resolve_config("quick", overrides=overrides), tmp_path / "run")
    torch.manual_seed(0)  # the loop seeds the initial weights with config.seed
    initial = create_model(
        "quick",
        **loop.data_model_config(load_splits("digits")),
        **resolve_config("quick", overrides=overrides).model,
    ).state_dict()
    after_epoch_0 = load_checkpoint(RunDir(tmp_path / "run").epoch_checkpoint(1))["model"]
    assert all(torch.equal(after_epoch_0[k], initial[k]) for k in initial)
    after_epoch_1 = load_checkpoint(RunDir(tmp_path / "run").epoch_checkpoint(2))["model"]
    assert not all(torch.equal(after_epoch_1[k], initial[k]) for k in initial)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    # 20 steps an epoch, 60 in all; warm-up int(0.4 · 60) = 24 steps: epochs start at 0, 20, 40
    cosine = 0.5 * (1 + math.cos(math.pi * (40 - 24) / (60 - 24)))
    assert [r["lr"] for r in records] == pytest.approx([0.0, 0.1 * 20 / 24, 0.1 * cosine])


def test_a_run_moved_between_machines_names_each_with_its_epochs() -> None:
    here = {"epoch": 1, "machine": "CPU A"}
    assert loop.machines_of([here, {**here, "epoch": 2}]) == "CPU A"
    moved = [here, {"epoch": 2, "machine": "GPU B"}, {"epoch": 3, "machine": "GPU B"}]
    assert loop.machines_of(moved) == "epoch 1: CPU A; epochs 2–3: GPU B"
    # back and forth, and epochs of an attnconv that kept no machine per epoch
    older = [{"epoch": 1}, {"epoch": 2}, {"epoch": 3, "machine": "CPU A"}, {"epoch": 4}]
    assert loop.machines_of(older) == (
        "epochs 1–2: not recorded; epoch 3: CPU A; epoch 4: not recorded"
    )
    assert loop.machines_of([]) == "not recorded"


def test_train_in_plans_repeats_a_run_stopped_and_resumed_to_a_new_length(
    tmp_path, monkeypatch
) -> None:
    """A run of 2 planned epochs stopped after epoch 1 and resumed to 3 epochs: train_in_plans
    does it in one call, ends with the weights of doing it by hand and records the same command;
    a straight 3-epoch run ends elsewhere (its first epoch had another schedule)."""
    config = resolve_config("quick", overrides=["epochs=2", *TINY, *QUIET])
    summary = loop.train_in_plans(config, tmp_path / "planned", [(2, 1), (3, 3)])
    assert summary["replans"] == [[2, 1]] and summary["epochs"] == 3
    assert summary["command"].endswith(
        "--out RUN (stopped after epoch 1) && attnconv train --resume RUN --epochs 3"
    )
    assert train(config, tmp_path / "by-hand", stop_after=1) == {}
    assert not (tmp_path / "by-hand" / "summary.json").exists()
    here = machine_description("cpu")
    with monkeypatch.context() as patch:  # resumed on another machine: the summary names both
        patch.setattr(loop, "machine_description", lambda device: "another machine")
        moved = train(None, tmp_path / "by-hand", resume=True, epochs=3)
    assert moved["machine"] == f"epoch 1: {here}; epochs 2–3: another machine"
    assert summary["machine"] == here
    assert_same_weights(weights(tmp_path / "planned"), weights(tmp_path / "by-hand"))
    train(resolve_config("quick", overrides=["epochs=3", *TINY, *QUIET]), tmp_path / "straight")
    straight = weights(tmp_path / "straight")
    assert any(not torch.equal(straight[k], v) for k, v in weights(tmp_path / "planned").items())
    # a folder part-way through is continued: a run stopped after epoch 1 goes on to the end
    train(config, tmp_path / "part", stop_after=1)
    other = dataclasses.replace(config, lr=0.5)
    with pytest.raises(UserError, match=r"holds another run \(its config differs in lr\)"):
        loop.train_in_plans(other, tmp_path / "part", [(2, 1), (3, 3)])
    assert loop.train_in_plans(config, tmp_path / "part", [(2, 1), (3, 3)])["replans"] == [[2, 1]]
    assert_same_weights(weights(tmp_path / "part"), weights(tmp_path / "planned"))
    with pytest.raises(UserError, match=r"plans \[\(2, 2\), \(2, 2\)\] do not chain"):
        loop.train_in_plans(config, tmp_path / "bad", [(2, 2), (2, 2)])


def test_gradient_clipping_bounds_every_update(tmp_path) -> None:
    clip = 1e-3
    common = [*TINY, *NO_DROPOUT, *QUIET, "epochs=1", "momentum=0", "weight_decay=0"]
    train(resolve_config("quick", overrides=[*common, f"grad_clip={clip}"]), tmp_path / "clipped")
    train(resolve_config("quick", overrides=common), tmp_path / "free")
    data = load_splits("digits")
    torch.manual_seed(0)
    initial = create_model(
        "quick", **loop.data_model_config(data), **resolve_config("quick", overrides=common).model
    ).state_dict()

    def distance(run: str) -> float:
        final = weights(tmp_path / run)
        return sum((final[k] - initial[k]).double().square().sum() for k in initial).sqrt().item()

    schedule = loop.build_schedule("cosine", 0.1, 1, 20, 0.05)
    bound = sum(schedule(s) for s in range(20)) * clip  # each step moves at most lr · clip
    assert distance("clipped") <= bound * (1 + 1e-5)
    assert distance("free") > 10 * bound
