import json
import os

import pytest
import torch

from helpers.measure import results


def test_record_then_load_round_trips(results_tmp):
    metrics = {"tflops": 1.5, "sizes": [1, 2, 3], "nested": {"a": 1}, "t": torch.tensor([1.0, 2.0]),
               "dtype": torch.bfloat16, "inf": float("inf")}
    results.record("demo", metrics, dtype=torch.float16)
    back = results.load_results(results_tmp)
    assert list(back) == ["demo"]
    rec = back["demo"]
    assert rec["metrics"]["tflops"] == 1.5
    assert rec["metrics"]["sizes"] == [1, 2, 3]
    assert rec["metrics"]["nested"] == {"a": 1}
    assert rec["metrics"]["t"] == [1.0, 2.0]
    assert rec["metrics"]["dtype"] == "torch.bfloat16"
    assert rec["metrics"]["inf"] == "inf"
    assert rec["dtype"] == "float16" and rec["profile"] == "smoke"
    assert rec["versions"]["torch"] == torch.__version__
    assert rec["device"] and rec["date"][:4].isdigit()


def test_record_is_atomic_on_failure(results_tmp, monkeypatch):
    results.record("keep", {"v": 1})

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        results.record("keep", {"v": 2})
    assert sorted(p.name for p in results_tmp.iterdir()) == ["keep.json"]  # no temp file left behind
    assert json.loads((results_tmp / "keep.json").read_text())["metrics"] == {"v": 1}


def test_record_rejects_path_names(results_tmp):
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            results.record(bad, {})


def test_load_results_of_missing_folder_is_empty(tmp_path):
    assert results.load_results(tmp_path / "nope") == {}


def test_device_slug_is_folder_safe():
    slug = results.device_slug()
    assert slug and all(c.isalnum() or c == "-" for c in slug)
    assert results.slug("NVIDIA H200") == "nvidia-h200"
    assert results.slug(" Tesla  T4 / PCIe (x) ") == "tesla-t4-pcie-x"  # every run of separators is one '-'


FIXTURES = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures"


def test_record_refuses_metrics_the_report_cannot_show(results_tmp):
    for bad in (None, [1, 2], 3.5, "fast"):
        with pytest.raises(TypeError, match="metrics must be a dict"):
            results.record("x", bad)
    assert list(results_tmp.iterdir()) == []  # refused before anything was written


def test_read_records_names_every_unreadable_file_and_drops_none():
    good, bad = results.read_records(FIXTURES / "bad_results")
    assert sorted(p.name for p, _ in good) == ["twin-copy.json", "twin.json"]
    reasons = {p.name: r for p, r in bad}
    assert set(reasons) == {"torn.json", "empty.json", "list.json", "none_metrics.json"}
    assert "torn or invalid JSON" in reasons["torn.json"] and reasons["empty.json"] == "empty file"
    assert "JSON list" in reasons["list.json"] and "'metrics' is NoneType" in reasons["none_metrics.json"]


def test_load_results_keeps_both_records_of_one_name_and_warns_on_bad_files():
    with pytest.warns(UserWarning) as warned:
        loaded = results.load_results(FIXTURES / "bad_results")
    assert sorted(str(w.message).split(":")[0].rsplit("/", 1)[1] for w in warned) == [
        "empty.json", "list.json", "none_metrics.json", "torn.json"]  # each bad file named once
    assert loaded["twin"]["metrics"] == {"value": 1}  # the file named after the record keeps the name
    assert loaded["twin [twin-copy.json]"]["metrics"] == {"value": 2}


def test_write_atomic_keeps_the_old_file_when_the_disk_is_full(tmp_path, monkeypatch):
    import errno

    target = results.write_atomic(tmp_path / "a.txt", "old")
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            self.fh.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    with pytest.raises(OSError) as err:
        results.write_atomic(target, "new and longer")
    assert err.value.filename == str(target) and err.value.errno == errno.ENOSPC
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_write_atomic_gives_files_the_usual_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        path = results.write_atomic(tmp_path / "r.json", "{}")
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644  # readable by others, as open() would make it


def test_write_atomic_sets_the_mode_asked_for_whatever_the_umask(tmp_path):
    umask = os.umask(0o077)
    try:
        path = results.write_atomic(tmp_path / "p.tgz", b"x", mode=0o644)
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644 and path.read_bytes() == b"x"


def test_runs_go_to_the_clone_or_to_the_working_folder_of_an_installed_course(tmp_path, monkeypatch):
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "pyproject.toml").write_text("[project]\n")
    assert results.runs_root(clone) == clone / "runs"
    installed = tmp_path / "site-packages"   # no pyproject.toml beside an installed package
    installed.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert results.runs_root(installed) == work / "runs"
    assert results.runs_root() == results.REPO_ROOT / "runs"   # this clone
