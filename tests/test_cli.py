"""The command line's parser: --help and --version without torch, each command's own arguments."""

import platform
import subprocess
import sys
from importlib import metadata

import pytest

import attnconv
from attnconv.cli import COMMANDS, main


def run_python(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout


def test_help_and_version_do_not_import_torch():
    out = run_python(
        "import sys\n"
        "from attnconv.cli import main\n"
        "for argv in (['--help'], ['--version']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, exit.code\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    assert out.splitlines()[-1] == "torch imported: False"
    for name, (_, summary) in COMMANDS.items():
        assert name in out and summary.split()[0] in out
    torch = metadata.version("torch")
    assert (
        f"attnconv {attnconv.__version__} (torch {torch}, Python {platform.python_version()})"
        in out
    )


def test_version_matches_the_installed_package(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.startswith(f"attnconv {metadata.version('attnconv')} (torch ")


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_help_lists_its_arguments(name, capsys):
    with pytest.raises(SystemExit) as exit:
        main([name, "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: attnconv {name} ")
    assert " ".join(COMMANDS[name][1].split()[:4]) in " ".join(out.split())
    # the command's own arguments are there, beyond -h
    options = [
        word for word in out.split() if word.startswith("-") and word not in ("-h", "--help")
    ]
    assert options, out


def test_lazy_exports():
    out = run_python(
        "import sys, attnconv\n"
        "print('torch' in sys.modules)\n"
        "print(attnconv.MultiHeadSelfAttention2d.__module__, 'torch' in sys.modules)\n"
        "print(sorted(attnconv.__all__) == sorted(vars(attnconv)['_EXPORTS']))\n"
    )
    assert out.split("\n")[:3] == ["False", "attnconv.attention.layer True", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        attnconv.nope  # noqa: B018


# ---------------------------------------------------------------------------- errors


def test_a_user_mistake_is_one_line_with_exit_status_2(capsys):
    assert main(["train", "--preset", "quick", "milestones=3"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "attnconv train: error: milestones apply to schedule=step only; the cosine schedule has "
        "none (got milestones=3)\n"
    )
    assert main(["train", "--preset", "nope"]) == 2
    assert "unknown preset 'nope'; valid presets: quadratic" in capsys.readouterr().err


@pytest.mark.parametrize("error", [ValueError, TypeError])
def test_an_internal_value_or_type_error_keeps_its_traceback(monkeypatch, error):
    from attnconv.cli import models

    def broken(args):
        return int("not a number") if error is ValueError else len(3)  # a bug, not the user's

    monkeypatch.setattr(models, "run", broken)
    with pytest.raises(error):
        main(["models"])


def test_a_command_module_imports_no_torch_before_it_runs():
    out = run_python(
        "import sys\n"
        "from attnconv.cli import build_parser\n"
        "build_parser('convert')\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    assert out.strip() == "torch imported: False"


def _checkpoint_of(tmp_path, preset):
    from attnconv.models import create_model
    from viz_helpers import save_checkpoint, small_model

    if preset == "resnet-fashion":
        model, config = create_model(preset, in_channels=1), {"in_channels": 1}
    else:
        model, config = small_model(preset)
    return save_checkpoint(tmp_path / f"{preset}.pt", model, preset, config)


@pytest.mark.parametrize(
    ("command", "preset", "message"),
    [
        (["plot", "--out", "figures"], "resnet-fashion", "ResNet, which has no attention"),
        (["heads"], "learned", "head geometry needs Gaussian attention"),
    ],
)
def test_a_checkpoint_the_command_cannot_use_is_one_line(tmp_path, capsys, command, preset, message):
    path = _checkpoint_of(tmp_path, preset)
    command = [part.replace("figures", str(tmp_path / "figures")) for part in command]
    assert main([command[0], str(path), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_report_of_a_run_with_broken_json_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"epoch": 1}\n')
    (run / "config.json").write_text("{not json")
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert "config.json: not valid JSON" in err and err.count("\n") == 1, err


def test_a_reader_that_leaves_early_stops_the_command_quietly():
    """`attnconv models | head -1`, the reader gone before the table is written (unbuffered, so
    the first write meets the closed pipe): no error on stderr, the shell's status for SIGPIPE."""
    import subprocess
    import sys

    command = [sys.executable, "-u", "-m", "attnconv", "models"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        process.stdout.close()  # before the command has imported what it needs to write
        errors = process.stderr.read().decode()
        code = process.wait(timeout=120)
    assert errors == ""
    assert code == 141
