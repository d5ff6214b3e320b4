"""The explorer: a self-contained static site to click through a model's attention in a browser.

``write_site(model, out_dir, image_size, images)`` writes ``index.html``, ``app.js``, ``style.css``
(package data, ``attnconv/viz/explorer/``) and the data they show as JavaScript files that assign
globals, because browsers refuse ``fetch`` of local files under ``file://`` but run ``<script>``s:

* ``data.js``: ``window.ATTNCONV_DATA``, the model description, the colour map and, for a
  position-only model, every layer's probabilities (the same for every image, so no image is
  needed). Separable layers (isotropic Gaussian, learned) store their exact row and column factors
  ``R (heads, h, h)`` and ``C (heads, w, w)``, with ``P[q, k] = R[q₁, k₁] · C[q₂, k₂]``; other
  layers store ``P (heads, N, N)`` quantised.
* ``images/image_NNN.js`` (models with content scores): per test image and layer, the content
  logits ``qᵀk/√d`` ``(heads, N, N)`` and the positional logits (all terms with ``r_δ``: ``wᵀr_δ``,
  ``qᵀr_δ/√d``, or the Gaussian score) as row and column parts ``(heads, N, h + w)`` whose sum over
  a key's row and column is the logit. The page adds them for the total score and applies the
  softmax itself; a file is loaded when its image is picked.

Arrays are base64 of little-endian bytes. "Quantised" arrays are ``uint16`` codes with a ``float32``
offset and step per last-axis row: ``value = lo + code · step`` (error ≤ step / 2, the row's range
/ 131070).
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnconv.attention import MultiHeadSelfAttention2d, scores
from attnconv.viz.maps import attention_layers, token_grid

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
    """Logits of one layer for a batch, split as the explorer shows them.

    ``content``: ``(B, heads, N, N)`` ``qᵀk/√d`` or None. ``position_row`` / ``position_col``:
    ``(B, heads, N, h)`` / ``(B, heads, N, w)``, the positional logit of query ``q`` and key
    ``(k₁, k₂)`` being ``position_row[..., q, k₁] + position_col[..., q, k₂]``; or
    ``position_dense`` ``(heads, N, N)`` (generalized Gaussian, the same for every image); all None
    when the layer has no positional score.
    """

    content: Tensor | None
    position_row: Tensor | None = None
    position_col: Tensor | None = None
    position_dense: Tensor | None = None

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
    content = None
    if layer.key is not None:
        k = layer.key(x).view(batch, n, layer.heads, d).transpose(1, 2)
        content = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    if layer.positional is None:
        return ScoreTerms(content)
    if layer.positional == "gaussian_full":
        return ScoreTerms(
            content, position_dense=scores.gaussian_full_logits(layer.centers, layer.spread, h, w)
        )
    if layer.positional == "gaussian":
        row, col = scores.gaussian_factors(layer.centers, layer.spread, h, w)
    else:
        row, col = scores.learned_factors(
            layer.row_embedding, layer.col_embedding, layer.positional_weight, h, w
        )
    position_row = row[:, rows].expand(batch, -1, -1, -1)  # (B, heads, N, h)
    position_col = col[:, cols].expand(batch, -1, -1, -1)  # (B, heads, N, w)
    if layer.content_positional:
        d_row = layer.row_embedding.shape[1]
        by_row = q[..., :d_row] @ layer.row_embedding.T  # (B, heads, N, 2M−1)
        by_col = q[..., d_row:] @ layer.col_embedding.T
        row_index = scores.offset_index(h, layer.row_embedding.shape[0], x.device)[rows]
        col_index = scores.offset_index(w, layer.col_embedding.shape[0], x.device)[cols]
        expand = (batch, layer.heads, -1, -1)
        position_row = position_row + by_row.gather(-1, row_index.expand(*expand)) / math.sqrt(d)
        position_col = position_col + by_col.gather(-1, col_index.expand(*expand)) / math.sqrt(d)
    return ScoreTerms(content, position_row, position_col)


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
    was_training = model.training
    model.eval()
    try:
        model(images.to(next(model.parameters()).device))
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return [score_terms(layer, inputs[index]) for index, layer in enumerate(layers)]


def image_payload(terms: Sequence[ScoreTerms], index: int) -> dict[str, Any]:
    """The per-image file's content for image ``index`` of the batch the terms were computed on."""
    layers = []
    for term in terms:
        entry: dict[str, Any] = {"content": None, "position": None}
        if term.content is not None:
            entry["content"] = quantize(term.content[index])
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


