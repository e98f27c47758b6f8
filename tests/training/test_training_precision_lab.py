"""helpers.training.precision_lab: notebook 03's gradient samples, range panel and bands, the static
scaling sweep and its sentence, the scalers compared on the course GPT, and notebook 03's parameters."""
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.patches import Polygon, Rectangle

from helpers.gpt.model import GPT, GPTConfig
from helpers.measure import bench
from helpers.training import precision, precision_lab


def _tiny_model():
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", n_layer=1, seq_len=16))


def test_gradient_samples_and_range_panel(capsys):
    base = _tiny_model()
    x, y = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    samples = precision_lab.gradient_samples(base, x, y)
    assert samples["weight gradients"].numel() == sum(p.numel() for p in base.parameters())
    assert (samples["activation gradients"] >= 0).all()
    fig = precision_lab.range_panel("fp16", "activation gradients", 0, samples=samples)
    low = capsys.readouterr().out
    precision_lab.range_panel("fp16", "activation gradients", 16, samples=samples)
    high = capsys.readouterr().out
    underflow = lambda text: float(text.split(": ")[1].split("%")[0])  # noqa: E731
    assert underflow(high) <= underflow(low) and "2^16" in high
    assert fig.axes[0].get_title() == "activation gradients × 2^0 in fp16"
    with pytest.raises(ValueError, match="distribution"):
        precision_lab.range_panel("fp16", "weights", samples=samples)
    assert len(precision_lab.bit_layout_figure().axes[0].patches) == 3 * len(precision.FORMATS)
    plt.close("all")


def test_interleaved_timings_and_thin():
    calls = []
    t = bench.benchmark_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                    reps=3, device="cpu")
    assert calls == ["a", "b"] * 4  # one warm-up round, then three timed rounds, alternating
    assert set(t) == {"a", "b"} and len(t["a"].samples) == 3 and t["a"].q25 <= t["a"].median <= t["a"].q75
    x, y = torch.arange(10.0), torch.arange(30.0)
    thinned = precision_lab.thin([x, y], 10)
    assert thinned.tolist() == [0.0, 4.0, 8.0, 0.0, 4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0]  # every 4th: 40 / 10
    assert precision_lab.thin([x], 100).tolist() == x.tolist()


# ---------------------------------------------------------------- figures: bands from data, overflow shown

def _spans(fig):
    """(label, x0, x1) of every axvspan in the figure's first axes."""
    out = []
    for patch in fig.axes[0].patches:
        if isinstance(patch, Polygon):  # axvspan draws a polygon (older matplotlib) ...
            xs = patch.get_xy()[:, 0]
            out.append((patch.get_label(), xs.min(), xs.max(), xs[0] <= xs[2]))
        elif isinstance(patch, Rectangle) and patch.get_label() and not patch.get_label().startswith("_"):
            x0, w = patch.get_x(), patch.get_width()  # ... or a rectangle (newer)
            out.append((patch.get_label(), min(x0, x0 + w), max(x0, x0 + w), w >= 0))
    return out


def test_range_panel_draws_no_reversed_band_when_the_data_lies_above_the_underflow_threshold(capsys):
    # fp32, values around 1e-4 scaled by 2^-1: they lie far above 2^-150
    samples = {"weight gradients": torch.logspace(-6, -2, 1000).float()}
    fig = precision_lab.range_panel("fp32", "weight gradients", -1, samples=samples)
    spans = _spans(fig)
    lo, hi = fig.axes[0].get_xlim()
    assert spans == [] or all(ok and lo <= a < b <= hi for _, a, b, ok in spans), spans
    assert "rounds to 0" not in [s[0] for s in spans] and "overflows" not in [s[0] for s in spans]
    out = capsys.readouterr().out
    assert "not drawn: rounds to 0, subnormal, overflows" in out
    assert lo > -30 and hi < 0  # the view follows the data, not fp32's range
    plt.close("all")


