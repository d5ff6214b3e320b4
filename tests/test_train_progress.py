"""Progress where no bar can redraw: `attnconv train` outside a terminal prints a line every
--log-interval steps (loss, rate, images per second, ETA), the first after at most a few seconds
of training, and an ETA in each epoch line; the demo's evaluation writes no bar frames into a
log."""

import json
import re
from types import SimpleNamespace

import pytest
import torch

from attnconv.cli import main
from attnconv.train import loop
from attnconv.train.config import resolve_config
from attnconv.train.logger import format_duration, format_record, format_step
from attnconv.train.progress import Progress
from attnconv.train.schedule import build_schedule
from train_helpers import TINY

pytestmark = pytest.mark.usefixtures("one_thread")

# the bar on, TensorBoard off: under pytest stderr is no terminal, as under nohup or tee
SETTINGS = ["tensorboard=false", "device=cpu", "precision=fp32"]
STEP_LINE = re.compile(
    r"epoch (\d+)/(\d+)  step (\d+)/(\d+)  loss (\d+\.\d{4}) \| lr (\S+) \| (\d+) img/s \| "
    r"ETA (\d+):(\d\d):(\d\d)$"
)
EPOCH_ETA = re.compile(r"^epoch (\d+)/\d+  train loss .* \| ETA (\d+):(\d\d):(\d\d)$")


def seconds(hours: str, minutes: str, secs: str) -> int:
    return 3600 * int(hours) + 60 * int(minutes) + int(secs)


def test_format_duration_and_the_epoch_line_with_an_eta() -> None:
    assert format_duration(3725.4) == "1:02:05"
    assert format_duration(59.6) == "0:01:00"
    assert format_duration(0) == "0:00:00"
    record = {"epoch": 1, "step": 10, "lr": 0.05, "train_loss": 2.0, "train_acc": 0.25,
              "val_loss": 1.5, "val_acc": 0.5, "epoch_time_s": 2.0, "images_per_s": 320.0}
    assert format_record(record, 3, eta_s=4.2).endswith("320 img/s, 2.0s | ETA 0:00:04")


def test_step_lines_off_a_terminal_then_on_resume(tmp_path, capsys, monkeypatch) -> None:
    # a clock that advances one second each time the loop reads it, so that every rate and ETA
    # printed follows from the step counts alone. The loop reads it as an epoch starts, after each
    # step, before validating and once the epoch's checkpoints are written (and, the first epoch
    # in a process, when it prints the epoch line): a step takes 1 s, an epoch 20 s of training,
    # and the seconds it takes besides are 2 after the process's first epoch, 1 after later ones.
    ticks = iter(range(1, 10**6))
    monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    run = tmp_path / "run"
    overrides = ["epochs=2", *TINY, *SETTINGS]
    argv = ["train", "--preset", "quick", "--out", str(run), "--log-interval", "7", *overrides]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert first.err == ""  # no bar frames in a log
    per_epoch = 20  # the 1077 training digits in batches of 64
    assert f"{per_epoch} steps/epoch of 64 images" in first.out
    # resumed to epoch 3, with its own interval
    assert main(["train", "--resume", str(run), "--epochs", "3", "--log-interval", "5"]) == 0
    second = capsys.readouterr()
    assert second.err == ""
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in metrics] == [20, 40, 60]
    assert [record["epoch_time_s"] for record in metrics] == [per_epoch] * 3

    config = resolve_config("quick", "digits", overrides)
    # the first line of each process once FIRST_LINE_S = 5 s of training have passed (step 5 of
    # the first; 45, a multiple of its interval 5, of the resumed one), then every 7 (5) steps
    for out, done, epochs, expected in (
        (first.out, 0, 2, [5, 7, 14, 21, 28, 35]),
        (second.out, 2, 3, [45, 50, 55, 60]),
    ):
        total = epochs * per_epoch
        schedule = build_schedule(
            config.schedule, config.lr, epochs, per_epoch, config.warmup_fraction, ()
        )
        lines = [STEP_LINE.match(line) for line in out.splitlines() if "  step " in line]
        assert all(lines), out
        assert [int(m[3]) for m in lines] == expected
        for match in lines:
            step = int(match[3])
            epoch = (step - 1) // per_epoch  # 0-based
            assert (int(match[1]), int(match[2]), int(match[4])) == (epoch + 1, epochs, total)
            assert match[6] == f"{schedule(step - 1):.3g}"  # the rate of that step's update
            assert int(match[7]) == 64  # a batch a second
            # the steps left at a second each, and per epoch left the time besides of the epoch
            # before (none yet in the process's first epoch)
            between = 0 if epoch == done else 2
            assert seconds(*match.groups()[7:]) == (total - step) + (epochs - epoch) * between
        epoch_lines = [EPOCH_ETA.match(line) for line in out.splitlines() if "train loss" in line]
        assert [int(m[1]) for m in epoch_lines] == list(range(done + 1, epochs + 1))
        for match in epoch_lines:
            epoch = int(match[1])  # 1-based
            # besides training: the epoch before's (the process's first: its own validation, 1)
            between = 2 if epoch - done == 2 else 1
            assert seconds(*match.groups()[1:]) == (epochs - epoch) * (per_epoch + between)
        # the run's last epoch: none left
        assert epoch_lines[-1].groups()[1:] == ("0", "00", "00")
    # the mean loss of a whole epoch, on the line of its last step
    end = STEP_LINE.match(next(line for line in second.out.splitlines() if "  step 60/60" in line))
    assert float(end[5]) == pytest.approx(metrics[2]["train_loss"], abs=6e-5)


