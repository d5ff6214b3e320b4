"""`attnconv convert`: --threshold belongs to --sweep."""

from attnconv.cli import main


def test_threshold_with_check_is_rejected(capsys):
    assert main(["convert", "--check", "--threshold", "1e-3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--threshold sets the target of --sweep" in err
