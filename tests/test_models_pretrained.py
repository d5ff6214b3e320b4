"""Shipped weights: export, SHA-256-checked load, and one-line errors for every broken file."""

from __future__ import annotations

import hashlib
import inspect
import json
import lzma

import pytest
import torch

from attnconv.models import ImageTransformer, create_model
from attnconv.models.presets import MODELS, PRESETS
from attnconv.models.pretrained import (
    INDEX_NAME,
    SAMPLE_COUNT,
    WEIGHTS_DIR,
    PretrainedError,
    export_pretrained,
    export_samples,
    load_pretrained,
    pack_weights,
    pretrained_models,
    sample_images,
    unpack_weights,
)


def export_quick(folder, name="tiny", test_accuracy=0.5):
    torch.manual_seed(3)
    preset = PRESETS["quick"]
    arguments = {**preset.model_kwargs, "num_classes": 10}
    model = create_model("quick")
    with torch.no_grad():
        model.blocks[0].attention.position.centers.add_(0.25)  # differs from a fresh model
    export_pretrained(
        model,
        name,
        description="a test model",
        dataset="digits",
        architecture=preset.model,
        arguments=arguments,
        test_accuracy=test_accuracy,
        run={"epochs": 1},
        folder=folder,
    )
    return model


def test_round_trip_is_exact_and_in_eval_mode(tmp_path):
    model = export_quick(tmp_path)
    loaded = load_pretrained("tiny", tmp_path)
    assert not loaded.training
    assert loaded.state_dict().keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    images = torch.rand(3, 1, 8, 8)
    model.eval()
    torch.testing.assert_close(loaded(images), model(images), rtol=0, atol=0)
    info = pretrained_models(tmp_path)["tiny"]
    assert info.test_accuracy == 0.5 and info.dataset == "digits"
    assert info.arguments["mean"] == list(PRESETS["quick"].model_kwargs["mean"])
    # Every constructor argument is listed, the defaults the preset does not set included.
    assert list(info.arguments) == list(inspect.signature(ImageTransformer).parameters)
    assert info.arguments["content"] is False and info.arguments["head_dim"] == 16
    # The file is safetensors (tensors only) packed: each tensor's bytes regrouped, then xz.
    from safetensors.torch import load, save

    assert info.file == "tiny.safetensors.shuf.xz"
    packed = (tmp_path / info.file).read_bytes()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert unpack_weights(packed) == save(state)  # the safetensors bytes, exactly
    raw = load(unpack_weights(packed))
    centers = model.blocks[0].attention.position.centers
    assert torch.equal(raw["blocks.0.attention.position.centers"], centers)


def test_packing_regroups_each_tensors_bytes_by_place_and_restores_them_exactly():
    from safetensors.torch import load, save

    state = {
        "w": torch.tensor([[1.0, -2.5], [3.0, 0.125]]),  # float32: 4 bytes an element
        "b": torch.tensor([1.5, -1.0], dtype=torch.bfloat16),
        "n": torch.tensor([7, 300], dtype=torch.int64),
        "m": torch.tensor([1, 2, 3], dtype=torch.uint8),
        "e": torch.empty(0, 3),
    }
    plain = save(state, metadata={"note": "x"})
    regrouped = lzma.decompress(pack_weights(plain))
    start = 8 + int.from_bytes(plain[:8], "little")
    assert regrouped[:start] == plain[:start]  # the header is kept as it is
    header = json.loads(plain[8:start])

    def tensor_bytes(data, name):
        first, last = header[name]["data_offsets"]
        return data[start + first : start + last]

    w = tensor_bytes(plain, "w")
    assert tensor_bytes(regrouped, "w") == bytes(w[i + 4 * j] for i in range(4) for j in range(4))
    b = tensor_bytes(plain, "b")
    assert tensor_bytes(regrouped, "b") == bytes([b[0], b[2], b[1], b[3]])
    assert tensor_bytes(regrouped, "m") == tensor_bytes(plain, "m") == bytes([1, 2, 3])
    assert unpack_weights(pack_weights(plain)) == plain
    restored = load(unpack_weights(pack_weights(plain)))
    assert all(torch.equal(restored[k], v) for k, v in state.items())
    # trained-like weights (smooth exponents) shrink more than with xz alone
    smooth = save({"w": torch.randn(256, 256) * 0.05})
    assert len(pack_weights(smooth)) < 0.95 * len(lzma.compress(smooth, preset=9))


