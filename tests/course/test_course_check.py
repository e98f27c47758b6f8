"""helpers.course.check's pieces on their own: the bands that say how far a number is off, the descriptions of
a case's inputs, the comparison of returned values, the registry's look-ups and the command line. (The
verdicts of whole exercises, and every registered exercise, are tested in test_course_exercises.py.) Also the
time limit of a learner's call (SIGALRM in the main thread, a trace function elsewhere), the dtypes a task names,
and tensors without values (meta) or of another layout (sparse)."""
import signal
import sys
import threading
import time

import pytest
import torch

from helpers.course import check, outputs, time_limit


def test_lookups_name_what_a_notebook_has():
    assert check.load("99") == []  # no exercise module for this number: nothing, and no error
    names = [ex.name for ex in check.load("00")]
    assert names and all(n.startswith("00.") for n in names)
    assert check.get(names[0]).name == names[0]
    with pytest.raises(KeyError, match="this notebook has: " + names[0]):
        check.get("00.no_such_exercise")


def test_the_command_line_says_how_to_use_it(capsys):
    assert check.main([]) == 2 and "usage" in capsys.readouterr().out
    assert check.main(["--help"]) == 0 and "NOTEBOOK" in capsys.readouterr().out


# ---------------------------------------------------------------- time limits, dtypes, tensors without values

SAFETY = 20.0  # seconds after which the "endless" learner functions below give up, so a broken limit fails, not hangs


@pytest.fixture
def toys():
    """Throw-away code exercises under notebook number 98, removed afterwards."""
    made = []

    def make(name, **kw):
        kw = {**dict(prompt="p", hint="h", solution=lambda x: x * 2, rtol=0, atol=0,
                     cases=lambda: [check.Case("odd", (torch.arange(5.0),)), check.Case("one", (torch.ones(1),))]),
              **kw}
        made.append(check.register(f"98.{name}", "code", **kw))
        return made[-1].name

    yield make
    for ex in made:
        check.REGISTRY.pop(ex.name)
        check._STATUS.pop(ex.name, None)


def _endless(x):
    """A learner's loop that never ends (until SAFETY), swallowing every Exception on the way."""
    start = time.monotonic()
    while time.monotonic() - start < SAFETY:
        try:
            x = x + 0
        except Exception:
            pass
    return "gave up"


def _sleeper(x):
    time.sleep(SAFETY)
    return "woke up"


@pytest.mark.slow
@pytest.mark.parametrize("learner", [_endless, _sleeper])
def test_a_function_that_never_returns_fails_within_its_time_limit(capsys, toys, learner):
    name = toys("forever", time_limit=1)
    before = signal.getsignal(signal.SIGALRM)
    check.exercise(name, learner)
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL  {name}: case 1/2 (odd; inputs tensor(5,) float32) did not return within 1 s")
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert check.get(name).time_limit == 1.0
    assert check.get(toys("default")).time_limit == check.DEFAULT_TIME_LIMIT
    check.exercise(name, lambda x: x + x)  # a function within its limit still passes
    assert capsys.readouterr().out.startswith("PASS")


@pytest.mark.slow
def test_an_outer_alarm_is_put_back_with_its_remaining_time(capsys, toys):
    name = toys("outer", time_limit=1)
    fired = []
    old = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 60.0)
        check.exercise(name, _endless)
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining < 60.0 and signal.getsignal(signal.SIGALRM) is not time_limit.TimeLimit._alarm
        assert not fired and "did not return within 1 s" in capsys.readouterr().out
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _in_a_thread(target) -> None:
    worker = threading.Thread(target=target)
    worker.start()
    worker.join(SAFETY + 10)
    assert not worker.is_alive()


@pytest.mark.slow
def test_outside_the_main_thread_a_trace_function_stops_a_loop(capsys, toys):
    name = toys("thread", time_limit=1)
    _in_a_thread(lambda: check.exercise(name, _endless))
    assert "did not return within 1 s" in capsys.readouterr().out
    assert sys.gettrace() is None


