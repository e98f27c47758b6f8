"""Notebook 09's takeaways: the sentences of its closing cell, generated from the run's numbers.

`takeaways` takes what the notebook measured (the workload results, the byte predictions, the compile times, the
GPT step, regional compilation, the graph-break and recompile counts, the claim rows, the Triton checks) and
returns one sentence per line, so that the cell only prints them.
"""
from __future__ import annotations

from typing import Any

from helpers.measure import claims, protocol
from helpers.show import units


def takeaways(*, results: list[dict], pred: dict[str, dict], ratios: dict[str, Any], spread: float, copy_gbps: float,
              copy_source: str, llc: int | None, cold: dict[str, Any], gpt_step: dict[str, Any], gpt_even_text: str,
              regional: dict[str, Any], regional_layers: int, regional_backend: str, recompiles: dict[str, dict],
              sizes: list[int], refused: list[str], n_breaks: int, claim_rows: dict[str, dict], device: str,
              checks: list[str], shape: str, compilers: list[dict] | None = None, xla_pair: Any = None,
              pass_nodes: dict[str, int] | None = None) -> list[str]:
    """The closing sentences of notebook 09, one a line, from the notebook's globals of the same names (upper-case
    there); `shape` is "ROWS x COLS DTYPE", `n_breaks` the number of planted graph breaks; `compilers` the rows of
    "Eager and three compilers" (FWD_ROWS, and XLA's row where it ran), eager first; `xla_pair` XLA's timing beside
    eager in its own rounds (XLA_PAIR, a protocol.Comparison, or {"eager": Timing, backend: Timing}); `pass_nodes` the graph's node counts
    before and after dead-code elimination and constant folding (PASS_NODES: {stage: nodes}, in order)."""
    names = ", ".join(f"{r['name']} {r['kernels']['eager']} -> {r['kernels']['compiled']}" for r in results)
    best = max(results, key=lambda r: r["gbps"]["compiled"])
    out = [f"- Fusion is fewer kernels and fewer bytes: kernels per call {names}; the counted bytes predicted up to "
           f"{max(p['eager'] / p['fused'] for p in pred.values()):.1f}x less traffic at {shape}."]
    out.append("- Measured eager/compiled: " + ", ".join(f"{k} {v}" for k, v in ratios.items())
               + f" (widest timing IQR {spread:.0%}; ranked only where the bounds exclude 1); the compiled {best['name']} "
               f"reached {best['gbps']['compiled'] / copy_gbps:.2g}x the copy bandwidth ({copy_source.split(':')[0]})"
               + (f"; every workload's data fit in the {units.fmt_bytes(llc)} cache"
                  if llc and all(r["bytes_fused"] <= llc for r in results) else "") + ".")
    out.append(f"- Compiling costs: the chain {cold['cold_s']:.1f} s cold ({cold['cold'][1]:.1f}-{cold['cold'][2]:.1f}), "
               f"{cold['warm_s']:.2f} s warm ({cold['warm'][1]:.2f}-{cold['warm'][2]:.2f}; Inductor's disk cache), medians "
               f"of {len(cold['cold_samples'])} on the CPU clock; the GPT step's first compiled step "
               f"{gpt_step['first_step_s']:.1f} s (one sample, cold or from the cache, see above): {gpt_even_text}; "
               f"compiled by block, one traced graph served all {regional_layers} blocks ({regional_backend}, medians of "
               f"{regional['repeats']} fresh compiles: first step {regional['each block']['first_step_s']:.2f} s vs "
               f"{regional['whole model']['first_step_s']:.2f} s whole; whole / block {regional['ratio']}"
               + ("" if regional["ratio"].separated else ", which this run cannot rank") + ").")
    if pass_nodes:
        out.append("- Before fusing, a compiler shrinks the graph: " + ", ".join(f"{k} {v} nodes" for k, v in pass_nodes.items())
                   + " (the planted module's torch.fx graph; each pass matched torch's own).")
    auto = recompiles["automatic dynamic (default)"]["compiles"]
    out.append(f"- Each planted graph break split its function into 2 graphs, each fix gave 1; automatic dynamic shapes "
               f"compiled {auto} times for {len(set(sizes))} sizes, dynamic=False {recompiles['dynamic=False']['compiles']}, "
               f"mark_dynamic {recompiles['mark_dynamic(x, 0)']['compiles']}; TORCH_LOGS showed them as they happened, "
               f"and fullgraph=True refused {len(refused)} of the {n_breaks} planted breaks.")
    out.append("- The claims, as the ledger recorded them: " + "; ".join(
        f"{cid} {claims.shown(row)}" + (f" ({row['reason'].split(';')[0]})" if row["reason"] else "")
        for cid, row in claim_rows.items())
        + f". Measured on this {device} for the training step: {gpt_step['speedup']}, beside the PyTorch 2 paper's A100 "
        "geomeans of 2.27x (inference) and 1.41x (training).")
    if compilers:
        pair = dict(getattr(xla_pair, "timings", xla_pair) or {})  # a protocol.Comparison, or {name: Timing}

        def said(r):
            text = f"{r['backend']} {r['timing'].ms:.3g} ms ({r['units']} {r['unit_kind']}"
            if r["backend"] in pair and r["backend"] != compilers[0]["backend"]:
                text += (f"; timed in rounds of its own, beside eager at {pair[compilers[0]['backend']].ms:.3g} ms: "
                         f"eager/XLA {protocol.paired_ratio(pair[compilers[0]['backend']], pair[r['backend']])} "
                         "in those rounds, the median of per-round ratios")
            return text + ")"
        out.append(f"- One forward, eager and {len(compilers) - 1} compiler(s), on one thread: "
                   + ", ".join(said(r) for r in compilers)
                   + f"; every output within {max(r['max_abs_err'] for r in compilers):.1e} of eager's. The counts compare "
                   "each compiler with itself, and the tables above rank only variants whose IQRs are apart.")
    if not checks:
        out.append("- The Triton softmax did not run in this process (why: printed where it is checked).")
    else:
        out.append(f"- The Triton softmax equalled torch.softmax ({', '.join(checks)}), "
                   + ("and was timed in the sweep." if device == "cuda" else "in Triton's interpreter (not timed)."))
    return out
