r"""The explorer: a self-contained static site to click through models' attention in a browser.

``write_explorer(models, out_dir)`` writes one page for one or more models (``SiteModel``): a model
switcher, each model's name, description and test accuracy, a few test images and, for models
with content scores, the attention averaged over more test images. ``write_site`` is the one-model
case. The site is ``index.html``, ``app.js``, ``style.css`` (package data,
``attnconv/viz/explorer/``) and the data as JavaScript files, because browsers refuse ``fetch`` of
local files under ``file://`` but run ``<script>``s:

* ``data.js``: ``window.ATTNCONV_SITE``, the manifest: the colour map, the ``floor`` of the
  probability colour scales (``maps.FLOOR``: each reaches at least ``floor/N``), every model's name,
  description, dataset, test accuracy, grid, heads per layer and its ``model.js``, and the models
  left out (``skipped``: name and reason).
* ``models/I/model.js``, loaded when model ``I`` is first shown: its description, test images
  (pixels) and, for a position-only model, every layer's probabilities (the same for every image).
  Separable layers (isotropic Gaussian, learned) store their exact row and column factors
  ``R (heads, h, h)`` and ``C (heads, w, w)``, with $P_{q,k} = R_{q_1,k_1} C_{q_2,k_2}$; other
  layers store ``P (heads, N, N)`` quantised.
* ``models/I/image_NNN.js`` (models with content scores), loaded when the image is picked: per layer
  the content logits $q^\top k / \sqrt d$, as the float32 factors $q / \sqrt d$ and $k$
  ``(heads, N, d)`` when that is smaller than ``(heads, N, N)`` quantised, and the positional logits
  (all terms with $r_\delta$: $w^\top r_\delta$, $q^\top r_\delta / \sqrt d$, or the Gaussian score)
  as row and column parts ``(heads, N, h + w)`` whose sum over a key's row and column is the logit.
  The page adds them for the total score and applies the softmax itself.
* ``models/I/average.js`` (models with content scores): the probabilities averaged over the
  ``average_images`` ``(heads, N, N)`` quantised, per layer.

A transformed network (T-CNN, ``TransformedNetwork``) is a model of kind ``"probabilities"``: its
attention mixes Gaussian heads and gated content (``TransformedConv2d.attention``), so the files
hold probabilities, not score terms, and each transformed layer has grids of its own. The picker's
``grid`` is the image's pixels (``stem`` 1), and ``layer_grids`` gives per layer its ``name``, its
``query`` grid (the output pixels), its ``key`` grid (the input pixels) and ``rows``/``cols``, the
input row and column where each output row's and column's query sits. The page queries each
layer at the output pixel nearest the clicked pixel (the image scaled onto the output grid) and
draws ``(heads, N_in)`` maps on the input grid. ``models/I/image_NNN.js`` holds ``{"probs":
[(heads, N_out, N_in) quantised per layer]}``; ``average.js`` is as for content models, with
these shapes.

A model whose attention was recorded from a network attnconv did not build (``attnconv.analysis``:
timm and torchvision vision transformers) is a model with content scores whose content logits are
the recorded log-probabilities (``"logit": "log-probability"``: the page names them so), and no
positional term (``recorded_explorer_data``). With a class token (``"class_token": true``) each
image file and ``average.js`` also hold ``"views"`` (``token_views_payload``): the attention
rollout (``attnconv.analysis.rollout``) as quantised ``(1 + N, N)``, row 0 the class token's and
row ``1 + q`` patch ``q``'s, each over the patches renormalised to sum to one
(``attnconv.viz.rollout.rollout_rows``), and per layer the class token's attention to the patches
``(heads, N)`` quantised (None for a layer without the class token). ``read_site`` reads a written
site's models back, to put them on another page (``attnconv explore --add``).

A model with content attention may carry ``"content"`` in its ``model.js``: whether that attention
is alive, measured by ``attnconv.analysis.content`` on the page's test images
(``ContentDiagnostics.to_dict``: per layer the entropy ÷ log N of each head's content map, its
gates, query/key norms against the start and the predictions that change when the layer's
content maps are made uniform). The page shows one line per layer under the model's header.

Every data file assigns its object to ``window.ATTNCONV_FILES[PATH]``, its path from the site
root. Arrays are base64 of little-endian bytes. "Quantised" arrays are ``uint16`` codes with a
``float32`` offset and step per last-axis row: ``value = lo + code · step`` (error ≤ step / 2, the
row's range / 131070).
"""

