r"""Grid score: how close the heads of one layer come to the taps of a K×K convolution.

Theorem 1 builds a $K \times K$ convolution from $K^2$ heads, each attending with all its mass to
one tap offset $\delta \in \{-r, \dots, r\}^2$ ($r = \lfloor K/2 \rfloor$) around the query. The
paper's claim is that trained heads settle into such a grid by themselves. For a layer with
probabilities $P^h_{q,k}$ on an ``h × w`` token grid
([the grid score][the-grid-score-do-trained-heads-become-a-convolution] says more):

* $m_h(\delta)$ is head $h$'s *tap mass*: the attention it puts on the token at offset $\delta$ from
  the query, averaged over the interior queries (those whose whole $K \times K$ window lies inside
  the grid, so every tap exists);
* the **grid score** is $\max_\sigma \frac{1}{K^2} \sum_\delta m_{\sigma(\delta)}(\delta)$ over
  one-to-one assignments $\sigma$ of taps to heads (the Hungarian algorithm): 1 exactly when $K^2$
  of the heads are the theorem's construction (each a one-hot on its own tap), about $1/N$ for heads
  that attend uniformly, and $1/K^2$ when every head looks at the same tap;
* the **coverage** is the fraction of the $K^2$ taps on which some head puts at least half of its
  mass (``COVERED_MASS``): how many taps have a dedicated head.

$K$ defaults to the largest odd kernel with $K^2 \le$ ``heads`` (3 for the paper's 9 heads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from attnconv.viz.maps import AttentionMaps

COVERED_MASS = 0.5


@dataclass(frozen=True)
class GridScore:
    """Grid score of one layer.

    Attributes:
        kernel_size: ``K``.
        score: in ``[0, 1]``, see the module docstring.
        coverage: fraction of the $K^2$ taps some head puts at least ``COVERED_MASS`` on.
        tap_mass: ``(heads, K, K)`` mean attention of each head on each tap offset.
        assignment: for each tap in row-major order (offsets ``(−r, −r)`` … ``(r, r)``), the head
            the best assignment gives it.
    """

    kernel_size: int
    score: float
    coverage: float
    tap_mass: Tensor
    assignment: tuple[int, ...]


def default_kernel_size(heads: int) -> int:
    r"""The largest odd $K$ with $K^2 \le$ ``heads`` (at least 1)."""
    k = max(1, math.isqrt(heads))
    return k if k % 2 else k - 1


def tap_mass(probs: Tensor, grid: tuple[int, int], kernel_size: int) -> Tensor:
    r"""``(heads, K, K)``: each head's attention on each tap offset, averaged over interior queries.

    ``probs`` is ``(heads, N, N)`` on the ``grid = (h, w)`` tokens (rows are queries); the grid must
    be at least $K \times K$.
    """
    h, w = grid
    n = h * w
    if probs.dim() != 3 or probs.shape[1:] != (n, n):
        raise ValueError(
            f"probs must be (heads, {n}, {n}) for a {h}x{w} grid, got shape {tuple(probs.shape)}"
        )
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be a positive odd number, got {kernel_size}")
    r = kernel_size // 2
    if h < kernel_size or w < kernel_size:
        raise ValueError(
            f"a {h}x{w} token grid has no query with a whole {kernel_size}x{kernel_size} window"
        )
    heads = probs.shape[0]
    # probs[head, q1, q2, k1, k2]: query (q1, q2), key (k1, k2).
    p = probs.double().reshape(heads, h, w, h, w)
    q1 = torch.arange(r, h - r)
    q2 = torch.arange(r, w - r)
    mass = torch.empty(heads, kernel_size, kernel_size, dtype=torch.float64)
    for i, d1 in enumerate(range(-r, r + 1)):
        for j, d2 in enumerate(range(-r, r + 1)):
            # (heads, interior rows, interior cols): attention of each query on query + (d1, d2).
            window = p[:, q1[:, None], q2[None, :], (q1 + d1)[:, None], (q2 + d2)[None, :]]
            mass[:, i, j] = window.mean(dim=(1, 2))
    return mass


def assign_taps(mass: Tensor) -> tuple[float, float, tuple[int, ...]]:
    r"""``(score, coverage, assignment)`` of a tap mass ``(heads, taps)`` (each head's attention on
    each tap): the best one-to-one assignment of taps to heads (the Hungarian algorithm), its score
    $\frac{1}{T} \sum_t m_{\sigma(t)}(t)$ over the $T$ taps (a tap without a head counts as zero),
    the fraction of taps some head puts at least ``COVERED_MASS`` on, and the head of each tap
    (``-1``: none)."""
    taps = mass.double().cpu().numpy()
    head_index, tap_index = linear_sum_assignment(taps, maximize=True)
    assignment = np.full(taps.shape[1], -1, dtype=int)
    assignment[tap_index] = head_index
    score = float(taps[head_index, tap_index].sum()) / taps.shape[1]
    coverage = float((taps >= COVERED_MASS).any(axis=0).mean())
    return score, coverage, tuple(int(a) for a in assignment)


def grid_score(probs: Tensor, grid: tuple[int, int], kernel_size: int | None = None) -> GridScore:
    """The grid score of one layer's ``(heads, N, N)`` probabilities (module docstring)."""
    heads = probs.shape[0]
    k = default_kernel_size(heads) if kernel_size is None else int(kernel_size)
    mass = tap_mass(probs, grid, k)
    score, coverage, assignment = assign_taps(mass.reshape(heads, k * k))
    return GridScore(k, score, coverage, mass.float(), assignment)


def layer_grid_scores(maps: AttentionMaps, kernel_size: int | None = None) -> list[GridScore]:
    """The grid score of every layer of ``maps``."""
    return [grid_score(p, maps.grid, kernel_size) for p in maps.probs]
