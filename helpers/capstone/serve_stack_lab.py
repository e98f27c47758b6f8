"""Notebook 14's serving measurements: the serving ladder (`helpers.capstone.serve_stack`) decoded, checked and
timed rung by rung, its table, sentences and waterfall, and continuous against static batching on one server.

Timing: one call decodes NEW_TOKENS greedy tokens after the first held-out prompt (its prefill included), and
every rung's call is timed by the course protocol (`helpers.measure.protocol.compare`: warmed up until steady,
so a compile and CUDA-graph recording stay out; interleaved rounds, rotated). ms/token is the call's median
over NEW_TOKENS. Achieved bandwidth counts what one decode step must read: the rung's weights once and the
K and V of the tokens cached so far, at the mean position of the reply (prompt + NEW_TOKENS / 2).
"""
from __future__ import annotations

import torch

from helpers.capstone import serve_stack
from helpers.capstone.waterfall import waterfall as draw_waterfall
from helpers.capstone.serve_stack import Decoder, ServeRung
from helpers.decode import serving
from helpers.decode.paged import blocks_for
from helpers.gpt import heldout
from helpers.gpt.model import PRESETS, GPTConfig
from helpers.measure import params, protocol
from helpers.measure.bench import Timing
from helpers.show import tables

GB = 1e9


def resolve_parameters(S: params.Setup, *, SERVE_MODEL, DRAFT_WIDTH, PROMPTS, PROMPT_LEN, NEW_TOKENS, GAMMA,
                       REQUESTS, EVAL_BATCHES) -> dict:
    """The serving ladder's parameters, validated at once with the profile's defaults.

    Raises ValueError naming the first bad parameter, or when PROMPT_LEN + NEW_TOKENS + GAMMA + 2 tokens (the
    speculative rung's longest pass) pass SERVE_MODEL's seq_len, or for an odd DRAFT_WIDTH (2 heads)."""
    R = S.resolve
    out = {"SERVE_MODEL": R("SERVE_MODEL", SERVE_MODEL, smoke="tiny", full="small10m",
                            check=lambda n, v: params.choose(n, v, PRESETS)),
           "DRAFT_WIDTH": R("DRAFT_WIDTH", DRAFT_WIDTH, smoke=64, full=128, check=params.positive),
           "PROMPTS": R("PROMPTS", PROMPTS, smoke=3, full=3, check=params.positive),
           "PROMPT_LEN": R("PROMPT_LEN", PROMPT_LEN, smoke=32, full=64, check=params.positive),
           "NEW_TOKENS": R("NEW_TOKENS", NEW_TOKENS, smoke=32, full=64, check=params.positive),
           "GAMMA": R("GAMMA", GAMMA, smoke=4, full=4, check=params.positive),
           "REQUESTS": R("REQUESTS", REQUESTS, smoke=12, full=32, check=params.positive),
           "EVAL_BATCHES": R("EVAL_BATCHES", EVAL_BATCHES, smoke=2, full=8, check=params.positive)}
    if out["DRAFT_WIDTH"] % 2:
        raise ValueError(f"DRAFT_WIDTH={out['DRAFT_WIDTH']} must be even (the draft has 2 heads)")
    longest = out["PROMPT_LEN"] + out["NEW_TOKENS"] + out["GAMMA"] + 2
    seq_len = GPTConfig.preset(out["SERVE_MODEL"]).seq_len
    if longest > seq_len:
        raise ValueError(f"PROMPT_LEN + NEW_TOKENS + GAMMA + 2 = {longest} passes {out['SERVE_MODEL']}'s "
                         f"seq_len={seq_len}")
    out["MAX_LEN"] = longest
    return out


def rungs_for(device: str, compile: bool) -> tuple[list[ServeRung], dict[str, str]]:
    """The serving ladder on `device`, without the compile rung when `compile` is False; every technique left
    out with its reason."""
    techniques = [t for t in serve_stack.TECHNIQUES if compile or t != "compile"]
    rungs, left = serve_stack.ladder(device, techniques)
    if not compile:
        left["compile"] = ("left out by COMPILE=False (the smoke profile on a CPU: a cold compile of the decode step "
                           "costs more than this notebook's budget there), so int8 and int4 stand on "
                           + ("bf16" if any(r.name == "bf16" for r in rungs) else "the fp32 KV-cache rung"))
    return rungs, left


