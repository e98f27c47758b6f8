"""Notebook 13's collectives on real gloo ranks (our ring against `dist.all_reduce` on 2 and 4 ranks), the
sentences on the sweep, and the notebook's list parameters."""
import pytest

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


def test_list_parameters_accept_papermill_strings():
    assert L.positive_ints("MICROS", "[1, 2]") == [1, 2] and L.positive_ints("MICROS", (4,)) == [4]
    with pytest.raises(ValueError, match="MICROS='1 2' is a string.*-y"):
        L.positive_ints("MICROS", "1 2")
    with pytest.raises(ValueError, match="MICROS"):
        L.positive_ints("MICROS", "[0, 2]")
    with pytest.raises(ValueError, match="MICROS"):
        L.positive_ints("MICROS", [])


def test_collectives_notes_follow_the_numbers():
    sw = {"sizes": [1024, 2 ** 20], "ping": [1e-4, 1e-3], "ring": [4e-3, 8e-3], "torch": [7e-4, 4e-3],
          "torch_iqr": [0.1, 1.84]}
    notes = L.collectives_notes(sw, 2, 2e-4, 6e-10)
    assert "184%: noisy" in notes[0] and "likely" in notes[1] and "x the prediction" in notes[1]
    assert "likely pays Python overhead" in notes[2]
    calm = L.collectives_notes({**sw, "torch_iqr": [0.1, 0.2], "ring": [4.1e-4, 8e-3]}, 2, 2e-4, 6e-10)
    assert "steady enough" in calm[0] and "within 2x of its floor" in calm[2]
