import json
import os

import pytest
import torch

from helpers import results


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
