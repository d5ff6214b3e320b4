"""Every figure of a checkpoint at once (``attnconv plot``), and the training loop's figure hook."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

from attnconv.errors import UserError
from attnconv.models.transformed import TransformedNetwork
from attnconv.runs import RunDir, require_regular_file
from attnconv.viz.contours import contour_figure, outlined_heads
from attnconv.viz.distance import add_distances, distance_figure, format_head_table, layer_distances
from attnconv.viz.maps import (
    AttentionMaps,
    attention_layers,
    compute_attention,
    default_query,
    is_position_only,
    map_grid_figure,
)
from attnconv.viz.style import save_figure
from attnconv.viz.trajectories import load_center_trajectories, trajectory_figure
from attnconv.viz.transformed import LayerAttention

# Grey level of the uniform probe image used for content models when no images are given.
PROBE_GREY = 0.5


def is_gaussian(model: nn.Module) -> bool:
    """True when every attention layer of ``model`` has a Gaussian positional score."""
    return all(layer.has_centers for layer in attention_layers(model))


def attention_figure(
    model: nn.Module, image_size: tuple[int, int], images: Tensor | None = None
) -> Figure:
    """The figure that shows what a model's attention has learned (logged by training each epoch).

    Gaussian models: the per-layer mass-contour figure for the centre query token. Other models:
    the layer × head grid of attention maps for that query. For models with content scores the
    attention is averaged over ``images`` (float ``(B, C, H, W)`` in ``[0, 1]``); without images a
    uniform grey image is used, and the title says so. ``image_size`` is ``(H, W)`` of the input.
    """
    if images is None and not is_position_only(model):
        channels = int(getattr(model, "in_channels", 3))
        images = torch.full((1, channels, *image_size), PROBE_GREY)
        maps = compute_attention(model, image_size, images)
        maps.description = f"on a uniform grey ({PROBE_GREY}) image"
    else:
        maps = compute_attention(model, image_size, images)
    if is_gaussian(model):
        return contour_figure(maps)
    return map_grid_figure(maps)


def checkpoint_path(path: str | Path) -> Path:
    """``path`` if it is a file, ``path/checkpoints/last.pt`` if it is a run folder."""
    path = Path(path)
    if path.is_dir():
        path = RunDir(path).last
    return require_regular_file(path, "checkpoint")


def test_images(
    dataset: str, count: int, data_dir: str | None, download: bool = True
) -> tuple[Tensor, list[str]]:
    """The first ``count`` test images of ``dataset`` as floats in ``[0, 1]`` and their captions;
    UserError if the test set has fewer. ``download=False``: FileNotFoundError (saying how to get
    the dataset) instead of fetching missing files."""
    from attnconv.data import load_splits

    if count < 1:
        raise UserError(f"need at least one test image, got {count}")
    # only the test split is used: no validation images need carving out of the training set
    splits = load_splits(dataset, data_dir=data_dir, val_size=0, download=download)
    if len(splits.test) < count:
        raise UserError(
            f"{dataset} has {len(splits.test)} test images, fewer than the {count} asked for"
        )
    images = splits.test.images[:count].float() / 255.0
    labels = [
        f"test {i}: {splits.classes[int(y)]}" for i, y in enumerate(splits.test.labels[:count])
    ]
    return images, labels


@dataclass
class PlotResult:
    """What ``plot_checkpoint`` wrote: the figure files, the head table rows and its text, the
    attention the distances were computed from (for content models, averaged over images; for a
    transformed network one ``LayerAttention`` per transformed layer), and why a figure the model
    could have was not drawn (one line each), and for content models where their test images came
    from."""

    files: list[Path]
    heads: list[dict[str, Any]]
    table: str
    maps: AttentionMaps | list[LayerAttention]
    not_drawn: list[str]
    image_source: str | None = None


def plot_checkpoint(
    path: str | Path,
    out_dir: str | Path,
    query: tuple[int, int] | None = None,
    window: int | None = None,
    num_images: int = 16,
    image_index: int = 0,
    data_dir: str | None = None,
    scale: str = "map",
) -> PlotResult:
    """Write every figure of a checkpoint (or run folder) into ``out_dir`` as PNG and PDF
    (``plot_model``). Models with content scores use the first ``max(num_images, image_index + 1)``
    test images of the checkpoint's dataset; Gaussian models of a run folder with
    ``checkpoints/epoch_*.pt`` also get their centres' trajectories. A transformed network gets
    ``plot_transformed``'s figures (``window`` and ``scale``, of the maps it does not get, and
    ``image_index`` are refused), its distances over the first ``num_images`` test images."""
    from attnconv.models.checkpoint import load_model

    path = checkpoint_path(path)
    model, checkpoint = load_model(path)
    if isinstance(model, TransformedNetwork):
        _check_transformed_options(window, scale, image_index)
        images, _ = test_images(checkpoint["dataset"], num_images, data_dir)
        result = plot_transformed(
            model,
            out_dir,
            f"{checkpoint['preset']}, epoch {checkpoint.get('epoch', '?')}",
            images,
            query,
            RunDir.of_checkpoint(path),
        )
        result.image_source = f"the first {num_images} test images of {checkpoint['dataset']}"
        return result
    if not hasattr(model, "attention_layers"):
        raise UserError(f"{str(path)!r} holds a {type(model).__name__}, which has no attention")
    images = labels = source = None
    if not is_position_only(model):
        count = max(num_images, image_index + 1)
        images, labels = test_images(checkpoint["dataset"], count, data_dir)
        source = f"the first {count} test images of {checkpoint['dataset']}"
    result = plot_model(
        model,
        out_dir,
        f"{checkpoint['preset']}, epoch {checkpoint['epoch']}",
        images,
        labels,
        query=query,
        window=window,
        num_images=num_images,
        image_index=image_index,
        run=RunDir.of_checkpoint(path),
        scale=scale,
    )
    result.image_source = source
    return result


def plot_model(
    model: nn.Module,
    out_dir: str | Path,
    name: str,
    images: Tensor | None = None,
    labels: list[str] | None = None,
    query: tuple[int, int] | None = None,
    window: int | None = None,
    num_images: int | None = None,
    image_index: int = 0,
    run: RunDir | None = None,
    scale: str = "map",
) -> PlotResult:
    """Write every figure of ``model`` (called ``name`` in titles) into ``out_dir``, PNG and PDF.

    ``contours`` (mass contours per layer, unless no head's would be drawn: ``not_drawn`` says
    so), ``maps`` (layer × head maps, zoomed to ``window`` tokens around ``query`` when given),
    ``distance`` (attention distance per head and layer),
    ``trajectories`` (Gaussian centres over the ``checkpoints/epoch_*.pt`` of the run folder
    ``run``, when there are any) and ``heads.csv`` (the head table with attention distances).
    Models with content scores need ``images`` (float ``(B, C, H, W)`` in ``[0, 1]``) and a caption
    per image: maps and contours for image ``image_index``, plus ``maps_average`` and the
    distances over the first ``num_images`` (all when None; UserError if there are fewer). ``scale``: the maps'
    colour scale, ``"map"`` (each its own) or ``"shared"`` (``map_grid_figure``).
    """
    if not hasattr(model, "attention_layers"):
        raise UserError(f"{name} is a {type(model).__name__}, which has no attention")
    image_size = tuple(model.image_size)
    out = Path(out_dir)
    if is_position_only(model):
        maps = averaged = compute_attention(model, image_size)
        image = None
    else:
        if images is None or labels is None:
            raise UserError(f"{name} has content scores: its figures need test images")
        if not 0 <= image_index < images.shape[0]:
            raise UserError(f"image_index {image_index} is outside the {images.shape[0]} images")
        if num_images is None:
            num_images = images.shape[0]
        if num_images > images.shape[0]:
            raise UserError(
                f"{name}: cannot average over {num_images} images, only {images.shape[0]} given"
            )
        image = images[image_index]
        maps = compute_attention(model, image_size, image[None])
        maps.description = labels[image_index]
        averaged = compute_attention(model, image_size, images[:num_images])
    files, distances, not_drawn = attention_figures(
        maps, averaged, out, name, image, query, window, scale=scale
    )
    if is_gaussian(model) and run is not None:
        if run.epoch_checkpoints():
            trajectories = trajectory_figure(load_center_trajectories(run.root))
            files += save_figure(trajectories, out, "trajectories")
        else:
            not_drawn.append(
                f"trajectories: {run.checkpoints} has no epoch_*.pt; train with "
                "checkpoint_every=1 to keep the centres of every epoch"
            )
    rows = add_distances(_head_rows(model), distances)
    files.append(write_csv(rows, out / "heads.csv"))
    return PlotResult(files, rows, format_head_table(rows), averaged, not_drawn)


def attention_figures(
    maps: AttentionMaps,
    averaged: AttentionMaps,
    out_dir: str | Path,
    name: str,
    image: Tensor | None = None,
    query: tuple[int, int] | None = None,
    window: int | None = None,
    scale: str = "map",
) -> tuple[list[Path], list[Tensor], list[str]]:
    """The attention figures of ``plot_model`` from attention already computed, PNG and PDF:
    ``maps_average`` (of ``averaged``, when it is not ``maps`` itself), ``contours`` and ``maps``
    (of ``maps``, with ``image`` ``(C, H, W)`` beside them when given), ``distance`` (of
    ``averaged``; ``name`` goes into its title); ``scale`` the maps' colour scale
    (``map_grid_figure``). ``contours`` is left out when it would outline no head
    (``contours.outlined_heads``). Returns the files, each layer's ``(heads,)`` attention
    distances in tokens and a line for each figure left out, saying why."""
    out = Path(out_dir)
    files: list[Path] = []
    if averaged is not maps:
        files += save_figure(
            map_grid_figure(averaged, query, window, scale=scale), out, "maps_average"
        )
    not_drawn = []
    if outlined_heads(maps, query):
        files += save_figure(contour_figure(maps, query), out, "contours")
    else:
        shown = default_query(maps.grid) if query is None else tuple(query)
        not_drawn.append(
            f"contours: no head's attention from query token {shown} ({maps.description}) is "
            "concentrated in one piece (each is diffuse or in several spots), so every panel "
            "would be empty; the maps show it"
        )
    files += save_figure(
        map_grid_figure(maps, query, window, image=image, scale=scale), out, "maps"
    )
    distances = layer_distances(averaged)
    files += save_figure(
        distance_figure(
            distances,
            stem=averaged.stem,
            grid=averaged.grid,
            title=f"Attention distance per head\n{name}\n{averaged.description}",
        ),
        out,
        "distance",
    )
    return files, distances, not_drawn


def pretrained_images(
    name: str, num_images: int | None, image_index: int = 0, data_dir: str | None = None
) -> tuple[Tensor, list[str], str]:
    """Test images for the figures of the shipped content model ``name``: ``(images, captions,
    where they came from)``, at least ``max(num_images, image_index + 1)`` of them.

    The test images shipped beside the weights (``attnconv.models.pretrained.sample_images``;
    ``num_images=None`` takes all of them) when they are enough and ``data_dir`` is not given;
    else the first test images of the dataset, from ``data_dir`` or an installed copy, never
    downloaded (UserError, one line, saying how to get the dataset when it is not there).
    """
    from attnconv.models.pretrained import pretrained_info, sample_images

    dataset = pretrained_info(name).dataset
    images, labels = sample_images(dataset)
    shipped = images.shape[0]
    needed = max(shipped if num_images is None else num_images, image_index + 1)
    if needed <= shipped and data_dir is None:
        return (
            images[:needed],
            labels[:needed],
            f"the {needed} test images of {dataset} shipped with the weights",
        )
    try:
        images, labels = test_images(dataset, needed, data_dir, download=False)
    except FileNotFoundError as err:
        raise UserError(
            f"{needed} test images of {dataset} asked for, {shipped} ship with the weights, and "
            f"the dataset is not here: {err}"
        ) from err
    return images, labels, f"the first {needed} test images of {dataset} (read from the dataset)"


def plot_pretrained(
    name: str,
    out_dir: str | Path,
    query: tuple[int, int] | None = None,
    window: int | None = None,
    num_images: int | None = None,
    image_index: int = 0,
    data_dir: str | None = None,
    scale: str = "map",
) -> PlotResult:
    """``plot_model`` for a model shipped with attnconv; a content model's test images are
    ``pretrained_images``' (by default the ones shipped with the weights, all of them)."""
    from attnconv.models.pretrained import load_pretrained

    model = load_pretrained(name)
    if isinstance(model, TransformedNetwork):
        _check_transformed_options(window, scale, image_index)
        images, _, source = pretrained_images(name, num_images, 0, data_dir)
        result = plot_transformed(model, out_dir, f"{name} (shipped)", images, query)
        result.image_source = source
        return result
    images = labels = source = None
    if hasattr(model, "attention_layers") and not is_position_only(model):
        images, labels, source = pretrained_images(name, num_images, image_index, data_dir)
    result = plot_model(
        model,
        out_dir,
        f"{name} (shipped)",
        images,
        labels,
        query=query,
        window=window,
        num_images=num_images,
        image_index=image_index,
        scale=scale,
    )
    result.image_source = source
    return result


