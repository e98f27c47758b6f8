"""The GPU capture: priority order, the time budget (fake clock), atomic packs, the importer (and damaged packs),
SIGINT and SIGTERM, and one-line errors for bad options."""
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import psutil
import pytest

from notebook_support import tiny_notebook
from tools.capture import capture as C

pytestmark = pytest.mark.tooling


def test_priority_puts_missing_references_first_then_the_oldest():
    index = {"00": {"date": "2026-12-01T00:00:00+00:00"}, "02": {"date": "2026-11-01T00:00:00+00:00"},
             "03": {"date": None}}
    assert C.priority(["00", "01", "02", "03", "04"], index) == ["01", "03", "04", "02", "00"]


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _fake_runner(clock, durations, device="NVIDIA H200"):
    def run(nb, work, profile, limit_s, log=print):
        took = durations[nb]
        results = work / "run" / "results"
        results.mkdir(parents=True)
        if took > limit_s:
            clock.t += limit_s
            return "stopped", "stopped"
        clock.t += took
        (results / f"rec{nb}.json").write_text(json.dumps({"name": f"rec{nb}", "device": device, "metrics": {"x": 1}}))
        (work / f"{nb}_nb.ipynb").write_text("{}")
        return "ok", ""
    return run


def test_budget_skips_what_cannot_fit_and_stops_what_overruns(tmp_path):
    clock = FakeClock()
    estimates = {"00": (30.0, ""), "01": (500.0, ""), "02": (40.0, ""), "03": (20.0, "")}
    runner = _fake_runner(clock, {"00": 30.0, "01": 1.0, "02": 200.0, "03": 5.0})
    lines = []
    out = C.capture(["00", "01", "02", "03"], tmp_path / "out", 150.0, estimates=estimates, runner=runner,
                    clock=clock, log=lines.append, margin_s=10.0, work=tmp_path / "work")
    assert [(o.notebook, o.status) for o in out] == [("00", "ok"), ("01", "skipped"), ("02", "stopped"),
                                                     ("03", "skipped")]
    assert clock.t <= 150.0 - 10.0  # ended inside the budget, margin kept
    assert "estimated 500 s > 110 s left" in out[1].note
    assert any("00: ok in 30.0 s (30 s estimated)" in line for line in lines)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["capture-1.tgz"]  # only packs come back


def test_each_finished_notebook_is_packed_at_once_and_packs_roll_over(tmp_path):
    clock = FakeClock()
    packs_seen = []

    def runner(nb, work, profile, limit_s, log=print):
        results = work / "run" / "results"
        results.mkdir(parents=True)
        packs_seen.append(sorted(p.name for p in (tmp_path / "out").glob("*.tgz")))
        (results / f"rec{nb}.json").write_text(json.dumps({"name": f"rec{nb}", "device": "GPU X"}))
        (work / "big.log").write_bytes(b"x" * 3000)
        return "ok", ""

    outcomes = C.capture(["00", "01", "02"], tmp_path / "out", 1e6, runner=runner, clock=clock, log=lambda s: None,
                         work=tmp_path / "work", estimates={})
    assert [o.records for o in outcomes] == [["rec00"], ["rec01"], ["rec02"]]
    assert packs_seen == [[], ["capture-1.tgz"], ["capture-1.tgz"]]  # written before the next notebook starts
    with tarfile.open(tmp_path / "out" / "capture-1.tgz") as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))
    assert {"00/results/rec00.json", "02/results/rec02.json", "01/big.log"} <= set(names)
    assert list(manifest["notebooks"]) == ["00", "01", "02"]
    packer = C.Packer(tmp_path / "p", tmp_path / "w", limit=4000)
    (tmp_path / "p").mkdir(), (tmp_path / "w").mkdir()
    f = tmp_path / "w" / "f"
    f.write_bytes(b"y" * 3000)
    assert packer.add([(f, "a/f")], {}).name == "capture-1.tgz"
    assert packer.add([(f, "b/f")], {}).name == "capture-2.tgz"  # would have passed the limit


