"""Both sides of every exercise checker, and no answer visible in any notebook.

For every registered exercise: the reference passes, every planted wrong answer fails with a hint,
an unanswered one prints TODO. Every notebook has at least one code exercise, calls the checker for
each of its exercises, and shows no expected value in its code cells.
"""
import json
import math
import re
from pathlib import Path

import pytest

from helpers.course import check

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = {p.stem[:2]: p for p in sorted((ROOT / "notebooks").glob("*.ipynb"))}
MODULES = sorted(p.stem[2:] for p in (ROOT / "helpers" / "course" / "exercises").glob("nb*.py"))
EXERCISES = [ex for nb in MODULES for ex in check.load(nb)]


def _verdict(capsys, name, answer):
    check.exercise(name, answer)
    return capsys.readouterr().out


# ---------------------------------------------------------------- the mechanism itself

@pytest.fixture
def toy():
    """Three throw-away exercises under notebook number 99."""
    import torch

    made = [
        check.register("99.value", "value", prompt="p", hint="think", solution=lambda: 12.5, wrong=(25.0,)),
        check.register("99.word", "choice", prompt="p", hint="h", solution=lambda: "memory",
                       options=("memory", "compute"), wrong=("compute",)),
        check.register("99.code", "code", prompt="p", hint="h", solution=lambda x: x * 2, rtol=0, atol=0,
                       cases=lambda: [check.Case("odd", (torch.arange(5.0),)),
                                      check.Case("inf", (torch.tensor([float("inf")]),))]),
    ]
    yield made
    for ex in made:
        check.REGISTRY.pop(ex.name)
        check._STATUS.pop(ex.name, None)


@pytest.mark.parametrize("answer, start", [(12.5, "PASS"), (12.51, "PASS"), (25.0, "FAIL"), (..., "TODO"),
                                           ("abc", "FAIL"), (float("nan"), "FAIL"), (True, "FAIL")])
def test_value_verdicts(capsys, toy, answer, start):
    out = _verdict(capsys, "99.value", answer)
    assert out.startswith(start)
    if start == "FAIL":
        assert "12.5" not in out


def test_a_wrong_value_is_told_how_far_off_without_the_answer(capsys, toy):
    out = _verdict(capsys, "99.value", 24.0)
    assert "too high by a factor of 1.5 to 2.5" in out and "hint: think" in out and "12.5" not in out
    assert "too low by a factor of 1.5 to 2.5" in _verdict(capsys, "99.value", 12.5 / 1.6)  # 1.6 is not "about 2"
    assert "10^3" in _verdict(capsys, "99.value", 12500.0)
    assert "sign" in _verdict(capsys, "99.value", -12.5)


def test_choice_verdicts(capsys, toy):
    assert _verdict(capsys, "99.word", " Memory ").startswith("PASS")
    assert _verdict(capsys, "99.word", "compute").startswith("FAIL")
    assert "is not one of 'memory', 'compute'" in _verdict(capsys, "99.word", "bandwidth")


def test_code_verdicts_name_the_failing_case(capsys, toy):
    import torch

    assert _verdict(capsys, "99.code", lambda x: x + x).startswith("PASS")
    out = _verdict(capsys, "99.code", lambda x: torch.nan_to_num(x * 2))
    assert out.startswith("FAIL") and "case 2/2 (inf; inputs tensor(1,) float32)" in out
    out = _verdict(capsys, "99.code", lambda x: x[:2] * 2)
    assert "case 1/2 (odd" in out and "shape (2,), expected (5,)" in out


def test_code_exceptions_and_unwritten_bodies_are_reported_not_raised(capsys, toy):
    def unwritten(x):
        ...

    def raising(x):
        raise NotImplementedError

    assert _verdict(capsys, "99.code", unwritten).startswith("TODO")
    assert _verdict(capsys, "99.code", raising).startswith("TODO")
    out = _verdict(capsys, "99.code", lambda x: x * torch_zero())
    assert out.startswith("FAIL") and "raised NameError" in out and "case 1/5" not in out
    assert _verdict(capsys, "99.code", 3).startswith("FAIL")


def torch_zero():  # noqa: D103 - used only to raise inside a learner function
    raise NameError("oops")


def test_learner_functions_cannot_change_the_reference_inputs(capsys, toy):
    assert _verdict(capsys, "99.code", lambda x: x.mul_(2)).startswith("PASS")


def test_unknown_names_and_bad_registrations(capsys):
    check.exercise("99.nothing", 1)
    assert capsys.readouterr().out.startswith("ERROR 99.nothing")
    for bad in (dict(name="merge", kind="value"), dict(name="99.x", kind="number"),
                dict(name="99.y", kind="code"), dict(name="99.z", kind="choice")):
        with pytest.raises(ValueError):
            check.register(bad["name"], bad["kind"], prompt="p", hint="h", solution=lambda: 1)


def test_summary_lists_states(capsys, toy):
    check._STATUS.clear()
    check.exercise("99.value", 12.5)
    check.exercise("99.word", ...)
    capsys.readouterr()
    check.summary("99")
    out = capsys.readouterr().out
    assert "1 of 3 passed" in out and "PASS" in out and "TODO" in out and "not run" in out


# ---------------------------------------------------------------- every registered exercise

def test_every_notebook_has_exercises_and_at_least_one_code_exercise():
    for nb in NOTEBOOKS:
        kinds = [ex.kind for ex in check.load(nb)]
        assert "code" in kinds, f"notebook {nb} has no code exercise (kinds: {kinds})"


