"""Output that cannot be written: a full or tiny disk is found before the work (folder_problem), a write that fails
after the work is one line naming what was kept and where (the capture, the smoke pass, the goals), an empty
notebooks folder is refused rather than reported as success, and a signal reaches the smoke pass's runner."""
import errno
import json
from collections import namedtuple
from pathlib import Path

import pytest

from helpers.course import processes, run
from helpers.measure import results
from tools.capture import capture as C
from tools.capture import goals as G
from tools.capture import gpu_smoke
from tools.capture.goal_base import check, result

pytestmark = pytest.mark.tooling
Usage = namedtuple("Usage", "total used free")


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_disk_without_room_is_found_before_the_work(tmp_path, monkeypatch):
    assert processes.folder_problem(tmp_path) == ""
    monkeypatch.setattr(processes.shutil, "disk_usage", lambda p: Usage(10**9, 10**9, 0))
    problem = processes.folder_problem(tmp_path / "out")
    assert "only 0.0 MiB free" in problem and str(tmp_path / "out") in problem
    for main in (lambda out: C.main(["run", "00", "--out", str(out), "--budget-s", "600"]),
                 lambda out: gpu_smoke.main(["run", "00", "--out", str(out)]),
                 lambda out: G.main(["run", "--out", str(out)])):
        assert main(tmp_path / "o") == 2
    assert run.main(["00", "--out", str(tmp_path / "r"), "--no-report"]) == 2


def test_a_pack_that_cannot_be_written_is_one_line_and_the_work_is_kept(tmp_path, monkeypatch):
    clock, lines = type("Clock", (), {"t": 0.0, "__call__": lambda self: self.t})(), []

    def runner(nb, work, profile, limit_s, log=print):
        (work / "run" / "results").mkdir(parents=True)
        (work / "run" / "results" / f"rec{nb}.json").write_text(json.dumps({"device": "GPU X"}))
        return "ok", ""

    monkeypatch.setattr(C, "write_atomic", _full)
    out = C.capture(["00", "01"], tmp_path / "out", 1e6, runner=runner, clock=clock, log=lines.append,
                    work=tmp_path / "work", estimates={})
    assert [(o.notebook, o.status) for o in out] == [("00", "not packed"), ("01", "not run")]
    said = [line for line in lines if "could not write" in line]
    assert said[-1] == f"could not write {tmp_path / 'out' / 'capture-1.tgz'}: No space left on device; " \
                       f"the work is kept in {tmp_path / 'work'}"
    assert (tmp_path / "work" / "00" / "run" / "results" / "rec00.json").is_file() and C.exit_status(out) == 1


def test_a_smoke_pack_that_cannot_be_written_is_one_line_and_fails_the_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_smoke, "gpu_facts", lambda: {"gpu": "NVIDIA H200"})
    monkeypatch.setattr(gpu_smoke, "write_atomic", _full)

    def runner(notebooks, work, profile, limit_s, log=print, jobs=1, notebooks_dir=None, stop=None):
        run_dir = work / "r"
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps([{"notebook": "00_hardware", "ok": True, "seconds": 1.0}]))
        return "ok", ""

    lines = []
    doc = gpu_smoke.smoke_pass(["00"], tmp_path / "out", 240.0, runner=runner, log=lines.append, work=tmp_path / "w")
    assert doc["pack_error"] == f"could not write {tmp_path / 'out' / 'smoke.tgz'}: No space left on device; " \
                                f"the work is kept in {tmp_path / 'w'}"
    assert lines[-1] == doc["pack_error"] and lines[-2].endswith("-> no pack")


def _quick(ctx):
    return result([check("r", 3.0, ">=", 2.0)], {"value": 3.0}, {})


def test_goals_that_cannot_be_written_say_so_once_and_still_return_their_table(tmp_path, monkeypatch):
    monkeypatch.setattr(G, "write_atomic", _full)
    lines = []
    quick = G.Goal("99", "99.quick", "quick", _quick, 1.0, "test", 1.0)
    doc = G.run([quick], tmp_path, profile="smoke", budget_s=120, log=lines.append)
    assert doc["goals"][0]["status"] == "measured" and "99.quick" in G.table(doc)
    assert sum("could not write" in line for line in lines) == 1 and "No space left" in doc["write_error"]


@pytest.mark.parametrize("command", ["capture", "smoke"])
def test_an_empty_notebooks_folder_is_refused_not_reported_as_success(tmp_path, capsys, command):
    (tmp_path / "empty").mkdir()
    main = C.main if command == "capture" else gpu_smoke.main
    assert main(["run", "--out", str(tmp_path / "out"), "--notebooks-dir", str(tmp_path / "empty")]) == 2
    assert "no notebooks" in capsys.readouterr().err


def test_the_runner_exits_2_for_a_notebook_that_does_not_exist(capsys):
    assert run.main(["99"]) == 2
    assert "no notebook matches '99'" in capsys.readouterr().err


def test_the_smoke_pass_hands_its_stop_to_the_runner(tmp_path, monkeypatch):
    seen = []

    def smoke_pass(notebooks, out, budget_s, **kw):
        seen.append(kw.get("stop"))
        return {"notebooks": {}}

    monkeypatch.setattr(gpu_smoke, "smoke_pass", smoke_pass)
    gpu_smoke.main(["run", "00", "--out", str(tmp_path / "out")])
    assert len(seen) == 1 and isinstance(seen[0], processes.Stop)


def test_a_device_name_that_names_no_folder_is_refused():
    assert results.slug("NVIDIA H200") == "nvidia-h200"
    with pytest.raises(ValueError, match="no letter or digit"):
        results.slug("!!!")
