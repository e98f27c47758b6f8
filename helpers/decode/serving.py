"""Serving the course GPT: a request mix, static batching, and continuous batching on the paged KV cache.

* `make_requests`: a seeded request mix, arrivals as a Poisson process counted in scheduler
  iterations and heavy-tailed (log-normal) prompt and output lengths.
* `serve(model, requests, policy=...)`: one scheduler loop, greedy decoding, two policies:
  - "static" (the baseline): take the requests that have arrived, up to `max_batch`, each with KV
    slots preallocated for its prompt plus the server's `max_new_tokens` cap; run the batch until
    its last member finishes; only then take the next batch. A finished member stops computing, but
    its slots and its place in the batch stay empty until the batch is done.
  - "continuous" (Yu et al., 2022, Orca's iteration-level scheduling; Kwon et al., 2023, vLLM's
    block-limited admission and preemption): every iteration, admit waiting requests while the
    batch has room and the free list has blocks for their prompts (prefill them), then decode one
    token for every request already running; a request leaves the moment it finishes and its blocks
    go back to the free list. When a decode needs a block and none is free, the request admitted
    last is preempted: its blocks are freed and it goes back to the front of the queue with the
    tokens it has produced, to be resumed by recomputing the prefill of prompt + those tokens.
  Both return a `ServeRun`: each request's tokens, time to first token and time per output token
  (p50 and p99), tokens/s and the KV memory wasted (allocated - used slots, averaged over iterations).
* `solo_tokens`: a request served alone, the reference every batched run must reproduce.
* `shared_prefix_generate`: requests that share a prompt, served on shared blocks with copy-on-write
  (`PagedKVCache.fork`) or on their own blocks, for the comparison of tokens, logits and block counts.
* `chunked_prefill`: a long prompt prefilled in chunks interleaved with other requests' decode steps.

The schedule is deterministic: arrivals are counted in iterations (request i joins the queue at
the start of iteration `arrival`), so the same seed gives the same batches on every machine; the
times are the measured wall-clock durations of those iterations (an idle wait for the next arrival
costs no time). A request's first token comes from its prefill, in the iteration that admitted it.

Notebook 10's measured sections on top of this scheduler (paged waste and speed, static against
continuous batching) are `helpers.decode.serving_lab`.
"""
from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from helpers.decode.paged import PagedKVCache, blocks_for
from helpers.measure.params import positive

POLICIES = ("static", "continuous")


@dataclass(frozen=True)
class Request:
    """One request: `prompt` token ids, `output_len` tokens it will produce (its end, as an EOS would
    mark it), and `arrival`, the scheduler iteration at whose start it joins the queue."""

    rid: int
    prompt: tuple[int, ...]
    output_len: int
    arrival: int = 0


def _lognormal_lengths(rng: random.Random, n: int, median: int, sigma: float, lo: int, hi: int) -> list[int]:
    return [min(hi, max(lo, round(median * math.exp(rng.gauss(0.0, sigma))))) for _ in range(n)]


