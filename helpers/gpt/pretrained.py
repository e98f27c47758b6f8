"""Trained course GPTs, cached once per machine: what generation, quantisation and speculative decoding need.

A notebook that needs a model which has *learned* something calls::

    tm = pretrained("tiny")              # smoke: shipped weights (see below), loaded in a second
    tm = pretrained("small10m")          # full: 1-2 minutes on a GPU
    tm.model, tm.val_loss, tm.perplexity  # an eval-mode GPT, nats per byte on held-out files, exp(val_loss)

The first call trains the course GPT (`helpers.gpt.model.GPT`) on the standard-library corpus
(`helpers.gpt.data`) with AdamW and a cosine schedule, shows a tqdm progress bar (silent in headless runs),
and saves {config, state_dict, key, val_loss} atomically (a temporary file renamed into place) under
`<course cache>/pretrained/`, the same folder family as the corpus (`data.resolve_cache_dir`). The file
name is a hash of everything the weights depend on: the config, the corpus split's own cache key, the
training schedule (steps, batch, sequence length, learning rate), the seed and `FORMAT`. Later calls load
it with `torch.load(weights_only=True)`; a file that cannot be read, whose stored key differs (a torn
write, an older format) or whose weights do not match the SHA-256 digest stored beside them (damage inside
a tensor, which loads without an error) is trained again, after one sentence saying why; one whose weights load but whose
validation loss is missing (a partial write) has the loss measured again and is rewritten. Finding,
training and saving a checkpoint happen under an exclusive `fcntl.flock` on `<checkpoint>.lock` beside it
(the file stays; it holds the owner's PID), so that two processes asking for the same model train it once:
the second says that it waits, then loads what the first wrote. Without fcntl (Windows) or a writable
cache folder there is no lock.

The smoke models (the "tiny" preset, and notebook 11's one-layer draft: `SHIP`) would need minutes of
CPU training to write recognisable Python, more than a smoke run may spend, so their weights are shipped
in `helpers/gpt/weights/` (trained here by `python -m helpers.gpt.pretrained ship`). When the cache has no
checkpoint, shipped weights of the same config, schedule and seed are loaded, their validation loss is
measured on this machine's held-out files, and they are copied into the cache; other recipes are trained.
Shipped weights that cannot be used (a torn file, a Git LFS pointer, weights that do not fit the model) are
named with what is wrong before the training that replaces them, with its cost: the schedule's steps and,
when the file still tells it, how long the shipped run trained.

Validation loss is the mean cross-entropy over `VAL_BATCHES` fixed windows of the held-out split (files
no training batch comes from; see `helpers.gpt.data`), so it is comparable between runs and between models
of the same `seq_len`.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from helpers.gpt import data
from helpers.gpt.checkpoint_file import checkpoint_lock, listed_sums, read_error, weights_digest
from helpers.gpt.model import GPT, GPTConfig
from helpers.measure.params import is_finite_number, positive
from helpers.measure.results import write_atomic
from helpers.show import widgets

FORMAT = 1  # bump when the training recipe or the file layout changes: old files are then retrained
VAL_BATCHES = 8  # held-out windows of VAL_BATCH sequences for validation loss
VAL_BATCH = 16

# training schedule per preset: steps, sequences per step, tokens per sequence, peak learning rate
SCHEDULES: dict[str, dict] = {
    # shipped with the course (SHIP), so a smoke run loads it instead of training it; the file records the
    # training time and the held-out loss it reached
    "tiny": dict(steps=1500, batch=32, seq_len=128, lr=6e-3),
    # trained on first use, in bf16 on CUDA
    "small10m": dict(steps=2000, batch=64, seq_len=256, lr=1e-3),
}


@dataclass
class Trained:
    """A trained course GPT and what is known about it.

    model: the GPT in eval mode on the requested device; val_loss: nats per byte on the held-out
    split; perplexity: exp(val_loss); path: the checkpoint file; trained_now: whether this call
    trained it (False: loaded); seconds: training time when trained now, else the stored one.
    """

    model: GPT
    val_loss: float
    perplexity: float
    path: Path
    trained_now: bool
    seconds: float
    schedule: dict


def schedule_for(preset: str, steps: int | None = None, config: GPTConfig | None = None) -> dict:
    """The training schedule of `preset` (SCHEDULES; other presets get tiny's batch and lr, their seq_len),
    with `steps` overriding the default, and sequences no longer than `config.seq_len` when a config is
    given. Raises ValueError for a non-positive steps."""
    if steps is not None:
        positive("steps", steps)
    sched = dict(SCHEDULES.get(preset, SCHEDULES["tiny"]))
    if steps is not None:
        sched["steps"] = steps
    if config is not None:
        sched["seq_len"] = min(sched["seq_len"], config.seq_len)
    return sched


def checkpoint_key(config: GPTConfig, schedule: dict, seed: int) -> dict:
    """Everything the trained weights depend on, as a JSON-able dict (its hash names the file)."""
    corpus = data.cache_path("train").stem  # 'stdlib-train-<hash of python version, files, sizes, mtimes>'
    return {"format": FORMAT, "config": asdict(config), "corpus": corpus, "schedule": dict(schedule), "seed": seed}


def checkpoint_path(key: dict, cache_dir=None) -> Path:
    """Where the checkpoint for `key` lives under the course cache folder."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return data.resolve_cache_dir(cache_dir) / "pretrained" / f"gpt-{key['config']['n_layer']}L-" \
        f"{key['config']['d_model']}d-{key['schedule']['steps']}steps-{digest}.pt"


@torch.no_grad()
def validation_loss(model: GPT, tokens: torch.Tensor | None = None, *, seq_len: int | None = None,
                    batches: int = VAL_BATCHES, batch: int = VAL_BATCH, seed: int = 1234) -> float:
    """Mean cross-entropy (nats per byte) of `model` on fixed windows of `tokens` (default: the held-out split).

    The windows come from a generator seeded with `seed`, so every call and every model sees the same
    text. seq_len defaults to the model's. Runs in eval mode on the model's device; restores the mode.
    """
    tokens = data.load_corpus("val") if tokens is None else tokens
    seq_len = seq_len or model.config.seq_len
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    was = model.training
    model.eval()
    total = 0.0
    for _ in range(batches):
        x, y = data.get_batch(tokens, batch, seq_len, device, generator=g)
        total += float(model(x, y)[1])
    model.train(was)
    return total / batches


def train(config: GPTConfig, schedule: dict, *, seed: int = 0, device: str = "cpu", progress: bool = True) -> GPT:
    """Train a fresh GPT(config) on the training split with AdamW (betas 0.9/0.95, weight decay 0.1),
    linear warm-up over 5% of the steps then cosine decay to 10% of `schedule['lr']`; bf16 autocast on
    CUDA, fp32 elsewhere. Returns the model in eval mode."""
    torch.manual_seed(seed)
    model = GPT(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=schedule["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    steps, warm = schedule["steps"], max(1, schedule["steps"] // 20)
    tokens = data.load_corpus("train")
    g = torch.Generator().manual_seed(seed)
    use_bf16 = torch.device(device).type == "cuda"
    model.train()
    threads = torch.get_num_threads()
    if not use_bf16:  # small CPU matmuls run faster on one thread than on threads that fight other processes
        torch.set_num_threads(1)
    try:
        _loop(model, opt, tokens, schedule, warm, g, device, use_bf16, progress, config)
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def _loop(model, opt, tokens, schedule, warm, g, device, use_bf16, progress, config) -> None:
    steps = schedule["steps"]
    it = widgets.progress(range(steps), desc=f"training {config.n_layer}L/{config.d_model}d") if progress \
        else range(steps)
    for step in it:
        frac = step / warm if step < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
        for group in opt.param_groups:
            group["lr"] = schedule["lr"] * min(1.0, frac)
        x, y = data.get_batch(tokens, schedule["batch"], schedule["seq_len"], device, generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
            loss = model(x, y)[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def _number(value) -> float | None:
    """`value` as a finite float, or None (missing, not a number, NaN or infinite)."""
    if not is_finite_number(value):
        return None
    return float(value)


def _load(path: Path, key: dict, device: str) -> tuple[GPT | None, dict | None, str]:
    """(model, payload, "") from `path`, or (None, the payload if it could be read, the reason it cannot be used).

    The weights must match the digest stored beside them (`weights_digest`), or, for shipped weights written
    before checkpoints carried one, the file's SHA-256 listed in SHIPPED_DIR/SHA256SUMS (`sha256sum *.pt`): a file damaged inside a tensor
    loads without an error and would give a model whose loss is NaN, or quietly worse."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a torn or corrupt file: pickle, zip or EOF errors alike
        return None, None, read_error(path, err)
    if not isinstance(payload, dict):
        return None, None, f"holds a {type(payload).__name__}, not a checkpoint"
    if payload.get("key") != json.loads(json.dumps(key)):
        return None, payload, "was written for another configuration or an older format"
    try:
        model = GPT(GPTConfig(**payload["config"]))
        model.load_state_dict(payload["state_dict"])
    except Exception as err:
        return None, payload, f"does not fit the model ({type(err).__name__})"
    if payload.get("digest") is None:
        listed = listed_sums(SHIPPED_DIR / "SHA256SUMS").get(path.name) if path.parent == SHIPPED_DIR else None
        if listed is None:
            return None, payload, "carries no digest of its weights (written before checkpoints did)"
        if hashlib.sha256(path.read_bytes()).hexdigest() != listed:
            return None, payload, "is damaged: its SHA-256 differs from the one SHA256SUMS lists beside it"
    elif weights_digest(payload["state_dict"]) != payload["digest"]:
        return None, payload, "is damaged: its weights do not match the digest stored beside them"
    return model.to(device).eval(), payload, ""


def pretrained(preset: str = "tiny", steps: int | None = None, *, seed: int = 0, device: str | None = None,
               cache_dir=None, progress: bool = True, quiet: bool = False, **overrides) -> Trained:
    """A course GPT of `preset` (helpers.gpt.model.PRESETS, fields overridable, e.g. n_kv_head=2) trained on the
    stdlib corpus: loaded from the course cache when present, else trained once and saved atomically, under a
    lock that lets one process at a time find, train and save it (`checkpoint_lock`).

    steps: training steps (None: SCHEDULES' default for the preset); seed: initialisation and batches;
    device: where the returned model lives (None: CUDA when available); quiet: no sentence about
    loading, waiting or training. Raises ValueError for an unknown preset, an invalid override or steps.
    """
    config = GPTConfig.preset(preset, **overrides)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative int")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    sched = schedule_for(preset, steps, config)
    key = checkpoint_key(config, sched, seed)
    path = checkpoint_path(key, cache_dir)
    with checkpoint_lock(path, preset, quiet):
        return _find_or_train(preset, config, sched, key, path, seed, device, progress, quiet)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds:.0f} s, {seconds / 60:.0f} min"


def _find_or_train(preset: str, config: GPTConfig, sched: dict, key: dict, path: Path, seed: int, device: str,
                   progress: bool, quiet: bool) -> Trained:
    """The body of `pretrained`, run under the checkpoint's lock."""
    say = (lambda text: None) if quiet else (lambda text: print(text, flush=True))
    cached = ""  # why the cached checkpoint cannot be used ("" when there is none)
    if path.is_file():
        model, payload, cached = _load(path, key, device)
        if model is not None:
            seconds = _number(payload.get("seconds")) or float("nan")
            val = _number(payload.get("val_loss"))
            if val is None:
                say(f"pretrained {preset}: the cached checkpoint {path.name} holds the weights but no validation "
                    f"loss (a torn or partial write); measuring it again and rewriting the file.")
                val = validation_loss(model)
                _save(path, key, model, val, seconds, preset, quiet)
            say(f"pretrained {preset}: loaded {path.name} ({sched['steps']} steps; validation loss "
                f"{val:.3f} nats/byte)")
            return Trained(model, val, math.exp(val), path, False, seconds, sched)
    shipped = shipped_path(key)
    unusable = ""  # why the shipped weights cannot be used, and what training instead costs
    if shipped.is_file():
        model, payload, why = _load(shipped, _without_corpus(key), device)
        seconds = _number((payload or {}).get("seconds"))
        if model is not None:
            if cached:
                say(f"pretrained {preset}: the cached checkpoint {path.name} {cached}; using the shipped weights.")
            val = validation_loss(model)  # on this machine's held-out files, which the shipped run may not have had
            _save(path, key, model, val, seconds or float("nan"), preset, quiet)
            say(f"pretrained {preset}: weights shipped with the course ({sched['steps']} steps, trained once on "
                f"{payload.get('trained_on', 'a CPU')} in {seconds or float('nan'):.0f} s); validation "
                f"loss on this machine's held-out files {val:.3f} nats/byte (perplexity {math.exp(val):.2f})")
            return Trained(model, val, math.exp(val), path, False, seconds or float("nan"), sched)
        took = (f"the shipped run took {_minutes(seconds)} on {payload.get('trained_on', 'a CPU')}" if seconds
                else "how long the shipped run took is unknown, as its file cannot tell")
        unusable = f"the shipped weights {shipped} {why}; training {sched['steps']} steps on {device} instead " \
                   f"({took}; later runs load the result)."
    if cached:
        again = "." if unusable else f" ({sched['steps']} steps on {device})."
        say(f"pretrained {preset}: the cached checkpoint {path.name} {cached}; training it again{again}")
    if unusable:
        say(f"pretrained {preset}: {unusable}")
    elif not cached:
        say(f"pretrained {preset}: no checkpoint in {path.parent} yet; training {sched['steps']} steps once "
            f"on {device} (later runs load it).")
    t0 = time.perf_counter()
    model = train(config, sched, seed=seed, device=device, progress=progress)
    seconds = time.perf_counter() - t0
    val = validation_loss(model)
    _save(path, key, model, val, seconds, preset, quiet)
    say(f"pretrained {preset}: trained in {seconds:.1f} s; validation loss {val:.3f} nats/byte "
        f"(perplexity {math.exp(val):.2f})")
    return Trained(model, val, math.exp(val), path, True, seconds, sched)


def _save(path: Path, key: dict, model: GPT, val: float, seconds: float, preset: str, quiet: bool, **extra) -> bool:
    """Write {key, config, state_dict, val_loss, seconds, **extra} atomically; False (and one sentence)
    when the folder cannot be written: a read-only cache is no reason to fail."""
    buf = io.BytesIO()
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save({"key": key, "config": asdict(model.config), "state_dict": state, "val_loss": val,
                "seconds": seconds, "digest": weights_digest(state), **extra}, buf)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, buf.getvalue(), fsync=True)
        return True
    except OSError as err:
        if not quiet:
            print(f"pretrained {preset}: could not save the checkpoint ({err}); it will be trained again next time.")
        return False


# -- weights shipped with the course ------------------------------------------------------------------
# Training the smoke models to the point where they write recognisable Python takes minutes on a CPU, more
# than a smoke run may spend, so the course ships those weights (trained here, with `python -m
# helpers.gpt.pretrained ship`). They are keyed like a cached checkpoint but without the corpus, whose key
# holds file sizes and dates that differ between machines; the validation loss is measured again on the
# machine that loads them, and they are then copied into the cache under the local key.
SHIPPED_DIR = Path(__file__).resolve().parent / "weights"
# what `ship` trains: the smoke target of notebooks 08, 10 and 11, and notebook 11's smoke draft
SHIP: list[tuple[str, dict]] = [("tiny", {}), ("tiny", dict(n_layer=1, d_model=64, n_head=2, d_ff=256))]


def _without_corpus(key: dict) -> dict:
    return json.loads(json.dumps({k: v for k, v in key.items() if k != "corpus"}))


def shipped_path(key: dict) -> Path:
    """Where the shipped weights for `key` would be (whatever its corpus)."""
    bare = _without_corpus(key)
    digest = hashlib.sha256(json.dumps(bare, sort_keys=True).encode()).hexdigest()[:16]
    return SHIPPED_DIR / f"gpt-{bare['config']['n_layer']}L-{bare['config']['d_model']}d-" \
        f"{bare['schedule']['steps']}steps-{digest}.pt"


def ship(preset: str = "tiny", *, seed: int = 0, progress: bool = True, **overrides) -> Path:
    """Train `preset` (with `overrides`) on this machine's CPU and write it to SHIPPED_DIR; returns the path."""
    config = GPTConfig.preset(preset, **overrides)
    sched = schedule_for(preset, None, config)
    key = checkpoint_key(config, sched, seed)
    t0 = time.perf_counter()
    model = train(config, sched, seed=seed, device="cpu", progress=progress)
    seconds = time.perf_counter() - t0
    path = shipped_path(key)
    where = f"a {platform.machine()} CPU, Python {platform.python_version()}'s standard library"
    _save(path, _without_corpus(key), model, validation_loss(model), seconds, preset, False, trained_on=where)
    return path


if __name__ == "__main__":  # python -m helpers.gpt.pretrained ship: (re)make the shipped weights
    if sys.argv[1:] != ["ship"]:
        raise SystemExit("usage: python -m helpers.gpt.pretrained ship")
    for name, extra in SHIP:
        print(ship(name, **extra))
