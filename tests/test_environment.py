import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_every_runtime_dependency_is_in_environment_yml():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = (ROOT / "environment.yml").read_text().lower()
    listed = {_name(m) for m in re.findall(r"^\s*-\s*([A-Za-z0-9_.\-]+)", env, flags=re.M)}
    missing = [d for d in deps if _name(d) not in listed]
    assert not missing, f"environment.yml lacks {missing}"


def test_makefile_and_ci_use_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme and "make run" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("test:", "lab:", "run:"):
        assert target in makefile
