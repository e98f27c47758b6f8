"""Notebook 12's takeaways: the sentences of its closing cell, generated from the run's numbers.

`takeaways` takes what the notebook measured (the loader sweep and its sentences, persistent workers, worker
memory, packing against padding, the mask checks and bytes, the rank shards, pinned copies on a GPU) and returns
one sentence per line, so that the cell only prints them.
"""
from __future__ import annotations

from typing import Any

from helpers.dataload import loading_sweep_lab


def _pct(x: float) -> str:
    return f"{x:.1%}"


def takeaways(*, sweep, fewest: str, most: str, cuda: bool, withheld: str | None, wait_sentence: str,
              loader_sentence: str, contention: str, compute_range: tuple[float, float] | None,
              persist_sentence: str | None, epochs: int, memory_mb: dict[str, float], packed: dict[str, dict],
              pack_sentence: str, mask_err: float, leak_after: float, flex_err: float, mask_bytes: dict[str, Any],
              shards: dict[bool, dict], n_docs: int, ranks: int, shuffled: float, h2d: list[dict] | None,
              pin_claim: dict[str, Any], overlap: dict[str, float] | None) -> list[str]:
    """The closing sentences of notebook 12, one a line.

    sweep: the loader sweep (`loading_sweep_lab.sweep_protocol`), fewest/most: its rows with the fewest and the
    most workers; withheld: why its rankings are withheld, or None; compute_range: (lowest, highest) compute median
    across rows of equal work when they differ by more than the clock's noise, else None; persist_sentence: None
    when no workers were kept alive; packed: {"padded", "packed"} rows of the packing comparison; leak_after: the
    largest loss difference without the mask of a document placed after another; mask_bytes: the mask-memory row
    of the longest row length; h2d, overlap: the pinned-copy rows and the side-stream overlap (None without a GPU).
    """
    shared = withheld and "withheld as the rankings above are"  # None: judged
    memmap = sweep["memmap"]
    out = [f"- Data wait: {wait_sentence}. "
           f"{loading_sweep_lab.idle_sentence(fewest, sweep[fewest].idle, cuda=cuda, say_device=False, withheld=shared)}; "
           f"{loading_sweep_lab.idle_sentence(most, sweep[most].idle, cuda=cuda, withheld=shared)}. Throughput: "
           f"{loader_sentence}. The memory-mapped file waited {memmap.wait.ms:.2f} ms per step (median) and trained "
           f"{memmap.tokens_per_s_text()}, with no padding in its rows"
           + f". The {contention}"
           + (f". Compute medians varied {compute_range[1] / compute_range[0]:.1f}x across rows that do the same work."
              if compute_range else ".")]
    if persist_sentence:
        out.append(f"- Persistent workers, {epochs} short epochs: {persist_sentence}.")
    out.append(f"- Memory per worker: reading every document copied {memory_mb['python']:.1f} MiB into a forked worker "
               f"from a list of Python bytes, {memory_mb['numpy']:.2f} MiB from the numpy store"
               + (" — the numpy store fixes copy-on-access." if memory_mb["python"] > 4 * max(memory_mb["numpy"], 0.1)
                  else " — no clear difference in this run."))
    pad, pack = packed["padded"], packed["packed"]
    out.append(f"- Packing: {_pct(pad['padding'])} of the padded batch was padding, {_pct(pack['padding'])} of the "
               f"packed one ({pack['rows']} rows instead of {pad['rows']}), saving {pack['saved_mb']:.1f} MiB "
               f"for backward against {pad['saved_mb']:.1f} MiB; {pack_sentence}.")
    out.append(f"- With the mask, each document's loss equalled its loss alone (largest difference {mask_err:.1e}); "
               f"without it, documents after another in a row were off by up to {leak_after:.3f} nats: "
               f"cross-contamination. FlexAttention's block mask gave per-document attention to {flex_err:.1e} while "
               f"storing {mask_bytes['block_mask']:,} bytes against the dense mask's {mask_bytes['dense']:,} at "
               f"T={mask_bytes['row_len']}.")
    out.append(f"- DistributedSampler over {n_docs} documents and {ranks} ranks: drop_last=False read "
               f"{shards[False]['repeated']} documents twice and missed none; drop_last=True skipped "
               f"{shards[True]['missing']} and no rank shared one; set_epoch(1) changed {shuffled:.0%} of rank 0's order.")
    if h2d:
        top = h2d[-1]
        out.append(f"- Pinned copies of {top['bytes'] / 2 ** 20:.0f} MB: {top['pinned_speedup'][0]:.2f}x pageable's "
                   f"bandwidth (IQR-bounded {top['pinned_speedup'][1]:.2f}-{top['pinned_speedup'][2]:.2f}x); pinning on "
                   f"the fly: the ledger's verdict is {pin_claim['verdict']}; a side stream hid "
                   f"{overlap['hidden']:.0%} of the shorter of copy and compute.")
    else:
        out.append("- Pinned memory: not measured (no GPU in this run).")
    return out