def make_requests(n: int, *, seed: int = 0, vocab_size: int = 256, max_len: int = 128,
                  prompt_median: int = 16, output_median: int = 16, sigma: float = 0.8,
                  max_new_tokens: int | None = None, arrival_rate: float | None = 1.0,
                  corpus: torch.Tensor | None = None) -> list[Request]:
    """`n` seeded requests with heavy-tailed (log-normal) prompt and output lengths.

    Lengths are median * exp(sigma * N(0, 1)), clipped so that prompt + max_new_tokens <= max_len
    (the model's seq_len) and output_len <= max_new_tokens (default: max_len // 2). Arrivals: a
    Poisson process with `arrival_rate` requests per iteration (None: all arrive at iteration 0).
    Prompts are random slices of `corpus` (1-D token ids) when given, else uniform random tokens.
    Raises ValueError for sizes that cannot fit.
    """
    max_new = max_len // 2 if max_new_tokens is None else max_new_tokens
    positive("n", n)
    positive("max_new_tokens", max_new)
    if max_len - max_new < 1 or sigma < 0:
        raise ValueError(f"need max_new_tokens={max_new} < max_len={max_len} and sigma={sigma} >= 0")
    if arrival_rate is not None:  # None: everything arrives at once
        positive("arrival_rate", float(arrival_rate) if type(arrival_rate) is int else arrival_rate, float)
    rng = random.Random(seed)
    prompts = _lognormal_lengths(rng, n, prompt_median, sigma, 1, max_len - max_new)
    outputs = _lognormal_lengths(rng, n, output_median, sigma, 1, max_new)
    t, out = 0.0, []
    for i in range(n):
        if corpus is not None:
            start = rng.randrange(0, max(1, corpus.numel() - prompts[i]))
            toks = tuple(int(x) for x in corpus[start:start + prompts[i]])
        else:
            toks = tuple(rng.randrange(vocab_size) for _ in range(prompts[i]))
        out.append(Request(i, toks, outputs[i], int(t)))
        if arrival_rate is not None:
            t += rng.expovariate(arrival_rate)
    return out


@dataclass
class _Live:
    """A request being served: the tokens produced so far and its timestamps (seconds of run time)."""

    req: Request
    out: list[int] = field(default_factory=list)
    arrived_s: float = 0.0
    first_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0

    @property
    def done(self) -> bool:
        return len(self.out) >= self.req.output_len


