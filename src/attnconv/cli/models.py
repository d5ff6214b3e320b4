"""``attnconv models [PATTERN] [--pretrained]``: the presets with their size, cost and whether
trained weights ship for them (``attnconv.models.costs``: no model is built at 10 classes)."""

from __future__ import annotations

import argparse
from fnmatch import fnmatchcase

from attnconv.cli.options import Name, int_in
from attnconv.errors import UserError

WILDCARDS = "*?["
MAX_CLASSES = 2**31  # more than any dataset names; the classifier's shape stays countable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pattern",
        nargs="?",
        metavar="PATTERN",
        type=Name("a shell pattern or a part of a preset name"),
        help="only the presets whose name matches: a shell pattern ('*-fashion', 'quadratic*') "
        "or, without wildcards, a part of the name ('content')",
    )
    parser.add_argument(
        "--pretrained",
        action="store_true",
        help="only the presets whose trained weights ship with attnconv "
        "(create_model(NAME, pretrained=True), --pretrained NAME)",
    )
    parser.add_argument(
        "--num-classes",
        type=int_in(1, MAX_CLASSES - 1),
        default=10,
        help="classifier outputs (default: 10; another count builds each model on the meta "
        "device to count it, a few seconds)",
    )


def _human(count: int) -> str:
    """``12086844`` -> ``12.09M``; ``5280384`` -> ``5.28M``; ``3264925600`` -> ``3.26G``."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f}{unit}"
    return str(count)


def matches(name: str, pattern: str | None) -> bool:
    """Whether preset ``name`` is listed for ``pattern``: a shell pattern matched against the
    whole name, or, without wildcards, a part of it; None: every preset."""
    if pattern is None:
        return True
    if any(char in pattern for char in WILDCARDS):
        return fnmatchcase(name, pattern)
    return pattern in name


def run(args: argparse.Namespace) -> int:
    from attnconv.models.costs import preset_cost
    from attnconv.models.presets import PRESETS
    from attnconv.models.pretrained import pretrained_models

    shipped = set(pretrained_models())
    names = [
        name
        for name in PRESETS
        if matches(name, args.pattern) and (not args.pretrained or name in shipped)
    ]
    if not names:
        which = "with shipped weights " if args.pretrained else ""
        raise UserError(
            f"no preset {which}matches {args.pattern!r}; presets: {', '.join(PRESETS)}"
        )
    header = (
        f"{'preset':<30} {'params':>8} {'MACs/image':>11}  {'input':<9} {'weights':<8} description"
    )
    print(header)
    print("-" * len(header))
    for name in names:
        cost = preset_cost(name, args.num_classes)
        size = "x".join(map(str, cost.input_size))
        weights = "shipped" if name in shipped else "-"
        print(
            f"{name:<30} {_human(cost.parameters):>8} {_human(cost.macs):>11}  {size:<9} "
            f"{weights:<8} {PRESETS[name].description}"
        )
    print(
        "\nMACs: multiply-adds of one eval-mode forward on one image at the preset's default "
        "input, as executed (matrix products and convolutions). weights: shipped with attnconv, "
        "trained (create_model(NAME, pretrained=True), attnconv eval --pretrained NAME)."
    )
    return 0