def test_import_writes_the_reference_folder(tmp_path):
    clock = FakeClock()
    runner = _fake_runner(clock, {"00": 3.0, "01": 4.0})
    C.capture(["00", "01"], tmp_path / "out", 1e6, runner=runner, clock=clock, log=lambda s: None,
              work=tmp_path / "work", estimates={"00": (5.0, "")})
    target = C.import_packs(sorted((tmp_path / "out").glob("*.tgz")), tmp_path / "results")
    assert target == tmp_path / "results" / "nvidia-h200"
    assert sorted(p.name for p in target.iterdir()) == ["README.md", "capture.json", "rec00.json", "rec01.json"]
    index = json.loads((target / "capture.json").read_text())
    assert index["notebooks"]["00"]["records"] == ["rec00"] and index["notebooks"]["00"]["estimate_s"] == 5.0
    readme = (target / "README.md").read_text()
    assert "Reference: NVIDIA H200" in readme and "torch" in readme and "driver" in readme
    assert C.priority(["00", "01", "02"], C.load_index(target))[0] == "02"
    # a smoke pass's table, written into the README by its own import, outlives the next capture's import
    (target / "README.md").write_text(readme + f"\n{C.SMOKE_MARK}\n## The smoke pass on this GPU\n\nplanted\n")
    C.import_packs(sorted((tmp_path / "out").glob("*.tgz")), tmp_path / "results")
    again = (target / "README.md").read_text()
    assert again.startswith("# Reference: NVIDIA H200") and again.count(C.SMOKE_MARK) == 1 and "planted" in again


def test_import_refuses_what_is_not_a_capture(tmp_path):
    bad = tmp_path / "x.tgz"
    with tarfile.open(bad, "w:gz"):
        pass
    with pytest.raises(ValueError, match="no manifest"):
        C.import_packs([bad], tmp_path)
    assert C.main(["import", str(tmp_path / "missing.tgz")]) == 2


def test_plan_and_bad_arguments(capsys):
    assert C.main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "total" in out and "06:" in out
    assert C.main(["plan", "99"]) == 2
    assert C.main(["run", "--out", "/tmp/x", "--budget-s", "5"]) == 2


def test_every_notebook_has_an_estimate_and_each_fits_one_call():
    notebooks = C.available_notebooks()
    assert set(notebooks) <= set(C.ESTIMATES)
    assert all(C.ESTIMATES[nb][0] <= 540 - C.MARGIN_S for nb in notebooks)  # the default budget of one call


FULL_PROFILE_LIMIT_S = 150.0  # every notebook's full profile within 150 s on one H200, compile time included


@pytest.mark.parametrize("nb", C.available_notebooks())
def test_every_notebook_has_a_stated_estimate_within_the_limit(nb):
    est, basis = C.ESTIMATES[nb]
    assert basis.strip(), f"notebook {nb}'s estimate states no basis"
    assert 0 < est <= FULL_PROFILE_LIMIT_S, f"notebook {nb}: {est:.0f} s estimated, above {FULL_PROFILE_LIMIT_S:.0f} s"


def test_every_measured_notebook_is_estimated_within_the_limit_of_its_measured_seconds():
    index = json.loads((C.ESTIMATED_ON / "capture.json").read_text())["notebooks"]
    measured = {nb: info["seconds"] for nb, info in index.items() if info.get("seconds")}
    assert measured  # the reference folder holds a capture's times
    checked = C.against_measured(C.load_index(C.ESTIMATED_ON))
    for nb, seconds in measured.items():
        assert checked[nb]["measured_s"] == seconds
        est = C.ESTIMATES[nb][0]
        assert abs(est / seconds - 1) <= C.OFF_LIMIT, f"notebook {nb}: {est:.0f} s estimated, {seconds:.1f} s measured"
        assert not checked[nb]["flagged"]


