"""helpers.show.plots (sweeps, bars, rooflines, log axes) and helpers.show.widgets (panels interactive and headless,
the progress bar)."""
import matplotlib.pyplot as plt
import pytest

from helpers.show import plots, widgets


def test_sweep_draws_one_line_per_series_and_reference_lines():
    fig = plots.sweep([1, 2, 4], {"a": [1.0, 2.0, 3.0], "b": [1.0, None, 5.0]}, xlabel="x", ylabel="y",
                      hlines={"peak": 10.0})
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["a", "b", "peak"]
    assert len(ax.get_lines()[1].get_xdata()) == 2  # the None point is skipped
    plt.close(fig)


def test_log_axes_when_data_spans_decades():
    assert plots.wants_log([1, 1000]) and not plots.wants_log([1, 50])
    fig = plots.sweep([1, 2], {"a": [1e-3, 10.0]}, xlabel="x", ylabel="y")
    assert fig.axes[0].get_yscale() == "log"
    plt.close(fig)


def test_bars_and_roofline():
    fig = plots.bars({"a": 1.0, "b": None}, ylabel="v")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["1", "n/a"]
    plt.close(fig)
    fig = plots.roofline({"bf16": 100.0}, 1000.0, [("op", 1.0, 0.5)])
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "ridge 100 FLOP/B" in ax.get_lines()[0].get_label()
    assert [t.get_text() for t in ax.texts] == ["op"]
    plt.close(fig)


def test_panel_calls_update_when_a_control_changes(monkeypatch):
    monkeypatch.setitem(widgets._INTERACTIVE, "on", True)  # an earlier test's params.setup may have set it off
    calls = []
    size = widgets.choice_slider([1, 2, 4], 2, "n")
    kind = widgets.dropdown(["a", "b"], "a", "kind")
    box = widgets.panel(lambda n, kind: calls.append((n, kind)), {"n": size, "kind": kind}, title="t")
    assert calls[-1] == (2, "a")  # drawn once on creation
    size.value = 4
    assert calls[-1] == (4, "a")
    kind.value = "b"
    assert calls[-1] == (4, "b")
    assert not size.continuous_update and "course-panel" in box._dom_classes


def test_a_headless_panel_draws_only_when_a_control_changes(monkeypatch, tmp_path):
    from helpers.measure import params, results

    monkeypatch.setitem(widgets._INTERACTIVE, "on", True)
    monkeypatch.setattr(results, "configure", lambda **kw: tmp_path)  # no results folder changed for others
    params.setup("smoke", 0, False)
    assert widgets._INTERACTIVE["on"] is False
    calls = []
    size = widgets.choice_slider([1, 2, 4], 2, "n")
    box = widgets.panel(lambda n: calls.append(n), {"n": size})
    assert calls == [] and "course-panel" in box._dom_classes  # not drawn into an Output nobody shows
    size.value = 4
    assert calls == [4]


def test_progress_is_silent_when_headless(monkeypatch):
    monkeypatch.setenv(widgets.HEADLESS_ENV, "1")
    assert list(widgets.progress(range(3))) == [0, 1, 2]
    assert widgets.progress(range(3)).disable
