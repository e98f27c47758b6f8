"""Serving the course GPT: a request mix, static batching, and continuous batching on the paged KV cache.

* `make_requests`: a seeded request mix, arrivals as a Poisson process counted in scheduler
  iterations and heavy-tailed (log-normal) prompt and output lengths; `model_requests` sizes one for a model.
* two schedulers, greedy decoding, each returning a `ServeRun`; `serve(model, requests, policy=...)` picks one
  by name (POLICIES):
  - `serve_static` (the baseline): take the requests that have arrived, up to `max_batch`, each with KV
    slots preallocated for its prompt plus the server's `max_new_tokens` cap; run the batch until
    its last member finishes; only then take the next batch. A finished member stops computing, but
    its slots and its place in the batch stay empty until the batch is done.
  - `serve_continuous` (Yu et al., 2022, Orca's iteration-level scheduling; Kwon et al., 2023, vLLM's
    block-limited admission and preemption): every iteration, admit waiting requests while the
    batch has room and the free list has blocks for their prompts (prefill them), then decode one
    token for every request already running; a request leaves the moment it finishes and its blocks
    go back to the free list. When a decode needs a block and none is free, the request admitted
    last is preempted: its blocks are freed and it goes back to the front of the queue with the
    tokens it has produced, to be resumed by recomputing the prefill of prompt + those tokens.
  A `ServeRun` holds each request's tokens, TTFT and TPOT (p50, p99), tokens/s and the KV waste.
* `solo_tokens`: a request served alone, the reference; `serve_policies`, `policy_speedup`: both policies, repeated.

The schedule is deterministic: arrivals are counted in iterations (request i joins the queue at
the start of iteration `arrival`), so the same seed gives the same batches on every machine; the times are the
measured durations of those iterations on `server_clock` (an idle wait for the next arrival costs no time).
A request's first token comes from its prefill, in the iteration that admitted it. Prefix sharing and chunked
prefill are `helpers.decode.prefill`; notebook 10 shows both schedulers in its cells.
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
from helpers.measure.bench import resolve_clock, sync
from helpers.measure.clock import THREAD
from helpers.measure.params import positive


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
    """`n` seeded requests with heavy-tailed (log-normal) prompt and output lengths. Lengths are median * exp(sigma * N(0, 1)), clipped so that prompt + max_new_tokens <= max_len
    (the model's seq_len) and output_len <= max_new_tokens (default: max_len // 2). Arrivals: a
    Poisson process with `arrival_rate` requests per iteration (None: all arrive at iteration 0).
    Prompts are random slices of `corpus` (1-D token ids) when given, else uniform random tokens.
    Raises ValueError for sizes that cannot fit.
    """
    max_new = max_len // 2 if max_new_tokens is None else max_new_tokens
    positive("n", n), positive("max_new_tokens", max_new)
    if max_len - max_new < 1 or sigma < 0:
        raise ValueError(f"need max_new_tokens={max_new} < max_len={max_len} and sigma={sigma} >= 0")
    if arrival_rate is not None:  # None: everything arrives at once
        positive("arrival_rate", float(arrival_rate) if type(arrival_rate) is int else arrival_rate, float)
    rng = random.Random(seed)
    prompts = _lognormal_lengths(rng, n, prompt_median, sigma, 1, max_len - max_new)
    outputs = _lognormal_lengths(rng, n, output_median, sigma, 1, max_new)
    t, out = 0.0, []
    for i in range(n):
        if corpus is not None:  # a random slice of the corpus
            start = rng.randrange(0, max(1, corpus.numel() - prompts[i]))
            toks = tuple(int(x) for x in corpus[start:start + prompts[i]])
        else:
            toks = tuple(rng.randrange(vocab_size) for _ in range(prompts[i]))
        out.append(Request(i, toks, outputs[i], int(t)))
        if arrival_rate is not None:
            t += rng.expovariate(arrival_rate)
    return out


def model_requests(model, n: int, *, seed: int = 0, arrival_rate: float | None = 1.0,
                   corpus: torch.Tensor | None = None, max_new_tokens: int | None = None) -> tuple[list[Request], int]:
    """(`make_requests` sized for the course GPT `model`, the server's max_new_tokens cap): its vocabulary, its
    seq_len as max_len, prompt and output medians of seq_len // 8 (at least 2), the cap seq_len // 2 unless given."""
    cfg = model.config
    cap = cfg.seq_len // 2 if max_new_tokens is None else max_new_tokens
    reqs = make_requests(n, seed=seed, vocab_size=cfg.vocab_size, max_len=cfg.seq_len,
                         prompt_median=max(2, cfg.seq_len // 8), output_median=max(2, cfg.seq_len // 8),
                         max_new_tokens=cap, arrival_rate=arrival_rate, corpus=corpus)
    return reqs, cap


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
    """What a scheduler measured. Times in seconds of run time (iteration durations on the server's clock)."""

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
        return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))] if values else float("nan")

    def row(self) -> dict:
        """The headline numbers: tokens/s, TTFT and TPOT p50/p99 (ms), waste (%), preemptions."""
        return {"policy": self.policy, "tokens/s": self.tokens_per_s,
                "TTFT p50 ms": 1e3 * self.percentile("ttft", 50), "TTFT p99 ms": 1e3 * self.percentile("ttft", 99),
                "TPOT p50 ms": 1e3 * self.percentile("tpot", 50), "TPOT p99 ms": 1e3 * self.percentile("tpot", 99),
                "KV waste %": 100 * self.waste_fraction, "peak blocks": self.peak_blocks,
                "preemptions": self.preemptions, "iterations": self.iterations}


