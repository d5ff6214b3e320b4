"""The built docs site in headless Chromium, opened from file:// as a reader without a network
would open it: every page of the site, read back after MathJax has typeset it.

Each page is opened once (the ``pages`` fixture) at 1300×900 and measured, then resized to a
phone's 390×844 and measured again, then read in the dark colour scheme; the tests assert on the
measurements: what it requested, its code blocks and their colours, its formulas and its tables.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from attnconv.viz.style import contrast_ratio
from conftest import CHROMIUM

pytestmark = pytest.mark.needs_chromium

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]
# Pages whose formulas carry the mathematics: each must have typeset ones.
MATH_PAGES = {
    "theory": 30,
    "theorem": 3,
    "layers": 10,
    "grid-score": 5,
    "api/attention": 5,
}
PHONE = {"width": 390, "height": 844}

# What one page shows, measured after MathJax has finished (or at once on a page without it).
MEASURE = """async () => {
  if (window.MathJax && MathJax.startup) await MathJax.startup.promise;
  const main = document.querySelector('div[role="main"]');
  const column = main.getBoundingClientRect();
  const blocks = [...main.querySelectorAll('pre')]
    .filter(pre => !pre.closest('.doc-signature'))
    .map(pre => {
      const box = pre.closest('div.highlight');
      const language = box && [...box.classList].find(c => c.startsWith('language-'));
      const tokens = [...pre.querySelectorAll('code span[class]')];
      const colours = new Set(tokens.map(span => getComputedStyle(span).color)).size;
      return {language: language ? language.slice(9) : null, tokens: tokens.length, colours,
              text: pre.innerText.slice(0, 60)};
    });
  const prose = main.cloneNode(true);
  prose.querySelectorAll('pre, code, mjx-container').forEach(e => e.remove());
  const tables = [...main.querySelectorAll('table')].map(table => {
    const wrapper = table.parentElement;
    // how far the table, or anything in its cells, reaches past the column (or its scroller)
    const rights = [table, ...table.querySelectorAll('th, td, th *, td *')]
      .map(e => e.getBoundingClientRect().right - column.right);
    return {overflow: Math.max(...rights, wrapper.scrollWidth - wrapper.clientWidth),
            head: table.rows[0].innerText.slice(0, 60)};
  });
  const links = [...main.querySelectorAll('a[href*="#"]')]
    .filter(a => a.protocol === 'file:')
    .map(a => ({file: decodeURI(a.pathname), anchor: decodeURIComponent(a.hash.slice(1))}));
  const past = [...main.querySelectorAll('p code, li code, p mjx-container, li mjx-container')]
    .filter(e => e.getBoundingClientRect().right > column.right + 1)
    .map(e => e.textContent.slice(0, 40));
  // a Markdown list with no blank line above it stays text: "- item" inside a paragraph
  const lists = [...main.querySelectorAll('p')]
    .filter(p => /\\n\\s*[-*] \\S/.test(p.textContent))
    .map(p => p.textContent.slice(0, 60));
  const images = [...main.querySelectorAll('img')].map(img => {
    const link = img.closest('a');
    return {src: img.src, link: link ? link.href : null};
  });
  return {
    blocks,
    tables,
    past,
    links,
    lists,
    images,
    formulas: main.querySelectorAll('.arithmatex').length,
    typeset: main.querySelectorAll('.arithmatex mjx-container svg').length,
    errors: main.querySelectorAll('mjx-container [data-mml-node="merror"]').length,
    prose: prose.textContent,
  };
}"""


# At a phone's width: how wide the page is against the screen, and every table and display formula
# (the theme makes each table its own scroll box): whether its content is wider than its box,
# how the box overflows, where its right edge is against the column's, the cue drawn behind it and
# whether any of its cells is opaque (and would hide the cue).
PHONE_MEASURE = """() => {
  const main = document.querySelector('div[role="main"]');
  const column = main.getBoundingClientRect();
  const boxes = [...main.querySelectorAll('table, div.arithmatex')].map(box => {
    const style = getComputedStyle(box);
    const opaque = [...box.querySelectorAll('td, th')]
      .map(cell => getComputedStyle(cell).backgroundColor)
      .filter(colour => colour.startsWith('rgb(')).length;
    return {what: box.textContent.trim().slice(0, 50),
            wide: box.scrollWidth > box.clientWidth + 1,
            overflow: style.overflowX,
            right: box.getBoundingClientRect().right - column.right,
            cue: style.backgroundImage, attachment: style.backgroundAttachment, opaque};
  });
  return {width: document.documentElement.scrollWidth,
          screen: document.documentElement.clientWidth, boxes};
}"""

# Every coloured token of the code blocks with its colour and the colour behind it (the nearest
# ancestor's background that is not transparent).
CODE_COLOURS = """() => [...document.querySelectorAll('div[role="main"] div.highlight code span[class]')]
  .filter(span => span.textContent.trim())
  .map(span => {
    let element = span, behind = 'rgba(0, 0, 0, 0)';
    while (element && (behind = getComputedStyle(element).backgroundColor) === 'rgba(0, 0, 0, 0)')
      element = element.parentElement;
    return {token: span.className, text: span.textContent.slice(0, 30),
            colour: getComputedStyle(span).color, behind};
  })"""


class Requests:
    """What a page asked for beyond its own files: ``route`` lets the site's files load and stops
    (and lists in ``outside``) any other request; ``failed`` lists the site's files that did not
    load (``missing``)."""

    def __init__(self) -> None:
        self.outside: list[str] = []
        self.missing: list[str] = []

    def route(self, route) -> None:
        if route.request.url.startswith(("file:", "data:", "blob:")):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def failed(self, request) -> None:
        if request.url.startswith("file:"):
            self.missing.append(request.url)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built with ``mkdocs build --strict``."""
    built = tmp_path_factory.mktemp("docs") / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "--site-dir", str(built)],
        cwd=ROOT,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    return built


