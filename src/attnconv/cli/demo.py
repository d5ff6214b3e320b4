"""``attnconv demo``: Theorem 1 checked, a model trained on embedded digits, and its figures."""

from __future__ import annotations

import argparse

from attnconv.cli.options import OutputFolder, int_in
from attnconv.demo import EPOCHS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=OutputFolder(), help="folder for everything it writes "
                        "(default attnconv-demo-DATE-TIME; one that holds a demo is refused)")
    parser.add_argument("--epochs", type=int_in(1, 10**4), default=EPOCHS,
                        help=f"training epochs (default {EPOCHS})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    import time

    from attnconv.demo import run_demo

    out = args.out or f"attnconv-demo-{time.strftime('%Y%m%d-%H%M%S')}"
    demo = run_demo(out, epochs=args.epochs, progress=not args.no_progress)
    return 0 if demo["theorem1_passed"] == demo["theorem1_checked"] else 1
