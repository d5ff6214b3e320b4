"""The ``attnconv`` command line.

Each subcommand lives next to the code it drives, in a module that defines

* ``HELP``: one line for ``attnconv --help``;
* ``add_arguments(parser: argparse.ArgumentParser) -> None``;
* ``run(args: argparse.Namespace) -> int``: the exit status.

``COMMANDS`` maps subcommand names to those modules. All of them are imported to build the
parser, so a command module keeps its heavy imports (matplotlib, TensorBoard, ...) inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, str] = {
    "convert": "attnconv.convert.command",
    "plot": "attnconv.viz.cli_plot",
    "explore": "attnconv.viz.cli_explore",
    "report": "attnconv.viz.cli_report",
    "train": "attnconv.train.command",
    "eval": "attnconv.train.eval_command",
    "demo": "attnconv.train.demo_command",
    "models": "attnconv.models.cli_models",
    "heads": "attnconv.models.cli_heads",
}


class UsageError(Exception):
    """A user mistake on the command line; printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnconv",
        description="Self-attention as convolution (Cordonnier et al., ICLR 2020).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._module.run(args) or 0)
    except (UsageError, ValueError, TypeError, FileNotFoundError) as err:
        print(f"attnconv {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
