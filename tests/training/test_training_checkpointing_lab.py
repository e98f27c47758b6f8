"""helpers.training.checkpointing_lab: measuring a strategy and its panel, the noise-aware Pareto front
and its figure, the "+33%" verdict, the profiler's added self time, the CUDA batch fit, and
notebook 04's parameters."""
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch

from helpers.gpt.model import GPT, GPTConfig
from helpers.measure import bench, claims, profiling
from helpers.measure.profiling import Profile
from helpers.training import checkpointing_lab


def tiny(**overrides) -> GPTConfig:
    return GPTConfig.preset("tiny", **{"n_layer": 4, "seq_len": 32, **overrides})


def batch(cfg, b=2, t=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, cfg.vocab_size, (b, t), generator=g), torch.randint(0, cfg.vocab_size, (b, t), generator=g))


@pytest.mark.slow
def test_the_panel_changes_with_the_controls(capsys):
    torch.manual_seed(0)
    cfg = tiny()
    m = GPT(cfg, attn_impl="naive")
    idx, tgt = batch(cfg)
    base = {"activation_bytes": checkpointing_lab.saved_by(lambda: m(idx, tgt), m.parameters())["activations"]}
    heights = {}
    for strategy, k in (("every-k", 1), ("every-k", 4), ("selective-mlp", 2)):
        fig = checkpointing_lab.strategy_panel(strategy, k, model=m, idx=idx, tgt=tgt, reps=1)
        heights[(strategy, k)] = fig.axes[0].patches[1].get_height()
        assert len(fig.axes[1].containers) == 1 + 2  # the bars, and an error bar (quartiles) on each
        assert fig.axes[0].patches[0].get_height() == pytest.approx(base["activation_bytes"] / 2**20)
        plt.close(fig)
    assert heights[("every-k", 1)] < heights[("every-k", 4)] < base["activation_bytes"] / 2**20
    out = capsys.readouterr().out
    assert "every-k (k=4)" in out and "selective-mlp" in out


def test_pareto_front_and_its_figure():
    points = {"none": (1.0, 10.0), "every": (1.3, 2.0), "bad": (1.4, 5.0), "tie": (1.3, 2.0), "mid": (1.1, 6.0)}
    assert checkpointing_lab.pareto_front(points) == ["none", "mid", "every", "tie"]
    fig = checkpointing_lab.pareto_figure(points)
    assert len(fig.axes[0].texts) == 5
    plt.close(fig)


def test_noise_aware_front_treats_overlapping_spreads_as_ties():
    points = {"none": (1.00, 10.0), "every": (1.40, 1.0), "every-2": (1.20, 5.0), "sqrt-L": (1.18, 4.9),
              "selective": (1.10, 8.0)}
    assert checkpointing_lab.pareto_front(points) == ["none", "selective", "sqrt-L", "every"]  # medians alone drop every-2
    wide = {"none": (0.95, 1.05), "every": (1.31, 1.5), "every-2": (1.1, 1.3), "sqrt-L": (1.1, 1.3),
            "selective": (1.04, 1.2)}
    # every-2 and sqrt-L overlap: a tie keeps both; selective overlaps none: neither removes the other
    assert checkpointing_lab.pareto_front(points, wide) == ["none", "selective", "sqrt-L", "every-2", "every"]
    beaten = {"none": (0.95, 1.0), "every": (1.31, 1.5), "every-2": (1.21, 1.3), "sqrt-L": (1.1, 1.2),
              "selective": (1.04, 1.09)}
    assert checkpointing_lab.dominators(points, beaten)["every-2"] == ["sqrt-L"]  # less memory and its range lies below
    assert checkpointing_lab.dominators(points, beaten)["selective"] == []  # faster than all with less memory: not beaten
    assert checkpointing_lab.pareto_front(points, beaten) == ["none", "selective", "sqrt-L", "every"]
    narrow = {n: (t * 0.999, t * 1.001) for n, (t, _) in points.items()}
    assert checkpointing_lab.pareto_front(points, narrow) == checkpointing_lab.pareto_front(points)
    with pytest.raises(ValueError, match="every"):
        checkpointing_lab.dominators(points, {**wide, "every": (1.5, 1.3)})
    fig = checkpointing_lab.pareto_figure(points, intervals=wide)
    ax = fig.axes[0]
    assert ax.get_xlim()[0] == 0 and ax.get_ylim()[0] == 0  # no truncated axes
    fig.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1  # legend outside the data
    assert len(ax.containers) == 5  # one error bar (the quartiles) per point
    plt.close(fig)


