"""A run survives what a user or an attacker does to it, tried the way it was found: SIGKILL at
each point of an epoch's saves, divergence on purpose, a read-only and a full disk (real tmpfs
mounts; skipped where mounting is not allowed), two writers on one folder, and checkpoints whose
fields do not fit."""

import json
import os
import shutil
import signal
import subprocess
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnconv import cli
from attnconv.data import load_splits
from attnconv.models.checkpoint import build_model, load_checkpoint, save_checkpoint
from train_helpers import QUIET, TINY

pytestmark = pytest.mark.usefixtures("one_thread")

# 20 steps per epoch: last.pt is written at steps 7 and 14, at 20 (end of epoch 1, then best.pt),
# at 21, 28 and 35, and at 40 (end of epoch 2, then best.pt if epoch 2 is the best): 7 times.
RUN = ["--preset", "quick", "--epochs", "2", "checkpoint_steps=7", *TINY, *QUIET]


def forked(argv: list[str], kill_name: str = "", kill_at: int = 0, kill_when: str = "") -> int:
    """Run ``attnconv ARGV`` in a forked child (torch already imported: fast) and return its pid.

    With ``kill_name``, the child SIGKILLs itself when the ``kill_at``-th rename onto a file of
    that name is about to happen (``kill_when="before"``: the new file is complete under its
    temporary name) or has just happened (``"after"``).
    """
    pid = os.fork()
    if pid:
        return pid
    try:
        real_replace, seen = os.replace, [0]

        def replace(src, dst, *args, **kwargs):
            hit = os.path.basename(dst) == kill_name
            seen[0] += hit
            if hit and seen[0] == kill_at and kill_when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            real_replace(src, dst, *args, **kwargs)
            if hit and seen[0] == kill_at and kill_when == "after":
                os.kill(os.getpid(), signal.SIGKILL)

        os.replace = replace
        code = cli.main(argv)
    except BaseException:
        traceback.print_exc()
        code = 3
    os._exit(code)


def exit_status(pid: int) -> int:
    """The child's exit code, or minus the signal that ended it."""
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def one_line_error(err: str) -> str:
    """The stderr of a command that must have failed with one line (no traceback)."""
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