from __future__ import annotations

import base64
import copy
import functools
import http.server
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnconv.attention import MultiHeadSelfAttention2d, scores
from attnconv.errors import UserError
from attnconv.models.modes import evaluating
from attnconv.models.transformed import TransformedNetwork
from attnconv.runs import parse_json, read_file, write_atomic, write_text_atomic
from attnconv.viz.maps import FLOOR, attention_layers, compute_attention, token_grid
from attnconv.viz.rollout import rollout_rows
from attnconv.viz.site_check import (
    SiteError,
    check_image_file,
    check_manifest,
    check_model,
    site_file,
)

FORMAT = "attnconv-explorer"
VERSION = 1
STATIC_FILES = ("index.html", "app.js", "style.css")
QUANT_LEVELS = 65535


def encode(array: np.ndarray | Tensor, dtype: str) -> str:
    """Base64 of ``array`` as little-endian ``dtype`` (``"<f4"``, ``"<u2"``, ``"|u1"``), row-major."""
    if isinstance(array, Tensor):
        array = array.detach().cpu().numpy()
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def quantize(values: Tensor) -> dict[str, Any]:
    """Quantise ``values (..., n)`` row by row (last axis) into uint16 codes.

    Returns ``{"type": "quantized", "shape", "codes", "lo", "step"}`` (base64); decoding is
    ``lo[row] + code · step[row]`` with ``lo``/``step`` float32, exact to ``step / 2``.
    """
    x = values.detach().double().cpu()
    if not torch.isfinite(x).all():
        raise ValueError("cannot quantise non-finite values")
    lo = x.amin(dim=-1).float().double()
    step = ((x.amax(dim=-1) - lo) / QUANT_LEVELS).float().double()
    safe = torch.where(step > 0, step, torch.ones_like(step))
    codes = ((x - lo[..., None]) / safe[..., None]).round().clamp(0, QUANT_LEVELS)
    return {
        "type": "quantized",
        "shape": list(x.shape),
        "codes": encode(codes.to(torch.int32), "<u2"),
        "lo": encode(lo, "<f4"),
        "step": encode(step, "<f4"),
    }


def dequantize(payload: dict[str, Any]) -> np.ndarray:
    """Inverse of ``quantize`` (float64), as the page computes it."""
    shape = payload["shape"]
    codes = np.frombuffer(base64.b64decode(payload["codes"]), "<u2").reshape(shape)
    lo = np.frombuffer(base64.b64decode(payload["lo"]), "<f4").astype(np.float64)
    step = np.frombuffer(base64.b64decode(payload["step"]), "<f4").astype(np.float64)
    return lo.reshape(*shape[:-1], 1) + codes * step.reshape(*shape[:-1], 1)


# ---------------------------------------------------------------- position-only layers


@torch.no_grad()
def position_layer_payload(layer: MultiHeadSelfAttention2d, grid: tuple[int, int]) -> dict:
    """Probabilities of a position-only layer: exact row/column factors when separable
    (``{"type": "product", "row", "col"}``, float32), else quantised ``(heads, N, N)``."""
    h, w = grid
    probs = layer.attention_probs(h, w).double().cpu()
    if not layer.separable:
        return quantize(probs)
    grid_probs = probs.view(layer.heads, h, w, h, w)
    # P = R ⊗ C with rows of R and C summing to one: marginalise over the other axis.
    row = grid_probs[:, :, 0, :, :].sum(dim=-1)  # (heads, h, h) over (q1, k1)
    col = grid_probs[:, 0, :, :, :].sum(dim=-2)  # (heads, w, w) over (q2, k2)
    return {"type": "product", "row": encode(row, "<f4"), "col": encode(col, "<f4")}


