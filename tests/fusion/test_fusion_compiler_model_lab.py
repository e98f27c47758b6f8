"""helpers.fusion.compiler_model_lab: the course GPT's training step compiled equals eager, the modes that need
CUDA, the break-even counts and sentences, the training claim's verdicts and regional compilation's one graph
for all blocks. The GPT is notebook 09's smoke model, so that the notebook finds these graphs in Inductor's
on-disk cache. No test asserts a speed."""
import pytest
import torch

from helpers.fusion import compiler, compiler_lab, compiler_model_lab
from helpers.measure import bench, protocol


@pytest.mark.slow
def test_gpt_training_step_compiled_equals_eager(results_tmp):
    from helpers.gpt.model import GPTConfig

    cfg = GPTConfig.preset("tiny", n_layer=1, seq_len=32)  # notebook 09's smoke model, so its graphs are cached for it
    r = compiler_model_lab.train_step_compare(cfg, 4, reps=1, check_steps=2)  # asserts rtol 1e-4, atol 1e-5 itself
    assert len(r["losses"]) == 2 and all(abs(a - b) <= 1e-4 * abs(a) + 1e-5 for a, b in r["losses"])
    assert r["tokens"] == 4 * 32 and r["flops"] > 0 and r["first_step_s"] > 0 and r["first_step"].wall > 0
    assert r["ratio"][0] == r["speedup"].value  # the paired ratio: median of the per-round ratios
    assert set(r["first_step_cache"]) == {"hit", "miss"} and sum(r["first_step_cache"].values()) >= 1  # looked up
    assert 0 < compiler_model_lab.matmul_share(r["eager_step"], name="test_gpt_step") < 1  # the step is not only matmuls


def test_a_compile_says_whether_its_graphs_came_from_the_disk_cache():
    warm = compiler.cache_note({"hit": 2, "miss": 0})
    assert warm.startswith("its 2 graph(s) were loaded from Inductor's disk cache") and "warm start" in warm
    assert "a cold start" in compiler.cache_note({"hit": 0, "miss": 3})
    assert "partly warm" in compiler.cache_note({"hit": 1, "miss": 1})
    assert "not consulted" in compiler.cache_note({"hit": 0, "miss": 0})


def test_break_even_and_modes_that_need_cuda():
    assert compiler_model_lab.break_even_steps(10.0, 0.3, 0.1) == pytest.approx(50.0)
    assert compiler_model_lab.break_even_steps(10.0, 0.1, 0.2) is None  # never pays back
    with pytest.raises(ValueError):
        compiler_model_lab.break_even_steps(1.0, 0.0, 0.1)
    if not torch.cuda.is_available():
        from helpers.gpt.model import GPTConfig

        with pytest.raises(ValueError, match="needs CUDA"):
            compiler_model_lab.one_token_forward(GPTConfig.preset("tiny"), ["reduce-overhead"])


def test_modes_note_says_what_the_full_profile_leaves_out_on_cuda():
    note = compiler_model_lab.modes_note(["default", "reduce-overhead"], "cuda")  # the full profile's on CUDA
    assert note.startswith("Not timed in this run: max-autotune.") and "leaves max-autotune out" in note
    assert "MODES=['default', 'reduce-overhead', 'max-autotune']" in note
    assert compiler_model_lab.modes_note(["default"], "cuda").startswith("Not timed in this run: reduce-overhead, max-autotune.")
    assert compiler_model_lab.modes_note(list(compiler_lab.ALL_MODES), "cuda") == "" == compiler_model_lab.modes_note(["default"], "cpu")


def test_break_even_comes_from_the_median_ratio_and_never_when_not_faster():
    assert compiler_model_lab.break_even_from_ratio(10.0, 0.02, 2.0) == pytest.approx(1000)  # saves 10 ms per step
    assert compiler_model_lab.break_even_from_ratio(10.0, 0.02, 1.0) is None
    assert compiler_model_lab.break_even_from_ratio(10.0, 0.02, 0.9) is None
    assert compiler_model_lab.saved_per_call(0.02, 0.5) == pytest.approx(-0.02)
    with pytest.raises(ValueError, match="ratio"):
        compiler_model_lab.saved_per_call(0.02, 0.0)


def T(median, spread=0.1):
    """A planted Timing: the median with quartiles spread/2 either side."""
    return bench.Timing(median, median * (1 - spread / 2), median * (1 + spread / 2), [median] * 5)


