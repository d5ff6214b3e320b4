"""`attnconv convert`: --threshold belongs to --sweep; --seed follows the rule of train's seed."""

import pytest

from attnconv.cli import main


def test_threshold_with_check_is_rejected(capsys):
    assert main(["convert", "--check", "--threshold", "1e-3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--threshold sets the target of --sweep" in err


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999999", str(2**63)])
@pytest.mark.parametrize(
    "command",
    [
        ["convert", "--check"],
        ["convert", "--sweep"],
        ["transform", "--pretrained", "resnet-fashion-small", "--out", "unwritten"],
    ],
)
def test_a_seed_outside_the_rule_train_keeps_is_one_line(capsys, command, seed):
    """One rule for seeds everywhere: train's (an integer in [0, 2**63))."""
    assert main([*command, "--seed", seed]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"attnconv {command[0]}: error: argument --seed: expected an integer in [0, 2**63 - 1], "
        f"got '{seed}' (see attnconv {command[0]} --help)\n"
    )


def test_train_refuses_the_same_seeds(capsys):
    assert main(["train", "--preset", "quick", "seed=-1"]) == 2
    assert capsys.readouterr().err == (
        "attnconv train: error: seed must be an integer in [0, 2**63), got -1\n"
    )
