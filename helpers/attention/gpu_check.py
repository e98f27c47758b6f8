"""Is the course's Triton FlashAttention right, and is it fast? One short run, made for a GPU lease.

`python -m helpers.attention.gpu_check --out DIR` needs torch and Triton only (no Jupyter), and does what
notebook 06 does for the Triton kernels in a few minutes:

1. correctness: forward and all three gradients of the kernels, autotuned as a GPU runs them, in
   bf16 and fp16 (fp32 too), causal and not, at head dims 64, 80 (padded to 128) and 128 and at a
   sequence length no tile divides; against an fp32 reference, by flash-attn's rule (`RULE`);
2. speed: forward and forward+backward TFLOP/s of "flash_triton" and of every SDPA kernel and
   flash-attn that runs here, in bf16 against sequence length (head dim 128; --head-dims adds
   others), with batch x N and heads x d fixed as in the FlashAttention-2 paper; then issue 5's
   goal: the Triton forward against "sdpa_flash" at head dim 128 and N >= 2048.

Each part is written to DIR as JSON by helpers.measure.results.record as soon as it is done. Without a GPU
the same checks run in Triton's interpreter at small sizes (fp32, fp16) and nothing is timed.
"""
from __future__ import annotations

import argparse
import time

import torch

from helpers.attention import kernels as A  # first: with no GPU it switches Triton's interpreter on
from helpers.measure import bench
from helpers.gpt.model import naive_attention
from helpers.measure.results import record
from helpers.show.tables import table
from helpers.show.widgets import progress

RULE = ("fp16/bf16: each of O, dQ, dK, dV has a max error at most 2x that of naive attention in the same "
        "precision, plus 1e-5 (the flash-attn test suite's rule); fp32: within rtol=1e-5, atol=2e-5 of the reference")
FP32_TOL = dict(rtol=1e-5, atol=2e-5)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
GOAL_MIN_N, GOAL_HEAD_DIM = 2048, 128


