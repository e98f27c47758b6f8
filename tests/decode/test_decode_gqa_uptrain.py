"""GQA and MQA made from a multi-head model (helpers.decode.gqa_uptrain) and notebook 10's sweep of them
(kv_decode_lab.gqa_sweep, gqa_recovery, gqa_sentences, gqa_takeaway, gqa_claim): exact where the pooling must be exact, the shapes, the
errors, and the uptraining loop on a few random tokens (no corpus, no checkpoint: seconds)."""
import copy

import pytest
import torch

from helpers.decode import gqa_uptrain, kv_decode_lab
from helpers.decode.kv_cache import kv_bytes_per_token
from helpers.gpt import heldout
from helpers.gpt.model import GPT, GPTConfig
from helpers.measure import claims

H, HD = 4, 8  # query heads and head width of the test model


def mha(seed: int = 0, **overrides) -> GPT:
    """A random 2-layer multi-head course GPT (4 heads of 8), eval mode."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**dict(n_layer=2, n_head=H, d_model=H * HD, d_ff=64, seq_len=24), **overrides})).eval()


def planted(model: GPT, n_kv_head: int) -> GPT:
    """A copy of `model` whose key and value heads are equal within each group of n_head // n_kv_head heads."""
    out, g = copy.deepcopy(model), H // n_kv_head
    with torch.no_grad():
        for block in out.blocks:
            for t in (block.attn.kv_proj.weight, block.attn.kv_proj.bias):
                heads = t.view(2, H, HD, *t.shape[1:])
                for j in range(n_kv_head):
                    heads[:, j * g + 1:(j + 1) * g] = heads[:, j * g:j * g + 1]
    return out


TOKENS = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def corpus(monkeypatch):
    """Random byte tokens in place of the training split, so that uptraining needs no corpus on disk."""
    tokens = torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(2), dtype=torch.int64)
    monkeypatch.setattr(gqa_uptrain.data, "load_corpus", lambda split: tokens)
    return tokens


def test_pooling_is_each_groups_mean_by_a_per_head_loop():
    w, b = torch.randn(2 * H * HD, 16), torch.randn(2 * H * HD)
    for kv in (4, 2, 1):
        g = H // kv
        for t in (w, b):
            heads = t.view(2, H, HD, *t.shape[1:])
            ref = torch.cat([torch.stack([heads[s, j * g + i] for i in range(g)]).mean(0)
                             for s in range(2) for j in range(kv)])
            got = gqa_uptrain.pool_kv_heads(t, H, kv)
            assert got.shape == (2 * kv * HD, *t.shape[1:])
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-7)


def test_as_many_kv_heads_as_query_heads_is_the_same_model_bit_for_bit():
    model = mha()
    same = gqa_uptrain.convert(model, H)
    assert same is not model and same.config.n_kv_head == H
    assert torch.equal(same(TOKENS)[0], model(TOKENS)[0])


@pytest.mark.parametrize("kv", [2, 1])
def test_groups_of_equal_heads_pool_exactly(kv):
    model = planted(mha(), kv)
    pooled = gqa_uptrain.convert(model, kv)
    g = H // kv
    for a, b in zip(pooled.blocks, model.blocks):  # each group's one head is the planted head itself
        assert torch.equal(a.attn.kv_proj.weight, b.attn.kv_proj.weight.view(2, H, HD, -1)[:, ::g].reshape(-1, H * HD))
    if kv == 2:  # the mean of two equal floats is that float: bit for bit
        assert torch.equal(pooled(TOKENS)[0], model(TOKENS)[0])
    torch.testing.assert_close(pooled(TOKENS)[0], model(TOKENS)[0], rtol=0, atol=1e-6)


def test_convert_copies_every_other_weight_and_leaves_the_model_alone():
    model = mha()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mqa = gqa_uptrain.convert(model, 1)
    assert mqa.config.n_kv_head == 1 and not mqa.training
    for name, t in mqa.state_dict().items():
        if ".kv_proj." in name:
            assert t.shape[0] == 2 * HD
        else:
            assert torch.equal(t, before[name]), name
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert mqa(TOKENS)[0].shape == (2, 20, 256)
    nobias = gqa_uptrain.convert(mha(bias=False), 2)  # no biases: the weights alone are pooled
    assert nobias.blocks[0].attn.kv_proj.bias is None


def test_bad_kv_heads_and_models_are_refused_with_their_names():
    model = mha()
    with pytest.raises(ValueError, match=r"n_kv_head=3 must divide n_head=4.*\[1, 2, 4\]"):
        gqa_uptrain.convert(model, 3)
    with pytest.raises(ValueError, match="n_kv_head=0"):
        gqa_uptrain.convert(model, 0)
    with pytest.raises(ValueError, match="multi-head model"):
        gqa_uptrain.convert(gqa_uptrain.convert(model, 2), 1)
    with pytest.raises(ValueError, match="n_kv_head"):
        gqa_uptrain.pool_kv_heads(torch.zeros(2 * H * HD), H, 8)


