"""`attnconv eval`: a result on a test set is labelled when it is not the dataset's standard one,
and the test split needs no validation images from the training set."""

from __future__ import annotations

import os

import pytest

from attnconv.cli import main
from test_data_fashion_mnist import write_fashion_folder

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_test_set_that_is_not_the_standard_one_is_labelled(tmp_path, capsys):
    """Issue 55: test files that are well-formed but hold other images (training images, say)
    gave an accuracy with no warning, where robustness refuses the same folder."""
    write_fashion_folder(tmp_path / "fashion-mnist", n_train=5010, n_test=40, gz=False)
    argv = ["eval", "--pretrained", "quadratic-fashion", "--data-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    unlike = (
        "not the standard fashion-mnist test set: its 40 test images and labels differ from the "
        "recorded ones (SHA-256)"
    )
    assert out[0].startswith("quadratic-fashion (shipped; stated test accuracy ")
    assert f"on fashion-mnist test [{unlike}] (40 images, fp32): accuracy " in out[0]
    assert out[1] == f"note: {unlike}: this accuracy is not comparable to results stated on it"


def test_a_data_folder_with_few_training_images_does_not_blame_val_size(tmp_path, capsys):
    """Issue 55: eval of the test split and robustness train nothing, yet refused a folder with
    fewer training images than the validation split takes, naming val_size."""
    write_fashion_folder(tmp_path / "fashion-mnist", n_train=10, n_test=20, gz=False)
    argv = ["--pretrained", "quadratic-fashion", "--data-dir", str(tmp_path)]
    assert main(["eval", *argv]) == 0
    assert "(20 images, fp32): accuracy" in capsys.readouterr().out
    csv = tmp_path / "r.csv"
    assert main(["robustness", *argv, "--out", str(csv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "val_size" not in err, err
    assert "the 'clean' fashion-mnist test images differ from the recorded ones" in err
    assert not csv.exists()
    assert main(["eval", *argv, "--split", "val"]) == 2  # the validation split does need them
    assert "val_size as a count must be in [0, 10)" in capsys.readouterr().err


def test_a_checkpoint_that_is_a_link_to_a_device_or_a_fifo_is_named_as_such(tmp_path, capsys):
    """Issue 55: a symbolic link to /dev/zero or a FIFO given as a checkpoint was reported as
    'does not exist'."""
    from attnconv.runs import checkpoint_file

    os.symlink("/dev/zero", tmp_path / "zero.pt")
    os.mkfifo(tmp_path / "fifo.pt")
    os.symlink(tmp_path / "gone", tmp_path / "dangling.pt")
    for name, what in (
        ("zero.pt", "is a symbolic link to /dev/zero, a character device, not a regular file"),
        ("fifo.pt", "is a FIFO (named pipe), not a regular file"),
        ("dangling.pt", f"is a symbolic link to {tmp_path / 'gone'}, which does not exist"),
    ):
        assert main(["eval", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"it {what}" in err, err
        with pytest.raises((OSError, ValueError)) as error:
            checkpoint_file(tmp_path / name)
        assert str(error.value) == f"checkpoint {tmp_path / name} {what}"


def test_a_run_tested_on_a_test_set_that_is_not_the_standard_one_says_so(tmp_path, capsys):
    """Issue 55, where a result is reported on a test set: train's summary.json too."""
    import json

    from train_helpers import QUIET, TINY

    write_fashion_folder(tmp_path / "data" / "fashion-mnist", n_train=80, n_test=20, gz=False)
    run = tmp_path / "run"
    argv = ["train", "--preset", "quick", "--dataset", "fashion-mnist", "--data-dir",
            str(tmp_path / "data"), "--epochs", "1", "--out", str(run), "val_size=10", *TINY,
            *QUIET]  # fmt: skip
    assert main(argv) == 0
    unlike = (
        "not the standard fashion-mnist test set: its 20 test images and labels differ from the "
        "recorded ones (SHA-256)"
    )
    assert json.loads((run / "summary.json").read_text())["test_set"] == unlike
    assert f"note: the test accuracy is on data that is {unlike}" in capsys.readouterr().out


def test_a_training_run_labels_a_test_accuracy_on_a_nonstandard_test_set(tmp_path, capsys):
    """What eval labels, a finished training run labels too: summary.json's "test_set" and the
    run's last line say why its test accuracy is not comparable to those stated on the dataset."""
    import json

    write_fashion_folder(tmp_path / "fashion-mnist", n_train=300, n_test=40, gz=False)
    run = tmp_path / "run"
    argv = ["train", "--preset", "quick", "--dataset", "fashion-mnist", "--epochs", "1", "--out",
            str(run), f"data_dir={tmp_path}", "val_size=100", "tensorboard=false",
            "progress=false"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test_set"].startswith("not the standard fashion-mnist test set: its 40 test")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"note: the test accuracy is on data that is {summary['test_set']}"
