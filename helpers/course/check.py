"""Exercises: named checks whose expected values live in `helpers.course.exercises`, out of the reader's sight.

A notebook asks a question and calls one function::

    check.exercise("01.add_intensity", answer_1)      # a number, a word, or ...
    check.exercise("06.merge", softmax_merge)         # a function the learner wrote

The name is "<notebook>.<key>"; its definition (expected value or reference implementation, the
inputs a function is called on, the tolerance, the hint and planted wrong answers for CI) is
registered in `helpers/course/exercises/nb<notebook>.py`. Three kinds:

* **value**: a number compared with a relative tolerance. A wrong number is told how far off it is
  in words (a band such as "too high by a factor of 2 to 10"), never the expected value.
* **choice**: one word out of a stated list (e.g. "memory" / "compute").
* **code**: the learner's function is called on every case (odd sizes, masked rows, infs, ...)
  beside the reference, and the outputs compared with `torch.testing.assert_close` at the stated
  tolerance. The first failing case is named with its input shapes and the error. An exception in
  the learner's code is reported with its message and the case that raised it.

Nothing here raises for a wrong or missing answer: an unanswered exercise (`...`, or a function
whose body is still `...` and so returns None) prints TODO, so a headless run never fails on one.
`summary("06")` prints every exercise of a notebook with its state in this session;
`python -m helpers.course.check 06` runs each checker on its reference (PASS) and on its planted wrong
answers (FAIL), which is what CI does for every exercise.
"""
from __future__ import annotations

import copy
import importlib
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

KINDS = ("value", "choice", "code")
REGISTRY: dict[str, "Exercise"] = {}
_STATUS: dict[str, str] = {}


@dataclass(frozen=True)
class Case:
    """One input a code exercise is called on: a label shown on failure, and the arguments."""

    label: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Exercise:
    """One exercise. `solution` is the expected value's function (value, choice) or the reference
    implementation (code); `wrong` holds planted wrong answers that CI checks are refused."""

    name: str
    kind: str
    prompt: str
    hint: str
    solution: Callable[..., Any]
    wrong: tuple = ()
    rtol: float = 1e-2
    atol: float = 0.0
    options: tuple = ()
    cases: Callable[[], Sequence[Case]] | None = None
    run: Callable[[Callable, Case], Any] | None = None
    tolerance: str = ""
    outputs: tuple = ()

    def expected(self) -> Any:
        """The expected value (value and choice exercises only)."""
        return self.solution()


def register(name: str, kind: str, *, prompt: str, hint: str, solution: Callable[..., Any],
             wrong: Iterable[Any] = (), rtol: float = 1e-2, atol: float = 0.0, options: Iterable[str] = (),
             cases: Callable[[], Sequence[Case]] | None = None, run: Callable[[Callable, Case], Any] | None = None,
             tolerance: str = "", outputs: Iterable[str] = ()) -> Exercise:
    """Add an exercise to the registry (called from `helpers/course/exercises/nbXX.py`).

    Raises ValueError for a malformed name or kind, a code exercise without cases, a choice
    without options, or a name registered twice.
    """
    if "." not in name or not name.split(".", 1)[0].isdigit():
        raise ValueError(f"exercise name {name!r} must look like '06.merge' (notebook number, dot, key)")
    if kind not in KINDS:
        raise ValueError(f"exercise {name!r}: kind={kind!r}; choose one of {', '.join(KINDS)}")
    if kind == "code" and cases is None:
        raise ValueError(f"code exercise {name!r} needs cases")
    if kind == "choice" and not options:
        raise ValueError(f"choice exercise {name!r} needs options")
    if name in REGISTRY:
        raise ValueError(f"exercise {name!r} is registered twice")
    ex = Exercise(name, kind, prompt, hint, solution, tuple(wrong), rtol, atol, tuple(options), cases, run,
                  tolerance, tuple(outputs))
    REGISTRY[name] = ex
    return ex


