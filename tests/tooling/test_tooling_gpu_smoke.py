"""The GPU smoke pass: every notebook at smoke sizes, several at once, reported per notebook, failures packed,
imported into results/<gpu>/ and named by the report."""
import io
import json
import os
import tarfile
import time

import pytest

from helpers.course import smoke_record
from notebook_support import tiny_notebook
from tools.capture import gpu_smoke
from tools.capture.capture import BadPack

pytestmark = pytest.mark.tooling


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _fake_runner(clock, rows, took=100.0, status=("ok", "")):
    calls = []

    def run(notebooks, work, profile, limit_s, log=print, jobs=1, notebooks_dir=None, stop=None):
        calls.append((list(notebooks), profile, limit_s, jobs))
        run_dir = work / "20261202-000000-cuda"
        (run_dir / "notebooks").mkdir(parents=True)
        (run_dir / "logs").mkdir()
        for r in rows:
            (run_dir / "notebooks" / f"{r['notebook']}.ipynb").write_text("{}")
            (run_dir / "logs" / f"{r['notebook']}.log").write_text("log")
        (run_dir / "summary.json").write_text(json.dumps(rows))
        clock.t += took
        return status
    return run, calls


ROWS = [{"notebook": "00_hardware", "ok": True, "status": "ok", "seconds": 12.34, "cell": None, "error": ""},
        {"notebook": "07_fp8_training", "ok": False, "status": "failed", "seconds": 30.0, "cell": 14,
         "error": "RuntimeError: scaled_mm refused\n  more\n  and more\n  and the fourth line"},
        {"notebook": "13_distributed", "ok": False, "status": "interrupted", "seconds": 200.0, "cell": 9,
         "error": "interrupted by SIGTERM"}]


def test_the_pass_reports_every_notebook_and_packs_only_what_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_smoke, "gpu_facts", lambda: {"gpu": "NVIDIA H200", "torch": "2.13.0"})
    clock, lines = FakeClock(), []
    runner, calls = _fake_runner(clock, ROWS, status=("stopped", "stopped after 225 s"))
    doc = gpu_smoke.smoke_pass(["00", "07", "12", "13"], tmp_path / "out", 240.0, jobs=4, runner=runner,
                               clock=clock, log=lines.append, work=tmp_path / "work")
    assert calls == [(["00", "07", "12", "13"], "smoke", 240.0 - gpu_smoke.MARGIN_S, 4)]
    nbs = doc["notebooks"]
    assert {nb: o["status"] for nb, o in nbs.items()} == {"00": "ok", "07": "failed", "12": "not run",
                                                          "13": "interrupted"}
    assert nbs["07"]["cell"] == 14 and nbs["07"]["error"] == "RuntimeError: scaled_mm refused\n  more\n  and more"
    assert nbs["12"]["error"] == "not started before the budget ran out" and nbs["00"]["seconds"] == 12.3
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["smoke.tgz"]  # one file comes back
    with tarfile.open(tmp_path / "out" / "smoke.tgz") as tar:
        names = sorted(tar.getnames())
        packed = json.loads(tar.extractfile("gpu-smoke.json").read())
    assert names == ["gpu-smoke.json", "logs/07_fp8_training.log", "logs/13_distributed.log",
                     "notebooks/07_fp8_training.ipynb", "notebooks/13_distributed.ipynb"]
    assert packed["notebooks"] == nbs and packed["gpu"]["gpu"] == "NVIDIA H200" and packed["seconds"] == 100.0
    assert "07: failed in 30.0 s at cell 14: RuntimeError: scaled_mm refused" in lines
    assert lines[-1] == "smoke pass: 1 of 4 ok in 100 s -> smoke.tgz"


def test_a_runner_that_wrote_no_summary_leaves_every_notebook_not_run_with_its_reason(tmp_path):
    def runner(notebooks, work, *a, **k):
        return "failed", "runner exit status 2; see run.log"

    doc = gpu_smoke.smoke_pass(["00", "01"], tmp_path / "out", 60.0, runner=runner, work=tmp_path / "w",
                               log=lambda s: None)
    assert all(o == {"status": "not run", "seconds": 0.0, "cell": None, "error": "runner exit status 2; see run.log"}
               for o in doc["notebooks"].values())