@pytest.fixture(scope="module")
def pages(site) -> dict[str, dict]:
    """Every page of the site: what it requested outside the site (``outside``), local files it
    could not load (``missing``) and ``MEASURE``'s result."""
    names = sorted(
        str(html.parent.relative_to(site)) if html.parent != site else "index"
        for html in site.rglob("index.html")
        if html.parent.name != "search"
    )
    measured = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for name in names:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            requests = Requests()
            page.route("**/*", requests.route)
            page.on("requestfailed", requests.failed)
            folder = site if name == "index" else site / name
            page.goto((folder / "index.html").as_uri(), wait_until="load")
            measured[name] = {
                **page.evaluate(MEASURE),
                "outside": requests.outside,
                "missing": requests.missing,
                "light": page.evaluate(CODE_COLOURS),
            }
            page.set_viewport_size(PHONE)
            measured[name]["phone"] = page.evaluate(PHONE_MEASURE)
            page.emulate_media(color_scheme="dark")
            measured[name]["dark"] = page.evaluate(CODE_COLOURS)
            page.close()
        browser.close()
    return measured


def test_every_page_loads_only_files_of_the_site(pages) -> None:
    assert {"index", "theory", "api/attention"} <= set(pages)
    for name, page in pages.items():
        assert page["outside"] == [], f"{name} requested {page['outside']}"
        assert page["missing"] == [], f"{name} could not load {page['missing']}"


def test_code_blocks_name_their_language_and_are_highlighted(pages) -> None:
    """Pygments split the code into tokens (spans with its classes) and the stylesheet colours
    them: a Python block shows at least two colours, and so does some shell block (a lone
    command can be one token kind)."""
    languages: set[str] = set()
    shell_colours = 0
    for name, page in pages.items():
        for block in page["blocks"]:
            assert block["language"], f"{name}: a code block without a language: {block['text']!r}"
            languages.add(block["language"])
            if block["language"] in ("python", "sh"):
                assert block["tokens"] > 0, f"{name}: not highlighted: {block['text']!r}"
            if block["language"] == "python":
                assert block["colours"] >= 2, f"{name}: not coloured: {block['text']!r}"
            if block["language"] == "sh":
                shell_colours = max(shell_colours, block["colours"])
    assert {"python", "sh", "text"} <= languages
    assert shell_colours >= 2


def test_formulas_are_typeset(pages) -> None:
    for name, page in pages.items():
        assert page["typeset"] == page["formulas"], f"{name}: a formula was not typeset"
        assert page["errors"] == 0, f"{name}: MathJax could not read a formula"
        for raw in ("$$", "\\(", "\\[", "\\frac", "\\Delta", "\\delta"):
            assert raw not in page["prose"], f"{name}: raw TeX {raw!r} in the text"
    for name, least in MATH_PAGES.items():
        assert pages[name]["typeset"] >= least, name


def test_tables_and_text_fit_the_content_column_at_1300_px(pages) -> None:
    assert len(pages["layers"]["tables"]) >= 1 and len(pages["theory"]["tables"]) >= 2
    for name, page in pages.items():
        for table in page["tables"]:
            assert table["overflow"] <= 1, f"{name}: table {table['head']!r} overflows"
        assert page["past"] == [], f"{name}: inline code or a formula runs past the column"


