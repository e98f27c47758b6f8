"""The sentences notebook 13 prints: same quantity and direction as its tables, and no self-contradiction."""
from helpers.measure.protocol import Ratio
from helpers.parallel import wording as W


def test_speed_sentence_quotes_the_tables_ratio_in_one_direction():
    slower = W.speed_sentence(32, Ratio(0.70, 0.66, 0.74, True), 1.3, 1.2, None, 2, 2)
    assert "0.70x (IQR 0.66-0.74x)" in slower and "bucketed overlap is slower" in slower and "1.43x" in slower
    assert "not met" in slower and "share 2 cores" in slower and "faster" not in slower
    faster = W.speed_sentence(32, Ratio(1.30, 1.25, 1.35, True), 1.3, 1.2, None, 8, 16)
    assert "bucketed overlap is faster" in faster and "; met in this run." in faster and "share" not in faster
    tied = W.speed_sentence(32, Ratio(1.0, 0.9, 1.1, False), 1.3, 1.2, None, 2, 2)
    assert "cannot say which is faster" in tied and "not met" in tied
    held = W.speed_sentence(32, Ratio(1.3, 1.25, 1.35, True), 1.3, 1.2, "the machine was shared", 2, 2)
    assert "not judged by this run: the machine was shared" in held


def test_ring_target_sentence():
    r = Ratio(1.2, 1.1, 1.3, True)
    assert "not tested" in W.ring_target_sentence(2 ** 22, 2, r, None)
    assert "met here" in W.ring_target_sentence(2 ** 24, 8, r, None)
    assert "not met here" in W.ring_target_sentence(2 ** 24, 8, Ratio(2.0, 1.8, 2.2, True), None)
    assert "undecided" in W.ring_target_sentence(2 ** 24, 8, Ratio(1.5, 1.4, 1.6, False), None)
    assert "not judged: busy" in W.ring_target_sentence(2 ** 24, 8, r, "busy")


def test_spread_sentence_names_the_size_and_reconciles_the_probes():
    s = W.spread_sentence([1024, 4096, 2 ** 20], [0.1, 2.14, 0.3], "probes 99% and 98%", None)
    assert "214% at 4 KiB" in s and "2 of 3 sizes above 25%" in s and "yet" in s
    calm = W.spread_sentence([1024, 2048], [0.1, 0.05], "probes 99%", None)
    assert "10% at 1 KiB: steady" in calm and "close to idle" in calm
    assert "withheld" in W.spread_sentence([1024, 2048], [0.1, 0.05], "probes 50%", "shared")


def test_torchrun_node_line():
    assert "printed:\n  step 0: loss" in W.torchrun_node_line(0, 0, "noise\nstep 0: loss 1.0\n", 2)
    quiet = W.torchrun_node_line(1, 0, "", 2)
    assert "trained 2 steps" in quiet and "global rank 0 only" in quiet
    assert "failed" in W.torchrun_node_line(1, 1, "", 2)


def test_doubling_sentence_keeps_measured_and_predicted_apart():
    s = W.doubling_sentence([1024, 2 ** 22], ["faster", "not separated"], 2, 1e-4, 5e-10, None)
    assert "faster at 1 KiB; not separated at 4 MiB" in s and "on 2 ranks doubling is never dearer" in s
    assert "on 8 ranks the ring is cheaper above" in s
    assert "not ranked by this run (busy)" in W.doubling_sentence([1024], ["faster"], 2, 1e-4, 5e-10, "busy")


def test_doubling_rows_judge_by_separation():
    from helpers.measure.bench import Timing
    from helpers.parallel import collectives_lab as L
    fast, slow = Timing(1.0, 0.9, 1.1, [0.9, 1.0, 1.1]), Timing(2.0, 1.9, 2.1, [1.9, 2.0, 2.1])
    sweep = {"sizes": [1024, 2048], "ring_t": [slow, fast], "doubling_t": [fast, fast]}
    rows, verdicts = L.doubling_rows(sweep, 2, 1e-4, 5e-10)
    assert verdicts == ["faster", "not separated"] and rows[0][-1] == "doubling" and len(rows[0]) == 7