def load(notebook: str) -> list[Exercise]:
    """Import the exercises of one notebook ("06") and return them in registration order."""
    notebook = str(notebook)[:2]
    try:
        importlib.import_module(f"helpers.course.exercises.nb{notebook}")
    except ModuleNotFoundError as err:
        if err.name != f"helpers.course.exercises.nb{notebook}":
            raise
    return [ex for name, ex in REGISTRY.items() if name.split(".", 1)[0] == notebook]


def get(name: str) -> Exercise:
    """The exercise called `name`, loading its notebook's module; KeyError with the known names."""
    if name not in REGISTRY:
        load(name.split(".", 1)[0])
    if name not in REGISTRY:
        known = ", ".join(ex.name for ex in load(name.split(".", 1)[0])) or "none"
        raise KeyError(f"no exercise {name!r}; this notebook has: {known}")
    return REGISTRY[name]


# ---------------------------------------------------------------- verdicts

def _unanswered(answer: Any) -> bool:
    return answer is None or answer is Ellipsis


def how_far(given: float, expected: float) -> str:
    """Say how far `given` is from `expected` in a band of words, without revealing `expected`."""
    if expected == 0:
        return "too high" if given > 0 else "too low"
    if given == 0:
        return "zero is not the answer"
    if (given > 0) != (expected > 0):
        return "the sign is wrong"
    ratio = given / expected
    word = "too high" if ratio > 1 else "too low"
    factor = max(ratio, 1 / ratio)
    if factor < 1.1:
        return f"close, but {word} by less than 10%"
    if factor < 1.5:
        return f"{word} by 10% to 50%"
    if factor < 2.5:
        return f"{word} by a factor of 1.5 to 2.5"
    if factor < 10:
        return f"{word} by a factor between 2.5 and 10"
    return f"{word} by a factor of about 10^{round(math.log10(factor))}: check the units and powers of ten"


def _say(name: str, verdict: str, text: str, hint: str = "") -> str:
    _STATUS[name] = verdict
    line = f"{verdict:<5} {name}: {text}"
    if verdict != "PASS" and hint:
        line += f"\n      hint: {hint}"
    print(line)
    return verdict


def _check_value(ex: Exercise, answer: Any) -> str:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) and not hasattr(answer, "__float__"):
        return _say(ex.name, "FAIL", f"expected a number, got {type(answer).__name__} {answer!r}", ex.hint)
    try:
        given = float(answer)
    except (TypeError, ValueError) as err:
        return _say(ex.name, "FAIL", f"could not read a number from {answer!r} ({err})", ex.hint)
    expected = float(ex.expected())
    if not math.isfinite(given):
        return _say(ex.name, "FAIL", f"you gave {given}, which is not a finite number", ex.hint)
    if math.isclose(given, expected, rel_tol=ex.rtol, abs_tol=ex.atol):
        return _say(ex.name, "PASS", f"{given:.4g} is right (tolerance {ex.rtol:.0e} relative)")
    return _say(ex.name, "FAIL", f"you gave {given:.4g}; {how_far(given, expected)}", ex.hint)


def _check_choice(ex: Exercise, answer: Any) -> str:
    options = ", ".join(repr(o) for o in ex.options)
    if not isinstance(answer, str) or answer.strip().lower() not in [o.lower() for o in ex.options]:
        return _say(ex.name, "FAIL", f"{answer!r} is not one of {options}", ex.hint)
    ok = answer.strip().lower() == str(ex.expected()).lower()
    if ok:
        return _say(ex.name, "PASS", f"{answer.strip()!r} is right")
    return _say(ex.name, "FAIL", f"{answer.strip()!r} is not right (the options are {options})", ex.hint)


