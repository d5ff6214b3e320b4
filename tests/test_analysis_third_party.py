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


def unreadable_weights(folder, kind: str):
    """A weights file attnconv cannot use, of the kind named."""
    if kind == "empty.pth":
        path = folder / "empty.pth"
        path.write_bytes(b"")
        return path
    path = folder / f"{kind}.safetensors"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        save_file({"cls_token": torch.zeros(1, 1, 192), "pos_embed": torch.zeros(1, 5, 192)}, path)
        path.write_bytes(path.read_bytes()[:-100])
    elif kind == "oversized-header":
        path.write_bytes((2**62).to_bytes(8, "little") + b'{"a": 1}')
    elif kind == "pickle-named":
        torch.save(vit_tiny(seed=0).state_dict(), path)
    elif kind == "no-tensors":
        save_file({}, path)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("empty", "is not a readable safetensors file"),
        ("truncated", "is not a readable safetensors file"),
        ("oversized-header", "is not a readable safetensors file"),
        ("pickle-named", "is not a readable safetensors file"),
        ("empty.pth", "is not a state dict torch can load without running code"),
        ("no-tensors", "holds no tensors"),
    ],
)
def test_timm_weights_it_cannot_read_are_one_line(tmp_path, kind, message):
    path = unreadable_weights(tmp_path, kind)
    with pytest.raises(UserError, match=message) as info:
        build_third_party("timm:vit_tiny_patch16_224", path, image_size=32)
    assert "\n" not in str(info.value) and path.name in str(info.value)


def test_analyze_with_weights_it_cannot_read_is_one_line(tmp_path, capsys):
    from attnconv.cli import main

    path = unreadable_weights(tmp_path, "truncated")
    out = tmp_path / "analysis"
    argv = ["analyze", "timm:vit_tiny_patch16_224", "--weights", str(path), "--out", str(out)]
    assert main([*argv, "--image-size", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a readable safetensors file" in err


def damaged(state: dict[str, torch.Tensor], token: str, damage: str) -> dict[str, torch.Tensor]:
    """``state`` with NaN in the weight ``token``, or with that weight stored as int8."""
    state = {k: v.clone().contiguous() for k, v in state.items()}
    if damage == "nan":
        state[token][0, 0, 3] = float("nan")
    else:
        state[token] = state[token].round().to(torch.int8)
    return state


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("nan", "holds NaN or infinite values"),
        ("int8", "is stored as torch.int8, where the model holds floating point"),
    ],
)
@pytest.mark.parametrize(
    ("spec", "token"),
    [("timm:vit_tiny_patch16_224", "cls_token"), ("torchvision:vit_b_32", "class_token")],
)
def test_weights_that_are_not_finite_floating_point_are_refused(
    tmp_path, spec, token, damage, message
):
    """Found before anything is built from them (a NaN reached the figures minutes later)."""
    torch.manual_seed(0)
    state = build_third_party(spec, None, image_size=32).model.state_dict()
    path = tmp_path / "weights.safetensors"
    save_file(damaged(state, token, damage), path)
    with pytest.raises(UserError, match=f"^weights.safetensors: weight {token} {message}"):
        build_third_party(spec, path, image_size=32)


def test_torchvision_classifier_is_sized_only_from_a_weight_that_fits(tmp_path):
    """An empty heads.head.weight of shape (10**9, 0) would have asked for a 3 TB classifier."""
    path = tmp_path / "lying.safetensors"
    save_file({"heads.head.weight": torch.empty(10**9, 0), "heads.head.bias": torch.zeros(3)}, path)
    with pytest.raises(UserError) as info:
        build_third_party("torchvision:vit_b_32", path, image_size=32)
    assert str(info.value) == (
        "lying.safetensors: heads.head.weight has shape (1000000000, 0), but "
        "torchvision:vit_b_32 takes (classes, 768)"
    )


def test_torchvision_image_size_must_be_a_multiple_of_the_patch_size():
    with pytest.raises(UserError) as info:
        build_third_party("torchvision:vit_b_16", None, image_size=30)
    assert str(info.value) == (
        "torchvision:vit_b_16 takes image sizes that are multiples of its patch size 16, got 30"
    )
