import base64
import json

import pytest

from helpers.course import report, report_picture

FIGURE = "figures/course-in-one-picture.png"


def _write(folder, name, metrics, device, profile):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(
        {"name": name, "metrics": metrics, "device": device, "profile": profile, "date": "2026-12-01T10:00:00"}))


def _train(rows):
    """A capstone_training_ladder record's metrics, rows as (rung, step_ms, q25_ms, q75_ms, tokens/s, cumulative)."""
    return {"model": "tiny", "batch": 4, "seq_len": 64, "steps": 8, "warmup": 2, "micro_batches": 1,
            "interleaved": True, "left_out": {"tf32": "no CUDA"}, "alone_vs_stack": [],
            "rungs": [{"rung": n, "step_ms": t, "q25_ms": a, "q75_ms": b, "tokens_per_s": tps, "mfu": None, "loss": 5.0,
                       "loss_gap": 0.0, "gain": None if i == 0 else 1.1, "cumulative": c}
                      for i, (n, t, a, b, tps, c) in enumerate(rows)]}


def _serve(rows):
    """A capstone_serving_ladder record's metrics, rows as (rung, base, ms/token, q25, q75, tokens/s, cumulative)."""
    return {"model": "pretrained", "prompt_len": 32, "new_tokens": 16, "left_out": {},
            "rungs": [{"rung": n, "base": base, "ms_per_token": t, "q25_ms_per_token": a, "q75_ms_per_token": b,
                       "tokens_per_s": tps, "gbps": None, "gain": None if base is None else 1.2, "cumulative": c}
                      for n, base, t, a, b, tps, c in rows],
            "batching": {"speedup": 2.0, "lo": 1.8, "hi": 2.2, "separated": True}}


MINE_TRAIN = _train([("baseline", 100, 95, 110, 1000, 1.0), ("bf16", 80, 78, 84, 1250, 1.25),
                     ("sdpa", 50, 48, 52, 2000, 2.0)])
H200_TRAIN = _train([("baseline", 10, 9.8, 10.4, 1e5, 1.0), ("tf32", 5, 4.9, 5.2, 2e5, 2.0),
                     ("bf16", 2, 1.9, 2.1, 5e5, 5.0), ("sdpa", 1, 0.95, 1.1, 1e6, 10.0)])
MINE_SERVE = _serve([("baseline", None, 20, 19, 22, 50, 1.0), ("kv_cache", "baseline", 10, 9.5, 11, 100, 2.0),
                     ("bf16", "kv_cache", 8, 7.5, 9, 125, 2.5), ("speculative", "bf16", 5, 4.8, 5.5, 200, 4.0),
                     ("int8", "bf16", 6, 5.5, 7, 1000 / 6, 20 / 6)])


def _run(tmp_path, train=MINE_TRAIN, serve=MINE_SERVE, ref_train=H200_TRAIN):
    run_dir, refs = tmp_path / "run", tmp_path / "refs"
    (run_dir / "results").mkdir(parents=True)
    if train is not None:
        _write(run_dir / "results", "capstone_training_ladder", train, "CPU: fixture", "smoke")
    if serve is not None:
        _write(run_dir / "results", "capstone_serving_ladder", serve, "CPU: fixture", "smoke")
    if ref_train is not None:
        _write(refs / "nvidia-h200", "capstone_training_ladder", ref_train, "NVIDIA H200", "full")
    return run_dir, refs


def _section(text):
    start = text.index("## " + report_picture.TITLE)
    return text[start:text.index("\n## ", start + 3)]


@pytest.mark.slow
def test_the_picture_opens_the_report_with_one_sentence_per_ladder(tmp_path):
    run_dir, refs = _run(tmp_path)
    md, page = report.write_report(run_dir, [], refs, profile="smoke")
    text = md.read_text()
    assert [ln for ln in text.splitlines() if ln.startswith("## ")][0] == "## The course in one picture"
    section = _section(text)
    assert f"]({FIGURE})" in section and "this run beside nvidia-h200" in section
    png = (run_dir / FIGURE).read_bytes()
    assert png.startswith(b"\x89PNG")
    assert base64.b64encode(png).decode() in page.read_text()  # embedded in the HTML page too
    assert ("Training: the whole ladder (2 techniques stacked, up to sdpa) 2.00x (IQR-bounded 1.83-2.29x) over the "
            "fp32 eager baseline on CPU: fixture (smoke); on NVIDIA H200 (full, results/nvidia-h200/), the whole "
            "ladder (3 techniques stacked, up to sdpa) 10.00x (IQR-bounded 8.91-10.95x).") in section
    # the serving rungs branch: its headline is its fastest rung (not its last), and no reference holds it
    assert ("Serving at batch 1: the fastest rung by median (speculative, on bf16) 4.00x (IQR-bounded 3.45-4.58x) "
            "over the fp32 eager baseline without a KV cache on CPU: fixture (smoke); no reference GPU in "
            "results/<gpu>/ holds this ladder yet.") in section
    assert "## Files the report could not read" not in text


