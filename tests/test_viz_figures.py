"""The training figure hook and `attnconv plot` on real checkpoints: files and their content."""

import csv

import numpy as np
import pytest
import torch

from attnconv.cli import main
from attnconv.data import fashion_mnist
from attnconv.errors import UserError
from attnconv.models.heads import head_table
from attnconv.models.pretrained import sample_images
from attnconv.viz.distance import layer_distances
from attnconv.viz.figures import attention_figure, plot_model, pretrained_images
from attnconv.viz.maps import compute_attention
from test_data_fashion_mnist import write_fashion_folder
from viz_helpers import save_checkpoint, small_model


def test_hook_draws_contours_for_gaussian_models():
    model, _ = small_model("quadratic")
    fig = attention_figure(model, (8, 8))
    gids = {c.get_gid() for ax in fig.axes for c in ax.collections} - {"token-grid"}
    assert gids == {
        f"layer{l}-head{h}-mass{m}" for l in range(2) for h in range(3) for m in ("0.5", "0.9")
    }


def test_hook_draws_maps_for_learned_models():
    model, _ = small_model("learned")
    fig = attention_figure(model, (8, 8))
    maps = compute_attention(model, (8, 8)).query_maps((4, 4))
    np.testing.assert_allclose(fig.axes[3 + 2].images[0].get_array(), maps[1][2])


def test_hook_for_content_models_without_and_with_images():
    model, _ = small_model("learned-content")
    fig = attention_figure(model, (8, 8))
    assert "uniform grey (0.5) image" in fig.get_suptitle()
    grey = compute_attention(model, (8, 8), torch.full((1, 1, 8, 8), 0.5)).query_maps((4, 4))
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), grey[0][0])
    images = torch.rand(3, 1, 8, 8)
    fig = attention_figure(model, (8, 8), images)
    assert "mean over 3 images" in fig.get_suptitle()


def test_hook_refuses_models_without_attention():
    with pytest.raises(TypeError, match="attention_layers"):
        attention_figure(torch.nn.Conv2d(1, 1, 3), (8, 8))


def read_csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_plot_gaussian_run(tmp_path, capsys):
    model, config = small_model("quadratic")
    run = tmp_path / "run"
    for epoch in (1, 2):
        with torch.no_grad():
            model.attention_layers()[0].position.centers.add_(0.5)
        save_checkpoint(
            run / "checkpoints" / f"epoch_{epoch:04d}.pt", model, "quadratic", config, epoch=epoch
        )
    save_checkpoint(run / "checkpoints" / "last.pt", model, "quadratic", config, epoch=2)
    out = tmp_path / "figures"
    assert main(["plot", str(run), "--out", str(out), "--window", "2"]) == 0
    for name in ("contours", "maps", "distance", "trajectories"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")
        assert (out / f"{name}.pdf").read_bytes().startswith(b"%PDF")
    rows = read_csv(out / "heads.csv")
    distances = layer_distances(compute_attention(model, (8, 8)))
    expected = head_table(model)
    assert len(rows) == len(expected) == 6
    for row, ref in zip(rows, expected, strict=True):
        assert int(row["layer"]) == ref["layer"] and int(row["head"]) == ref["head"]
        assert float(row["center_row"]) == pytest.approx(ref["center_row"])
        assert float(row["spread"]) == pytest.approx(ref["spread"])
        assert row["degenerate"] == str(ref["degenerate"])
        assert float(row["attention_distance"]) == pytest.approx(
            float(distances[ref["layer"]][ref["head"]])
        )
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == [
        "layer",
        "head",
        "center_row",
        "center_col",
        "spread",
        "condition",
        "degenerate",
        "distance",
    ]

    assert "not drawn" not in printed


def test_plot_says_why_a_run_without_epoch_checkpoints_has_no_trajectories(tmp_path, capsys):
    model, config = small_model("quadratic")
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints" / "last.pt", model, "quadratic", config, epoch=2)
    out = tmp_path / "figures"
    assert main(["plot", str(run), "--out", str(out)]) == 0
    assert not (out / "trajectories.png").exists()
    assert (out / "contours.png").is_file()
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"not drawn: trajectories: {run / 'checkpoints'} has no epoch_*.pt; "
        "train with checkpoint_every=1 to keep the centres of every epoch"
    )