def test_the_documented_way_to_unpack_by_hand_gives_the_safetensors_bytes(tmp_path):
    """The recipe in ``attnconv.models.pretrained``'s docstring (lzma and numpy, no attnconv)."""
    import textwrap

    from attnconv.models import pretrained

    model = export_quick(tmp_path)
    path = tmp_path / pretrained_models(tmp_path)["tiny"].file
    recipe = pretrained.__doc__.split("by hand::\n")[1].split("\n\n")[0]
    scope = {"path": path}
    exec(textwrap.dedent(recipe), scope)  # the documentation's own code
    from safetensors.torch import load, save

    assert bytes(scope["data"]) == save({k: v.contiguous() for k, v in model.state_dict().items()})
    weight = model.state_dict()["classifier.weight"]
    assert torch.equal(load(bytes(scope["data"]))["classifier.weight"], weight)


def test_a_plain_safetensors_entry_of_before_loads_and_a_new_export_replaces_it(tmp_path):
    from safetensors.torch import save

    model = export_quick(tmp_path)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    plain = save({k: v.contiguous() for k, v in model.state_dict().items()})
    (tmp_path / "tiny.safetensors").write_bytes(plain)
    (tmp_path / "tiny.safetensors.shuf.xz").unlink()
    index[0].update(file="tiny.safetensors", sha256=hashlib.sha256(plain).hexdigest())
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    loaded = load_pretrained("tiny", tmp_path)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    export_quick(tmp_path)  # exported again: packed, and the plain file is gone
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        INDEX_NAME,
        "tiny.safetensors.shuf.xz",
    ]


def test_a_packed_file_that_is_not_one_is_refused_in_one_line(tmp_path):
    export_quick(tmp_path)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    path = tmp_path / index[0]["file"]
    for broken in (b"not xz at all", lzma.compress(b"\x05" + bytes(7) + b"[1]")):
        path.write_bytes(broken)
        index[0]["sha256"] = hashlib.sha256(broken).hexdigest()  # an index made wrongly
        (tmp_path / INDEX_NAME).write_text(json.dumps(index))
        with pytest.raises(PretrainedError, match=r"tiny.safetensors.shuf.xz cannot be read \("):
            load_pretrained("tiny", tmp_path)


def _rehash(folder, data: bytes, **entry) -> None:
    """Write ``data`` as the tiny model's file, its index entry rehashed (and updated with
    ``entry``): what an index made wrongly, or by someone else, says."""
    index = json.loads((folder / INDEX_NAME).read_text())
    (folder / index[0]["file"]).write_bytes(data)
    index[0].update(sha256=hashlib.sha256(data).hexdigest(), **entry)
    (folder / INDEX_NAME).write_text(json.dumps(index))


def test_a_packed_file_that_expands_past_its_recorded_size_is_refused_within_it(tmp_path):
    """Issue 55: a 915 KB packed file that expands to 6 GiB of zeros (its index rehashed) was
    decompressed without a limit: 3.4 GB resident, then MemoryError. The index records the
    unpacked size; decompression stops there, and the memory it takes with it."""
    import tracemalloc

    export_quick(tmp_path)
    size = json.loads((tmp_path / INDEX_NAME).read_text())[0]["size"]
    assert size == len(unpack_weights((tmp_path / "tiny.safetensors.shuf.xz").read_bytes()))
    compressor = lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=1)
    zeros = bytes(2**24)
    bomb = b"".join(compressor.compress(zeros) for _ in range(16)) + compressor.flush()  # 256 MiB
    assert len(bomb) < 2**16
    _rehash(tmp_path, bomb)
    tracemalloc.start()
    try:
        with pytest.raises(PretrainedError, match=f"decompresses to more than the {size} bytes"):
            load_pretrained("tiny", tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * size + 2**22  # not the 256 MiB it expands to
    _rehash(tmp_path, bomb, size=2**40)  # an index that says more than any weights hold
    with pytest.raises(PretrainedError, match="has a size of 1099511627776 bytes, not in"):
        load_pretrained("tiny", tmp_path)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    del index[0]["size"]
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(PretrainedError, match=r"lacks size \(a packed file's unpacked size\)"):
        load_pretrained("tiny", tmp_path)


def test_a_safetensors_header_nested_deeply_is_one_line(tmp_path):
    """Issue 55: a packed file whose safetensors header nests 100,000 '[' raised RecursionError."""
    export_quick(tmp_path)
    header = b"[" * 100_000
    plain = len(header).to_bytes(8, "little") + header
    _rehash(tmp_path, lzma.compress(plain), size=len(plain))
    with pytest.raises(PretrainedError, match="its safetensors header is not JSON") as error:
        load_pretrained("tiny", tmp_path)
    assert "\n" not in str(error.value) and "tiny.safetensors.shuf.xz" in str(error.value)
    with pytest.raises(ValueError, match="nested too deeply"):
        unpack_weights(lzma.compress(plain))
    for entry in ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}},
                  {"x": {"dtype": "F32", "shape": ["a"], "data_offsets": [0, 4]}},
                  {"x": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}}, [1]):  # fmt: skip
        text = json.dumps(entry).encode()
        plain = len(text).to_bytes(8, "little") + text + bytes(4)
        _rehash(tmp_path, lzma.compress(plain), size=len(plain))
        with pytest.raises(PretrainedError, match=r"tiny\.safetensors\.shuf\.xz"):
            load_pretrained("tiny", tmp_path)