def test_the_uptraining_schedule_is_a_share_of_the_pretraining_at_its_final_rate():
    sched = {"steps": 1500, "batch": 32, "seq_len": 128, "lr": 6e-3}
    up = gqa_uptrain.uptrain_schedule(sched, 0.05)
    assert up == {"steps": 75, "batch": 32, "seq_len": 128, "lr": pytest.approx(6e-4)}
    assert gqa_uptrain.uptrain_schedule(sched, 1e-6, 4)["steps"] == 1
    assert gqa_uptrain.uptrain_schedule(sched, 0.01, 4)["batch"] == 4
    for share in (0, 1.5, True, "0.05"):
        with pytest.raises(ValueError, match="share="):
            gqa_uptrain.uptrain_schedule(sched, share)
    with pytest.raises(ValueError, match="batch=0"):
        gqa_uptrain.uptrain_schedule(sched, 0.05, 0)


def test_the_learning_rate_warms_up_to_the_peak_then_decays_toward_a_tenth_of_it():
    lr = gqa_uptrain.learning_rate
    short = {"steps": 15, "lr": 6e-4}  # 5% of 15 rounds to 1: no step below the peak
    assert gqa_uptrain.warmup_steps(15) == 1 and lr(short, 0) == pytest.approx(6e-4)
    rates = [lr(short, s) for s in range(15)]
    assert rates[1] == rates[0] and all(a > b for a, b in zip(rates[1:], rates[2:])) and rates[-1] > 0.1 * 6e-4
    long = {"steps": 100, "lr": 1e-3}  # 5 warm-up steps: a fifth of the peak, then up to it
    assert gqa_uptrain.warmup_steps(100) == 5
    assert [lr(long, s) for s in range(5)] == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4, 1e-3])
    assert lr(long, 5) == pytest.approx(1e-3) and lr(long, 99) == pytest.approx(1e-4, rel=0.01)
    assert max(lr(long, s) for s in range(100)) == pytest.approx(1e-3)
    for step in (-1, 100):
        with pytest.raises(ValueError, match="step="):
            lr(long, step)


@pytest.mark.slow  # AdamW's first steps in a process: seconds on 2 busy cores
def test_uptraining_trains_a_copy_the_same_way_for_the_same_seed(corpus):
    model = gqa_uptrain.convert(mha(), 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sched = {"steps": 3, "batch": 2, "seq_len": 16, "lr": 1e-3}
    a, b = gqa_uptrain.uptrain(model, sched, seed=0), gqa_uptrain.uptrain(model, sched, seed=0)
    assert not a.training and a.config.n_kv_head == 2
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert not torch.equal(a.blocks[0].attn.kv_proj.weight, model.blocks[0].attn.kv_proj.weight)
    with pytest.raises(ValueError, match="steps=0"):
        gqa_uptrain.uptrain(model, {**sched, "steps": 0})


@pytest.mark.slow  # uptrains three models
def test_the_sweep_its_sentences_and_its_claim(corpus, results_tmp, capsys):
    model = mha()
    val = torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(3), dtype=torch.int64)
    sched = {"steps": 2, "batch": 2, "seq_len": 16, "lr": 1e-3}
    sweep = kv_decode_lab.gqa_sweep(model, [4, 2, 1], sched, val, 2, 4, seed=0)
    rows = sweep["rows"]
    assert [r["kv heads"] for r in rows] == [4, 2, 1] and sweep["steps"] == 2 and sweep["batch"] == 2
    assert [r["variant"] for r in rows] == ["MHA (4 kv heads)", "GQA (2 kv heads)", "MQA (1 kv head)"]
    assert [r["bytes per token"] for r in rows] == [kv_bytes_per_token(2, kv, HD, 4) for kv in (4, 2, 1)]
    base = heldout.window_losses(model, val, batches=2, batch=4)
    assert torch.equal(sweep["windows"][4][0], base) and rows[0]["pooled"] == float(base.mean())
    sentences = kv_decode_lab.gqa_sentences(sweep, H, 0.05)
    assert len(sentences) == 3 and sentences[0].startswith("Control, MHA after 2 uptraining steps (5% of")
    assert f"{rows[0]['pooled']:.3f} to {rows[0]['uptrained']:.3f} nats/byte" in sentences[0]
    assert "GQA (2 kv heads), 2x fewer cache bytes" in sentences[1] and "MQA (1 kv head), 4x" in sentences[2]
    kwargs = kv_decode_lab.gqa_claim(sweep, H, 0.05)
    lo, hi = kwargs["spread"]
    assert lo <= kwargs["value"] <= hi and kwargs["claimed"] == (None, 1.0)
    assert kwargs["value"] == pytest.approx(rows[1]["uptrained"] / rows[0]["uptrained"])
    row = claims.verdict("gqa-quality-near-mha", quiet=True, **kwargs)
    assert row["verdict"] in claims.VERDICTS and "2x fewer bytes" in row["measured"]
    assert f"GQA's loss over the control's {kwargs['value']:.4f} ({lo:.4f}-{hi:.4f}" in row["measured"]
    short = kv_decode_lab.gqa_claim(sweep, H, 0.01)
    assert kwargs["reason"] == "" and "verdict" not in kwargs
    assert short["verdict"] == "not testable" and "less than the paper's 5%" in short["reason"]
    assert short["value"] == kwargs["value"]   # measured and recorded all the same
    assert claims.verdict("gqa-quality-near-mha", quiet=True, **short)["verdict"] == "not testable"
    line = kv_decode_lab.gqa_takeaway(sweep, 0.01, claims.verdict("gqa-quality-near-mha", quiet=True, **short))
    assert "uptrained 2 steps (1% of" in line and "GQA with 2 kv heads" in line and "MQA with 1 kv head " in line
    assert f"loss {rows[1]['uptrained']:.3f}" in line
    assert f"to {rows[0]['uptrained']:.3f} nats/byte" in line and "not testable (this run uptrained" in line
    assert capsys.readouterr().out == ""  # the lab measures and returns; the notebook prints
    with pytest.raises(ValueError, match="must include n_head=4"):
        kv_decode_lab.gqa_sweep(model, [2, 1], sched, val, 2, 4)


