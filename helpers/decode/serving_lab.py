"""Notebook 10's serving sections, measured on the course GPT: the paged KV cache's waste and decode
speed, static against continuous batching, the KV-memory panel and the verdict on paged waste.

The cache is `helpers.decode.paged`, its attention `helpers.decode.paged_attention`, the request mix and the
scheduler `helpers.decode.serving`. Each section is one call that prints its tables and a sentence made from
this run's numbers, draws its figure and returns its rows:

* `paged_section(model, block_sizes=..., n_requests=..., context=..., batch=..., reps=...)`: memory
  waste paged against preallocated, and decode-attention time against block size (Triton's kernel
  timed only on CUDA); its "speed" rows hold paged vs contiguous times for the "within 10% at 4k" goal.
* `batching_section(model, n_requests=..., max_batch=..., max_new_tokens=..., repeats=...)`: both
  policies on the same mix and memory; "speedup" is the continuous / static tokens/s ratio, "record"
  what to pass to `results.record`.
* `serving_panel(kv_heads, block, mix, budget_gb, weight_bytes_=..., gbps=...)`: the instructor-panel
  callback (KV memory reserved, waste and a throughput estimate, preallocated against paged, for a
  1.3B-sized model), on `request_mix` and `serving_estimate`.
* `paged_waste_verdict(fraction, block_size, mean_tokens)`: the vLLM paper's "under 4% wasted",
  judged only where requests are long enough for the claim to be testable.

`model` is the trained course GPT in eval mode (on S.device); pass `corpus=` (1-D token ids of
held-out text) to draw prompts from real text.
"""
from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import torch

from helpers.decode import paged, paged_attention
from helpers.decode.kv_cache import kv_bytes_per_token
from helpers.decode.paged import PagedKVCache, blocks_for
from helpers.decode.serving import POLICIES, Request, ServeRun, make_requests, serve, solo_tokens
from helpers.measure import bench
from helpers.measure.params import positive, positives
from helpers.show import plots, tables