def test_rule_verdict_quotes_the_recorded_verdict_and_follows_the_numbers():
    def verdict(low, mid, high, flops, added=None, v="supported"):
        return checkpointing_lab.rule_verdict(low, mid, high, flops, added, verdict=v)

    above = verdict(0.54, 0.63, 0.83, 0.222, {"total_ms": 10.0, "matmul_ms": 3.6, "other_ms": 6.4,
                                              "top": [("AddmmBackward0", 5.0), ("aten::addmm", 3.0)]}, v="exceeded")
    assert "verdict on the \"+33%\" rule of thumb: exceeded" in above and "64% of the 10.00 ms" in above
    assert "AddmmBackward0" in above and "autograd node" in above and "early stop" in above
    below = verdict(0.20, 0.25, 0.30, 0.28, v="contradicted")
    assert "contradicted" in below and "about as much as the counted FLOPs" in below
    tie = verdict(0.30, 0.34, 0.40, 0.34)
    assert "rule of thumb: supported" in tie and "exceeded" not in tie
    faster = verdict(0.05, 0.10, 0.15, 0.222)
    assert "grew less than the counted FLOPs" in faster


def _judged(low, mid, high, emulated=None):
    kw = checkpointing_lab.every_claim(low, mid, high, 0.22, "cpu", emulated)
    if "verdict" in kw:
        return kw["verdict"], kw["reason"]
    return claims.judge_interval(kw["value"], *kw["spread"], *kw["claimed"], above=kw["above"])


def test_the_every_block_claim_of_the_issue_s_two_measurements():
    # a busy CPU's +43% (+14..+84%): too wide to support or contradict anything
    wide, why = _judged(0.14, 0.43, 0.84)
    assert wide == "not testable" and "163%" in why
    # an H200's precise +36% (+35..+45%): close to the claim, never against it
    assert _judged(0.35, 0.36, 0.45)[0] == "supported"
    # a precise measurement well above and well below: both against a claimed cost
    assert _judged(0.60, 0.63, 0.70)[0] == "contradicted"
    assert _judged(0.10, 0.12, 0.14)[0] == "contradicted"
    # the H200's row as recorded before this rule (its median alone, no spread), judged again by the report
    h200 = {"verdict": "contradicted", "value": 0.3616, "unit": ""}
    lo, hi = checkpointing_lab.every_claim(0.35, 0.36, 0.45, 0.24, "cuda")["claimed"]
    assert claims.rejudge(h200, {"claimed": {"lo": lo, "hi": hi, "above": "contradicted"}})["verdict"] == "supported"
    # an emulated format: not testable, with the sentence that says so
    assert _judged(0.35, 0.36, 0.45, "bf16 is emulated on this CPU")[1] == "bf16 is emulated on this CPU"


def test_overhead_range_pairs_the_rounds():
    def timing(xs):
        return bench.Timing(*bench.quartiles(xs), xs)

    base = timing([1.0, 2.0, 1.0, 2.0, 1.0])  # load moves both steps alike, round by round
    every = timing([1.3, 2.6, 1.3, 2.6, 1.3])
    lo, mid, hi = checkpointing_lab.overhead_range(every, base)
    assert lo == pytest.approx(0.3) and mid == pytest.approx(0.3) and hi == pytest.approx(0.3)
    with pytest.raises(ValueError):
        checkpointing_lab.overhead_range(timing([1.0, 2.0]), base)


def test_added_self_time_splits_matmuls_from_the_rest():
    base = Profile([("aten::mm", 10.0, 4, 0.5), ("aten::gelu", 2.0, 1, 0.1)], "cpu", 2, 20.0)
    other = Profile([("aten::mm", 13.0, 6, 0.4), ("aten::gelu", 4.0, 2, 0.1), ("AddmmBackward0", 5.0, 2, 0.1)],
                    "cpu", 2, 30.0)
    added = checkpointing_lab.added_self_time(base, other)
    assert added["total_ms"] == 10.0 and added["matmul_ms"] == 3.0 and added["other_ms"] == 7.0
    assert [n for n, _ in added["top"]] == ["AddmmBackward0", "aten::mm", "aten::gelu"]
    assert profiling.is_matmul("sm90_xmma_gemm_bf16") and profiling.is_matmul("aten::bmm") and not profiling.is_matmul("aten::gelu")
    assert profiling.is_matmul("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNT")  # cuBLAS's GEMM kernels on Hopper
    assert "+5.00 ms" in checkpointing_lab.added_summary("every", added)


