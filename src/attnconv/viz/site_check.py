"""Checks of an explorer site read back to be put on another page (``export.read_site``,
``attnconv explore --add``): every file it names lies inside the site, and each model's data is
what ``export.write_explorer`` writes (see ``attnconv.viz.export`` for the format), every array as
long as its shape says and every shape fitting the model's token grid and heads.

Nothing is sized from a file's claims before they are checked against the bytes the site holds: a
page written from a grid of 10⁹ × 10⁹ tokens would hang the browser tab that opens it.
``SiteError`` names the file and what was expected.
"""

from __future__ import annotations

import base64
import binascii
import math
from pathlib import Path
from typing import Any

from attnconv.errors import UserError

KINDS = ("position", "content", "probabilities")


class SiteError(UserError):
    """An explorer site file that is not what ``write_explorer`` writes; one line naming it."""


def site_file(root: Path, name: Any, where: Path) -> Path:
    """The file ``name`` (a path relative to the site folder ``root``, as ``where`` gives it),
    which must lie inside ``root``."""
    if not isinstance(name, str) or not name:
        raise SiteError(f"{where}: a file entry is {name!r}, expected a path inside {root}")
    path = (root / name).resolve()
    if not path.is_relative_to(root.resolve()):
        raise SiteError(f"{where}: the file {name!r} lies outside the site {root}; expected a "
                        f"path inside it")  # fmt: skip
    if not path.is_file():
        raise SiteError(f"{where}: the file {name!r} it names is not in the site {root}")
    return path


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(entry: Any, key: str, kind: type | tuple[type, ...], where: Path, what: str) -> Any:
    """``entry[key]``, which must be there and of type ``kind``."""
    if not isinstance(entry, dict) or key not in entry:
        raise SiteError(f"{where}: {what} lacks {key!r}")
    value = entry[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise SiteError(f"{where}: {what} has a malformed {key!r} ({type(value).__name__})")
    return value


def _sizes(value: Any, count: int, where: Path, what: str) -> list[int]:
    """``value`` as ``count`` positive whole numbers."""
    if (
        not isinstance(value, list)
        or len(value) != count
        or not all(_whole(v) and v > 0 for v in value)
    ):
        raise SiteError(f"{where}: {what} is {value!r:.80}, expected {count} positive whole numbers")
    return value


def _length(text: Any, expected: int, where: Path, what: str) -> None:
    """``text`` is base64 of ``expected`` bytes."""
    try:
        got = len(base64.b64decode(text, validate=True)) if isinstance(text, str) else -1
    except (binascii.Error, ValueError):
        got = -1
    if got != expected:
        held = "no base64" if got < 0 else f"{got} bytes"
        raise SiteError(f"{where}: {what} holds {held}, expected {expected} bytes for its shape")


def _quantized(payload: Any, shape: list[int], where: Path, what: str, kind: str = "quantized"):
    """A ``quantize`` payload of ``shape`` (``kind`` ``"sum"``: the positional row and column
    parts, with their ``split``)."""
    if _field(payload, "type", str, where, what) != kind:
        raise SiteError(f"{where}: {what} is of type {payload['type']!r:.40}, expected {kind!r}")
    if _field(payload, "shape", list, where, what) != shape:
        raise SiteError(f"{where}: {what} has shape {payload['shape']!r:.80}, expected {shape}")
    rows = math.prod(shape[:-1])
    _length(payload.get("codes"), 2 * rows * shape[-1], where, f"{what}'s codes")
    _length(payload.get("lo"), 4 * rows, where, f"{what}'s lo")
    _length(payload.get("step"), 4 * rows, where, f"{what}'s step")


def check_manifest(manifest: Any, where: Path) -> list[dict[str, Any]]:
    """The model entries of a site's ``data.js`` object, each with its name, description,
    dataset, test accuracy and file."""
    models = _field(manifest, "models", list, where, "the site")
    for number, info in enumerate(models):
        what = f"model {number}"
        _field(info, "name", str, where, what)
        _field(info, "description", str, where, what)
        _field(info, "dataset", (str, type(None)), where, what)
        _field(info, "test_accuracy", (int, float, type(None)), where, what)
        _field(info, "file", str, where, what)
    return models


def check_model(data: Any, where: Path) -> None:
    """A ``model.js`` object: its kind, token grid, image size, heads and images (their pixels
    as long as the image size says); ``check_layers`` and ``check_image_file`` check the rest."""
    kind = _field(data, "kind", str, where, "the model")
    if kind not in KINDS:
        raise SiteError(f"{where}: the model is of kind {kind!r:.40}, expected one of {KINDS}")
    _field(data, "meta", dict, where, "the model")
    _sizes(data.get("grid"), 2, where, "the token grid")
    height, width = _sizes(data.get("image_size"), 2, where, "the image size")
    stem = _field(data, "stem", int, where, "the model")
    if stem < 1:
        raise SiteError(f"{where}: the stem is {stem}, expected a positive whole number")
    heads = _field(data, "heads", list, where, "the model")
    _sizes(heads, len(heads), where, "the heads per layer")
    if not heads:
        raise SiteError(f"{where}: the model has no layers, expected at least one")
    if "logit" in data:
        _field(data, "logit", str, where, "the model")
    if "class_token" in data and (data["class_token"] is not True or kind != "content"):
        raise SiteError(f"{where}: the model's class_token is {data['class_token']!r:.40}, "
                        f"expected true on a model of kind 'content'")  # fmt: skip
    for number, image in enumerate(_field(data, "images", list, where, "the model")):
        what = f"image {number}"
        _field(image, "label", str, where, what)
        channels = _field(image, "channels", int, where, what)
        if channels not in (1, 3):
            raise SiteError(f"{where}: {what} has {channels} channels, expected 1 or 3")
        _length(image.get("pixels"), height * width * channels, where, f"{what}'s pixels")
        if "file" in image:
            _field(image, "file", str, where, what)
            if kind == "position":
                raise SiteError(f"{where}: {what} names a file, which a position-only model's "
                                f"images have none of")  # fmt: skip
        if "average" in image and not (_whole(image["average"]) and image["average"] > 0):
            raise SiteError(f"{where}: {what} averages {image['average']!r:.40} images, expected "
                            f"a positive whole number")  # fmt: skip
    check_layers(data, where)
    if "content" in data:
        check_content(data["content"], where)


def _share_or_none(value: Any) -> bool:
    """None, or a number in ``[0, 1]``."""
    return value is None or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1
    )


