"""The docs: the site builds with warnings as errors, and every Python and shell snippet of the
README and of docs/ runs, so that none goes stale.

The conventions (languages, the ``<!-- snippet ... -->`` comments that give a long block its tiny
settings) are described in docs/development.md, "These pages".
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from attnconv.viz.style import contrast_ratio
from conftest import NEEDS

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
LANGUAGES = ("python", "sh", "text")
# What a directive's ``needs:`` names, as the suite's markers for system packages.
NEEDED = {"fashion-mnist": "needs_fashion_mnist"}
QUICK_START = "## Quick start"
# The shell blocks' commands: `attnconv`, `python` and `torchrun` are this interpreter's, so that
# they run the code under test.
SHELL_PRELUDE = """set -euo pipefail
attnconv() { "$SNIPPET_PYTHON" -m attnconv "$@"; }
python() { "$SNIPPET_PYTHON" "$@"; }
torchrun() { "$SNIPPET_PYTHON" -m torch.distributed.run "$@"; }
"""


@dataclass
class Block:
    """A code block of a page: ``language`` is a fence's, or ``indented`` (a 4-space block)."""

    page: str
    line: int  # 1-based, of the first line of code
    language: str
    code: str
    section: str  # the ``## `` heading it is under
    replace: list[tuple[str, str]] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)

    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def runnable_code(self) -> str:
        """The code with the directive's replacements; AssertionError for one that does not
        apply (the block changed, the directive did not)."""
        code = self.code
        for old, new in self.replace:
            assert old in code, f"{self.where()}: 'replace: {old} => ...' matches nothing"
            code = code.replace(old, new)
        return code


def parse_directive(lines: list[str], where: str) -> dict[str, list]:
    """The ``key: value`` lines of a ``<!-- snippet ... -->`` comment."""
    directive: dict[str, list] = {"replace": [], "setup": [], "needs": []}
    for line in lines:
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        assert sep and key in directive, f"{where}: unknown snippet directive line {line!r}"
        if key == "replace":
            old, arrow, new = value.partition(" => ")
            assert arrow, f"{where}: expected 'replace: OLD => NEW', got {line!r}"
            directive["replace"].append((old, new))
        elif key == "needs":
            assert value in NEEDED, f"{where}: needs one of {list(NEEDED)}, got {value!r}"
            directive["needs"].append(value)
        else:
            directive["setup"].append(value)
    return directive


def parse_page(page: str) -> list[Block]:
    """Every fenced and indented code block of ``page``, with the directive above it."""
    lines = (ROOT / page).read_text().splitlines()
    blocks: list[Block] = []
    section = ""
    directive: dict[str, list] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^(\s*)```(\S*)\s*$", line)
        if line.startswith("## "):
            section = line
        if line == "<!-- snippet":
            end = lines.index("-->", i)
            directive = parse_directive(lines[i + 1 : end], f"{page}:{i + 1}")
            i = end + 1
            assert i < len(lines) and lines[i].startswith("```"), (
                f"{page}:{i}: a snippet directive must stand right above a fenced block"
            )
            continue
        if fence:
            indent, language = fence.groups()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            code = "\n".join(text[len(indent) :] for text in lines[i + 1 : end]) + "\n"
            blocks.append(Block(page, i + 2, language, code, section, **(directive or {})))
            directive = None
            i = end + 1
            continue
        previous_blank = i == 0 or not lines[i - 1].strip()
        if line.startswith("    ") and line.strip() and previous_blank:
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            code = "\n".join(text[4:] for text in lines[i:end]).strip() + "\n"
            blocks.append(Block(page, i + 1, "indented", code, section))
            i = end
            continue
        i += 1
    return blocks


BLOCKS = {page: parse_page(page) for page in PAGES}


def test_the_pages_and_their_blocks_follow_the_conventions() -> None:
    assert {"README.md", "docs/index.md", "docs/layers.md", "docs/theorem.md"} <= set(PAGES)
    for page, blocks in BLOCKS.items():
        for block in blocks:
            if block.language == "indented":
                # the site highlights a block by its language and typesets formulas written
                # as LaTeX ($$ ... $$): an indented block has neither
                assert page == "README.md" and block.section == QUICK_START, (
                    f"{block.where()}: an indented code block; fence it with its language "
                    f"(```sh, ```python, ```text), or write a formula as $$ ... $$"
                )
            else:
                assert block.language in LANGUAGES, (
                    f"{block.where()}: a fenced block names its language, one of {LANGUAGES} "
                    f"(got {block.language!r})"
                )
                if block.language == "text":
                    assert not (block.replace or block.setup or block.needs), block.where()
    runnable = sum(b.language in ("python", "sh") for blocks in BLOCKS.values() for b in blocks)
    assert runnable >= 15  # the parser found the pages' snippets


def test_the_quick_start_is_what_ci_runs_verbatim() -> None:
    """The README's Quick start is the one block not run here: CI runs it on a fresh machine
    (.ci/run calls scripts/fresh-machine-check.sh, which runs these exact commands)."""
    (quick_start,) = [
        b for b in BLOCKS["README.md"] if b.section == QUICK_START and b.language == "indented"
    ]
    listed = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fresh-machine-check.sh"), "--list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert listed == quick_start.code
    assert listed.splitlines()[0] == "sh scripts/install.sh && attnconv demo"
    assert "scripts/fresh-machine-check.sh" in (ROOT / ".ci" / "run").read_text().splitlines()[-1]


