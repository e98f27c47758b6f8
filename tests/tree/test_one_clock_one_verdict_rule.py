"""Numbers that hold on a busy machine, as a kind: no notebook or lab writes its own verdict (every one comes from
claims.judge_interval through claims.verdict), and no lab or notebook times CPU work on a raw wall clock of its own
(bench, protocol and clock.Stopwatch read the thread's clock; a wall clock stays only where waiting is the lesson,
in the modules listed here with the reason)."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# modules whose wall clock times waiting, which is their lesson or their job, not CPU work on the calling thread
WALL_CLOCK_ALLOWED = {
    "measure/bench.py": "the timer itself (its wall clock for more than one thread, beside the thread clock)",
    "measure/clock.py": "the clock itself",
    "measure/protocol.py": "the budget of a comparison in wall seconds",
    "course/run.py": "the runner's seconds per notebook", "course/worker.py": "the runner's workers",
    "course/time_limit.py": "time limits", "course/processes.py": "waiting for processes to end",
    "dataload/loading.py": "loader workers: waiting is the lesson",
    "dataload/loading_lab.py": "loader workers and pinned copies: waiting is the lesson",
    "dataload/loading_sweep_lab.py": "the loader sweep's seconds budget",
    "parallel/launch.py": "rank processes", "parallel/torchrun.py": "torchrun launches",
    "parallel/collectives_lab.py": "ranks wait for each other: waiting is the lesson",
    "parallel/ddp_lab.py": "ranks wait for each other", "parallel/pipeline_lab.py": "pipeline stages wait",
    "gpt/pretrained.py": "training the cached models, untimed by the course",
    "decode/serving.py": "a request queue's arrival clock",
}
WALL = re.compile(r"\btime\.(perf_counter|perf_counter_ns|time|monotonic)\(\)")
OWN_VERDICT = re.compile(r"""verdict\s*=\s*[^\n]*["'](supported|contradicted|exceeded)["']""")
OLD_RULES = re.compile(r"\bclaims\.judge\(|\bjudge_range\b")


def _cells(path: Path) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


def _sources():
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        yield str(path.relative_to(ROOT / "helpers")), path.read_text()
    for path in NOTEBOOKS:
        yield path.name, _cells(path)


@pytest.mark.parametrize("name, text", list(_sources()), ids=lambda x: x if isinstance(x, str) and len(x) < 60 else "")
def test_no_notebook_or_lab_writes_its_own_verdict(name, text):
    if name == "measure/claims.py":
        return
    own = [m.group(0).strip() for m in OWN_VERDICT.finditer(text)]
    assert not own, f"{name} writes a verdict itself ({own[0][:90]}): pass value, spread and claimed to claims.verdict"
    assert not OLD_RULES.search(text), f"{name} uses a retired verdict rule: claims.judge_interval is the one rule"


@pytest.mark.parametrize("name, text", list(_sources()), ids=lambda x: x if isinstance(x, str) and len(x) < 60 else "")
def test_cpu_work_is_timed_on_the_course_clock(name, text):
    if name in WALL_CLOCK_ALLOWED or name.startswith("course/exercises/"):
        return
    hits = [m.group(0) for m in WALL.finditer(text)]
    assert not hits, (f"{name} times with {hits[0]}: use bench/protocol or clock.Stopwatch (the thread's own clock), "
                      "or, where waiting is the lesson, add the module here with the reason")


def test_the_rule_catches_what_it_should():
    assert OWN_VERDICT.search('verdict="supported" if x else "contradicted"')
    assert OWN_VERDICT.search("claims.verdict('a', verdict=('exceeded' if y else 'not testable'))")
    assert not OWN_VERDICT.search('verdict="not testable", reason="needs a GPU"')
    assert WALL.search("t0 = time.perf_counter()") and not WALL.search("time.thread_time_ns()")
