"""reuse_freed_memory: a large tensor freed and allocated again reuses mapped pages (no page
faults), which glibc's defaults do not. Each case runs in a fresh interpreter: the setting is
process-wide and cannot be taken back."""

import platform
import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import torch
from attnconv.memory import reuse_freed_memory
if sys.argv[1] == "reuse":
    assert reuse_freed_memory()
def faults_of_one_round():
    # a step's worth of large tensors, allocated, written and freed (40 to 160 MiB of float32:
    # above glibc's largest mmap threshold, 32 MiB)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    held = [torch.ones(mib << 18) for mib in (40, 160, 40, 80)]
    del held
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
for _ in range(5):  # the first round faults its pages in either way; with reuse, glibc's heap
    faults_of_one_round()  # takes a few rounds more to settle into a layout that fits them all
print(sum(faults_of_one_round() for _ in range(3)))
"""

PAGES = 3 * (320 << 20) // 4096  # three rounds of 320 MiB


def faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[-1])


@pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the setting is glibc's; elsewhere it does nothing"
)
def test_freed_memory_is_reused_without_page_faults():
    assert faults("default") > 0.9 * PAGES  # every tensor is mapped afresh, page by page
    # reused: once the heap has settled, at most half a round's pages are mapped again
    assert faults("reuse") < 0.5 * PAGES


def test_training_on_a_cpu_turns_it_on(monkeypatch, tmp_path):
    from attnconv.train import loop
    from attnconv.train.config import resolve_config

    calls = []
    monkeypatch.setattr(loop, "reuse_freed_memory", lambda: calls.append(1) or True)
    config = resolve_config(
        "quick", "digits", ["model.hidden=8", "model.depth=1", "model.heads=1", "model.mlp_dim=8"],
        epochs=1, device="cpu", precision="fp32", tensorboard=False, progress=False, val_size=64,
    )
    loop.train(config, tmp_path / "run")
    assert calls == [1]
