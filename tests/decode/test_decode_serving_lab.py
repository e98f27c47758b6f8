"""Notebook 10's new serving sections (helpers.decode.serving_lab): paged waste counted from block tables on
planted and workload-like lengths, the continuous-batching verdict, and chunked prefill against a plain one
(helpers.decode.serving.chunked_prefill)."""
from __future__ import annotations

import pytest
import torch

from helpers.decode import serving, serving_lab
from kv_support import small_gpt


def test_table_waste_on_planted_lengths():
    w = serving_lab.table_waste([1, 16, 17, 32, 0], 16)
    assert (w["allocated"], w["used"], w["wasted"]) == (16 + 16 + 32 + 32, 66, 30)
    assert w["fraction"] == pytest.approx(30 / 96)


def test_workload_lengths_and_the_waste_verdict():
    lens = serving_lab.workload_lengths("ShareGPT-like", 4000, seed=1)
    mean = sum(lens) / len(lens)
    assert 400 < mean < 550 and max(lens) <= 2048 and min(lens) >= 2  # 161 + 338 on average, capped at 2048
    out = serving_lab.realistic_waste(block_sizes=[16], n=500, show=False)
    r = out["row16"]
    assert r["block size"] == 16 and r["workload"] == "ShareGPT-like"
    assert out["verdict"]["verdict"] == ("supported" if r["fraction"] < 0.04 else "contradicted")
    assert out["verdict"]["expected"] == pytest.approx(8 / r["mean tokens"])
    with pytest.raises(ValueError, match="workload"):
        serving_lab.workload_lengths("chat", 3)


def test_continuous_batching_verdict_is_judged_only_where_batching_pays():
    v = serving_lab.continuous_batching_verdict
    assert v(3.0, (2.5, 3.5), True, 8.0, 32)["verdict"] == "supported"
    assert v(5.0, (4.5, 5.5), True, 8.0, 32)["verdict"] == "exceeded"
    assert v(1.2, (1.1, 1.3), True, 8.0, 32)["verdict"] == "contradicted"
    flat = v(1.2, (1.1, 1.3), True, 1.3, 8)
    assert flat["verdict"] == "not testable" and "1.30x" in flat["reason"]
    assert v(3.0, (0.9, 3.5), False, 8.0, 32)["verdict"] == "not testable"
    straddle = v(1.8, (1.4, 2.7), True, 8.0, 32)
    assert straddle["verdict"] == "not testable" and "straddle" in straddle["reason"]


def test_chunked_prefill_equals_plain_prefill_and_leaves_other_requests_alone():
    model = small_gpt(2)
    prompt = list(range(5, 35))
    others = [[3, 4, 5], [6, 7]]
    plain, o_plain = serving.chunked_prefill(model, prompt, len(prompt), others=others, decode_steps=6)
    chunked, o_chunked = serving.chunked_prefill(model, prompt, 7, others=others, decode_steps=6)
    ref = model(torch.tensor([prompt]))[0][0]
    torch.testing.assert_close(plain, ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-4)
    assert o_chunked == o_plain and all(len(o) == 6 for o in o_plain)
    alone = [serving.chunked_prefill(model, o, len(o), decode_steps=6)[0].argmax(-1)[-1].item() for o in others]
    assert [o[0] for o in o_plain] == alone  # the first token comes from each request's own prefill
    with pytest.raises(ValueError, match="decode_steps"):
        serving.chunked_prefill(model, prompt, 7, others=others, decode_steps=2)
    out = serving_lab.chunked_section(model, prompt, 7, others, reps=2, budget_s=0.01, show=False)
    assert out["tokens_equal"] and set(out["comparison"].timings) == {"whole prefill", "one chunk"}