def _bars(ax):
    from matplotlib.container import BarContainer

    return [c for c in ax.containers if isinstance(c, BarContainer)]


def test_reference_bars_appear_beside_this_runs_only_where_a_reference_holds_the_ladder(tmp_path):
    run_dir, refs = _run(tmp_path)
    problems = []
    drawn = report_picture.panels(report._by_name(report.read_records(run_dir / "results")[0]),
                                  report.reference_sets(refs, problems), problems)
    assert not problems and [ladder.record for ladder, _ in drawn] == ["capstone_training_ladder",
                                                                       "capstone_serving_ladder"]
    train, serve = report_picture.draw(drawn).axes
    mine, h200 = _bars(train)
    assert [mine.get_label(), h200.get_label()] == ["this run: CPU: fixture (smoke)", "nvidia-h200: NVIDIA H200 (full)"]
    # rungs matched by name, in ladder order; tf32 (only the H200 ran it) has the reference's bar alone
    assert [t.get_text() for t in train.get_xticklabels()] == ["baseline", "tf32", "bf16", "sdpa"]
    assert [round(p.get_x() + p.get_width() / 2, 2) for p in mine.patches] == [-0.2, 1.8, 2.8]
    assert [round(p.get_x() + p.get_width() / 2, 2) for p in h200.patches] == [0.2, 1.2, 2.2, 3.2]
    assert [p.get_height() for p in mine.patches] == [1000, 1250, 2000]
    # the error bar runs from tokens/s * median / q75 to tokens/s * median / q25: baseline 909.1 to 1052.6
    (lo, hi), = [s[:, 1] for s in mine.errorbar.lines[2][0].get_segments()[:1]]
    assert (round(lo, 1), round(hi, 1)) == (909.1, 1052.6)
    assert {"1.00x", "1.25x", "2.00x", "10.00x"} <= {t.get_text() for t in train.texts}
    assert train.get_yscale() == "log"  # CPU and H200 bars span three decades
    (alone,) = _bars(serve)  # no reference holds the serving ladder
    assert len(alone.patches) == 5 and serve.get_yscale() == "linear"
    assert [t.get_text() for t in serve.get_xticklabels()][3] == "speculative\n(on bf16)"

    _run(tmp_path / "no-ref", ref_train=None)
    text = report.write_report(tmp_path / "no-ref" / "run", [], tmp_path / "no-ref" / "refs")[0].read_text()
    assert "this run alone (no reference GPU holds these ladders)" in text and "results/nvidia-h200/" not in text


def test_without_notebook_14_the_section_is_one_line_and_draws_nothing(tmp_path):
    run_dir, refs = _run(tmp_path, train=None, serve=None)  # a reference holds a ladder; this run none
    text = report.write_report(run_dir, [], refs)[0].read_text()
    lines = [ln for ln in _section(text).splitlines()[1:] if ln.strip()]
    assert lines == ["This run has no ladder from notebook 14 (the capstone) to draw; run it to see every technique of "
                     "the course stacked on one training run and one server, rung by rung."]
    assert not (run_dir / FIGURE).exists() and "course-in-one-picture" not in text


def test_a_ladder_that_cannot_be_drawn_is_named_and_the_other_is_drawn(tmp_path):
    torn = json.loads(json.dumps(MINE_TRAIN))
    del torn["rungs"][1]["q75_ms"]
    bad_ref = _serve([("baseline", None, 20, 25, 22, 50, 1.0)])  # q25 above the median
    run_dir, refs = _run(tmp_path, train=torn)
    _write(refs / "nvidia-h200", "capstone_serving_ladder", bad_ref, "NVIDIA H200", "full")
    text = report.write_report(run_dir, [], refs)[0].read_text()
    section = _section(text)
    assert "Training: this run's record cannot be drawn (see the files the report could not read)." in section
    assert "Serving at batch 1: the fastest rung by median (speculative, on bf16)" in section
    assert "no reference GPU in results/<gpu>/ holds this ladder yet" in section  # the torn reference is left out
    unreadable = text[text.index("## Files the report could not read"):]
    assert "results/capstone_training_ladder.json | a capstone_training_ladder record without rungs" in unreadable
    assert "nvidia-h200/capstone_serving_ladder.json | a capstone_serving_ladder record without rungs" in unreadable
    assert (run_dir / FIGURE).read_bytes().startswith(b"\x89PNG")


def test_rung_order_places_a_rung_one_run_lacks_after_the_rung_it_follows():
    S = report_picture.Series
    a = S("this run", "cpu", "smoke", [{"rung": n} for n in ("baseline", "bf16", "compile")])
    b = S("gpu", "gpu", "full", [{"rung": n} for n in ("baseline", "tf32", "bf16", "fp8", "compile", "checkpoint")])
    c = S("gpu2", "gpu", "full", [{"rung": n} for n in ("pre", "baseline")])
    assert report_picture.rung_order([a, b, c]) == ["pre", "baseline", "tf32", "bf16", "fp8", "compile", "checkpoint"]
