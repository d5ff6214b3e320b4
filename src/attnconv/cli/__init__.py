"""The ``attnconv`` command line.

``COMMANDS`` maps each subcommand to its one-line help and to its module, ``attnconv.cli.NAME``,
which defines

* ``add_arguments(parser: argparse.ArgumentParser) -> None``;
* ``run(args: argparse.Namespace) -> int``: the exit status.

Every option's value is checked as the command line is read (``attnconv.cli.options``: one type
per kind of value, and the one output rule); a bad one is one line, exit status 2.

Errors: a ``UserError`` (bad argument, config value or file, busy or unwritable run folder), a
missing file and an OSError (permissions, read-only or full disk) print one line naming the problem
(exit status 2); anything else, a plain ValueError or TypeError included, is a bug and keeps its
traceback. Ctrl-C prints one line, with what the command saved and how to go on where it says
(``train``: the resume command), and exits with status 130 (128 + SIGINT), as shells do; SIGTERM
(``kill``, a batch system's time limit) stops the command the same way, with status 143.

Only the chosen subcommand's module is imported, so ``attnconv --help`` and ``--version`` do not
import torch; a command module keeps its heavy imports (matplotlib, TensorBoard, ...) inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import signal
import sys
import threading
from importlib import metadata

from attnconv import __version__
from attnconv.cli.options import Parser, printable, safe_streams
from attnconv.cli.options import UsageError as UsageError  # re-exported: the commands raise it
from attnconv.errors import UserError
from attnconv.runs import os_error_reason

COMMANDS: dict[str, tuple[str, str]] = {
    "convert": (
        "attnconv.cli.convert",
        "check the conv → attention construction: configuration battery (--check), spread sweep (--sweep)",
    ),
    "plot": (
        "attnconv.cli.plot",
        "draw a checkpoint's attention figures (contours, maps, distances, centre trajectories)",
    ),
    "analyze": (
        "attnconv.cli.analyze",
        "attention distance, grid score, maps, rollout and explorer of any vision transformer (timm, torchvision, attnconv)",
    ),
    "explore": (
        "attnconv.cli.explore",
        "write an offline web page to click through the attention of a checkpoint or the shipped models",
    ),
    "report": (
        "attnconv.cli.report",
        "compare training runs: accuracy curves and a Table-1-style summary",
    ),
    "train": (
        "attnconv.cli.train",
        "train a preset (from scratch, resumed exactly, or fine-tuned from a checkpoint)",
    ),
    "eval": (
        "attnconv.cli.eval",
        "accuracy and cross-entropy of a checkpoint on its dataset's test (or validation) split",
    ),
    "robustness": (
        "attnconv.cli.robustness",
        "accuracy of Fashion-MNIST models (centred or anywhere) under shifts, noise, blur, low "
        "contrast and occlusion",
    ),
    "reproduce": (
        "attnconv.cli.reproduce",
        "the paper's experiment on a dataset: train every model, Table 1, grid scores, figures",
    ),
    "demo": (
        "attnconv.cli.demo",
        "the paper in a few CPU minutes, no download: Theorem 1, training on digits, figures",
    ),
    "models": (
        "attnconv.cli.models",
        "list the model presets with parameters and forward multiply-adds per image",
    ),
    "transform": (
        "attnconv.cli.transform",
        "recast a trained CNN's convolutions as attention that keeps learning (T-CNN)",
    ),
    "heads": (
        "attnconv.cli.heads",
        "print each Gaussian attention head of a checkpoint and flag the degenerate ones; "
        "whether its content attention is alive (entropy, gates, uniform-content ablation)",
    ),
}


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: raised where the command runs, so that it stops as Ctrl-C stops it (what
    it saved, how to go on)."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def _version() -> str:
    try:
        torch = f"torch {metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        torch = "torch not installed"
    return f"attnconv {__version__} ({torch}, Python {platform.python_version()})"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of ``command`` only (the one module imported)."""
    parser = Parser(
        prog="attnconv",
        description="Self-attention as convolution (Cordonnier et al., ICLR 2020).",
    )
    parser.add_argument("--version", action="version", version=_version())
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=Parser
    )
    for name, (module_name, summary) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=summary, description=summary)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    safe_streams()
    # the top-level options take no value: the first other word names the command
    parser = build_parser(next((word for word in argv if not word.startswith("-")), None))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # --help and --version end here; a bad value printed its line
        if exit.code in (0, None):
            raise
        return int(exit.code) if isinstance(exit.code, int) else 2
    # SIGTERM stops the command as Ctrl-C does (unless someone else handles it)
    terminable = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    )
    if terminable:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args._module.run(args) or 0)
    except (UserError, FileNotFoundError) as err:
        message = str(err)
    except BrokenPipeError:  # the reader left (`attnconv models | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command the signal ended
    except OSError as err:  # permissions, read-only or full disks, ...: name the file
        message = f"{err.filename}: {os_error_reason(err)}" if err.filename else str(err)
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM: what was saved, if the command says
        advice = f"; {printable(str(err))}" if str(err) else ""
        terminated = isinstance(err, Terminated) or isinstance(err.__cause__, Terminated)
        what = "stopped by SIGTERM" if terminated else "interrupted"
        print(f"attnconv {args.command}: {what}{advice}", file=sys.stderr)
        return 143 if terminated else 130
    finally:
        if terminable:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(f"attnconv {args.command}: error: {printable(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
