"""`attnconv explore`: options that would do nothing in a combination are refused in one line."""

import pytest

from attnconv.cli import main
from attnconv.models import create_model
from attnconv.models.pretrained import sample_images
from viz_helpers import save_checkpoint


@pytest.fixture
def position_only(tmp_path):
    return save_checkpoint(tmp_path / "quick.pt", create_model("quick"), "quick", {})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--images", "2"], "--images and --data-dir do nothing for"),
        (["--data-dir", "somewhere"], "position-only, the same for every image"),
        (["--weights-dir", "w"], "--weights-dir is for --pretrained"),
        (["--port", "0"], "--port is for --serve"),
    ],
)
def test_options_that_do_nothing_are_refused(position_only, tmp_path, capsys, options, message):
    out = tmp_path / "site"
    assert main(["explore", str(position_only), "--out", str(out), *options]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (out / "index.html").exists()


def test_data_dir_with_pretrained_is_refused(tmp_path, capsys):
    argv = ["explore", "--pretrained", "quadratic-fashion", "--data-dir", "d", "--out", "x"]
    assert main(argv) == 2
    assert "--pretrained shows the test images shipped" in capsys.readouterr().err


def test_more_images_than_shipped_are_refused_not_cut(tmp_path, capsys):
    out = tmp_path / "site"
    argv = ["explore", "--pretrained", "quadratic-fashion", "--images", "20", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    shipped = sample_images("fashion-mnist")[0].shape[0]
    assert f"--images 20: {shipped} test images of fashion-mnist ship with the weights" in err
    assert not (out / "index.html").exists()


def test_a_position_only_checkpoint_explores_without_them(position_only, tmp_path):
    assert main(["explore", str(position_only), "--out", str(tmp_path / "site")]) == 0
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_checkpoint_attnconv_transform_writes_is_explored_on_its_test_images(tmp_path):
    """A T-CNN checkpoint as `attnconv transform` writes it (no epoch): the page holds its
    transformed layers' attention on the first test images of its dataset and their average."""
    from attnconv.data import load_splits
    from attnconv.models.checkpoint import save_checkpoint as write
    from attnconv.viz.export import read_data
    from viz_helpers import transformed_checkpoint

    checkpoint = transformed_checkpoint(image_size=(8, 8), dataset="digits", moved=False)
    for key in ("epoch", "step", "config", "metrics"):
        del checkpoint[key]
    write(checkpoint, tmp_path / "transformed.pt")
    site = tmp_path / "site"
    argv = ["explore", str(tmp_path / "transformed.pt"), "--images", "2", "--out", str(site)]
    assert main(argv) == 0
    manifest = read_data(site / "data.js")
    assert [(m["name"], m["kind"], m["heads"]) for m in manifest["models"]] == [
        ("tcnn-fashion-small", "probabilities", [9] * 8)
    ]
    data = read_data(site / "models" / "0" / "model.js")
    assert data["meta"]["checkpoint"] == "transformed.pt" and "epoch" not in data["meta"]
    assert data["meta"]["mean content gate per layer"] == ", ".join(["0.00"] * 8)
    splits = load_splits("digits", val_size=0)
    assert [image["label"] for image in data["images"]] == [
        f"test 0: {splits.classes[int(splits.test.labels[0])]}",
        f"test 1: {splits.classes[int(splits.test.labels[1])]}",
        "average over 2 test images",
    ]


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_that_cannot_be_served_is_refused_before_the_site_is_written(
    position_only, tmp_path, capsys, port
):
    out = tmp_path / "site"
    assert main(["explore", str(position_only), "--out", str(out), "--serve", "--port", port]) == 2
    assert capsys.readouterr().err == (
        f"attnconv explore: error: --port must be in [0, 65535] (0 picks a free one), got {port}\n"
    )
    assert not out.exists()