# ---------------------------------------------------------------- layers with content scores


@dataclass
class ScoreTerms:
    r"""Logits of one layer for a batch, split as the explorer shows them.

    ``content``: ``(B, heads, N, N)`` $q^\top k / \sqrt d$ or None. ``position_row`` /
    ``position_col``: ``(B, heads, N, h)`` / ``(B, heads, N, w)``, the positional logit of query
    ``q`` and key ``(k₁, k₂)`` being ``position_row[..., q, k₁] + position_col[..., q, k₂]``; or
    ``position_dense`` ``(heads, N, N)`` (generalized Gaussian, the same for every image); all None
    when the layer has no positional score. ``query`` / ``key``: ``(B, heads, N, d)`` $q / \sqrt d$
    and $k$, whose products are ``content`` (None with it).
    """

    content: Tensor | None
    position_row: Tensor | None = None
    position_col: Tensor | None = None
    position_dense: Tensor | None = None
    query: Tensor | None = None
    key: Tensor | None = None

    def total(self) -> Tensor:
        """All logits ``(B, heads, N, N)``; their softmax is the layer's attention."""
        total = 0.0 if self.content is None else self.content
        if self.position_row is not None:
            b, heads, n, h = self.position_row.shape
            w = self.position_col.shape[-1]
            total = total + (
                self.position_row[..., :, None] + self.position_col[..., None, :]
            ).reshape(b, heads, n, h * w)
        if self.position_dense is not None:
            total = total + self.position_dense
        return total


@torch.no_grad()
def score_terms(layer: MultiHeadSelfAttention2d, x: Tensor) -> ScoreTerms:
    """Content and positional logits of ``layer`` for its input ``x (B, h, w, dim)``."""
    if layer.hard:
        raise ValueError("hard attention has no finite logits to show next to content scores")
    batch, h, w, _ = x.shape
    n, d = h * w, layer.head_dim
    rows = torch.arange(n, device=x.device) // w  # query row of each query index
    cols = torch.arange(n, device=x.device) % w
    q = None
    if layer.query is not None:
        q = layer.query(x).view(batch, n, layer.heads, d).transpose(1, 2)
    content = scaled_query = k = None
    if layer.key is not None:
        k = layer.key(x).view(batch, n, layer.heads, d).transpose(1, 2)
        scaled_query = q / math.sqrt(d)
        content = scaled_query @ k.transpose(-1, -2)
    vectors = {"query": scaled_query, "key": k}
    position = layer.position
    if position is None:
        return ScoreTerms(content, **vectors)
    if not position.separable:
        return ScoreTerms(content, position_dense=position.logits(h, w), **vectors)
    row, col = position.factors(h, w)  # (heads, h, h), (heads, w, w)
    position_row = row[:, rows].expand(batch, -1, -1, -1)  # (B, heads, N, h)
    position_col = col[:, cols].expand(batch, -1, -1, -1)  # (B, heads, N, w)
    if layer.content_positional:
        by_row, by_col = scores.content_positional_factors(
            q, position.row_embedding, position.col_embedding, h, w
        )  # (B, heads, N, h), (B, heads, N, w)
        position_row = position_row + by_row / math.sqrt(d)
        position_col = position_col + by_col / math.sqrt(d)
    return ScoreTerms(content, position_row, position_col, **vectors)


@torch.no_grad()
def model_score_terms(model: nn.Module, images: Tensor) -> list[ScoreTerms]:
    """``score_terms`` of every attention layer of ``model`` for ``images (B, C, H, W)`` in
    ``[0, 1]``, from the layers' actual inputs (captured with forward pre-hooks)."""
    layers = attention_layers(model)
    inputs: dict[int, Tensor] = {}
    hooks = [
        layer.register_forward_pre_hook(
            lambda _module, args, index=index: inputs.__setitem__(index, args[0])
        )
        for index, layer in enumerate(layers)
    ]
    try:
        with evaluating(model):
            model(images.to(next(model.parameters()).device))
    finally:
        for hook in hooks:
            hook.remove()
    return [score_terms(layer, inputs[index]) for index, layer in enumerate(layers)]


