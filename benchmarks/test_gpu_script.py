"""benchmarks/gpu.sh: one clear line without a GPU, and its CPU rehearsal (--dry-run) end to end;
benchmarks/epoch.py trains what it says it trains."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnconv.models import create_model
from epoch import one_epoch

SCRIPT = Path(__file__).resolve().parent / "gpu.sh"
# No GPU, whatever the machine: CUDA_VISIBLE_DEVICES="" hides every device from torch.
ENV = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def run_script(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *argv], env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def test_without_a_gpu_it_says_so_in_one_line_and_runs_nothing() -> None:
    result = run_script()
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "no CUDA GPU" in lines[0] and "--dry-run" in lines[0]


def test_an_unknown_argument_is_named() -> None:
    result = run_script("--dryrun")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "benchmarks/gpu.sh: unknown argument '--dryrun' (expected --dry-run or --help)")


@pytest.mark.slow
def test_the_dry_run_rehearses_every_stage_on_the_cpu() -> None:
    result = run_script("--dry-run")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "failed" not in out and "stopped at the stage limit" not in out, out
    for stage in ("1/4", "2/4", "3/4", "4/4"):
        assert f"== stage {stage}" in out
    # Stage 1: the layer's routes, the layer as it picks and every peer, FlexAttention included,
    # with positive times.
    for name in ("route: shared", "route: separable", "layer, as it picks",
                 "shared dense (einsum)", "SDPA + bias", "flex (compiled)", "naive per image",
                 "floor: projection"):
        row = re.search(rf"^{re.escape(name)}\s+(\d+\.\d+) \((\d+\.\d+)x\)", out, re.MULTILINE)
        assert row is not None, name
        assert float(row.group(1)) > 0
    assert re.search(r"^layer, as it picks(\s+\S+ \(1\.00x\)){4}$", out, re.MULTILINE)
    assert re.search(r"^picked: no-grad fp32: \S", out, re.MULTILINE)
    # Stage 2: both forms of the content model in both precisions.
    content_rows = re.findall(r"^(w·r \+ .*?)\s+(fp32|bf16)\s+(\d+\.\d+)\s+(\d+\.\d+)", out,
                              re.MULTILINE)
    assert {(form.strip(), precision) for form, precision, _, _ in content_rows} == {
        (form, precision) for form in ("w·r + q·k/√d", "w·r + q·r/√d + q·k/√d")
        for precision in ("fp32", "bf16")}
    # Stage 3: the epoch, eager and compiled, each with a finite last loss near ln(10) after
    # two steps on random labels.
    epochs = re.findall(r"^quick\s+(eager|compiled)\s.*?\s(\S+)$", out, re.MULTILINE)
    assert [mode for mode, _ in epochs] == ["eager", "compiled"]
    for _, loss in epochs:
        assert abs(float(loss) - math.log(10)) < 0.5
    # Stage 4: DDP with gloo, one rank.
    assert "device cpu x1 (DDP, gloo)" in out
    assert "DDP smoke run: trained one epoch under DDP with gloo" in out
    assert re.search(r"== done in \d+ s$", out.strip())


def test_one_epoch_trains_the_model_as_a_plain_sgd_loop_does() -> None:
    """The benchmark's epoch is the training it claims: the same last loss as a hand-written SGD
    loop over the same synthetic images (eager, float32, fixed seeds)."""
    torch.set_num_threads(1)
    result = one_epoch("quick", compiled=False, images=60, batch_size=20, warmup=1,
                       precision="fp32", device=torch.device("cpu"))
    assert result["epoch_s"] >= result["warmup_s"] > 0
    assert result["steady_images_per_s"] > 0

    torch.manual_seed(0)
    model = create_model("quick").train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(0)
    pixels = torch.rand(60, model.in_channels, *model.image_size, generator=generator)
    labels = torch.randint(0, model.num_classes, (60,), generator=generator)
    for start in range(0, 60, 20):
        loss = F.cross_entropy(model(pixels[start:start + 20]), labels[start:start + 20])
        last = loss.item()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert result["last_loss"] == pytest.approx(last, abs=1e-6)


def test_one_epoch_needs_more_steps_than_its_warm_up() -> None:
    with pytest.raises(ValueError, match="gives 2 steps; more than --warmup 2"):
        one_epoch("quick", compiled=False, images=40, batch_size=20, warmup=2, precision="fp32",
                  device=torch.device("cpu"))