def test_break_even_is_printed_only_when_the_ratio_is_separated_from_1():
    eager = T(0.010)
    straddles = protocol.ratio(T(0.010, 0.5), T(0.009, 0.5))  # IQRs overlap
    assert not straddles.separated
    text = compiler_model_lab.break_even_sentence(5.0, eager, straddles)
    assert "cannot tell" in text
    assert "pays back after" not in text
    faster = protocol.ratio(T(0.010), T(0.005))  # 2x, IQRs apart
    text = compiler_model_lab.break_even_sentence(5.0, eager, faster)
    assert "pays back after about 1,000 calls" in text and "between" in text  # 5 s / (10 ms * (1 - 1/2))
    slower = protocol.ratio(T(0.005), T(0.010))
    assert "never pays back" in compiler_model_lab.break_even_sentence(5.0, eager, slower, "steps")


def test_cold_and_warm_break_even_says_a_shared_verdict_once():
    eager = T(0.010)
    slower = protocol.ratio(T(0.005), T(0.010))
    both = compiler_model_lab.break_even_pair_sentence(0.7, 0.02, eager, slower)
    assert both.startswith("Cold or warm, it never pays back") and both.count("eager/compiled") == 1
    straddles = protocol.ratio(T(0.010, 0.5), T(0.009, 0.5))
    assert compiler_model_lab.break_even_pair_sentence(0.7, 0.02, eager, straddles).count("eager/compiled") == 1
    faster = protocol.ratio(T(0.010), T(0.005))  # saves 5 ms per call
    each = compiler_model_lab.break_even_pair_sentence(5.0, 0.5, eager, faster)
    assert each.startswith("Cold, it pays back after about 1,000 calls") and "Warm, it pays back after about 100 calls" in each
    assert each.count("saving") == 1 and each.endswith(".")


def test_the_first_compile_sample_is_set_beside_the_others_without_a_cause():
    said = compiler_model_lab.first_sample_sentence([1.28, 0.78, 0.71, 0.73, 0.69])
    assert said.startswith("The first timed cold compile took 1.28 s, 1.8x the median of the 4 after it (0.72 s)")
    assert "slower than each of them, although 1 untimed cold compile(s) ran before it" in said
    assert "do not say what it is" in said
    assert "untimed" not in compiler_model_lab.first_sample_sentence([1.28, 0.78, 0.71], warmup=0)
    assert "median of all 5, 0.73 s, is the number quoted (0.72 s without the first)" in said
    inside = compiler_model_lab.first_sample_sentence([0.72, 0.78, 0.71, 0.73, 0.69])
    assert "within the range of the 4 after it (0.69-0.78 s)" in inside and "no cost of coming first" in inside
    assert "below the range" in compiler_model_lab.first_sample_sentence([0.60, 0.78, 0.71])
    with pytest.raises(ValueError, match="2 samples"):
        compiler_model_lab.first_sample_sentence([1.0])


def test_training_claim_is_judged_by_the_ledger_from_the_measured_step_and_not_testable_on_a_cpu(results_tmp):
    from helpers.measure import claims

    within = protocol.ratio(T(0.15, 0.2), T(0.10, 0.2))  # 1.5x, bounds about 1.23-1.83
    on_cpu = compiler_model_lab.training_claim(within, "cpu", 30.0)
    assert on_cpu["verdict"] == "not testable" and "CPU" in on_cpu["reason"]
    assert on_cpu["claimed"] == (1.41, 1.41) and on_cpu["value"] == pytest.approx(1.5)  # recorded for the report
    above = protocol.ratio(T(0.30), T(0.10))  # 3x
    below = protocol.ratio(T(0.10), T(0.10))  # 1x
    wide = protocol.ratio(T(0.15, 0.9), T(0.10, 0.9))  # bounds wider than half the value
    want = {"supported": within, "exceeded": above, "contradicted": below, "not testable": wide}
    for verdict, r in want.items():  # the ledger's one rule decides; the lab never writes a verdict on a GPU
        kw = compiler_model_lab.training_claim(r, "cuda", 1.0)
        assert "verdict" not in kw and kw["claimed"] == (1.41, 1.41)
        row = claims.verdict("pytorch2-training-1-41x", notebook="09", claim="c", source="s", quiet=True, unit="x", **kw)
        assert row["verdict"] == verdict, (verdict, row)
    claims.verdict("pytorch2-training-1-41x", notebook="09", claim="c", source="s", quiet=True, **on_cpu)


