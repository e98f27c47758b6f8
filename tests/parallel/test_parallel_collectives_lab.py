"""Notebook 13's collectives on real gloo ranks (our ring against `dist.all_reduce` on 2 and 4 ranks), the
sentences on the sweep, and the notebook's list parameters."""
import pytest

from helpers.measure import params
from helpers.parallel import collectives_lab as L
from helpers.parallel import launch


@pytest.mark.ranks
def test_ring_all_reduce_equals_dist_all_reduce():
    out = launch.run_on_ranks(L.check_collectives, 2)[0]
    assert out["int exact"] and out["float max err"] <= 1e-5


@pytest.mark.ranks
def test_ring_all_reduce_on_four_ranks():
    out = launch.run_on_ranks(L.check_collectives, 4)[0]
    assert out["int exact"] and out["float max err"] <= 1e-5


@pytest.mark.ranks
def test_recursive_doubling_equals_dist_all_reduce_on_three_ranks():  # not a power of two: the fold runs
    out = launch.run_on_ranks(L.check_collectives, 3)[0]
    assert out["doubling int exact"] and out["doubling float max err"] <= 1e-5


def _resolve(**given):
    names = ("WORLD_SIZE", "MEMORY_RANKS", "MSG_SIZES", "REPS", "DDP_WIDTH", "DDP_ROWS", "MICROS", "STAGE_MS",
             "MEMORY_MODEL", "TORCHRUN")
    return L.resolve_parameters(params.Setup("smoke", "cpu", 0, False, None), **{**dict.fromkeys(names), **given})


def test_list_parameters_accept_papermill_strings():
    assert _resolve(MICROS="[1, 2]")["MICROS"] == [1, 2] and _resolve(MICROS=(4,))["MICROS"] == [4]
    assert _resolve(MSG_SIZES="[1024, 4096]")["MSG_SIZES"] == [1024, 4096]
    with pytest.raises(ValueError, match="MICROS='1 2' is a string.*-y"):
        _resolve(MICROS="1 2")
    with pytest.raises(ValueError, match="MICROS"):
        _resolve(MICROS="[0, 2]")
    with pytest.raises(ValueError, match="DDP_ROWS"):
        _resolve(DDP_ROWS=[])
    with pytest.raises(ValueError, match="MSG_SIZES=.*not a whole number of fp32 elements"):
        _resolve(MSG_SIZES="[1024, 1030]")
    with pytest.raises(ValueError, match="MEMORY_RANKS=\\[1\\]: every world size must be >= 2"):
        _resolve(MEMORY_RANKS="[1]")


def test_collectives_notes_follow_the_numbers():
    sw = {"sizes": [1024, 2 ** 20], "ping": [1e-4, 1e-3], "ring": [4e-3, 8e-3], "torch": [7e-4, 4e-3],
          "torch_iqr": [0.1, 1.84]}
    notes = L.collectives_notes(sw, 2, 2e-4, 6e-10)
    assert len(notes) == 2 and "likely" in notes[0] and "x the prediction" in notes[0]
    assert "likely pays Python overhead" in notes[1]
    calm = L.collectives_notes({**sw, "torch_iqr": [0.1, 0.2], "ring": [4.1e-4, 8e-3]}, 2, 2e-4, 6e-10)
    assert "within 2x of its floor" in calm[1]


def _budgeted_rounds(rank, world, budget_s):
    """`rounds` over one variant paired with itself (never separated) and no steady target, on a fake clock that
    runs 10 s a reading: how many rounds it timed."""
    import itertools
    t = L.rounds({"a": lambda: None}, 2, [("a", "a")], warmup=0, max_reps=6, target_spread=-1.0,
                 budget_s=budget_s, clock=itertools.count(0, 10).__next__)
    return len(t["a"].samples)


@pytest.mark.ranks
def test_rounds_on_ranks_stop_at_their_seconds_budget():
    assert launch.run_on_ranks(_budgeted_rounds, 2, 5.0) == [2, 2]  # past the budget once its 2 rounds are in
    assert launch.run_on_ranks(_budgeted_rounds, 2, 1e9) == [6, 6]  # no budget: on to max_reps