def content_payload(term: ScoreTerms, index: int) -> dict[str, Any]:
    r"""The content logits of image ``index``: float32 $q / \sqrt d$ and $k$ (``{"type": "factors",
    "dim", "query", "key"}``) when 2 × 4 bytes × d per token is less than the 2 bytes × N of a
    quantised row, else (or without ``q`` and ``k``) quantised ``(heads, N, N)``."""
    if term.key is None:
        return quantize(term.content[index])
    heads, n, dim = term.key.shape[1:]
    if 8 * dim >= 2 * n:
        return quantize(term.content[index])
    return {
        "type": "factors",
        "shape": [heads, n, n],
        "dim": dim,
        "query": encode(term.query[index], "<f4"),
        "key": encode(term.key[index], "<f4"),
    }


def decode_content(payload: dict[str, Any]) -> np.ndarray:
    """The content logits ``(heads, N, N)`` (float64) of a ``content_payload``, as the page
    computes them."""
    if payload["type"] == "quantized":
        return dequantize(payload)
    heads, n, _ = payload["shape"]
    shape = (heads, n, payload["dim"])
    query = np.frombuffer(base64.b64decode(payload["query"]), "<f4").reshape(shape)
    key = np.frombuffer(base64.b64decode(payload["key"]), "<f4").reshape(shape)
    return query.astype(np.float64) @ key.astype(np.float64).transpose(0, 2, 1)


def image_payload(terms: Sequence[ScoreTerms], index: int) -> dict[str, Any]:
    """The per-image file's content for image ``index`` of the batch the terms were computed on."""
    layers = []
    for term in terms:
        entry: dict[str, Any] = {"content": None, "position": None}
        if term.content is not None:
            entry["content"] = content_payload(term, index)
        if term.position_row is not None:
            split = term.position_row.shape[-1]
            entry["position"] = {
                **quantize(torch.cat([term.position_row[index], term.position_col[index]], -1)),
                "type": "sum",
                "split": split,
            }
        elif term.position_dense is not None:
            entry["position"] = quantize(term.position_dense)
        layers.append(entry)
    return {"layers": layers}


# ---------------------------------------------------------------- the site


def colormap_bytes(name: str = "viridis") -> str:
    """A matplotlib colour map as 256 RGB triples (base64 uint8)."""
    from matplotlib import colormaps

    rgb = colormaps[name](np.linspace(0.0, 1.0, 256))[:, :3]
    return encode(np.round(rgb * 255), "|u1")


def _check_images(images: Tensor | None, image_size: tuple[int, int], what: str) -> None:
    if images is None or not isinstance(images, Tensor) or images.dim() != 4:
        raise ValueError(f"{what}: a float tensor (B, C, H, W) in [0, 1]")
    if tuple(images.shape[2:]) != (int(image_size[0]), int(image_size[1])):
        raise ValueError(
            f"images are {images.shape[2]}x{images.shape[3]}, expected {tuple(image_size)}"
        )


def _pixels(image: Tensor) -> str:
    """One image ``(C, H, W)`` in ``[0, 1]`` as base64 uint8 ``(H, W, C)``."""
    return encode((image.clamp(0, 1) * 255).round().permute(1, 2, 0), "|u1")