def test_plan_prints_the_measured_seconds_beside_each_estimate_and_flags_one_far_off(tmp_path, monkeypatch, capsys):
    (tmp_path / "capture.json").write_text(json.dumps({"notebooks": {
        "00": {"date": "2026-11-30T23:42:37+00:00", "seconds": 20.0},    # estimated within 30%
        "01": {"date": "2026-11-30T23:42:37+00:00", "seconds": 100.0}}}))  # estimated far below
    estimates = {"00": (25.0, "counted"), "01": (20.0, "counted"), "02": (50.0, "counted")}
    monkeypatch.setattr(C, "ESTIMATED_ON", tmp_path)
    monkeypatch.setattr(C, "ESTIMATES", estimates)
    checked = C.against_measured(C.load_index(tmp_path))
    assert checked["00"]["off"] == pytest.approx(0.25) and not checked["00"]["flagged"]
    assert checked["01"]["off"] == pytest.approx(-0.8) and checked["01"]["flagged"]
    assert checked["02"]["measured_s"] is None and not checked["02"]["flagged"]
    assert C.main(["plan", "00", "01", "02", "--references", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    by_nb = {line[:2]: line for line in lines[:-1]}
    assert "25 s estimated, 20.0 s measured" in by_nb["00"] and "+25%" in by_nb["00"] and "OFF" not in by_nb["00"]
    assert "20 s estimated, 100.0 s measured" in by_nb["01"] and "-80%" in by_nb["01"] and "OFF BY MORE" in by_nb["01"]
    assert "50 s estimated, not measured yet" in by_nb["02"]
    total = next(line for line in lines if line.startswith("total"))
    assert total.startswith("total 95 s") and total.endswith(": 01")
    assert lines[-1].startswith("left for a later window") or lines[-1].startswith("every notebook")


def test_the_call_plan_takes_what_fits_in_order_and_skips_what_does_not():
    est = {"a": (40.0, ""), "b": (70.0, ""), "c": (30.0, ""), "d": (60.0, "")}
    calls, left = C.call_plan(["a", "b", "c", "d", "e"], est, [100.0, 95.0], margin_s=10.0)
    assert calls == [["a", "c"], ["b"]]  # 90 s: a, then c (b does not fit); 85 s: b, then d does not fit
    assert left == ["d", "e"]  # e has no estimate: never started
    lines = C.call_plan_lines(["a", "b"], est, (("first", 70.0), ("second", 100.0)))  # less 25 s each
    assert lines[0] == "first (70 s for references): a, 40 s estimated"
    assert lines[1] == "second (100 s for references): b, 70 s estimated"
    assert lines[-1] == "every notebook above is captured in these 2 calls"
    assert C.call_plan_lines(["b"], est, (("only", 50.0),))[-1] == "left for a later window: b"


def test_the_whole_course_fits_its_limit_and_two_windows_capture_what_has_no_reference():
    assert sum(est for est, _ in C.ESTIMATES.values()) <= C.COURSE_LIMIT_S
    order = C.priority(C.available_notebooks(), C.load_index(C.ESTIMATED_ON))
    missing = [nb for nb in order if not C.load_index(C.ESTIMATED_ON).get(nb, {}).get("date")]
    calls, left = C.call_plan(order, C.ESTIMATES, [b for _, b in C.CALLS])
    assert not set(missing) & set(left), f"no call of the two windows takes {sorted(set(missing) & set(left))}"


@pytest.mark.notebook
def test_a_real_run_is_stopped_at_its_limit_and_leaves_no_process(tmp_path):
    import os
    import time

    folder = tmp_path / "nbs"
    folder.mkdir()
    tiny_notebook(folder / "00_quick.ipynb", "import json, pathlib\n"
                   "pathlib.Path(RESULTS_DIR, 'quick.json').write_text(json.dumps({'name': 'quick', 'device': 'cpu'}))")
    tiny_notebook(folder / "01_slow.ipynb", "import os, pathlib, time\n"
                   "pathlib.Path(RESULTS_DIR, 'pid').write_text(str(os.getpid()))\ntime.sleep(600)")
    for nb in ("00", "01"):
        (tmp_path / nb).mkdir()
    status, _ = C.run_notebook("00", tmp_path / "00", "smoke", 120, notebooks_dir=folder)
    assert status == "ok" and [p.name for p in C._records(tmp_path / "00")] == ["quick.json"]
    t0 = time.monotonic()
    status, note = C.run_notebook("01", tmp_path / "01", "smoke", 45, notebooks_dir=folder)
    assert status == "stopped" and time.monotonic() - t0 < 90
    kernel = int(next((tmp_path / "01").rglob("results/pid")).read_text())
    time.sleep(1)
    with pytest.raises(ProcessLookupError):
        os.kill(kernel, 0)  # the notebook's kernel went with its runner


class _Signalled:
    """A stand-in for processes.Stop whose signal comes while notebook `at` runs."""

    def __init__(self):
        self.why, self.signum = "", 0


def test_a_signal_packs_what_finished_and_marks_the_rest_not_run(tmp_path):
    clock, stop = FakeClock(), _Signalled()
    inner = _fake_runner(clock, {"00": 3.0, "01": 4.0, "02": 5.0})

    def runner(nb, work, profile, limit_s, log=print):
        status = inner(nb, work, profile, limit_s, log)
        if nb == "01":
            stop.why, stop.signum = "SIGTERM", 15
            return "interrupted", "interrupted by SIGTERM; see run.log"
        return status
    out = C.capture(["00", "01", "02"], tmp_path / "out", 1e6, runner=runner, clock=clock, log=lambda s: None,
                    work=tmp_path / "work", estimates={}, stop=stop)
    assert [(o.notebook, o.status) for o in out] == [("00", "ok"), ("01", "interrupted"), ("02", "not run")]
    assert out[2].note == "not run (SIGTERM)"
    with tarfile.open(tmp_path / "out" / "capture-1.tgz") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert {nb: v["status"] for nb, v in manifest["notebooks"].items()} == {"00": "ok", "01": "interrupted",
                                                                           "02": "not run"}


def _pack(tmp_path):
    clock = FakeClock()
    C.capture(["00"], tmp_path / "out", 1e6, runner=_fake_runner(clock, {"00": 1.0}), clock=clock,
              log=lambda s: None, work=tmp_path / "work", estimates={})
    return tmp_path / "out" / "capture-1.tgz"


@pytest.mark.parametrize("damage", ["truncated", "not gzip", "empty", "torn record", "torn manifest"])
def test_a_damaged_pack_is_one_line_and_nothing_is_imported(tmp_path, capsys, damage):
    import gzip
    import io

    good = _pack(tmp_path)
    bad = tmp_path / "bad.tgz"
    data = good.read_bytes()
    if damage == "truncated":
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "not gzip":
        bad.write_bytes(gzip.decompress(data))  # a plain tar
    elif damage == "empty":
        bad.write_bytes(b"")
    else:
        name = "00/results/rec00.json" if damage == "torn record" else "manifest.json"
        buf = io.BytesIO()
        with tarfile.open(good) as src, tarfile.open(fileobj=buf, mode="w:gz") as dst:
            for m in src.getmembers():
                body = src.extractfile(m).read()
                body = body[: len(body) // 2] if m.name == name else body
                m.size = len(body)
                dst.addfile(m, io.BytesIO(body))
        bad.write_bytes(buf.getvalue())
    (tmp_path / "goals.json").write_text(json.dumps({"goals": [], "machine": {"gpu": "NVIDIA H200"}}))
    into = tmp_path / "results"
    assert C.main(["import", str(good), str(bad), "--into", str(into)]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and str(bad) in out and "Traceback" not in out, out
    assert not into.exists() or not any(into.rglob("*")), sorted(into.rglob("*"))  # nothing half-written


@pytest.mark.parametrize("budget", ["nan", "inf", "0", "-1", "soon"])
def test_a_bad_budget_is_one_line(tmp_path, capsys, budget):
    for command in ("plan", "run"):
        extra = ["--out", str(tmp_path / "out")] if command == "run" else []
        with pytest.raises(SystemExit) as exit_:
            C.main([command, *extra, f"--budget-s={budget}"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and budget in err and "--budget-s" in err, err
    assert not (tmp_path / "out").exists()


def test_an_unwritable_out_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder under a regular file cannot be made, even by root
    assert C.main(["run", "--out", str(blocker / "out"), "00"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "--out" in captured.err and str(blocker) in captured.err
    assert "Traceback" not in captured.err + captured.out


@pytest.mark.notebook
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_runner_its_worker_and_kernel_and_packs_what_finished(tmp_path, sig):
    folder = tmp_path / "nbs"
    folder.mkdir()
    marker = tmp_path / "kernel.pid"
    tiny_notebook(folder / "00_quick.ipynb", "import json, pathlib\n"
                   "pathlib.Path(RESULTS_DIR, 'quick.json').write_text(json.dumps({'name': 'quick', 'device': 'cpu'}))")
    tiny_notebook(folder / "01_slow.ipynb", f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n"
                   "time.sleep(600)")
    tiny_notebook(folder / "02_later.ipynb", "x = 1")
    out, refs = tmp_path / "out", tmp_path / "refs"
    refs.mkdir()
    cmd = [sys.executable, "-m", "tools.capture.capture", "run", "--out", str(out), "--profile", "smoke",
           "--references", str(refs), "--notebooks-dir", str(folder), "--budget-s", "500"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the capture's run folders, removed with tmp_path
    main = subprocess.Popen(cmd, cwd=C.REPO_ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    below = []
    try:
        deadline = time.monotonic() + 240
        while not (marker.exists() and marker.read_text()) and main.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "the slow notebook's kernel never started"
        below = psutil.Process(main.pid).children(recursive=True)  # runner, worker, kernel, ...
        kernel = psutil.Process(int(marker.read_text()))
        main.send_signal(sig)  # to the capture alone, as a supervisor or Ctrl-C's handler would
        text, _ = main.communicate(timeout=90)
        alive = psutil.wait_procs(below, timeout=10)[1]
    finally:  # whatever happened above, nothing this test started stays
        if main.poll() is None:
            main.kill()
            main.wait()
        for p in below:
            try:
                p.kill()
            except psutil.Error:
                pass
    assert main.returncode == 128 + sig, text
    assert len(below) >= 3 and kernel.pid in {p.pid for p in below}
    assert not alive, f"outlived the capture: {alive}"
    assert "Traceback" not in text and f"{signal.Signals(sig).name} received" in text
    summary = {ln.split()[0]: ln.split()[1] for ln in text.splitlines() if ln[:3] in ("00 ", "01 ", "02 ")}
    assert summary == {"00": "ok", "01": "interrupted", "02": "not"}  # the closing table: 02 "not run"
    with tarfile.open(out / "capture-1.tgz") as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))
    assert {nb: v["status"] for nb, v in manifest["notebooks"].items()} == {"00": "ok", "01": "interrupted",
                                                                           "02": "not run"}
    assert "00/results/quick.json" in names and any(n.startswith("01/") and n.endswith("01_slow.ipynb") for n in names)


def _edited(good, tmp_path, edit_manifest=None, edit_record=None, rename=None):
    """A copy of pack `good` whose manifest, record or member names went through the given edits."""
    import io

    buf = io.BytesIO()
    with tarfile.open(good) as src, tarfile.open(fileobj=buf, mode="w:gz") as dst:
        for m in src.getmembers():
            body = src.extractfile(m).read()
            if m.name == "manifest.json" and edit_manifest:
                doc = json.loads(body)
                edit_manifest(doc)
                body = json.dumps(doc).encode()
            elif "/results/" in m.name and edit_record:
                doc = json.loads(body)
                edit_record(doc)
                body = json.dumps(doc).encode()
            if rename and m.name in rename:
                m.name = rename[m.name]
            m.size = len(body)
            dst.addfile(m, io.BytesIO(body))
    bad = tmp_path / "edited.tgz"
    bad.write_bytes(buf.getvalue())
    return bad


def _set_records(names):
    return lambda doc: doc["notebooks"]["00"].update(records=names)


@pytest.mark.parametrize("case", ["record up two folders", "absolute record", "no seconds", "no started",
                                  "a device with no letter", "a record named like the index", "a notebook name"])
def test_an_import_writes_and_deletes_only_inside_its_folder_and_checks_everything_first(tmp_path, capsys, case):
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    edits = {"record up two folders": dict(edit_manifest=_set_records(["../../victim"])),
             "absolute record": dict(edit_manifest=_set_records([str(tmp_path / "victim")])),
             "no seconds": dict(edit_manifest=lambda d: d["notebooks"]["00"].pop("seconds")),
             "no started": dict(edit_manifest=lambda d: d.pop("started")),
             "a device with no letter": dict(edit_record=lambda d: d.update(device="!!!")),
             "a record named like the index": dict(rename={"00/results/rec00.json": "00/results/capture.json"}),
             "a notebook name": dict(edit_manifest=lambda d: d["notebooks"].update({"../x": {"status": "ok"}}))}
    bad = _edited(_pack(tmp_path), tmp_path, **edits[case])
    into = tmp_path / "results"
    assert C.main(["import", str(bad), "--into", str(into)]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "Traceback" not in out, out
    assert victim.read_text() == "{}" and (not into.exists() or not any(into.rglob("*"))), sorted(into.rglob("*"))


def test_an_edited_index_cannot_make_an_import_delete_outside_its_folder(tmp_path, capsys):
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    target = tmp_path / "results" / "nvidia-h200"
    target.mkdir(parents=True)
    (target / "capture.json").write_text(json.dumps({"notebooks": {"00": {"records": ["../../victim"]}}}))
    assert C.main(["import", str(_pack(tmp_path)), "--into", str(tmp_path / "results")]) == 1
    assert "not a record name" in capsys.readouterr().out and victim.exists()
    assert sorted(p.name for p in target.iterdir()) == ["capture.json"]


def test_a_missing_pack_is_called_missing(tmp_path):
    with pytest.raises(C.BadPack, match="no such file"):
        C.read_pack(tmp_path / "nowhere.tgz")
