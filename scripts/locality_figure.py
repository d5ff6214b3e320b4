"""Issue 39's side-by-side view: attention distance by depth of models on different datasets.

Each model is a shipped one (``pretrained:NAME``) or a checkpoint (a file, or a run folder for its
``checkpoints/best.pt``). Draws every model's per-head distances in one figure, each panel with
the uniform-attention line of its own token grid (14×14 on Fashion-MNIST, 16×16 on
fashion-mnist-anywhere), and prints a markdown table per model and layer: mean distance in
tokens, that distance over uniform attention's, grid score and the 3×3 taps covered. Models with
content scores are averaged over the first 64 test images of their dataset, as
``attnconv reproduce`` does.

    python scripts/locality_figure.py --out docs/figures/anywhere-distance-by-depth \\
        pretrained:learned-fashion pretrained:learned-anywhere RUN_DIR ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnconv.models import create_model
from attnconv.models.checkpoint import load_model
from attnconv.models.pretrained import pretrained_info
from attnconv.reproduce import AVERAGE_IMAGES, layer_summaries
from attnconv.runs import RunDir
from attnconv.viz.distance import distance_comparison_figure, uniform_distance
from attnconv.viz.figures import test_images
from attnconv.viz.maps import compute_attention, is_position_only
from attnconv.viz.style import save_figure


def load(source: str) -> tuple[str, torch.nn.Module, str]:
    """``(name, model in eval mode, dataset)`` of ``pretrained:NAME``, a checkpoint or a run."""
    if source.startswith("pretrained:"):
        name = source.removeprefix("pretrained:")
        model = create_model(name, pretrained=True).eval()
        return f"{name} (shipped)", model, pretrained_info(name).dataset
    path = Path(source)
    if path.is_dir():
        path = RunDir(path).best
    model, checkpoint = load_model(path)
    name = f"{path.parent.parent.name}, epoch {checkpoint['epoch']}"  # the run folder's name
    return name, model.eval(), checkpoint["dataset"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", metavar="pretrained:NAME|CHECKPOINT|RUN_DIR")
    parser.add_argument("--out", type=Path, required=True, help="figure path without suffix")
    parser.add_argument("--data-dir", help="where datasets live")
    args = parser.parse_args()
    distances, grids = {}, {}
    print("| model | layer | distance (tokens) | / uniform | grid score | taps covered |")
    print("|---|---|---|---|---|---|")
    for source in args.models:
        name, model, dataset = load(source)
        images = None
        if not is_position_only(model):
            images, _ = test_images(dataset, AVERAGE_IMAGES, args.data_dir)
        summary = layer_summaries(compute_attention(model, tuple(model.image_size), images))
        uniform = uniform_distance(summary["grid"])
        label = f"{name}\n{dataset}"
        distances[label] = [torch.tensor(layer) for layer in summary["head_distances"]]
        grids[label] = summary["grid"]
        for layer, (distance, score, coverage) in enumerate(
            zip(
                summary["attention_distance"],
                summary["grid_score"],
                summary["grid_coverage"],
                strict=True,
            )
        ):
            print(
                f"| {name} ({dataset}) | {layer} | {distance:.2f} | {distance / uniform:.2f} | "
                f"{score:.2f} | {round(coverage * summary['grid_kernel'] ** 2)}/"
                f"{summary['grid_kernel'] ** 2} |"
            )
    figure = distance_comparison_figure(distances, grid=grids)
    for path in save_figure(figure, args.out.parent, args.out.name):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
