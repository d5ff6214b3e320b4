"""Normalize: the per-channel constants it holds, and the warning for images outside [0, 1]."""

import warnings

import pytest
import torch

from attnconv.models import create_model
from attnconv.models.normalize import ImageRangeWarning, Normalize

SMALL = {"hidden": 12, "depth": 1, "heads": 2, "head_dim": 4, "mlp_dim": 8}


def test_normalize_subtracts_and_divides_per_channel() -> None:
    normalize = Normalize((0.5, 0.25), (0.5, 2.0), in_channels=2)
    x = torch.tensor([[[[1.0]], [[0.75]]]])  # (1, 2, 1, 1)
    torch.testing.assert_close(normalize(x), torch.tensor([[[[1.0]], [[0.25]]]]))
    with pytest.raises(ValueError, match=r"std must be positive per channel, got \(0.5, 0.0\)"):
        Normalize((0.5, 0.25), (0.5, 0.0), in_channels=2)


@pytest.mark.parametrize("preset", ["quick", "resnet-fashion"])
def test_a_model_warns_once_when_its_images_are_not_on_the_unit_scale(preset: str) -> None:
    torch.manual_seed(0)
    overrides = SMALL if preset == "quick" else {"widths": (4, 4, 4, 4)}
    model = create_model(preset, **overrides).eval()
    images = torch.rand(2, model.in_channels, *model.image_size)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # images in [0, 1]: nothing to say
        expected = model(images)
        model.train()(images * 255)  # training mode is not checked
        model.eval()
    with pytest.warns(ImageRangeWarning) as caught:
        scaled = model(images * 255)
        model(images * 255)
        model(images - 0.5)
    assert len(caught) == 1  # once per model
    assert caught[0].filename == __file__  # it names the line that called the model
    low, high = (images * 255).min().item(), (images * 255).max().item()
    assert str(caught[0].message).startswith(
        f"the model received float images with values in [{low:.4g}, {high:.4g}]; it expects "
        "them in [0, 1] and normalises them itself (divide 0-255 images by 255"
    )
    assert not torch.allclose(scaled, expected)  # why it warns: the outputs are wrong
    with pytest.warns(ImageRangeWarning, match=r"values in \[-0.49"):  # a fresh model warns again
        create_model(preset, **overrides).eval()(images - 0.5)


def test_no_check_where_values_cannot_be_read() -> None:
    """Meta tensors (count_macs) and traces hold no values to check; neither raises nor warns."""
    model = create_model("quick", **SMALL).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImageRangeWarning)
        warnings.simplefilter("error", torch.jit.TracerWarning)
        with torch.device("meta"):
            shapes = create_model("quick", **SMALL).eval()
        assert shapes(torch.empty(2, 1, 8, 8, device="meta")).shape == (2, 10)
        traced = torch.jit.trace(model.normalize, torch.rand(1, 1, 8, 8))
        scaled = torch.rand(1, 1, 8, 8) * 255
        torch.testing.assert_close(
            traced(scaled), (scaled - model.normalize.mean) / model.normalize.std
        )
    assert not model.normalize.range_warned  # a trace records the arithmetic only
