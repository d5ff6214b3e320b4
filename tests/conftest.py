"""Test-session settings shared by every test file."""

import functools
import http.server
import os
import threading

import pytest
import torch

# pytest -n 2 runs two workers on this project's 2-core machines. With torch's default of one
# intra-op thread per core each, four busy-waiting OpenMP threads share two cores and small
# models run 10× slower; one thread per worker (inherited by subprocesses) avoids that.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


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
