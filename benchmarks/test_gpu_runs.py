"""benchmarks/gpu_runs.py: its CPU rehearsal (--dry-run) runs a plan's runs at once to the end,
continues carried-in interrupted runs exactly where they stopped, keeps finished ones, stops
what outlives the limit, and refuses bad plans and a missing GPU in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import gpu_runs

TINY = ["--preset", "quick", "epochs=2", "model.hidden=16", "model.depth=1", "model.heads=2",
        "model.head_dim=4", "model.mlp_dim=16", "batch_size=64"]  # fmt: skip
PLANS = Path(__file__).resolve().parent / "plans"


def write_plan(path: Path, runs: list[dict]) -> Path:
    path.write_text(json.dumps({"runs": runs}))
    return path


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_a_dry_run_trains_every_run_at_once_and_reports_each(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    plan = write_plan(tmp_path / "plan.json", [
        {"folder": "digits/a/seed-0", "train": [*TINY, "seed=0"]},
        {"folder": "digits/b/seed-1", "train": [*TINY, "seed=1"]},
    ])  # fmt: skip
    out = tmp_path / "out"
    code = gpu_runs.main([str(plan), "--out", str(out), "--dry-run", "--parallel", "2"])
    assert code == 0
    report = json.loads((out / "runs.json").read_text())
    assert [r["folder"] for r in report["runs"]] == ["digits/a/seed-0", "digits/b/seed-1"]
    for row in report["runs"]:
        folder = out / row["folder"]
        assert row["state"] == "finished" and row["epochs_done"] == 2 and row["exit_status"] == 0
        assert row["test_acc"] == summary(folder)["test_acc"]
        assert json.loads((folder / "config.json").read_text())["seed"] == int(row["folder"][-1])
    # two seeds, two different runs
    first = torch.load(out / "digits/a/seed-0/checkpoints/last.pt", weights_only=False)["model"]
    second = torch.load(out / "digits/b/seed-1/checkpoints/last.pt", weights_only=False)["model"]
    assert not torch.equal(first["classifier.weight"], second["classifier.weight"])


def test_a_carried_interrupted_run_continues_exactly_and_a_finished_one_is_kept(tmp_path, monkeypatch):
    """A run stopped after epoch 1 of 3, carried in with --from, is continued from its
    checkpoint and ends where the run trained without a stop ends; the carried folder is left as
    it was."""
    from attnconv.train import resolve_config
    from attnconv.train.loop import train

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the driver's runs: 1 thread each, as here
    threads = torch.get_num_threads()
    overrides = [a for a in TINY if "=" in a and not a.startswith("epochs=")]
    overrides.append("precision=fp32")
    config = resolve_config("quick", "digits", [*overrides, "epochs=3", "device=cpu",
                                                "tensorboard=false", "progress=false"])  # fmt: skip
    carried = tmp_path / "carried"
    torch.set_num_threads(1)
    try:
        train(config, carried / "digits/quick/seed-0", stop_after=1)
        train(config, carried / "digits/whole/seed-0")  # finished: kept as it is
    finally:
        torch.set_num_threads(threads)
    before = (carried / "digits/quick/seed-0/checkpoints/last.pt").read_bytes()
    plan = write_plan(tmp_path / "plan.json", [
        {"folder": "digits/quick/seed-0", "train": ["--preset", "quick", *overrides, "epochs=3"]},
        {"folder": "digits/whole/seed-0", "train": ["--preset", "quick", "epochs=3"]},
    ])  # fmt: skip
    out = tmp_path / "out"
    code = gpu_runs.main(
        [str(plan), "--out", str(out), "--from", str(carried), "--dry-run", "--parallel", "2"]
    )
    assert code == 0
    rows = {r["folder"]: r for r in json.loads((out / "runs.json").read_text())["runs"]}
    assert rows["digits/quick/seed-0"]["state"] == "finished"
    assert rows["digits/quick/seed-0"]["epochs_done"] == 3
    assert rows["digits/whole/seed-0"]["exit_status"] is None  # not started again
    assert (carried / "digits/quick/seed-0/checkpoints/last.pt").read_bytes() == before
    # continued, not started again: epoch 1's record is the carried one, and the run said so
    first = (carried / "digits/quick/seed-0/metrics.jsonl").read_text().splitlines()[0]
    assert (out / "digits/quick/seed-0/metrics.jsonl").read_text().splitlines()[0] == first
    assert "resuming at epoch 2" in (out / "logs/digits__quick__seed-0.log").read_text()
    # and it ends where the run trained in one go ends (to rounding: another process)
    resumed = torch.load(out / "digits/quick/seed-0/checkpoints/last.pt", weights_only=False)
    whole = torch.load(carried / "digits/whole/seed-0/checkpoints/last.pt", weights_only=False)
    for key, value in whole["model"].items():
        assert torch.allclose(resumed["model"][key], value, rtol=1e-3, atol=1e-4), key


def test_the_limit_stops_what_is_still_running():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                               start_new_session=True)  # fmt: skip
    started = time.monotonic()
    gpu_runs.stop({"sleeper": sleeper})
    assert sleeper.returncode is not None and time.monotonic() - started < gpu_runs.GRACE_S


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ("[]", "must hold"),
        ('{"runs": [{"folder": "/abs", "train": []}]}', "relative path"),
        ('{"runs": [{"folder": "a/../../b", "train": []}]}', "relative path"),
        ('{"runs": [{"folder": "a", "train": ["--out", "x"]}]}', "but --out"),
        ('{"runs": [{"folder": "a", "train": []}, {"folder": "a", "train": []}]}', "twice"),
        ("{not json", "cannot read the plan"),
    ],
)
def test_a_bad_plan_is_one_line(tmp_path, plan, message):
    path = tmp_path / "plan.json"
    path.write_text(plan)
    with pytest.raises(SystemExit, match=message):
        gpu_runs.main([str(path), "--out", str(tmp_path / "out"), "--dry-run"])


def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path):
    plan = write_plan(tmp_path / "plan.json", [{"folder": "a", "train": TINY}])
    result = subprocess.run(
        [sys.executable, str(Path(gpu_runs.__file__)), str(plan), "--out", str(tmp_path / "o")],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2 and "no CUDA GPU" in result.stderr
    assert not (tmp_path / "o").exists()


def test_the_shipped_plans_parse_and_name_presets():
    from attnconv.models.presets import PRESETS

    for path in sorted(PLANS.glob("*.json")):
        for run in gpu_runs.load_plan(path):
            preset = run["train"][run["train"].index("--preset") + 1]
            assert preset in PRESETS, (path.name, preset)
            assert run["folder"].split("/")[1] == preset
