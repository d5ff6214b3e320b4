"""Test-session settings shared by every test file."""

import functools
import http.server
import os
import shutil
import threading

import pytest
import torch

from attnconv.data import fashion_mnist

# Attention routes are measured on first use (attnconv/attention/routes.py); the suite takes the
# rule-based ones instead, so that no result depends on a timing (tests that compare bits pin a
# route). Subprocesses inherit it; tests of the measurement turn it on for themselves.
os.environ["ATTNCONV_ROUTE_TIMING"] = "off"

# pytest -n 2 runs two workers on this project's 2-core machines. With torch's default of one
# intra-op thread per core each, four busy-waiting OpenMP threads share two cores and small
# models run 10× slower; one thread per worker (inherited by subprocesses) avoids that.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a test module: tiny models run fastest on one thread (and subprocesses
    use one: OMP_NUM_THREADS). Modules use it with ``pytestmark``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# System packages some tests need. Each check returns None when the package is there, else what is
# missing and how to install it. Without it those tests skip with that reason; with CI=true they
# fail instead, so CI cannot pass with them silently skipped.
def _chromium() -> str | None:
    if shutil.which(CHROMIUM):
        return None
    return f"needs Chromium at {CHROMIUM} (Debian/Ubuntu: sudo apt-get install chromium)"


def _fashion_mnist() -> str | None:
    if (fashion_mnist.SYSTEM_DIR / "train-images-idx3-ubyte.gz").is_file():
        return None
    return (
        f"needs Debian's Fashion-MNIST in {fashion_mnist.SYSTEM_DIR}/ "
        "(sudo apt-get install dataset-fashion-mnist)"
    )


CHROMIUM = "/usr/bin/chromium"
NEEDS = {"needs_chromium": _chromium, "needs_fashion_mnist": _fashion_mnist}


def pytest_configure(config):
    for name in NEEDS:
        config.addinivalue_line("markers", f"{name}: skips without the system package it names")


def pytest_runtest_setup(item):
    for name, missing in NEEDS.items():
        reason = item.get_closest_marker(name) and missing()
        if reason:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true and the system lacks it: {reason}", pytrace=False)
            pytest.skip(reason)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def http_root(tmp_path, monkeypatch):
    """(folder served, its base URL) from a local server on a free port, shut down afterwards."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
