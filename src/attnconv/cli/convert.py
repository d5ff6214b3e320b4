"""``attnconv convert``: check Theorem 1's construction numerically."""

from __future__ import annotations

import argparse

from attnconv.cli import UsageError
from attnconv.cli.options import float_in, seed

DEFAULT_THRESHOLD = 1e-6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--check",
        action="store_true",
        help="convert every configuration of the battery (kernel sizes, stride, dilation, padding, "
        "groups, Conv1d) and compare forward and backward to the convolution in float64 and "
        "float32; exit status 1 if any fails",
    )
    mode.add_argument(
        "--sweep",
        action="store_true",
        help="error of the finite-spread construction against the convolution as s grows, and "
        "the smallest s under --threshold",
    )
    parser.add_argument(
        "--threshold",
        type=float_in(0, 1, low_open=True, high_open=True),
        help=f"--sweep only: target relative error (default {DEFAULT_THRESHOLD:g}); --check "
        "compares with fixed per-dtype tolerances",
    )
    parser.add_argument(
        "--seed", type=seed(), default=0,
        help="seed of the random weights and inputs, in [0, 2**63)",
    )


def run(args: argparse.Namespace) -> int:
    from attnconv.convert import check
    from attnconv.seeds import check_seed

    check_seed(args.seed, "--seed")
    if args.check and args.threshold is not None:
        raise UsageError(
            "--threshold sets the target of --sweep; --check compares every configuration with "
            "fixed per-dtype tolerances"
        )
    if args.check:
        results = check.run_battery(seed=args.seed)
        print(check.format_battery(results))
        failed = sum(not r.passed for r in results)
        print(f"{len(results) - failed}/{len(results)} passed")
        return 1 if failed else 0
    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    result = check.spread_sweep(threshold=threshold, seed=args.seed)
    print(check.format_sweep(result))
    return 0
