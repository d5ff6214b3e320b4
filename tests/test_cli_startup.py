"""Commands that answer at once: `attnconv --help` and each command's --help load none of the
libraries only some commands use, and `attnconv models` counts no model (no compiler stack)."""

import subprocess
import sys

import pytest

from attnconv.cli import COMMANDS

# matplotlib, scikit-learn, timm, TensorBoard, torchvision, SciPy: loaded by the commands that use
# them, when they run; torch._dynamo: what counting a model on the meta device imports
HEAVY = ("matplotlib", "sklearn", "timm", "tensorboard", "torchvision", "scipy", "torch._dynamo")


def imported(*argv: str) -> set[str]:
    """The modules ``python -m attnconv ARGV`` imports, read from ``-X importtime``."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "attnconv", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    names = {line.rsplit("|", 1)[1].strip() for line in lines[1:]}  # the first is the header
    assert "attnconv.cli" in names  # the listing is read
    return names


def heavy(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY))


def test_help_imports_no_torch_and_nothing_heavy():
    names = imported("--help")
    assert "torch" not in names and heavy(names) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_help_imports_nothing_heavy(command):
    assert heavy(imported(command, "--help")) == []


def test_models_imports_nothing_heavy():
    assert heavy(imported("models", "*-fashion")) == []