def exactness(decoders: dict[str, Decoder], prompts: list[torch.Tensor], n: int) -> dict[str, dict]:
    """Every rung's greedy tokens for every prompt, checked as `serve_stack` says: per rung {"tokens": [(n,)],
    "identical": prompts whose tokens equal its base's, "differences": [first_difference or None per prompt],
    "exact_ok": for an EXACT rung, every difference at a tie (None for the others), "agreement": mean share
    of next tokens agreeing with the baseline's (fp32) tokens given its text}."""
    out: dict[str, dict] = {}
    for name, d in decoders.items():
        out[name] = {"tokens": [d.generate(p, n).cpu() for p in prompts]}
    ref = out[next(iter(decoders))]["tokens"]  # the baseline's
    for name, d in decoders.items():
        r, base = out[name], d.rung.base
        if base is None:
            r.update(identical=len(prompts), differences=[None] * len(prompts), exact_ok=None, agreement=1.0)
            continue
        bmodel = decoders[base].model
        r["differences"] = [serve_stack.first_difference(bmodel, p, w, g)
                            for p, w, g in zip(prompts, out[base]["tokens"], r["tokens"])]
        r["identical"] = sum(x is None for x in r["differences"])
        keep = serve_stack.must_keep_tokens(d.rung, decoders[base].rung)
        r["exact_ok"] = all(x is None or x["tie"] for x in r["differences"]) if keep else None
        r["agreement"] = sum(serve_stack.agreement(d.model, p, t) for p, t in zip(prompts, ref)) / len(prompts)
    return out


def held_out(decoders: dict[str, Decoder], tokens: torch.Tensor, *, batches: int, seq_len: int) -> dict[str, dict]:
    """Per distinct model of the ladder (keyed by the first rung that runs it): held-out windows' losses, their
    mean, and the gap to the fp32 model's with its standard error ({"windows", "loss", "gap", "se",
    "separated"}: separated when the gap exceeds `heldout.NOISE_K` standard errors, `heldout.gap_separated`)."""
    seen: dict[int, str] = {}
    out: dict[str, dict] = {}
    for name, d in decoders.items():
        if id(d.model) in seen:
            out[name] = out[seen[id(d.model)]]
            continue
        seen[id(d.model)] = name
        w = heldout.window_losses(d.model, tokens, batches=batches, batch=8, seq_len=seq_len)  # notebook 08's, in fp32
        out[name] = {"windows": w, "loss": float(w.mean())}
    ref = out[next(iter(decoders))]["windows"]
    for r in out.values():
        if "gap" not in r:
            r["gap"], r["se"] = heldout.loss_gap(r["windows"], ref)
            r["separated"] = heldout.gap_separated(r["windows"], ref)
    return out


def call_ratio(num: Timing, den: Timing) -> protocol.Ratio:
    """num's call time over den's: from the paired rounds (`protocol.paired_ratio`; `protocol.compare` times one call
    of every rung per round) when both have the same rounds, else quartiles against quartiles."""
    if num.samples and len(num.samples) == len(den.samples):
        return protocol.paired_ratio(num, den)
    return protocol.ratio(num, den)


def time_ladder(decoders: dict[str, Decoder], prompt: torch.Tensor, n: int, device: str, *, min_reps: int = 8,
                max_reps: int = 30, budget_s: float = 6.0) -> protocol.Comparison:
    """Every rung's call (n greedy tokens after `prompt`, its prefill included) timed by the course protocol."""
    fns = {name: (lambda d=d: d.generate(prompt, n)) for name, d in decoders.items()}
    return protocol.compare(fns, device=device, min_reps=min_reps, max_reps=max_reps, budget_s=budget_s)