@pytest.mark.slow
@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.name)
def test_reference_passes_and_every_planted_wrong_answer_fails(capsys, ex):
    assert ex.wrong, f"{ex.name} has no planted wrong answer"
    reference = ex.solution if ex.kind == "code" else ex.expected()
    out = _verdict(capsys, ex.name, reference)
    assert out.startswith("PASS"), out
    for wrong in ex.wrong:
        out = _verdict(capsys, ex.name, wrong)
        assert out.startswith("FAIL") and "hint:" in out, f"{ex.name}: a planted wrong answer gave\n{out}"
        if ex.kind == "code":
            assert re.search(r"case \d+/\d+ \(", out) or "raised" in out or "expected" in out, out
    assert _verdict(capsys, ex.name, ...).startswith("TODO")


def _literals(value):
    """The ways an expected number could be written in a cell."""
    if isinstance(value, str):
        return {repr(value), f'"{value}"'}
    if isinstance(value, bool):
        return set()
    value = float(value)
    out = set()
    if value.is_integer() and abs(value) >= 10:
        out |= {str(int(value)), f"{int(value):_}", f"{int(value):,}"}
    if not value.is_integer() or abs(value) >= 1e6:
        for digits in (3, 4, 5):
            text = f"{value:.{digits}g}"
            if len(text.replace("-", "").replace(".", "").lstrip("0")) >= 3:
                out.add(text)
    return out


@pytest.mark.parametrize("nb", sorted(NOTEBOOKS))
def test_no_answer_is_visible_in_the_notebook(nb):
    cells = json.loads(NOTEBOOKS[nb].read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "check_close" not in code and "check_equal" not in code, "old checkers that carry the answer"
    start = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                 and "".join(c["source"]).lstrip().startswith("## Exercises"))
    tail = "\n".join("".join(c["source"]) for c in cells[start:] if c["cell_type"] == "code")
    for ex in check.load(nb):
        assert f'"{ex.name}"' in code, f"notebook {nb} never checks {ex.name}"
        if ex.kind in ("value", "choice"):
            for literal in _literals(ex.expected()):
                assert not re.search(rf"(?<![\w.]){re.escape(literal)}(?![\w])", tail), \
                    f"{ex.name}'s answer {literal} is visible in the exercise cells"
    assert f'check.summary("{nb}")' in code, f"notebook {nb} does not print its exercise summary"


@pytest.mark.parametrize("ex", [e for e in EXERCISES if e.kind == "value"], ids=lambda ex: ex.name)
def test_hints_do_not_contain_the_answer(ex):
    for literal in _literals(ex.expected()):
        assert literal not in ex.hint, f"{ex.name}'s hint contains {literal}"
    assert math.isfinite(float(ex.expected()))


@pytest.mark.slow
def test_the_command_line_self_test_passes():
    assert check.main(MODULES) == 0


def test_a_failing_code_case_does_not_print_the_expected_output(capsys):
    import torch

    check.register("98.count", "code", prompt="p", hint="h", solution=lambda n: n * 66519, rtol=0, atol=0,
                   cases=lambda: [check.Case("n=1", (1,))])
    check.register("98.vec", "code", prompt="p", hint="h", solution=lambda: torch.tensor([12345.0, 2.0]),
                   rtol=0, atol=0, cases=lambda: [check.Case("one", ())])
    try:
        out = _verdict(capsys, "98.count", lambda n: n * 66000)
        assert out.startswith("FAIL") and "66519" not in out and "too low" in out
        out = _verdict(capsys, "98.vec", lambda: torch.tensor([12000.0, 2.0]))
        assert "1 of 2 values differ" in out and "index (0,)" in out and "12345" not in out
        out = _verdict(capsys, "98.vec", lambda: torch.tensor([float("nan"), 2.0]))
        assert "NaN" in out and "12345" not in out
    finally:
        for name in ("98.count", "98.vec"):
            check.REGISTRY.pop(name)
            check._STATUS.pop(name, None)


def test_named_outputs_and_unwritten_bodies_under_a_runner(capsys):
    def replay(fn, case):  # a runner that unpacks what the learner returns
        state = 0
        for step in case.args[0]:
            state, flag = fn(state, step)
        return state, flag

    check.register("97.replay", "code", prompt="p", hint="h", solution=lambda s, x: (s + x, x > 1), rtol=0, atol=0,
                   cases=lambda: [check.Case("steps", ([1, 2, 3],))], run=replay, outputs=("total", "big"))

    def unwritten(state, step):
        ...

    try:
        assert _verdict(capsys, "97.replay", unwritten).startswith("TODO")
        out = _verdict(capsys, "97.replay", lambda s, x: (s + x, x > 5))
        assert out.startswith("FAIL") and "big:" in out
        assert _verdict(capsys, "97.replay", lambda s, x: (s + x, x > 1)).startswith("PASS")
    finally:
        check.REGISTRY.pop("97.replay")
        check._STATUS.pop("97.replay", None)


def test_a_difference_where_the_right_value_is_zero_has_no_relative_figure():
    import torch

    from helpers.course.check import compare

    why = compare(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.0], [1.0, 1.0]]), 0.0, 0.0)
    assert "the first at index (1, 0) (yours there: 0)" in why and "largest relative 1" in why
    why = compare(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0]), 0.0, 0.0)  # wrong only where 0 is right
    assert "index (1,)" in why and "yours there: 1" in why and "relative" not in why
