"""The training figure hook and `attnconv plot` on real checkpoints: files and their content."""

import csv

import numpy as np
import pytest
import torch

from attnconv.cli import main
from attnconv.models.heads import head_table
from attnconv.viz.distance import layer_distances
from attnconv.viz.figures import attention_figure
from attnconv.viz.maps import compute_attention
from viz_helpers import save_checkpoint, small_model


def test_hook_draws_contours_for_gaussian_models():
    model, _ = small_model("quadratic")
    fig = attention_figure(model, (8, 8))
    gids = {c.get_gid() for ax in fig.axes for c in ax.collections}
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


def test_plot_content_model_uses_test_images(tmp_path):
    model, config = small_model("learned-content")
    path = save_checkpoint(tmp_path / "model.pt", model, "learned-content", config)
    out = tmp_path / "figures"
    assert main(["plot", str(path), "--out", str(out), "--images", "3", "--image-index", "1"]) == 0
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
    assert main(["plot", str(path), "--out", str(tmp_path), "--query", "9", "0"]) == 2
    assert "outside the 8x8 token grid" in capsys.readouterr().err
