import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from helpers.course import run

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _notebook(path, *sources, params='PROFILE = "auto"\nINTERACTIVE = True\nRESULTS_DIR = None'):
    cells = [new_markdown_cell("# fixture")]
    cell = new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    cells.append(cell)
    cells += [new_code_cell(s) for s in sources]
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                             "language": "python"}})
    nbformat.write(nb, path)


RECORD = ("from helpers.measure import results\nresults.configure(RESULTS_DIR, PROFILE)\n"
          "results.record('fixture', {'answer': 42})")


@pytest.fixture
def fixture_dir(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    _notebook(folder / "10_ok.ipynb", RECORD, "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4]);")
    _notebook(folder / "20_fails.ipynb", "x = 1", "", "raise RuntimeError('broken on purpose')")
    _notebook(folder / "30_exits.ipynb", "import sys\nsys.exit(0)", "x = 1")
    _notebook(folder / "40_checks.ipynb", "assert isinstance(N, int), f'N={N!r} must be an int'", "x = 1",
              params='PROFILE = "auto"\nINTERACTIVE = True\nRESULTS_DIR = None\nN = 3')
    return folder


@pytest.mark.slow
def test_runner_reports_each_notebook_with_learner_cell_numbers(fixture_dir, tmp_path, capsys):
    refs = tmp_path / "refs"
    shutil.copytree(FIXTURES / "bad_reference", refs)  # a torn file and a record dated null
    (refs / "nvidia-h200" / "fixture.json").write_text(json.dumps(
        {"name": "fixture", "metrics": {"answer": 41}, "date": "2026-10-01", "profile": "full",
         "device": "NVIDIA H200", "versions": {"torch": "2.6.0"}}))
    code = run.main(["--notebooks-dir", str(fixture_dir), "--out", str(tmp_path / "runs"), "--references",
                     str(refs), "--jobs", "2", "-p", "N='abc'"])
    out = capsys.readouterr().out
    assert code == 1
    line = {ln.split()[0]: ln for ln in out.splitlines() if ln[:3] in ("10_", "20_", "30_", "40_")}
    assert line["10_ok"].split()[1] == "ok"
    # code cells counted from 1 as JupyterLab's [N] after Run All: empty cells and papermill's injected cell don't count
    assert "FAILED" in line["20_fails"] and "cell 3: RuntimeError: broken on purpose" in line["20_fails"]
    assert "FAILED" in line["30_exits"] and "cell 2: SystemExit" in line["30_exits"]  # sys.exit(0) is not ok
    assert "cell 2: AssertionError: N='abc' must be an int" in line["40_checks"]  # right after the parameters
    assert "conditions: 2 notebooks at a time (--jobs 2)" in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(s["notebook"], s["status"], s["cell"]) for s in summary] == [
        ("10_ok", "ok", None), ("20_fails", "failed", 3), ("30_exits", "failed", 2), ("40_checks", "failed", 2)]
    injected = [c for c in nbformat.read(run_dir / "notebooks" / "10_ok.ipynb", 4).cells
                if "injected-parameters" in c.metadata.get("tags", [])][0].source
    assert "N = " not in injected and 'PROFILE = "smoke"' in injected  # -p N only where N is declared
    report = (run_dir / "report.md").read_text()
    assert "| answer | 42 | 41 |" in report  # this run beside the reference GPU
    assert "NVIDIA H200, profile full, torch 2.6.0, 2026-10-01" in report  # the reference's own origin
    assert "profile smoke" in report and "Run conditions: 2 notebooks at a time" in report
    assert "nvidia-h200/torn.json" in report and "torn or invalid JSON" in report
    assert "figures/10_ok-" in report
    assert "Kernel is running over TCP" not in out and "Kernel is running over TCP" in (run_dir / "logs" / "10_ok.log").read_text()
    html = (run_dir / "report.html").read_text()
    assert "data:image/png;base64," in html and "broken on purpose" in html