@pytest.mark.parametrize("kw, match", [({"jobs": 0}, "jobs"), ({"budget_s": 10.0}, "exceed")])
def test_bad_arguments_are_refused(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        gpu_smoke.smoke_pass(["00"], tmp_path, **{"budget_s": 60.0, **kw})


def test_import_puts_the_pass_beside_the_references_and_the_report_names_it(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_smoke, "gpu_facts", lambda: {"gpu": "NVIDIA H200"})
    clock = FakeClock()
    runner, _ = _fake_runner(clock, ROWS)
    gpu_smoke.smoke_pass(["00", "07"], tmp_path / "out", 240.0, runner=runner, clock=clock, log=lambda s: None,
                         work=tmp_path / "w")
    path = gpu_smoke.import_smoke(tmp_path / "out" / "smoke.tgz", tmp_path / "results")
    assert path == tmp_path / "results" / "nvidia-h200" / "gpu-smoke.json"
    doc = smoke_record.load(path.parent)
    day = doc["started"][:10]
    assert smoke_record.line_for("00", doc, "nvidia-h200") == (f"Ran on nvidia-h200 in the smoke profile on {day}: every "
                                                            "cell ran (12 s).")
    assert smoke_record.line_for("07", doc, "nvidia-h200") == (f"Smoke pass on nvidia-h200 ({day}): failed at cell 14: "
                                                            "RuntimeError: scaled_mm refused.")
    assert smoke_record.line_for("09", doc, "nvidia-h200") == f"Not in the smoke pass on nvidia-h200 ({day})."
    assert smoke_record.line_for("00", None, "nvidia-h200") is None
    readme = (path.parent / "README.md").read_text()
    assert readme.startswith("# Reference: NVIDIA H200") and "## The smoke pass on this GPU" in readme
    assert "1 of 2 ran every cell" in readme and "07        failed  30       14    RuntimeError: scaled_mm refused" in readme
    (path.parent / "README.md").write_text("# Reference: NVIDIA H200\n\nthe capture's part\n\n" + readme[readme.index(
        gpu_smoke.SMOKE_MARK):])
    gpu_smoke.import_smoke(tmp_path / "out" / "smoke.tgz", tmp_path / "results")  # a second import replaces the table
    again = (path.parent / "README.md").read_text()
    assert "the capture's part" in again and again.count("## The smoke pass on this GPU") == 1


def test_a_later_pass_of_some_notebooks_replaces_their_rows_and_keeps_the_others(tmp_path, monkeypatch):
    # a pass cut short or a fix re-run on a few notebooks: the record keeps every notebook's latest outcome, when
    # it ran, and what it replaced
    monkeypatch.setattr(gpu_smoke, "gpu_facts", lambda: {"gpu": "NVIDIA H200"})
    for k, rows in enumerate([ROWS[:2], [{**ROWS[1], "ok": True, "status": "ok", "seconds": 41.0, "cell": None,
                                          "error": ""}]]):
        runner, _ = _fake_runner(FakeClock(), rows)
        gpu_smoke.smoke_pass([r["notebook"][:2] for r in rows], tmp_path / f"out{k}", 240.0, runner=runner,
                             log=lambda s: None, work=tmp_path / f"w{k}")
        pack = tmp_path / f"out{k}" / "smoke.tgz"
        if k == 0:  # the first pass ran a day earlier
            members = gpu_smoke.read_pack(pack)
            doc = json.loads(members["gpu-smoke.json"])
            doc["started"] = "2026-12-01T10:00:00+00:00"
            with tarfile.open(pack, "w:gz") as tar:
                data = json.dumps(doc).encode()
                info = tarfile.TarInfo("gpu-smoke.json")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        path = gpu_smoke.import_smoke(pack, tmp_path / "results")
    doc = smoke_record.load(path.parent)
    assert sorted(doc["notebooks"]) == ["00", "07"]
    assert doc["notebooks"]["07"]["status"] == "ok"
    assert doc["notebooks"]["07"]["earlier"] == {"status": "failed", "cell": 14, "started": "2026-12-01T10:00:00+00:00",
                                                 "error": "RuntimeError: scaled_mm refused\n  more\n  and more"}
    assert doc["notebooks"]["00"]["started"] == "2026-12-01T10:00:00+00:00" and "earlier" not in doc["notebooks"]["00"]
    assert smoke_record.line_for("00", doc, "nvidia-h200").startswith("Ran on nvidia-h200 in the smoke profile on 2026-12-01")
    day = doc["started"][:10]
    assert day != "2026-12-01" and f"on {day}: every cell ran (41 s)" in smoke_record.line_for("07", doc, "nvidia-h200")
    readme = (path.parent / "README.md").read_text()
    assert "2 of 2 ran every cell" in readme and "in 2 passes, started 2026-12-01T10:00:00+00:00, " in readme
    assert "pass started" in readme and "2026-12-01T10:00" in readme.split("```")[1]


def test_import_refuses_a_cpu_pass_and_what_is_not_a_smoke_pack(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_smoke, "gpu_facts", lambda: {"gpu": "none (CPU)"})
    runner, _ = _fake_runner(FakeClock(), ROWS[:1])
    gpu_smoke.smoke_pass(["00"], tmp_path / "out", 60.0, runner=runner, log=lambda s: None, work=tmp_path / "w")
    with pytest.raises(ValueError, match="without a GPU"):
        gpu_smoke.import_smoke(tmp_path / "out" / "smoke.tgz", tmp_path / "results")
    bad = tmp_path / "bad.tgz"
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(tmp_path / "out" / "smoke.tgz", arcname="other.tgz")
    with pytest.raises(BadPack, match="no gpu-smoke.json"):
        gpu_smoke.import_smoke(bad, tmp_path / "results")
    assert not (tmp_path / "results").exists()
    assert gpu_smoke.main(["import", str(bad), "--into", str(tmp_path / "results")]) == 1


@pytest.mark.notebook
def test_a_real_pass_runs_notebooks_at_once_reports_a_failure_and_a_hang_and_leaves_no_process(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    tiny_notebook(folder / "00_ok.ipynb", "x = 1")
    tiny_notebook(folder / "01_fails.ipynb", "raise ValueError('planted failure')")
    tiny_notebook(folder / "02_hangs.ipynb", "import os, pathlib, time\n"
                   "pathlib.Path(RESULTS_DIR, 'pid').write_text(str(os.getpid()))\ntime.sleep(600)")
    t0 = time.monotonic()
    doc = gpu_smoke.smoke_pass(["00", "01", "02"], tmp_path / "out", 50.0, jobs=3, work=tmp_path / "work",
                               notebooks_dir=folder, log=lambda s: None)
    assert time.monotonic() - t0 < 50.0 + 20.0
    nbs = doc["notebooks"]
    assert nbs["00"]["status"] == "ok" and nbs["01"]["status"] == "failed" and nbs["02"]["status"] == "interrupted"
    assert nbs["01"]["cell"] == 2 and "planted failure" in nbs["01"]["error"]
    kernel = int(next((tmp_path / "work").rglob("results/pid")).read_text())
    time.sleep(1)
    with pytest.raises(ProcessLookupError):
        os.kill(kernel, 0)  # the hung notebook's kernel went with the runner
    with tarfile.open(tmp_path / "out" / "smoke.tgz") as tar:
        names = tar.getnames()
    assert "notebooks/01_fails.ipynb" in names and "notebooks/02_hangs.ipynb" in names
    assert not any("00_ok" in n for n in names)


def test_the_capture_script_runs_the_smoke_pass_first_then_the_goals_then_the_references():
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "scripts" / "gpu_capture.sh").read_text()
    body = script[script.index("set -uo pipefail"):]
    steps = [body.index(s) for s in ("tools.capture.gpu_smoke run", "tools.capture.goals run",
                                     "tools.capture.capture run")]
    assert steps == sorted(steps)
    assert 'SMOKE_BUDGET_S="${SMOKE_BUDGET_S:-240}"' in body and 'GOALS_BUDGET_S="${GOALS_BUDGET_S:-rest}"' in body


def _fake_capture(tmp_path, env_extra):
    """Run scripts/gpu_capture.sh with a python3 on PATH that only logs its arguments (and answers every
    import check yes): [(the module run, its --budget-s)] in the order the script called them."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "calls.log"
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit 0\n')
    (bin_dir / "python3").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(tmp_path / "out"), **env_extra}
    subprocess.run(["bash", str(root / "scripts" / "gpu_capture.sh")], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=60)
    calls = []
    for line in log.read_text().splitlines():
        words = line.split()
        if words[:2] == ["-m", words[1]] and "run" in words:
            calls.append((words[1], float(words[words.index("--budget-s") + 1])))
    return calls


def test_the_goals_get_what_the_smoke_pass_left_of_the_call_and_references_run_in_the_second_call(tmp_path):
    calls = _fake_capture(tmp_path / "one", {"BUDGET_S": "540"})
    # the fake smoke pass and goals take no time, so the goals get the whole rest and the references what they left
    assert [m for m, _ in calls] == ["tools.capture.gpu_smoke", "tools.capture.goals", "tools.capture.capture"]
    assert calls[0][1] == 240 and 535 <= calls[1][1] <= 540 and calls[2][1] <= calls[1][1]
    calls = _fake_capture(tmp_path / "two", {"BUDGET_S": "260", "SMOKE_BUDGET_S": "0", "GOALS_BUDGET_S": "0"})
    assert [m for m, _ in calls] == ["tools.capture.capture"] and 255 <= calls[0][1] <= 260


@pytest.mark.parametrize("env", [{"SMOKE_BUDGET_S": "abc"}, {"SMOKE_BUDGET_S": "1e3"}, {"GOALS_BUDGET_S": "nan"},
                                 {"BUDGET_S": "-5"}, {"BUDGET_S": "540.5"}])
def test_a_budget_that_is_not_whole_seconds_stops_the_capture_script_in_one_line(tmp_path, env):
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(["bash", str(root / "scripts" / "gpu_capture.sh")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), **env})
    name = next(iter(env))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and f"{name}={env[name]}" in done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything ran


@pytest.mark.parametrize("odd", [{"gpu": "NVIDIA H200"}, {"notebooks": {"01": "ok"}},
                                 {"notebooks": {"01": {"status": "ok", "seconds": None}}}])
def test_a_malformed_smoke_record_is_refused_at_import(tmp_path, odd):
    import io

    doc = {"started": "2026-12-01", "gpu": {"gpu": "NVIDIA H200"},
           "notebooks": {"00": {"status": "ok", "seconds": 1.0}}, **odd}
    pack = tmp_path / "smoke.tgz"
    data = json.dumps(doc).encode()
    with tarfile.open(pack, "w:gz") as tar:
        info = tarfile.TarInfo("gpu-smoke.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(BadPack):
        gpu_smoke.import_smoke(pack, tmp_path / "results")
    assert not (tmp_path / "results").exists()


def test_a_pass_starts_what_the_last_pass_did_not_finish_then_its_longest():
    record = {"notebooks": {"00": {"status": "ok", "seconds": 10.0}, "06": {"status": "ok", "seconds": 106.0},
                            "07": {"status": "ok", "seconds": 73.0}, "08": {"status": "ok", "seconds": 73.0},
                            "09": {"status": "failed", "seconds": 112.0}, "14": {"status": "interrupted", "seconds": 47.0},
                            "13": {"status": "ok", "seconds": None}}}
    asked = ["00", "06", "07", "08", "09", "12", "13", "14"]
    # unfinished or unseen first (course order among them), then by seconds, longest first; 07 before 08 on a tie
    assert gpu_smoke.longest_first(asked, record) == ["09", "12", "13", "14", "06", "07", "08", "00"]
    assert gpu_smoke.longest_first(asked, None) == asked
    assert gpu_smoke.longest_first(["07", "06"], {"notebooks": {}}) == ["06", "07"]