@torch.no_grad()
def _step(model, cache: PagedKVCache, lives: Sequence[_Live], inputs: Sequence[Sequence[int]]) -> list[int]:
    """One forward over the given sequences (same number of new tokens each); their greedy next tokens."""
    cache.set_batch([lv.req.rid for lv in lives])
    idx = torch.tensor([list(x) for x in inputs], dtype=torch.long, device=cache.k_pool.device)  # (B, T)
    logits, _ = model(idx, cache=cache)
    return logits[:, -1].argmax(-1).tolist()


def _cap(model, requests: Sequence[Request], num_blocks: int, block_size: int, max_batch: int,
         max_new_tokens: int | None) -> int:
    """The server's max_new_tokens cap (default: the longest output_len), once every argument is checked."""
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
    return cap


def server_clock(device: str) -> Callable[[], float]:
    """A server's clock: the thread's CPU seconds with torch on one CPU thread (`bench.resolve_clock`), else wall."""
    return time.thread_time if resolve_clock(device) == THREAD else time.perf_counter


class Server:
    """What both schedulers share: the paged cache, the queues, the clock and the counters. An iteration is
    `begin`, admissions (`admit`), one decode step (`decode`), `end` (tokens delivered) and `release`."""

    def __init__(self, model, requests: Sequence[Request], *, num_blocks: int, block_size: int, max_batch: int,
                 max_new_tokens: int | None, impl: str, clock: Callable[[], float] | None):
        self.cap = _cap(model, requests, num_blocks, block_size, max_batch, max_new_tokens)
        self.model, self.block_size, self.max_batch = model, block_size, max_batch
        self.cache = PagedKVCache.for_model(model, num_blocks=num_blocks, block_size=block_size, impl=impl)
        self.device = self.cache.k_pool.device
        self.clock = clock or server_clock(self.device.type)
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival, r.rid)))
        self.waiting: deque[_Live] = deque()  # arrived (or preempted), not holding blocks
        self.running: list[_Live] = []  # holding blocks, in order of admission
        self.done: list[_Live] = []
        self.now, self.it, self.preemptions, self.peak, self.waste_sum, self.waste_n = 0.0, 0, 0, 0, 0.0, 0
        self.t0, self.was_training = 0.0, model.training
        model.eval()

    def busy(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    def begin(self) -> None:
        """Arrivals join the queue (an idle server skips to the next arrival: no time passes); the clock starts."""
        if not self.waiting and not self.running and self.pending[0].arrival > self.it:
            self.it = self.pending[0].arrival
        while self.pending and self.pending[0].arrival <= self.it:
            self.waiting.append(_Live(self.pending.popleft(), arrived_s=self.now))
        sync(self.device)
        self.t0 = self.clock()

    def next_fits(self, held: Callable[[_Live], int]) -> bool:
        """Whether the first waiting request may join: room in the batch, free blocks for its `held(request)` tokens."""
        return (bool(self.waiting) and len(self.running) < self.max_batch
                and blocks_for(held(self.waiting[0]), self.block_size) <= self.cache.allocator.num_free)

    def admit(self, reserve: int | None) -> tuple[_Live, int]:
        """The first waiting request joins the batch (with `reserve` slots taken now, if given) and prefills its
        prompt + the tokens it produced so far (a resumed request recomputes them); (it, its next token)."""
        lv = self.waiting.popleft()
        self.cache.add(lv.req.rid)
        if reserve is not None:
            self.cache.reserve(lv.req.rid, reserve)
        self.running.append(lv)
        return lv, _step(self.model, self.cache, [lv], [list(lv.req.prompt) + lv.out])[0]

    def decoding(self, produced: list[tuple[_Live, int]]) -> list[_Live]:
        """The running requests this iteration decodes: not admitted in it and not done."""
        fresh = {id(lv) for lv, _ in produced}
        return [lv for lv in self.running if id(lv) not in fresh and not lv.done]

    def preempt_for(self, lv: _Live) -> list[_Live]:
        """Free the last-admitted requests until lv has a slot for its next token (or lv itself is freed); take
        it. Returns the preempted requests (back at the head of the queue), newest first; [] when a block was free."""
        preempted = []
        while self.cache.blocks_needed([lv.req.rid], 1) > self.cache.allocator.num_free:
            victim = self.running.pop()
            self.cache.free(victim.req.rid)
            victim.preemptions += 1
            self.preemptions += 1
            self.waiting.appendleft(victim)
            preempted.append(victim)
            if victim is lv:
                return preempted
        self.cache.reserve(lv.req.rid, self.cache.lengths[lv.req.rid] + 1)  # the block now, before the next request
        return preempted

    def decode(self, decoding: list[_Live]) -> list[tuple[_Live, int]]:
        """One decode step of every request in `decoding`: (request, its next token) pairs."""
        if not decoding:
            return []
        return list(zip(decoding, _step(self.model, self.cache, decoding, [[lv.out[-1]] for lv in decoding])))

    def end(self, produced: list[tuple[_Live, int]]) -> None:
        """Count the KV slots, stop the clock, deliver the tokens (ready when the iteration ends), record the done."""
        alloc, used = self.cache.slots()
        self.peak = max(self.peak, self.cache.allocator.num_used)
        if alloc:
            self.waste_sum, self.waste_n = self.waste_sum + (alloc - used) / alloc, self.waste_n + 1
        sync(self.device)
        self.now += self.clock() - self.t0
        for lv, tok in produced:
            lv.out.append(tok)
            lv.first_s = self.now if lv.first_s is None else lv.first_s
            if lv.done:
                lv.finish_s = self.now
                self.done.append(lv)
                if lv in self.waiting:  # preempted in the iteration that finished it: nothing left to do
                    self.waiting.remove(lv)
        self.it += 1

    def release(self, lives: list[_Live]) -> None:
        """The requests leave the batch; their blocks go back to the free list."""
        for lv in lives:
            self.running.remove(lv)
            self.cache.free(lv.req.rid)

    def result(self, policy: str) -> ServeRun:
        self.model.train(self.was_training)
        if self.cache.allocator.num_used or self.cache.tables:
            raise RuntimeError("blocks leaked: the scheduler ended with blocks still allocated")
        done = self.done
        return ServeRun(
            policy=policy, tokens={lv.req.rid: lv.out for lv in done},
            ttft={lv.req.rid: lv.first_s - lv.arrived_s for lv in done},
            tpot={lv.req.rid: (lv.finish_s - lv.first_s) / (len(lv.out) - 1) for lv in done if len(lv.out) > 1},
            wall_s=self.now, iterations=self.it, preemptions=self.preemptions,
            waste_fraction=self.waste_sum / max(1, self.waste_n), peak_blocks=self.peak,
            finished_order=[lv.req.rid for lv in done])


def serve_static(model, requests: Sequence[Request], *, num_blocks: int = 64, block_size: int = 16,
                 max_batch: int = 8, max_new_tokens: int | None = None, impl: str = "torch",
                 clock: Callable[[], float] | None = None) -> ServeRun:
    """Static batching (the baseline) of `requests`, greedy, with the course GPT `model` on a paged KV cache of
    `num_blocks` blocks: when no batch is running, the requests that have arrived join one, up to `max_batch`,
    each taking the slots of its prompt plus the server's cap `max_new_tokens` (default: the longest output_len
    of the mix) at once; the batch decodes until its last member is done, and only then do its blocks go back.

    impl: the decode attention ("torch" or "triton"). clock: seconds, default `server_clock` (CUDA is
    synchronised before each reading). Raises ValueError when a request could never fit the pool or the
    model's seq_len."""
    s = Server(model, requests, num_blocks=num_blocks, block_size=block_size, max_batch=max_batch,
                max_new_tokens=max_new_tokens, impl=impl, clock=clock)
    held = lambda lv: len(lv.req.prompt) + s.cap  # noqa: E731  (preallocated: the prompt and the cap)
    while s.busy():
        s.begin()  # arrivals join the queue; the iteration's clock starts
        produced = []
        if not s.running:  # a new batch only when the last one is done
            while s.next_fits(held):  # a free place and free blocks for the prompt + the cap, reserved now
                produced.append(s.admit(reserve=held(s.waiting[0])))  # its prefill gives its first token
        produced += s.decode(s.decoding(produced))  # one token for each member not yet done; the done ones idle
        s.end(produced)
        if all(lv.done for lv in s.running):  # the blocks come back only when the longest member is done
            s.release(list(s.running))
    return s.result("static")


def serve_continuous(model, requests: Sequence[Request], *, num_blocks: int = 64, block_size: int = 16,
                     max_batch: int = 8, max_new_tokens: int | None = None, impl: str = "torch",
                     clock: Callable[[], float] | None = None) -> ServeRun:
    """Continuous batching (Orca's iteration-level scheduling, vLLM's block-limited admission and preemption) of
    `requests`, greedy, with the course GPT `model` on a paged KV cache of `num_blocks` blocks: every
    iteration, waiting requests join while the batch has room (`max_batch`) and the free list has blocks for
    their prompts (and the tokens a preempted request already produced); then every other running request
    decodes one token, the request admitted last preempted whenever a decode needs a block and none is free;
    a request leaves, and frees its blocks, the moment it is done.

    max_new_tokens, impl, clock and the errors: as `serve_static`."""
    s = Server(model, requests, num_blocks=num_blocks, block_size=block_size, max_batch=max_batch,
                max_new_tokens=max_new_tokens, impl=impl, clock=clock)
    held = lambda lv: len(lv.req.prompt) + len(lv.out)  # noqa: E731  (what its prefill writes)
    while s.busy():
        s.begin()  # arrivals join the queue; the iteration's clock starts
        produced = []
        while s.next_fits(held):  # every iteration: a free place and free blocks for what its prefill writes
            produced.append(s.admit(reserve=None))  # nothing reserved ahead: blocks come as the tokens do
        decoding = s.decoding(produced)
        for lv in list(decoding):  # oldest first: a token that starts a block needs a free one
            if lv in decoding:  # skip a request already preempted for an older one in this loop
                preempted = s.preempt_for(lv)  # the newest running requests freed until lv has its block
                decoding = [d for d in decoding if d not in preempted]  # they decode no token this iteration
        produced += s.decode(decoding)
        s.end(produced)
        s.release([lv for lv in s.running if lv.done])  # a finished request leaves now; its blocks are free
    return s.result("continuous")


SERVERS = {"static": serve_static, "continuous": serve_continuous}
POLICIES = tuple(SERVERS)


def serve(model, requests: Sequence[Request], *, policy: str = "continuous", **kwargs) -> ServeRun:
    """`serve_static` or `serve_continuous` by name (`policy`, one of POLICIES), with their keyword arguments.
    Raises ValueError for an unknown policy."""
    if policy not in SERVERS:
        raise ValueError(f"policy={policy!r} is unknown; choose one of {', '.join(map(repr, POLICIES))}")
    return SERVERS[policy](model, requests, **kwargs)


def serve_policies(model, requests: Sequence[Request], *, repeats: int = 1, servers: dict | None = None,
                   **serve_kwargs) -> dict[str, list[ServeRun]]:
    """Every policy of POLICIES serving `requests` `repeats` times, interleaved, which goes first alternating
    round by round (drift on the machine hits both alike): {policy: its runs}. servers: {policy: scheduler}
    (default SERVERS; notebook 10 passes the ones its cells define); serve_kwargs: `serve_static`'s."""
    positive("repeats", repeats)
    servers = SERVERS if servers is None else servers
    tries: dict[str, list[ServeRun]] = {p: [] for p in POLICIES}
    for i in range(repeats):
        for p in (POLICIES if i % 2 == 0 else POLICIES[::-1]):
            tries[p].append(servers[p](model, requests, **serve_kwargs))
    return tries


def policy_speedup(tries: dict[str, list[ServeRun]]) -> dict:
    """What `serve_policies`' runs say: "runs" {policy: its run with the median tokens/s}, "speedup" (continuous /
    static tokens/s of those), "speedup_range" (slowest continuous / fastest static, fastest continuous /
    slowest static), "separated" (two or more runs each, and the policies' tokens/s ranges do not overlap),
    "spread" (the largest (max - min) / median tokens/s of a policy)."""
    runs = {p: sorted(t, key=lambda r: r.tokens_per_s)[(len(t) - 1) // 2] for p, t in tries.items()}
    tps = {p: sorted(r.tokens_per_s for r in t) for p, t in tries.items()}
    co, st = tps["continuous"], tps["static"]
    return {"runs": runs, "speedup": runs["continuous"].tokens_per_s / runs["static"].tokens_per_s,
            "speedup_range": (co[0] / st[-1], co[-1] / st[0]),
            "separated": min(len(co), len(st)) > 1 and (co[0] > st[-1] or st[0] > co[-1]),
            "spread": max((v[-1] - v[0]) / runs[p].tokens_per_s for p, v in tps.items())}


def solo_tokens(model, request: Request, *, block_size: int = 16, impl: str = "torch") -> list[int]:
    """The greedy tokens `request` gets when it is served alone (the reference for batched runs)."""
    alone = Request(request.rid, request.prompt, request.output_len, 0)
    need = blocks_for(len(request.prompt) + request.output_len, block_size)
    return serve_continuous(model, [alone], num_blocks=need, block_size=block_size, max_batch=1, impl=impl,
                            max_new_tokens=request.output_len).tokens[request.rid]