def rows(decoders: dict[str, Decoder], cmp: protocol.Comparison, checks: dict, losses: dict, *, prompt_len: int,
         n: int, copy_gbps: float | None) -> list[dict]:
    """One row per rung: the call's Timing, ms/token, tokens/s, achieved GB/s of one decode step (weights + K and
    V at the mean position) and its share of `copy_gbps`, the gain over the rung it stands on and over the
    baseline (`call_ratio`s: paired rounds), identical prompts, agreement and held-out loss gap."""
    base = next(iter(decoders))
    out = []
    for name, d in decoders.items():
        t: Timing = cmp[name]
        s_per_token = t.median / n
        gbps = None
        if d.weight_bytes is not None and name != "speculative":  # a speculative token is not one step's read
            gbps = (d.weight_bytes + (prompt_len + n / 2) * d.kv_bytes_per_token) / s_per_token / GB
        c = checks[name]
        out.append({"rung": name, "title": serve_stack.TITLES[name], "base": d.rung.base, "timing": t,
                    "ms_per_token": 1e3 * s_per_token, "tokens_per_s": n / t.median, "gbps": gbps,
                    "copy_share": None if gbps is None or not copy_gbps else gbps / copy_gbps,
                    "gain": None if d.rung.base is None else call_ratio(cmp[d.rung.base], t),
                    "cumulative": call_ratio(cmp[base], t), "identical": c["identical"],
                    "prompts": len(c["tokens"]), "exact_ok": c["exact_ok"], "agreement": c["agreement"],
                    "differences": c["differences"], "loss": losses[name]["loss"], "loss_gap": losses[name]["gap"],
                    "loss_se": losses[name]["se"], "loss_separated": losses[name]["separated"]})
    return out


def exact_sentence(row: dict) -> str:
    """What a rung's tokens show: identical to its base's (or where they part, a tie), or, for a rung that
    changes the numbers, its agreement with the fp32 tokens and its held-out loss gap ranked against its noise."""
    if row["base"] is None:
        return f"{row['rung']}: the reference tokens."
    ties = [x for x in row["differences"] if x is not None]
    same = f"{row['identical']} of {row['prompts']} prompts' tokens identical to {row['base']}'s"
    if row["exact_ok"] is not None:
        if not ties:
            return f"{row['rung']}: {same}, as it must be."
        parts = "; ".join(f"token {x['index']}: top-2 gap {x['gap']:.3g} {'<=' if x['tie'] else '>'} {x['tolerance']:.3g}"
                          for x in ties)
        return (f"{row['rung']}: {same}; the others part at a tie of the reference's top two logits ({parts}), "
                "which paths of different shapes may round apart." if row["exact_ok"] else
                f"{row['rung']}: {same}; a difference NOT at a tie ({parts}): this rung does not compute what it "
                "stands on.")
    loss = (f"held-out loss {row['loss_gap']:+.4f} nats/byte from fp32's ({'beyond' if row['loss_separated'] else 'within'} "
            f"{heldout.NOISE_K:g} standard errors, {row['loss_se']:.1g})")
    return f"{row['rung']}: {100 * row['agreement']:.1f}% of next tokens agree with fp32's; {same}; {loss}."


def gain_sentence(row: dict) -> str:
    """What one serving rung bought over the rung it stands on, ranked only when the IQRs do not overlap."""
    g = row["gain"]
    if g is None:
        return f"baseline: {row['ms_per_token']:.3g} ms/token ({row['tokens_per_s']:.0f} tokens/s), prefill included."
    what = f"{row['rung']} ({row['title']}, on {row['base']})"
    if not g.separated:
        return f"{what}: within the noise of {row['base']} ({g}); this run cannot say it helped."
    if g.value > 1:
        return f"{what}: {g} faster than {row['base']}."
    return f"{what}: slower than {row['base']} ({g}): on this device it costs more than it saves."


def bandwidth_sentence(table: list[dict], copy_gbps: float | None, where: str) -> str:
    """The best achieved bandwidth of the ladder's cached rungs against the copy bandwidth."""
    bw = [r for r in table if r["gbps"] is not None]
    if not bw or not copy_gbps:
        return "No copy bandwidth to compare against."
    best = max(bw, key=lambda r: r["gbps"])
    return (f"The cached rung closest to the copy bandwidth is {best['rung']}: {best['gbps']:.3g} GB/s, "
            f"{100 * best['copy_share']:.0f}% of {copy_gbps:.3g} GB/s ({where}); a batch-1 decode step that reads its "
            "weights once can go no faster than a copy of them.")