def test_plot_content_model_uses_test_images(tmp_path, capsys):
    model, config = small_model("learned-content")
    path = save_checkpoint(tmp_path / "model.pt", model, "learned-content", config)
    out = tmp_path / "figures"
    assert main(["plot", str(path), "--out", str(out), "--images", "3", "--image-index", "1"]) == 0
    assert "content model: averaged over the first 3 test images of digits" in (
        capsys.readouterr().out
    )
    for name in ("contours", "maps", "maps_average", "distance"):
        assert (out / f"{name}.png").is_file() and (out / f"{name}.pdf").is_file()
    assert not (out / "trajectories.png").exists()
    from attnconv.data import load_splits

    images = load_splits("digits").test.images[:3].float() / 255
    distances = layer_distances(compute_attention(model, (8, 8), images))
    rows = read_csv(out / "heads.csv")
    assert list(rows[0]) == ["layer", "head", "attention_distance"]
    np.testing.assert_allclose(
        [float(r["attention_distance"]) for r in rows], torch.cat(distances).numpy(), rtol=1e-5
    )


def test_plot_errors(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "none.pt"), "--out", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    model, config = small_model("quadratic")
    path = save_checkpoint(tmp_path / "m.pt", model, "quadratic", config)
    assert main(["plot", str(path), "--out", str(tmp_path / "figures"), "--query", "9", "0"]) == 2
    assert "outside the 8x8 token grid" in capsys.readouterr().err


@pytest.fixture
def fashion_dir(tmp_path, monkeypatch):
    """A data folder with a 70-image Fashion-MNIST test set; the system copy hidden."""
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", tmp_path / "not-installed")
    arrays = write_fashion_folder(tmp_path / "data" / "fashion-mnist", n_train=5, n_test=70)
    return tmp_path / "data", arrays["t10k-images-idx3-ubyte"]


def test_pretrained_figures_take_as_many_test_images_as_asked(fashion_dir):
    data_dir, test_images = fashion_dir
    images, captions, source = pretrained_images(
        "learned-content-fashion", 64, data_dir=str(data_dir)
    )
    expected = torch.from_numpy(test_images[:64].copy()).float().unsqueeze(1) / 255
    torch.testing.assert_close(images, expected)
    assert len(captions) == 64 and captions[63].startswith("test 63: ")
    assert source == "the first 64 test images of fashion-mnist (read from the dataset)"
    # an image index past the average still gets its image
    images, _, _ = pretrained_images("learned-content-fashion", 3, 9, data_dir=str(data_dir))
    torch.testing.assert_close(images, expected[:10])


def test_pretrained_figures_use_the_shipped_images_unless_more_are_asked():
    shipped, shipped_captions = sample_images("fashion-mnist")
    images, captions, source = pretrained_images("learned-content-fashion", None)
    torch.testing.assert_close(images, shipped)
    assert captions == shipped_captions
    assert source == f"the {shipped.shape[0]} test images of fashion-mnist shipped with the weights"
    images, _, _ = pretrained_images("learned-content-fashion", 3)
    torch.testing.assert_close(images, shipped[:3])


def test_figures_refuse_to_average_over_more_images_than_given(tmp_path):
    model, _ = small_model("learned-content")
    images = torch.rand(3, 1, 8, 8)
    labels = ["a", "b", "c"]
    with pytest.raises(UserError, match="cannot average over 5 images, only 3 given"):
        plot_model(model, tmp_path, "small", images, labels, num_images=5)
    assert not list(tmp_path.iterdir())


