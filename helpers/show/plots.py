"""One plotting style for the course: roofline, sweeps and bar comparisons."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import matplotlib
import matplotlib.pyplot as plt

COLORS = ["#1f5fa8", "#d1495b", "#2e933c", "#edae49", "#7b4fa0", "#00798c", "#8c564b", "#444444"]
STYLE = {
    "figure.figsize": (7.0, 4.2), "figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False, "axes.titleweight": "bold",
    "axes.prop_cycle": matplotlib.cycler(color=COLORS), "legend.frameon": False, "font.size": 10,
}


def axes(ax=None, title: str | None = None):
    """(figure, axes) in the course's style: `ax` and its figure when given, else a new figure; `title` set
    when given."""
    plt.rcParams.update(STYLE)
    if ax is None:
        fig, ax = plt.subplots()
    else:
        fig = ax.figure
    if title:
        ax.set_title(title)
    return fig, ax


def figure(ncols: int = 1, figsize: tuple[float, float] | None = None):
    """A course-styled figure with `ncols` axes side by side: (fig, ax) or (fig, [ax, ...])."""
    plt.rcParams.update(STYLE)
    return plt.subplots(1, ncols, figsize=figsize or (STYLE["figure.figsize"][0] * (1 + 0.5 * (ncols - 1)),
                                                      STYLE["figure.figsize"][1]))


def wants_log(values: Sequence[float]) -> bool:
    """True when positive data spans more than two decades, so a log axis reads better."""
    vals = [v for v in values if v is not None and v > 0]
    return bool(vals) and max(vals) / min(vals) > 100


def sweep(x: Sequence[float], series: Mapping[str, Sequence[float | None]], *, xlabel: str, ylabel: str,
          title: str | None = None, logx: bool | None = None, logy: bool | None = None,
          hlines: Mapping[str, float] | None = None, ax=None):
    """One line per implementation against the swept variable; dashed horizontal reference lines."""
    fig, ax = axes(ax, title)
    ys_all: list[float] = []
    for label, ys in series.items():
        pts = [(xi, yi) for xi, yi in zip(x, ys) if yi is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label)
            ys_all += [p[1] for p in pts]
    for i, (label, y) in enumerate((hlines or {}).items()):
        ax.axhline(y, ls="--", lw=1, color=COLORS[-1 - i % 3], label=label)
        ys_all.append(y)
    if logx if logx is not None else wants_log(list(x)):
        ax.set_xscale("log", base=2)
    if logy if logy is not None else wants_log(ys_all):
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if series or hlines:
        ax.legend()
    fig.tight_layout()
    return fig


def bars(values: Mapping[str, float | None], *, ylabel: str, title: str | None = None,
         annotate: str = "{:.3g}", logy: bool | None = None, ax=None):
    """A bar per named value (None bars are shown as 'n/a'), each annotated with its number."""
    fig, ax = axes(ax, title)
    names = list(values)
    heights = [values[n] or 0.0 for n in names]
    rects = ax.bar(names, heights, color=[COLORS[i % len(COLORS)] for i in range(len(names))])
    for rect, name in zip(rects, names):
        v = values[name]
        ax.annotate("n/a" if v is None else annotate.format(v), (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                    ha="center", va="bottom", fontsize=9)
    if logy if logy is not None else wants_log(heights):
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    return fig


def roofline(ceilings_tflops: Mapping[str, float], bandwidth_gbs: float,
             points: Sequence[tuple[str, float, float]] = (), *, title: str | None = None,
             intensity_range: tuple[float, float] | None = None, ax=None):
    """Log-log roofline: one roof per compute ceiling, one labelled marker per (name, FLOP/B, TFLOP/s)."""
    fig, ax = axes(ax, title)
    ridges = [c * 1e3 / bandwidth_gbs for c in ceilings_tflops.values()]
    xs_pts = [p[1] for p in points]
    lo = min(xs_pts + ridges + [1.0]) / 4
    hi = max(xs_pts + ridges + [1.0]) * 4
    if intensity_range:
        lo, hi = intensity_range
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    for i, (label, ceiling) in enumerate(ceilings_tflops.items()):
        ax.plot(xs, np.minimum(ceiling, bandwidth_gbs * xs / 1e3), color=COLORS[i % len(COLORS)],
                lw=2, label=f"{label}: {ceiling:.3g} TFLOP/s, ridge {ceiling * 1e3 / bandwidth_gbs:.3g} FLOP/B")
    for j, (name, intensity, achieved) in enumerate(points):
        ax.scatter([intensity], [achieved], marker="o", s=40, color=COLORS[(j + 3) % len(COLORS)], zorder=3)
        ax.annotate(name, (intensity, achieved), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title or f"roofline ({bandwidth_gbs:.3g} GB/s)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
