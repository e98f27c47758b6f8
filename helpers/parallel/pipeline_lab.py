"""Notebook 13's model parallelism on ranks: tensor parallelism checked, the pipeline executed and explained.

Each function taking `(rank, world, ...)` runs under `helpers.parallel.launch.run_on_ranks`:

* `check_tensor_parallel`: `tensor_parallel.TPMLP` and `TPAttention` against the dense layers;
* `run_pipeline` / `measure_pipeline` / `pipeline_row`: a schedule (`pipeline.pipeline_schedule`)
  executed with a fixed compute time per step, its bubble and where its idle time went, from timestamps
  carried by the messages;
* the sentences, and what the ledger judges of GPipe's formula: `bubble_sentences`, `bubble_claim`.
"""
from __future__ import annotations

import time
from statistics import median

import torch
import torch.distributed as dist

from helpers.gpt.model import GPT
from helpers.measure import bench
from helpers.parallel import pipeline, tensor_parallel
from helpers.parallel.ddp_lab import small_config


def check_tensor_parallel(rank: int, world: int, seed: int = 0) -> dict:
    """Megatron MLP and head-split attention against the dense layers: outputs and input gradients."""
    torch.manual_seed(seed)
    cfg = small_config(n_head=4, n_kv_head=2 if world <= 2 else 4)
    block = GPT(cfg).blocks[0]
    x = torch.randn(2, cfg.seq_len, cfg.d_model)
    out = {}
    for name, dense, tp in (("mlp", block.mlp, tensor_parallel.TPMLP(block.mlp)),
                            ("attention", block.attn, tensor_parallel.TPAttention(block.attn))):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = dense(xa), tp(xb)
        ya.pow(2).sum().backward()
        yb.pow(2).sum().backward()
        out[name] = max(float((ya - yb).detach().abs().max()), float((xa.grad - xb.grad).abs().max()))
    return out if rank == 0 else {}


def run_pipeline(rank: int, world: int, kind: str, micro: int, forward_ms: float, width: int = 64) -> dict:
    """On ranks (one stage each): one training step of the schedule; activations and gradients really sent.

    Each step does a small real linear and then waits out `forward_ms` (forward) or 2x (backward), a
    fixed-duration stand-in for a stage's compute, so that p ranks sharing a few cores still show the
    schedule's own bubble. Every message carries its send time (perf_counter, one clock for all
    processes on a machine) in its last element, so each receive's wait splits into the part the
    schedule causes (the data was not sent yet) and the delivery (sent, not yet received). Returns this
    stage's seconds: {"busy_s", "wall_s", "bubble", "peak_in_flight", "t0", "end", "forward_s" and
    "backward_s" (median busy time of one step), "schedule_wait_s", "delivery_s" (summed over its
    receives), "messages" (received)}.
    """
    steps = pipeline.pipeline_schedule(kind, world, micro)[rank]
    w = torch.randn(width, width, dtype=torch.float64) / width ** 0.5
    acts: dict[int, torch.Tensor] = {}
    busy, peak, sends = 0.0, 0, []  # sends are asynchronous: 1F1B would deadlock on blocking sends
    f_s, b_s, waited, delivery, received = [], [], 0.0, 0.0, 0

    def receive(src):
        nonlocal waited, delivery, received
        buf = torch.empty(8 * width + 1, dtype=torch.float64)
        posted = time.perf_counter()
        dist.recv(buf, src)
        got = time.perf_counter()
        sent = float(buf[-1])
        waited += max(0.0, min(sent, got) - posted)
        delivery += got - max(posted, sent)
        received += 1
        return buf[:-1].view(8, width)

    def send(x, dst):
        msg = torch.cat([x.reshape(-1), torch.tensor([time.perf_counter()], dtype=torch.float64)])
        sends.append(dist.isend(msg, dst))

    dist.barrier()
    t0 = time.perf_counter()
    for op, i in steps:
        if op == "F":
            x = receive(rank - 1) if rank > 0 else torch.randn(8, width, dtype=torch.float64)
            s = time.perf_counter()
            acts[i] = x @ w
            time.sleep(forward_ms / 1e3)
            f_s.append(time.perf_counter() - s)
            peak = max(peak, len(acts))
            if rank < world - 1:
                send(acts[i], rank + 1)
        else:
            g = receive(rank + 1) if rank < world - 1 else torch.ones(8, width, dtype=torch.float64)
            s = time.perf_counter()
            g = g @ w.t()
            del acts[i]
            time.sleep(2 * forward_ms / 1e3)
            b_s.append(time.perf_counter() - s)
            if rank > 0:
                send(g, rank - 1)
        busy += (f_s if op == "F" else b_s)[-1]
    for req in sends:
        req.wait()
    end = time.perf_counter()
    wall = end - t0
    return {"busy_s": busy, "wall_s": wall, "bubble": 1 - busy / wall, "peak_in_flight": peak, "t0": t0,
            "end": end, "forward_s": median(f_s), "backward_s": median(b_s), "schedule_wait_s": waited,
            "delivery_s": delivery, "messages": received}