def outputs_and_grads(fn, q, k, v, do) -> list[torch.Tensor]:
    """[fn(q, k, v), dq, dk, dv] for the upstream gradient do, computed on fresh leaves."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return [out, *torch.autograd.grad(out, (q, k, v), do.to(out.dtype))]


def compare(impl: str, q, k, v, do, causal: bool) -> dict:
    """Max errors of `impl`'s O, dQ, dK, dV against naive attention in fp32, and whether they pass RULE.

    For fp16/bf16 inputs `naive` holds naive attention's own errors in that precision, the yardstick.
    """
    up = [t.float() for t in (q, k, v, do)]
    ref = outputs_and_grads(lambda q, k, v: naive_attention(q, k, v, causal), *up)
    got = outputs_and_grads(lambda q, k, v: A.attention(q, k, v, impl, causal), q, k, v, do)
    errors = [(a.float() - b).abs().max().item() for a, b in zip(got, ref)]
    if q.dtype == torch.float32:
        ok = all(torch.allclose(a, b, **FP32_TOL) for a, b in zip(got, ref))
        return {"errors": errors, "naive": None, "passed": ok}
    mine = outputs_and_grads(lambda q, k, v: naive_attention(q, k, v, causal), q, k, v, do)
    naive = [(a.float() - b).abs().max().item() for a, b in zip(mine, ref)]
    return {"errors": errors, "naive": naive, "passed": all(e <= 2 * b + 1e-5 for e, b in zip(errors, naive))}


def correctness(device: str, dtypes, head_dims, seq_lens, impl: str = "flash_triton", batch: int = 2,
                heads: int = 4, seed: int = 0) -> list[dict]:
    """compare() for every dtype, head dim, sequence length and causal flag; one row each."""
    rows = []
    for dname in dtypes:
        for d in head_dims:
            for n in seq_lens:
                for causal in (False, True):
                    q, k, v = A.make_qkv(batch, heads, n, d, DTYPES[dname], device, seed=seed)
                    do = torch.randn(q.shape, device=device, generator=torch.Generator(device).manual_seed(seed + 1))
                    rows.append({"impl": impl, "dtype": dname, "head_dim": d, "n": n, "causal": causal,
                                 **compare(impl, q, k, v, do.to(q.dtype), causal)})
    return rows


def speed(device: str, impls, head_dims, seq_lens, *, dtype: str = "bf16", tokens: int = 16384,
          d_model: int = 2048, reps: int = 10, warmup: int = 3, max_n: dict[str, int] | None = None) -> list[dict]:
    """TFLOP/s of each implementation, forward and forward+backward, per (head dim, causal, N).

    Batch x N stays at `tokens` and heads x d at `d_model`. `max_n` = {impl: longest N to time}
    (for slow ones). An out-of-memory error, or a library kernel's refusal, is recorded in the row's
    status, and the sweep goes on.
    """
    rows = []
    combos = [(d, causal, n) for d in head_dims for causal in (False, True) for n in seq_lens]
    for d, causal, n in progress(combos, desc="speed sweep"):
        b, h = max(1, tokens // n), max(1, d_model // d)
        q, k, v = A.make_qkv(b, h, n, d, DTYPES[dtype], device)
        for impl in impls:
            for backward in (False, True):
                row = {"impl": impl, "dtype": dtype, "head_dim": d, "causal": causal, "n": n,
                       "pass": "fwd+bwd" if backward else "fwd", "ms": None, "tflops": None, "status": "ok"}
                rows.append(row)
                if n > (max_n or {}).get(impl, n):
                    row["status"] = f"not timed above N={max_n[impl]}"
                    continue
                try:
                    t = A.time_attention(impl, q, k, v, is_causal=causal, backward=backward, reps=reps, warmup=warmup)
                    flops = A.attention_flops(b, h, n, d, causal, backward)
                    row |= {"ms": t.ms, "spread": t.spread, "tflops": bench.tflops(flops, t.median),
                            "tflops_lo": bench.tflops(flops, t.q75), "tflops_hi": bench.tflops(flops, t.q25)}  # IQR
                except RuntimeError as err:  # out of memory, or a library kernel that refuses this shape
                    row["status"] = bench.recoverable_failure(err)
                    if row["status"] is None:
                        raise
                if row["status"] != "ok":  # after the except block, so the failed call's frames are gone
                    bench.release_memory()
        del q, k, v
    return rows


def goal(rows: list[dict], ours: str = "flash_triton", theirs: str = "sdpa_flash") -> list[dict]:
    """Issue 5's performance goal, per N >= 2048 and causal flag: our forward's TFLOP/s over theirs (d=128)."""
    pick = {(r["impl"], r["causal"], r["n"]): r["tflops"] for r in rows
            if r["pass"] == "fwd" and r["head_dim"] == GOAL_HEAD_DIM and r["tflops"]}
    return [{"n": n, "causal": c, "ours": pick[(ours, c, n)], "theirs": pick[(theirs, c, n)],
             "ratio": pick[(ours, c, n)] / pick[(theirs, c, n)]}
            for (impl, c, n) in sorted(pick, key=lambda key: (key[1], key[2]))
            if impl == ours and n >= GOAL_MIN_N and (theirs, c, n) in pick]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/flash_check", help="folder for the JSON records")
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[128], help="speed sweep head dims (the first "
                        "one is tabled)")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    say = lambda text: print(f"[{time.perf_counter() - started:6.1f} s] {text}", flush=True)
    if device == "cuda":  # N = 1040 leaves a ragged last tile for every tile size from 32 to 128, but is a
        # multiple of 16, so Triton compiles the same specialisation the speed sweep then reuses
        plan = [(("bf16",), (128, 80), (1040,)), (("fp16",), (64,), (1040,)), (("fp32",), (128,), (97,))]
    else:  # Triton's interpreter: exact, slow, no bf16
        plan = [(("fp32", "fp16"), (16, 80), (1, 67))]
    why_not = A.availability(device, torch.float16)["flash_triton"]
    if why_not:
        say(f"the course's Triton kernels cannot run here: {why_not}")
        return 0
    say(f"correctness of flash_triton on {device} ({'compiled' if device == 'cuda' else 'interpreted'}); {RULE}")
    heads = 16 if device == "cuda" else 4  # 16 as in the speed sweep: Triton compiles one specialisation for both
    checked = [row for dtypes, dims, lens in plan for row in correctness(device, dtypes, dims, lens, heads=heads)]
    record("flash_check_correctness", {"rule": RULE, "rows": checked}, folder=args.out, quiet=True)
    failed = [r for r in checked if not r["passed"]]
    print(table(["dtype", "d", "N", "causal", "max |err| O, dQ, dK, dV", "naive's", "passed"],
                [[r["dtype"], r["head_dim"], r["n"], r["causal"], ", ".join(f"{e:.1e}" for e in r["errors"]),
                  r["naive"] and ", ".join(f"{e:.1e}" for e in r["naive"]), r["passed"]] for r in checked]))
    say(f"{len(checked) - len(failed)} of {len(checked)} passed")
    if device != "cuda":
        say("no GPU: the kernels ran in Triton's interpreter, so nothing is timed")
        return 1 if failed else 0
    impls = [i for i in A.available(device, torch.bfloat16) if i in ("flash_triton", "sdpa_flash", "sdpa_efficient",
                                                                     "sdpa_cudnn", "flash_attn")]
    say(f"speed, bf16, batch x N = 16384, heads x d = 2048: {', '.join(impls)}")
    timed = []
    for n in args.seq_lens:  # recorded after each N, so a run stopped by its time limit keeps what it measured
        timed += speed(device, impls, args.head_dims, [n], reps=args.reps)
        ratios = goal(timed)
        record("flash_check_speed", {"rows": timed, "goal": ratios, "autotuned": A.flash_triton.tuned_configs()},
               dtype=torch.bfloat16, folder=args.out, quiet=True)
    d = args.head_dims[0]
    for pass_ in ("fwd", "fwd+bwd"):
        print(f"TFLOP/s, {pass_}, d={d}, bf16 (not causal / causal)")
        cell = lambda i, n: " / ".join(f"{r['tflops']:.0f}" if r["tflops"] else r["status"] for r in timed
                                       if (r["impl"], r["n"], r["head_dim"], r["pass"]) == (i, n, d, pass_))
        print(table(["N", *impls], [[n, *(cell(i, n) for i in impls)] for n in args.seq_lens]))
    print(table(["N", "causal", "flash_triton fwd", "sdpa_flash fwd", "ratio"],
                [[r["n"], r["causal"], r["ours"], r["theirs"], r["ratio"]] for r in ratios]))
    met = bool(ratios) and all(r["ratio"] >= 1 for r in ratios)
    say(f"goal (Triton forward >= sdpa_flash, bf16, d=128, N >= 2048): {'met' if met else 'NOT met'} "
        f"at {sum(r['ratio'] >= 1 for r in ratios)} of {len(ratios)} points; autotuner: {A.flash_triton.tuned_configs()}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