def explorer_data(
    model: nn.Module | Sequence[MultiHeadSelfAttention2d],
    image_size: tuple[int, int],
    images: Tensor | None = None,
    labels: Sequence[str] | None = None,
    title: str = "attnconv explorer",
    meta: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The page's data: ``(data.js object, [per-image file objects])``.

    ``images``: float ``(B, C, H, W)`` in ``[0, 1]``, required for models with content scores (one
    image file each) and not used for position-only models (whose maps need no image).
    ``labels``: one caption per image.
    """
    layers = attention_layers(model)
    grid = token_grid(model, image_size)
    data: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "title": title,
        "meta": meta or {},
        "grid": list(grid),
        "stem": int(getattr(model, "stem", 1)),
        "image_size": [int(image_size[0]), int(image_size[1])],
        "heads": [layer.heads for layer in layers],
        "colormap": colormap_bytes(),
    }
    if all(layer.position_only for layer in layers):
        data["kind"] = "position"
        data["layers"] = [position_layer_payload(layer, grid) for layer in layers]
        data["images"] = []
        return data, []
    if images is None or not isinstance(images, Tensor) or images.dim() != 4:
        raise ValueError(
            "a model with content scores needs test images: a float tensor (B, C, H, W) in [0, 1]"
        )
    if tuple(images.shape[2:]) != tuple(data["image_size"]):
        raise ValueError(
            f"images are {images.shape[2]}x{images.shape[3]}, expected {tuple(image_size)}"
        )
    if labels is not None and len(labels) != images.shape[0]:
        raise ValueError(f"got {len(labels)} labels for {images.shape[0]} images")
    data["kind"] = "content"
    data["terms"] = {
        "content": any(layer.key is not None for layer in layers),
        "position": any(
            layer.positional is not None or layer.content_positional for layer in layers
        ),
    }
    data["images"] = []
    files = []
    for index in range(images.shape[0]):
        image = images[index : index + 1]
        terms = model_score_terms(model, image)
        pixels = (image[0].clamp(0, 1) * 255).round().permute(1, 2, 0)  # (H, W, C)
        data["images"].append(
            {
                "label": labels[index] if labels is not None else f"image {index}",
                "channels": int(image.shape[1]),
                "pixels": encode(pixels, "|u1"),
                "file": f"images/image_{index:03d}.js",
            }
        )
        files.append(image_payload(terms, 0))
    return data, files


def write_site(
    model: nn.Module | Sequence[MultiHeadSelfAttention2d],
    out_dir: str | Path,
    image_size: tuple[int, int],
    images: Tensor | None = None,
    labels: Sequence[str] | None = None,
    title: str = "attnconv explorer",
    meta: dict[str, Any] | None = None,
) -> list[Path]:
    """Write the explorer for ``model`` into ``out_dir`` (see ``explorer_data`` for the arguments);
    returns the written files. Open ``out_dir/index.html`` in a browser (``file://`` works)."""
    out = Path(out_dir)
    data, image_files = explorer_data(model, image_size, images, labels, title, meta)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    static = resources.files("attnconv.viz") / "explorer"
    for name in STATIC_FILES:
        with resources.as_file(static / name) as source:
            shutil.copyfile(source, out / name)
        written.append(out / name)
    written.append(_write_script(out / "data.js", "window.ATTNCONV_DATA = ", data))
    if image_files:
        (out / "images").mkdir(exist_ok=True)
    for index, payload in enumerate(image_files):
        written.append(
            _write_script(
                out / data["images"][index]["file"],
                f"(window.ATTNCONV_IMAGES = window.ATTNCONV_IMAGES || {{}})[{index}] = ",
                payload,
            )
        )
    return written


def _write_script(path: Path, prefix: str, payload: dict[str, Any]) -> Path:
    path.write_text(prefix + json.dumps(payload, separators=(",", ":")) + ";\n")
    return path


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