@pytest.mark.slow
def test_cuda_batch_fit_fits_a_line_confirms_and_survives_out_of_memory(monkeypatch, capsys):
    """The logic of the CUDA-only section, with the allocator's peak replaced by a known linear law."""
    cfg = tiny(n_layer=1)
    models = {"none": GPT(cfg), "every": GPT(cfg)}
    n_params = sum(p.numel() for p in models["none"].parameters())
    per = {id(models["none"]): 400, id(models["every"]): 100}  # bytes per sample

    def fake_peak(model, idx, tgt, autocast=None, others=()):
        if idx.shape[0] > 50 and model is models["every"]:
            raise torch.cuda.OutOfMemoryError("fake")
        return 1_000 + per[id(model)] * idx.shape[0]

    monkeypatch.setattr(checkpointing_lab, "cuda_step_peak", fake_peak)
    idx, tgt = batch(cfg, b=4, t=8)
    tokens = torch.randint(0, cfg.vocab_size, (1000,))
    budget = 1_000 + 8 * n_params + 10_000
    fit = checkpointing_lab.cuda_batch_fit(models, idx, tgt, tokens, autocast=None, budget=budget)
    assert fit["none"]["cuda_per_sample"] == 400 and fit["every"]["cuda_per_sample"] == 100
    assert fit["none"]["max_batch_cuda"] == 25 and fit["every"]["max_batch_cuda"] == 100
    assert fit["none"]["confirmed_peak"] == 1_000 + 400 * 25 + 8 * n_params <= budget
    assert "confirmed_peak" not in fit["every"]
    out = capsys.readouterr().out
    assert "none: batch 25 ran" in out and "every: batch 100 ran out of memory" in out


# ---------------------------------------------------------------- notebook 04's parameters fail fast

def _validate_04(tmp_path, **overrides):
    """Run notebook 04's parameters cell, the overrides, then its validation cell, in a plain namespace."""
    nb = Path(__file__).resolve().parents[2] / "notebooks" / "04_activation_checkpointing.ipynb"
    cells = [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
    i = next(i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", []))  # after the start cell
    ns = {}
    exec("".join(cells[i]["source"]), ns)
    ns.update(RESULTS_DIR=str(tmp_path), INTERACTIVE=False, **overrides)
    exec("".join(cells[i + 1]["source"]), ns)
    return ns


@pytest.mark.parametrize("name, value", [("REPS", 0), ("REPS", -2), ("BATCH", 0), ("N_LAYER", 2.5), ("K", 0),
                                         ("DTYPE", "auto"), ("MODEL", "gpt5"), ("BUDGET_MB", 0),
                                         ("PROFILE_STEPS", 0), ("CPU_THREADS", 0), ("ATTN", "flash")])
def test_notebook_parameters_fail_at_once_naming_the_parameter(tmp_path, name, value):
    with pytest.raises(ValueError, match=name):
        _validate_04(tmp_path, **{name: value})


def test_notebook_parameters_none_means_the_profile_default(tmp_path):
    threads = torch.get_num_threads()
    try:
        ns = _validate_04(tmp_path, PROFILE="smoke")
    finally:
        torch.set_num_threads(threads)
    assert (ns["MODEL"], ns["N_LAYER"], ns["BATCH"], ns["SEQ_LEN"], ns["REPS"], ns["PROFILE_STEPS"]) == \
        ("tiny", 4, 4, 64, 60, 2)
    assert ns["BUDGET_MB"] == 48.0 and ns["DTYPE"] == ("fp32" if not torch.cuda.is_available() else ns["HALF"])
    assert ns["CPU_THREADS"] == 1


def test_the_takeaways_follow_the_numbers():
    strategies = ("none", "every", "every-k", "sqrt-L", "selective-attention", "selective-mlp")
    kept = {"none": 100, "every": 20, "every-k": 60, "sqrt-L": 30, "selective-attention": 70, "selective-mlp": 80}
    results = {s: {"activation_bytes": kept[s], "flop_overhead": 0.0 if s == "selective-mlp" else 0.02,
                   "time_overhead": 0.1, "time_overhead_range": (0.05, 0.15)} for s in strategies}
    fits = {s: {"max_batch_estimate": {"every": 40, "sqrt-L": 40}.get(s, 10)} for s in strategies}
    kwargs = dict(attn="naive", block_bytes=1500, paper=1000, results=results, label={s: s for s in strategies},
                  verdict_every="(the verdict)", fits=fits,
                  added_mlp={"top": [("aten::mm", 1.0), ("aten::gelu", 0.5), ("aten::add", 0.1)],
                             "matmul_ms": 0.4, "other_ms": 0.9},
                  front=["none", "every"], budget_mb=48)
    text = checkpointing_lab.takeaway_bullets(**kwargs)
    assert text[0] == ("One block (naive attention, 16-bit) keeps 1,500 bytes, exactly the term-by-term count, 1.50× "
                       "Korthikanti et al.'s 1,000: fp32 LayerNorm inputs, one extra cast, no dropout.")
    assert text[1] == "Every block recomputed kept 0.20× the activations of none. (the verdict)"
    assert "√L segments kept 0.30× against every block's 0.20×: a block's input is small" in text[2]
    assert "selective-mlp kept 0.80× for +0.0% counted FLOPs and +10% time (+5% to +15%)" in text[3]
    assert "(grew most: aten::gelu, aten::add)" in text[3]
    assert text[4].endswith("goes from 10 (none) to 40 (every).")  # the first of the tied largest batches
    kwargs["attn"] = "sdpa"
    assert checkpointing_lab.takeaway_bullets(**kwargs)[0].endswith("and no scores with the fused kernel.")