def temporaries(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.rglob(".*.tmp"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run every killed-and-resumed run must end identical to."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert cli.main(["train", "--out", str(run_dir), *RUN]) == 0
    return run_dir


def killed_run(tmp_path: Path, name: str, count: int, when: str) -> Path:
    run_dir = tmp_path / "run"
    pid = forked(["train", "--out", str(run_dir), *RUN], name, count, when)
    assert exit_status(pid) == -signal.SIGKILL
    assert not (run_dir / "summary.json").exists()
    return run_dir


# ---------------------------------------------------------------------------- 1. kill windows

KILL_POINTS = [
    # (file, occurrence, before/after the rename): what the kill interrupts
    ("last.pt", 2, "before"),  # a mid-epoch save: a complete temporary file is left behind
    ("last.pt", 3, "before"),  # the end-of-epoch-1 save of last.pt
    ("last.pt", 3, "after"),  # between last.pt and best.pt of epoch 1
    ("best.pt", 1, "after"),  # between best.pt and metrics.jsonl of epoch 1
    ("summary.json", 1, "before"),  # while writing summary.json
]  # and between last.pt and best.pt of the final epoch: the next test


@pytest.mark.parametrize(("name", "count", "when"), KILL_POINTS)
def test_sigkill_at_each_save_point_then_resume_ends_like_the_uninterrupted_run(
    reference: Path, tmp_path: Path, name: str, count: int, when: str
) -> None:
    run_dir = killed_run(tmp_path, name, count, when)
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    assert temporaries(run_dir) == []
    for file in ("last.pt", "best.pt"):
        ours = load_checkpoint(run_dir / "checkpoints" / file)
        theirs = load_checkpoint(reference / "checkpoints" / file)
        assert (ours["epoch"], ours["step"]) == (theirs["epoch"], theirs["step"]), file
        for key, value in theirs["model"].items():
            assert torch.equal(ours["model"][key], value), (file, key)
    summary = json.loads((run_dir / "summary.json").read_text())
    expected = json.loads((reference / "summary.json").read_text())
    for key in ("best_epoch", "best_val_acc", "test_acc", "test_loss"):
        assert summary[key] == expected[key], key
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 2


def test_a_kill_between_last_and_best_of_the_final_epoch_is_repaired_on_resume(
    reference: Path, tmp_path: Path, capsys
) -> None:
    """last.pt holds the final (best) epoch, best.pt still the previous one: resume rewrites it,
    and summary.json tests the checkpoint of the epoch it names."""
    records = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert records[1]["val_acc"] > records[0]["val_acc"], "the final epoch must be the best"
    run_dir = killed_run(tmp_path, "last.pt", 7, "after")
    best = run_dir / "checkpoints" / "best.pt"
    assert load_checkpoint(best)["epoch"] == 1  # the kill left epoch 1's best.pt behind
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    expected = json.loads((reference / "summary.json").read_text())
    assert summary["best_epoch"] == 2
    assert (summary["test_acc"], summary["test_loss"]) == (
        expected["test_acc"],
        expected["test_loss"],
    )
    assert load_checkpoint(best)["epoch"] == 2
    assert f"{best} was missing or older than last.pt" in capsys.readouterr().err


# ---------------------------------------------------------------------------- 2. divergence


def test_a_transformed_network_fine_tuned_and_killed_mid_epoch_resumes_bit_exactly(
    tmp_path: Path,
) -> None:
    """`train --init` of a small T-CNN (gated content on), SIGKILLed with a mid-epoch last.pt
    complete under its temporary name: `train --resume` ends with the weights (centres, spreads,
    gates included) and momentum buffers of the uninterrupted run, bit for bit."""
    from viz_helpers import transformed_checkpoint

    init = tmp_path / "transformed.pt"
    save_checkpoint(transformed_checkpoint(image_size=(8, 8), dataset="digits"), init)
    run = ["--preset", "tcnn-fashion-small", "--init", str(init), "--dataset", "digits",
           "--epochs", "2", "checkpoint_steps=7", "batch_size=64", *QUIET]  # fmt: skip
    assert cli.main(["train", "--out", str(tmp_path / "whole"), *run]) == 0
    killed = tmp_path / "killed"
    pid = forked(["train", "--out", str(killed), *run], "last.pt", 2, "before")
    assert exit_status(pid) == -signal.SIGKILL
    interrupted = load_checkpoint(killed / "checkpoints" / "last.pt")
    assert (interrupted["epoch"], interrupted["step"]) == (0, 7)  # killed inside epoch 1
    assert cli.main(["train", "--resume", str(killed)]) == 0
    ours = load_checkpoint(killed / "checkpoints" / "last.pt")
    theirs = load_checkpoint(tmp_path / "whole" / "checkpoints" / "last.pt")
    assert (ours["epoch"], ours["step"]) == (theirs["epoch"], theirs["step"]) == (2, 40)
    assert ours["model"].keys() == theirs["model"].keys()
    for key, value in theirs["model"].items():
        assert torch.equal(ours["model"][key], value), key
    for a, b in zip(
        ours["optimizer"]["state"].values(), theirs["optimizer"]["state"].values(), strict=True
    ):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    start = load_checkpoint(init)["model"]
    gates = [key for key in start if key.endswith(".gate")]
    assert len(gates) == 8 and all(not torch.equal(ours["model"][k], start[k]) for k in gates)


def test_a_huge_learning_rate_never_saves_the_diverged_weights(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert (
        cli.main(
            [
                "train",
                "--out",
                str(run_dir),
                "--preset",
                "quick",
                "--epochs",
                "2",
                "checkpoint_steps=1",
                "lr=1000",
                *TINY,
                *QUIET,
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    last = run_dir / "checkpoints" / "last.pt"
    checkpoint = load_checkpoint(last)
    model = build_model(checkpoint).eval()
    val = load_splits("digits", val_size=checkpoint["config"]["val_size"], seed=0).val
    with torch.no_grad():
        loss = F.cross_entropy(model(val.images.float() / 255), val.labels)
    assert torch.isfinite(loss), "the kept checkpoint must not be diverged already"
    step = checkpoint["step"]
    # Which check sees the divergence first (the step's training loss, or the updated weights'
    # loss on their last batch) depends on where the float32 arithmetic overflows.
    assert f"training diverged at epoch 1, step {step + 1}: the " in err, err
    assert (
        f"; stopping without saving it (the last good checkpoint is {last} (step {step}))" in err
    ), err
    assert not (run_dir / "summary.json").exists()


# ---------------------------------------------------------------------------- 6. two writers


def test_a_second_writer_is_refused_while_the_first_one_runs(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    first = forked(
        [
            "train",
            "--out",
            str(run_dir),
            "--preset",
            "quick",
            "--epochs",
            "4",
            "checkpoint_steps=5",
            "seed=0",
            *TINY,
            *QUIET,
        ]
    )
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "last.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        capsys.readouterr()
        second = cli.main(
            [
                "train",
                "--out",
                str(run_dir),
                "--preset",
                "quick",
                "--epochs",
                "1",
                "seed=1",
                *TINY,
                *QUIET,
            ]
        )
        second_err = capsys.readouterr().err
        resume = cli.main(["train", "--resume", str(run_dir)])
        resume_err = capsys.readouterr().err
        still_running = os.waitpid(first, os.WNOHANG) == (0, 0)
    finally:
        assert exit_status(first) == 0
    assert still_running, "the first run ended before the others started: make it longer"
    for code, err in ((second, second_err), (resume, resume_err)):
        assert code == 2
        assert f"run folder {run_dir} is in use by process {first} on " in one_line_error(err)
    assert json.loads((run_dir / "config.json").read_text())["seed"] == 0
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert last["config"]["seed"] == 0 and last["epoch"] == 4
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4


# ---------------------------------------------------------------------------- 3. bad fields


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert (
        cli.main(
            ["train", "--out", str(run_dir), "--preset", "quick", "--epochs", "1", *TINY, *QUIET]
        )
        == 0
    )
    return run_dir


def altered(finished: Path, folder: Path, change) -> Path:
    """A copy of the finished run whose checkpoints went through ``change``."""
    shutil.copytree(finished, folder)
    for path in (folder / "checkpoints").glob("*.pt"):
        checkpoint = load_checkpoint(path)
        change(checkpoint)
        save_checkpoint(checkpoint, path)
    return folder


def wider(checkpoint: dict) -> None:
    checkpoint["arguments"]["hidden"] = 32


def not_a_dict(checkpoint: dict) -> None:
    checkpoint["arguments"] = "hidden=16"


def unknown_argument(checkpoint: dict) -> None:
    checkpoint["arguments"]["colour"] = "red"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (wider, "its weights do not fit the 'image_transformer' model its arguments describe (size mismatch for "),
        (not_a_dict, "has a malformed 'arguments' entry (a str, expected dict)"),
        (unknown_argument, "its arguments do not build a 'image_transformer' model ("),
    ],
)
def test_checkpoints_whose_fields_do_not_fit_are_one_line_in_every_command(
    finished: Path, tmp_path: Path, capsys, change, message: str
) -> None:
    run_dir = altered(finished, tmp_path / "run", change)
    best = str(run_dir / "checkpoints" / "best.pt")
    commands = [
        ["eval", best],
        ["heads", best],
        ["plot", best, "--out", str(tmp_path / "plots")],
        ["explore", best, "--out", str(tmp_path / "site")],
    ]
    for argv in commands:
        assert cli.main(argv) == 2, argv
        err = one_line_error(capsys.readouterr().err)
        assert best in err and message in err, (argv, err)
    assert cli.main(["train", "--resume", str(run_dir)]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert str(run_dir / "checkpoints" / "last.pt") in err and message in err, err


def test_a_malformed_record_of_length_changes_stops_a_resume_in_one_line(
    finished: Path, tmp_path: Path, capsys
) -> None:
    def replans_as_text(checkpoint: dict) -> None:
        checkpoint["replans"] = "2 -> 4"

    run_dir = altered(finished, tmp_path / "run", replans_as_text)
    assert cli.main(["train", "--resume", str(run_dir), "--epochs", "4"]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert str(run_dir / "checkpoints" / "last.pt") in err, err
    assert "its 'replans' entry should be a list of [epochs planned, epochs trained] pairs, got '2 -> 4'" in err


# ---------------------------------------------------------------------------- 4, 5. disks


@pytest.fixture
def tmpfs(tmp_path: Path):
    """Mount a tmpfs at a fresh folder: ``mount(options) -> Path``; unmounted afterwards."""
    mounted = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here ({result.stderr.strip()}): needs root or CAP_SYS_ADMIN"
            )
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=True)


def test_a_read_only_folder_is_one_line_naming_it(tmpfs, capsys) -> None:
    run_dir = tmpfs("ro,size=1m") / "run"
    assert (
        cli.main(
            ["train", "--out", str(run_dir), "--preset", "quick", "--epochs", "1", *TINY, *QUIET]
        )
        == 2
    )
    err = one_line_error(capsys.readouterr().err)
    assert err == (
        f"attnconv train: error: cannot write run folder {run_dir}: read-only file "
        f"system (EROFS); make {run_dir} writable or give another folder\n"
    )


def test_a_full_disk_stops_with_one_line_and_keeps_the_previous_checkpoint(tmpfs, capsys) -> None:
    disk = tmpfs("size=120k")
    run_dir = disk / "run"
    # A checkpoint of this model is 37 kB: last.pt, best.pt and a temporary file fit in 120 kB,
    # epoch_0001.pt as well does not.
    assert (
        cli.main(
            [
                "train",
                "--out",
                str(run_dir),
                "--preset",
                "quick",
                "--epochs",
                "2",
                "checkpoint_every=1",
                *TINY,
                *QUIET,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = run_dir / "checkpoints" / "last.pt"
    kept = load_checkpoint(last)
    assert kept["epoch"] == 1
    assert err.splitlines()[-1] == (
        f"attnconv train: error: cannot write {run_dir / 'checkpoints' / 'epoch_0001.pt'}: no "
        f"space left on the device (ENOSPC); the last good checkpoint is {last} (step 20), "
        f"intact. Free space, then continue with: attnconv train --resume {run_dir}"
    )
    assert temporaries(run_dir) == []

    subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    assert load_checkpoint(run_dir / "checkpoints" / "epoch_0001.pt")["step"] == 20
    assert load_checkpoint(last)["epoch"] == 2


# ---------------------------------------------------------------------------- smaller items


def test_checkpoints_get_the_mode_of_a_plain_open(finished: Path, tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        save_checkpoint(load_checkpoint(finished / "checkpoints" / "last.pt"), tmp_path / "a.pt")
    finally:
        os.umask(mask)
    assert (tmp_path / "a.pt").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    assert (finished / "metrics.jsonl").stat().st_mode & 0o777 == 0o666 & ~mask


def test_internal_bugs_keep_their_traceback_user_errors_do_not(
    finished: Path, monkeypatch, capsys
) -> None:
    from attnconv.models import checkpoint

    def buggy(path, map_location="cpu"):  # a ValueError from inside torch: a bug, not the user's
        return F.cross_entropy(torch.zeros(2, 3), torch.zeros(5, dtype=torch.long))

    monkeypatch.setattr(checkpoint, "load_model", buggy)
    with pytest.raises(ValueError, match="Expected input batch_size"):
        cli.main(["eval", str(finished / "checkpoints" / "best.pt")])
    monkeypatch.setattr(checkpoint, "load_model", lambda path, map_location: len(5))
    with pytest.raises(TypeError):
        cli.main(["eval", str(finished / "checkpoints" / "best.pt")])
    monkeypatch.undo()
    assert cli.main(["train", "--preset", "quick", "lr=-1"]) == 2
    assert one_line_error(capsys.readouterr().err) == (
        "attnconv train: error: lr must be > 0, got -1.0\n"
    )


def test_downloads_get_the_mode_of_a_plain_open(tmp_path: Path, http_root) -> None:
    from attnconv.data.download import fetch

    root, url = http_root
    (root / "file.bin").write_bytes(b"attnconv")
    mask = os.umask(0o022)
    try:
        path = fetch(
            url + "file.bin",
            tmp_path / "file.bin",
            "6a23cdc3ce5c1408ec6bcb3ff30a2e2a",
            manual_hint="",
        )
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644


# ---------------------------------------------------------------------------- 7. found from outside

QUICK = ["--preset", "quick", "--epochs", "2", *TINY, *QUIET]


@pytest.fixture
def at_epoch_start(monkeypatch):
    """``at_epoch_start(epoch, action)``: run ``action(trainer)`` when (0-based) ``epoch`` of
    ``attnconv train`` is about to start training."""
    from attnconv.train.loop import Trainer

    def install(epoch: int, action) -> None:
        real = Trainer._train_epoch

        def train_epoch(self):
            if self.epoch == epoch:
                action(self)
            return real(self)

        monkeypatch.setattr(Trainer, "_train_epoch", train_epoch)

    return install


def test_a_run_folder_deleted_mid_run_stops_the_run_without_making_it_again(
    tmp_path: Path, at_epoch_start, capsys
) -> None:
    run_dir = tmp_path / "run"
    at_epoch_start(1, lambda trainer: shutil.rmtree(run_dir))
    assert cli.main(["train", "--out", str(run_dir), *QUICK, "tensorboard=true"]) == 2
    assert one_line_error(capsys.readouterr().err) == (
        f"attnconv train: error: run folder {run_dir} was deleted while this run was writing it "
        f"({run_dir / '.lock'} is gone); the run stopped without writing to it again\n"
    )
    assert not run_dir.exists()


def test_a_run_folder_taken_over_by_another_writer_is_left_to_it(
    tmp_path: Path, at_epoch_start, capsys
) -> None:
    """The folder is deleted and made again by a second ``train --resume`` (its lock held here by
    ``locked_run``): the first run stops before it writes over the second one's files."""
    from contextlib import ExitStack

    from attnconv.runs import locked_run

    run_dir = tmp_path / "run"
    with ExitStack() as second:

        def take_over(trainer) -> None:
            shutil.rmtree(run_dir)
            second.enter_context(locked_run(run_dir))

        at_epoch_start(1, take_over)
        assert cli.main(["train", "--out", str(run_dir), *QUICK]) == 2
        err = one_line_error(capsys.readouterr().err)
        assert err.startswith(
            f"attnconv train: error: run folder {run_dir} was replaced while this run was writing "
            f"it: its .lock is now held by process {os.getpid()} on "
        ), err
        assert err.endswith("; the run stopped without writing to it again\n"), err
        assert sorted(p.name for p in run_dir.rglob("*")) == [".lock", "checkpoints"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.hidden=0", "hidden must be a positive int, got 0"),
        ("model.heads=0", "heads must be a positive int or a list of 2 positive ints"),
        ("model.dropout=2.0", "dropout probability has to be between 0 and 1, but got 2.0"),
        ("model.positional=bogus", "positional must be one of "),
        ("model.stem=3", "image size 8x8 is not divisible by the stem width 3"),
        ("model.head_dim=-4", "head_dim must be >= 1, got -4"),
    ],
)
def test_bad_model_values_are_one_line_naming_the_value(
    tmp_path: Path, capsys, override: str, message: str
) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "--out", str(run_dir), "--preset", "quick", override, *QUIET]
    assert cli.main(argv) == 2
    err = one_line_error(capsys.readouterr().err)
    assert err.startswith(
        f"attnconv train: error: {override}: the 'quick' model cannot be built on digits with it ("
    ), err
    assert message in err, err
    assert not (run_dir / "checkpoints" / "last.pt").exists()


def test_a_full_disk_before_the_first_checkpoint_advises_starting_again(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Nothing to ``--resume`` yet: the advice is to run the command again."""
    import errno

    from attnconv.train import loop

    def full(checkpoint, path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(loop, "save_checkpoint", full)
    run_dir = tmp_path / "run"
    argv = ["train", "--out", str(run_dir), *QUICK, "checkpoint_steps=7"]
    assert cli.main(argv) == 2
    assert one_line_error(capsys.readouterr().err) == (
        f"attnconv train: error: cannot write {run_dir / 'checkpoints' / 'last.pt'}: no space "
        f"left on the device (ENOSPC); no checkpoint was saved yet. Free space, then start the run "
        f"again with the same command (there is nothing to resume)\n"
    )
    monkeypatch.undo()
    assert cli.main(argv) == 0  # the same command, once there is space
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["epoch"] == 2


def interrupt(trainer) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("epoch", [0, 1])
def test_ctrl_c_is_one_line_saying_how_to_go_on(
    tmp_path: Path, at_epoch_start, monkeypatch, capsys, epoch: int
) -> None:
    run_dir = tmp_path / "run"
    at_epoch_start(epoch, interrupt)
    try:
        code = cli.main(["train", "--out", str(run_dir), *QUICK])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped attnconv train as a traceback")
    assert code == 130
    last = run_dir / "checkpoints" / "last.pt"
    advice = (
        f"the last checkpoint is {last} (step 20): continue with: attnconv train --resume {run_dir}"
        if epoch
        else "no checkpoint was saved yet: start the run again with the same command"
    )
    assert one_line_error(capsys.readouterr().err) == f"attnconv train: interrupted; {advice}\n"
    if epoch:
        monkeypatch.undo()
        assert cli.main(["train", "--resume", str(run_dir)]) == 0
        assert load_checkpoint(last)["epoch"] == 2


def test_sigterm_says_where_the_checkpoint_is_and_how_to_resume(
    tmp_path: Path, at_epoch_start, monkeypatch, capsys
) -> None:
    """Issue 55: SIGTERM (kill, a batch system's time limit) ended training within a second with
    no message; it now stops it as Ctrl-C does, with the shell's status for SIGTERM (143)."""
    run_dir = tmp_path / "run"
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def terminate(trainer) -> None:
        # attnconv handles SIGTERM while it runs: sent without its handler, it would end pytest
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        at_epoch_start(1, terminate)
        code = cli.main(["train", "--out", str(run_dir), *QUICK])
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back as it was
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 143
    last = run_dir / "checkpoints" / "last.pt"
    assert one_line_error(capsys.readouterr().err) == (
        f"attnconv train: stopped by SIGTERM; the last checkpoint is {last} (step 20): continue "
        f"with: attnconv train --resume {run_dir}\n"
    )
    assert temporaries(run_dir) == []
    monkeypatch.undo()
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    assert load_checkpoint(last)["epoch"] == 2


def negative_epoch(checkpoint: dict) -> None:
    checkpoint["epoch"] = -1


def nan_weight(checkpoint: dict) -> None:
    checkpoint["model"]["blocks.0.attention.position.centers"][0, 0] = float("nan")


def huge_hidden(checkpoint: dict) -> None:
    checkpoint["arguments"]["hidden"] = 200_000  # 320 GB, more than the process may map


def large_hidden(checkpoint: dict) -> None:
    checkpoint["arguments"]["hidden"] = 5_000  # 100 MB for each Linear: the OS would lend it


@pytest.fixture
def bounded_memory():
    """The process may map at most 3 GiB more than it does now (while the test runs): an attempt
    to allocate a huge model fails at once instead of paging the machine."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (3 << 30), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.usefixtures("bounded_memory")
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (negative_epoch, "has epoch=-1; expected a count >= 0"),
        (
            nan_weight,
            "weight blocks.0.attention.position.centers holds NaN or infinite values",
        ),
        (
            huge_hidden,
            "its arguments describe a model far larger than its {held:,} bytes of weights "
            "(building it would allocate more memory than this machine can give)",
        ),
        (
            large_hidden,
            "its arguments describe a model far larger than its {held:,} bytes of weights "
            "(building it would allocate more than {limit:,} bytes)",
        ),
    ],
)
def test_checkpoint_fields_out_of_range_are_one_line_in_every_command(
    finished: Path, tmp_path: Path, capsys, change, message: str
) -> None:
    from attnconv.models.checkpoint import CONSTRUCTION_SLACK

    weights = load_checkpoint(finished / "checkpoints" / "best.pt")["model"].values()
    held = sum(t.numel() * t.element_size() for t in weights)
    message = message.format(held=held, limit=2 * held + CONSTRUCTION_SLACK)
    test_checkpoints_whose_fields_do_not_fit_are_one_line_in_every_command(
        finished, tmp_path, capsys, change, message
    )


def test_a_resumed_step_that_does_not_fit_its_epoch_is_refused(
    finished: Path, tmp_path: Path, capsys
) -> None:
    run_dir = altered(finished, tmp_path / "run", lambda c: c.update(step=10**12))
    assert cli.main(["train", "--resume", str(run_dir)]) == 2
    assert one_line_error(capsys.readouterr().err) == (
        f"attnconv train: error: checkpoint {run_dir / 'checkpoints' / 'last.pt'} cannot be "
        f"resumed: its step 1000000000000 does not fit its epoch 1 (20 steps per epoch: expected "
        f"step 20); the file was edited or damaged\n"
    )


def test_a_seed_beyond_64_bits_is_one_line(capsys) -> None:
    assert cli.main(["train", *QUICK, "seed=1180591620717411303424"]) == 2
    assert one_line_error(capsys.readouterr().err) == (
        "attnconv train: error: seed must be an integer in [0, 2**63), got 1180591620717411303424\n"
    )