_PIPE_KEYS = ("busy_s", "t0", "end", "forward_s", "backward_s", "schedule_wait_s", "delivery_s", "messages",
              "peak_in_flight")


def pipeline_row(kind: str, micro: int, stages: int, runs: list[list[dict]]) -> dict:
    """One (schedule, m) row from repeated runs, each a list of every stage's `run_pipeline` dict.

    The bubble of a run is 1 - sum(busy) / (p * W), W from the earliest start to the latest end over the
    stages; its idle time p * W - sum(busy) is split, from the timestamps, into the schedule's own waits
    (receives whose data was not sent yet, and each stage's time before the first start and after its
    own end), message delivery, and each stage's own time between steps (Python, allocation, being
    descheduled: the rest). The schedule's bubble, sched / (sched + busy), is the idle share the step would
    have without delivery and the stages' own time: for equal steps, exactly (p-1)/(m+p-1). Returns
    medians and quartiles over the runs, the formula, and the replay
    (`pipeline.replay_schedule`) with the medians of the measured step times, delivery per message
    and overhead per step: {"kind", "micro", "stages", "bubble", "bubble_q25", "bubble_q75", "bubbles",
    "schedule_bubble" (and its "_q25", "_q75"),
    "formula", "replay", "replay_no_overhead", "idle_ms" {"schedule", "delivery", "own"}, "forward_ms",
    "backward_ms", "delay_ms", "overhead_ms", "peak_in_flight", "wall_s", "runs"}.
    """
    bubbles, net, walls, f, b, delay, over = [], [], [], [], [], [], []
    parts: dict[str, list[float]] = {"schedule": [], "delivery": [], "own": []}
    for stages_ in runs:
        start, end = min(r["t0"] for r in stages_), max(r["end"] for r in stages_)
        wall = end - start
        busy = sum(r["busy_s"] for r in stages_)
        idle = stages * wall - busy
        sched = sum(r["schedule_wait_s"] + (r["t0"] - start) + (end - r["end"]) for r in stages_)
        deliv = sum(r["delivery_s"] for r in stages_)
        msgs = sum(r["messages"] for r in stages_)
        bubbles.append(idle / (stages * wall))
        net.append(sched / (sched + busy))
        walls.append(wall)
        parts["schedule"].append(sched)
        parts["delivery"].append(deliv)
        parts["own"].append(idle - sched - deliv)
        f.append(median(r["forward_s"] for r in stages_))
        b.append(median(r["backward_s"] for r in stages_))
        delay.append(deliv / msgs if msgs else 0.0)
        over.append(max(0.0, idle - sched - deliv) / (stages * 2 * micro))
    med, q25, q75 = bench.quartiles(bubbles)
    args = (kind, stages, micro, median(f), median(b), median(delay))
    nmed, nq25, nq75 = bench.quartiles(net)
    return {"kind": kind, "micro": micro, "stages": stages, "bubble": med, "bubble_q25": q25, "bubble_q75": q75,
            "schedule_bubble": nmed, "schedule_bubble_q25": nq25, "schedule_bubble_q75": nq75,
            "bubbles": bubbles, "formula": pipeline.bubble_formula(stages, micro),
            "replay": pipeline.replay_schedule(*args, overhead_s=median(over))["bubble"],
            "replay_no_overhead": pipeline.replay_schedule(*args)["bubble"],
            "idle_ms": {k: 1e3 * median(v) for k, v in parts.items()},
            "forward_ms": 1e3 * median(f), "backward_ms": 1e3 * median(b), "delay_ms": 1e3 * median(delay),
            "overhead_ms": 1e3 * median(over), "peak_in_flight": [r["peak_in_flight"] for r in runs[0]],
            "wall_s": median(walls), "runs": len(runs)}