def test_second_export_keeps_the_first_entry(tmp_path):
    export_quick(tmp_path, "one", 0.1)
    export_quick(tmp_path, "two", 0.2)
    models = pretrained_models(tmp_path)
    assert list(models) == ["one", "two"]
    assert [m.test_accuracy for m in models.values()] == [0.1, 0.2]


def test_a_changed_byte_is_refused(tmp_path):
    export_quick(tmp_path)
    path = tmp_path / "tiny.safetensors.shuf.xz"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(PretrainedError, match=r"tiny.safetensors.shuf.xz .*corrupted \(SHA-256"):
        load_pretrained("tiny", tmp_path)


def test_missing_file_and_unknown_name(tmp_path):
    export_quick(tmp_path)
    with pytest.raises(PretrainedError, match="no pretrained weights for 'other'; shipped: tiny"):
        load_pretrained("other", tmp_path)
    (tmp_path / "tiny.safetensors.shuf.xz").unlink()
    with pytest.raises(
        PretrainedError, match=r"tiny.safetensors.shuf.xz of pretrained model 'tiny' is missing"
    ):
        load_pretrained("tiny", tmp_path)


def test_weights_that_do_not_fit_the_arguments(tmp_path):
    export_quick(tmp_path)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    index[0]["arguments"]["depth"] = 3
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    fit = r"^pretrained model 'tiny' \(.*tiny.safetensors.shuf.xz\): its weights do not fit .*missing: blocks.2"
    with pytest.raises(PretrainedError, match=fit):
        load_pretrained("tiny", tmp_path)
    (tmp_path / INDEX_NAME).write_text("[{")
    with pytest.raises(PretrainedError, match=r"index .* is corrupted"):
        load_pretrained("tiny", tmp_path)


