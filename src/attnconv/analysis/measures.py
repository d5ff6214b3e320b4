"""attnconv's measures on recorded attention: the patch-to-patch attention of every layer, and the
per-head and per-layer tables (attention distance in patches and pixels, grid score, attention to
the class token).

**Class and other non-patch tokens are excluded.** The measures are about where a head looks on the
image, so they use the attention between patches only: the rows of the class, distillation and
register tokens are dropped, and so are their columns, with each patch query's row renormalised
to sum to one over the patches. What the dropped columns held is reported beside the measures, as
``prefix_attention``: the mean attention a patch query gives those tokens.

**Attention distance** is the ViT paper's (Dosovitskiy et al., 2021, Figure 7): for each query
patch the attention-weighted distance to the key patches, averaged over queries and images; in
patches (``attnconv.viz.distance``) and in pixels (times the patch size). It is linear in the
probabilities, so the distance of the attention averaged over images is the average of the
per-image distances.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnconv.analysis.record import Recording, record_attention
from attnconv.analysis.rollout import TokenViews, TokenViewSums
from attnconv.viz.distance import add_distances, layer_distances
from attnconv.viz.grid import GridScore, default_kernel_size, grid_score
from attnconv.viz.maps import AttentionMaps

# Images per forward pass when recording (the probabilities of big models are large).
CHUNK = 8


def patch_attention(recording: Recording) -> tuple[list[Tensor], list[Tensor]]:
    """Per layer: the patch-to-patch attention ``(B, heads, N, N)`` (``N = h·w``; prefix tokens'
    rows and columns dropped, each row renormalised over the patches) and the attention each
    image's patch queries give the prefix tokens, ``(B, heads)`` (mean over the queries; zero for
    layers without prefix tokens)."""
    patches, prefix_mass = [], []
    for probs, prefix in zip(recording.probs, recording.prefix_tokens, strict=True):
        rows = probs[:, :, prefix:, :].double()  # patch queries (B, heads, N, T)
        kept = rows[..., prefix:]
        patches.append((kept / kept.sum(dim=-1, keepdim=True)).float())
        prefix_mass.append(rows[..., :prefix].sum(dim=-1).mean(dim=-1).float())
    return patches, prefix_mass


def excluded_tokens(prefix_tokens: Sequence[int]) -> str:
    """What the measures leave out, for titles and summaries ("" when nothing is)."""
    most = max(prefix_tokens)
    if most == 0:
        return ""
    if most == 1:
        return "class token excluded"
    return f"the {most} class/register tokens excluded"


@dataclass
class PatchAttention:
    """The patch attention of a model over a set of images.

    Attributes:
        average: per layer ``(heads, N, N)``, the mean over all images (``description`` says how
            many and what was excluded); ``stem`` is the patch size in pixels.
        per_image: one ``AttentionMaps`` for each of the first images kept.
        prefix_attention: per layer ``(heads,)``, the mean over images and patch queries of the
            attention given to the prefix tokens.
        prefix_tokens: per layer, how many there are.
        views: the attention rollout and the class token's view (``attnconv.analysis.rollout``),
            of all the tokens, per image and averaged.
    """

    average: AttentionMaps
    per_image: list[AttentionMaps]
    prefix_attention: list[Tensor]
    prefix_tokens: list[int]
    views: TokenViews


@torch.no_grad()
def measure_patch_attention(
    model: nn.Module, images: Tensor, labels: Sequence[str], keep: int = 1
) -> PatchAttention:
    """Record ``model``'s attention on ``images`` (``(B, C, H, W)`` as the model takes them, with
    a caption each), ``CHUNK`` images per forward, and average the patch attention, the rollout and
    the class token's view; the first ``keep`` images also keep their own."""
    if images.shape[0] < 1 or len(labels) != images.shape[0]:
        raise ValueError(f"need at least one image and one label each, got {len(labels)} labels")
    sums: list[Tensor] | None = None
    prefix_sums: list[Tensor] | None = None
    per_image: list[AttentionMaps] = []
    views = TokenViewSums(keep)
    for start in range(0, images.shape[0], CHUNK):
        recording = record_attention(model, images[start : start + CHUNK])
        views.add(recording.probs, recording.prefix_tokens, recording.class_token)
        patches, prefix_mass = patch_attention(recording)
        chunk_sums = [p.double().sum(dim=0) for p in patches]
        chunk_prefix = [m.double().sum(dim=0) for m in prefix_mass]
        if sums is None:
            sums, prefix_sums = chunk_sums, chunk_prefix
        else:
            sums = [a + b for a, b in zip(sums, chunk_sums, strict=True)]
            prefix_sums = [a + b for a, b in zip(prefix_sums, chunk_prefix, strict=True)]
        excluded = excluded_tokens(recording.prefix_tokens)
        for offset in range(min(keep - len(per_image), patches[0].shape[0])):
            description = labels[start + offset] + (f", {excluded}" if excluded else "")
            per_image.append(
                AttentionMaps(
                    [p[offset] for p in patches],
                    recording.grid,
                    description,
                    recording.patch_size,
                )
            )
    count = images.shape[0]
    description = "one image" if count == 1 else f"mean over {count} images"
    if excluded:
        description += f", {excluded}"
    average = AttentionMaps(
        [(s / count).float() for s in sums], recording.grid, description, recording.patch_size
    )
    return PatchAttention(
        average,
        per_image,
        [(s / count).float() for s in prefix_sums],
        recording.prefix_tokens,
        views.result(),
    )


