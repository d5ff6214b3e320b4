"""Timing the attention layers' routes side by side (``attnconv/attention/routes.py``): each route
pinned, the layer as it picks, and the name of its pick; their table.

    with measuring():                  # a fresh selector, timing on, no cache file
        with pinned("shared"):         # every choice within takes the route "shared"
            layer(x)
        with picks() as chosen:        # the selector picks; chosen[-1] is what it took
            layer(x)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

import torch

from attnconv.attention import routes

ROUTE = "route: "
"""The row name of a pinned route starts so."""
PICKED = "layer, as it picks"
"""The row name of the layer as its selector picks; the ratios are to it."""


@contextmanager
def measuring() -> Iterator[routes.RouteSelector]:
    """A fresh selector for the layers, timing on and no cache file (``ATTNCONV_ROUTE_CACHE``
    unset within): each key is measured here, as a first use on this machine would."""
    selector = routes.RouteSelector()
    selector.timing = True
    cache = os.environ.pop(routes.CACHE_ENV, None)
    try:
        with mock.patch.object(routes, "SELECTOR", selector):
            yield selector
    finally:
        if cache is not None:
            os.environ[routes.CACHE_ENV] = cache


@contextmanager
def pinned(name: str) -> Iterator[None]:
    """Every choice within takes route ``name`` (ValueError where it is not a candidate)."""

    def choose(key: str, candidates: dict, rule: str, device: torch.device) -> str:
        if name not in candidates:
            raise ValueError(f"route {name!r} is not among {list(candidates)}")
        return name

    with mock.patch.object(routes.SELECTOR, "choose", choose):
        yield


@contextmanager
def picks() -> Iterator[list[str]]:
    """The routes the selector takes within, in order (it chooses as it would)."""
    chosen: list[str] = []
    choose = routes.SELECTOR.choose

    def recorded(key: str, candidates: dict, rule: str, device: torch.device) -> str:
        chosen.append(choose(key, candidates, rule, device))
        return chosen[-1]

    with mock.patch.object(routes.SELECTOR, "choose", recorded):
        yield chosen


def candidates(run: Callable[[], object]) -> list[str]:
    """The candidate routes of the one choice ``run()`` makes (it takes the rule meanwhile)."""
    seen: list[list[str]] = []

    def choose(key: str, found: dict, rule: str, device: torch.device) -> str:
        seen.append(list(found))
        return rule

    with mock.patch.object(routes.SELECTOR, "choose", choose):
        run()
    if len(seen) != 1:
        raise ValueError(f"expected one choice of route, saw {len(seen)}")
    return seen[0]


def print_table(title: str, times: dict[tuple[str, str], dict[str, float]],
                picked: dict[tuple[str, str], str]) -> None:
    """Print ``times`` (``{(mode, precision): {row: seconds}}``) as one row per contender and two
    columns per mode, milliseconds and the ratio to ``PICKED``'s time, then the route picked in
    each mode and, as the measurement's own spread, ``PICKED``'s time over that route's pinned
    one (the same computation timed twice)."""
    modes = list(times)
    names = list(dict.fromkeys(name for mode in modes for name in times[mode]))
    width = max(map(len, names)) + 2
    print(f"\n{title}; ms per call, (ratio) = that time / the layer's as it picks")
    print(f"{'':<{width}}" + "".join(f"{mode + ' ' + precision:>19}" for mode, precision in modes))
    for name in names:
        cells = []
        for mode in modes:
            seconds = times[mode].get(name)
            cells.append(f"{'-':>19}" if seconds is None else
                         f"{seconds * 1e3:>11.2f} ({seconds / times[mode][PICKED]:.2f}x)")
        print(f"{name:<{width}}" + "".join(cells))
    print("picked: " + "; ".join(f"{mode} {precision}: {picked[mode, precision]}"
                                 for mode, precision in modes))
    print("the same route twice, layer as it picks / its route pinned (the spread of runs): "
          + "; ".join(f"{mode} {precision}: "
                      f"{times[mode, precision][PICKED] / times[mode, precision][ROUTE + route]:.2f}x"
                      for (mode, precision), route in picked.items()), flush=True)


def fastest_route(times: dict[str, float]) -> float:
    """The best time of the pinned routes among ``times``."""
    return min(seconds for name, seconds in times.items() if name.startswith(ROUTE))


def pick_over_fastest(times: dict[str, float], picked: str) -> float:
    """The time of route ``picked``, pinned, over the fastest pinned route's: how far the pick is
    from the best of its routes, each measured alike (the row ``PICKED`` is the same route run
    again, and differs from its pinned row by the spread of runs alone)."""
    return times[ROUTE + picked] / fastest_route(times)