@dataclass
class ServeRun:
    """What `serve` measured. Times in seconds of run time (sum of iteration durations)."""

    policy: str
    tokens: dict[int, list[int]]  # request id -> generated tokens
    ttft: dict[int, float]  # request id -> time to first token (s)
    tpot: dict[int, float]  # request id -> mean time per output token after the first (s); outputs > 1 only
    wall_s: float
    iterations: int
    preemptions: int
    waste_fraction: float  # mean over iterations of (allocated - used) / allocated KV slots
    peak_blocks: int
    finished_order: list[int]

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of run time."""
        return sum(map(len, self.tokens.values())) / self.wall_s if self.wall_s > 0 else float("nan")

    def percentile(self, metric: str, q: float) -> float:
        """The q-th percentile (0-100, nearest rank) of 'ttft' or 'tpot' over requests, in seconds."""
        values = sorted(getattr(self, metric).values())
        if not values:
            return float("nan")
        return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]

    def row(self) -> dict:
        """The headline numbers: tokens/s, TTFT and TPOT p50/p99 (ms), waste (%), preemptions."""
        return {"policy": self.policy, "tokens/s": self.tokens_per_s,
                "TTFT p50 ms": 1e3 * self.percentile("ttft", 50), "TTFT p99 ms": 1e3 * self.percentile("ttft", 99),
                "TPOT p50 ms": 1e3 * self.percentile("tpot", 50), "TPOT p99 ms": 1e3 * self.percentile("tpot", 99),
                "KV waste %": 100 * self.waste_fraction, "peak blocks": self.peak_blocks,
                "preemptions": self.preemptions, "iterations": self.iterations}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def _step(model, cache: PagedKVCache, lives: Sequence[_Live], inputs: Sequence[Sequence[int]]) -> list[int]:
    """One forward over the given sequences (same number of new tokens each); their greedy next tokens."""
    device = cache.k_pool.device
    cache.set_batch([lv.req.rid for lv in lives])
    idx = torch.tensor([list(x) for x in inputs], dtype=torch.long, device=device)  # (B, T)
    logits, _ = model(idx, cache=cache)
    return logits[:, -1].argmax(-1).tolist()


def serve(model, requests: Sequence[Request], *, policy: str = "continuous", num_blocks: int = 64,
          block_size: int = 16, max_batch: int = 8, max_new_tokens: int | None = None, impl: str = "torch",
          clock: Callable[[], float] | None = None) -> ServeRun:
    """Serve `requests` greedily with the course GPT `model` on a paged KV cache of `num_blocks` blocks.

    policy: "static" or "continuous" (see the module docstring). max_new_tokens: the server's cap,
    which static batching preallocates for (default: the longest output_len of the mix). impl: the
    decode attention ("torch" or "triton"). clock: seconds, default time.perf_counter (CUDA is
    synchronised before each reading). Raises ValueError when a request could never fit the pool or
    the model's seq_len.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is unknown; choose one of {', '.join(map(repr, POLICIES))}")
    for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_batch", max_batch)):
        positive(name, value)
    if not requests or len({r.rid for r in requests}) != len(requests):
        raise ValueError("requests must be non-empty with distinct ids")
    cap = max(r.output_len for r in requests) if max_new_tokens is None else max_new_tokens
    for r in requests:
        full = len(r.prompt) + cap
        if r.output_len < 1 or not r.prompt or r.output_len > cap:
            raise ValueError(f"request {r.rid}: needs a prompt and 1 <= output_len={r.output_len} <= cap={cap}")
        if full > model.config.seq_len:
            raise ValueError(f"request {r.rid}: prompt + {cap} new tokens = {full} > seq_len={model.config.seq_len}")
        if blocks_for(full, block_size) > num_blocks:
            raise ValueError(f"request {r.rid} needs {blocks_for(full, block_size)} blocks alone; "
                             f"the pool has {num_blocks}")
    cache = PagedKVCache.for_model(model, num_blocks=num_blocks, block_size=block_size, impl=impl)
    device, clock = cache.k_pool.device, clock or time.perf_counter
    pending = deque(sorted(requests, key=lambda r: (r.arrival, r.rid)))
    waiting: deque[_Live] = deque()  # arrived (or preempted), not holding blocks
    running: list[_Live] = []  # holding blocks, in order of admission
    done: list[_Live] = []
    now, it, preemptions, peak, waste_sum, waste_n = 0.0, 0, 0, 0, 0.0, 0

    def admit(lv: _Live, reserve: int | None) -> tuple[_Live, int]:
        """Prefill prompt + tokens produced so far (a resumed request recomputes them); its next token."""
        waiting.popleft()
        cache.add(lv.req.rid)
        if reserve is not None:
            cache.reserve(lv.req.rid, reserve)
        running.append(lv)
        return lv, _step(model, cache, [lv], [list(lv.req.prompt) + lv.out])[0]

    def preempt_for(lv: _Live, decoding: list[_Live]) -> None:
        """Free the last-admitted requests until lv has a slot for its next token (or lv itself is freed); take it."""
        nonlocal preemptions
        while cache.blocks_needed([lv.req.rid], 1) > cache.allocator.num_free:
            victim = running.pop()
            cache.free(victim.req.rid)
            victim.preemptions += 1
            preemptions += 1
            waiting.appendleft(victim)
            if victim in decoding:
                decoding.remove(victim)
            if victim is lv:
                return
        cache.reserve(lv.req.rid, cache.lengths[lv.req.rid] + 1)  # take the block now, before the next request

    was_training = model.training
    model.eval()
    while pending or waiting or running:
        if not waiting and not running and pending[0].arrival > it:
            it = pending[0].arrival  # idle until the next arrival: no time passes
        while pending and pending[0].arrival <= it:
            waiting.append(_Live(pending.popleft(), arrived_s=now))
        _sync(device)
        t0 = clock()
        produced: list[tuple[_Live, int]] = []
        if policy == "continuous" or not running:  # static: a new batch only when the last one is done
            while waiting and len(running) < max_batch:
                lv = waiting[0]
                held = len(lv.req.prompt) + (len(lv.out) if policy == "continuous" else cap)
                if blocks_for(held, block_size) > cache.allocator.num_free:
                    break  # admission is limited by free KV blocks
                produced.append(admit(lv, None if policy == "continuous" else held))
        fresh = {id(lv) for lv, _ in produced}
        decoding = [lv for lv in running if id(lv) not in fresh and not lv.done]
        if policy == "continuous":
            for lv in list(decoding):
                if lv in decoding:
                    preempt_for(lv, decoding)
        if decoding:
            produced += zip(decoding, _step(model, cache, decoding, [[lv.out[-1]] for lv in decoding]))
        alloc, used = cache.slots()
        peak = max(peak, cache.allocator.num_used)
        if alloc:
            waste_sum, waste_n = waste_sum + (alloc - used) / alloc, waste_n + 1
        _sync(device)
        now += clock() - t0
        for lv, tok in produced:  # tokens are ready when their iteration ends
            lv.out.append(tok)
            lv.first_s = now if lv.first_s is None else lv.first_s
            if lv.done:
                lv.finish_s = now
                done.append(lv)
                if lv in waiting:  # preempted in the iteration that finished it: nothing left to do
                    waiting.remove(lv)
        if policy == "continuous" or all(lv.done for lv in running):
            for lv in [lv for lv in running if lv.done]:
                running.remove(lv)
                cache.free(lv.req.rid)
        it += 1
    model.train(was_training)
    if cache.allocator.num_used or cache.tables:
        raise RuntimeError("blocks leaked: the scheduler ended with blocks still allocated")
    return ServeRun(
        policy=policy, tokens={lv.req.rid: lv.out for lv in done},
        ttft={lv.req.rid: lv.first_s - lv.arrived_s for lv in done},
        tpot={lv.req.rid: (lv.finish_s - lv.first_s) / (len(lv.out) - 1) for lv in done if len(lv.out) > 1},
        wall_s=now, iterations=it, preemptions=preemptions, waste_fraction=waste_sum / max(1, waste_n),
        peak_blocks=peak, finished_order=[lv.req.rid for lv in done])


