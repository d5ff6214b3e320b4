"""Every import in src/attnconv points down the house (module-level and lazy imports alike), and no
module imports itself back through a cycle.

Levels, lowest first: errors, hardware, memory, runs, seeds < attention, data < convert, models < train < viz <
reproduce, demo, analysis < cli. A module's level is that of its first name under ``attnconv``; an import may
point to the same level or a lower one, and besides viz never imports train (figures load models
through attnconv.models) and train never imports convert.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "attnconv"
LEVELS = {
    **dict.fromkeys(("errors", "hardware", "memory", "runs", "seeds"), 0),
    **dict.fromkeys(("attention", "data"), 1),
    **dict.fromkeys(("convert", "models"), 2),
    "train": 3,
    "viz": 4,
    **dict.fromkeys(("reproduce", "demo", "analysis"), 5),
    **dict.fromkeys(("cli", "__main__", ""), 6),  # "": the package's own __init__ (its façade)
}
APART = {("viz", "train"), ("train", "convert")}  # lower, yet never imported


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("attnconv", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The attnconv modules ``module`` imports anywhere in its file (``from P import name``: the
    submodule ``P.name`` when there is one, else ``P``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in found if name in known and name != module}


def room(module: str) -> str:
    """The first name under ``attnconv`` ("" for the package itself)."""
    return module.split(".")[1] if "." in module else ""


def level(module: str) -> int:
    return LEVELS[room(module)]


def graph() -> dict[str, set[str]]:
    names = module_names()
    return {module: imports(module, path, set(names)) for module, path in names.items()}


def test_every_module_has_a_level():
    assert [m for m in module_names() if [*m.split("."), ""][1] not in LEVELS] == []


def test_imports_point_down_and_keep_apart():
    upward = {
        (module, target)
        for module, targets in graph().items()
        for target in targets
        if level(target) > level(module) or (room(module), room(target)) in APART
    }
    assert sorted(upward) == []


def test_no_cycles():
    edges = graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    source = tmp_path / "attnconv" / "models" / "thing.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "from . import presets\n"
        "def f():\n"
        "    from attnconv.train.loop import train\n"
        "    import attnconv.viz.maps\n"
    )
    known = {"attnconv.models.presets", "attnconv.train.loop", "attnconv.viz.maps", "attnconv.models"}
    assert imports("attnconv.models.thing", source, known) == known - {"attnconv.models"}