def measure_pipeline(rank: int, world: int, micros: list[int], forward_ms: float, rounds: int = 5) -> list[dict] | None:
    """GPipe and 1F1B on `world` stages for each micro-batch count, `rounds` interleaved rounds (one run of
    every configuration per round, their order rotated) after one warm-up run of each schedule at the fewest
    micro-batches (its first sends set up the connections both ways between neighbours; a larger m sends the
    same messages, only more of them); rank 0 gets `pipeline_row` for each configuration."""
    configs = [(kind, m) for kind in ("gpipe", "1f1b") for m in micros]
    runs: dict[tuple, list] = {c: [] for c in configs}
    for kind in ("gpipe", "1f1b"):
        run_pipeline(rank, world, kind, min(micros), forward_ms)
    for k in range(rounds):
        for c in configs[k % len(configs):] + configs[:k % len(configs)]:
            r = run_pipeline(rank, world, c[0], c[1], forward_ms)
            stats = torch.tensor([float(r[key]) for key in _PIPE_KEYS], dtype=torch.float64)
            every = [torch.zeros_like(stats) for _ in range(world)]
            dist.all_gather(every, stats)
            runs[c].append([dict(zip(_PIPE_KEYS, (float(x) for x in s))) for s in every])
    if rank != 0:
        return None
    rows = [pipeline_row(kind, m, world, runs[(kind, m)]) for kind, m in configs]
    for row in rows:
        row["peak_in_flight"] = [int(x) for x in row["peak_in_flight"]]
    return rows


BUBBLE_CLAIMED = (1.0, 1.0)  # GPipe's formula, as (schedule's bubble / formula): exactly 1


def bubble_claim(rows: list[dict]) -> dict:
    """What the ledger judges of GPipe's bubble formula, from GPipe's row at the largest m: the schedule's own
    bubble (`pipeline_row`: idle time that is the schedule's own waiting, from the timestamps) over
    (p-1)/(m+p-1), with the spread from its quartiles, for `claims.verdict(value=, spread=, claimed=BUBBLE_CLAIMED,
    above="contradicted")` (a bubble above the formula is as much against it as one below). Returns {"ratio",
    "spread" (lo, hi), "raw_ratio" (whole measured bubble / formula), "row", "measured" (a sentence),
    "claimed"}; no verdict: the one rule (`claims.judge_interval`) makes it."""
    top = max(r["micro"] for r in rows if r["kind"] == "gpipe")
    row = next(r for r in rows if r["kind"] == "gpipe" and r["micro"] == top)
    ratio = row["schedule_bubble"] / row["formula"]
    lo, hi = row["schedule_bubble_q25"] / row["formula"], row["schedule_bubble_q75"] / row["formula"]
    raw = row["bubble"] / row["formula"]
    measured = (f"GPipe, p = {row['stages']}, m = {top}, {row['runs']} runs: the schedule's own waiting gives a bubble "
                f"of {row['schedule_bubble']:.3f} (IQR {row['schedule_bubble_q25']:.3f}-{row['schedule_bubble_q75']:.3f}), "
                f"{ratio:.2f}x (IQR {lo:.2f}-{hi:.2f}x) the formula's {row['formula']:.3f}; with message delivery and the "
                f"ranks' own time between steps the whole bubble was {row['bubble']:.3f} ({raw:.2f}x)")
    return {"ratio": ratio, "spread": (min(lo, ratio), max(hi, ratio)), "raw_ratio": raw, "row": row,
            "measured": measured, "claimed": BUBBLE_CLAIMED}


