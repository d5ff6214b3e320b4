"""Hooks of the docs build (``hooks:`` in mkdocs.yml): the site's two assets that come from
installed packages rather than from docs/, so that the built site loads nothing from the network.

- ``assets/mathjax/tex-svg-full.js``: MathJax 3 from the ``django-static-mathjax`` wheel (no
  dependencies; ``sh scripts/install.sh --dev`` installs it). The SVG output needs no font files and
  the full build no extension loaded on demand: the one file typesets every formula.
- ``assets/pygments.css``: the colours of the Pygments classes that ``pymdownx.highlight`` writes
  into the code blocks, generated from Pygments' own style.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File
from pygments.formatters import HtmlFormatter

MATHJAX = "assets/mathjax/tex-svg-full.js"
PYGMENTS_CSS = "assets/pygments.css"
PYGMENTS_STYLE = "friendly"


def on_files(files, config):
    spec = importlib.util.find_spec("mathjax")
    if spec is None or spec.origin is None:
        raise PluginError(
            "the docs need MathJax from the django-static-mathjax package: "
            "sh scripts/install.sh --dev installs it"
        )
    mathjax = Path(spec.origin).parent / "static" / "mathjax" / "es5" / Path(MATHJAX).name
    files.append(File.generated(config, MATHJAX, abs_src_path=str(mathjax)))
    css = HtmlFormatter(style=PYGMENTS_STYLE).get_style_defs(".highlight")
    files.append(File.generated(config, PYGMENTS_CSS, content=css))
    return files
