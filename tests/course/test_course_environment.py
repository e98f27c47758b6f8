import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10, which pyproject declares: no tomllib in its standard library
    tomllib = None

ROOT = Path(__file__).resolve().parents[2]
DECLARED = (3, 10)  # pyproject's requires-python and the README's "Python 3.10+"


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _dependencies_by_hand(text: str) -> list[str]:
    """[project] dependencies without a TOML parser: the quoted strings of its `dependencies = [...]`."""
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    block = re.search(r"^dependencies\s*=\s*\[(.*?)\]", project, flags=re.S | re.M).group(1)
    return re.findall(r'"([^"]+)"', block)


def dependencies() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    return tomllib.loads(text)["project"]["dependencies"] if tomllib else _dependencies_by_hand(text)


def test_every_runtime_dependency_is_in_environment_yml():
    env = (ROOT / "environment.yml").read_text().lower()
    listed = {_name(m) for m in re.findall(r"^\s*-\s*([A-Za-z0-9_.\-]+)", env, flags=re.M)}
    missing = [d for d in dependencies() if _name(d) not in listed]
    assert not missing, f"environment.yml lacks {missing}"


@pytest.mark.skipif(tomllib is None, reason="compares with tomllib, which Python 3.10 lacks")
def test_the_310_fallback_reads_the_same_dependencies():
    text = (ROOT / "pyproject.toml").read_text()
    assert _dependencies_by_hand(text) == tomllib.loads(text)["project"]["dependencies"]


def test_requires_python_is_what_the_code_supports():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'requires-python\s*=\s*">=3\.10"', text)
    assert "Python 3.10+" in (ROOT / "README.md").read_text()


# names that exist only from Python 3.11 on, and so break the code on 3.10 unless guarded by try/except
NEW_IN_311 = ("tomllib", "wsgiref.types", "datetime.UTC", "StrEnum", "TaskGroup", "ExceptionGroup",
              "typing.Self", "LiteralString", "assert_never", "reveal_type", "Never", "NotRequired", "TypeVarTuple")


def _sources():
    for path in sorted([*ROOT.glob("helpers/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/*.py")]):
        yield path, path.read_text()
    import nbformat

    for path in sorted(ROOT.glob("notebooks/*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        code = "\n".join(c.source for c in cells if c.cell_type == "code")
        yield path, "\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith(("%", "!")))


def _unguarded_new_names(tree) -> list[str]:
    guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
               and any(isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                       for h in t.handlers) for n in ast.walk(t)}
    found = []
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{a.name}" for a in node.names] + [a.name for a in node.names] + [node.module or ""]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names = [f"{node.value.id}.{node.attr}"]
        else:
            continue
        found += [n for n in names if n in NEW_IN_311]
    return found


@pytest.mark.slow
def test_code_parses_and_imports_on_the_declared_python():
    problems = []
    for path, source in _sources():
        try:
            tree = ast.parse(source, feature_version=DECLARED)
        except SyntaxError as err:
            problems.append(f"{path.relative_to(ROOT)}:{err.lineno}: not Python {DECLARED}: {err.msg}")
            continue
        problems += [f"{path.relative_to(ROOT)}: {name} is new in Python 3.11" for name in _unguarded_new_names(tree)]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_a_311_only_import():
    assert _unguarded_new_names(ast.parse("import tomllib")) == ["tomllib"]
    assert _unguarded_new_names(ast.parse("try:\n    import tomllib\nexcept ModuleNotFoundError:\n    pass")) == []


def test_makefile_and_ci_use_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme and "make run" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("test:", "lab:", "run:"):
        assert target in makefile


def _make_plan(venv: Path) -> str:
    """What `make test` would do for a venv at `venv` (dry run: nothing is installed)."""
    out = subprocess.run(["make", "-n", "-C", str(ROOT), f"VENV={venv}", "test"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="the Makefile is for Linux and macOS")
def test_make_rebuilds_a_venv_whose_python_is_gone_though_the_marker_stays(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()  # the marker, newer than pyproject.toml
    (venv / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    assert "-m venv" not in _make_plan(venv) and "pip install" not in _make_plan(venv)  # a working venv: as is
    (venv / "bin" / "python").unlink()
    plan = _make_plan(venv)  # python gone, marker still there
    assert "-m venv --clear" in plan and "pip install" in plan
    (venv / "bin" / "python").symlink_to(tmp_path / "no-such-python")  # a dangling link: broken the same way
    assert "-m venv --clear" in _make_plan(venv)


def test_make_run_passes_profile_only_when_asked(tmp_path):
    def plan(*extra):
        out = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), f"VENV={tmp_path / 'v'}", "run", *extra],
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip().splitlines()[-1]

    line = plan("ARGS=-p PROFILE=full")
    assert "helpers.course.run" in line and "--profile" not in line  # so -p PROFILE and --profile never disagree
    assert "--profile smoke" in plan("PROFILE=smoke")
