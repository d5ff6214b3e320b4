"""Images for an analysis: scaled and cropped to the model's input, channels converted, read from a
folder, a dataset or the shipped test images."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from attnconv.analysis.images import LUMA, fit_image, fit_images, folder_images, load_images
from attnconv.errors import UserError


def test_fit_image_scales_to_cover_then_crops_the_centre():
    image = torch.rand(3, 20, 40, generator=torch.Generator().manual_seed(0))
    fitted = fit_image(image, (10, 10), 3)
    # scaled by 1/2 to 10x20 (covering 10x10), then the middle 10 columns
    scaled = F.interpolate(image[None], size=(10, 20), mode="bilinear", antialias=True)[0]
    torch.testing.assert_close(fitted, scaled[:, :, 5:15].clamp(0, 1))
    assert torch.equal(fit_image(image, (20, 40), 3), image)  # already the size: untouched


def test_fit_image_converts_channels():
    grey = torch.rand(1, 4, 4)
    assert torch.equal(fit_image(grey, (4, 4), 3), grey.expand(3, -1, -1))
    rgb = torch.rand(3, 4, 4)
    luminance = LUMA[0] * rgb[0] + LUMA[1] * rgb[1] + LUMA[2] * rgb[2]
    torch.testing.assert_close(fit_image(rgb, (4, 4), 1)[0], luminance)
    with pytest.raises(UserError, match="cannot turn 2-channel images into the 3 channels"):
        fit_image(torch.rand(2, 4, 4), (4, 4), 3)
    assert fit_images(torch.rand(5, 1, 8, 8), (16, 16), 3).shape == (5, 3, 16, 16)


def test_folder_images_are_read_in_name_order(tmp_path):
    pixels = torch.randint(0, 256, (2, 6, 5, 3), dtype=torch.uint8)
    for name, array in zip(("b.png", "a.png"), pixels, strict=True):
        Image.fromarray(array.numpy()).save(tmp_path / name)
    (tmp_path / "notes.txt").write_text("not an image")
    images, names = folder_images(tmp_path, 5)
    assert names == ["a.png", "b.png"]
    assert torch.equal(images[0], pixels[1].permute(2, 0, 1).float() / 255)
    fitted, labels, origin = load_images(str(tmp_path), 1, (10, 12), 3)
    assert fitted.shape == (1, 3, 10, 12) and labels == ["a.png"]
    assert origin == f"1 image of {tmp_path}, scaled to 10x12"
    (tmp_path / "broken.png").write_bytes(b"no png")
    with pytest.raises(UserError, match=r"broken\.png is not an image PIL can read"):
        folder_images(tmp_path, 5)


def test_image_sources(tmp_path):
    images, labels, origin = load_images(None, 3, (28, 28), 1)
    assert images.shape == (3, 1, 28, 28) and len(labels) == 3
    assert origin == "the 3 fashion-mnist test images shipped with attnconv"
    images, labels, origin = load_images("digits", 2, (16, 16), 3)  # embedded: no download
    assert images.shape == (2, 3, 16, 16) and labels[0].startswith("test 0: ")
    assert origin == "the first 2 digits test images, scaled to 16x16"
    with pytest.raises(UserError, match="holds no image files"):
        load_images(str(tmp_path), 2, (8, 8), 1)
    with pytest.raises(UserError, match="'nowhere' is neither a folder nor a dataset"):
        load_images("nowhere", 2, (8, 8), 1)
    with pytest.raises(UserError, match="need at least one image"):
        load_images(None, 0, (8, 8), 1)
