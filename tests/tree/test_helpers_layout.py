"""The shape of helpers/: packages by layer and by part of the course, imports that run downward only,
each package's __init__ a map of its files, one name per module across the notebooks.

The layers are import-linter's contracts in pyproject.toml (a layers contract and an acyclic-siblings
contract); these tests run the real tool, on the tree and on a copy with a planted upward import.
"""
import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "helpers"
LINT = Path(sys.executable).with_name("lint-imports")
PACKAGES = sorted(p.parent for p in HELPERS.glob("**/__init__.py") if p.parent != HELPERS)  # nested ones too

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (pip install -e '.[dev]')")


def _lint(folder: Path) -> subprocess.CompletedProcess:
    """lint-imports on the helpers/ package found in `folder`, with pyproject.toml's contracts."""
    env = {"PYTHONPATH": str(folder), "PATH": str(LINT.parent), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([str(LINT), "--config", str(folder / "pyproject.toml"), "--no-cache"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_layers_and_no_circles_hold():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout


def test_a_planted_upward_import_breaks_the_layers_and_removing_it_mends_them(tmp_path):
    shutil.copytree(HELPERS, tmp_path / "helpers", ignore=shutil.ignore_patterns("__pycache__", "*.pt"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    low = tmp_path / "helpers" / "show" / "tables.py"
    clean = low.read_text()
    low.write_text(clean + "\n\nfrom helpers.course import report  # planted: show may not import course\n")
    broken = _lint(tmp_path)
    assert broken.returncode != 0
    assert "helpers.show is not allowed to import helpers.course" in broken.stdout, broken.stdout[-3000:]
    assert "helpers.show.tables -> helpers.course.report" in broken.stdout
    low.write_text(clean)
    mended = _lint(tmp_path)
    assert mended.returncode == 0, mended.stdout[-3000:]


TOOLING_NAMES = re.compile(r"capture|goals?(_\w+)?|gpu_smoke|gpu_check")


def _tooling_in_helpers(helpers: Path) -> list[str]:
    """What of the maintainers' tooling (tools/, not installed) sits in, or is imported by, the package at
    `helpers`: a module named like the capture, the goals, the smoke pass or the GPU check, and any import
    of `tools`, each as 'path: why'."""
    found = [f"{p.relative_to(helpers.parent)}: a tooling module in the package" for p in sorted(helpers.rglob("*.py"))
             if TOOLING_NAMES.fullmatch(p.stem)]
    for path in sorted(helpers.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.relative_to(helpers.parent)}:{node.lineno}: imports {n}" for n in names
                      if n == "tools" or n.startswith("tools.")]
    return found


@pytest.mark.slow
def test_the_maintainers_tooling_stays_out_of_helpers_and_a_planted_piece_is_found(tmp_path):
    assert _tooling_in_helpers(HELPERS) == []
    assert (ROOT / "tools" / "capture" / "capture.py").is_file()  # where the tooling lives instead
    planted = tmp_path / "helpers"
    shutil.copytree(HELPERS, planted, ignore=shutil.ignore_patterns("__pycache__", "*.pt"))
    assert _tooling_in_helpers(planted) == []
    (planted / "course" / "gpu_smoke.py").write_text('"""planted"""\n')
    report = planted / "course" / "report.py"
    report.write_text(report.read_text() + "\n\ndef _planted():\n    from tools.capture import capture  # planted\n")
    (planted / "show" / "tables.py").write_text((planted / "show" / "tables.py").read_text() + "\nimport tools\n")
    found = _tooling_in_helpers(planted)
    assert found[0] == "helpers/course/gpu_smoke.py: a tooling module in the package"
    assert [f.split(":")[0] for f in found[1:]] == ["helpers/course/report.py", "helpers/show/tables.py"]
    assert found[1].endswith("imports tools.capture") and found[2].endswith("imports tools"), found


def _docstring(init: Path) -> str:
    return ast.get_docstring(ast.parse(init.read_text())) or ""


TOOLS = [ROOT / "tools", ROOT / "tools" / "capture"]  # the maintainers' tooling maps its files the same way


@pytest.mark.parametrize("package", [*PACKAGES, *TOOLS], ids=lambda p: p.relative_to(
    HELPERS if p.is_relative_to(HELPERS) else ROOT).as_posix())
def test_each_package_init_is_a_map_of_its_files(package):
    init = package / "__init__.py"
    tree = ast.parse(init.read_text())
    doc = _docstring(init)
    assert doc, f"{init} has no docstring"
    code = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    assert not code, f"{init} holds code besides its docstring (imports or re-exports)"
    files = sorted(p.stem for p in package.glob("*.py") if p.name != "__init__.py")
    files += sorted(p.name + "/" for p in package.iterdir() if (p / "__init__.py").exists())
    missing = [f for f in files if f"`{f}`" not in doc]
    assert not missing, f"{init}'s docstring does not name {missing}"
    named = set(re.findall(r"^`(\w+/?)`", doc, flags=re.M))
    gone = sorted(named - set(files))
    assert not gone, f"{init}'s docstring names files that do not exist: {gone}"


def test_the_course_map_names_every_package_and_no_flat_module_remains():
    doc = _docstring(HELPERS / "__init__.py")
    missing = [p.name for p in PACKAGES if p.parent == HELPERS and f"`{p.name}/`" not in doc]
    assert not missing, f"helpers/__init__.py does not name {missing}"
    flat = [p.name for p in HELPERS.glob("*.py") if p.name != "__init__.py"]
    assert not flat, f"modules outside the packages: {flat}"
    for number in sorted({p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}):
        assert re.search(rf"^{number}\b", doc, flags=re.M), f"helpers/__init__.py has no row for notebook {number}"


def _module_imports(source: str):
    """(module, alias) for every `from helpers.a import b as c` / `import helpers.a.b as c` of a module."""
    for line in source.splitlines():
        if not re.match(r"\s*(from|import)\s+helpers", line):
            continue
        try:
            tree = ast.parse(line.strip())
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if (ROOT / (full.replace(".", "/") + ".py")).exists() or (ROOT / full.replace(".", "/")).is_dir():
                        yield full, a.asname or a.name
            elif isinstance(node, ast.Import):
                for a in node.names:
                    yield a.name, a.asname or a.name


def test_one_name_per_module_across_every_notebook():
    names: dict[str, set[str]] = {}
    modules: dict[str, set[str]] = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            for module, name in _module_imports("".join(cell["source"])):
                names.setdefault(module, set()).add(name)
                modules.setdefault(name, set()).add(module)
    assert names, "no notebook imports a helpers module"
    two_names = {m: n for m, n in names.items() if len(n) > 1}
    two_modules = {n: m for n, m in modules.items() if len(m) > 1}
    assert not two_names, f"modules imported under more than one name: {two_names}"
    assert not two_modules, f"one name standing for several modules: {two_modules}"


def test_the_product_speaks_of_the_course_not_of_a_tracker():
    # another project's issue, cited as a source ("PyTorch's issue #13246"), is not the course's tracker
    pattern = re.compile(r"(?<!'s )\bissues? (#?\d+|\d+-\d+)|(?<!'s )\bissue \d+'s\b", re.I)
    places = [*HELPERS.rglob("*.py"), *(ROOT / "tools").rglob("*.py"), *(ROOT / "scripts").iterdir(), ROOT / "README.md",
              ROOT / "results" / "README.md", *(ROOT / "notebooks").glob("*.ipynb")]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for p in places if p.is_file()
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if pattern.search(line)]
    assert not hits, "tracker numbers in the product:\n" + "\n".join(hits[:20])


def test_the_readme_links_nothing_outside_the_repository():
    for doc in (ROOT / "README.md", ROOT / "CONTRIBUTING.md"):
        links = re.findall(r"\]\(([^)#]+)", doc.read_text())
        outside = [link for link in links if not link.startswith(("http://", "https://"))
                   and not (doc.parent / link).resolve().is_relative_to(ROOT)]
        assert not outside, f"{doc.name} links outside the repository: {outside}"


MAX_LINES = 400


def oversized_modules(root: Path) -> list[str]:
    """Modules of the helpers/ tree at `root` over MAX_LINES lines that are not exempt: the exercises' registrations
    (course/exercises/) and Triton kernel files (a module that defines an @triton.jit kernel) are; any other must
    give its reason in its docstring's first line, saying "over 400 lines"."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") <= MAX_LINES or "exercises" in path.relative_to(root).parts or "@triton.jit" in text:
            continue
        first = (ast.get_docstring(ast.parse(text)) or "").splitlines()[:1]
        if not (first and f"over {MAX_LINES} lines" in first[0]):
            out.append(f"{path.relative_to(root).as_posix()} ({text.count(chr(10))} lines)")
    return out


def test_no_module_is_over_400_lines_without_a_reason():
    assert oversized_modules(HELPERS) == []


def test_an_oversized_module_is_caught_until_its_first_line_gives_the_reason(tmp_path):
    (tmp_path / "pkg").mkdir()
    big = tmp_path / "pkg" / "big.py"
    big.write_text('"""A module."""\n' + "x = 1\n" * MAX_LINES)
    assert oversized_modules(tmp_path) == [f"pkg/big.py ({MAX_LINES + 1} lines)"]
    big.write_text(f'"""A module, over {MAX_LINES} lines: one table that reads best whole."""\n' + "x = 1\n" * MAX_LINES)
    assert oversized_modules(tmp_path) == []