def test_at_a_phone_s_width_no_page_is_wider_than_the_screen(pages) -> None:
    """At 390 px every page fits the screen: it does not pan sideways. What is wider than the
    column (a table, a display formula) scrolls inside its own box, which ends at the column's
    edge and shows that it scrolls: shadows drawn behind its content at the edges with more to
    see (a background that scrolls with the content covers them at its ends), with no opaque
    cell over them."""
    wide = []
    for name, page in pages.items():
        phone = page["phone"]
        assert phone["screen"] == PHONE["width"]
        assert phone["width"] <= phone["screen"], f"{name} is {phone['width']} px wide"
        for box in phone["boxes"]:
            if not box["wide"]:
                continue
            wide.append(name)
            where = f"{name}: {box['what']!r}"
            assert box["overflow"] in ("auto", "scroll"), where
            assert box["right"] <= 1, where
            assert box["cue"].count("radial-gradient") == 2, f"{where}: no scroll cue"
            assert "local" in box["attachment"] and "scroll" in box["attachment"], where
            assert box["opaque"] == 0, f"{where}: opaque cells hide the cue"
    # the results tables and the formulas of the transform page are wider than a phone
    assert wide.count("reproducing") >= 3 and "transform" in wide and "theory" in wide


def rgb_hex(css: str) -> str:
    """``rgb(r, g, b)`` (a computed colour) as ``#rrggbb``."""
    red, green, blue = (int(v) for v in re.findall(r"\d+", css)[:3])
    return f"#{red:02x}{green:02x}{blue:02x}"


def test_code_is_readable_in_the_light_and_the_dark_colour_scheme(pages) -> None:
    """Every coloured token of every code block, comments and numbers included, has at least
    4.5:1 contrast (WCAG AA) on what is behind it, as the browser draws it, in both schemes."""
    seen: dict[str, set[str]] = {"light": set(), "dark": set()}
    for name, page in pages.items():
        for scheme in seen:
            for token in page[scheme]:
                ratio = contrast_ratio(rgb_hex(token["colour"]), rgb_hex(token["behind"]))
                assert ratio >= 4.5, f"{name}, {scheme}: {token} at {ratio:.2f}:1"
                seen[scheme].add(token["token"])
    for scheme, tokens in seen.items():
        assert {"c1", "mi", "k"} <= tokens, scheme  # comments, numbers and keywords were measured


def test_search_from_files_says_it_needs_a_web_server(site) -> None:
    """From file:// the browser cannot read the search index: the search page says so in place
    of "Searching..." (which would stay for ever), and so does every page's search box."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto((site / "search.html").as_uri() + "?q=theorem", wait_until="load")
        results = page.locator("#mkdocs-search-results").inner_text()
        page.goto((site / "index.html").as_uri(), wait_until="load")
        box = page.locator('div[role="search"] input[name="q"]')
        placeholder, title = box.get_attribute("placeholder"), box.get_attribute("title")
        browser.close()
    assert "Searching" not in results
    assert "mkdocs serve" in results and "python -m http.server" in results
    assert placeholder == "Search needs a web server" and "mkdocs serve" in title


def test_every_figure_opens_full_size(pages) -> None:
    """A wide figure is drawn at the text column's width: each is a link to its own file."""
    figures = [image for page in pages.values() for image in page["images"]]
    assert len(figures) >= 10
    for image in figures:
        assert image["link"] == image["src"], image


def test_lists_are_lists(pages) -> None:
    for name, page in pages.items():
        assert page["lists"] == [], f"{name}: a list ran into its paragraph (a blank line above it)"


def test_cross_references_are_links_to_headings_that_exist(pages) -> None:
    """The docstrings link the guides' sections (``[text][heading-anchor]``, resolved by
    mkdocs-autorefs): none is left as text, in the Markdown form of an unresolved reference or as
    a path, and every link to an anchor of the site lands on an element with that id."""
    ids: dict[str, set[str]] = {}
    for name, page in pages.items():
        assert not re.search(r"\]\[[\w-]+\]", page["prose"]), f"{name}: an unresolved reference"
        assert not re.search(r"docs/[\w-]+\.md", page["prose"]), (
            f"{name}: a path in place of a link"
        )
        for link in page["links"]:
            if link["file"] not in ids:  # a folder's page is its index.html
                target = Path(link["file"])
                html = (target / "index.html" if target.is_dir() else target).read_text()
                ids[link["file"]] = set(re.findall(r'\bid="([^"]+)"', html))
            assert link["anchor"] in ids[link["file"]], f"{name}: a link to a missing {link}"
    to_theory = [
        link["anchor"] for link in pages["api/attention"]["links"] if "/theory/" in link["file"]
    ]
    assert "1-pixels-offsets-and-the-attention-layer" in to_theory