RANDOM_BYTES = bytes(torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize(
    ("index", "message"),
    [
        (RANDOM_BYTES, "is corrupted: not UTF-8 JSON ('utf-8' codec can't decode byte 0x"),
        (b"\xff\xfe[]", "is corrupted: not UTF-8 JSON ('utf-8' codec can't decode byte 0xff"),
        (b'{"name": "tiny"}', "is corrupted: not a JSON list of model entries (an object)"),
        (b"[1]", "is corrupted: entry 1 is not a JSON object (a number)"),
        (b'[{"name": "tiny"}]', "entry 1 (tiny) lacks description, dataset, architecture"),
        (("architecture", ["x"]), "entry 1 (tiny) has a malformed architecture (an array, "),
        (("test_accuracy", "x"), "entry 1 (tiny) has a malformed test_accuracy (a string, "),
        (b"[" * 100_000, "is corrupted: not UTF-8 JSON (nested too deeply)"),
    ],
    ids=[
        "random bytes", "not UTF-8", "an object", "a number", "fields missing", "array", "str",
        "nested",
    ],
)
def test_a_broken_index_is_one_line_naming_it(tmp_path, index, message):
    export_quick(tmp_path)
    path = tmp_path / INDEX_NAME
    if isinstance(index, tuple):  # (field, value): the entry export_quick wrote, changed
        entries = json.loads(path.read_text())
        entries[0][index[0]] = index[1]
        index = json.dumps(entries).encode()
    path.write_bytes(index)
    for read in (lambda: pretrained_models(tmp_path), lambda: load_pretrained("tiny", tmp_path)):
        with pytest.raises(PretrainedError) as caught:
            read()
        text = str(caught.value)
        assert text.startswith(f"the pretrained index {path} ") and "\n" not in text, text
        assert message in text and text.endswith("; reinstall attnconv"), text


def test_create_model_pretrained_names_what_is_shipped():
    with pytest.raises(PretrainedError, match="no pretrained weights for 'quadratic'; shipped: "):
        create_model("quadratic", pretrained=True)


def test_shipped_test_images_round_trip(tmp_path):
    images = torch.randint(0, 256, (3, 1, 5, 4), dtype=torch.uint8)
    labels = torch.tensor([2, 0, 1])
    export_samples(images, labels, ["cat", "dog", "fox"], "toy", tmp_path)
    floats, captions = sample_images("toy", tmp_path)
    torch.testing.assert_close(floats, images.float() / 255.0)
    assert captions == ["test 0: fox", "test 1: cat", "test 2: dog"]
    with pytest.raises(PretrainedError, match="no test images of 'other'"):
        sample_images("other", tmp_path)
    with pytest.raises(ValueError, match="expected uint8 images"):
        export_samples(images.float(), labels, ["a"], "toy", tmp_path)


def test_commands_take_a_checkpoint_or_a_pretrained_name_not_both(capsys, tmp_path):
    from attnconv import cli

    some = tmp_path / "some.pt"
    some.write_bytes(b"")
    for command in (["eval"], ["plot", "--out", str(tmp_path / "x")]):
        assert cli.main([*command, "--pretrained", "no-such-model"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no pretrained weights for 'no-such-model'" in err[0], err
        assert cli.main([*command, str(some), "--pretrained", "quadratic-fashion"]) == 2
        assert "give a CHECKPOINT or --pretrained NAME" in capsys.readouterr().err
        assert cli.main(command) == 2
        assert "give a CHECKPOINT or --pretrained NAME" in capsys.readouterr().err


SHIPPED = pretrained_models()
IMAGE_SIZES = {"fashion-mnist": 28, "fashion-mnist-anywhere": 32}  # the side of their images


def _as_saved(arguments: dict) -> dict:
    """JSON gives lists where the presets hold tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in arguments.items()}


def test_the_fashion_mnist_experiments_are_shipped_within_10_mb():
    assert list(SHIPPED) == [
        "quadratic-fashion",
        "learned-fashion",
        "learned-content-fashion",
        "resnet-fashion",
        "vit-fashion",
        "resnet-fashion-small",
        "tcnn-fashion-small",
        "learned-anywhere",
        "quadratic-anywhere",
        "learned-content-anywhere",
    ]
    folder = WEIGHTS_DIR
    total = sum(path.stat().st_size for path in folder.iterdir())
    assert total <= 10 * 2**20
    for name, info in SHIPPED.items():
        assert info.architecture == PRESETS[name].model and info.dataset == PRESETS[name].dataset
        # Every constructor argument, defaults included: a later default cannot change the model.
        assert set(info.arguments) == set(inspect.signature(MODELS[info.architecture]).parameters)
        preset, saved = PRESETS[name].model_kwargs, info.arguments
        if info.architecture == "transformed":  # the base network's arguments, and the layers
            assert saved["layers"] == list(preset["layers"]) and saved["spread"] == preset["spread"]
            preset, saved = preset["base_arguments"], saved["base_arguments"]
        shape = {k: v for k, v in preset.items() if k not in ("mean", "std")}
        assert shape.items() <= _as_saved(saved).items()  # statistics: measured on data
        model = create_model(name, pretrained=True)
        assert not model.training
        size = IMAGE_SIZES[info.dataset]
        assert model(torch.rand(2, 1, size, size)).shape == (2, 10)
    for dataset, size in IMAGE_SIZES.items():
        images, captions = sample_images(dataset)
        assert images.shape == (SAMPLE_COUNT, 1, size, size) and len(captions) == SAMPLE_COUNT


@pytest.mark.needs_fashion_mnist
@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_model_reaches_its_stated_test_accuracy(name):
    """Each shipped model, in float32 on the 10000 test images of its dataset (Fashion-MNIST, or
    its garments placed anywhere), within half a point of the accuracy its index states (measured
    when it was exported)."""
    from attnconv.data import BatchLoader, load_splits
    from attnconv.train.loop import evaluation_sums

    test = load_splits(SHIPPED[name].dataset, download=False).test
    loader = BatchLoader(test, 500, device="cpu", train=False, flip=False)
    _, correct, seen = evaluation_sums(create_model(name, pretrained=True), loader, "fp32")
    assert seen == 10000
    assert abs(correct / seen - SHIPPED[name].test_accuracy) <= 0.005