def test_cold_and_warm_times_each_pair_in_a_fresh_folder_with_new_arguments(monkeypatch):
    from helpers.measure import clock

    seen, readings = [], iter(clock.Reading(c, w) for c, w in ((3.0, 5.0), (0.2, 0.3), (4.0, 9.0), (0.1, 0.2), (3.5, 4.0),
                                                                 (0.3, 0.3)))

    def fake(fn, *args, cache_dir=None):
        seen.append((args, cache_dir))
        return next(readings), fn
    monkeypatch.setattr(compiler_model_lab, "compile_seconds", fake)
    out = compiler_model_lab.cold_and_warm(lambda x: x, lambda i: (i,), repeats=3, warmup=0)
    assert [a for a, _ in seen] == [(0,), (0,), (1,), (1,), (2,), (2,)]
    folders = [d for _, d in seen]
    assert folders[0] == folders[1] and folders[2] == folders[3] and len(set(folders)) == 3  # warm: the cold one's
    assert out["cold_samples"] == [3.0, 4.0, 3.5] and out["cold_wall"] == [5.0, 9.0, 4.0]
    assert out["cold_s"] == 3.5 and out["cold"] == (3.5, 3.25, 3.75) and out["warm_s"] == 0.2
    assert "C++ compiler" in out["clock"]
    with pytest.raises(ValueError, match="repeats"):
        compiler_model_lab.cold_and_warm(lambda x: x, lambda i: (i,), repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        compiler_model_lab.cold_and_warm(lambda x: x, lambda i: (i,), warmup=-1)
    # the default first compiles once, untimed, in a folder of its own, with arguments of its own
    seen.clear()
    readings = iter([clock.Reading(9.0, 9.0)] + [clock.Reading(1.0, 1.0)] * 2)
    out = compiler_model_lab.cold_and_warm(lambda x: x, lambda i: (i,), repeats=1)
    assert [a for a, _ in seen] == [(-1,), (0,), (0,)] and seen[0][1] != seen[1][1]
    assert out["cold_samples"] == [1.0]


def test_regional_sentence_ranks_only_from_three_repeats_whose_quartiles_exclude_1():
    def reg(whole, block):
        per = [w / b for w, b in zip(whole, block)]
        med, q25, q75 = bench.quartiles(per)
        side = lambda xs: {"graphs": 1, "nodes": [40], "first_step_s": bench.quartiles(xs)[0], "first_steps": xs}  # noqa: E731
        return {"whole model": side(whole), "each block": side(block), "repeats": len(whole),
                "ratio": protocol.Ratio(med, q25, q75, not q25 <= 1 <= q75)}
    one = compiler_model_lab.regional_sentence(reg([2.4], [0.4]), 4, "aot_eager")
    assert "an observation, not a ranking" in one and "faster" not in one
    apart = compiler_model_lab.regional_sentence(reg([2.4, 2.2, 2.6], [0.4, 0.5, 0.45]), 4, "aot_eager")
    assert "compiling by block made the first step" in apart and "median of 3" in apart
    mixed = compiler_model_lab.regional_sentence(reg([1.0, 1.3, 0.8], [1.0, 1.0, 1.0]), 4, "aot_eager")
    assert "cannot rank" in mixed and "made the first step" not in mixed
    slower = compiler_model_lab.regional_sentence(reg([1.0, 1.0, 1.0], [2.0, 2.2, 1.9]), 4, "aot_eager")
    assert "compiling the whole model made the first step faster" in slower


@pytest.mark.slow
def test_regional_compilation_traces_one_block_for_all(results_tmp):
    from helpers.gpt.model import GPTConfig

    cfg = GPTConfig.preset("tiny", n_layer=3, seq_len=16)
    reg = compiler_model_lab.regional_compare(cfg, 2, backend="aot_eager", repeats=2)  # asserts each loss equals eager's
    assert reg["each block"]["graphs"] == 1 and reg["whole model"]["graphs"] == 1
    # a fresh compile each repeat (Dynamo's caches emptied): the second repeat traced again, it did not reuse
    assert len(reg["whole model"]["first_steps"]) == 2 and reg["repeats"] == 2
    assert reg["ratio"].lo <= reg["ratio"].value <= reg["ratio"].hi
    assert sum(reg["whole model"]["nodes"]) > 2 * reg["each block"]["nodes"][0]  # the whole model holds 3 blocks
    text = compiler_model_lab.regional_sentence(reg, 3, "aot_eager", 12.0)
    assert "one graph of" in text and "all 3 blocks" in text and "12.0 s" in text and "not a ranking" in text
    with pytest.raises(ValueError, match="backend"):
        compiler_model_lab.regional_compare(cfg, 2, backend="tvm")
    with pytest.raises(ValueError, match="repeats"):
        compiler_model_lab.regional_compare(cfg, 2, backend="aot_eager", repeats=0)


def test_a_compile_is_quoted_on_the_cpu_clock_only_when_its_compiler_processes_were_waited_for():
    import torch._inductor.config as inductor_config

    from helpers.measure import clock

    reading = clock.Reading(cpu=2.0, wall=5.0)
    with inductor_config.patch(compile_threads=1):
        assert compiler_model_lab.counted_seconds(reading) == 2.0
    with inductor_config.patch(compile_threads=4):  # a pool of workers: only the wall clock saw their work
        assert compiler_model_lab.counted_seconds(reading) == 5.0
