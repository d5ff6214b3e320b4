"""Tests that need a system package skip without it, saying how to install it, and fail in CI."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

MARKED = """
import pytest

@pytest.mark.needs_fashion_mnist
def test_data():
    pass

@pytest.mark.needs_chromium
def test_browser():
    pass
"""


@pytest.fixture
def absent(pytester):
    """A test folder with this suite's conftest, on a system with neither package."""
    conftest = Path(__file__).with_name("conftest.py").read_text()
    pytester.makeconftest(
        conftest
        + "\nfrom pathlib import Path"
        + '\nfashion_mnist.SYSTEM_DIR = Path("/nonexistent/fashion-mnist")\n'
        + 'CHROMIUM = "/nonexistent/chromium"\n'
    )
    pytester.makepyfile(test_marked=MARKED)
    return pytester


def test_skipped_with_the_install_command(absent, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    result = absent.runpytest_subprocess("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*needs Debian's Fashion-MNIST in /nonexistent/fashion-mnist/*"
            "apt-get install dataset-fashion-mnist*",
            "*needs Chromium at /nonexistent/chromium*apt-get install chromium*",
        ],
        consecutive=False,
    )


def test_fail_in_ci(absent, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = absent.runpytest_subprocess()
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*CI=true and the system lacks it: needs Debian's*"])


def test_present_runs(pytester, monkeypatch, tmp_path):
    monkeypatch.delenv("CI", raising=False)
    folder = tmp_path / "fm"
    folder.mkdir()
    (folder / "train-images-idx3-ubyte.gz").write_bytes(b"")
    conftest = Path(__file__).with_name("conftest.py").read_text()
    pytester.makeconftest(
        conftest
        + "\nfrom pathlib import Path"
        + f"\nfashion_mnist.SYSTEM_DIR = Path({str(folder)!r})\n"
    )
    pytester.makepyfile(test_marked=MARKED.split("@pytest.mark.needs_chromium")[0])
    pytester.runpytest_subprocess().assert_outcomes(passed=1)