@pytest.mark.slow
def test_under_a_debugger_the_overrun_is_still_reported(capsys, toys):
    name = toys("debugger", time_limit=1)

    def traced():  # another tracer owns this thread (a debugger): nothing can stop the call, the clock still tells
        sys.settrace(lambda frame, event, arg: None)
        try:
            check.exercise(name, lambda x: (time.sleep(1.2), x * 2)[1])
        finally:
            sys.settrace(None)

    _in_a_thread(traced)
    assert "case 1/2 (odd; inputs tensor(5,) float32) did not return within 1 s" in capsys.readouterr().out


def test_bad_time_limits_are_refused(toys):
    for bad in (0, -1, float("inf"), "5", True):
        with pytest.raises(ValueError, match="time_limit"):
            toys("bad", time_limit=bad)


def test_the_dtypes_a_prompt_names():
    assert check.named_dtypes("cast to e4m3fn") == {"float8_e4m3fn"}
    assert check.named_dtypes("(int8 codes, float32 scales)") == {"int8", "float32"}
    assert check.named_dtypes("(R, T, T) bool, True where") == {"bool"}
    assert check.named_dtypes("swiglu_counts(tokens, dim, hidden, dtype)") == frozenset()
    assert check.get("07.rowwise").dtypes == {"float8_e4m3fn", "float32"}


def test_a_wrong_dtype_fails_where_the_task_names_one(capsys, toys):
    named = toys("named", prompt="write it: (n,) int64 ids", solution=lambda x: x.long())
    check.exercise(named, lambda x: x.clone())  # the right values, in float32
    assert "case 1/2 (odd; inputs tensor(5,) float32): expected dtype int64, got float32" in capsys.readouterr().out
    check.exercise(named, lambda x: x.long())
    assert capsys.readouterr().out.startswith("PASS")
    unnamed = toys("unnamed", prompt="write it", solution=lambda x: x.long())
    check.exercise(unnamed, lambda x: x.clone())  # no dtype named: the values decide
    assert capsys.readouterr().out.startswith("PASS")
    explicit = toys("explicit", prompt="write it", solution=lambda x: x.long(), dtypes=(torch.int64,))
    check.exercise(explicit, lambda x: x.clone())
    assert "expected dtype int64, got float32" in capsys.readouterr().out
    assert outputs.compare(torch.zeros(2), torch.zeros(2, dtype=torch.int8), 0, 0, dtypes=("int8",)) == \
        "expected dtype int8, got float32"
    assert outputs.compare((torch.ones(2), torch.zeros(2)), (torch.ones(2), torch.zeros(2).half()), 0, 0,
                         names=("a", "b"), dtypes=(torch.float16,)) == "b: expected dtype float16, got float32"


def test_the_fp8_cast_exercise_refuses_fp32_values(capsys):
    from helpers.course.exercises import nb07

    def in_fp32(x):
        q, scale = nb07._rowwise_reference(x)
        return q.float(), scale  # exactly the fp8 values, never cast

    check.exercise("07.rowwise", in_fp32)
    assert "q: expected dtype float8_e4m3fn, got float32" in capsys.readouterr().out


def test_the_fp8_cast_exercise_refuses_fp64_scales(capsys):
    from helpers.course.exercises import nb07

    def fp64_scales(x):
        q, scale = nb07._rowwise_reference(x)
        return q, scale.double()

    check.exercise("07.rowwise", fp64_scales)
    assert "scale: expected dtype float32, got float64" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")  # torch's own note on making one
@pytest.mark.parametrize("make, words", [
    (lambda x: (x * 2).to("meta"), "got a meta tensor of shape (5,), which has no values"),
    (lambda x: (x * 2).to_sparse(), "got a tensor of layout sparse_coo; return an ordinary dense tensor"),
    (lambda x: (x * 2).reshape(1, -1).to_sparse_csr(), "got a tensor of layout sparse_csr"),
])
def test_meta_and_sparse_tensors_fail_with_a_sentence(capsys, toys, make, words):
    name = toys("odd_tensor")
    check.exercise(name, make)
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL  {name}: case 1/2 (odd; inputs tensor(5,) float32): ") and words in out