def batching(model, *, n_requests: int, repeats: int = 3, seed: int = 0, max_batch: int = 8, block_size: int = 16,
             arrival_rate: float = 2.0) -> dict:
    """Continuous against static batching of one seeded request mix (`serving.model_requests`, arriving at
    `arrival_rate` per iteration) on the same paged KV memory: room for max_batch // 2 requests at their longest,
    which static batching preallocates and continuous batching fills by actual lengths, up to `max_batch`. Both
    policies serve the mix `repeats` times, interleaved (`serving.serve_policies`), on a CPU timed on the thread's
    own CPU clock (the server's iterations are work on the calling thread; run it with torch on one thread); prints
    a table of each policy's median run and one sentence. Returns `serving.policy_speedup`'s dict (runs, speedup, speedup_range, separated,
    spread) with "num_blocks", "same_tokens" (requests whose tokens both policies' median runs agree on) and
    "sentence"."""
    params.positive("n_requests", n_requests)
    reqs, cap = serving.model_requests(model, n_requests, seed=seed, arrival_rate=arrival_rate)
    longest = max(len(r.prompt) for r in reqs) + cap
    num_blocks = max(1, max_batch // 2) * blocks_for(longest, block_size)
    tries = serving.serve_policies(model, reqs, repeats=repeats, num_blocks=num_blocks, block_size=block_size,
                                   max_batch=max_batch, max_new_tokens=cap)  # on serving.server_clock
    said = serving.policy_speedup(tries)
    st, co = said["runs"]["static"], said["runs"]["continuous"]
    rows = [said["runs"][p].row() for p in serving.POLICIES]
    print(tables.table(list(rows[0]), [list(r.values()) for r in rows]))
    same = sum(st.tokens[r.rid] == co.tokens[r.rid] for r in reqs)
    lo, hi = said["speedup_range"]
    sentence = (f"Same {n_requests} requests, same {num_blocks} blocks of {block_size} tokens: continuous batching "
                f"generated {co.tokens_per_s:.0f} tokens/s against static batching's {st.tokens_per_s:.0f} "
                f"({said['speedup']:.2f}x; {lo:.2f}-{hi:.2f}x over {repeats} interleaved run"
                f"{'s' if repeats != 1 else ''} per policy); {same} of {n_requests} requests produced identical "
                "tokens under both policies.")
    print(sentence)
    return {**said, "num_blocks": num_blocks, "same_tokens": same, "sentence": sentence}


def waterfall(table: list[dict], ax=None, title: str = "serving ladder: tokens/s at batch 1, rung by rung"):
    """Tokens/s per rung with its IQR, the gain over the baseline above each bar and the rung each stands on
    below its name."""
    fig = draw_waterfall([{**r, "rung": r["rung"] if r["base"] is None else f"{r['rung']}\n(on {r['base']})"}
                                  for r in table], ax=ax, title=title)
    fig.axes[0].set(xlabel="rung (each adds one technique to the rung named under it); above each bar: its gain over the "
                           "baseline")
    return fig


def record_metrics(table: list[dict], batch: dict, *, model: str, prompt_len: int, n: int,
                   left_out: dict[str, str]) -> dict:
    """The "capstone_serving_ladder" record's metrics: per rung its ms/token with quartiles, tokens/s, GB/s, gains
    and checks; the batching comparison's speed-up with its range."""
    q = lambda r, k: 1e3 * getattr(r["timing"], k) / n  # noqa: E731 - ms per token at a quartile of the call
    return {"model": model, "prompt_len": prompt_len, "new_tokens": n, "left_out": left_out,
            "rungs": [{"rung": r["rung"], "base": r["base"], "ms_per_token": r["ms_per_token"],
                       "q25_ms_per_token": q(r, "q25"), "q75_ms_per_token": q(r, "q75"),
                       "tokens_per_s": r["tokens_per_s"], "gbps": r["gbps"], "copy_share": r["copy_share"],
                       "gain": None if r["gain"] is None else r["gain"].value, "cumulative": r["cumulative"].value,
                       "identical": r["identical"], "prompts": r["prompts"], "agreement": r["agreement"],
                       "loss_gap": r["loss_gap"]} for r in table],
            "batching": {"speedup": batch["speedup"], "lo": batch["speedup_range"][0], "hi": batch["speedup_range"][1],
                         "separated": batch["separated"]}}


ALONE = ("int8", "int4", "speculative")  # bf16 stands on kv_cache already, and a compile alone is one cold compile more


def alone_comparison(decoders: dict[str, Decoder], alone: dict[str, Decoder], prompt: torch.Tensor, n: int,
                     device: str, *, gamma: int, budget_s: float = 5.0) -> list[dict]:
    """Per technique in `alone` (decoders of `serve_stack.alone` rungs): its gain alone on the fp32 KV-cache rung
    (timed with `decoders["kv_cache"]` by the protocol) and what bounds it alone and in the stack (`decoders`, the
    ladder): for a quantised rung the ratio of the weight bytes of the rung under it to its own (a step bound by
    reading its weights gains at most that), for speculative decoding the tokens each target pass committed.
    Rows {"technique", "alone" (a Ratio), "bound_alone", "bound_stack"} or {..., "passes_alone",
    "passes_stack", "gamma"}; `alone_sentence` sets them beside the ladder's gain."""
    cmp = time_ladder({"kv_cache": decoders["kv_cache"], **alone}, prompt, n, device, budget_s=budget_s)
    out = []
    for name, d in alone.items():
        t = name.removesuffix(" alone")
        row = {"technique": t, "alone": call_ratio(cmp["kv_cache"], cmp[name])}
        if t in ("int8", "int4"):
            base = decoders[t].rung.base
            row["bound_alone"] = decoders["kv_cache"].weight_bytes / d.weight_bytes
            row["bound_stack"] = decoders[base].weight_bytes / decoders[t].weight_bytes
        else:
            row["passes_alone"] = tokens_per_pass(d, prompt, n, gamma)
            row["passes_stack"] = tokens_per_pass(decoders[t], prompt, n, gamma)
            row["gamma"] = gamma
        out.append(row)
    return out


def tokens_per_pass(d: Decoder, prompt: torch.Tensor, n: int, gamma: int) -> float:
    """Tokens a speculative rung commits per target pass on `prompt` (greedy): n / target passes."""
    from helpers.decode import speculative

    res = speculative.speculative_generate(d.model, d.draft, prompt, n, gamma=gamma, temperature=0)
    return n / res.target_passes


def alone_sentence(row: dict, stack_row: dict) -> str:
    """What a serving technique bought alone on fp32 with a cache against in the stack, and the bound that says why,
    ranked only beyond both spreads."""
    t, a, b = row["technique"], row["alone"], stack_row["gain"]
    if a.lo > b.hi:
        rank = f"it did better alone ({a.value:.2f}x) than in the stack ({b.value:.2f}x on {stack_row['base']})"
    elif b.lo > a.hi:
        rank = f"it did better in the stack ({b.value:.2f}x on {stack_row['base']}) than alone ({a.value:.2f}x)"
    else:
        rank = f"alone ({a}) and in the stack ({b}) within each other's spread"
    if "bound_alone" in row:
        why = (f"it reads {1 / row['bound_alone']:.2f}x the weight bytes of fp32 alone and {1 / row['bound_stack']:.2f}x "
               f"those of {stack_row['base']} in the stack, so a step bound by reading its weights could gain at most "
               f"{row['bound_alone']:.2f}x and {row['bound_stack']:.2f}x: it reached {a.value / row['bound_alone']:.0%} "
               f"and {b.value / row['bound_stack']:.0%} of those bounds"
               + (" (well below them: the step is not bound by its weights' bytes, or dequantising costs more than the "
                  "bytes save)" if max(a.value / row["bound_alone"], b.value / row["bound_stack"]) < 0.5 else ""))
    else:
        why = (f"each target pass committed {row['passes_alone']:.2f} tokens alone (fp32 target and draft) and "
               f"{row['passes_stack']:.2f} in the stack (on {stack_row['base']}): the gain is at most that many tokens "
               f"per pass, less what the draft's {row['gamma']} steps of each round cost")
    return f"{t}: {rank}; {why}."
