"""Notebook 14's exercises.

14.settings: the settings a rung's techniques put on the baseline's training step. The reference is
`helpers.capstone.stack.settings`, which the ladder builds every rung from. The learner's dict is checked by
what it does: one training step of a tiny GPT built from it, against one built from the reference, on the
same batch and weights (loss and every gradient; the same ops, so bitwise on a CPU).

14.agreement: the serving ladder's yardstick for a rung that changes the numbers, the share of next tokens
that agree with a reference text given that text so far (`helpers.capstone.serve_stack.agreement`), checked
on the shipped trained tiny GPTs against their own replies, each other's and the held-out text.
"""
from __future__ import annotations

import torch

from helpers.capstone import serve_stack, stack
from helpers.course.check import Case, register
from helpers.gpt.model import GPTConfig

_CFG = GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, vocab_size=64, seq_len=16)


def _one_step(fn, case: Case):
    """(settings dict's fields the step uses, the step's loss, the gradients) of one step built from fn's dict."""
    techniques, micro_batches = case.args
    s = fn(techniques, micro_batches)
    if s is None:
        raise NotImplementedError("the function returns None")
    missing = sorted({"attn_impl", "adamw", "autocast", "fp8", "checkpoint", "compile", "micro_batches"} - set(s))
    if missing:
        raise KeyError(f"the dict has no {', '.join(missing)}")
    built = stack.build_from(_CFG, {**s, "compile": False}, "cpu", lr=1e-2, seed=0)  # compile: too slow to check
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)
    with stack.tf32(False):
        loss = stack.accumulation.accumulate_gradients(built.forward, stack.accumulation.split_batch(x, y, built.micro_batches),
                                                       autocast_dtype=built.autocast)
    grads = torch.cat([p.grad.flatten() for p in built.model.parameters() if p.grad is not None])
    used = {"attn_impl": s["attn_impl"], "micro_batches": s["micro_batches"], "checkpoint": bool(s["checkpoint"]),
            "compile": bool(s["compile"]), "fp8": bool(s["fp8"]), "autocast": str(s["autocast"]),
            "adamw": str(sorted(dict(s["adamw"]).items()))}
    return used, torch.tensor(loss), grads


def _cases() -> list[Case]:
    return [Case("the baseline (no technique), 4 micro-batches", (frozenset(), 4)),
            Case("bf16 + SDPA", (frozenset({"bf16", "sdpa"}), 4)),
            Case("fused AdamW alone, 2 micro-batches", (frozenset({"fused_adamw"}), 2)),
            Case("everything a CPU runs, with checkpointing", (frozenset({"bf16", "sdpa", "fused_adamw", "data_path",
                                                                          "checkpoint"}), 4)),
            Case("compile on (not run here: only the flag is compared)", (frozenset({"compile", "sdpa"}), 4))]


def _checkpoint_keeps_micro_batches(techniques, micro_batches):
    """Planted wrong: checkpointing without spending the freed memory on a larger micro-batch."""
    return {**stack.settings(techniques, micro_batches), "micro_batches": micro_batches}


def _fused_always(techniques, micro_batches):
    """Planted wrong: the baseline's AdamW fused too (the baseline is torch's for-loop AdamW)."""
    return {**stack.settings(techniques, micro_batches), "adamw": {"fused": True}}


def _sdpa_always(techniques, micro_batches):
    """Planted wrong: SDPA from the start (the baseline's attention materialises the scores)."""
    return {**stack.settings(techniques, micro_batches), "attn_impl": "sdpa"}


register(
    "14.settings", "code",
    prompt="write rung_settings(techniques, micro_batches) -> dict: what a rung's techniques set on the baseline's "
           "training step (attn_impl, adamw, autocast, fp8, checkpoint, compile, micro_batches)",
    hint="start from the baseline (naive attention, AdamW with foreach=False, no autocast, micro_batches as given) "
         "and let each technique set its field; checkpointing also runs the whole batch at once; tf32 and data_path "
         "change nothing in the dict",
    solution=stack.settings,
    wrong=(_checkpoint_keeps_micro_batches, _fused_always, _sdpa_always),
    cases=_cases, run=_one_step, rtol=0.0, atol=0.0,
    tolerance="exact: the same settings build the same step, so the loss and every gradient are bitwise equal on a CPU",
    outputs=("the settings", "the step's loss", "the gradients"),
)


