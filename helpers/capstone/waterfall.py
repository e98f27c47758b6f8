"""The capstone's waterfall: tokens/s per rung of a ladder, with its spread and its gain over the baseline."""
from __future__ import annotations

from helpers.show import plots


def waterfall(table: list[dict], ax=None, title: str = "training ladder: tokens/s, rung by rung"):
    """Tokens/s per rung as bars, each with its IQR as an error bar, the cumulative gain over the baseline
    written above it."""
    fig, ax = plots.axes(ax, title)
    names = [r["rung"] for r in table]
    tps = [r["tokens_per_s"] for r in table]
    tokens = [r["tokens_per_s"] * r["timing"].median for r in table]
    lo = [t - n / r["timing"].q75 for t, n, r in zip(tps, tokens, table)]
    hi = [n / r["timing"].q25 - t for t, n, r in zip(tps, tokens, table)]
    ax.bar(names, tps, yerr=[lo, hi], color=[plots.COLORS[i % len(plots.COLORS)] for i in range(len(names))],
           capsize=3)
    for i, r in enumerate(table):
        ax.text(i, tps[i] + hi[i], f"{r['cumulative'].value:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="tokens/s (median, IQR)", xlabel="rung (each adds one technique); above each bar: its gain over the baseline")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig
