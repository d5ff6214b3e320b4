"""The README is a front page a newcomer reads in two minutes: what attnconv is, how to run it, what
it found and where to read more. Its shape is checked here (where "In Python" starts, its length,
the results section's length, every paragraph's), and so is every number it states: each appears
in a docs page that the README links for it, where the details are.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
LINES = README.splitlines()

MOST_LINES = 160
IN_PYTHON_BY = 60  # the line "## In Python" is on or before it
RESULTS = "## What attention learned"
RESULTS_MOST_LINES = 50  # from its heading to the next one
PARAGRAPH_MOST_LINES = 6
# A number as prose writes it: 93.3, 2.13.0, 55,000; not the digits inside a word (python3, 2d).
NUMBER = re.compile(r"(?<![\w.,])\d+(?:[.,]\d+)*")
# A link to a docs page, with or without an anchor: [text](docs/page.md#anchor)
DOCS_LINK = re.compile(r"\]\((docs/[\w/-]+\.md)(?:#[\w-]+)?\)")


def blocks(lines: list[str]) -> list[tuple[str, str, list[str]]]:
    """The README's text as ``(section, kind, lines)`` blocks, in order: ``kind`` is ``prose`` (a
    paragraph, or one item of a list), ``table``, ``code`` (fenced or indented) or ``comment`` (an
    HTML comment); ``section`` is the ``## `` heading it is under. Headings are no block."""
    found: list[tuple[str, str, list[str]]] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("#"):
            section = line if line.startswith("## ") else section
            i += 1
        elif line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            found.append((section, "code", lines[i : end + 1]))
            i = end + 1
        elif line.startswith("<!--"):
            end = next(j for j in range(i, len(lines)) if lines[j].rstrip().endswith("-->"))
            found.append((section, "comment", lines[i : end + 1]))
            i = end + 1
        elif line.startswith("    "):
            end = i
            while end < len(lines) and lines[end].startswith("    "):
                end += 1
            found.append((section, "code", lines[i:end]))
            i = end
        else:
            kind = "table" if line.startswith("|") else "prose"
            end = i + 1
            while (
                end < len(lines)
                and lines[end].strip()
                and not lines[end].startswith(("#", "```", "<!--"))
                and not (kind == "prose" and lines[end].startswith("- "))  # the next list item
            ):
                end += 1
            found.append((section, kind, lines[i:end]))
            i = end
    return found


BLOCKS = blocks(LINES)


def heading_line(heading: str) -> int:
    """The 1-based line of ``heading``."""
    assert heading in LINES, f"the README has no {heading!r}"
    return LINES.index(heading) + 1


def test_the_blocks_are_found() -> None:
    kinds = [kind for _, kind, _ in BLOCKS]
    assert kinds.count("table") == 1  # one results table
    assert kinds.count("code") == 4  # the Quick start, In Python, On the command line, Citation
    assert kinds.count("prose") >= 15


def test_a_newcomer_reaches_python_early_and_the_page_is_short() -> None:
    assert len(LINES) <= MOST_LINES
    sections = [line for line in LINES if line.startswith("## ")]
    assert sections[:4] == [
        "## Quick start",
        "## In Python",
        "## On the command line",
        RESULTS,
    ]
    assert heading_line("## In Python") <= IN_PYTHON_BY
    # what attnconv is: at most five lines between the title and the Quick start
    intro = [line for line in LINES[1 : heading_line("## Quick start") - 1] if line.strip()]
    assert 1 <= len(intro) <= 5


def test_the_results_are_one_table_and_at_most_two_figures() -> None:
    start = heading_line(RESULTS)
    end = next(i for i in range(start, len(LINES)) if LINES[i].startswith("## "))
    assert end - start + 1 <= RESULTS_MOST_LINES
    results = [(kind, text) for section, kind, text in BLOCKS if section == RESULTS]
    assert [kind for kind, _ in results].count("table") == 1
    figures = [text for kind, text in results if "![" in text[0]]
    assert 1 <= len(figures) <= 2
    for index, (_, text) in enumerate(results):
        if "![" in text[0]:  # a figure is one line, its caption the next block: two lines
            caption = results[index + 1][1]
            assert caption[0].startswith("*") and caption[-1].endswith("*"), caption
            assert len(caption) <= 2, caption
    (table,) = [text for kind, text in results if kind == "table"]
    assert table[0] == "| model | attention | epochs | test accuracy | parameters |"
    for row in table[2:]:  # every row states its own budget
        epochs = row.split("|")[3].strip()
        assert re.fullmatch(r"\d+", epochs), row


def test_no_paragraph_is_longer_than_six_lines() -> None:
    for section, kind, text in BLOCKS:
        if kind == "prose":
            assert len(text) <= PARAGRAPH_MOST_LINES, f"{section}: {text[0]!r}"


def numbers(text: str) -> set[str]:
    """The numbers of Markdown ``text``, leaving out link targets (paths, addresses)."""
    return set(NUMBER.findall(re.sub(r"\]\([^)]*\)", "]", text)))


def test_numbers_need_a_word_boundary() -> None:
    assert numbers("93.3% (2 seeds: 91.87 ± 0.28), 242k, 8×8, torch==2.13.0.") == {
        "93.3", "2", "91.87", "0.28", "242", "8", "2.13.0",
    }  # fmt: skip
    assert numbers("python3 Conv2d `--out runs/q4` [a](docs/x-1.md#y-2)") == set()


def test_every_number_is_in_a_docs_page_the_readme_links_for_it() -> None:
    """A paragraph's (or a table's, or a caption's) numbers appear in a docs page that the same
    paragraph links or, where it links none, that its section links: the page with the details.
    Code blocks are commands and examples, not claims, and are left out."""
    pages: dict[str, set[str]] = {}
    unlinked = []
    for section, kind, text in BLOCKS:
        if kind not in ("prose", "table"):
            continue
        body = "\n".join(text)
        claimed = numbers(body)
        if not claimed:
            continue
        linked = set(DOCS_LINK.findall(body)) or {
            page
            for other, _, lines in BLOCKS
            if other == section
            for page in DOCS_LINK.findall("\n".join(lines))
        }
        assert linked, f"{section}: {text[0]!r} states numbers and links no docs page"
        for page in linked:
            if page not in pages:
                pages[page] = numbers((ROOT / page).read_text())
        found = set().union(*(pages[page] for page in linked))
        unlinked += [
            f"{number} ({text[0][:40]!r} -> {sorted(linked)})" for number in claimed - found
        ]
    assert unlinked == [], "numbers not in the pages linked for them:\n" + "\n".join(unlinked)
