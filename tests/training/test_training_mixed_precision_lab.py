import pytest
"""helpers.training.mixed_precision_lab: the sentences on the six training variants follow their numbers."""
from helpers.training import mixed_precision_lab


def _summary(**loss):
    names = ["fp32", "fp16 no scaling", "fp16 + our scaler", "fp16 + GradScaler", "bf16 autocast"]
    zero = {"fp32": 1e-5, "fp16 no scaling": 3e-3, "fp16 + our scaler": 0.0, "fp16 + GradScaler": 0.0,
            "bf16 autocast": 0.0}
    skipped = loss.pop("skipped", 0)
    return {n: {"final_loss": loss.get(n.split()[0].replace("+", ""), 4.046), "zero_grad_fraction": zero[n],
                "skipped_steps": skipped if "+" in n else 0} for n in names}


def test_training_sentences_follow_the_numbers():
    same = mixed_precision_lab.training_sentences(_summary(), 12)
    assert "300× fp32's" in same[0] and "scaling recovered" in same[0]
    assert "does not show the lost gradients" in same[1] and len(same) == 2
    s = _summary(skipped=1)
    for n in ("fp16 + our scaler", "fp16 + GradScaler"):
        s[n]["final_loss"] = 4.131
    text = mixed_precision_lab.training_sentences(s, 12)
    assert "skipped 1 of 12 steps" in text[2] and "skipped updates cost it more than rounding" in text[2]
    s = _summary()
    s["fp16 no scaling"]["final_loss"] = 4.2
    assert "slowed training" in mixed_precision_lab.training_sentences(s, 12)[1]
    s = _summary()
    s["fp16 no scaling"]["zero_grad_fraction"] = 1e-5
    assert "recovered" not in mixed_precision_lab.training_sentences(s, 12)[0]


def _timed(speeds, emulated=()):
    """A summary with a paired speed ratio per variant and the formats named in `emulated` emulated."""
    from helpers.measure.protocol import Ratio
    from helpers.training.mixed_precision import variant_format

    mem = {"weights": 4, "master": 0, "grads": 4, "optimizer": 8, "weight_copies": 0, "activations": 20}
    out = {}
    for name, (value, lo, hi) in speeds.items():
        fmt = variant_format(name)
        out[name] = {"speed": Ratio(value, lo, hi, not lo <= 1 <= hi), "format": fmt,
                     "emulated": f"{fmt} is emulated on this CPU" if fmt in emulated else None,
                     "memory": dict(mem, activations=10 if fmt != "fp32" else 20)}
    return out


def test_an_emulated_format_is_never_ranked_nor_the_speed_headline():
    s = _timed({"fp32": (1, 1, 1), "fp16 + GradScaler": (0.14, 0.13, 0.15), "bf16 autocast": (1.3, 1.2, 1.4)},
               emulated=("fp16",))
    text = mixed_precision_lab.speed_sentence(s, "cpu")
    assert "fp16 + GradScaler ×0.14 (fp16 is emulated here: not a speed comparison)" in text
    assert "bf16 autocast ×1.30 (1.20-1.40, faster)" in text and "slower" not in text
    assert mixed_precision_lab.speed_variant(s) == "bf16 autocast"
    # the issue's machine: bf16 emulated, fp16 native -> the headline is fp16's
    s = _timed({"fp32": (1, 1, 1), "fp16 + GradScaler": (0.9, 0.8, 1.1), "bf16 autocast": (0.023, 0.02, 0.025)},
               emulated=("bf16",))
    assert mixed_precision_lab.speed_variant(s) == "fp16 + GradScaler"
    assert "cannot tell" in mixed_precision_lab.speed_sentence(s, "cpu")
    both = _timed({"fp32": (1, 1, 1), "fp16 + GradScaler": (0.1, 0.1, 0.1), "bf16 autocast": (0.1, 0.1, 0.1)},
                  emulated=("bf16", "fp16"))
    assert mixed_precision_lab.speed_variant(both) is None
    speed = mixed_precision_lab.claim_rows(both, "bf16 autocast", "cuda")[1]
    assert speed["verdict"] == "not testable" and "emulated" in speed["reason"] and "value" not in speed


