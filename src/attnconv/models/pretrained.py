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
    the file's bytes, checked before anything is read), size (for a packed file: the bytes of the
    safetensors file it unpacks to; unpacking stops there, so a file that would expand further is
    refused without the memory it asks for), test_accuracy (on the dataset's test set, in
    [0, 1]), and the run that made it (the ``attnconv train`` command that repeats it, epochs,
    best epoch, precision, training time, and the machine where the run recorded it).

Every file here is read through ``attnconv.runs``'s bounded reader: sizes bounded, the
safetensors header's size and nesting bounded and its entries checked, the file named in the
one-line error.

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
from attnconv.runs import (
    MAX_JSON_BYTES,
    FileFormatError,
    json_kind,
    parse_json,
    read_file,
    read_xz,
    safetensors_header,
    write_atomic,
)

WEIGHTS_DIR = Path(__file__).with_name("weights")
INDEX_NAME = "index.json"
# A few test images of each dataset the shipped models were trained on, so that figures and the
# explorer of models with content scores work offline: ``samples-DATASET.safetensors``.
SAMPLE_COUNT = 8


PACKED_SUFFIX = ".safetensors.shuf.xz"
# The largest weight file read, packed or not, and the most a packed one may unpack to: the
# paper's largest model (learned-content, 29.5M float32 parameters) takes 118 MB.
MAX_WEIGHTS_BYTES = 2**30
# Bytes per element of each safetensors dtype (the rest: 1, which the regrouping leaves alone).
_ELEMENT_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                  "I16": 2, "U16": 2}


class PretrainedError(UserError):
    """Shipped weights that are missing, corrupted or do not fit their model (one-line message)."""


def _regroup_tensor_bytes(data: bytes, restore: bool, where: str = "the safetensors data") -> bytes:
    """``data`` (a safetensors file) with every tensor's bytes regrouped by their place in an
    element (``restore``: put back). The header is left as it is, so it reads the same either
    way. FileFormatError (a ValueError) naming ``where`` if the header is not a safetensors one
    (``attnconv.runs.safetensors_header``: size and nesting bounded, entries checked) or a tensor
    lies outside the data."""
    header, start = safetensors_header(data, where)
    out = bytearray(data)
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        width = _ELEMENT_BYTES.get(entry["dtype"], 1)
        first, last = (start + offset for offset in entry["data_offsets"])
        if (last - first) % width:
            raise FileFormatError(f"{where}: tensor {name[:40]!r} lies outside the file's data")
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


def unpack_weights(
    packed: bytes, size: int | None = None, where: str = "the packed weights"
) -> bytes:
    """The safetensors bytes [`pack_weights`][] packed, exactly. ``size``: the bytes they must
    have (the index's ``size``); decompression stops there (else at ``MAX_WEIGHTS_BYTES``), so a
    file that expands further costs no more memory than that. FileFormatError (a ValueError)
    naming ``where`` for bytes that are not such a file or unpack to another size."""
    limit = MAX_WEIGHTS_BYTES if size is None else min(size, MAX_WEIGHTS_BYTES)
    data = read_xz(packed, limit, where)
    if size is not None and len(data) != size:
        raise FileFormatError(
            f"{where} cannot be read (it unpacks to {len(data)} bytes, its index entry says "
            f"{size})"
        )
    return _regroup_tensor_bytes(data, restore=True, where=where)


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
    size: int | None = None


# The type of each entry field of index.json (``run`` may be left out, and ``size`` but for a
# packed file).
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
    "size": int,
}
_OPTIONAL_FIELDS = ("run", "size")


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
        entries = parse_json(read_file(path, MAX_JSON_BYTES, "the pretrained index").decode())
    except FileFormatError:
        raise
    except ValueError as err:  # UnicodeDecodeError, JSONDecodeError, too deeply nested
        reason = str(err).splitlines()[0][:120]
        raise corrupted(f"not UTF-8 JSON ({reason})") from err
    if not isinstance(entries, list):
        raise corrupted(f"not a JSON list of model entries ({json_kind(entries)})")
    models = {}
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise corrupted(f"entry {number} is not a JSON object ({json_kind(entry)})")
        name = str(entry.get("name", "?"))[:40]
        missing = [key for key in _ENTRY_TYPES if key not in _OPTIONAL_FIELDS and key not in entry]
        if str(entry.get("file", "")).endswith(PACKED_SUFFIX) and "size" not in entry:
            missing.append("size (a packed file's unpacked size)")
        unknown = sorted(str(key)[:40] for key in entry if key not in _ENTRY_TYPES)
        if missing or unknown:
            lacks = f"lacks {', '.join(missing)}" if missing else ""
            extra = f"has unknown field(s) {', '.join(unknown)}" if unknown else ""
            raise corrupted(f"entry {number} ({name}) {' and '.join(filter(None, (lacks, extra)))}")
        for key, value in entry.items():
            expected = _ENTRY_TYPES[key]
            if not isinstance(value, expected) or isinstance(value, bool):
                kind = json_kind(1.0 if key == "test_accuracy" else expected())
                raise corrupted(
                    f"entry {number} ({name}) has a malformed {key} ({json_kind(value)}, "
                    f"expected {kind})"
                )
        if "size" in entry and not 0 < entry["size"] <= MAX_WEIGHTS_BYTES:
            raise corrupted(
                f"entry {number} ({name}) has a size of {entry['size']} bytes, not in "
                f"[1, {MAX_WEIGHTS_BYTES}]"
            )
        models[entry["name"]] = PretrainedInfo(**entry)
    return models


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
    if not path.exists():
        raise PretrainedError(
            f"the weight file {path} of pretrained model {info.name!r} is missing; reinstall "
            f"attnconv"
        )
    data = read_file(path, MAX_WEIGHTS_BYTES, "the weight file")
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise PretrainedError(
            f"the weight file {path} of pretrained model {info.name!r} is corrupted (SHA-256 "
            f"differs from the index); reinstall attnconv"
        )
    try:
        if info.file.endswith(PACKED_SUFFIX):
            data = unpack_weights(data, info.size, f"the weight file {path}")
        else:
            safetensors_header(data, f"the weight file {path}")
        return load_safetensors(data)
    except FileFormatError as err:
        raise PretrainedError(str(err)) from err
    except (SafetensorError, ValueError, KeyError, TypeError) as err:
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
    plain = save(state)
    write_atomic(folder / file, pack_weights(plain))
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
        size=len(plain),
    )
    entries = {**entries, name: info}
    fields = [
        {key: value for key, value in asdict(entry).items() if value is not None or key != "size"}
        for entry in entries.values()
    ]
    text = json.dumps(fields, indent=2) + "\n"
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
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = _samples_path(dataset, Path(folder))
    if not path.exists():
        raise PretrainedError(f"no test images of {dataset!r} are shipped (no {path})")
    try:
        data = read_file(path, MAX_WEIGHTS_BYTES, "the shipped test images")
        header, _ = safetensors_header(data, f"the shipped test images {path}")
        tensors = load(data)
        images, labels = tensors["images"], tensors["labels"]
        classes = parse_json(header["__metadata__"]["classes"])
        named = isinstance(classes, list) and all(0 <= int(y) < len(classes) for y in labels)
        if not named:
            raise ValueError("its labels do not name its classes")
    except FileFormatError as err:
        raise PretrainedError(str(err)) from err
    except (SafetensorError, KeyError, ValueError, TypeError) as err:
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