def test_range_panel_bands_where_the_data_reaches_them(capsys):
    samples = {"wide": torch.exp2(torch.linspace(-40, 20, 601)).float()}
    fig = precision_lab.range_panel("fp16", "wide", 0, samples=samples)
    spans = {label: (a, b) for label, a, b, ok in _spans(fig) if ok}
    assert set(spans) == {"rounds to 0", "subnormal (fewer bits)", "overflows"}
    assert spans["rounds to 0"] == (-41.0, -25.0) and spans["subnormal (fewer bits)"] == (-25.0, -14.0)
    assert spans["overflows"][0] == pytest.approx(16.0, abs=1e-3) and spans["overflows"][1] == 21.0
    assert "not drawn" not in capsys.readouterr().out
    plt.close("all")


def test_visible_span():
    assert precision_lab.visible_span(-math.inf, -151.0, (-30.0, 0.0)) is None  # entirely left of the view
    assert precision_lab.visible_span(-math.inf, -25.0, (-41.0, 21.0)) == (-41.0, -25.0)
    assert precision_lab.visible_span(128.0, math.inf, (-41.0, 21.0)) is None
    assert precision_lab.visible_span(-25.0, -14.0, (-20.0, 0.0)) == (-20.0, -14.0)


def test_scaling_is_done_in_fp64_so_overflow_past_fp32_is_counted(capsys):
    samples = {"big": torch.tensor([2.0**100, 2.0**-100])}
    precision_lab.range_panel("fp32", "big", 40, samples=samples)  # 2^140 overflows fp32; fp32 arithmetic dropped it as inf
    out = capsys.readouterr().out
    assert "50.00% overflow (n=2)" in out and "50.00% normal" in out
    precision_lab.range_panel("fp32", "big", -60, samples=samples)  # 2^-160 underflows fp32 instead of vanishing before counting
    assert "50.00% underflow to 0" in capsys.readouterr().out
    rows = precision_lab.underflow_rows({0: {"g": torch.tensor([2.0**100])}}, 2.0**40)
    assert rows[0][-1] == "100.00%"
    with pytest.raises(ValueError, match="log2_scale"):
        precision_lab.range_panel("fp32", "big", 5000, samples=samples)
    plt.close("all")


# ---------------------------------------------------------------- loss scaling

@pytest.mark.slow
def test_static_scaling_sweep_and_its_figure_show_the_overflow_edge():
    base = _tiny_model()
    x, y = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    rows = precision_lab.static_scaling_sweep(base, x, y, [0, 8, 60, 90], "cpu")
    assert [r["finite"] for r in rows][:2] == [True, True] and rows[-1]["finite"] is False
    assert rows[-1]["rel_error"] == math.inf and 0 <= rows[0]["zero_fraction"] < 1
    fig = precision_lab.scaling_sweep_figure(rows)
    labels = [c.get_label() for c in fig.axes[0].collections]
    assert "overflow: inf/NaN in the gradients" in labels
    over = next(c for c in fig.axes[0].collections if c.get_label().startswith("overflow"))
    assert sorted(over.get_offsets()[:, 0].tolist()) == [r["log2_scale"] for r in rows if not r["finite"]]
    with pytest.raises(ValueError, match="log2 scale"):
        precision_lab.static_scaling_sweep(base, x, y, [-1], "cpu")
    with pytest.raises(ValueError, match="LOG2_SCALES"):
        precision_lab.check_log2_scales("LOG2_SCALES", [0, 4.0])
    assert precision_lab.check_log2_scales("LOG2_SCALES", (0, 4)) == [0, 4]
    plt.close("all")


def _row(k, lost, finite=True, err=1e-3):
    return {"log2_scale": k, "zero_fraction": lost, "finite": finite, "rel_error": err if finite else math.inf}


def test_scaling_sweep_sentence_names_the_window():
    rows = [_row(0, 0.005, err=3.6e-4), _row(8, 0.0001, err=3.2e-4), _row(16, 0.0, err=3.3e-4),
            _row(20, 0, False), _row(24, 0, False)]
    text = precision_lab.scaling_sweep_sentence(rows)
    assert "finite from 2^0 to 2^16" in text and "between 2^16 and 2^20" in text and "2^20, 2^24" in text
    assert "smallest error was 3.20e-04 at S = 2^8" in text and "within 1.5×" in text
    assert "beyond this sweep" in precision_lab.scaling_sweep_sentence(rows[:3])
    assert "Every scale" in precision_lab.scaling_sweep_sentence([_row(0, 0, False)])
    assert "already overflowed" in precision_lab.scaling_sweep_sentence([_row(0, 0, False), _row(4, 0.1)])


