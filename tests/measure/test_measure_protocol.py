import itertools
import random
import re

import pytest

from helpers.measure import protocol
from helpers.measure.bench import Timing, quartiles


class FakeMachine:
    """A timer and a clock for named variants: each call's seconds come from that variant's script, and
    the clock advances by what was timed."""

    def __init__(self, scripts):
        self.scripts = {name: iter(s) for name, s in scripts.items()}
        self.now = 0.0
        self.calls = {name: 0 for name in scripts}

    def fn(self, name):
        f = lambda: None  # noqa: E731
        f.variant = name
        return f

    def timer(self, fn):
        self.calls[fn.variant] += 1
        t = next(self.scripts[fn.variant])
        self.now += t
        return t

    def clock(self):
        return self.now


def noisy(base, rel, seed, slow_every=0, slow=0.0, cold=()):
    """base seconds x (1 +- rel), a planted slow call every `slow_every` calls, and cold first calls."""
    rng = random.Random(seed)
    yield from cold
    for i in itertools.count(1):
        t = base * (1 + rel * (2 * rng.random() - 1))
        yield t + (slow if slow_every and i % slow_every == 0 else 0.0)


def run(machine, **kw):
    fns = {name: machine.fn(name) for name in machine.scripts}
    return protocol.compare(fns, timer=machine.timer, clock=machine.clock, device="cpu", **kw)


def test_warm_up_absorbs_cold_calls_and_stops_when_steady():
    m = FakeMachine({"a": noisy(0.010, 0.02, 0, cold=(1.0, 0.2, 0.05))})
    times = protocol.warm_up(m.fn("a"), m.timer)
    assert times[:3] == [1.0, 0.2, 0.05] and len(times) == 6  # three cold calls, then three steady ones
    with pytest.raises(ValueError, match="tol"):
        protocol.warm_up(m.fn("a"), m.timer, tol=0)
    with pytest.raises(ValueError, match="max_warmup"):
        protocol.warm_up(m.fn("a"), m.timer, window=5, max_warmup=4)


def test_planted_slow_steps_do_not_decide_the_headline():
    # b is truly 10% slower; a has a 40 ms hiccup every 4th call and a 2 s cold first call
    m = FakeMachine({"a": noisy(0.010, 0.01, 1, slow_every=4, slow=0.040, cold=(2.0,)),
                     "b": noisy(0.011, 0.01, 2)})
    c = run(m, max_reps=40)
    assert c["a"].median == pytest.approx(0.010, rel=0.03) and c["b"].median == pytest.approx(0.011, rel=0.03)
    assert max(c["a"].samples) < 1.0  # the cold call was warm-up
    mean_a = sum(c["a"].samples) / len(c["a"].samples)
    assert mean_a > c["b"].median  # a mean would have ranked a slower; the median does not
    assert c.ratio("b", "a").value == pytest.approx(1.1, rel=0.05)
    assert "a was" in protocol.rank_sentence("a", c["a"], "b", c["b"]) or "within the noise" in \
        protocol.rank_sentence("a", c["a"], "b", c["b"])


def test_overlapping_spreads_are_never_ranked():
    m = FakeMachine({"a": noisy(0.010, 0.30, 3), "b": noisy(0.0105, 0.30, 4)})
    c = run(m, max_reps=12, budget_s=100)
    assert not protocol.separated(c["a"], c["b"]) and not c.rankable()
    assert c.stopped == "max_reps" and c.rounds == 12
    s = protocol.rank_sentence("cached", c["a"], "uncached", c["b"])
    assert "within the noise" in s and "cannot rank" in s and "faster" not in s
    assert not c.ratio("b", "a").separated


def test_separated_variants_stop_early_and_are_ranked_by_their_medians():
    m = FakeMachine({"fast": noisy(0.010, 0.02, 5), "slow": noisy(0.030, 0.02, 6)})
    c = run(m, min_reps=5)
    assert c.stopped == "separated" and c.rounds == 5  # separated from round 3 on: three rounds in a row by 5
    s = protocol.rank_sentence("slow", c["slow"], "fast", c["fast"])
    assert re.match(r"fast was (2\.9\d|3\.0\d)x \(IQR-bounded", s) and "faster than slow" in s
    assert s.endswith(f"(time per call: {c['fast']} vs {c['slow']})")  # the faster's time first, as named
    wait = protocol.rank_sentence("slow", c["slow"], "fast", c["fast"], what="data wait", better="shorter")
    assert "fast was" in wait and "shorter than slow (data wait:" in wait and "faster" not in wait
    r = c.ratio("slow", "fast")
    assert r.lo <= r.value <= r.hi and r.separated


