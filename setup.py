"""The package description an index shows (PyPI's project page): README.md, whose images and
links point into the repository (docs/...), paths that lead nowhere on the index. There each image
becomes its caption and each link its text, both with the path where the source distribution
holds the file (MANIFEST.in ships docs/). Everything else is in pyproject.toml."""

import re
from pathlib import Path

from setuptools import setup

# a Markdown image or link whose target is neither a URL nor a page anchor
REPOSITORY_TARGET = re.compile(r"(?P<image>!?)\[(?P<text>[^\]]*)\]\((?P<path>(?!https?://|#)[^)\s]+)\)")


def package_description(readme: str) -> str:
    """``readme`` with each repository-relative image and link spelled out (module docstring)."""

    def spelled_out(match: re.Match) -> str:
        text, path = match["text"], match["path"]
        if match["image"]:
            return f"*Figure: {text} ({path} in the source distribution)*"
        return f"{text} ({path} in the source distribution)"

    return REPOSITORY_TARGET.sub(spelled_out, readme)


setup(
    long_description=package_description(Path(__file__).with_name("README.md").read_text("utf-8")),
    long_description_content_type="text/markdown",
)
