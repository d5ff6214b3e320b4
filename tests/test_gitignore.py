""".gitignore covers what the Quick start, the demo, training and the tests write, and no source."""

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRITTEN = [
    "attnconv-demo-20261122-174105/demo.json",  # attnconv demo's default folder
    "notebooks/attnconv-demo-20261122-174105/figures/accuracy.png",
    "runs/quick-fashion-mnist-20261122-174105/checkpoints/best.pt",
    ".venv/bin/python",  # the Quick start's virtual environment
    "test-artifacts/explorer.png",
    "src/attnconv.egg-info/PKG-INFO",
    "site/index.html",  # mkdocs build
]
SOURCE = ["README.md", "docs/index.md", "mkdocs.yml", "scripts/install.sh", "src/attnconv/demo.py", "tests/conftest.py",
          "tests/fixtures/checkpoint-v1/quick-digits.pt"]


def ignored(tmp_path, paths):
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    out = subprocess.run(
        ["git", "-C", str(tmp_path), "check-ignore", "--no-index", *paths],
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def test_outputs_ignored(tmp_path):
    assert ignored(tmp_path, WRITTEN) == WRITTEN


def test_sources_not_ignored(tmp_path):
    assert ignored(tmp_path, SOURCE) == []