def test_the_budget_stops_a_noisy_run_and_says_so():
    m = FakeMachine({"a": noisy(1.0, 0.5, 7), "b": noisy(1.0, 0.5, 8)})
    c = run(m, min_reps=5, max_reps=1000, budget_s=20.0)
    assert c.stopped == "budget" and c.rounds < 1000
    assert "stopped: budget" in c.note() and f"{c.rounds} interleaved rounds" in c.note()


def test_the_note_keeps_a_name_that_ends_in_a_number_apart_from_its_count():
    m = FakeMachine({"paged 4": noisy(1.0, 0.01, 1), "paged 16": noisy(2.0, 0.01, 2)})
    c = run(m, min_reps=5, max_reps=50, budget_s=20.0)
    warm = c.warmup_calls
    assert f"(paged 4 ×{warm['paged 4']}, paged 16 ×{warm['paged 16']} calls)" in c.note()


def test_rounds_are_interleaved_in_rotating_order():
    order = []
    m = FakeMachine({"a": noisy(0.01, 0.0, 0), "b": noisy(0.01, 0.0, 0), "c": noisy(0.01, 0.0, 0)})
    timer = m.timer
    m.timer = lambda fn: (order.append(fn.variant), timer(fn))[1]
    run(m, min_reps=3, max_reps=3)
    timed = order[-9:]
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_bad_arguments_are_refused_at_once():
    m = FakeMachine({"a": noisy(0.01, 0.0, 0)})
    with pytest.raises(ValueError, match="empty"):
        protocol.compare({}, timer=m.timer)
    with pytest.raises(ValueError, match="max_reps"):
        run(m, min_reps=5, max_reps=4)
    with pytest.raises(ValueError, match="budget_s"):
        run(m, budget_s=0)


def test_a_real_function_is_timed_on_the_cpu():
    t = protocol.measure(lambda: sum(range(2000)), device="cpu", min_reps=3, max_reps=5)
    assert isinstance(t, Timing) and 3 <= len(t.samples) <= 5 and t.median > 0


def test_alternating_overlapping_rounds_never_stop_the_comparison_early():
    a = iter([0.010, 0.012, 0.011, 0.013, 0.0100, 0.012, 0.010, 0.013] * 10)
    b = iter([0.012, 0.010, 0.013, 0.011, 0.0135, 0.010, 0.013, 0.011] * 10)
    m = FakeMachine({"a": a, "b": b})
    m.scripts = {"a": a, "b": b}
    c = run(m, min_reps=5, max_reps=12, budget_s=100, warmup_tol=1.0, max_warmup=3)
    assert c.stopped != "separated" and c.rounds == 12
    with pytest.raises(ValueError, match="confirm"):
        run(FakeMachine({"a": noisy(0.01, 0.0, 0)}), confirm=0)


def test_a_single_separated_round_is_not_enough_to_stop():
    # a and b overlap for 6 rounds; then b slows for good: the stop waits for `confirm` separated rounds in a row
    m = FakeMachine({"a": noisy(0.010, 0.05, 11),
                     "b": itertools.chain([0.010] * 3, [0.0105, 0.0095, 0.0102, 0.0098, 0.0101, 0.0099],
                                          itertools.repeat(0.05))})
    c = run(m, min_reps=5, max_reps=40, confirm=3, target_spread=0.0)
    assert c.stopped == "separated"
    separated_from = next(k for k in range(2, c.rounds + 1) if protocol.separated(
        Timing(*quartiles(c["a"].samples[:k]), []), Timing(*quartiles(c["b"].samples[:k]), [])))
    assert c.rounds == max(5, separated_from + 2)  # three separated rounds in a row, not the first one


def test_one_round_is_a_valid_minimum():
    m = FakeMachine({"a": noisy(0.01, 0.0, 0), "b": noisy(0.02, 0.0, 0)})
    c = run(m, min_reps=1, max_reps=1)
    assert c.rounds == 1 and c["a"].median == pytest.approx(0.01)


def test_paired_ratio_cancels_a_load_both_calls_share():
    den = Timing(2.0, 1.0, 4.0, [1.0, 2.0, 4.0, 8.0, 2.0])  # the load moves every round 8x
    num = Timing(0.2, 0.1, 0.4, [0.1, 0.2, 0.4, 0.8, 0.2])  # and this call with it: 0.1 of den each round
    r = protocol.paired_ratio(num, den)
    assert (r.value, r.lo, r.hi) == pytest.approx((0.1, 0.1, 0.1)) and r.separated
    assert not protocol.paired_ratio(Timing(1, 1, 1, [0.9, 1.1, 1.0]), Timing(1, 1, 1, [1.0, 1.0, 1.0])).separated
    with pytest.raises(ValueError, match="same rounds"):
        protocol.paired_ratio(num, Timing(1, 1, 1, [1.0]))
