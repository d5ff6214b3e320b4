"""Centre trajectories read back from epoch checkpoints and drawn as saved."""

import numpy as np
import pytest
import torch

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
