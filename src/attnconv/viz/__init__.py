"""Figures of what attention learned, and an interactive explorer in the browser.

Figures (``attnconv plot``): ``contour_figure`` (probability-mass contours per head and layer),
``map_grid_figure`` (layer × head attention maps), ``distance_figure`` (attention distance),
``trajectory_figure`` (Gaussian centres over training), ``report_figure`` (accuracy of several
runs, ``attnconv report``), ``rollout_figure`` and ``class_token_figure`` (attention rollout and
the class token's attention over the image, ``attnconv analyze``). Computations: ``compute_attention``, ``mass_region``,
``attention_distance``, ``uniform_distance``, ``load_center_trajectories``, ``load_run``. A
transformed network (T-CNN, ``viz.transformed``): ``transformed_attention`` and
``gaussian_attention`` (each layer's attention on its own query and key grids),
``transformed_contour_figure``, ``gate_figure``, ``transformed_distance_figure``, and
``plot_transformed`` for all of them. The explorer (``attnconv explore``): ``write_site``. ``attention_figure(model, image_size)`` is the
figure the training loop logs to TensorBoard.

Names are loaded on first use, so importing ``attnconv.viz`` does not import matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AttentionMaps": "maps",
    "compute_attention": "maps",
    "map_grid_figure": "maps",
    "mass_threshold": "contours",
    "mass_region": "contours",
    "region_outline": "contours",
    "contour_figure": "contours",
    "distance_map": "distance",
    "attention_distance": "distance",
    "layer_distances": "distance",
    "uniform_distance": "distance",
    "distance_figure": "distance",
    "format_head_table": "distance",
    "CenterTrajectories": "trajectories",
    "load_center_trajectories": "trajectories",
    "trajectory_figure": "trajectories",
    "Run": "report",
    "load_run": "report",
    "summary_row": "report",
    "format_summary_table": "report",
    "report_figure": "report",
    "LayerAttention": "transformed",
    "transformed_attention": "transformed",
    "gaussian_attention": "transformed",
    "transformed_contour_figure": "transformed",
    "gate_figure": "transformed",
    "transformed_distance_figure": "transformed",
    "rollout_figure": "rollout",
    "class_token_figure": "rollout",
    "attention_figure": "figures",
    "plot_checkpoint": "figures",
    "plot_transformed": "figures",
    "write_site": "export",
    "save_figure": "style",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attnconv.viz' has no attribute {name!r}")
    return getattr(importlib.import_module(f"attnconv.viz.{_EXPORTS[name]}"), name)
