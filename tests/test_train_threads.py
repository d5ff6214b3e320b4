"""The thread count a run computes with: the cores other work leaves idle (injected load values),
what the user set, what was asked; said in the start line, set for the run and put back after."""

import json

import pytest
import torch

from attnconv.cli import main
from attnconv.errors import UserError
from attnconv.train.threads import choose_threads, torch_threads
from train_helpers import QUIET, TINY


@pytest.mark.parametrize(
    ("cpus", "load", "available", "threads"),
    [
        (2, 2.3, 2, 1),  # another job keeps both cores busy: one thread, not two spinning
        (2, 1.6, 2, 1),  # 0.4 of a core idle: still one
        (2, 1.4, 2, 1),  # 0.6 idle rounds to 1
        (2, 0.4, 2, 2),  # 1.6 idle rounds to 2
        (2, 0.0, 2, 2),  # idle: torch's count
        (16, 5.6, 16, 10),  # 10.4 cores idle
        (16, 0.2, 8, 8),  # never more than torch's count (the caller's torch.set_num_threads)
        (2, 9.0, 2, 1),  # at least one
    ],
)
def test_the_count_is_the_idle_cores_at_most_torchs(cpus, load, available, threads) -> None:
    chosen, why = choose_threads(None, available=available, cpus=cpus, load=load, env=None)
    assert chosen == threads
    count = f"{threads} thread{'s' if threads > 1 else ''}"
    assert why.startswith(f"{count} ({cpus} cores, load {load:.1f}")
    fewer = f": fewer than torch's {available}, set with --threads N)"
    assert why.endswith(fewer if threads < available else f"load {load:.1f})")


def test_what_the_user_set_wins_over_the_load() -> None:
    busy = {"available": 3, "cpus": 2, "load": 2.5}
    assert choose_threads(None, **busy, env="3") == (3, "3 threads (OMP_NUM_THREADS=3)")
    assert choose_threads(4, **busy, env="3") == (4, "4 threads as asked")
    assert choose_threads(1, **busy, env=None) == (1, "1 thread as asked")
    unknown = {"available": 2, "cpus": 2, "env": None}
    assert choose_threads(None, **unknown, load=None) == (2, "2 threads (load unknown)")
    for bad in (0, -1, True, 1.5):
        with pytest.raises(UserError, match=f"threads must be an int >= 1, got {bad!r}"):
            choose_threads(bad, **busy, env=None)


def test_torch_threads_sets_the_count_inside_and_puts_it_back() -> None:
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError
    assert torch.get_num_threads() == before


def test_a_run_trains_with_the_threads_asked_and_says_so(tmp_path, capsys) -> None:
    argv = ["train", "--preset", "quick", "--out", str(tmp_path / "run"), "--threads", "1",
            "epochs=1", *TINY, *QUIET]  # fmt: skip
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(argv) == 0
        assert torch.get_num_threads() == 2  # put back
    finally:
        torch.set_num_threads(before)
    start = capsys.readouterr().out.splitlines()[0]
    assert start.startswith("quick on digits: ") and ", 1 thread as asked, precision " in start
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert ", 1 threads, " in record["machine"]  # the count the epoch ran with
