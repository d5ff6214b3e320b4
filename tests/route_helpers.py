"""Pinning the attention route a test runs (``attnconv/attention/routes.py``), and listing the
routes a call could take."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

from attnconv.attention import routes


@contextmanager
def pinned_route(name: str) -> Iterator[None]:
    """Every choice made within the block takes route ``name``, which must be a candidate."""

    def choose(key, candidates, rule, device):
        assert name in candidates, (name, list(candidates))
        return name

    with mock.patch.object(routes.SELECTOR, "choose", choose):
        yield


def route_names(run: Callable[[], object]) -> list[str]:
    """The candidate routes of the one choice ``run()`` makes (it takes the rule meanwhile)."""
    seen: list[list[str]] = []

    def choose(key, candidates, rule, device):
        seen.append(list(candidates))
        return rule

    with mock.patch.object(routes.SELECTOR, "choose", choose):
        run()
    assert len(seen) == 1, seen
    return seen[0]
