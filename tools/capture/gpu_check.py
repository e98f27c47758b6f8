"""The GPU check of the course's Triton FlashAttention: is it right, and is it fast?

One short run, made for a GPU lease.

`python -m tools.capture.gpu_check --out DIR` needs no Jupyter, and does what notebook 06 does for
the Triton kernels in a few minutes:

1. correctness: forward and all three gradients of the kernels, autotuned as a GPU runs them, in
   bf16 and fp16 (fp32 too), causal and not, at head dims 64, 80 (padded to 128) and 128 and at a
   sequence length no tile divides; against an fp32 reference, by flash-attn's rule
   (`helpers.attention.flash_lab.RULE`, checked by `flash_lab.compare`);
2. speed: forward and forward+backward TFLOP/s of "flash_triton" and of every SDPA kernel and
   flash-attn that runs here, in bf16 against sequence length (head dim 128; --head-dims adds
   others), with batch x N and heads x d fixed as in the FlashAttention-2 paper (`flash_speed_lab.speed`);
   then the kernel's goal: the Triton forward against "sdpa_flash" at head dim 128 and N >= 2048
   (`flash_speed_lab.goal`).

Each part is written to DIR as JSON by helpers.measure.results.record as soon as it is done (records
"flash_check_correctness" and "flash_check_speed"). Without a GPU the same checks run in Triton's
interpreter at small sizes (fp32, fp16) and nothing is timed. The exit status is 1 when a check failed.
"""
from __future__ import annotations

import argparse
import time

import torch

from helpers.attention import flash_speed_lab, kernels
from helpers.attention.flash_lab import RULE, compare
from helpers.measure import hardware
from helpers.measure.results import record
from helpers.show.tables import table


def correctness(device: str, dtypes, head_dims, seq_lens, impl: str = "flash_triton", batch: int = 2,
                heads: int = 4, seed: int = 0) -> list[dict]:
    """`flash_lab.compare` of `impl` for every dtype name ("fp32", "fp16", "bf16"), head dim, sequence length and
    causal flag, on (batch, heads, N, d) inputs; one row each: {"impl", "dtype", "head_dim", "n", "causal",
    "errors", "naive", "passed"}."""
    rows = []
    for dname in dtypes:
        for d in head_dims:
            for n in seq_lens:
                for causal in (False, True):
                    q, k, v = kernels.make_qkv(batch, heads, n, d, hardware.torch_dtype(dname), device, seed=seed)
                    do = torch.randn(q.shape, device=device, generator=torch.Generator(device).manual_seed(seed + 1))
                    rows.append({"impl": impl, "dtype": dname, "head_dim": d, "n": n, "causal": causal,
                                 **compare(impl, q, k, v, do.to(q.dtype), causal)})
    return rows


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
    why_not = kernels.availability(device, torch.float16)["flash_triton"]
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
    timed_impls = ("flash_triton", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flash_attn")
    impls = [i for i in kernels.available(device, torch.bfloat16) if i in timed_impls]
    say(f"speed, bf16, batch x N = 16384, heads x d = 2048: {', '.join(impls)}")
    timed = []
    for n in args.seq_lens:  # recorded after each N, so a run stopped by its time limit keeps what it measured
        timed += flash_speed_lab.speed(device, impls, args.head_dims, [n], reps=args.reps)
        ratios = flash_speed_lab.goal(timed)
        record("flash_check_speed", {"rows": timed, "goal": ratios, "autotuned": kernels.flash_triton.tuned_configs()},
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
        f"at {sum(r['ratio'] >= 1 for r in ratios)} of {len(ratios)} points; "
        f"autotuner: {kernels.flash_triton.tuned_configs()}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
