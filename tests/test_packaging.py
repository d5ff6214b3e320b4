"""The package as people get it: the sdist and the wheel carry the MIT licence text, the sdist
leaves the tests out (they need the repository: helpers, fixtures, docs, benchmarks), and the
package description an index shows has no image or link that only works in the repository."""

from __future__ import annotations

import email
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a Markdown image or link whose target is neither a URL nor a page anchor
RELATIVE_TARGET = re.compile(r"\]\((?!https?://|#)[^)]+\)")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel, built by the package's build backend from a copy of the files git
    tracks or would (the working tree, without what .gitignore names)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("builds from a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    source = tmp_path_factory.mktemp("source")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    built = {}
    for kind in ("sdist", "wheel"):  # as pip and `python -m build` call the backend
        code = f"import sys; from setuptools import build_meta; print(build_meta.build_{kind}(sys.argv[1]))"
        result = subprocess.run(
            [sys.executable, "-c", code, str(out)], cwd=source, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-3000:]
        built[kind] = out / result.stdout.split()[-1]
    return built


def test_the_licence_is_mit_in_the_repository():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) 2026 attnconv contributors\n")
    assert "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND" in text
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "MIT"\nlicense-files = ["LICENSE"]\n' in pyproject


def test_the_sdist_carries_the_licence_and_the_readme_figures_but_no_tests(built):
    with tarfile.open(built["sdist"]) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        licence = archive.extractfile(next(m for m in archive.getmembers()
                                           if m.name.endswith("/LICENSE"))).read().decode()  # fmt: skip
    assert licence == (ROOT / "LICENSE").read_text()
    assert not [name for name in names if name.startswith(("tests/", "benchmarks/"))]
    # the README in the sdist shows its figures and finds the pages it links
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(((?!https?://|#)[^)#]+)", readme)
    assert targets and not [target for target in targets if target not in names]


def test_the_wheel_carries_the_licence(built):
    with zipfile.ZipFile(built["wheel"]) as archive:
        licences = [name for name in archive.namelist() if name.endswith(".dist-info/licenses/LICENSE")]
        assert len(licences) == 1
        assert archive.read(licences[0]).decode() == (ROOT / "LICENSE").read_text()
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith("/METADATA")))
    message = email.message_from_bytes(metadata)
    assert message["License-Expression"] == "MIT"
    assert message["License-File"] == "LICENSE"


def test_the_package_description_has_no_repository_relative_image_or_link(built):
    with zipfile.ZipFile(built["wheel"]) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith("/METADATA")))
    description = email.message_from_bytes(metadata).get_payload()
    assert email.message_from_bytes(metadata)["Description-Content-Type"] == "text/markdown"
    assert RELATIVE_TARGET.findall(description) == []
    # each figure is still named, with its caption and where the sdist holds it
    readme = (ROOT / "README.md").read_text()
    for caption, path in re.findall(r"!\[([^\]]*)\]\(((?!https?://)[^)]+)\)", readme):
        assert f"{caption} ({path} in the source distribution)" in description