def test_the_site_builds_with_warnings_as_errors(tmp_path) -> None:
    site = tmp_path / "site"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(site),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for page in PAGES[1:]:  # each page of docs/ became one
        name = Path(page).relative_to("docs").with_suffix("")
        html = site / (name.parent if name.name == "index" else name) / "index.html"
        assert html.is_file(), page
    # the API reference is generated from the docstrings, signatures included
    models = (site / "api" / "models" / "index.html").read_text()
    assert "count_macs" in models and "Multiply-adds of one forward pass on one image" in models
    assert "on the meta device" in models
    # docstrings name other objects as mkdocs-autorefs cross-references, which become links; a
    # Sphinx role (":class:`X`") would show as written, ":class:<code>X</code>"
    for page in sorted((site / "api").rglob("index.html")):
        roles = re.findall(
            r":(?:class|func|meth|data|attr|mod|exc|obj):(?:`|<code>)~?[\w.]+", page.read_text()
        )
        assert roles == [], f"{page.relative_to(site)} shows Sphinx roles: {roles[:5]}"
    convert = (site / "api" / "convert" / "index.html").read_text()
    link = (
        r'<a class="autorefs autorefs-internal"[^>]*href="#attnconv\.convert\.model\.layers_left"'
    )
    assert re.search(link, convert)
    assert (site / "figures" / "fashion-quadratic-contours.png").is_file()


def run_shell(code: str, cwd: Path, where: str) -> None:
    env = {
        **os.environ,
        "SNIPPET_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        ["bash", "-c", SHELL_PRELUDE + code], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, (
        f"{where}: the shell snippet failed (exit {result.returncode}):\n{code}\n"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    )


RUNNABLE = [
    page for page, blocks in BLOCKS.items() if any(b.language in ("python", "sh") for b in blocks)
]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE)
def test_every_snippet_of_the_page_runs(page: str, tmp_path, monkeypatch) -> None:
    """The page's python and sh blocks in order, in one scratch folder (holding links to the
    repository's benchmarks/ and scripts/, which the snippets name by relative path)."""
    for folder in ("benchmarks", "scripts"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__snippet__"}
    not_run = []
    for block in BLOCKS[page]:
        if block.language not in ("python", "sh"):
            continue
        missing = [NEEDS[NEEDED[name]]() for name in block.needs]
        missing = [reason for reason in missing if reason]
        if missing:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true and the system lacks it: {missing[0]}", pytrace=False)
            not_run.append(f"{block.where()} ({missing[0]})")
            continue
        for command in block.setup:
            run_shell(command, tmp_path, f"{block.where()} setup")
        code = block.runnable_code()
        if block.language == "python":
            # the source in linecache: a failing line shows in the traceback
            linecache.cache[block.where()] = (len(code), None, code.splitlines(True), "")
            exec(compile(code, block.where(), "exec"), namespace)
        else:
            run_shell(code, tmp_path, block.where())
    if not_run:
        pytest.skip("every other snippet ran; not run: " + "; ".join(not_run))


def test_docstrings_use_no_sphinx_roles() -> None:
    """The docs renderer reads no Sphinx roles (":class:`X`" shows as written): docstrings link
    objects as ``[`X`][]`` (docs/development.md, "These pages"), in the modules the API reference
    shows and in the others, which it may show later."""
    role = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):`")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "src").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if role.search(line)
    ]
    assert found == [], f"Sphinx roles in docstrings: {found}"


def load_hooks():
    """scripts/mkdocs_hooks.py as a module (the docs build's hooks)."""
    spec = importlib.util.spec_from_file_location(
        "mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py"
    )
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_every_code_colour_meets_wcag_aa_in_the_light_and_the_dark_scheme() -> None:
    """The code blocks' stylesheet, as the docs build writes it: in each scheme every token
    class's colour has at least 4.5:1 contrast on the code's background (its own background
    where it has one); whitespace, which draws nothing, is left out."""
    hooks = load_hooks()
    light, dark = hooks.pygments_css().split(hooks.DARK)
    for scheme, css in (("light", light), ("dark", dark)):
        (background,) = re.findall(
            re.escape(hooks.CODE_BOX)
            + r" \{ background: (#[0-9a-fA-F]{6}); color: (#[0-9a-fA-F]{6}); \}",
            css,
        )
        assert contrast_ratio(background[1], background[0]) >= 4.5, scheme
        rules = re.findall(
            r"\.highlight \.(\w+) \{ color: (#[0-9a-fA-F]{6});.*background-color: (\S+); \}", css
        )
        colours = {short: (colour, behind) for short, colour, behind in rules}
        assert {"c", "c1", "m", "mi", "mf", "k", "s2", "nb"} <= set(colours), scheme
        for short, (colour, behind) in colours.items():
            if short == "w":
                continue
            on = background[0] if behind == "transparent" else behind
            assert contrast_ratio(colour, on) >= 4.5, f"{scheme}: .{short} {colour} on {on}"