@pytest.mark.parametrize(
    ("seconds_per_step", "interval", "due"),
    [
        (0.75, 50, [7, 50, 100]),  # slow: the first after 5.25 s, then every 50 steps
        (0.01, 50, [50, 100]),  # fast: step 50 comes first, at 0.5 s
        (0.75, 0, []),  # no lines asked for
    ],
)
def test_the_first_line_comes_after_a_few_seconds(seconds_per_step, interval, due, capsys) -> None:
    """A fake clock, two epochs of 60 steps of 10 images: a line once FIRST_LINE_S = 5 s of
    training have passed, once in the process, or at the interval's steps, whichever comes
    first; its rate and ETA at the pace of the epoch so far."""
    now = [0.0]
    lines: list[str] = []
    shown = Progress(
        2, 60, 10, progress=True, main=True, log_interval=interval, print_line=lines.append,
        clock=lambda: now[0], device=torch.device("cpu"),
    )  # fmt: skip
    reported = []
    for epoch in range(2):
        shown.start_epoch(epoch, 0, between_s=3.0 * epoch)
        for step in range(epoch * 60 + 1, epoch * 60 + 61):
            now[0] += seconds_per_step
            if shown.step(step):
                reported.append(step)
                shown.show(step, 1.5, 0.1, line=True)
        assert shown.end_epoch() == pytest.approx(60 * seconds_per_step)
    assert reported == due
    expected = []
    for step in due:
        epoch = (step - 1) // 60
        between = 3.0 * epoch  # what an epoch takes besides training, as start_epoch was told
        eta = (120 - step) * seconds_per_step + (2 - epoch) * between
        expected.append(format_step(epoch + 1, 2, step, 120, 1.5, 0.1, 10 / seconds_per_step, eta))
    assert lines == expected
    assert capsys.readouterr().err == ""  # off a terminal (captured): lines, no bar


@pytest.mark.parametrize(("interval", "setting"), [("0", []), ("3", ["progress=false"])])
def test_no_step_lines_when_turned_off(tmp_path, capsys, interval, setting) -> None:
    argv = ["train", "--preset", "quick", "--out", str(tmp_path / "run"), "epochs=1", *TINY,
            *SETTINGS, *setting, "--log-interval", interval]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "  step " not in out and re.search(r"^epoch 1/1  train loss .* \| ETA 0:00:00$", out, re.M)


def test_a_negative_log_interval_is_one_line(tmp_path, capsys) -> None:
    argv = ["train", "--preset", "quick", "--out", str(tmp_path / "run"), "--log-interval", "-1"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "attnconv train: error: argument --log-interval: expected an integer in [0, 10**9], got "
        "'-1' (see attnconv train --help)\n"
    )


def test_the_demo_evaluation_writes_no_bar_into_a_log(capsys) -> None:
    from attnconv.data import ImageSet
    from attnconv.demo import SHIPPED, _shipped_test_counts
    from attnconv.models.pretrained import load_pretrained

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (30, 1, 28, 28), generator=generator, dtype=torch.uint8)
    labels = torch.randint(0, 10, (30,), generator=generator)
    correct, seen = _shipped_test_counts(ImageSet(images, labels), progress=True, chunk=10)
    with torch.no_grad():
        predicted = load_pretrained(SHIPPED)(images.float() / 255).argmax(dim=1)
    assert (correct, seen) == (float((predicted == labels).sum()), 30.0)
    assert capsys.readouterr().err == ""


def test_the_demo_runs_on_one_thread_and_gives_the_count_back(tmp_path, monkeypatch) -> None:
    from attnconv import demo
    from attnconv.train import loop as train_loop

    seen = []

    def stop(*args, **kwargs):  # where the demo trains: how many threads, then stop there
        seen.append(torch.get_num_threads())
        raise KeyboardInterrupt

    monkeypatch.setattr(train_loop, "train", stop)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(KeyboardInterrupt):
            demo.run_demo(tmp_path / "demo", epochs=1, progress=False)
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