def test_the_claims_are_left_to_the_one_rule():
    from helpers.measure import claims

    s = _timed({"fp32": (1, 1, 1), "bf16 autocast": (4.6, 4.4, 4.9)})
    memory, speed = mixed_precision_lab.claim_rows(s, "bf16 autocast", "cuda")
    assert "verdict" not in memory and "verdict" not in speed  # claims.verdict judges them
    assert claims.judge_interval(memory["value"], memory["value"], memory["value"], *memory["claimed"],
                                 above=memory["above"])[0] == "contradicted"  # 26 of 36 bytes: far from half
    assert claims.judge_interval(speed["value"], *speed["spread"], *speed["claimed"])[0] == "exceeded"
    assert "tensor cores" in speed["reason"]
    cpu = mixed_precision_lab.claim_rows(s, "bf16 autocast", "cpu")[1]
    assert cpu["verdict"] == "not testable" and cpu["claimed"] == (1.5, 2.0) and cpu["spread"] == (4.4, 4.9)


def test_emulated_formats_follow_the_measurement(monkeypatch):
    from helpers.measure import hardware

    monkeypatch.setattr(hardware, "emulated", lambda dtype, device="cpu": "planted" if dtype == "bf16" else None)
    assert mixed_precision_lab.emulated_formats("cpu") == {"fp16": None, "bf16": "planted"}


def test_the_takeaways_follow_the_numbers_and_name_an_emulated_format():
    import torch

    speeds = {"fp32": (1, 1, 1), "fp16 no scaling": (1, 1, 1), "fp16 + our scaler": (1, 1, 1),
              "fp16 + GradScaler": (0.5, 0.4, 0.6), "bf16 autocast": (1.3, 1.2, 1.4)}
    timed = _timed(speeds, emulated=("fp16",))
    summary = {n: {**row, **timed[n]} for n, row in _summary().items()}
    last = {"activation gradients": torch.tensor([1e-9, 1.0]), "weight gradients": torch.tensor([1.0, 2.0])}
    kwargs = dict(last=last, underflow={"activation gradients": 0.25, "weight gradients": 0.0},
                  scaled_underflow={"activation gradients": {"underflow": 0.0, "overflow": 0.0},
                                    "weight gradients": {"underflow": 0.0, "overflow": 0.01}},
                  init_scale=2.0**12, summary=summary, steps=12, check_steps=14, injected=5, vanished=0.4,
                  fast="bf16 autocast", verdicts={"mixed-precision-memory": {"verdict": "contradicted"},
                                                  "mixed-precision-speed": {"verdict": "not testable",
                                                                            "reason": "a CPU has no tensor cores"}},
                  device_name="a CPU", emulated={"fp16": "fp16 is emulated on this CPU", "bf16": None})
    text = mixed_precision_lab.takeaway_sentences(**kwargs)
    assert text[0].startswith("fp16's range: at the last step fp16 would flush 25.00% of the gradients")
    assert "scaled by 2^12" in text[0] and "1.00% would overflow" in text[0]
    assert "over 14 steps with 5 injected infs and NaNs" in text[2] and "40.0% of one real AdamW update" in text[3]
    assert "bf16 autocast total ×0.72 of fp32 (activations ×0.50): contradicted" in text[4]
    assert "bf16 autocast ×1.30 of fp32's (1.20-1.40 over the paired rounds) on a CPU" in text[4]
    assert text[4].endswith("not testable (a CPU has no tensor cores).")
    assert text[5] == "fp16 is emulated on this CPU." and len(text) == 6
    kwargs["vanished"] = None
    assert len(mixed_precision_lab.takeaway_sentences(**kwargs)) == 5


def test_the_accuracy_claim_judges_the_largest_recipe_gap_against_the_stated_tolerance():
    from helpers.measure import claims
    summary = {"fp32": {"final_loss": 4.0}, "fp16 no scaling": {"final_loss": 5.0},
               "fp16 + GradScaler": {"final_loss": 4.02}, "bf16 autocast": {"final_loss": 3.96}}
    row = mixed_precision_lab.accuracy_claim(summary, [5.0, 4.5, 4.4, 4.3, 4.2, 4.1, 4.0])
    assert row["value"] == pytest.approx(1.0) and row["claimed"] == (None, 1.0) and "spread" not in row
    assert "bf16 autocast -1.00%" in row["measured"] and "fp16 no scaling" not in row["measured"]
    assert "2.50% of its value per step" in row["reason"]  # (4.5 - 4.0) / 5 steps / 4.0
    assert claims.judge_interval(row["value"], row["value"], row["value"], *row["claimed"], above=row["above"])[0] == "supported"
    far = mixed_precision_lab.accuracy_claim(summary | {"bf16 autocast": {"final_loss": 4.2}}, [4.0])
    assert far["value"] == pytest.approx(5.0)
    assert claims.judge_interval(far["value"], far["value"], far["value"], *far["claimed"], above=far["above"])[0] == "contradicted"
    with pytest.raises(ValueError, match="none of"):
        mixed_precision_lab.accuracy_claim({"fp32": {"final_loss": 4.0}}, [4.0])