def grid_scores(maps: AttentionMaps) -> list[GridScore]:
    """Each layer's grid score, ``K`` the largest odd number with ``K²`` at most its heads
    (``default_kernel_size``) and ``K`` at most the grid's sides."""
    fits = min(maps.grid) - 1 + min(maps.grid) % 2  # the largest odd number <= both sides
    return [
        grid_score(p, maps.grid, min(default_kernel_size(p.shape[0]), fits)) for p in maps.probs
    ]


def _tap(score: GridScore, head: int) -> dict[str, Any]:
    """The grid-score tap assigned to ``head``: offset (rows, columns) and the head's mass on it;
    None for a head the assignment leaves without a tap."""
    if head not in score.assignment:
        return {"grid_tap_row": None, "grid_tap_col": None, "grid_tap_mass": None}
    tap = score.assignment.index(head)
    k = score.kernel_size
    i, j = divmod(tap, k)
    return {
        "grid_tap_row": i - k // 2,
        "grid_tap_col": j - k // 2,
        "grid_tap_mass": float(score.tap_mass[head, i, j]),
    }


def head_rows(
    maps: AttentionMaps,
    prefix_attention: Sequence[Tensor] | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One row per layer and head of ``maps``: ``rows`` (e.g. the Gaussian head table; default:
    only ``layer`` and ``head``) with ``attention_distance`` (patches/tokens),
    ``attention_distance_pixels``, ``prefix_attention`` (zero without ``prefix_attention``) and
    the head's tap in its layer's grid score (``grid_tap_row``/``_col``: offset from the query,
    ``grid_tap_mass``: the head's mean attention on it; empty for heads without a tap)."""
    table = add_distances(rows or [], layer_distances(maps))
    scores = grid_scores(maps)
    for row in table:
        layer, head = row["layer"], row["head"]
        row["attention_distance_pixels"] = row["attention_distance"] * maps.stem
        row["prefix_attention"] = (
            0.0 if prefix_attention is None else float(prefix_attention[layer][head])
        )
        row.update(_tap(scores[layer], head))
    return table


def layer_rows(
    maps: AttentionMaps, prefix_attention: Sequence[Tensor] | None = None
) -> list[dict[str, Any]]:
    """One row per layer: ``heads``, mean ``attention_distance`` over heads (patches) and
    ``attention_distance_pixels``, ``grid_kernel``, ``grid_score``, ``grid_coverage`` and mean
    ``prefix_attention``."""
    rows = []
    for layer, (distance, score) in enumerate(
        zip(layer_distances(maps), grid_scores(maps), strict=True)
    ):
        rows.append(
            {
                "layer": layer,
                "heads": int(distance.shape[0]),
                "attention_distance": float(distance.mean()),
                "attention_distance_pixels": float(distance.mean()) * maps.stem,
                "grid_kernel": score.kernel_size,
                "grid_score": score.score,
                "grid_coverage": score.coverage,
                "prefix_attention": (
                    0.0 if prefix_attention is None else float(prefix_attention[layer].mean())
                ),
            }
        )
    return rows


def format_layer_table(rows: Sequence[dict[str, Any]], prefix: bool) -> str:
    """``layer_rows`` as aligned text (the prefix-attention column only when ``prefix``)."""
    columns = [
        ("layer", "layer", "{:d}"),
        ("heads", "heads", "{:d}"),
        ("attention_distance", "distance (patches)", "{:.2f}"),
        ("attention_distance_pixels", "distance (px)", "{:.1f}"),
        ("grid_score", "grid score", "{:.3f}"),
    ]
    if prefix:
        columns.append(("prefix_attention", "to class/register tokens", "{:.3f}"))
    cells = [[header for _, header, _ in columns]]
    cells += [[form.format(row[key]) for key, _, form in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(text.rjust(width) for text, width in zip(line, widths, strict=True))
        for line in cells
    )
