"""Trained weights shipped inside the package, loaded offline: ``create_model(name, pretrained=True)``.

The folder ``attnconv/models/weights/`` holds one ``NAME.safetensors.shuf.xz`` per model and
``index.json``, which says for each model what it is and how to rebuild it without consulting the
current presets. A weight file is a safetensors file (tensors only: it cannot run code when it is
read) packed to fit the package's 10 MB of weights (``pack_weights``): each tensor's bytes regrouped
by their place in an element (all first bytes of its float32 values, then all second bytes, ...: the
shuffle filter of HDF5 and Blosc, which puts the slowly varying sign-and-exponent bytes side by
side), then compressed with xz. Trained float32 weights shrink to 0.84–0.86 of their size this
way (xz alone: 0.92). ``unpack_weights`` gives the safetensors bytes back, exactly; by hand::

    import lzma, json, numpy as np
    data = bytearray(lzma.decompress(open(path, "rb").read()))
    header = 8 + int.from_bytes(data[:8], "little")
    for name, entry in json.loads(data[8:header]).items():  # "__metadata__" has no offsets
        if name != "__metadata__":
            start, stop = (header + o for o in entry["data_offsets"])
            width = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2}.get(entry["dtype"], 1)
            planes = np.frombuffer(bytes(data[start:stop]), np.uint8).reshape(width, -1)
            data[start:stop] = planes.T.tobytes()   # then: safetensors.torch.load(bytes(data))

An entry whose file is a plain ``NAME.safetensors`` (as attnconv exported them before) loads as it
is. The index's fields:

    name, description, dataset, architecture (a ``MODELS`` key), arguments (every constructor
    argument, so a later edit of a preset never changes how old weights load), file, sha256 (of
    the file's bytes, checked before anything is read), test_accuracy (on the dataset's test set,
    in [0, 1]), and the run that made it (the ``attnconv train`` command that repeats it, epochs,
    best epoch, precision, training time, and the machine where the run recorded it).

The models normalise their own input (mean and std are buffers), so they take float images in
``[0, 1]`` of shape ``(B, C, H, W)`` like every model of the package, and are returned in eval mode.
``attnconv reproduce fashion-mnist`` retrains them and writes new files with ``export_pretrained``.
"""

from __future__ import annotations

import hashlib
import json
import lzma
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnconv.errors import UserError
from attnconv.models.checkpoint import rebuild
from attnconv.models.presets import full_arguments
from attnconv.runs import parse_json, write_atomic

WEIGHTS_DIR = Path(__file__).with_name("weights")
INDEX_NAME = "index.json"
# A few test images of each dataset the shipped models were trained on, so that figures and the
# explorer of models with content scores work offline: ``samples-DATASET.safetensors``.
SAMPLE_COUNT = 8


PACKED_SUFFIX = ".safetensors.shuf.xz"
# Bytes per element of each safetensors dtype (the rest: 1, which the regrouping leaves alone).
_ELEMENT_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                  "I16": 2, "U16": 2}


class PretrainedError(UserError):
    """Shipped weights that are missing, corrupted or do not fit their model (one-line message)."""


def _regroup_tensor_bytes(data: bytes, restore: bool) -> bytes:
    """``data`` (a safetensors file) with every tensor's bytes regrouped by their place in an
    element (``restore``: put back). The header is left as it is, so it reads the same either
    way. ValueError if the header is not a safetensors one or a tensor lies outside the data."""
    if len(data) < 8:
        raise ValueError(f"{len(data)} bytes, too short for a safetensors header")
    start = 8 + int.from_bytes(data[:8], "little")
    header = json.loads(data[8:start])
    if not isinstance(header, dict):
        raise ValueError("the safetensors header is not a JSON object")
    out = bytearray(data)
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        width = _ELEMENT_BYTES.get(entry["dtype"], 1)
        first, last = (start + offset for offset in entry["data_offsets"])
        if not start <= first <= last <= len(data) or (last - first) % width:
            raise ValueError(f"tensor {name!r} lies outside the file's data")
        if width > 1 and last > first:
            elements = np.frombuffer(data, np.uint8, last - first, first)
            shape = (width, -1) if restore else (-1, width)
            out[first:last] = elements.reshape(shape).T.tobytes()
    return bytes(out)


def pack_weights(safetensors_bytes: bytes) -> bytes:
    """A safetensors file packed as the package ships it (module docstring): each tensor's bytes
    regrouped by their place in an element, then xz (preset 9, extreme)."""
    regrouped = _regroup_tensor_bytes(safetensors_bytes, restore=False)
    return lzma.compress(regrouped, preset=9 | lzma.PRESET_EXTREME)


def unpack_weights(packed: bytes) -> bytes:
    """The safetensors bytes [`pack_weights`][] packed, exactly. ValueError (or
    ``lzma.LZMAError``) for bytes that are not such a file."""
    return _regroup_tensor_bytes(lzma.decompress(packed, format=lzma.FORMAT_XZ), restore=True)