def solo_tokens(model, request: Request, *, block_size: int = 16, impl: str = "torch") -> list[int]:
    """The greedy tokens `request` gets when it is served alone (the reference for batched runs)."""
    alone = Request(request.rid, request.prompt, request.output_len, 0)
    need = blocks_for(len(request.prompt) + request.output_len, block_size)
    return serve(model, [alone], num_blocks=need, block_size=block_size, max_batch=1, impl=impl,
                 max_new_tokens=request.output_len).tokens[request.rid]


# ---------------------------------------------------------------- prefix sharing and chunked prefill


@dataclass
class SharedPrefixRun:
    """What `shared_prefix_generate` produced: each request's greedy tokens, the logits of every position it
    computed after the prompt (suffix and generated tokens, (n_requests, T, vocab)), and the cache's block
    counts at the end, before anything is freed: `physical` blocks held, `logical` blocks the tables name
    (what an unshared cache holds for the same tokens), `cow_copies` blocks copied on a shared write."""

    tokens: list[list[int]]
    logits: torch.Tensor
    physical: int
    logical: int
    cow_copies: int


@torch.no_grad()
def shared_prefix_generate(model, prompt: Sequence[int], suffixes: Sequence[Sequence[int]], new_tokens: int, *,
                           block_size: int = 16, share: bool = True) -> SharedPrefixRun:
    """Requests i = `prompt` + `suffixes[i]` (all suffixes one length), each continued greedily by
    `new_tokens` tokens, on one paged cache (the vLLM paper's prefix sharing, section 4.4).

    share=True: the prompt is prefilled once, as its own sequence; every request is `fork`ed from it (its
    blocks shared, counts + 1) and the prompt's own entry is freed, so only the requests hold the blocks.
    The requests' suffixes and decode steps then run as one batch; a request that writes into a block others
    still hold (the prompt's partly filled last block) gets a private copy first (copy-on-write), and the last
    holder writes in place. share=False: each request prefills the prompt into its own blocks, in one batch
    of the same requests, then the same suffix and decode steps. Raises ValueError for an empty prompt or
    suffix list, suffixes of different lengths, or new_tokens < 1.
    """
    positive("new_tokens", new_tokens)
    if not prompt or not suffixes or len({len(s) for s in suffixes}) != 1 or not suffixes[0]:
        raise ValueError("need a non-empty prompt and one or more non-empty suffixes of the same length")
    n, total = len(suffixes), len(prompt) + len(suffixes[0]) + new_tokens
    cache = PagedKVCache.for_model(model, num_blocks=n * blocks_for(total, block_size) + 1, block_size=block_size)
    dev = cache.k_pool.device
    rids = list(range(n))

    def forward(sids, rows):
        cache.set_batch(sids)
        return model(torch.tensor(rows, dtype=torch.long, device=dev), cache=cache)[0]

    if share:
        cache.add("prompt")
        forward(["prompt"], [list(prompt)])
        for r in rids:
            cache.fork("prompt", r)
        cache.free("prompt")
    else:
        for r in rids:
            cache.add(r)
        forward(rids, [list(prompt)] * n)
    logits = [forward(rids, [list(s) for s in suffixes])]
    out = [[t] for t in logits[-1][:, -1].argmax(-1).tolist()]
    for _ in range(new_tokens - 1):
        logits.append(forward(rids, [[o[-1]] for o in out]))
        for o, t in zip(out, logits[-1][:, -1].argmax(-1).tolist()):
            o.append(t)
    return SharedPrefixRun(out, torch.cat(logits, 1), cache.allocator.num_used, cache.logical_blocks(),
                           cache.cow_copies)


