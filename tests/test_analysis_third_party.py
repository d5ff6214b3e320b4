"""timm and torchvision models by name, local weights (safetensors or state dict), and importing
torchvision next to a CPU torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from attnconv.analysis import third_party
from attnconv.analysis.third_party import (
    IMAGENET_MEAN,
    build_third_party,
    import_timm,
    read_state_dict,
)
from attnconv.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_timm_imports_next_to_this_torch_in_a_fresh_interpreter():
    """A new process (nothing imported yet): attnconv's import makes torchvision's operators
    exist (loaded from its extension, or the schemas defined where that does not fit this
    torch), and timm and torchvision's vision transformer work."""
    code = (
        "import torch\n"
        "from attnconv.analysis.third_party import import_timm\n"
        "timm = import_timm()\n"
        "import torchvision\n"
        "print(hasattr(torch.ops.torchvision, 'nms'), hasattr(torch.ops.torchvision, 'qnms'))\n"
        "model = torchvision.models.vit_b_32(image_size=32).eval()\n"
        "print(tuple(model(torch.rand(1, 3, 32, 32)).shape))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["True True", "(1, 1000)"]


def test_missing_libraries_are_named(monkeypatch):
    monkeypatch.setattr(third_party.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"timm is not installed: install the dev extra"):
        import_timm()


def vit_tiny(seed: int):
    torch.manual_seed(seed)
    return import_timm().create_model("vit_tiny_patch16_224", img_size=32).eval()


@pytest.mark.parametrize("kind", ["safetensors", "state-dict", "wrapped"])
def test_timm_model_with_local_weights(tmp_path, kind):
    source = vit_tiny(seed=1)
    state = source.state_dict()
    if kind == "safetensors":
        path = tmp_path / "vit.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, path)
    else:
        path = tmp_path / "vit.pth"
        torch.save(state if kind == "state-dict" else {"model": state, "epoch": 3}, path)
    torch.manual_seed(2)  # another initialisation, overwritten by the file
    loaded = build_third_party("timm:vit_tiny_patch16_224", path, image_size=32)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), source(x))
    assert (loaded.name, loaded.weights, loaded.image_size) == (
        "timm:vit_tiny_patch16_224",
        path.name,
        (32, 32),
    )
    assert loaded.mean == (0.5, 0.5, 0.5) and loaded.std == (0.5, 0.5, 0.5)  # timm's config
    assert not loaded.model.training


def test_random_weights_and_normalisation():
    torch.manual_seed(3)
    first = build_third_party("timm:vit_tiny_patch16_224", None, image_size=32)
    torch.manual_seed(4)
    second = build_third_party("timm:vit_tiny_patch16_224", None, image_size=32)
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        assert not torch.equal(first.model(x), second.model(x))
    assert first.weights == "random"
    torch.testing.assert_close(first.normalize(x), (x - 0.5) / 0.5)


def test_torchvision_weights_that_do_not_fit_are_one_line(tmp_path):
    path = tmp_path / "partial.safetensors"
    save_file({"heads.head.weight": torch.zeros(7, 768), "heads.head.bias": torch.zeros(7)}, path)
    with pytest.raises(UserError) as info:
        build_third_party("torchvision:vit_b_16", path, image_size=32)
    message = str(info.value)
    assert message.startswith("partial.safetensors does not fit torchvision:vit_b_16: Missing")
    assert "\n" not in message


def test_torchvision_random_model():
    loaded = build_third_party("torchvision:vit_b_32", None, image_size=64)
    assert loaded.image_size == (64, 64) and loaded.model.patch_size == 32
    assert (loaded.mean, loaded.weights) == (IMAGENET_MEAN, "random")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("keras:vit", "expected timm:NAME or torchvision:NAME, got 'keras:vit'"),
        ("timm:", "expected timm:NAME or torchvision:NAME"),
        ("timm:no_such_model", "timm has no model 'no_such_model'"),
        ("torchvision:no_such_model", "torchvision has no model 'no_such_model'"),
        ("torchvision:resnet18", "torchvision:resnet18 is not a vision transformer"),
    ],
)
def test_bad_model_names(spec, message):
    with pytest.raises(UserError, match=message):
        build_third_party(spec, None)


def test_unreadable_weights_are_named(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_state_dict(tmp_path / "missing.pth")
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a pickle")
    with pytest.raises(UserError, match="is not a state dict torch can load without running code"):
        read_state_dict(garbage)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 16)
    with pytest.raises(UserError, match="is not a readable safetensors file"):
        read_state_dict(broken)
    listing = tmp_path / "list.pth"
    torch.save([torch.zeros(1)], listing)
    with pytest.raises(UserError, match="holds no state dict"):
        read_state_dict(listing)
    with pytest.raises(UserError, match=r"weights file .* does not exist"):
        build_third_party("timm:vit_tiny_patch16_224", tmp_path / "missing.safetensors")
