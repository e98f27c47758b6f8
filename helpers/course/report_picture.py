"""The report's opening section, "the course in one picture": notebook 14's two ladders (its records
"capstone_training_ladder" and "capstone_serving_ladder") as tokens/s per rung, this run's bars beside each
reference GPU's, with one sentence per ladder on what the whole ladder gained.

A rung's bar is its median tokens/s; its error bar is the IQR of its time per step (or per token) turned into
tokens/s, `tokens_per_s * median / q75` to `tokens_per_s * median / q25`; above it, its recorded cumulative gain
over the ladder's first rung. Rungs are matched across runs by name; a rung only one run has gets its bar alone.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

from helpers.measure.results import write_atomic

TITLE = "The course in one picture"
FILE = "course-in-one-picture.png"  # under the run's figures/ folder, beside the notebooks' figures


@dataclass(frozen=True)
class Ladder:
    """One of notebook 14's ladders: its record, how the report names it and its baseline, the keys of a rung's
    median and quartile times (ms), and whether its last rung holds every technique (the training ladder) or
    its rungs branch (the serving ladder: int8 and int4 stand on compile, speculative decoding on bf16)."""
    record: str
    label: str
    baseline: str
    median: str
    q25: str
    q75: str
    linear: bool


LADDERS = (
    Ladder("capstone_training_ladder", "Training", "the fp32 eager baseline", "step_ms", "q25_ms", "q75_ms", True),
    Ladder("capstone_serving_ladder", "Serving at batch 1", "the fp32 eager baseline without a KV cache",
           "ms_per_token", "q25_ms_per_token", "q75_ms_per_token", False),
)


@dataclass(frozen=True)
class Series:
    """One run's ladder: who ran it ('this run' or a reference GPU's folder), on what, and its rungs in order,
    each {rung, base, tokens_per_s, lo, hi (tokens/s at the IQR's bounds), cumulative, t, t25, t75 (ms)}."""
    who: str
    device: str
    profile: str
    rungs: list[dict]


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def rungs_of(rec: dict, ladder: Ladder) -> list[dict] | None:
    """The rungs of one ladder record, with each rung's tokens/s bounds from its quartile times; None when the
    record has no list of rungs, each with a name, positive tokens/s, quartiles q25 <= median <= q75 and a
    cumulative gain."""
    rows = rec["metrics"].get("rungs")
    if not isinstance(rows, list) or not rows:
        return None
    out = []
    for r in rows:
        if not (isinstance(r, dict) and isinstance(r.get("rung"), str) and all(
                _positive(r.get(k)) for k in ("tokens_per_s", "cumulative", ladder.median, ladder.q25, ladder.q75))):
            return None
        t, t25, t75 = r[ladder.median], r[ladder.q25], r[ladder.q75]
        if not t25 <= t <= t75:
            return None
        tps = r["tokens_per_s"]
        out.append({"rung": r["rung"], "base": r.get("base") if isinstance(r.get("base"), str) else None,
                    "tokens_per_s": tps, "lo": tps * t / t75, "hi": tps * t / t25, "cumulative": r["cumulative"],
                    "t": t, "t25": t25, "t75": t75})
    return out


def _series(who: str, rec: dict | None, ladder: Ladder, problems: list) -> Series | None:
    if rec is None:
        return None
    rows = rungs_of(rec, ladder)
    if rows is None:
        problems.append((rec["_file"], f"a {ladder.record} record without rungs, each with its name, tokens_per_s, "
                                       f"{ladder.q25} <= {ladder.median} <= {ladder.q75} and cumulative"))
        return None
    return Series(who, str(rec.get("device") or "?"), str(rec.get("profile") or "?"), rows)


def panels(mine: dict, refs: dict, problems: list) -> list[tuple[Ladder, list[Series]]]:
    """Per ladder this run recorded: (ladder, [this run's series, then each reference GPU's that has it]).
    A record that cannot be drawn goes to `problems` as (file, reason) and is left out."""
    out = []
    for ladder in LADDERS:
        own = _series("this run", mine.get(ladder.record), ladder, problems)
        theirs = [_series(gpu, recs.get(ladder.record), ladder, problems) for gpu, recs in refs.items()]
        if own is not None:
            out.append((ladder, [own] + [s for s in theirs if s is not None]))
    return out


def rung_order(series: list[Series]) -> list[str]:
    """Every rung name of the series in ladder order: the first series' order, and a rung only a later series
    has placed right after the rung it follows there."""
    order: list[str] = []
    for s in series:
        prev = None
        for r in s.rungs:
            if r["rung"] not in order:
                order.insert(order.index(prev) + 1 if prev is not None else 0, r["rung"])
            prev = r["rung"]
    return order


def _headline(ladder: Ladder, s: Series) -> str:
    """What the whole ladder gained on one run: its top rung's cumulative gain with the IQR bounds of the
    baseline's time over that rung's (as protocol.ratio bounds two timings)."""
    from helpers.measure.protocol import Ratio  # torch, through the timer: only a report that draws needs it

    base = s.rungs[0]
    top = s.rungs[-1] if ladder.linear else max(s.rungs, key=lambda r: r["cumulative"])
    lo, hi = base["t25"] / top["t75"], base["t75"] / top["t25"]
    gain = Ratio(top["cumulative"], lo, hi, lo > 1 or hi < 1)
    what = (f"the whole ladder ({len(s.rungs) - 1} techniques stacked, up to {top['rung']})" if ladder.linear else
            f"the fastest rung by median ({top['rung']}" + (f", on {top['base']})" if top["base"] else ")"))
    return f"{what} {gain}"


def sentence(ladder: Ladder, series: list[Series]) -> str:
    """One line per ladder: the whole ladder's gain on this run and on each reference GPU."""
    own, *theirs = series
    text = f"{ladder.label}: {_headline(ladder, own)} over {ladder.baseline} on {own.device} ({own.profile})"
    for s in theirs:
        text += f"; on {s.device} ({s.profile}, results/{s.who}/), {_headline(ladder, s)}"
    return text + ("." if theirs else "; no reference GPU in results/<gpu>/ holds this ladder yet.")


def draw(drawn: list[tuple[Ladder, list[Series]]]):
    """A figure with one panel per ladder: per rung a bar per series (tokens/s, IQR error bars), the cumulative
    gain above each bar; a log axis when the bars span more than two decades."""
    # heavy: matplotlib, and only a run with notebook 14's records draws; the Agg canvas, whatever the backend
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from helpers.show import plots

    with matplotlib.rc_context(plots.STYLE):
        fig = Figure(figsize=(6.5 * len(drawn), 4.6))
        FigureCanvasAgg(fig)
        for k, (ladder, series) in enumerate(drawn):
            ax = fig.add_subplot(1, len(drawn), k + 1)
            names, width = rung_order(series), 0.8 / len(series)
            for j, s in enumerate(series):
                at = {r["rung"]: r for r in s.rungs}
                rows = [(i, at[n]) for i, n in enumerate(names) if n in at]
                xs = [i + (j - (len(series) - 1) / 2) * width for i, _ in rows]
                tps = [r["tokens_per_s"] for _, r in rows]
                ax.bar(xs, tps, width, yerr=[[t - r["lo"] for t, (_, r) in zip(tps, rows)],
                                             [r["hi"] - t for t, (_, r) in zip(tps, rows)]],
                       capsize=2, color=plots.COLORS[j % len(plots.COLORS)], label=f"{s.who}: {s.device} ({s.profile})")
                for x, (_, r) in zip(xs, rows):
                    ax.text(x, r["hi"], f"{r['cumulative']:.2f}x", ha="center", va="bottom", fontsize=7,
                            rotation=90 if len(series) > 1 else 0)
            bases = {r["rung"]: r["base"] for s in reversed(series) for r in s.rungs}
            ax.set_xticks(range(len(names)), [n + (f"\n(on {bases[n]})" if bases[n] else "") for n in names],
                          rotation=30, ha="right", rotation_mode="anchor", fontsize=8)
            if plots.wants_log([r[b] for s in series for r in s.rungs for b in ("lo", "hi")]):
                ax.set_yscale("log")
            ax.set(title=f"{ladder.label}: tokens/s per rung", ylabel="tokens/s (median, IQR)")
            ax.margins(y=0.15)
            ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
    return fig


def blocks(mine: dict, refs: dict, run_dir: Path, problems: list) -> list[tuple]:
    """The section's blocks: its heading, the figure (saved as figures/course-in-one-picture.png) and one
    sentence per ladder; one line and no figure when this run has neither ladder to draw. A figure that cannot
    be written goes to `problems` and the sentences stay."""
    out: list[tuple] = [("h2", TITLE)]
    drawn = panels(mine, refs, problems)
    if not drawn:
        return out + [("p", "This run has no ladder from notebook 14 (the capstone) to draw; run it to see every "
                            "technique of the course stacked on one training run and one server, rung by rung.")]
    path = run_dir / "figures" / FILE
    buf = io.BytesIO()
    draw(drawn).savefig(buf, format="png")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, buf.getvalue(), fsync=False)
        beside = sorted({s.who for _, series in drawn for s in series[1:]})
        out.append(("fig", str(path.relative_to(run_dir)),
                    "tokens/s per rung of the " + " and ".join(ladder.label.split()[0].lower() for ladder, _ in drawn)
                    + " ladder" + ("s" if len(drawn) > 1 else "") + " (median, IQR as error bars), the cumulative gain "
                    "over the baseline above each bar; this run "
                    + (f"beside {', '.join(beside)}" if beside else "alone (no reference GPU holds these ladders)")))
    except OSError as err:
        problems.append((path, f"figure not saved: {err.strerror or err}"))
    by_record = dict((ladder.record, series) for ladder, series in drawn)
    for ladder in LADDERS:
        series = by_record.get(ladder.record)
        out.append(("p", sentence(ladder, series) if series else f"{ladder.label}: " + (
            "this run's record cannot be drawn (see the files the report could not read)." if ladder.record in mine
            else "not recorded in this run.")))
    return out