@pytest.mark.slow
def test_runner_exits_0_with_a_torn_reference_and_saves_reference(fixture_dir, tmp_path, capsys):
    from helpers.measure.results import device_slug

    refs = tmp_path / "refs"
    shutil.copytree(FIXTURES / "bad_reference", refs)
    (refs / device_slug()).mkdir(exist_ok=True)
    shutil.copy(FIXTURES / "bad_reference" / "nvidia-h200" / "torn.json", refs / device_slug() / "old.json")
    code = run.main(["10", "--notebooks-dir", str(fixture_dir), "--out", str(tmp_path / "runs"), "--profile", "smoke",
                     "--references", str(refs), "--save-reference", "-p", "PROFILE='smoke'"])
    assert code == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    report = (run_dir / "report.md").read_text()
    assert "torn.json" in report and f"{device_slug()}/old.json" in report
    saved = json.loads((refs / device_slug() / "fixture.json").read_text())
    assert saved["metrics"] == {"answer": 42} and saved["versions"]["torch"] and saved["profile"] == "smoke"
    assert "Profile: smoke." in report


def _wait_for(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_workers_and_kernels_and_keeps_what_finished(tmp_path, sig):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    params = 'PROFILE = "auto"\nINTERACTIVE = True\nRESULTS_DIR = None\nMARK = ""'
    _notebook(nbs / "05_first.ipynb", "x = 1", params=params)
    _notebook(nbs / "10_sleeps.ipynb", "import json, os, time",
              "open(MARK, 'w').write(json.dumps([os.getpid(), os.getppid()]))\ntime.sleep(120)",
              "open(MARK + '.after', 'w').write('ran')", params=params)
    _notebook(nbs / "20_later.ipynb", "x = 2")
    mark = tmp_path / "pids.json"
    runner = subprocess.Popen([sys.executable, "-m", "helpers.course.run", "--notebooks-dir", str(nbs), "--out",
                               str(tmp_path / "runs"), "-p", f"MARK={str(mark)!r}"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    below = []
    try:
        assert _wait_for(lambda: mark.exists() and mark.read_text(), 180), "the sleeping cell never started"
        kernel, worker = (psutil.Process(pid) for pid in json.loads(mark.read_text()))
        below = psutil.Process(runner.pid).children(recursive=True)  # the worker, the kernel, all they started
        runner.send_signal(sig)  # to the runner alone, as a supervisor or Ctrl-C's handler would
        out, _ = runner.communicate(timeout=60)
        alive = psutil.wait_procs(below, timeout=5)[1]
    finally:  # whatever happened above, nothing this test started stays
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        for p in below:
            try:
                p.kill()
            except psutil.Error:
                pass
    assert runner.returncode == 128 + sig, out
    assert {kernel.pid, worker.pid} <= {p.pid for p in below}
    assert not alive, f"a process outlived the runner: {alive}"
    assert "Traceback" not in out and f"{signal.Signals(sig).name} received" in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = {s["notebook"]: s for s in json.loads((run_dir / "summary.json").read_text())}
    assert summary["05_first"]["status"] == "ok"
    assert (summary["10_sleeps"]["status"], summary["10_sleeps"]["cell"]) == ("interrupted", 3)
    assert summary["20_later"]["status"] == "not run"
    assert "10_sleeps | INTERRUPTED" in (run_dir / "report.md").read_text()
    executed = nbformat.read(run_dir / "notebooks" / "10_sleeps.ipynb", 4)
    statuses = [c.metadata.get("papermill", {}).get("status") for c in executed.cells if c.cell_type == "code"]
    assert statuses[-2:] == ["interrupted", "pending"]  # not "completed", as papermill would leave it
    assert executed.metadata["course_run"]["status"] == "interrupted"
    assert not Path(str(mark) + ".after").exists()


def test_each_run_owns_its_folder_even_in_the_same_second(tmp_path, monkeypatch):
    import datetime as dt

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 11, 30, 12, 0, 0)

    monkeypatch.setattr(run._dt, "datetime", Frozen)
    made = []
    threads = [threading.Thread(target=lambda: made.append(run.make_run_dir(tmp_path / "runs"))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 6 and len(set(made)) == 6
    assert all((d / "results").is_dir() and (d / "notebooks").is_dir() for d in made)


def test_an_unwritable_out_is_one_line(fixture_dir, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code = run.main(["10", "--notebooks-dir", str(fixture_dir), "--out", str(blocker / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot create a run folder under" in err and str(blocker) in err


def test_unknown_and_conflicting_parameters_fail_before_anything_runs(fixture_dir, tmp_path, capsys):
    out = tmp_path / "runs"
    common = ["--notebooks-dir", str(fixture_dir), "--out", str(out)]
    assert run.main(["40", *common, "-p", "n=64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no parameter 'n' (did you mean N?)" in err and "allowed: N, PROFILE" in err
    assert run.main(["10", *common, "-p", "RESULTS_DIR='x'"]) == 2
    assert "the runner sets RESULTS_DIR itself" in capsys.readouterr().err
    assert run.main(["10", *common, "--profile", "smoke", "-p", "PROFILE='full'"]) == 2
    assert "disagree" in capsys.readouterr().err
    assert run.main(["10", *common, "-p", "PROFILE='fast'"]) == 2
    assert not out.exists()  # nothing ran, no folder made
    routed = run.route_parameters(sorted(fixture_dir.glob("*.ipynb")), {"N": 5})
    assert {nb.stem: p for nb, p in routed.items()}["40_checks"] == {"N": 5}
    assert {nb.stem: p for nb, p in routed.items()}["10_ok"] == {}


def test_notebook_parameters_reads_the_parameters_cell(fixture_dir):
    assert run.notebook_parameters(fixture_dir / "40_checks.ipynb") == ["PROFILE", "INTERACTIVE", "RESULTS_DIR", "N"]


def test_environment_block_states_the_run_conditions(monkeypatch, capsys):
    from helpers.measure import hardware

    monkeypatch.setenv("COURSE_RUN_CONDITIONS", run.conditions(2, 1, False, True))
    hardware.describe()
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("conditions"))
    assert "2 notebooks at a time (--jobs 2), 1 torch thread, timed on its own CPU clock, each" in line and "compete" in line
    monkeypatch.delenv("COURSE_RUN_CONDITIONS")
    assert "not under the course runner" in hardware.run_conditions()
    assert "1 notebook at a time (the default)" in run.conditions(1, 2, False, False)


def test_selection_errors_and_listing(fixture_dir, capsys):
    with pytest.raises(run.UsageError, match="no notebook matches '99'"):
        run.find_notebooks(["99"], fixture_dir)
    assert run.main(["--list", "--notebooks-dir", str(fixture_dir)]) == 0
    assert "10_ok.ipynb" in capsys.readouterr().out
    assert [p.name for p in run.find_notebooks(["20_fails"], fixture_dir)] == ["20_fails.ipynb"]


def test_parse_parameter():
    assert run.parse_parameter("N=4") == ("N", 4)
    assert run.parse_parameter("DTYPE=bf16") == ("DTYPE", "bf16")
    assert run.parse_parameter("S=[1,2]") == ("S", [1, 2])
    with pytest.raises(Exception):
        run.parse_parameter("novalue")


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        run.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for option in ("--profile", "--parameter", "--jobs", "--out", "--notebooks-dir", "--references",
                   "--timeout", "--no-report", "--save-reference", "--list"):
        assert option in text


def test_may_start_keeps_notebook_00_alone():
    a, b, z = Path("00_hardware.ipynb"), Path("01_x.ipynb"), Path("02_y.ipynb")
    assert run._may_start(a, [], 2) and run._may_start(b, [], 2) and run._may_start(z, [b], 2)
    assert not run._may_start(b, [a], 2) and not run._may_start(a, [b], 2) and not run._may_start(z, [b], 1)


def test_an_unwritable_reference_folder_is_one_line(tmp_path, monkeypatch, capsys):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    nbformat.write(new_notebook(cells=[]), nbs / "10_x.ipynb")
    monkeypatch.setattr(run, "_run_all", lambda *a, **k: [run.Outcome("10_x", True, 1.0)])
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = run.main(["--notebooks-dir", str(nbs), "--out", str(tmp_path / "runs"), "--no-report",
                     "--save-reference", "--references", str(blocker / "refs")])
    out = capsys.readouterr().out
    assert code == 1 and [ln for ln in out.splitlines() if "references" in ln] == [
        next(ln for ln in out.splitlines() if ln.startswith("helpers.course.run: references not saved:"))]


def test_every_kernel_of_a_run_shares_one_inductor_cache(fixture_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "cache"))
    assert run.inductor_cache_dir({}) == str((tmp_path / "cache" / "inductor").resolve())
    assert run.inductor_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "/mine"}) == "/mine"  # the user's own wins
    seen = []
    monkeypatch.setattr(run, "_run_all", lambda notebooks, routed, base, workers, *rest: seen.append(workers.env) or [])
    run.main(["--notebooks-dir", str(fixture_dir), "--out", str(tmp_path / "runs"), "--no-report", "10"])
    assert seen and seen[0]["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / "cache" / "inductor").resolve())


@pytest.mark.slow
@pytest.mark.parametrize("death", ["os._exit(1)", "os.kill(os.getpid(), signal.SIGKILL)"])
def test_a_kernel_that_dies_is_reported_at_its_cell_and_the_cells_after_it_did_not_run(tmp_path, capsys, death):
    """The dying cell prints first, so the kernel may have numbered it before it died: the report must still
    name it, not the next one, and the executed notebook must not call the later cells completed."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    pid_file = tmp_path / "kernel.pid"
    _notebook(nbs / "10_dies.ipynb", "x = 1",
              f"import os, signal, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
              f"print('about to die', flush=True)\ntime.sleep(0.5)\n{death}", "y = 2", "z = 3")
    code = run.main(["--notebooks-dir", str(nbs), "--out", str(tmp_path / "runs"), "--no-report"])
    out = capsys.readouterr().out
    assert code == 1
    (run_dir,) = (tmp_path / "runs").iterdir()
    (summary,) = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["cell"]) == ("failed", 3), summary
    assert "DeadKernelError" in summary["error"] and "cells after it did not run" in summary["error"]
    assert "cell 3: DeadKernelError" in out
    executed = nbformat.read(run_dir / "notebooks" / "10_dies.ipynb", 4)
    statuses = [c.metadata.get("papermill", {}).get("status") for c in executed.cells
                if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])]
    assert statuses == ["completed", "completed", "failed", "pending", "pending"]
    assert executed.metadata["course_run"]["cell"] == 3
    assert not psutil.pid_exists(int(pid_file.read_text())) or \
        psutil.Process(int(pid_file.read_text())).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("value", ["1e999", "-1e999", "[1, 1e999]", "{'a': 1e999}", "1e999j", "(1, 2)", "..."])
def test_a_parameter_json_cannot_hold_is_refused_in_one_line(fixture_dir, tmp_path, capsys, value):
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_:
        run.main(["40", "--notebooks-dir", str(fixture_dir), "--out", str(out), "-p", f"N={value}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and f"-p N={value}" in err, err
    assert not out.exists()


@pytest.mark.parametrize("option", [["--timeout", "0"], ["--timeout", "nan"], ["--timeout", "-5"], ["--jobs", "0"],
                                    ["--jobs", "inf"], ["--jobs", "two"]])
def test_a_bad_number_is_refused_in_one_line_before_anything_runs(fixture_dir, tmp_path, capsys, option):
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_:
        run.main(["10", "--notebooks-dir", str(fixture_dir), "--out", str(out), *option])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and option[0] in err and option[1] in err, err
    assert not out.exists()


def test_an_unwritable_course_cache_falls_back_to_a_temporary_inductor_cache(fixture_dir, tmp_path, monkeypatch,
                                                                            capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a cache under a regular file: unwritable, even for root
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("COURSE_CACHE_DIR", str(blocker / "cache"))
    said = []
    folder = Path(run.inductor_cache_dir({}, say=said.append))
    try:
        assert folder.is_dir() and not str(folder).startswith(str(blocker))
        (folder / "probe").write_text("x")  # writable
        assert len(said) == 1 and str(blocker) in said[0] and str(folder) in said[0]
        seen = []
        monkeypatch.setattr(run, "_run_all", lambda notebooks, routed, base, workers, *rest: seen.append(workers.env) or [])
        run.main(["--notebooks-dir", str(fixture_dir), "--out", str(tmp_path / "runs"), "--no-report", "10"])
        used = Path(seen[0]["TORCHINDUCTOR_CACHE_DIR"])
        assert used.is_dir() and not str(used).startswith(str(blocker))
        lines = [ln for ln in capsys.readouterr().out.splitlines() if "compile cache" in ln]
        assert len(lines) == 1 and str(used) in lines[0]
        shutil.rmtree(used)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_full_profile_without_a_gpu_is_refused_in_one_line_unless_asked_for(fixture_dir, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "runs"
    for how in (["--profile", "full"], ["-p", "PROFILE='full'"]):
        assert run.main(["10", "--notebooks-dir", str(fixture_dir), "--out", str(out), *how]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no GPU is visible" in err and "--full-on-cpu" in err
    assert not out.exists()
    assert "--full-on-cpu" in run.build_parser().format_help()
