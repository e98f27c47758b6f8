"""Notebook parameters: validation, profiles and the one setup call each notebook makes."""
from __future__ import annotations

import ast
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from helpers.measure import clock, heap, results
from helpers.show import widgets

PROFILES = ("auto", "smoke", "full")


def choose(name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """Return `value` if it is one of `allowed`, else raise a ValueError naming the parameter."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}")
    return value


def positive(name: str, value: Any, kind: type = int) -> Any:
    """Return `value` if it is a positive number of type `kind`, else raise a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:  # `not >`: NaN is refused too
        raise ValueError(f"{name}={value!r} must be a positive {kind.__name__}")
    return value


def is_finite_number(value: Any) -> bool:
    """True for an int or float that is finite and not a bool: what a number read from a JSON record must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive_number(name: str, value: Any) -> float:
    """A finite positive int or float, returned as a float; else a ValueError naming the parameter."""
    value = positive(name, float(value) if type(value) is int else value, float)
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite positive number")
    return value


def boolean(name: str, value: Any) -> bool:
    """Return `value` if it is True or False, else raise a ValueError naming the parameter (1, "yes" and
    None are not booleans here)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")
    return value


def listed(name: str, values: Any) -> Any:
    """`values`, or the list a string holds: papermill passes a list parameter given on the command line with
    `-p NAME "[1, 2]"` as the text "[1, 2]", which is read here as a Python literal (`ast.literal_eval`).
    A string that is not a list or tuple literal raises a ValueError naming the parameter and saying how to
    pass a list (`-y "NAME: [1, 2]"`). Anything else is returned as it is, for the caller to validate."""
    if not isinstance(values, (str, bytes)):
        return values
    text = values.decode() if isinstance(values, bytes) else values
    try:
        parsed = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        parsed = None
    if not isinstance(parsed, (list, tuple)):
        raise ValueError(f"{name}={values!r} is a string, not a list: papermill's -p passes text; pass a list "
                         f"literal such as -p {name} \"[1, 2]\", or YAML with -y \"{name}: [1, 2]\"")
    return parsed


def positives(name: str, values: Any, kind: type = int) -> list:
    """Return `values` as a list if it is a non-empty list or tuple of positive `kind`s, else raise a
    ValueError naming the parameter. A string is read as a list literal first (`listed`): "[1, 2]" is [1, 2]."""
    values = listed(name, values)
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{name}={values!r} must be a non-empty list of positive {kind.__name__}s")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
            raise ValueError(f"{name}={values!r}: entry {value!r} must be a positive {kind.__name__}")
    return list(values)


def choices(name: str, values: Any, allowed: Iterable[Any]) -> list:
    """Return `values` as a list if it is a non-empty list or tuple of entries from `allowed`, else raise a
    ValueError naming the parameter. A string is read as a list literal first (`listed`)."""
    allowed = tuple(allowed)
    values = listed(name, values)
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{name}={values!r} must be a non-empty list drawn from {', '.join(map(repr, allowed))}")
    for value in values:
        if value not in allowed:
            raise ValueError(f"{name}={values!r}: entry {value!r} is not allowed; choose from "
                             f"{', '.join(map(repr, allowed))}")
    return list(values)


def resolve_profile(profile: str) -> str:
    """Map "auto" to "full" on CUDA and "smoke" elsewhere; validate the name."""
    choose("PROFILE", profile, PROFILES)
    if profile != "auto":
        return profile
    import torch  # heavy: imported only when a profile is resolved

    return "full" if torch.cuda.is_available() else "smoke"


def by_profile(profile: str, *, smoke: Any, full: Any) -> Any:
    """Pick the value that belongs to the resolved profile."""
    return {"smoke": smoke, "full": full}[choose("PROFILE", profile, ("smoke", "full"))]


@dataclass(frozen=True)
class Setup:
    """What a notebook knows after validating its parameters."""

    profile: str
    device: str
    seed: int
    interactive: bool
    results_dir: Path

    def pick(self, *, smoke: Any, full: Any) -> Any:
        """The value for this run's profile."""
        return by_profile(self.profile, smoke=smoke, full=full)

    def resolve(self, name: str, value: Any, *, smoke: Any, full: Any,
                check: Callable[[str, Any], Any] | None = None) -> Any:
        """`value` if it was given, else this profile's default; then validated by `check(name, value)`.

        `None` is the only "use the default": 0, [] or "" are validated like any other value, so
        `-p REPS=0` fails here with a ValueError naming REPS instead of silently becoming the default.
        E.g. `REPS = S.resolve("REPS", REPS, smoke=5, full=20, check=params.positive)`.
        """
        value = self.pick(smoke=smoke, full=full) if value is None else value
        if check is not None:
            checked = check(name, value)
            value = value if checked is None else checked
        return value


def setup(profile: str = "auto", seed: int = 0, interactive: bool = True,
          results_dir: str | None = None, device: str = "auto") -> Setup:
    """Validate the common parameters, seed every RNG and point `record` at the results folder. On a CPU, torch is
    set to one thread: the course times CPU work on the thread's own clock (`measure.clock`), which counts one
    thread only, and the thread's tally of timed seconds starts over; freed memory stays in the process
    (`heap.keep_freed_memory`), so a timed call does not pay the kernel's page faults for its tensors."""
    import torch  # heavy: the runner imports this module for PROFILES without needing torch

    resolved = resolve_profile(profile)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
        raise ValueError(f"SEED={seed!r} must be an int from 0 to 2**32 - 1 (numpy's seeds stop there)")
    if not isinstance(interactive, bool):
        raise ValueError(f"INTERACTIVE={interactive!r} must be True or False")
    choose("DEVICE", device, ("auto", "cpu", "cuda"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise ValueError("DEVICE='cuda' was asked for but no CUDA device is visible; use 'auto' or 'cpu'")
    if device == "cpu":
        torch.set_num_threads(1)
        heap.keep_freed_memory()  # a freed tensor's pages stay for the next one: no page faults in a timed call
    clock.reset()
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # numpy is a dependency, but seeding must never be the thing that fails
        pass
    folder = results.configure(results_dir=results_dir, profile=resolved)
    widgets.set_interactive(interactive)
    return Setup(profile=resolved, device=device, seed=seed, interactive=interactive, results_dir=folder)


def fill(namespace: dict, resolver: Callable[..., dict], setup: Setup) -> None:
    """The one way a notebook resolves its own parameters: `resolver(setup, NAME=namespace["NAME"], ...)` for
    every keyword-only parameter the resolver takes (a lab's `resolve_parameters`), with the values read from
    `namespace` (the notebook's `globals()`); the resolved values are written back into `namespace` and one line
    says what the profile filled in. Returns None, so that a setup cell ending with the call shows that line
    alone (the values are the notebook's globals).

    E.g. `params.fill(globals(), kv_cache_lab.resolve_parameters, S)` after the parameters cell. Raises a
    NameError naming a parameter the resolver wants and the namespace lacks; the resolver raises a ValueError
    naming the first bad value.
    """
    import inspect

    wanted = [p.name for p in inspect.signature(resolver).parameters.values() if p.kind is p.KEYWORD_ONLY]
    missing = [n for n in wanted if n not in namespace]
    if missing:
        raise NameError(f"the parameters cell defines no {', '.join(missing)}, which "
                        f"{resolver.__module__}.{resolver.__name__} needs")
    given = {n: namespace[n] for n in wanted}
    resolved = resolver(setup, **given)
    namespace.update(resolved)
    chosen = [f"{n}={resolved[n]!r}" for n in wanted if given[n] is None and resolved.get(n) is not None]
    if chosen:
        print(f"the {setup.profile} profile fills in: " + ", ".join(chosen))


def free_bytes(device: str) -> int:
    """Memory free for this process's tensors now: the GPU's free bytes on CUDA, the machine's available RAM else."""
    import torch

    if device == "cuda" and torch.cuda.is_available():  # a CUDA setup without a GPU (a test's) falls back to RAM
        return int(torch.cuda.mem_get_info()[0])
    import psutil

    return int(psutil.virtual_memory().available)


def fits(name: str, value: Any, need_bytes: int, device: str, what: str) -> Any:
    """`value` when `need_bytes` (a floor on what the size `value` of parameter `name` makes `what` need) fits in
    the memory free on `device`; else a ValueError naming the parameter, the bytes and what is free, raised
    before anything is allocated (SEQ_LEN=10**9 would otherwise try to allocate half a terabyte in a later cell)."""
    free = free_bytes(device)
    if need_bytes > free:
        raise ValueError(f"{name}={value!r} makes {what} need at least {need_bytes / 1e9:.3g} GB; "
                         f"{free / 1e9:.3g} GB is free on this {device}")
    return value