def test_a_model_without_a_gqa_between_mqa_and_mha_is_not_testable():
    sweep = {"rows": [{"kv heads": 2, "bytes per token": 8}, {"kv heads": 1, "bytes per token": 4}], "steps": 1,
             "batch": 2, "windows": {}}
    kwargs = kv_decode_lab.gqa_claim(sweep, 2, 0.05)
    assert kwargs["verdict"] == "not testable" and "no GQA" in kwargs["reason"]


def synthetic_sweep(control_shift: float) -> dict:
    """A gqa_sweep-shaped result with chosen per-window losses: MHA 1.0 (+ control_shift after uptraining), GQA
    pooled 2.0 and uptrained 1.5 + control_shift, MQA pooled 3.0 and uptrained 2.0 + control_shift; small per-window
    noise so that the standard errors are not zero."""
    noise = torch.tensor([0.01, -0.01, 0.02, -0.02], dtype=torch.float64)
    w = {4: (1.0, 1.0 + control_shift), 2: (2.0, 1.5 + control_shift), 1: (3.0, 2.0 + control_shift)}
    windows = {kv: (a + noise, b + noise.flip(0)) for kv, (a, b) in w.items()}
    rows = [{"kv heads": kv, "variant": v, "bytes per token": 8 * kv, "pooled": float(windows[kv][0].mean()),
             "uptrained": float(windows[kv][1].mean())}
            for kv, v in ((4, "MHA (4 kv heads)"), (2, "GQA (2 kv heads)"), (1, "MQA (1 kv head)"))]
    return {"rows": rows, "windows": windows, "steps": 3, "batch": 2}


@pytest.mark.parametrize("shift, word", [(0.2, "rose from 1.000 to 1.200"), (-0.2, "fell from 1.000 to 0.800"),
                                         (0.0, "did not move beyond the noise")])
def test_the_control_is_described_by_its_measured_direction_and_the_shares_closed_are_against_it(shift, word):
    sweep = synthetic_sweep(shift)
    rec = kv_decode_lab.gqa_recovery(sweep)
    assert rec["control"]["change"] == pytest.approx(shift) and rec["control"]["separated"] == (shift != 0)
    assert rec[2]["cost"] == pytest.approx(1.0) and rec[2]["left"] == pytest.approx(0.5)
    assert rec[2]["closed"] == pytest.approx(0.5) and rec[1]["closed"] == pytest.approx(0.5)
    sentences = kv_decode_lab.gqa_sentences(sweep, H, 0.01)
    assert word in sentences[0] and "yardstick" in sentences[0]
    assert ("not free" in sentences[0]) == (shift > 0)  # reasons offered only for a rise
    assert "closed 50% of the 1.000 nats/byte gap" in sentences[1] and "closed 50% of the 2.000" in sentences[2]
    row = {"verdict": "not testable", "reason": "too short; more"}
    line = kv_decode_lab.gqa_takeaway(sweep, 0.01, row)
    assert f"its loss {word}" in line and "the yardstick for the others" in line
    assert "GQA with 2 kv heads (16 B/token): pooling cost 1.000 nats/byte, uptraining closed 50% of it" in line
    assert "MQA with 1 kv head (8 B/token): pooling cost 2.000" in line and "+0.500 against the control" in line
    assert line.endswith("not testable (too short).")


def test_a_pooling_cost_within_the_noise_gets_no_share_closed():
    sweep = synthetic_sweep(0.0)
    sweep["windows"][2] = (sweep["windows"][4][0] + torch.tensor([0.01, -0.01, 0.0, 0.0], dtype=torch.float64),
                           sweep["windows"][2][1])
    assert kv_decode_lab.gqa_recovery(sweep)[2]["closed"] is None
    assert "no share closed" in kv_decode_lab.gqa_takeaway(sweep, 0.01, {"verdict": "not testable"})
    assert "gap pooling opened" not in kv_decode_lab.gqa_sentences(sweep, H, 0.01)[1]