@torch.no_grad()
def chunked_prefill(model, prompt: Sequence[int], chunk: int, *, others: Sequence[Sequence[int]] = (),
                    decode_steps: int | None = None, block_size: int = 16) -> tuple[torch.Tensor, list[list[int]]]:
    """Prefill `prompt` in chunks of `chunk` tokens, each chunk one forward over the cached earlier chunks,
    interleaved with greedy decode steps of the requests `others` (their prompts, prefilled first), as a
    scheduler does so that a long prompt never stalls the running requests for a whole prefill (Agrawal et
    al., 2023, Sarathi; vLLM's chunked prefill).

    Each iteration runs one chunk of `prompt`, then one decode step of every request in `others`; after the
    prompt's last chunk the others go on until each has `decode_steps` tokens (default: the number of
    chunks). Returns (the prompt's logits at every position, (len(prompt), vocab); each other request's
    greedy tokens). With chunk >= len(prompt) this is a plain prefill. Raises ValueError for an empty prompt,
    chunk < 1, an empty prompt in `others`, or a request that would pass the model's seq_len.
    """
    positive("chunk", chunk)
    if not prompt or any(not o for o in others):
        raise ValueError("the prompt and every request of `others` need at least one token")
    n_chunks = blocks_for(len(prompt), chunk)
    steps = n_chunks if decode_steps is None else decode_steps
    if steps < n_chunks:
        raise ValueError(f"decode_steps={steps} must cover the {n_chunks} chunk iterations")
    longest = max([len(prompt)] + [len(o) + steps for o in others])
    if longest > model.config.seq_len:
        raise ValueError(f"a request would reach {longest} tokens, past seq_len={model.config.seq_len}")
    need = blocks_for(len(prompt), block_size) + sum(blocks_for(len(o) + steps, block_size) for o in others)
    cache = PagedKVCache.for_model(model, num_blocks=need, block_size=block_size)
    dev = cache.k_pool.device
    rows = [("other", i) for i in range(len(others))]

    def forward(sids, ids):
        cache.set_batch(sids)
        return model(torch.tensor(ids, dtype=torch.long, device=dev), cache=cache)[0]

    outs: list[list[int]] = []
    for sid, o in zip(rows, others):  # the running requests: prefilled, holding their first token
        cache.add(sid)
        outs.append([int(forward([sid], [list(o)])[0, -1].argmax())])
    cache.add("long")
    got = []
    for i in range(steps):
        if i < n_chunks:
            got.append(forward(["long"], [list(prompt[i * chunk:(i + 1) * chunk])])[0])
        if rows and i < steps - 1:
            nxt = forward(rows, [[o[-1]] for o in outs])[:, -1].argmax(-1).tolist()
            for o, t in zip(outs, nxt):
                o.append(t)
    return torch.cat(got, 0), outs
