"""The technique on stage: a notebook cell that defines the core of its technique, and its twin in `helpers/`.

A cell puts code on stage with a first line `# on stage: helpers.<package>.<module>` (every top-level function
and class the cell defines is the module's own, line for line) or `# on stage: helpers.<...>.<module>.<Class>.<method>`
(the cell's one definition is that piece of the module, dedented). The suite compares each cell with its twin,
comments included, so the code a learner reads is the code the course runs and the two cannot drift.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

MARKER = "# on stage:"


@dataclass(frozen=True)
class Stage:
    """One on-stage cell: `notebook`, its code-cell `index` among all cells, the dotted `target` its marker
    names, and its `source`."""

    notebook: str
    index: int
    target: str
    source: str


def stages(notebook: Path) -> list[Stage]:
    """The on-stage cells of `notebook` (an .ipynb path), in order."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    out = []
    for i, cell in enumerate(cells):
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        first = src.lstrip().splitlines()[0] if src.strip() else ""
        if cell["cell_type"] == "code" and first.startswith(MARKER):
            out.append(Stage(Path(notebook).name, i, first[len(MARKER):].strip(), src))
    return out


def _segment(lines: list[str], node: ast.AST) -> str:
    """The source lines of a definition, decorators included, dedented, trailing spaces dropped."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    text = textwrap.dedent("\n".join(lines[start - 1:node.end_lineno]))
    return "\n".join(line.rstrip() for line in text.splitlines())


def definitions(source: str) -> dict[str, str]:
    """{name: source} of the top-level functions and classes in `source`."""
    lines = source.splitlines()
    return {n.name: _segment(lines, n) for n in ast.parse(source).body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _resolve(target: str) -> tuple[str, list[str]]:
    """(the module's source, the attribute path inside it) of a dotted target: the longest importable prefix is
    the module."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return inspect.getsource(module), parts[cut:]
    raise ValueError(f"{target!r} names no importable module")


def twin(target: str) -> dict[str, str]:
    """{name: source} of what `target` names in helpers: every top-level definition of a module, or the one
    class, function or method an attribute path reaches (ValueError if it reaches nothing)."""
    source, path = _resolve(target)
    if not path:
        return definitions(source)
    lines, body = source.splitlines(), ast.parse(source).body
    node = None
    for name in path:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == name), None)
        if node is None:
            raise ValueError(f"{target!r}: no definition named {name!r} there")
        body = getattr(node, "body", [])
    return {node.name: _segment(lines, node)}


def differences(stage: Stage) -> list[str]:
    """What differs between an on-stage cell and its helpers twin: a line per definition that is missing from
    either side or not identical, with the first line that differs. Empty when they are the same code."""
    where = f"{stage.notebook} cell {stage.index} ({stage.target})"
    try:
        mine, theirs = definitions(stage.source), twin(stage.target)
        piece = bool(_resolve(stage.target)[1])
    except (SyntaxError, ValueError) as e:
        return [f"{where}: {e}"]
    if not mine:
        return [f"{where}: the cell defines no function or class"]
    if piece and set(mine) != set(theirs):
        return [f"{where}: the cell defines {', '.join(mine)}; the marker names {', '.join(theirs)} alone"]
    out = []
    for name, src in mine.items():
        if name not in theirs:
            out.append(f"{where}: {name} is not defined in {stage.target}")
        elif src != theirs[name]:
            a, b = src.splitlines(), theirs[name].splitlines()
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append(f"{where}: {name} differs from its twin at its line {k + 1}: "
                       f"{(a[k] if k < len(a) else '<end>')!r} in the cell, "
                       f"{(b[k] if k < len(b) else '<end>')!r} in helpers")
    return out
