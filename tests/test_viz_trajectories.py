"""Centre trajectories read back from epoch checkpoints and drawn as saved."""

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attnconv.viz.trajectories import load_center_trajectories, trajectory_figure
from viz_helpers import save_checkpoint, small_model


def write_epochs(run_dir, epochs, preset="quadratic", **overrides):
    """Save one checkpoint per epoch with known centres; returns them per layer (E, heads, 2)."""
    model, config = small_model(preset, **overrides)
    saved = [[] for _ in model.attention_layers()]
    for epoch in epochs:
        for index, layer in enumerate(model.attention_layers()):
            centers = torch.randn(layer.heads, 2, generator=torch.Generator().manual_seed(epoch))
            with torch.no_grad():
                layer.position.centers.copy_(centers + index)
            saved[index].append(layer.position.centers.detach().clone())
        save_checkpoint(
            run_dir / "checkpoints" / f"epoch_{epoch:04d}.pt", model, preset, config, epoch=epoch
        )
    return [torch.stack(s).double().numpy() for s in saved]


def test_trajectories_match_the_saved_centres(tmp_path):
    expected = write_epochs(tmp_path, [10, 5, 15])  # written out of order
    traj = load_center_trajectories(tmp_path)
    assert traj.epochs == [5, 10, 15]
    assert [p.name for p in traj.paths] == ["epoch_0005.pt", "epoch_0010.pt", "epoch_0015.pt"]
    order = [1, 0, 2]  # expected was built in writing order 10, 5, 15
    for layer, centers in enumerate(traj.centers):
        np.testing.assert_array_equal(centers, expected[layer][order])
    fig = trajectory_figure(traj)
    for layer in range(2):
        lines = {line.get_gid(): line for line in fig.axes[layer].lines if line.get_gid()}
        assert len(lines) == 3
        for head in range(3):
            line = lines[f"layer{layer}-head{head}"]
            np.testing.assert_allclose(line.get_xdata(), traj.centers[layer][:, head, 1])
            np.testing.assert_allclose(line.get_ydata(), traj.centers[layer][:, head, 0])


def test_four_layers_fill_a_two_by_two_grid_with_readable_numbers(tmp_path):
    write_epochs(tmp_path, [1, 2, 3], depth=4, heads=9)
    traj = load_center_trajectories(tmp_path)
    # every head's last centre close to one of two spots: their numbers would pile up
    for layer in range(4):
        traj.centers[layer][-1] = 0.05 * traj.centers[layer][-1] + np.array([0.5, 0.5])
        traj.centers[layer][-1, ::2] += 1.0
    fig = trajectory_figure(traj)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    assert len(fig.axes) == 4
    corners = {(round(ax.get_position().x0, 3), round(ax.get_position().y0, 3)) for ax in fig.axes}
    assert len({x for x, _ in corners}) == 2 and len({y for _, y in corners}) == 2
    for layer, ax in enumerate(fig.axes):
        texts = [t for t in ax.texts if t.get_gid()]
        assert sorted(t.get_gid() for t in texts) == sorted(
            f"layer{layer}-head{h}-label" for h in range(9)
        )
        boxes = [t.get_bbox_patch().get_window_extent(renderer) for t in texts]
        ends = [  # the filled circles of the last epoch: no number covers one
            line.get_window_extent(renderer)
            for line in ax.lines
            if line.get_marker() == "o" and line.get_markerfacecolor() != "white"
        ]
        assert len(ends) == 9
        for i, box in enumerate(boxes):
            assert not any(box.overlaps(other) for other in boxes[i + 1 :])
            assert not any(box.overlaps(end) for end in ends)


def test_missing_and_inconsistent_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint_every"):
        load_center_trajectories(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_center_trajectories(tmp_path / "nope")
    write_epochs(tmp_path, [1])
    write_epochs(tmp_path, [2], heads=2)
    with pytest.raises(ValueError, match="different attention heads"):
        load_center_trajectories(tmp_path)


def test_non_gaussian_run_is_refused(tmp_path):
    model, config = small_model("learned")
    save_checkpoint(tmp_path / "checkpoints" / "epoch_0001.pt", model, "learned", config)
    with pytest.raises(ValueError, match="no Gaussian attention centres"):
        load_center_trajectories(tmp_path)


def test_starts_are_squares_each_head_line_leaves_from(tmp_path):
    expected = write_epochs(tmp_path, [1, 2])
    traj = load_center_trajectories(tmp_path)
    starts = [np.arange(6, dtype=float).reshape(3, 2) + 10 * layer for layer in range(2)]
    fig = trajectory_figure(traj, starts=starts, unit="pixels", layer_titles=["a", "b"])
    for layer, ax in enumerate(fig.axes[:2]):
        assert ax.get_title() == "ab"[layer] and ax.get_xlabel() == "column offset (pixels)"
        lines = {line.get_gid(): line for line in ax.lines if line.get_gid()}
        for head in range(3):
            row, col = starts[layer][head]
            start = lines[f"layer{layer}-start{head}"]
            assert (start.get_marker(), start.get_xdata()[0], start.get_ydata()[0]) == (
                "s", col, row
            )  # fmt: skip
            # the head's own line is still its epochs' centres, the start dotted to the first
            line = lines[f"layer{layer}-head{head}"]
            np.testing.assert_allclose(line.get_xdata(), expected[layer][:, head, 1])
            (dotted,) = [
                other for other in ax.lines
                if other.get_linestyle() == ":" and other.get_xdata()[0] == col
                and other.get_ydata()[0] == row
            ]  # fmt: skip
            assert (dotted.get_xdata()[1], dotted.get_ydata()[1]) == (
                expected[layer][0, head, 1], expected[layer][0, head, 0]
            )  # fmt: skip
    # the axes reach every start (the largest, 15, plus the margin)
    assert fig.axes[0].get_xlim()[1] == pytest.approx(15.7)
    with pytest.raises(ValueError, match=r"one \(heads, 2\) array per layer"):
        trajectory_figure(traj, starts=starts[:1])
