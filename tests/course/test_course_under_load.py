"""Numbers that hold on a busy machine: the notebooks whose headlines and verdicts once flipped under load run in
smoke with two busy processes on the cores, and what they record is compared with the quiet smoke run of the same
session (the browser suite's or test_course_notebooks', kept in the `quiet_smoke` folder; a notebook neither ran is
run quietly here first). Every numeric headline must agree within 1.5x; every string headline (a ranking, a
recommended size, "cannot tell") and every claim's verdict must be the same."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNDER_LOAD = ("00", "01", "02", "05", "06", "10", "12", "14")
AGREE_WITHIN = 1.5


def records(folder: Path) -> tuple[dict, dict]:
    """({(notebook, label): value} of the summaries' headlines, {claim id: verdict}) of the records in `folder`."""
    heads, verdicts = {}, {}
    for path in folder.rglob("summary-*.json"):
        m = json.loads(path.read_text())["metrics"]
        for label, row in (m.get("headline") or {}).items():
            heads[(m["notebook"], label)] = row.get("value")
    for path in folder.rglob("claim-*.json"):
        m = json.loads(path.read_text())["metrics"]
        verdicts[m["id"]] = (m.get("notebook"), m.get("verdict"))
    return heads, verdicts


def disagreements(quiet: tuple[dict, dict], loaded: tuple[dict, dict], notebooks) -> list[str]:
    """What differs between a quiet and a loaded run, restricted to `notebooks`: a line per headline that moved
    more than AGREE_WITHIN times (numbers) or changed (strings), per verdict that flipped, and per headline or
    verdict one run has and the other does not."""
    out = []
    (qh, qv), (lh, lv) = quiet, loaded
    for key in sorted(k for k in set(qh) | set(lh) if k[0] in notebooks):
        a, b = qh.get(key), lh.get(key)
        if a is None or b is None:
            out.append(f"{key[0]} {key[1]!r}: only in the {'loaded' if a is None else 'quiet'} run")
        elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if a != b and (a <= 0 or b <= 0 or max(a, b) / min(a, b) > AGREE_WITHIN):
                out.append(f"{key[0]} {key[1]!r}: {a:.4g} quiet, {b:.4g} loaded")
        elif a != b:
            out.append(f"{key[0]} {key[1]!r}: {a!r} quiet, {b!r} loaded")
    for cid in sorted(c for c in set(qv) | set(lv) if (qv.get(c) or lv.get(c))[0] in notebooks):
        if qv.get(cid) != lv.get(cid):
            out.append(f"verdict {cid}: {qv.get(cid, ('', 'absent'))[1]} quiet, {lv.get(cid, ('', 'absent'))[1]} loaded")
    return out


def test_the_comparison_catches_a_moved_headline_and_a_flipped_verdict():
    quiet = ({("00", "copy"): 10.0, ("00", "rank"): "A faster", ("01", "x"): 1.0}, {"c": ("00", "supported")})
    assert disagreements(quiet, quiet, UNDER_LOAD) == []
    loaded = ({("00", "copy"): 4.0, ("00", "rank"): "cannot tell", ("01", "x"): 1.4}, {"c": ("00", "not testable")})
    found = disagreements(quiet, loaded, UNDER_LOAD)
    assert len(found) == 3 and "10 quiet, 4 loaded" in found[0] and "flip" not in found[2]
    assert "verdict c: supported quiet, not testable loaded" in found


def _run(notebooks, out: Path, jobs: int) -> None:
    cmd = [sys.executable, "-m", "helpers.course.run", *notebooks, "--profile", "smoke", "--out", str(out),
           "--no-report", "--jobs", str(jobs)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"the run failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.serial
def test_headlines_and_verdicts_hold_with_two_busy_processes_on_the_cores(tmp_path, quiet_smoke):
    have = {p.stem.split("-")[1] for p in quiet_smoke.glob("summary-*.json")}
    missing = [nb for nb in UNDER_LOAD if nb not in have]
    if missing:  # run alone (-k), or a notebook neither suite ran: run it quietly here
        _run(missing, tmp_path / "quiet", jobs=1)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        _run(UNDER_LOAD, tmp_path / "loaded", jobs=1)  # one notebook beside the two busy processes
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    quiet = records(quiet_smoke)
    if missing:
        extra = records(tmp_path / "quiet")
        quiet = ({**quiet[0], **extra[0]}, {**quiet[1], **extra[1]})
    loaded = records(tmp_path / "loaded")
    assert any(k[0] in UNDER_LOAD for k in loaded[0]), "the loaded run recorded no headline"
    found = disagreements(quiet, loaded, UNDER_LOAD)
    assert not found, "under two busy processes:\n" + "\n".join(found)