def _number_or_none(value: Any) -> bool:
    """None, or a finite number."""
    return value is None or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    )


def check_content(content: Any, where: Path) -> None:
    """A model's ``"content"`` diagnostics (``ContentDiagnostics.to_dict``): the images they were
    measured on, the accuracies (shares, or null without labels), the predictions changed (0 to
    the images) and per layer its name, kind, keys, an entropy per head (null for one key), gates
    per head or null, the query/key norm ratios (null: no start)."""
    what = "the content diagnostics"
    images = _field(content, "images", int, where, what)
    changed = _field(content, "changed", int, where, what)
    if images < 1 or not 0 <= changed <= images:
        raise SiteError(f"{where}: {what} count {changed} changed of {images} images, expected "
                        f"0 to a positive number of images")  # fmt: skip
    for key in ("accuracy", "ablated_accuracy"):
        if not _share_or_none(content.get(key)):
            raise SiteError(f"{where}: {what}' {key} is {content.get(key)!r:.40}, expected a "
                            f"share in [0, 1] or null")  # fmt: skip
    _field(content, "start", (str, type(None)), where, what)
    for number, layer in enumerate(_field(content, "layers", list, where, what)):
        name = f"content layer {number}"
        _field(layer, "name", str, where, name)
        _field(layer, "kind", str, where, name)
        _field(layer, "keys", int, where, name)
        entropy = _field(layer, "entropy", list, where, name)
        gates = _field(layer, "gates", (list, type(None)), where, name)
        count = _field(layer, "changed", int, where, name)
        if not 0 <= count <= images:
            raise SiteError(f"{where}: {name} changed {count} of {images} predictions")
        if not entropy or not all(_number_or_none(e) for e in entropy):
            raise SiteError(f"{where}: {name}'s entropy is not a number (or null) per head")
        if gates is not None and (
            len(gates) != len(entropy) or not all(_share_or_none(g) for g in gates)
        ):
            raise SiteError(f"{where}: {name}'s gates are not a share per head")
        for key in ("query_ratio", "key_ratio"):
            if not _number_or_none(layer.get(key)):
                raise SiteError(f"{where}: {name}'s {key} is {layer.get(key)!r:.40}, expected a "
                                f"number or null")  # fmt: skip
        if not _share_or_none(layer.get("accuracy")):
            raise SiteError(f"{where}: {name}'s accuracy is {layer.get('accuracy')!r:.40}, "
                            f"expected a share in [0, 1] or null")  # fmt: skip


