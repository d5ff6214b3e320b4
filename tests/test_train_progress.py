"""Progress where no bar can redraw: `attnconv train` outside a terminal prints a line every
--log-interval steps (loss, rate, images per second, ETA) and an ETA in each epoch line; the demo's
evaluation writes no bar frames into a log."""

import json
import re
from types import SimpleNamespace

import pytest
import torch

from attnconv.cli import main
from attnconv.train import loop
from attnconv.train.config import resolve_config
from attnconv.train.logger import format_duration, format_record
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
    # printed follows from the step counts alone. Each epoch the loop reads it as it starts
    # training, at each step line, as training ends, before validating and once the epoch's
    # checkpoints are written (and, the first epoch in a process, when it prints the epoch line):
    # the seconds an epoch takes besides its training steps are 2 after the process's first epoch,
    # 1 after each later one.
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

    config = resolve_config("quick", "digits", overrides)
    for out, interval, done, epochs in ((first.out, 7, 0, 2), (second.out, 5, 2, 3)):
        total = epochs * per_epoch
        schedule = build_schedule(
            config.schedule, config.lr, epochs, per_epoch, config.warmup_fraction, ()
        )
        lines = [STEP_LINE.match(line) for line in out.splitlines() if "  step " in line]
        assert all(lines), out
        steps = [int(m[3]) for m in lines]
        assert steps == list(range(interval * (done * per_epoch // interval + 1), total + 1, interval))
        for match, step in zip(lines, steps, strict=True):
            epoch = (step - 1) // per_epoch  # 0-based
            in_epoch = step - epoch * per_epoch
            assert (int(match[1]), int(match[2]), int(match[4])) == (epoch + 1, epochs, total)
            assert match[6] == f"{schedule(step - 1):.3g}"  # the rate of that step's update
            # the clock read at the epoch's start and once per line so far in it
            lines_so_far = sum(1 for s in steps if epoch * per_epoch < s <= step)
            per_step = lines_so_far / in_epoch
            assert int(match[7]) == round(64 / per_step)
            # training steps left at that pace, and the time besides of the epoch before, per
            # epoch left (none yet in the process's first epoch)
            between = (0, 2)[epoch - done] if epoch - done < 2 else 1
            eta = (total - step) * per_step + (epochs - epoch) * between
            assert seconds(*match.groups()[7:]) == round(eta)
        epoch_lines = [EPOCH_ETA.match(line) for line in out.splitlines() if "train loss" in line]
        assert [int(m[1]) for m in epoch_lines] == list(range(done + 1, epochs + 1))
        for match in epoch_lines:
            epoch = int(match[1])  # 1-based
            # its training: a tick per step line and one at its end
            ticks = sum(1 for s in steps if (epoch - 1) * per_epoch < s <= epoch * per_epoch) + 1
            assert metrics[epoch - 1]["epoch_time_s"] == ticks
            # besides training: the epoch before's (the process's first: its own validation, 1)
            between = 2 if epoch - done == 2 else 1
            assert seconds(*match.groups()[1:]) == (epochs - epoch) * (ticks + between)
        # the run's last epoch: none left
        assert epoch_lines[-1].groups()[1:] == ("0", "00", "00")
    # the mean loss of a whole epoch, on the line of its last step
    end = STEP_LINE.match(next(line for line in second.out.splitlines() if "  step 60/60" in line))
    assert float(end[5]) == pytest.approx(metrics[2]["train_loss"], abs=6e-5)


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
        "attnconv train: error: log_interval must be >= 0 steps (0: no step lines), got -1\n"
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
