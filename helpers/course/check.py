"""Exercises: named checks whose expected values live in `helpers.course.exercises`, out of the reader's sight.

A notebook asks a question and calls one function::

    check.exercise("01.add_intensity", answer_1)      # a number, a word, or ...
    check.exercise("06.merge", state_merge)           # a function the learner wrote

The name is "<notebook>.<key>"; its definition (expected value or reference implementation, the
inputs a function is called on, the tolerance, the hint and planted wrong answers for CI) is
registered in `helpers/course/exercises/nb<notebook>.py`. Three kinds:

* **value**: a number compared with a relative tolerance. A wrong number is told how far off it is
  in words (a band such as "too high by a factor between 2.5 and 10", or "by an exact power of two"),
  never the expected value; a close miss is told the precision the answer needs.
* **choice**: one word out of a stated list (e.g. "memory" / "compute").
* **code**: the learner's function is called on every case (odd sizes, masked rows, infs, ...)
  beside the reference, and the outputs compared with `torch.testing.assert_close` at the stated
  tolerance. The first failing case is named with its input shapes and the error. An exception in
  the learner's code is reported with its message and the case that raised it. A returned tensor must
  have the dtype of the reference's where the task names that dtype (`dtypes`: by default every dtype
  the prompt names, e.g. "int8 codes", "cast to e4m3fn"), and has to be an ordinary dense tensor with
  values (a meta or sparse tensor FAILs with a sentence saying so). A returned tuple's items are named
  by the exercise's `outputs` in every message; a count the task itself states (`stated`) is said
  outright ("2 graphs; it must be 1").
* **time limit**: every call of the learner's function on a case (through the exercise's runner) has
  `time_limit` seconds (`DEFAULT_TIME_LIMIT` unless the exercise sets its own); one that runs longer
  FAILs with "case k/n (...) did not return within N s". In the main thread on a POSIX system (a
  Jupyter kernel runs cells there) a SIGALRM timer (`signal.setitimer`) stops the call, whatever it is
  doing in Python: an endless loop, a sleep. Elsewhere (another thread; Windows, which has no
  setitimer) a trace function (`sys.settrace`) stops a Python loop at its next line once time is up;
  a call stuck inside one C function cannot be stopped there, and is reported when it returns. An
  outer SIGALRM timer (pytest-timeout's, say) is put back with its remaining time. (A thread with a
  timeout would only stop waiting: the learner's loop would go on in the background.) Nothing inside
  the process stops a loop whose bare `except:` swallows every interruption.

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
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from helpers.course.outputs import compare, describe, dtype_name, how_far
from helpers.course.time_limit import CaseTimeout, TimeLimit

KINDS = ("value", "choice", "code")
# seconds a learner's function may take on one case; ten times what the slowest reference case takes cold
# on a 2-core CPU (about 1 s: 01.swiglu's first FLOP count imports torch's flop counter)
DEFAULT_TIME_LIMIT = 10.0
REGISTRY: dict[str, "Exercise"] = {}
_STATUS: dict[str, str] = {}


@dataclass(frozen=True)
class Case:
    """One input a code exercise is called on: a label shown on failure, and the arguments."""

    label: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Exercise:
    """One exercise. `solution` is the expected value's function (value, choice) or the reference
    implementation (code); `wrong` holds planted wrong answers that CI checks are refused. Frozen: a learner's
    function that reassigns `REGISTRY[name].solution` while it is checked raises, and so fails."""

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
    time_limit: float = DEFAULT_TIME_LIMIT
    dtypes: frozenset = frozenset()
    stated: tuple = ()

    def expected(self) -> Any:
        """The expected value (value and choice exercises only)."""
        return self.solution()


def register(name: str, kind: str, *, prompt: str, hint: str, solution: Callable[..., Any],
             wrong: Iterable[Any] = (), rtol: float = 1e-2, atol: float = 0.0, options: Iterable[str] = (),
             cases: Callable[[], Sequence[Case]] | None = None, run: Callable[[Callable, Case], Any] | None = None,
             tolerance: str = "", outputs: Iterable[str] = (), time_limit: float = DEFAULT_TIME_LIMIT,
             dtypes: Iterable[Any] | None = None, stated: Iterable[str] = ()) -> Exercise:
    """Add an exercise to the registry (called from `helpers/course/exercises/nbXX.py`).

    time_limit: seconds the learner's function may take on one case (code exercises). dtypes: the dtypes
    (torch dtypes or their names) a returned tensor must keep when the reference returns that dtype; None
    means those the prompt names (`named_dtypes`), () means no dtype is checked. stated: output names
    (from `outputs`) whose whole-number expected value the task states, said outright on a mismatch.

    Raises ValueError for a malformed name or kind, a code exercise without cases, a choice
    without options, a `stated` name that is not in `outputs`, a time limit that is not a positive number of seconds, or a name registered twice.
    """
    if "." not in name or not name.split(".", 1)[0].isdigit():
        raise ValueError(f"exercise name {name!r} must look like '06.merge' (notebook number, dot, key)")
    if kind not in KINDS:
        raise ValueError(f"exercise {name!r}: kind={kind!r}; choose one of {', '.join(KINDS)}")
    if kind == "code" and cases is None:
        raise ValueError(f"code exercise {name!r} needs cases")
    if kind == "choice" and not options:
        raise ValueError(f"choice exercise {name!r} needs options")
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not 0 < time_limit < math.inf:
        raise ValueError(f"exercise {name!r}: time_limit={time_limit!r} must be a positive number of seconds")
    if name in REGISTRY:
        raise ValueError(f"exercise {name!r} is registered twice")
    names = named_dtypes(prompt) if dtypes is None else frozenset(dtype_name(d) for d in dtypes)
    stated, outputs = tuple(stated), tuple(outputs)
    if set(stated) - set(outputs):
        raise ValueError(f"exercise {name!r}: stated={stated!r} names outputs it does not have ({outputs!r})")
    ex = Exercise(name, kind, prompt, hint, solution, tuple(wrong), rtol, atol, tuple(options), cases, run,
                  tolerance, outputs, float(time_limit), names, stated)
    REGISTRY[name] = ex
    return ex


# the words a prompt may use for a dtype, beside torch's own name of it (str(dtype) without "torch.")
DTYPE_WORDS = {
    "float32": ("float32", "fp32"), "float64": ("float64", "fp64"), "float16": ("float16", "fp16"),
    "bfloat16": ("bfloat16", "bf16"), "float8_e4m3fn": ("float8_e4m3fn", "e4m3fn", "e4m3"),
    "float8_e5m2": ("float8_e5m2", "e5m2"), "bool": ("bool",), "uint8": ("uint8",), "int8": ("int8",),
    "int16": ("int16",), "int32": ("int32",), "int64": ("int64",),
}


def named_dtypes(prompt: str) -> frozenset:
    """The dtypes (torch's names, e.g. 'float8_e4m3fn') that `prompt` names as a word ("int8 codes",
    "cast to e4m3fn", "fp32 scales")."""
    words = set(re.findall(r"[A-Za-z0-9_]+", prompt.lower()))
    return frozenset(name for name, spellings in DTYPE_WORDS.items() if words & set(spellings))


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
    limit = TimeLimit(ex.time_limit)  # float() runs the answer's own __float__, which may never return
    try:
        try:
            with limit:
                given = float(answer)
        finally:
            limit.disarm()
    except CaseTimeout:
        return _say(ex.name, "FAIL", f"reading a number from your answer did not finish within {ex.time_limit:g} s "
                                     "(its __float__ never returns?)", ex.hint)
    except SystemExit as err:
        return _say(ex.name, "FAIL", f"reading a number from your answer called sys.exit({err.code!r})", ex.hint)
    except Exception as err:
        return _say(ex.name, "FAIL", f"could not read a number from {describe(answer)} ({type(err).__name__}: {err})",
                    ex.hint)
    expected = float(ex.expected())
    if not math.isfinite(given):
        return _say(ex.name, "FAIL", f"you gave {given}, which is not a finite number", ex.hint)
    if math.isclose(given, expected, rel_tol=ex.rtol, abs_tol=ex.atol):
        return _say(ex.name, "PASS", f"{given:.4g} is right (tolerance {ex.rtol:.0e} relative)")
    return _say(ex.name, "FAIL", f"you gave {given:.4g}; {how_far(given, expected, ex.rtol)}", ex.hint)


def _check_choice(ex: Exercise, answer: Any) -> str:
    options = ", ".join(repr(o) for o in ex.options)
    if not isinstance(answer, str) or answer.strip().lower() not in [o.lower() for o in ex.options]:
        return _say(ex.name, "FAIL", f"{answer!r} is not one of {options}", ex.hint)
    ok = answer.strip().lower() == str(ex.expected()).lower()
    if ok:
        return _say(ex.name, "PASS", f"{answer.strip()!r} is right")
    return _say(ex.name, "FAIL", f"{answer.strip()!r} is not right (the options are {options})", ex.hint)


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


def _limited(fn: Callable, case: Case, run: Callable | None, seconds: float) -> tuple[bool, Any]:
    """(True, the output) of the learner's call on `case`, or (False, None) when it ran past `seconds`."""
    limit = TimeLimit(seconds)
    try:
        try:
            with limit:
                got = _call(fn, case, run)
        finally:
            limit.disarm()
    except CaseTimeout:
        limit.disarm()
        return False, None
    return (False, None) if limit.overran else (True, got)