def _layer_sizes(data: dict[str, Any], where: Path) -> list[tuple[int, int]]:
    """Per layer, the number of query and key tokens: the token grid's for every layer but a
    transformed network's, whose ``layer_grids`` give each layer's own."""
    tokens = math.prod(data["grid"])
    if data["kind"] != "probabilities":
        return [(tokens, tokens)] * len(data["heads"])
    grids = _field(data, "layer_grids", list, where, "the model")
    if len(grids) != len(data["heads"]):
        raise SiteError(f"{where}: {len(grids)} layer grids, expected one per layer "
                        f"({len(data['heads'])})")  # fmt: skip
    sizes = []
    for number, grid in enumerate(grids):
        what = f"layer grid {number}"
        _field(grid, "name", str, where, what)
        query = _sizes(grid.get("query"), 2, where, f"{what}'s query grid")
        key = _sizes(grid.get("key"), 2, where, f"{what}'s key grid")
        for axis, name in enumerate(("rows", "cols")):
            places = grid.get(name)
            if (
                not isinstance(places, list)
                or len(places) != query[axis]
                or not all(_whole(p) and 0 <= p < key[axis] for p in places)
            ):
                raise SiteError(f"{where}: {what}'s {name} are not {query[axis]} key {name} in "
                                f"[0, {key[axis]})")  # fmt: skip
        sizes.append((math.prod(query), math.prod(key)))
    return sizes


def check_layers(data: dict[str, Any], where: Path) -> None:
    """The layers a position-only model stores in its ``model.js`` (the others: none)."""
    _layer_sizes(data, where)
    if data["kind"] != "position":
        return
    layers = _field(data, "layers", list, where, "the model")
    if len(layers) != len(data["heads"]):
        raise SiteError(f"{where}: {len(layers)} layers, expected {len(data['heads'])}")
    h, w = data["grid"]
    for number, (layer, heads) in enumerate(zip(layers, data["heads"], strict=True)):
        what = f"layer {number}"
        if isinstance(layer, dict) and layer.get("type") == "product":
            _length(layer.get("row"), 4 * heads * h * h, where, f"{what}'s row factors")
            _length(layer.get("col"), 4 * heads * w * w, where, f"{what}'s column factors")
        else:
            _quantized(layer, [heads, h * w, h * w], where, what)


def check_image_file(data: dict[str, Any], payload: Any, average: bool, where: Path) -> None:
    """The file of one image entry of ``data`` (``average``: the averaged probabilities)."""
    sizes = _layer_sizes(data, where)
    key = "average" if average else "probs" if data["kind"] == "probabilities" else "layers"
    layers = _field(payload, key, list, where, "the file")
    if len(layers) != len(sizes):
        raise SiteError(f"{where}: {len(layers)} layers, expected {len(sizes)}")
    h, w = data["grid"]
    for number, (layer, heads, (queries, keys)) in enumerate(
        zip(layers, data["heads"], sizes, strict=True)
    ):
        what = f"layer {number}"
        if key != "layers":
            _quantized(layer, [heads, queries, keys], where, what)
            continue
        content = _field(layer, "content", (dict, type(None)), where, what)
        if isinstance(content, dict) and content.get("type") == "factors":
            _field(content, "shape", list, where, f"{what}'s content")
            if content["shape"] != [heads, queries, keys]:
                raise SiteError(f"{where}: {what}'s content has shape {content['shape']!r:.80}, "
                                f"expected {[heads, queries, keys]}")  # fmt: skip
            dim = _field(content, "dim", int, where, f"{what}'s content")
            if dim < 1:
                raise SiteError(f"{where}: {what}'s content has dim {dim}, expected >= 1")
            for part in ("query", "key"):
                _length(content.get(part), 4 * heads * queries * dim, where, f"{what}'s {part}")
        elif content is not None:
            _quantized(content, [heads, queries, keys], where, f"{what}'s content")
        position = _field(layer, "position", (dict, type(None)), where, what)
        if isinstance(position, dict) and position.get("type") == "sum":
            if position.get("split") != h:
                raise SiteError(f"{where}: {what}'s position splits at "
                                f"{position.get('split')!r:.40}, expected {h}")  # fmt: skip
            _quantized(position, [heads, queries, h + w], where, f"{what}'s position", "sum")
        elif position is not None:
            _quantized(position, [heads, queries, keys], where, f"{what}'s position")
    if data.get("class_token"):
        _check_views(data, payload, where)


def _check_views(data: dict[str, Any], payload: dict[str, Any], where: Path) -> None:
    """The rollout and class-token views of an image file of a model with a class token."""
    views = _field(payload, "views", dict, where, "the file")
    tokens = math.prod(data["grid"])
    _quantized(views.get("rollout"), [1 + tokens, tokens], where, "the rollout")
    classes = _field(views, "class", list, where, "the views")
    if len(classes) != len(data["heads"]):
        raise SiteError(f"{where}: the class token's view has {len(classes)} layers, expected "
                        f"{len(data['heads'])}")  # fmt: skip
    for number, (layer, heads) in enumerate(zip(classes, data["heads"], strict=True)):
        if layer is not None:
            _quantized(layer, [heads, tokens], where, f"the class token's layer {number}")
