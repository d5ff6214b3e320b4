"""attnconv.cli.options: every option of every command, tried with hostile values, is refused in
one line with exit status 2 or taken for what it is, never a traceback, never a file left behind.

The cases are generated from the parsers themselves (``build_parser``), so an option added to a
command is tried without writing a case, and one added without a type from ``attnconv.cli.options``
(or ``choices``, or as a flag) fails ``test_every_option_has_a_checked_type``. The parse-level
checks run in-process; ``test_hostile_values_through_the_real_command_line`` runs a handful through
``python -m attnconv``, with the bytes of a non-UTF-8 argument as the shell passes them.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnconv.cli import COMMANDS, build_parser, main
from attnconv.cli.options import (
    CheckpointSource,
    DataFolder,
    Device,
    InitSource,
    InputFile,
    InputFolder,
    KeyValue,
    Name,
    Number,
    OptionType,
    OutputFile,
    OutputFolder,
    Registry,
    RunFolder,
    int_in,
    matching,
    option_types,
)

NON_UTF8 = os.fsdecode(b"\xff\xfe")  # how Python hands over a non-UTF-8 argument
HOSTILE = {
    "nan": "nan",
    "inf": "inf",
    "-inf": "-inf",
    "zero": "0",
    "minus one": "-1",
    "10**20": str(10**20),
    "empty": "",
    "non-UTF-8": NON_UTF8,
    "missing file": "{tmp}/missing",
    "folder": "{tmp}/folder",
    "FIFO": "{tmp}/fifo",
}
NUMERIC = ("nan", "inf", "-inf", "zero", "minus one", "10**20")
PATHS = ("missing file", "folder", "FIFO")
# What each kind of option must refuse of HOSTILE (the rest it takes: the command checks it, or it
# is a valid value, e.g. a folder to be made)
ALL = frozenset(HOSTILE)
MUST_REFUSE: dict[type, frozenset[str]] = {
    Name: frozenset({"empty", "non-UTF-8"}),
    Registry: ALL,
    Device: ALL,
    KeyValue: ALL,
    InputFile: ALL,
    RunFolder: ALL,
    CheckpointSource: ALL,
    InitSource: ALL,
    InputFolder: ALL - {"folder"},
    DataFolder: frozenset({"empty", "non-UTF-8", "FIFO"}),
    OutputFolder: frozenset({"empty", "non-UTF-8", "FIFO"}),
    OutputFile: frozenset({"empty", "non-UTF-8", "folder", "FIFO"}),
}
# What each command's parser requires, nothing more: the options before the one tried, and the
# positional arguments after it (unless it is the one tried)
BASE = {
    "convert": (["--check"], {}),
    "plot": (["--out", "{tmp}/out"], {}),
    "analyze": (["--out", "{tmp}/out"], {}),
    "explore": (["--out", "{tmp}/out"], {}),
    "report": ([], {"runs": "{tmp}/run"}),
    "train": ([], {}),
    "eval": ([], {}),
    "robustness": ([], {}),
    "reproduce": ([], {"experiment": "fashion-mnist"}),
    "demo": ([], {}),
    "models": ([], {}),
    "transform": (["--out", "{tmp}/out"], {}),
    "heads": ([], {}),
}


def subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(command)
    return parser._subparsers._group_actions[0].choices[command]


def options(command: str) -> list[argparse.Action]:
    return [action for action, _ in option_types(subparser(command))]


def label(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def must_refuse(kind: OptionType) -> frozenset[str]:
    if isinstance(kind, Number):
        refused = set(NUMERIC) - {"zero", "minus one"} | {"empty", "non-UTF-8", *PATHS}
        refused |= {name for name in ("zero", "minus one") if not kind.contains(float(HOSTILE[name]))}
        return frozenset(refused)
    for cls in type(kind).__mro__:
        if cls in MUST_REFUSE:
            return MUST_REFUSE[cls]
    raise AssertionError(f"no rule for the option type {kind!r}: add it to MUST_REFUSE")


@pytest.fixture
def hostile_dir(tmp_path, monkeypatch):
    """A scratch folder as the working directory, with the hostile paths and a run folder the
    commands' required arguments name; returns a function from a HOSTILE key to its value."""
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"epoch": 1}\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def listing(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


# ---------------------------------------------------------------------------- the rule itself


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_a_checked_type(command):
    """A value-taking option without a type of attnconv.cli.options (or choices) would reach the
    command unchecked."""
    unchecked = [
        label(action)
        for action in options(command)
        if action.nargs != 0
        and action.choices is None
        and not isinstance(action.type, OptionType)
    ]
    assert unchecked == []
    for action in options(command):
        if isinstance(action.type, Number):  # finite bounds, below 10**20: every one refuses it
            assert max(abs(action.type.low), abs(action.type.high)) < 10**20, label(action)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_refuses_hostile_values_in_one_line(command, hostile_dir, capsys):
    before = listing(hostile_dir)
    tried = 0
    for action in options(command):
        for name, template in HOSTILE.items():
            value = template.format(tmp=hostile_dir)
            kind = action.type
            if isinstance(kind, OptionType):
                try:
                    kind(value)
                    refused = False
                except argparse.ArgumentTypeError as err:
                    refused = True
                    assert "\n" not in str(err)
                assert refused == (name in must_refuse(kind)), (label(action), name, kind)
            else:
                refused = action.nargs == 0 or value not in (action.choices or [value])
            before_options, positionals = BASE[command]
            argv = [command, *(part.format(tmp=hostile_dir) for part in before_options)]
            if action.option_strings:
                flag = action.option_strings[-1]
                argv += [flag, value, "0"] if action.nargs == 2 else [f"{flag}={value}"]
            positionals = {**positionals, **({} if action.option_strings else {action.dest: value})}
            if positionals:
                argv += ["--", *(part.format(tmp=hostile_dir) for part in positionals.values())]
            tried += 1
            try:
                build_parser(command).parse_args(argv)
            except SystemExit as exit:
                err = capsys.readouterr().err
                assert exit.code == 2, (argv, err)
                assert err.count("\n") == 1 and err.startswith(f"attnconv {command}: error: "), err
                assert "Traceback" not in err
            else:
                assert not refused, f"{argv} was taken"
                capsys.readouterr()
    assert tried == len(options(command)) * len(HOSTILE)
    assert listing(hostile_dir) == before  # reading the command line writes nothing


def test_the_types_take_what_they_should(tmp_path):
    seed = int_in(0)
    assert seed("0") == 0 and seed(str(2**63 - 1)) == 2**63 - 1
    for bad in (str(2**63), "1.5", "1e3", "0x10", " ", "１"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed(bad)
    spread = Number(0, 1000, low_open=True)
    assert spread("1e3") == 1000.0 and spread(" 2.5 ") == 2.5
    assert spread.what == "a finite number in (0, 1000]"
    with pytest.raises(argparse.ArgumentTypeError, match=r"in \(0, 1000\], got '1e308'"):
        spread("1e308")
    assert math.isclose(Number(-1, 1)("-0.5"), -0.5)
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.pt").write_bytes(b"x")
    os.symlink("/dev/zero", tmp_path / "zero")
    with pytest.raises(argparse.ArgumentTypeError, match="symbolic link to /dev/zero, a character"):
        InputFile("a weights file")(str(tmp_path / "zero"))
    assert InputFile("a file")(str(folder / "a.pt")) == str(folder / "a.pt")
    with pytest.raises(argparse.ArgumentTypeError, match="not a folder"):
        OutputFolder()(str(folder / "a.pt" / "below"))
    assert OutputFile("a CSV file")(str(folder / "new.csv"))
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        OutputFile("a CSV file")(str(tmp_path / "nowhere" / "new.csv"))
    with pytest.raises(argparse.ArgumentTypeError, match="control characters"):
        Name("a name")("two\nlines")
    assert InitSource()("pretrained:quadratic-fashion") == "pretrained:quadratic-fashion"
    assert Device()("cuda:1") == "cuda:1"
    assert matching(["b*", "a"], ["a", "b1", "b2", "c"], "--layers") == ["a", "b1", "b2"]
    with pytest.raises(Exception, match=r"--layers 'x\*' matches no layer; the layers are a, b"):
        matching(["x*"], ["a", "b"], "--layers")


# ---------------------------------------------------------------------------- names, when run

# Options that take any name the parser cannot judge (checked when the command runs): the argv
# that runs the command with one, where the name is all that is wrong. A new such option needs a
# line here (the test below fails without it).
NAME_RUNS = {
    ("analyze", "model"): ["analyze", "{value}", "--out", "{tmp}/out"],
    ("analyze", "--pretrained"): ["analyze", "--pretrained", "{value}", "--out", "{tmp}/out"],
    ("analyze", "--images"): ["analyze", "quick", "--images", "{value}", "--out", "{tmp}/out"],
    ("explore", "--pretrained"): ["explore", "--pretrained", "{value}", "--out", "{tmp}/out"],
    ("models", "pattern"): ["models", "{value}"],
    ("transform", "--layers"): [
        "transform", "--pretrained", "resnet-fashion-small", "--spread", "3", "--out",
        "{tmp}/out", "--layers", "{value}",
    ],
    ("transform", "--content-layers"): [
        "transform", "--pretrained", "resnet-fashion-small", "--spread", "3", "--out",
        "{tmp}/out", "--content-layers", "{value}",
    ],
}


def name_options() -> list[tuple[str, str]]:
    return [
        (command, label(action))
        for command in COMMANDS
        for action in options(command)
        if type(action.type) is Name
    ]


def test_every_free_name_option_has_a_run_case():
    assert sorted(name_options()) == sorted(NAME_RUNS)


@pytest.mark.parametrize("case", sorted(NAME_RUNS))
@pytest.mark.parametrize("value", ["nan", "-1", "{tmp}/folder"])
def test_a_name_the_parser_takes_is_refused_in_one_line_when_run(
    case, value, hostile_dir, capsys
):
    before = listing(hostile_dir)
    argv = [part.format(tmp=hostile_dir, value=value.format(tmp=hostile_dir)) for part in NAME_RUNS[case]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert listing(hostile_dir) == before


# ---------------------------------------------------------------------------- the output rule

# A run of each command that writes into --out (with --overwrite): it must refuse an --out that
# holds a result, before any work, and write nothing
OUTPUT_RUNS = {
    "plot": ["plot", "--pretrained", "quadratic-fashion", "--out", "{out}"],
    "analyze": ["analyze", "quick", "--out", "{out}"],
    "explore": ["explore", "--pretrained", "quadratic-fashion", "--out", "{out}"],
    "report": ["report", "{tmp}/run", "--out", "{out}"],
    "transform": [
        "transform", "--pretrained", "resnet-fashion-small", "--spread", "3", "--out", "{out}"
    ],
    "robustness": ["robustness", "--pretrained", "quadratic-fashion", "--out", "{out}"],
}
RESULTS = {"report": "summary.md", "transform": "transform.json", "robustness": None}


def test_every_command_with_overwrite_has_an_output_case():
    with_overwrite = [
        command
        for command in COMMANDS
        if any("--overwrite" in action.option_strings for action in options(command))
    ]
    assert sorted(with_overwrite) == sorted(OUTPUT_RUNS)


@pytest.mark.parametrize("command", sorted(OUTPUT_RUNS))
def test_an_out_that_holds_a_result_is_refused_without_overwrite(command, hostile_dir, capsys):
    if command == "robustness":
        out = hostile_dir / "robustness.csv"
        out.write_text("old\n")
    else:
        out = hostile_dir / "out"
        out.mkdir()
        (out / (RESULTS.get(command) or "figure.png")).write_text("old\n")
    before = listing(hostile_dir)
    argv = [part.format(tmp=hostile_dir, out=out) for part in OUTPUT_RUNS[command]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give --overwrite" in err, err
    assert listing(hostile_dir) == before


# ---------------------------------------------------------------------------- the real CLI

REAL = [
    ["transform", "--pretrained", "resnet-fashion-small", "--out", "T", "--spread", "inf"],
    ["transform", "--pretrained", "resnet-fashion-small", "--out", "T", "--qk-dim", str(10**9)],
    ["eval", "--pretrained", "quadratic-fashion", "--batch-size", "0"],
    ["robustness", "--pretrained", "all", "--images", "nan"],
    ["reproduce", "fashion-mnist", "--analyse-only", "--seeds", "-1"],
    ["train", "--preset", "quick", "--out", b"r\xff\xfe"],
    ["plot", "fifo", "--out", "figures"],
    ["explore", "--pretrained", "all", "--out", "site", "--serve", "--port", "70000"],
]


@pytest.mark.parametrize("argv", REAL, ids=lambda argv: " ".join(map(str, argv[:4])))
def test_hostile_values_through_the_real_command_line(argv, tmp_path):
    os.mkfifo(tmp_path / "fifo")
    before = listing(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "attnconv", *argv], cwd=tmp_path, capture_output=True, timeout=300
    )
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"attnconv {argv[0]}: error: argument "), err
    assert listing(tmp_path) == before


# ---------------------------------------------------------------------------- train's KEY=VALUE


def test_every_key_value_override_of_train_is_checked_or_refused_in_one_line():
    """``attnconv train KEY=VALUE``: every config key and model argument, given each hostile
    value, is resolved (a value the key takes) or refused with a UserError, never another error
    (what ``attnconv train`` does first, before anything is written)."""
    import dataclasses

    from attnconv.errors import UserError
    from attnconv.models import PRESETS
    from attnconv.train.config import TrainConfig, resolve_config

    keys = [field.name for field in dataclasses.fields(TrainConfig)]
    keys += [f"model.{name}" for name in PRESETS["quick"].model_kwargs]
    taken = {}
    for key in keys:
        for name in (*NUMERIC, "empty", "non-UTF-8"):
            value = HOSTILE[name]
            try:
                resolve_config("quick", None, [f"{key}={value}"])
            except UserError as err:
                assert "\n" not in str(err), (key, value)
            else:
                taken.setdefault(key, []).append(name)
    for key in ("epochs", "batch_size", "pad", "seed"):
        assert "10**20" not in taken.get(key, []), key  # 10**20 epochs, images or pixels
    assert not [  # a model argument may be a name ("nan" a weight_init), checked when built
        key for key, names in taken.items()
        if not key.startswith("model.") and {"nan", "inf", "-inf"} & set(names)
    ]