def bubble_sentences(rows: list[dict], withheld: str | None = None) -> list[str]:
    """What the pipeline rows show, generated from them: each schedule at the largest m against the formula
    (ratio of medians, with the IQR), where its idle time went (the schedule's own waiting against the
    formula's (p-1)(F+B) per stage at the measured step times, message delivery, each stage's own time
    between steps), whether the replay with those measured times accounts for the gap (the replay's excess
    over the formula within 0.5-1.5x of the measured excess: the replay spreads the measured delays evenly
    over the steps, a coarse model), and
    whether GPipe and 1F1B differ beyond their spread, and by which part of the idle time; withheld: why this run
    may not rank the two schedules (`collectives_lab.Load.withheld`), then their bubbles are stated, not compared."""
    out = []
    top = max(r["micro"] for r in rows)
    by = {r["kind"]: r for r in rows if r["micro"] == top}
    for kind, r in by.items():
        ratio, lo, hi = (r[k] / r["formula"] for k in ("bubble", "bubble_q25", "bubble_q75"))
        idle = r["idle_ms"]
        total = sum(idle.values())
        own_formula = r["stages"] * (r["stages"] - 1) * (r["forward_ms"] + r["backward_ms"])
        s = (f"{kind} at m = {top}: measured bubble {r['bubble']:.3f} (IQR {r['bubble_q25']:.3f}-{r['bubble_q75']:.3f}, "
             f"{r['runs']} runs), {ratio:.2f}x the formula's {r['formula']:.3f} (IQR {lo:.2f}-{hi:.2f}x)")
        s += (f"; of the stages' {total:.1f} ms idle, {idle['schedule']:.1f} ms was the schedule's own waiting "
              f"(the formula's (p-1)(F+B) per stage, over the {r['stages']} stages at the measured step times: "
              f"{own_formula:.1f} ms), "
              f"{idle['delivery']:.1f} ms message delivery ({r['delay_ms']:.2f} ms per message) and {idle['own']:.1f} ms "
              f"each stage's own time between steps ({r['overhead_ms']:.2f} ms per step: Python, allocation, "
              "waiting for a core)")
        gap, explained = r["bubble"] - r["formula"], r["replay"] - r["formula"]
        if abs(gap) < 0.02:
            s += "; no gap to explain"
        elif 0.5 <= explained / gap <= 1.5:
            s += (f"; replaying the schedule with these measured times predicts {r['replay']:.3f} "
                  f"({r['replay_no_overhead']:.3f} without the time between steps), within half the gap of the "
                  "measured bubble: they account for it")
        elif explained > gap:
            s += (f"; replaying the schedule with these times spread evenly over every step predicts {r['replay']:.3f}, "
                  f"more than the measured {r['bubble']:.3f}: the delays that were measured cover the gap, but not all "
                  "of them lay on the critical path")
        else:
            s += (f"; replaying the schedule with these measured times predicts {r['replay']:.3f}, short of the measured "
                  f"{r['bubble']:.3f}: the rest of the gap is not explained by this run")
        out.append(s + ".")
    if {"gpipe", "1f1b"} <= set(by):
        g, f = by["gpipe"], by["1f1b"]
        apart = g["bubble_q75"] < f["bubble_q25"] or f["bubble_q75"] < g["bubble_q25"]
        if withheld:
            out.append(f"GPipe and 1F1B at m = {top} ({g['bubble']:.3f} vs {f['bubble']:.3f}) are not ranked by this run: "
                       f"{withheld}.")
        elif not apart:
            out.append(f"GPipe and 1F1B at m = {top} are within each other's spread ({g['bubble']:.3f} vs "
                       f"{f['bubble']:.3f}), as the theory says: the same bubble; 1F1B held fewer activations.")
        else:
            d = {k: g["idle_ms"][k] - f["idle_ms"][k] for k in g["idle_ms"]}
            more, less = (("GPipe", "1F1B") if g["bubble"] > f["bubble"] else ("1F1B", "GPipe"))
            sign = 1 if more == "GPipe" else -1
            parts = ", ".join(f"{k} {sign * v:+.1f} ms" for k, v in d.items())
            total = sum(sign * v for v in d.values())
            sched = sign * d["schedule"] > 0.5 * total
            out.append(f"GPipe and 1F1B at m = {top} differ beyond their spread ({g['bubble']:.3f} vs {f['bubble']:.3f}), "
                       f"although the formula gives both the same bubble (and the replay with free messages and no "
                       f"time between steps gives both exactly the formula): {more} idled {total:.1f} ms longer "
                       f"({parts})"
                       + (": most of it the schedule's own waiting, which the formula says is equal, so this run does "
                          "not explain the difference" if sched else
                          ": most of it message delivery and the stages' own time between steps, so the difference "
                          f"comes from this machine's costs, not from the schedule (per message {g['delay_ms']:.2f} ms "
                          f"under GPipe, {f['delay_ms']:.2f} ms under 1F1B)") + ".")
    return out


def takeaway(rows: list[dict], stages: int, claim: dict, verdict: str, withheld: str | None) -> str:
    """The notebook's takeaway on the pipeline at the largest m, from `measure_pipeline`'s rows, `bubble_claim`'s
    result and the ledger's verdict on it; withheld: why this run may not rank the two schedules (None: it may)."""
    top = max(r["micro"] for r in rows)
    g, f = (next(r for r in rows if r["kind"] == kind and r["micro"] == top) for kind in ("gpipe", "1f1b"))
    apart = g["bubble_q75"] < f["bubble_q25"] or f["bubble_q75"] < g["bubble_q25"]
    return (f"Pipeline: at m = {top} on {stages} stages GPipe's bubble was {g['bubble']:.3f} (IQR "
            f"{g['bubble_q25']:.3f}-{g['bubble_q75']:.3f}), {g['bubble'] / g['formula']:.2f}x (p-1)/(m+p-1) = "
            f"{g['formula']:.3f}; the schedule's own waiting alone gives {g['schedule_bubble']:.3f} "
            f"({claim['ratio']:.2f}x, ledger: {verdict}), the rest is message delivery ({g['idle_ms']['delivery']:.1f} ms) "
            f"and the ranks' own time between steps ({g['idle_ms']['own']:.1f} ms). 1F1B: {f['bubble']:.3f} (IQR "
            f"{f['bubble_q25']:.3f}-{f['bubble_q75']:.3f}), "
            + ("not ranked against GPipe's: the machine was shared" if withheld else "within GPipe's spread" if not apart
               else "apart from GPipe's beyond the spread (the note under the table says which part of the idle time "
                    "differs)")
            + f"; it held {f['peak_in_flight']} micro-batches' activations per stage against GPipe's {g['peak_in_flight']}.")
