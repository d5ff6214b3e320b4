"""Hooks of the docs build (``hooks:`` in mkdocs.yml): the site's two assets that come from
installed packages rather than from docs/, so that the built site loads nothing from the network.

- ``assets/mathjax/tex-svg-full.js``: MathJax 3 from the ``django-static-mathjax`` wheel (no
  dependencies; ``sh scripts/install.sh --dev`` installs it). The SVG output needs no font files and
  the full build no extension loaded on demand: the one file typesets every formula.
- ``assets/pygments.css``: the colours of the Pygments classes that ``pymdownx.highlight`` writes
  into the code blocks, from two of Pygments' own styles: ``PYGMENTS_STYLES["light"]``, and under
  ``prefers-color-scheme: dark`` the dark one. Every token class gets its colour, weight, slant
  and background in both (no light colour is left on the dark background), with the style's own
  background behind the code, so that each colour's contrast is the style's: every one is at least
  4.5:1 (WCAG AA), which tests/test_docs.py computes from this file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File
from pygments.styles import get_style_by_name
from pygments.token import STANDARD_TYPES, Token

MATHJAX = "assets/mathjax/tex-svg-full.js"
PYGMENTS_CSS = "assets/pygments.css"
# Pygments styles whose every token colour has at least 4.5:1 contrast on the style's background
PYGMENTS_STYLES = {"light": "xcode", "dark": "github-dark"}
# the code box: beats the theme's `.rst-content pre code`, which puts #f8f8f8 behind any style
CODE_BOX = ".rst-content div.highlight pre code, .highlight"
DARK = "@media (prefers-color-scheme: dark) {"


def on_files(files, config):
    spec = importlib.util.find_spec("mathjax")
    if spec is None or spec.origin is None:
        raise PluginError(
            "the docs need MathJax from the django-static-mathjax package: "
            "sh scripts/install.sh --dev installs it"
        )
    mathjax = Path(spec.origin).parent / "static" / "mathjax" / "es5" / Path(MATHJAX).name
    files.append(File.generated(config, MATHJAX, abs_src_path=str(mathjax)))
    files.append(File.generated(config, PYGMENTS_CSS, content=pygments_css()))
    return files


def pygments_css() -> str:
    """The stylesheet of the code blocks (module docstring): the light style's rules, then the
    dark style's inside ``DARK``."""
    light, dark = (style_rules(PYGMENTS_STYLES[scheme]) for scheme in ("light", "dark"))
    return f"{light}{DARK}\n{dark}}}\n"


def style_rules(name: str) -> str:
    """Pygments style ``name`` as CSS: its background and text colour on ``CODE_BOX``, and one
    rule per token class with every property set (a class the style leaves plain gets the text
    colour)."""
    style = get_style_by_name(name)
    background = style.background_color
    text = style.style_for_token(Token.Text)["color"] or _readable_on(background)
    rules = [f"{CODE_BOX} {{ background: {background}; color: #{text}; }}"]
    for token, short in STANDARD_TYPES.items():
        if not short:
            continue
        look = style.style_for_token(token)
        rules.append(
            f".highlight .{short} {{ color: #{look['color'] or text}; "
            f"font-style: {'italic' if look['italic'] else 'normal'}; "
            f"font-weight: {'bold' if look['bold'] else 'normal'}; "
            f"text-decoration: {'underline' if look['underline'] else 'none'}; "
            f"background-color: {'#' + look['bgcolor'] if look['bgcolor'] else 'transparent'}; }}"
        )
    return "\n".join(rules) + "\n"


def _readable_on(background: str) -> str:
    """Black on a light ``background`` (``#rrggbb``), white on a dark one."""
    red, green, blue = (int(background[i : i + 2], 16) for i in (1, 3, 5))
    return "000000" if 0.299 * red + 0.587 * green + 0.114 * blue > 128 else "ffffff"