def _check_transformed_options(window: int | None, scale: str, image_index: int) -> None:
    """UserError for the options of figures a transformed network does not get."""
    given = [
        option
        for option, value in (
            ("--window", window is not None),
            ("--scale", scale != "map"),
            ("--image-index", image_index != 0),
        )
        if value
    ]
    if given:
        raise UserError(
            f"{', '.join(given)}: for the maps of attention models; a transformed network gets "
            f"contours, gates, distances and trajectories, leave {'it' if len(given) == 1 else 'them'}"
            f" out"
        )


def plot_transformed(
    model: TransformedNetwork,
    out_dir: str | Path,
    name: str,
    images: Tensor,
    query: tuple[int, int] | None = None,
    run: RunDir | None = None,
) -> PlotResult:
    """Write the figures of a transformed network (T-CNN) into ``out_dir``, PNG and PDF:
    ``contours`` (each transformed layer's Gaussian heads from the output pixel nearest image
    pixel ``query``, default the centre, their start taps marked), ``gates`` (content gates,
    layer × head, and each layer's mean), ``distance`` (attention distance by depth, content on,
    averaged over ``images`` ``(B, C, H, W)`` in ``[0, 1]``), ``trajectories`` (the heads' centres
    over the ``checkpoints/epoch_*.pt`` of the run folder ``run``, from their kernel taps, when
    there are any), ``heads.csv`` and ``layers.csv`` (``viz.transformed.head_rows`` and
    ``layer_rows``). The table is the per-layer one."""
    from attnconv.viz import transformed as tcnn

    out = Path(out_dir)
    layers = tcnn.transformed_attention(model, images)
    files = save_figure(tcnn.transformed_contour_figure(tcnn.gaussian_attention(model), query),
                        out, "contours")  # fmt: skip
    files += save_figure(
        tcnn.gate_figure(model, f"Content gates of {name}: each head's share of content attention"),
        out,
        "gates",
    )
    files += save_figure(
        tcnn.transformed_distance_figure(
            layers, f"Attention distance per head and transformed layer\n{name} "
            f"({layers[0].description}; rows renormalised over the image)",
        ),
        out,
        "distance",
    )  # fmt: skip
    not_drawn = []
    if run is not None and run.epoch_checkpoints():
        trajectories = load_center_trajectories(run.root)
        named = list(model.transformed_layers())
        if trajectories.layer_names == [f"network.{n}.position.centers" for n in named]:
            starts = [layer.tap_offsets().detach().double().cpu().numpy()
                      for layer in model.transformed_layers().values()]  # fmt: skip
            moves = [np.linalg.norm(centers[-1] - start, axis=1).max()
                     for centers, start in zip(trajectories.centers, starts, strict=True)]  # fmt: skip
            figure = trajectory_figure(
                trajectories,
                f"Centres of the transformed layers' heads over training, from their kernel taps "
                f"(epochs {trajectories.epochs[0]}–{trajectories.epochs[-1]})",
                starts,
                "pixels",
                [f"{i}: {named[i]}\nlargest move {m:.3g} px" for i, m in enumerate(moves)],
            )
            files += save_figure(figure, out, "trajectories")
        else:
            not_drawn.append(
                f"trajectories: the checkpoints of {run.root} hold other layers than this one"
            )
    elif run is not None:
        not_drawn.append(
            f"trajectories: {run.checkpoints} has no epoch_*.pt; train with "
            "checkpoint_every=1 to keep the centres of every epoch"
        )
    heads = tcnn.head_rows(model, layers)
    layer_table = tcnn.layer_rows(model, layers)
    files.append(write_csv(heads, out / "heads.csv"))
    files.append(write_csv(layer_table, out / "layers.csv"))
    return PlotResult(files, heads, tcnn.format_layer_table(layer_table), layers, not_drawn)


def _head_rows(model: nn.Module) -> list[dict[str, Any]]:
    """``attnconv heads``' table for Gaussian models, else no rows (distances only)."""
    if not is_gaussian(model):
        return []
    from attnconv.models.heads import head_table

    return head_table(model)


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """``rows`` (dicts with the same keys, the first row's order) as a CSV file with a header,
    written atomically."""
    import io

    from attnconv.runs import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    handle = io.StringIO(newline="")
    writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, handle.getvalue())
    return path