def test_what_compare_cannot_read_fails_instead_of_raising(capsys, toys, monkeypatch):
    name = toys("unreadable")

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this tensor")

    monkeypatch.setattr(check, "compare", broken)
    check.exercise(name, lambda x: x * 2)
    assert "could not compare what it returned (tensor(5,) float32)" in capsys.readouterr().out


@pytest.mark.parametrize("notebook", [f"{i:02d}" for i in range(15)])
def test_every_output_of_a_code_exercise_has_a_name(notebook):
    # a failing case names the output that differs ("scale: ..."), never "item 1"
    for ex in check.load(notebook):
        if ex.kind != "code":
            continue
        case = ex.cases()[0]
        out = ex.run(ex.solution, case) if ex.run else ex.solution(*case.args, **case.kwargs)
        if isinstance(out, (tuple, list)) and len(out) > 1:
            assert len(ex.outputs) >= len(out), f"{ex.name} returns {len(out)} outputs but names {len(ex.outputs)}"


def test_a_count_the_task_states_is_said_outright():
    assert outputs.compare((torch.ones(2), 2), (torch.ones(2), 1), 0, 0, ("the output", "graphs"),
                         stated=("graphs",)) == "2 graphs; it must be 1"
    assert outputs.compare((torch.ones(2), 1), (torch.ones(2), 1), 0, 0, ("the output", "graphs"),
                         stated=("graphs",)) is None
    with pytest.raises(ValueError, match="stated"):
        check.register("97.x", "code", prompt="p", hint="h", solution=lambda: 1, cases=lambda: [],
                       outputs=("a",), stated=("graphs",))
    assert "97.x" not in check.REGISTRY




# ---------------------------------------------------------------- learner code that turns on the checker

def _silences_the_alarm(x):
    """A learner's loop that first switches SIGALRM off, then never ends (until SAFETY)."""
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.setitimer(signal.ITIMER_REAL, 0)
    start = time.monotonic()
    while time.monotonic() - start < SAFETY:
        x = x + 0
    return x


@pytest.mark.slow
def test_a_function_that_silences_the_alarm_is_still_stopped(capsys, toys):
    name = toys("silenced", time_limit=1)
    before = signal.getsignal(signal.SIGALRM)
    t0 = time.monotonic()
    check.exercise(name, _silences_the_alarm)
    assert time.monotonic() - t0 < 1 + time_limit.GRACE_S + 5  # stopped by the watchdog, not by SAFETY
    assert capsys.readouterr().out.startswith(f"FAIL  {name}: case 1/2 (odd; inputs tensor(5,) float32) did not return")
    assert signal.getsignal(signal.SIGALRM) is before


def test_a_function_that_rewrites_the_checker_cannot_make_a_wrong_answer_pass(capsys, toys, monkeypatch):
    name = toys("tamper")
    real_compare = check.compare

    def swaps_the_solution(x):
        check.REGISTRY[name].solution = lambda y: y * 3
        return x * 3

    def swaps_compare(x):
        check.compare = lambda *a, **k: ""
        return x * 3

    try:
        for wrong in (swaps_the_solution, swaps_compare):
            check.exercise(name, wrong)
            assert capsys.readouterr().out.startswith(f"FAIL  {name}"), wrong.__name__
            check.compare = real_compare
    finally:
        check.compare = real_compare


def test_sys_exit_in_a_checked_function_is_a_fail_not_the_end_of_the_kernel(capsys, toys):
    name = toys("exits")
    check.exercise(name, lambda x: sys.exit(3))
    assert "called sys.exit(3); return the result instead" in capsys.readouterr().out


class _Endless:
    def __float__(self):
        while True:
            pass


class _Exits:
    def __float__(self):
        sys.exit(0)


@pytest.mark.slow
def test_a_number_whose_float_never_returns_or_exits_fails_within_the_limit(capsys):
    ex = check.register("98.number", "value", prompt="p", hint="h", solution=lambda: 2.0, time_limit=1)
    try:
        check.exercise(ex.name, _Endless())
        assert "did not finish within 1 s" in capsys.readouterr().out
        check.exercise(ex.name, _Exits())
        assert "called sys.exit(0)" in capsys.readouterr().out
    finally:
        check.REGISTRY.pop(ex.name)
        check._STATUS.pop(ex.name, None)