# ---------------------------------------------------------------- 14.agreement: the serving ladder's yardstick

def _decoder_case(model_name: str, reference: str, offset: int):
    """One of the shipped trained course GPTs (notebook 11's tiny target or its one-layer draft), a 16-token prompt
    from the held-out text at `offset`, and a 12-token reference: the model's own greedy reply, the other model's,
    or the held-out text that follows the prompt."""
    from helpers.gpt import data, generation
    from helpers.gpt.pretrained import pretrained

    kw = {} if model_name == "target" else dict(n_layer=1, d_model=64, n_head=2, d_ff=256)
    other = dict(n_layer=1, d_model=64, n_head=2, d_ff=256) if model_name == "target" else {}
    model = pretrained("tiny", device="cpu", quiet=True, progress=False, **kw).model.float().eval()
    text = data.load_corpus("val")[offset:offset + 28].long()
    prompt, following = text[:16], text[16:]
    if reference == "its own":
        ref = generation.generate(model, prompt, 12)[0]
    elif reference == "the other model's":
        ref = generation.generate(pretrained("tiny", device="cpu", quiet=True, progress=False, **other).model.float().eval(),
                                  prompt, 12)[0]
    else:
        ref = following
    return model, prompt, ref


def _agreement_cases() -> list[Case]:
    return [Case("the target's own greedy reply (every token agrees)", ("target", "its own", 11500)),
            Case("the target against the draft's greedy reply", ("target", "the other model's", 14500)),
            Case("the target against the held-out text itself", ("target", "the text", 9000)),
            Case("the draft against the target's greedy reply", ("draft", "the other model's", 22000)),
            Case("the draft against the held-out text itself", ("draft", "the text", 17000))]


def _run_agreement(fn, case: Case):
    model, prompt, ref = _decoder_case(*case.args)
    out = fn(model, prompt, ref)
    if out is None:
        raise NotImplementedError("the function returns None")
    return torch.tensor(float(out), dtype=torch.float64)


def _free_running(model, prompt, reference):
    """Planted wrong: the model's own free-running reply compared with the reference (one early difference
    decides every later token)."""
    from helpers.gpt import generation

    mine = generation.generate(model, prompt, reference.numel())[0]
    return float((mine == reference).double().mean())


def _shifted(model, prompt, reference):
    """Planted wrong: predictions read one position late (position T + i predicts reference[i])."""
    seq = torch.cat([prompt, reference])[None]
    with torch.no_grad():
        pred = model(seq)[0][0, prompt.numel():].argmax(-1)
    return float((pred == reference).double().mean())


def _without_last_prompt_token(model, prompt, reference):
    """Planted wrong: the first reference token scored from the prompt without its last token."""
    seq = torch.cat([prompt[:-1], reference])[None]
    with torch.no_grad():
        pred = model(seq[:, :-1])[0][0, prompt.numel() - 2:].argmax(-1)
    return float((pred == reference).double().mean())


register(
    "14.agreement", "code",
    prompt="write agreement(model, prompt, reference) -> float: the share of positions i where the model's greedy "
           "next token, given prompt + reference[:i], equals reference[i]",
    hint="one forward pass over prompt + reference without its last token gives every prediction at once; the "
         "prediction for reference[0] sits at the prompt's last position",
    solution=serve_stack.agreement,
    wrong=(_free_running, _shifted, _without_last_prompt_token),
    cases=_agreement_cases, run=_run_agreement, rtol=0.0, atol=1e-6,
    tolerance="within 1e-6, float32's rounding of a share: a different count of 12 positions differs by at least 1/12",
)