@dataclass(frozen=True)
class PretrainedInfo:
    """One entry of ``index.json`` (see the module docstring)."""

    name: str
    description: str
    dataset: str
    architecture: str
    arguments: dict[str, Any]
    file: str
    sha256: str
    test_accuracy: float
    run: dict[str, Any] = field(default_factory=dict)


# The type of each entry field of index.json (``run`` may be left out).
_ENTRY_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "description": str,
    "dataset": str,
    "architecture": str,
    "arguments": dict,
    "file": str,
    "sha256": str,
    "test_accuracy": (float, int),
    "run": dict,
}


def _read_index(folder: Path) -> dict[str, PretrainedInfo]:
    """The entries of ``folder/index.json`` by name; PretrainedError (one line naming the file)
    if it is not UTF-8 JSON, not a list of objects, or an entry lacks a field or has one of the
    wrong type (``_ENTRY_TYPES``)."""
    path = folder / INDEX_NAME
    if not path.is_file():
        return {}

    def corrupted(what: str) -> PretrainedError:
        return PretrainedError(
            f"the pretrained index {path} is corrupted: {what}; reinstall attnconv"
        )

    try:
        entries = parse_json(path.read_bytes().decode("utf-8"))
    except ValueError as err:  # UnicodeDecodeError, JSONDecodeError, too deeply nested
        reason = str(err).splitlines()[0][:120]
        raise corrupted(f"not UTF-8 JSON ({reason})") from err
    if not isinstance(entries, list):
        raise corrupted(f"not a JSON list of model entries ({_json_kind(entries)})")
    models = {}
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise corrupted(f"entry {number} is not a JSON object ({_json_kind(entry)})")
        name = str(entry.get("name", "?"))[:40]
        missing = [key for key in _ENTRY_TYPES if key != "run" and key not in entry]
        unknown = sorted(str(key)[:40] for key in entry if key not in _ENTRY_TYPES)
        if missing or unknown:
            lacks = f"lacks {', '.join(missing)}" if missing else ""
            extra = f"has unknown field(s) {', '.join(unknown)}" if unknown else ""
            raise corrupted(f"entry {number} ({name}) {' and '.join(filter(None, (lacks, extra)))}")
        for key, value in entry.items():
            expected = _ENTRY_TYPES[key]
            if not isinstance(value, expected) or isinstance(value, bool):
                kind = _json_kind(1.0 if key == "test_accuracy" else expected())
                raise corrupted(
                    f"entry {number} ({name}) has a malformed {key} ({_json_kind(value)}, "
                    f"expected {kind})"
                )
        models[entry["name"]] = PretrainedInfo(**entry)
    return models


