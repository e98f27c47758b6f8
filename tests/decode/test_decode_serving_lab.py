"""Notebook 10's serving measurements (helpers.decode.serving_lab): prefix sharing against its formula, chunked prefill
checked and timed, static against continuous batching on one mix (against each request served alone), and the
continuous-batching verdict."""
from __future__ import annotations

import pytest
import torch

from helpers.decode import serving, serving_lab
from helpers.measure import claims
from kv_support import small_gpt, tiny_gpt


@pytest.mark.slow
@pytest.mark.parametrize("prompt_len,block", [(13, 4), (12, 4)])
def test_prefix_sharing_checks_the_formulas_blocks(prompt_len, block, capsys):
    model = small_gpt(2)
    prompt = list(range(3, 3 + prompt_len))
    suffixes = [[1, 2], [5, 6], [9, 10]]
    f = serving_lab.prefix_blocks(prompt_len, prompt_len + 2 + 5, 3, block)
    assert f["saved"] == 2 * (prompt_len // block) and f["copies"] == (2 if prompt_len % block else 0)
    out = serving_lab.prefix_sharing(model, prompt, suffixes, 5, block_size=block)
    assert (out["shared"].physical, out["unshared"].physical, out["shared"].cow_copies) == (
        f["shared"], f["unshared"], f["copies"])
    assert out["rows"] == [["unshared", f["unshared"], f["unshared"], 0, f["unshared"]],
                           ["shared prefix", f["shared"], f["unshared"], f["copies"], f["shared"]]]
    assert out["bitwise"] and f"{f['saved']} saved" in out["sentence"]
    assert capsys.readouterr().out == ""  # the notebook's cell prints; the lab only measures


@pytest.mark.slow
def test_chunked_stall_checks_and_times_one_chunk_against_the_whole_prefill(capsys):
    model = small_gpt(2)
    out = serving_lab.chunked_stall(model, list(range(5, 35)), 7, [[3, 4, 5], [6, 7]], reps=2, budget_s=0.01)
    assert out["tokens_equal"] and set(out["comparison"].timings) == {"whole prefill", "one chunk"}
    assert [r[:2] for r in out["rows"]] == [["the whole prefill", 30], ["one chunk (the last)", 2]]  # 30 = 4 * 7 + 2
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="chunk"):
        serving_lab.chunked_stall(model, [1, 2, 3], 0, [])


@pytest.mark.slow
def test_compare_policies_serves_both_on_the_same_mix_and_the_report_adds_every_check(capsys):
    model = tiny_gpt(2)
    run = serving_lab.compare_policies(model, n_requests=5, max_batch=4, block_size=4, max_new_tokens=8, repeats=2)
    assert capsys.readouterr().out == ""
    paired = sorted(c.tokens_per_s / s.tokens_per_s for c, s in zip(run["tries"]["continuous"], run["tries"]["static"]))
    assert run["speedup"] == pytest.approx(sum(paired) / 2)  # the median of two rounds' paired ratios
    assert run["speedup_range"] == pytest.approx((paired[0] + (paired[1] - paired[0]) / 4,
                                                  paired[0] + 3 * (paired[1] - paired[0]) / 4))
    assert run["record"]["n_requests"] == 5 and 0 <= run["same_tokens"] <= 5 and "2 interleaved runs" in run["noise"]
    assert run["num_blocks"] == 2 * serving.blocks_for(max(len(r.prompt) for r in run["requests"]) + 8, 4)
    tight = serving.serve_continuous(model, run["requests"], num_blocks=run["tight_blocks"], block_size=4, max_batch=4,
                                     max_new_tokens=run["cap"])
    solo = serving_lab.served_alone(model, run, tight)
    assert set(solo["matches"]) == {"static", "continuous", "continuous, tight"} and solo["checked"] == 5
    assert all(0 <= k <= 5 for k in solo["matches"].values())
    report = serving_lab.batching_report(run, tight, solo)
    assert [r["policy"] for r in report["rows"]] == [*serving.POLICIES, f"continuous, {run['tight_blocks']} blocks"]
    rec = report["record"]
    assert rec["tight_preemptions"] == tight.preemptions and tight.peak_blocks <= rec["tight_num_blocks"]
    assert rec["solo_checked"] == 5 and rec["solo_matches_continuous_tight"] == solo["matches"]["continuous, tight"]
    assert list(rec)[-1] == "policies_separated" and "Against each request served alone" in report["sentence"]
    runs = run["runs"]  # the two numbers quoted first, their ratio, then the median of the paired ratios, each named
    assert (f"the ratio of the two policies' median runs {runs['continuous'].tokens_per_s / runs['static'].tokens_per_s:.2f}x; "
            f"the median of the rounds' paired continuous / static ratios {run['speedup']:.2f}x") in report["sentence"]
    assert "tight_num_blocks" not in serving_lab.batching_report(run)["record"]  # only the checks that ran
    with pytest.raises(ValueError, match="max_batch"):
        serving_lab.compare_policies(model, max_batch=0)
    with pytest.raises(ValueError, match="repeats"):
        serving_lab.compare_policies(model, repeats=0)