def explorer_data(
    model: nn.Module | Sequence[MultiHeadSelfAttention2d],
    image_size: tuple[int, int],
    images: Tensor | None = None,
    labels: Sequence[str] | None = None,
    meta: dict[str, Any] | None = None,
    average_images: Tensor | None = None,
    content: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One model's data: ``(model.js object, [image file objects])``; image ``i``'s file is
    ``data["images"][i]["file"]`` (relative to the model's folder), if it has one. ``content``:
    the diagnostics of its content attention (module docstring), written as they are.

    ``images``: float ``(B, C, H, W)`` in ``[0, 1]``, required for models with content scores and
    transformed networks (one file each; ``transformed_explorer_data``); for position-only models, whose maps need no image, only drawn under the query
    picker. ``labels``: one caption per image. ``average_images`` (content models): the images the
    ``average.js`` entry averages the probabilities over.
    """
    data, files = _model_data(model, image_size, images, labels, meta, average_images)
    if content is not None:
        data["content"] = content
    return data, files


def _model_data(
    model: nn.Module | Sequence[MultiHeadSelfAttention2d],
    image_size: tuple[int, int],
    images: Tensor | None,
    labels: Sequence[str] | None,
    meta: dict[str, Any] | None,
    average_images: Tensor | None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``explorer_data`` without the content diagnostics."""
    if isinstance(model, TransformedNetwork):
        return transformed_explorer_data(model, images, labels, meta, average_images)
    layers = attention_layers(model)
    grid = token_grid(model, image_size)
    data: dict[str, Any] = {
        "meta": meta or {},
        "grid": list(grid),
        "stem": int(getattr(model, "stem", 1)),
        "image_size": [int(image_size[0]), int(image_size[1])],
        "heads": [layer.heads for layer in layers],
        "images": [],
    }
    position_only = all(layer.position_only for layer in layers)
    if images is not None or not position_only:
        _check_images(images, image_size, "a model with content scores needs test images")
        if labels is not None and len(labels) != images.shape[0]:
            raise UserError(f"got {len(labels)} labels for {images.shape[0]} images")
        for index in range(images.shape[0]):
            entry = {
                "label": labels[index] if labels is not None else f"image {index}",
                "channels": int(images.shape[1]),
                "pixels": _pixels(images[index]),
            }
            if not position_only:
                entry["file"] = f"image_{index:03d}.js"
            data["images"].append(entry)
    if position_only:
        data["kind"] = "position"
        data["layers"] = [position_layer_payload(layer, grid) for layer in layers]
        return data, []
    data["kind"] = "content"
    data["terms"] = {
        "content": any(layer.key is not None for layer in layers),
        "position": any(
            layer.positional is not None or layer.content_positional for layer in layers
        ),
    }
    files = [
        image_payload(model_score_terms(model, images[index : index + 1]), 0)
        for index in range(images.shape[0])
    ]
    if average_images is not None:
        _check_images(average_images, image_size, "average_images must be")
        probs = compute_attention(model, image_size, average_images).probs
        entry, payload = _average_entry(average_images, probs)
        data["images"].append(entry)
        files.append(payload)
    return data, files


def transformed_explorer_data(
    model: TransformedNetwork,
    images: Tensor | None,
    labels: Sequence[str] | None = None,
    meta: dict[str, Any] | None = None,
    average_images: Tensor | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The data of a transformed network, as ``explorer_data`` gives it (module docstring, kind
    ``"probabilities"``): every transformed layer's attention on each of ``images`` (float
    ``(B, C, H, W)`` in ``[0, 1]``, required, a caption each in ``labels``) and averaged over
    ``average_images``. ``meta`` gains each layer's mean content gate and mean distance moved
    from the kernel taps."""
    from attnconv.models.heads import transformed_head_table, transformed_layer_summary
    from attnconv.viz.transformed import transformed_attention

    size = tuple(int(s) for s in model.image_size)
    _check_images(images, size, "a transformed network needs test images")
    if images.shape[0] < 1:
        raise UserError("a transformed network needs at least one test image")
    if labels is not None and len(labels) != images.shape[0]:
        raise UserError(f"got {len(labels)} labels for {images.shape[0]} images")
    summary = transformed_layer_summary(transformed_head_table(model))
    data: dict[str, Any] = {
        "meta": {
            **(meta or {}),
            "mean content gate per layer": ", ".join(f"{r['mean_gate']:.2f}" for r in summary),
            "mean move from the taps per layer (px)": ", ".join(
                f"{r['mean_moved']:.2f}" for r in summary
            ),
        },
        "grid": list(size),
        "stem": 1,
        "image_size": list(size),
        "heads": [layer.heads for layer in model.transformed_layers().values()],
        "images": [],
        "kind": "probabilities",
    }
    files = []
    for index in range(images.shape[0]):
        layers = transformed_attention(model, images[index : index + 1])
        files.append({"probs": [quantize(layer.probs) for layer in layers]})
        data["images"].append(
            {
                "label": labels[index] if labels is not None else f"image {index}",
                "channels": int(images.shape[1]),
                "pixels": _pixels(images[index]),
                "file": f"image_{index:03d}.js",
            }
        )
    data["layer_grids"] = [
        {
            "name": layer.name,
            "query": list(layer.query_grid),
            "key": list(layer.key_grid),
            "rows": layer.query_rows.tolist(),
            "cols": layer.query_cols.tolist(),
        }
        for layer in layers
    ]
    if average_images is not None:
        _check_images(average_images, size, "average_images must be")
        probs = [layer.probs for layer in transformed_attention(model, average_images)]
        entry, payload = _average_entry(average_images, probs)
        data["images"].append(entry)
        files.append(payload)
    return data, files


def _average_entry(images: Tensor, probs: Sequence[Tensor]) -> tuple[dict, dict]:
    """The image entry and the file (``average.js``) of probabilities ``(heads, N, N)`` per layer
    (``(heads, N_out, N_in)`` for a transformed network) averaged over ``images``
    ``(B, C, H, W)``."""
    count = images.shape[0]
    entry = {
        "label": f"average over {count} test image{'s' if count > 1 else ''}",
        "channels": int(images.shape[1]),
        "pixels": _pixels(images.mean(dim=0)),
        "file": "average.js",
        "average": count,
    }
    return entry, {"average": [quantize(p) for p in probs]}


def token_views_payload(
    rollout: Tensor, prefix: int, grid: tuple[int, int], classes: Sequence[Tensor | None]
) -> dict[str, Any]:
    """The ``"views"`` of one image file (module docstring) from the rollout ``(T, T)`` of
    ``prefix`` tokens then the patches of ``grid``, and per layer the class token's attention
    ``(heads, N)`` to the patches (None: no class token in that layer)."""
    tokens = grid[0] * grid[1]
    rows = [rollout_rows(rollout, prefix, grid, query)[0] for query in (None, *range(tokens))]
    return {
        "rollout": quantize(torch.stack(rows).reshape(1 + tokens, tokens)),
        "class": [None if c is None else quantize(c) for c in classes],
    }


def recorded_explorer_data(
    image_probs: Sequence[Sequence[Tensor]],
    grid: tuple[int, int],
    stem: int,
    images: Tensor,
    labels: Sequence[str],
    average_probs: Sequence[Tensor],
    average_images: Tensor,
    meta: dict[str, Any] | None = None,
    views: Any = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The data of a model whose attention probabilities were recorded, not computed by attnconv's
    layers (``attnconv.analysis``), as ``(model.js object, [image file objects])``.

    It is a model with content scores whose per-image content logits are the log-probabilities
    (their softmax gives the probabilities back, up to quantisation; the page's logit view shows
    and names log-probabilities) and no positional term. ``image_probs``: per image of ``images``
    ``(K, C, H, W)`` in ``[0, 1]`` (with ``labels``), per layer ``(heads, N, N)`` on ``grid``;
    ``average_probs``: per layer, their mean over ``average_images``. ``views``: a ``TokenViews``
    (``attnconv.analysis.rollout``) of at least the ``K`` images and averaged over
    ``average_images``, as ``measure_patch_attention`` gives it; a model with a class token gets
    the page's views of it.
    """
    if len(image_probs) != images.shape[0] or len(labels) != images.shape[0]:
        raise ValueError(
            f"got {len(image_probs)} attention sets and {len(labels)} labels for "
            f"{images.shape[0]} images"
        )
    tiny = torch.finfo(torch.float32).tiny  # log of a probability that underflowed to zero
    data: dict[str, Any] = {
        "meta": meta or {},
        "grid": list(grid),
        "stem": int(stem),
        "image_size": [int(images.shape[2]), int(images.shape[3])],
        "heads": [int(p.shape[0]) for p in average_probs],
        "images": [],
        "kind": "content",
        "terms": {"content": True, "position": False},
        "logit": "log-probability",
    }
    class_token = views is not None and views.class_attention is not None
    if class_token:
        data["class_token"] = True
    files = []
    for index, layers in enumerate(image_probs):
        data["images"].append(
            {
                "label": labels[index],
                "channels": int(images.shape[1]),
                "pixels": _pixels(images[index]),
                "file": f"image_{index:03d}.js",
            }
        )
        terms = [ScoreTerms(p.double().clamp_min(tiny).log()[None]) for p in layers]
        files.append(image_payload(terms, 0))
        if class_token:
            files[-1]["views"] = token_views_payload(
                views.rollout_images[index], views.prefix, grid, views.class_attention_images[index]
            )
    entry, payload = _average_entry(average_images, average_probs)
    if class_token:
        payload["views"] = token_views_payload(
            views.rollout, views.prefix, grid, views.class_attention
        )
    data["images"].append(entry)
    files.append(payload)
    return data, files


@dataclass
class SiteModel:
    """One model of an explorer site (see ``explorer_data`` for the images and ``content``)."""

    name: str
    model: nn.Module | Sequence[MultiHeadSelfAttention2d]
    image_size: tuple[int, int]
    description: str = ""
    dataset: str | None = None
    test_accuracy: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    images: Tensor | None = None
    labels: Sequence[str] | None = None
    average_images: Tensor | None = None
    content: dict[str, Any] | None = None


@dataclass
class PreparedModel:
    """One model of an explorer site whose data is already in the site's format: ``data`` (the
    ``model.js`` object, image files named relative to the model's folder) and ``files`` (one
    object per image entry with a ``file``, in order); from ``recorded_explorer_data`` or
    ``read_site``."""

    name: str
    data: dict[str, Any]
    files: list[dict[str, Any]]
    description: str = ""
    dataset: str | None = None
    test_accuracy: float | None = None


def write_explorer(
    models: Sequence[SiteModel | PreparedModel],
    out_dir: str | Path,
    title: str = "attnconv explorer",
    skipped: dict[str, str] | None = None,
) -> list[Path]:
    """Write one explorer page for ``models`` (at least one) into ``out_dir``; ``skipped`` names
    models left out, with the reason, shown on the page. Returns the written files. Open
    ``out_dir/index.html`` in a browser (``file://`` works)."""
    if not models:
        raise UserError("an explorer site needs at least one model with attention")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    static = resources.files("attnconv.viz") / "explorer"
    for name in STATIC_FILES:
        with resources.as_file(static / name) as source:
            write_atomic(out / name, source.read_bytes())
        written.append(out / name)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "title": title,
        "colormap": colormap_bytes(),
        "floor": FLOOR,
        "models": [],
        "skipped": [{"name": name, "reason": why} for name, why in (skipped or {}).items()],
    }
    for number, entry in enumerate(models):
        if isinstance(entry, PreparedModel):
            data, files = copy.deepcopy(entry.data), entry.files
        else:
            data, files = explorer_data(
                entry.model,
                entry.image_size,
                entry.images,
                entry.labels,
                entry.meta,
                entry.average_images,
                entry.content,
            )
        folder = f"models/{number}"
        (out / folder).mkdir(parents=True, exist_ok=True)
        data["name"] = entry.name
        data["description"] = entry.description
        for image in data["images"]:
            if "file" in image:
                image["file"] = f"{folder}/{image['file']}"
        written.append(_write_data(out, f"{folder}/model.js", data))
        with_files = [image for image in data["images"] if "file" in image]
        for image, payload in zip(with_files, files, strict=True):
            written.append(_write_data(out, image["file"], payload))
        manifest["models"].append(
            {
                "name": entry.name,
                "description": entry.description,
                "dataset": entry.dataset,
                "test_accuracy": entry.test_accuracy,
                "kind": data["kind"],
                "grid": data["grid"],
                "heads": data["heads"],
                "file": f"{folder}/model.js",
            }
        )
    path = out / "data.js"
    write_text_atomic(
        path, "window.ATTNCONV_SITE = " + json.dumps(manifest, separators=(",", ":")) + ";\n"
    )
    written.append(path)
    return written


def write_site(
    model: nn.Module | Sequence[MultiHeadSelfAttention2d],
    out_dir: str | Path,
    image_size: tuple[int, int],
    images: Tensor | None = None,
    labels: Sequence[str] | None = None,
    name: str = "model",
    description: str = "",
    meta: dict[str, Any] | None = None,
) -> list[Path]:
    """The explorer page of one model (``write_explorer`` with one ``SiteModel``)."""
    entry = SiteModel(
        name, model, image_size, description, meta=meta or {}, images=images, labels=labels
    )
    return write_explorer([entry], out_dir, title=f"attnconv explorer: {name}")


def _write_data(out: Path, file: str, payload: dict[str, Any]) -> Path:
    path = out / file
    text = json.dumps(payload, separators=(",", ":"))
    write_text_atomic(path, f"window.ATTNCONV_FILES[{json.dumps(file)}] = {text};\n")
    return path


MAX_DATA_BYTES = 2**30
"""The largest site data file ``read_data`` reads (a model's with many test images: megabytes)."""


def read_data(path: str | Path) -> dict[str, Any]:
    """The object a site's data file (``data.js`` or one under ``models/``) assigns. SiteError
    naming the file unless it is UTF-8 text assigning a JSON object."""
    path = Path(path)
    try:
        text = read_file(path, MAX_DATA_BYTES, "explorer data file").decode("utf-8")
        start, end = text.index("= ") + 2, text.rindex(";")
        data = parse_json(text[start:end])
    except ValueError as err:  # not UTF-8, no assignment, malformed JSON
        reason = str(err).splitlines()[0][:120]
        raise SiteError(
            f"{path} is not an explorer data file ({reason}); expected the JavaScript "
            f"attnconv explore writes, an assignment of a JSON object"
        ) from err
    if not isinstance(data, dict):
        raise SiteError(f"{path} assigns a {type(data).__name__}, expected a JSON object")
    return data


def read_site(site_dir: str | Path) -> list[PreparedModel]:
    """The models of an explorer site written by ``write_explorer``, to put on another page.
    UserError if ``site_dir`` holds no such site; SiteError naming the file if the site names a
    file outside its folder or its data is not what ``write_explorer`` writes
    (``attnconv.viz.site_check``)."""
    root = Path(site_dir)
    manifest_path = root / "data.js"
    if not manifest_path.is_file():
        raise UserError(f"{str(root)!r} is not an explorer site (it has no data.js)")
    manifest = read_data(manifest_path)
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise UserError(
            f"{manifest_path} is not a version-{VERSION} {FORMAT} site; write it again with "
            f"this attnconv"
        )
    models = []
    for info in check_manifest(manifest, manifest_path):
        model_path = site_file(root, info["file"], manifest_path)
        data = read_data(model_path)
        check_model(data, model_path)
        files = []
        for image in data["images"]:
            if "file" in image:
                image_path = site_file(root, image["file"], model_path)
                payload = read_data(image_path)
                check_image_file(data, payload, "average" in image, image_path)
                files.append(payload)
                image["file"] = Path(image["file"]).name
        models.append(
            PreparedModel(
                info["name"],
                data,
                files,
                info["description"],
                info["dataset"],
                info["test_accuracy"],
            )
        )
    return models


def site_size(out_dir: str | Path) -> int:
    """Total bytes of the files under ``out_dir``."""
    return sum(path.stat().st_size for path in Path(out_dir).rglob("*") if path.is_file())


def make_server(site_dir: str | Path, port: int = 8000) -> http.server.ThreadingHTTPServer:
    """An HTTP server for ``site_dir`` bound to ``127.0.0.1:port`` (``port=0``: any free port).
    Call ``serve_forever()`` on it; ``server.server_address`` says where it listens."""
    directory = Path(site_dir)
    if not (directory / "index.html").is_file():
        raise FileNotFoundError(f"{str(directory)!r} has no index.html: not an explorer site")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
