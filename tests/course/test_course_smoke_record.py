"""helpers.course.smoke_record: a reference GPU's gpu-smoke.json, read for the report, one sentence per notebook."""
import json

from helpers.course import smoke_record

DOC = {"started": "2026-12-01T10:00:00+00:00", "notebooks": {
    "00": {"status": "ok", "seconds": 12.4, "cell": None, "error": ""},
    "07": {"status": "failed", "seconds": 30.0, "cell": 14, "error": "RuntimeError: refused\nsecond line"},
    "08": {"status": "interrupted", "seconds": 0.0, "cell": None, "error": ""}}}


def test_load_reads_the_record_and_refuses_what_is_absent_torn_or_foreign(tmp_path):
    assert smoke_record.load(tmp_path) is None
    (tmp_path / smoke_record.SMOKE_FILE).write_text("{torn")
    assert smoke_record.load(tmp_path) is None
    (tmp_path / smoke_record.SMOKE_FILE).write_text(json.dumps({"notebooks": ["00"]}))
    assert smoke_record.load(tmp_path) is None
    (tmp_path / smoke_record.SMOKE_FILE).write_text(json.dumps(DOC))
    assert smoke_record.load(tmp_path) == DOC
    assert smoke_record.SMOKE_FILE == "gpu-smoke.json"


def test_one_sentence_per_notebook_ok_failed_with_its_cell_or_not_in_the_pass():
    line = smoke_record.line_for
    assert line("00", DOC, "nvidia-h200") == "Ran on nvidia-h200 in the smoke profile on 2026-12-01: every cell ran (12 s)."
    assert line("07", DOC, "nvidia-h200") == "Smoke pass on nvidia-h200 (2026-12-01): failed at cell 14: RuntimeError: refused."
    assert line("08", DOC, "nvidia-h200") == "Smoke pass on nvidia-h200 (2026-12-01): interrupted."
    assert line("09", DOC, "nvidia-h200") == "Not in the smoke pass on nvidia-h200 (2026-12-01)."
    assert line("00", None, "nvidia-h200") is None


def test_a_malformed_record_is_cleaned_or_named_and_a_torn_one_is_listed(tmp_path):
    problems = []
    (tmp_path / smoke_record.SMOKE_FILE).write_text("{torn")
    assert smoke_record.load(tmp_path, problems) is None
    assert problems and "not readable as JSON" in problems[0][1]
    odd = {"started": None, "gpu": "a string", "notebooks": {"00": {"status": "ok", "seconds": None},
                                                               "01": "ok", "02": {"status": 3, "seconds": "x"}}}
    (tmp_path / smoke_record.SMOKE_FILE).write_text(json.dumps(odd))
    problems = []
    doc = smoke_record.load(tmp_path, problems)
    assert sorted(doc["notebooks"]) == ["00", "02"] and "notebook '01'" in problems[0][1]
    assert smoke_record.line_for("00", doc, "gpu") == "Ran on gpu in the smoke profile on ?: every cell ran."
    assert smoke_record.line_for("02", doc, "gpu") == "Smoke pass on gpu (?): 3."