@pytest.mark.slow
def test_served_alone_checks_one_request_in_every_against_its_solo_tokens():
    model = tiny_gpt(2, torch.float64)  # float64: batched and solo numerics cannot flip a greedy argmax
    run = serving_lab.compare_policies(model, n_requests=5, max_batch=4, block_size=4, max_new_tokens=8)
    solo = serving_lab.served_alone(model, run, every=2)
    assert solo["checked"] == 3  # requests 0, 2 and 4 of the mix
    assert solo["matches"] == {"static": 3, "continuous": 3}
    report = serving_lab.batching_report(run, solo=solo)
    assert report["record"]["solo_checked"] == 3
    assert "3 of the 5 requests (one in 2, in the order of the mix) served alone" in report["sentence"]
    assert "3 of 3 under static batching" in report["sentence"]
    with pytest.raises(ValueError, match="every"):
        serving_lab.served_alone(model, run, every=0)


def test_compare_policies_runs_the_schedulers_it_is_given():
    model = tiny_gpt(2)
    called = []

    def counting(policy):
        def serve(model_, requests, **kw):
            called.append(policy)
            return serving.SERVERS[policy](model_, requests, **kw)
        return serve

    serving_lab.compare_policies(model, n_requests=3, max_batch=2, block_size=4, max_new_tokens=4, repeats=2,
                                 servers={p: counting(p) for p in serving.POLICIES})
    assert called == ["static", "continuous", "continuous", "static"]  # interleaved, alternating who goes first


def test_continuous_batching_verdict_is_judged_by_the_one_rule_where_batching_pays(results_tmp):
    def v(*args, **kw):
        return serving_lab.continuous_batching_verdict(*args, **kw, device="cuda")

    cpu = serving_lab.continuous_batching_verdict(1.8, (1.7, 1.9), 6.6, 8, device="cpu", top_batch=16)
    assert cpu["verdict"] == "not testable" and "batch 16 gave 6.60x" in cpu["reason"]
    assert "(" not in cpu["reason"]  # the ledger prints the reason in parentheses of its own
    assert v(3.0, (2.5, 3.5), 8.0, 32)["verdict"] == "supported"
    assert v(5.0, (4.5, 5.5), 8.0, 32)["verdict"] == "exceeded"
    assert v(1.2, (1.1, 1.3), 8.0, 32)["verdict"] == "contradicted"  # precise and well below 2x
    assert v(1.9, (1.7, 2.0), 8.0, 32)["verdict"] == "supported"  # close to the claim is never against it
    flat = v(1.2, (1.1, 1.3), 1.3, 8)
    assert flat["verdict"] == "not testable" and "1.30x" in flat["reason"] and flat["kwargs"]["verdict"] == "not testable"
    wide = v(1.8, (1.0, 2.7), 8.0, 32)  # a range wider than half the ratio: noise that wide decides nothing
    assert wide["verdict"] == "not testable" and "too wide" in wide["reason"]
    for got in (v(3.0, (2.5, 3.5), 8.0, 32), wide, flat):  # what the ledger records says the same
        assert claims.verdict("continuous-batching-2-4x", notebook="10", claim="c", source="s", measured="m",
                              quiet=True, **got["kwargs"])["verdict"] == got["verdict"]
        assert got["kwargs"]["claimed"] == (2.0, 4.0)
    batching = {"speedup": 3.0, "speedup_range": (2.5, 3.5), "repeats": 5, "n_requests": 48}
    said = serving_lab.continuous_batching_claim(batching, v(3.0, (2.5, 3.5), 8.0, 32), "small10m", "cuda")
    assert said["value"] == 3.0 and said["claimed"] == (2.0, 4.0)
    assert "3.00x tokens/s (the median of 5 paired rounds' ratios, IQR 2.50-3.50x) on 48 requests" in said["measured"]


def test_the_tight_pool_sentence_ranks_only_beyond_the_rounds_spread():
    from types import SimpleNamespace as NS
    full = NS(tokens_per_s=1000.0, iterations=40)
    assert "cannot tell" in serving_lab.tight_speed(NS(tokens_per_s=1300.0, iterations=60), full, 0.4)
    lower = serving_lab.tight_speed(NS(tokens_per_s=500.0, iterations=60), full, 0.2)
    assert "50% lower" in lower and "recomputes" in lower
    higher = serving_lab.tight_speed(NS(tokens_per_s=1500.0, iterations=60), full, 0.2)
    assert "50% higher" in higher and "more iterations" in higher and "rerun" in higher


def test_the_batching_figure_gives_each_policy_one_colour_in_every_panel():
    from types import SimpleNamespace as NS

    import matplotlib.pyplot as plt

    runs = {"static": NS(tokens_per_s=100.0, percentile=lambda metric, q: q / 1e3),
            "continuous": NS(tokens_per_s=200.0, percentile=lambda metric, q: q / 2e3)}
    fig = serving_lab.batching_figure(runs)
    throughput, *latency = fig.axes
    static, continuous = (bar.get_facecolor() for bar in throughput.patches)
    assert static != continuous
    for ax in latency:  # static p50, static p99, continuous p50, continuous p99
        assert [bar.get_facecolor() for bar in ax.patches] == [static, static, continuous, continuous]
        assert [bar.get_hatch() for bar in ax.patches] == [None, "//", None, "//"]
    plt.close(fig)