def describe(value: Any) -> str:
    """A short description of a case's argument: shape and dtype of a tensor, else its repr."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"tensor{tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"{type(value).__name__} of {len(value)}"
    if isinstance(value, (list, tuple)):
        return f"({', '.join(describe(v) for v in value)})" if isinstance(value, tuple) else \
            f"[{', '.join(describe(v) for v in value)}]"
    if callable(value):
        return getattr(value, "__name__", "a function")
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def compare(got: Any, want: Any, rtol: float, atol: float, names: Sequence[str] = ()) -> str | None:
    """None when `got` matches `want` (tensors, numbers, and tuples/lists/dicts of them), else why not.

    `names` name the items of a returned tuple in the message ("new_scale: ..." rather than "item 1").
    """
    import torch  # heavy: value and choice exercises, and the registry itself, need no torch

    if isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return f"expected a {type(want).__name__} of {len(want)} values, got {describe(got)}"
        for i, (g, w) in enumerate(zip(got, want)):
            why = compare(g, w, rtol, atol)
            if why:
                return f"{names[i] if i < len(names) else f'item {i}'}: {why}"
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"expected a dict with keys {sorted(want)}, got {describe(got)}"
        for key in want:
            why = compare(got[key], want[key], rtol, atol)
            if why:
                return f"[{key!r}]: {why}"
        return None
    if isinstance(want, str) or isinstance(want, bool) or want is None:
        return None if got == want else f"got {describe(got)}, which is not what a correct version returns here"
    if isinstance(want, torch.Tensor) and not isinstance(got, torch.Tensor):
        return f"expected a tensor of shape {tuple(want.shape)}, got {describe(got)}"
    try:
        g = torch.as_tensor(got, dtype=torch.float64) if not isinstance(got, torch.Tensor) else got.double()
    except (TypeError, ValueError, RuntimeError):
        return f"expected a number, got {describe(got)}"
    w = torch.as_tensor(want, dtype=torch.float64) if not isinstance(want, torch.Tensor) else want.double()
    if g.shape != w.shape:
        return f"shape {tuple(g.shape)}, expected {tuple(w.shape)}"
    g, w = g.cpu(), w.cpu()
    try:
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError:
        return _difference(g, w, rtol, atol)
    return None


def _difference(got, want, rtol: float, atol: float) -> str:
    """How `got` differs from `want`, without printing `want` (that would be the answer)."""
    import torch  # heavy: as in compare

    if got.numel() == 1:
        g, w = float(got.reshape(())), float(want.reshape(()))
        if not (torch.isfinite(got).all() and torch.isfinite(want).all()):
            return f"got {g}, which is not what a correct version gives here (infinities and NaNs must match)"
        return f"got {g:.6g}: {how_far(g, w)}"
    same_nan = torch.isnan(got) & torch.isnan(want)
    close = torch.isclose(got, want, rtol=rtol, atol=atol) | same_nan
    bad = (~close).nonzero()
    first = tuple(bad[0].tolist())
    nonfinite = ~(torch.isfinite(got) & torch.isfinite(want)) & ~close
    text = f"{len(bad)} of {got.numel()} values differ (tolerance rtol={rtol:g}, atol={atol:g}); the first at index {first}"
    if nonfinite.any():
        return text + f", where you have {float(got[first])} (infinities or NaNs that a correct version does not give)"
    text += f" (yours there: {float(got[first]):.6g})"  # the learner's own value, never the expected one
    diff = (got - want).abs()[~close]
    nonzero = want.abs()[~close] != 0  # a relative difference means nothing where the right value is 0
    rel = f", largest relative {float((diff[nonzero] / want.abs()[~close][nonzero]).max()):.3g}" if nonzero.any() else ""
    return text + f"; largest absolute difference {float(diff.max()):.3g}{rel}"


class _Watched:
    """The learner's function, remembering whether its first call returned None (an unwritten body)."""

    def __init__(self, fn: Callable):
        self.fn, self.first = fn, Ellipsis

    def __call__(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)
        if self.first is Ellipsis:
            self.first = out
        return out


def _call(fn: Callable, case: Case, run: Callable | None) -> Any:
    case = Case(case.label, copy.deepcopy(case.args), copy.deepcopy(case.kwargs))  # learners may write in place
    return run(fn, case) if run else fn(*case.args, **case.kwargs)


