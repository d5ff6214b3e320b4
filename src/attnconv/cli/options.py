"""The types of every option of every ``attnconv`` command, and the one output rule.

Each option a command's ``add_arguments`` declares takes its ``type`` from here (or ``choices``, or
is a flag), so its value is checked when the command line is read, before anything is loaded or
written: numbers are finite and within the option's range (``Number``: ``positive``, ``float_in``,
``probability``, ``int_in``), paths are what the option needs (``InputFile``, ``RunFolder``,
``CheckpointSource``, ``DataFolder``, ``OutputFolder``, ``OutputFile``), names are UTF-8 text
without control characters (``Name``) or one of a registry's (``Registry``, ``Device``), and
``KEY=VALUE`` overrides have that form (``KeyValue``). A value that fails is one line, ``attnconv
COMMAND: error: argument --OPTION: ...`` with exit status 2 (``Parser``), never a traceback.
``tests/test_cli_options.py`` tries every option of every command with hostile values (NaN,
infinities, 0, -1, 10**20, empty, non-UTF-8, a missing file, a folder, a FIFO), so an option
added without its check fails it.

What needs more than the value itself is checked by the command with the helpers below, as the
first thing it does: ``matching`` (layer patterns that must match a network's layers) and
``claim_output``, the one output rule: a command that writes a result refuses a folder or file
that already holds one unless ``--overwrite`` (or its ``--resume``) asks for it, writes every file
atomically (``attnconv.runs.write_atomic``), and removes the temporary files a killed earlier run
of it left there (``attnconv.runs.remove_dead_temporaries``).

This module imports nothing heavy: ``attnconv --help`` and each command's parser stay fast.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib
import math
import os
import re
import stat
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from attnconv.errors import UserError

INT64_MAX = 2**63 - 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UsageError(UserError):
    """A user mistake on the command line; printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr, ``PROG: error: MESSAGE (see
    PROG --help)``, with exit status 2, where argparse would print its usage block above it."""

    def error(self, message: str) -> None:  # type: ignore[override]
        text = printable(" ".join(str(message).split()))
        self.exit(2, f"{self.prog}: error: {text} (see {self.prog} --help)\n")


def printable(text: str) -> str:
    """``text`` that any stream can print: characters UTF-8 cannot encode (the lone surrogates
    by which Python keeps the non-UTF-8 bytes of a command line) as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _refuse(reason: str, text: str) -> argparse.ArgumentTypeError:
    shown = repr(text) if len(text) <= 80 else repr(text[:30] + "..." + text[-47:])  # a path's end names it
    return argparse.ArgumentTypeError(f"{reason}, got {printable(shown)}")


def _plain_text(text: str, what: str) -> str:
    """``text`` if it is non-empty UTF-8 text without control characters."""
    if not isinstance(text, str):
        raise argparse.ArgumentTypeError(f"expected {what}, got {type(text).__name__}")
    if text == "":
        raise argparse.ArgumentTypeError(f"expected {what}, got an empty value")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse(f"expected {what} in UTF-8 (attnconv records it as text)", text) from None
    if _CONTROL.search(text):
        raise _refuse(f"expected {what} without control characters", text)
    return text


class OptionType:
    """An argparse ``type``: the text of one value in, the value out, or ArgumentTypeError (one
    line). ``what`` says in words what the option takes; ``__name__`` is what argparse names the
    type in its own messages."""

    what = "a value"

    @property
    def __name__(self) -> str:
        return type(self).__name__

    def __call__(self, text: str) -> Any:
        return self.convert(_plain_text(text, self.what))

    def convert(self, text: str) -> Any:
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.what!r})"


# ---------------------------------------------------------------------------- numbers