def test_pretrained_plot_without_the_dataset_says_why_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", tmp_path / "not-installed")
    argv = ["plot", "--pretrained", "learned-content-fashion", "--images", "64"]
    argv += ["--data-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    shipped = sample_images("fashion-mnist")[0].shape[0]
    assert f"64 test images of fashion-mnist asked for, {shipped} ship with the weights" in err
    assert "dataset-fashion-mnist" in err  # how to get it
    assert not (tmp_path / "out" / "maps_average.png").exists()


def test_plot_of_a_transformed_run(tmp_path, capsys):
    """`attnconv plot` of a T-CNN run folder: contours, gates, distance and trajectories from the
    kernel taps, and heads.csv / layers.csv holding the heads' geometry and their distances on
    the first test images of its dataset."""
    from attnconv.models.checkpoint import build_model
    from attnconv.models.checkpoint import save_checkpoint as write
    from attnconv.viz import transformed as tcnn
    from attnconv.viz.figures import test_images
    from viz_helpers import transformed_checkpoint

    run = tmp_path / "run"
    start = transformed_checkpoint(image_size=(8, 8), dataset="digits", moved=False)
    trained = transformed_checkpoint(image_size=(8, 8), dataset="digits")
    write({**start, "epoch": 1}, run / "checkpoints" / "epoch_0001.pt")
    write({**trained, "epoch": 2}, run / "checkpoints" / "epoch_0002.pt")
    write({**trained, "epoch": 2}, run / "checkpoints" / "last.pt")
    out = tmp_path / "figures"
    assert main(["plot", str(run), "--out", str(out), "--images", "5"]) == 0
    printed = capsys.readouterr().out
    for name in ("contours", "gates", "distance", "trajectories"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")
        assert (out / f"{name}.pdf").read_bytes().startswith(b"%PDF")
    assert not (out / "maps.png").exists()
    model = build_model(trained).eval()
    layers = tcnn.transformed_attention(model, test_images("digits", 5, None)[0])
    heads = read_csv(out / "heads.csv")
    expected = tcnn.head_rows(model, layers)
    assert len(heads) == len(expected) == 8 * 9
    for row, ref in zip(heads, expected, strict=True):
        assert (row["name"], int(row["head"])) == (ref["name"], ref["head"])
        for key in ("moved", "gate", "attention_distance", "attention_distance_image"):
            assert float(row[key]) == pytest.approx(ref[key], rel=1e-6, abs=1e-9), key
    layer_table = read_csv(out / "layers.csv")
    assert [row["input"] for row in layer_table] == ["4x4"] + ["2x2"] * 4 + ["1x1"] * 3
    assert float(layer_table[0]["mean_gate"]) == pytest.approx(0.4, abs=1e-6)
    assert "stages.3.1.conv2" in printed and "tap score" in printed
    assert "averaged over the first 5 test images of digits" in printed
    capsys.readouterr()
    assert main(["plot", str(run), "--out", str(out), "--window", "2", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "--window: for the maps of attention models" in err and err.count("\n") == 1


def test_plot_of_a_shipped_transformed_network(tmp_path, monkeypatch):
    """`plot_pretrained` of a shipped T-CNN: its figures, its distances over all the test images
    shipped with the weights, no trajectories (no run)."""
    from attnconv.models import pretrained
    from attnconv.viz.figures import plot_pretrained
    from attnconv.viz.transformed import attention_distance, transformed_attention
    from explorer_helpers import SAMPLES, shipped_folder

    folder = shipped_folder(tmp_path / "weights", ("tcnn-fashion-small",))
    for name in ("load_pretrained", "pretrained_info", "sample_images"):  # default: folder
        original = getattr(pretrained, name)
        monkeypatch.setattr(pretrained, name, lambda x, where=folder, f=original: f(x, where))
    result = plot_pretrained("tcnn-fashion-small", tmp_path / "out", query=(0, 27))
    assert result.image_source == (
        f"the {SAMPLES} test images of fashion-mnist shipped with the weights"
    )
    assert sorted(path.name for path in result.files) == sorted(
        [f"{n}.{e}" for n in ("contours", "gates", "distance") for e in ("png", "pdf")]
        + ["heads.csv", "layers.csv"]
    )
    assert result.not_drawn == []
    model = pretrained.load_pretrained("tcnn-fashion-small")
    layers = transformed_attention(model, pretrained.sample_images("fashion-mnist")[0])
    distances = [float(d) for layer in layers for d in attention_distance(layer)]
    assert [row["attention_distance"] for row in result.heads] == pytest.approx(distances)
    with pytest.raises(UserError, match="--scale: for the maps of attention models"):
        plot_pretrained("tcnn-fashion-small", tmp_path / "out", scale="shared")


def test_no_contour_figure_when_no_head_would_be_outlined(tmp_path, capsys):
    # learned positional scores of zero: every head attends uniformly, a contour figure of empty
    # panels; plot and analyze leave it out and say why, and still draw the maps
    model, config = small_model("learned")
    with torch.no_grad():
        for layer in model.attention_layers():
            for table in layer.position.parameters():
                table.zero_()
    path = save_checkpoint(tmp_path / "uniform.pt", model, "learned", config)
    why = (
        "not drawn: contours: no head's attention from query token (4, 4) (position-only) is "
        "concentrated in one piece (each is diffuse or in several spots), so every panel would "
        "be empty; the maps show it"
    )
    for command in (["plot", str(path)], ["analyze", str(path), "--explore-images", "0"]):
        out = tmp_path / command[0]
        assert main([*command, "--out", str(out)]) == 0
        assert not (out / "contours.png").exists() and (out / "maps.png").is_file()
        assert why in capsys.readouterr().out.splitlines()