def _mix_for(model, n_requests: int, seed: int, arrival_rate: float | None, corpus: torch.Tensor | None,
             max_new_tokens: int | None) -> tuple[list[Request], int]:
    """The section's request mix for `model`'s seq_len and vocabulary, and the server's max_new_tokens cap."""
    cfg = model.config
    cap = cfg.seq_len // 2 if max_new_tokens is None else max_new_tokens
    reqs = make_requests(n_requests, seed=seed, vocab_size=cfg.vocab_size, max_len=cfg.seq_len,
                         prompt_median=max(2, cfg.seq_len // 8), output_median=max(2, cfg.seq_len // 8),
                         max_new_tokens=cap, arrival_rate=arrival_rate, corpus=corpus)
    return reqs, cap


def _decode_speed(model, block_sizes: Sequence[int], *, batch: int, context: int, reps: int, seed: int
                  ) -> tuple[list[dict], str]:
    """Decode attention time per block size: paged (PyTorch; Triton on CUDA) against contiguous SDPA."""
    cfg, p = model.config, next(model.parameters())
    H, H_kv, hd, dev, dt = cfg.n_head, cfg.n_kv_head, cfg.head_dim, p.device, p.dtype
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(batch, H, hd, generator=g).to(dev, dt)
    k = torch.randn(batch, H_kv, context, hd, generator=g).to(dev, dt)
    v = torch.randn(batch, H_kv, context, hd, generator=g).to(dev, dt)
    lens = torch.full((batch,), context, device=dev, dtype=torch.int32)
    qc = q[:, :, None]  # (B, H, 1, hd)
    contiguous = lambda: torch.nn.functional.scaled_dot_product_attention(qc, k, v, enable_gqa=True)  # noqa: E731
    rows, check = [], ""
    for bs in block_sizes:
        per = blocks_for(context, bs)
        perm = torch.randperm(batch * per, generator=g)
        tables = perm.view(batch, per).to(device=dev, dtype=torch.int32)
        pool = torch.zeros(batch * per * bs, H_kv, hd, device=dev, dtype=dt)
        slots = (tables.long()[:, :, None] * bs + torch.arange(bs, device=dev)).view(batch, -1)[:, :context]
        kp, vp = pool.clone(), pool.clone()
        kp[slots.reshape(-1)] = k.transpose(1, 2).reshape(-1, H_kv, hd)
        vp[slots.reshape(-1)] = v.transpose(1, 2).reshape(-1, H_kv, hd)
        kp, vp = kp.view(-1, bs, H_kv, hd), vp.view(-1, bs, H_kv, hd)
        fns = {"contiguous": contiguous,
               "paged torch": lambda: paged_attention.paged_decode_torch(q, kp, vp, tables, lens)}
        if dev.type == "cuda" and paged_attention.TRITON_MISSING is None:
            fns["paged triton"] = lambda: paged_attention.paged_decode_triton(q, kp, vp, tables, lens, max_len=context)
        t = bench.benchmark_interleaved(fns, reps=reps, warmup=2, device=dev.type)
        want = contiguous()[:, :, 0].float()
        err = (fns["paged torch"]() - want).abs().max().item()
        row = {"block size": bs, "contiguous us": 1e6 * t["contiguous"].median,
               "paged torch us": 1e6 * t["paged torch"].median, "paged triton us": None,
               "spread %": 100 * max(x.spread for x in t.values()), "max |err| torch": err}
        if "paged triton" in t:
            row["paged triton us"] = 1e6 * t["paged triton"].median
            row["max |err| triton"] = (fns["paged triton"]() - want).abs().max().item()
        rows.append(row)
    if dev.type != "cuda" and paged_attention.TRITON_MISSING is None:  # correctness only, in the interpreter
        small = min(context, 40)
        per = blocks_for(small, block_sizes[0])
        kp = torch.randn(batch * per, block_sizes[0], H_kv, hd, generator=g)
        vp = torch.randn_like(kp)
        tables = torch.randperm(batch * per, generator=g).view(batch, per).int()
        lens_s = torch.full((batch,), small)
        qs = q.float().cpu()
        err = (paged_attention.paged_decode_triton(qs, kp, vp, tables, lens_s)
               - paged_attention.paged_decode_torch(qs, kp, vp, tables, lens_s)).abs().max().item()
        check = (f"The Triton kernel ran in Triton's interpreter (no CUDA): at {small} tokens x {batch} sequences it "
                 f"matches the PyTorch paged decode to {err:.1e} (tolerance 1e-5); the interpreter is not timed.")
    elif paged_attention.TRITON_MISSING is not None:
        check = f"The Triton kernel is skipped: {paged_attention.TRITON_MISSING}."
    return rows, check


def _speed_sentence(rows: list[dict], batch: int, context: int) -> str:
    """One sentence on paged vs contiguous decode-attention time, from the measured rows."""
    parts, best = [], None
    for impl in ("paged torch", "paged triton"):
        ratios = [(r[f"{impl} us"] / r["contiguous us"], r["block size"]) for r in rows if r[f"{impl} us"]]
        if ratios:
            lo, hi = min(ratios), max(ratios)
            parts.append(f"{impl} {lo[0]:.2f}x (block size {lo[1]})" + (f" to {hi[0]:.2f}x" if len(ratios) > 1 else ""))
            if impl == "paged triton":
                best = lo
    text = (f"Decode attention over {batch} sequences of {context} tokens in scattered blocks takes "
            + " and ".join(parts) + " the time of contiguous SDPA")
    if best is not None:
        text += (f"; at its best block size the Triton kernel is {'within' if best[0] <= 1.10 else 'not within'} "
                 f"10% of contiguous (the course's target, stated for 4k tokens)")
    return text + "."


def paged_section(model, *, block_sizes: Sequence[int] = (4, 16, 64), n_requests: int = 24, seed: int = 0,
                  max_new_tokens: int | None = None, corpus: torch.Tensor | None = None, batch: int = 8,
                  context: int = 256, reps: int = 5, show: bool = True) -> dict:
    """Notebook 10, "Paged KV cache": memory waste paged vs preallocated, and block size vs waste and speed.

    Waste: every request of a seeded mix (`n_requests`, lengths heavy-tailed, see make_requests) at its
    final length L = prompt + output, held (a) in blocks of each size in `block_sizes`, measured from
    the block tables of a PagedKVCache (and checked against ceil(L/b)*b), (b) preallocated to the
    model's seq_len, (c) preallocated to prompt + the `max_new_tokens` cap (default seq_len // 2).
    Speed: decode attention of `batch` sequences of `context` tokens through randomly scattered block
    tables, timed interleaved (`reps` rounds) against contiguous SDPA; the Triton kernel is timed on
    CUDA and only checked (interpreter) elsewhere. Prints two tables and a sentence, draws a figure;
    returns {"waste": rows, "speed": rows, "figure": fig, "sentence": str}.
    """
    positives("block_sizes", block_sizes)
    for name, value in (("n_requests", n_requests), ("batch", batch), ("context", context), ("reps", reps)):
        positive(name, value)
    reqs, cap = _mix_for(model, n_requests, seed, None, corpus, max_new_tokens)
    lengths = [len(r.prompt) + r.output_len for r in reqs]
    seq_len = model.config.seq_len
    waste_rows = []
    for label, w in (("preallocate seq_len", paged.waste(lengths, reserve=seq_len)),
                     ("preallocate prompt + cap", paged.waste(lengths, reserve=[len(r.prompt) + cap for r in reqs]))):
        waste_rows.append({"scheme": label, "block size": None, **w})
    for bs in block_sizes:
        cache = PagedKVCache(1, 1, 1, num_blocks=sum(blocks_for(L, bs) for L in lengths), block_size=bs)
        for r, L in zip(reqs, lengths):
            cache.add(r.rid)
            cache.reserve(r.rid, L)
        allocated = cache.allocator.num_used * bs  # read from the block tables
        w = paged.waste(lengths, block_size=bs)
        if allocated != w["allocated"]:
            raise AssertionError(f"block tables hold {allocated} slots, ceil(L/b)*b gives {w['allocated']}")
        waste_rows.append({"scheme": "paged", "block size": bs, **w})
    print(tables.table(["scheme", "block size", "allocated slots", "used slots", "wasted", "waste %"],
                       [[r["scheme"], r["block size"], r["allocated"], r["used"], r["wasted"], 100 * r["fraction"]]
                        for r in waste_rows]))
    speed_rows, check = _decode_speed(model, list(block_sizes), batch=batch, context=context, reps=reps, seed=seed)
    print()
    print(tables.table(["block size", "contiguous us", "paged torch us", "paged triton us", "spread %"],
                       [[r["block size"], r["contiguous us"], r["paged torch us"], r["paged triton us"], r["spread %"]]
                        for r in speed_rows]))
    paged_w = [r for r in waste_rows if r["scheme"] == "paged"]
    worst = max(paged_w, key=lambda r: r["fraction"])
    sentence = (f"On this mix of {n_requests} requests, paged blocks waste {100 * min(r['fraction'] for r in paged_w):.1f}-"
                f"{100 * worst['fraction']:.1f}% of the slots they allocate (block size {worst['block size']} wastes most), "
                f"against {100 * waste_rows[0]['fraction']:.0f}% when each request preallocates seq_len={seq_len} and "
                f"{100 * waste_rows[1]['fraction']:.0f}% when it preallocates prompt + {cap}. "
                f"{_speed_sentence(speed_rows, batch, context)} {check}")
    print()
    print(sentence)
    fig, (ax1, ax2) = plots.figure(ncols=2, figsize=(11, 3.8))
    xs = [r["block size"] for r in paged_w]
    plots.sweep(xs, {"paged": [100 * r["fraction"] for r in paged_w]}, xlabel="block size (tokens)",
                ylabel="KV slots wasted (%)", title="Waste on the request mix", logx=True, logy=False,
                hlines={r["scheme"]: 100 * r["fraction"] for r in waste_rows[:2]}, ax=ax1)
    series = {"paged torch": [r["paged torch us"] for r in speed_rows],
              "paged triton": [r["paged triton us"] for r in speed_rows]}
    plots.sweep(xs, series, xlabel="block size (tokens)", ylabel="decode attention (us)", logx=True,
                title=f"{batch} x {context} tokens", hlines={"contiguous (mean)": sum(
                    r["contiguous us"] for r in speed_rows) / len(speed_rows)}, ax=ax2)
    if not show:
        plt.close(fig)
    return {"waste": waste_rows, "speed": speed_rows, "figure": fig, "sentence": sentence}


def batching_section(model, *, n_requests: int = 16, max_batch: int = 8, block_size: int = 16,
                     num_blocks: int | None = None, arrival_rate: float | None = 2.0, seed: int = 0,
                     max_new_tokens: int | None = None, corpus: torch.Tensor | None = None, impl: str = "torch",
                     repeats: int = 1, tight_pool: bool = True, check_solo: bool = True, show: bool = True) -> dict:
    """Notebook 10, "Continuous batching": static vs continuous on the same request mix and KV memory.

    Both policies serve the same seeded mix (arrivals: `arrival_rate` per iteration) greedily with the
    same pool of `num_blocks` blocks (default: room for max_batch // 2 requests at prompt + cap, so
    static batching, which preallocates that much per request, runs about max_batch // 2 at a time,
    while continuous batching fits as many as their actual lengths allow, up to max_batch). Prints a
    table (tokens/s, TTFT and TPOT p50/p99, waste, preemptions) and a sentence, draws a figure.
    With `repeats` > 1 each policy runs that many times, interleaved, and the run with the median
    tokens/s is reported, with the spread ("noise"). With `tight_pool`, continuous batching also runs
    with half the blocks, where it must preempt, to show that no request's tokens change. With
    `check_solo`, every request is also served alone (`solo_tokens`) and the sentence counts the
    requests whose batched tokens equal their solo ones. Returns {"rows", "runs", "speedup",
    "same_tokens", "solo_matches", "sentence", "noise", "figure", "record"}.
    """
    for name, value in (("n_requests", n_requests), ("max_batch", max_batch), ("block_size", block_size),
                        ("repeats", repeats)):
        positive(name, value)
    reqs, cap = _mix_for(model, n_requests, seed, arrival_rate, corpus, max_new_tokens)
    longest = max(len(r.prompt) for r in reqs) + cap
    if num_blocks is None:
        num_blocks = max(1, max_batch // 2) * blocks_for(longest, block_size)
    tries: dict[str, list[ServeRun]] = {p: [] for p in POLICIES}
    for i in range(repeats):  # interleaved, alternating which policy goes first: drift hits both alike
        for p in (POLICIES if i % 2 == 0 else POLICIES[::-1]):
            tries[p].append(serve(model, reqs, policy=p, num_blocks=num_blocks, block_size=block_size,
                                  max_batch=max_batch, max_new_tokens=cap, impl=impl))
    runs = {p: sorted(tries[p], key=lambda r: r.tokens_per_s)[(repeats - 1) // 2] for p in POLICIES}  # the median
    spread = max((max(r.tokens_per_s for r in t) - min(r.tokens_per_s for r in t)) / runs[p].tokens_per_s
                 for p, t in tries.items())
    noise = (f"Median of {repeats} interleaved runs per policy; their tokens/s varied by up to {100 * spread:.0f}% "
             f"of the median." if repeats > 1 else
             "One run per policy (repeats=1), so this run's noise is not measured.")
    rows = [runs[p].row() for p in POLICIES]
    tight_note = ""
    if tight_pool:  # the same mix with half the blocks: preemption, and nothing lost
        half = max(blocks_for(longest, block_size), num_blocks // 2)
        tight = serve(model, reqs, policy="continuous", num_blocks=half, block_size=block_size, max_batch=max_batch,
                      max_new_tokens=cap, impl=impl)
        rows.append(tight.row() | {"policy": f"continuous, {half} blocks"})
        kept = sum(tight.tokens[r.rid] == runs["continuous"].tokens[r.rid] for r in reqs)
        tight_note = (f" With {half} blocks instead of {num_blocks}, continuous batching preempted {tight.preemptions} "
                      f"time(s) and {kept} of {n_requests} requests produced the same tokens as with the full pool.")
        runs = runs | {"continuous, tight": tight}
    print(tables.table(list(rows[0]), [list(r.values()) for r in rows]))
    st, co = runs["static"], runs["continuous"]
    speedup = co.tokens_per_s / st.tokens_per_s
    same = sum(st.tokens[r.rid] == co.tokens[r.rid] for r in reqs)
    solo_matches, solo_note = {}, ""
    if check_solo:  # greedy tokens of each request served alone: what batching must not change
        solo = {r.rid: solo_tokens(model, r, block_size=block_size, impl=impl) for r in reqs}
        solo_matches = {name: sum(run.tokens[r.rid] == solo[r.rid] for r in reqs) for name, run in runs.items()}
        label = {"static": "static batching", "continuous": "continuous batching",
                 "continuous, tight": "continuous batching with half the blocks"}
        solo_note = (" Against each request served alone, the greedy tokens matched for " + ", ".join(
            f"{k} of {n_requests} under {label[name]}" for name, k in solo_matches.items()) + ".")
    faster = "faster" if speedup > 1 else "slower"
    sentence = (f"Same {n_requests} requests, same {num_blocks} blocks of {block_size} tokens: continuous batching "
                f"generates {co.tokens_per_s:.0f} tokens/s against static batching's {st.tokens_per_s:.0f} "
                f"({speedup:.2f}x, {faster}); median time to first token {1e3 * co.percentile('ttft', 50):.0f} ms "
                f"against {1e3 * st.percentile('ttft', 50):.0f} ms, p99 {1e3 * co.percentile('ttft', 99):.0f} against "
                f"{1e3 * st.percentile('ttft', 99):.0f} ms; KV waste {100 * co.waste_fraction:.0f}% against "
                f"{100 * st.waste_fraction:.0f}%, with {co.preemptions} preemption(s). {same} of {n_requests} "
                f"requests produced identical tokens under both policies.{tight_note}{solo_note} {noise}")
    print()
    print(sentence)
    fig, axes = plots.figure(ncols=3, figsize=(13, 3.8))
    plots.bars({p: runs[p].tokens_per_s for p in POLICIES}, ylabel="tokens/s", title="Throughput", ax=axes[0],
               logy=False)
    for ax, metric, title in ((axes[1], "ttft", "Time to first token"), (axes[2], "tpot", "Time per output token")):
        plots.bars({f"{p} p{q}": 1e3 * runs[p].percentile(metric, q) for p in POLICIES for q in (50, 99)},
                   ylabel="ms", title=title, ax=ax, logy=False)
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    if not show:
        plt.close(fig)
    record = {f"{p}_{k}": v for p in POLICIES for k, v in
              (("tokens_per_s", runs[p].tokens_per_s), ("ttft_p50_s", runs[p].percentile("ttft", 50)),
               ("ttft_p99_s", runs[p].percentile("ttft", 99)), ("tpot_p50_s", runs[p].percentile("tpot", 50)),
               ("tpot_p99_s", runs[p].percentile("tpot", 99)), ("kv_waste", runs[p].waste_fraction),
               ("preemptions", runs[p].preemptions))}
    record |= {"speedup": speedup, "num_blocks": num_blocks, "block_size": block_size, "n_requests": n_requests,
               "max_batch": max_batch, "same_tokens": same}
    record["tokens_per_s_spread"] = spread
    if tight_pool:
        record |= {"tight_num_blocks": half, "tight_preemptions": runs["continuous, tight"].preemptions,
                   "tight_same_tokens": kept}
    record |= {f"solo_matches_{name.replace(', ', '_')}": k for name, k in solo_matches.items()}
    return {"rows": rows, "runs": runs, "speedup": speedup, "same_tokens": same, "solo_matches": solo_matches,
            "sentence": sentence,
            "noise": noise, "figure": fig, "record": record}


# ---------------------------------------------------------------- the panel: memory, waste, throughput (1.3B-sized)


def request_mix(name: str, n: int, max_len: int, seed: int = 0) -> list[int]:
    """Token lengths of n requests: 'uniform' (1..max_len) or 'heavy-tailed' (a log-normal, many short and a
    few long), clipped to 1..max_len."""
    g = torch.Generator().manual_seed(seed)
    if name == "uniform":
        lens = torch.randint(1, max_len + 1, (n,), generator=g)
    elif name == "heavy-tailed":
        lens = torch.exp(torch.randn(n, generator=g) * 1.0 + math.log(max_len / 8)).round().long()
    else:
        raise ValueError(f"mix={name!r}; choose 'uniform' or 'heavy-tailed'")
    return lens.clamp(1, max_len).tolist()


def serving_estimate(lengths: list[int], max_len: int, bytes_per_token: float, block: int, budget_bytes: float,
                     weight_bytes_: float, gbps: float) -> dict:
    """Memory and throughput of serving `lengths` two ways. Preallocating max_len per request reserves
    max_len tokens each; paging reserves whole blocks of `block` tokens. Waste = reserved but unused / reserved.
    Throughput is a bandwidth model from this run's measured GB/s: as many requests as the budget holds decode
    together, one step reading the weights once plus their K/V (tokens/s = batch / step time)."""
    used = sum(lengths)
    pre = len(lengths) * max_len
    paged_reserved = sum(-(-n // block) * block for n in lengths)
    out = {"used_tokens": used}
    for name, reserved_per_req in (("preallocated", [max_len] * len(lengths)),
                                   ("paged", [-(-n // block) * block for n in lengths])):
        reserved = pre if name == "preallocated" else paged_reserved
        free = max(0.0, budget_bytes - weight_bytes_)
        batch, total = 0, 0.0
        for r in reserved_per_req:  # admit requests in order while their reservation fits
            if total + r * bytes_per_token > free:
                break
            total += r * bytes_per_token
            batch += 1
        mean_ctx = sum(lengths[:batch]) / batch if batch else 0.0
        step_s = (weight_bytes_ + batch * mean_ctx * bytes_per_token) / (gbps * 1e9)
        out[name] = {"reserved_tokens": reserved, "waste": 1 - used / reserved, "batch": batch,
                     "tokens_per_s": batch / step_s if batch else 0.0}
    return out


def serving_panel(kv_heads: int = 8, block: int = 16, mix: str = "heavy-tailed", budget_gb: float = 8.0, *,
                  weight_bytes_: float, gbps: float, n_requests: int = 64, max_len: int = 2048, seed: int = 0,
                  show: bool = True) -> dict:
    """Notebook 10's panel callback for a 1.3B-sized model (24 layers, head_dim 64, bf16): `n_requests` of `mix`
    served preallocated (max_len each) or paged (blocks of `block`) in `budget_gb` GB with weights of
    `weight_bytes_`; prints a table, draws the waste bars and returns `serving_estimate`'s dict."""
    lens = request_mix(mix, n_requests, max_len, seed=seed)
    est = serving_estimate(lens, max_len, kv_bytes_per_token(24, kv_heads, 64, 2), block, budget_gb * 1e9,
                           weight_bytes_, gbps)
    if show:
        print(tables.table(["layout", "reserved tokens", "waste", "requests admitted", "est. tokens/s"],
                           [[k, est[k]["reserved_tokens"], f"{est[k]['waste']:.1%}", est[k]["batch"],
                             est[k]["tokens_per_s"]] for k in ("preallocated", "paged")]))
        plots.bars({k: 100 * est[k]["waste"] for k in ("preallocated", "paged")},
                   ylabel="% of reserved KV memory unused",
                   title=f"{mix}, {kv_heads} kv heads, block {block}, {budget_gb:g} GB: "
                         f"{est['preallocated']['batch']} vs {est['paged']['batch']} requests admitted")
    return est


# ---------------------------------------------------------------- the paged-waste claim at this run's scale


def paged_waste_verdict(fraction: float, block_size: int, mean_tokens: float, min_ratio: float = 25.0) -> dict:
    """Judge the vLLM paper's "under 4% of KV memory wasted" on a measured paged-cache waste `fraction` (0-1).

    A paged cache wastes about half a block per request (the last block's empty tail), so the expected waste
    is (block_size / 2) / mean_tokens: on requests only a few blocks long it exceeds 4% whatever the allocator
    does. The claim is therefore judged only when `mean_tokens` >= `min_ratio` x `block_size`; otherwise the
    verdict is "not testable" with that reason. Returns {"verdict", "expected" (0-1), "reason" (str or None)}.
    Raises ValueError for a block_size, mean_tokens or min_ratio that is not positive."""
    positive("block_size", block_size)
    for name, value in (("mean_tokens", mean_tokens), ("min_ratio", min_ratio)):
        positive(name, float(value) if type(value) is int else value, float)
    expected = (block_size / 2) / mean_tokens
    if mean_tokens < min_ratio * block_size:
        return {"verdict": "not testable", "expected": expected,
                "reason": f"requests average {mean_tokens:.0f} tokens, under {min_ratio:g} blocks of {block_size}: "
                          f"half a block per request alone is {100 * expected:.1f}% expected waste, a scale effect "
                          f"of this small run, not the allocator"}
    return {"verdict": "supported" if fraction < 0.04 else "contradicted", "expected": expected, "reason": None}