@pytest.mark.slow
def test_compare_scalers_matches_on_the_course_gpt():
    base = _tiny_model()
    batches = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))) for _ in range(3)]
    both = precision_lab.compare_scalers(base, batches, init_scale=2.0**10, growth_interval=2, steps=6,
                              inject={1: math.nan, 2: math.inf}, device="cpu")
    assert both["ours"] == both["torch"] and [k for _, k in both["ours"]] == [False, True, True, False, False,
                                                                            False]
    for a, b in zip(*both["params"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.slow
def test_compare_scalers_drives_the_class_it_is_given_and_sees_a_scaler_that_never_skips():
    from helpers.training.precision import DynamicLossScaler

    class NeverSkips(DynamicLossScaler):  # planted: steps even after an inf/NaN gradient
        def step(self, optimizer, *args, **kwargs):
            self.unscale_(optimizer)
            self._state(optimizer)["stage"] = "stepped"
            return optimizer.step(*args, **kwargs)

    base = _tiny_model()
    batches = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))) for _ in range(3)]
    both = precision_lab.compare_scalers(base, batches, init_scale=2.0**10, growth_interval=2, steps=3,
                                         inject={1: math.nan}, device="cpu", scaler_class=NeverSkips)
    assert any(not torch.equal(a, b) for a, b in zip(*both["params"]))  # NaN written into its weights


# ---------------------------------------------------------------- notebook 03's parameters fail fast

def _validate_nb03(tmp_path, **parameters):
    """Run notebook 03's parameters cell and the cell that validates it, with `parameters` injected."""
    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "03_mixed_precision.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"]
            if c["cell_type"] == "code" and c.get("id") != "course-start"]  # after the start cell
    ns: dict = {}
    exec(code[0], ns)  # noqa: S102 - the notebook's own cells
    ns.update(PROFILE="smoke", INTERACTIVE=False, RESULTS_DIR=str(tmp_path), **parameters)
    threads = torch.get_num_threads()
    try:
        exec(code[1], ns)  # noqa: S102
    finally:
        torch.set_num_threads(threads)
    return ns


@pytest.mark.parametrize("name, value", [("REPS", 0), ("STEPS", -2), ("GROWTH_INTERVAL", 0), ("INIT_SCALE", 0.0),
                                         ("LR", -1e-3), ("LOG2_SCALES", []), ("LOG2_SCALES", [0, -4]),
                                         ("MODEL", "huge"), ("BATCH", 2.5), ("CPU_THREADS", 0)])
def test_notebook_03_rejects_a_bad_parameter_naming_it(tmp_path, capsys, name, value):
    with pytest.raises(ValueError, match=name):
        _validate_nb03(tmp_path, **{name: value})


def test_notebook_03_defaults_and_an_int_scale(tmp_path, capsys):
    ns = _validate_nb03(tmp_path, INIT_SCALE=65536, GROWTH_INTERVAL=None)
    assert ns["INIT_SCALE"] == 65536.0 and isinstance(ns["INIT_SCALE"], float)
    assert ns["GROWTH_INTERVAL"] == ns["STEPS"] == 12 and ns["LOG2_SCALES"] == [0, 4, 8, 12, 16, 20, 24]
    assert _validate_nb03(tmp_path)["INIT_SCALE"] == 2.0**12


def test_the_full_profile_trains_long_enough_for_two_growth_probes(tmp_path):
    from helpers.measure import params

    S = params.Setup(profile="full", device="cuda", seed=0, interactive=False, results_dir=tmp_path)
    P = precision_lab.resolve_parameters(S, MODEL=None, BATCH=None, SEQ_LEN=None, STEPS=None, LR=None,
                                         INIT_SCALE=None, GROWTH_INTERVAL=None, LOG2_SCALES=None, REPS=None,
                                         CPU_THREADS=None)
    assert (P["MODEL"], P["BATCH"], P["SEQ_LEN"], P["STEPS"]) == ("gpt2", 16, 512, 120)
    assert P["STEPS"] // P["GROWTH_INTERVAL"] == 2  # the scaler tries to grow twice (steps 50 and 100)
    assert P["CPU_THREADS"] == 1  # one thread in every profile: the course times a CPU on the thread's own clock