def _json_kind(value: Any) -> str:
    """What a value read from JSON is, in JSON's words: ``an object``, ``a number``, ..."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return kinds.get(type(value), "a number")


def pretrained_models(folder: str | Path = WEIGHTS_DIR) -> dict[str, PretrainedInfo]:
    """The shipped models, by name (empty if none are shipped)."""
    return _read_index(Path(folder))


def pretrained_info(name: str, folder: str | Path = WEIGHTS_DIR) -> PretrainedInfo:
    """The index entry of ``name``; PretrainedError listing the shipped names if there is none."""
    models = pretrained_models(folder)
    if name not in models:
        shipped = ", ".join(models) or "none"
        raise PretrainedError(f"no pretrained weights for {name!r}; shipped: {shipped}")
    return models[name]


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_weights(info: PretrainedInfo, folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load as load_safetensors

    path = folder / info.file
    if not path.is_file():
        raise PretrainedError(
            f"the weight file {path} of pretrained model {info.name!r} is missing; reinstall "
            f"attnconv"
        )
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise PretrainedError(
            f"the weight file {path} of pretrained model {info.name!r} is corrupted (SHA-256 "
            f"differs from the index); reinstall attnconv"
        )
    try:
        if info.file.endswith(PACKED_SUFFIX):
            data = unpack_weights(data)
        return load_safetensors(data)
    except (SafetensorError, lzma.LZMAError, ValueError, KeyError, TypeError) as err:
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise PretrainedError(f"the weight file {path} cannot be read ({reason})") from err


def load_pretrained(name: str, folder: str | Path = WEIGHTS_DIR) -> nn.Module:
    """The shipped model ``name`` with its trained weights, in eval mode, on the CPU.

    Raises PretrainedError (one line, naming the file) if the model is not shipped, its file is
    missing, its SHA-256 differs from the index, or the weights do not fit the architecture.
    """
    folder = Path(folder)
    info = pretrained_info(name, folder)
    state = _read_weights(info, folder)
    source = f"pretrained model {name!r} ({folder / info.file})"
    return rebuild(info.architecture, info.arguments, state, source, PretrainedError).eval()


def export_pretrained(
    model: nn.Module,
    name: str,
    *,
    description: str,
    dataset: str,
    architecture: str,
    arguments: Mapping[str, Any],
    test_accuracy: float,
    run: Mapping[str, Any],
    folder: str | Path = WEIGHTS_DIR,
) -> PretrainedInfo:
    """Write ``model``'s weights as ``folder/NAME.safetensors.shuf.xz`` (``pack_weights``) and
    its entry into ``index.json`` (replacing an entry of the same name, and its file).
    ``arguments`` must rebuild ``model`` through ``MODELS[architecture]``; that is checked by
    loading the file back. The entry lists every constructor argument (``full_arguments``),
    defaults included."""
    from safetensors.torch import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    file = f"{name}{PACKED_SUFFIX}"
    state = {key: value.detach().cpu().contiguous() for key, value in model.state_dict().items()}
    entries = pretrained_models(folder)
    replaced = entries.get(name)
    write_atomic(folder / file, pack_weights(save(state)))
    info = PretrainedInfo(
        name=name,
        description=description,
        dataset=dataset,
        architecture=architecture,
        arguments=json.loads(json.dumps(full_arguments(architecture, arguments))),
        file=file,
        sha256=file_sha256(folder / file),
        test_accuracy=float(test_accuracy),
        run=json.loads(json.dumps(dict(run))),
    )
    entries = {**entries, name: info}
    text = json.dumps([asdict(entry) for entry in entries.values()], indent=2) + "\n"
    write_atomic(folder / INDEX_NAME, text.encode())
    if replaced is not None and replaced.file != file:  # e.g. a plain .safetensors of before
        (folder / replaced.file).unlink(missing_ok=True)
    load_pretrained(name, folder)
    return info


def _samples_path(dataset: str, folder: Path) -> Path:
    return folder / f"samples-{dataset}.safetensors"


def export_samples(
    images: torch.Tensor,
    labels: torch.Tensor,
    classes: list[str],
    dataset: str,
    folder: str | Path = WEIGHTS_DIR,
) -> Path:
    """Ship ``images`` (uint8 ``(B, C, H, W)``) and ``labels`` (``(B,)``) of ``dataset``'s test
    set, with the class names, as ``samples-DATASET.safetensors``."""
    from safetensors.torch import save

    if images.dtype != torch.uint8 or images.dim() != 4 or labels.shape != images.shape[:1]:
        raise ValueError(
            f"expected uint8 images (B, C, H, W) and labels (B,), got {images.dtype} "
            f"{tuple(images.shape)} and {tuple(labels.shape)}"
        )
    path = _samples_path(dataset, Path(folder))
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"images": images.contiguous(), "labels": labels.to(torch.int64).contiguous()}
    write_atomic(path, save(tensors, metadata={"classes": json.dumps(list(classes))}))
    return path


def sample_images(dataset: str, folder: str | Path = WEIGHTS_DIR) -> tuple[torch.Tensor, list[str]]:
    """The shipped test images of ``dataset`` as floats ``(B, C, H, W)`` in ``[0, 1]``, and a
    caption per image (``"test i: CLASS"``). PretrainedError if none are shipped."""
    from safetensors import SafetensorError, safe_open

    path = _samples_path(dataset, Path(folder))
    if not path.is_file():
        raise PretrainedError(f"no test images of {dataset!r} are shipped (no {path})")
    try:
        with safe_open(str(path), framework="pt") as handle:
            images = handle.get_tensor("images")
            labels = handle.get_tensor("labels")
            classes = parse_json(handle.metadata()["classes"])
    except (SafetensorError, KeyError, ValueError) as err:
        raise PretrainedError(f"the shipped test images {path} cannot be read ({err})") from err
    captions = [f"test {i}: {classes[int(y)]}" for i, y in enumerate(labels)]
    return images.float() / 255.0, captions


def checkpoint_or_pretrained(checkpoint: str | None, pretrained: str | None) -> str:
    """For commands that take ``CHECKPOINT`` or ``--pretrained NAME``: which one was given
    (``"checkpoint"`` or ``"pretrained"``); UserError unless exactly one was."""
    if (checkpoint is None) == (pretrained is None):
        raise UserError("give a CHECKPOINT or --pretrained NAME (one of them)")
    return "checkpoint" if pretrained is None else "pretrained"


PRETRAINED_PREFIX = "pretrained:"


def pretrained_checkpoint(name: str, folder: str | Path = WEIGHTS_DIR) -> dict[str, Any]:
    """The shipped model ``name`` as a checkpoint dict (``attnconv.models.checkpoint``'s entries:
    preset ``name``, dataset, architecture, arguments, model weights), e.g. to fine-tune it."""
    folder = Path(folder)
    info = pretrained_info(name, folder)
    return {
        "preset": name,
        "dataset": info.dataset,
        "architecture": info.architecture,
        "arguments": dict(info.arguments),
        "model": _read_weights(info, folder),
    }


def load_init_checkpoint(spec: str) -> dict[str, Any]:
    """A checkpoint to start from: ``spec`` is a checkpoint file, or ``pretrained:NAME`` for a
    model shipped with attnconv ([`pretrained_checkpoint`][])."""
    from attnconv.models.checkpoint import load_checkpoint

    if spec.startswith(PRETRAINED_PREFIX):
        return pretrained_checkpoint(spec[len(PRETRAINED_PREFIX) :])
    return load_checkpoint(spec)
