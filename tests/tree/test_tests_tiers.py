"""The test suite's shape: folders that mirror the packages, tiers by declared markers, and a fast tier that
leaves every slow tier out."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SLOW_TIERS = ("notebook", "browser", "ranks", "tooling", "slow")


def declared_markers() -> set[str]:
    """The markers pyproject.toml declares (read as text: tomllib is not in Python 3.10), with strict markers on."""
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^addopts = ".*--strict-markers', text, re.M)
    block = text.split("markers = [", 1)[1].split("]", 1)[0]
    return set(re.findall(r'^\s*"(\w+):', block, re.M))


def fast_expression() -> str:
    (line,) = [ln for ln in (ROOT / "Makefile").read_text().splitlines() if ln.startswith("FAST :=")]
    return line.split(":=", 1)[1].strip()


def missing_from_fast(expression: str) -> list[str]:
    """The slow tiers the fast tier's marker expression does not exclude."""
    return [m for m in SLOW_TIERS if f"not {m}" not in expression]


def test_every_slow_tier_is_declared_and_left_out_of_the_fast_tier():
    assert set(SLOW_TIERS) <= declared_markers()
    assert missing_from_fast(fast_expression()) == []
    assert missing_from_fast("not notebook and not browser") == ["ranks", "tooling", "slow"]


def test_test_files_sit_in_the_folder_of_the_package_they_test():
    misplaced = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        folder = path.relative_to(ROOT / "tests").parts[0]
        if folder in ("browser", "tree") or path.parent == ROOT / "tests":
            misplaced += [path.name] if path.parent == ROOT / "tests" else []
            continue
        if not path.name.startswith(f"test_{folder}_"):
            misplaced.append(path.relative_to(ROOT).as_posix())
    assert misplaced == []
    assert {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()} >= {p.name for p in (ROOT / "helpers").iterdir()
                                                                        if (p / "__init__.py").exists()}


def test_the_fast_tier_is_documented_where_contributors_look():
    for doc in ("README.md", "CONTRIBUTING.md"):
        assert re.search(r"make test-fast", (ROOT / doc).read_text()), doc


class _Item:
    """What the ordering hook reads of a collected test: its node id and its markers."""

    def __init__(self, nodeid: str, browser: bool = False):
        self.nodeid, self.browser = nodeid, browser

    def get_closest_marker(self, name: str):
        return object() if name == "browser" and self.browser else None


def test_the_browser_suite_is_handed_out_first_and_every_file_stays_in_one_piece():
    spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)  # by its path: under xdist, `import conftest` finds another
    spec.loader.exec_module(conftest)
    items = [_Item("tests/a/test_a.py::one"), _Item("tests/a/test_a.py::two"),
             _Item("tests/browser/test_panels.py::skip_check"), _Item("tests/browser/test_panels.py::panel", True),
             _Item("tests/b/test_b.py::one"), _Item("tests/browser/test_site.py::site", True)]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        "tests/browser/test_panels.py::skip_check", "tests/browser/test_panels.py::panel",
        "tests/browser/test_site.py::site", "tests/a/test_a.py::one", "tests/a/test_a.py::two", "tests/b/test_b.py::one"]
    # the order only holds if xdist keeps it: make test's parallel part must not let it reorder by test count
    (line,) = [ln for ln in (ROOT / "Makefile").read_text().splitlines() if "-n $(JOBS)" in ln]
    assert "--dist loadfile" in line and "--no-loadscope-reorder" in line