def _check_code(ex: Exercise, fn: Any) -> str:
    if not callable(fn):
        return _say(ex.name, "FAIL", f"expected a function, got {describe(fn)}", ex.hint)
    cases = list(ex.cases())
    tolerance = ex.tolerance or f"rtol={ex.rtol:g}, atol={ex.atol:g}"
    unwritten = "your function returns None: its body is not written yet"
    watched = _Watched(fn)
    for i, case in enumerate(cases):
        shapes = ", ".join(describe(a) for a in case.args) or "no arguments"
        try:
            got = _call(watched, case, ex.run)
        except NotImplementedError:
            return _say(ex.name, "TODO", unwritten if watched.first is None else
                        "not written yet (it raises NotImplementedError)", ex.hint)
        except Exception as err:  # the learner's code failed: report it, never raise
            if i == 0 and watched.first is None:  # a runner choked on the None of an unwritten body
                return _say(ex.name, "TODO", unwritten, ex.hint)
            return _say(ex.name, "FAIL", f"case {i + 1}/{len(cases)} ({case.label}; inputs {shapes}) raised "
                                         f"{type(err).__name__}: {err}", ex.hint)
        if i == 0 and watched.first is None:
            return _say(ex.name, "TODO", unwritten, ex.hint)
        want = _call(ex.solution, case, ex.run)
        why = compare(got, want, ex.rtol, ex.atol, ex.outputs)
        if why:
            return _say(ex.name, "FAIL", f"case {i + 1}/{len(cases)} ({case.label}; inputs {shapes}): {why}",
                        ex.hint)
    return _say(ex.name, "PASS", f"all {len(cases)} cases match the course's reference ({tolerance})")


def exercise(name: str, answer: Any) -> None:
    """Check a learner's answer to the exercise `name` and print TODO, PASS or FAIL (never raises).

    Returns None so that a notebook cell shows only the printed verdict.
    """
    try:
        ex = get(name)
    except KeyError as err:
        print(f"ERROR {name}: {err.args[0]}")
        return None
    if _unanswered(answer):
        _say(name, "TODO", "not answered yet (replace the ...)", ex.hint)
        return None
    {"value": _check_value, "choice": _check_choice, "code": _check_code}[ex.kind](ex, answer)
    return None


def summary(notebook: str) -> None:
    """Print every exercise of a notebook with its state in this session (PASS, FAIL, TODO, not run)."""
    exercises = load(notebook)
    if not exercises:
        print(f"notebook {notebook} has no registered exercises")
        return
    done = sum(_STATUS.get(ex.name) == "PASS" for ex in exercises)
    print(f"exercises of notebook {notebook}: {done} of {len(exercises)} passed")
    for ex in exercises:
        print(f"  {_STATUS.get(ex.name, 'not run'):<8} {ex.name:<24} {ex.kind:<6} {ex.prompt}")


def self_test(notebook: str) -> list[tuple[str, str, str]]:
    """Run each checker of a notebook on its reference (must PASS) and planted wrong answers (must FAIL).

    Returns (exercise, what was checked, verdict) rows; printed output is the checkers' own.
    """
    rows = []
    for ex in load(notebook):
        reference = ex.solution if ex.kind == "code" else ex.expected()
        rows.append((ex.name, "reference", _verdict_of(ex.name, reference)))
        for i, wrong in enumerate(ex.wrong):
            rows.append((ex.name, f"wrong {i + 1}", _verdict_of(ex.name, wrong)))
    return rows


def _verdict_of(name: str, answer: Any) -> str:
    exercise(name, answer)
    return _STATUS[name]


def main(argv: list[str] | None = None) -> int:
    """`python -m helpers.course.check 06 [07 ...]`: prove each checker on its reference and wrong answers."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m helpers.course.check NOTEBOOK [NOTEBOOK ...]   e.g. 06, or 'all'")
        return 0 if argv else 2
    if argv == ["all"]:
        argv = sorted(p.stem[2:] for p in (Path(__file__).parent / "exercises").glob("nb*.py"))
    bad = 0
    for notebook in argv:
        for name, what, verdict in self_test(notebook):
            want = "PASS" if what == "reference" else "FAIL"
            bad += verdict != want
            print(f"   -> {name} {what}: {verdict} ({'as it should' if verdict == want else 'WRONG, expected ' + want})")
    print(f"{'all checkers behave' if not bad else f'{bad} checker results were wrong'}")
    return 1 if bad else 0


if __name__ == "__main__":  # run through the package's module, which the exercise modules register into
    from helpers.course.check import main as _main

    raise SystemExit(_main())