class Number(OptionType):
    """A finite number in ``[low, high]`` (``low_open``/``high_open``: that end excluded), an
    integer when ``integer``. Both ends are finite, so NaN, the infinities and values like
    ``10**20`` are refused by every numeric option."""

    def __init__(
        self,
        low: float,
        high: float,
        *,
        integer: bool = False,
        low_open: bool = False,
        high_open: bool = False,
    ) -> None:
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"a Number needs finite bounds low <= high, got {low}, {high}")
        self.low, self.high, self.integer = low, high, integer
        self.low_open, self.high_open = low_open, high_open
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        kind = "an integer" if integer else "a finite number"
        self.what = f"{kind} in {left}{_number(low)}, {_number(high)}{right}"

    def contains(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def convert(self, text: str) -> int | float:
        stripped = text.strip()
        try:
            if not stripped.isascii():  # Python reads other scripts' digits too: not here
                raise ValueError(stripped)
            value: int | float = (
                int(stripped) if self.integer and re.fullmatch(r"[+-]?[0-9]+", stripped)
                else float(stripped)
            )
        except ValueError:
            raise _refuse(f"expected {self.what}", text) from None
        if self.integer and not isinstance(value, int):
            raise _refuse(f"expected {self.what}", text)
        if not (math.isfinite(value) and self.contains(value)):
            raise _refuse(f"expected {self.what}", text)
        return value


def _number(value: float) -> str:
    """``value`` as the help and errors write a bound: ``0.1``, ``65535``, ``10**15``, ``2**31 - 1``."""
    if float(value).is_integer():
        whole = int(value)
        if abs(whole) < 10**7:
            return str(whole)
        sign = "-" if whole < 0 else ""
        for base in (10, 2):
            for below in (0, 1):  # 10**15, 2**31 - 1
                exponent = round(math.log(abs(whole) + below, base))
                if base**exponent == abs(whole) + below:
                    return f"{sign}{base}**{exponent}" + (" - 1" if below else "")
    return f"{value:g}"


def positive(maximum: float, *, integer: bool = False) -> Number:
    """A finite number > 0 (an integer >= 1) up to ``maximum``."""
    if integer:
        return Number(1, maximum, integer=True)
    return Number(0, maximum, low_open=True)


def float_in(low: float, high: float, **ends: bool) -> Number:
    """A finite number in ``[low, high]`` (``low_open``, ``high_open`` exclude an end)."""
    return Number(low, high, **ends)


def probability() -> Number:
    """A finite number in ``[0, 1]``."""
    return Number(0, 1)


def int_in(low: int, high: int = INT64_MAX) -> Number:
    """An integer in ``[low, high]`` (by default up to the largest signed 64-bit integer)."""
    return Number(low, high, integer=True)


def seed() -> Number:
    """A seed: an integer in ``[0, 2**63)`` (``attnconv.seeds``)."""
    return Number(0, INT64_MAX, integer=True)


# ---------------------------------------------------------------------------- names


class Name(OptionType):
    """Non-empty UTF-8 text without control characters: a name checked by the command (a
    dataset, a pretrained model, a pattern)."""

    def __init__(self, what: str = "a name") -> None:
        self.what = what


class Registry(Name):
    """One of the names ``source`` (``"module:attribute"``, a mapping, sequence or function
    giving one) holds, read when the first value is checked; ``extra`` names are also taken
    (``all``). An unknown name is refused with ``message`` (``{value}``: the name given,
    ``{names}``: those it may be)."""

    def __init__(
        self,
        noun: str,
        source: str,
        extra: Sequence[str] = (),
        message: str = "unknown {noun} {value}; valid {noun}s: {names}",
    ) -> None:
        super().__init__(f"a {noun}")
        self.noun, self.source, self.extra, self.message = noun, source, tuple(extra), message

    def names(self) -> list[str]:
        module, _, attribute = self.source.partition(":")
        found = getattr(importlib.import_module(module), attribute)
        return [*(found() if callable(found) else found), *self.extra]

    def convert(self, text: str) -> str:
        names = self.names()
        if text not in names:
            shown = ", ".join(names) or "none"
            value = printable(repr(text if len(text) <= 80 else text[:77] + "..."))
            raise argparse.ArgumentTypeError(
                self.message.format(noun=self.noun, value=value, names=shown)
            )
        return text


def shipped_model(extra: Sequence[str] = ()) -> Registry:
    """The name of a model shipped with attnconv (or one of ``extra``, e.g. ``all``)."""
    return Registry(
        "shipped model",
        "attnconv.models.pretrained:pretrained_models",
        extra,
        "no pretrained weights for {value}; shipped: {names}",
    )


def preset_name() -> Registry:
    """The name of a preset (``attnconv models`` lists them)."""
    return Registry("preset", "attnconv.models.presets:PRESETS")


def dataset_name() -> Registry:
    """The name of a dataset attnconv reads."""
    return Registry("dataset", "attnconv.data.datasets:DATASETS")


class Device(Name):
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""

    what = "a device: auto, cpu, cuda or cuda:N"

    def __init__(self) -> None:
        pass

    def convert(self, text: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda|cuda:\d{1,4}", text):
            raise _refuse(f"expected {self.what}", text)
        return text


class KeyValue(Name):
    """``KEY=VALUE`` with a non-empty ``KEY`` (a config or ``model.`` key, checked by the
    command)."""

    what = "KEY=VALUE"

    def __init__(self) -> None:
        pass

    def convert(self, text: str) -> str:
        key, equals, _ = text.partition("=")
        if not equals or not key.strip():
            raise _refuse(f"expected {self.what} (e.g. lr=0.05)", text)
        return text


# ---------------------------------------------------------------------------- paths


def _kind(path: Path) -> str | None:
    """``"folder"``, ``"file"``, another kind in words, or None where nothing is (links
    followed)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return "a path through a file"
    except OSError as err:
        return f"unreadable ({err.strerror})"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISREG(mode):
        return "file"
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a file or folder"


class PathOption(OptionType):
    """A path: UTF-8 text without control characters, whose file-system kind ``check`` says
    whether the option takes."""

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, text: str) -> str:
        problem = self.check(Path(text))
        if problem:
            raise _refuse(f"expected {self.what}: {problem}", text)
        return text

    def check(self, path: Path) -> str | None:
        raise NotImplementedError


class InputFile(PathOption):
    """An existing regular file one can read (links followed)."""

    def check(self, path: Path) -> str | None:
        from attnconv.runs import path_problem

        problem = path_problem(path)
        return f"it {problem}" if problem else None


class InputFolder(PathOption):
    """An existing folder."""

    def check(self, path: Path) -> str | None:
        kind = _kind(path)
        if kind is None:
            return "it does not exist"
        if kind != "folder":
            return f"it is {'a file' if kind == 'file' else kind}, not a folder"
        return None


class RunFolder(InputFolder):
    """An existing folder that holds ``needs`` (e.g. ``metrics.jsonl``): a run folder."""

    def __init__(self, what: str, needs: str) -> None:
        super().__init__(what)
        self.needs = needs

    def check(self, path: Path) -> str | None:
        problem = super().check(path)
        if problem is None and not (path / self.needs).exists():
            return f"it has no {self.needs}"
        return problem


class CheckpointSource(PathOption):
    """A checkpoint: a regular file, or a run folder (one with ``checkpoints/``), whose
    checkpoint the command picks."""

    def __init__(self, what: str = "a checkpoint file or run folder") -> None:
        super().__init__(what)

    def check(self, path: Path) -> str | None:
        from attnconv.runs import CHECKPOINTS, path_problem

        kind = _kind(path)
        if kind == "folder":
            if not (path / CHECKPOINTS).is_dir():
                return f"it is a folder but not a run folder (no {CHECKPOINTS}/)"
            return None
        problem = path_problem(path)
        return f"it {problem}" if problem else None


class InitSource(PathOption):
    """A checkpoint file to start from, or ``pretrained:NAME`` for a shipped model."""

    def __init__(self, what: str = "a checkpoint file or pretrained:NAME") -> None:
        super().__init__(what)

    def check(self, path: Path) -> str | None:
        text = str(path)
        if text.startswith("pretrained:"):
            return None if text.removeprefix("pretrained:") else "no NAME after pretrained:"
        return InputFile(self.what).check(path)


class DataFolder(PathOption):
    """A folder that may not exist yet (it is made): not an existing file, FIFO or device."""

    def __init__(self, what: str = "a folder") -> None:
        super().__init__(what)

    def check(self, path: Path) -> str | None:
        kind = _kind(path)
        if kind not in (None, "folder"):
            return f"it is {'a file' if kind == 'file' else kind}, not a folder"
        return _ancestor_problem(path) if kind is None else None


class OutputFolder(DataFolder):
    """The folder a command writes its result into: new, or an existing folder (whether it may
    be written, ``claim_output`` says when the command starts)."""


class OutputFile(PathOption):
    """The file a command writes: new, or an existing regular file (``claim_output``), in an
    existing folder."""

    def check(self, path: Path) -> str | None:
        kind = _kind(path)
        if kind not in (None, "file"):
            return f"it is {kind}, not a file"
        parent = path.parent
        if _kind(parent) != "folder":
            return f"its folder {parent} does not exist"
        return None


def _ancestor_problem(path: Path) -> str | None:
    """Why a folder could not be made at ``path``: an ancestor that is not a folder."""
    for parent in path.absolute().parents:
        kind = _kind(parent)
        if kind == "folder":
            return None
        if kind is not None:
            return f"{parent} is {'a file' if kind == 'file' else kind}, not a folder"
    return None


# ---------------------------------------------------------------------------- rules at run time


def add_overwrite(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--overwrite`` flag of a command that writes ``what``."""
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help=f"write into --out even if it already holds {what} (files of the same names are "
        "replaced, others left)",
    )


def _result_files(path: Path, result: Iterable[str] | None) -> list[str]:
    """What in the folder ``path`` counts as a result: the ``result`` names present, or (None)
    anything but temporary files."""
    from attnconv.runs import TMP_SUFFIX

    if result is not None:
        return [name for name in result if (path / name).exists() or (path / name).is_symlink()]
    names = sorted(entry.name for entry in os.scandir(path))
    return [n for n in names if not (n.startswith(".") and n.endswith(TMP_SUFFIX))]


def claim_output(
    path: str | Path,
    overwrite: bool,
    *,
    result: Iterable[str] | None = None,
    option: str = "--out",
    folder: bool = True,
) -> Path:
    """The one output rule, checked before a command does any work: UsageError (one line) if
    ``path`` already holds a result and ``overwrite`` is not set. For a folder (``folder``) a
    result is any of the ``result`` names in it, or with ``result=None`` anything but a killed
    run's temporary files; for a file (``folder=False``), the file itself. The temporary files a
    killed earlier run left there (``attnconv.runs.remove_dead_temporaries``) are removed."""
    from attnconv.runs import remove_dead_temporaries

    path = Path(path)
    if not folder:
        if path.exists() and not overwrite:
            raise UsageError(
                f"{option} {printable(str(path))} already exists; give --overwrite to replace it, "
                f"or another {option}"
            )
        if path.parent.is_dir():
            remove_dead_temporaries(path.parent, depth=0)
        return path
    if not path.is_dir():
        return path
    found = _result_files(path, result)
    if found and not overwrite:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise UsageError(
            f"{option} {printable(str(path))} already holds a result ({printable(shown)}); give "
            f"--overwrite to write over it, or another {option}"
        )
    remove_dead_temporaries(path)
    return path


def matching(
    patterns: Sequence[str], names: Sequence[str], option: str, kind: str = "layer"
) -> list[str]:
    """The ``names`` (in their order) that the ``fnmatch`` ``patterns`` select; UsageError
    naming ``option`` and the first pattern that matches none of them."""

    chosen = []
    for pattern in patterns:
        matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            listed = ", ".join(list(names)[:8]) + (", ..." if len(names) > 8 else "")
            raise UsageError(
                f"{option} {printable(repr(pattern))} matches no {kind}; the {kind}s are {listed}"
            )
        chosen += [name for name in matched if name not in chosen]
    return [name for name in names if name in chosen]


def option_types(parser: argparse.ArgumentParser) -> list[tuple[argparse.Action, Any]]:
    """Every action of ``parser`` but help, with its type (None for flags and choices)."""
    return [
        (action, action.type)
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._VersionAction))
    ]


def safe_streams() -> None:
    """Make stdout (and stderr) print what UTF-8 cannot encode as backslash escapes, as Python's
    stderr does by default: a non-UTF-8 name a command prints never ends it with a traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", "") == "strict":
            with contextlib.suppress(ValueError, OSError):  # a stream that cannot change now
                reconfigure(errors="backslashreplace")
