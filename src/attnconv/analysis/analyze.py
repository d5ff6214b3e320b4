"""``analyze_third_party`` / ``analyze_attnconv``: every measure and figure of one model into a
folder (the ``attnconv analyze`` command).

    OUT/heads.csv      one row per layer and head: attention distance (patches, pixels), attention
                       to the class/register tokens, the head's tap in the layer's grid score
                       (attnconv's Gaussian models add their head table)
    OUT/layers.csv     one row per layer: mean distance, grid score and coverage
    OUT/distance.*     attention distance against depth, one dot per head (ViT paper, Figure 7)
    OUT/maps.*, OUT/contours.*   every head's attention from the query patch on the first image;
                       OUT/maps_average.* the same averaged over all images
    OUT/rollout.*      the attention rollout (``attnconv.analysis.rollout``) of the class token,
                       or of the query patch for a model without one, over the first images and
                       averaged over all of them
    OUT/class_token.*  what the class token attends to, per layer and head, over the first image;
                       OUT/class_token_average.* the same averaged over all images (models with a
                       class token)
    OUT/explorer/      the interactive page of this model (``attnconv explore --add OUT`` puts it
                       beside the shipped models)

A model with content attention (transformed layers, ``learned-content-*``, the ViT) also gets
``OUT/content.csv`` (one row per layer: entropy ÷ log N of its content maps, mean gate, query/key
norms against the start, the predictions the uniform-content ablation changes) and
``OUT/content_heads.csv`` (each head's entropy ÷ log N and gate), measured on the analysed images
(``attnconv.analysis.content``), with the table in the summary and a line per layer on the
explorer page.

A transformed network (T-CNN, ``analyze_transformed``) gets what applies to its transformed layers,
each attending from its output pixels over its input pixels (``attnconv.viz.transformed``):
heads.csv (each head's start tap, centre, distance moved, spread, content gate, attention distance
and attention on its own tap), layers.csv (the layer means, attention distance in pixels of its
input and of the image, the tap score), distance.*, contours.* (its Gaussian heads from a query
pixel, their start taps marked), gates.* and the explorer page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from attnconv.analysis.content import content_diagnostics, content_layers, format_content
from attnconv.analysis.images import load_images
from attnconv.analysis.measures import (
    excluded_tokens,
    format_layer_table,
    head_rows,
    layer_rows,
    measure_patch_attention,
)
from attnconv.analysis.rollout import TokenViews, own_model_views
from attnconv.analysis.third_party import ThirdPartyModel
from attnconv.errors import UserError
from attnconv.models.transformed import TransformedNetwork
from attnconv.viz.export import PreparedModel, SiteModel, recorded_explorer_data, write_explorer
from attnconv.viz.figures import attention_figures, is_gaussian, write_csv
from attnconv.viz.maps import (
    AttentionMaps,
    compute_attention,
    default_query,
    is_position_only,
    query_index,
)
from attnconv.viz.rollout import class_token_figure, rollout_figure, rollout_rows
from attnconv.viz.style import save_figure
from attnconv.viz.transformed import layer_rows as transformed_layer_rows

EXPLORER = "explorer"
# ``progress(message)``: called as each stage starts (recording, drawing, the explorer page), so
# that a caller can say where a long analysis is; None: nothing is said.
Progress = Callable[[str], None] | None


def _say(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)


@dataclass
class Analysis:
    """What ``analyze_*`` wrote: the files, the head and layer tables, and a short summary."""

    files: list[Path]
    heads: list[dict[str, Any]]
    layers: list[dict[str, Any]]
    summary: str


def _write_tables(
    out: Path,
    average: AttentionMaps,
    prefix_attention: list[Tensor] | None,
    rows: list[dict[str, Any]] | None = None,
) -> tuple[list[Path], list[dict[str, Any]], list[dict[str, Any]]]:
    heads = head_rows(average, prefix_attention, rows)
    layers = layer_rows(average, prefix_attention)
    return (
        [write_csv(heads, out / "heads.csv"), write_csv(layers, out / "layers.csv")],
        heads,
        layers,
    )


def _summary(
    header: list[str],
    layers: list[dict[str, Any]],
    prefix: bool,
    files: list[Path],
    not_drawn: list[str],
) -> str:
    kernels = sorted({row["grid_kernel"] for row in layers})
    kernel = f"{kernels[0]}x{kernels[0]}" if len(kernels) == 1 else "KxK (K per layer: layers.csv)"
    return "\n".join(
        [
            *header,
            f"grid score: how close the heads of a layer come to the taps of a {kernel} "
            f"convolution (1: one one-hot head on each tap)",
            format_layer_table(layers, prefix),
            f"wrote {len(files)} files to {files[0].parent}",
            *(f"not drawn: {reason}" for reason in not_drawn),
        ]
    )


# Images of the rollout figure drawn over their image (beside the mean over all of them).
ROLLOUT_IMAGES = 4
# ``(the model as it started, or None, what that is)``, as ``attnconv.analysis.content.run_start``
# and ``pretrained_start`` give it: what the query and key norms are compared with.
Start = tuple[nn.Module | None, str]


@dataclass
class ContentFiles:
    """The content-attention diagnostics of an analysed model (``content``): the files written,
    the explorer's ``content`` entry and the summary's table (all empty without content)."""

    files: list[Path]
    explorer: dict[str, Any] | None
    text: list[str]


def content(
    model: nn.Module, pixels: Tensor | None, origin: str, start: Start | None, out: Path
) -> ContentFiles:
    """``content.csv`` and ``content_heads.csv`` (module docstring) of ``model`` on ``pixels``
    ``(B, C, H, W)`` (``origin`` says which images), the norms against ``start`` (None: not
    known); nothing for a model without content attention or without images."""
    if pixels is None or not content_layers(model):
        return ContentFiles([], None, [])
    model_start, note = start if start is not None else (None, "not known")
    diagnostics = content_diagnostics(model, pixels, start=model_start, start_note=note)
    files = [
        write_csv(diagnostics.layer_rows(), out / "content.csv"),
        write_csv(diagnostics.head_rows(), out / "content_heads.csv"),
    ]
    return ContentFiles(files, diagnostics.to_dict(), [format_content(diagnostics, origin)])


def token_view_figures(
    views: TokenViews,
    grid: tuple[int, int],
    stem: int,
    images: Tensor | None,
    labels: list[str] | None,
    name: str,
    query: tuple[int, int] | None,
    out: Path,
) -> list[Path]:
    """``rollout.*`` and, with a class token, ``class_token.*`` and ``class_token_average.*``
    (module docstring) from ``views``; ``images`` ``(B, C, H, W)`` the images whose own views
    ``views`` kept (their first ``ROLLOUT_IMAGES`` drawn under the rollout), None for a
    position-only model (one map, the same for every image)."""
    query = default_query(grid) if query is None else query
    index = None if views.class_attention is not None else query_index(query, grid)
    rows = [rollout_rows(r, views.prefix, grid, index) for r in views.rollout_images]
    shown = min(ROLLOUT_IMAGES, len(rows))
    if images is None:
        maps, pictures, captions = [rows[0]], [None], ["position-only: every image"]
    else:
        maps = [*rows[:shown], rollout_rows(views.rollout, views.prefix, grid, index)]
        pictures = [images[i] for i in range(shown)] + [None]
        count = "one image" if views.count == 1 else f"mean over {views.count} images"
        captions = [labels[i] for i in range(shown)] + [count]
        if views.count == 1:  # the mean is the first image's own
            maps, pictures, captions = maps[:1], pictures[:1], captions[:1]
    if index is None:
        shares = [f"patches: {share:.0%} of the row" for _, share in maps]
    else:
        shares = [f"the query keeps {float(m[query]):.0%}" for m, _ in maps]
    captions = [f"{caption}\n{share}" for caption, share in zip(captions, shares, strict=True)]
    if index is None:
        source = "the class token"
        shown_row = (
            "its row over the patches, renormalised to sum to one (the captions give the share "
            "the patches held)"
        )
    else:
        source = f"query token {tuple(query)}"
        shown_row = (
            "its row, the query outlined and left out of the colour scale (the residual keeps "
            "much of each patch on itself)"
        )
    title = (
        f"Attention rollout (Abnar & Zuidema 2020) of {source} through all layers, {name}. "
        "R: the product of every layer's Â, the last layer's leftmost, Â = 0.5·(A averaged "
        "over heads) + 0.5·I with rows renormalised; "
        f"{shown_row}. Colour: one scale for all maps."
    )
    fig = rollout_figure(
        [m for m, _ in maps], pictures, captions, stem, title, None if index is None else query
    )
    files = save_figure(fig, out, "rollout")
    if views.class_attention is None:
        return files
    figures = [("class_token", views.class_attention_images[0], images[0], labels[0])]
    count = "one image" if views.count == 1 else f"mean over {views.count} images"
    if views.count > 1:
        figures.append(("class_token_average", views.class_attention, None, count))
    for file, per_layer, image, caption in figures:
        title = (
            f"What the class token attends to, per layer and head, {name} ({caption}): its row "
            "of each head's attention at the patches (not renormalised: the rest goes to the "
            "class and other prefix tokens). Colour: one scale for all maps."
        )
        files += save_figure(class_token_figure(per_layer, grid, stem, image, title), out, file)
    return files


def analyze_third_party(
    loaded: ThirdPartyModel,
    out: str | Path,
    images: str | None = None,
    num_images: int = 16,
    explore_images: int = 4,
    data_dir: str | None = None,
    query: tuple[int, int] | None = None,
    window: int | None = None,
    progress: Progress = None,
) -> Analysis:
    """Record ``loaded``'s attention on ``num_images`` images (``images``: a folder, a dataset, or
    None for the shipped test images; see ``load_images``) and write everything into ``out``
    (module docstring); the explorer holds the first ``explore_images`` images (0: no explorer)
    and the average over all of them. ``progress``: told as each stage starts."""
    out = Path(out)
    pixels, labels, origin = load_images(
        images, num_images, loaded.image_size, loaded.in_channels, data_dir
    )
    _say(progress, f"recording the attention on {len(labels)} images ({origin})")
    measured = measure_patch_attention(
        loaded.model, loaded.normalize(pixels), labels, keep=max(ROLLOUT_IMAGES, explore_images)
    )
    average = measured.average
    name = f"{loaded.name}, {'random weights' if loaded.weights == 'random' else loaded.weights}"
    _say(progress, f"drawing the figures and writing the tables into {out}")
    files, _, not_drawn = attention_figures(
        measured.per_image[0], average, out, name, pixels[0], query, window
    )
    files += token_view_figures(
        measured.views, average.grid, average.stem, pixels, labels, name, query, out
    )
    tables, heads, layers = _write_tables(out, average, measured.prefix_attention)
    files += tables
    excluded = excluded_tokens(measured.prefix_tokens)
    if explore_images > 0:
        shown = min(explore_images, len(labels))
        _say(progress, f"writing the explorer page of {shown} images into {out / EXPLORER}")
        meta = {
            "weights": loaded.weights,
            "scores": "the recorded probabilities (logit views: their logarithm)",
        }
        if excluded:
            meta["patches only"] = f"{excluded}, rows renormalised over the patches"
        data, payloads = recorded_explorer_data(
            [maps.probs for maps in measured.per_image[:shown]],
            average.grid,
            average.stem,
            pixels[:shown],
            labels[:shown],
            average.probs,
            pixels,
            meta,
            measured.views,
        )
        files += write_explorer(
            [PreparedModel(loaded.name, data, payloads, f"{loaded.name} ({loaded.weights})")],
            out / EXPLORER,
            title=f"attnconv explorer: {loaded.name}",
        )
    h, w = average.grid
    header = [
        f"{name}: {len(layers)} layers, {max(r['heads'] for r in layers)} heads, {h}x{w} patches "
        f"of {average.stem}x{average.stem} pixels ({loaded.image_size[0]}x{loaded.image_size[1]} "
        f"input)",
        f"images: {origin}",
        "attention distance: the ViT paper's (Figure 7), attention-weighted distance between "
        "query and key patches, mean over queries and images"
        + (f"; {excluded} (rows renormalised over the patches)" if excluded else ""),
    ]
    summary = _summary(header, layers, bool(excluded), files, not_drawn)
    return Analysis(files, heads, layers, summary)


def analyze_attnconv(
    model: nn.Module,
    name: str,
    out: str | Path,
    dataset: str,
    images: str | None = None,
    num_images: int = 16,
    explore_images: int = 4,
    data_dir: str | None = None,
    query: tuple[int, int] | None = None,
    window: int | None = None,
    description: str = "",
    test_accuracy: float | None = None,
    progress: Progress = None,
    start: Start | None = None,
) -> Analysis:
    """The same for one of attnconv's own models (``attention_layers()``), its attention computed
    by ``compute_attention``. Position-only models need no images; models with content scores
    use ``images`` (default: the test images of ``dataset`` shipped with attnconv, else its test
    split) and get their content diagnostics, the query and key norms against ``start`` (None:
    not known). ``progress``: told as each stage starts."""
    from attnconv.models.heads import head_table
    from attnconv.models.pretrained import PretrainedError

    out = Path(out)
    size = tuple(model.image_size)
    pixels = labels = None
    if is_position_only(model):
        if images is not None:
            raise UserError(
                f"{name}'s attention is position-only, the same for every image: leave the "
                f"images out"
            )
        _say(progress, "computing the attention (position-only: no images needed)")
        average = single = compute_attention(model, size)
        origin = "none needed (position-only attention: the same for every image)"
    else:
        try:
            pixels, labels, origin = load_images(
                images, num_images, size, model.in_channels, data_dir, shipped=dataset
            )
        except PretrainedError:  # no shipped test images of this dataset: its test split
            pixels, labels, origin = load_images(
                dataset, num_images, size, model.in_channels, data_dir
            )
        _say(progress, f"computing the attention on {len(labels)} images ({origin})")
        single = compute_attention(model, size, pixels[:1])
        single.description = labels[0]
        average = compute_attention(model, size, pixels)
    _say(progress, f"drawing the figures and writing the tables into {out}")
    files, _, not_drawn = attention_figures(
        single, average, out, name, None if pixels is None else pixels[0], query, window
    )
    views = own_model_views(model, size, pixels, keep=ROLLOUT_IMAGES)
    files += token_view_figures(views, average.grid, average.stem, pixels, labels, name, query, out)
    tables, heads, layers = _write_tables(
        out, average, None, head_table(model) if is_gaussian(model) else None
    )
    files += tables
    if pixels is not None and content_layers(model):
        _say(progress, f"measuring the content attention on {len(labels)} images")
    measured = content(model, pixels, origin, start, out)
    files += measured.files
    if explore_images > 0:
        shown = None if pixels is None else slice(0, explore_images)
        on = "" if pixels is None else f" of {len(pixels[shown])} images"
        _say(progress, f"writing the explorer page{on} into {out / EXPLORER}")
        entry = SiteModel(
            name,
            model,
            size,
            description,
            dataset=dataset,
            test_accuracy=test_accuracy,
            images=None if shown is None else pixels[shown],
            labels=None if shown is None else labels[shown],
            average_images=pixels,
            content=measured.explorer,
        )
        files += write_explorer([entry], out / EXPLORER, title=f"attnconv explorer: {name}")
    h, w = average.grid
    header = [
        f"{name}: {len(layers)} layers, {max(r['heads'] for r in layers)} heads, {h}x{w} tokens "
        f"of {average.stem}x{average.stem} pixels ({size[0]}x{size[1]} input)",
        f"images: {origin}",
        "attention distance: attention-weighted distance between query and key tokens, mean over "
        "queries" + ("" if pixels is None else " and images"),
    ]
    summary = _summary(header, layers, False, files, not_drawn)
    return Analysis(files, heads, layers, "\n".join([summary, *measured.text]))


def analyze_transformed(
    model: TransformedNetwork,
    name: str,
    out: str | Path,
    dataset: str,
    images: str | None = None,
    num_images: int = 16,
    explore_images: int = 4,
    data_dir: str | None = None,
    query: tuple[int, int] | None = None,
    description: str = "",
    test_accuracy: float | None = None,
    progress: Progress = None,
    start: Start | None = None,
) -> Analysis:
    """``analyze_attnconv`` for a transformed network: its figures and tables
    (``viz.figures.plot_transformed``, the contours from image pixel ``query``) and its content
    diagnostics (the query and key norms against ``start``) on ``num_images`` images (``images``
    as for a content model), and the explorer page of the first ``explore_images`` of them (0:
    none) with their average. ``progress``: told as each stage starts."""
    from attnconv.models.pretrained import PretrainedError
    from attnconv.viz.figures import plot_transformed

    out = Path(out)
    size = tuple(model.image_size)
    try:
        pixels, labels, origin = load_images(
            images, num_images, size, model.in_channels, data_dir, shipped=dataset
        )
    except PretrainedError:  # no shipped test images of this dataset: its test split
        pixels, labels, origin = load_images(dataset, num_images, size, model.in_channels, data_dir)
    _say(
        progress,
        f"computing the attention on {len(labels)} images ({origin}), drawing the figures and "
        f"writing the tables into {out}",
    )
    plot = plot_transformed(model, out, name, pixels, query)
    files = plot.files
    if content_layers(model):
        _say(progress, f"measuring the content attention on {len(labels)} images")
    measured = content(model, pixels, origin, start, out)
    files += measured.files
    if explore_images > 0:
        _say(
            progress,
            f"writing the explorer page of {len(labels[:explore_images])} images into "
            f"{out / EXPLORER}",
        )
        entry = SiteModel(
            name,
            model,
            size,
            description,
            dataset=dataset,
            test_accuracy=test_accuracy,
            images=pixels[:explore_images],
            labels=labels[:explore_images],
            average_images=pixels,
            content=measured.explorer,
        )
        files += write_explorer([entry], out / EXPLORER, title=f"attnconv explorer: {name}")
    layers = transformed_layer_rows(model, plot.maps)  # layers.csv's rows
    header = [
        f"{name}: {len(layers)} transformed layers of {layers[0]['heads']} heads "
        f"({size[0]}x{size[1]} input)",
        f"images: {origin}",
        "attention distance: attention-weighted distance from each query's pixel to the input "
        "pixels (rows renormalised over the image), mean over queries and images",
        plot.table,
        f"wrote {len(files)} files to {out}",
        *measured.text,
    ]
    return Analysis(files, plot.heads, layers, "\n".join(header))