def _check_code(ex: Exercise, fn: Any) -> str:
    if not callable(fn):
        return _say(ex.name, "FAIL", f"expected a function, got {describe(fn)}", ex.hint)
    cases = list(ex.cases())
    tolerance = ex.tolerance or f"rtol={ex.rtol:g}, atol={ex.atol:g}"
    unwritten = "your function returns None: its body is not written yet"
    watched = _Watched(fn)
    same = compare  # taken before the learner's code runs: a function that replaces check.compare changes nothing
    for i, case in enumerate(cases):
        shapes = ", ".join(describe(a) for a in case.args) or "no arguments"
        want = _call(ex.solution, case, ex.run)  # the reference first, for the same reason
        try:
            returned, got = _limited(watched, case, ex.run, ex.time_limit)
        except SystemExit as err:  # sys.exit() in the learner's code ends the check, not the kernel
            return _say(ex.name, "FAIL", f"case {i + 1}/{len(cases)} ({case.label}; inputs {shapes}) called "
                                         f"sys.exit({err.code!r}); return the result instead", ex.hint)
        except NotImplementedError:
            return _say(ex.name, "TODO", unwritten if watched.first is None else
                        "not written yet (it raises NotImplementedError)", ex.hint)
        except Exception as err:  # the learner's code failed: report it, never raise
            if i == 0 and watched.first is None:  # a runner choked on the None of an unwritten body
                return _say(ex.name, "TODO", unwritten, ex.hint)
            return _say(ex.name, "FAIL", f"case {i + 1}/{len(cases)} ({case.label}; inputs {shapes}) raised "
                                         f"{type(err).__name__}: {err}", ex.hint)
        if not returned:
            return _say(ex.name, "FAIL", f"case {i + 1}/{len(cases)} ({case.label}; inputs {shapes}) did not return "
                                         f"within {ex.time_limit:g} s (a loop that never ends?)", ex.hint)
        if i == 0 and watched.first is None:
            return _say(ex.name, "TODO", unwritten, ex.hint)
        try:
            why = same(got, want, ex.rtol, ex.atol, ex.outputs, ex.dtypes, ex.stated)
        except Exception as err:  # something compare cannot read (an exotic tensor subclass): say so, never raise
            why = f"could not compare what it returned ({describe(got)}) with a correct version's: " \
                  f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"
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
    ex = copy.copy(ex)  # the learner's code runs next: a new entry it puts in REGISTRY cannot reach this check
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
